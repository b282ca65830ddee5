"""A failure of something outside flight-serve (issue 14, item 5) reaches a client as
UNAVAILABLE with ``extra_info = {"retryable": true}``, not INVALID_ARGUMENT: the request was
fine, the outside system was not. Each case runs against the real component failing for real:
a remote Flight server on a closed loopback port, FalkorDB on a port nobody listens on, a
pyiceberg REST catalog on a closed port. A bad option stays INVALID_ARGUMENT.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.server import start_server
from helpers import act, free_port

pytestmark = pytest.mark.integration

RETRYABLE = b'{"retryable": true}'


def _submit_fails(tmp_path: Path, sql: str) -> flight.FlightUnavailableError:
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        with pytest.raises(flight.FlightUnavailableError) as caught:
            act(client, "pipeline.submit", {"sql": sql})
        # the server keeps serving everyone else
        assert act(client, "pipeline.list", {}) is not None
    return caught.value


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    path.write_text("k,t\na,2026-01-01T00:00:00\n")
    return path


def test_a_flight_source_whose_server_is_down_is_unavailable_at_submit(tmp_path: Path) -> None:
    port = free_port()  # closed: nothing listens
    sql = f"""CREATE SOURCE events WITH (connector = 'flight',
    server = 'grpc://127.0.0.1:{port}', stream = 'events');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT * FROM events;"""
    started = time.monotonic()
    error = _submit_fails(tmp_path, sql)
    assert 4.5 < time.monotonic() - started < 20.0  # OPEN_RETRY_S of retries first
    assert error.extra_info == RETRYABLE
    message = str(error)
    assert message.startswith("SOURCE events: flight connector"), message  # where it failed
    assert (
        f"flight connector (server grpc://127.0.0.1:{port}, stream 'events'): reading the "
        "stream's FlightInfo failed: the server stayed unreachable for 5 s ("
    ) in message
    assert "declare the source's columns to let the pipeline wait for the server" in message
    assert "(retryable: try again after a short delay)" in message


def test_a_falkordb_sink_whose_server_is_down_fails_the_run_with_a_graph_store_error(
    tmp_path: Path,
) -> None:
    """The sink connects when the run starts (after the submit answered): the run fails and
    ``pipeline.status`` carries the GraphStoreError's message (the status has no status code
    of its own); the same sink built directly raises GraphStoreError, UNAVAILABLE."""
    from flight_serve.connectors.falkordb import FalkorDBSink
    from flight_serve.errors import GraphStoreError
    from flight_serve.flight.status import to_flight_error

    port = free_port()
    sql = f"""CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t)
WITH (connector = 'file', path = '{_csv(tmp_path)}');
CREATE SINK g WITH (connector = 'falkordb', url = 'falkor://127.0.0.1:{port}', graph = 'g',
    node_label = 'K', node_key = 'k', max_retries = '0');
INSERT INTO g SELECT k FROM s;"""
    expected = f"sink g: FalkorDB at falkor://127.0.0.1:{port} unreachable after 0 retries (connect): "
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        pid = act(client, "pipeline.submit", {"sql": sql})["id"]
        deadline = time.monotonic() + 20
        while (status := dict(act(client, "pipeline.status", {"id": pid})))["state"] != "failed":
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    assert str(status["last_error"]).startswith(expected)
    options = {"url": f"falkor://127.0.0.1:{port}", "node_label": "K", "node_key": "k",
               "max_retries": "0"}  # fmt: skip
    with pytest.raises(GraphStoreError) as caught:
        FalkorDBSink("g", options, pa.schema([("k", pa.string())]), pipeline="p")
    mapped = to_flight_error(caught.value, rpc="DoAction")
    assert isinstance(mapped, flight.FlightUnavailableError)
    assert mapped.extra_info == RETRYABLE


def test_an_iceberg_source_whose_catalog_is_down_is_unavailable(tmp_path: Path) -> None:
    port = free_port()
    sql = f"""CREATE SOURCE s (k VARCHAR) WITH (connector = 'iceberg', table = 'lake.t',
    catalog_uri = 'http://127.0.0.1:{port}', stop_at = 'latest');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT k FROM s;"""
    error = _submit_fails(tmp_path, sql)
    assert error.extra_info == RETRYABLE
    assert "iceberg catalog 'default': cannot load it: " in str(error)


def test_an_iceberg_source_whose_sql_catalog_cannot_be_opened_is_unavailable(
    tmp_path: Path,
) -> None:
    """A real pyiceberg SqlCatalog whose SQLite file cannot be opened (the path is a
    directory): sqlite's ``unable to open database file`` is the catalog's failure."""
    database = tmp_path / "catalog.db"
    database.mkdir()
    sql = f"""CREATE SOURCE s (k VARCHAR) WITH (connector = 'iceberg', table = 'lake.t',
    catalog_uri = 'sqlite:///{database}', warehouse = 'file://{tmp_path / "wh"}',
    stop_at = 'latest');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT k FROM s;"""
    error = _submit_fails(tmp_path, sql)
    assert error.extra_info == RETRYABLE
    assert "iceberg catalog 'default': cannot load it: (sqlite3.OperationalError) unable to " \
        "open database file" in str(error)  # fmt: skip


def test_an_iceberg_catalog_directory_that_cannot_be_made_is_invalid_argument(
    tmp_path: Path,
) -> None:
    """A catalog path under a regular file is the user's option, not an outage (it used to
    escape as a raw FileNotFoundError / NotADirectoryError, INTERNAL)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    sql = f"""CREATE SOURCE s (k VARCHAR) WITH (connector = 'iceberg', table = 'lake.t',
    catalog_uri = 'sqlite:///{blocker}/sub/catalog.db', stop_at = 'latest');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT k FROM s;"""
    refused = "iceberg catalog 'default': cannot create its directory: "
    with (
        start_server(tmp_path / "a") as a,
        flight.connect(a.location) as client,
        pytest.raises(pa.ArrowInvalid, match=refused),
    ):
        act(client, "pipeline.submit", {"sql": sql})


def test_a_bad_connector_option_stays_invalid_argument(tmp_path: Path) -> None:
    sql = """CREATE SOURCE events WITH (connector = 'flight',
    server = 'grpc://127.0.0.1:1', stream = 'events', start_offset = '-1');
CREATE SINK out WITH (connector = 'flight', stream = 'out', writer = 'p');
INSERT INTO out SELECT * FROM events;"""
    with (
        start_server(tmp_path / "a") as a,
        flight.connect(a.location) as client,
        pytest.raises(pa.ArrowInvalid, match="option start_offset: must be at least 0, got -1"),
    ):
        act(client, "pipeline.submit", {"sql": sql})


def test_a_failed_pipelines_status_carries_its_errors_domain_and_whether_it_is_retryable(
    tmp_path: Path,
) -> None:
    """``pipeline.status`` says what class of error failed a run (issue 14): FalkorDB down is
    ``external`` and retryable; a row the query cannot compute (a division by zero) is the
    user's input and not retryable; a pipeline that has not failed has neither."""
    port = free_port()  # closed: nothing listens
    numbers = tmp_path / "numbers.csv"
    numbers.write_text("k,v\na,5\nb,0\n")
    graph = f"""CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t)
WITH (connector = 'file', path = '{_csv(tmp_path)}');
CREATE SINK g WITH (connector = 'falkordb', url = 'falkor://127.0.0.1:{port}', graph = 'g',
    node_label = 'K', node_key = 'k', max_retries = '0');
INSERT INTO g SELECT k FROM s;"""
    divide = f"""CREATE SOURCE n (k VARCHAR, v BIGINT) WITH (connector = 'file', path = '{numbers}');
CREATE SINK out WITH (connector = 'file', path = '{tmp_path / "out.csv"}');
INSERT INTO out SELECT k, 100 / v AS r FROM n;"""
    healthy = f"""CREATE SOURCE e (k VARCHAR) WITH (connector = 'flight', stream = 'events');
CREATE SINK copy WITH (connector = 'file', path = '{tmp_path / "copy.csv"}');
INSERT INTO copy SELECT k FROM e;"""
    with start_server(tmp_path / "a") as a, flight.connect(a.location) as client:
        pids = [act(client, "pipeline.submit", {"sql": sql})["id"] for sql in (graph, divide)]
        running = act(client, "pipeline.submit", {"sql": healthy})["id"]
        statuses = []
        for pid in pids:
            deadline = time.monotonic() + 20
            while (status := dict(act(client, "pipeline.status", {"id": pid})))["state"] != (
                "failed"
            ):
                assert time.monotonic() < deadline, status
                time.sleep(0.05)
            statuses.append(status)
        other = dict(act(client, "pipeline.status", {"id": running}))
    kinds = [(s["last_error_domain"], s["last_error_retryable"]) for s in statuses]
    assert kinds == [("external", True), ("input", False)], statuses
    assert "Divide by zero" in str(statuses[1]["last_error"])
    assert (other["state"], other["last_error"]) == ("running", None)
    assert (other["last_error_domain"], other["last_error_retryable"]) == (None, None)
