"""Stream retention by size and age (DESIGN §3): whole closed segments go, oldest first."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from flight_serve.cli import _age, _byte_size
from flight_serve.store import StreamStore

#: 1000 int64 rows: one frame is larger than the 4096-byte segments below, so every batch
#: gets a segment of its own (offset n lives in segment file n).
ROWS = 1000
SEGMENT_BYTES = 4096


def _batch(start: int) -> pa.RecordBatch:
    return pa.record_batch({"x": list(range(start, start + ROWS))})


def _segments(data: Path, name: str = "events") -> list[Path]:
    return sorted((data / "streams" / name).glob("*.seg"))


def _fill(store: StreamStore, count: int, name: str = "events") -> None:
    for i in range(count):
        assert store.append(name, _batch(i * ROWS)) == i


def _size(path: Path) -> int:
    return path.stat().st_size


def test_size_limit_removes_the_oldest_closed_segments_after_a_commit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as plain:
        _fill(plain, 1)
        frame = _size(_segments(data)[0])  # one frame: header + IPC message
    # three segments' worth: after every commit at most three segments remain
    limit = 3 * frame
    other = tmp_path / "other"
    with StreamStore(other, segment_bytes=SEGMENT_BYTES, retention_bytes=limit) as store:
        _fill(store, 6)
        info = store.info("events")
        assert info.first_offset == 3
        assert info.next_offset == 6
        assert info.num_rows == 3 * ROWS
        assert [int(p.stem) for p in _segments(other)] == [3, 4, 5]
        offsets = [o for o, _ in store.read("events")]
        assert offsets == [3, 4, 5]
        # a read from a removed offset starts at first_offset
        rows = [x for _, b in store.read("events", 0) for x in b.column("x").to_pylist()]
        assert rows == list(range(3 * ROWS, 6 * ROWS))
        assert [o for o, _ in store.read("events", 1, 5)] == [3, 4]
        assert [e.offset for e in store.entries("events", 2)] == [3, 4, 5]
        assert store.writers("events")[""].first_offset == 3


def test_the_active_segment_is_never_removed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with StreamStore(data, segment_bytes=SEGMENT_BYTES, retention_bytes=0) as store:
        _fill(store, 4)
        info = store.info("events")
        assert (info.first_offset, info.next_offset, info.num_rows) == (3, 4, ROWS)
        assert [int(p.stem) for p in _segments(data)] == [3]
        assert store.enforce_retention() == {}
        store.append("events", _batch(0))
        assert store.info("events").first_offset == 4


def test_age_limit_with_an_injected_clock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    age = timedelta(days=7)
    with StreamStore(data, segment_bytes=SEGMENT_BYTES, retention_age=age) as store:
        _fill(store, 5)
        assert store.info("events").first_offset == 0  # all written just now
        paths = _segments(data)
        base = datetime(2026, 1, 1, tzinfo=UTC)
        for i, path in enumerate(paths):  # segment i's newest entry written on Jan 1 + i days
            at = (base + timedelta(days=i)).timestamp()
            os.utime(path, (at, at))
        # Jan 9, 23:00: segments 0 (Jan 1) and 1 (Jan 2) are older than 7 days, 2 (Jan 3) is not
        assert store.enforce_retention(now=base + timedelta(days=8, hours=23)) == {"events": 2}
        info = store.info("events")
        assert (info.first_offset, info.next_offset, info.num_rows) == (2, 5, 3 * ROWS)
        assert store.enforce_retention(now=base + timedelta(days=8, hours=23, minutes=59)) == {}
        # far in the future: every closed segment goes, the active one (offset 4) stays
        assert store.enforce_retention(now=base + timedelta(days=400)) == {"events": 2}
        info = store.info("events")
        assert (info.first_offset, info.next_offset, info.num_rows) == (4, 5, ROWS)
        assert [o for o, _ in store.read("events")] == [4]


def test_retention_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:
        _fill(store, 6)
        frame = _size(_segments(data)[0])
    # the limit is applied when the store opens
    with StreamStore(data, segment_bytes=SEGMENT_BYTES, retention_bytes=2 * frame) as store:
        info = store.info("events")
        assert (info.first_offset, info.next_offset, info.num_rows) == (4, 6, 2 * ROWS)
    # re-opened without limits: the removed offsets stay gone, appends go on from 6
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:
        info = store.info("events")
        assert (info.first_offset, info.next_offset, info.num_rows) == (4, 6, 2 * ROWS)
        assert store.append("events", _batch(6 * ROWS)) == 6
        rows = [x for _, b in store.read("events") for x in b.column("x").to_pylist()]
        assert rows == list(range(4 * ROWS, 7 * ROWS))
        assert [o for o, _ in store.read("events")] == [4, 5, 6]


def test_limits_are_per_stream_and_no_limit_keeps_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:
        _fill(store, 4, "a")
        assert store.enforce_retention(now=datetime(2100, 1, 1, tzinfo=UTC)) == {}
        assert store.info("a").first_offset == 0
    with StreamStore(data, segment_bytes=SEGMENT_BYTES, retention_bytes=10**9) as store:
        _fill(store, 2, "b")
        assert store.info("a").first_offset == 0
        assert store.info("b").first_offset == 0


def test_invalid_limits_and_cli_parsing() -> None:
    with pytest.raises(ValueError, match="retention_bytes"):
        StreamStore(Path("/nonexistent"), retention_bytes=-1)
    with pytest.raises(ValueError, match="retention_age"):
        StreamStore(Path("/nonexistent"), retention_age=timedelta(seconds=-1))
    assert _age("7d") == timedelta(days=7)
    assert _age("90s") == timedelta(seconds=90)
    assert _age("12h") == timedelta(hours=12)
    assert _byte_size("10GiB") == 10 * 1024**3
    assert _byte_size("500000000") == 500_000_000


def test_rows_before_counts_the_rows_retention_removed_across_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:
        _fill(store, 4)
        store.append("events", pa.record_batch({"x": [1, 2, 3]}))  # offset 4: 3 rows
        assert [store.rows_before("events", o) for o in range(6)] == [
            0, 1000, 2000, 3000, 4000, 4003
        ]  # fmt: skip
        keep = sum(_size(p) for p in _segments(data)[2:])
    with StreamStore(data, segment_bytes=SEGMENT_BYTES, retention_bytes=keep) as store:
        assert store.info("events").first_offset == 2
        # offsets 0 and 1 (2000 rows) are gone, still counted
        assert [store.rows_before("events", o) for o in (0, 2, 3, 5)] == [2000, 2000, 3000, 4003]
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:  # the count survives
        assert store.rows_before("events", 5) == 4003


def test_a_retention_removal_cut_short_by_a_crash_is_finished_on_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:
        _fill(store, 3)
    # the record is written before the files go: a crash between leaves segment 0 behind
    (data / "streams" / "events" / "retention.json").write_text(
        '{"first_offset": 1, "rows_removed": 1000}'
    )
    with StreamStore(data, segment_bytes=SEGMENT_BYTES) as store:
        assert store.info("events").first_offset == 1
        assert [int(p.stem) for p in _segments(data)] == [1, 2]
        assert store.rows_before("events", 3) == 3000
