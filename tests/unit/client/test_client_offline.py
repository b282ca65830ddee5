"""flight_serve_client against a tiny pyarrow server that speaks the wire contract (schemas/README.md).

The fake server is not flight-serve: it only replays the contract's message shapes (PutResult JSON,
tail offsets, the DoExchange result / late / ack / done sequence) so the client's side of each
protocol is tested without the real server. tests/integration/test_client.py runs the client
against the real one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve_client import ExchangeEvent, FlightServeClient, ProtocolError


def _json(value: dict[str, Any]) -> pa.Buffer:
    return pa.py_buffer(json.dumps(value).encode())


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class ContractServer(flight.FlightServerBase):
    """Streams in memory; ``SELECT * FROM name`` as the only query; a toy exchange."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.streams: dict[str, list[pa.RecordBatch]] = {}
        # Tail connection i is dropped after tail_drop_plan[i] messages; later ones run out.
        self.tail_drop_plan: list[int] = []
        self.tail_pieces = False  # send every batch as one-row pieces sharing its offset
        self.tail_numbered = False  # number the pieces: {"offset", "piece", "pieces"}
        self.tail_requests: list[int] = []
        self.put_acks_missing = False

    # DoPut: one PutResult per batch.
    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        name = descriptor.path[0].decode()  # type: ignore[index]
        log = self.streams.setdefault(name, [])
        if log and log[0].schema != reader.schema:
            raise pa.ArrowInvalid(f"schema mismatch for stream {name!r}")
        for chunk in reader:
            log.append(chunk.data)
            if not self.put_acks_missing:
                writer.write(_json({"offset": len(log) - 1, "rows": chunk.data.num_rows}))

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            name = descriptor.path[0].decode()  # type: ignore[index]
            if name not in self.streams:
                raise KeyError(f"no stream {name!r}")
            table = pa.Table.from_batches(self.streams[name])
            info = flight.FlightInfo(
                table.schema,
                descriptor,
                [flight.FlightEndpoint(f"range:{name}", [])],
                table.num_rows,
                table.nbytes,
                app_metadata=json.dumps(
                    {"first_offset": 0, "next_offset": len(self.streams[name]), "incarnation": 1}
                ).encode(),
            )
            return info
        sql = descriptor.command.decode()  # type: ignore[union-attr]
        words = sql.split()
        if words[:3] != ["SELECT", "*", "FROM"] or len(words) != 4:
            raise pa.ArrowInvalid(f"SQL error: cannot parse {sql!r}")
        name = words[3]
        if name not in self.streams:
            raise pa.ArrowKeyError(f"table '{name}' does not exist")  # NOT_FOUND, as flight-serve
        schema = self.streams[name][0].schema
        # Two endpoints: the client must read both, in order.
        endpoints = [
            flight.FlightEndpoint(f"half:0:{name}", []),
            flight.FlightEndpoint(
                f"half:1:{name}", [flight.Location("arrow-flight-reuse-connection://?")]
            ),
        ]
        return flight.FlightInfo(schema, descriptor, endpoints, -1, -1)

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        text = ticket.ticket.decode()
        if text.startswith("{"):
            return self._tail(json.loads(text))
        kind, _, rest = text.partition(":")
        if kind == "range":
            return flight.RecordBatchStream(pa.Table.from_batches(self.streams[rest]))
        half, _, name = rest.partition(":")
        log = self.streams[name]
        mid = len(log) // 2
        part = log[:mid] if half == "0" else log[mid:]
        return flight.RecordBatchStream(pa.Table.from_batches(part, schema=log[0].schema))

    def _tail(self, request: dict[str, Any]) -> flight.FlightDataStream:
        log = self.streams[request["stream"]]
        start = request["offset"]
        drop_after = self.tail_drop_plan.pop(0) if self.tail_drop_plan else -1

        def batches() -> Iterator[tuple[pa.RecordBatch, pa.Buffer]]:
            sent = 0
            for offset in range(start, len(log)):
                batch = log[offset]
                pieces = (
                    [batch.slice(i, 1) for i in range(batch.num_rows)]
                    if self.tail_pieces
                    else [batch]
                )
                for i, piece in enumerate(pieces):
                    numbered = {"piece": i, "pieces": len(pieces)} if self.tail_numbered else {}
                    yield piece, _json({"offset": offset, **numbered})
                    sent += 1
                    if sent == drop_after:
                        raise flight.FlightUnavailableError("connection dropped")

        return flight.GeneratorStream(log[0].schema, batches())

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        body = json.loads(action.body.to_pybytes())
        if action.type == "stream.drop":
            if body["stream"] not in self.streams:
                raise KeyError(f"no stream {body['stream']!r}")
            del self.streams[body["stream"]]
            return iter([json.dumps({"dropped": body["stream"]}).encode()])
        if action.type == "stream.tail":
            if body["stream"] not in self.streams:
                raise KeyError(f"no stream {body['stream']!r}")
            self.tail_requests.append(body["offset"])
            return iter([json.dumps(body).encode()])
        raise pa.ArrowInvalid(f"unknown action {action.type!r}")

    def list_flights(
        self, context: flight.ServerCallContext, criteria: str
    ) -> Iterator[flight.FlightInfo]:
        for name in self.streams:
            yield self.get_flight_info(context, flight.FlightDescriptor.for_path(name))
        yield flight.FlightInfo(
            pa.schema([]), flight.FlightDescriptor.for_path("pipelines", "p1"), [], -1, -1
        )

    # DoExchange: results = rows with v >= 0 (one result batch per input batch); rows with v < 0
    # are "late"; the flush after done_writing emits one more result row.
    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        if descriptor.command != b"ECHO":
            raise pa.ArrowInvalid("not a windowed query (line 1, column 1)")
        schema = reader.schema
        writer.begin(schema)
        late_total = 0
        for index, chunk in enumerate(reader):
            batch = chunk.data
            assert batch is not None
            values = batch.column("v").to_pylist()
            on_time = [i for i, v in enumerate(values) if v >= 0]
            late = [i for i, v in enumerate(values) if v < 0]
            if on_time:
                writer.write_with_metadata(batch.take(on_time), _json({"input_batch": index}))
            if late:
                late_table = pa.Table.from_batches([batch.take(late)]).append_column(
                    "_late_reason", pa.array(["late"] * len(late))
                )
                writer.write_metadata(pa.py_buffer(_ipc(late_table)))
                late_total += len(late)
            writer.write_metadata(
                _json({"ack": index, "watermark_ns": index * 10, "late_rows": late_total})
            )
        flush = pa.RecordBatch.from_pylist([{"k": "flush", "v": 0}], schema=schema)
        writer.write_with_metadata(flush, _json({"input_batch": None}))
        writer.write_metadata(_json({"done": True, "watermark_ns": None, "late_rows": late_total}))


# Private: a Flight server that follows the wire contract only, so the client is tested without flight-serve.
@pytest.fixture
def server() -> Iterator[ContractServer]:
    with ContractServer() as srv:
        yield srv


@pytest.fixture
def client(server: ContractServer) -> Iterator[FlightServeClient]:
    with FlightServeClient(f"grpc://127.0.0.1:{server.port}") as c:
        yield c


TABLE = pa.table({"k": ["a", "b", "c", "d", "e"], "v": [1, 2, 3, 4, 5]})


def test_put_slices_into_batches_and_reports_durable_rows(
    client: FlightServeClient, server: ContractServer
) -> None:
    progress: list[int] = []
    assert client.put("s", TABLE, batch_rows=2, on_progress=progress.append) == 2
    assert progress == [2, 4, 5]
    assert [b.num_rows for b in server.streams["s"]] == [2, 2, 1]
    # Appending continues the offsets; an iterable of batches works too.
    assert client.put("s", iter(TABLE.to_batches())) == 3


def test_put_of_nothing_sends_nothing(client: FlightServeClient, server: ContractServer) -> None:
    assert client.put("s", TABLE.slice(0, 0)) == -1
    assert client.put("s", []) == -1
    assert server.streams == {}


def test_put_schema_mismatch_is_arrow_invalid(client: FlightServeClient) -> None:
    client.put("s", TABLE)
    with pytest.raises(pa.ArrowInvalid, match="schema mismatch"):
        client.put("s", pa.table({"other": [1.0]}))


def test_put_without_put_results_is_a_protocol_error(
    client: FlightServeClient, server: ContractServer
) -> None:
    server.put_acks_missing = True
    with pytest.raises(ProtocolError, match="0 PutResults for 1 batches"):
        client.put("s", TABLE)


def test_put_rejects_bad_batch_rows(client: FlightServeClient) -> None:
    with pytest.raises(ValueError, match="batch_rows"):
        client.put("s", TABLE, batch_rows=0)


def test_query_reads_every_endpoint_in_order(client: FlightServeClient) -> None:
    client.put("s", TABLE, batch_rows=1)
    assert client.query("SELECT * FROM s").to_pydict() == TABLE.to_pydict()
    assert sum(b.num_rows for b in client.query_batches("SELECT * FROM s")) == 5


def test_query_errors(client: FlightServeClient) -> None:
    with pytest.raises(pa.ArrowInvalid, match="cannot parse"):
        client.query("SELEC nonsense")
    with pytest.raises(pa.ArrowKeyError, match="table 'missing' does not exist"):
        client.query("SELECT * FROM missing")


def test_stream_info_list_and_drop(client: FlightServeClient) -> None:
    client.put("b", TABLE, batch_rows=2)
    client.put("a", TABLE)
    info = client.stream_info("b")
    assert info["name"] == "b"
    assert info["schema"] == TABLE.schema
    assert info["total_records"] == 5
    assert (info["first_offset"], info["next_offset"], info["incarnation"]) == (0, 3, 1)
    assert client.list_streams() == ["a", "b"]  # the pipeline flight is not a stream
    client.drop("b")
    assert client.list_streams() == ["a"]
    with pytest.raises(KeyError):
        client.stream_info("b")
    with pytest.raises(KeyError):
        client.drop("b")


def test_tail_yields_offsets_and_resumes_after_a_drop(
    client: FlightServeClient, server: ContractServer
) -> None:
    client.put("s", TABLE, batch_rows=1)
    server.tail_drop_plan = [2, 2]
    seen = [(offset, batch.column("k")[0].as_py()) for offset, batch in client.tail("s", 1)]
    assert seen == [(1, "b"), (2, "c"), (3, "d"), (4, "e")]
    # Each reconnection asked from the last offset seen (and skipped its rows already seen).
    assert server.tail_requests == [1, 2, 3]


def test_tail_resumes_inside_a_batch_split_into_pieces(
    client: FlightServeClient, server: ContractServer
) -> None:
    client.put("s", TABLE, batch_rows=3)  # offsets 0: a b c, 1: d e
    server.tail_pieces = True  # one row per message, like a batch above 4 MiB split in pieces
    server.tail_drop_plan = [2, 4]
    seen = [(offset, batch.column("k").to_pylist()) for offset, batch in client.tail("s")]
    # Connection 1: a b | drop. Connection 2 from offset 0: a b (skipped) c d | drop.
    # Connection 3 from offset 1: d (skipped) e.
    assert seen == [(0, ["a"]), (0, ["b"]), (0, ["c"]), (1, ["d"]), (1, ["e"])]
    assert server.tail_requests == [0, 0, 1]


def test_tail_resumes_after_the_last_piece_of_a_numbered_split_batch(
    client: FlightServeClient, server: ContractServer
) -> None:
    client.put("s", TABLE, batch_rows=3)  # offsets 0: a b c, 1: d e
    server.tail_pieces = server.tail_numbered = True
    server.tail_drop_plan = [3, 1]
    seen = [(offset, batch.column("k").to_pylist()) for offset, batch in client.tail("s")]
    # Connection 1: a b c (piece 2 of 3: offset 0 is complete) | drop. Connection 2 from
    # offset 1: d | drop. Connection 3 from offset 1: d (skipped) e.
    assert seen == [(0, ["a"]), (0, ["b"]), (0, ["c"]), (1, ["d"]), (1, ["e"])]
    assert server.tail_requests == [0, 1, 1]


def test_tail_without_reconnect_raises(client: FlightServeClient, server: ContractServer) -> None:
    client.put("s", TABLE, batch_rows=1)
    server.tail_drop_plan = [1]
    tail = client.tail("s", 0, reconnect=False)
    assert next(tail)[0] == 0
    with pytest.raises(flight.FlightUnavailableError):
        next(tail)


def test_tail_can_be_closed_early(client: FlightServeClient) -> None:
    client.put("s", TABLE, batch_rows=1)
    assert [offset for offset, _ in itertools.islice(client.tail("s"), 2)] == [0, 1]


def test_exchange_reads_results_late_rows_and_acks_in_order(client: FlightServeClient) -> None:
    batches = [
        pa.record_batch({"k": ["a", "b"], "v": [1, -1]}),
        pa.record_batch({"k": ["c"], "v": [-2]}),
        pa.record_batch({"k": ["d"], "v": [4]}),
    ]
    events = list(client.exchange("ECHO", batches))
    assert [(e.kind, e.input_batch) for e in events] == [
        ("result", 0),
        ("late", 0),
        ("ack", 0),
        ("late", 1),
        ("ack", 1),
        ("result", 2),
        ("ack", 2),
        ("result", None),
        ("done", None),
    ]
    late = events[1]
    assert late.batch is not None
    assert late.batch.to_pydict() == {"k": ["b"], "v": [-1], "_late_reason": ["late"]}
    assert events[2].metadata == {"ack": 0, "watermark_ns": 0, "late_rows": 1}
    assert events[-1] == ExchangeEvent(
        "done", None, {"done": True, "watermark_ns": None, "late_rows": 2}, None
    )


def test_exchange_table_collects_results_and_late_rows(client: FlightServeClient) -> None:
    table = pa.table({"k": ["a", "b", "c", "d"], "v": [1, -1, 3, -4]})
    results, late = client.exchange_table("ECHO", table, batch_rows=2)
    assert results.to_pydict() == {"k": ["a", "c", "flush"], "v": [1, 3, 0]}
    assert late.to_pydict() == {"k": ["b", "d"], "v": [-1, -4], "_late_reason": ["late", "late"]}


def test_exchange_table_without_late_rows_has_an_empty_late_table(
    client: FlightServeClient,
) -> None:
    results, late = client.exchange_table("ECHO", pa.table({"k": ["a"], "v": [1]}))
    assert results.num_rows == 2
    assert late.num_rows == 0
    assert late.schema.names == ["k", "v", "_late_reason", "_window_start", "_window_end"]


def test_exchange_of_no_batches_needs_a_schema(client: FlightServeClient) -> None:
    with pytest.raises(ValueError, match="schema"):
        client.exchange("ECHO", [])
    schema = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.int64())])
    assert [e.kind for e in client.exchange("ECHO", [], schema=schema)] == ["result", "done"]


def test_exchange_bad_sql_is_arrow_invalid(client: FlightServeClient) -> None:
    with pytest.raises(pa.ArrowInvalid, match="line 1, column 1"):
        list(client.exchange("SELECT 1", [pa.record_batch({"k": ["a"], "v": [1]})]))


def test_location_without_scheme(server: ContractServer) -> None:
    with FlightServeClient(f"127.0.0.1:{server.port}") as c:
        assert c.location.startswith("grpc+tcp://")
        assert c.list_streams() == []
