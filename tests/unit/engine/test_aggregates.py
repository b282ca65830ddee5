"""Mergeable aggregates (DESIGN §4, last bullet) against DataFusion's batch ``GROUP BY``.

Every aggregate is streamed through tumbling, hopping and session windows, cut into batches in
several ways (one batch; one row per batch; small batches merged into pane state after every
batch, ``merge_rows = 1``), and compared with DataFusion over the same rows:

* exactly where DataFusion is exact: ``count(DISTINCT)``, ``min``/``max`` over strings,
  ``first_value``/``last_value`` by event time (oracle ``first_value(x ORDER BY t, x)``, the
  documented tie rule), ``approx_percentile_cont`` on panes of at most 100 values (oracle
  ``percentile_cont``);
* to a relative 1e-9 for stddev / var (partials merge with Chan's update, not in one pass);
* within the stated error for the sketches: ``approx_distinct`` vs ``count(DISTINCT)``
  (standard error 1.6 %) and ``approx_percentile_cont`` vs ``percentile_cont`` (1 % of the value)
  on 100 000 distinct values, where the sketch results are also bit-identical however the input is
  cut (the merges are exact).

Times are integer seconds (``timestamp[s, tz=UTC]``); windows: TUMBLE 10 s, HOP 10 s every 5 s,
SESSION gap 4 s. Oracles are SQL run by DataFusion, never Python loops over rows.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import datafusion
import numpy as np
import pyarrow as pa
import pytest
from flight_serve.engine.operator import WindowOperator
from flight_serve.engine.sketches import DD_RELATIVE_ACCURACY, HLL_STANDARD_ERROR
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.query import parse_window_query

UTC_S = pa.timestamp("s", "UTC")
INPUT = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("t", UTC_S),
        pa.field("v", pa.int64()),
        pa.field("s", pa.string()),
        pa.field("f", pa.float64()),
    ]
)

# (key, t, v, s, f) in arrival order. Key "n" has only NULL values. Ties in event time: a@1
# (first_value(v) = 3, the smaller), b@12 and b@19 (last_value takes the larger). a@9 has v NULL:
# last_value(v) of a in [0, 10) is NULL (NULLs are respected), IGNORE NULLS gives 7. b@19 holds
# values near 1e9 whose spread is 1 (stddev must not cancel).
Row = tuple[str, int, int | None, str | None, float | None]
ROWS: list[Row] = [
    ("a", 1, 5, "pear", 1.5),
    ("b", 2, 10, "kiwi", 10.0),
    ("a", 1, 3, "apple", -2.0),
    ("a", 4, 5, None, 0.25),
    ("a", 3, None, "fig", None),
    ("n", 5, None, None, None),
    ("b", 6, None, None, None),
    ("a", 9, None, "date", 1e9),
    ("a", 8, 7, "apple", 7.5),
    ("n", 7, None, None, None),
    ("b", 12, 8, "lime", 8.0),
    ("b", 12, -4, "lime", -4.0),
    ("a", 17, 2, "plum", 2.0),
    ("a", 13, 2, "plum", 2.0),
    ("b", 19, 1_000_000_001, "kiwi", 1e9 + 2),
    ("b", 19, 1_000_000_000, "kiwi", 1e9 + 1),
    ("b", 18, 999_999_999, "Kiwi", 1e9),
    ("a", 25, 1, "fig", 3.0),
    ("b", 33, None, "", None),
    ("b", 31, 0, "", 0.0),
]

# (query aggregate, DataFusion batch oracle, comparison): "eq" exact, "rel" 1e-9 relative,
# "hll" within the HyperLogLog error (and +-1 on tiny counts)
AGGREGATES: list[tuple[str, str, str]] = [
    ("count(DISTINCT s)", "count(DISTINCT s)", "eq"),
    ("count(DISTINCT v)", "count(DISTINCT v)", "eq"),
    ("min(s)", "min(s)", "eq"),
    ("max(s)", "max(s)", "eq"),
    ("stddev(v)", "stddev(v)", "rel"),
    ("stddev_samp(f)", "stddev_samp(f)", "rel"),
    ("stddev_pop(v)", "stddev_pop(v)", "rel"),
    ("var(f)", "var(f)", "rel"),
    ("var_samp(v)", "var_samp(v)", "rel"),
    ("var_pop(f)", "var_pop(f)", "rel"),
    ("first_value(v)", "first_value(v ORDER BY t, v)", "eq"),
    ("last_value(v)", "last_value(v ORDER BY t, v NULLS FIRST)", "eq"),
    ("first_value(s)", "first_value(s ORDER BY t, s)", "eq"),
    ("last_value(s)", "last_value(s ORDER BY t, s NULLS FIRST)", "eq"),
    (
        "first_value(v) IGNORE NULLS",
        "first_value(v ORDER BY t, v) FILTER (WHERE v IS NOT NULL)",
        "eq",
    ),
    (
        "last_value(f) IGNORE NULLS",
        "last_value(f ORDER BY t, f NULLS FIRST) FILTER (WHERE f IS NOT NULL)",
        "eq",
    ),
    ("approx_distinct(s)", "count(DISTINCT s)", "hll"),
    ("approx_distinct(f)", "count(DISTINCT f)", "hll"),
    ("approx_percentile_cont(v, 0.5)", "percentile_cont(v, 0.5)", "rel"),
    ("approx_percentile_cont(0.9) WITHIN GROUP (ORDER BY f)", "percentile_cont(f, 0.9)", "rel"),
    ("approx_percentile_cont(f, 0.0)", "percentile_cont(f, 0.0)", "rel"),
]
WINDOWS = {
    "tumbling": "TUMBLE(input, t, INTERVAL '10' SECOND)",
    "hopping": "HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND)",
    "session": "SESSION(input, t, INTERVAL '4' SECOND)",
}
ORDER = "ORDER BY window_end, window_start, key"


def table_of(rows: Sequence[Row]) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(zip(INPUT.names, r, strict=True)) for r in rows], INPUT
    ).combine_chunks()


def no_late_bound(rows: Sequence[Row]) -> int:
    """The smallest watermark bound (seconds) that makes no row of this arrival order late."""
    times = np.array([r[1] for r in rows], dtype=np.int64)
    return int((np.maximum.accumulate(times) - times).max())


def window_sql(window: str, aggregates: Sequence[str], rows: Sequence[Row] = ROWS) -> str:
    items = ", ".join(f'{a} AS "a{i}"' for i, a in enumerate(aggregates))
    return (
        f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{no_late_bound(rows)}' SECOND);\n"
        f"SELECT key, window_start, window_end, {items}\n"
        f"FROM {WINDOWS[window]}\nGROUP BY key, window_start, window_end"
    )


def oracle_sql(window: str, aggregates: Sequence[str]) -> str:
    items = ", ".join(f'{a} AS "a{i}"' for i, a in enumerate(aggregates))
    if window == "tumbling":
        return (
            "WITH w AS (SELECT *, CAST(t AS BIGINT) AS ts,"
            " CAST(t AS BIGINT) - ((CAST(t AS BIGINT) % 10) + 10) % 10 AS ws FROM input)"
            f" SELECT key, ws AS window_start, ws + 10 AS window_end, {items}"
            f" FROM w GROUP BY key, ws {ORDER}"
        )
    if window == "hopping":
        return (
            "WITH r AS (SELECT *, CAST(t AS BIGINT) AS ts FROM input),"
            " l AS (SELECT *, ts - (((ts % 5) + 5) % 5) AS last FROM r),"
            " w AS (SELECT *, unnest(generate_series(last, last - 10, -5)) AS ws FROM l)"
            f" SELECT key, ws AS window_start, ws + 10 AS window_end, {items}"
            f" FROM w WHERE ws + 10 > ts GROUP BY key, ws {ORDER}"
        )
    return (
        "WITH r AS (SELECT *, CAST(t AS BIGINT) AS ts FROM input),"
        " p AS (SELECT *, lag(ts) OVER (PARTITION BY key ORDER BY ts) AS prev FROM r),"
        " s AS (SELECT *, sum(CASE WHEN prev IS NULL OR ts - prev >= 4 THEN 1 ELSE 0 END)"
        "       OVER (PARTITION BY key ORDER BY ts ROWS UNBOUNDED PRECEDING) AS sid FROM p)"
        f" SELECT key, min(ts) AS window_start, max(ts) + 4 AS window_end, {items}"
        f" FROM s GROUP BY key, sid {ORDER}"
    )


def oracle(sql: str, table: pa.Table) -> pa.Table:
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("input", [table.to_batches()])
    return ctx.sql(sql).to_arrow_table()


def run(op: WindowOperator, table: pa.Table, cuts: Sequence[int]) -> pa.Table:
    """Feed ``table`` cut before each index of ``cuts``, then finish; all output, in order."""
    bounds = [0, *sorted(set(cuts)), table.num_rows]
    outputs = [
        op.process(table.slice(lo, hi - lo).to_batches()[0]).output
        for lo, hi in itertools.pairwise(bounds)
        if hi > lo
    ]
    outputs.append(op.finish().output)
    return pa.concat_tables(outputs)


CUTS = {
    "one batch": ([], None),
    "row by row": (list(range(1, len(ROWS))), None),
    "merge every 3 rows": (list(range(3, len(ROWS), 3)), 1),
}


def stream(sql: str, table: pa.Table, cut: str) -> pa.Table:
    cuts, merge_rows = CUTS[cut]
    aggregation = parse_window_query(sql).aggregation
    if merge_rows is not None:
        aggregation = replace(aggregation, merge_rows=merge_rows)
    return run(aggregation.build(table.schema), table, cuts)


def close(a: Any, b: Any, how: str) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if how == "eq":
        return bool(a == b)
    if how == "rel":
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    assert how == "hll"
    return abs(a - b) <= max(1, 3 * HLL_STANDARD_ERROR * b)


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("window", list(WINDOWS))
def test_every_aggregate_equals_datafusion_group_by(window: str, cut: str) -> None:
    table = table_of(ROWS)
    got = stream(window_sql(window, [a for a, _, _ in AGGREGATES]), table, cut)
    want = oracle(oracle_sql(window, [o for _, o, _ in AGGREGATES]), table)
    bounds = ["key", "window_start", "window_end"]
    assert (
        got.select(bounds).to_pylist()
        == want.select(bounds).cast(got.select(bounds).schema).to_pylist()
    )
    mismatches = [
        (AGGREGATES[i][0], row["key"], row["window_start"], g, w)
        for i in range(len(AGGREGATES))
        for row, g, w in zip(
            got.to_pylist(), got[f"a{i}"].to_pylist(), want[f"a{i}"].to_pylist(), strict=True
        )
        if not close(g, w, AGGREGATES[i][2])
    ]
    assert mismatches == []


def test_all_null_input_gives_datafusion_empty_results() -> None:
    # key "n" has two rows, every value NULL: counts are 0, everything else NULL
    table = table_of([r for r in ROWS if r[0] == "n"])
    aggregates = [a for a, _, _ in AGGREGATES]
    out = stream(window_sql("tumbling", aggregates, ROWS), table, "one batch").to_pylist()
    assert len(out) == 1
    values = {a: out[0][f"a{i}"] for i, a in enumerate(aggregates)}
    zero = {"count(DISTINCT s)", "count(DISTINCT v)", "approx_distinct(s)", "approx_distinct(f)"}
    assert values == {a: 0 if a in zero else None for a in aggregates}
    want = oracle(oracle_sql("tumbling", [o for _, o, _ in AGGREGATES]), table).to_pylist()[0]
    assert [values[a] for a in aggregates] == [want[f"a{i}"] for i in range(len(aggregates))]


def test_result_types_are_datafusions() -> None:
    schema = pa.schema(
        [
            pa.field("key", pa.string()),
            pa.field("t", UTC_S),
            pa.field("i", pa.int32()),
            pa.field("x", pa.float32()),
            pa.field("d", pa.decimal128(12, 2)),
            pa.field("s", pa.string()),
        ]
    )
    aggregates = [
        "count(DISTINCT s)",
        "min(s)",
        "first_value(d)",
        "last_value(x)",
        "stddev(i)",
        "var_pop(d)",
        "stddev_pop(x)",
        "approx_distinct(i)",
        "approx_percentile_cont(i, 0.5)",
        "approx_percentile_cont(x, 0.5)",
        "approx_percentile_cont(d, 0.5)",
    ]
    sql = window_sql("tumbling", aggregates)
    op = parse_window_query(sql).build(schema)
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("input", [[pa.RecordBatch.from_pylist([], schema)]])
    items = ", ".join(f'{a} AS "a{i}"' for i, a in enumerate(aggregates))
    want = ctx.sql(f"SELECT {items} FROM input").schema()
    assert [op.output_schema.field(f"a{i}").type for i in range(len(aggregates))] == [
        want.field(f"a{i}").type for i in range(len(aggregates))
    ]


def test_approx_distinct_takes_any_type_datafusion_can_print() -> None:
    # binary need not be UTF-8; floats (which DataFusion's approx_distinct rejects) are fine
    columns: dict[str, pa.Array[Any]] = {
        "b": pa.array([b"\xff", b"a", b"\xff", None, b"\x00\xfe"], pa.binary()),
        "x": pa.array([1.5, -0.5, 1.5, None, 2.0], pa.float32()),
        "d": pa.array([1, 2, 1, None, 3]).cast(pa.decimal128(30, 3)),
        "w": pa.array([1, 2, 1, None, 3], pa.int64()).cast(pa.timestamp("ms")),
        "o": pa.array([True, False, True, None, True]),
    }
    table = pa.table(
        {"key": pa.array(["k"] * 5), "t": pa.array(range(5), pa.int64()).cast(UTC_S), **columns}
    )
    sql = window_sql("tumbling", [f"approx_distinct({c})" for c in columns])
    op = parse_window_query(sql).build(table.schema)
    out = run(op, table, [2]).to_pylist()
    assert [out[0][f"a{i}"] for i in range(len(columns))] == [3, 3, 3, 3, 2]


def test_stddev_does_not_cancel_on_large_offsets() -> None:
    # 5 000 values 1e9 + {0, 1, 2, 3}, merged into pane state 50 times; a running
    # (count, sum, sum of squares) in float64 would lose every digit here
    n = 5000
    t = np.arange(n) % 10
    v = 1e9 + (np.arange(n) % 4)
    table = pa.table(
        {
            "key": pa.array(["a"] * n),
            "t": pa.array(t, pa.int64()).cast(UTC_S),
            "v": pa.array(np.arange(n) % 4 + 1_000_000_000, pa.int64()),
            "s": pa.nulls(n, pa.string()),
            "f": pa.array(v),
        }
    )
    aggregation = parse_window_query(
        window_sql("tumbling", ["var_pop(f)", "stddev(v)"], ROWS)
    ).aggregation
    op = replace(aggregation, merge_rows=1).build(table.schema)
    out = run(op, table, list(range(100, n, 100))).to_pylist()[0]
    assert math.isclose(out["a0"], float(np.var(v)), rel_tol=1e-9)
    assert math.isclose(out["a1"], float(np.std(v, ddof=1)), rel_tol=1e-9)


# --- sketches on 100 000 distinct values ----------------------------------------------------------

BIG_N = 100_000
PERCENTILES = (0.01, 0.5, 0.99)


@pytest.fixture(scope="module")
def big_table() -> pa.Table:
    """100 000 rows of key "a" over 100 s, ``v`` all distinct (spread over six decades), ``s``
    their text; rows shuffled in time within each 10 s."""
    rng = np.random.default_rng(7)
    t = np.sort(rng.integers(0, 100, BIG_N))
    t = t + rng.integers(-3, 4, BIG_N).clip(-t, 99 - t)
    v = rng.permutation(np.unique(rng.integers(1, 10**6, 3 * BIG_N)))[:BIG_N] * 7
    return pa.table(
        {
            "key": pa.array(np.full(BIG_N, "a")),
            "t": pa.array(t, pa.int64()).cast(UTC_S),
            "v": pa.array(v, pa.int64()),
            "s": pa.array(v.astype(str)),
            "f": pa.array(v / 3.0),
        }
    )


def big_sql(window: str, table: pa.Table) -> str:
    t = table["t"].cast(pa.int64()).to_numpy()
    bound = int((np.maximum.accumulate(t) - t).max())
    items = ", ".join(
        ["approx_distinct(s) AS ad", "approx_distinct(v) AS av", "count(DISTINCT v) AS cd"]
        + [f'approx_percentile_cont(f, {q}) AS "p{q}"' for q in PERCENTILES]
    )
    return (
        f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{bound}' SECOND);\n"
        f"SELECT key, window_start, window_end, {items} FROM {WINDOWS[window]}\n"
        "GROUP BY key, window_start, window_end"
    )


@pytest.mark.parametrize("window", ["tumbling", "session"])
def test_sketches_within_stated_error_and_independent_of_batch_cutting(
    window: str, big_table: pa.Table
) -> None:
    big_window = {"tumbling": "TUMBLE(input, t, INTERVAL '100' SECOND)"}
    sql = big_sql(window, big_table)
    if window in big_window:
        sql = sql.replace(WINDOWS[window], big_window[window])
    aggregation = parse_window_query(sql).aggregation
    whole = run(aggregation.build(big_table.schema), big_table, [])
    cut = run(
        replace(aggregation, merge_rows=1).build(big_table.schema),
        big_table,
        list(range(7_919, BIG_N, 7_919)),
    )
    assert whole.equals(cut)  # the merges are exact: bit-identical results
    assert whole.num_rows == 1
    row = whole.to_pylist()[0]
    assert row["cd"] == BIG_N
    for name in ("ad", "av"):
        assert abs(row[name] / BIG_N - 1) <= 3 * HLL_STANDARD_ERROR, (name, row[name])
    exact = oracle(
        "SELECT "
        + ", ".join(f'percentile_cont(f, {q}) AS "p{q}"' for q in PERCENTILES)
        + " FROM input",
        big_table,
    ).to_pylist()[0]
    for q in PERCENTILES:
        got, want = row[f"p{q}"], exact[f"p{q}"]
        assert abs(got - want) <= DD_RELATIVE_ACCURACY * want, (q, got, want)


def test_hopping_sketches_equal_per_window_oracles(big_table: pa.Table) -> None:
    # 20 panes of about 10 000 rows, each row in two windows
    small = big_table.slice(0, BIG_N // 5)
    aggregation = replace(parse_window_query(big_sql("hopping", small)).aggregation, merge_rows=1)
    got = run(aggregation.build(small.schema), small, list(range(1_000, small.num_rows, 1_000)))
    want = oracle(
        oracle_sql(
            "hopping",
            ["count(DISTINCT s)", "count(DISTINCT v)", "count(DISTINCT v)"]
            + [f"percentile_cont(f, {q})" for q in PERCENTILES],
        ),
        small,
    )
    assert got.num_rows == want.num_rows > 1
    for g, w in zip(got.to_pylist(), want.to_pylist(), strict=True):
        assert g["cd"] == w["a2"]
        for name, col in (("ad", "a0"), ("av", "a1")):
            assert abs(g[name] - w[col]) <= max(2, 4 * HLL_STANDARD_ERROR * w[col])
        for i, q in enumerate(PERCENTILES):
            want_q = w[f"a{3 + i}"]
            assert abs(g[f"p{q}"] - want_q) <= DD_RELATIVE_ACCURACY * abs(want_q)


# --- snapshots ---------------------------------------------------------------------------------


def ipc_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_snapshot_mid_stream_changes_neither_later_results_nor_itself() -> None:
    sql = window_sql(
        "session", ["count(DISTINCT s)", "min(s)", "approx_distinct(s)", "max(s)", "first_value(s)"]
    )
    table = table_of(ROWS)
    batches = [table.slice(i, 2).to_batches()[0] for i in range(0, table.num_rows, 2)]
    aggregation = replace(parse_window_query(sql).aggregation, merge_rows=1)

    plain = aggregation.build(INPUT)
    expected = [plain.process(b).output for b in batches] + [plain.finish().output]

    live = aggregation.build(INPUT)
    outputs, snapshots = [], []
    for b in batches:
        outputs.append(live.process(b).output)
        snap = live.snapshot()
        state = snap.panes
        snapshots.append((state, ipc_bytes(state)))
        live.snapshot()  # twice in a row: still nothing consumed
    outputs.append(live.finish().output)

    assert [o.to_pylist() for o in outputs] == [o.to_pylist() for o in expected]
    assert any(s.num_rows for s, _ in snapshots)  # the snapshots did hold live pane state
    assert all(ipc_bytes(s) == raw for s, raw in snapshots)  # and no later step changed them


# --- SQL surface ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aggregate", "message"),
    [
        ("count(DISTINCT v, s)", "takes one column"),
        ("sum(DISTINCT v)", "only count(DISTINCT column)"),
        ("approx_percentile_cont(v, 1.5)", "between 0 and 1"),
        ("approx_percentile_cont(v)", "takes (column, percentile)"),
        ("approx_percentile_cont(v, 0.5, 100)", "takes (column, percentile)"),
        ("approx_percentile_cont(v, s)", "number literal"),
        ("first_value(v ORDER BY t)", "ordered by event time"),
        ("sum(v) IGNORE NULLS", "IGNORE NULLS applies to first_value and last_value"),
        ("var(*)", "expected a column name"),
    ],
)
def test_unsupported_aggregate_forms_are_sql_errors(aggregate: str, message: str) -> None:
    with pytest.raises(PipelineSQLError, match=re.escape(message)):
        parse_window_query(window_sql("tumbling", [aggregate]))


def test_same_aggregate_is_computed_once_and_percentile_desc_mirrors() -> None:
    q = parse_window_query(
        window_sql(
            "tumbling",
            [
                "approx_percentile_cont(f, 0.25)",
                "approx_percentile_cont(0.75) WITHIN GROUP (ORDER BY f DESC)",
                "approx_percentile_cont(f, 0.5)",
                "variance(f)",
                "var_samp(f)",
                "approx_count_distinct(s)",
            ],
        )
    )
    calls = [(a.func, a.percentile) for a in q.aggregation.aggregates]
    assert calls == [
        ("approx_percentile_cont", 0.25),
        ("approx_percentile_cont", 0.5),
        ("var_samp", None),
        ("approx_distinct", None),
    ]
