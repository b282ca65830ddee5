-- HOP slide 5 size 10, B = 0; rows at 100, then 50: W = 100 closes both windows of 50
-- ([45,55) and [50,60)), so the row goes to the late side output, missing [50,60), and opens nothing.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n
FROM HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
