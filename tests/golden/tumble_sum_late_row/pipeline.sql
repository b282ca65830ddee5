-- DESIGN §4 / docs/semantics.md: TUMBLE 10, sum(v), B = 0; rows (t, v): (5,1) (10,1) (10,1) (9,1)
-- t=10 closes [0,10); the second t=10 is on time for [10,20); t=9 is late for the closed [0,10).
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');

INSERT INTO out
SELECT key, window_start, window_end, sum(v) AS total
FROM TUMBLE(input, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
