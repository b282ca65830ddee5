-- A windowed query reading another's output. Stage 1 counts per key per 10 s (B = 0); stage 2
-- windows stage 1's rows by their window_start into 20 s windows. Stage 1 emits [0,10) when its
-- watermark reaches 12; stage 2 keeps its own watermark, from the window_start values it has seen
-- (0), so [0,10)'s rows are on time for stage 2's [0,20) and LATE(per_20s) stays empty.
-- (a,9) arrives after stage 1's W = 12 and is late for stage 1 only.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'input.csv', batch_rows = '1');
CREATE SINK stage1 WITH (connector = 'file', format = 'csv');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late1 WITH (connector = 'file', format = 'csv');
CREATE SINK late2 WITH (connector = 'file', format = 'csv');

CREATE VIEW per_key AS
SELECT key, window_start, window_end, count(*) AS n
FROM TUMBLE(input, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;

CREATE VIEW per_20s AS
SELECT window_start, window_end, sum(n) AS total, count(*) AS windows
FROM TUMBLE(per_key, window_start, INTERVAL '20' SECOND)
GROUP BY window_start, window_end;

INSERT INTO stage1 SELECT * FROM per_key;
INSERT INTO out SELECT * FROM per_20s;
INSERT INTO late1 SELECT * FROM LATE(per_key);
INSERT INTO late2 SELECT * FROM LATE(per_20s);
