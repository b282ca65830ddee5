"""Remote ``flight`` connectors against real servers: the exactly-once stream
sink into another flight-serve (:class:`FlightStreamTarget` under a checkpointed run), its retry
rules, the at-least-once rule into a plain Flight server, and the bounded ticket source.

Every server is real: flight-serve in-process (``start_server``), or a plain
``pyarrow.flight.FlightServerBase`` that keeps what it is sent in memory and serves tickets.
Faults are injected by wrapping the real objects (a PutResult read, then the call raises).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from flight_serve.connectors.flight import FlightStreamTarget, FlightTicketSource
from flight_serve.errors import CheckpointError, ConnectorError, RemoteFlightError
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve.pipelines.durable import DurableRuntime, PipelineStopped
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime
from flight_serve_client import FlightServeClient

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("t", pa.timestamp("s"))])


def batch(first: int, count: int) -> pa.RecordBatch:
    """Rows ``first .. first + count - 1``: id, k = 'a'/'b' by parity, t = id seconds."""
    ids = list(range(first, first + count))
    return pa.RecordBatch.from_pydict(
        {"id": ids, "k": ["ab"[i % 2] for i in ids], "t": ids}, schema=SCHEMA
    )


def lose_put_result(target: FlightStreamTarget, nth: int, message: str) -> None:
    """Make the ``nth`` PutResult the sink reads fail after the real read (the batch is stored
    and acknowledged by the server; the sink sees UNAVAILABLE instead)."""
    real = target._acknowledged
    calls = {"n": 0}

    def lose() -> int:
        offset = real()
        calls["n"] += 1
        if calls["n"] == nth:
            raise flight.FlightUnavailableError(message)
        return offset

    target._acknowledged = lose  # type: ignore[method-assign]


def read_stream(location: str, stream: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with flight.connect(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
        table = client.do_get(info.endpoints[0].ticket).read_all()
    return table.to_pylist(), json.loads(info.app_metadata)


@pytest.fixture
def server(start_flight_server: Callable[..., FlightServeService]) -> str:
    """The location of a server without pipelines (only its streams are under test)."""
    return start_flight_server(pipelines=False).location


class PlainServer(flight.FlightServerBase):  # type: ignore[misc]
    """A Flight server that is not flight-serve: DoPut appends to ``received[path]`` (no
    PutResult, no FlightInfo metadata); DoGet serves ``tickets[ticket]`` and, while
    ``cut_after`` is set, fails with UNAVAILABLE after that many batches (once per setting)."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.received: dict[str, list[pa.RecordBatch]] = {}
        self.tickets: dict[bytes, pa.Table] = {}
        self.cut_after: int | None = None
        self.gets = 0

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        key = "/".join(p.decode() for p in descriptor.path)
        for chunk in reader:
            if chunk.data is not None and chunk.data.num_rows:
                self.received.setdefault(key, []).append(chunk.data)

    def get_flight_info(self, context: Any, descriptor: Any) -> flight.FlightInfo:
        raise flight.FlightServerError("no FlightInfo here")

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        table = self.tickets[ticket.ticket]
        self.gets += 1
        cut, self.cut_after = self.cut_after, None
        batches = table.to_batches(max_chunksize=10)

        def generate() -> Iterator[pa.RecordBatch]:
            for i, b in enumerate(batches):
                if cut is not None and i == cut:
                    raise flight.FlightUnavailableError("connection lost (injected)")
                yield b

        return flight.GeneratorStream(table.schema, generate())


@pytest.fixture
def plain() -> Iterator[PlainServer]:
    server = PlainServer()
    try:
        yield server
    finally:
        server.shutdown()


# --- the exactly-once sink's target -------------------------------------------------------


def test_a_lost_put_result_is_looked_up_not_written_again(server: str) -> None:
    """The server stores batch 2 and sends its PutResult, but the call fails before the sink
    reads it (injected after the real read): the retry finds the batch in the writer's entries
    and returns its offset; the stream holds every batch once."""
    target = FlightStreamTarget(server, "out", SCHEMA, "sink-1", retry_s=10)
    lose_put_result(target, 2, "PutResult lost (injected)")
    offsets = [target.append(batch(i * 10, 10)) for i in range(3)]
    target.end_input()
    target.end_input()  # once only: the history says the writer ended
    target.close()
    assert offsets == [0, 1, 2]
    rows, metadata = read_stream(server, "out")
    assert [r["id"] for r in rows] == list(range(30))
    assert metadata["writers"] == {
        "sink-1": {"first_offset": 0, "last_offset": 3, "watermark_ns": None, "ended_at": 3}
    }
    assert target.exactly_once


def test_a_pipelined_commit_that_loses_a_put_result_resends_only_what_did_not_land(
    server: str,
) -> None:
    """``append_many`` sends up to 8 batches ahead of their PutResults. The call fails right
    after the 3rd PutResult is read (injected after the real read): batches 4.. may have landed
    too. The read-back counts those that did (a prefix, in order) and sends only the rest; the
    stream holds the 12 batches once, at offsets 0..11, and on_ack ran once per batch."""
    target = FlightStreamTarget(server, "out", SCHEMA, "sink-1", retry_s=10)
    lose_put_result(target, 3, "connection lost (injected)")
    acks: list[int] = []
    offsets = target.append_many([batch(i * 10, 10) for i in range(12)], lambda: acks.append(1))
    target.committed()
    target.close()
    assert offsets == list(range(12))
    assert len(acks) == 12
    rows, metadata = read_stream(server, "out")
    assert [r["id"] for r in rows] == list(range(120))
    assert metadata["next_offset"] == 12


def test_appends_wait_for_a_server_that_restarts(tmp_path: Path) -> None:
    """The server shuts down between two commits and comes back on the same port and data dir
    0.5 s later: the next append waits (retried with backoff) and lands once."""
    with start_server(tmp_path / "data", pipelines=False) as service:
        port = service.port
        target = FlightStreamTarget(service.location, "out", SCHEMA, "w", retry_s=20)
        assert target.append(batch(0, 5)) == 0
        target.committed()  # the end of a commit: no call stays open to hold up the shutdown
    restarted: list[Any] = []

    def restart() -> None:
        time.sleep(0.5)
        context = start_server(tmp_path / "data", port=port, pipelines=False)
        restarted.append((context, context.__enter__()))

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        started = time.monotonic()
        assert target.append(batch(5, 5)) == 1  # sent while the server is down
        assert time.monotonic() - started >= 0.4
        thread.join()
        rows, _ = read_stream(restarted[0][1].location, "out")
        assert [r["id"] for r in rows] == list(range(10))
    finally:
        thread.join()
        target.close()
        if restarted:
            restarted[0][0].__exit__(None, None, None)


def test_an_unreachable_server_fails_after_the_retry_budget() -> None:
    started = time.monotonic()
    with pytest.raises(RemoteFlightError, match=r"stayed unreachable for 0.5 s"):
        FlightStreamTarget("grpc://127.0.0.1:1", "out", SCHEMA, "w", retry_s=0.5)
    assert time.monotonic() - started < 10


def test_a_refused_doput_is_not_retried(server: str) -> None:
    """Another schema is INVALID_ARGUMENT: a ConnectorError at once, naming the sink."""
    with flight.connect(server) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("taken"), SCHEMA)
        writer.write_batch(batch(0, 1))
        reader.read()
        writer.close()
    other = pa.schema([("x", pa.float64())])
    started = time.monotonic()

    def open_and_append() -> None:  # the server may refuse at the DoPut's start or its batch
        target = FlightStreamTarget(server, "taken", other, "w", retry_s=30)
        target.append(pa.RecordBatch.from_pydict({"x": [1.0]}, schema=other))

    with pytest.raises(ConnectorError, match=r"flight sink \(server .*stream 'taken'.*failed"):
        open_and_append()
    assert time.monotonic() - started < 5  # not retried


# --- checkpointed runs with a remote sink -------------------------------------------------

PIPELINE = """
SET checkpoint_every = 1;
SET checkpoint_retain = 100;
CREATE SOURCE events (WATERMARK FOR t AS t - INTERVAL '1' SECOND)
WITH (connector = 'file', path = '{path}', batch_rows = '10');
CREATE SINK out WITH (connector = 'flight', server = '{server}', stream = 'out', writer = 'run');
INSERT INTO out SELECT id, k, t FROM events WHERE id % 3 <> 0;
"""


def test_a_checkpointed_run_resumed_from_an_old_checkpoint_writes_nothing_twice(
    server: str, tmp_path: Path
) -> None:
    """``flight-serve run`` (a DurableRuntime without a store) with a remote sink: 80 rows in 8
    file batches, a checkpoint after every batch (each commits one batch to the stream). A
    second run resumed from checkpoint 3 replays batches 4..8: the sink reads its writer's
    batches back from checkpoint 3's mark and skips every replayed one. The stream holds the
    filtered rows once, and the writer ended once."""
    pq.write_table(pa.Table.from_batches([batch(0, 80)]), tmp_path / "events.parquet")
    sql = PIPELINE.format(path=tmp_path / "events.parquet", server=server)
    state = str(tmp_path / "state")

    def run(resume: Any) -> DurableRuntime:
        runtime = DurableRuntime(
            parse_pipeline(sql), name="remote", state_root=state, resume=resume
        )
        list(runtime.run())
        return runtime

    run("fresh")
    rows, _ = read_stream(server, "out")
    want = [i for i in range(80) if i % 3]
    assert [r["id"] for r in rows] == want
    again = run(3)
    rows, metadata = read_stream(server, "out")
    assert [r["id"] for r in rows] == want
    assert again.resumed_from == 3
    sink = again._txn["out"]
    # checkpoint 3's staged batch (committed again on restore) and the replayed batches of
    # epochs 4..8 (ids 30..79) were all in the stream already
    assert sink.skipped == 6
    assert metadata["writers"]["run"]["ended_at"] == metadata["next_offset"] - 1


def test_a_plain_flight_server_gets_every_row_at_least_once(
    plain: PlainServer, tmp_path: Path
) -> None:
    """Into a Flight server that is not flight-serve the sink cannot read back: each append is
    one finished DoPut (``path = [stream, writer]``), all rows arrive, and a replay from an
    old checkpoint sends its batches again (at-least-once, as documented)."""
    pq.write_table(pa.Table.from_batches([batch(0, 40)]), tmp_path / "events.parquet")
    location = f"grpc://127.0.0.1:{plain.port}"
    sql = PIPELINE.format(path=tmp_path / "events.parquet", server=location)
    state = str(tmp_path / "state")
    list(DurableRuntime(parse_pipeline(sql), name="p", state_root=state, resume="fresh").run())
    got = [r["id"] for b in plain.received["out/run"] for r in b.to_pylist()]
    want = [i for i in range(40) if i % 3]
    assert got == want
    runtime = DurableRuntime(parse_pipeline(sql), name="p", state_root=state, resume=2)
    list(runtime.run())
    got = [r["id"] for b in plain.received["out/run"] for r in b.to_pylist()]
    # checkpoint 2's staged batch (ids 10..19, committed again on restore) and the replayed
    # batches 3..4 (ids 20..39) arrive a second time
    assert got == want + [i for i in range(10, 40) if i % 3]
    assert plain.received.keys() == {"out/run"}


# --- the ticket source --------------------------------------------------------------------

TICKET_PIPELINE = """{settings}
CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(0),
                      WATERMARK FOR t AS t - INTERVAL '1' SECOND)
WITH (connector = 'flight', server = '{server}', {ticket});
CREATE SINK counts WITH (connector = 'stdout');
INSERT INTO counts
SELECT k, window_start, count(*) AS n, sum(id) AS total
FROM TUMBLE(events, t, INTERVAL '20' SECOND) GROUP BY k, window_start;
"""


def counts_of(ids: range) -> list[dict[str, Any]]:
    """The expected TUMBLE(20 s) counts per k over rows with these ids (t = id s)."""
    out: dict[tuple[str, int], list[int]] = {}
    for i in ids:
        out.setdefault(("ab"[i % 2], i // 20 * 20), []).append(i)
    return [
        {"k": k, "start": start, "n": len(v), "total": sum(v)}
        for (k, start), v in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]


def collected(runtime: PipelineRuntime) -> list[dict[str, Any]]:
    rows = [r for _, b in runtime.run(write=False, collect=True) for r in b.to_pylist()]
    return sorted(
        (
            {"k": r["k"], "start": int(r["window_start"].timestamp()), "n": r["n"],
             "total": r["total"]}
            for r in rows
        ),
        key=lambda r: (r["start"], r["k"]),
    )


def test_a_ticket_source_reads_a_plain_servers_doget_and_survives_a_cut(
    plain: PlainServer,
) -> None:
    """The plain server serves ticket ``events`` (100 rows in 10 batches) and cuts the first
    DoGet after 4 batches (UNAVAILABLE): the source opens it again and skips the 40 rows it
    handed out; the windows are those of the 100 rows, each row once."""
    plain.tickets[b"events"] = pa.Table.from_batches([batch(0, 100)])
    plain.cut_after = 4
    location = f"grpc://127.0.0.1:{plain.port}"
    sql = TICKET_PIPELINE.format(settings="", server=location, ticket="ticket = 'events'")
    runtime = PipelineRuntime(parse_pipeline(sql))
    assert collected(runtime) == counts_of(range(100))
    assert plain.gets == 2  # the cut DoGet (it also gave the schema), the one that finished


def test_a_ticket_source_takes_a_flight_serve_ticket_in_base64_and_resumes_from_its_rows(
    server: str, tmp_path: Path, stop_after: Any
) -> None:
    """A flight-serve stream-range ticket (GetFlightInfo's endpoint), given as ticket_base64, in
    a checkpointed run that checkpoints after every batch and is stopped after the third: the
    resumed run skips the rows its checkpoint counted and the windows equal a straight run's."""
    with flight.connect(server) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("src"), SCHEMA)
        for i in range(6):
            writer.write_batch(batch(i * 10, 10))
            reader.read()
        writer.close()
        info = client.get_flight_info(flight.FlightDescriptor.for_path("src"))
    ticket = base64.b64encode(info.endpoints[0].ticket.ticket).decode()
    sql = TICKET_PIPELINE.format(
        settings="SET checkpoint_every = 1;",
        server=server,
        ticket=f"ticket_base64 = '{ticket}'",
    ).replace(
        "CREATE SINK counts WITH (connector = 'stdout');",
        f"CREATE SINK counts WITH (connector = 'file', path = '{tmp_path / 'counts.parquet'}');",
    )
    state = str(tmp_path / "state")
    first = DurableRuntime(parse_pipeline(sql), name="t", state_root=state, resume="fresh")
    source = first.flight_sources["events"]
    assert isinstance(source, FlightTicketSource)
    assert "one DoGet, bounded; offset = rows handed out" in first.explain()
    stop_after(first, source, 3)
    real_poll = source.poll
    # one batch per poll (the runtime passes only the timeout), so a barrier follows each batch
    source.poll = lambda timeout_s, max_entries=64: real_poll(timeout_s, 1)  # type: ignore[method-assign]
    with pytest.raises(PipelineStopped):
        list(first.run())
    second = DurableRuntime(parse_pipeline(sql), name="t", state_root=state)
    assert second.resumed_from is not None
    resumed = second.flight_sources["events"]
    assert isinstance(resumed, FlightTicketSource)
    assert resumed.start_offset == 30  # rows handed out before the stop
    list(second.run())
    table = pq.read_table(tmp_path / "counts.parquet").to_pylist()
    got = sorted(
        (
            {"k": r["k"], "start": int(r["window_start"].timestamp()), "n": r["n"],
             "total": r["total"]}
            for r in table
        ),
        key=lambda r: (r["start"], r["k"]),
    )
    assert got == counts_of(range(60))


def test_ticket_options_are_checked(server: str) -> None:
    both = TICKET_PIPELINE.format(settings="", server=server, ticket="ticket = 'x', ticket_base64 = 'eA=='")
    with pytest.raises(Exception, match="give ticket or ticket_base64, not both"):
        PipelineRuntime(parse_pipeline(both))
    bad = TICKET_PIPELINE.format(settings="", server=server, ticket="ticket_base64 = '***'")
    with pytest.raises(Exception, match="not base64"):
        PipelineRuntime(parse_pipeline(bad))
    mixed = TICKET_PIPELINE.format(settings="", server=server, ticket="ticket = 'x', stream = 'y'")
    with pytest.raises(Exception, match="a ticket source takes no stream"):
        PipelineRuntime(parse_pipeline(mixed))



# --- the Python client's follow tail ------------------------------------------------------


def test_a_follow_tail_outlives_a_server_restart(tmp_path: Path) -> None:
    """``FlightServeClient.tail(..., follow=True)``: batches 0..1, then the server shuts down
    cleanly (its tails end) and comes back on the same port and data dir; batches 2..3 appended
    after the restart are yielded next, each once; dropping the stream ends the iterator."""
    data = tmp_path / "data"
    with start_server(data, pipelines=False) as service:
        port, location = service.port, service.location
        with FlightServeClient(location) as writer:
            writer.put("s", pa.Table.from_batches([batch(0, 3)]))
            writer.put("s", pa.Table.from_batches([batch(3, 3)]))
    got: list[tuple[int, list[int]]] = []
    errors: list[BaseException] = []
    client = FlightServeClient(location)

    def follow() -> None:
        try:
            for offset, b in client.tail("s", follow=True):
                got.append((offset, b.column("id").to_pylist()))
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=follow)
    with start_server(data, port=port, pipelines=False):
        thread.start()
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    # the server is down here: the tail ended on the server's side, the client waits
    with start_server(data, port=port, pipelines=False):
        with FlightServeClient(location) as writer:
            writer.put("s", pa.Table.from_batches([batch(6, 3)]))
            writer.put("s", pa.Table.from_batches([batch(9, 3)]))
            deadline = time.monotonic() + 15
            while len(got) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            writer.drop("s")
        thread.join(15)
    client.close()
    assert not thread.is_alive()
    assert not errors, errors
    assert got == [(0, [0, 1, 2]), (1, [3, 4, 5]), (2, [6, 7, 8]), (3, [9, 10, 11])]


# --- a remote tail source's offset in checkpoints -------------------------------------------

TAIL_PIPELINE = """
SET checkpoint_every = 1;
CREATE SOURCE src (id BIGINT, k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t)
WITH (connector = 'flight', server = '{server}', stream = 'src');
CREATE SINK out WITH (connector = 'file', path = '{path}');
INSERT INTO out SELECT id FROM src;
"""


def put(location: str, stream: str, *items: pa.RecordBatch, end: bool = False) -> None:
    with flight.connect(location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path(stream, "w1"), SCHEMA)
        for item in items:
            writer.write_batch(item)
            reader.read()
        if end:
            writer.write_metadata(pa.py_buffer(b'{"end_of_input": true}'))
            reader.read()
        writer.close()


def test_a_remote_tail_resumes_from_its_offset_and_a_recreated_stream_is_refused_or_reset(
    server: str, tmp_path: Path, stop_after: Any
) -> None:
    """A checkpointed run tails stream ``src`` of another server (ids 0..29, 3 entries) and is
    stopped after 3 batches (its checkpoint holds offset 3 and the stream's incarnation). The
    stream is then dropped and re-created (ids 100..119, then end of input): the restore is
    refused (the offset names nothing); with ``offset_reset = 'earliest'`` the new stream is
    read from its start, the gap is reported, and the output holds 0..29 then 100..119."""
    put(server, "src", batch(0, 10), batch(10, 10), batch(20, 10))
    sql = TAIL_PIPELINE.format(server=server, path=tmp_path / "out.parquet")
    state = str(tmp_path / "state")
    first = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state, resume="fresh")
    source = first.flight_sources["src"]
    stop_after(first, source, 3)
    with pytest.raises(PipelineStopped):
        list(first.run())
    manifest = first.checkpoints.latest()
    assert manifest is not None
    assert manifest.sources["src"]["offset"] == 3
    with flight.connect(server) as client:
        list(client.do_action(flight.Action("stream.drop", b'{"stream": "src"}')))
    put(server, "src", batch(100, 10), batch(110, 10), end=True)
    with pytest.raises(CheckpointError, match=r"dropped or re-created since the checkpoint"):
        DurableRuntime(parse_pipeline(sql), name="tail", state_root=state)
    plan = parse_pipeline(sql)
    options = replace(plan.run_options, offset_reset="earliest")
    second = DurableRuntime(plan, name="tail", state_root=state, options=options)
    list(second.run())
    assert second.resumed_from == manifest.epoch
    assert len(second.gaps) == 1
    assert "resuming at 0 (offset_reset = 'earliest')" in second.gaps[0]
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == list(range(30)) + list(range(100, 120))


def test_a_read_back_waits_for_an_earlier_doput_of_the_writer(server: str) -> None:
    """``stream.writer_wait``: while a DoPut of writer ``sink-1`` is in progress (a call whose
    client died is still drained by the server), the action reports it active; the sink's
    read-back waits until it ended, so it sees the call's last batch and never sends it
    again."""
    with flight.connect(server) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("out", "sink-1"), SCHEMA)
        writer.write_batch(batch(0, 5))
        reader.read()
        body = json.dumps({"stream": "out", "writer": "sink-1", "timeout_s": 0.2}).encode()
        (result,) = client.do_action(flight.Action("stream.writer_wait", body))
        assert json.loads(result.body.to_pybytes()) == {"active": 1}

        def finish_later() -> None:
            time.sleep(0.5)
            writer.write_batch(batch(5, 5))  # the old call's last batch, written late
            writer.done_writing()
            writer.close()

        late = threading.Thread(target=finish_later)
        late.start()
        started = time.monotonic()
        # the sink waits from the start (its first stream end is read after the old call)
        target = FlightStreamTarget(server, "out", SCHEMA, "sink-1", retry_s=20)
        found = [(offset, b.column("id").to_pylist()) for offset, b in target.entries(0)]
        late.join()
        assert time.monotonic() - started >= 0.4
        assert found == [(0, [0, 1, 2, 3, 4]), (1, [5, 6, 7, 8, 9])]
        (result,) = client.do_action(flight.Action("stream.writer_wait", body))
        assert json.loads(result.body.to_pybytes()) == {"active": 0}
    target.close()


def test_a_resumed_sink_whose_earlier_call_was_still_draining_resends_nothing_that_landed(
    server: str,
) -> None:
    """The sink of a restarted run connects while its dead run's DoPut is still being drained
    by the server (batch 0 stored, batch 1 still to come). It skips both (the read-back waits
    for the old call), then appends batch 2 and loses the PutResult after the batch landed
    (injected after the real read). The retry must find batch 2 and not send it again: it
    reads from the stream's end after the old call, not from the end seen while it was still
    writing (offset 1: batch 1 there is not batch 2, so the sink resent batch 2).

    timeline:  old call: b0 ─────────── b1, ends
               sink:        connects │ read-back (waits) │ append b2 ─ PutResult lost ─ retry
    """
    with flight.connect(server) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("out", "sink-1"), SCHEMA)
        writer.write_batch(batch(0, 5))
        reader.read()

        def finish_later() -> None:
            time.sleep(0.5)
            writer.write_batch(batch(5, 5))  # the old call's last batch, written late
            writer.done_writing()
            writer.close()

        late = threading.Thread(target=finish_later)
        late.start()
        try:
            # the sink connects while the old call is in progress (it waits for it)
            target = FlightStreamTarget(server, "out", SCHEMA, "sink-1", retry_s=20)
            found = [(offset, b.column("id").to_pylist()) for offset, b in target.entries(0)]
        finally:
            late.join()
    assert found == [(0, [0, 1, 2, 3, 4]), (1, [5, 6, 7, 8, 9])]
    lose_put_result(target, 1, "PutResult lost (injected)")
    offsets = target.append_many([batch(10, 5)])
    target.committed()
    target.close()
    assert offsets == [2]
    rows, metadata = read_stream(server, "out")
    assert [r["id"] for r in rows] == list(range(15))
    assert metadata["next_offset"] == 3
