"""No server internals in errors: every error a client receives, on every RPC and through
ADBC and the CLI, is flight-serve's own message and a request id (no traceback, no file path);
the server log has the traceback under that request id."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.flight.sql.handler import pack

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
ALL, READ = "tok-all-errors", "tok-read-errors"
SCHEMA = pa.schema([("x", pa.int64())])
REQUEST_ID = re.compile(r"\(request id ([0-9A-Za-z_.:-]+)\)")


# Private: a `flight-serve serve` process whose stderr log the tests read.
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("errors")
    tokens = root / "tokens.txt"
    tokens.write_text(f"{ALL} read,write,admin ops\n{READ} read dash\n")
    log = root / "server.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [str(CLI), "serve", "--port", "0", "--data-dir", str(root / "data"),
             "--tokens-file", str(tokens)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=os.environ.copy(),
        )
        try:
            assert proc.stdout is not None
            location = proc.stdout.readline().decode().strip()
            assert location.startswith("grpc://"), log.read_text()
            state: dict[str, Any] = {"location": location, "log": log, "root": root}
            yield state
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()


def options(token: str = ALL) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {token}".encode())], timeout=30
    )


def put(client: flight.FlightClient, stream: str, schema: pa.Schema, values: list[Any]) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(stream), schema, options())
    writer.write_batch(pa.record_batch([pa.array(values, schema.field(0).type)], schema=schema))
    writer.done_writing()
    reader.read()
    writer.close()


def action(name: str, body: bytes, token: str = ALL) -> Callable[[flight.FlightClient], Any]:
    return lambda c: list(c.do_action(flight.Action(name, body), options(token)))


def flightsql(sql: str) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=sql)))


def exchange_bad_sql(client: flight.FlightClient) -> None:
    descriptor = flight.FlightDescriptor.for_command(b"SELECT nope FROM TUMBLE(")
    writer, reader = client.do_exchange(descriptor, options())
    writer.begin(SCHEMA)
    writer.done_writing()
    reader.read_all()


def doget_mid_stream(client: flight.FlightClient) -> None:
    sql = "SELECT CAST('x' || CAST(x AS VARCHAR) AS INT) AS y FROM keep"
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()), options())
    client.do_get(info.endpoints[0].ticket, options()).read_all()


#: (name, call, the exception the client raises, a phrase of flight-serve's own message)
CASES: list[tuple[str, Callable[[flight.FlightClient], Any], type[Exception], str]] = [
    ("bad SQL (GetFlightInfo)",
     lambda c: c.get_flight_info(flight.FlightDescriptor.for_command(b"SELEC 1"), options()),
     pa.ArrowInvalid, "SELEC"),
    ("bad SQL (GetSchema)",
     lambda c: c.get_schema(flight.FlightDescriptor.for_command(b"SELECT 1 +"), options()),
     pa.ArrowInvalid, "Expected: an expression"),
    # (SELECT FROM WHERE reads from a table named "where": NOT_FOUND)
    ("missing table (GetSchema)",
     lambda c: c.get_schema(flight.FlightDescriptor.for_command(b"SELECT FROM WHERE"), options()),
     pa.ArrowKeyError, "table 'where' does not exist"),
    ("missing stream (GetFlightInfo)",
     lambda c: c.get_flight_info(flight.FlightDescriptor.for_path("nope"), options()),
     pa.ArrowKeyError, "nope"),
    ("missing stream (GetSchema)",
     lambda c: c.get_schema(flight.FlightDescriptor.for_path("nope"), options()),
     pa.ArrowKeyError, "nope"),
    ("malformed ticket (DoGet)",
     lambda c: c.do_get(flight.Ticket(b"\x00garbage"), options()).read_all(),
     pa.ArrowInvalid, "ticket"),
    ("failure mid-stream (DoGet)", doget_mid_stream, pa.ArrowInvalid, ""),
    ("schema mismatch (DoPut)",
     lambda c: put(c, "keep", pa.schema([("y", pa.string())]), ["a"]),
     pa.ArrowInvalid, "y"),
    ("bad action body", action("stream.drop", b"{not json"), pa.ArrowInvalid, "JSON"),
    ("unknown action", action("no.such.action", b"{}"), pa.ArrowInvalid, "unknown action"),
    ("unknown pipeline", action("pipeline.status", b'{"id": "nope"}'), pa.ArrowKeyError, "nope"),
    ("bad pipeline SQL", action("pipeline.submit", b'{"sql": "CREAT SINK x;"}'),
     pa.ArrowInvalid, ""),
    ("permission denied (action)", action("stream.drop", b'{"stream": "keep"}', READ),
     flight.FlightUnauthorizedError, "admin"),
    ("permission denied (DoPut)",
     lambda c: c.do_put(flight.FlightDescriptor.for_path("w"), SCHEMA, options(READ))[1].read(),
     flight.FlightUnauthorizedError, "write"),
    ("bad pipeline SQL (DoExchange)", exchange_bad_sql, pa.ArrowInvalid, ""),
    ("Flight SQL bad SQL (GetFlightInfo)",
     lambda c: c.get_flight_info(flightsql("SELEC 1"), options()), pa.ArrowInvalid, "SELEC"),
    ("Flight SQL missing table (GetSchema)",
     lambda c: c.get_schema(flightsql("SELECT * FROM nope"), options()), pa.ArrowKeyError, "nope"),
]


def assert_clean(text: str) -> str:
    """Fail if ``text`` shows server internals; return its request id."""
    assert "Traceback" not in text, text
    assert ".py" not in text, text
    assert 'File "' not in text, text
    found = REQUEST_ID.search(text)
    assert found is not None, f"no request id in {text!r}"
    return found.group(1)


def server_log(state: dict[str, Any]) -> list[dict[str, Any]]:
    lines = state["log"].read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.parametrize(("name", "call", "raised", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_an_error_shows_its_message_and_a_request_id_and_the_log_has_the_traceback(
    served: dict[str, Any],
    name: str,
    call: Callable[[flight.FlightClient], Any],
    raised: type[Exception],
    phrase: str,
) -> None:
    with flight.FlightClient(served["location"]) as client:
        put(client, "keep", SCHEMA, [1, 2])
        with pytest.raises(raised) as info:
            call(client)
    text = str(info.value)
    request_id = assert_clean(text)
    assert phrase in text.split(". Detail: ", 1)[0]
    deadline = time.monotonic() + 5
    while True:
        records = [r for r in server_log(served) if r.get("request_id") == request_id]
        failed = [r for r in records if str(r.get("msg", "")).startswith("request failed")]
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert failed, f"no log line under request id {request_id}"
    assert "Traceback (most recent call last)" in failed[0]["exc"]


def test_unauthenticated_calls_carry_a_request_id_and_no_internals(
    served: dict[str, Any],
) -> None:
    with (
        flight.FlightClient(served["location"]) as client,
        pytest.raises(flight.FlightUnauthenticatedError) as info,
    ):
        client.get_flight_info(flight.FlightDescriptor.for_path("keep"), options("no-such"))
    assert_clean(str(info.value))


def test_adbc_errors_are_clean(served: dict[str, Any]) -> None:
    dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi")
    kwargs = {"adbc.flight.sql.authorization_header": f"Bearer {ALL}"}
    with dbapi.connect(served["location"], db_kwargs=kwargs, autocommit=True) as conn:
        for sql in ("SELEC 1", "SELECT * FROM nope", "SELECT CAST('a' AS INT)",
                    "INSERT INTO nope VALUES (1)"):
            with pytest.raises(Exception) as info:  # noqa: PT011  # the driver's own classes
                run(conn, sql)
            assert_clean(str(info.value))


def run(conn: Any, sql: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql)
        cur.fetchall()


@pytest.mark.parametrize(
    "args",
    [["pipelines", "status", "nope"], ["pipelines", "cancel", "nope"], ["submit", "{bad}"]],
    ids=["status", "cancel", "submit"],
)
def test_the_cli_prints_the_message_and_request_id_only(
    served: dict[str, Any], args: list[str]
) -> None:
    if "{bad}" in args:
        bad = served["root"] / "bad.sql"
        bad.write_text("CREATE SOURCE s (x BIGINT) WITH (connector = 'nope');\n")
        args = [a.replace("{bad}", str(bad)) for a in args]
    env = {**os.environ, "FLIGHT_SERVE_TOKEN": ALL}
    done = subprocess.run(
        [str(CLI), *args, "--server", served["location"]],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert done.returncode == 1, done
    err = done.stderr.replace(str(served["root"]), "<root>")  # the file's own path may show
    assert_clean(err)
    assert "Detail:" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_internal_error_in_get_schema_shows_no_traceback(tmp_path: Path) -> None:
    # pyarrow's GetSchema sends even a FlightError with the handler's traceback
    from flight_serve.flight.server import start_server

    with (
        start_server(tmp_path / "data", pipelines=False) as service,
        flight.FlightClient(service.location) as client,
    ):
        writer, _ = client.do_put(flight.FlightDescriptor.for_path("s"), SCHEMA)
        writer.write_batch(pa.record_batch([pa.array([1], pa.int64())], schema=SCHEMA))
        writer.close()
        service.store.close()  # every read now fails: StorageError, an internal error
        for call in (
            lambda: client.get_schema(flight.FlightDescriptor.for_path("s")),
            lambda: client.get_flight_info(flight.FlightDescriptor.for_path("s")),
        ):
            with pytest.raises(pa.ArrowException) as info:
                call()
            assert_clean(str(info.value))
            assert "the stream store is closed" in str(info.value)
