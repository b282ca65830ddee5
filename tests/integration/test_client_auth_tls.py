"""flight_serve_client with credentials and TLS against a real server: a bearer token from a
tokens file, a user and password from a users file (Basic handshake), TLS with a CA and a client
certificate (mutual TLS; certificates made with the openssl command line, the ``pki`` fixture),
and ``tail`` stopping at the current end (``follow=False``) versus following (``follow=True``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.roles import TlsFiles, load_tokens_file
from flight_serve.flight.server import start_server
from flight_serve_client import FlightServeClient

pytestmark = pytest.mark.integration

ROWS = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})
TOKENS = {"read": "tok-read-7", "rw": "tok-rw-7", "admin": "tok-admin-7"}


@dataclass(frozen=True)
class Secured:
    location: str
    pki: Path

    def client(self, **kwargs: object) -> FlightServeClient:
        """A client with the CA and the client certificate, plus ``kwargs``."""
        return FlightServeClient(
            self.location,
            tls_ca=self.pki / "ca.pem",
            tls_cert=self.pki / "client.pem",
            tls_key=self.pki / "client.key",
            **kwargs,  # type: ignore[arg-type]
        )


# Private: one server per module with mutual TLS, a tokens file and a users file.
@pytest.fixture(scope="module")
def secured(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A server with mutual TLS, a tokens file and a users file (the README's setup)."""
    root = tmp_path_factory.mktemp("secured")
    tokens = root / "tokens.txt"
    tokens.write_text(
        f"{TOKENS['read']} read dashboards\n{TOKENS['rw']} read,write ingest\n"
        f"{TOKENS['admin']} read,admin ops\n"
    )
    tls = TlsFiles(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    with start_server(
        root / "data",
        tls=tls,
        tokens=load_tokens_file(tokens),
        users={"alice": "wonderland"},
    ) as service:
        assert service.location.startswith("grpc+tls://")
        yield Secured(service.location, pki)


def test_a_token_is_sent_on_every_call_with_its_roles(secured: Secured) -> None:
    with secured.client(token=TOKENS["rw"]) as writer:
        assert writer.put("tokened", ROWS) == 0
        assert writer.query("SELECT sum(v) AS s FROM tokened").to_pydict() == {"s": [6]}
        assert [o for o, _ in writer.tail("tokened")] == [0]
    with secured.client(token=TOKENS["read"]) as reader:
        assert reader.stream_info("tokened")["total_records"] == 3
        with pytest.raises(flight.FlightUnauthorizedError, match="'write' role"):
            reader.put("tokened", ROWS)
    with secured.client(token="not-a-token") as stranger, pytest.raises(
        flight.FlightUnauthenticatedError
    ):
        stranger.list_streams()
    with secured.client() as anonymous, pytest.raises(flight.FlightUnauthenticatedError):
        anonymous.list_streams()


def test_a_user_and_password_run_the_basic_handshake(secured: Secured) -> None:
    with secured.client(username="alice", password="wonderland") as alice:
        alice.put("alices", ROWS)  # a handshake token has every role
        assert alice.query("SELECT k FROM alices ORDER BY k").column("k").to_pylist() == [
            "a",
            "b",
            "c",
        ]
        alice.drop("alices")
        assert "alices" not in alice.list_streams()
    with pytest.raises(flight.FlightUnauthenticatedError):
        secured.client(username="alice", password="wrong")


def test_tls_needs_the_ca_and_for_mutual_tls_the_client_certificate(secured: Secured) -> None:
    untrusting = FlightServeClient(secured.location, token=TOKENS["read"])  # system CAs only
    with untrusting, pytest.raises(flight.FlightUnavailableError):
        untrusting.list_streams()
    no_certificate = FlightServeClient(
        secured.location, token=TOKENS["read"], tls_ca=(secured.pki / "ca.pem").read_bytes()
    )
    with no_certificate, pytest.raises(flight.FlightUnavailableError):
        no_certificate.list_streams()
    pem = {n: (secured.pki / n).read_bytes() for n in ("ca.pem", "client.pem", "client.key")}
    with FlightServeClient(
        secured.location,
        token=TOKENS["read"],
        tls_ca=pem["ca.pem"],
        tls_cert=pem["client.pem"],
        tls_key=pem["client.key"],
    ) as by_bytes:
        assert isinstance(by_bytes.list_streams(), list)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token": "t", "username": "u", "password": "p"}, "either token or username"),
        ({"username": "u"}, "password is missing"),
        ({"password": "p"}, "username is missing"),
        ({"tls_cert": b"x"}, "tls_key is missing"),
        ({"tls_key": b"x"}, "tls_cert is missing"),
        ({"tls_ca": "/no/such/ca.pem"}, "tls_ca: cannot read '/no/such/ca.pem'"),
    ],
)
def test_bad_credentials_arguments_name_the_argument(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        FlightServeClient("grpc+tls://127.0.0.1:1", **kwargs)  # type: ignore[arg-type]


def test_tls_options_for_a_plain_location_are_refused() -> None:
    with pytest.raises(ValueError, match=r"tls_ca is for a TLS server, but 'grpc://127.0.0.1:1'"):
        FlightServeClient("grpc://127.0.0.1:1", tls_ca=b"pem")


# --- tail: the current end versus following --------------------------------------------------


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[FlightServeClient]:
    with (
        start_server(tmp_path / "data", pipelines=False) as service,
        FlightServeClient(service.location) as client,
    ):
        yield client


def test_tail_without_follow_returns_at_the_current_end(plain: FlightServeClient) -> None:
    plain.put("s", ROWS, batch_rows=1)  # offsets 0, 1, 2
    assert [(o, b.column("k").to_pylist()) for o, b in plain.tail("s")] == [
        (0, ["a"]),
        (1, ["b"]),
        (2, ["c"]),
    ]
    assert [o for o, _ in plain.tail("s", 2)] == [2]
    assert list(plain.tail("s", 3)) == []  # at the end: nothing, at once
    assert list(plain.tail("s", 10)) == []
    plain.end_input("s", writer="w")  # a marker at offset 3
    assert [(e.offset, e.end_of_input) for e in plain.tail_entries("s", 2)] == [
        (2, False),
        (3, True),
    ]
    assert [o for o, _ in plain.tail("s", 0)] == [0, 1, 2]  # markers are not yielded


def test_tail_with_follow_sees_appends_until_closed(plain: FlightServeClient) -> None:
    plain.put("s", ROWS, batch_rows=3)  # offset 0
    seen: queue.Queue[int] = queue.Queue()
    stop = threading.Event()

    def consume() -> None:
        with FlightServeClient(plain.location) as reader:
            for offset, _ in reader.tail("s", 0, follow=True):
                seen.put(offset)
                if stop.is_set():
                    break

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert seen.get(timeout=10) == 0
    plain.put("s", ROWS)  # offset 1, after the tail began
    assert seen.get(timeout=10) == 1
    stop.set()
    plain.put("s", ROWS)  # offset 2: read, then the loop breaks
    assert seen.get(timeout=10) == 2
    thread.join(timeout=10)
    assert not thread.is_alive()
