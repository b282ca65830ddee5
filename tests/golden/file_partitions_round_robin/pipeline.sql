-- Each file is a watermark partition, registered before any is read, read round-robin one batch
-- each: a.csv at 20, b.csv at 5, a.csv at 25, b.csv at 6, a.csv at 27. W = min over the files, so
-- b.csv's rows at 5 and 6 are not late although a.csv is already at 20. When b.csv ends W = 27
-- ([0,10) fires); when a.csv ends W = +inf.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'parts/*.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM TUMBLE(input, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
