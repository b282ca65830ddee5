"""Bearer tokens with roles, TLS and mutual TLS, and the refusal to listen beyond loopback
unprotected. Certificates are made with the openssl command line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.errors import InvalidInputError
from flight_serve.flight.ops.roles import TlsFiles, load_tokens_file
from flight_serve.flight.server import start_server

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
SCHEMA = pa.schema([("x", pa.int64())])
TOKENS = {"read": "tok-read-1", "write": "tok-write-1", "admin": "tok-admin-1"}


def options(token: str | None) -> flight.FlightCallOptions:
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    return flight.FlightCallOptions(headers=headers, timeout=30)


def put(client: flight.FlightClient, token: str | None, stream: str = "s") -> None:
    writer, reader = client.do_put(
        flight.FlightDescriptor.for_path(stream), SCHEMA, options=options(token)
    )
    writer.write_batch(pa.record_batch([pa.array([1, 2])], schema=SCHEMA))
    writer.done_writing()
    reader.read()
    writer.close()


def act_raw(client: flight.FlightClient, token: str | None, action: str, body: object) -> bytes:
    results = list(
        client.do_action(flight.Action(action, json.dumps(body).encode()), options=options(token))
    )
    return bytes(results[0].body.to_pybytes()) if results else b""


def act(client: flight.FlightClient, token: str | None, action: str, body: object) -> object:
    raw = act_raw(client, token, action, body)
    return json.loads(raw) if raw else None


def get(client: flight.FlightClient, token: str | None) -> int:
    info = client.get_flight_info(flight.FlightDescriptor.for_path("s"), options=options(token))
    return int(client.do_get(info.endpoints[0].ticket, options=options(token)).read_all().num_rows)


# Private: one server per module with a tokens file and a stream written with a token.
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("roles")
    tokens_file = root / "tokens.txt"
    tokens_file.write_text(
        "# token  roles  name\n"
        f"{TOKENS['read']} read dashboards\n"
        f"{TOKENS['write']} write ingest\n"
        f"{TOKENS['admin']} admin ops\n"
        "tok-rw read,write\n"
    )
    tokens = load_tokens_file(tokens_file)
    with start_server(root / "data", tokens=tokens) as service:
        with flight.FlightClient(service.location) as client:
            put(client, "tok-rw")
        yield service.location


@pytest.fixture
def client(server: str) -> Iterator[flight.FlightClient]:
    with flight.FlightClient(server) as c:
        yield c


@pytest.mark.parametrize("token", [None, "no-such-token"])
def test_no_or_unknown_token_is_unauthenticated(
    client: flight.FlightClient, token: str | None
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: list(client.list_flights(options=options(token))),
        lambda: get(client, token),
        lambda: put(client, token),
        lambda: act(client, token, "stream.drop", {"stream": "s"}),
        lambda: list(client.list_actions(options=options(token))),
    ]
    for call in calls:
        with pytest.raises(flight.FlightUnauthenticatedError):
            call()


def test_read_queries_and_tails_only(client: flight.FlightClient) -> None:
    token = TOKENS["read"]
    assert get(client, token) >= 2
    assert [i.descriptor.path for i in client.list_flights(options=options(token))]
    assert act(client, token, "pipeline.list", {}) == {"pipelines": []}
    assert act_raw(client, token, "stream.tail", {"stream": "s"})  # a tail ticket
    with pytest.raises(flight.FlightUnauthorizedError, match="DoPut needs the 'write' role"):
        put(client, token)
    with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
        act(client, token, "stream.drop", {"stream": "s"})
    with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
        act(client, token, "pipeline.submit", {"sql": "SELECT 1"})
    with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
        act(client, token, "pipeline.update", {"id": "nope-00000000", "sql": "SELECT 1"})


def test_write_uploads_only(client: flight.FlightClient) -> None:
    token = TOKENS["write"]
    put(client, token, "written")
    with pytest.raises(flight.FlightUnauthorizedError, match="'read' role"):
        get(client, token)
    with pytest.raises(flight.FlightUnauthorizedError, match="'read' role"):
        list(client.list_flights(options=options(token)))
    with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
        act(client, token, "stream.drop", {"stream": "written"})


def test_admin_pipelines_and_drops_only(client: flight.FlightClient) -> None:
    token = TOKENS["admin"]
    put(client, "tok-rw", "to-drop")
    assert act(client, token, "stream.drop", {"stream": "to-drop"}) == {"dropped": "to-drop"}
    with pytest.raises(pa.ArrowKeyError):  # past the role check: no such pipeline
        act(client, token, "pipeline.cancel", {"id": "nope-00000000"})
    with pytest.raises(pa.ArrowKeyError):
        act(client, token, "pipeline.update", {"id": "nope-00000000", "sql": "SELECT 1"})
    with pytest.raises(flight.FlightUnauthorizedError, match="'write' role"):
        put(client, token)
    with pytest.raises(flight.FlightUnauthorizedError, match="'read' role"):
        get(client, token)


def test_a_bad_tokens_file_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.txt"
    bad.write_text("good read\nsecret superuser\n")
    with pytest.raises(InvalidInputError, match=r"tokens.txt:2: unknown role\(s\) superuser") as e:
        load_tokens_file(bad)
    assert "secret" not in str(e.value)  # a line number, never the token


# --- TLS ---------------------------------------------------------------------------------------


def test_tls_location_and_a_client_without_the_ca_fails(pki: Path, tmp_path: Path) -> None:
    tls = TlsFiles(pki / "server.pem", pki / "server.key")
    with start_server(tmp_path / "data", tls=tls, pipelines=False) as service:
        assert service.location.startswith("grpc+tls://")
        ca = (pki / "ca.pem").read_bytes()
        with flight.FlightClient(service.location, tls_root_certs=ca) as client:
            put(client, None)
            assert get(client, None) == 2
        untrusting = flight.FlightClient(service.location)  # the system CAs only
        with untrusting, pytest.raises(flight.FlightUnavailableError):
            list(untrusting.list_flights(options=flight.FlightCallOptions(timeout=10)))


def test_mtls_refuses_a_client_without_a_certificate(pki: Path, tmp_path: Path) -> None:
    tls = TlsFiles(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    with start_server(tmp_path / "data", tls=tls, pipelines=False) as service:
        ca = (pki / "ca.pem").read_bytes()
        with flight.FlightClient(
            service.location,
            tls_root_certs=ca,
            cert_chain=(pki / "client.pem").read_bytes(),
            private_key=(pki / "client.key").read_bytes(),
        ) as client:
            put(client, None)
            assert get(client, None) == 2
        anonymous = flight.FlightClient(service.location, tls_root_certs=ca)  # no certificate
        with anonymous, pytest.raises(flight.FlightUnavailableError):
            list(anonymous.list_flights(options=flight.FlightCallOptions(timeout=10)))


def test_serve_refuses_a_remote_address_without_tls_and_credentials(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(CLI), "serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "refusing to listen on 0.0.0.0 without TLS and credentials" in result.stderr
    assert "--insecure-allow-remote" in result.stderr


def test_users_and_tokens_together(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text("tok-r read\n")
    with (
        start_server(
            tmp_path / "data",
            tokens=load_tokens_file(tokens_file),
            users={"alice": "secret"},
            pipelines=False,
        ) as service,
        flight.FlightClient(service.location) as client,
    ):
        # A Basic handshake returns a bearer token with every role.
        pairs = client.authenticate_basic_token("alice", "secret")
        bearer = dict([pairs]).get(b"authorization", b"").decode()
        assert bearer.startswith("Bearer ")
        put(client, bearer[7:])
        assert get(client, bearer[7:]) == 2
        # The tokens file's tokens keep their roles.
        assert get(client, "tok-r") == 2
        with pytest.raises(flight.FlightUnauthorizedError):
            put(client, "tok-r")
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.authenticate_basic_token("alice", "wrong")
        with pytest.raises(flight.FlightUnauthenticatedError):
            get(client, None)


def _sql_put(client: flight.FlightClient, token: str, command: bytes) -> int:
    """DoPut of a Flight SQL update command; the PutResult's DoPutUpdateResult count."""
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2

    writer, reader = client.do_put(
        flight.FlightDescriptor.for_command(command), pa.schema([]), options=options(token)
    )
    writer.done_writing()
    result = reader.read()
    writer.close()
    assert result is not None
    return int(sql_pb2.DoPutUpdateResult.FromString(result.to_pybytes()).record_count)


def _sql_query(client: flight.FlightClient, token: str, sql: str) -> pa.Table:
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    descriptor = flight.FlightDescriptor.for_command(
        pack(sql_pb2.CommandStatementQuery(query=sql))
    )
    info = client.get_flight_info(descriptor, options=options(token))
    return client.do_get(info.endpoints[0].ticket, options=options(token)).read_all()


def test_flightsql_statements_need_the_role_of_what_they_do(client: flight.FlightClient) -> None:
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    def update(sql: str) -> bytes:
        return pack(sql_pb2.CommandStatementUpdate(query=sql))

    read, write, admin = TOKENS["read"], TOKENS["write"], TOKENS["admin"]
    # write: CREATE TABLE and INSERT, over DoPut and sent as a query (run in GetFlightInfo)
    assert _sql_put(client, write, update("CREATE TABLE sqlt (x BIGINT)")) == 0
    assert _sql_put(client, write, update("INSERT INTO sqlt VALUES (1), (2), (3)")) == 3
    with pytest.raises(flight.FlightUnauthorizedError, match="'read' role"):
        _sql_query(client, write, "SELECT x FROM sqlt")  # INSERT-only token cannot read
    # read: queries only
    assert _sql_query(client, read, "SELECT x FROM sqlt ORDER BY x").column("x").to_pylist() == [
        1,
        2,
        3,
    ]
    for sql in ("INSERT INTO sqlt VALUES (4)", "CREATE TABLE other (y BIGINT)"):
        with pytest.raises(flight.FlightUnauthorizedError, match="'write' role"):
            _sql_put(client, read, update(sql))
        with pytest.raises(flight.FlightUnauthorizedError, match="'write' role"):
            client.get_flight_info(
                flight.FlightDescriptor.for_command(
                    pack(sql_pb2.CommandStatementQuery(query=sql))
                ),
                options=options(read),
            )
    # bulk ingest: write; in replace mode over an existing table (a drop): admin
    ingest = sql_pb2.CommandStatementIngest(table="sqlt")
    opts = sql_pb2.CommandStatementIngest.TableDefinitionOptions
    ingest.table_definition_options.if_not_exist = opts.TABLE_NOT_EXIST_OPTION_FAIL
    ingest.table_definition_options.if_exists = opts.TABLE_EXISTS_OPTION_APPEND
    rows = pa.record_batch([pa.array([10, 11], pa.int64())], names=["x"])

    def bulk(token: str, command: bytes) -> None:
        writer, reader = client.do_put(
            flight.FlightDescriptor.for_command(command), rows.schema, options=options(token)
        )
        writer.write_batch(rows)
        writer.done_writing()
        reader.read()
        writer.close()

    with pytest.raises(flight.FlightUnauthorizedError, match="'write' role"):
        bulk(read, pack(ingest))
    bulk(write, pack(ingest))
    ingest.table_definition_options.if_exists = opts.TABLE_EXISTS_OPTION_REPLACE
    with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
        bulk(write, pack(ingest))
    # admin: DROP TABLE (and nothing else of the above)
    with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
        _sql_put(client, write, update("DROP TABLE sqlt"))
    with pytest.raises(flight.FlightUnauthorizedError, match="'write' role"):
        _sql_put(client, admin, update("INSERT INTO sqlt VALUES (5)"))
    # nothing refused above ran: 1, 2, 3 and the one ingest of 10, 11
    assert _sql_query(client, read, "SELECT x FROM sqlt ORDER BY x").column("x").to_pylist() == [
        1,
        2,
        3,
        10,
        11,
    ]
    assert _sql_put(client, admin, update("DROP TABLE sqlt")) == 0
    with pytest.raises(pa.ArrowKeyError):
        _sql_query(client, read, "SELECT x FROM sqlt")
