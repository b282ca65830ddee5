"""FileSource.poll reads the next batch ahead on a reader thread (connectors/file.py): the events,
the cursor, errors and restores are what they are without it."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from flight_serve.connectors.file import FileSource
from flight_serve.errors import ConnectorError

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def source(paths: list[Path]) -> FileSource:
    files = FileSource(tuple(paths), "csv", batch_rows=2, schema=SCHEMA, name="s")
    files.measure()
    return files


def events(files: FileSource) -> list[tuple[str, str, list[int] | None]]:
    out: list[tuple[str, str, list[int] | None]] = []
    while not files.done:
        for e in files.poll():
            values = e.batch.column("v").to_pylist() if e.batch is not None else None
            out.append((e.kind, Path(e.partition).name, values))
    return out


def readers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("file-source-s")]


def test_two_files_round_robin_the_same_events_and_cursor(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("k,v\na,1\na,2\na,3\n")
    (tmp_path / "b.csv").write_text("k,v\nb,10\nb,20\nb,30\nb,40\nb,50\n")
    files = source([tmp_path / "a.csv", tmp_path / "b.csv"])
    first = files.poll()[0]
    assert first.batch is not None
    assert first.batch.column("v").to_pylist() == [1, 2]
    # b's first batch is read ahead, not counted: the cursor says one batch of a, none of b
    assert [(f["batches"], f["ended"]) for f in files.snapshot()["files"]] == [(1, False), (0, False)]
    assert readers() == ["file-source-s_0"]
    assert events(files) == [
        ("batch", "b.csv", [10, 20]),
        ("batch", "a.csv", [3]),
        ("batch", "b.csv", [30, 40]),
        ("end", "a.csv", None),
        ("batch", "b.csv", [50]),
        ("end", "b.csv", None),
    ]
    assert files.snapshot()["rows"] == 8
    files.close()
    assert readers() == []


def test_a_bad_value_fails_the_poll_that_asks_for_its_batch_not_an_earlier_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.csv").write_text("k,v\na,1\na,2\na,3\n")
    (tmp_path / "b.csv").write_text("k,v\nb,x\n")
    files = source([tmp_path / "a.csv", tmp_path / "b.csv"])
    got = files.poll()[0]  # b's batch (with 'x') is being read ahead now
    assert got.batch is not None
    assert got.batch.column("v").to_pylist() == [1, 2]
    assert [f["batches"] for f in files.snapshot()["files"]] == [1, 0]
    with pytest.raises(ConnectorError, match=r"b\.csv: line 2, column v \(int64\): cannot convert 'x'"):
        files.poll()
    files.close()


def test_a_restored_cursor_skips_the_batches_read_and_reads_ahead_from_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.csv").write_text("k,v\n" + "".join(f"a,{i}\n" for i in range(7)))
    straight = source([tmp_path / "a.csv"])
    straight.poll()
    straight.poll()
    state = straight.snapshot()  # 2 batches read (a third fetched ahead: not in the state)
    straight.close()
    resumed = source([tmp_path / "a.csv"])
    resumed.restore(state, 1)
    assert events(resumed) == [("batch", "a.csv", [4, 5]), ("batch", "a.csv", [6]),
                               ("end", "a.csv", None)]  # fmt: skip
    resumed.close()
    resumed.close()  # idempotent
