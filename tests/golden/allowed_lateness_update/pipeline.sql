-- the same rows with emit update and L = 5 as per-query options (named arguments):
-- (a,0,10,2) revision 0 at W = 12; (a,0,10,3) revision 1 when (a,7) arrives;
-- (a,8) at W = 16 >= 10 + 5 is late; (a,10,20,2) revision 0 at end.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM TUMBLE(input, t, INTERVAL '10' SECOND,
            emit => 'update', allowed_lateness => INTERVAL '5' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
