-- Stream to stream, inside a server: read the live stream `flights_live` (fed by feed.py),
-- count departures and add up departure delays per origin per hour, write the windows into the
-- stream `hourly_delays`. Submit it to a running server and it runs there, checkpointed every
-- second, resumed after a restart or a crash, every window written once:
--
--   flight-serve submit examples/stream_to_stream/hourly_delays.sql --server grpc://127.0.0.1:8815
--
-- Event time = scheduled departure (UTC); the watermark trails the latest one by 15 minutes.
-- A window fires once the watermark passes its end, and all of them when the feeder ends its
-- input (feed.py --end-input).

SET checkpoint_interval = '1s';

CREATE SOURCE flights_live (
    id BIGINT, origin VARCHAR, sched_dep TIMESTAMP(6), dep_delay BIGINT,
    WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE
) WITH (connector = 'flight', stream = 'flights_live');

CREATE SINK hourly_delays WITH (connector = 'flight', stream = 'hourly_delays');

INSERT INTO hourly_delays
SELECT origin, window_start, window_end,
       count(*) AS departures, sum(dep_delay) AS total_dep_delay
FROM TUMBLE(flights_live, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, window_start, window_end;
