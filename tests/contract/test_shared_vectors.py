"""The shared test vectors (schemas/vectors/) are what the server writes and reads: its decoders
read every file to the manifest's ``decoded``, its encoders write the same bytes back, and the
committed files are what ``generate.py`` makes now. The Rust and Java clients test the same files.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from flight_serve._proto.flight_serve.v1 import ticket_pb2
from flight_serve.flight.doput import encode_put_error, encode_put_result
from flight_serve.flight.markers import Marker
from flight_serve.flight.plugin_exchange import _json as plugin_json
from flight_serve.flight.plugin_exchange import _metadata as plugin_metadata
from flight_serve.flight.tickets import decode_ticket, encode_ticket
from flight_serve.pipelines.plugins import PluginDeclaration
from flight_serve_client.plugin import hello_message
from google.protobuf import json_format

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "schemas" / "vectors"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shared_vectors_generate", VECTORS / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()
MANIFEST: dict[str, Any] = json.loads((VECTORS / "manifest.json").read_text("utf-8"))
ENTRIES: list[dict[str, Any]] = MANIFEST["vectors"]


def of_kind(kind: str) -> list[Any]:
    return [pytest.param(e, id=e["name"]) for e in ENTRIES if e["kind"] == kind]


def data_of(entry: dict[str, Any]) -> bytes:
    return (VECTORS / entry["file"]).read_bytes()


def test_manifest_shape() -> None:
    assert set(MANIFEST) == {"version", "vectors"}
    assert MANIFEST["version"] == 1
    kinds = {"ticket", "plugin_hello", "plugin_frame", "put_result_metadata"}
    for entry in ENTRIES:
        assert set(entry) == {"name", "kind", "file", "decoded"}
        assert entry["kind"] in kinds
        assert entry["file"] == f"{entry['name']}.bin"
    assert {e["kind"] for e in ENTRIES} == kinds
    assert len({e["name"] for e in ENTRIES}) == len(ENTRIES) == 18


@pytest.mark.parametrize("entry", of_kind("ticket"))
def test_ticket(entry: dict[str, Any]) -> None:
    data = data_of(entry)
    ticket = decode_ticket(data)  # the server's decoder accepts it
    assert encode_ticket(ticket) == data
    message = ticket_pb2.Ticket()
    message.ParseFromString(data)
    assert json_format.MessageToDict(message, preserving_proto_field_name=True) == entry["decoded"]
    rebuilt = json_format.ParseDict(entry["decoded"], ticket_pb2.Ticket())
    assert rebuilt.SerializeToString(deterministic=True) == data


def test_ticket_fields_spelled_out() -> None:
    """One vector decoded to the dataclass, so a wrong MessageToDict cannot hide a codec bug."""
    entry = next(e for e in ENTRIES if e["name"] == "ticket_tail_max_offset")
    ticket = decode_ticket(data_of(entry))
    assert (ticket.stream, ticket.incarnation, ticket.start_offset) == (  # type: ignore[union-attr]
        "e",
        "6fa459ea-ee8a-3ca4-894e-db77e160355e",
        2**63 - 1,
    )
    assert entry["decoded"]["tail"]["start_offset"] == "9223372036854775807"


@pytest.mark.parametrize("entry", of_kind("plugin_hello"))
def test_plugin_hello(entry: dict[str, Any]) -> None:
    data = data_of(entry)
    decoded = entry["decoded"]
    declaration = PluginDeclaration.from_hello(decoded["name"], data)
    assert gen.schema_fields(declaration.input_schema) == decoded["input_schema"]
    assert gen.schema_fields(declaration.output_schema) == decoded["output_schema"]
    assert (declaration.protocol, declaration.max_in_flight) == (
        decoded["protocol"],
        decoded["max_in_flight"],
    )
    again = hello_message(
        decoded["name"], declaration.input_schema, declaration.output_schema, declaration.max_in_flight
    )
    assert again == data


def _schema(fields: list[dict[str, Any]]) -> pa.Schema:
    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "timestamp[s]": pa.timestamp("s"),
    }
    return pa.schema([pa.field(f["name"], types[f["type"]], f["nullable"]) for f in fields])


@pytest.mark.parametrize("entry", of_kind("plugin_frame"))
def test_plugin_frame(entry: dict[str, Any]) -> None:
    data = data_of(entry)
    decoded = entry["decoded"]
    frames = gen.decode_frames(data)
    metadata = frames[-1][1]
    if decoded["direction"] == "server_to_plugin":
        assert plugin_json(decoded["app_metadata"]).to_pybytes() == metadata  # the server writes
    else:
        assert decoded["direction"] == "plugin_to_server"
        assert plugin_metadata(pa.py_buffer(metadata)) == decoded["app_metadata"]  # it reads
    if "schema" not in decoded:
        assert len(frames) == 1
        assert frames[0][0] == frames[0][2] == b""
        return
    batch = gen.read_batch(frames)
    assert gen.schema_fields(batch.schema) == decoded["schema"]
    assert batch.num_rows == decoded["num_rows"]
    assert gen.column_values(batch) == decoded["columns"]
    schema = _schema(decoded["schema"])
    columns = [
        pa.array(decoded["columns"][f.name], pa.int64()).cast(f.type)
        if pa.types.is_timestamp(f.type)
        else pa.array(decoded["columns"][f.name], f.type)
        for f in schema
    ]
    rebuilt = pa.RecordBatch.from_arrays(columns, schema=schema)
    assert gen._batch_frame(rebuilt, metadata) == data


@pytest.mark.parametrize("entry", of_kind("put_result_metadata"))
def test_put_result_metadata(entry: dict[str, Any]) -> None:
    data = data_of(entry)
    decoded = entry["decoded"]
    assert json.loads(data) == decoded
    if "error" in decoded:
        assert encode_put_error(decoded["error"]) == data
        return
    marker = None
    if decoded.get("end_of_input"):
        marker = Marker(end_of_input=True)
    elif "watermark_ns" in decoded:
        marker = Marker(watermark_ns=decoded["watermark_ns"])
    assert encode_put_result(decoded["offset"], decoded["rows"], marker) == data


def test_committed_vectors_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(VECTORS / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "18 vectors current"


def test_check_finds_a_stale_file(tmp_path: Path) -> None:
    """--check fails naming the file when one differs (run on a copy of the directory)."""
    copy = tmp_path / "schemas" / "vectors"  # the repository's layout: generate.py reads
    copy.mkdir(parents=True)  # the enrich example's schemas from clients/examples/
    example = tmp_path / "clients" / "examples" / "enrich_plugin.py"
    example.parent.mkdir(parents=True)
    example.write_bytes((VECTORS.parents[1] / "clients/examples/enrich_plugin.py").read_bytes())
    for path in VECTORS.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    (copy / "put_result_batch.bin").write_bytes(b'{"offset": 1, "rows": 65536}')
    result = subprocess.run(
        [sys.executable, str(copy / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "stale or missing: put_result_batch.bin" in result.stderr
