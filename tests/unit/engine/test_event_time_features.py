"""The event-time features, case by case, with hand-computed results (DESIGN §4).

Allowed lateness and emit modes, watermarks over partitions (registration, explicit advance, end of
input, idle timeout on an injected processing-time clock, backlog), ``max_future_skew`` on an
injected wall clock, window offsets, CUMULATE, calendar day / week / month windows across DST,
sessions that never reopen an emitted session, opt-in empty windows, and snapshots that leave live
state alone.

Rows are ``(key, t, v)`` with ``t`` in whole seconds since the Unix epoch, fed as
``timestamp[s, tz=UTC]``; results are compared as aware UTC instants (``at(s)``). Unless a case
says otherwise every row is its own batch, so the step at which a window fires is observable:
``steps[i]`` is the emission after the i-th row and ``steps[-1]`` the one of ``finish()``.

Timelines beside the assertions: ``[`` closed and ``)`` open window bounds, ``x`` a row accepted
into a window, ``L`` a row sent to the late side output, ``F`` a row sent aside as ``future``, ``W``
the watermark after the step (``-∞`` before any progress, ``+∞`` at end of input).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import helpers
import pyarrow as pa
import pytest
from flight_serve.engine.operator import Emission, OperatorSnapshot, WindowOperator
from flight_serve.engine.windows import CalendarWindow, TumblingWindow
from flight_serve.errors import InvalidInputError
from flight_serve.pipelines.query import parse_window_query
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS
from helpers import tuples

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SECOND_NS = 10**9
INPUT_FIELDS: list[pa.Field[Any]] = [
    pa.field("key", pa.string()),
    pa.field("t", pa.timestamp("s", "UTC")),
    pa.field("v", pa.int64()),
]
INPUT = pa.schema(INPUT_FIELDS)

Row = tuple[str, int, int]


def at(seconds: int) -> datetime:
    """The aware UTC instant ``seconds`` after the Unix epoch."""
    return EPOCH + timedelta(seconds=seconds)


def utc(iso: str) -> datetime:
    """``'2026-03-08T05:00'`` read as an aware UTC instant."""
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


def sec(iso: str) -> int:
    """Whole seconds since the epoch of the UTC instant ``iso``."""
    return int((utc(iso) - EPOCH).total_seconds())


def batch_of(rows: Sequence[Row]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _, _ in rows], pa.string()),
            pa.array([at(t) for _, t, _ in rows], INPUT.field("t").type),
            pa.array([v for _, _, v in rows], pa.int64()),
        ],
        schema=INPUT,
    )


def seconds(watermark_ns: int) -> float:
    """A watermark in whole seconds; ``±math.inf`` for the sentinels."""
    if watermark_ns == MIN_WATERMARK_NS:
        return -math.inf
    if watermark_ns == MAX_WATERMARK_NS:
        return math.inf
    return watermark_ns // SECOND_NS


class Run(helpers.Run):
    @property
    def watermarks(self) -> list[float]:
        return [seconds(e.watermark_ns) for e in self.steps]


def feed(op: WindowOperator, rows: Sequence[Row]) -> Run:
    """Feed each row as its own batch, then finish."""
    steps = [op.process(batch_of([row])) for row in rows]
    steps.append(op.finish())
    return Run(op, steps)


def run(sql: str, rows: Sequence[Row]) -> Run:
    return feed(parse_window_query(sql).build(INPUT), rows)


def source(bound_s: int = 0, **options: str) -> str:
    """``CREATE SOURCE input`` with watermark bound ``B = bound_s`` seconds and ``WITH`` options."""
    with_ = ", ".join(f"{k} = '{v}'" for k, v in options.items())
    return (
        f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{bound_s}' SECOND)"
        + (f" WITH ({with_})" if with_ else "")
        + ";\n"
    )


def select(window: str, aggregates: str = "count(*) AS n") -> str:
    return (
        f"SELECT key, window_start, window_end, {aggregates}\n"
        f"FROM {window}\n"
        "GROUP BY key, window_start, window_end"
    )


TUMBLE_10 = "TUMBLE(input, t, INTERVAL '10' SECOND)"
SESSION_5 = "SESSION(input, t, INTERVAL '5' SECOND)"


# --- 1. allowed lateness and emit modes -------------------------------------------------------

#: allowed lateness's case: (a,1) (a,4) (a,12) (a,7) (a,16) (a,8), then end
LATENESS_CASE_ROWS: list[Row] = [("a", t, 0) for t in (1, 4, 12, 7, 16, 8)]


def test_final_mode_emits_once_at_end_plus_lateness() -> None:
    r = run(source(0, allowed_lateness="5s") + select(TUMBLE_10), LATENESS_CASE_ROWS)
    #  t:   0  1     4     7  8   10 12      15 16       20
    #       [------- w0 ----------)[-------- w1 ---------)
    #                             [-- L --)                  w0 is final at W ≥ 10 + 5 = 15
    #  #0      x                                             W = 1
    #  #1            x                                       W = 4
    #  #2                            x                       W = 12: w0 not final yet
    #  #3                  x                                 10 + 5 > 12: accepted into w0
    #  #4                                       x            W = 16 ≥ 15: (a, w0, 3), evicted
    #  #5                     L                              10 + 5 ≤ 16: late for w0
    #  end                                                   W = +∞: (a, w1, 2)
    assert r.watermarks == [1, 4, 12, 12, 16, 16, math.inf]
    assert r.outputs == [[], [], [], [], [("a", at(0), at(10), 3)], [], [("a", at(10), at(20), 2)]]
    assert r.late == [[], [], [], [], [], [("a", at(8), 0, "late", at(0), at(10))], []]
    assert r.op.output_schema.names == ["key", "window_start", "window_end", "n"]
    assert r.op.metrics.rows_late == 1


def test_update_mode_emits_at_end_and_a_new_revision_per_accepted_late_row() -> None:
    r = run(source(0, allowed_lateness="5s", emit="update") + select(TUMBLE_10), LATENESS_CASE_ROWS)
    #  t:   0  1     4     7  8   10 12      15 16       20
    #       [------- w0 ----------)[-------- w1 ---------)
    #  #2                            x                       W = 12 ≥ 10: (a, w0, 2) rev 0
    #  #3                  x                                 accepted: (a, w0, 3) rev 1
    #  #4                                       x            W = 16 ≥ 15: w0 evicted, unchanged:
    #                                                        nothing new to emit
    #  #5                     L                              late for w0
    #  end                                                   (a, w1, 2) rev 0
    assert r.watermarks == [1, 4, 12, 12, 16, 16, math.inf]
    assert r.op.output_schema.names == ["key", "window_start", "window_end", "n", "_revision"]
    assert r.outputs == [
        [],
        [],
        [("a", at(0), at(10), 2, 0)],
        [("a", at(0), at(10), 3, 1)],
        [],
        [],
        [("a", at(10), at(20), 2, 0)],
    ]
    assert r.late == [[], [], [], [], [], [("a", at(8), 0, "late", at(0), at(10))], []]


def test_update_mode_emits_the_late_revision_when_its_own_batch_evicts_the_window() -> None:
    op = parse_window_query(
        source(0, allowed_lateness="5s", emit="update") + select(TUMBLE_10)
    ).build(INPUT)
    #  t:   0 1      7    10 12      15    20     25  30
    #       [-- w0 -------)[---- w1 -------)            [-- w2 ...
    #  #0     x                                              W = 1
    #  #1                    x                               W = 12: (a, w0, 1) rev 0
    #  #2   one batch: 7 judged against W = 12 (accepted into w0), 30 into w2; then W = 30:
    #       w0 (10 + 5 ≤ 30) evicted with its pending change: (a, w0, 2) rev 1;
    #       w1 (20 ≤ 30) due and evicted at once (20 + 5 ≤ 30): (a, w1, 1) rev 0
    #  end  (a, w2, 1) rev 0
    steps = [op.process(batch_of([("a", 1, 0)])), op.process(batch_of([("a", 12, 0)]))]
    steps.append(op.process(batch_of([("a", 7, 0), ("a", 30, 0)])))
    steps.append(op.finish())
    assert [tuples(e.output) for e in steps] == [
        [],
        [("a", at(0), at(10), 1, 0)],
        [("a", at(0), at(10), 2, 1), ("a", at(10), at(20), 1, 0)],
        [("a", at(30), at(40), 1, 0)],
    ]
    assert all(e.late.num_rows == 0 for e in steps)


# --- 2. watermarks across partitions ----------------------------------------------------------


def tumble_10_op() -> WindowOperator:
    """TUMBLE 10 s, count per key, B = 0."""
    return parse_window_query(source(0) + select(TUMBLE_10)).build(INPUT)


def test_registered_partitions_hold_the_watermark_at_minus_infinity_until_each_sends() -> None:
    op = tumble_10_op()
    op.add_partition("p1")
    op.add_partition("p2")
    #  t:   0  1  3   10 12  14  18 20     25  30
    #       [-- w0 ---)[--- w1 ----)[--- w2 ---)
    #  p1:     x         x               x         W = -∞: p2 has sent nothing
    #  p1:        x                                3 < 25 but nothing is closed: accepted
    #  p2:                   x                     W = min(25, 14) = 14: w0 fires (count 2)
    #  p2:                       x                 W = min(25, 18) = 18
    #  p2:                                     x   W = min(25, 30) = 25: w1 fires
    #                                                  (a: 12; b: 14, 18)
    steps = [op.process(batch_of([("a", t, 0)]), partition="p1") for t in (1, 12, 25, 3)]
    assert [seconds(e.watermark_ns) for e in steps] == [-math.inf] * 4
    assert all(e.output.num_rows == 0 and e.late.num_rows == 0 for e in steps)
    more = [op.process(batch_of([("b", t, 0)]), partition="p2") for t in (14, 18, 30)]
    assert [seconds(e.watermark_ns) for e in more] == [14, 18, 25]
    assert [tuples(e.output) for e in more] == [
        [("a", at(0), at(10), 2)],
        [],
        [("a", at(10), at(20), 1), ("b", at(10), at(20), 2)],
    ]
    assert tuples(op.finish().output) == [("a", at(20), at(30), 1), ("b", at(30), at(40), 1)]
    assert op.metrics.rows_late == 0


def test_a_finished_partition_counts_as_plus_infinity() -> None:
    op = tumble_10_op()
    op.add_partition("p1")
    op.add_partition("p2")
    #  t:   0    5    10   14   20
    #       [----x----)[---x----)
    #  p1:       x                    W = -∞ (p2 registered, silent)
    #  p2:             x              W = min(5, 14) = 5
    #  finish(p1)                     W = min(+∞, 14) = 14: w0 fires
    #  finish(p2)                     W = +∞: w1 fires
    assert seconds(op.process(batch_of([("a", 5, 0)]), partition="p1").watermark_ns) == -math.inf
    assert seconds(op.process(batch_of([("b", 14, 0)]), partition="p2").watermark_ns) == 5
    first = op.finish("p1")
    assert seconds(first.watermark_ns) == 14
    assert tuples(first.output) == [("a", at(0), at(10), 1)]
    last = op.finish("p2")
    assert seconds(last.watermark_ns) == math.inf
    assert tuples(last.output) == [("b", at(10), at(20), 1)]


def test_a_silent_registered_partition_that_finishes_releases_the_watermark() -> None:
    op = tumble_10_op()
    op.add_partition("p1")
    op.add_partition("p2")
    #  p1: rows at 5 and 12; p2 sends nothing, then ends: W = 12 (p1 alone), w0 fires
    op.process(batch_of([("a", 5, 0)]), partition="p1")
    assert op.process(batch_of([("a", 12, 0)]), partition="p1").output.num_rows == 0
    done = op.finish("p2")
    assert seconds(done.watermark_ns) == 12
    assert tuples(done.output) == [("a", at(0), at(10), 1)]


def test_a_partition_that_appears_late_never_moves_the_watermark_back() -> None:
    op = tumble_10_op()
    #  t:   0   5   10     18 20 21 22     30
    #       [-- w0 -)[-- w1 --)[--- w2 ---)
    #  p1:               x                        W = 18
    #  p2:                         x              W = min(18, 22) = 18
    #  p1:                         x (25)         W = min(25, 22) = 22: w0 nothing, w1 fires
    #  p3:      L                                 new partition, row at 5: w0 closed, late
    #                                             W_p3 = 5, but W stays 22
    #  p3:                      x                 21: w2 still open, accepted; W stays 22
    #  finish(p1), finish(p2)                     W = min(p3 = 21) → still 22: nothing fires
    #  finish(p3)                                 W = +∞: w2 fires: a {25, 21}, b {22}
    steps = [
        op.process(batch_of([("a", 18, 0)]), partition="p1"),
        op.process(batch_of([("b", 22, 0)]), partition="p2"),
        op.process(batch_of([("a", 25, 0)]), partition="p1"),
        op.process(batch_of([("a", 5, 7)]), partition="p3"),
        op.process(batch_of([("a", 21, 0)]), partition="p3"),
        op.finish("p1"),
        op.finish("p2"),
    ]
    assert [seconds(e.watermark_ns) for e in steps] == [18, 18, 22, 22, 22, 22, 22]
    assert [tuples(e.output) for e in steps] == [[], [], [("a", at(10), at(20), 1)], [], [], [], []]
    assert tuples(steps[3].late) == [("a", at(5), 7, "late", at(0), at(10))]
    assert all(e.late.num_rows == 0 for i, e in enumerate(steps) if i != 3)
    end = op.finish("p3")
    assert tuples(end.output) == [("a", at(20), at(30), 2), ("b", at(20), at(30), 1)]
    assert op.metrics.rows_late == 1


def test_advance_watermark_moves_a_partition_without_rows_and_never_lowers_it() -> None:
    op = tumble_10_op()
    op.add_partition("p1")
    op.add_partition("p2")
    #  t:   0    5  9 10 12       20      30
    #       [----x--L-)[x---------)[------x--)
    #  p1:       x       x              W = -∞ (p2 silent)
    #  p2: advance to 10                W = min(12, 10) = 10: w0 fires
    #  p1:          L                   9 ∈ w0, 10 ≤ W: late
    #  p2: advance to 20                W = min(12, 20) = 12
    #  p2: advance to 4                 never lowers: W_p2 stays 20, W stays 12
    #  p1:                         x    30: W = min(30, W_p2 = 20) = 20: w1 fires
    op.process(batch_of([("a", 5, 0)]), partition="p1")
    op.process(batch_of([("a", 12, 0)]), partition="p1")
    advanced = op.advance_watermark("p2", 10 * SECOND_NS)
    assert seconds(advanced.watermark_ns) == 10
    assert tuples(advanced.output) == [("a", at(0), at(10), 1)]
    assert advanced.late.num_rows == 0
    late = op.process(batch_of([("a", 9, 3)]), partition="p1")
    assert tuples(late.late) == [("a", at(9), 3, "late", at(0), at(10))]
    assert seconds(op.advance_watermark("p2", 20 * SECOND_NS).watermark_ns) == 12
    lowered = op.advance_watermark("p2", 4 * SECOND_NS)
    assert seconds(lowered.watermark_ns) == 12
    assert lowered.output.num_rows == 0
    step = op.process(batch_of([("a", 30, 0)]), partition="p1")
    assert seconds(step.watermark_ns) == 20
    assert tuples(step.output) == [("a", at(10), at(20), 1)]
    assert tuples(op.finish().output) == [("a", at(30), at(40), 1)]


class FakeClock:
    """A clock the test moves by hand: ``set_seconds(s, ns)`` sets it to ``origin + s`` seconds
    (plus ``ns``). The processing-time clocks start at an arbitrary origin, 1000 s, so that
    "silent since registration" has to be measured from the registration instant, not from 0."""

    def __init__(self, origin_s: int = 1000) -> None:
        self.origin_ns = origin_s * SECOND_NS
        self.now_ns = self.origin_ns

    def __call__(self) -> int:
        return self.now_ns

    def set_seconds(self, s: int, ns: int = 0) -> None:
        self.now_ns = self.origin_ns + s * SECOND_NS + ns


def idle_30s_op(clock: Callable[[], int]) -> WindowOperator:
    """TUMBLE 10 s count, B = 0, ``idle_timeout = 30 s``, two registered partitions p1 and p2."""
    q = parse_window_query(source(0, idle_timeout="30s") + select(TUMBLE_10))
    assert q.aggregation.idle_timeout == timedelta(seconds=30)
    op = q.aggregation.build(INPUT, clock_ns=clock)
    op.add_partition("p1")
    op.add_partition("p2")
    return op


def test_idle_partition_stops_holding_the_watermark_back_and_cannot_move_it_back() -> None:
    clock = FakeClock()
    op = idle_30s_op(clock)
    #  processing time →  0 s        10 s             30 s - 1 ns  30 s       31 s   32 s
    #  p1                 (a,5)      (a,12)
    #  p2  registered at 0 s, silent ......................... idle at 30 s  (b,3)  (b,15)
    #  W                  -∞         -∞               -∞           12         12     12
    #  event time:  0   3  5   10 12   15     20 22     30
    #               [---L--x---)[x------x-----)[-x------)
    #  tick at 30 s: p2 silent ≥ 30 s → idle; W = W_p1 = 12: w0 fires (a, 1)
    #  (b,3) at 31 s: p2 is back, its row is late for the closed w0; W stays 12 (never back)
    #  (b,15) at 32 s: accepted into w1; W = min(12, 15) = 12
    #  (a,22) at 33 s: W = min(22, 15) = 15; end: w1 (a, b), w2 (a)
    op.process(batch_of([("a", 5, 0)]), partition="p1")
    clock.set_seconds(10)
    assert seconds(op.process(batch_of([("a", 12, 0)]), partition="p1").watermark_ns) == -math.inf
    clock.set_seconds(30, ns=-1)
    quiet = op.tick()
    assert seconds(quiet.watermark_ns) == -math.inf
    assert quiet.output.num_rows == 0
    clock.set_seconds(30)
    fired = op.tick()
    assert seconds(fired.watermark_ns) == 12
    assert tuples(fired.output) == [("a", at(0), at(10), 1)]
    clock.set_seconds(31)
    back = op.process(batch_of([("b", 3, 1)]), partition="p2")
    assert seconds(back.watermark_ns) == 12
    assert tuples(back.late) == [("b", at(3), 1, "late", at(0), at(10))]
    clock.set_seconds(32)
    assert seconds(op.process(batch_of([("b", 15, 0)]), partition="p2").watermark_ns) == 12
    clock.set_seconds(33)
    step = op.process(batch_of([("a", 22, 0)]), partition="p1")
    assert seconds(step.watermark_ns) == 15
    assert step.output.num_rows == 0
    assert tuples(op.finish().output) == [
        ("a", at(10), at(20), 1),
        ("b", at(10), at(20), 1),
        ("a", at(20), at(30), 1),
    ]


def test_a_partition_with_backlog_is_never_idle() -> None:
    clock = FakeClock()
    op = idle_30s_op(clock)
    op.set_backlog("p2", True)
    #  p1 sends (a,5) at 0 s and (a,12) at 50 s; p2 (registered at 0 s) has unread input
    #  tick at 60 s: p2 silent 60 s but backlogged → not idle; W = -∞
    #  backlog cleared: tick → p2 idle; W = 12: w0 fires
    op.process(batch_of([("a", 5, 0)]), partition="p1")
    clock.set_seconds(50)
    op.process(batch_of([("a", 12, 0)]), partition="p1")
    clock.set_seconds(60)
    held = op.tick()
    assert seconds(held.watermark_ns) == -math.inf
    assert held.output.num_rows == 0
    op.set_backlog("p2", False)
    released = op.tick()
    assert seconds(released.watermark_ns) == 12
    assert tuples(released.output) == [("a", at(0), at(10), 1)]


def test_when_every_partition_is_idle_the_watermark_holds() -> None:
    clock = FakeClock()
    op = idle_30s_op(clock)
    #  p1: (a,5) at 0 s, (a,12) at 20 s; p2 silent: idle at 30 s → W = 12 (w0 fires)
    #  at 100 s p1 is idle too: no live partition is active, W holds at 12 (no jump to +∞)
    op.process(batch_of([("a", 5, 0)]), partition="p1")
    clock.set_seconds(20)
    op.process(batch_of([("a", 12, 0)]), partition="p1")
    clock.set_seconds(30)
    assert tuples(op.tick().output) == [("a", at(0), at(10), 1)]
    clock.set_seconds(100)
    idle = op.tick()
    assert seconds(idle.watermark_ns) == 12
    assert idle.output.num_rows == 0


def test_the_next_idle_instant_is_the_last_row_plus_idle_timeout() -> None:
    clock = FakeClock()
    op = idle_30s_op(clock)
    #  p1, p2 registered at 0 s; p1 sends (a,5) at 4 s and (a,12) at 7.25 s; p2 stays silent
    #  p2 is due idle at 0 + 30 s, p1 at 7.25 + 30 s; an idle or backlogged one has no instant
    assert op.next_idle_ns() == clock.origin_ns + 30 * SECOND_NS
    clock.set_seconds(4)
    op.process(batch_of([("a", 5, 0)]), partition="p1")
    clock.set_seconds(7, ns=250_000_000)
    op.process(batch_of([("a", 12, 0)]), partition="p1")
    op.set_backlog("p2", True)
    assert op.next_idle_ns() == clock.origin_ns + 37_250_000_000
    op.set_backlog("p2", False)
    assert op.next_idle_ns() == clock.origin_ns + 30 * SECOND_NS
    clock.set_seconds(30)
    assert tuples(op.tick().output) == [("a", at(0), at(10), 1)]  # p2 idle: W = 12
    assert op.next_idle_ns() == clock.origin_ns + 37_250_000_000  # p1 only
    clock.set_seconds(38)
    assert op.next_idle_ns() is None  # both idle


def test_the_run_loop_wakes_at_the_instant_a_partition_goes_idle() -> None:
    """A live source's partition silent since 100 s with idle_timeout 5 s: the run loop's next
    wake-up is at 105 s exactly, not at its next periodic tick (a quarter of the timeout, 0.5 s
    at most, after the previous one); without a partition that can go idle it is the tick."""
    from flight_serve.pipelines.graph import WindowNode as _WindowNode
    from flight_serve.pipelines.pipeline import parse_pipeline
    from flight_serve.pipelines.runtime import PipelineRuntime

    clock = FakeClock(origin_s=100)
    plan = parse_pipeline(
        "CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t) WITH (connector ="
        " 'flight', server = 'grpc://127.0.0.1:9', stream = 'events', idle_timeout = '5s');\n"
        "CREATE SINK out WITH (connector = 'stdout');\n"
        "INSERT INTO out SELECT k, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;"
    )
    runtime = PipelineRuntime(plan, clock_ns=clock)
    node = runtime.nodes[0]
    assert isinstance(node, _WindowNode)
    assert runtime._tick_s() == 0.5
    tick_at = clock.origin_ns + 4_800_000_000 + 500_000_000  # a tick at 104.8 s, the next 105.3 s
    assert runtime._wake_ns(tick_at) == tick_at  # no partition yet
    node.op.add_partition("writer-a")  # silent from 100 s
    clock.set_seconds(4, ns=800_000_000)
    assert runtime._wake_ns(tick_at) == clock.origin_ns + 5 * SECOND_NS
    clock.set_seconds(5)
    node.op.tick()
    assert runtime._wake_ns(tick_at) == tick_at  # idle now: nothing more to wait for


class Clocks:
    """Processing time (monotonic, origin 1000 s) and wall-clock time (ns since the epoch, at
    ``wall_origin_s`` when processing time is 0), moved together."""

    def __init__(self, wall_origin_s: int) -> None:
        self.proc = FakeClock()
        self.wall = FakeClock(origin_s=wall_origin_s)

    def set_seconds(self, s: int, ns: int = 0) -> None:
        self.proc.set_seconds(s, ns)
        self.wall.set_seconds(s, ns)


def idle_advance_op(clocks: Clocks) -> WindowOperator:
    """TUMBLE 10 s count, B = 0, idle_timeout 5 s, idle_watermark_advance 30 s, partition p1."""
    sql = source(0, idle_timeout="5s", idle_watermark_advance="30s") + select(TUMBLE_10)
    q = parse_window_query(sql)
    assert q.aggregation.idle_watermark_advance == timedelta(seconds=30)
    op = q.aggregation.build(INPUT, clock_ns=clocks.proc, wall_clock_ns=clocks.wall)
    op.add_partition("p1")
    return op


def test_idle_watermark_advance_closes_a_quiet_window_d_after_its_end_by_the_wall_clock() -> None:
    clocks = Clocks(wall_origin_s=100)
    op = idle_advance_op(clocks)
    #  processing s   wall s        p1                    W     fires
    #  0              100           (a,101) (a,105) (b,108)  108
    #  5              105           idle: W = max(108, 105 - 30)   108
    #  next wake: wall 140 = end 110 + L 0 + D 30, i.e. processing 40 s
    #  40 - 1 ns      140 - 1 ns    tick                  108
    #  40             140           tick: W = 140 - 30    110   [100,110) a 2, b 1
    #  41             141           (a,109) late, (a,115)  115
    #  end                                                +∞    [110,120) a 1
    step = op.process(batch_of([("a", 101, 0), ("a", 105, 0), ("b", 108, 0)]), partition="p1")
    assert seconds(step.watermark_ns) == 108
    assert op.next_wake_ns() == clocks.proc.origin_ns + 5 * SECOND_NS  # p1 goes idle
    clocks.set_seconds(5)
    quiet = op.tick()
    assert (seconds(quiet.watermark_ns), quiet.output.num_rows) == (108, 0)
    assert op.next_wake_ns() == clocks.proc.origin_ns + 40 * SECOND_NS
    clocks.set_seconds(40, ns=-1)
    assert op.tick().output.num_rows == 0
    clocks.set_seconds(40)
    fired = op.tick()
    assert seconds(fired.watermark_ns) == 110
    assert tuples(fired.output) == [("a", at(100), at(110), 2), ("b", at(100), at(110), 1)]
    clocks.set_seconds(41)
    back = op.process(batch_of([("a", 109, 7), ("a", 115, 0)]), partition="p1")
    assert tuples(back.late) == [("a", at(109), 7, "late", at(100), at(110))]
    assert seconds(back.watermark_ns) == 115
    assert tuples(op.finish().output) == [("a", at(110), at(120), 1)]


def test_idle_watermark_advance_waits_for_every_partition_and_never_moves_w_back() -> None:
    clocks = Clocks(wall_origin_s=100)
    op = idle_advance_op(clocks)
    op.add_partition("p2")
    #  p1 (a,101) at 0 s, p2 (b,150) at 3 s: W = 101. At 5 s p1 is idle, p2 not: W = 150 is
    #  p2's (not the wall clock's). At 8 s both idle: wall 108 - 30 = 78 < 150, W holds at 150.
    #  At 200 s (wall 300): W = 270 — [100,110) and [150,160) fired at 5 s and 200 s.
    op.process(batch_of([("a", 101, 0)]), partition="p1")
    clocks.set_seconds(3)
    assert seconds(op.process(batch_of([("b", 150, 0)]), partition="p2").watermark_ns) == 101
    clocks.set_seconds(5)
    p1_idle = op.tick()
    assert seconds(p1_idle.watermark_ns) == 150
    assert tuples(p1_idle.output) == [("a", at(100), at(110), 1)]
    clocks.set_seconds(8)
    assert seconds(op.tick().watermark_ns) == 150
    assert op.next_wake_ns() == clocks.proc.origin_ns + 90 * SECOND_NS  # wall 190 = 160 + 30
    clocks.set_seconds(200)
    late = op.tick()
    assert seconds(late.watermark_ns) == 270
    assert tuples(late.output) == [("b", at(150), at(160), 1)]


def test_idle_watermark_advance_without_idle_timeout_is_refused_naming_both() -> None:
    from flight_serve.errors import PipelineSQLError

    with pytest.raises(PipelineSQLError, match="idle_watermark_advance needs idle_timeout"):
        parse_window_query(source(0, idle_watermark_advance="30s") + select(TUMBLE_10))


# --- 3. max_future_skew -----------------------------------------------------------------------


def test_far_future_row_goes_aside_and_does_not_move_the_watermark() -> None:
    wall = FakeClock(origin_s=0)  # wall-clock time: ns since the Unix epoch
    wall.set_seconds(1000)
    q = parse_window_query(source(0, max_future_skew="60s") + select(TUMBLE_10))
    assert q.aggregation.max_future_skew == timedelta(seconds=60)
    op = q.aggregation.build(INPUT, wall_clock_ns=wall)
    #  wall clock 1000 s, skew 60 s: a row after 1060 s is "future"
    #  t:  1000 1005 1010 1012          1060        ...     1100
    #      [x----x---)[x------------------------------------)
    #  #0   x                                       W = 1000
    #  #1                                      F    1100 > 1060: aside, reason future; W = 1000
    #  #2        x                                  1005 ≥ 1000 - 0: not late; W = 1005
    #  #3                x                          W = 1012: [1000, 1010) fires (count 2)
    #  #4                              x            exactly 1060: not future; W = 1060
    #  wall clock → 1100 s
    #  #5                                      x    1100 ≤ 1160: accepted; W = 1100
    rows: list[Row] = [
        ("a", 1000, 0),
        ("a", 1100, 9),
        ("a", 1005, 0),
        ("a", 1012, 0),
        ("a", 1060, 0),
    ]
    steps = [op.process(batch_of([row])) for row in rows]
    wall.set_seconds(1100)
    steps.append(op.process(batch_of([("a", 1100, 0)])))
    steps.append(op.finish())
    assert [seconds(e.watermark_ns) for e in steps] == [
        1000,
        1000,
        1005,
        1012,
        1060,
        1100,
        math.inf,
    ]
    assert tuples(steps[1].late) == [("a", at(1100), 9, "future", None, None)]
    assert all(e.late.num_rows == 0 for i, e in enumerate(steps) if i != 1)
    assert op.metrics.rows_future == 1
    assert [tuples(e.output) for e in steps] == [
        [],
        [],
        [],
        [("a", at(1000), at(1010), 2)],
        [("a", at(1010), at(1020), 1)],
        [("a", at(1060), at(1070), 1)],
        [("a", at(1100), at(1110), 1)],
    ]


# --- 4. windows: offsets, cumulate, calendar --------------------------------------------------


def test_tumble_with_an_offset_shifts_the_window_grid() -> None:
    sql = source(0) + select("TUMBLE(input, t, INTERVAL '10' SECOND, INTERVAL '3' SECOND)")
    assert parse_window_query(sql).aggregation.window == TumblingWindow(
        timedelta(seconds=10), timedelta(seconds=3)
    )
    r = run(sql, [("a", 2, 0), ("a", 3, 0), ("a", 12, 0), ("a", 13, 0), ("a", 22, 0)])
    #  t:  -7       2 3           12 13          22 23
    #       [------x)[x-----------x)[x-----------x)
    #  #0  2 ∈ [-7, 3)                   W = 2
    #  #1  3 ∈ [3, 13)                   W = 3: [-7, 3) fires
    #  #2  12 ∈ [3, 13)                  W = 12
    #  #3  13 ∈ [13, 23)                 W = 13: [3, 13) fires, count 2
    #  end                               [13, 23), count 2
    assert r.outputs == [
        [],
        [("a", at(-7), at(3), 1)],
        [],
        [("a", at(3), at(13), 2)],
        [],
        [("a", at(13), at(23), 2)],
    ]


def test_hop_with_an_offset_shifts_the_window_starts() -> None:
    sql = source(0) + select(
        "HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND, INTERVAL '2' SECOND)"
    )
    r = run(sql, [("a", 1, 0), ("a", 8, 0), ("a", 12, 0)])
    #  slide 5, size 10, offset 2: windows start at 2 + 5k
    #  t:  -8   -3    1  2     7  8        12     17     22
    #  w-8  [---------x--)                                  count 1
    #  w-3       [----x--------)                            count 1
    #  w2                [--------x---------)               count 1 (12 is not in it)
    #  w7                      [--x---------x------)        count 2
    #  w12                                  [x-----------)  count 1
    #  #1  W = 8: w-8 (end 2) and w-3 (end 7) fire     #2  W = 12: w2 fires
    assert r.outputs == [
        [],
        [("a", at(-8), at(2), 1), ("a", at(-3), at(7), 1)],
        [("a", at(2), at(12), 1)],
        [("a", at(7), at(17), 2), ("a", at(12), at(22), 1)],
    ]


def test_cumulate_windows_grow_by_step_and_late_rows_drop_only_closed_ones() -> None:
    sql = source(0) + select(
        "CUMULATE(input, t, INTERVAL '10' SECOND, INTERVAL '30' SECOND)",
        "count(*) AS n, sum(v) AS s",
    )
    r = run(
        sql, [("a", 5, 1), ("a", 10, 2), ("a", 25, 4), ("a", 12, 8), ("a", 31, 16), ("a", 8, 32)]
    )
    #  t:   0    5   10 12     20   25  30 31   40   50   60
    #       [----x---)                               [0, 10)
    #       [----x---x--x------)                     [0, 20)
    #       [----x---x--x-----------x--)             [0, 30)
    #                                  [x--)         [30, 40) [30, 50) [30, 60)
    #  #0  5: [0,10) [0,20) [0,30)          W = 5
    #  #1  10: [0,20) [0,30), not [0,10)    W = 10: [0,10) fires (5)
    #  #2  25: [0,30)                       W = 25: [0,20) fires (5, 10)
    #  #3  12: [0,20) closed (20 ≤ 25), [0,30) open: accepted into [0,30) only, not late
    #  #4  31                               W = 31: [0,30) fires (5, 10, 25, 12)
    #  #5  8: all of [0,10) [0,20) [0,30) closed: late, missed window = its largest, [0,30)
    #  end                                  the three windows from 30
    assert r.outputs == [
        [],
        [("a", at(0), at(10), 1, 1)],
        [("a", at(0), at(20), 2, 3)],
        [],
        [("a", at(0), at(30), 4, 15)],
        [],
        [("a", at(30), at(40), 1, 16), ("a", at(30), at(50), 1, 16), ("a", at(30), at(60), 1, 16)],
    ]
    assert r.late == [[], [], [], [], [], [("a", at(8), 32, "late", at(0), at(30))], []]


NY_DAY = source(0, time_zone="America/New_York") + select("TUMBLE(input, t, INTERVAL '1' DAY)")


def test_day_window_in_new_york_spring_forward_lasts_23_hours() -> None:
    assert parse_window_query(NY_DAY).aggregation.window == CalendarWindow(
        "day", "America/New_York"
    )
    times = ["2026-03-08T04:59:59", "2026-03-08T05:00", "2026-03-09T03:59:59", "2026-03-09T04:00"]
    r = run(NY_DAY, [("a", sec(t), 0) for t in times])
    #  UTC:     03-07 05:00    03-08 04:59:59 | 05:00       03-09 03:59:59 | 04:00      03-10 04:00
    #  local:   03-07 00:00 EST  23:59:59 EST | 03-08 00:00  23:59:59 EDT  | 03-09 00:00
    #           [------ 03-07: 24 h ---------x)[x--- 03-08: 23 h ---------x)[x-- 03-09: 24 h --)
    #  #1  W = 03-08 05:00Z: day 03-07 fires
    #  #2  W = 03-09 03:59:59Z: day 03-08 (ends 04:00Z) still open
    #  #3  W = 03-09 04:00Z = its end: day 03-08 fires, count 2
    assert r.outputs == [
        [],
        [("a", utc("2026-03-07T05:00"), utc("2026-03-08T05:00"), 1)],
        [],
        [("a", utc("2026-03-08T05:00"), utc("2026-03-09T04:00"), 2)],
        [("a", utc("2026-03-09T04:00"), utc("2026-03-10T04:00"), 1)],
    ]


def test_day_window_in_new_york_fall_back_lasts_25_hours() -> None:
    times = [
        "2026-11-01T03:59:59",  # 10-31 23:59:59 EDT
        "2026-11-01T04:00",  # 11-01 00:00 EDT
        "2026-11-01T05:30",  # 01:30 EDT, the first one
        "2026-11-01T06:30",  # 01:30 EST, the second one
        "2026-11-02T04:59:59",  # 11-01 23:59:59 EST
        "2026-11-02T05:00",  # 11-02 00:00 EST
    ]
    r = run(NY_DAY, [("a", sec(t), 0) for t in times])
    #  UTC:   10-31 04:00   11-01 04:00          05:30  06:30       11-02 05:00      11-03 05:00
    #  local: 10-31 00:00   11-01 00:00 EDT      01:30  01:30 EST   11-02 00:00 EST
    #         [-- 10-31 --x)[x---- 11-01: 25 h ---x------x-------x)[x--- 11-02 -----)
    assert r.outputs[1] == [("a", utc("2026-10-31T04:00"), utc("2026-11-01T04:00"), 1)]
    assert r.outputs[2:5] == [[], [], []]
    assert r.outputs[5] == [("a", utc("2026-11-01T04:00"), utc("2026-11-02T05:00"), 4)]
    assert r.outputs[6] == [("a", utc("2026-11-02T05:00"), utc("2026-11-03T05:00"), 1)]


def test_month_window_in_utc_follows_the_calendar() -> None:
    sql = source(0) + select("TUMBLE(input, t, INTERVAL '1' MONTH)")
    assert parse_window_query(sql).aggregation.window == CalendarWindow("month", "UTC")
    times = ["2026-01-31T23:59:59", "2026-02-01T00:00", "2026-02-28T23:59:59", "2026-03-01T00:00"]
    r = run(sql, [("a", sec(t), 0) for t in times])
    #  [---- January: 31 d ---x)[x---- February: 28 d ----x)[x---- March ----)
    assert r.outputs == [
        [],
        [("a", utc("2026-01-01T00:00"), utc("2026-02-01T00:00"), 1)],
        [],
        [("a", utc("2026-02-01T00:00"), utc("2026-03-01T00:00"), 2)],
        [("a", utc("2026-03-01T00:00"), utc("2026-04-01T00:00"), 1)],
    ]


def test_month_window_in_new_york_starts_at_local_midnight_of_the_first() -> None:
    sql = source(0, time_zone="America/New_York") + select("TUMBLE(input, t, INTERVAL '1' MONTH)")
    times = ["2026-03-01T04:59:59", "2026-03-01T05:00", "2026-04-01T03:59:59", "2026-04-01T04:00"]
    r = run(sql, [("a", sec(t), 0) for t in times])
    #  local: 02-28 23:59:59 EST | 03-01 00:00 EST ... (DST) ... 03-31 23:59:59 EDT | 04-01 00:00 EDT
    #  [-- February --------x)[x------------ March: 31 d - 1 h -------------x)[x-- April --)
    assert r.outputs == [
        [],
        [("a", utc("2026-02-01T05:00"), utc("2026-03-01T05:00"), 1)],
        [],
        [("a", utc("2026-03-01T05:00"), utc("2026-04-01T04:00"), 2)],
        [("a", utc("2026-04-01T04:00"), utc("2026-05-01T04:00"), 1)],
    ]


def test_week_window_starts_monday_local_midnight() -> None:
    sql = source(0, time_zone="America/New_York") + select("TUMBLE(input, t, INTERVAL '1' WEEK)")
    times = ["2026-03-02T04:59:59", "2026-03-02T05:00", "2026-03-08T12:00", "2026-03-09T04:00"]
    r = run(sql, [("a", sec(t), 0) for t in times])
    #  2026-03-02 and 2026-03-09 are Mondays; DST starts Sunday 03-08
    #  local: Sun 03-01 23:59:59 EST | Mon 03-02 00:00 EST   Sun 03-08 08:00 EDT | Mon 03-09 00:00 EDT
    #  [-- week of 02-23 -----x)[x---------- week of 03-02: 167 h ---x----------)[x-- 03-09 --)
    assert r.outputs == [
        [],
        [("a", utc("2026-02-23T05:00"), utc("2026-03-02T05:00"), 1)],
        [],
        [("a", utc("2026-03-02T05:00"), utc("2026-03-09T04:00"), 2)],
        [("a", utc("2026-03-09T04:00"), utc("2026-03-16T04:00"), 1)],
    ]


def test_week_window_in_utc_starts_monday_midnight() -> None:
    sql = source(0, time_zone="UTC") + select("TUMBLE(input, t, INTERVAL '1' WEEK)")
    times = ["2026-03-01T23:59:59", "2026-03-02T00:00"]  # Sunday, then Monday
    r = run(sql, [("a", sec(t), 0) for t in times])
    assert r.outputs == [
        [],
        [("a", utc("2026-02-23T00:00"), utc("2026-03-02T00:00"), 1)],
        [("a", utc("2026-03-02T00:00"), utc("2026-03-09T00:00"), 1)],
    ]


# --- 5. sessions never reopen an emitted session ----------------------------------------------


@pytest.mark.parametrize("base", [0, 100])
def test_row_that_would_join_an_emitted_session_is_late_for_it(base: int) -> None:
    rows: list[Row] = [("a", base + 0, 0), ("a", base + 6, 0), ("a", base + 4, 9)]
    r = run(source(0) + select(SESSION_5), rows)
    #  t - base:   0   4 5 6   9  11
    #              [x----)                #0  W = base
    #                      [x----)        #1  W = base + 6 ≥ base + 5: [0, 5) fires
    #                  [L----)            #2  own [4, 9): 9 > W, not late by itself, but 4 < 5
    #                                         would join the emitted [0, 5): late for it, no
    #                                         second session (nor a bridge into [6, 11))
    #  end                 [x----)        [6, 11) unchanged, count 1
    assert r.outputs == [
        [],
        [("a", at(base), at(base + 5), 1)],
        [],
        [("a", at(base + 6), at(base + 11), 1)],
    ]
    assert r.late == [[], [], [("a", at(base + 4), 9, "late", at(base), at(base + 5))], []]
    assert r.op.metrics.rows_late == 1


def test_late_session_rows_overlapping_an_open_session_merge_into_it() -> None:
    r = run(
        source(0) + select(SESSION_5, "count(*) AS n, sum(v) AS s"),
        [("a", 0, 1), ("a", 20, 2), ("a", 16, 4), ("a", 12, 8), ("a", 9, 16)],
    )
    #  t:   0    5   9    12 14 16 17   20 21     25
    #       [x---)                                     #0  W = 0
    #                                   [x--------)    #1  W = 20: [0, 5) fires
    #                          [x--------x--------)    #2  own [16, 21): on time, merges: [16, 25)
    #                     [x-----x-------x--------)    #3  own [12, 17): 17 ≤ 20, late by itself,
    #                                                      but overlaps the open [16, 25): merges
    #                [x---x-----x-------x--------)     #4  own [9, 14): same, via [12, 25)
    #  end           [9, 25): count 4, sum 30
    assert r.watermarks == [0, 20, 20, 20, 20, math.inf]
    assert r.outputs == [[], [("a", at(0), at(5), 1, 1)], [], [], [], [("a", at(9), at(25), 4, 30)]]
    assert r.late == [[]] * 6


def test_row_bridging_an_emitted_and_an_open_session_is_late_whatever_other_keys_do() -> None:
    r = run(
        source(0) + select(SESSION_5, "count(*) AS n, sum(v) AS s"),
        [("a", 0, 1), ("a", 8, 2), ("b", 6, 4), ("a", 12, 8), ("a", 4, 16)],
    )
    #  t:   0   4 5 6  8  9  11 12 13    17
    #  a:   [x----)                             #0  W = 0
    #                  [x---------)             #1  W = 8: a [0, 5) fires
    #  b:           [x------)                   #2  on time (11 > 8)
    #  a:              [x-----------x-----)     #3  merges: a [8, 17); W = 12: b [6, 11) fires
    #  a:       [L-----)                        #4  own [4, 9): 9 ≤ 12; it overlaps the open
    #                                               [8, 17) but also the emitted [0, 5) (4 < 5):
    #                                               late for [0, 5), as without key b
    #  end             [8, 17): count 2, sum 10
    assert r.outputs == [
        [],
        [("a", at(0), at(5), 1, 1)],
        [],
        [("b", at(6), at(11), 1, 4)],
        [],
        [("a", at(8), at(17), 2, 10)],
    ]
    assert r.late == [[], [], [], [], [("a", at(4), 16, "late", at(0), at(5))], []]


# --- 6. empty windows -------------------------------------------------------------------------

EMPTY_TTL = timedelta(seconds=15)


def empty_windows_op(window: str, ttl: timedelta = EMPTY_TTL) -> WindowOperator:
    agg = parse_window_query(source(0) + select(window, "count(*) AS n, sum(v) AS s")).aggregation
    return replace(agg, empty_windows_key_ttl=ttl).build(INPUT)


def test_empty_tumbling_windows_for_keys_seen_within_the_ttl() -> None:
    op = empty_windows_op(TUMBLE_10)
    r = feed(op, [("a", 1, 1), ("b", 3, 2), ("a", 12, 4), ("a", 45, 8), ("b", 71, 16)])
    #  Rule: key k gets an empty [s, e) when it had a row in [s - 15, s) and none in [s, e).
    #  t:   0 1 3   10 12   20     30     40  45  50     60     70 71  80     90
    #  a:   [x  )   [x  )   [ 0  )        [x    ) [ 0  ) [ 0  )
    #                       12 ∈ [5, 20)          45 ∈ [35, 50), 45 ∈ [45, 60); [30, 40), [70, 80):
    #                                             no row in [15, 30) nor in [55, 70)
    #  b:   [  x)   [ 0  )                                       [ x  ) [ 0  )
    #               3 ∈ [-5, 10); [20, 30): nothing in [5, 20)          71 ∈ [65, 80)
    #  #2  W = 12: [0, 10) fires for a and b
    #  #3  W = 45: [10, 20) a (1), b (empty); [20, 30) a (empty)
    #  #4  W = 71: [40, 50) a (1); [50, 60) a (empty); [60, 70) a (empty)
    #  end W = +∞: [70, 80) b (1); [80, 90) b (empty)
    assert r.outputs == [
        [],
        [],
        [("a", at(0), at(10), 1, 1), ("b", at(0), at(10), 1, 2)],
        [
            ("a", at(10), at(20), 1, 4),
            ("b", at(10), at(20), 0, None),
            ("a", at(20), at(30), 0, None),
        ],
        [
            ("a", at(40), at(50), 1, 8),
            ("a", at(50), at(60), 0, None),
            ("a", at(60), at(70), 0, None),
        ],
        [("b", at(70), at(80), 1, 16), ("b", at(80), at(90), 0, None)],
    ]
    assert all(not late for late in r.late)


def test_empty_hopping_windows_for_keys_seen_within_the_ttl() -> None:
    op = empty_windows_op(
        "HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND)", timedelta(seconds=10)
    )
    r = feed(op, [("a", 2, 1), ("b", 14, 2), ("a", 31, 4)])
    #  size 10, slide 5, ttl 10: k gets an empty [s, s + 10) with a row in [s - 10, s), none in it
    #  t:  -5  0 2  5    10  14 15   20   25   30 31 35   40   45   50
    #  a: [---x-)                                                         [-5, 5)   1
    #         [x--------)                                                 [0, 10)   1
    #              [ 0      )                                             [5, 15)   2 ∈ [-5, 5)
    #                   [ 0     )                                         [10, 20)  2 ∈ [0, 10)
    #                                           [x------)                 [25, 35)  1
    #                                              [x--------)            [30, 40)  1
    #                                                   [ 0     )         [35, 45)  31 ∈ [25, 35)
    #                                                      [ 0      )     [40, 50)  31 ∈ [30, 40)
    #  b: [5, 15) 1, [10, 20) 1, [15, 25) empty (14 ∈ [5, 15)), [20, 30) empty (14 ∈ [10, 20)),
    #     [25, 35): nothing in [15, 25)
    #  #1  W = 14: windows ending ≤ 14    #2  W = 31: ending in (14, 31]    end: the rest
    assert r.outputs == [
        [],
        [("a", at(-5), at(5), 1, 1), ("a", at(0), at(10), 1, 1)],
        [
            ("a", at(5), at(15), 0, None),
            ("b", at(5), at(15), 1, 2),
            ("a", at(10), at(20), 0, None),
            ("b", at(10), at(20), 1, 2),
            ("b", at(15), at(25), 0, None),
            ("b", at(20), at(30), 0, None),
        ],
        [
            ("a", at(25), at(35), 1, 4),
            ("a", at(30), at(40), 1, 4),
            ("a", at(35), at(45), 0, None),
            ("a", at(40), at(50), 0, None),
        ],
    ]


@pytest.mark.parametrize(
    ("window", "ttl", "rows"),
    [
        (TUMBLE_10, EMPTY_TTL, [("a", 1, 1), ("b", 3, 2), ("a", 12, 4), ("a", 45, 8), ("b", 71, 16)]),
        ("HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND)", timedelta(seconds=10),
         [("a", 2, 1), ("b", 14, 2), ("a", 31, 4)]),
    ],
    ids=["tumble", "hop"],
)  # fmt: skip
@pytest.mark.parametrize("null_key", ["a", "b"])
def test_a_null_key_gets_the_empty_windows_any_other_key_gets(
    window: str, ttl: timedelta, rows: list[Row], null_key: str
) -> None:
    """NULL is one key, as GROUP BY groups it: the two examples above with key ``a`` (then
    ``b``) replaced by NULL give the same rows, NULL in place of that key, real and empty
    windows alike (the known keys, the new-key check and the windows already fired match a
    NULL to a NULL)."""

    def nulled(run: Run) -> list[list[Any]]:
        return [
            sorted((tuple(None if v == null_key else v for v in r) for r in out), key=repr)
            for out in run.outputs
        ]

    plain = feed(empty_windows_op(window, ttl), rows)
    with_null = feed(
        empty_windows_op(window, ttl),
        [(None if k == null_key else k, t, v) for k, t, v in rows],
    )
    assert [sorted(o, key=repr) for o in with_null.outputs] == nulled(plain)
    assert any(r[0] is None and r[3] == 0 for out in with_null.outputs for r in out)


def test_empty_windows_fire_at_end_plus_allowed_lateness() -> None:
    agg = parse_window_query(
        source(0, allowed_lateness="5s") + select(TUMBLE_10, "count(*) AS n, sum(v) AS s")
    ).aggregation
    op = replace(agg, empty_windows_key_ttl=EMPTY_TTL).build(INPUT)
    r = feed(op, [("a", 1, 1), ("a", 16, 2), ("a", 8, 4), ("a", 41, 8)])
    #  L = 5: [s, e) fires at W ≥ e + 5; ttl 15
    #  t:   0 1   8 10    16   20     30     40 41   50     60
    #       [x    L )[ x    )[ 0    )[ 0    )[x    )[ 0    )
    #                        16 ∈ [5, 20)  16 ∈ [15, 30)  41 ∈ [35, 50); [60, 70): none in [45, 60)
    #  #1  W = 16 ≥ 15: [0, 10) fires
    #  #2  8: late for [0, 10), creates no window
    #  #3  W = 41: windows with e + 5 ≤ 41: [10, 20), [20, 30) empty; [30, 40) not yet (45 > 41)
    #  end [30, 40) empty, [40, 50), [50, 60) empty
    assert r.outputs == [
        [],
        [("a", at(0), at(10), 1, 1)],
        [],
        [("a", at(10), at(20), 1, 2), ("a", at(20), at(30), 0, None)],
        [
            ("a", at(30), at(40), 0, None),
            ("a", at(40), at(50), 1, 8),
            ("a", at(50), at(60), 0, None),
        ],
    ]
    assert r.late == [[], [], [("a", at(8), 4, "late", at(0), at(10))], [], []]


@pytest.mark.parametrize(
    ("window", "emit"),
    [(TUMBLE_10, "update"), (SESSION_5, "final")],
    ids=["update-mode", "session"],
)
def test_empty_windows_reject_update_mode_and_sessions(window: str, emit: str) -> None:
    agg = parse_window_query(source(0, emit=emit) + select(window)).aggregation
    with pytest.raises(InvalidInputError, match="empty windows"):
        replace(agg, empty_windows_key_ttl=EMPTY_TTL).build(INPUT)


# --- 7. snapshots leave live state alone ------------------------------------------------------

SNAPSHOT_ROWS: list[Row] = [
    ("a", 1, 5),
    ("b", 2, -3),
    ("a", 4, 7),
    ("a", 12, 2),
    ("b", 7, 4),
    ("b", 13, 9),
    ("a", 16, 1),
    ("a", 8, 6),
    ("b", 27, 3),
    ("a", 24, 8),
]


def contents(value: object) -> object:
    """A plain-Python deep copy of a snapshot: tables and batches as lists of row dicts."""
    if isinstance(value, pa.Table | pa.RecordBatch):
        return value.to_pylist()
    if isinstance(value, OperatorSnapshot):
        return {
            name: contents(getattr(value, name))
            for name in ("panes", "buffer", "closed_sessions", "known_keys", "meta")
        }
    if isinstance(value, dict):
        return {k: contents(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [contents(v) for v in value]
    return value


@pytest.mark.parametrize(
    "sql",
    [
        source(2, allowed_lateness="5s")
        + select(TUMBLE_10, "count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi"),
        source(2) + select(TUMBLE_10, "avg(v) AS m, count(v) AS c"),
        source(2)
        + select(
            TUMBLE_10,
            "count(DISTINCT v) AS d, stddev(v) AS sd, first_value(v) AS f, last_value(v) AS l, "
            "approx_distinct(v) AS ad, approx_percentile_cont(v, 0.5) AS p",
        ),
        source(2, allowed_lateness="5s", emit="update") + select(TUMBLE_10, "sum(v) AS s"),
        source(2)
        + select("HOP(input, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND)", "sum(v) AS s"),
        source(2) + select(SESSION_5, "count(*) AS n, sum(v) AS s"),
    ],
    ids=["tumble-final", "tumble-avg", "tumble-sketches", "tumble-update", "hop", "session"],
)
@pytest.mark.parametrize("merge_rows", [1, 1 << 18], ids=["merge-each-row", "buffered"])
def test_snapshot_mid_stream_does_not_change_the_results(sql: str, merge_rows: int) -> None:
    agg = replace(parse_window_query(sql).aggregation, merge_rows=merge_rows)
    plain = feed(agg.build(INPUT), SNAPSHOT_ROWS)

    op = agg.build(INPUT)
    steps: list[Emission] = []
    snapshots = []
    for row in SNAPSHOT_ROWS:
        steps.append(op.process(batch_of([row])))
        snapshot = op.snapshot()
        snapshots.append((snapshot, contents(snapshot)))
        assert contents(op.snapshot()) == contents(snapshot)  # a second one sees the same state
    steps.append(op.finish())
    snapped = Run(op, steps)

    assert snapped.outputs == plain.outputs
    assert snapped.late == plain.late
    assert snapped.watermarks == plain.watermarks
    assert sum(len(rows) for rows in plain.outputs) > 0
    # an earlier snapshot is not changed by what the operator did after it
    assert all(contents(snapshot) == copy for snapshot, copy in snapshots)


def test_sum_and_avg_of_one_column_snapshot_and_finish_together() -> None:
    sql = source(0) + select(TUMBLE_10, "sum(v) AS s, avg(v) AS m")
    op = parse_window_query(sql).build(INPUT)
    op.process(batch_of([("a", 1, 1), ("a", 2, 2)]))
    op.snapshot()
    #  [0, 10): rows 1 and 2 → sum 3, avg 1.5
    assert tuples(op.finish().output) == [("a", at(0), at(10), 3, 1.5)]
