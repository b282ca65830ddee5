-- CUMULATE step 10, max_size 30, B = 0: 5 is in [0,10), [0,20), [0,30); 25 in [0,30).
-- 25 moves W to 25: [0,10) and [0,20) fire. 12 then misses the closed [0,20) but is accepted into
-- the open [0,30), so it is not late. [0,30) fires at end with count 3.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM CUMULATE(input, t, INTERVAL '10' SECOND, INTERVAL '30' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
