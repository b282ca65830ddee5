"""A GROUP BY of two key columns where either, both or neither is NULL: each combination is its
own group (SQL's GROUP BY treats NULLs as equal to each other and distinct from every value, the
empty string included), on the folded path, on the SQL-merge path (``fold_state=False``), after
a kill-and-resume through the serialised snapshot, and against DataFusion's batch GROUP BY over
the same rows (the oracle).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import datafusion
import pyarrow as pa
import pytest
from flight_serve.engine.operator import OperatorSnapshot, WindowOperator
from flight_serve.pipelines.query import parse_window_query

SCHEMA = pa.schema(
    [("k", pa.string()), ("j", pa.int32()), ("t", pa.timestamp("s", tz="UTC")), ("v", pa.int64())]
)
SQL = (
    "CREATE SOURCE s (WATERMARK FOR t AS t);\n"
    "SELECT k, j, window_start, window_end, count(*) AS n, sum(v) AS total, min(v) AS lo "
    "FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, j, window_start, window_end"
)

#: (k, j, t seconds, v); each v a power of two, so a sum names the rows it holds.
#:
#:   t   0    1      2       3       4        5     6       7       8        9     | 12
#:   k        a      a       NULL    NULL     a     NULL    a       NULL     ''    | NULL
#:   j        1      NULL    1       NULL     1     1       NULL    NULL     1     | NULL
#:   v        1      2       4       8        16    32      64      128      256   | 512
#:       [0, 10) ------------------------------------------------------------------)[10, 20)
#:
#: W = t: the row at t = 12 closes [0, 10); [10, 20) closes at the end of input.
ROWS = [
    ("a", 1, 1, 1),
    ("a", None, 2, 2),
    (None, 1, 3, 4),
    (None, None, 4, 8),
    ("a", 1, 5, 16),
    (None, 1, 6, 32),
    ("a", None, 7, 64),
    (None, None, 8, 128),
    ("", 1, 9, 256),
    (None, None, 12, 512),
]

#: (k, j, window_start second, n, total, lo), by hand from the timeline; within a window the
#: groups come out sorted by k then j, NULLs last.
EXPECTED = [
    ("", 1, 0, 1, 256, 256),
    ("a", 1, 0, 2, 17, 1),
    ("a", None, 0, 2, 66, 2),
    (None, 1, 0, 2, 36, 4),
    (None, None, 0, 2, 136, 8),
    (None, None, 10, 1, 512, 512),
]


def _table() -> pa.Table:
    return pa.table(
        {
            "k": pa.array([r[0] for r in ROWS], pa.string()),
            "j": pa.array([r[1] for r in ROWS], pa.int32()),
            "t": pa.array([r[2] for r in ROWS], pa.int64()).cast(SCHEMA.field("t").type),
            "v": pa.array([r[3] for r in ROWS], pa.int64()),
        },
        schema=SCHEMA,
    )


def _build(folded: bool, restore: OperatorSnapshot | None = None) -> WindowOperator:
    aggregation = replace(parse_window_query(SQL).aggregation, fold_state=folded)
    return aggregation.build(SCHEMA, restore=restore)


def _run(folded: bool, size: int, cut: int | None = None) -> list[tuple[Any, ...]]:
    op = _build(folded)
    out: list[dict[str, Any]] = []
    for i, batch in enumerate(_table().to_batches(max_chunksize=size)):
        if i == cut:  # kill and resume: only the serialised snapshot survives
            op = _build(folded, OperatorSnapshot.from_bytes(op.snapshot().to_bytes()))
        emission = op.process(batch)
        assert emission.late.num_rows == 0
        out.extend(emission.output.to_pylist())
    out.extend(op.finish().output.to_pylist())
    return [
        (r["k"], r["j"], int(r["window_start"].timestamp()), r["n"], r["total"], r["lo"])
        for r in out
    ]


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "sql_merge"])
@pytest.mark.parametrize("size", [1, 2, 3, 10])
def test_each_null_combination_of_two_keys_is_its_own_group(folded: bool, size: int) -> None:
    assert _run(folded, size) == EXPECTED


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "sql_merge"])
@pytest.mark.parametrize("cut", [1, 4, 8])
def test_the_groups_survive_a_kill_and_resume(folded: bool, cut: int) -> None:
    assert _run(folded, 1, cut) == EXPECTED


def test_datafusion_batch_group_by_agrees() -> None:
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("s", [_table().to_batches()])
    oracle = ctx.sql(
        "SELECT k, j, CAST(to_unixtime(t) AS BIGINT) / 10 * 10 AS ws, count(*) AS n, "
        "sum(v) AS total, min(v) AS lo FROM s GROUP BY k, j, ws"
    ).to_arrow_table()
    got = sorted(_run(True, 3), key=repr)
    assert got == sorted((tuple(r.values()) for r in oracle.to_pylist()), key=repr)
