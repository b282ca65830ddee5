"""Write the shared test vectors of schemas/vectors/ with the server's own encoders.

    python schemas/vectors/generate.py           # (re)write the .bin files and manifest.json
    python schemas/vectors/generate.py --check   # exit 1, naming the files, if any is stale

Run it with the project's virtual environment (it imports flight_serve and flight_serve_client).
What each kind holds and how its ``decoded`` is written: schemas/vectors/README.md. The Python
test tests/contract/test_shared_vectors.py reads the files back with the server's decoders; the
Rust (clients/rust/tests/vectors.rs) and Java clients read the same files.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from flight_serve.flight.doput import encode_put_error, encode_put_result
from flight_serve.flight.markers import Marker
from flight_serve.flight.plugin_exchange import _json as plugin_json
from flight_serve.flight.tickets import (
    AnyTicket,
    QueryTicket,
    StreamPin,
    StreamRangeTicket,
    TailTicket,
    encode_ticket,
)
from flight_serve_client.plugin import hello_message
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
VERSION = 1

INCARNATION = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
OTHER_INCARNATION = "6fa459ea-ee8a-3ca4-894e-db77e160355e"

#: The "double" plugin of tests/integration/plugin_proc.py and clients/rust (bin double_plugin).
DOUBLE_IN = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
DOUBLE_OUT = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v2", pa.int64())])
def _enrich_example() -> Any:
    """clients/examples/enrich_plugin.py as a module (its schemas are the vector's, not a copy)."""
    path = Path(__file__).resolve().parents[2] / "clients" / "examples" / "enrich_plugin.py"
    spec = importlib.util.spec_from_file_location("enrich_plugin_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The enrich plugin of clients/examples/enrich_plugin.py (zoned timestamps, int32, float64).
_ENRICH = _enrich_example()
ENRICH_IN: pa.Schema = _ENRICH.INPUT_SCHEMA
ENRICH_OUT: pa.Schema = _ENRICH.OUTPUT_SCHEMA


# --- Flight's FlightData message (Flight.proto), built here: the venv has no compiled Flight.proto


def _flight_data_class() -> type[Message]:
    """``arrow.flight.protocol.FlightData`` with the fields a DoExchange message uses:
    ``data_header = 2``, ``app_metadata = 3``, ``data_body = 1000`` (all bytes; the descriptor,
    field 1, is only on a call's first message and never in a vector)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="flight_serve_vectors_flight_data.proto",
        package="flight_serve_vectors",
        syntax="proto3",
    )
    message = file.message_type.add(name="FlightData")
    for name, number in (("data_header", 2), ("app_metadata", 3), ("data_body", 1000)):
        message.field.add(
            name=name,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    cls: type[Message] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("flight_serve_vectors.FlightData")
    )
    return cls


FlightData = _flight_data_class()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated length prefix")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def encode_frames(messages: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """``(data_header, app_metadata, data_body)`` triples as length-delimited FlightData
    messages (protobuf's delimited format: a varint length before each)."""
    out = bytearray()
    for header, metadata, body in messages:
        data = FlightData(data_header=header, app_metadata=metadata, data_body=body)
        raw = data.SerializeToString(deterministic=True)
        out += _varint(len(raw)) + raw
    return bytes(out)


def decode_frames(data: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """The inverse of :func:`encode_frames`.

    Raises:
        ValueError: a truncated length prefix or message.
    """
    out = []
    at = 0
    while at < len(data):
        size, at = _read_varint(data, at)
        if at + size > len(data):
            raise ValueError(f"truncated FlightData message at byte {at}")
        message = FlightData()
        message.ParseFromString(data[at : at + size])
        out.append(
            (
                bytes(message.data_header),
                bytes(message.app_metadata),
                bytes(message.data_body),
            )
        )
        at += size
    return out


def ipc_parts(payload: pa.Schema | pa.RecordBatch) -> tuple[bytes, bytes]:
    """``(data_header, data_body)`` of a schema or record batch as Flight sends it: the IPC
    message's flatbuffer and its body (no continuation marker or length prefix)."""
    message = pa.ipc.read_message(payload.serialize())
    return message.metadata.to_pybytes(), message.body.to_pybytes() if message.body else b""


def read_batch(frames: list[tuple[bytes, bytes, bytes]]) -> pa.RecordBatch:
    """The record batch of a schema frame followed by a batch frame."""
    (schema_header, _, _), (batch_header, _, body) = frames
    stream = (
        b"\xff\xff\xff\xff"
        + len(schema_header).to_bytes(4, "little")
        + schema_header
        + b"\xff\xff\xff\xff"
        + len(batch_header).to_bytes(4, "little")
        + batch_header
        + body
    )
    return pa.ipc.open_stream(pa.py_buffer(stream)).read_next_batch()


# --- decoded forms ------------------------------------------------------------------------------


def schema_fields(schema: pa.Schema) -> list[dict[str, Any]]:
    """A schema as text: ``[{"name", "type", "nullable"}]``, ``type`` as pyarrow prints it
    (``string``, ``int32``, ``int64``, ``double``, ``timestamp[s]``, ``timestamp[us, tz=UTC]``)."""
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]


def column_values(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    """Each column's values as JSON: timestamps as integers in their unit, nulls as null."""
    out: dict[str, list[Any]] = {}
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            column = column.cast(pa.int64())
        out[field.name] = column.to_pylist()
    return out


def ticket_dict(data: bytes) -> dict[str, Any]:
    """The ticket's protobuf JSON form (MessageToDict, proto field names; uint64 as strings,
    fields at their default left out)."""
    from flight_serve._proto.flight_serve.v1 import ticket_pb2

    message = ticket_pb2.Ticket()
    message.ParseFromString(data)
    value: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return value


def hello_dict(data: bytes) -> dict[str, Any]:
    """The hello's JSON with each base64 IPC schema replaced by :func:`schema_fields`."""
    value: dict[str, Any] = json.loads(data)
    for key in ("input_schema", "output_schema"):
        value[key] = schema_fields(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value[key]))))
    return value


def frames_dict(direction: str, data: bytes) -> dict[str, Any]:
    """A plugin frame's decoded form: its direction, app_metadata JSON and, for a batch, the
    schema, row count and column values."""
    frames = decode_frames(data)
    value: dict[str, Any] = {
        "direction": direction,
        "app_metadata": json.loads(frames[-1][1]),
    }
    if len(frames) == 2:
        batch = read_batch(frames)
        value["schema"] = schema_fields(batch.schema)
        value["num_rows"] = batch.num_rows
        value["columns"] = column_values(batch)
    return value


# --- the vectors --------------------------------------------------------------------------------


def _tickets() -> Iterator[tuple[str, AnyTicket]]:
    yield (
        "ticket_query",
        QueryTicket(
            "SELECT carrier, count(*) AS n FROM flights JOIN airlines USING (carrier) GROUP BY carrier",
            (StreamPin("flights", INCARNATION, 7), StreamPin("airlines", OTHER_INCARNATION, 1)),
        ),
    )
    yield ("ticket_query_unicode", QueryTicket("SELECT 'Zürich ✈' AS city, 1 AS n", ()))
    yield ("ticket_stream_range", StreamRangeTicket("flights", INCARNATION, 2, 9))
    yield ("ticket_tail_from_zero", TailTicket("events.v2", INCARNATION, 0))
    yield ("ticket_tail_max_offset", TailTicket("e", OTHER_INCARNATION, 2**63 - 1))


def _double_batch(column: str, values: list[int]) -> pa.RecordBatch:
    schema = DOUBLE_IN if column == "v" else DOUBLE_OUT
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["a", None, "ü"], pa.string()),
            pa.array([1_700_000_000, 1_700_000_001, None], pa.timestamp("s")),
            pa.array(values, pa.int64()),
        ],
        schema=schema,
    )


def _batch_frame(batch: pa.RecordBatch, metadata: bytes) -> bytes:
    schema_header, _ = ipc_parts(batch.schema)
    header, body = ipc_parts(batch)
    return encode_frames([(schema_header, b"", b""), (header, metadata, body)])


def _metadata_frame(metadata: bytes) -> bytes:
    return encode_frames([(b"", metadata, b"")])


def vectors() -> list[tuple[dict[str, Any], bytes]]:
    """Every vector as ``(manifest entry, file bytes)``, in manifest order."""
    out: list[tuple[dict[str, Any], bytes]] = []

    def add(name: str, kind: str, data: bytes, decoded: dict[str, Any]) -> None:
        out.append(({"name": name, "kind": kind, "file": f"{name}.bin", "decoded": decoded}, data))

    for name, ticket in _tickets():
        data = encode_ticket(ticket)
        add(name, "ticket", data, ticket_dict(data))

    for name, plugin, (schema_in, schema_out), max_in_flight in (
        ("plugin_hello_double", "double", (DOUBLE_IN, DOUBLE_OUT), 8),
        ("plugin_hello_enrich", "enrich", (ENRICH_IN, ENRICH_OUT), 4),
    ):
        data = hello_message(plugin, schema_in, schema_out, max_in_flight)
        add(name, "plugin_hello", data, hello_dict(data))

    server = "server_to_plugin"
    plugin = "plugin_to_server"
    frames = [
        (
            "plugin_frame_accepted",
            server,
            _metadata_frame(
                plugin_json({"accepted": True, "protocol": 1, "instance": 3, "heartbeat_ms": 1000})
                .to_pybytes()
            ),
        ),
        ("plugin_frame_heartbeat", server, _metadata_frame(plugin_json({"heartbeat": True}).to_pybytes())),
        ("plugin_frame_closing", server, _metadata_frame(plugin_json({"closing": True}).to_pybytes())),
        (
            "plugin_frame_input_batch",
            server,
            _batch_frame(_double_batch("v", [1, -2, 2**62]), plugin_json({"seq": 17}).to_pybytes()),
        ),
        (
            "plugin_frame_result_batch",
            plugin,
            _batch_frame(_double_batch("v2", [2, -4, 2**63 - 2]), b'{"seq":17}'),
        ),
        ("plugin_frame_plugin_heartbeat", plugin, _metadata_frame(b'{"heartbeat":true}')),
        (
            "plugin_frame_plugin_error",
            plugin,
            _metadata_frame(b'{"error":"weather table missing: gave up"}'),
        ),
    ]
    for name, direction, data in frames:
        add(name, "plugin_frame", data, frames_dict(direction, data))

    for name, data in (
        ("put_result_batch", encode_put_result(0, 65536)),
        ("put_result_watermark", encode_put_result(5, 0, Marker(watermark_ns=1_700_000_000_123_456_789))),
        ("put_result_end_of_input", encode_put_result(6, 0, Marker(end_of_input=True))),
        ("put_result_error", encode_put_error("stream 'flights': disk full")),
    ):
        add(name, "put_result_metadata", data, json.loads(data))
    return out


def manifest_bytes(entries: list[dict[str, Any]]) -> bytes:
    text = json.dumps({"version": VERSION, "vectors": entries}, indent=2, ensure_ascii=False)
    return (text + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the files are current")
    args = parser.parse_args(argv)
    items = vectors()
    wanted = {HERE / entry["file"]: data for entry, data in items}
    wanted[MANIFEST] = manifest_bytes([entry for entry, _ in items])
    stale = [p for p, data in wanted.items() if not p.exists() or p.read_bytes() != data]
    extra = sorted(p for p in HERE.glob("*.bin") if p not in wanted)
    if args.check:
        if stale or extra:
            for p in stale:
                print(f"stale or missing: {p.relative_to(HERE)}", file=sys.stderr)
            for p in extra:
                print(f"not a vector (remove it): {p.relative_to(HERE)}", file=sys.stderr)
            print("run: python schemas/vectors/generate.py", file=sys.stderr)
            return 1
        print(f"{len(items)} vectors current")
        return 0
    for p in stale:
        p.write_bytes(wanted[p])
    for p in extra:
        p.unlink()
    print(f"{len(items)} vectors; wrote {len(stale)} files, removed {len(extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
