"""Decoding of flight-serve's ``app_metadata`` messages (schemas/README.md), pyarrow only.

Two kinds of metadata travel on flight-serve's streams:

* JSON objects (UTF-8, always beginning with ``{``): PutResults ``{"offset", "rows"}``, tail batches
  ``{"offset"}`` (pieces of a split batch add ``"piece", "pieces"``), DoExchange result batches ``{"input_batch"}``, acknowledgements ``{"ack",
  "watermark_ns", "late_rows"}`` and the final ``{"done": true, ...}``;
* late-row messages of DoExchange: an Arrow IPC stream (beginning with the continuation marker
  ``FF FF FF FF``) holding the input columns plus ``_late_reason``, ``_window_start`` and
  ``_window_end``.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

#: The first four bytes of an Arrow IPC stream message (the continuation marker).
IPC_CONTINUATION = b"\xff\xff\xff\xff"


class ProtocolError(flight.FlightError):
    """The server sent something the flight-serve wire contract does not allow.

    For example a PutResult that is not JSON, an exchange stream that ends before the
    acknowledgement of a written batch, or a tail batch without an offset. It is a
    :class:`pyarrow.flight.FlightError`, so code that catches Flight errors catches it too.
    """


def is_late_rows(metadata: bytes) -> bool:
    """Whether ``metadata`` is a late-rows message (an Arrow IPC stream), not JSON.

    >>> is_late_rows(b"\\xff\\xff\\xff\\xff\\x10\\x00"), is_late_rows(b'{"ack": 0}')
    (True, False)
    """
    return metadata[:4] == IPC_CONTINUATION


def decode_json(metadata: pa.Buffer | bytes | None, what: str) -> dict[str, Any]:
    """Decode a JSON-object metadata message; ``what`` names it in the error.

    >>> decode_json(b'{"offset": 3, "rows": 10}', "PutResult")
    {'offset': 3, 'rows': 10}

    Raises:
        ProtocolError: ``metadata`` is missing, not UTF-8 JSON, or not an object.
    """
    if metadata is None:
        raise ProtocolError(f"{what}: expected JSON app_metadata, got none")
    raw = metadata.to_pybytes() if isinstance(metadata, pa.Buffer) else bytes(metadata)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{what}: app_metadata is not UTF-8 JSON: {raw[:60]!r}") from exc
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: app_metadata is not a JSON object: {raw[:60]!r}")
    return value


def decode_int(message: dict[str, Any], key: str, what: str) -> int:
    """Return ``message[key]`` as an int.

    Raises:
        ProtocolError: the key is missing or not an integer.
    """
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{what}: expected an integer {key!r} in {message!r}")
    return value


def decode_late_rows(metadata: bytes) -> pa.RecordBatch:
    """Decode a late-rows message (an Arrow IPC stream) into one record batch.

    >>> sink = pa.BufferOutputStream()
    >>> batch = pa.record_batch({"k": ["a"], "_late_reason": ["late"]})
    >>> with pa.ipc.new_stream(sink, batch.schema) as w:
    ...     w.write_batch(batch)
    >>> decode_late_rows(sink.getvalue().to_pybytes()).to_pydict()
    {'k': ['a'], '_late_reason': ['late']}

    Raises:
        ProtocolError: the bytes are not a readable Arrow IPC stream.
    """
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(metadata))
        batches = list(reader)
    except pa.ArrowException as exc:
        raise ProtocolError(f"late-rows message is not an Arrow IPC stream: {exc}") from exc
    if not batches:
        return empty_batch(reader.schema)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """Return a record batch with ``schema`` and no rows.

    >>> empty_batch(pa.schema([("x", pa.int64())])).num_rows
    0
    """
    return pa.RecordBatch.from_arrays(
        [pa.array([], type=field.type) for field in schema], schema=schema
    )
