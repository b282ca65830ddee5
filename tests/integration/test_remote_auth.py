"""``flight`` connectors with a ``server`` that needs TLS and a token: a
flight-serve on another host must use TLS and credentials (``serve`` refuses a non-loopback
address without them), so a remote source or sink takes ``tls_ca``, ``tls_cert`` / ``tls_key``
(mutual TLS) and ``token_env`` (the environment variable holding its bearer token).

B is a real flight-serve with mutual TLS and a tokens file, on loopback; the pipelines read its
stream ``events`` (ids 0..19, writer w, ended) and write its stream ``copy``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.errors import PipelineSQLError
from flight_serve.flight.ops.roles import TlsFiles, load_tokens_file
from flight_serve.flight.server import start_server
from flight_serve.pipelines.durable import DurableRuntime
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("id", pa.int64()), ("t", pa.timestamp("ms"))])
TOKEN = "tok-b-0123456789"
SOURCE_TOKEN = "tok-source-0123"
SINK_TOKEN = "tok-sink-0123"


def rows(first: int, count: int) -> pa.RecordBatch:
    ids = list(range(first, first + count))
    return pa.record_batch({"id": ids, "t": pa.array(ids, pa.timestamp("ms"))}, schema=SCHEMA)


def client_of(location: str, pki: Path) -> flight.FlightClient:
    return flight.FlightClient(
        location,
        tls_root_certs=(pki / "ca.pem").read_bytes(),
        cert_chain=(pki / "client.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes(),
    )


BEARER = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])


@pytest.fixture
def b(pki: Path, tmp_path: Path) -> Iterator[str]:
    tokens = tmp_path / "tokens.txt"
    # the roles the docs say each needs: a source read, a sink read and write
    tokens.write_text(
        f"{TOKEN} read,write,admin b-test\n{SOURCE_TOKEN} read src\n{SINK_TOKEN} read,write sink\n"
    )
    tls = TlsFiles(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    with start_server(
        tmp_path / "b", tls=tls, tokens=load_tokens_file(tokens), pipelines=False
    ) as service:
        with client_of(service.location, pki) as client:
            descriptor = flight.FlightDescriptor.for_path("events", "w")
            writer, reader = client.do_put(descriptor, SCHEMA, options=BEARER)
            for first in (0, 10):
                writer.write_batch(rows(first, 10))
                reader.read()
            writer.write_metadata(pa.py_buffer(b'{"end_of_input": true}'))
            reader.read()
            writer.close()
        yield service.location


def copy_ids(location: str, pki: Path) -> list[int]:
    with client_of(location, pki) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("copy"), options=BEARER)
        table = client.do_get(info.endpoints[0].ticket, options=BEARER).read_all()
    return list(table["id"].to_pylist())


def sql(location: str, pki: Path, checkpoint: str = "", **extra: str) -> str:
    auth = {
        "tls_ca": str(pki / "ca.pem"),
        "tls_cert": str(pki / "client.pem"),
        "tls_key": str(pki / "client.key"),
        "token_env": "B_TOKEN",
        **extra,
    }
    options = ", ".join(f"{k} = '{v}'" for k, v in auth.items() if v)
    sink_options = options.replace("token_env = 'B_TOKEN'", "token_env = 'B_SINK_TOKEN'")
    return f"""{checkpoint}
CREATE SOURCE events (id BIGINT, t TIMESTAMP(3))
WITH (connector = 'flight', server = '{location}', stream = 'events', {options});
CREATE SINK copy WITH (connector = 'flight', server = '{location}', stream = 'copy',
    writer = 'p', {sink_options});
INSERT INTO copy SELECT id, t FROM events;"""


def test_a_checkpointed_run_reads_and_writes_a_server_with_mtls_and_a_token(
    b: str, pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # source: B's events (tail, until w's end); sink: B's copy, exactly-once target
    monkeypatch.setenv("B_TOKEN", SOURCE_TOKEN)
    monkeypatch.setenv("B_SINK_TOKEN", SINK_TOKEN)
    text = sql(b, pki, "SET checkpoint_interval = '200ms';")
    runtime = DurableRuntime(
        parse_pipeline(text), name="auth", state_root=str(tmp_path / "state"), resume="fresh"
    )
    list(runtime.run())
    assert copy_ids(b, pki) == list(range(20))


def test_a_run_without_checkpoints_reads_and_writes_a_server_with_mtls_and_a_token(
    b: str, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("B_TOKEN", SOURCE_TOKEN)
    monkeypatch.setenv("B_SINK_TOKEN", SINK_TOKEN)
    runtime = PipelineRuntime(parse_pipeline(sql(b, pki)))
    list(runtime.run())
    assert copy_ids(b, pki) == list(range(20))


def test_a_wrong_token_is_refused_at_once_not_waited_for(
    b: str, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("B_TOKEN", "not-a-token")
    with pytest.raises(PipelineSQLError) as caught:
        PipelineRuntime(parse_pipeline(sql(b, pki)))
    said = re.sub(r" \(request id [0-9a-f]{16}\)", "", str(caught.value), count=1)
    assert said != str(caught.value), "B's request id is in the message, for B's log"
    assert said == (
        f"SOURCE events: flight connector (server {b}, stream 'events'): unknown or expired "
        "bearer token (line 2, column 15)"
    )


def test_auth_options_are_checked(b: str, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("B_TOKEN", raising=False)
    cases: list[tuple[str, str]] = [
        (
            sql(b, pki),
            "token_env: the environment variable B_TOKEN (the bearer token) is not set or empty",
        ),
        (sql(b, pki, tls_key=""), "tls_cert: tls_cert and tls_key go together (mutual TLS)"),
        (
            sql(b, pki, tls_ca=str(pki / "nope.pem")),
            f"tls_ca: cannot read {pki / 'nope.pem'}: ",
        ),
        (
            sql(b, pki).replace(f"server = '{b}', stream = 'events'", "stream = 'events'"),
            "tls_ca is for another server: give its server = 'grpc+tls://host:port' too",
        ),
    ]
    for text, expected in cases:
        with pytest.raises(PipelineSQLError) as caught:
            PipelineRuntime(parse_pipeline(text))
        assert expected in str(caught.value), (expected, str(caught.value))



def test_a_tls_handshake_failure_is_not_retried_by_a_sink_or_a_ticket_source(b: str) -> None:
    # B speaks mutual TLS; a client without a certificate fails the handshake (gRPC says
    # UNAVAILABLE): the sink and the ticket source fail at once, not after the 60 s budget
    from flight_serve.connectors.flight import FlightStreamTarget, FlightTicketSource
    from flight_serve.errors import ConnectorError

    started = time.monotonic()
    with pytest.raises(ConnectorError) as sink_error:
        FlightStreamTarget(b, "copy", SCHEMA, "p")  # no CA: B's certificate is not trusted
    with pytest.raises(ConnectorError) as ticket_error:
        FlightTicketSource(b, b"events", name="s", schema=SCHEMA)
    assert time.monotonic() - started < 5.0
    assert str(sink_error.value).startswith(
        f"flight sink (server {b}, stream 'copy', writer 'p'): listing the server's actions "
        "failed: "
    )
    assert str(ticket_error.value).startswith(
        f"source s (server {b}, ticket 'events'): opening the DoGet failed: "
    )
    for error in (sink_error, ticket_error):
        assert "Ssl handshake failed" in str(error.value)
        assert "certificate verify failed" in str(error.value)
