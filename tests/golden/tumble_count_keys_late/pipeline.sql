-- TUMBLE 10, count, B = 0; rows (A,1) (B,2) (C,5) (B,13) (A,8) (A,14), then end.
-- at (B,13): W = 13 fires [0,10) for A, B, C; (A,8) is late; at end [10,20) fires for A and B.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM TUMBLE(input, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
