-- opt-in empty windows. TUMBLE 10, count and sum, B = 0, key_ttl 15 s; one row per batch.
-- rows (a,1) (b,3) (a,12) (a,45) (b,71). A key gets an empty window [s,e) (count 0, sum NULL)
-- when it had a row in [s - 15, s) and none in [s,e):
--   [0,10)   a 1, b 1 (real)
--   [10,20)  a real (12); b empty (3 >= 10 - 15)
--   [20,30)  a empty (12 >= 5); b nothing (3 < 5)
--   [30,40)  nothing (a's last row before 30 is 12 < 15)
--   [40,50)  a real (45)
--   [50,60)  a empty (45 >= 35)     [60,70) a empty (45 >= 45)
--   [70,80)  b real (71)            [80,90) b empty (71 >= 65)
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1',
        empty_windows = 'true', key_ttl = '15s');
CREATE SINK out WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(input, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
