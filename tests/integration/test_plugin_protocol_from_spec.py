"""A plugin written from schemas/README.md ("Plugin protocol") alone, without an Arrow Flight
library: grpcio and hand-encoded ``FlightData`` frames (the four fields a plugin needs), the
Arrow IPC messages taken apart with ``pyarrow.ipc.read_message``, as a Rust (tonic) or Java
(grpc-java) developer would write it. It keeps the spec honest: if the README stops being
enough to write a working plugin, these tests fail.

The pipeline reads stream ``events`` (k string, v int64, one batch per DoPut) through the plugin
``up``, which answers (k, v, k_upper = upper(k)); the output stream ``out`` must hold every input
row exactly once.
"""

from __future__ import annotations

import base64
import json
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest
from flight_serve.flight import plugin_exchange as flight_plugins
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from helpers import act, wait_until

pytestmark = pytest.mark.integration

IN = pa.schema([("k", pa.string()), ("v", pa.int64())])
OUT = pa.schema([("k", pa.string()), ("v", pa.int64()), ("k_upper", pa.string())])
WAIT_S = 30.0
PIPELINE = """
CREATE SOURCE events (k VARCHAR, v BIGINT) WITH (connector = 'flight', stream = 'events');
CREATE FUNCTION up() RETURNS TABLE (k VARCHAR, v BIGINT, k_upper VARCHAR)
WITH (connector = 'plugin', timeout = '30s');
CREATE SINK out WITH (connector = 'flight', stream = 'out');
INSERT INTO out SELECT * FROM up(events);
"""

# --- FlightData by hand (Flight.proto: 1 flight_descriptor, 2 data_header, 3 app_metadata,
# --- 1000 data_body; FlightDescriptor: 1 type (PATH = 1), 3 path) ----------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _fields(buf: bytes) -> dict[int, bytes]:
    """The length-delimited fields of a protobuf message (varint fields skipped)."""

    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = buf[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, i

    out: dict[int, bytes] = {}
    i = 0
    while i < len(buf):
        key, i = varint(i)
        if key & 7 == 2:
            length, i = varint(i)
            out[key >> 3] = buf[i : i + length]
            i += length
        else:
            assert key & 7 == 0, f"wire type {key & 7}"
            _, i = varint(i)
    return out


def frame(
    *, descriptor: bytes = b"", header: bytes = b"", metadata: bytes = b"", body: bytes = b""
) -> bytes:
    return b"".join(
        _field(n, v)
        for n, v in ((1, descriptor), (2, header), (3, metadata), (1000, body))
        if v
    )


def path_descriptor(*path: str) -> bytes:
    return b"\x08\x01" + b"".join(_field(3, p.encode()) for p in path)


def ipc_parts(message_bytes: pa.Buffer) -> tuple[bytes, bytes]:
    """(flatbuffer header, body) of an encapsulated IPC message: FlightData's two fields."""
    message = pa.ipc.read_message(message_bytes)
    return message.metadata.to_pybytes(), message.body.to_pybytes()


def ipc_message(header: bytes, body: bytes) -> pa.ipc.Message:
    pad = (-len(header)) % 8
    prefix = struct.pack("<Ii", 0xFFFFFFFF, len(header) + pad)
    return pa.ipc.read_message(pa.py_buffer(prefix + header + b"\0" * pad + body))


def b64_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


class GrpcPlugin:
    """One plugin instance over a raw gRPC DoExchange.

    ``opening``: how the call starts: ``"descriptor_alone"`` (descriptor; hello; output schema),
    ``"descriptor_with_schema"`` (descriptor on the output schema message, as Rust's
    ``FlightDataEncoder`` sends it; then the hello), ``"hello_with_descriptor"`` (the hello's
    metadata on the descriptor's message) or ``"hello_on_schema"`` (descriptor; the hello's
    metadata on the output schema's message): the server never sees the hello of the last two. ``answer`` maps
    (the number of answers so far, input batch) to the frames to write, or ``None`` to hold it.
    """

    def __init__(
        self,
        location: str,
        opening: str = "descriptor_alone",
        answer: Callable[[int, pa.RecordBatch, int], list[bytes]] | None = None,
        output: pa.Schema = OUT,
    ) -> None:
        self.channel = grpc.insecure_channel(location.removeprefix("grpc://"))
        self.outgoing: queue.Queue[bytes | None] = queue.Queue()
        self.messages: list[dict[str, Any]] = []  # the server's metadata-only messages
        self.answered: list[int] = []
        self.ended: grpc.RpcError | None = None
        self.answer = answer or answer_upper
        hello = json.dumps(
            {"protocol": 1, "name": "up", "input_schema": b64_schema(IN),
             "output_schema": b64_schema(output), "max_in_flight": 2}
        ).encode()
        descriptor = path_descriptor("plugins", "up")
        schema_header, _ = ipc_parts(output.serialize())
        opening_frames = {
            "descriptor_alone": [
                frame(descriptor=descriptor), frame(metadata=hello), frame(header=schema_header)
            ],
            "descriptor_with_schema": [
                frame(descriptor=descriptor, header=schema_header), frame(metadata=hello)
            ],
            "hello_with_descriptor": [
                frame(descriptor=descriptor, metadata=hello), frame(header=schema_header)
            ],
            "hello_on_schema": [
                frame(descriptor=descriptor), frame(header=schema_header, metadata=hello)
            ],
        }[opening]
        for f in opening_frames:
            self.outgoing.put(f)
        self.thread = threading.Thread(target=self.main, daemon=True)
        self.thread.start()

    def requests(self) -> Iterator[bytes]:
        while (item := self.outgoing.get()) is not None:
            yield item

    def main(self) -> None:
        exchange = self.channel.stream_stream(
            "/arrow.flight.protocol.FlightService/DoExchange",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        schema: pa.Schema | None = None
        try:
            for raw in exchange(self.requests()):
                data = _fields(raw)
                header, metadata, body = data.get(2, b""), data.get(3, b""), data.get(1000, b"")
                if header and schema is None:  # the server's stream begins with input_schema
                    schema = pa.ipc.read_schema(ipc_message(header, b""))
                elif not header:
                    self.messages.append(json.loads(metadata))
                    if self.messages[-1].get("closing"):  # the server stops: finish writing
                        self.outgoing.put(None)
                else:
                    assert schema is not None
                    batch = pa.ipc.read_record_batch(ipc_message(header, body), schema)
                    seq = json.loads(metadata)["seq"]
                    for f in self.answer(len(self.answered), batch, seq):
                        self.outgoing.put(f)
                    self.answered.append(seq)
        except grpc.RpcError as exc:
            self.ended = exc

    def close(self) -> None:
        self.outgoing.put(None)
        self.thread.join(10)
        self.channel.close()


def result_frame(batch: pa.RecordBatch, seq: int) -> bytes:
    header, body = ipc_parts(batch.serialize())
    return frame(header=header, body=body, metadata=json.dumps({"seq": seq}).encode())


def upper(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch["k"], batch["v"], pc.utf8_upper(batch["k"])], schema=OUT
    )


def answer_upper(n: int, batch: pa.RecordBatch, seq: int) -> list[bytes]:
    return [result_frame(upper(batch), seq)]


# --- the server side ----------------------------------------------------------------------


def feed(location: str, n_batches: int) -> list[dict[str, Any]]:
    """Batch b: rows (k = "a<b>", v = 10 b + i) for i in 0, 1, 2; one DoPut (entry) each."""
    rows = []
    with flight.connect(location) as c:
        for b in range(n_batches):
            part = [{"k": f"a{b}", "v": 10 * b + i} for i in range(3)]
            writer, _ = c.do_put(flight.FlightDescriptor.for_path("events", "w"), IN)
            writer.write_batch(pa.RecordBatch.from_pylist(part, schema=IN))
            writer.close()
            rows += part
    return rows


def out_rows(client: flight.FlightClient, expected: int, pid: str) -> list[dict[str, Any]]:
    def count() -> int:
        try:
            return int(client.get_flight_info(flight.FlightDescriptor.for_path("out")).total_records)
        except pa.ArrowKeyError:
            return 0

    wait_until(lambda: count() >= expected, f"{expected} rows in out")
    assert act(client, "pipeline.checkpoint", {"id": pid})["completed"] is True
    info = client.get_flight_info(flight.FlightDescriptor.for_path("out"))
    return sorted(client.do_get(info.endpoints[0].ticket).read_all().to_pylist(), key=lambda r: r["v"])


def expected_out(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"k": r["k"], "v": r["v"], "k_upper": r["k"].upper()} for r in rows]


@pytest.mark.parametrize("opening", ["descriptor_alone", "descriptor_with_schema"])
def test_a_plugin_written_from_the_spec_with_grpc_only_serves_a_pipeline(
    server: FlightServeService, opening: str
) -> None:
    rows = feed(server.location, 4)
    with flight.connect(server.location) as client:
        pid = act(client, "pipeline.submit", {"sql": PIPELINE})["id"]

        def reversed_pairs(n: int, batch: pa.RecordBatch, seq: int) -> list[bytes]:
            # hold every even-numbered batch, answer the pair in reverse order (any order is
            # allowed; the pipeline emits in input order)
            if n % 2 == 0:
                held.append((batch, seq))
                return []
            first = held.pop()
            return [result_frame(upper(batch), seq), result_frame(upper(first[0]), first[1])]

        held: list[tuple[pa.RecordBatch, int]] = []
        plugin = GrpcPlugin(server.location, opening, reversed_pairs)
        try:
            assert out_rows(client, 12, pid) == expected_out(rows)
            assert plugin.messages[0] == {
                "accepted": True, "protocol": 1, "instance": 1, "heartbeat_ms": 1000
            }
            assert len(plugin.answered) == 4
            status = act(client, "pipeline.status", {"id": pid})
            # caught up: it waits for its source, not for the plugin
            assert (status["state"], status["plugin_errors"], status["waiting"]) == (
                "running", {}, "source events: waiting for new entries of stream 'events' "
                "(next offset 4)"
            )
        finally:
            plugin.close()


@pytest.mark.parametrize("opening", ["hello_with_descriptor", "hello_on_schema"])
def test_a_hello_on_the_descriptor_or_schema_message_is_not_seen_and_the_server_says_so(
    server: FlightServeService, monkeypatch: pytest.MonkeyPatch, opening: str
) -> None:
    # 0 s: the hello's metadata on the descriptor's (or the schema's) message; the server waits
    # for a hello; 1 s: it writes {"error": …}; the plugin finishes writing: INVALID_ARGUMENT
    monkeypatch.setattr(flight_plugins, "HELLO_TIMEOUT_S", 1.0)
    plugin = GrpcPlugin(server.location, opening)
    try:
        wait_until(lambda: bool(plugin.messages), "the server's error message")
        assert plugin.messages == [
            {
                "error": "plugin exchange: no hello within 1 s. The hello is the first "
                "metadata-only message after the descriptor; the server does not see "
                "app_metadata on a message that carries the descriptor or a schema, so send "
                "the hello as a message of its own (schemas/README.md)"
            }
        ]
        plugin.outgoing.put(None)
        plugin.thread.join(10)
        assert plugin.ended is not None
        assert plugin.ended.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert plugin.ended.details().startswith("plugin exchange: no hello message")
        with flight.connect(server.location) as client:  # the server serves on
            assert act(client, "plugin.list", {}) == {"instances": {}, "errors": {}}
    finally:
        plugin.close()


def test_a_server_stopping_asks_attached_plugins_to_leave_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    # a pending read of a plugin's stream when its handler returned crashed the process
    # ("pure virtual method called", about 1 run in 3); now the server writes
    # {"closing": true}, the plugin finishes writing, and only then does the handler return
    for attempt in range(4):
        with start_server(tmp_path / f"data{attempt}") as service:
            plugin = GrpcPlugin(service.location)
            messages = plugin.messages
            wait_until(lambda: bool(messages), "the accept")  # noqa: B023 - used in this pass
        plugin.thread.join(10)
        try:
            assert plugin.ended is None  # the call ended OK
            assert plugin.messages[0]["accepted"] is True
            assert plugin.messages[-1] == {"closing": True}
        finally:
            plugin.close()


def test_a_second_schema_mid_stream_detaches_the_instance_and_loses_nothing(
    server: FlightServeService,
) -> None:
    rows = feed(server.location, 4)
    other = pa.schema([("k", pa.string()), ("v", pa.string()), ("k_upper", pa.string())])

    def change_schema(n: int, batch: pa.RecordBatch, seq: int) -> list[bytes]:
        if n == 0:
            return answer_upper(n, batch, seq)
        # the second answer starts a new IPC schema on the plugin's stream: not allowed
        changed = pa.RecordBatch.from_arrays(
            [batch["k"], batch["v"].cast(pa.string()), pc.utf8_upper(batch["k"])], schema=other
        )
        header, _ = ipc_parts(other.serialize())
        return [frame(header=header), result_frame(changed, seq)]

    with flight.connect(server.location) as client:
        pid = act(client, "pipeline.submit", {"sql": PIPELINE})["id"]
        bad = GrpcPlugin(server.location, answer=change_schema)
        try:
            bad.thread.join(WAIT_S)
            assert bad.ended is not None
            assert bad.ended.code() == grpc.StatusCode.INVALID_ARGUMENT
            error = act(client, "pipeline.status", {"id": pid})["plugin_errors"]["up"]
            assert error.startswith("plugin up instance 1: its stream broke: ")
            assert act(client, "pipeline.status", {"id": pid})["waiting"] == "waiting for plugin up"
        finally:
            bad.close()
        good = GrpcPlugin(server.location)
        try:
            # the first answer was taken once; the rest went to instance 2
            assert out_rows(client, 12, pid) == expected_out(rows)
        finally:
            good.close()


def test_a_second_answer_for_one_seq_detaches_and_the_rows_are_taken_once(
    server: FlightServeService,
) -> None:
    rows = feed(server.location, 4)

    def twice(n: int, batch: pa.RecordBatch, seq: int) -> list[bytes]:
        return [result_frame(upper(batch), seq)] * 2

    with flight.connect(server.location) as client:
        pid = act(client, "pipeline.submit", {"sql": PIPELINE})["id"]
        bad = GrpcPlugin(server.location, answer=twice)
        try:
            bad.thread.join(WAIT_S)
            assert bad.ended is not None
            assert bad.ended.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert bad.ended.details().startswith(
                f"plugin up instance 1: a result for seq {bad.answered[0]}, which is not outstanding"
            )
        finally:
            bad.close()
        good = GrpcPlugin(server.location)
        try:
            assert out_rows(client, 12, pid) == expected_out(rows)
        finally:
            good.close()


def test_two_instances_of_one_name_with_different_outputs_only_the_fitting_one_is_used(
    server: FlightServeService,
) -> None:
    # instance 1 declares v as a string (not the function's RETURNS TABLE): refused, attached,
    # given no batch; instance 2 fits and answers every batch
    rows = feed(server.location, 4)
    other = pa.schema([("k", pa.string()), ("v", pa.string()), ("k_upper", pa.string())])
    with flight.connect(server.location) as client:
        pid = act(client, "pipeline.submit", {"sql": PIPELINE})["id"]
        misfit = GrpcPlugin(server.location, output=other)
        wait_until(lambda: bool(misfit.messages), "the misfit's accept")
        fit = GrpcPlugin(server.location)
        try:
            assert out_rows(client, 12, pid) == expected_out(rows)
            assert misfit.answered == []
            assert len(fit.answered) == 4
            listed = act(client, "plugin.list", {})["instances"]["up"]
            assert [(i["id"], i["sent"], i["answered"]) for i in listed] == [(1, 0, 0), (2, 4, 4)]
            assert act(client, "pipeline.status", {"id": pid})["plugin_errors"] == {
                "up": "plugin up instance 1 declares output columns that differ from FUNCTION "
                "up's RETURNS TABLE: retyped v (string, expected int64)"
            }
        finally:
            fit.close()
            misfit.close()


def test_a_big_input_batch_reaches_a_client_with_grpc_s_default_4_mib_limit_in_slices(
    server: FlightServeService,
) -> None:
    # one DoPut batch of 4,000 rows of ~2 KB (≈ 8 MB): sent whole it exceeded the 4 MiB a
    # gRPC client takes by default (grpcio, tonic, grpc-java, grpc-go) and the plugin's call
    # broke (RESOURCE_EXHAUSTED); the server now sends it in row slices of at most 3 MiB
    rows = [{"k": f"{i:04d}" + "x" * 2000, "v": i} for i in range(4000)]
    with flight.connect(server.location) as c:
        writer, _ = c.do_put(flight.FlightDescriptor.for_path("events", "w"), IN)
        writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=IN))
        writer.close()
    sizes: list[int] = []

    def measured(n: int, batch: pa.RecordBatch, seq: int) -> list[bytes]:
        sizes.append(batch.num_rows)
        assert batch.nbytes <= 3 * 1024 * 1024
        return answer_upper(n, batch, seq)

    with flight.connect(server.location) as client:
        pid = act(client, "pipeline.submit", {"sql": PIPELINE})["id"]
        plugin = GrpcPlugin(server.location, answer=measured)
        try:
            assert out_rows(client, 4000, pid) == expected_out(rows)
            assert plugin.ended is None
            assert sum(sizes) == 4000
            assert len(sizes) == 3  # ≈ 8.05 MB in slices of at most 3 MiB
        finally:
            plugin.close()


def test_the_python_client_s_attach_plugin_returns_when_the_server_stops(tmp_path: Path) -> None:
    from flight_serve_client import FlightServeClient

    outcome: list[object] = []
    with start_server(tmp_path / "data") as service:
        fs = FlightServeClient(service.location)

        def attach() -> None:
            try:
                outcome.append(fs.attach_plugin("up", upper, IN, OUT))
            except Exception as exc:  # the test reports it
                outcome.append(exc)

        thread = threading.Thread(target=attach)
        thread.start()
        wait_until(lambda: "up" in service.plugins.describe()["instances"], "the instance")
        started = time.monotonic()
    thread.join(10)
    fs.close()
    assert time.monotonic() - started < 5.0  # not CLOSE_WAIT_S: the client left on "closing"
    assert len(outcome) == 1
    stats = outcome[0]
    assert not isinstance(stats, Exception), stats
    assert (stats.instance, stats.batches) == (1, 0)  # type: ignore[attr-defined]
