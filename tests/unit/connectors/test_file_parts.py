"""FileSource.read_part (connectors/file.py): one Parquet file read by several readers, each
the batches that start in its row groups; together exactly read_file's batches."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flight_serve.connectors.file import FileSource

ROWS = 10_007


@pytest.fixture
def table() -> pa.Table:
    return pa.table({
        "i": pa.array(range(ROWS), pa.int64()),
        "s": pa.array([f"row {i}" for i in range(ROWS)]),
    })  # fmt: skip


@pytest.mark.parametrize(
    ("group_rows", "batch_rows"),
    [(1_000, 100), (777, 333), (777, 1), (4_096, 1_000), (13, 700), (10_007, 5_000), (1_000, 20_000)],
)
def test_the_parts_together_are_the_files_batches_each_once(
    table: pa.Table, tmp_path: Path, group_rows: int, batch_rows: int
) -> None:
    path = tmp_path / "one.parquet"
    pq.write_table(table, path, row_group_size=group_rows)
    source = FileSource((path,), batch_rows=batch_rows)
    groups = source.row_groups(0)
    assert groups == tuple(min(group_rows, ROWS - g) for g in range(0, ROWS, group_rows))
    whole = list(source.read_file(0))
    assert len(whole) == -(-ROWS // batch_rows)
    for parts in (1, 2, 3, 5):
        got: dict[int, pa.RecordBatch] = {}
        for part in range(parts):
            steps = [k for k, _ in source.read_part(0, part, parts)]
            assert steps == sorted(steps)  # each reader in order
            for k, batch in source.read_part(0, part, parts):
                assert k not in got
                got[k] = batch
        assert sorted(got) == list(range(len(whole)))
        for k, batch in got.items():
            assert batch.equals(whole[k]), (parts, k)


def test_part_ownership_follows_the_row_group_of_a_batchs_first_row(
    table: pa.Table, tmp_path: Path
) -> None:
    """Row groups of 1,000, batches of 700: batch k starts at row 700 k, in group 700 k //
    1000; with 2 parts, part 0 owns the batches starting in groups 0, 2, 4, …"""
    path = tmp_path / "one.parquet"
    pq.write_table(table, path, row_group_size=1_000)
    source = FileSource((path,), batch_rows=700)
    part0 = [k for k, _ in source.read_part(0, 0, 2)]
    assert part0 == [k for k in range(15) if (700 * k // 1_000) % 2 == 0]
    assert part0 == [0, 1, 3, 4, 6, 7, 9, 12]  # rows 0, 700, 2100, 2800, 4200, 4900, 6300, 8400


def test_only_parquet_is_read_in_parts(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text("i\n1\n2\n")
    source = FileSource((path,), batch_rows=1)
    assert source.row_groups(0) == ()
    assert [k for k, _ in source.read_part(0, 0, 1)] == [0, 1]
    with pytest.raises(ValueError, match=r"only a Parquet file is read in row groups"):
        list(source.read_part(0, 0, 2))
    with pytest.raises(ValueError, match=r"part 2 of 2"):
        list(source.read_part(0, 2, 2))
