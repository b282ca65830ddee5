"""The remote Flight sink (issue 7 item 3) vs a raw pyarrow DoPut into the same server.

* ``remote_sink``: a checkpointed pipeline's commit into another flight-serve, i.e.
  :class:`~flight_serve.connectors.flight.FlightStreamTarget` appending every batch (one DoPut
  per commit, each batch's PutResult awaited before the next batch is sent, then the DoPut
  finished) vs a raw ``pyarrow.flight`` client writing the same batches to the same server in one
  DoPut and reading the PutResults as they come (pipelined). Both write into a durable
  flight-serve stream (fsync per batch), in this process, on loopback, so the ratio is what the
  sink's one-batch-at-a-time acknowledgement and its per-commit call cost, nothing else.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pyarrow as pa
import pyarrow.flight as flight

from benchmarks._harness import Comparison, alternate
from benchmarks.data import flights_like

ROWS = 2_000_000
BATCH_ROWS = 65_536


@contextlib.contextmanager
def _server() -> Iterator[str]:
    from flight_serve.flight.server import start_server

    with (
        tempfile.TemporaryDirectory(prefix="flight-serve-bench-") as data_dir,
        start_server(Path(data_dir), port=0, pipelines=False) as service,
    ):
        yield str(service.location)


def _raw_put(location: str, stream: str, batches: list[pa.RecordBatch]) -> None:
    """One DoPut; PutResults read on a second thread while batches go out."""
    with flight.FlightClient(location) as client:
        descriptor = flight.FlightDescriptor.for_path(stream, "raw")
        writer, raw_reader = client.do_put(descriptor, batches[0].schema)
        reader = cast(flight.FlightMetadataReader, raw_reader)
        acks: list[int] = []

        def read() -> None:
            for _ in batches:
                if reader.read() is None:
                    return
                acks.append(1)

        thread = threading.Thread(target=read)
        thread.start()
        for batch in batches:
            writer.write_batch(batch)
        thread.join()
        writer.done_writing()
        writer.close()
    assert len(acks) == len(batches), "a PutResult is missing"


def remote_sink(repeat: int, rows: int = ROWS) -> list[Comparison]:
    """``rows`` flights-like rows in 64 Ki-row batches, and a quarter of them in 4 Ki-row
    batches (where the per-batch acknowledgement round trip shows): FlightStreamTarget vs raw
    DoPut."""
    return [
        _compare("remote_sink", repeat, rows, BATCH_ROWS),
        _compare("remote_sink_small", repeat, rows // 4, 4096),
    ]


def _compare(name: str, repeat: int, rows: int, batch_rows: int) -> Comparison:
    from flight_serve.connectors.flight import FlightStreamTarget

    batches = flights_like(rows, batch_rows)
    comparison = Comparison(
        name=name,
        subject="remote flight sink commit (FlightStreamTarget: each PutResult awaited)",
        baseline="raw pyarrow DoPut, PutResults read while writing",
        units=rows,
        unit="rows",
        nbytes=sum(b.nbytes for b in batches),
    )
    with _server() as location:
        target = FlightStreamTarget(location, "sink", batches[0].schema, "sink")
        offsets: list[int] = []

        def sink() -> None:
            offsets.extend(target.append_many(batches))
            target.committed()

        try:
            alternate(
                comparison,
                sink,
                lambda: _raw_put(location, "raw", batches),
                repeat,
            )
        finally:
            target.close()
        runs = repeat + 1  # the warm-up run too
        assert offsets == list(range(len(batches) * runs)), "the sink skipped or repeated"
        comparison.note = (
            f"  {len(batches)} batches of {batch_rows:,} rows per run; every batch acknowledged "
            f"once (offsets 0..{offsets[-1]} in order)"
        )
    return comparison
