"""StreamStore: offsets, durability across re-opens, torn-tail recovery, schema rule, waits."""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.errors import (
    DiskFullError,
    InvalidInputError,
    SchemaMismatchError,
    StorageError,
    StreamNameError,
    StreamNotFoundError,
)
from flight_serve.store import StreamStore
from flight_serve.store import log as stream_log
from flight_serve.store.streams import WriterInfo


def _batch(xs: list[int], names: list[str] | None = None) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "x": pa.array(xs, pa.int64()),
            "name": pa.array(names if names is not None else [f"n{x}" for x in xs], pa.string()),
        }
    )


# Private: the store's root is tmp_path itself (tests look in tmp_path / "streams") and fsync is the default.
@pytest.fixture
def store(tmp_path: Path) -> Iterator[StreamStore]:
    with StreamStore(tmp_path) as s:
        yield s


def _segments(tmp_path: Path, name: str) -> list[Path]:
    return sorted((tmp_path / "streams" / name).glob("*.seg"))


def test_append_returns_consecutive_offsets_and_read_returns_the_batches(
    store: StreamStore,
) -> None:
    assert store.append("t", _batch([1, 2])) == 0
    assert store.append("t", _batch([3])) == 1
    assert store.append("t", _batch([])) == 2  # an empty batch is a batch
    assert store.append("t", _batch([4, 5, 6])) == 3

    got = [(offset, batch.to_pydict()) for offset, batch in store.read("t")]
    assert got == [
        (0, {"x": [1, 2], "name": ["n1", "n2"]}),
        (1, {"x": [3], "name": ["n3"]}),
        (2, {"x": [], "name": []}),
        (3, {"x": [4, 5, 6], "name": ["n4", "n5", "n6"]}),
    ]
    assert [o for o, _ in store.read("t", start=1, stop=3)] == [1, 2]
    assert [o for o, _ in store.read("t", start=3, stop=99)] == [3]
    assert list(store.read("t", start=4)) == []
    assert [b.num_rows for b in store.batches("t", stop=2)] == [2, 1]


def test_info_counts_rows_and_bytes(store: StreamStore) -> None:
    before = datetime.now(UTC)
    store.append("t", _batch([1, 2]))
    store.append("t", _batch([3]))
    info = store.info("t")
    assert info.name == "t"
    assert info.schema == pa.schema([("x", pa.int64()), ("name", pa.string())])
    assert (info.first_offset, info.next_offset, info.num_rows) == (0, 2, 3)
    assert info.num_bytes == _batch([1, 2]).serialize().size + _batch([3]).serialize().size
    assert str(uuid.UUID(info.incarnation)) == info.incarnation
    assert before <= info.created_at <= datetime.now(UTC)
    assert [i.name for i in store.list_streams()] == ["t"]
    assert store.exists("t")
    assert not store.exists("u")


def test_read_is_zero_copy_from_the_mapped_segment(store: StreamStore, tmp_path: Path) -> None:
    store.append("t", _batch([1, 2, 3]))
    (_, batch), *_ = store.read("t")
    # The int64 values buffer lies inside the segment mapping, not in a fresh allocation: its
    # bytes sit at the frame's position in the file.
    raw = _segments(tmp_path, "t")[0].read_bytes()
    values = batch.column(0).buffers()[1]
    assert values is not None
    assert values.to_pybytes() in raw
    assert batch.column(0).to_pylist() == [1, 2, 3]


def test_streams_survive_a_reopen(tmp_path: Path) -> None:
    with StreamStore(tmp_path) as store:
        store.append("a", _batch([1]))
        store.append("a", _batch([2, 3]))
        store.append("b.c-d_e", pa.record_batch({"v": pa.array([1.5])}))
        before = store.info("a")
    with StreamStore(tmp_path) as store:
        after = store.info("a")
        assert after == before
        assert [b.to_pydict()["x"] for b in store.batches("a")] == [[1], [2, 3]]
        assert [i.name for i in store.list_streams()] == ["a", "b.c-d_e"]
        assert store.append("a", _batch([4])) == 2
    with StreamStore(tmp_path) as store:
        assert store.info("a").next_offset == 3
        assert store.info("a").num_rows == 4


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(b"FSF1" + struct.pack("<QQI", 4096, 1, 0) + b"\x00" * 100, id="half-a-frame"),
        pytest.param(
            b"FSF2" + struct.pack("<QQIIB3x", 4096, 1, 0, 0, 0) + b"\x00" * 100,
            id="half-a-frame-v2",
        ),
        pytest.param(b"FSF1\x00\x00", id="half-a-header"),
        pytest.param(b"FSF2" + b"\x00" * 24, id="half-a-header-v2"),
        pytest.param(b"garbage that is no frame at all....", id="garbage"),
    ],
)
def test_a_torn_tail_is_truncated_on_open(tmp_path: Path, tail: bytes) -> None:
    with StreamStore(tmp_path) as store:
        for i in range(3):
            store.append("t", _batch([i]))
    (segment,) = _segments(tmp_path, "t")
    good_size = segment.stat().st_size
    with segment.open("ab") as f:
        f.write(tail)

    with StreamStore(tmp_path) as store:
        assert store.info("t").next_offset == 3
        assert segment.stat().st_size == good_size
        assert [b.to_pydict()["x"] for b in store.batches("t")] == [[0], [1], [2]]
        assert store.append("t", _batch([3])) == 3
        assert [b.to_pydict()["x"] for b in store.batches("t")] == [[0], [1], [2], [3]]
    with StreamStore(tmp_path) as store:
        assert store.info("t").next_offset == 4


def test_a_last_frame_with_a_bad_checksum_is_dropped(tmp_path: Path) -> None:
    with StreamStore(tmp_path) as store:
        store.append("t", _batch([1]))
        store.append("t", _batch([2]))
    (segment,) = _segments(tmp_path, "t")
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the last frame's body
    segment.write_bytes(bytes(data))
    with StreamStore(tmp_path) as store:
        assert store.info("t").next_offset == 1
        assert [b.to_pydict()["x"] for b in store.batches("t")] == [[1]]


def test_segments_roll_and_read_across_them(tmp_path: Path) -> None:
    frame = 32 + _batch([0]).serialize().size
    with StreamStore(tmp_path, segment_bytes=frame * 2) as store:
        for i in range(5):
            assert store.append("t", _batch([i])) == i
        assert [p.name for p in _segments(tmp_path, "t")] == [
            "00000000000000000000.seg",
            "00000000000000000002.seg",
            "00000000000000000004.seg",
        ]
        assert [o for o, _ in store.read("t", start=1, stop=5)] == [1, 2, 3, 4]
    with StreamStore(tmp_path, segment_bytes=frame * 2) as store:
        assert [b.to_pydict()["x"] for b in store.batches("t")] == [[0], [1], [2], [3], [4]]
        assert store.append("t", _batch([5])) == 5


def test_a_corrupt_segment_in_the_middle_ends_the_log_there(tmp_path: Path) -> None:
    frame = 32 + _batch([0]).serialize().size
    with StreamStore(tmp_path, segment_bytes=frame * 2) as store:
        for i in range(5):
            store.append("t", _batch([i]))
    middle = _segments(tmp_path, "t")[1]
    middle.write_bytes(middle.read_bytes()[: frame + 32 + 10])  # offset 3 torn inside its body
    with StreamStore(tmp_path, segment_bytes=frame * 2) as store:
        assert store.info("t").next_offset == 3
        assert [b.to_pydict()["x"] for b in store.batches("t")] == [[0], [1], [2]]
        assert len(_segments(tmp_path, "t")) == 2
        assert store.append("t", _batch([3])) == 3


def test_schema_mismatch_names_each_field(store: StreamStore) -> None:
    store.append("t", _batch([1]))
    bad = pa.record_batch({"x": pa.array(["1"]), "extra": pa.array([True])})
    with pytest.raises(SchemaMismatchError) as info:
        store.append("t", bad)
    assert str(info.value) == (
        "batch schema does not match stream 't': missing field 'name' (string); "
        "unexpected field 'extra' (bool); retyped field 'x' (stream has int64, batch has string)"
    )
    assert store.info("t").next_offset == 1  # nothing was written


def test_fields_in_another_order_are_reordered(store: StreamStore) -> None:
    store.append("t", _batch([1]))
    swapped = pa.record_batch({"name": pa.array(["b"]), "x": pa.array([2], pa.int64())})
    assert store.append("t", swapped) == 1
    assert store.batches("t")[1].to_pydict() == {"x": [2], "name": ["b"]}


def test_nulls_in_a_non_nullable_field_are_a_mismatch(store: StreamStore) -> None:
    schema = pa.schema([pa.field("x", pa.int64(), nullable=False)])
    store.append("t", pa.record_batch([pa.array([1])], schema=schema))
    assert store.append("t", pa.record_batch({"x": pa.array([2], pa.int64())})) == 1
    with pytest.raises(SchemaMismatchError, match=r"'x' \(not nullable in the stream"):
        store.append("t", pa.record_batch({"x": pa.array([None], pa.int64())}))


def test_a_batch_of_the_streams_own_schema_skips_the_field_by_field_check(
    store: StreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pa.schema(
        [pa.field("x", pa.int64(), nullable=False), pa.field("name", pa.string())],
        metadata={b"k": b"v"},
    )
    store.append("t", pa.record_batch([pa.array([1]), pa.array(["a"])], schema=schema))
    from flight_serve.store import schema as schema_rule
    from flight_serve.store import streams

    checks: list[str] = []
    real = schema_rule.describe_mismatch

    def counted(*args: Any) -> str | None:
        checks.append(args[0])
        return real(*args)

    monkeypatch.setattr(schema_rule, "describe_mismatch", counted)
    monkeypatch.setattr(streams, "describe_mismatch", counted)
    same = pa.record_batch([pa.array([2]), pa.array([None], pa.string())], schema=schema)
    store.validate("t", same)
    assert store.append("t", same) == 1
    assert checks == []  # DoPut's batches: one schema comparison in C++, no Python loop
    # Anything else still takes the full rule: nulls where the stream forbids them, even under
    # the stream's own schema; other metadata (stored with the stream's); another field order.
    holey = pa.record_batch([pa.array([None], pa.int64()), pa.array(["b"])], schema=schema)
    with pytest.raises(SchemaMismatchError, match=r"'x' \(not nullable in the stream"):
        store.validate("t", holey)
    with pytest.raises(SchemaMismatchError, match=r"'x' \(not nullable in the stream"):
        store.append("t", holey)
    other = pa.record_batch([pa.array([3]), pa.array(["c"])], schema=schema.remove_metadata())
    assert store.append("t", other) == 2
    swapped = pa.record_batch({"name": pa.array(["d"]), "x": pa.array([4], pa.int64())})
    assert store.append("t", swapped) == 3
    assert len(checks) == 4  # holey twice, other, swapped
    batches = store.batches("t")
    assert all(b.schema.equals(schema, check_metadata=True) for b in batches)
    assert [b.to_pydict() for b in batches] == [
        {"x": [1], "name": ["a"]},
        {"x": [2], "name": [None]},
        {"x": [3], "name": ["c"]},
        {"x": [4], "name": ["d"]},
    ]


def test_dictionary_columns_are_decoded_on_append(store: StreamStore) -> None:
    batch = pa.record_batch({"k": pa.array(["a", "b", "a"]).dictionary_encode()})
    store.append("t", batch)
    assert store.info("t").schema == pa.schema([("k", pa.string())])
    assert store.append("t", pa.record_batch({"k": pa.array(["c"])})) == 1
    assert [b.to_pydict() for b in store.batches("t")] == [{"k": ["a", "b", "a"]}, {"k": ["c"]}]


def test_view_and_large_typed_batches_are_stored_in_the_streams_plain_types(
    store: StreamStore,
) -> None:
    plain = pa.schema(
        [("s", pa.string()), ("b", pa.binary()), ("l", pa.list_(pa.field("item", pa.string())))]
    )
    rows = {"s": ["x", None], "b": [b"\x00", None], "l": [["p", None], None]}
    views = pa.schema(
        [("s", pa.string_view()), ("b", pa.binary_view()), ("l", pa.list_view(pa.string_view()))]
    )
    large = pa.schema(
        [("s", pa.large_string()), ("b", pa.large_binary()), ("l", pa.large_list(pa.string()))]
    )
    store.append("t", pa.RecordBatch.from_pydict(rows, schema=views))  # creates the stream
    assert store.info("t").schema == plain
    store.append("t", pa.RecordBatch.from_pydict(rows, schema=large))
    store.create("t", views)  # a view schema matches the plain stream
    assert [b.schema for b in store.batches("t")] == [plain, plain]
    assert [b.to_pydict() for b in store.batches("t")] == [rows, rows]
    # a plain stream created with large types takes the plain and the view types too
    store.append("big", pa.RecordBatch.from_pydict(rows, schema=large))
    store.append("big", pa.RecordBatch.from_pydict(rows, schema=views))
    assert [b.schema for b in store.batches("big")] == [large, large]
    retyped = r"retyped field 's' \(stream has string, batch has binary\)"
    with pytest.raises(SchemaMismatchError, match=retyped):
        store.append("t", pa.record_batch({"s": [b"x"], "b": [b"y"], "l": [["z"]]}))


def test_a_stream_an_earlier_version_created_with_view_types_takes_plain_batches(
    tmp_path: Path,
) -> None:
    views = pa.schema([("s", pa.string_view()), ("b", pa.binary_view())])
    with StreamStore(tmp_path) as store:
        store.create("legacy", pa.schema([("s", pa.string()), ("b", pa.binary())]))
    # what flight-serve wrote before view types were stored as plain ones
    (tmp_path / "streams" / "legacy" / "schema.arrow").write_bytes(views.serialize().to_pybytes())
    with StreamStore(tmp_path) as store:
        assert store.info("legacy").schema == views
        store.append("legacy", pa.record_batch({"s": ["x", None], "b": [b"y", None]}))
        store.append("legacy", pa.RecordBatch.from_pydict({"s": ["z"], "b": [b"w"]}, schema=views))
        batches = store.batches("legacy")
        assert [b.schema for b in batches] == [views, views]
        assert [b.to_pydict() for b in batches] == [
            {"s": ["x", None], "b": [b"y", None]},
            {"s": ["z"], "b": [b"w"]},
        ]


def test_create_checks_the_schema(store: StreamStore) -> None:
    info = store.create("t", pa.schema([("x", pa.int64())]))
    assert (info.next_offset, info.num_rows) == (0, 0)
    assert store.batches("t") == []
    assert store.create("t", pa.schema([("x", pa.int64())])).incarnation == info.incarnation
    with pytest.raises(SchemaMismatchError, match=r"retyped field 'x' \(stream has int64"):
        store.create("t", pa.schema([("x", pa.int32())]))


def test_drop_removes_the_stream_and_a_new_one_is_a_new_incarnation(
    store: StreamStore, tmp_path: Path
) -> None:
    store.append("t", _batch([1]))
    old = store.info("t").incarnation
    held = store.batches("t")
    store.drop("t")
    assert not store.exists("t")
    assert not (tmp_path / "streams" / "t").exists()
    with pytest.raises(StreamNotFoundError, match="stream 't' does not exist"):
        store.info("t")
    with pytest.raises(StreamNotFoundError):
        store.drop("t")
    assert held[0].to_pydict() == {"x": [1], "name": ["n1"]}  # still mapped

    assert store.append("t", pa.record_batch({"y": [1.0]})) == 0
    assert store.info("t").incarnation != old
    with pytest.raises(StreamNotFoundError, match=f"incarnation {old} no longer exists"):
        store.read("t", incarnation=old)


def test_drop_if_empty_drops_only_an_empty_stream_of_that_incarnation(
    store: StreamStore, tmp_path: Path
) -> None:
    """What a refused first DoPut calls: the stream it created goes only while nothing is in
    it or reserved in it (a write staged and not yet durable counts) and it is still that
    incarnation; a write after the drop lands in a new incarnation, never lost."""
    schema = _batch([]).schema
    info, created = store.create_if_missing("t", schema)
    assert created
    assert store.create_if_missing("t", schema) == (info, False)
    assert not store.drop_if_empty("t", "another-incarnation")
    assert not store.drop_if_empty("nope", info.incarnation)
    pending = store.write("t", _batch([1]))  # staged, not durable yet: reserved
    assert not store.drop_if_empty("t", info.incarnation)
    assert store.commit(pending) == 0
    assert not store.drop_if_empty("t", info.incarnation)
    assert store.batches("t")[0].to_pydict() == {"x": [1], "name": ["n1"]}

    info, created = store.create_if_missing("u", schema)
    assert created
    assert store.drop_if_empty("u", info.incarnation)
    assert not store.exists("u")
    assert not (tmp_path / "streams" / "u").exists()
    assert store.append("u", _batch([2])) == 0
    assert store.info("u").incarnation != info.incarnation
    assert store.batches("u")[0].to_pydict() == {"x": [2], "name": ["n2"]}


def test_invalid_names_are_rejected(store: StreamStore) -> None:
    for name in ["", "a/b", "..", ".", "x" * 201, "é"]:
        with pytest.raises(StreamNameError):
            store.append(name, _batch([1]))
    assert store.append("x" * 200, _batch([1])) == 0


def test_wait_for_wakes_on_append_times_out_and_wakes_on_drop(store: StreamStore) -> None:
    store.append("t", _batch([0]))
    assert store.wait_for("t", 0, timeout_s=0.0) is True

    started = time.monotonic()
    assert store.wait_for("t", 1, timeout_s=0.05) is False
    assert time.monotonic() - started >= 0.05

    timer = threading.Timer(0.05, lambda: store.append("t", _batch([1])))
    timer.start()
    assert store.wait_for("t", 1, timeout_s=5.0) is True
    timer.join()

    dropper = threading.Timer(0.05, lambda: store.drop("t"))
    dropper.start()
    started = time.monotonic()
    assert store.wait_for("t", 2, timeout_s=5.0) is False
    assert time.monotonic() - started < 2.0
    dropper.join()


def test_concurrent_appends_get_distinct_contiguous_offsets(store: StreamStore) -> None:
    offsets: list[int] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(20):
            offset = store.append("t", _batch([k * 100 + i]))
            with lock:
                offsets.append(offset)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(offsets) == list(range(80))
    values = sorted(v for b in store.batches("t") for v in b.column(0).to_pylist())
    assert values == sorted(k * 100 + i for k in range(4) for i in range(20))


def test_a_data_dir_has_one_owner(tmp_path: Path) -> None:
    with StreamStore(tmp_path), pytest.raises(StorageError, match="in use"):
        StreamStore(tmp_path)
    StreamStore(tmp_path).close()  # released after close


def test_fsync_never_still_persists_on_close(tmp_path: Path) -> None:
    with StreamStore(tmp_path, fsync="never") as store:
        store.append("t", _batch([1]))
    with StreamStore(tmp_path) as store:
        assert store.batches("t")[0].to_pydict()["x"] == [1]


def test_frames_are_what_the_module_docstring_says(store: StreamStore, tmp_path: Path) -> None:
    batch = _batch([7, 8])
    store.append("t", batch)
    raw = _segments(tmp_path, "t")[0].read_bytes()
    body = batch.serialize().to_pybytes()
    assert raw == b"FSF2" + struct.pack("<QQIIB3x", len(body), 2, zlib.crc32(body), 0, 0) + body


def test_frame_crc_is_zlib_ngs_simd_crc32_with_zlibs_values() -> None:
    # The frame CRC is zlib's CRC-32 (old segments stay readable), computed by zlib-ng: the
    # stdlib's was ~0.1 s of CPU per 484 MB DoPut (benchmarks/README.md, doput).
    import zlib_ng.zlib_ng
    from flight_serve.store import frames

    assert frames.crc32 is zlib_ng.zlib_ng.crc32
    data = os.urandom(3 << 20) + b"tail"
    view = memoryview(data)
    assert frames.crc32(view) == zlib.crc32(data)
    assert frames.crc32(view[5:], frames.crc32(view[:5])) == zlib.crc32(data)
    assert frames.crc32(b"") == 0


# --- group commit, O_DIRECT frames, write and sync failures -----------------------------------


def _big_batch(start: int, rows: int = 200_000) -> pa.RecordBatch:
    """About 2.4 MB of Arrow: above the O_DIRECT threshold (1 MiB)."""
    xs = list(range(start, start + rows))
    return pa.record_batch(
        {"x": pa.array(xs, pa.int64()), "name": pa.array([f"n{x % 1000}" for x in xs])}
    )


def test_a_written_batch_is_invisible_until_committed_and_one_sync_covers_many(
    store: StreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs: list[int] = []
    real_sync = stream_log._sync

    def counted(fd: int) -> None:
        syncs.append(fd)
        real_sync(fd)

    monkeypatch.setattr(stream_log, "_sync", counted)
    store.append("t", _batch([0]))
    syncs.clear()

    pending = [store.write("t", _batch([i])) for i in (1, 2)]
    pending.append(store.write("t", _big_batch(3)))
    assert [p.offset for p in pending] == [1, 2, 3]
    assert store.info("t").next_offset == 1  # staged, not durable: not visible
    assert [o for o, _ in store.read("t")] == [0]
    assert store.wait_for("t", 1, timeout_s=0.0) is False
    assert syncs == []

    assert store.commit(pending[2]) == 3  # the last one: a single fdatasync covers all three
    assert len(syncs) == 1
    assert [store.commit(p) for p in pending[:2]] == [1, 2]  # already durable: no sync
    assert len(syncs) == 1
    info = store.info("t")
    assert (info.next_offset, info.num_rows) == (4, 3 + 200_000)
    assert [b.num_rows for b in store.batches("t")] == [1, 1, 1, 200_000]


def test_frames_reach_the_file_while_a_sync_waits_and_a_sync_publishes_what_it_covered(
    store: StreamStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # commit(p0):  write f0 | fdatasync ...(blocked)..................| publish [0, 1)
    # other thread:              write f1, flush(f1): in the file now |        commit(p1)
    # Before: the sync held the lock that writing takes, so f1 waited for the device too.
    store.append("t", _big_batch(0))
    in_sync, release = threading.Event(), threading.Event()
    real_sync = stream_log._sync

    def blocked(fd: int) -> None:
        in_sync.set()
        assert release.wait(10)
        real_sync(fd)

    monkeypatch.setattr(stream_log, "_sync", blocked)
    p0 = store.write("t", _big_batch(1))
    committed: list[int] = []
    committer = threading.Thread(target=lambda: committed.append(store.commit(p0)))
    committer.start()
    assert in_sync.wait(10)
    (segment,) = _segments(tmp_path, "t")
    size = segment.stat().st_size
    p1 = store.write("t", _big_batch(2))
    flusher = threading.Thread(target=store.flush, args=(p1,))
    flusher.start()
    flusher.join(5)
    assert not flusher.is_alive()  # written while the sync still waits
    assert segment.stat().st_size > size
    assert store.info("t").next_offset == 1
    release.set()
    committer.join(10)
    assert committed == [1]
    assert store.info("t").next_offset == 2  # f1 was not in the file when that sync began
    monkeypatch.setattr(stream_log, "_sync", real_sync)
    assert store.commit(p1) == 2
    assert [b.num_rows for b in store.batches("t")] == [200_000] * 3
    assert store.batches("t")[2].equals(_big_batch(2))


def test_fsync_never_makes_a_write_visible_at_once(tmp_path: Path) -> None:
    with StreamStore(tmp_path, fsync="never") as store:
        pending = store.write("t", _big_batch(0))
        assert store.info("t").next_offset == 1
        assert store.commit(pending) == 0


def test_large_frames_are_page_aligned_and_survive_a_reopen(tmp_path: Path) -> None:
    expected = [_batch([1]), _big_batch(0), _big_batch(7), _batch([2, 3]), _big_batch(9)]
    with StreamStore(tmp_path) as store:
        for i, batch in enumerate(expected):
            assert store.append("t", batch) == i
        assert store.direct_io  # this file system takes O_DIRECT
        assert all(b.equals(e) for b, e in zip(store.batches("t"), expected, strict=True))
        info = store.info("t")
    (segment,) = _segments(tmp_path, "t")
    raw = segment.read_bytes()
    position, ends = 0, []
    while position < len(raw):  # walk the frames as recovery does
        magic, body_len, _, crc = struct.unpack_from("<4sQQI", raw, position)
        assert magic == b"FSF2"
        body = raw[position + 32 : position + 32 + body_len]
        assert zlib.crc32(body) == crc  # the CRC covers the zero padding too
        position += 32 + body_len
        ends.append(position)
    # A large frame ends on a 4 KiB boundary (its body is the IPC message plus zero padding).
    assert [end % 4096 == 0 for end in ends] == [False, True, True, False, True]
    with StreamStore(tmp_path) as store:
        assert store.info("t") == info
        assert all(b.equals(e) for b, e in zip(store.batches("t"), expected, strict=True))


def test_a_torn_large_frame_is_truncated_on_open(tmp_path: Path) -> None:
    with StreamStore(tmp_path) as store:
        store.append("t", _batch([1]))
        store.append("t", _big_batch(0))
    (segment,) = _segments(tmp_path, "t")
    size = segment.stat().st_size
    with segment.open("r+b") as f:  # the last 4 KiB page never reached the disk: zeros
        f.seek(size - 4096)
        f.write(bytes(4096))
    with StreamStore(tmp_path) as store:
        assert store.info("t").next_offset == 1
        assert store.append("t", _big_batch(5)) == 1
        assert store.batches("t")[1].equals(_big_batch(5))


def test_without_o_direct_large_frames_go_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_direct(path: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    with StreamStore(tmp_path) as store:
        store.append("t", _batch([1]))
        assert store.append("t", _big_batch(0)) == 1
        assert not store.direct_io
        assert store.append("t", _big_batch(3)) == 2
    with StreamStore(tmp_path) as store:
        assert [b.num_rows for b in store.batches("t")] == [1, 200_000, 200_000]


def test_a_failed_write_discards_what_was_not_durable_and_the_stream_goes_on(
    store: StreamStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.append("t", _batch([0]))
    good_size = _segments(tmp_path, "t")[0].stat().st_size
    real_pwrite = os.pwrite
    calls = 0

    def full_disk(fd: int, data: Any, position: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:  # the second frame (its header)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", full_disk)
    first, second = store.write("t", _batch([1])), store.write("t", _batch([2]))
    with pytest.raises(DiskFullError, match="No space left"):
        store.commit(first)
    with pytest.raises(StorageError, match="batch 2 of stream 't' was discarded"):
        store.commit(second)
    assert store.info("t").next_offset == 1
    assert _segments(tmp_path, "t")[0].stat().st_size == good_size  # cut back
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert store.append("t", _batch([3])) == 1  # the offset is reused: it was never durable
    assert [b.to_pydict()["x"] for b in store.batches("t")] == [[0], [3]]


def test_a_writer_stages_nothing_after_its_batch_a_failed_write_discarded(
    store: StreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``write(after=)``: a caller's frames land as a prefix of what it wrote. Writer w1 has
    batch [0] durable; another writer's failed write discards w1's staged [1]; w1's next batch
    (after [1]) is refused, not staged at offset 1 with a gap before it, while a batch after
    the durable [0] (which no discard touched) is still taken.

    offsets:  0 [0] w1 durable │ 1 [1] w1 staged ─ w2's write fails: 1.. discarded, epoch 1
              w1 write [2] after [1] → refused │ w1 write [3] after [0] → offset 1
    """
    durable = store.write("t", _batch([0]), writer="w1")
    store.commit(durable)
    staged = store.write("t", _batch([1]), writer="w1", after=durable)
    real_pwrite = os.pwrite
    calls = 0

    def full_disk(fd: int, data: Any, position: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:  # the second frame of the drain (w2's)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, position)

    other = store.write("t", _batch([9]), writer="w2")
    monkeypatch.setattr(os, "pwrite", full_disk)
    with pytest.raises(DiskFullError, match="No space left"):
        store.commit(other)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    with pytest.raises(StorageError, match="the batch at offset 1 before this one was discarded"):
        store.write("t", _batch([2]), writer="w1", after=staged)
    with pytest.raises(StorageError, match="batch 1 of stream 't' was discarded"):
        store.commit(staged)
    assert store.commit(store.write("t", _batch([3]), writer="w1", after=durable)) == 1
    assert [b.to_pydict()["x"] for b in store.batches("t")] == [[0], [3]]


def test_a_failed_sync_makes_the_stream_refuse_writes_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StreamStore(tmp_path) as store:
        store.append("t", _batch([0]))
        real_sync = stream_log._sync

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(stream_log, "_sync", broken)
        with pytest.raises(StorageError, match="refuses writes after a failed fdatasync"):
            store.append("t", _batch([1]))
        monkeypatch.setattr(stream_log, "_sync", real_sync)
        with pytest.raises(StorageError, match="refuses writes"):
            store.append("t", _batch([2]))
        assert store.info("t").next_offset == 1  # never acknowledged, never visible
        assert store.append("u", _batch([1])) == 0  # other streams are fine
    with StreamStore(tmp_path) as store:  # the frame may or may not have survived: it is whole
        assert store.info("t").next_offset in (1, 2)
        assert store.append("t", _batch([3])) == store.info("t").next_offset - 1


def test_drop_and_close_make_staged_batches_durable_first(tmp_path: Path) -> None:
    with StreamStore(tmp_path) as store:
        pending = store.write("t", _batch([1]))
        store.drop("t")
        assert store.commit(pending) == 0  # durable before the drop, then dropped
        pending = store.write("u", _big_batch(0))
    with pytest.raises(StorageError):  # the store is closed
        store.info("u")
    assert store.commit(pending) == 0
    with StreamStore(tmp_path) as store:
        assert store.batches("u")[0].equals(_big_batch(0))


def test_segments_roll_with_staged_frames_across_the_boundary(tmp_path: Path) -> None:
    with StreamStore(tmp_path, segment_bytes=3_000_000) as store:
        pending = [store.write("t", _big_batch(i * 10)) for i in range(5)]
        assert store.commit(pending[-1]) == 4
        assert len(_segments(tmp_path, "t")) == 5
        assert all(b.equals(_big_batch(i * 10)) for i, b in enumerate(store.batches("t")))
    with StreamStore(tmp_path, segment_bytes=3_000_000) as store:
        assert store.info("t").next_offset == 5


def test_writers_and_markers_are_entries(tmp_path: Path) -> None:
    """Every entry has its writer; markers have offsets but no rows; all of it survives a
    re-open (writers.jsonl and the frames)."""
    with StreamStore(tmp_path) as store:
        assert store.append("t", _batch([1]), writer="a") == 0
        assert store.append("t", _batch([2])) == 1
        assert store.append_marker("t", "a", watermark_ns=-5) == 2
        assert store.append("t", _batch([3, 4]), writer="b") == 3
        assert store.append_marker("t", "a", end_of_input=True) == 4
        with pytest.raises(InvalidInputError, match="exactly one"):
            store.write_marker("t", "a")
        with pytest.raises(InvalidInputError, match="invalid writer name"):
            store.append("t", _batch([5]), writer="no spaces")
        with pytest.raises(StreamNotFoundError):
            store.append_marker("missing", "a", end_of_input=True)
    with StreamStore(tmp_path) as store:
        info = store.info("t")
        assert (info.next_offset, info.num_rows) == (5, 4)
        assert [(o, b.to_pydict()["x"]) for o, b in store.read("t")] == [
            (0, [1]),
            (1, [2]),
            (3, [3, 4]),
        ]
        entries = [
            (
                e.offset,
                e.writer,
                None if e.batch is None else e.batch.num_rows,
                e.watermark_ns,
                e.end_of_input,
            )
            for e in store.entries("t", 1)
        ]
        assert entries == [
            (1, "", 1, None, False),
            (2, "a", None, -5, False),
            (3, "b", 2, None, False),
            (4, "a", None, None, True),
        ]
        assert store.writers("t") == {
            "a": WriterInfo("a", 0, 4, -5, 4),
            "": WriterInfo("", 1, 1, None, None),
            "b": WriterInfo("b", 3, 3, None, None),
        }
        assert store.append("t", _batch([6]), writer="b") == 5
        assert store.writers("t")["b"].last_offset == 5


def test_a_repeated_end_of_input_is_stored_once(tmp_path: Path) -> None:
    """A writer's second end of input (a client that lost the first one's PutResult and sent it
    again) stores nothing and names the first marker's offset, also after a re-open; another
    writer's end of input and other entries are unaffected.

    offsets:  0 a:[1]   1 a:END   2 b:[2]   (a:END again -> 1, nothing written)   3 b:END
    """
    with StreamStore(tmp_path) as store:
        assert store.append("t", _batch([1]), writer="a") == 0
        assert store.append_marker("t", "a", end_of_input=True) == 1
        assert store.append("t", _batch([2]), writer="b") == 2
        assert store.append_marker("t", "a", end_of_input=True) == 1
        assert store.info("t").next_offset == 3
        assert store.append_marker("t", "b", end_of_input=True) == 3
    with StreamStore(tmp_path) as store:
        assert store.append_marker("t", "a", end_of_input=True) == 1
        assert store.append_marker("t", "b", end_of_input=True) == 3
        assert store.info("t").next_offset == 4
        assert [(e.offset, e.writer, e.end_of_input) for e in store.entries("t", 0)] == [
            (0, "a", False),
            (1, "a", True),
            (2, "b", False),
            (3, "b", True),
        ]


def test_format_1_frames_are_read_as_batches_of_writer_nobody(tmp_path: Path) -> None:
    with StreamStore(tmp_path) as store:
        store.append("t", _batch([0]))
    (segment,) = _segments(tmp_path, "t")
    body = _batch([1]).serialize().to_pybytes()
    old = b"FSF1" + struct.pack("<QQI", len(body), 1, zlib.crc32(body)) + body
    segment.write_bytes(old + old)
    with StreamStore(tmp_path) as store:
        assert [(e.offset, e.writer) for e in store.entries("t")] == [(0, ""), (1, "")]
        assert store.append("t", _batch([2]), writer="w") == 2
    with StreamStore(tmp_path) as store:
        assert [b.to_pydict()["x"] for b in store.batches("t")] == [[1], [1], [2]]
        assert [e.writer for e in store.entries("t")] == ["", "", "w"]
