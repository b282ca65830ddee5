"""Limits and overload: concurrent streaming calls beyond the limit get UNAVAILABLE with a retry
hint (and slots come back, also after refused calls), and one slow uploader does not stall
another client's small query."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.roles import load_tokens_file
from flight_serve.flight.server import start_server

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("x", pa.int64())])


def one_batch() -> pa.RecordBatch:
    return pa.record_batch([pa.array([1, 2, 3])], schema=SCHEMA)


def test_streams_beyond_the_limit_are_unavailable_and_retryable(tmp_path: Path) -> None:
    with (
        start_server(tmp_path / "data", max_streams=2, pipelines=False) as service,
        flight.FlightClient(service.location) as client,
    ):
        held = []
        for name in ("a", "b"):
            writer, reader = client.do_put(flight.FlightDescriptor.for_path(name), SCHEMA)
            writer.write_batch(one_batch())
            reader.read()
            held.append((writer, reader))
        with pytest.raises(flight.FlightUnavailableError, match="retryable") as caught:
            client.do_get(flight.Ticket(b"anything")).read_all()
        assert "too many concurrent streams (2" in str(caught.value)
        assert json.loads(caught.value.extra_info) == {"retryable": True}
        # Unary calls are not limited.
        assert len(list(client.list_flights())) == 2
        for writer, _ in held:
            writer.done_writing()
            writer.close()
        deadline = time.monotonic() + 10
        while True:  # the slots come back once the uploads have ended
            try:
                info = client.get_flight_info(flight.FlightDescriptor.for_path("a"))
                assert client.do_get(info.endpoints[0].ticket).read_all().num_rows == 3
                break
            except flight.FlightUnavailableError:
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_refused_calls_give_their_slots_back(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text("tok read,write\n")
    with (
        start_server(
            tmp_path / "data", max_streams=2, tokens=load_tokens_file(tokens_file), pipelines=False
        ) as service,
        flight.FlightClient(service.location) as client,
    ):
        for _ in range(10):  # no token: refused by auth
            with pytest.raises(flight.FlightUnauthenticatedError):
                client.do_get(flight.Ticket(b"x")).read_all()
        for _ in range(10):  # a bad ticket: refused by the handler
            with pytest.raises(pa.ArrowInvalid):
                client.do_get(
                    flight.Ticket(b"x"),
                    options=flight.FlightCallOptions(headers=[(b"authorization", b"Bearer tok")]),
                ).read_all()
        options = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer tok")])
        writer, reader = client.do_put(
            flight.FlightDescriptor.for_path("s"), SCHEMA, options=options
        )
        writer.write_batch(one_batch())
        writer.done_writing()
        reader.read()
        writer.close()


def test_a_slow_uploader_does_not_stall_another_clients_query(tmp_path: Path) -> None:
    with start_server(tmp_path / "data", pipelines=False) as service:
        with flight.FlightClient(service.location) as setup:
            writer, reader = setup.do_put(flight.FlightDescriptor.for_path("small"), SCHEMA)
            writer.write_batch(one_batch())
            writer.done_writing()
            reader.read()
            writer.close()
        stop = threading.Event()
        sent = []

        def slow_upload() -> None:
            with flight.FlightClient(service.location) as client:
                w, r = client.do_put(flight.FlightDescriptor.for_path("slow"), SCHEMA)
                while not stop.is_set():
                    w.write_batch(one_batch())
                    r.read()
                    sent.append(time.monotonic())
                    stop.wait(1.0)  # one batch a second
                w.done_writing()
                w.close()

        uploader = threading.Thread(target=slow_upload)
        uploader.start()
        try:
            deadline = time.monotonic() + 10
            while not sent:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            timings = []
            with flight.FlightClient(service.location) as client:
                for _ in range(5):
                    started = time.monotonic()
                    descriptor = flight.FlightDescriptor.for_command(
                        "SELECT count(*) AS n FROM small"
                    )
                    info = client.get_flight_info(descriptor)
                    table = client.do_get(info.endpoints[0].ticket).read_all()
                    timings.append(time.monotonic() - started)
                    assert table.column("n").to_pylist() == [3]
                    time.sleep(0.2)
            assert max(timings) < 0.5, timings  # while the upload is open between its batches
            assert len(sent) >= 1
        finally:
            stop.set()
            uploader.join(30)
