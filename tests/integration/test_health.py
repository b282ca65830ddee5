"""The grpc.health.v1 service beside the Flight port, seen by a real gRPC health client:
SERVING while the server runs, NOT_SERVING while it drains (SIGTERM) and while the data directory
is not writable."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.health import FLIGHT_SERVICE_NAME, HealthServer
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(port: int, service: str = "") -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_for(port: int, status: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while check(port) != status:
        assert time.monotonic() < deadline, f"health never became {status}"
        time.sleep(0.05)


# Private: the gRPC health server alone, without a Flight server.
@pytest.fixture
def health(tmp_path: Path) -> Iterator[tuple[HealthServer, Path]]:
    data = tmp_path / "data"
    data.mkdir()
    server = HealthServer("127.0.0.1", 0, data, check_interval_s=0.05)
    try:
        yield server, data
    finally:
        server.stop(0)


def test_serving_for_both_names_and_unknown_names_are_not_found(
    health: tuple[HealthServer, Path],
) -> None:
    server, _ = health
    assert check(server.port) == SERVING
    assert check(server.port, FLIGHT_SERVICE_NAME) == SERVING
    with pytest.raises(grpc.RpcError) as caught:
        check(server.port, "some.other.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_not_serving_while_the_data_dir_is_not_writable(
    health: tuple[HealthServer, Path],
) -> None:
    server, data = health
    assert check(server.port) == SERVING
    shutil.rmtree(data)  # (chmod does not stop root, so the directory goes away instead)
    wait_for(server.port, NOT_SERVING)
    assert check(server.port, FLIGHT_SERVICE_NAME) == NOT_SERVING
    data.mkdir()
    wait_for(server.port, SERVING)


def test_draining_is_not_serving(health: tuple[HealthServer, Path]) -> None:
    server, _ = health
    server.set_draining()
    assert check(server.port) == NOT_SERVING
    assert check(server.port, FLIGHT_SERVICE_NAME) == NOT_SERVING


def test_serve_reports_serving_then_not_serving_while_draining_an_open_doput(
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [
                str(CLI),
                "serve",
                "--port",
                "0",
                "--health-port",
                "0",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    try:
        assert proc.stdout is not None
        location = proc.stdout.readline().strip()
        assert location, log_path.read_text()
        listening = next(
            json.loads(line)
            for line in log_path.read_text().splitlines()
            if json.loads(line)["msg"] == "listening"
        )
        port = int(listening["health_port"])
        assert check(port) == SERVING
        assert check(port, FLIGHT_SERVICE_NAME) == SERVING

        # An upload in flight keeps the server draining after SIGTERM.
        schema = pa.schema([("x", pa.int64())])
        with flight.FlightClient(location) as client:
            writer, reader = client.do_put(flight.FlightDescriptor.for_path("drain"), schema)
            writer.write_batch(pa.record_batch([pa.array([1, 2, 3])], schema=schema))
            reader.read()  # the batch is durable
            proc.send_signal(signal.SIGTERM)
            wait_for(port, NOT_SERVING)
            assert check(port, FLIGHT_SERVICE_NAME) == NOT_SERVING
            assert proc.poll() is None  # still draining the open upload
            writer.done_writing()
            writer.close()
        assert proc.wait(30) == 0, log_path.read_text()
        messages = [json.loads(line)["msg"] for line in log_path.read_text().splitlines()]
        assert "shutting down" in messages
        assert messages[-1] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
