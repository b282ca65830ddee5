"""Exact ``count(DISTINCT x)`` on the folded path (``flight_serve.engine.distinct``).

Hand-computed windows (NULL values, NULL keys, repeats across batches, hops), DataFusion's batch
``count(DISTINCT)`` over the same rows as the oracle, the SQL-merge path (``fold_state=False``)
as a second oracle including late rows, kill-and-resume through the serialised snapshot at every
batch, non-consuming snapshots, key-map compaction and the checkpoint version checks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import datafusion
import numpy as np
import pyarrow as pa
import pytest
from flight_serve.engine.fold import FoldState
from flight_serve.engine.operator import OperatorSnapshot, WindowOperator
from flight_serve.errors import CheckpointError
from flight_serve.pipelines.query import parse_window_query
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

SCHEMA = pa.schema(
    [
        ("k", pa.string()),
        ("t", pa.timestamp("s", tz="UTC")),
        ("x", pa.int64()),
        ("s", pa.string()),
        ("v", pa.float64()),
    ]
)
SOURCE = "CREATE SOURCE src (WATERMARK FOR t AS t - INTERVAL '{bound}' SECOND);\n"
WINDOWS = {
    "tumble": "TUMBLE(src, t, INTERVAL '10' SECOND)",
    "hop": "HOP(src, t, INTERVAL '5' SECOND, INTERVAL '15' SECOND)",
    "hop_gaps": "HOP(src, t, INTERVAL '10' SECOND, INTERVAL '4' SECOND)",
}
AGGS = "count(*) AS n, count(DISTINCT x) AS dx, sum(x) AS sx, count(DISTINCT s) AS ds"

Row = tuple[str | None, int, int | None, str | None]


def sql_of(window: str, bound: int = 0, aggs: str = AGGS, keys: str = "k") -> str:
    group = ", ".join([*([keys] if keys else []), "window_start", "window_end"])
    return SOURCE.format(bound=bound) + (
        f"SELECT {group}, {aggs} FROM {WINDOWS[window]} GROUP BY {group}"
    )


def batches_of(data: list[Row], size: int) -> list[pa.RecordBatch]:
    table = pa.table(
        {
            "k": pa.array([r[0] for r in data], pa.string()),
            "t": pa.array([r[1] for r in data], pa.int64()).cast(SCHEMA.field("t").type),
            "x": pa.array([r[2] for r in data], pa.int64()),
            "s": pa.array([r[3] for r in data], pa.string()),
            "v": pa.array([1.0] * len(data), pa.float64()),
        },
        schema=SCHEMA,
    )
    return table.to_batches(max_chunksize=size)


def build(sql: str, folded: bool = True, restore: OperatorSnapshot | None = None) -> WindowOperator:
    aggregation = replace(parse_window_query(sql).aggregation, fold_state=folded)
    return aggregation.build(SCHEMA, restore=restore)


def run(
    sql: str, batches: list[pa.RecordBatch], folded: bool = True, cut: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    op = build(sql, folded)
    assert op.distinct_sets is folded
    out: list[dict[str, Any]] = []
    late: list[dict[str, Any]] = []
    for i, batch in enumerate(batches):
        if i == cut:  # kill and resume: only the serialised snapshot survives
            blob = op.snapshot().to_bytes()
            op = build(sql, folded, restore=OperatorSnapshot.from_bytes(blob))
        emission = op.process(batch)
        out.extend(emission.output.to_pylist())
        late.extend(emission.late.to_pylist())
    out.extend(op.finish().output.to_pylist())
    return out, late


def short(rows_: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(key, window_start second, n, dx, sx, ds)."""
    return [(r["k"], r["window_start"].second, r["n"], r["dx"], r["sx"], r["ds"]) for r in rows_]


def test_hand_computed_tumble_with_null_values_and_keys() -> None:
    """TUMBLE 10 s, W = t. Window [0, 10):
    a: x 1, 1, 2, NULL (and 1 again in the second batch) -> dx 2; s 'p', 'p', NULL, 'q' -> ds 2
    NULL key: x NULL, NULL -> dx 0 (two rows, every value NULL); s 'r', 'r' -> ds 1
    b: x 7 -> dx 1, s NULL -> ds 0
    Window [10, 20): a: x 1 (a value seen in the previous window counts again) -> dx 1."""
    data: list[Row] = [
        ("a", 1, 1, "p"),
        ("a", 2, 1, "p"),
        (None, 3, None, "r"),
        ("a", 3, 2, None),
        ("b", 4, 7, None),
        ("a", 5, None, "q"),
        (None, 6, None, "r"),
        ("a", 9, 1, "q"),
        ("a", 12, 1, "p"),
    ]
    for size in (1, 2, 3, 5, 9):
        out, late = run(sql_of("tumble"), batches_of(data, size))
        assert late == []
        assert short(out) == [
            ("a", 0, 5, 2, 5, 2),
            ("b", 0, 1, 1, 7, 0),
            (None, 0, 2, 0, None, 1),
            ("a", 10, 1, 1, 1, 1),
        ], size


def test_hand_computed_hop_counts_a_value_once_across_its_panes() -> None:
    """HOP slide 5 s, size 15 s: panes of 5 s. Key a: x 1 at t=1 (pane 0), x 1 at t=6 (pane 1),
    x 2 at t=11 (pane 2), x NULL at t=16. Window [0, 15) holds panes 0-2: dx 2 (1 once);
    [5, 20): x 1, 2, NULL -> 2; [10, 25): 2, NULL -> 1; [15, 30): NULL -> 0; [-10, 5): 1 -> 1;
    [-5, 10): 1 -> 1."""
    data: list[Row] = [("a", 1, 1, "u"), ("a", 6, 1, "u"), ("a", 11, 2, "w"), ("a", 16, None, None)]
    for size in (1, 2, 4):
        out, _ = run(sql_of("hop"), batches_of(data, size))
        got = [(r["window_start"].timestamp(), r["n"], r["dx"], r["ds"]) for r in out]
        assert got == [
            (-10, 1, 1, 1),
            (-5, 2, 1, 1),
            (0, 3, 2, 2),
            (5, 3, 2, 2),
            (10, 2, 1, 1),
            (15, 1, 0, 0),
        ], size


def datafusion_oracle(data: list[Row]) -> list[tuple[Any, ...]]:
    """DataFusion's batch ``count(DISTINCT)`` per key and 10 s tumbling window."""
    ctx = datafusion.SessionContext()
    table = pa.Table.from_batches(batches_of(data, max(len(data), 1)))
    ctx.register_record_batches("events", [table.to_batches()])
    sql = (
        "SELECT k, CAST(floor(CAST(t AS BIGINT) / 10) * 10 AS BIGINT) AS ws, count(*) AS n, "
        "count(DISTINCT x) AS dx, sum(x) AS sx, count(DISTINCT s) AS ds FROM "
        "(SELECT k, arrow_cast(t, 'Int64') AS t, x, s FROM events) "
        "GROUP BY k, ws ORDER BY ws, k NULLS LAST"
    )
    rows_ = ctx.sql(sql).to_arrow_table().to_pylist()
    return [(r["k"], r["ws"], r["n"], r["dx"], r["sx"], r["ds"]) for r in rows_]


rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", None]),
        st.integers(0, 60),
        st.one_of(st.none(), st.integers(-3, 3)),
        st.one_of(st.none(), st.sampled_from(["p", "q", "", "ü"])),
    ),
    min_size=1,
    max_size=60,
)
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],
)


@SETTINGS
@given(data=rows, size=st.integers(1, 9))
def test_tumble_equals_datafusion_batch_count_distinct(data: list[Row], size: int) -> None:
    """In event-time order with W = t nothing is late, so the windows are DataFusion's batch
    GROUP BY over the same rows, exactly (window_end order, then key; NULL key last)."""
    data = sorted(data, key=lambda r: r[1])
    out, late = run(sql_of("tumble"), batches_of(data, size))
    assert late == []
    got = [
        (r["k"], int(r["window_start"].timestamp()), r["n"], r["dx"], r["sx"], r["ds"]) for r in out
    ]
    assert got == datafusion_oracle(data)


@pytest.mark.parametrize("window", sorted(WINDOWS))
@SETTINGS
@given(data=rows, size=st.integers(1, 9), bound=st.sampled_from([0, 3, 12]))
def test_folded_distinct_equals_sql_merge_and_resumes_at_any_cut(
    window: str, data: list[Row], size: int, bound: int
) -> None:
    """Out of order, with late rows: the folded sets emit what the SQL merge emits, and a run
    killed at any batch and resumed from its serialised snapshot emits the straight run."""
    sql = sql_of(window, bound)
    batches = batches_of(data, size)
    straight = run(sql, batches)
    assert straight == run(sql, batches, folded=False)
    for cut in range(1, len(batches)):
        assert run(sql, batches, cut=cut) == straight, cut


def test_snapshot_is_versioned_non_consuming_and_restores_mid_stream() -> None:
    sql = sql_of("tumble")
    data: list[Row] = [("a", 1, 1, "p"), ("a", 2, 2, "p"), (None, 3, None, "q"), ("a", 4, 1, "r")]
    batches = batches_of(data, 2)
    op = build(sql)
    op.process(batches[0])
    first = op.snapshot()
    again = op.snapshot()
    assert first.meta["version"] == OperatorSnapshot.VERSION_DISTINCT == 4
    assert first.panes.equals(again.panes)
    assert first.panes.column_names[-2:] == ["d:x", "d:s"]
    assert first.panes.to_pylist()[0]["d:x"] == [1, 2]
    op.process(batches[1])  # the live state went on after both snapshots
    straight = short(op.finish().output.to_pylist())
    assert straight == [("a", 0, 3, 2, 4, 2), (None, 0, 1, 0, None, 1)]
    resumed = build(sql, restore=OperatorSnapshot.from_bytes(first.to_bytes()))
    resumed.process(batches[1])
    assert short(resumed.finish().output.to_pylist()) == straight


def test_checkpoint_versions_are_checked() -> None:
    sql = sql_of("tumble")
    batch = batches_of([("a", 1, 1, "p")], 1)[0]
    sql_op = build(sql, folded=False)
    sql_op.process(batch)
    v1 = OperatorSnapshot.from_bytes(sql_op.snapshot().to_bytes())
    assert v1.meta["version"] == 1
    with pytest.raises(
        CheckpointError,
        match=r"version 1 \(SQL-merged pane state\).*count\(DISTINCT\) sets \(version 4\)",
    ):
        build(sql, restore=v1)
    folded = build(sql)
    folded.process(batch)
    v4 = OperatorSnapshot.from_bytes(folded.snapshot().to_bytes())
    with pytest.raises(CheckpointError, match=r"version 4 \(folded state with count"):
        build(sql, folded=False, restore=v4)
    as_v2 = replace(v4, meta={**v4.meta, "version": 2})
    with pytest.raises(CheckpointError, match=r"version 2 \(folded state\)"):
        build(sql, restore=as_v2)
    other = sql_of(
        "tumble",
        aggs="count(*) AS n, count(DISTINCT x) AS dx, sum(x) AS sx, count(DISTINCT k) AS ds",
    )
    with pytest.raises(CheckpointError, match="pane state does not match"):
        build(other, restore=v4)


def test_which_queries_keep_distinct_sets() -> None:
    schema_sql = sql_of("tumble", aggs="count(DISTINCT x) AS dx")
    op = build(schema_sql)
    assert op.distinct_sets
    assert not op.folded_state
    # floats (NaN, -0.0) keep the SQL path, and so do sessions
    assert not build(sql_of("tumble", aggs="count(DISTINCT v) AS dv")).distinct_sets
    session = SOURCE.format(bound=0) + (
        "SELECT k, window_start, window_end, count(DISTINCT x) AS dx "
        "FROM SESSION(src, t, INTERVAL '4' SECOND) GROUP BY k, window_start, window_end"
    )
    assert not build(session).distinct_sets
    assert build(sql_of("tumble", aggs="count(*) AS n")).folded_state


def test_compaction_renumbers_the_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ever-new keys: the key map is compacted while sets are held; counts stay exact."""
    monkeypatch.setattr(FoldState, "COMPACT_MIN_SLOTS", 8)
    rng = np.random.default_rng(3)
    data: list[Row] = []
    for t in range(0, 200):
        key = f"k{t // 3}"  # three rows per key, then the key is never seen again
        data.append((key, t, int(rng.integers(0, 3)), None if t % 5 == 0 else key[-1:]))
    sql = sql_of("hop", bound=2)
    batches = batches_of(data, 7)
    folded = run(sql, batches)
    assert folded == run(sql, batches, folded=False)
    assert run(sql, batches, cut=13) == folded


def test_many_batches_into_one_pane_stay_exact() -> None:
    """More batches into one pane than DistinctSets.MAX_PARTS: its tables are grouped."""
    data: list[Row] = [("a", 5, i % 4, str(i % 6)) for i in range(50)] + [("a", 30, 9, "z")]
    out, _ = run(sql_of("tumble"), batches_of(data, 1))
    assert short(out)[0] == ("a", 0, 50, 4, sum(i % 4 for i in range(50)), 6)
