"""A remote ``flight`` tail source whose server goes away mid-run: each
outage gets the whole reconnection budget (an earlier outage, followed by a quiet stream, does not
use it up), the wait shows in ``on_retry`` (a pipeline's ``pipeline.status`` ``waiting``), and a close
ends it at once.

B is a real flight-serve (in-process, restarted on the same port and data directory).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow as pa
import pytest
from flight_serve.connectors.flight import FlightSource, SourceEvent
from flight_serve.errors import RemoteFlightError
from flight_serve.flight.server import start_server
from flight_serve_client import FlightServeClient
from helpers import ID_TIMES as SCHEMA
from helpers import free_port
from helpers import id_rows as rows

pytestmark = pytest.mark.integration



def put(location: str, table: pa.Table) -> None:
    with FlightServeClient(location) as fs:
        fs.put("events", table, writer="w")


def poll_ids(source: FlightSource, want: int, timeout_s: float = 30.0) -> list[int]:
    """Poll until ``want`` rows were handed out; their ids (a failure of the source raises)."""
    ids: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(ids) < want:
        assert time.monotonic() < deadline, f"timed out with ids {ids}"
        events: list[SourceEvent] = source.poll(0.05)
        for event in events:
            if event.kind == "batch":
                assert event.batch is not None
                ids += event.batch.column("id").to_pylist()
    return ids


def idle(source: FlightSource, seconds: float) -> None:
    """Poll for ``seconds`` expecting no rows (a failure of the source raises)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert [e for e in source.poll(0.05) if e.kind == "batch"] == []


def test_each_outage_gets_the_whole_reconnection_budget(tmp_path: Path) -> None:
    # budget 6 s of failures in a row (a checkpointed run's is 60 s)
    # 0 s    B up, ids 0..9 read
    # ~0 s   B down 2 s, up again (the tail reconnects; no new rows: the stream is quiet)
    # ~2 s   quiet 5 s
    # ~7 s   B down 2 s, up again; ids 10..19 read. Both outages were shorter than the budget:
    #        the source must not fail (it counted the second from the first outage's start)
    port = free_port()
    data = tmp_path / "b"
    told: list[str | None] = []
    with start_server(data, port=port, pipelines=False) as b:
        put(b.location, rows(0, 10))
        source = FlightSource(b.location, "events", schema=SCHEMA)
        source.reconnect_s = 6.0
        source.on_retry = told.append
        assert poll_ids(source, 10) == list(range(10))
    try:
        time.sleep(2.0)
        with start_server(data, port=port, pipelines=False):
            idle(source, 5.0)
        time.sleep(2.0)
        with start_server(data, port=port, pipelines=False) as b:
            put(b.location, rows(10, 10))
            assert poll_ids(source, 10) == list(range(10, 20))
    finally:
        source.close()
    # the waits were told, and that they were over
    waits = [w for w in told if w is not None]
    assert waits
    assert waits[0].startswith(
        f"flight connector (server {b.location}, stream 'events'): reading the tail: the server "
        "is unreachable for 0 s, retrying (1 attempts of up to 6 s): "
    )
    assert told[-1] is None


def test_a_closed_source_stops_waiting_at_once(tmp_path: Path) -> None:
    # B down; the source waits (reconnect budget 60 s); close() returns within a second
    port = free_port()
    with start_server(tmp_path / "b", port=port, pipelines=False) as b:
        put(b.location, rows(0, 10))
        source = FlightSource(b.location, "events", schema=SCHEMA)
        source.reconnect_s = 60.0
        assert poll_ids(source, 10) == list(range(10))
    idle(source, 1.0)
    started = time.monotonic()
    source.close()
    assert time.monotonic() - started < 1.0



def test_an_outage_longer_than_the_budget_fails_the_source_naming_the_server(
    tmp_path: Path,
) -> None:
    # budget 1 s; B goes down for good: the next poll after ~1 s raises, naming B
    port = free_port()
    told: list[str | None] = []
    with start_server(tmp_path / "b", port=port, pipelines=False) as b:
        put(b.location, rows(0, 10))
        source = FlightSource(b.location, "events", schema=SCHEMA)
        source.reconnect_s = 1.0
        source.on_retry = told.append
        assert poll_ids(source, 10) == list(range(10))
    try:
        with pytest.raises(RemoteFlightError) as caught:
            idle(source, 15.0)
    finally:
        source.close()
    message = str(caught.value)
    assert re.fullmatch(
        re.escape(
            f"flight connector (server {b.location}, stream 'events'): reading the tail failed: "
            "the server stayed unreachable for "
        )
        + r"[1-9] s \([0-9]+ attempts of up to 1 s\): Flight returned unavailable error, with "
        r"message: failed to connect to all addresses; .*Connection refused",
        message,
    ), message
    assert told[-1] is None  # the wait is over
