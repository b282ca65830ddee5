"""DoPut and DoGet: a flight-serve server vs a raw pyarrow Flight server, same batches, one process.

* ``doput``: :meth:`FlightServeClient.put` into a durable flight-serve stream (every batch
  fsynced before its PutResult, every PutResult read) vs a raw ``pyarrow.flight`` client writing
  the same batches to a server whose DoPut only drains them into memory (``reader.read_all()``).
* ``doget``: GetFlightInfo(``SELECT * FROM s``) + DoGet of every endpoint through flight-serve
  (DataFusion plans it; a bare scan is sent from the stored batches, ``query.stored_scan``) vs
  GetFlightInfo + DoGet of the same table held in memory by a minimal pyarrow server
  (``RecordBatchStream``).

Both servers run in this process on loopback ports, as does the client, so both sides pay the
same GIL and gRPC costs.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.flight as flight
from flight_serve_client import FlightServeClient

from benchmarks._harness import Comparison, alternate, timed
from benchmarks.data import flights_like

ROWS = 5_000_000
BATCH_ROWS = 65_536


class DrainServer(flight.FlightServerBase):
    """The DoPut baseline: reads every batch into memory, acknowledges nothing, stores nothing."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.last: pa.Table | None = None

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        self.last = reader.read_all()


class WriteServer(flight.FlightServerBase):
    """The write floor (informative): raw pyarrow DoPut that also writes the IPC stream to a
    file as it reads it (``RecordBatchStreamWriter`` on an ``OSFile``, through the page cache)
    and ``fdatasync``-s it once at the end; no PutResults, no checks, no offsets. What a durable
    DoPut costs at least on this machine if receiving and writing were all it did."""

    def __init__(self, directory: str) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.path = Path(directory) / "put.arrows"
        self.rows = 0

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        import os

        rows = 0
        with pa.OSFile(str(self.path), "wb") as sink:
            with pa.ipc.new_stream(sink, reader.schema) as ipc:
                for chunk in reader:
                    ipc.write_batch(chunk.data)
                    rows += chunk.data.num_rows
            sink.flush()
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        self.rows = rows


class TableServer(flight.FlightServerBase):
    """The DoGet baseline: serves one in-memory table for any descriptor and ticket."""

    def __init__(self, table: pa.Table) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.table = table

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        endpoint = flight.FlightEndpoint(b"table", [])
        return flight.FlightInfo(
            self.table.schema, descriptor, [endpoint], self.table.num_rows, self.table.nbytes
        )

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        return flight.RecordBatchStream(self.table)


def _uri(location: Any) -> str:
    if isinstance(location, flight.Location):
        uri = location.uri
        return uri.decode() if isinstance(uri, bytes) else str(uri)
    return str(location)


@contextlib.contextmanager
def flight_serve_location(fsync: Literal["batch", "never"] = "batch") -> Iterator[str]:
    """Start flight-serve on a free loopback port over a temporary data directory."""
    from flight_serve.flight.server import start_server

    with (
        tempfile.TemporaryDirectory(prefix="flight-serve-bench-") as data_dir,
        start_server(Path(data_dir), port=0, fsync=fsync) as service,
    ):
        yield _uri(service.location)


def _no_fsync_note(comparison: Comparison, batches: list[pa.RecordBatch], repeat: int) -> str:
    """Informative: the same DoPut with ``fsync = never`` (page cache only), to split the cost of
    durability from the rest of the write path."""
    with flight_serve_location(fsync="never") as location, FlightServeClient(location) as client:
        times = []
        for _ in range(repeat + 1):  # the first run warms up
            times.append(timed(lambda: client.put("bench", batches, batch_rows=BATCH_ROWS)))
            client.drop("bench")
    median = statistics.median(times[1:])
    return (
        f"\n  for reference, flight-serve with fsync = never: {median:.3f} s, "
        f"ratio {comparison.baseline_median / median:.2f}"
    )


def _write_floor_note(comparison: Comparison, batches: list[pa.RecordBatch], repeat: int) -> str:
    """Informative: the raw pyarrow DoPut that also writes the stream to a file (see
    :class:`WriteServer`), so the part of the gap that any durable DoPut pays here shows."""
    rows = sum(b.num_rows for b in batches)
    with (
        tempfile.TemporaryDirectory(prefix="flight-serve-floor-") as tmp,
        WriteServer(tmp) as server,
        flight.FlightClient(f"grpc://127.0.0.1:{server.port}") as client,
    ):
        times = []
        for _ in range(repeat + 1):  # the first run warms up
            times.append(timed(lambda: _raw_put(client, batches)))
            if server.rows != rows:
                return f"\n  [red]MISMATCH[/red]: the write floor server wrote {server.rows} rows"
            server.path.unlink()
    median = statistics.median(times[1:])
    comparison.figures.update(
        write_floor_s=median, write_floor_ratio=comparison.baseline_median / median
    )
    return (
        f"\n  the write floor, raw pyarrow DoPut that also writes the IPC stream to a file and "
        f"fdatasyncs it once at the end (no PutResults): {median:.3f} s, ratio "
        f"{comparison.baseline_median / median:.2f}"
    )


def disk_floor_s(nbytes: int, repeat: int, chunk: int = 4 << 20) -> list[float]:
    """Seconds to write ``nbytes`` with ``O_DIRECT`` (4 MiB page-aligned writes, one
    ``fdatasync`` at the end) into a new file in the default temporary directory, the file system
    the benchmark's data directories are on: the disk's own durable write speed here, ``repeat``
    runs after one warm-up. ``O_DIRECT`` bypasses the page cache as the store's writer does."""
    import mmap
    import os
    import time

    buf = mmap.mmap(-1, chunk)  # anonymous maps are page-aligned, as O_DIRECT needs
    buf.write(os.urandom(chunk))
    times = []
    with tempfile.TemporaryDirectory(prefix="flight-serve-disk-") as tmp:
        path = os.path.join(tmp, "odirect")
        for _ in range(repeat + 1):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0))
            try:
                started = time.perf_counter()
                written = 0
                while written < nbytes:
                    written += os.pwrite(fd, buf, written)
                os.fdatasync(fd)
                times.append(time.perf_counter() - started)
            finally:
                os.close(fd)
            os.unlink(path)
    buf.close()
    return times[1:]


def _disk_note(comparison: Comparison, repeat: int) -> str:
    """The physical floor: the disk's O_DIRECT throughput for the same bytes, and the ratio the
    durable path could reach if it were bound by the disk alone (writes overlapping the
    transfer: ``baseline / max(baseline, disk)``)."""
    disk = statistics.median(disk_floor_s(comparison.nbytes, repeat))
    ceiling = comparison.baseline_median / max(comparison.baseline_median, disk)
    comparison.figures.update(disk_gb_s=comparison.nbytes / disk / 1e9, floor_ratio=ceiling)
    return (
        f"\n  the disk here (O_DIRECT, 4 MiB writes, one fdatasync) wrote the same "
        f"{comparison.nbytes / 1e6:,.0f} MB in {disk:.3f} s ({comparison.nbytes / disk / 1e9:.2f} "
        f"GB/s): a disk-bound durable DoPut could reach ratio {ceiling:.2f} at best"
    )


def _raw_put(client: flight.FlightClient, batches: list[pa.RecordBatch]) -> None:
    writer, _ = client.do_put(flight.FlightDescriptor.for_path("bench"), batches[0].schema)
    for batch in batches:
        writer.write_batch(batch)
    writer.close()


def _raw_get(client: flight.FlightClient) -> pa.Table:
    info = client.get_flight_info(flight.FlightDescriptor.for_command(b"SELECT * FROM s"))
    return pa.concat_tables(client.do_get(e.ticket).read_all() for e in info.endpoints)


def doput(repeat: int, rows: int = ROWS) -> list[Comparison]:
    """DoPut of ``rows`` flights-like rows in 64 Ki-row batches: durable stream vs memory drain."""
    batches = flights_like(rows, BATCH_ROWS)
    nbytes = sum(b.nbytes for b in batches)
    comparison = Comparison(
        name="doput",
        subject="DoPut into a durable stream (fsync per batch, PutResults read)",
        baseline="raw pyarrow DoPut drained into memory",
        units=rows,
        unit="rows",
        nbytes=nbytes,
        ratio_target=0.7,
    )
    with (
        flight_serve_location() as location,
        FlightServeClient(location) as client,
        DrainServer() as raw_server,
        flight.FlightClient(f"grpc://127.0.0.1:{raw_server.port}") as raw,
    ):
        stored: list[int] = []
        drained: list[int] = []

        def put() -> None:
            client.put("bench", batches, batch_rows=BATCH_ROWS)

        def after_put() -> None:
            stored.append(client.stream_info("bench")["total_records"])
            client.drop("bench")

        def after_raw() -> None:
            drained.append(-1 if raw_server.last is None else raw_server.last.num_rows)
            raw_server.last = None

        alternate(
            comparison,
            put,
            lambda: _raw_put(raw, batches),
            repeat,
            after_subject=after_put,
            after_baseline=after_raw,
        )
    ok = all(n == rows for n in stored + drained)
    comparison.note = (
        f"check: the stream and the drain server held {rows:,} rows after every put"
        if ok
        else f"[red]MISMATCH[/red]: stream rows {stored}, drained rows {drained}"
    )
    comparison.note += _no_fsync_note(comparison, batches, repeat)
    comparison.note += _write_floor_note(comparison, batches, repeat)
    comparison.note += _disk_note(comparison, repeat)
    return [comparison]


def doget(repeat: int, rows: int = ROWS) -> list[Comparison]:
    """DoGet of ``SELECT * FROM s`` (``rows`` flights-like rows) vs raw DoGet of the same table."""
    batches = flights_like(rows, BATCH_ROWS)
    table = pa.Table.from_batches(batches)
    comparison = Comparison(
        name="doget",
        subject="GetFlightInfo(SELECT * FROM s) + DoGet",
        baseline="raw pyarrow GetFlightInfo + DoGet of the table in memory",
        units=rows,
        unit="rows",
        nbytes=table.nbytes,
        ratio_target=0.7,
    )
    seen: dict[str, int] = {}
    with (
        flight_serve_location() as location,
        FlightServeClient(location) as client,
        TableServer(table) as raw_server,
        flight.FlightClient(f"grpc://127.0.0.1:{raw_server.port}") as raw,
    ):
        client.put("s", batches, batch_rows=BATCH_ROWS)
        alternate(
            comparison,
            lambda: seen.__setitem__("subject", client.query("SELECT * FROM s").num_rows),
            lambda: seen.__setitem__("baseline", _raw_get(raw).num_rows),
            repeat,
        )
    comparison.note = (
        f"check: both returned {rows:,} rows"
        if seen == {"subject": rows, "baseline": rows}
        else f"[red]MISMATCH[/red]: {seen}"
    )
    return [comparison]
