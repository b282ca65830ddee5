"""The tumbling job against Pathway: flight-serve's engine vs Pathway's ``windowby`` + ``reduce``.

Both run the job of :mod:`benchmarks.vs_bytewax` on the same synthetic events
(:func:`benchmarks.data.events`): count and sum of ``v`` per key in 10 s tumbling event-time
windows aligned to the Unix epoch, every window fired at the end of input.

* flight-serve: the engine as in :mod:`benchmarks.windows` (``parse_window_query(sql).build``,
  ``op.process`` per 64 Ki-row Arrow batch, ``op.finish()``).
* Pathway 0.33 (the ``bench`` extra), static (batch) mode, in this process:
  ``pw.io.csv.read(path, schema=…, mode="static")`` →
  ``table.windowby(t.t, window=pw.temporal.tumbling(duration=10 s, origin=epoch),
  instance=t.key).reduce(key, window_start, n=pw.reducers.count(), total=pw.reducers.sum(v))`` →
  ``pw.debug.table_to_pandas`` (which runs the graph to the end of its static input).

Pathway is some hundreds of times slower, so it processes only the first
:data:`PATHWAY_EVENTS` of the events; the ratio compares **throughputs** (events/s), not run
times. Each side's input is prepared before timing: Arrow record batches for the engine, a CSV
file (``key``, ``t``, ``v``) in a temporary directory for Pathway (written by pyarrow; it reads
back bit for bit, checked), which Pathway's Rust CSV reader parses inside the timed run.

Pathway is given its fastest reasonable settings, all measured on this machine:

* input from ``pw.io.csv.read(mode="static")``: the fastest static input found here.
  ``pw.debug.table_from_pandas`` of the same events was 2-3 x slower (45-65 k against 120-150 k
  events/s on 200 k events, one thread: it fingerprints every row's id in Python when the table
  is built, then feeds the rows to the engine); ``pw.io.deltalake.read`` (Parquet, no text parsing) needs a Pathway license
  key, which this benchmark does not use;
* the event time as an ``int`` (µs since the epoch, ``duration=10_000_000, origin=0``) rather
  than a ``DateTimeUtc`` column: the same windows, and cheaper for Pathway (no timestamp parsing;
  with ``table_from_pandas``, ints ran 1.2-1.6 x faster than ``datetime64[ns, UTC]``);
* ``PATHWAY_THREADS`` = the machine's CPU count (:data:`PATHWAY_THREADS`): on 1 M events on 2
  cores, 3.1-3.3 s against 5.5-6.8 s with one thread, although a run with 2 threads has a fixed
  cost of ≈ 0.5 s (1,000 events: 0.51-0.54 s, against 0.015-0.035 s on one thread). The engine's
  operator is one thread, so a one-thread Pathway run is printed for reference;
* :data:`PATHWAY_EVENTS` = 1 M events: on 200 k events Pathway's throughput was ≈ 30 % lower
  (fixed per-run costs), and ``autocommit_duration_ms`` (1,500, ``None``, 60,000) made no
  difference in static mode.

For reference the note also times Pathway on a plain ``groupby(key, t - t % 10 s)`` reduce (not
its window API; the same numbers) and on a read-only job (the CSV read and a global count: the
floor of its input path), and the engine on exactly Pathway's events.

Nothing leaves the machine: no license key is set (``pw.set_license_key(None)``; the windowby /
reduce path needs none), no monitoring server (``pw.set_monitoring_config(server_endpoint=None)``),
and the run checks that Pathway's telemetry configuration then has no tracing, logging or
metrics endpoint (with neither set, ``TelemetryConfig.create`` lists none).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from benchmarks._harness import Comparison, alternate, timed
from benchmarks.data import events
from benchmarks.vs_bytewax import _ENGINE_SQL, Windows, _engine_windows
from benchmarks.windows import BATCH_ROWS, KEYS, _engine

#: Events Pathway processes per run (the engine processes ``count``: 10 M, as in ``tumbling``).
PATHWAY_EVENTS = 1_000_000
#: Pathway's worker threads (``PATHWAY_THREADS``): every CPU.
PATHWAY_THREADS = os.cpu_count() or 1

_WINDOW_US = 10_000_000


def _pathway_csv(table: pa.Table, directory: Path) -> Path:
    """Pathway's input: ``key`` (int64), ``t`` (int64 µs since the epoch), ``v`` (float64), as
    CSV; checked to read back equal to the events."""
    micros = table.column("t").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    data = pa.table({"key": table.column("key"), "t": micros, "v": table.column("v")})
    path = directory / "events.csv"
    pacsv.write_csv(data, path)
    back = pacsv.read_csv(path)
    if not back.equals(data):
        raise RuntimeError("the CSV written for Pathway does not read back equal to the events")
    return path


@contextlib.contextmanager
def _threads(threads: int) -> Iterator[None]:
    before = os.environ.get("PATHWAY_THREADS")
    os.environ["PATHWAY_THREADS"] = str(threads)
    try:
        yield
    finally:
        if before is None:
            del os.environ["PATHWAY_THREADS"]
        else:
            os.environ["PATHWAY_THREADS"] = before


def _offline() -> None:
    """No license key, no monitoring server; fail if Pathway would still export telemetry."""
    import pathway as pw
    from pathway.internals import api

    pw.set_license_key(None)
    pw.set_monitoring_config(server_endpoint=None)
    config = api.TelemetryConfig.create(run_id="benchmark", license_key=None)
    endpoints = [*config.tracing_servers, *config.logging_servers, *config.metrics_servers]
    if endpoints or config.monitoring_server:
        raise RuntimeError(f"Pathway would send telemetry to {endpoints}; not running it")


def _pathway(path: Path, job: str = "windowby", threads: int = PATHWAY_THREADS) -> Any:
    """Run ``job`` over the CSV in Pathway's static mode; return its result (a DataFrame)."""
    import pathway as pw
    from pathway.internals.parse_graph import G

    class Event(pw.Schema):
        key: int
        t: int
        v: float

    G.clear()  # a fresh graph each run (table_to_pandas runs only what its table needs)
    t = pw.io.csv.read(str(path), schema=Event, mode="static")
    if job == "windowby":
        result = t.windowby(
            t.t, window=pw.temporal.tumbling(duration=_WINDOW_US, origin=0), instance=t.key
        ).reduce(
            key=pw.this._pw_instance,
            window_start=pw.this._pw_window_start,
            n=pw.reducers.count(),
            total=pw.reducers.sum(pw.this.v),
        )
    elif job == "groupby":
        result = (
            t.select(key=t.key, window_start=t.t - t.t % _WINDOW_US, v=t.v)
            .groupby(pw.this.key, pw.this.window_start)
            .reduce(
                pw.this.key,
                pw.this.window_start,
                n=pw.reducers.count(),
                total=pw.reducers.sum(pw.this.v),
            )
        )
    else:  # "read": the CSV read and a global count, the floor of the input path
        result = t.reduce(n=pw.reducers.count())
    with _threads(threads):
        return pw.debug.table_to_pandas(result, include_id=False)


def _pathway_windows(frame: Any) -> Windows:
    """Pathway's rows as ``(key, window start in µs) -> (count, sum)``."""
    out: Windows = {}
    for key, start, n, total in zip(
        frame["key"].tolist(),
        frame["window_start"].tolist(),
        frame["n"].tolist(),
        frame["total"].tolist(),
        strict=True,
    ):
        if (key, start) in out:
            raise RuntimeError(f"Pathway gave window ({key}, {start}) twice")
        out[(int(key), int(start))] = (int(n), float(total))
    return out


def _check(engine: Windows, pathway: Windows, what: str) -> tuple[bool, str]:
    """Same (key, window_start) rows, same counts, equal sums (to float rounding)."""
    if engine.keys() != pathway.keys():
        return False, (
            f"[red]MISMATCH[/red] ({what}): {len(engine):,} (key, window) rows vs Pathway's "
            f"{len(pathway):,}, {len(engine.keys() ^ pathway.keys()):,} not in both"
        )
    rows = sorted(engine)
    counts = [engine[w][0] for w in rows] == [pathway[w][0] for w in rows]
    ours = np.array([engine[w][1] for w in rows])
    theirs = np.array([pathway[w][1] for w in rows])
    if counts and np.allclose(ours, theirs, rtol=1e-12, atol=1e-9):
        events_ = sum(n for n, _ in engine.values())
        return True, (
            f"check ({what}): on the first {events_:,} events both produced the same "
            f"{len(rows):,} (key, window_start) rows with equal counts and sums (largest sum "
            f"difference {np.max(np.abs(ours - theirs)):.1e}: summation order)"
        )
    return (
        False,
        f"[red]MISMATCH[/red] ({what}): counts or sums differ between the engine and Pathway",
    )


def pathway(repeat: int, count: int = 10_000_000) -> list[Comparison]:
    """Tumbling 10 s, count and sum per key: the engine over ``count`` events, Pathway over the
    first :data:`PATHWAY_EVENTS` of the same events; throughputs compared.

    Raises:
        RuntimeError: Pathway is not installed (it is in the ``bench`` extra), or it would send
            telemetry.
    """
    try:
        import pathway as _pw  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "the pathway benchmark needs Pathway: pip install 'pathway==0.33.0' "
            "(in the bench extra: make bench)"
        ) from exc
    _offline()
    table = events(count, KEYS)
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    prefix = table.slice(0, min(PATHWAY_EVENTS, count))
    prefix_batches = prefix.to_batches(max_chunksize=BATCH_ROWS)
    results: dict[str, Any] = {}
    comparison = Comparison(
        name="pathway",
        subject="engine, TUMBLE 10 s, 64 Ki-row batches",
        baseline=(
            f"Pathway 0.33 csv.read(static) → windowby(tumbling 10 s) reduce, "
            f"{PATHWAY_THREADS} threads"
        ),
        units=count,
        unit="events",
        baseline_units=prefix.num_rows,
    )
    with tempfile.TemporaryDirectory(prefix="vs_pathway_") as tmp:
        path = _pathway_csv(prefix, Path(tmp))
        alternate(
            comparison,
            lambda: _engine(_ENGINE_SQL, batches),
            lambda: results.__setitem__("windowby", _pathway(path)),
            repeat,
        )
        engine_prefix = _engine_windows(_engine(_ENGINE_SQL, prefix_batches)[0])
        equal, comparison.note = _check(
            engine_prefix, _pathway_windows(results["windowby"]), "windowby"
        )
        references = []
        for label, job, threads in (
            ("Pathway windowby on 1 thread", "windowby", 1),
            (f"Pathway plain groupby(key, t - t % 10 s), {PATHWAY_THREADS} threads", "groupby",
             PATHWAY_THREADS),
            (f"Pathway's CSV read + a global count (input floor), {PATHWAY_THREADS} threads",
             "read", PATHWAY_THREADS),
        ):  # fmt: skip
            times = []
            for _ in range(repeat):
                times.append(
                    timed(lambda j=job, n=threads: results.__setitem__(j, _pathway(path, j, n)))
                )
            median = statistics.median(times)
            references.append(
                f"{label}: {median:.3f} s ({prefix.num_rows / median / 1e6:.3f} M events/s), "
                f"ratio {comparison.subject_rate / (prefix.num_rows / median):.0f}"
            )
            if job == "groupby":
                ok, text = _check(engine_prefix, _pathway_windows(results[job]), "groupby")
                equal = equal and ok
                references.append(text)
            elif job == "read" and int(results[job]["n"].iloc[0]) != prefix.num_rows:
                equal = False
                references.append("[red]MISMATCH[/red]: Pathway's count of the CSV rows")
    comparison.figures["results_equal"] = 1.0 if equal else 0.0
    # Informative: the engine on exactly Pathway's events.
    median = statistics.median(
        timed(lambda: _engine(_ENGINE_SQL, prefix_batches)) for _ in range(repeat)
    )
    references.append(
        f"the engine on the same {prefix.num_rows:,} events as Pathway: {median:.3f} s "
        f"({prefix.num_rows / median / 1e6:.2f} M events/s), "
        f"ratio {comparison.baseline_median / median:.0f}"
    )
    comparison.note += "\n  for reference, " + "\n  ".join(references)
    comparison.note += (
        "\n  ratio = events/s over events/s (Pathway processes fewer events); inputs prepared "
        "untimed: Arrow batches for the engine, a CSV file for Pathway (parsed in its timed run)"
    )
    return [comparison]
