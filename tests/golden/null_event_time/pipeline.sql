-- A row with a null event time (an empty CSV field) goes to the late side output with reason
-- null_time and no window; the rest of its batch is processed. One batch of three rows.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'input.csv');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM TUMBLE(input, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
