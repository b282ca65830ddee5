-- Per-row queries, run per batch through DataFusion: a filter in a view, a LEFT JOIN with a static
-- table (CREATE TABLE: read once, in full, before the stream), a projection with an expression,
-- and a window over the joined view (the WATERMARK column t passes through b.*).
CREATE TABLE owners (key VARCHAR, owner VARCHAR)
WITH (connector = 'file', path = 'owners.csv');
CREATE SOURCE input (
    key VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'input.csv', batch_rows = '2');
CREATE SINK rows_out WITH (connector = 'file', path = 'rows.csv');
CREATE SINK per_owner WITH (connector = 'file', format = 'csv');

CREATE VIEW enriched AS
SELECT b.*, coalesce(o.owner, 'nobody') AS owner
FROM input b LEFT JOIN owners o ON b.key = o.key
WHERE b.v > 1;

INSERT INTO rows_out
SELECT key, owner, t, v * 10 AS v10 FROM enriched;

INSERT INTO per_owner
SELECT owner, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(enriched, t, INTERVAL '10' SECOND)
GROUP BY owner, window_start, window_end;
