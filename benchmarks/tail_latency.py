"""Tail latency: from the DoPut of the batch that closes a window to its row at a tailing client.

One flight-serve server in this process (loopback, a temporary data directory, durable streams
``fsync = batch``). A pipeline is **submitted** to it (``pipeline.submit``): it reads the stream
``ev`` (``flight`` source; writer ``feed`` is its one watermark partition, watermark = the latest
event time), counts and sums ``v`` per key in 1 s tumbling windows and writes them to the stream
``out`` (``flight`` sink, exactly once: a window's rows are appended when the checkpoint that
covers them commits). A client thread tails ``out`` with DoGet (``FlightServeClient.tail``,
``follow=True``) and stamps each window's arrival.

One repetition (``units`` = 1 window): the feeder DoPuts one 256-row batch of the next second of
event time (8 keys), which moves the watermark past the previous window's end, so that window
fires; the clock runs from just before the DoPut to the tailing thread receiving the window's
rows (all 8 keys). The next batch is sent only after that, so windows never overlap in flight.

Baseline (the floor of any tailing client): the same DoPut into a stream ``raw`` tailed by the
same kind of client thread, clock to the batch arriving there: durable append + DoGet delivery,
no pipeline. A **time** comparison: ratio = subject median / baseline median (lower is better);
p50 / p99 of both are printed under the table. Two rows: ``checkpoint_every = 1`` (a checkpoint,
hence a sink commit, after every source batch: the least latency exactly once allows) and the
server default ``checkpoint_interval = '1s'`` (fewer windows: each waits up to a second).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks._harness import Comparison, alternate

KEYS = 8
ROWS = 256
SCHEMA = pa.schema([("key", pa.int64()), ("t", pa.timestamp("us", tz="UTC")), ("v", pa.float64())])
START_US = 1_700_000_000 * 1_000_000


def _sql(run_option: str) -> str:
    return f"""
SET {run_option};
CREATE SOURCE ev (
    key BIGINT, t TIMESTAMP(6), v DOUBLE,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND
) WITH (connector = 'flight', stream = 'ev');
CREATE SINK out WITH (connector = 'flight', stream = 'out');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(ev, t, INTERVAL '1' SECOND)
GROUP BY key, window_start, window_end;
"""


def _batch(second: int) -> pa.RecordBatch:
    """``ROWS`` events within event-time second ``second``, every key present."""
    rows = np.arange(ROWS, dtype=np.int64)
    t = START_US + second * 1_000_000 + rows * (1_000_000 // ROWS)
    return pa.RecordBatch.from_arrays(
        [pa.array(rows % KEYS), pa.array(t, SCHEMA.field("t").type), pa.array(rows * 0.5)],
        schema=SCHEMA,
    )


class _Tail(threading.Thread):
    """Tails ``stream`` from offset 0; ``arrived(key)`` waits for ``key`` (a window start in
    µs, or an offset) to be complete and returns the ``perf_counter`` it arrived at."""

    def __init__(self, location: str, stream: str, by_window: bool) -> None:
        super().__init__(daemon=True)
        self.location, self.stream, self.by_window = location, stream, by_window
        self.seen: dict[int, int] = {}
        self.at: dict[int, float] = {}
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.stop = False

    def run(self) -> None:
        from flight_serve_client import FlightServeClient

        try:
            with FlightServeClient(self.location) as client:
                for offset, batch in client.tail(self.stream, 0, follow=True):
                    now = time.perf_counter()
                    with self.cond:
                        if self.by_window:
                            starts = batch.column("window_start").cast(pa.int64()).to_numpy()
                            for start in np.unique(starts).tolist():
                                got = self.seen.get(start, 0) + int((starts == start).sum())
                                self.seen[start] = got
                                if got >= KEYS:
                                    self.at[start] = now
                        else:
                            self.at[offset] = now
                        self.cond.notify_all()
                    if self.stop:
                        return
        except BaseException as exc:  # reported by the benchmark
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def arrived(self, key: int, timeout_s: float = 30.0) -> float:
        deadline = time.perf_counter() + timeout_s
        with self.cond:
            while key not in self.at:
                if self.error is not None:
                    raise self.error
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"{self.stream}: {key} did not arrive in {timeout_s:g} s")
                self.cond.wait(left)
            return self.at[key]


def _percentiles(values: list[float]) -> str:
    ms = np.asarray(values) * 1e3
    return f"p50 {np.percentile(ms, 50):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms"


def _one(location: str, run_option: str, windows: int, label: str) -> Comparison:
    import pyarrow.flight as flight
    from flight_serve_client import FlightServeClient

    body = {"sql": _sql(run_option), "name": f"tail_{label}"}
    with FlightServeClient(location) as client:
        client.put("ev", [_batch(0)], writer="feed")  # second 0: opens window 0
        client.put("raw", [_batch(0)], writer="feed")
    with flight.FlightClient(location) as raw:
        list(raw.do_action(flight.Action("pipeline.submit", json.dumps(body).encode())))
    out, floor = _Tail(location, "out", True), _Tail(location, "raw", False)
    out.start()
    floor.start()
    feeder = FlightServeClient(location)
    state = {"second": 0, "raw_offset": 0}

    def close_next() -> None:
        state["second"] += 1
        second = state["second"]
        started = time.perf_counter()
        feeder.put("ev", [_batch(second)], writer="feed")
        closed = START_US + (second - 1) * 1_000_000
        _record(subject_lat, out.arrived(closed) - started)

    def raw_next() -> None:
        state["raw_offset"] += 1
        started = time.perf_counter()
        feeder.put("raw", [_batch(state["raw_offset"])], writer="feed")
        _record(baseline_lat, floor.arrived(state["raw_offset"]) - started)

    subject_lat: list[float] = []
    baseline_lat: list[float] = []
    comparison = Comparison(
        name=f"tail_latency_{label}",
        subject=f"submitted pipeline ({run_option}): DoPut closing a window -> its rows at a "
        "DoGet tail of the sink stream",
        baseline="DoPut of a batch -> that batch at a DoGet tail of its stream (no pipeline)",
        units=1,
        unit="windows",
        lower_is_better=True,
        ratio_target=None,
    )
    try:
        alternate(comparison, close_next, raw_next, windows)
    finally:
        feeder.close()
        out.stop = floor.stop = True
    # the harness timed each call (put + wait + bookkeeping); the latencies are the stamps
    comparison.subject_s, comparison.baseline_s = subject_lat[1:], baseline_lat[1:]
    for side, values in (("", comparison.subject_s), ("floor_", comparison.baseline_s)):
        for q in (50, 99):
            comparison.figures[f"{side}p{q}_ms"] = float(np.percentile(values, q) * 1e3)
    target = "p99 ≤ 10 ms" if label == "every_batch" else "informative"
    comparison.note = (
        f"pipeline: {_percentiles(comparison.subject_s)}; floor (DoPut -> tail, no pipeline): "
        f"{_percentiles(comparison.baseline_s)}; {len(comparison.subject_s)} windows of {KEYS} "
        f"keys (target {target})"
    )
    return comparison


def _record(values: list[float], seconds: float) -> None:
    values.append(seconds)


def tail_latency(repeat: int) -> list[Comparison]:
    """The comparisons described in the module docstring: ``40 x repeat`` windows with a
    checkpoint every batch, ``2 x repeat`` with the default 1 s interval."""
    from flight_serve.flight.server import start_server

    results = []
    for label, option, windows in (
        ("every_batch", "checkpoint_every = 1", 40 * repeat),
        ("interval_1s", "checkpoint_interval = '1s'", 2 * repeat),
    ):
        with (
            tempfile.TemporaryDirectory(prefix="bench-tail-") as tmp,
            start_server(Path(tmp)) as svc,
        ):
            results.append(_one(svc.location, option, windows, label))
    return results
