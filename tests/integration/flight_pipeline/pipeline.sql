-- A flight source and flight sinks against a live server ({server} is filled in by the test).
-- TUMBLE 10 s, count per key, B = 0; writers a and b of stream events (input.csv, in log order):
--
--   entry              W after   fires
--   a (x,1)            -inf      (b holds W back: it is known from the stream's history)
--   b (y,2)            1
--   a (x,11)           2
--   b (x,5)            5         on time: [0,10) is open (W was 2)
--   a (y,23)           5
--   b watermark 15     15        [0,10): x 2, y 1
--   b (y,9)            15        late: [0,10) closed (10 <= 15) -> the late stream
--   b (x,16)           16
--   a end_of_input     16
--   b end_of_input     +inf      [10,20): x 2; [20,30): y 1; both writers ended: the run ends
CREATE SOURCE events (
    k VARCHAR, t TIMESTAMP(0),
    WATERMARK FOR t AS t
) WITH (connector = 'flight', server = '{server}', stream = 'events');

CREATE SINK results WITH (connector = 'flight', server = '{server}', stream = 'results');
CREATE SINK late_rows WITH (connector = 'flight', server = '{server}', stream = 'late', writer = 'late-of-events');

INSERT INTO results
SELECT k, window_start, window_end, count(*) AS n
FROM TUMBLE(events, t, INTERVAL '10' SECOND)
GROUP BY k, window_start, window_end;

INSERT INTO late_rows SELECT * FROM LATE(events);
