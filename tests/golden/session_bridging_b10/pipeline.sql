-- SESSION gap 5, B = 10; rows 0, 12, 4, 8: 4 extends [0,5) to [0,9), 8 bridges [0,9) and [12,17).
-- One session [0,17), count 4. Input and output as JSON lines.
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t - INTERVAL '10' SECOND
) WITH (connector = 'file', path = 'input.jsonl', batch_rows = '1');
CREATE SINK out WITH (connector = 'file', format = 'jsonl');
CREATE SINK late WITH (connector = 'file', format = 'jsonl');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total
FROM SESSION(input, t, INTERVAL '5' SECOND)
GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
