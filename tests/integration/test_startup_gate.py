"""Nothing answers before the server is whole: from the first moment ``flight-serve serve``'s
Flight port accepts a connection, every role check and every action is in place (a ``read``
token never drops a stream, ``pipeline.*`` is never an unknown action)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
READ, ADMIN = "tok-read-startup", "tok-admin-startup"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _options(token: str) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {token}".encode())], timeout=10
    )


def _act(client: flight.FlightClient, token: str, action: str, body: object) -> list[bytes]:
    results = client.do_action(flight.Action(action, json.dumps(body).encode()), _options(token))
    return [r.body.to_pybytes() for r in results]


def _start(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{READ} read dash\n{ADMIN} admin,write,read ops\n")
    return subprocess.Popen(
        [str(CLI), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"),
         "--tokens-file", str(tokens), "--health-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _put_stream(location: str) -> None:
    schema = pa.schema([("x", pa.int64())])
    with flight.FlightClient(location) as client:
        writer, reader = client.do_put(
            flight.FlightDescriptor.for_path("keep"), schema, options=_options(ADMIN)
        )
        writer.write_batch(pa.record_batch([pa.array([1])], schema=schema))
        writer.done_writing()
        reader.read()
        writer.close()


@pytest.mark.parametrize("attempt", range(3))
def test_a_read_token_can_never_drop_and_pipeline_actions_exist_from_the_first_call(
    tmp_path: Path, attempt: int
) -> None:
    # The data dir already holds a stream, so a drop that got through would remove it.
    port = _free_port()
    proc = _start(tmp_path, port)
    location = f"grpc://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # listening
        _put_stream(location)
    finally:
        _stop(proc)

    proc = _start(tmp_path, port)
    answers: list[str] = []
    try:
        deadline = time.monotonic() + 30
        # Connect in a tight loop from before the port opens until the server said it listens
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.05):
                    break
            except OSError:
                continue
        with flight.FlightClient(location) as client:
            for _ in range(40):
                for action, body in (("stream.drop", {"stream": "keep"}), ("pipeline.list", {})):
                    try:
                        result = _act(client, READ, action, body)
                        answers.append(f"{action}: ok {result!r}")
                    except flight.FlightUnauthorizedError as exc:
                        answers.append(f"{action}: unauthorized {str(exc).splitlines()[0]}")
                    except flight.FlightUnavailableError:
                        answers.append(f"{action}: unavailable")
                    except pa.ArrowException as exc:
                        answers.append(f"{action}: {type(exc).__name__} {exc}")
            drops = [a for a in answers if a.startswith("stream.drop")]
            lists = [a for a in answers if a.startswith("pipeline.list")]
            assert [a for a in drops if "unauthorized" not in a] == []
            assert [a for a in lists if ": ok" not in a] == []
            assert all("needs the 'admin' role" in a for a in drops)
            info = client.get_flight_info(flight.FlightDescriptor.for_path("keep"), _options(READ))
            assert info.total_records == 1
    finally:
        _stop(proc)


def _service_with_gate(tmp_path: Path, gate: object) -> object:
    from flight_serve.flight.service import FlightServeService
    from flight_serve.store import StreamStore

    return FlightServeService(store=StreamStore(tmp_path / "d"), middleware={"gate": gate})


def test_the_gate_holds_calls_until_open_and_a_failed_start_ends_them(tmp_path: Path) -> None:
    import threading

    from flight_serve.flight.startup import StartupGate

    for ending in ("open", "refuse"):
        gate = StartupGate(wait_s=30)
        service: Any = _service_with_gate(tmp_path / ending, gate)
        outcome: list[str] = []

        def call(service: Any = service, outcome: list[str] = outcome) -> None:
            with flight.FlightClient(service.location) as client:
                try:
                    list(client.do_action(flight.Action("stream.tail", b'{"stream": "none"}')))
                except flight.FlightUnavailableError as exc:
                    outcome.append(f"unavailable: {str(exc).split('. Detail')[0]}")
                except pa.ArrowException as exc:
                    outcome.append(f"answered: {type(exc).__name__}")

        try:
            caller = threading.Thread(target=call)
            started = time.monotonic()
            caller.start()
            time.sleep(0.5)
            assert outcome == []  # held
            getattr(gate, ending)()
            caller.join(10)
            assert time.monotonic() - started < 5
            expected = (
                ["answered: ArrowKeyError"]
                if ending == "open"
                else ["unavailable: the server failed to start (retryable: try again after a "
                      "short delay)"]
            )
            assert outcome == expected
        finally:
            service.shutdown()
            service.store.close()
