"""The plugin protocol (schemas/README.md, "Plugin protocol") is a wire contract: a hello written
byte for byte as the README says keeps parsing to the same declaration, and the Python client's
hello is what the server parses."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pytest
from flight_serve.errors import InvalidInputError
from flight_serve.flight.plugin_exchange import HEARTBEAT_S
from flight_serve.pipelines.plugins import MAX_IN_FLIGHT_LIMIT, PROTOCOL_VERSION, PluginDeclaration
from flight_serve_client.plugin import PROTOCOL_VERSION as CLIENT_PROTOCOL_VERSION
from flight_serve_client.plugin import hello_message

IN = pa.schema([("origin", pa.string()), ("time_hour", pa.timestamp("us", tz="UTC"))])
OUT = pa.schema([*IN, ("temp", pa.float64())])

# IN as an encapsulated IPC schema message (continuation marker FF FF FF FF, length, flatbuffer,
# padding), base64, as pyarrow 26 wrote it; these bytes must keep decoding to IN.
PINNED_INPUT_SCHEMA = (
    "/////7gAAAAQAAAAAAAKAAwABgAFAAgACgAAAAABBAAMAAAACAAIAAAABAAIAAAABAAAAAIAAABcAAAABAAAALz///8A"
    "AAEKEAAAACQAAAAEAAAAAAAAAAkAAAB0aW1lX2hvdXIAAAAIAAwABgAIAAgAAAAAAAIABAAAAAMAAABVVEMAEAAUAAgA"
    "BgAHAAwAAAAQABAAAAAAAAEFEAAAABwAAAAEAAAAAAAAAAYAAABvcmlnaW4AAAQABAAEAAAA"
)


def test_versions_and_limits_are_pinned() -> None:
    assert PROTOCOL_VERSION == CLIENT_PROTOCOL_VERSION == 1
    assert MAX_IN_FLIGHT_LIMIT == 1024
    assert HEARTBEAT_S == 1.0


def test_a_readme_hello_parses() -> None:
    hello = json.dumps(
        {
            "protocol": 1,
            "name": "enrich",
            "input_schema": PINNED_INPUT_SCHEMA,
            "output_schema": base64.b64encode(OUT.serialize().to_pybytes()).decode(),
            "max_in_flight": 4,
        }
    ).encode()
    declaration = PluginDeclaration.from_hello("enrich", hello)
    assert declaration.input_schema == IN
    assert declaration.output_schema == OUT
    assert (declaration.max_in_flight, declaration.protocol) == (4, 1)


def test_name_and_max_in_flight_are_optional() -> None:
    hello = json.dumps(
        {"protocol": 1, "input_schema": PINNED_INPUT_SCHEMA, "output_schema": PINNED_INPUT_SCHEMA}
    ).encode()
    assert PluginDeclaration.from_hello("x", hello).max_in_flight == 4


def test_the_python_client_hello_is_what_the_server_parses() -> None:
    declaration = PluginDeclaration.from_hello("enrich", hello_message("enrich", IN, OUT, 7))
    assert (declaration.input_schema, declaration.output_schema) == (IN, OUT)
    assert declaration.max_in_flight == 7


def test_a_schema_that_is_not_base64_ipc_is_refused_naming_the_field() -> None:
    for bad in ("not base64!", base64.b64encode(b"an Arrow schema? no").decode()):
        hello = json.dumps(
            {"protocol": 1, "input_schema": PINNED_INPUT_SCHEMA, "output_schema": bad}
        ).encode()
        with pytest.raises(InvalidInputError, match="'output_schema' is not a base64 Arrow IPC"):
            PluginDeclaration.from_hello("x", hello)
