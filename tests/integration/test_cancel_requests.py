"""Cancelling a running call: Flight SQL's ``CancelQuery`` stops a query's DoGet (and only it),
Flight's ``CancelFlightInfo`` ends a tail."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.server import start_server
from helpers import cancel_flight_info_body

pytestmark = pytest.mark.integration



def test_cancel_query_stops_a_flight_sql_doget_and_only_it(tmp_path: Path) -> None:
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    def statement(sql: str) -> flight.FlightDescriptor:
        return flight.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=sql)))

    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        info = c.get_flight_info(statement("SELECT value FROM generate_series(1, 200000000)"))
        other = c.get_flight_info(statement("SELECT value FROM generate_series(7, 100000000)"))
        ticket = info.endpoints[0].ticket
        reader = c.do_get(ticket)
        bystander = c.do_get(other.endpoints[0].ticket)
        first = reader.read_chunk().data.column(0).to_pylist()
        assert first == list(range(1, 8193))  # DataFusion's 8192-row batches
        assert bystander.read_chunk().data.column(0).to_pylist() == list(range(7, 7 + 8192))
        assert service.running.in_progress(ticket.ticket) == 1
        request = sql_pb2.ActionCancelQueryRequest(info=info.serialize())
        [result] = c.do_action(flight.Action("CancelQuery", pack(request)))
        assert result.body.to_pybytes() == pack(
            sql_pb2.ActionCancelQueryResult(
                result=sql_pb2.ActionCancelQueryResult.CANCEL_RESULT_CANCELLED
            )
        )
        started = time.monotonic()

        def drain() -> None:  # a few batches may be in flight already
            for _ in range(200000000 // 8192):
                reader.read_chunk()

        with pytest.raises(flight.FlightCancelledError):
            drain()
        assert time.monotonic() - started < 5.0
        # the other query, with its own ticket, goes on
        assert bystander.read_chunk().data.column(0).to_pylist() == list(
            range(7 + 8192, 7 + 2 * 8192)
        )
        bystander.cancel()


def test_cancel_flight_info_ends_a_tail(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        writer, reader = c.do_put(flight.FlightDescriptor.for_path("s"), schema)
        writer.write_batch(pa.record_batch([pa.array([1, 2])], schema=schema))
        writer.done_writing()
        reader.read()
        writer.close()
        [tail] = c.do_action(flight.Action("stream.tail", json.dumps({"stream": "s"}).encode()))
        ticket = flight.Ticket(tail.body.to_pybytes())
        stream = c.do_get(ticket)
        assert stream.read_chunk().data.column(0).to_pylist() == [1, 2]
        info = flight.FlightInfo(
            schema, flight.FlightDescriptor.for_path("s"), [flight.FlightEndpoint(ticket, [])]
        )
        [result] = c.do_action(flight.Action("CancelFlightInfo", cancel_flight_info_body(info)))
        assert result.body.to_pybytes() == b"\x08\x01"  # CancelFlightInfoResult{CANCELLED}
        with pytest.raises(flight.FlightCancelledError, match="CancelFlightInfo"):
            stream.read_chunk()
        # nothing in progress: still CANCELLED (no work is held for it)
        [again] = c.do_action(flight.Action("CancelFlightInfo", cancel_flight_info_body(info)))
        assert again.body.to_pybytes() == b"\x08\x01"
        # a body that is not a request, and a FlightInfo of another server's ticket
        with pytest.raises(pa.ArrowInvalid, match="CancelFlightInfoRequest"):
            list(c.do_action(flight.Action("CancelFlightInfo", b"\xff\xff")))
        foreign = flight.FlightInfo(
            schema,
            flight.FlightDescriptor.for_path("s"),
            [flight.FlightEndpoint(b"not-a-ticket", [])],
        )
        with pytest.raises(pa.ArrowInvalid, match="ticket"):
            list(c.do_action(flight.Action("CancelFlightInfo", cancel_flight_info_body(foreign))))
