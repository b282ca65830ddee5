"""A remote ``flight`` sink whose server is down when the pipeline starts: the
pipeline says so in ``pipeline.status`` (``waiting``) while its sink retries, and once the
server comes up every row arrives exactly once.

Timeline::

    0 s   A: submit (sink -> B's port, nothing listening); ids 0..49 in A's stream
    ~1 s  A's status: waiting = "flight sink (server …): … unreachable for N s, retrying …"
    ~2 s  B starts on that port; ids 50..99 into A's stream
          B's relay: ids 0..99 once; A's status: waiting = None
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.server import start_server
from flight_serve_client import FlightServeClient
from helpers import act, wait_until
from helpers import id_rows as rows

pytestmark = pytest.mark.integration



def relay_count(client: flight.FlightClient) -> int:
    try:
        return int(client.get_flight_info(flight.FlightDescriptor.for_path("relay")).total_records)
    except pa.ArrowKeyError:
        return 0


def test_a_remote_sink_waits_for_a_server_down_at_start_and_says_so(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sql = f"""SET checkpoint_interval = '200ms';
CREATE SOURCE events (id BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE SINK relay WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}',
    stream = 'relay', writer = 'from-a');
INSERT INTO relay SELECT id, t FROM events;"""
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        with FlightServeClient(a.location) as fs:
            fs.put("events", rows(0, 50), writer="w")
        pid = act(client, "pipeline.submit", {"sql": sql})["id"]
        prefix = (
            f"flight sink (server grpc://127.0.0.1:{port}, stream 'relay', writer 'from-a'): "
            "listing the server's actions: the server is unreachable for "
        )
        wait_until(
            lambda: (act(client, "pipeline.status", {"id": pid})["waiting"] or "").startswith(
                prefix
            ),
            "the status to say what the sink waits for",
        )
        status = act(client, "pipeline.status", {"id": pid})
        assert (status["state"], status["last_error"]) == ("running", None)
        assert "s, retrying (" in status["waiting"]
        with start_server(tmp_path / "b", port=port) as b, flight.connect(b.location) as bc:
            with FlightServeClient(a.location) as fs:
                fs.put("events", rows(50, 50), writer="w")
            wait_until(lambda: relay_count(bc) >= 100, "100 rows in B's relay")
            assert act(client, "pipeline.checkpoint", {"id": pid})["completed"] is True
            info = bc.get_flight_info(flight.FlightDescriptor.for_path("relay"))
            ids = bc.do_get(info.endpoints[0].ticket).read_all()["id"].to_pylist()
            assert sorted(ids) == list(range(100))  # every row once
            status = act(client, "pipeline.status", {"id": pid})
            assert (status["state"], status["last_error"]) == ("running", None)
            # the sink no longer waits; the caught-up source waits for new entries
            assert status["waiting"].startswith(
                "source events: waiting for new entries of stream 'events' (next offset "
            )


def test_a_pipeline_whose_remote_sink_retries_is_cancelled_at_once(tmp_path: Path) -> None:
    # 0 s: submit, the sink's server down; ~1 s: cancel (it stopped after the retry budget,
    # 60 s, before the sink told the pipeline about its retries)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sql = f"""CREATE SOURCE events (id BIGINT, t TIMESTAMP(3)) WITH (connector = 'flight');
CREATE SINK relay WITH (connector = 'flight', server = 'grpc://127.0.0.1:{port}');
INSERT INTO relay SELECT id, t FROM events;"""
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        pid = act(client, "pipeline.submit", {"sql": sql})["id"]
        wait_until(
            lambda: (act(client, "pipeline.status", {"id": pid})["waiting"] or "").startswith(
                "flight sink"
            ),
            "the sink's retry",
        )
        started = time.monotonic()
        assert act(client, "pipeline.cancel", {"id": pid}) == {"id": pid, "state": "cancelled"}
        assert time.monotonic() - started < 10.0
        assert act(client, "pipeline.status", {"id": pid})["waiting"] is None


class _CutServer(flight.FlightServerBase):
    """A plain Flight server: ticket ``events`` is 100 rows in batches of 10; the first DoGet
    fails with UNAVAILABLE after 4 batches."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.gets = 0

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        self.gets += 1
        cut = 4 if self.gets == 1 else None
        table = rows(0, 100)

        def generate() -> Any:
            for i, b in enumerate(table.to_batches(max_chunksize=10)):
                if i == cut:
                    raise flight.FlightUnavailableError("connection lost (injected)")
                yield b

        return flight.GeneratorStream(table.schema, generate())


def test_a_ticket_source_reports_its_retries_to_the_pipeline() -> None:
    from flight_serve.connectors.flight import FlightTicketSource
    from flight_serve.pipelines.pipeline import parse_pipeline
    from flight_serve.pipelines.runtime import PipelineRuntime

    server = _CutServer()
    try:
        location = f"grpc://127.0.0.1:{server.port}"
        sql = f"""CREATE SOURCE s (id BIGINT, t TIMESTAMP(3))
WITH (connector = 'flight', server = '{location}', ticket = 'events');
CREATE SINK out WITH (connector = 'stdout');
INSERT INTO out SELECT id, t FROM s;"""
        runtime = PipelineRuntime(parse_pipeline(sql))
        sources = [s for s in runtime.flight_sources.values() if isinstance(s, FlightTicketSource)]
        assert len(sources) == 1
        assert sources[0].on_retry == runtime.connector_wait  # the source tells the pipeline
        told: list[str | None] = []

        def record(waiting: str | None) -> None:  # what it tells, then the runtime's own hook
            told.append(waiting)
            runtime.connector_wait(waiting)

        sources[0].on_retry = record
        for _ in runtime.run():
            pass
        # one cut: one retry message, then None once the DoGet was opened again
        assert len(told) == 2
        assert (told[0] or "").startswith(
            f"source s (server {location}, ticket 'events'): reading the DoGet: the server is "
            "unreachable for 0 s, retrying (1 attempts of up to 60 s): "
        )
        assert told[1] is None
        assert runtime.connector_waiting is None
        assert server.gets == 2
    finally:
        server.shutdown()
