"""Exactly-once into server streams and resuming from stream offsets, against a real
:class:`~flight_serve.store.StreamStore`: a stream sink's commit redone after a crash at each step
writes every batch once; a stream source's offset that retention removed fails fast, or resumes
with the gap reported under ``offset_reset = 'earliest'``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from flight_serve.errors import CheckpointError
from flight_serve.pipelines.durable import DurableRuntime, PipelineStopped
from flight_serve.pipelines.epoch_sinks import EpochStreamSink
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.store_io import StoreSource, StoreTarget
from flight_serve.store import StreamStore

SCHEMA = pa.schema([("x", pa.int64())])


def b(*values: int) -> pa.RecordBatch:
    return pa.record_batch({"x": list(values)}, schema=SCHEMA)


def stored(store: StreamStore, name: str = "out") -> list[int]:
    return [x for _, batch in store.read(name) for x in batch.column("x").to_pylist()]


def epoch(sink: EpochStreamSink, number: int, *batches: pa.RecordBatch) -> dict[str, object]:
    for batch in batches:
        sink.write(batch)
    files: dict[str, bytes] = {}
    entry = sink.prepare(number, files)
    entry["_staged"] = files  # what the checkpoint holds
    return entry


def resume(store: StreamStore, entry: dict[str, object]) -> EpochStreamSink:
    """A new sink from the checkpoint ``entry``, which redoes the checkpoint's commit."""
    from flight_serve._arrow import read_ipc

    sink = EpochStreamSink(
        "out",
        StoreTarget(store, "out", SCHEMA, "p"),
        SCHEMA,
        mark=int(entry["mark"]),  # type: ignore[call-overload]
        incarnation=entry["incarnation"],  # type: ignore[arg-type]
        rows=int(entry["rows"]),  # type: ignore[call-overload]
    )
    files = entry["_staged"]
    assert isinstance(files, dict)
    sink.recover(read_ipc(files[sink.file]) if sink.file in files else [])
    return sink


def test_a_commit_cut_short_at_any_batch_is_finished_once(tmp_path: Path) -> None:
    for done in range(4):  # the crash came after `done` of epoch 2's 3 batches were appended
        with StreamStore(tmp_path / f"data{done}", fsync="never") as store:
            sink = EpochStreamSink("out", StoreTarget(store, "out", SCHEMA, "p"), SCHEMA)
            assert epoch(sink, 1, b(1), b(2))["mark"] == 0
            sink.commit(1)
            second = epoch(sink, 2, b(3), b(4, 5), b(6))
            assert second["mark"] == 2  # the stream offset after epoch 1's batches
            for staged in sink._staged[:done]:
                store.append("out", staged, writer="p")  # the commit, cut short by the crash
            resumed = resume(store, second)
            assert resumed.skipped == done
            assert stored(store) == [1, 2, 3, 4, 5, 6], f"cut after {done}"
            epoch(resumed, 3, b(7))
            resumed.commit(3)
            assert stored(store) == [1, 2, 3, 4, 5, 6, 7]


def test_a_replay_from_an_older_checkpoint_skips_what_is_there(store: StreamStore) -> None:
    sink = EpochStreamSink("out", StoreTarget(store, "out", SCHEMA, "p"), SCHEMA)
    checkpoints = []
    for number, values in enumerate(([1, 2], [3], [4, 5]), start=1):
        checkpoints.append(epoch(sink, number, *(b(v) for v in values)))
        sink.commit(number)
    assert stored(store) == [1, 2, 3, 4, 5]
    resumed = resume(store, checkpoints[0])  # --from-epoch 1: epochs 2 and 3 replay
    assert resumed.skipped == 2  # epoch 1's own batches were there
    for number, values in ((2, [3]), (3, [4, 5])):
        epoch(resumed, number, *(b(v) for v in values))
        resumed.commit(number)
    resumed.write(b(6))
    resumed.prepare(4, {})
    resumed.commit(4)
    assert stored(store) == [1, 2, 3, 4, 5, 6]
    assert resumed.skipped == 5


def test_another_writers_batches_are_passed_over(store: StreamStore) -> None:
    """The sink appends as its own writer; the replay matching looks at that writer only, so
    another writer's batch is never taken for ours, even an identical one."""
    sink = EpochStreamSink("out", StoreTarget(store, "out", SCHEMA, "p"), SCHEMA)
    entry = epoch(sink, 1, b(1), b(2))
    store.append("out", b(1), writer="p")  # ours (the commit was cut after it)
    store.append("out", b(2), writer="someone")  # identical to our next one, not ours
    store.append("out", b(99))  # an unnamed writer's
    resume(store, entry)
    assert stored(store) == [1, 2, 99, 2]
    assert [e.writer for e in store.entries("out")] == ["p", "someone", "", "p"]


def test_the_end_of_input_is_marked_once(store: StreamStore) -> None:
    target = StoreTarget(store, "out", SCHEMA, "p")
    target.append(b(1))
    target.end_input()
    target.end_input()  # a restart that completes a finished run marks nothing twice
    assert [(e.writer, e.end_of_input) for e in store.entries("out")] == [
        ("p", False),
        ("p", True),
    ]


def test_a_dropped_output_stream_is_a_checkpoint_error(store: StreamStore) -> None:
    sink = EpochStreamSink("out", StoreTarget(store, "out", SCHEMA, "p"), SCHEMA)
    entry = epoch(sink, 1, b(1))
    sink.commit(1)
    store.drop("out")
    with pytest.raises(CheckpointError, match=r"stream 'out' was dropped or re-created .*--fresh"):
        resume(store, entry)


# --- stream sources: offsets and retention --------------------------------------------------

PIPELINE = """
CREATE SOURCE events (x BIGINT) WITH (connector = 'flight', stream = 'events');
CREATE SINK doubled WITH (connector = 'flight', stream = 'doubled');
INSERT INTO doubled SELECT x * 2 AS y FROM events;
"""


def run_until(runtime: DurableRuntime, entries: int) -> None:
    """Run ``runtime`` until its source read ``entries`` entries, then stop it (checkpoint)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            for _ in runtime.run():
                pass
        except PipelineStopped:
            pass
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    source = runtime.flight_sources["events"]
    assert isinstance(source, StoreSource)
    while source.position < entries and not failure and thread.is_alive():
        thread.join(0.01)
    runtime.request_stop()
    thread.join(20)
    assert not failure, failure


def durable(tmp_path: Path, store: StreamStore, **options: object) -> DurableRuntime:
    return DurableRuntime(
        parse_pipeline(PIPELINE),
        name="p",
        options=RunOptions(checkpoint_interval=timedelta(hours=1), **options),  # type: ignore[arg-type]
        state_root=str(tmp_path / "state"),
        store=store,
    )


def test_a_stream_source_resumes_at_its_offset(tmp_path: Path, store: StreamStore) -> None:
    for x in range(5):
        store.append("events", pa.record_batch({"x": [x]}))
    run_until(durable(tmp_path, store), 5)
    for x in range(5, 8):
        store.append("events", pa.record_batch({"x": [x]}))
    resumed = durable(tmp_path, store)
    assert resumed.resumed_from == 1
    assert resumed.flight_sources["events"].start_offset == 5
    run_until(resumed, 8)
    assert [y for _, batch in store.read("doubled") for y in batch.column("y").to_pylist()] == [
        0,
        2,
        4,
        6,
        8,
        10,
        12,
        14,
    ]


def test_an_offset_removed_by_retention_fails_fast_or_resets_with_the_gap(tmp_path: Path) -> None:
    data = tmp_path / "data"
    big = pa.record_batch({"x": list(range(1000))})
    with StreamStore(data, fsync="never", segment_bytes=4096) as store:
        for _ in range(2):
            store.append("events", big)
        run_until(durable(tmp_path, store), 2)  # checkpoint: offset 2
        for _ in range(4):
            store.append("events", big)
        segments = sorted((data / "streams" / "events").glob("*.seg"))
    assert len(segments) >= 4
    # Retention (enforced when the store opens) removes the oldest segments (offsets 0 .. 2).
    keep = sum(p.stat().st_size for p in segments[3:])
    with StreamStore(data, fsync="never", segment_bytes=4096, retention_bytes=keep) as store:
        assert [p.exists() for p in segments[:4]] == [False, False, False, True]
        first = store.info("events").first_offset
        assert first == 3
        with pytest.raises(CheckpointError, match=r"offset 2 is gone .* 1 entries were never read"):
            durable(tmp_path, store)
        resumed = durable(tmp_path, store, offset_reset="earliest")
        assert resumed.flight_sources["events"].start_offset == 3
        assert resumed.gaps == [
            "source events (stream 'events'): the checkpoint's offset 2 is gone (retention kept "
            "offsets 3 and up): 1 entries were never read (1000 rows); resuming at 3 "
            "(offset_reset = 'earliest')"
        ]
        assert resumed.metrics()["data_loss_rows"] == 1000  # offset 2: one batch of 1000 rows
        run_until(resumed, 6)
        latest = resumed.checkpoints.latest()
        assert latest is not None
        assert latest.sources["events"]["gap_entries"] == 1
        assert latest.metrics["gaps"] == resumed.gaps
        assert latest.metrics["data_loss_rows"] == 1000
