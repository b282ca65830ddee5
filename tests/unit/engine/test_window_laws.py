"""Hypothesis laws of event-time windows (DESIGN §4, STYLE habit 8).

* window assignment: a row lands in exactly ``size/slide`` hopping windows when ``slide`` divides
  ``size``, every one containing it; tumbling puts ``t`` in ``[start, start + size)``;
* when nothing is late, final results depend neither on how the input is cut into batches nor, for
  sessions, on arrival order;
* tumbling and hopping results equal DataFusion's batch ``GROUP BY`` over the same rows, sessions
  equal a gap-and-islands query (``LAG`` + running ``sum``): the oracles are SQL, run by DataFusion,
  never Python loops over rows;
* with any arrival order, bound ``B``, allowed lateness ``L`` and batching, a tumbling or hopping
  window holds exactly the rows that were on time for it (``window_end + L > W`` on arrival, ``W``
  the largest event time of the earlier batches minus ``B``), and the late side output holds
  exactly the rows on time for none of their windows: the watermark rule, written as SQL.

"Nothing is late" is arranged with the smallest sufficient bound: ``B = max_i (max(t_0..t_i) - t_i)``
(the largest disorder of the arrival order), so every row is at or after ``W`` on arrival and
``W ≤ t < window_end`` holds for each of its windows, however the rows are cut into batches.

Times are integer seconds (``timestamp[s, tz=UTC]``), values integers, so sums are exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import datafusion
import numpy as np
import pyarrow as pa
from flight_serve.engine.windows import HoppingWindow, TumblingWindow
from flight_serve.pipelines.query import parse_window_query
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

LAWS = settings(
    derandomize=True,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FAST_LAWS = settings(LAWS, max_examples=200)

UTC_S = pa.timestamp("s", "UTC")
KEYS = ("a", "b", "c")
AGGREGATES = "count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi"
ORDER = "ORDER BY window_end, window_start, key"

Row = tuple[str, int, int]


def input_table(rows: Sequence[Row]) -> pa.Table:
    """``id`` (arrival position), ``key``, ``t`` (timestamp[s, UTC]), ``v`` from ``(key, t, v)``."""
    return pa.table(
        {
            "id": pa.array(range(len(rows)), pa.int64()),
            "key": pa.array([k for k, _, _ in rows], pa.string()),
            "t": pa.array([t for _, t, _ in rows], pa.int64()).cast(UTC_S),
            "v": pa.array([v for _, _, v in rows], pa.int64()),
        }
    )


def no_late_bound(rows: Sequence[Row]) -> int:
    """The smallest watermark bound that makes no row of this arrival order late (seconds)."""
    times = np.array([t for _, t, _ in rows], dtype=np.int64)
    return int((np.maximum.accumulate(times) - times).max()) if len(times) else 0


def source(bound_s: int) -> str:
    return f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{bound_s}' SECOND);\n"


def window_sql(frm: str) -> str:
    return (
        f"SELECT key, window_start, window_end, {AGGREGATES}\n"
        f"FROM {frm}\nGROUP BY key, window_start, window_end"
    )


@dataclass
class Result:
    output: pa.Table
    late: pa.Table
    output_schema: pa.Schema
    fired_before_end: bool


def stream(sql: str, table: pa.Table, cuts: Sequence[int]) -> Result:
    """Feed ``table`` cut before each index of ``cuts``, then finish; concatenate what came out."""
    op = parse_window_query(sql).build(table.schema)
    bounds = [0, *sorted(set(cuts)), table.num_rows]
    outputs, late = [], []
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            em = op.process(table.slice(lo, hi - lo).combine_chunks().to_batches()[0])
            outputs.append(em.output)
            late.append(em.late)
    early = any(o.num_rows for o in outputs)
    end = op.finish()
    outputs.append(end.output)
    late.append(end.late)
    return Result(pa.concat_tables(outputs), pa.concat_tables(late), op.output_schema, early)


def oracle(sql: str, table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Run ``sql`` over ``table`` registered as ``input`` in DataFusion; cast to ``schema``."""
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("input", [table.to_batches()])
    return ctx.sql(sql).to_arrow_table().cast(schema)


def tumbling_oracle(size_s: int) -> str:
    size = f"INTERVAL '{size_s} seconds'"
    return (
        f"SELECT key, window_start, window_start + {size} AS window_end, n, total, lo, hi FROM ("
        f"  SELECT key, date_bin({size}, t, TIMESTAMP '1970-01-01T00:00:00Z') AS window_start,"
        f"         {AGGREGATES} FROM input GROUP BY 1, 2"
        f") {ORDER}"
    )


def hopping_oracle(size_s: int, slide_s: int) -> str:
    # the last window start at or before t (floor to the slide), then every slide back to
    # last - size; a candidate is kept when it contains t
    return (
        "WITH r AS (SELECT key, v, CAST(t AS BIGINT) AS ts FROM input),"
        f" l AS (SELECT *, ts - (((ts % {slide_s}) + {slide_s}) % {slide_s}) AS last FROM r),"
        f" w AS (SELECT key, v, ts,"
        f"       unnest(generate_series(last, last - {size_s}, -{slide_s})) AS ws FROM l)"
        f" SELECT key, ws AS window_start, ws + {size_s} AS window_end, {AGGREGATES}"
        f" FROM w WHERE ws + {size_s} > ts GROUP BY key, ws {ORDER}"
    )


def session_oracle(gap_s: int) -> str:
    # gap-and-islands: a row more than gap after its key's previous row starts a new session
    return (
        "WITH r AS (SELECT key, v, CAST(t AS BIGINT) AS ts FROM input),"
        " p AS (SELECT *, lag(ts) OVER (PARTITION BY key ORDER BY ts) AS prev FROM r),"
        f" s AS (SELECT *, sum(CASE WHEN prev IS NULL OR ts - prev >= {gap_s} THEN 1 ELSE 0 END)"
        "       OVER (PARTITION BY key ORDER BY ts ROWS UNBOUNDED PRECEDING) AS sid FROM p)"
        f" SELECT key, min(ts) AS window_start, max(ts) + {gap_s} AS window_end, {AGGREGATES}"
        f" FROM s GROUP BY key, sid {ORDER}"
    )


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


# --- strategies -------------------------------------------------------------------------------

rows_st = st.lists(
    st.tuples(st.sampled_from(KEYS), st.integers(-40, 120), st.integers(-5, 9)),
    min_size=1,
    max_size=40,
)


@st.composite
def nearly_ordered_rows(draw: st.DrawFn) -> list[Row]:
    """Rows in event-time order, each moved back by up to ``disorder`` seconds: the watermark
    then passes window ends mid-stream, as in a real stream."""
    rows = sorted(draw(rows_st), key=lambda r: r[1])
    disorder = draw(st.integers(0, 15))
    jitter = draw(st.lists(st.integers(0, disorder), min_size=len(rows), max_size=len(rows)))
    return [(k, t - d, v) for (k, t, v), d in zip(rows, jitter, strict=True)]


@st.composite
def rows_and_cuts(draw: st.DrawFn) -> tuple[list[Row], list[int], list[int]]:
    """Rows in arrival order (arbitrary or nearly ordered) and two ways to cut them into
    batches."""
    rows = draw(st.one_of(rows_st, nearly_ordered_rows()))
    cut = st.lists(st.integers(1, max(1, len(rows) - 1)), max_size=len(rows))
    return rows, draw(cut), draw(cut)


# --- assignment -------------------------------------------------------------------------------

instants_ns = st.lists(st.integers(-(10**17), 10**17), min_size=1, max_size=50)


@FAST_LAWS
@given(
    ts=instants_ns,
    slide_us=st.integers(1, 10**9),
    k=st.integers(1, 6),
    offset_us=st.integers(-(10**9), 10**9),
)
def test_hopping_row_lands_in_exactly_size_over_slide_windows(
    ts: list[int], slide_us: int, k: int, offset_us: int
) -> None:
    w = HoppingWindow(
        size=timedelta(microseconds=slide_us * k),
        slide=timedelta(microseconds=slide_us),
        offset=timedelta(microseconds=offset_us),
    )
    t = np.array(ts, dtype=np.int64)
    rows, starts = w.assign_ns(t)
    assert np.array_equal(np.bincount(rows, minlength=len(t)), np.full(len(t), k))
    assert (starts <= t[rows]).all()
    assert (t[rows] < w.end_ns(starts)).all()
    assert (np.mod(starts - w.offset_ns, w.slide_ns) == 0).all()
    pairs = set(zip(rows.tolist(), starts.tolist(), strict=True))
    assert len(pairs) == len(rows)  # k distinct windows per row


@FAST_LAWS
@given(ts=instants_ns, size_us=st.integers(1, 10**9), offset_us=st.integers(-(10**9), 10**9))
def test_tumbling_puts_t_in_start_to_start_plus_size(
    ts: list[int], size_us: int, offset_us: int
) -> None:
    w = TumblingWindow(
        size=timedelta(microseconds=size_us), offset=timedelta(microseconds=offset_us)
    )
    t = np.array(ts, dtype=np.int64)
    rows, starts = w.assign_ns(t)
    assert np.array_equal(rows, np.arange(len(t)))
    assert (starts <= t).all()
    assert (t < starts + w.size_ns).all()
    assert (np.mod(starts - w.offset_ns, w.size_ns) == 0).all()


# --- no late rows: batch cuts do not matter, DataFusion agrees --------------------------------


def check_final_results(sql: str, rows: list[Row], cuts_a: list[int], cuts_b: list[int]) -> Result:
    """Two batchings give the same output, in the same order, and nothing is late."""
    table = input_table(rows)
    a = stream(sql, table, cuts_a)
    b = stream(sql, table, cuts_b)
    assert a.late.num_rows == 0
    assert b.late.num_rows == 0
    assert rows_of(a.output) == rows_of(b.output)
    ordered = a.output.sort_by(
        [("window_end", "ascending"), ("window_start", "ascending"), ("key", "ascending")]
    )
    assert rows_of(a.output) == rows_of(ordered)  # every step emits in window_end order
    fired_early = a.fired_before_end or b.fired_before_end
    event("some window fired before end of input" if fired_early else "all fired at end")
    return a


@LAWS
@given(data=rows_and_cuts(), size_s=st.integers(1, 30))
def test_tumbling_is_batch_independent_and_equals_group_by(
    data: tuple[list[Row], list[int], list[int]], size_s: int
) -> None:
    rows, cuts_a, cuts_b = data
    sql = source(no_late_bound(rows)) + window_sql(f"TUMBLE(input, t, INTERVAL '{size_s}' SECOND)")
    result = check_final_results(sql, rows, cuts_a, cuts_b)
    expected = oracle(tumbling_oracle(size_s), input_table(rows), result.output_schema)
    assert rows_of(result.output) == rows_of(expected)


@LAWS
@given(data=rows_and_cuts(), slide_s=st.integers(1, 10), size_extra=st.integers(0, 25))
def test_hopping_is_batch_independent_and_equals_group_by(
    data: tuple[list[Row], list[int], list[int]], slide_s: int, size_extra: int
) -> None:
    rows, cuts_a, cuts_b = data
    size_s = slide_s + size_extra  # slide need not divide size
    hop = f"HOP(input, t, INTERVAL '{slide_s}' SECOND, INTERVAL '{size_s}' SECOND)"
    sql = source(no_late_bound(rows)) + window_sql(hop)
    result = check_final_results(sql, rows, cuts_a, cuts_b)
    expected = oracle(hopping_oracle(size_s, slide_s), input_table(rows), result.output_schema)
    assert rows_of(result.output) == rows_of(expected)


@LAWS
@given(data=rows_and_cuts(), gap_s=st.integers(1, 20))
def test_session_is_batch_independent_and_equals_gaps_and_islands(
    data: tuple[list[Row], list[int], list[int]], gap_s: int
) -> None:
    rows, cuts_a, cuts_b = data
    sql = source(no_late_bound(rows)) + window_sql(f"SESSION(input, t, INTERVAL '{gap_s}' SECOND)")
    result = check_final_results(sql, rows, cuts_a, cuts_b)
    expected = oracle(session_oracle(gap_s), input_table(rows), result.output_schema)
    assert rows_of(result.output) == rows_of(expected)


@LAWS
@given(rows=rows_st, order=st.randoms(use_true_random=False), gap_s=st.integers(1, 20))
def test_session_merging_does_not_depend_on_arrival_order(
    rows: list[Row], order: Any, gap_s: int
) -> None:
    shuffled = list(rows)
    order.shuffle(shuffled)
    bound = max(no_late_bound(rows), no_late_bound(shuffled))
    sql = source(bound) + window_sql(f"SESSION(input, t, INTERVAL '{gap_s}' SECOND)")
    one_row_batches = list(range(1, len(rows)))
    a = stream(sql, input_table(rows), one_row_batches)
    b = stream(sql, input_table(shuffled), one_row_batches)
    assert a.late.num_rows == b.late.num_rows == 0
    assert rows_of(a.output) == rows_of(b.output)


# --- with late rows ---------------------------------------------------------------------------


def watermark_rule_oracle(size_s: int, slide_s: int, bound_s: int, lateness_s: int) -> str:
    """DESIGN §4 as SQL over ``input`` with a ``batch`` column: ``W`` before a batch is the
    largest event time of the earlier batches minus ``B``; a (row, window) pair is kept when
    ``window_end + L > W``. Yields the windows, then (``late`` CTE) the ids of rows kept nowhere."""
    return (
        "WITH r AS (SELECT id, key, v, batch, CAST(t AS BIGINT) AS ts FROM input),"
        " m AS (SELECT *, max(ts) OVER (ORDER BY batch RANGE BETWEEN UNBOUNDED PRECEDING"
        f"       AND 1 PRECEDING) - {bound_s} AS w FROM r),"
        f" l AS (SELECT *, ts - (((ts % {slide_s}) + {slide_s}) % {slide_s}) AS last FROM m),"
        " a AS (SELECT id, key, v, ts, w,"
        f"       unnest(generate_series(last, last - {size_s}, -{slide_s})) AS ws FROM l),"
        f" k AS (SELECT * FROM a WHERE ws + {size_s} > ts"
        f"       AND (w IS NULL OR ws + {size_s} + {lateness_s} > w))"
    )


@LAWS
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(KEYS), st.integers(-15, 45), st.integers(-5, 9)),
        min_size=4,
        max_size=40,
    ),
    cut_every=st.integers(1, 5),
    slide_s=st.integers(1, 8),
    size_factor=st.sampled_from([1, 1, 2, 3]),  # 1: tumbling
    bound_s=st.integers(0, 6),
    lateness_s=st.sampled_from([0, 0, 3, 8]),
)
def test_windows_hold_exactly_the_rows_on_time_for_them(
    rows: list[Row],
    cut_every: int,
    slide_s: int,
    size_factor: int,
    bound_s: int,
    lateness_s: int,
) -> None:
    """Any arrival order and bound: each (row, window) pair is counted iff ``end + L > W`` on
    arrival; a row counted nowhere is in the late side output, once; none is lost."""
    size_s = slide_s * size_factor
    frm = (
        f"TUMBLE(input, t, INTERVAL '{size_s}' SECOND)"
        if size_factor == 1
        else f"HOP(input, t, INTERVAL '{slide_s}' SECOND, INTERVAL '{size_s}' SECOND)"
    )
    lateness = f" WITH (allowed_lateness = '{lateness_s}s')" if lateness_s else ""
    sql = (
        f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{bound_s}' SECOND){lateness};\n"
        + window_sql(frm)
    )
    table = input_table(rows)
    cuts = list(range(cut_every, len(rows), cut_every))
    result = stream(sql, table, cuts)
    event("some rows late" if result.late.num_rows else "no row late")

    batch = np.searchsorted(np.array(cuts, dtype=np.int64), np.arange(len(rows)), side="right")
    with_batch = table.append_column("batch", pa.array(batch, pa.int64()))
    rule = watermark_rule_oracle(size_s, slide_s, bound_s, lateness_s)
    expected = oracle(
        f"{rule} SELECT key, ws AS window_start, ws + {size_s} AS window_end, {AGGREGATES}"
        f" FROM k GROUP BY key, ws {ORDER}",
        with_batch,
        result.output_schema,
    )
    assert rows_of(result.output) == rows_of(expected)  # late rows never reorder the output

    late_ids = oracle(
        f"{rule} SELECT id FROM r WHERE id NOT IN (SELECT id FROM k) ORDER BY id",
        with_batch,
        pa.schema([pa.field("id", pa.int64())]),
    )
    assert rows_of(result.late.sort_by("id").select(["id"])) == rows_of(late_ids)
    assert set(result.late.column("_late_reason").to_pylist()) <= {"late"}
