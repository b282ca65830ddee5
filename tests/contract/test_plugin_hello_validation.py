"""Malformed plugin hellos: every malformed hello is ``InvalidInputError``
naming the field (the Flight status INVALID_ARGUMENT), never an internal error, and a hello the
README does not allow is not accepted."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pytest
from flight_serve.errors import InvalidInputError
from flight_serve.pipelines.plugins import PluginDeclaration

IN = pa.schema([("k", pa.string()), ("v", pa.int64())])


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hello(**fields: object) -> bytes:
    payload: dict[str, object] = {
        "protocol": 1,
        "input_schema": b64(IN.serialize().to_pybytes()),
        "output_schema": b64(IN.serialize().to_pybytes()),
    }
    payload.update(fields)
    return json.dumps(payload).encode()


def test_schema_bytes_that_are_not_a_flatbuffer_name_the_field() -> None:
    # an IPC continuation marker and a length, then bytes that are no Schema flatbuffer
    # (pyarrow raises OSError "Invalid flatbuffers message" for these, not ArrowInvalid)
    garbage = b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x00" * 16
    with pytest.raises(InvalidInputError, match="'input_schema' is not a base64 Arrow IPC"):
        PluginDeclaration.from_hello("x", hello(input_schema=b64(garbage)))


def test_a_record_batch_message_is_not_a_schema() -> None:
    batch = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=IN)
    message = batch.serialize().to_pybytes()  # an encapsulated record batch message
    with pytest.raises(InvalidInputError, match="'output_schema' is not a base64 Arrow IPC"):
        PluginDeclaration.from_hello("x", hello(output_schema=b64(message)))


def test_deeply_nested_json_is_refused_not_an_internal_error() -> None:
    with pytest.raises(InvalidInputError, match="plugin hello: not UTF-8 JSON"):
        PluginDeclaration.from_hello("x", b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("protocol", [True, 1.0, "1"])
def test_protocol_must_be_the_integer_1(protocol: object) -> None:
    with pytest.raises(InvalidInputError, match=f"'protocol' is {protocol!r}; this server speaks 1"):
        PluginDeclaration.from_hello("x", hello(protocol=protocol))


def test_schemas_without_columns_or_with_repeated_names_are_refused() -> None:
    empty = b64(pa.schema([]).serialize().to_pybytes())
    with pytest.raises(InvalidInputError, match="'input_schema' has no fields"):
        PluginDeclaration.from_hello("x", hello(input_schema=empty))
    with pytest.raises(InvalidInputError, match="'output_schema' has no fields"):
        PluginDeclaration.from_hello("x", hello(output_schema=empty))
    twice = b64(pa.schema([("a", pa.int64()), ("a", pa.string())]).serialize().to_pybytes())
    with pytest.raises(InvalidInputError, match="'output_schema' names field 'a' twice"):
        PluginDeclaration.from_hello("x", hello(output_schema=twice))
