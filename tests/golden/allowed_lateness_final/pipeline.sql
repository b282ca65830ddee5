-- TUMBLE 10, count, B = 0, L = 5 (a pipeline option), emit final (the default).
-- rows (a,1) (a,4) (a,12) (a,7) (a,16) (a,8): [0,10) fires once at W = 16 >= 10 + 5 with count 3
-- ((a,7) arrived at W = 12 < 15: accepted); (a,8) at W = 16 is late; [10,20) fires at end.
SET allowed_lateness = '5s';
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
