"""A remote ``flight`` tail source whose server is down when the pipeline starts: the
submit returns, the pipeline says in ``pipeline.status`` (``waiting``) that its source
waits for the server, and once the server comes up every row arrives exactly once. The same when
the pipeline's own server restarts (it resumes from its checkpoint) while the source's is down.
The wait is bounded (the retry budget; then the run fails naming the server), a cancel ends it
at once, and what is not "unreachable" (no columns to wait with, a TLS handshake) fails at once.

B is the source's server (a real flight-serve, in-process, started late on a reserved port);
A runs the pipeline and keeps its output in its own stream ``out``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from flight_serve.connectors.flight import FlightSource
from flight_serve.errors import CheckpointError, ConnectorError, RemoteFlightError
from flight_serve.flight.server import start_server
from flight_serve.pipelines.durable import DurableRuntime, PipelineStopped
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve_client import FlightServeClient
from helpers import ID_TIMES as SCHEMA
from helpers import act, free_port, wait_until
from helpers import id_rows as rows

pytestmark = pytest.mark.integration



def out_ids(client: flight.FlightClient) -> list[int]:
    """The ids in A's stream ``out``, in stream order ([] before it exists)."""
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("out"))
    except pa.ArrowKeyError:
        return []
    return list(client.do_get(info.endpoints[0].ticket).read_all()["id"].to_pylist())


def pipeline_sql(port: int) -> str:
    return f"""SET checkpoint_interval = '200ms';
CREATE SOURCE events (id BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t)
WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}', stream = 'events');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT id, t FROM events;"""


def waiting_prefix(port: int) -> str:
    return (
        f"flight connector (server grpc://127.0.0.1:{port}, stream 'events'): reading the "
        "stream's FlightInfo: the server is unreachable for "
    )


def status(client: flight.FlightClient, pid: str) -> dict[str, Any]:
    return dict(act(client, "pipeline.status", {"id": pid}))


def test_a_submitted_pipeline_waits_for_its_source_server_and_reads_every_row_once(
    tmp_path: Path,
) -> None:
    # 0 s   A: submit (source -> B's port, nothing listening): returns at once, state running
    # ~0.1s A's status: waiting = "flight connector (server …, stream 'events'): reading the
    #       stream's FlightInfo: the server is unreachable for N s, retrying …"
    # ~0.5s B starts on that port; ids 0..49, then 50..99 into B's events (writer w)
    #       A's out: ids 0..99 once, in order; A's status: waiting = None
    port = free_port()
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        started = time.monotonic()
        pid = act(client, "pipeline.submit", {"sql": pipeline_sql(port)})["id"]
        assert time.monotonic() - started < 5.0  # the submit did not wait for B
        wait_until(
            lambda: (status(client, pid)["waiting"] or "").startswith(waiting_prefix(port)),
            "the status to say what the source waits for",
        )
        now = status(client, pid)
        assert (now["state"], now["last_error"]) == ("running", None)
        assert "s, retrying (" in now["waiting"]
        assert "of up to 60 s): " in now["waiting"]  # the checkpointed run's budget
        with start_server(tmp_path / "b", port=port) as b:
            with FlightServeClient(b.location) as fs:
                fs.put("events", rows(0, 50), writer="w")
                fs.put("events", rows(50, 50), writer="w")
            wait_until(lambda: len(out_ids(client)) >= 100, "100 rows in A's out")
            assert act(client, "pipeline.checkpoint", {"id": pid})["completed"] is True
            assert out_ids(client) == list(range(100))  # every row once, in order
            now = status(client, pid)
            assert (now["state"], now["waiting"], now["last_error"]) == ("running", None, None)
        # pipeline.logs: the wait began once and ended once
        lines = act(client, "pipeline.logs", {"id": pid})["lines"]
        waits = [(m["level"], m["message"]) for m in lines if m["message"] != "submitted"]
        assert len(waits) == 2
        assert waits[0][0] == "warning"
        assert waits[0][1].startswith("waiting: " + waiting_prefix(port))
        assert waits[1] == ("info", "going on")


def test_a_pipeline_resumed_while_its_source_server_is_down_waits_and_goes_on(
    tmp_path: Path,
) -> None:
    # A1: B up; submit; ids 0..49 in B -> A's out 0..49; checkpoint; B stops; A stops
    # A2: A restarts, resumes from its checkpoint with B down: waiting (the source's server)
    #     B restarts on the same port (same data); ids 50..99 into B
    #     A's out: ids 0..99 once, in order
    port = free_port()
    with start_server(tmp_path / "b", port=port) as b:
        with FlightServeClient(b.location) as fs:
            fs.put("events", rows(0, 50), writer="w")
        with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
            pid = act(client, "pipeline.submit", {"sql": pipeline_sql(port)})["id"]
            wait_until(lambda: len(out_ids(client)) >= 50, "50 rows in A's out")
            assert act(client, "pipeline.checkpoint", {"id": pid})["completed"] is True
            assert out_ids(client) == list(range(50))
    # both servers are down; A comes back first
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        wait_until(
            lambda: (status(client, pid)["waiting"] or "").startswith(waiting_prefix(port)),
            "the resumed pipeline to say what its source waits for",
        )
        now = status(client, pid)
        assert (now["state"], now["last_error"]) == ("running", None)
        with start_server(tmp_path / "b", port=port) as b:
            with FlightServeClient(b.location) as fs:
                fs.put("events", rows(50, 50), writer="w")
            wait_until(lambda: len(out_ids(client)) >= 100, "100 rows in A's out")
            assert act(client, "pipeline.checkpoint", {"id": pid})["completed"] is True
            assert out_ids(client) == list(range(100))  # 0..49 not read twice
            now = status(client, pid)
            assert (now["state"], now["waiting"], now["last_error"]) == ("running", None, None)


def test_the_wait_for_a_source_server_is_bounded_and_names_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the retry budget made 1 s: 0 s submit (B never starts); ~1 s the run fails, naming B
    import flight_serve.pipelines.durable as durable

    monkeypatch.setattr(durable, "RETRY_BUDGET_S", 1.0)
    port = free_port()
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        pid = act(client, "pipeline.submit", {"sql": pipeline_sql(port)})["id"]
        wait_until(lambda: status(client, pid)["state"] == "failed", "the run to fail")
        now = status(client, pid)
        assert now["waiting"] is None
        assert now["last_error"].startswith(
            f"flight connector (server grpc://127.0.0.1:{port}, stream 'events'): reading the "
            "stream's FlightInfo failed: the server stayed unreachable for 1 s ("
        )
        assert "Connection refused" in now["last_error"]


def test_a_pipeline_waiting_for_its_source_server_is_cancelled_at_once(tmp_path: Path) -> None:
    # 0 s submit (B down); waiting; cancel: done within a poll, not after the 60 s budget
    port = free_port()
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        pid = act(client, "pipeline.submit", {"sql": pipeline_sql(port)})["id"]
        wait_until(lambda: status(client, pid)["waiting"] is not None, "the source's wait")
        started = time.monotonic()
        assert act(client, "pipeline.cancel", {"id": pid}) == {"id": pid, "state": "cancelled"}
        assert time.monotonic() - started < 3.0
        assert status(client, pid)["waiting"] is None


def test_a_source_without_columns_is_refused_when_its_server_stays_down() -> None:
    # no declared columns: the pipeline cannot be planned without the stream's schema; the
    # server gets OPEN_RETRY_S (5 s), then the source is refused saying what to do
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RemoteFlightError) as caught:
        FlightSource(f"grpc://127.0.0.1:{port}", "events")
    assert 4.5 < time.monotonic() - started < 15.0
    message = str(caught.value)
    assert message.startswith(
        f"flight connector (server grpc://127.0.0.1:{port}, stream 'events'): reading the "
        "stream's FlightInfo failed: the server stayed unreachable for 5 s ("
    )
    assert message.endswith(
        "; declare the source's columns to let the pipeline wait for the server"
    )


def test_a_tls_handshake_failure_is_not_waited_for() -> None:
    # grpc+tls to a server without TLS: gRPC says UNAVAILABLE, but it is no outage
    server = flight.FlightServerBase("grpc://127.0.0.1:0")
    try:
        started = time.monotonic()
        with pytest.raises(ConnectorError) as caught:
            FlightSource(f"grpc+tls://127.0.0.1:{server.port}", "events", schema=SCHEMA)
        assert time.monotonic() - started < 3.0
        message = str(caught.value)
        assert message.startswith(
            f"flight connector (server grpc+tls://127.0.0.1:{server.port}, stream 'events'): "
        )
        assert "handshake failed" in message.lower()
    finally:
        server.shutdown()


TAIL_PIPELINE = """
SET checkpoint_every = 1;
CREATE SOURCE src (id BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t)
WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}', stream = 'src');
CREATE SINK out WITH (connector = 'file', path = '{path}');
INSERT INTO out SELECT id FROM src;
"""


def put(location: str, *tables: pa.Table, end: bool = False) -> None:
    with FlightServeClient(location) as fs:
        for table in tables:
            fs.put("src", table, writer="w1", end_input=end and table is tables[-1])


def run_in_thread(runtime: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def main() -> None:
        try:
            list(runtime.run())
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    return thread, errors


def test_a_resume_checked_once_the_source_server_is_back(
    tmp_path: Path, stop_after: Any
) -> None:
    """The restore checks of a remote tail (the stream's incarnation, the offset kept) run once
    the source reaches its server when it was down at the resume.

    B up: src = ids 0..29 (3 entries, writer w1); run 1 stops after 3 batches (offset 3).
    B: src dropped and re-created (ids 100..119, end of input); B stops.
    run 2 (B down): made at once, waits; B starts: the run fails (re-created stream).
    run 3 (B down, offset_reset = 'earliest'): waits (connector_waiting says why); B starts:
    the new stream from offset 0, the gap reported; out = 0..29 then 100..119."""
    port = free_port()
    data = tmp_path / "b"
    sql = TAIL_PIPELINE.format(port=port, path=tmp_path / "out.parquet")
    state = str(tmp_path / "state")
    with start_server(data, port=port, pipelines=False) as b:
        put(b.location, rows(0, 10), rows(10, 10), rows(20, 10))
        first = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state, resume="fresh")
        source = first.flight_sources["src"]
        stop_after(first, source, 3)
        with pytest.raises(PipelineStopped):
            list(first.run())
        with flight.connect(b.location) as client:
            list(client.do_action(flight.Action("stream.drop", b'{"stream": "src"}')))
        put(b.location, rows(100, 10), rows(110, 10), end=True)
    manifest = first.checkpoints.latest()
    assert manifest is not None
    assert manifest.sources["src"]["offset"] == 3

    second = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state)
    thread, errors = run_in_thread(second)
    wait_until(lambda: second.connector_waiting is not None, "run 2 to wait for B")
    with start_server(data, port=port, pipelines=False):
        thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], CheckpointError)
    assert str(errors[0]).startswith(
        f"source src (stream 'src' on grpc://127.0.0.1:{port}): the stream was dropped or "
        "re-created since the checkpoint (incarnation "
    )

    plan = parse_pipeline(sql)
    options = replace(plan.run_options, offset_reset="earliest")
    third = DurableRuntime(plan, name="tail", state_root=state, options=options)
    thread, errors = run_in_thread(third)
    wait_until(
        lambda: (third.connector_waiting or "").startswith(
            f"flight connector (server grpc://127.0.0.1:{port}, stream 'src'): reading the "
            "stream's FlightInfo: the server is unreachable for "
        ),
        "run 3 to wait for B",
    )
    with start_server(data, port=port, pipelines=False):
        thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    assert third.resumed_from == manifest.epoch
    assert third.connector_waiting is None
    assert len(third.gaps) == 1
    assert "resuming at 0 (offset_reset = 'earliest')" in third.gaps[0]
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == list(range(30)) + list(range(100, 120))


def test_a_checkpoint_taken_while_the_source_waits_keeps_the_streams_incarnation(
    tmp_path: Path,
    stop_after: Any,
) -> None:
    # run 1 (B up): ids 0..9, stopped: its checkpoint holds offset 1 and src's incarnation X
    # run 2 (B down): resumed, waits; stopped while waiting: its checkpoint holds offset 1 and
    #   X still (with no incarnation a later restore could not see that src was re-created)
    port = free_port()
    sql = TAIL_PIPELINE.format(port=port, path=tmp_path / "out.parquet")
    state = str(tmp_path / "state")
    with start_server(tmp_path / "b", port=port, pipelines=False) as b:
        put(b.location, rows(0, 10))
        first = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state, resume="fresh")
        source = first.flight_sources["src"]
        stop_after(first, source, 1)
        with pytest.raises(PipelineStopped):
            list(first.run())
    before = first.checkpoints.latest()
    assert before is not None
    incarnation = before.sources["src"]["incarnation"]
    assert isinstance(incarnation, str)
    assert before.sources["src"]["offset"] == 1

    second = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state)
    thread, errors = run_in_thread(second)
    wait_until(lambda: second.connector_waiting is not None, "run 2 to wait for B")
    second.request_stop()
    thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], PipelineStopped)
    after = second.checkpoints.latest()
    assert after is not None
    assert after.epoch > before.epoch
    assert after.sources["src"]["offset"] == 1
    assert after.sources["src"]["incarnation"] == incarnation


#: a source declaring column k, which the events put on B (id, t) do not have
MISSING_K_PIPELINE = """SET checkpoint_interval = '200ms';
CREATE SOURCE events (id BIGINT, t TIMESTAMP(3), k VARCHAR)
WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}', stream = 'events');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT id, t, k FROM events;"""


def test_a_missing_column_found_after_the_wait_fails_the_run_with_its_message(
    tmp_path: Path,
) -> None:
    # 0 s submit (B down; the source declares k, which B's events will not have); B starts
    # with events (id, t): the run fails with the message a submit with B up gets at once
    port = free_port()
    sql = MISSING_K_PIPELINE.format(port=port)
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        pid = act(client, "pipeline.submit", {"sql": sql})["id"]
        wait_until(lambda: status(client, pid)["waiting"] is not None, "the source's wait")
        with start_server(tmp_path / "b", port=port) as b:
            put_events = FlightServeClient(b.location)
            put_events.put("events", rows(0, 10), writer="w")
            put_events.close()
            wait_until(lambda: status(client, pid)["state"] == "failed", "the run to fail")
        now = status(client, pid)
        assert now["last_error"] == (
            f"flight connector (server grpc://127.0.0.1:{port}, stream 'events'): the stream "
            "has no column 'k'; its columns: id, t"
        )
        assert now["waiting"] is None
        assert out_ids(client) == []


def test_explain_says_the_source_server_is_unreachable_now() -> None:
    from flight_serve.pipelines.runtime import PipelineRuntime

    port = free_port()
    sql = f"""CREATE SOURCE events (id BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t)
WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}', stream = 'events');
CREATE SINK out WITH (connector = 'stdout');
INSERT INTO out SELECT id, t FROM events;"""
    runtime = PipelineRuntime(parse_pipeline(sql), load_tables=False)
    try:
        lines = runtime.explain().splitlines()
    finally:
        for source in runtime.flight_sources.values():
            source.close()
    at = lines.index("SOURCE events  (line 1)")
    assert lines[at + 2 : at + 4] == [
        "  partitions: one per DoPut writer; known now (0): none",
        "  the server is unreachable now: the run waits for it (the stream's writers are read "
        "then)",
    ]
    ticket = PipelineRuntime(
        parse_pipeline(sql.replace("stream = 'events'", "ticket = 'events'")), load_tables=False
    )
    try:
        lines = ticket.explain().splitlines()
    finally:
        for source in ticket.flight_sources.values():
            source.close()
    at = lines.index("SOURCE events  (line 1)")
    assert lines[at + 2 : at + 4] == [
        "  partitions: one, ended when the DoGet ends",
        "  the server is unreachable now: the run waits for it",
    ]


def test_a_source_that_waited_reads_the_streams_history_as_if_its_server_had_been_up(
    tmp_path: Path,
) -> None:
    # B: events = ids 0..9 (writer a), ids 10..19 (writer b); B stops
    # the source (stop_at_end) is made while B is down: no partitions yet, not done
    # B starts again: the history's writers become partitions before any row, then the rows,
    # then (stop_at_end) both writers end
    port = free_port()
    data = tmp_path / "b"
    with start_server(data, port=port, pipelines=False) as b, FlightServeClient(b.location) as fs:
        fs.put("events", rows(0, 10), writer="a")
        fs.put("events", rows(10, 10), writer="b")
    source = FlightSource(
        f"grpc://127.0.0.1:{port}", "events", schema=SCHEMA, stop_at_end=True
    )
    try:
        assert source.waiting_to_open
        assert (source.partitions, source.done) == ((), False)
        assert source.poll(0.2) == []
        with start_server(data, port=port, pipelines=False):
            events = []
            deadline = time.monotonic() + 20
            while not source.done:
                assert time.monotonic() < deadline
                events += source.poll(0.1)
    finally:
        source.close()
    assert [
        (e.kind, e.partition, e.batch["id"].to_pylist() if e.batch is not None else None)
        for e in events
        if e.kind != "backlog"
    ] == [
        ("partition", "a", None),
        ("partition", "b", None),
        ("batch", "a", list(range(10))),
        ("batch", "b", list(range(10, 20))),
        ("end", "a", None),
        ("end", "b", None),
    ]
    assert (source.end_offset, source.incarnation is not None) == (2, True)


def test_a_submit_does_not_wait_long_for_a_source_server_that_does_not_answer(
    tmp_path: Path,
) -> None:
    # B's port accepts TCP connections and never answers (a hung server): gRPC would wait
    # about 20 s for its connection; the submit gives the first call OPEN_RETRY_S (5 s), then
    # returns with the pipeline waiting (the status says so at once)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
            started = time.monotonic()
            pid = act(client, "pipeline.submit", {"sql": pipeline_sql(port)})["id"]
            assert time.monotonic() - started < 8.0
            wait_until(
                lambda: (status(client, pid)["waiting"] or "").startswith(waiting_prefix(port)),
                "the status to say what the source waits for",
                timeout_s=2.0,
            )
            now = status(client, pid)
            assert now["state"] == "running"
            assert now["waiting"].endswith(
                "s, retrying (1 attempts of up to 60 s): Flight returned timeout error, with "
                "message: Deadline Exceeded"
            )
            started = time.monotonic()  # the source's call waits 30 s: the cancel does not
            assert act(client, "pipeline.cancel", {"id": pid})["state"] == "cancelled"
            assert time.monotonic() - started < 3.0


class _TicketServer(flight.FlightServerBase):
    """A plain Flight server: ticket ``events`` is ids 0..99 in batches of 10."""

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        table = pa.Table.from_batches(rows(0, 100).to_batches(max_chunksize=10))
        return flight.RecordBatchStream(table)


def test_a_ticket_source_with_columns_waits_for_its_server_too(tmp_path: Path) -> None:
    # 0 s   A: submit (ticket source -> B's port, nothing listening): returns at once
    # ~0.1s A's status: waiting = "source events (server …, ticket 'events'): opening the
    #       DoGet: the server is unreachable for N s, retrying …"
    # ~0.5s B (a plain Flight server) starts on that port: A's out = ids 0..99 once, finished
    port = free_port()
    sql = f"""SET checkpoint_interval = '200ms';
CREATE SOURCE events (id BIGINT, t TIMESTAMP(3))
WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}', ticket = 'events');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT id, t FROM events;"""
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        started = time.monotonic()
        pid = act(client, "pipeline.submit", {"sql": sql})["id"]
        assert time.monotonic() - started < 3.0  # not the 5 s a source without columns gets
        wait_until(
            lambda: (status(client, pid)["waiting"] or "").startswith(
                f"source events (server grpc://127.0.0.1:{port}, ticket 'events'): opening the "
                "DoGet: the server is unreachable for "
            ),
            "the status to say what the ticket source waits for",
        )
        b = _TicketServer(f"grpc://127.0.0.1:{port}")
        try:
            wait_until(lambda: status(client, pid)["state"] == "finished", "the run to finish")
        finally:
            b.shutdown()
        assert out_ids(client) == list(range(100))
        now = status(client, pid)
        assert (now["waiting"], now["last_error"]) == (None, None)


def test_flight_serve_run_says_what_it_waits_for(tmp_path: Path) -> None:
    # flight-serve run (checkpointed), the source's server B down: stderr says the run waits
    # for B; B starts, ids 0..19 (writer w) then its end: the run says it goes on, writes the
    # 20 rows and exits 0
    port = free_port()
    pipeline = tmp_path / "tail.sql"
    pipeline.write_text(
        TAIL_PIPELINE.format(port=port, path=tmp_path / "out.parquet").replace(
            "SET checkpoint_every = 1;", "SET checkpoint_interval = '1s';"
        )
    )
    cli = Path(sys.executable).with_name("flight-serve")
    proc = subprocess.Popen(
        [str(cli), "run", str(pipeline), "--output-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # blocks until the run says something
        assert first.startswith(
            f"flight-serve: {pipeline}: waiting: flight connector (server "
            f"grpc://127.0.0.1:{port}, stream 'src'): reading the stream's FlightInfo: the "
            "server is unreachable for "
        ), first
        with start_server(tmp_path / "b", port=port, pipelines=False) as b:
            put(b.location, rows(0, 10), rows(10, 10), end=True)
            _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert err.splitlines()[0] == f"flight-serve: {pipeline}: going on"
    assert "sink out: 20 rows" in err
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == list(range(20))


def test_a_source_without_columns_resumes_while_its_server_is_down(
    tmp_path: Path, stop_after: Any
) -> None:
    # no declared columns (the stream's schema is taken): run 1 (B up) reads ids 0..9 (1 entry)
    # and stops; its checkpoint records the columns read. run 2 is made while B is down (no
    # columns to plan with but the checkpoint's): it waits; B starts with ids 10..19 and the
    # end: out = 0..19, each once
    port = free_port()
    data = tmp_path / "b"
    sql = TAIL_PIPELINE.format(port=port, path=tmp_path / "out.parquet").replace(
        "CREATE SOURCE src (id BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t)", "CREATE SOURCE src"
    )
    state = str(tmp_path / "state")
    with start_server(data, port=port, pipelines=False) as b:
        put(b.location, rows(0, 10))
        first = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state, resume="fresh")
        source = first.flight_sources["src"]
        stop_after(first, source, 1)
        with pytest.raises(PipelineStopped):
            list(first.run())
    second = DurableRuntime(parse_pipeline(sql), name="tail", state_root=state)
    assert second.flight_sources["src"].schema == SCHEMA
    thread, errors = run_in_thread(second)
    wait_until(lambda: second.connector_waiting is not None, "run 2 to wait for B")
    with start_server(data, port=port, pipelines=False) as b:
        put(b.location, rows(10, 10), end=True)
        thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == list(range(20))


def test_a_ticket_source_without_columns_resumes_while_its_server_is_down(
    tmp_path: Path, stop_after: Any
) -> None:
    # B: a plain Flight server, ticket 'events' = ids 0..99 in batches of 10; no columns
    # declared. run 1 reads 3 batches and stops (rows 30, the columns recorded); B stops.
    # run 2 is made while B is down: it waits; B starts again: out = 0..99, each once
    port = free_port()
    sql = f"""SET checkpoint_every = 1;
CREATE SOURCE events WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}',
    ticket = 'events');
CREATE SINK out WITH (connector = 'file', path = '{tmp_path / "out.parquet"}');
INSERT INTO out SELECT id FROM events;"""
    state = str(tmp_path / "state")
    b = _TicketServer(f"grpc://127.0.0.1:{port}")
    try:
        first = DurableRuntime(parse_pipeline(sql), name="t", state_root=state, resume="fresh")
        source = first.flight_sources["events"]
        stop_after(first, source, 3)
        real_poll = source.poll
        # one batch per poll (the runtime passes only the timeout): a barrier after each batch
        source.poll = lambda timeout_s, max_entries=64: real_poll(timeout_s, 1)  # type: ignore[method-assign]
        with pytest.raises(PipelineStopped):
            list(first.run())
    finally:
        b.shutdown()
    manifest = first.checkpoints.latest()
    assert manifest is not None
    assert manifest.sources["events"]["rows"] == 30
    second = DurableRuntime(parse_pipeline(sql), name="t", state_root=state)
    thread, errors = run_in_thread(second)
    wait_until(lambda: second.connector_waiting is not None, "run 2 to wait for B")
    b = _TicketServer(f"grpc://127.0.0.1:{port}")
    try:
        thread.join(30)
    finally:
        b.shutdown()
    assert not thread.is_alive()
    assert errors == []
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == list(range(100))


def test_a_missing_column_of_a_stream_created_after_the_source_opened_names_the_stream(
    tmp_path: Path,
) -> None:
    # 0 s B up without stream 'events'; submit (the source opens and waits for the stream);
    # then events (id, t) arrive: the run fails with the stream's missing column, the message a
    # submit gets when the stream is already there (not the per-batch conform message)
    port = free_port()
    sql = MISSING_K_PIPELINE.format(port=port)
    with (
        start_server(tmp_path / "b", port=port) as b,
        start_server(tmp_path / "a") as a,
        flight.connect(a.location) as client,
    ):
        pid = act(client, "pipeline.submit", {"sql": sql})["id"]
        wait_until(lambda: status(client, pid)["state"] == "running", "the run to start")
        time.sleep(0.5)  # the source has asked B for the stream, which is not there yet
        put_events = FlightServeClient(b.location)
        put_events.put("events", rows(0, 10), writer="w")
        put_events.close()
        wait_until(lambda: status(client, pid)["state"] == "failed", "the run to fail")
        assert status(client, pid)["last_error"] == (
            f"flight connector (server grpc://127.0.0.1:{port}, stream 'events'): the stream "
            "has no column 'k'; its columns: id, t"
        )
