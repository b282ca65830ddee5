-- SESSION gap 5, B = 20; the same rows in reverse order (12, 8, 4, 0) give the same session.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '20' SECOND
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total
FROM SESSION(input, t, INTERVAL '5' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
