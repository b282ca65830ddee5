"""The Iceberg connector (sink, source and tables) against a real pyiceberg SqlCatalog on SQLite in a
temporary directory: the exactly-once sink (racing writers, an unknown commit outcome, replays,
snapshot expiry, upserts, types and partitions), the incremental source (non-append snapshots,
start strategies, rate limits, expired offsets), a pipeline killed and resumed, and Iceberg
tables queried over DoGet and Flight SQL next to streams.

Fault injection wraps the real catalog (its ``commit_table``), never a fake one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pytest
from flight_serve.connectors.iceberg import (
    MARKER_EPOCH,
    MARKER_WRITER,
    IcebergSink,
    IcebergSource,
    NonAppendSnapshotError,
    SnapshotExpiredError,
    SnapshotNotInHistoryError,
)
from flight_serve.pipelines.durable import DurableRuntime
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.run_options import RunOptions
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

CLI = Path(sys.executable).parent / "flight-serve"
UTC_US = pa.timestamp("us", tz="UTC")
H_US = 3_600 * 10**6


def new_catalog(root: Path) -> SqlCatalog:
    """A real SqlCatalog on SQLite (a new Python object per call, one database per root)."""
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    return SqlCatalog(
        "default", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{root / 'warehouse'}"
    )


def catalog_options(root: Path) -> str:
    return f"catalog_uri = 'sqlite:///{root / 'catalog.db'}', warehouse = 'file://{root / 'warehouse'}'"


def marker_epochs(table: Table, writer: str) -> list[int]:
    """The epochs of ``writer`` in the snapshot summaries, in commit order."""
    out = []
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(MARKER_WRITER) == writer:
            out.append(int(props[MARKER_EPOCH]))
    return out


def batch(**columns: Any) -> pa.RecordBatch:
    return pa.record_batch(columns)


def rows_of(table: Table, *order: str) -> list[dict[str, Any]]:
    data = table.refresh().scan().to_arrow()
    return data.sort_by([(c, "ascending") for c in order]).to_pylist()


def fail_commit_after(catalog: Catalog, action: Callable[[], None]) -> None:
    """Wrap the real ``commit_table`` of ``catalog``: the first call first runs ``action``."""
    real = catalog.commit_table
    state = {"armed": True}

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if state["armed"]:
            state["armed"] = False
            action()
        return real(*args, **kwargs)

    catalog.commit_table = wrapped  # type: ignore[method-assign]


# --- the sink --------------------------------------------------------------------------------


def test_two_writers_racing_on_one_table_commit_each_epoch_exactly_once(tmp_path: Path) -> None:
    """Writer A loads the table, then writer B commits before A's commit reaches the catalog:
    A's commit fails (CommitFailedException), A reloads, re-checks its markers, retries."""
    cat_a, cat_b = new_catalog(tmp_path), new_catalog(tmp_path)
    sink_a = IcebergSink(cat_a, "ops.t", writer="pa/out", run="ra", backoff_s=0.001)
    sink_b = IcebergSink(cat_b, "ops.t", writer="pb/out", run="rb", backoff_s=0.001)
    sink_b.commit(1, [batch(k=["b0"], v=[0])])  # creates the table
    fail_commit_after(cat_a, lambda: sink_b.commit(2, [batch(k=["b2"], v=[2])]))
    result = sink_a.commit(1, [batch(k=["a1", "a1x"], v=[1, 11])])
    assert (result.committed, result.conflicts, result.attempts) == (True, 1, 2)
    table = cat_a.load_table("ops.t")
    assert marker_epochs(table, "pa/out") == [1]
    assert marker_epochs(table, "pb/out") == [1, 2]
    assert rows_of(table, "k") == [
        {"k": "a1", "v": 1},
        {"k": "a1x", "v": 11},
        {"k": "b0", "v": 0},
        {"k": "b2", "v": 2},
    ]
    assert table.properties["flight-serve.epoch.pa/out"] == "ra:1"
    assert table.properties["flight-serve.epoch.pb/out"] == "rb:2"


def test_two_writer_threads_racing_lose_nothing_and_double_nothing(tmp_path: Path) -> None:
    """Two threads, each with its own catalog object, commit epochs 1..4 at the same moments
    (a barrier before each): every epoch of both writers lands once."""
    catalogs = [new_catalog(tmp_path), new_catalog(tmp_path)]
    IcebergSink(catalogs[0], "ops.race", writer="setup", run="s").load_or_create(
        pa.schema([("w", pa.string()), ("epoch", pa.int64())])
    )
    gate = threading.Barrier(2)
    sinks = [
        IcebergSink(c, "ops.race", writer=f"w{i}/out", run=f"r{i}", backoff_s=0.005)
        for i, c in enumerate(catalogs)
    ]
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for epoch in range(1, 5):
                gate.wait(timeout=30)
                sinks[i].commit(epoch, [batch(w=[f"w{i}"], epoch=[epoch])])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    table = catalogs[0].load_table("ops.race")
    assert marker_epochs(table, "w0/out") == [1, 2, 3, 4]
    assert marker_epochs(table, "w1/out") == [1, 2, 3, 4]
    assert rows_of(table, "w", "epoch") == [
        {"w": f"w{i}", "epoch": e} for i in range(2) for e in range(1, 5)
    ]
    assert sinks[0].conflicts + sinks[1].conflicts >= 1  # they did race


def test_two_instances_of_one_sink_racing_on_one_epoch_write_it_once(tmp_path: Path) -> None:
    """Two instances of the SAME sink (one pipeline, one sink name, one run: a zombie and its
    replacement after a failover) commit the SAME epoch with the same rows.

    Timeline: A loads the table (no marker for epoch 2) -> B commits epoch 2 -> A's commit
    reaches the catalog and fails (CommitFailedException) -> A reloads, finds its writer's
    marker for epoch 2 and writes nothing. Without the marker re-check after the conflict,
    A would append epoch 2's rows a second time."""
    cat_a, cat_b = new_catalog(tmp_path), new_catalog(tmp_path)
    sink_a = IcebergSink(cat_a, "ops.t", writer="p/out", run="r1", backoff_s=0.001)
    sink_b = IcebergSink(cat_b, "ops.t", writer="p/out", run="r1", backoff_s=0.001)
    rows = [batch(k=["a", "b"], v=[1, 2])]
    assert sink_b.commit(1, [batch(k=["z"], v=[0])]).committed  # creates the table
    landed: list[bool] = []
    fail_commit_after(cat_a, lambda: landed.append(sink_b.commit(2, rows).committed))
    result = sink_a.commit(2, rows)
    assert landed == [True]
    assert (result.committed, result.conflicts, result.attempts) == (False, 1, 1)
    table = cat_a.load_table("ops.t")
    assert marker_epochs(table, "p/out") == [1, 2]
    assert len(table.metadata.snapshots) == 2
    assert rows_of(table, "k") == [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "z", "v": 0}]
    assert table.properties["flight-serve.epoch.p/out"] == "r1:2"


def test_two_threads_of_one_sink_racing_on_each_epoch_write_each_once(tmp_path: Path) -> None:
    """Two threads, each with its own catalog object and its own instance of the SAME sink
    (writer ``p/out``, run ``r1``), commit epochs 1..4 with the same rows at the same moments
    (a barrier before each): each epoch's rows land exactly once, one snapshot per epoch, and
    for each epoch exactly one instance reports that it wrote it."""
    catalogs = [new_catalog(tmp_path), new_catalog(tmp_path)]
    IcebergSink(catalogs[0], "ops.race", writer="setup", run="s").load_or_create(
        pa.schema([("k", pa.string()), ("epoch", pa.int64())])
    )
    gate = threading.Barrier(2)
    sinks = [
        IcebergSink(c, "ops.race", writer="p/out", run="r1", backoff_s=0.005) for c in catalogs
    ]
    wrote: list[list[bool]] = [[], []]
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for epoch in range(1, 5):
                gate.wait(timeout=30)
                rows = [batch(k=[f"e{epoch}a", f"e{epoch}b"], epoch=[epoch, epoch])]
                wrote[i].append(sinks[i].commit(epoch, rows).committed)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [a + b for a, b in zip(wrote[0], wrote[1], strict=True)] == [1, 1, 1, 1]
    table = catalogs[0].load_table("ops.race")
    assert marker_epochs(table, "p/out") == [1, 2, 3, 4]
    assert rows_of(table, "epoch", "k") == [
        {"k": f"e{e}{s}", "epoch": e} for e in range(1, 5) for s in "ab"
    ]


def test_a_commit_that_lands_then_raises_is_not_duplicated(tmp_path: Path) -> None:
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.t", writer="p/out", run="r1", backoff_s=0.001)
    sink.commit(1, [batch(k=["a"], v=[1])])
    real = catalog.commit_table
    calls = {"n": 0}

    def lands_then_raises(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        response = real(*args, **kwargs)  # the commit lands in the catalog...
        if calls["n"] == 1:
            raise ConnectionResetError("connection reset after the commit")  # ...the call fails
        return response

    catalog.commit_table = lands_then_raises  # type: ignore[method-assign]
    result = sink.commit(2, [batch(k=["b", "c"], v=[2, 3])])
    assert (result.committed, result.unknown, calls["n"]) == (False, 1, 1)  # no second commit
    table = catalog.load_table("ops.t")
    assert marker_epochs(table, "p/out") == [1, 2]
    assert rows_of(table, "k") == [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "c", "v": 3}]
    # a replay of both epochs (a restore) writes nothing
    assert not sink.commit(1, [batch(k=["a"], v=[1])]).committed
    assert not sink.commit(2, [batch(k=["b", "c"], v=[2, 3])]).committed
    assert len(catalog.load_table("ops.t").metadata.snapshots) == 2


def test_the_table_property_guards_replays_after_snapshot_expiry(tmp_path: Path) -> None:
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.t", writer="p/out", run="r1")
    sink.commit(1, [batch(k=["a"], v=[1])])
    sink.commit(2, [batch(k=["b"], v=[2])])
    table = catalog.load_table("ops.t")
    first = table.metadata.snapshots[0].snapshot_id
    table.maintenance.expire_snapshots().by_id(first).commit()
    table = catalog.load_table("ops.t")
    assert marker_epochs(table, "p/out") == [2]  # epoch 1's summary is gone
    assert not sink.commit(1, [batch(k=["a"], v=[1])]).committed  # the property still says 2
    assert rows_of(table, "k") == [{"k": "a", "v": 1}, {"k": "b", "v": 2}]
    # a new run (--fresh) writes its epochs again: they are new results
    assert (
        IcebergSink(catalog, "ops.t", writer="p/out", run="r2")
        .commit(1, [batch(k=["c"], v=[3])])
        .committed
    )


def test_datafusion_ns_timestamps_land_in_a_day_partitioned_table(tmp_path: Path) -> None:
    ctx = datafusion.SessionContext()
    out = ctx.sql(
        "SELECT column1 AS k, to_timestamp_nanos(column2) AT TIME ZONE 'UTC' AS ts FROM (VALUES "
        "('a', '2013-01-01T23:59:59.123456789Z'), ('b', '2013-01-02T00:00:00.5Z'), "
        "('c', '2013-01-02T10:00:00Z'))"
    ).to_arrow_table()
    assert out.schema.field("ts").type == pa.timestamp("ns", tz="UTC")  # DataFusion's output
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.days", writer="p/out", run="r", partition_by="day(ts)")
    assert sink.commit(1, out.to_batches()).committed
    table = catalog.load_table("ops.days")
    assert str(table.spec().fields[0].transform) == "day"
    got = table.scan().to_arrow().sort_by("k")
    assert got.schema.field("ts").type == UTC_US
    assert got.column("ts").to_pylist() == [
        datetime(2013, 1, 1, 23, 59, 59, 123456, tzinfo=UTC),  # the ns digits are truncated
        datetime(2013, 1, 2, 0, 0, 0, 500000, tzinfo=UTC),
        datetime(2013, 1, 2, 10, tzinfo=UTC),
    ]
    days = sorted((t.file.partition[0], t.file.record_count) for t in table.scan().plan_files())
    assert days == [(15706, 1), (15707, 2)]  # days since 1970-01-01: 2013-01-01, 2013-01-02


def test_unsigned_and_small_ints_widen_and_new_columns_need_the_option(tmp_path: Path) -> None:
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.t", writer="p/out", run="r")
    sink.commit(1, [batch(k=pa.array([1], pa.uint32()), s=pa.array([2], pa.int8()))])
    table = catalog.load_table("ops.t")
    assert [(f.name, str(f.field_type)) for f in table.schema().fields] == [
        ("k", "long"),
        ("s", "int"),
    ]
    from flight_serve.errors import ConnectorError

    with pytest.raises(ConnectorError, match=r"uint64.*'k'|'k'.*uint64"):
        sink.commit(2, [batch(k=pa.array([2**63], pa.uint64()), s=pa.array([1], pa.int8()))])
    with pytest.raises(ConnectorError, match=r"no column 'extra'.*allow_schema_evolution"):
        sink.commit(2, [batch(k=[2], s=[3], extra=["x"])])
    evolving = IcebergSink(catalog, "ops.t", writer="p/out", run="r", allow_schema_evolution=True)
    assert evolving.commit(2, [batch(k=[2], s=[3], extra=["x"])]).committed
    assert rows_of(catalog.load_table("ops.t"), "k") == [
        {"k": 1, "s": 2, "extra": None},
        {"k": 2, "s": 3, "extra": "x"},
    ]


def test_a_table_created_from_non_nullable_columns_takes_nulls_later(tmp_path: Path) -> None:
    """DataFusion marks some output columns non-nullable; the table is created with every
    column optional, so a later epoch with nulls still lands."""
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.n", writer="p/out", run="r")
    required = pa.schema([pa.field("k", pa.int64(), nullable=False)])
    sink.commit(1, [pa.RecordBatch.from_arrays([pa.array([1])], schema=required)])
    assert sink.commit(2, [batch(k=pa.array([None], pa.int64()))]).committed
    table = catalog.load_table("ops.n")
    assert [f.required for f in table.schema().fields] == [False]
    assert sorted(table.scan().to_arrow().column("k").to_pylist(), key=str) == [1, None]


def test_upsert_keys_replace_rows_of_the_same_window_and_key(tmp_path: Path) -> None:
    """emit = 'update': a window fires, then fires again with a late row; the table keeps one
    row per (origin, window_start), the last values (also within one epoch)."""
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(
        catalog, "ops.u", writer="p/out", run="r", upsert_keys=("origin", "window_start")
    )
    w0 = pa.array([0, 0], UTC_US)
    sink.commit(1, [batch(origin=["EWR", "JFK"], window_start=w0, n=[1, 5])])
    sink.commit(
        2,
        [
            batch(origin=["EWR"], window_start=pa.array([0], UTC_US), n=[2]),
            batch(origin=["EWR", "LGA"], window_start=pa.array([0, H_US], UTC_US), n=[3, 7]),
        ],
    )
    got = rows_of(catalog.load_table("ops.u"), "origin")
    assert [(r["origin"], r["n"]) for r in got] == [("EWR", 3), ("JFK", 5), ("LGA", 7)]
    assert not sink.commit(2, [batch(origin=["EWR"], window_start=w0[:1], n=[99])]).committed


# --- the source ------------------------------------------------------------------------------


def drain(source: IcebergSource, limit: int = 100) -> list[list[dict[str, Any]]]:
    """Poll until the source ends; the rows of each poll."""
    polls: list[list[dict[str, Any]]] = []
    for _ in range(limit):
        events = source.poll(0.0)
        polls.append([r for e in events if e.kind == "batch" for r in e.batch.to_pylist()])  # type: ignore[union-attr]
        if source.done:
            return [p for p in polls if p]
    raise AssertionError("the source did not end")


@pytest.fixture
def history(tmp_path: Path) -> tuple[SqlCatalog, list[int]]:
    """ops.src with this history (snapshot: operation, rows):

    s0 append [1, 2] · s1 append [3] · s2 overwrite (delete id = 1 rewrites s0's file: [2])
    · s3 append [4] · s4 delete (id = 3: s1's whole file) · s5 append [5]
    """
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    table = catalog.create_table("ops.src", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": [1, 2]}))
    table.append(pa.table({"id": [3]}))
    table.delete("id == 1")
    table.append(pa.table({"id": [4]}))
    table.delete("id == 3")
    table.append(pa.table({"id": [5]}))
    table = catalog.load_table("ops.src")
    ops = [s.summary.operation.value for s in table.metadata.snapshots]  # type: ignore[union-attr]
    assert ops == ["append", "append", "overwrite", "append", "delete", "append"]
    return catalog, [s.snapshot_id for s in table.metadata.snapshots]


def test_overwrite_and_delete_snapshots_fail_by_default_naming_them(
    history: tuple[SqlCatalog, list[int]],
) -> None:
    catalog, ids = history
    source = IcebergSource(catalog, "ops.src", name="src", stop_at="latest")
    with pytest.raises(NonAppendSnapshotError, match=rf"snapshot {ids[2]} is a\(n\) overwrite"):
        drain(source)
    only_overwrites = IcebergSource(
        catalog, "ops.src", name="src", stop_at="latest", skip_overwrite_snapshots=True
    )
    with pytest.raises(NonAppendSnapshotError, match=rf"snapshot {ids[4]} is a\(n\) delete"):
        drain(only_overwrites)


def test_the_skip_options_deliver_only_the_appended_rows_and_log_each_skip(
    history: tuple[SqlCatalog, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    catalog, ids = history
    source = IcebergSource(
        catalog,
        "ops.src",
        name="src",
        stop_at="latest",
        skip_overwrite_snapshots=True,
        skip_delete_snapshots=True,
    )
    with caplog.at_level(logging.WARNING, logger="flight_serve.connectors.iceberg"):
        polls = drain(source)
    assert polls == [[{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}, {"id": 5}]]
    assert source.snapshot_id == ids[5]
    skipped = [r.getMessage() for r in caplog.records]
    assert any(f"snapshot {ids[2]} (overwrite) skipped" in m for m in skipped)
    assert any(f"snapshot {ids[4]} (delete) skipped" in m for m in skipped)


def test_start_strategies_and_rate_limits(tmp_path: Path) -> None:
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    table = catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())]))
    for first in range(0, 10, 2):  # five appends of two rows: [0,1] [2,3] ... [8,9]
        table.append(pa.table({"id": [first, first + 1]}))
    ids = [s.snapshot_id for s in catalog.load_table("ops.s").metadata.snapshots]

    def ids_per_poll(**options: Any) -> list[list[int]]:
        source = IcebergSource(catalog, "ops.s", name="s", stop_at="latest", **options)
        return [[r["id"] for r in poll] for poll in drain(source)]

    assert ids_per_poll() == [list(range(10))]
    assert ids_per_poll(max_snapshots_per_poll=2) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # rows: two per snapshot; 3 rows allow one snapshot, a snapshot is never split
    assert ids_per_poll(max_rows_per_poll=3) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert ids_per_poll(starting_strategy="snapshot_id", start_snapshot_id=ids[3]) == [[6, 7, 8, 9]]
    stamp = catalog.load_table("ops.s").snapshot_by_id(ids[2]).timestamp_ms  # type: ignore[union-attr]
    at = datetime.fromtimestamp(stamp / 1000, UTC)
    assert ids_per_poll(starting_strategy="timestamp", start_timestamp=at) == [[4, 5, 6, 7, 8, 9]]
    latest = IcebergSource(catalog, "ops.s", name="s", starting_strategy="latest")
    assert latest.poll(0.0) == []  # nothing after the start
    catalog.load_table("ops.s").append(pa.table({"id": [10]}))
    latest._next_check = 0.0  # the monitor interval (1 s) is not what this test waits for
    assert [
        r["id"] for e in latest.poll(0.0) if e.batch is not None for r in e.batch.to_pylist()
    ] == [10]


def test_an_expired_offset_resumes_at_its_child_else_fails_or_resets(tmp_path: Path) -> None:
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    table = catalog.create_table("ops.e", schema=pa.schema([("id", pa.int64())]))
    for i in range(4):
        table.append(pa.table({"id": [i]}))
    ids = [s.snapshot_id for s in catalog.load_table("ops.e").metadata.snapshots]
    source = IcebergSource(catalog, "ops.e", name="e", max_snapshots_per_poll=2)
    source.poll(0.0)
    offset = source.position_state()
    assert offset["snapshot_id"] == ids[1]
    catalog.load_table("ops.e").maintenance.expire_snapshots().by_ids(ids[:2]).commit()
    # the offset (s1) expired; s2 survives and names it as parent: go on there, nothing lost
    resumed = IcebergSource(catalog, "ops.e", name="e", offset=offset, stop_at="latest")
    resumed._stop_id = ids[3]
    assert drain(resumed) == [[{"id": 2}, {"id": 3}]]
    catalog.load_table("ops.e").maintenance.expire_snapshots().by_id(ids[2]).commit()
    # now s1's child is gone too: its rows are lost, and the message names it (s2)
    expired = (
        rf"snapshot {ids[2]}, the next after the checkpointed snapshot {ids[1]} \(which expired "
        r"too\), expired before the source read it.*expired_snapshot"
    )
    with pytest.raises(SnapshotExpiredError, match=expired):
        IcebergSource(catalog, "ops.e", name="e", offset=offset).poll(0.0)
    gaps: list[str] = []
    reset = IcebergSource(
        catalog, "ops.e", name="e", offset=offset, expired_snapshot="reset", on_gap=gaps.append
    )
    reset._stop_id = ids[3]
    assert drain(reset) == [[{"id": 3}]]
    assert len(gaps) == 1
    assert f"resuming at snapshot {ids[3]}" in gaps[0]


def _appended(catalog: SqlCatalog, name: str, n: int) -> list[int]:
    """Create ``name`` (one ``id`` column) with ``n`` appends of one row each (``id`` = 0 …
    n - 1): their snapshot ids, oldest first."""
    table = catalog.create_table(name, schema=pa.schema([("id", pa.int64())]))
    for i in range(n):
        table.append(pa.table({"id": [i]}))
    return [s.snapshot_id for s in catalog.load_table(name).metadata.snapshots]


def _offset_at(catalog: SqlCatalog, name: str, snapshots: int) -> dict[str, Any]:
    """The checkpoint offset of a source that read the first ``snapshots`` snapshots."""
    source = IcebergSource(catalog, name, name="r", max_snapshots_per_poll=snapshots)
    source.poll(0.0)
    return source.position_state()


@pytest.mark.parametrize("mode", ["fail", "reset"])
def test_a_checkpointed_snapshot_rolled_back_off_the_history_fails_naming_it_and_the_table(
    tmp_path: Path, mode: str
) -> None:
    """s0 … s2 read (offset s2), then the table is rolled back to s1: s2 is still in the
    metadata but no longer an ancestor of the current snapshot, so the rows the source
    delivered from it are not the table's. Resuming fails naming s2, the table and the current
    snapshot, before and after a new append s3 (whose sequence number is s2's + 1) and with
    expired_snapshot = 'reset' too (as Flink's and Spark's Iceberg sources fail); a running
    source fails the same at its next look."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    ids = _appended(catalog, "ops.r", 3)
    offset = _offset_at(catalog, "ops.r", 3)
    assert offset["snapshot_id"] == ids[2]
    live = IcebergSource(catalog, "ops.r", name="r", offset=offset)
    catalog.load_table("ops.r").manage_snapshots().rollback_to_snapshot(ids[1]).commit()
    message = (
        rf"source r \(iceberg table ops.r\): the checkpointed snapshot {ids[2]} is not an "
        rf"ancestor of the table's current snapshot {ids[1]}"
    )

    def resume() -> IcebergSource:
        return IcebergSource(catalog, "ops.r", name="r", offset=offset, expired_snapshot=mode)  # type: ignore[arg-type]

    with pytest.raises(SnapshotNotInHistoryError, match=message):
        resume().poll(0.0)
    with pytest.raises(SnapshotNotInHistoryError, match=message):
        live.poll(0.0)
    catalog.load_table("ops.r").append(pa.table({"id": [30]}))
    s3 = catalog.load_table("ops.r").current_snapshot().snapshot_id  # type: ignore[union-attr]
    with pytest.raises(SnapshotNotInHistoryError, match=rf"{ids[2]} is not an ancestor.*{s3}"):
        resume().poll(0.0)


def test_a_snapshot_set_current_on_another_branch_fails_the_source(tmp_path: Path) -> None:
    """``set_current_snapshot`` to an older snapshot and a new append on it: the offset (on
    the abandoned line) is not an ancestor of the new current snapshot."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    ids = _appended(catalog, "ops.b", 4)
    offset = _offset_at(catalog, "ops.b", 3)  # read s0 … s2
    catalog.load_table("ops.b").manage_snapshots().set_current_snapshot(ids[0]).commit()
    catalog.load_table("ops.b").append(pa.table({"id": [40]}))
    with pytest.raises(SnapshotNotInHistoryError, match=rf"snapshot {ids[2]} is not an ancestor"):
        IcebergSource(catalog, "ops.b", name="b", offset=offset).poll(0.0)
    # a start_snapshot_id off the current history: the same (it is not an expiry)
    with pytest.raises(
        SnapshotNotInHistoryError, match=rf"the first snapshot {ids[1]} is not an ancestor"
    ):
        IcebergSource(
            catalog, "ops.b", name="b", starting_strategy="snapshot_id", start_snapshot_id=ids[1]
        ).poll(0.0)


@pytest.mark.parametrize("sequence_number", [None, 1, 2])
def test_an_offset_naming_a_snapshot_the_table_never_had_fails_naming_it(
    tmp_path: Path, sequence_number: int | None
) -> None:
    """An offset whose snapshot id never was the table's (whatever sequence number it
    claims: one that would make s1 look like its child included) fails naming it."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    _appended(catalog, "ops.n", 3)
    offset = {**_offset_at(catalog, "ops.n", 1), "snapshot_id": 123456789}
    offset["sequence_number"] = sequence_number
    with pytest.raises(
        SnapshotNotInHistoryError,
        match=r"source n \(iceberg table ops.n\): the checkpointed snapshot 123456789 is not a "
        r"snapshot of the table",
    ):
        IcebergSource(catalog, "ops.n", name="n", offset=offset, stop_at="latest").poll(0.0)


def test_an_expired_child_of_a_surviving_offset_is_named_as_the_snapshot_that_expired(
    tmp_path: Path,
) -> None:
    """Offset s1 (still there); its child s2 expires (pyiceberg clears s3's parent id): the
    error names s2 as the snapshot that expired, not s1. With the metadata log gone (no earlier
    metadata file to find s2's id in) it says which snapshots it expired between."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    ids = _appended(catalog, "ops.c", 4)
    offset = _offset_at(catalog, "ops.c", 2)
    assert offset["snapshot_id"] == ids[1]
    catalog.load_table("ops.c").maintenance.expire_snapshots().by_id(ids[2]).commit()
    assert catalog.load_table("ops.c").snapshot_by_id(ids[3]).parent_snapshot_id is None  # type: ignore[union-attr]
    with pytest.raises(
        SnapshotExpiredError,
        match=rf"snapshot {ids[2]}, the next after the checkpointed snapshot {ids[1]} \(still in "
        rf"the table\), expired before the source read it",
    ):
        IcebergSource(catalog, "ops.c", name="c", offset=offset).poll(0.0)
    gaps: list[str] = []
    reset = IcebergSource(catalog, "ops.c", name="c", offset=offset, expired_snapshot="reset",
                          on_gap=gaps.append)  # fmt: skip
    reset._stop_id = ids[3]  # the bound of a restored source is its checkpoint's: end it here
    assert drain(reset) == [[{"id": 3}]]
    assert len(gaps) == 1
    assert f"snapshot {ids[2]}" in gaps[0]
    assert f"resuming at snapshot {ids[3]}" in gaps[0]
    # no earlier metadata files: s2's id is gone with them
    forgetful = _appended(catalog, "ops.f", 4)
    table = catalog.load_table("ops.f")
    table.transaction().set_properties(
        {"write.metadata.delete-after-commit.enabled": "true",
         "write.metadata.previous-versions-max": "1"}
    ).commit_transaction()  # fmt: skip
    offset = _offset_at(catalog, "ops.f", 2)
    catalog.load_table("ops.f").maintenance.expire_snapshots().by_id(forgetful[2]).commit()
    catalog.load_table("ops.f").transaction().set_properties({"x": "1"}).commit_transaction()
    with pytest.raises(
        SnapshotExpiredError,
        match=rf"a snapshot after the checkpointed snapshot {forgetful[1]} \(still in the table\) "
        rf"and before snapshot {forgetful[3]} expired before the source read it",
    ):
        IcebergSource(catalog, "ops.f", name="f", offset=offset).poll(0.0)


def test_a_stop_at_snapshot_rolled_back_off_the_history_fails_the_bounded_source(
    tmp_path: Path,
) -> None:
    """``stop_at = 'latest'`` bound to s2 when the source starts; the table is rolled back to
    s1 before the source looks: it must not read s0 … s2 (s2 is no longer the table's), it
    fails naming the stop snapshot."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    ids = _appended(catalog, "ops.t", 3)
    source = IcebergSource(catalog, "ops.t", name="t", stop_at="latest")
    catalog.load_table("ops.t").manage_snapshots().rollback_to_snapshot(ids[1]).commit()
    with pytest.raises(
        SnapshotNotInHistoryError,
        match=rf"the stop_at snapshot {ids[2]} is not an ancestor of the table's current "
        rf"snapshot {ids[1]}",
    ):
        source.poll(0.0)


# --- a pipeline: iceberg source -> windowed query -> iceberg sink, killed and resumed ---------

# Input: ops.flights, six appends (one snapshot each, one source batch each), event time t:
#
#   snapshot   0          1           2           3          4          5
#   rows       EWR 00:10  EWR 00:40   JFK 01:05   EWR 02:10  JFK 02:50  EWR 04:01
#              JFK 00:20  EWR 01:15   EWR 01:30   JFK 02:20             JFK 04:30
#
# Hourly tumbling windows per origin; W = max(t) - 0 and the source ends after snapshot 5.
# Windows [00,01) EWR 2 / JFK 1, [01,02) EWR 2 / JFK 1, [02,03) EWR 1 / JFK 2, [04,05) 1 / 1.
FLIGHTS = [
    [("EWR", 10, 5.0), ("JFK", 20, 1.0)],
    [("EWR", 40, 15.0), ("EWR", 75, -3.0)],
    [("JFK", 65, 30.0), ("EWR", 90, 2.0)],
    [("EWR", 130, 0.0), ("JFK", 140, 8.0)],
    [("JFK", 170, 12.0)],
    [("EWR", 241, 1.0), ("JFK", 270, 4.0)],
]
EXPECTED = [
    ("EWR", 0, 2, 10.0),
    ("JFK", 0, 1, 1.0),
    ("EWR", 1, 2, -0.5),
    ("JFK", 1, 1, 30.0),
    ("EWR", 2, 1, 0.0),
    ("JFK", 2, 2, 10.0),
    ("EWR", 4, 1, 1.0),
    ("JFK", 4, 1, 4.0),
]


def flights_table(root: Path, snapshots: slice = slice(None)) -> None:
    """Append ``FLIGHTS[snapshots]`` to lake.flights (created if missing), one commit each."""
    catalog = new_catalog(root)
    catalog.create_namespace_if_not_exists("lake")
    schema = pa.schema([("origin", pa.string()), ("t", UTC_US), ("dep_delay", pa.float64())])
    if catalog.table_exists("lake.flights"):
        table = catalog.load_table("lake.flights")
    else:
        table = catalog.create_table("lake.flights", schema=schema)
    for snapshot in FLIGHTS[snapshots]:
        table.append(
            pa.table(
                {
                    "origin": [o for o, _, _ in snapshot],
                    "t": pa.array([m * 60 * 10**6 for _, m, _ in snapshot], UTC_US),
                    "dep_delay": [d for _, _, d in snapshot],
                },
                schema=schema,
            )
        )


def pipeline_text(root: Path) -> str:
    cat = catalog_options(root)
    return f"""
SET checkpoint_every = 1;
CREATE SOURCE flights (origin VARCHAR, t TIMESTAMP WITH TIME ZONE, dep_delay DOUBLE,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND)
  WITH (connector = 'iceberg', table = 'lake.flights', stop_at = 'latest',
        max_snapshots_per_poll = 1, monitor_interval = '10ms', {cat});
CREATE SINK hourly WITH (connector = 'iceberg', table = 'ops.hourly',
    partition_by = 'day(window_start)', {cat});
INSERT INTO hourly
SELECT origin, window_start, window_end, count(*) AS departures, avg(dep_delay) AS avg_delay
FROM TUMBLE(flights, t, INTERVAL '1' HOUR) GROUP BY origin, window_start, window_end;
"""


def hourly(root: Path) -> list[tuple[str, int, int, float]]:
    table = new_catalog(root).load_table("ops.hourly")
    return [
        (r["origin"], r["window_start"].hour, r["departures"], r["avg_delay"])
        for r in rows_of(table, "window_start", "origin")
    ]


def durable_run(root: Path) -> DurableRuntime:
    return DurableRuntime(
        parse_pipeline(pipeline_text(root)),
        name="sync",
        options=RunOptions(checkpoint_every=1),
        state_root=str(root / "state"),
        output_dir=root / "out",
    )


class Crash(Exception):
    """Stands for the process dying at a barrier (nothing is cleaned up)."""


def test_pipeline_straight_run_writes_each_window_once(tmp_path: Path) -> None:
    flights_table(tmp_path)
    runtime = durable_run(tmp_path)
    for _ in runtime.run():
        pass
    assert hourly(tmp_path) == EXPECTED
    table = new_catalog(tmp_path).load_table("ops.hourly")
    epochs = marker_epochs(table, "sync/hourly")
    assert epochs == sorted(set(epochs))  # each epoch committed once, in order
    assert runtime.metrics()["rows_in"] == 11


@pytest.mark.parametrize("cut", range(1, 7))
def test_pipeline_killed_at_each_batch_and_resumed_equals_the_straight_run(
    tmp_path: Path, cut: int
) -> None:
    flights_table(tmp_path)
    runtime = durable_run(tmp_path)

    def dying(counted: int) -> None:
        if counted >= cut:
            raise Crash

    runtime.coordinator.barrier_hooks.append(dying)
    with pytest.raises(Crash):
        for _ in runtime.run():
            pass
    resumed = durable_run(tmp_path)
    assert resumed.resumed_from is not None or cut == 1
    for _ in resumed.run():
        pass
    assert hourly(tmp_path) == EXPECTED


@pytest.mark.integration
@pytest.mark.parametrize("crash", ["checkpoint:3", "commit:4"])
def test_pipeline_sigkilled_by_flight_serve_run_and_resumed_equals_the_straight_run(
    tmp_path: Path, crash: str
) -> None:
    """A real ``flight-serve run`` process, SIGKILLed after checkpoint 3's manifest (before its
    Iceberg commit) or after commit 4; the rerun resumes and ends with the same rows."""
    flights_table(tmp_path)
    sql = tmp_path / "sync.sql"
    sql.write_text(pipeline_text(tmp_path))
    args = [str(CLI), "run", str(sql), "--output-dir", str(tmp_path / "out")]
    args += ["--state-root", str(tmp_path / "state")]
    killed = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FLIGHT_SERVE_CRASH_AT": crash},
    )
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint" in resumed.stderr
    assert hourly(tmp_path) == EXPECTED
    epochs = marker_epochs(new_catalog(tmp_path).load_table("ops.hourly"), "sync/hourly")
    assert epochs == sorted(set(epochs))


def test_a_run_resumed_after_its_table_was_rolled_back_fails_naming_the_snapshot(
    tmp_path: Path,
) -> None:
    """``flight-serve run`` SIGKILLed after commit 2 (its checkpoint holds snapshot 1 as the
    offset); the table is then rolled back to snapshot 0. The rerun resumes and must not read
    snapshots 2-5 (the checkpoint's stop_at bound, no longer the table's history): it fails,
    naming the snapshot and the table."""
    flights_table(tmp_path)
    ids = [s.snapshot_id for s in new_catalog(tmp_path).load_table("lake.flights").snapshots()]
    sql = tmp_path / "sync.sql"
    sql.write_text(pipeline_text(tmp_path))
    args = [str(CLI), "run", str(sql), "--output-dir", str(tmp_path / "out")]
    args += ["--state-root", str(tmp_path / "state")]
    killed = subprocess.run(args, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "FLIGHT_SERVE_CRASH_AT": "commit:2"})  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    table = new_catalog(tmp_path).load_table("lake.flights")
    table.manage_snapshots().rollback_to_snapshot(ids[0]).commit()
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert resumed.returncode != 0, resumed.stderr
    err = " ".join(resumed.stderr.split())
    assert "resuming from checkpoint" in err
    assert (
        f"source flights (iceberg table lake.flights): the checkpointed snapshot {ids[1]} is "
        f"not an ancestor of the table's current snapshot {ids[0]}"
    ) in err


def test_emit_update_pipeline_upserts_each_window_row(tmp_path: Path) -> None:
    """emit = 'update' with allowed_lateness 2 h; one snapshot per poll, W = max(t):

    snapshot 0: EWR 00:10            W 00:10
    snapshot 1: EWR 01:30            W 01:30  [00,01) fires: EWR n=1
    snapshot 2: EWR 00:50 (late, within lateness: [00,01) again, n=2), EWR 03:00
    end: every window fires. The table keeps one row per (origin, window), the last values.
    """
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("lake")
    schema = pa.schema([("origin", pa.string()), ("t", UTC_US)])
    table = catalog.create_table("lake.f", schema=schema)
    for minutes in ([10], [90], [50, 180]):
        table.append(
            pa.table(
                {
                    "origin": ["EWR"] * len(minutes),
                    "t": pa.array([m * 60 * 10**6 for m in minutes], UTC_US),
                },
                schema=schema,
            )
        )
    cat = catalog_options(tmp_path)
    text = f"""
SET checkpoint_every = 1;
SET emit = 'update';
SET allowed_lateness = '2h';
CREATE SOURCE f (origin VARCHAR, t TIMESTAMP WITH TIME ZONE, WATERMARK FOR t AS t)
  WITH (connector = 'iceberg', table = 'lake.f', stop_at = 'latest',
        max_snapshots_per_poll = 1, {cat});
CREATE SINK out WITH (connector = 'iceberg', table = 'ops.upd', {cat});
INSERT INTO out SELECT origin, window_start, window_end, count(*) AS n
FROM TUMBLE(f, t, INTERVAL '1' HOUR) GROUP BY origin, window_start, window_end;
"""
    runtime = DurableRuntime(
        parse_pipeline(text),
        name="upd",
        options=RunOptions(checkpoint_every=1),
        state_root=str(tmp_path / "state"),
        output_dir=tmp_path / "out",
    )
    assert runtime.sinks["out"].iceberg is not None
    assert runtime.sinks["out"].iceberg.upsert_keys == ("origin", "window_start", "window_end")
    for _ in runtime.run():
        pass
    got = rows_of(catalog.load_table("ops.upd"), "window_start")
    assert [(r["window_start"].hour, r["n"]) for r in got] == [(0, 2), (1, 1), (3, 1)]
    assert runtime.summary().rows["out"] > 3  # the window [00,01) was written twice


# --- Iceberg tables in SQL, next to streams ---------------------------------------------------


@pytest.mark.integration
def test_doget_and_flight_sql_query_an_iceberg_table_next_to_a_stream(tmp_path: Path) -> None:
    """The server's embedded catalog (<data dir>/iceberg) holds ops.delays; the stream
    ``airports`` is joined with it by plain Flight (DoGet) and by Flight SQL (ADBC)."""
    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow.flight as flight
    from flight_serve.flight.server import start_server

    sql = (
        "SELECT d.origin, a.name, sum(d.n) AS n FROM ops.delays d "
        "JOIN airports a ON a.faa = d.origin GROUP BY d.origin, a.name ORDER BY d.origin"
    )
    with start_server(tmp_path, fsync="never") as service:
        service.store.create("airports", pa.schema([("faa", pa.string()), ("name", pa.string())]))
        service.store.append(
            "airports", pa.record_batch({"faa": ["EWR", "JFK"], "name": ["Newark", "Kennedy"]})
        )
        catalog = new_catalog(tmp_path / "iceberg")
        sink = IcebergSink(catalog, "ops.delays", writer="p/out", run="r")
        sink.commit(1, [batch(origin=["EWR", "JFK", "EWR"], n=[1, 2, 3])])
        with flight.connect(service.location) as client:
            info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
            sink.commit(2, [batch(origin=["JFK"], n=[10])])  # after planning: DoGet sees it
            got = pa.concat_tables([client.do_get(e.ticket).read_all() for e in info.endpoints])
        assert got.to_pylist() == [
            {"origin": "EWR", "name": "Newark", "n": 4},
            {"origin": "JFK", "name": "Kennedy", "n": 12},
        ]
        with (
            flightsql.connect(service.location, autocommit=True) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(sql)
            assert cur.fetch_arrow_table().to_pylist() == got.to_pylist()
            with pytest.raises(
                flightsql.Error, match=r"(?i)ops\.nope.*not found|not found.*ops\.nope"
            ):
                cur.execute("SELECT count(*) AS c FROM ops.nope")  # not a table of the catalog


@pytest.mark.integration
def test_a_submitted_pipeline_follows_an_iceberg_table_into_another_queried_over_doget(
    tmp_path: Path,
) -> None:
    """A server pipeline with no catalog options uses the server's embedded catalog
    (<data dir>/iceberg): lake.flights -> hourly windows -> ops.hourly, queried with
    ``SELECT ... FROM ops.hourly`` over DoGet. Snapshots 0-2 exist at submit; 3-5 are committed
    while it runs (monitor_interval 50 ms) and are followed. The source has no end, so W stops at
    04:30 and the windows up to [02,03) are the ones that fire (the first six of EXPECTED)."""
    import json
    import time

    import pyarrow.flight as flight
    from flight_serve.flight.server import start_server

    data = tmp_path / "data"
    flights_table(data / "iceberg", slice(0, 3))  # the server's embedded catalog
    text = """
CREATE SOURCE flights (origin VARCHAR, t TIMESTAMP WITH TIME ZONE, dep_delay DOUBLE,
    WATERMARK FOR t AS t - INTERVAL '0' SECOND)
  WITH (connector = 'iceberg', table = 'lake.flights', monitor_interval = '50ms');
CREATE SINK hourly WITH (connector = 'iceberg', table = 'ops.hourly');
INSERT INTO hourly
SELECT origin, window_start, window_end, count(*) AS departures, avg(dep_delay) AS avg_delay
FROM TUMBLE(flights, t, INTERVAL '1' HOUR) GROUP BY origin, window_start, window_end;
"""
    sql = (
        "SELECT origin, extract(hour FROM window_start) AS h, departures, avg_delay "
        "FROM ops.hourly ORDER BY window_start, origin"
    )

    def act(client: flight.FlightClient, action: str, body: dict[str, Any]) -> Any:
        results = list(client.do_action(flight.Action(action, json.dumps(body).encode())))
        return json.loads(results[0].body.to_pybytes())

    def hourly_rows(client: flight.FlightClient) -> list[tuple[str, int, int, float]]:
        try:
            info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
        except pa.ArrowKeyError as exc:  # NOT_FOUND: no ops.hourly before its first commit
            if "ops.hourly' not found" not in str(exc):
                raise
            return []
        got = pa.concat_tables([client.do_get(e.ticket).read_all() for e in info.endpoints])
        return [
            (r["origin"], int(r["h"]), r["departures"], r["avg_delay"]) for r in got.to_pylist()
        ]

    with start_server(data, fsync="never") as service, flight.connect(service.location) as client:
        pid = act(client, "pipeline.submit", {"sql": text, "name": "hourly"})["id"]
        flights_table(data / "iceberg", slice(3, 6))
        deadline = time.monotonic() + 60
        while (rows := hourly_rows(client)) != EXPECTED[:6]:
            status = act(client, "pipeline.status", {"id": pid})
            assert status["state"] == "running", status
            assert time.monotonic() < deadline, (rows, status)
            time.sleep(0.1)
        act(client, "pipeline.cancel", {"id": pid})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("", r"SOURCE f needs WITH \(table = '<namespace>.<table>'\) \(line 2"),
        ("table = 'flights'", r"option table: iceberg table 'flights': expected <namespace>"),
        ("table = 'lake.nope'", r"SOURCE f: iceberg table lake.nope does not exist"),
        (
            "table = 'lake.flights', starting_strategy = 'first'",
            r"option starting_strategy: expected earliest, latest, snapshot_id or timestamp",
        ),
        (
            "table = 'lake.flights', max_rows_per_poll = 0",
            r"option max_rows_per_poll: must be at least 1, got 0",
        ),
        ("table = 'lake.flights', colour = 'red'", r"unknown option of the iceberg connector"),
        (
            "table = 'lake.flights', starting_strategy = 'snapshot_id', start_snapshot_id = 42",
            r"start_snapshot_id 42 is not a snapshot of the table",
        ),
    ],
)
def test_bad_source_options_are_clear_errors_with_their_position(
    tmp_path: Path, options: str, message: str
) -> None:
    from flight_serve.errors import PipelineSQLError
    from flight_serve.pipelines.runtime import PipelineRuntime

    flights_table(tmp_path, slice(0, 1))
    sep = ", " if options else ""
    text = f"""
CREATE SOURCE f (origin VARCHAR, t TIMESTAMP WITH TIME ZONE, WATERMARK FOR t AS t)
  WITH (connector = 'iceberg'{sep}{options}, {catalog_options(tmp_path)});
CREATE SINK out WITH (connector = 'stdout');
INSERT INTO out SELECT origin FROM f;
"""
    with pytest.raises(PipelineSQLError, match=message):
        PipelineRuntime(parse_pipeline(text), output_dir=tmp_path)


def test_a_watermark_column_the_table_lacks_and_a_bad_partition_spec_are_refused(
    tmp_path: Path,
) -> None:
    from flight_serve.errors import PipelineSQLError
    from flight_serve.pipelines.runtime import PipelineRuntime

    flights_table(tmp_path, slice(0, 1))
    cat = catalog_options(tmp_path)
    no_column = f"""
CREATE SOURCE f (origin VARCHAR, sched TIMESTAMP, WATERMARK FOR sched AS sched)
  WITH (connector = 'iceberg', table = 'lake.flights', {cat});
CREATE SINK out WITH (connector = 'stdout');
INSERT INTO out SELECT origin FROM f;
"""
    with pytest.raises(
        PipelineSQLError,
        match=r"the table has no column 'sched'; its columns: origin, t, dep_delay",
    ):
        PipelineRuntime(parse_pipeline(no_column), output_dir=tmp_path)
    bad_spec = f"""
CREATE SOURCE f WITH (connector = 'iceberg', table = 'lake.flights', {cat});
CREATE SINK out WITH (connector = 'iceberg', table = 'ops.o', partition_by = 'week(t)', {cat});
INSERT INTO out SELECT origin FROM f;
"""
    with pytest.raises(
        PipelineSQLError, match=r"option partition_by: .*'week\(t\)'.*year/month/day/hour"
    ):
        PipelineRuntime(parse_pipeline(bad_spec), output_dir=tmp_path)


# --- metadata, messages -------------------------------------------------------------------------


@pytest.mark.integration
def test_flight_sql_get_db_schemas_and_get_tables_list_the_iceberg_tables(tmp_path: Path) -> None:
    """GetDbSchemas lists every one-level namespace of the embedded catalog next to ``public``,
    and GetTables its tables as (datafusion, <namespace>, <table>) with their Arrow schemas, so a
    JDBC/ADBC tool browsing the server sees what ``SELECT … FROM ops.delays`` reads, and the
    three-part name such a tool builds (``datafusion.ops.delays``) reads it. Namespace ``a.b``
    (two levels, not a two-part SQL name; its parent ``a`` is listed, empty) and ``public``
    (DataFusion's default schema) are not listed."""
    import adbc_driver_flightsql.dbapi as flightsql
    from flight_serve.flight.server import start_server

    with start_server(tmp_path, fsync="never") as service:
        service.store.create("airports", pa.schema([("faa", pa.string()), ("name", pa.string())]))
        catalog = new_catalog(tmp_path / "iceberg")
        IcebergSink(catalog, "ops.delays", writer="p/out", run="r").commit(
            1, [batch(origin=["EWR"], n=[1])]
        )
        IcebergSink(catalog, "lake.flights", writer="p/f", run="r").commit(
            1, [batch(origin=["JFK"], t=pa.array([0], UTC_US))]
        )
        IcebergSink(catalog, "a.b.deep", writer="p/d", run="r").commit(1, [batch(x=[1])])
        IcebergSink(catalog, "public.hidden", writer="p/h", run="r").commit(1, [batch(x=[1])])
        with flightsql.connect(service.location, autocommit=True) as conn:
            objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
            assert [
                (
                    c["catalog_name"],
                    s["db_schema_name"],
                    [t["table_name"] for t in s["db_schema_tables"]],
                )
                for c in objects
                for s in c["catalog_db_schemas"]
            ] == [
                ("datafusion", "a", []),  # the parent of a.b, a namespace the catalog lists
                ("datafusion", "lake", ["flights"]),
                ("datafusion", "ops", ["delays"]),
                ("datafusion", "public", ["airports"]),
            ]
            only_ops = conn.adbc_get_objects(depth="db_schemas", db_schema_filter="o%")
            assert [
                s["db_schema_name"]
                for c in only_ops.read_all().to_pylist()
                for s in c["catalog_db_schemas"]
            ] == ["ops"]
            schema = conn.adbc_get_table_schema("delays", db_schema_filter="ops")
            assert [(f.name, f.type) for f in schema] == [("origin", pa.string()), ("n", pa.int64())]
            flights = conn.adbc_get_table_schema("flights", db_schema_filter="lake")
            assert [(f.name, f.type) for f in flights] == [("origin", pa.string()), ("t", UTC_US)]
            with conn.cursor() as cur:
                cur.execute("SELECT origin, n FROM datafusion.ops.delays")
                assert cur.fetch_arrow_table().to_pylist() == [{"origin": "EWR", "n": 1}]


def test_a_checkpointed_embedded_run_names_iceberg_and_falkordb_in_its_refusal(
    tmp_path: Path,
) -> None:
    """A checkpointed ``flight-serve run`` refusing a local ``flight`` source lists what it does
    cover, which includes the Iceberg source and sink and the FalkorDB sink."""
    from flight_serve.errors import PipelineSQLError

    text = """
CREATE SOURCE s WITH (connector = 'flight', stream = 'x');
CREATE SINK o WITH (connector = 'stdout');
INSERT INTO o SELECT * FROM s;
"""
    with pytest.raises(PipelineSQLError) as caught:
        DurableRuntime(
            parse_pipeline(text),
            name="r",
            options=RunOptions(checkpoint_every=1),
            state_root=str(tmp_path / "state"),
            output_dir=tmp_path,
        )
    assert str(caught.value) == (
        "option connector: a checkpointed run of flight-serve run covers file and iceberg "
        "sources, file, stdout, iceberg and falkordb sinks, and flight connectors with a server "
        "option, not a 'flight' source (a 'flight' source needs server = …): submit the pipeline "
        "to the server (flight-serve submit), where it reads and writes streams exactly once, or "
        "run it without checkpoints (line 2, column 35)"
    )


def test_a_table_missing_from_a_catalog_names_the_catalog(tmp_path: Path) -> None:
    """A wrong ``catalog_uri`` (a SQLite file that holds no such table) is the likely mistake
    behind "does not exist": the message names the catalog's URI."""
    from flight_serve.errors import PipelineSQLError
    from flight_serve.pipelines.runtime import PipelineRuntime

    wrong = tmp_path / "other"
    text = f"""
CREATE SOURCE f WITH (connector = 'iceberg', table = 'lake.flights', {catalog_options(wrong)});
CREATE SINK out WITH (connector = 'stdout');
INSERT INTO out SELECT * FROM f;
"""
    with pytest.raises(PipelineSQLError) as caught:
        PipelineRuntime(parse_pipeline(text), output_dir=tmp_path)
    assert str(caught.value) == (
        f"SOURCE f: iceberg table lake.flights does not exist in catalog 'default' "
        f"(sqlite:///{wrong / 'catalog.db'}; it has no namespaces) (line 2, column 15)"
    )


def test_rows_that_do_not_fit_an_existing_tables_types_fail_naming_each_column(
    tmp_path: Path,
) -> None:
    """A table the user created with ``n int`` and ``t timestamp`` (no zone): rows with a
    ``long`` count and a UTC timestamp are refused in one line naming both columns and both
    types (Iceberg promotes int to long, never back; Flink also refuses the implicit cast),
    before anything is committed."""
    from flight_serve.errors import ConnectorError
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, NestedField, StringType, TimestampType

    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    catalog.create_table(
        "ops.pre",
        schema=Schema(
            NestedField(1, "k", StringType(), required=False),
            NestedField(2, "n", IntegerType(), required=False),
            NestedField(3, "t", TimestampType(), required=False),
        ),
    )
    sink = IcebergSink(catalog, "ops.pre", writer="p/out", run="r")
    with pytest.raises(ConnectorError) as caught:
        sink.commit(1, [batch(k=["a"], n=[1], t=pa.array([0], UTC_US))])
    assert str(caught.value) == (
        "iceberg table ops.pre: epoch 1 does not fit the table's columns: column 'n' is int in "
        "the table, int64 in the rows; column 't' is timestamp in the table, timestamp[us, "
        "tz=UTC] in the rows (CAST them in the query, or write to a new table)"
    )
    assert catalog.load_table("ops.pre").metadata.snapshots == []
    # int32 rows into the int column and a naive timestamp fit
    sink.commit(2, [batch(k=["b"], n=pa.array([2], pa.int32()), t=pa.array([0], pa.timestamp("us")))])
    assert [(r["k"], r["n"]) for r in rows_of(catalog.load_table("ops.pre"), "k")] == [("b", 2)]
    # allow_schema_evolution widens int to long even when no column is new; a string column
    # cannot take int64 rows either way
    evolving = IcebergSink(catalog, "ops.pre", writer="p/out", run="r", allow_schema_evolution=True)
    assert evolving.commit(3, [batch(k=["c"], n=[2**40])]).committed
    table = catalog.load_table("ops.pre")
    assert [(f.name, str(f.field_type)) for f in table.schema().fields] == [
        ("k", "string"),
        ("n", "long"),
        ("t", "timestamp"),
    ]
    assert [(r["k"], r["n"]) for r in rows_of(table, "k")] == [("b", 2), ("c", 2**40)]
    with pytest.raises(ConnectorError) as caught:
        evolving.commit(4, [batch(k=[5])])
    assert str(caught.value) == (  # pyiceberg's schema update says it in one line
        "iceberg table ops.pre: epoch 4 cannot be written: Cannot change column type: "
        "k: string -> long"
    )


def test_a_poll_stops_adding_snapshots_once_it_holds_max_entries_batches(tmp_path: Path) -> None:
    """Without rate limits, a source far behind (``earliest`` over a long history) must not read
    every pending snapshot into one poll's memory: a poll stops adding whole snapshots once it
    holds ``max_entries`` batches (a snapshot is never split), and the next poll goes on at
    once (backlog). Five snapshots of three rows, one row per batch, max_entries 4: each poll
    takes snapshots until it holds at least 4 batches, i.e. two snapshots (6 batches)."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    table = catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())]))
    for first in range(0, 15, 3):
        table.append(pa.table({"id": [first, first + 1, first + 2]}))
    source = IcebergSource(catalog, "ops.s", name="s", stop_at="latest", batch_rows=1)
    polls = []
    while not source.done:
        events = source.poll(0.0, max_entries=4)
        polls.append(
            [
                (
                    e.kind,
                    e.batch.column(0).to_pylist()
                    if e.batch is not None
                    else (e.backlog if e.kind == "backlog" else None),
                )
                for e in events
            ]
        )
    assert polls == [
        [("batch", [i]) for i in range(6)] + [("backlog", True)],
        [("batch", [i]) for i in range(6, 12)],
        [("batch", [i]) for i in range(12, 15)] + [("backlog", False)],
        [("end", None)],
    ]


def test_a_checkpoint_of_a_table_since_dropped_and_recreated_fails_or_resets(
    tmp_path: Path,
) -> None:
    """ops.s had snapshots 1-3 (rows 0, 1, 2) when the checkpoint was taken; then it was
    dropped and created again, with one append (row 100). The checkpointed snapshot is not in
    the new table's history and the new table's sequence numbers start over below the
    checkpoint's, so a restore used to find nothing newer and wait forever, silently. Now it
    fails naming both table uuids, or with expired_snapshot = 'reset' reads the new table from
    its oldest snapshot and reports the gap (a bounded run still ends)."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    table = catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())]))
    for i in range(3):
        table.append(pa.table({"id": [i]}))
    old_uuid = str(catalog.load_table("ops.s").metadata.table_uuid)
    source = IcebergSource(catalog, "ops.s", name="s")
    assert drain_live(source) == [0, 1, 2]
    state = source.position_state()
    assert state["table_uuid"] == old_uuid
    catalog.drop_table("ops.s")
    catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())])).append(
        pa.table({"id": [100]})
    )
    new_uuid = str(catalog.load_table("ops.s").metadata.table_uuid)
    with pytest.raises(SnapshotExpiredError) as caught:
        IcebergSource(catalog, "ops.s", name="s", offset=state)
    assert str(caught.value) == (
        f"source s (iceberg table ops.s): the table was dropped and created again since the "
        f"checkpoint (table uuid {old_uuid}, now {new_uuid}): its snapshot "
        f"{state['snapshot_id']} is not in the new table's history. Start over (--fresh), or "
        "set expired_snapshot = 'reset' to read the new table from its oldest snapshot (the "
        "gap is reported)"
    )
    gaps: list[str] = []
    reset = IcebergSource(
        catalog,
        "ops.s",
        name="s",
        offset=state,
        expired_snapshot="reset",
        on_gap=gaps.append,
        stop_at="latest",
    )
    assert drain(reset) == [[{"id": 100}]]
    assert gaps == [
        f"source s (iceberg table ops.s): the table was dropped and created again since the "
        f"checkpoint (table uuid {old_uuid}, now {new_uuid}): its snapshot "
        f"{state['snapshot_id']} is not in the new table's history; reading the new table "
        "from its oldest snapshot (expired_snapshot = 'reset')"
    ]


def drain_live(source: IcebergSource) -> list[int]:
    """The ids of one poll of a live source (no stop_at)."""
    return [r["id"] for e in source.poll(0.0) if e.batch is not None for r in e.batch.to_pylist()]


def test_adding_expired_snapshot_reset_after_the_failure_keeps_the_checkpoint(
    tmp_path: Path,
) -> None:
    """The SnapshotExpiredError says "set expired_snapshot = 'reset'"; a user who does so
    after the failure changes the pipeline text, which used to make the checkpoint refuse to
    restore ("the pipeline text changed"), so the advice could not be followed. Recovery
    options (expired_snapshot, SET offset_reset) are left out of the checkpoint's fingerprint:
    the run resumes, reads the re-created table (row 100) and reports the gap. Any other
    change is still refused."""
    from flight_serve.errors import CheckpointError

    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    table = catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())]))
    for i in range(3):
        table.append(pa.table({"id": [i]}))
    text = f"""
SET checkpoint_every = 1;
CREATE SOURCE s WITH (connector = 'iceberg', table = 'ops.s', stop_at = 'latest',
    max_snapshots_per_poll = 1, {catalog_options(tmp_path)});
CREATE SINK o WITH (connector = 'file', path = 'o.jsonl');
INSERT INTO o SELECT * FROM s;
"""

    def run(sql: str, cut: int | None = None) -> DurableRuntime:
        runtime = DurableRuntime(
            parse_pipeline(sql),
            name="p",
            state_root=str(tmp_path / "state"),
            output_dir=tmp_path / "out",
        )
        if cut is not None:

            def dying(counted: int) -> None:
                if counted >= cut:
                    raise Crash

            runtime.coordinator.barrier_hooks.append(dying)
        for _ in runtime.run():
            pass
        return runtime

    with pytest.raises(Crash):
        run(text, cut=2)
    old = catalog.load_table("ops.s")
    old_uuid, first_id = str(old.metadata.table_uuid), old.metadata.snapshots[0].snapshot_id
    catalog.drop_table("ops.s")
    catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())])).append(
        pa.table({"id": [100]})
    )
    new_uuid = str(catalog.load_table("ops.s").metadata.table_uuid)
    with pytest.raises(SnapshotExpiredError):
        run(text)
    with_reset = text.replace("max_snapshots_per_poll = 1,", "max_snapshots_per_poll = 1,\n"
                              "    expired_snapshot = 'reset',")
    with pytest.raises(CheckpointError, match="the pipeline text changed"):
        run(with_reset.replace("o.jsonl", "other.jsonl"))  # another change: still refused
    resumed = run(with_reset)
    assert resumed.resumed_from is not None
    assert resumed.gaps == [
        f"source s (iceberg table ops.s): the table was dropped and created again since the "
        f"checkpoint (table uuid {old_uuid}, now {new_uuid}): its snapshot {first_id} is not "
        "in the new table's history; reading the new table from its oldest snapshot "
        "(expired_snapshot = 'reset')"
    ]
    got = (tmp_path / "out" / "o.jsonl").read_text().splitlines()
    assert got == ['{"id":0}', '{"id":100}']  # snapshot 1 before the crash, then the new table


@pytest.mark.integration
def test_flight_sql_updates_read_iceberg_tables_and_refuse_to_write_them(tmp_path: Path) -> None:
    """GetTables lists ops.delays, so a JDBC/ADBC user may try to change it: INSERT, DROP TABLE
    and CREATE TABLE on a two-part name are refused naming the Iceberg table and saying how it
    is written (they used to say "does not exist" / "failed to resolve schema"). Reading an
    Iceberg table into a stream works: CREATE TABLE … AS SELECT and INSERT … SELECT."""
    import adbc_driver_flightsql.dbapi as flightsql
    from flight_serve.flight.server import start_server

    with start_server(tmp_path, fsync="never") as service:
        catalog = new_catalog(tmp_path / "iceberg")
        IcebergSink(catalog, "ops.delays", writer="p/out", run="r").commit(
            1, [batch(origin=["EWR", "JFK"], n=[1, 2])]
        )
        refusal = (
            "{name} is an Iceberg table of the server's catalog (a two-part name): SQL reads "
            "it; a pipeline's iceberg sink writes it (CREATE SINK … WITH (connector = "
            "'iceberg', table = '{name}')). Streams have one-part names"
        )
        with flightsql.connect(service.location, autocommit=True) as conn, conn.cursor() as cur:
            for sql, name in [
                ("INSERT INTO ops.delays VALUES ('LGA', 3)", "ops.delays"),
                ("DROP TABLE ops.delays", "ops.delays"),
                ("CREATE TABLE ops.fresh (a INT)", "ops.fresh"),
                ("INSERT INTO datafusion.ops.delays VALUES ('LGA', 3)", "ops.delays"),
            ]:
                with pytest.raises(flightsql.Error) as caught:
                    cur.execute(sql)
                assert refusal.format(name=name) in str(caught.value), sql
            cur.execute("CREATE TABLE copy AS SELECT origin, n FROM ops.delays ORDER BY origin")
            cur.execute("INSERT INTO copy SELECT origin, n * 10 FROM ops.delays ORDER BY origin")
            cur.execute("SELECT origin, n FROM copy")
            assert cur.fetchall() == [("EWR", 1), ("JFK", 2), ("EWR", 10), ("JFK", 20)]
            cur.execute("SELECT count(*) FROM ops.delays")
            assert cur.fetchall() == [(2,)]


def test_a_partition_spec_that_cannot_apply_creates_no_table(tmp_path: Path) -> None:
    """partition_by day(k) over a string column, or over a column the rows lack, fails the
    first commit with a one-line error, and leaves no table behind: the table used to be
    created first (unpartitioned) and the spec added after, so the error came as a raw
    traceback and the next run wrote into the unpartitioned table without a word."""
    from flight_serve.errors import ConnectorError

    catalog = new_catalog(tmp_path)
    rows = [batch(k=["a"], t=pa.array([0], UTC_US))]
    with pytest.raises(ConnectorError) as caught:
        IcebergSink(catalog, "ops.p", writer="w", run="r", partition_by="day(k)").commit(1, rows)
    assert str(caught.value) == (
        "iceberg table ops.p: partition_by day(k) cannot apply: day cannot transform string "
        "values from k"
    )
    assert not catalog.table_exists("ops.p")
    with pytest.raises(ConnectorError) as caught:
        IcebergSink(catalog, "ops.p", writer="w", run="r", partition_by="day(tt)").commit(1, rows)
    assert str(caught.value) == (
        "iceberg table ops.p: partition_by names tt, which the rows lack (columns: k, t)"
    )
    assert not catalog.table_exists("ops.p")
    sink = IcebergSink(catalog, "ops.p", writer="w", run="r", partition_by="day(t), identity(k)")
    assert sink.commit(1, rows).committed
    spec = catalog.load_table("ops.p").spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [
        ("t_day", "day"),
        ("k", "identity"),
    ]


def test_partition_by_differing_from_an_existing_tables_spec_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """partition_by applies to a table the sink creates; an existing table keeps its own spec
    (as Flink's CREATE TABLE IF NOT EXISTS does), and a differing partition_by is not silent:
    one WARNING per sink names both specs."""
    catalog = new_catalog(tmp_path)
    rows = [batch(k=["a"], t=pa.array([0], UTC_US))]
    IcebergSink(catalog, "ops.p", writer="w", run="r").commit(1, rows)  # unpartitioned
    sink = IcebergSink(catalog, "ops.p", writer="w", run="r", partition_by="day(t)")
    with caplog.at_level(logging.WARNING, logger="flight_serve.connectors.iceberg"):
        sink.commit(2, rows)
        sink.commit(3, rows)
    assert [r.getMessage() for r in caplog.records] == [
        "iceberg sink ops.p: partition_by day(t) is not the existing table's partition spec "
        "(unpartitioned) and is ignored: it applies to a table the sink creates"
    ]
    assert catalog.load_table("ops.p").spec().fields == ()


@pytest.mark.integration
def test_a_query_over_an_iceberg_table_reserves_its_data_in_the_memory_budget(
    tmp_path: Path,
) -> None:
    """DoGet loads an Iceberg table's current snapshot into memory, as it loads a stream; a
    stream's query reserves its on-disk bytes in --memory-budget, and an Iceberg table's now
    reserves its data files' bytes (the snapshot summary's total-files-size): a table larger
    than the whole budget is refused with the budget named, instead of being loaded anyway."""
    import pyarrow.flight as flight
    from flight_serve.flight.ops.limits import MemoryBudget
    from flight_serve.flight.server import start_server

    catalog = new_catalog(tmp_path / "iceberg")
    sink = IcebergSink(catalog, "ops.big", writer="w", run="r")
    sink.commit(1, [batch(k=[f"key-{i:06d}-{'x' * 40}" for i in range(20_000)])])
    summary = catalog.load_table("ops.big").current_snapshot().summary  # type: ignore[union-attr]
    files_bytes = int(summary.additional_properties["total-files-size"])  # type: ignore[union-attr]
    work = 1 << 16
    budget = MemoryBudget(files_bytes + work - 1, wait_s=0.1)
    with (
        start_server(tmp_path, pipelines=False, memory_budget=budget, query_work_bytes=work)
        as service,
        flight.FlightClient(service.location) as client,
    ):
        info = client.get_flight_info(
            flight.FlightDescriptor.for_command("SELECT count(*) AS n FROM ops.big")
        )
        with pytest.raises(pa.ArrowInvalid) as caught:  # INVALID_ARGUMENT
            client.do_get(info.endpoints[0].ticket).read_all()
        assert (
            f"this query needs {files_bytes + work} bytes of memory, more than the server's "
            f"whole memory budget of {files_bytes + work - 1} bytes (--memory-budget)"
        ) in str(caught.value)
        assert budget.in_use() == {}
    enough = MemoryBudget(files_bytes + work, wait_s=0.1)
    with (
        start_server(tmp_path, pipelines=False, memory_budget=enough, query_work_bytes=work)
        as service,
        flight.FlightClient(service.location) as client,
    ):
        info = client.get_flight_info(
            flight.FlightDescriptor.for_command("SELECT count(*) AS n FROM ops.big")
        )
        assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"n": 20_000}]


def test_a_table_dropped_and_recreated_under_a_running_source_fails_or_resets(
    tmp_path: Path,
) -> None:
    """The live form of the case above: the source has read rows 0-2 when ops.s is dropped and
    created again with row 100. It used to fail with pyiceberg's "Table UUID does not match"
    (after a restart: wait forever). Now the same choice as for a checkpoint: fail naming both
    uuids, or with expired_snapshot = 'reset' read the new table from its start, gap reported."""
    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")

    def fresh_table() -> str:
        if catalog.table_exists("ops.s"):
            catalog.drop_table("ops.s")
        table = catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())]))
        for i in range(3):
            table.append(pa.table({"id": [i]}))
        return str(table.metadata.table_uuid)

    for mode in ("fail", "reset"):
        old_uuid = fresh_table()
        gaps: list[str] = []
        source = IcebergSource(
            catalog, "ops.s", name="s", expired_snapshot=mode, on_gap=gaps.append  # type: ignore[arg-type]
        )
        assert drain_live(source) == [0, 1, 2]
        last = source.snapshot_id
        catalog.drop_table("ops.s")
        created = catalog.create_table("ops.s", schema=pa.schema([("id", pa.int64())]))
        created.append(pa.table({"id": [100]}))
        new_uuid = str(created.metadata.table_uuid)
        source._next_check = 0.0  # the monitor interval is not what this test waits for
        message = (
            f"source s (iceberg table ops.s): the table was dropped and created again while the "
            f"source read it (table uuid {old_uuid}, now {new_uuid}): its snapshot {last} is not "
            "in the new table's history"
        )
        if mode == "fail":
            with pytest.raises(SnapshotExpiredError) as caught:
                source.poll(0.0)
            assert str(caught.value).startswith(message + ". Start over (--fresh)")
        else:
            assert drain_live(source) == [100]
            assert gaps == [
                message + "; reading the new table from its oldest snapshot "
                "(expired_snapshot = 'reset')"
            ]


def test_a_timestamp_zoned_other_than_utc_lands_as_the_same_instants(tmp_path: Path) -> None:
    """Iceberg's timestamptz holds UTC instants and pyiceberg takes only UTC-zoned Arrow
    timestamps: a column zoned America/New_York (a source file's zone, kept by the query)
    failed with "unsupported type". Arrow stores instants whatever the zone, so the column is
    written as the same instants in UTC."""
    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.tz", writer="p", run="r")
    ny = pa.array([0, 3_600 * 10**9 + 7], pa.timestamp("ns", tz="America/New_York"))
    assert sink.commit(1, [batch(k=["a", "b"], t=ny)]).committed
    table = catalog.load_table("ops.tz")
    assert [(f.name, str(f.field_type)) for f in table.schema().fields] == [
        ("k", "string"),
        ("t", "timestamptz"),
    ]
    got = table.scan().to_arrow().sort_by("k")
    assert got.column("t").type == UTC_US
    assert got.column("t").cast(pa.int64()).to_pylist() == [0, 3_600 * 10**6]  # µs, same instants


def test_date64_and_time32_columns_are_cast_to_the_types_iceberg_stores(tmp_path: Path) -> None:
    """date64 (ms since the epoch, whole days) and time32 have no Iceberg type of their own;
    they failed with "unsupported type" and are now written as date32 and time64[us]."""
    from datetime import date, time

    catalog = new_catalog(tmp_path)
    sink = IcebergSink(catalog, "ops.dt", writer="p", run="r")
    rows = batch(
        d=pa.array([date(2024, 2, 29)], pa.date64()),
        s=pa.array([3_725], pa.time32("s")),
        m=pa.array([3_725_250], pa.time32("ms")),
    )
    assert sink.commit(1, [rows]).committed
    table = catalog.load_table("ops.dt")
    assert [(f.name, str(f.field_type)) for f in table.schema().fields] == [
        ("d", "date"),
        ("s", "time"),
        ("m", "time"),
    ]
    assert table.scan().to_arrow().to_pylist() == [
        {"d": date(2024, 2, 29), "s": time(1, 2, 5), "m": time(1, 2, 5, 250_000)}
    ]


def test_a_required_column_takes_rows_without_nulls_and_names_the_nulls_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table made elsewhere with ``k string NOT NULL`` (required): DataFusion's results are
    always nullable fields, so pyiceberg refused every epoch ("required string" vs "optional
    string"), even with no null in it, and the message said "string in the table, string in
    the rows". Now rows without nulls land, and nulls are refused naming the column and the
    count; pyiceberg's table of fields is not printed on stdout."""
    from flight_serve.errors import ConnectorError
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = new_catalog(tmp_path)
    catalog.create_namespace("ops")
    catalog.create_table(
        "ops.req",
        schema=Schema(
            NestedField(1, "k", StringType(), required=True),
            NestedField(2, "n", LongType(), required=False),
        ),
    )
    sink = IcebergSink(catalog, "ops.req", writer="p", run="r")
    assert sink.commit(1, [batch(k=["a"], n=[1])]).committed
    with pytest.raises(ConnectorError) as caught:
        sink.commit(2, [batch(k=["b", None, None], n=[2, 3, 4])])
    assert str(caught.value) == (
        "iceberg table ops.req: epoch 2 does not fit the table's columns: column 'k' is "
        "required (NOT NULL) in the table and null in 2 row(s) (filter or coalesce them in "
        "the query)"
    )
    assert rows_of(catalog.load_table("ops.req"), "k") == [{"k": "a", "n": 1}]
    assert capsys.readouterr().out == ""
