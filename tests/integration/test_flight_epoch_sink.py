"""Attacks on the exactly-once remote Flight sink between two flight-serve servers.

Server B is a real ``flight-serve serve`` process (``kill -9``ed and restarted where a test
says so); the sink side is the checkpointed run's :class:`EpochStreamSink` over a
:class:`FlightStreamTarget`, driven epoch by epoch (prepare, commit, then a "crash": a new
target and sink restored from the checkpoint's commit mark, as ``pipelines/durable.py`` does).
The process helpers are in ``helpers.py``; the ``servers`` fixture in ``integration/conftest.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve._arrow import read_ipc
from flight_serve.connectors.flight import FlightStreamTarget
from flight_serve.pipelines.epoch_sinks import EpochStreamSink
from helpers import ID_EVENTS as SCHEMA
from helpers import ServeProcess, free_port, stream_rows
from helpers import id_batches as batches

pytestmark = [pytest.mark.integration]



def commit_then_crash(
    sink: EpochStreamSink, items: list[pa.RecordBatch], epoch: int = 1
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Write ``items``, checkpoint them as epoch ``epoch`` and commit it, then drop the sink as a
    crash before the next checkpoint would: the checkpoint's sink entry and staged files."""
    for batch in items:
        sink.write(batch)
    files: dict[str, bytes] = {}
    entry = sink.prepare(epoch, files)
    sink.commit(epoch)
    sink.close()  # the crash: the next checkpoint was never written
    return entry, files


def restored(
    location: str, entry: dict[str, Any], files: dict[str, bytes], writer: str = "from-a"
) -> EpochStreamSink:
    """The sink of a run resumed from the checkpoint whose commit mark is ``entry`` and staged
    files ``files``: a new target, the mark and incarnation restored, the staged epoch's commit
    redone (``recover``), as ``pipelines/durable.py`` restores a stream sink."""
    target = FlightStreamTarget(location, "relay", SCHEMA, writer)
    sink = EpochStreamSink(
        "relay",
        target,
        SCHEMA,
        mark=entry["mark"],
        incarnation=entry["incarnation"],
        rows=entry["rows"],
    )
    staged = files.get(entry["staged"]) if entry["staged"] else None
    sink.recover(read_ipc(staged) if staged is not None else [])
    return sink


def test_a_restored_sink_skips_its_batches_in_a_stream_whose_columns_are_in_another_order(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    """B's stream ``relay`` was made by another producer with the same columns in another
    order (``k, id, t, v``); B takes the sink's batches (``id, k, t, v``) and stores them in the
    stream's order. The run crashes after its epoch-1 commit landed, before checkpoint 2:
    the restore redoes the commit of checkpoint 1 and must find the three batches there.

    timeline:  other writer makes relay (k, id, t, v) ─ epoch 1: ids 1..30 prepared, committed
               ─ crash ─ restore from checkpoint 1: recover(ids 1..30) ─ epoch 2: ids 31..40
    """
    b = servers["b"] = ServeProcess(tmp_path / "b", free_port())
    reordered = pa.schema([SCHEMA.field(n) for n in ("k", "id", "t", "v")])
    with flight.connect(b.location) as client:
        writer, _ = client.do_put(flight.FlightDescriptor.for_path("relay", "other"), reordered)
        writer.done_writing()
        writer.close()

    sink = EpochStreamSink(
        "relay", FlightStreamTarget(b.location, "relay", SCHEMA, "from-a"), SCHEMA
    )
    entry, files = commit_then_crash(sink, batches(1, 3))

    sink = restored(b.location, entry, files)
    try:
        assert sink.skipped == 3  # found in the stream, not appended again
        for batch in batches(31, 1):
            sink.write(batch)
        sink.prepare(2, {})
        sink.commit(2)
    finally:
        sink.close()
    rows = stream_rows(b.location, "relay")
    assert [r["id"] for r in rows] == list(range(1, 41))


def test_a_restored_sink_into_a_local_stream_with_reordered_columns_skips_its_batches(
    tmp_path: Path,
) -> None:
    """The same rule for a pipeline's sink into a stream of its own server (``StoreTarget``):
    the stream ``relay`` exists with the columns in the order ``k, id, t, v`` and one
    dictionary-encoded column sent as plain text; the commit of checkpoint 1 redone after a
    crash finds ids 1..30 there (they were appended again before: ids 1..30 twice).

    timeline:  relay (k, id, t, v) ─ epoch 1: ids 1..30 committed ─ crash ─ recover ─ ids 31..40
    """
    from flight_serve.pipelines.store_io import StoreTarget
    from flight_serve.store.streams import StreamStore

    reordered = pa.schema([SCHEMA.field(n) for n in ("k", "id", "t", "v")])
    # the sink's k is dictionary-encoded (the stream stores it decoded)
    schema = pa.schema(
        [
            SCHEMA.field("id"),
            pa.field("k", pa.dictionary(pa.int32(), pa.string())),
            SCHEMA.field("t"),
            SCHEMA.field("v"),
        ]
    )

    def encoded(items: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        return [
            pa.RecordBatch.from_arrays(
                [b.column(0), b.column(1).dictionary_encode(), b.column(2), b.column(3)],
                schema=schema,
            )
            for b in items
        ]

    with StreamStore(tmp_path / "data") as store:
        store.create("relay", reordered)
        sink = EpochStreamSink("relay", StoreTarget(store, "relay", schema, "p"), schema)
        entry, files = commit_then_crash(sink, encoded(batches(1, 3)))

        sink = EpochStreamSink(
            "relay",
            StoreTarget(store, "relay", schema, "p"),
            schema,
            mark=entry["mark"],
            incarnation=entry["incarnation"],
            rows=entry["rows"],
        )
        sink.recover(read_ipc(files[entry["staged"]]))
        assert sink.skipped == 3
        for batch in encoded(batches(31, 1)):
            sink.write(batch)
        sink.prepare(2, {})
        sink.commit(2)
        sink.close()
        ids = [i for b in store.batches("relay") for i in b.column("id").to_pylist()]
    assert ids == list(range(1, 41))


def test_a_write_that_fails_on_the_receiving_server_fails_the_sink_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's disk is full when it writes the sink's 2nd batch (fault injection: ``os.pwrite``
    fails with ENOSPC in the server's process, this one; the real store discards the staged
    frame and raises its StorageError). B answers the batch with its last PutResult
    ``{"error": <message>}`` and ends the call: the sink fails with a ConnectorError carrying
    B's message (no retry: B refused; the run's ``on_failure`` decides), not a KeyError
    ``'offset'`` from reading the error PutResult as an acknowledgement. The 1st batch stays.

    timeline:  ids 1..10 appended, acked ─ disk full ─ ids 11..20: B's write fails ─ sink fails
    """
    from flight_serve.errors import ConnectorError
    from flight_serve.flight.server import start_server

    def full_disk(fd: int, data: Any, position: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with start_server(tmp_path / "b", pipelines=False) as service:
        retries: list[str | None] = []
        target = FlightStreamTarget(
            service.location, "relay", SCHEMA, "from-a", on_retry=retries.append
        )
        first, second = batches(1, 2)
        try:
            assert target.append(first) == 0
            with monkeypatch.context() as patch:
                patch.setattr(os, "pwrite", full_disk)
                with pytest.raises(ConnectorError) as failed:
                    target.append(second)
        finally:
            target.close()
        assert retries == []  # B refused: not retried
        message = str(failed.value)
        assert message == (
            f"flight sink (server {service.location}, stream 'relay', writer 'from-a'): the "
            "server failed the DoPut: cannot append to stream 'relay': [Errno 28] No space "
            "left on device"
        )
        assert [r["id"] for r in stream_rows(service.location, "relay")] == list(range(1, 11))


def test_a_remote_sink_the_receiving_server_refuses_fails_when_it_opens(tmp_path: Path) -> None:
    """B's stream ``relay`` has ``id`` as text; a sink with ``id BIGINT`` is refused when it
    opens (its first DoPut, which also creates a missing stream), as a sink into a local
    stream is: not at its first commit, after the run had written a checkpoint holding an
    epoch B can never take. The message is B's, without gRPC's detail tail."""
    from flight_serve.errors import ConnectorError
    from flight_serve.flight.server import start_server

    with start_server(tmp_path / "b", pipelines=False) as service:
        service.store.create("relay", pa.schema([("id", pa.string())]))
        with pytest.raises(ConnectorError) as failed:
            FlightStreamTarget(service.location, "relay", SCHEMA, "from-a", retry_s=30)
        said = re.fullmatch(r"(.*) \(request id [0-9a-f]{16}\)", str(failed.value))
        assert said is not None, str(failed.value)  # B's request id, for B's log
        assert said.group(1) == (
            f"flight sink (server {service.location}, stream 'relay', writer 'from-a'): opening "
            "the DoPut failed: batch schema does not match stream 'relay': unexpected field 'k' "
            "(string), 't' (timestamp[ms]), 'v' (int64); retyped field 'id' (stream has "
            "string, batch has int64)"
        )


FLOATS = pa.schema([("id", pa.int64()), ("ratio", pa.float64())])


def nan_batches(first_id: int, count: int) -> list[pa.RecordBatch]:
    """``count`` batches of 10 rows, ids from ``first_id``; ``ratio`` is NaN for every id
    divisible by 4 (what ``0.0 / 0.0`` gives in SQL), ``id / 10`` otherwise."""
    out = []
    for b in range(count):
        ids = list(range(first_id + b * 10, first_id + b * 10 + 10))
        ratios = [float("nan") if i % 4 == 0 else i / 10 for i in ids]
        out.append(pa.RecordBatch.from_pydict({"id": ids, "ratio": ratios}, schema=FLOATS))
    return out


def test_a_restored_sink_skips_its_batches_that_hold_nan(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    """Arrow's comparison says NaN differs from NaN, so a committed batch holding a NaN was
    never recognized in the read-back: the restore appended it again. Epoch 1 (ids 1..30, NaN
    at 4, 8, ... 28) is committed, the run crashes before checkpoint 2, the restore redoes the
    commit of checkpoint 1: every batch is found and skipped; a NaN is still told apart from a
    number (a batch whose NaN became 0.0 is appended).

    timeline:  epoch 1: ids 1..30 committed ─ crash ─ recover(ids 1..30) ─ epoch 2: ids 31..40
    """
    b = servers["b"] = ServeProcess(tmp_path / "b", free_port())

    def target() -> FlightStreamTarget:
        return FlightStreamTarget(b.location, "floats", FLOATS, "from-a")

    sink = EpochStreamSink("floats", target(), FLOATS)
    entry, files = commit_then_crash(sink, nan_batches(1, 3))

    sink = EpochStreamSink(
        "floats", target(), FLOATS, mark=entry["mark"], incarnation=entry["incarnation"]
    )
    zeroed = nan_batches(31, 1)[0]
    zeroed = zeroed.set_column(
        1, "ratio", pa.array([0.0 if i % 4 == 0 else i / 10 for i in range(31, 41)])
    )
    try:
        sink.recover(read_ipc(files[entry["staged"]]))
        assert sink.skipped == 3
        sink.write(zeroed)
        sink.prepare(2, {})
        sink.commit(2)
    finally:
        sink.close()
    with flight.connect(b.location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("floats"))
        table = client.do_get(info.endpoints[0].ticket).read_all()
    assert table.column("id").to_pylist() == list(range(1, 41))
    ratios = table.column("ratio").to_pylist()
    assert [i for i, r in zip(range(1, 41), ratios, strict=True) if r != r] == [
        4,
        8,
        12,
        16,
        20,
        24,
        28,
    ]
    assert ratios[31] == 0.0  # id 32: the epoch-2 batch, appended


def test_same_rows_takes_nan_for_nan_at_any_depth_and_nothing_else() -> None:
    """The read-back comparison of the stream sinks (``connectors.columns.same_rows``)."""
    from flight_serve.connectors.columns import same_rows

    nan = float("nan")

    def one(column: pa.Array[Any], other: pa.Array[Any] | None = None) -> bool:
        x = pa.record_batch({"id": [1, 2], "c": column})
        y = pa.record_batch({"id": [1, 2], "c": column if other is None else other})
        return same_rows(x, y)

    floats = pa.array([nan, 1.5])
    nested = pa.array([[nan, 1.0], None], pa.list_(pa.float32()))
    structs = pa.array([{"f": nan, "s": "a"}, {"f": 2.0, "s": None}])
    maps = pa.array([[("a", nan)], [("b", 1.0)]], pa.map_(pa.string(), pa.float64()))
    assert [one(c) for c in (floats, nested, structs, maps)] == [True] * 4
    assert not one(floats, pa.array([0.0, 1.5]))  # NaN is not 0.0
    assert not one(floats, pa.array([None, 1.5], pa.float64()))  # nor null
    assert not one(nested, pa.array([[nan, 1.0], []], pa.list_(pa.float32())))
    assert not one(structs, pa.array([{"f": nan, "s": "b"}, {"f": 2.0, "s": None}]))
    assert not one(floats, pa.array([nan, 1.5], pa.float32()))  # another type
    # by column name; a dictionary-encoded column by its values
    text = pa.array(["x", "y"])
    left = pa.record_batch({"id": [1, 2], "k": text.dictionary_encode(), "r": floats})
    right = pa.record_batch({"r": floats, "id": [1, 2], "k": text})
    assert same_rows(left, right)
    assert not same_rows(left, pa.record_batch({"r": floats, "id": [1, 3], "k": text}))


class CuttableProxy:
    """A TCP proxy on loopback in front of ``target`` (``host:port``) whose connections can be
    cut at once (:meth:`cut`: both sides closed), as a network partition cuts them while both
    processes live on; later connections are proxied again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.location = f"grpc://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return  # closed
            far = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            cut, self.sockets = self.sockets, []
        for s in cut:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_an_end_of_input_whose_putresult_was_lost_is_not_sent_twice(tmp_path: Path) -> None:
    """The sink's end-of-input marker reaches B, whose disk is slow (fault injection: the
    real store's commit of the marker waits 1 s); then the network between them is cut (a
    proxy closes the connection; both processes live on) before the PutResult. The retry must
    first wait until B has ended the old call (``stream.writer_wait``), then see that the
    writer ended, and not send a second end-of-input marker.

    timeline:  ids 1..10 (offset 0) ─ marker staged on B (offset 1) ─ connection cut ─ retry:
               writer_wait (B commits the marker, 1 s) ─ FlightInfo: ended at 1 ─ nothing sent
    """
    from flight_serve.flight.server import start_server

    with start_server(tmp_path / "b", pipelines=False) as service:
        store = service.store
        real_marker, real_commit = store.write_marker, store.commit
        markers: list[Any] = []

        def write_marker(*args: Any, **kwargs: Any) -> Any:
            pending = real_marker(*args, **kwargs)
            markers.append(pending)
            return pending

        def slow_commit(pending: Any) -> int:
            if any(pending is m for m in markers):
                time.sleep(1.0)
            return int(real_commit(pending))

        store.write_marker = write_marker  # type: ignore[method-assign]
        store.commit = slow_commit  # type: ignore[method-assign]
        proxy = CuttableProxy(("127.0.0.1", service.port))
        target = FlightStreamTarget(proxy.location, "relay", SCHEMA, "from-a")
        try:
            assert target.append_many(batches(1, 1)) == [0]
            target.committed()
            real_ack = target._acknowledged

            def cut_first() -> int:
                if not markers:  # the first marker: B has it, then the network is cut
                    deadline = time.monotonic() + 10
                    while not markers and time.monotonic() < deadline:
                        time.sleep(0.01)
                    assert markers, "B did not receive the marker"
                    proxy.cut()
                return int(real_ack())

            target._acknowledged = cut_first  # type: ignore[method-assign]
            target.end_input()
        finally:
            target.close()
            proxy.close()
        time.sleep(1.5)  # a second marker, if sent, is committed by now
        ends = [e.offset for e in store.entries("relay", 0) if e.end_of_input]
        assert ends == [1]
        assert store.writers("relay")["from-a"].ended_at == 1


def test_a_receiving_server_killed_mid_commit_of_direct_io_batches_gets_each_once(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    """An epoch of 12 batches of 40,000 rows (1.1 MiB each: B writes them with O_DIRECT), up
    to 8 sent ahead of their PutResults; B is ``kill -9``ed right after the 5th PutResult and
    restarted 0.3 s later on the same port and dir. The sink retries, reads back which of
    the batches in flight landed, sends only the others; then the run crashes after epoch 2's
    commit and the restore skips both epochs' batches there.

    timeline:  epoch 1: ids 1..480,000 ─ 5 acked ─ kill -9 B ─ restart B ─ the rest ─
               epoch 2: ids 480,001..560,000 ─ crash ─ recover(epoch 2) ─ nothing appended
    """
    b = servers["b"] = ServeProcess(tmp_path / "b", free_port())
    target = FlightStreamTarget(b.location, "relay", SCHEMA, "from-a")
    real = target.append_many
    acks = {"n": 0}

    def kill_b_after_the_5th(items: list[pa.RecordBatch], on_ack: Any = None) -> list[int]:
        def acked() -> None:
            acks["n"] += 1
            if acks["n"] == 5:
                b.kill()

                def restart() -> None:
                    time.sleep(0.3)
                    servers["b"] = ServeProcess(b.data, b.port)

                threading.Thread(target=restart).start()
            if on_ack is not None:
                on_ack()

        return list(real(items, acked))

    target.append_many = kill_b_after_the_5th  # type: ignore[method-assign]
    sink = EpochStreamSink("relay", target, SCHEMA)
    for batch in batches(1, 12, rows=40_000):
        sink.write(batch)
    sink.prepare(1, {})
    sink.commit(1)
    entry, files = commit_then_crash(sink, batches(480_001, 2, rows=40_000), 2)
    assert acks["n"] == 14

    sink = restored(servers["b"].location, entry, files)
    sink.close()
    assert sink.skipped == 2
    ids = [r["id"] for r in stream_rows(servers["b"].location, "relay")]
    assert ids == list(range(1, 560_001))


def test_a_read_back_longer_than_one_call_timeout_goes_on_from_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the sink's run was down, another writer (``c``) wrote 60 batches to the same
    stream of B; the restore reads everything after the commit mark back (every writer's
    entries, keeping its own), and that takes longer than one call's timeout (here 0.5 s for
    30 s: B is slow, 20 ms per entry). Each timed-out read goes on from the entry it stopped
    at: it started over from the mark every time, never finished, and the restore failed once
    its retry budget ran out (the run could never resume).

    offsets:  0..2 ids 1..30 (from-a, committed) │ 3..62 writer c │ crash ─ restore: read 0..62
    """
    import flight_serve.connectors.flight as flight_connector
    from flight_serve.flight.server import start_server

    monkeypatch.setattr(flight_connector, "CALL_TIMEOUT_S", 0.5)
    with start_server(tmp_path / "b", pipelines=False) as service:
        store = service.store

        def target() -> FlightStreamTarget:
            return FlightStreamTarget(service.location, "relay", SCHEMA, "from-a", retry_s=8)

        sink = EpochStreamSink("relay", target(), SCHEMA)
        entry, files = commit_then_crash(sink, batches(1, 3))
        for batch in batches(1001, 60):
            store.append("relay", batch, writer="c")
        real_entries = store.entries

        def slow_entries(*args: Any, **kwargs: Any) -> Iterator[Any]:
            for item in real_entries(*args, **kwargs):
                time.sleep(0.02)
                yield item

        store.entries = slow_entries  # type: ignore[method-assign]
        sink = EpochStreamSink(
            "relay", target(), SCHEMA, mark=entry["mark"], incarnation=entry["incarnation"]
        )
        try:
            sink.recover(read_ipc(files[entry["staged"]]))
            assert sink.skipped == 3
        finally:
            sink.close()
        store.entries = real_entries  # type: ignore[method-assign]
        rows = stream_rows(service.location, "relay")
        assert [r["id"] for r in rows] == list(range(1, 31)) + list(range(1001, 1601))


def test_a_fresh_sink_whose_writer_has_a_call_still_drained_sends_nothing_twice(
    tmp_path: Path,
) -> None:
    """A run (``--fresh``, or a pipeline submitted again) starts while B still writes the
    batches of the previous run's call of the same writer (the network to it was cut; B is
    slow, 0.2 s per batch). Its first commit loses the 1st PutResult (injected after the real
    read) and reads back which batches landed: it must look after the old call's batches,
    not from the stream end it saw when it started (it met the old call's ids 1..10 first,
    took its own batch for missing and sent ids 101..110 again).

    timeline:  old call: ids 1..50 sent, cut ─ fresh target (B has written 1 batch) ─ B writes
               those it received (a prefix) ─ ids 101..130: 1st PutResult lost ─ read back ─
               nothing resent
    """
    from flight_serve.flight.server import start_server

    with start_server(tmp_path / "b", pipelines=False) as service:
        store = service.store
        real_write = store.write

        def slow_write(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.2)
            return real_write(*args, **kwargs)

        store.write = slow_write  # type: ignore[method-assign]
        proxy = CuttableProxy(("127.0.0.1", service.port))
        old = FlightStreamTarget(proxy.location, "relay", SCHEMA, "from-a")
        writer = old._open()[0]
        for batch in batches(1, 5):
            writer.write_batch(batch)
        deadline = time.monotonic() + 10
        while store.info("relay").next_offset < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        proxy.cut()  # the old run is gone; B goes on writing what it received
        visible_at_cut = store.info("relay").next_offset
        old._drop()

        fresh = FlightStreamTarget(service.location, "relay", SCHEMA, "from-a")
        lose_first = {"done": False}
        real_ack = fresh._acknowledged

        def lose() -> int:
            offset = int(real_ack())
            if not lose_first["done"]:
                lose_first["done"] = True
                raise flight.FlightUnavailableError("PutResult lost (injected)")
            return offset

        fresh._acknowledged = lose  # type: ignore[method-assign]
        try:
            offsets = fresh.append_many(batches(101, 3))
            fresh.committed()
        finally:
            fresh.close()
            proxy.close()
        store.write = real_write  # type: ignore[method-assign]
        ids = [r["id"] for r in stream_rows(service.location, "relay")]
        landed = sum(1 for i in ids if i < 100) // 10  # the old call's batches B wrote
        assert visible_at_cut < landed  # B was still writing them when the fresh run began
        assert offsets == [landed, landed + 1, landed + 2]
        assert ids == list(range(1, 10 * landed + 1)) + list(range(101, 131))
