"""Decoding flight-serve's JSON ``app_metadata`` on the server side (the wire contract of
``schemas/README.md``): PutResults ``{"offset", "rows"}``, tail messages ``{"offset", ...}``,
a stream's FlightInfo ``{"first_offset", "next_offset", "incarnation", "writers"}``.

A leaf (standard library and pyarrow only). The Python client keeps its own decoder
(``flight_serve_client._protocol``: the client never imports the server);
``tests/contract/test_app_metadata_decoding.py`` checks that the two agree.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

__all__ = ["WireError", "decode_json", "info_metadata"]


class WireError(ValueError):
    """A peer sent app_metadata the wire contract does not allow (missing, not UTF-8 JSON, not
    a JSON object); the message names what was expected and quotes the first 60 bytes.
    Callers turn it into their own error (a connector's external error)."""


def decode_json(metadata: pa.Buffer | bytes | None, what: str) -> dict[str, Any]:
    """Decode a JSON-object metadata message; ``what`` names it in the error.

    >>> decode_json(b'{"offset": 3, "rows": 10}', "PutResult")
    {'offset': 3, 'rows': 10}

    Raises:
        WireError: ``metadata`` is missing, not UTF-8 JSON, or not an object.
    """
    if metadata is None:
        raise WireError(f"{what}: expected JSON app_metadata, got none")
    raw = metadata.to_pybytes() if isinstance(metadata, pa.Buffer) else bytes(metadata)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"{what}: app_metadata is not UTF-8 JSON: {raw[:60]!r}") from exc
    if not isinstance(value, dict):
        raise WireError(f"{what}: app_metadata is not a JSON object: {raw[:60]!r}")
    return value


def info_metadata(raw: bytes | str | None) -> dict[str, Any]:
    """A FlightInfo's ``app_metadata`` as a JSON object, ``{}`` when it is empty or is not one
    (a server that keeps none, or another Flight server): what a reader of a stream's info
    needs, leniently.

    >>> info_metadata(b'{"next_offset": 7}'), info_metadata(b""), info_metadata(b"[1]")
    ({'next_offset': 7}, {}, {})
    """
    try:
        value = json.loads((raw.decode() if isinstance(raw, bytes) else raw) or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}
