"""A pass-through plugin in a pipeline vs the same pipeline without it (issue 7).

An in-process server (``start_server``) holds the input stream: ``ROWS`` events (k string,
t timestamp[ms], v int64) in batches of ``BATCH_ROWS``, written once. Each repetition runs a
pipeline in this process (``PipelineRuntime`` with the server's plugin hub) that reads the stream
over Flight from offset 0 to its end (``stop_at_end``) and collects its output (no sink), timed
from start to the last batch:

* subject: ``SELECT * FROM pass(events)`` with one plugin **process** attached
  (``python -m benchmarks.plugins --serve URL``: ``FlightServeClient.attach_plugin`` with the
  identity function, ``max_in_flight`` 8; the function's is 16), so every batch crosses two more Flight hops;
* baseline: ``SELECT * FROM events``.

Target: ratio ≥ 0.5 (issue 7). The note gives the added latency per batch: from handing a batch
to the plugin instance to taking its result (:meth:`PluginHub.latencies_s`), median and p99 in
ms over every batch of the timed subject runs, and the seconds a bare pyarrow DoExchange echo of
the same batches takes (the transport floor). (Server pipelines commit their output at
checkpoints; timing them to the last commit would measure the checkpoint timing instead.)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
from flight_serve.flight.server import start_server
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

from benchmarks._harness import Comparison, alternate

ROWS = 8_000_000
BATCH_ROWS = 65_536
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("ms")), ("v", pa.int64())])
SOURCE = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(3), v BIGINT)
WITH (connector = 'flight', server = '{server}', stream = 'events', stop_at_end = 'true');
CREATE SINK out WITH (connector = 'stdout');
"""
WITH_PLUGIN = """
CREATE FUNCTION pass() RETURNS TABLE (k VARCHAR, t TIMESTAMP(3), v BIGINT)
WITH (connector = 'plugin', plugin = 'pass', max_in_flight = '16');
INSERT INTO out SELECT * FROM pass(events);
"""
WITHOUT = "INSERT INTO out SELECT * FROM events;"


def _batches() -> list[pa.RecordBatch]:
    keys = pa.array([f"k{i % 100}" for i in range(BATCH_ROWS)], pa.string())
    out = []
    for start in range(0, ROWS, BATCH_ROWS):
        n = min(BATCH_ROWS, ROWS - start)
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    keys.slice(0, n),
                    pa.array(range(start, start + n), pa.int64()).cast(pa.timestamp("ms")),
                    pa.array(range(start, start + n), pa.int64()),
                ],
                schema=SCHEMA,
            )
        )
    return out


class _Echo(flight.FlightServerBase):
    """A bare pyarrow DoExchange echo: the transport floor of any out-of-process plugin."""

    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        writer.begin(SCHEMA)
        for chunk in reader:
            writer.write_with_metadata(chunk.data, chunk.app_metadata)


def _echo_seconds(batches: list[pa.RecordBatch], runs: int = 3) -> float:
    """Median seconds to send ``batches`` through :class:`_Echo` and read them back (writer and
    reader on two threads of this process)."""
    server = _Echo("grpc://127.0.0.1:0")
    times = []
    try:
        with flight.connect(f"grpc://127.0.0.1:{server.port}") as client:
            for _ in range(runs):
                writer, reader = client.do_exchange(flight.FlightDescriptor.for_path("echo"))
                writer.begin(SCHEMA)
                start = time.perf_counter()
                drain = threading.Thread(target=lambda r=reader: [r.read_chunk() for _ in batches])
                drain.start()
                for batch in batches:
                    writer.write_with_metadata(batch, b'{"seq":1}')
                drain.join()
                times.append(time.perf_counter() - start)
                writer.done_writing()
                writer.close()
    finally:
        server.shutdown()
    return statistics.median(times)


def plugins(repeat: int) -> list[Comparison]:
    """The comparison (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="flight-serve-bench-plugins-"))
    with start_server(work / "data") as server, flight.connect(server.location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("events"), SCHEMA)
        with writer:
            for batch in _batches():
                writer.write_batch(batch)
                reader.read()
        root = Path(__file__).resolve().parents[1]
        plugin = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.plugins", "--serve", server.location],
            cwd=root,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(str(root / p) for p in ("server", "clients/python")),
            },
        )
        try:
            deadline = time.monotonic() + 30
            while not server.plugins.describe()["instances"].get("pass"):
                if time.monotonic() > deadline or plugin.poll() is not None:
                    raise RuntimeError("the pass-through plugin did not attach")
                time.sleep(0.05)

            def run(body: str) -> None:
                plan = parse_pipeline(SOURCE.format(server=server.location) + body)
                runtime = PipelineRuntime(plan, plugins=server.plugins)
                rows = sum(b.num_rows for _, b in runtime.run(write=False, collect=True))
                if rows != ROWS:
                    raise RuntimeError(f"the pipeline emitted {rows} rows, not {ROWS}")

            warm = len(server.plugins.latencies_s("pass"))
            comparison = Comparison(
                name="plugin_passthrough",
                subject="pipeline with a pass-through plugin process",
                baseline="the same pipeline without it",
                units=ROWS,
                unit="rows",
                nbytes=sum(b.nbytes for b in _batches()),
                ratio_target=0.5,
            )
            alternate(comparison, lambda: run(WITH_PLUGIN), lambda: run(WITHOUT), repeat)
            latencies = sorted(s * 1000 for s in server.plugins.latencies_s("pass")[warm:])
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            comparison.note = (
                f"added latency per batch of {BATCH_ROWS:,} rows (send -> result, "
                f"{len(latencies)} batches): median {statistics.median(latencies):.2f} ms, "
                f"p99 {p99:.2f} ms; a bare pyarrow DoExchange echo of the same batches (no "
                f"pipeline, one process) takes {_echo_seconds(_batches()):.3f} s"
            )
        finally:
            plugin.terminate()
            plugin.wait(10)
    return [comparison]


def _serve(location: str) -> None:
    from flight_serve_client import FlightServeClient

    with FlightServeClient(location) as client:
        client.attach_plugin("pass", lambda batch: batch, SCHEMA, SCHEMA, max_in_flight=8)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        _serve(sys.argv[2])
