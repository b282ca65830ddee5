"""Serve a transform plugin: a function ``RecordBatch -> RecordBatch`` attached to a flight-serve
server over DoExchange (schemas/README.md, "Plugin protocol"). Imports pyarrow only.

Example::

    from flight_serve_client import FlightServeClient

    def upper(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch([pc.utf8_upper(batch["name"])], names=["name"])

    with FlightServeClient("grpc://127.0.0.1:8815") as client:
        client.attach_plugin("upper", upper, input_schema, output_schema)   # blocks

The loop answers every input batch with ``fn(batch)`` tagged with the batch's ``seq``, in the
order the batches came. ``max_in_flight`` is only what the server may send before waiting for an
answer (the loop itself handles one batch at a time).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve_client._protocol import ProtocolError

__all__ = ["PROTOCOL_VERSION", "PluginStats", "hello_message", "serve_plugin"]

#: The plugin protocol version this client speaks.
PROTOCOL_VERSION = 1


@dataclass
class PluginStats:
    """What :func:`serve_plugin` did: ``batches`` answered, ``rows_in``, ``rows_out``, and the
    server's ``instance`` id (from its accept message)."""

    batches: int = 0
    rows_in: int = 0
    rows_out: int = 0
    instance: int | None = None


def _b64_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def hello_message(
    name: str, input_schema: pa.Schema, output_schema: pa.Schema, max_in_flight: int
) -> bytes:
    """The hello: UTF-8 JSON with both schemas as base64 Arrow IPC schema messages."""
    return json.dumps(
        {
            "protocol": PROTOCOL_VERSION,
            "name": name,
            "input_schema": _b64_schema(input_schema),
            "output_schema": _b64_schema(output_schema),
            "max_in_flight": max_in_flight,
        }
    ).encode()


def _meta(buffer: pa.Buffer | None) -> dict[str, Any]:
    if buffer is None:
        return {}
    try:
        value = json.loads(buffer.to_pybytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"plugin exchange: app_metadata is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError("plugin exchange: app_metadata is not a JSON object")
    return value


def serve_plugin(
    client: flight.FlightClient,
    name: str,
    fn: Callable[[pa.RecordBatch], pa.RecordBatch],
    input_schema: pa.Schema,
    output_schema: pa.Schema,
    *,
    max_in_flight: int = 4,
    stop: threading.Event | None = None,
    options: flight.FlightCallOptions | None = None,
) -> PluginStats:
    """Attach as plugin ``name`` and answer batches until the server ends the exchange (or
    says ``{"closing": true}``: it stops) or ``stop`` is set (checked between messages; the
    server sends a heartbeat every second).

    Args:
        client: a connected Flight client.
        name: the plugin name (``WITH (plugin = …)`` of the pipeline's function).
        fn: one input batch (``input_schema``) to one result batch (``output_schema``; zero rows
            allowed). Its result is cast to ``output_schema`` (a cast that fails raises).
        input_schema, output_schema: declared in the hello.
        max_in_flight: batches the server may send before an answer (1 … 1024).
        stop: set it to leave (the server re-sends the unanswered batches to other instances).

    Returns the counters. Raises what pyarrow raises for the call (``ArrowInvalid`` when the
    server refuses the hello, with the reason), :class:`ProtocolError` for a message outside
    the protocol, and whatever ``fn`` raises (the server then re-sends the batch elsewhere).
    """
    descriptor = flight.FlightDescriptor.for_path("plugins", name)
    writer, reader = (
        client.do_exchange(descriptor, options)
        if options is not None
        else client.do_exchange(descriptor)
    )
    stats = PluginStats()
    failed = True
    try:
        writer.write_metadata(
            pa.py_buffer(hello_message(name, input_schema, output_schema, max_in_flight))
        )
        writer.begin(output_schema)
        while stop is None or not stop.is_set():
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            meta = _meta(chunk.app_metadata)
            if chunk.data is None:
                if meta.get("accepted"):
                    stats.instance = meta.get("instance")
                if meta.get("closing"):  # the server stops: finish writing, it ends the call
                    break
                continue  # heartbeat
            seq = meta.get("seq")
            if not isinstance(seq, int):
                raise ProtocolError(f"plugin exchange: an input batch without seq ({meta!r})")
            result = fn(chunk.data)
            if result.schema != output_schema:
                result = result.cast(output_schema)
            writer.write_with_metadata(result, pa.py_buffer(json.dumps({"seq": seq}).encode()))
            stats.batches += 1
            stats.rows_in += chunk.data.num_rows
            stats.rows_out += result.num_rows
        failed = False
    finally:
        try:
            writer.done_writing()
            writer.close()  # raises the server's status when it ended the call with one
        except (flight.FlightError, pa.ArrowException, OSError):
            if not failed and (stop is None or not stop.is_set()):
                raise
    return stats
