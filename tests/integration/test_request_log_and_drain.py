"""flight-serve serve: one JSON log line per call with its request id, and SIGTERM's drain
deadline (an upload held open does not keep the server from exiting 0; what was acknowledged
stays)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
SCHEMA = pa.schema([("x", pa.int64())])


@contextmanager
def serve(data: Path, log_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    with open(log_path, "a") as log_file:
        proc = subprocess.Popen(
            [str(CLI), "serve", "--port", "0", "--data-dir", str(data), *args],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    try:
        assert proc.stdout is not None
        location = proc.stdout.readline().strip()
        assert location, log_path.read_text()
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def log_entries(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]


def test_each_call_logs_one_json_line_with_its_request_id(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    with serve(tmp_path / "data", log_path) as (proc, location):
        with flight.FlightClient(location) as client:
            options = flight.FlightCallOptions(headers=[(b"x-request-id", b"req-123")])
            assert list(client.list_flights(options=options)) == []
            with pytest.raises(pa.ArrowKeyError):
                client.get_flight_info(flight.FlightDescriptor.for_path("missing"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    rpcs = [e for e in log_entries(log_path) if e["msg"] == "rpc"]
    listed = [e for e in rpcs if e["method"] == "ListFlights"]
    assert len(listed) == 1
    assert listed[0]["request_id"] == "req-123"
    assert listed[0]["code"] == "OK"
    assert listed[0]["level"] == "info"
    assert listed[0]["duration_ms"] >= 0
    (failed,) = [e for e in rpcs if e["method"] == "GetFlightInfo"]
    assert re.fullmatch(r"[0-9a-f]{16}", failed["request_id"])
    assert failed["code"] == "NOT_FOUND"
    assert failed["level"] == "warning"
    assert "stream 'missing' does not exist" in failed["error"]


def test_sigterm_drain_deadline_exits_0_and_acknowledged_rows_stay(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    with serve(data, log_path, "--drain-timeout", "1") as (proc, location):
        client = flight.FlightClient(location)
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("held"), SCHEMA)
        writer.write_batch(pa.record_batch([pa.array([1, 2, 3])], schema=SCHEMA))
        assert json.loads(reader.read().to_pybytes()) == {"offset": 0, "rows": 3}
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the upload stays open
        assert proc.wait(30) == 0, log_path.read_text()
        assert time.monotonic() - started < 15
        messages = [e["msg"] for e in log_entries(log_path)]
        assert "drain deadline passed: exiting with calls still in flight" in messages

        def write_more() -> None:
            writer.write_batch(pa.record_batch([pa.array([4])], schema=SCHEMA))
            writer.done_writing()
            reader.read()

        with pytest.raises(flight.FlightError):
            write_more()  # the server is gone
        client.close()
    with serve(data, log_path) as (proc, location), flight.FlightClient(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("held"))
        table = client.do_get(info.endpoints[0].ticket).read_all()
        assert table.column("x").to_pylist()[:3] == [1, 2, 3]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
