-- A keyed windowed query over another's output, and one over a late side output (the second
-- exchange of the distributed runtime, docs/scaling.md). Stage 1: sessions (gap 10) per region
-- and shop; stage 2: TUMBLE 20 per region over the sessions' window_start (its own watermark,
-- B = 0: the largest window_start it has seen); a TUMBLE 30 per region over LATE(visits).
-- Two files read round-robin (a1 b1 a2 b-end a3 …); W = min over the files, B = 0.
--
--  step  row / end           W after  stage 1 emits (region shop [start,end) n total)  stage 2
--  a1    east  s1  1          -inf
--  b1    west  s4  2          1
--  a2    west  s3  2          2
--  b-end                      2
--  a3    east  s2  4          4
--  a4    east  s1  8          8        (east s1 now [1,18))
--  a5    north s1 13          13       west s3 [2,12) 1 4, west s4 [2,12) 1 2     W2 = 2
--  a6    west  s2  3          13       late: [3,13) ends at 13 <= W -> LATE(visits)
--  a7    east  s1 16          16       east s2 [4,14) 1 8                          W2 = 4
--  a8    west  s1 21          21
--  a9    east  s1 25          25       north s1 [13,23) 1 32                       W2 = 13
--  a10   north s2  9          25       late: [9,19) -> LATE(visits)
--  a11   west  s1 28          28       (west s1 now [21,38))
--  a12   east  s1 33          33       (east s1 now [1,43))
--  a13   north s2 39          39       west s1 [21,38) 2 2304                      W2 = 21:
--                                        [0,20) fires: east 1 visit (s2); north 1 (s1);
--                                        west 2 visits, n 2, first_shop s3, last_shop s4 (both
--                                        start at 2: a tie is broken by value, not arrival)
--  a14   east  s3 52          52       east s1 [1,43) 5 4753, north s2 [39,49) 1 8192
--                                        east s1 starts at 1 < W2 before the batch (21): late
--                                        for stage 2's [0,20) -> LATE(per_region); W2 = 39
--  a-end                      +inf     east s3 [52,62) 1 16384                     W2 = 52:
--                                        [20,40) fires: north (s2), west (s1, n 2); then the
--                                        end: [40,60) east (s3)
-- At the end LATE(visits) ends too: late_counts [0,30) north 1 row (1024), west 1 row (64).
CREATE SOURCE input (
    region VARCHAR, shop VARCHAR, t TIMESTAMP(0), v BIGINT,
    WATERMARK FOR t AS t
) WITH (connector = 'file', path = 'parts/*.csv', batch_rows = '1');
CREATE SINK stage1 WITH (connector = 'file', format = 'csv');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late1 WITH (connector = 'file', format = 'csv');
CREATE SINK late2 WITH (connector = 'file', format = 'csv');
CREATE SINK late_counts WITH (connector = 'file', format = 'csv');

CREATE VIEW visits AS
SELECT region, shop, window_start, window_end, count(*) AS n, sum(v) AS total
FROM SESSION(input, t, INTERVAL '10' SECOND)
GROUP BY region, shop, window_start, window_end;

CREATE VIEW per_region AS
SELECT region, window_start, window_end, sum(n) AS n, count(*) AS visits,
       first_value(shop) AS first_shop, last_value(shop) AS last_shop
FROM TUMBLE(visits, window_start, INTERVAL '20' SECOND)
GROUP BY region, window_start, window_end;

CREATE VIEW late_visits AS SELECT * FROM LATE(visits);

INSERT INTO stage1 SELECT * FROM visits;
INSERT INTO out SELECT * FROM per_region;
INSERT INTO late1 SELECT * FROM late_visits;
INSERT INTO late2 SELECT * FROM LATE(per_region);
INSERT INTO late_counts
SELECT region, window_start, window_end, count(*) AS late_rows, sum(v) AS late_v
FROM TUMBLE(late_visits, t, INTERVAL '30' SECOND)
GROUP BY region, window_start, window_end;
