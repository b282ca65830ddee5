"""Windowed aggregation: the flight-serve engine vs DataFusion's batch GROUP BY over the same data.

The engine runs the query as a stream: :func:`flight_serve.pipelines.query.parse_window_query`,
``spec.build(schema)``, ``op.process(batch)`` for every 64 Ki-row batch, then ``op.finish()``
(end of input: the watermark becomes +∞ and every window fires). The baseline is DataFusion
(default session: all cores) running one batch query over the same record batches in memory, with
``date_bin`` assigning windows. Both produce one row per (key, window).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datafusion import SessionConfig, SessionContext
from flight_serve.pipelines.query import parse_window_query

from benchmarks._harness import Comparison, alternate, timed
from benchmarks.data import events

BATCH_ROWS = 65_536
KEYS = 1_000

_AGGS = "count(*) AS n, sum(v) AS total"


def _engine(
    sql: str, batches: list[pa.RecordBatch], fold_state: bool = True
) -> tuple[list[pa.Table], list[int]]:
    aggregation = replace(parse_window_query(sql).aggregation, fold_state=fold_state)
    op = aggregation.build(batches[0].schema)
    outputs: list[pa.Table] = []
    late = 0
    for batch in batches:
        emission = op.process(batch)
        if emission.output.num_rows:
            outputs.append(emission.output)
        late += emission.late.num_rows
    final = op.finish()
    if final.output.num_rows:
        outputs.append(final.output)
    return outputs, [late + final.late.num_rows]


def _datafusion(ctx: SessionContext, sql: str) -> list[pa.RecordBatch]:
    return ctx.sql(sql).collect()


def _sorted(table: pa.Table) -> pa.Table:
    return table.select(["key", "window_start", "n", "total"]).sort_by(
        [("key", "ascending"), ("window_start", "ascending")]
    )


def _check(engine: list[pa.Table], baseline: list[pa.RecordBatch]) -> str:
    """Compare the two results (untimed): same (key, window) rows, same counts, equal sums."""
    got = _sorted(pa.concat_tables(engine))
    want = _sorted(pa.Table.from_batches(baseline))
    if got.num_rows != want.num_rows:
        return f"[red]MISMATCH[/red]: {got.num_rows} windows vs {want.num_rows}"
    same_keys = got.column("key").equals(want.column("key"))
    same_starts = pc.all(
        pc.equal(
            got.column("window_start").cast(pa.int64()),
            want.column("window_start").cast(pa.int64()),
        )
    ).as_py()
    same_counts = got.column("n").cast(pa.int64()).equals(want.column("n").cast(pa.int64()))
    close_sums = np.allclose(got.column("total").to_numpy(), want.column("total").to_numpy())
    if same_keys and same_starts and same_counts and close_sums:
        return f"check: both produced the same {got.num_rows:,} (key, window) rows"
    return "[red]MISMATCH[/red] between the engine's and DataFusion's results"


def tumbling(repeat: int, count: int = 10_000_000) -> list[Comparison]:
    """Tumbling 10 s windows, count and sum per key over ``count`` events (1,000 keys)."""
    table = events(count, KEYS)
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    engine_sql = (
        f"SELECT key, window_start, window_end, {_AGGS} "
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end"
    )
    bin_ = "date_bin(INTERVAL '10 seconds', t, TIMESTAMP '1970-01-01T00:00:00Z')"
    baseline_sql = (
        f"SELECT key, {bin_} AS window_start, {bin_} + INTERVAL '10 seconds' AS window_end, "
        f"{_AGGS} FROM events GROUP BY key, {bin_}"
    )
    ctx = SessionContext()
    ctx.register_record_batches("events", [batches])
    results: dict[str, object] = {}
    comparison = Comparison(
        name="tumbling",
        subject="engine, TUMBLE 10 s, 64 Ki-row batches",
        baseline="DataFusion batch GROUP BY key, date_bin(10 s)",
        units=count,
        unit="events",
        ratio_target=0.4,
        rate_target=10e6,
    )
    alternate(
        comparison,
        lambda: results.__setitem__("engine", _engine(engine_sql, batches)[0]),
        lambda: results.__setitem__("baseline", _datafusion(ctx, baseline_sql)),
        repeat,
    )
    comparison.note = _check(results["engine"], results["baseline"])  # type: ignore[arg-type]
    comparison.note += _one_core_note(comparison, batches, baseline_sql, repeat)
    return [comparison]


def _one_core_note(
    comparison: Comparison, batches: list[pa.RecordBatch], sql: str, repeat: int
) -> str:
    """Informative: DataFusion limited to one partition (the engine's operator is one thread)."""
    ctx = SessionContext(SessionConfig().with_target_partitions(1))
    ctx.register_record_batches("events", [batches])
    median = statistics.median(timed(lambda: _datafusion(ctx, sql)) for _ in range(repeat))
    return (
        f"\n  for reference, DataFusion on one partition (target_partitions = 1): {median:.3f} s, "
        f"ratio {median / comparison.subject_median:.2f}"
    )


def hopping(repeat: int, count: int = 4_000_000) -> list[Comparison]:
    """Hopping windows of 40 s sliding by 10 s (size/slide = 4: every event is in 4 windows)."""
    table = events(count, KEYS)
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    engine_sql = (
        f"SELECT key, window_start, window_end, {_AGGS} FROM HOP(input, t, "
        "INTERVAL '10' SECOND, INTERVAL '40' SECOND) GROUP BY key, window_start, window_end"
    )
    bin_ = "date_bin(INTERVAL '10 seconds', t, TIMESTAMP '1970-01-01T00:00:00Z')"
    starts = ", ".join(f"{bin_} - INTERVAL '{10 * i} seconds'" for i in range(4))
    baseline_sql = (
        f"SELECT key, window_start, window_start + INTERVAL '40 seconds' AS window_end, {_AGGS} "
        f"FROM (SELECT key, v, unnest(make_array({starts})) AS window_start FROM events) "
        "GROUP BY key, window_start"
    )
    ctx = SessionContext()
    ctx.register_record_batches("events", [batches])
    results: dict[str, object] = {}
    comparison = Comparison(
        name="hopping",
        subject="engine, HOP 40 s / 10 s",
        baseline="DataFusion batch GROUP BY over unnest(4 window starts)",
        units=count,
        unit="events",
        rate_target=2e6,
    )
    alternate(
        comparison,
        lambda: results.__setitem__("engine", _engine(engine_sql, batches)[0]),
        lambda: results.__setitem__("baseline", _datafusion(ctx, baseline_sql)),
        repeat,
    )
    comparison.note = _check(results["engine"], results["baseline"])  # type: ignore[arg-type]
    return [comparison]


def session(repeat: int, count: int = 4_000_000) -> list[Comparison]:
    """Session windows per key with a 5 s gap. DataFusion has no session windows; its baseline
    is the tumbling GROUP BY over the same events (a floor, not an equivalent job)."""
    # 1 ms apart: a key's events come ~1 s apart; ~0.7 % of its gaps exceed 5 s and close a session.
    table = events(count, KEYS, spacing_ns=1_000_000)
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    engine_sql = (
        f"SELECT key, window_start, window_end, {_AGGS} "
        "FROM SESSION(input, t, INTERVAL '5' SECOND) GROUP BY key, window_start, window_end"
    )
    bin_ = "date_bin(INTERVAL '5 seconds', t, TIMESTAMP '1970-01-01T00:00:00Z')"
    baseline_sql = f"SELECT key, {bin_} AS window_start, {_AGGS} FROM events GROUP BY key, {bin_}"
    ctx = SessionContext()
    ctx.register_record_batches("events", [batches])
    windows: list[int] = []
    comparison = Comparison(
        name="session",
        subject="engine, SESSION gap 5 s (folded state)",
        baseline="DataFusion tumbling 5 s GROUP BY (not the same job)",
        units=count,
        unit="events",
        rate_target=5e6,
    )
    alternate(
        comparison,
        lambda: windows.append(sum(t.num_rows for t in _engine(engine_sql, batches)[0])),
        lambda: _datafusion(ctx, baseline_sql),
        repeat,
    )
    comparison.note = f"{windows[-1]:,} sessions; the ratio is informative only (different jobs)"
    # before / after: the same job on the SQL-merge path (the engine before issue 19's sessions)
    results: dict[str, list[pa.Table]] = {}
    before = Comparison(
        name="session_vs_sql_path",
        subject="engine, SESSION gap 5 s, folded state",
        baseline="the same on the SQL-merge path (fold_state = false)",
        units=count,
        unit="events",
    )
    alternate(
        before,
        lambda: results.__setitem__("folded", _engine(engine_sql, batches)[0]),
        lambda: results.__setitem__("sql", _engine(engine_sql, batches, fold_state=False)[0]),
        repeat,
    )
    got, want = (
        pa.concat_tables(results[k]).sort_by([("key", "ascending"), ("window_start", "ascending")])
        for k in ("folded", "sql")
    )
    same = got.select(["key", "window_start", "window_end", "n"]).equals(
        want.select(["key", "window_start", "window_end", "n"])
    ) and np.allclose(got["total"].to_numpy(), want["total"].to_numpy())
    before.note = (
        f"check: both paths gave the same {got.num_rows:,} sessions"
        if same
        else "[red]MISMATCH[/red] between the folded and the SQL-merge path"
    )
    return [comparison, before]
