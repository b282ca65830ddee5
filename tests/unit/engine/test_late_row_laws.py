"""Hypothesis laws of the late side output, for every window kind (DESIGN §4, STYLE habit 8).

Each input row carries ``bit = 2**id``; every window sums it, so a fired window's ``ids`` is the
exact set of rows counted in it (ids are distinct, the sum has no carries). With any arrival order,
batching, watermark bound and allowed lateness, for TUMBLE, HOP, SESSION and CUMULATE, with
``emit = 'final'`` and ``'update'`` (a window's last revision counts; a session's revision
supersedes the smaller sessions of its key it grew from):

* every late row is in the late side output exactly once;
* no row is both counted in a window and late, and none is lost: the rows counted in some window
  and the late rows are together the input, each once;
* tumbling and session windows count a row in at most one window;
* within one batch the order of rows does not matter (every row of a batch meets the same ``W``).

Times are integer seconds (``timestamp[s, tz=UTC]``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.pipelines.query import parse_window_query
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

LAWS = settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
UTC_S = pa.timestamp("s", "UTC")
KEYS = ("A", "B", "C")

WINDOWS = {
    "tumble": "TUMBLE(input, t, INTERVAL '5' SECOND)",
    "hop": "HOP(input, t, INTERVAL '2' SECOND, INTERVAL '6' SECOND)",
    "session": "SESSION(input, t, INTERVAL '5' SECOND)",
    "cumulate": "CUMULATE(input, t, INTERVAL '2' SECOND, INTERVAL '6' SECOND)",
}
ONE_WINDOW_PER_ROW = {"tumble", "session"}


def query(kind: str, bound_s: int, lateness_s: int, emit: str = "final") -> str:
    options = [f"emit = '{emit}'"] + ([f"allowed_lateness = '{lateness_s}s'"] if lateness_s else [])
    lateness = f" WITH ({', '.join(options)})"
    return (
        f"CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL '{bound_s}' SECOND){lateness};\n"
        f"SELECT k, window_start, window_end, count(*) AS n, sum(bit) AS ids\n"
        f"FROM {WINDOWS[kind]}\nGROUP BY k, window_start, window_end"
    )


def table_of(rows: Sequence[tuple[str, int]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(len(rows)), pa.int64()),
            "k": pa.array([k for k, _ in rows], pa.string()),
            "t": pa.array([t for _, t in rows], pa.int64()).cast(UTC_S),
            "bit": pa.array([1 << i for i in range(len(rows))], pa.int64()),
        }
    )


def run(sql: str, table: pa.Table, batches: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Feed ``table``'s rows in ``batches`` (row ids per batch), then finish.

    Returns ``(late ids in arrival order, ids-bitmask of each fired window)``; with ``emit =
    'update'`` the bitmask of a window's last revision (each revision holds the earlier ones)."""
    op = parse_window_query(sql).build(table.schema)
    update = "_revision" in op.output_schema.names
    grows = update and "SESSION(" in sql  # an update-mode session grows by late rows
    late: list[int] = []
    masks: list[int] = []
    windows: dict[tuple[Any, ...], int] = {}

    def collect(output: pa.Table, late_rows: pa.Table) -> None:
        late.extend(late_rows.column("id").to_pylist())
        assert set(late_rows.column("_late_reason").to_pylist()) <= {"late"}
        counts, id_sets = output.column("n").to_pylist(), output.column("ids").to_pylist()
        bounds = [output.column(c).to_pylist() for c in ("k", "window_start", "window_end")]
        keys = list(zip(*bounds, strict=True))
        for key, n, ids in zip(keys, counts, id_sets, strict=True):
            assert n == bin(ids).count("1")  # each counted row once per window
            if not update:
                assert key not in windows, f"window {key} fired twice"
            # a revision supersedes the earlier rows of its key within its bounds (a session
            # that grew by a late row comes out with its new bounds) and only adds rows
            k, start, end = key
            older = [
                w
                for w in windows
                if w == key or (grows and w[0] == k and start <= w[1] and w[2] <= end)
            ]
            for w in older:
                assert ids & windows[w] == windows[w], f"a revision of {w} lost rows"
                del windows[w]
            windows[key] = ids

    for ids in batches:
        if ids:
            em = op.process(table.take(pa.array(ids, pa.int64())).combine_chunks().to_batches()[0])
            collect(em.output, em.late)
    end = op.finish()
    collect(end.output, end.late)
    masks.extend(windows.values())
    return late, masks


@st.composite
def late_batches(draw: st.DrawFn) -> tuple[list[tuple[str, int]], list[list[int]]]:
    """Rows whose event times wander back and forth (many are late), cut into random batches."""
    rows = draw(
        st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-10, 40)), min_size=1, max_size=45)
    )
    sizes = draw(st.lists(st.integers(1, 6), min_size=len(rows), max_size=len(rows)))
    batches, i = [], 0
    for size in sizes:
        if i >= len(rows):
            break
        batches.append(list(range(i, min(i + size, len(rows)))))
        i += size
    return rows, batches


@pytest.mark.parametrize("emit", ["final", "update"])
@pytest.mark.parametrize("kind", list(WINDOWS))
@LAWS
@given(
    data=late_batches(),
    bound_s=st.sampled_from([0, 0, 2]),
    lateness_s=st.sampled_from([0, 0, 3]),
    order=st.randoms(use_true_random=False),
)
def test_every_row_is_late_once_or_counted_and_none_is_lost(
    kind: str,
    emit: str,
    data: tuple[list[tuple[str, int]], list[list[int]]],
    bound_s: int,
    lateness_s: int,
    order: random.Random,
) -> None:
    rows, batches = data
    sql = query(kind, bound_s, lateness_s, emit)
    table = table_of(rows)
    late, masks = run(sql, table, batches)
    event("some rows late" if late else "no row late")

    assert len(late) == len(set(late)), f"a late row came out twice: {late}"
    counted = 0
    for mask in masks:
        if kind in ONE_WINDOW_PER_ROW:
            assert not counted & mask, "a row counted in two windows"
        counted |= mask
    late_mask = sum(1 << i for i in late)
    assert not counted & late_mask, "a row both counted in a window and late"
    assert counted | late_mask == (1 << len(rows)) - 1, "a row was lost"

    shuffled = [list(b) for b in batches]
    for b in shuffled:
        order.shuffle(b)
    late_b, masks_b = run(sql, table, shuffled)
    assert sorted(late_b) == sorted(late)
    assert sorted(masks_b) == sorted(masks)


@pytest.mark.parametrize(
    "last_batch", [[("B", 1), ("A", 3)], [("A", 3), ("B", 1)]], ids=["B-first", "A-first"]
)
def test_two_late_session_rows_in_one_batch_each_come_out_once(
    last_batch: list[tuple[str, int]],
) -> None:
    """(A, 0 s), then (A, 20 s) fires session A [0, 5); then (A, 3 s) hits that emitted session
    and (B, 1 s) is behind the watermark: both are late, once each, in either order."""
    rows = [("A", 0), ("A", 20), *last_batch]
    late, masks = run(query("session", 0, 0), table_of(rows), [[0], [1], [2, 3]])
    assert sorted(rows[i] for i in late) == [("A", 3), ("B", 1)]
    assert sorted(masks) == [0b01, 0b10]  # [0, 5) with row 0, then [20, 25) at end of input
