-- HOP slide 7 size 16 (Flink/RisingWave order: slide, then size); rows at 100 and 112.
-- 100 is in [91,107) and [98,114); 112 in [98,114), [105,121), [112,128).
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM HOP(input, t, INTERVAL '7' SECOND, INTERVAL '16' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
