"""The tumbling job against Bytewax: flight-serve's engine vs Bytewax's windowing operators.

Both run the same job on the same synthetic events (:func:`benchmarks.data.events`): count and
sum of ``v`` per key in 10 s tumbling event-time windows aligned to the Unix epoch, every window
fired at the end of input.

* flight-serve: the engine as in :mod:`benchmarks.windows` (``parse_window_query(sql).build``,
  ``op.process`` per 64 Ki-row Arrow batch, ``op.finish()``).
* Bytewax 0.21 (the ``bench`` extra): ``op.input(TestingSource)`` → ``op.key_on`` →
  ``bytewax.operators.windowing.fold_window`` with an ``EventClock`` and a ``TumblingWindower``,
  executed in this thread by ``bytewax.testing.run_main`` (one worker), results into a
  ``TestingSink``.

Bytewax is some hundreds of times slower, so it processes only the first :data:`BYTEWAX_EVENTS`
of the events; the ratio compares **throughputs** (events/s), not run times. Each side gets its
input in its native form, prepared before timing: Arrow record batches for the engine, a list of
``(key: str, t: datetime (UTC), v: float)`` tuples for Bytewax (its keys must be strings).

Bytewax is given its fastest reasonable settings: ``TestingSource(batch_size=65_536)`` (the
engine's batch size; the default of 1 item a batch is several times slower), ``ordered=False``
(count and sum do not depend on order; ``ordered=True`` buffers and sorts), and an event clock
whose watermark follows the event time only (``wait_for_system_duration`` 0, a constant
``now_getter``, no wake-ups), which is the engine's watermark rule (``W = max(t)``) for in-order
events. With the default ``now_getter`` the wall clock would push the watermark ahead of events
only 100 µs apart and make some late.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks._harness import Comparison, alternate, timed
from benchmarks.data import events
from benchmarks.windows import _AGGS, BATCH_ROWS, KEYS, _engine

#: Events Bytewax processes per run (the engine processes ``count``: 10 M, as in ``tumbling``).
BYTEWAX_EVENTS = 200_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WINDOW = timedelta(seconds=10)
_ENGINE_SQL = (
    f"SELECT key, window_start, window_end, {_AGGS} "
    "FROM TUMBLE(input, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end"
)

#: One event as Bytewax gets it: (key, event time, v).
Event = tuple[str, datetime, float]

#: One result row of either side: (key, window start in µs since the epoch) -> (count, sum).
Windows = dict[tuple[int, int], tuple[int, float]]


def _bytewax_items(table: pa.Table) -> list[Event]:
    """Bytewax's input: ``(str(key), t as an aware UTC datetime, v)`` per event."""
    micros = table.column("t").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    times = [_EPOCH + timedelta(microseconds=us) for us in micros.to_numpy().tolist()]
    keys = [str(k) for k in table.column("key").to_numpy().tolist()]
    values: list[float] = table.column("v").to_numpy().tolist()
    return list(zip(keys, times, values, strict=True))


def _fixed_now() -> datetime:
    return _EPOCH


def _no_wake_up(_ts: datetime) -> None:
    return None


def _bytewax(items: list[Event]) -> tuple[list[Any], list[Any]]:
    """Run the job in Bytewax; return its window results and its late items."""
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
    from bytewax.testing import TestingSink, TestingSource, run_main

    flow = Dataflow("tumbling_10s")
    up = op.input("events", flow, TestingSource(items, batch_size=BATCH_ROWS))
    keyed = op.key_on("key", up, lambda e: e[0])
    clock: EventClock[Event] = EventClock(
        ts_getter=lambda e: e[1],
        wait_for_system_duration=timedelta(0),
        now_getter=_fixed_now,
        to_system_utc=_no_wake_up,
    )
    windower = TumblingWindower(length=_WINDOW, align_to=_EPOCH)
    out = fold_window(
        "count_sum",
        keyed,
        clock,
        windower,
        builder=lambda: (0, 0.0),
        folder=lambda acc, e: (acc[0] + 1, acc[1] + e[2]),
        merger=lambda a, b: (a[0] + b[0], a[1] + b[1]),
        ordered=False,
    )
    results: list[Any] = []
    late: list[Any] = []
    op.output("results", out.down, TestingSink(results))
    op.output("late", out.late, TestingSink(late))
    run_main(flow)  # type: ignore[no-untyped-call]
    return results, late


def _bytewax_windows(results: list[Any]) -> Windows:
    """Bytewax's ``(key, (window_id, (n, total)))``; a window starts at ``align_to + id * 10 s``."""
    size_us = _WINDOW // timedelta(microseconds=1)
    out: Windows = {}
    for key, (window_id, (n, total)) in results:
        out[(int(key), window_id * size_us)] = (n, total)
    return out


def _engine_windows(outputs: list[pa.Table]) -> Windows:
    table = pa.concat_tables(outputs)
    starts = table.column("window_start").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return {
        (k, s): (n, total)
        for k, s, n, total in zip(
            table.column("key").to_numpy().tolist(),
            starts.to_numpy().tolist(),
            table.column("n").to_numpy().tolist(),
            table.column("total").to_numpy().tolist(),
            strict=True,
        )
    }


def _check(engine: Windows, bytewax: Windows, late: int) -> str:
    """Same (key, window) rows, same counts, equal sums (to float rounding), nothing late."""
    if late:
        return f"[red]MISMATCH[/red]: Bytewax put {late:,} events on its late stream"
    if engine.keys() != bytewax.keys():
        return (
            f"[red]MISMATCH[/red]: {len(engine):,} (key, window) rows vs Bytewax's {len(bytewax):,}"
        )
    same_counts = all(engine[w][0] == bytewax[w][0] for w in engine)
    keys = list(engine)
    sums_close = np.allclose([engine[w][1] for w in keys], [bytewax[w][1] for w in keys])
    if same_counts and sums_close:
        events_ = sum(n for n, _ in engine.values())
        return (
            f"check: on the first {events_:,} events both produced the same {len(engine):,} "
            "(key, window) rows, counts and sums; Bytewax put nothing on its late stream"
        )
    return "[red]MISMATCH[/red]: counts or sums differ between the engine and Bytewax"


def bytewax(repeat: int, count: int = 10_000_000) -> list[Comparison]:
    """Tumbling 10 s, count and sum per key: the engine over ``count`` events, Bytewax over the
    first :data:`BYTEWAX_EVENTS` of the same events; throughputs compared.

    Raises:
        RuntimeError: Bytewax is not installed (it is in the ``bench`` extra).
    """
    try:
        import bytewax  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "the bytewax benchmark needs Bytewax: pip install 'bytewax==0.21.1' "
            "(in the bench extra: make bench)"
        ) from exc
    table = events(count, KEYS)
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    prefix = table.slice(0, BYTEWAX_EVENTS)
    prefix_batches = prefix.to_batches(max_chunksize=BATCH_ROWS)
    items = _bytewax_items(prefix)
    results: dict[str, tuple[list[Any], list[Any]]] = {}
    comparison = Comparison(
        name="bytewax",
        subject="engine, TUMBLE 10 s, 64 Ki-row batches",
        baseline="Bytewax 0.21 fold_window, EventClock, TumblingWindower, run_main",
        units=count,
        unit="events",
        baseline_units=len(items),
        ratio_target=100.0,
    )
    alternate(
        comparison,
        lambda: _engine(_ENGINE_SQL, batches),
        lambda: results.__setitem__("bytewax", _bytewax(items)),
        repeat,
    )
    bytewax_results, late = results["bytewax"]
    engine_prefix = _engine_windows(_engine(_ENGINE_SQL, prefix_batches)[0])
    comparison.note = _check(engine_prefix, _bytewax_windows(bytewax_results), len(late))
    # Informative: the engine on exactly Bytewax's events (more of its time is per-window fixed cost).
    median = statistics.median(
        timed(lambda: _engine(_ENGINE_SQL, prefix_batches)) for _ in range(repeat)
    )
    comparison.note += (
        f"\n  for reference, the engine on the same {len(items):,} events as Bytewax: "
        f"{median:.3f} s ({len(items) / median / 1e6:.2f} M events/s), "
        f"ratio {comparison.baseline_median / median:.0f}"
    )
    comparison.note += (
        "\n  ratio = events/s over events/s (Bytewax processes fewer events); inputs prepared "
        "untimed: Arrow batches for the engine, Python tuples for Bytewax"
    )
    return [comparison]
