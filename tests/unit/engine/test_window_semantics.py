"""Event-time window semantics, case by case (DESIGN §4), through the SQL entry point.

Every case streams rows ``(key, t, v)`` one row per batch, so the step at which a window fires is
observable: ``steps[i]`` is the emission after the i-th row and ``steps[-1]`` the one of
``finish()`` (end of input, ``W = +∞``). Times are whole seconds since the Unix epoch, fed as
``timestamp[s, tz=UTC]`` and compared as aware UTC instants (``at(s)``).

Timelines beside the assertions: ``[`` closed and ``)`` open window bounds, ``x`` a row accepted
into a window, ``L`` a row sent to the late side output, ``W`` the watermark after the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import helpers
import pyarrow as pa
import pytest
from flight_serve.errors import EventTimeError, PipelineSQLError
from flight_serve.pipelines.query import parse_window_query
from flight_serve.types import MAX_WATERMARK_NS
from helpers import tuples

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def input_schema(t_type: pa.DataType) -> pa.Schema:
    """``key`` string, ``t`` of ``t_type`` (the event time), ``v`` int64."""
    fields: list[pa.Field[Any]] = [
        pa.field("key", pa.string()),
        pa.field("t", t_type),
        pa.field("v", pa.int64()),
    ]
    return pa.schema(fields)


INPUT = input_schema(pa.timestamp("s", "UTC"))

Row = tuple[str, int | None, int | None]


def at(seconds: int) -> datetime:
    """The aware UTC instant ``seconds`` after the Unix epoch."""
    return EPOCH + timedelta(seconds=seconds)


def source(bound_s: int, lateness: str | None = None) -> str:
    """``CREATE SOURCE input`` with watermark bound ``B = bound_s`` seconds (and ``L``)."""
    with_ = f" WITH (allowed_lateness = '{lateness}')" if lateness else ""
    return f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{bound_s}' SECOND){with_};\n"


def batch_of(rows: Sequence[Row], schema: pa.Schema = INPUT) -> pa.RecordBatch:
    ts_type = schema.field("t").type
    naive = ts_type.tz is None
    times = [
        None if t is None else (at(t).replace(tzinfo=None) if naive else at(t)) for _, t, _ in rows
    ]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _, _ in rows], pa.string()),
            pa.array(times, ts_type),
            pa.array([v for _, _, v in rows], pa.int64()),
        ],
        schema=schema,
    )


class Run(helpers.Run):
    @property
    def watermarks(self) -> list[int | None]:
        """The watermark after each step in whole seconds (None: -∞ or +∞)."""
        return [
            None if e.watermark_ns in (MAX_WATERMARK_NS, -(2**63)) else e.watermark_ns // 10**9
            for e in self.steps
        ]


def run(sql: str, rows: Sequence[Row], schema: pa.Schema = INPUT) -> Run:
    """Parse, build, feed each row as its own batch, then finish."""
    op = parse_window_query(sql).build(schema)
    steps = [op.process(batch_of([row], schema)) for row in rows]
    steps.append(op.finish())
    return Run(op, steps)


TUMBLE_10_SUM = (
    "SELECT key, window_start, window_end, sum(v) AS total\n"
    "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
    "GROUP BY key, window_start, window_end"
)
TUMBLE_10_COUNT = (
    "SELECT key, window_start, window_end, count(*) AS n\n"
    "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
    "GROUP BY key, window_start, window_end"
)
SESSION_5 = (
    "SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total\n"
    "FROM SESSION(input, t, INTERVAL '5' SECOND)\n"
    "GROUP BY key, window_start, window_end"
)


# --- tumbling ---------------------------------------------------------------------------------


def test_tumbling_fires_when_watermark_reaches_end_and_sends_a_late_row_aside() -> None:
    r = run(source(0) + TUMBLE_10_SUM, [("a", 5, 1), ("a", 10, 1), ("a", 10, 1), ("a", 9, 1)])
    #  t:   0         5        10        15        20
    #       [------ w0 --------)[------ w1 --------)
    #  #0             x                                W = 5
    #  #1                       x                      W = 10 ≥ end(w0): w0 fires, sum 1
    #  #2                       x                      W = 10 < end(w1): accepted, not late
    #  #3                     L                        9 ∈ w0, end(w0) = 10 ≤ W: late
    #  end                                             W = +∞: w1 fires, sum 2
    assert r.watermarks == [5, 10, 10, 10, None]
    assert r.outputs == [
        [],
        [("a", at(0), at(10), 1)],
        [],
        [],
        [("a", at(10), at(20), 2)],
    ]
    assert r.late == [[], [], [], [("a", at(9), 1, "late", at(0), at(10))], []]
    assert r.op.metrics.rows_late == 1


def test_naive_millisecond_event_time_keeps_its_type_in_window_bounds() -> None:
    naive_ms = input_schema(pa.timestamp("ms"))
    r = run(
        source(0) + TUMBLE_10_SUM,
        [("a", 5, 1), ("a", 10, 1), ("a", 10, 1), ("a", 9, 1)],
        schema=naive_ms,
    )
    # Same timeline as above; naive means UTC, and the bounds stay naive timestamp[ms].
    assert r.op.output_schema.field("window_start").type == pa.timestamp("ms")
    assert r.op.output_schema.field("window_end").type == pa.timestamp("ms")
    assert r.steps[1].output.schema.field("window_start").type == pa.timestamp("ms")
    assert r.op.late_schema.field("_window_start").type == pa.timestamp("ms")
    naive = [at(s).replace(tzinfo=None) for s in (0, 9, 10, 20)]
    assert r.outputs == [
        [],
        [("a", naive[0], naive[2], 1)],
        [],
        [],
        [("a", naive[2], naive[3], 2)],
    ]
    assert r.late[3] == [("a", naive[1], 1, "late", naive[0], naive[2])]


def test_tumbling_keys_fire_together_and_late_is_per_window_not_per_key() -> None:
    r = run(
        source(0) + TUMBLE_10_COUNT,
        [("A", 1, 0), ("B", 2, 0), ("C", 5, 0), ("B", 13, 0), ("A", 8, 0), ("A", 14, 0)],
    )
    #  t:   0  1  2     5        8   10       13 14       20
    #       [---------- w0 ----------)[------- w1 --------)
    #  #0      A                                                W = 1
    #  #1         B                                             W = 2
    #  #2               C                                       W = 5
    #  #3                                      B                W = 13: w0 fires for A, B, C
    #  #4                        L(A)                           8 ∈ w0, closed: late
    #  #5                                         A             W = 14
    #  end                                                      w1 fires for A, B
    assert r.watermarks == [1, 2, 5, 13, 13, 14, None]
    assert r.outputs == [
        [],
        [],
        [],
        [("A", at(0), at(10), 1), ("B", at(0), at(10), 1), ("C", at(0), at(10), 1)],
        [],
        [],
        [("A", at(10), at(20), 1), ("B", at(10), at(20), 1)],
    ]
    assert r.late[4] == [("A", at(8), 0, "late", at(0), at(10))]
    assert sum(len(late) for late in r.late) == 1


def test_allowed_lateness_delays_firing_and_accepts_rows_until_end_plus_lateness() -> None:
    r = run(
        source(0, lateness="5s") + TUMBLE_10_COUNT,
        [("a", 1, 0), ("a", 4, 0), ("a", 12, 0), ("a", 7, 0), ("a", 16, 0), ("a", 8, 0)],
    )
    #  t:   0  1     4     7  8   10 12      15 16       20
    #       [------- w0 ----------)[-------- w1 ---------)
    #                             [-- L --)                   w0 closes at W ≥ 10 + 5 = 15
    #  #0      x                                              W = 1
    #  #1            x                                        W = 4
    #  #2                            x                        W = 12 < 15: w0 stays open
    #  #3                  x                                  10 + 5 > 12: accepted into w0
    #  #4                                       x             W = 16 ≥ 15: w0 fires, count 3
    #  #5                     L                               10 + 5 ≤ 16: late
    #  end                                                    w1 fires, count 2
    assert r.watermarks == [1, 4, 12, 12, 16, 16, None]
    assert r.outputs == [
        [],
        [],
        [],
        [],
        [("a", at(0), at(10), 3)],
        [],
        [("a", at(10), at(20), 2)],
    ]
    assert r.late == [[], [], [], [], [], [("a", at(8), 0, "late", at(0), at(10))], []]


# --- hopping ----------------------------------------------------------------------------------


def test_hopping_row_lands_in_every_window_that_contains_it() -> None:
    sql = source(0) + (
        "SELECT key, window_start, window_end, count(*) AS n\n"
        "FROM HOP(input, t, INTERVAL '7' SECOND, INTERVAL '16' SECOND)\n"
        "GROUP BY key, window_start, window_end"
    )
    r = run(sql, [("a", 100, 0), ("a", 112, 0)])
    #  t:     91    98   100  105  107  112 114   121   128
    #  w91    [-----------x--------)                           count 1
    #  w98          [-----x--------------x---)                 count 2
    #  w105                    [---------x-----------)         count 1
    #  w112                             [x------------------)  count 1
    #  #0  t = 100: w91, w98                     W = 100
    #  #1  t = 112: w98, w105, w112              W = 112 ≥ 107: w91 fires
    #  end                                       w98, w105, w112 fire
    assert r.watermarks == [100, 112, None]
    assert r.outputs == [
        [],
        [("a", at(91), at(107), 1)],
        [("a", at(98), at(114), 2), ("a", at(105), at(121), 1), ("a", at(112), at(128), 1)],
    ]
    assert r.late == [[], [], []]


def test_hopping_late_row_creates_no_state() -> None:
    sql = source(0) + (
        "SELECT key, window_start, window_end, count(*) AS n\n"
        "FROM HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND)\n"
        "GROUP BY key, window_start, window_end"
    )
    # merge_rows=1 folds every accepted row into pane state at once, so open_panes sees it
    op = replace(parse_window_query(sql).aggregation, merge_rows=1).build(INPUT)
    #  t:   45   50   55   60   ...   95   100  105  110
    #       [----L----)                                   w45: 55 ≤ W = 100, closed
    #            [----L----)                              w50: 60 ≤ W, closed
    #                                 [----x----)         w95
    #                                      [x--------)    w100
    first = op.process(batch_of([("a", 100, 0)]))
    assert first.watermark_ns == 100 * 10**9
    assert op.open_panes == 2
    second = op.process(batch_of([("a", 50, 0)]))
    assert tuples(second.late) == [("a", at(50), 0, "late", at(50), at(60))]
    assert second.output.num_rows == 0
    assert op.open_panes == 2

    # pane state and buffered rows both carry the window start as __ws (int64 ns):
    # only [95, 105) and [100, 110) are held, nothing for [45, 55) or [50, 60)
    snapshot = op.snapshot()
    state, buffer = snapshot.panes, snapshot.buffer
    starts = [*state.column("__ws").to_pylist(), *buffer.column("__ws").to_pylist()]
    assert sorted(int(s) for s in starts) == [95 * 10**9, 100 * 10**9]

    end = op.finish()
    assert tuples(end.output) == [("a", at(95), at(105), 1), ("a", at(100), at(110), 1)]
    assert end.late.num_rows == 0
    assert op.metrics.rows_late == 1


# --- session ----------------------------------------------------------------------------------


def test_session_out_of_order_rows_within_the_bound_make_one_session() -> None:
    r = run(source(10) + SESSION_5, [("a", 0, 1), ("a", 12, 1), ("a", 4, 1), ("a", 8, 1)])
    #  t:   0    4  5  8  9   12 13      17
    #       [x---)                            #0  W = 0 - 10
    #                         [x--)           #1  W = 2 (12 is 7 past the last session: apart)
    #            [x----)                      #2  4 < 5: bridges into [0, 9)
    #                  [x-----)               #3  8 < 9 and 12 < 13: bridges to [0, 17)
    #       [----------------------------)    end: one session, count 4, sum 4
    assert r.watermarks == [-10, 2, 2, 2, None]
    assert r.outputs == [[], [], [], [], [("a", at(0), at(17), 4, 4)]]
    assert all(not late for late in r.late)


def test_session_reverse_arrival_gives_the_same_session() -> None:
    r = run(source(20) + SESSION_5, [("a", 12, 1), ("a", 8, 1), ("a", 4, 1), ("a", 0, 1)])
    #  t:   0    4     8     12      17
    #                        [x------)     #0  W = -8
    #                  [x-------------)    #1  merges
    #            [x-------------------)    #2  merges
    #       [x-------------------------)   #3  merges; end: [0, 17), count 4
    assert r.outputs == [[], [], [], [], [("a", at(0), at(17), 4, 4)]]
    assert all(not late for late in r.late)


def test_session_bridging_row_merges_two_sessions() -> None:
    apart = run(source(10) + SESSION_5, [("a", 0, 1), ("a", 8, 10)])
    #  t:   0    5  8    13
    #       [x---)  [x---)      8 - 0 ≥ 5: two sessions
    assert apart.outputs[-1] == [("a", at(0), at(5), 1, 1), ("a", at(8), at(13), 1, 10)]

    bridged = run(source(10) + SESSION_5, [("a", 0, 1), ("a", 8, 10), ("a", 4, 100)])
    #  t:   0   4 5  8 9   13
    #       [x--)    [x----)
    #           [x-----)          4 < 5 and 8 < 9: the row at 4 bridges them
    #       [--------------)      [0, 13), count 3, sum 111
    assert bridged.outputs == [[], [], [], [("a", at(0), at(13), 3, 111)]]


def test_sessions_of_two_keys_stay_separate() -> None:
    r = run(source(10) + SESSION_5, [("a", 0, 1), ("b", 2, 10), ("a", 4, 100)])
    #  t:   0  2  4   7  9
    #  a:   [x----x------)    [0, 9), count 2, sum 101
    #  b:      [x----)        [2, 7): would overlap a's session, but b is another key
    assert r.outputs[-1] == [("b", at(2), at(7), 1, 10), ("a", at(0), at(9), 2, 101)]


def test_late_session_row_overlapping_an_open_session_of_its_key_is_accepted() -> None:
    r = run(source(0) + SESSION_5, [("a", 6, 1), ("a", 10, 1), ("a", 3, 1), ("b", 3, 1)])
    #  t:   3    6  8  10     15
    #             [x---x-----)      #0, #1: session a [6, 15); W = 10
    #       [x-----)                #2  a@3: own [3, 8) has 8 ≤ W, but overlaps the open
    #                                   [6, 15) of a: accepted, session a is [3, 15)
    #       [L-----)                #3  b@3: [3, 8), no open session of b: late
    assert r.watermarks == [6, 10, 10, 10, None]
    assert r.outputs == [[], [], [], [], [("a", at(3), at(15), 3, 3)]]
    assert r.late == [[], [], [], [("b", at(3), 1, "late", at(3), at(8))], []]


# --- invalid event time -----------------------------------------------------------------------


def test_null_event_time_goes_to_the_side_output_and_the_rest_of_the_batch_is_processed() -> None:
    op = parse_window_query(source(0) + TUMBLE_10_COUNT).build(INPUT)
    em = op.process(batch_of([("a", 5, 1), ("b", None, 2), ("a", 12, 3)]))
    #  t:   0    5   10 12   20
    #       [----x---)[x-----)      W = 12 after the batch: w0 fires; b (no time) aside
    assert tuples(em.late) == [("b", None, 2, "null_time", None, None)]
    assert tuples(em.output) == [("a", at(0), at(10), 1)]
    assert op.metrics.rows_null_time == 1
    assert op.metrics.rows_late == 0
    assert tuples(op.finish().output) == [("a", at(10), at(20), 1)]


def test_missing_event_time_column_is_an_event_time_error_naming_it() -> None:
    """The operator names the column (EventTimeError); the SQL query names it where it is
    written, with the input's columns (PipelineSQLError, as every unknown column of a query)."""
    schema = INPUT.remove(INPUT.get_field_index("t"))
    query = parse_window_query(TUMBLE_10_COUNT)
    with pytest.raises(EventTimeError, match=r"'t'"):
        query.aggregation.build(schema)
    with pytest.raises(PipelineSQLError) as caught:
        query.build(schema)
    columns = ", ".join(schema.names)
    assert str(caught.value) == (
        f"event-time column t does not exist in input (columns of input: {columns}) "
        "(line 2, column 20)"
    )


def test_non_timestamp_event_time_column_is_an_event_time_error_naming_it() -> None:
    schema = input_schema(pa.int64())
    with pytest.raises(EventTimeError, match=r"'t'.*timestamp"):
        parse_window_query(TUMBLE_10_COUNT).build(schema)


# --- SQL errors -------------------------------------------------------------------------------


def test_syntax_error_reports_line_and_column() -> None:
    sql = (
        "SELECT key, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND))\n"
        "GROUP BY key, window_start, window_end"
    )
    with pytest.raises(PipelineSQLError, match=r"line 2, column 44") as info:
        parse_window_query(sql)
    assert (info.value.line, info.value.col) == (2, 44)  # the stray ')'


def test_unknown_window_function_is_a_pipeline_sql_error() -> None:
    sql = (
        "SELECT key, window_start, window_end, count(*) AS n\n"
        "FROM SLIDE(input, t, INTERVAL '10' SECOND)\n"
        "GROUP BY key, window_start, window_end"
    )
    with pytest.raises(PipelineSQLError, match="SLIDE") as info:
        parse_window_query(sql)
    assert info.value.line == 2


def test_non_grouped_column_is_a_pipeline_sql_error() -> None:
    """Without declared columns the check waits for the input schema (build): only then can a
    column that is not grouped be told from one that does not exist."""
    sql = (
        "SELECT key, v, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
        "GROUP BY key, window_start, window_end"
    )
    with pytest.raises(PipelineSQLError, match=r"column v must appear in GROUP BY") as info:
        parse_window_query(sql).build(INPUT)
    assert (info.value.line, info.value.col) == (1, 13)


# --- query features ---------------------------------------------------------------------------


def test_where_filters_rows_before_windowing_so_they_are_never_late() -> None:
    sql = source(0) + (
        "SELECT key, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
        "WHERE v > 0\n"
        "GROUP BY key, window_start, window_end"
    )
    r = run(sql, [("a", 5, 1), ("a", 15, 1), ("a", 3, 0), ("a", 16, 0)])
    #  t:   0  3  5    10   15 16   20
    #       [-----x----)[---x--------)
    #  #1                   W = 15: w0 fires
    #  #2     (3, v=0): filtered out, not late although [0, 10) is closed
    #  #3                      (16, v=0): filtered out, does not count
    assert r.outputs == [[], [("a", at(0), at(10), 1)], [], [], [("a", at(10), at(20), 1)]]
    assert all(not late for late in r.late)
    assert r.op.metrics.rows_late == 0


def test_having_and_an_expression_over_aggregates() -> None:
    sql = source(0) + (
        "SELECT key, window_start, window_end, count(*) * 2 AS dbl\n"
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
        "GROUP BY key, window_start, window_end\n"
        "HAVING count(*) > 1"
    )
    r = run(sql, [("a", 1, 0), ("a", 2, 0), ("b", 3, 0), ("b", 11, 0), ("b", 12, 0)])
    #  t:   0 1 2 3    10 11 12    20
    #  a:   [ x x -----)                count 2 → dbl 4
    #  b:   [     x ---)[ x  x ----)    count 1 (HAVING drops it), then count 2 → dbl 4
    assert r.op.output_schema.names == ["key", "window_start", "window_end", "dbl"]
    assert r.outputs == [[], [], [], [("a", at(0), at(10), 4)], [], [("b", at(10), at(20), 4)]]


def test_avg_of_only_null_values_is_null() -> None:
    sql = source(0) + (
        "SELECT key, window_start, window_end, avg(v) AS mean, count(v) AS n_v, count(*) AS n\n"
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
        "GROUP BY key, window_start, window_end"
    )
    r = run(sql, [("a", 1, None), ("b", 2, 3), ("a", 3, None), ("b", 4, 4)])
    #  t:   0 1 2 3 4     10
    #  a:   [ n   n ------)    avg of no values: NULL
    #  b:   [   3   4 ----)    avg 3.5
    assert r.outputs[-1] == [("a", at(0), at(10), None, 0, 2), ("b", at(0), at(10), 3.5, 2, 2)]
