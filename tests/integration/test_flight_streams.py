"""Streams over Flight, end to end: a real in-process server on port 0 per test (STYLE habit 6)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.config import ServerConfig
from flight_serve.flight.server import serve_forever, start_server
from flight_serve.flight.service import FlightServeService
from flight_serve.flight.tickets import decode_ticket
from flight_serve.store import StreamStore
from flight_serve.store import log as stream_log

pytestmark = pytest.mark.integration

FOUR_MIB = 4 * 1024 * 1024
TIMEOUT = flight.FlightCallOptions(timeout=20)


def put(client: flight.FlightClient, name: str, *batches: pa.RecordBatch) -> list[dict[str, int]]:
    """DoPut ``batches``; return the PutResult app_metadata of each, read as it is acknowledged."""
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(name), batches[0].schema)
    acks = []
    with writer:
        for batch in batches:
            writer.write_batch(batch)
            acks.append(json.loads(reader.read().to_pybytes()))
    return acks


def flights_batch(origins: list[str], delays: list[float]) -> pa.RecordBatch:
    return pa.record_batch(
        {"origin": pa.array(origins, pa.string()), "delay": pa.array(delays, pa.float64())}
    )


def query(client: flight.FlightClient, sql: str) -> tuple[flight.FlightInfo, pa.Table]:
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql), TIMEOUT)
    table = client.do_get(info.endpoints[0].ticket, TIMEOUT).read_all()
    return info, table


def read_batches(client: flight.FlightClient, ticket: flight.Ticket) -> list[pa.RecordBatch]:
    batches = []
    for chunk in client.do_get(ticket, TIMEOUT):
        assert chunk.data is not None
        batches.append(chunk.data)
    return batches


def still_serving(location: str) -> None:
    """A second, fresh client gets a normal answer."""
    with flight.connect(location) as other:
        _, table = query(other, "SELECT 41 + 1 AS answer")
        assert table.to_pydict() == {"answer": [42]}


def test_doput_then_sql_round_trip(client: flight.FlightClient) -> None:
    acks = put(
        client,
        "flights",
        flights_batch(["EWR", "JFK", "EWR"], [10.0, -2.0, 4.0]),
        flights_batch(["LGA"], [7.5]),
        flights_batch([], []),
    )
    assert acks == [{"offset": 0, "rows": 3}, {"offset": 1, "rows": 1}, {"offset": 2, "rows": 0}]

    info, table = query(
        client,
        "SELECT origin, count(*) AS n, sum(delay) AS total FROM flights "
        "GROUP BY origin ORDER BY origin",
    )
    assert info.schema == pa.schema(
        [
            ("origin", pa.string()),
            pa.field("n", pa.int64(), nullable=False),
            ("total", pa.float64()),
        ]
    )
    assert table.schema == info.schema
    assert table.to_pydict() == {
        "origin": ["EWR", "JFK", "LGA"],
        "n": [2, 1, 1],
        "total": [14.0, -2.0, 7.5],
    }
    (pin,) = decode_ticket(info.endpoints[0].ticket.ticket).pins  # type: ignore[union-attr]
    assert (pin.stream, pin.stop_offset) == ("flights", 3)


def test_a_query_ticket_reads_only_up_to_the_offsets_pinned_at_planning(
    client: flight.FlightClient,
) -> None:
    put(client, "t", pa.record_batch({"x": [1, 2]}))
    info = client.get_flight_info(flight.FlightDescriptor.for_command("SELECT sum(x) AS s FROM t"))
    put(client, "t", pa.record_batch({"x": [100]}))
    assert client.do_get(info.endpoints[0].ticket).read_all().to_pydict() == {"s": [3]}
    assert query(client, "SELECT sum(x) AS s FROM t")[1].to_pydict() == {"s": [103]}


def test_path_flight_info_schema_and_list_flights(client: flight.FlightClient) -> None:
    put(client, "b.stream", pa.record_batch({"k": ["a", "b"]}), pa.record_batch({"k": ["c"]}))
    put(client, "a", pa.record_batch({"v": pa.array([1.5], pa.float64())}))

    info = client.get_flight_info(flight.FlightDescriptor.for_path("b.stream"))
    assert info.schema == pa.schema([("k", pa.string())])
    assert info.total_records == 3
    expected_bytes = sum(pa.record_batch({"k": ks}).serialize().size for ks in (["a", "b"], ["c"]))
    assert info.total_bytes == expected_bytes
    assert info.descriptor.path == [b"b.stream"]
    meta = json.loads(info.app_metadata)
    assert (meta["first_offset"], meta["next_offset"]) == (0, 2)
    assert len(meta["incarnation"]) == 36
    (writer,) = meta["writers"]  # one DoPut, one writer; it has not ended
    assert meta["writers"][writer] == {
        "first_offset": 0,
        "last_offset": 1,
        "watermark_ns": None,
        "ended_at": None,
    }
    assert client.do_get(info.endpoints[0].ticket).read_all().to_pydict() == {"k": ["a", "b", "c"]}

    assert client.get_schema(flight.FlightDescriptor.for_path("a")).schema == pa.schema(
        [("v", pa.float64())]
    )
    sql_schema = client.get_schema(
        flight.FlightDescriptor.for_command('SELECT upper(k) AS u FROM "b.stream"')
    ).schema
    assert sql_schema == pa.schema([("u", pa.string())])

    listed = list(client.list_flights())
    assert [f.descriptor.path for f in listed] == [[b"a"], [b"b.stream"]]
    assert [f.total_records for f in listed] == [1, 3]


def test_actions_drop_and_tail(client: flight.FlightClient) -> None:
    actions = [(a.type, bool(a.description)) for a in client.list_actions()]
    stream_actions = [a for a in actions if a[0].startswith("stream.")]
    assert stream_actions == [
        ("stream.drop", True),
        ("stream.tail", True),
        ("stream.writer_wait", True),
    ]
    assert ("CreatePreparedStatement", True) in actions  # Flight SQL (test_flightsql_adbc.py)
    put(client, "gone", pa.record_batch({"x": [1]}))
    (result,) = client.do_action(flight.Action("stream.drop", b'{"stream": "gone"}'))
    assert json.loads(result.body.to_pybytes()) == {"dropped": "gone"}
    assert list(client.list_flights()) == []
    with pytest.raises(pa.ArrowKeyError, match="stream 'gone' does not exist"):
        client.get_flight_info(flight.FlightDescriptor.for_path("gone"))
    with pytest.raises(pa.ArrowKeyError, match="stream 'gone' does not exist"):
        list(client.do_action(flight.Action("stream.drop", b'{"stream": "gone"}')))
    with pytest.raises(pa.ArrowInvalid, match="unknown action 'nope'"):
        list(client.do_action(flight.Action("nope", b"")))
    with pytest.raises(pa.ArrowInvalid, match='"offset" must be an integer >= 0'):
        list(client.do_action(flight.Action("stream.tail", b'{"stream": "x", "offset": -1}')))


def test_streams_survive_a_server_restart(tmp_path: Path) -> None:
    with start_server(tmp_path / "data") as first, flight.connect(first.location) as c:
        put(c, "t", pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [3]}))
    with start_server(tmp_path / "data") as second, flight.connect(second.location) as c:
        assert query(c, "SELECT x FROM t ORDER BY x")[1].to_pydict() == {"x": [1, 2, 3]}
        assert put(c, "t", pa.record_batch({"x": [4]})) == [{"offset": 2, "rows": 1}]


def test_schema_mismatch_is_invalid_argument_and_earlier_batches_stay(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    put(client, "t", pa.record_batch({"x": pa.array([1], pa.int64()), "y": ["a"]}))
    bad = pa.record_batch({"x": pa.array(["1"]), "z": [True]})
    with pytest.raises(pa.ArrowInvalid) as info:
        put(client, "t", bad)
    assert str(info.value).startswith(
        "batch schema does not match stream 't': missing field 'y' (string); "
        "unexpected field 'z' (bool); retyped field 'x' (stream has int64, batch has string)"
    )
    assert server.store.info("t").next_offset == 1
    still_serving(server.location)


def test_a_mismatch_mid_upload_keeps_the_batches_before_it(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    # The upload's schema matches when it starts; the stream is re-created with another schema
    # by a concurrent writer half way through.
    writer, reader = client.do_put(
        flight.FlightDescriptor.for_path("t"), pa.schema([("x", pa.int64())])
    )
    writer.write_batch(pa.record_batch({"x": pa.array([1], pa.int64())}))
    assert json.loads(reader.read().to_pybytes()) == {"offset": 0, "rows": 1}
    server.store.drop("t")
    server.store.append("t", pa.record_batch({"other": ["q"]}))
    writer.write_batch(pa.record_batch({"x": pa.array([2], pa.int64())}))
    with pytest.raises(pa.ArrowInvalid, match="missing field 'other'"):
        writer.close()
    assert [b.to_pydict() for b in server.store.batches("t")] == [{"other": ["q"]}]
    still_serving(server.location)


def test_bad_sql_is_invalid_argument_with_datafusion_message(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    with pytest.raises(pa.ArrowInvalid, match=r"SQL error: ParserError\(\"Expected: an SQL"):
        client.get_flight_info(flight.FlightDescriptor.for_command("SELEC 1"))
    with pytest.raises(pa.ArrowInvalid, match="DDL not supported"):
        client.get_flight_info(flight.FlightDescriptor.for_command("CREATE TABLE x (a INT)"))
    put(client, "t", pa.record_batch({"s": ["not a number"]}))
    _, t = query(client, "SELECT 1 AS one FROM t")
    assert t.to_pydict() == {"one": [1]}
    info = client.get_flight_info(
        flight.FlightDescriptor.for_command("SELECT CAST(s AS INT) FROM t")
    )
    with pytest.raises(pa.ArrowInvalid, match="Cannot cast string 'not a number'"):
        client.do_get(info.endpoints[0].ticket).read_all()  # fails while running
    still_serving(server.location)


def test_malformed_and_stale_tickets_are_invalid_argument(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    with pytest.raises(pa.ArrowInvalid, match="malformed ticket"):
        client.do_get(flight.Ticket(b"\xff\x00garbage")).read_all()
    with pytest.raises(pa.ArrowInvalid, match="unknown ticket version 0"):
        client.do_get(flight.Ticket(b"")).read_all()

    put(client, "t", pa.record_batch({"x": [1]}))
    sql_info = client.get_flight_info(flight.FlightDescriptor.for_command("SELECT x FROM t"))
    path_info = client.get_flight_info(flight.FlightDescriptor.for_path("t"))
    list(client.do_action(flight.Action("stream.drop", b'{"stream": "t"}')))
    put(client, "t", pa.record_batch({"x": [2]}))  # same name, new incarnation
    for info in (sql_info, path_info):
        with pytest.raises(pa.ArrowInvalid, match="stale ticket: stream 't' incarnation"):
            client.do_get(info.endpoints[0].ticket).read_all()
    still_serving(server.location)


def test_too_large_batch_names_the_limit(tmp_path: Path) -> None:
    with start_server(tmp_path / "data", max_batch_bytes=1000) as service:
        with flight.connect(service.location) as c:
            put(c, "t", pa.record_batch({"x": pa.array(range(10), pa.int64())}))
            with pytest.raises(
                pa.ArrowInvalid, match="exceeds the maximum batch size of 1000 bytes"
            ):
                put(c, "t", pa.record_batch({"x": pa.array(range(1000), pa.int64())}))
        still_serving(service.location)


def test_a_refused_first_put_leaves_no_stream_behind(tmp_path: Path) -> None:
    """A DoPut refused on its first batch (over ``max_batch_bytes``) drops the stream it created,
    as Flight SQL ingest does; it used to leave an empty stream of that schema (``big2``, 0 rows)
    the user never made. A stream that existed before (with rows, or empty) is left as it was."""
    small = pa.record_batch({"x": pa.array(range(10), pa.int64())})  # 80 bytes
    large = pa.record_batch({"x": pa.array(range(1000), pa.int64())})  # 8,000 bytes
    with start_server(tmp_path / "data", max_batch_bytes=1000) as service:
        with flight.connect(service.location) as c:
            with pytest.raises(pa.ArrowInvalid, match="exceeds the maximum batch size of 1000"):
                put(c, "big2", large)
            with pytest.raises(pa.ArrowKeyError, match="stream 'big2' does not exist"):
                c.get_flight_info(flight.FlightDescriptor.for_path("big2"))
            assert not (tmp_path / "data" / "streams" / "big2").exists()
            # existing streams stay: one with rows, one created empty by a put of no batch
            put(c, "t", small)
            writer, _ = c.do_put(flight.FlightDescriptor.for_path("e"), small.schema)
            writer.close()
            before = {n: service.store.info(n).incarnation for n in ("t", "e")}
            for name in ("t", "e"):
                with pytest.raises(pa.ArrowInvalid, match="exceeds the maximum batch size"):
                    put(c, name, large)
            assert {n: service.store.info(n).incarnation for n in ("t", "e")} == before
            assert [b.to_pydict() for b in service.store.batches("t")] == [small.to_pydict()]
            assert service.store.batches("e") == []
            assert [i.descriptor.path for i in c.list_flights()] == [[b"e"], [b"t"]]
        still_serving(service.location)


def _open_put(
    service: FlightServeService, c: flight.FlightClient, name: str, schema: pa.Schema
) -> flight.FlightStreamWriter:
    """A DoPut to ``name`` whose call has created the stream (it waits for that)."""
    writer, _ = c.do_put(flight.FlightDescriptor.for_path(name), schema)
    deadline = time.monotonic() + 20
    while not service.store.exists(name):
        assert time.monotonic() < deadline, f"the DoPut did not create {name}"
        time.sleep(0.01)
    return writer


def _write_and_close(writer: flight.FlightStreamWriter, batch: pa.RecordBatch) -> None:
    writer.write_batch(batch)
    writer.close()


def test_a_refused_first_put_drops_its_stream_only_while_empty_and_its_own(
    tmp_path: Path,
) -> None:
    """The race of a refused first put with other writers of the new stream: the stream goes
    only if nothing is in it and it is still the incarnation the refused call created, so no
    other writer's row is lost.

    1. A opens a put (creating ``s``), B puts two batches (acknowledged), A is refused: ``s``
       stays with B's rows (dropping it whenever the refused call created it would lose them).
    2. A opens a put (creating ``u``), A is refused (``u`` goes), then B puts: a new ``u`` with
       B's rows.
    3. A opens a put (creating ``w``); ``w`` is dropped and created again, empty, by B's put of
       no batch; A is refused: B's ``w`` stays (not the incarnation A created).
    """
    small = pa.record_batch({"x": pa.array(range(10), pa.int64())})
    large = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    with start_server(tmp_path / "data", max_batch_bytes=1000) as service:
        with flight.connect(service.location) as a, flight.connect(service.location) as b:
            first = _open_put(service, a, "s", small.schema)
            assert put(b, "s", small, small) == [
                {"offset": 0, "rows": 10},
                {"offset": 1, "rows": 10},
            ]
            with pytest.raises(pa.ArrowInvalid, match="exceeds the maximum batch size"):
                _write_and_close(first, large)
            assert [x.num_rows for x in service.store.batches("s")] == [10, 10]

            first = _open_put(service, a, "u", small.schema)
            created = service.store.info("u").incarnation
            with pytest.raises(pa.ArrowInvalid, match="exceeds the maximum batch size"):
                _write_and_close(first, large)
            assert not service.store.exists("u")
            assert put(b, "u", small) == [{"offset": 0, "rows": 10}]
            assert service.store.info("u").incarnation != created
            assert [x.num_rows for x in service.store.batches("u")] == [10]

            first = _open_put(service, a, "w", small.schema)
            service.store.drop("w")
            writer, _ = b.do_put(flight.FlightDescriptor.for_path("w"), small.schema)
            writer.close()
            again = service.store.info("w").incarnation
            with pytest.raises(pa.ArrowInvalid, match="exceeds the maximum batch size"):
                _write_and_close(first, large)
            assert service.store.info("w").incarnation == again
            assert service.store.batches("w") == []
        still_serving(service.location)


def test_a_large_result_arrives_in_batches_of_at_most_4_mib(client: flight.FlightClient) -> None:
    rows = 20_000
    text = pa.array([f"{i:08d}" + "x" * 992 for i in range(rows)], pa.string())  # 1000 B each
    put(client, "big", pa.record_batch({"i": pa.array(range(rows), pa.int64()), "s": text}))

    info = client.get_flight_info(flight.FlightDescriptor.for_command("SELECT i, s FROM big"))
    batches = read_batches(client, info.endpoints[0].ticket)
    sizes = [b.nbytes for b in batches]
    assert max(sizes) <= FOUR_MIB
    assert sum(b.num_rows for b in batches) == rows
    assert any(size > FOUR_MIB // 2 for size in sizes)  # DataFusion's 8 MiB batches were split
    table = pa.Table.from_batches(batches).sort_by("i")
    assert table.column("s").to_pylist() == text.to_pylist()

    # The stored batch itself is ~20 MB; reading the stream by path splits it too.
    path_info = client.get_flight_info(flight.FlightDescriptor.for_path("big"))
    batches = read_batches(client, path_info.endpoints[0].ticket)
    assert len(batches) >= 5
    assert max(b.nbytes for b in batches) <= FOUR_MIB
    assert pa.Table.from_batches(batches).column("s").to_pylist() == (text.to_pylist())


def test_a_tail_numbers_the_pieces_of_a_batch_above_4_mib(client: flight.FlightClient) -> None:
    rows = 12_000
    text = pa.array([f"{i:08d}" + "x" * 992 for i in range(rows)], pa.string())  # ~12 MB
    put(client, "big", pa.record_batch({"s": text}), pa.record_batch({"s": ["small"]}))
    (result,) = client.do_action(flight.Action("stream.tail", b'{"stream": "big", "offset": 0}'))
    reader = client.do_get(flight.Ticket(result.body.to_pybytes()), TIMEOUT)
    chunks = []
    while len(chunks) < 2 or chunks[-1][1]["offset"] == 0:
        c = reader.read_chunk()
        assert c.data is not None
        assert c.app_metadata is not None
        chunks.append((c.data, json.loads(c.app_metadata.to_pybytes())))
    reader.cancel()
    *pieces, (last, last_meta) = chunks
    n = len(pieces)
    assert n >= 3
    assert [m for _, m in pieces] == [
        {"offset": 0, "writer": "", "next_offset": 2, "piece": i, "pieces": n} for i in range(n)
    ]
    assert all(b.nbytes <= FOUR_MIB for b, _ in pieces)
    assert pa.Table.from_batches([b for b, _ in pieces]).column("s").to_pylist() == text.to_pylist()
    assert (last.to_pydict(), last_meta) == (
        {"s": ["small"]},
        {"offset": 1, "writer": "", "next_offset": 2},  # sent whole
    )


def test_view_types_are_sent_as_plain_types(client: flight.FlightClient) -> None:
    put(client, "t", pa.record_batch({"s": ["a", "b"]}))
    info, table = query(
        client,
        "SELECT arrow_cast(s, 'Utf8View') AS v, "
        "arrow_cast(make_array(1, 2), 'ListView(Int64)') AS l FROM t ORDER BY s",
    )
    assert info.schema.field("v").type == pa.string()
    assert info.schema.field("l").type == pa.list_(pa.int64())
    assert table.to_pydict() == {"v": ["a", "b"], "l": [[1, 2], [1, 2]]}


def test_a_tail_sees_batches_appended_after_it_started(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    put(client, "live", pa.record_batch({"x": [0]}))
    (result,) = client.do_action(
        flight.Action("stream.tail", json.dumps({"stream": "live", "offset": 0}).encode())
    )
    reader = client.do_get(flight.Ticket(result.body.to_pybytes()), TIMEOUT)

    def chunk() -> tuple[list[Any], dict[str, int]]:
        c = reader.read_chunk()
        assert c.app_metadata is not None
        assert c.data is not None
        meta = json.loads(c.app_metadata.to_pybytes())
        assert meta.pop("writer") == ""  # unnamed DoPuts: the stream's unnamed writer
        return c.data.column(0).to_pylist(), meta

    assert chunk() == ([0], {"offset": 0, "next_offset": 1})
    with flight.connect(server.location) as writer_client:
        put(writer_client, "live", pa.record_batch({"x": [1, 2]}))
        assert chunk() == ([1, 2], {"offset": 1, "next_offset": 2})
        put(writer_client, "live", pa.record_batch({"x": [3]}))
        assert chunk() == ([3], {"offset": 2, "next_offset": 3})
        list(writer_client.do_action(flight.Action("stream.drop", b'{"stream": "live"}')))
    with pytest.raises(StopIteration):  # a dropped stream ends the tail
        reader.read_chunk()


def test_a_tail_from_a_later_offset_and_shutdown_ends_it(tmp_path: Path) -> None:
    with start_server(tmp_path / "data") as service, flight.connect(service.location) as c:
        put(c, "s", *[pa.record_batch({"x": [i]}) for i in range(3)])
        (result,) = c.do_action(flight.Action("stream.tail", b'{"stream": "s", "offset": 2}'))
        reader = c.do_get(flight.Ticket(result.body.to_pybytes()), TIMEOUT)
        first = reader.read_chunk().data
        assert first is not None
        assert first.to_pydict() == {"x": [2]}
        # Leaving the block shuts the server down while the tail waits; it must not hang.


def _raw_grpc_code(location: str, method: str, request: bytes, streaming: bool) -> grpc.StatusCode:
    target = location.removeprefix("grpc://")
    with grpc.insecure_channel(target) as channel:
        path = f"/arrow.flight.protocol.FlightService/{method}"
        try:
            if streaming:
                list(channel.unary_stream(path)(request, timeout=10))
            else:
                channel.unary_unary(path)(request, timeout=10)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
    raise AssertionError(f"{method} succeeded")


def _len_prefixed(field: int, data: bytes) -> bytes:
    assert len(data) < 128
    return bytes([field << 3 | 2, len(data)]) + data


def test_a_missing_table_is_not_found_naming_it(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    """GetFlightInfo / GetSchema (``cmd = <SQL>``) of a table that does not exist is NOT_FOUND
    naming the table, as Flight SQL says it (test_flightsql_adbc.py: "table 'nope' does not
    exist", NOT_FOUND); it used to be INVALID_ARGUMENT with DataFusion's message only."""
    said = (
        "table 'nope' does not exist (Error during planning: table 'datafusion.public.nope' "
        "not found)"
    )
    for call in (client.get_flight_info, client.get_schema):
        with pytest.raises(pa.ArrowKeyError) as caught:
            call(flight.FlightDescriptor.for_command("SELECT count(*) FROM nope"))
        assert str(caught.value).split(" (request id ")[0] == said
    put(client, "t", pa.record_batch({"x": [1]}))  # a join with one missing table
    with pytest.raises(pa.ArrowKeyError, match=r"^table 'nope' does not exist \("):
        client.get_flight_info(
            flight.FlightDescriptor.for_command("SELECT * FROM t JOIN nope ON t.x = nope.x")
        )
    cmd = b"\x08\x02" + _len_prefixed(2, b"SELECT * FROM nope")
    assert _raw_grpc_code(server.location, "GetFlightInfo", cmd, False) == grpc.StatusCode.NOT_FOUND
    still_serving(server.location)


def test_status_codes_on_the_wire(server: FlightServeService, client: flight.FlightClient) -> None:
    """What a non-pyarrow gRPC client sees (the table in flight_serve.flight.status)."""
    loc = server.location
    # FlightDescriptor{type=CMD(2), cmd=...}
    bad_sql = b"\x08\x02" + _len_prefixed(2, b"SELEC 1")
    assert _raw_grpc_code(loc, "GetFlightInfo", bad_sql, False) == grpc.StatusCode.INVALID_ARGUMENT
    # FlightDescriptor{type=PATH(1), path=["missing"]}
    missing = b"\x08\x01" + _len_prefixed(3, b"missing")
    assert _raw_grpc_code(loc, "GetFlightInfo", missing, False) == grpc.StatusCode.NOT_FOUND
    # Ticket{ticket=garbage}
    bad_ticket = _len_prefixed(1, b"\xff\xffnope")
    assert _raw_grpc_code(loc, "DoGet", bad_ticket, True) == grpc.StatusCode.INVALID_ARGUMENT
    # Action{type="stream.drop", body={"stream": "missing"}}
    drop = _len_prefixed(1, b"stream.drop") + _len_prefixed(2, b'{"stream": "missing"}')
    assert _raw_grpc_code(loc, "DoAction", drop, True) == grpc.StatusCode.NOT_FOUND
    unknown = _len_prefixed(1, b"no.such.action")
    assert _raw_grpc_code(loc, "DoAction", unknown, True) == grpc.StatusCode.INVALID_ARGUMENT

    # pyarrow clients see the matching exception classes.
    with pytest.raises(pa.ArrowInvalid):
        client.get_flight_info(flight.FlightDescriptor.for_command("SELEC 1"))
    with pytest.raises(pa.ArrowKeyError):
        client.get_flight_info(flight.FlightDescriptor.for_path("missing"))
    cmd_writer, _ = client.do_put(
        flight.FlightDescriptor.for_command("x"), pa.schema([("a", pa.int8())])
    )
    with pytest.raises(pa.ArrowInvalid, match="expected a path descriptor"):
        cmd_writer.close()


def test_an_internal_failure_is_internal_not_unknown(
    server: FlightServeService, client: flight.FlightClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(server.store, "list_streams", broken)
    with pytest.raises(flight.FlightInternalError, match=r"internal error \w+ \(RuntimeError\)"):
        list(client.list_flights())


def test_serve_forever_logs_json_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flight_serve.cli",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--fsync",
            "never",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        location = proc.stdout.readline().strip()
        assert location.startswith("grpc://127.0.0.1:")
        with flight.connect(location) as c:
            assert put(c, "t", pa.record_batch({"x": [1]})) == [{"offset": 0, "rows": 1}]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    lines = [json.loads(line) for line in stderr.splitlines()]
    msgs = [line["msg"] for line in lines]
    assert "listening" in msgs
    assert msgs[-2:] == ["shutting down", "stopped"]
    listening = lines[msgs.index("listening")]
    assert listening["location"] == location
    assert listening["level"] == "info"
    assert lines[-2]["signal"] == "SIGTERM"
    assert all({"ts", "level", "msg"} <= line.keys() for line in lines)


def test_concurrent_puts_and_queries(server: FlightServeService) -> None:
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            with flight.connect(server.location) as c:
                put(c, "shared", *[pa.record_batch({"x": [k * 10 + i]}) for i in range(5)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with flight.connect(server.location) as c:
        _, table = query(c, "SELECT count(*) AS n, sum(x) AS s FROM shared")
    assert table.to_pydict() == {
        "n": [20],
        "s": [sum(k * 10 + i for k in range(4) for i in range(5))],
    }


def test_serve_forever_returns_1_when_the_data_dir_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    level = root.level
    try:
        with StreamStore(tmp_path / "data"):
            config = ServerConfig(tmp_path / "data", host="127.0.0.1", port=0, fsync="never")
            assert serve_forever(config) == 1
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    (line,) = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert line["msg"].startswith("cannot serve: data dir")
    assert (line["level"], line["error_class"]) == ("error", "StorageError")


def _frame_ends(segment: Path) -> list[int]:
    """The end position of each frame of a segment file (header: magic, body_len u64, ...)."""
    raw = segment.read_bytes()
    ends, position = [], 0
    while position < len(raw):
        position += 32 + int.from_bytes(raw[position + 4 : position + 12], "little")
        ends.append(position)
    return ends


def test_a_put_result_is_sent_only_after_an_fdatasync_covered_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Instrument the store's fdatasync: record, once it returns, how much of the file it made
    # durable (the size when it started), after a pause that gives a PutResult sent too early
    # the time to arrive first.
    durable = [0]
    real_sync = stream_log._sync

    def slow_sync(fd: int) -> None:
        size = os.fstat(fd).st_size
        time.sleep(0.02)
        real_sync(fd)
        durable.append(max(durable[-1], size))

    monkeypatch.setattr(stream_log, "_sync", slow_sync)
    small = [pa.record_batch({"x": pa.array(range(i, i + 10), pa.int64())}) for i in range(8)]
    big = pa.record_batch({"x": pa.array(range(300_000), pa.int64())})  # 2.4 MB: O_DIRECT
    batches = [small[0], big, *small[1:4], big, big, *small[4:]]
    with start_server(tmp_path / "data") as server, flight.connect(server.location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("t"), big.schema)
        seen: list[tuple[int, int]] = []  # (offset acknowledged, bytes durable when it arrived)
        with writer:
            for batch in batches:
                writer.write_batch(batch)
            writer.done_writing()
            for _ in batches:
                ack = json.loads(reader.read().to_pybytes())
                seen.append((ack["offset"], durable[-1]))
        assert server.store.info("t").next_offset == len(batches)
        (segment,) = sorted((tmp_path / "data" / "streams" / "t").glob("*.seg"))
        ends = _frame_ends(segment)
    assert [offset for offset, _ in seen] == list(range(len(batches)))
    late = [(offset, size, ends[offset]) for offset, size in seen if size < ends[offset]]
    assert late == [], "PutResults arrived before an fdatasync covered their frame"
    assert len(durable) - 1 < len(batches)  # group commit: fewer syncs than batches


@pytest.mark.parametrize("client_kind", ["flight_serve_client", "pyarrow, one batch at a time"])
def test_a_storage_failure_mid_put_is_reported_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client_kind: str
) -> None:
    # The disk fills up at the third frame. The handler thread is then blocked reading the
    # next batch while the client waits for PutResults: the client must learn of it anyway.
    real_write = stream_log.StreamLog._write_staged
    frames = 0

    def disk_full(self: stream_log.StreamLog, frame: Any) -> None:
        nonlocal frames
        frames += 1
        if frames == 3:
            raise OSError(28, "No space left on device")
        real_write(self, frame)

    monkeypatch.setattr(stream_log.StreamLog, "_write_staged", disk_full)
    batches = [pa.record_batch({"x": pa.array([i], pa.int64())}) for i in range(40)]
    outcome: list[BaseException | list[dict[str, Any]]] = []
    with start_server(tmp_path / "data") as server:

        def run() -> None:
            try:
                if client_kind == "flight_serve_client":
                    from flight_serve_client import FlightServeClient

                    with FlightServeClient(server.location) as c:
                        c.put("t", batches)
                else:
                    with flight.connect(server.location) as c:
                        outcome.append(put(c, "t", *batches))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the put hung after a storage failure"
        # What was durable before the failure stays, nothing after it (a commit that fails
        # discards every batch it covered; one batch at a time, each was committed alone).
        # (a put that created the stream and stored nothing of it drops it again)
        durable = server.store.info("t").next_offset if server.store.exists("t") else 0
        assert durable == 2 if client_kind != "flight_serve_client" else durable <= 2
        stored = [b.column(0).to_pylist() for b in server.store.batches("t")] if durable else []
        assert stored == [[i] for i in range(durable)]
    (result,) = outcome
    if client_kind == "flight_serve_client":
        assert isinstance(result, flight.FlightUnavailableError)
        assert "No space left on device" in str(result)
    else:  # a client that reads each PutResult sees {"error"}, then the status on its next write
        assert isinstance(result, flight.FlightUnavailableError) or result[2:3] == [
            {"error": "cannot append to stream 't': [Errno 28] No space left on device"}
        ]
