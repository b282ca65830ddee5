"""Client messages without rows: explicit watermarks and end of input (schemas/README.md).

A client that has no rows to send can still tell the server about event time with a
metadata-only Flight message whose ``app_metadata`` is a JSON object:

* ``{"watermark_ns": <int>}`` (ns since the Unix epoch) or ``{"watermark": "<ISO-8601>"}``
  (a naive instant is UTC): "no row with an earlier event time will follow from me";
* ``{"end_of_input": true}`` (DoPut only): "this writer is done for good".

DoExchange (:mod:`flight_serve.flight.exchange`) takes the watermark forms; DoPut
(:mod:`flight_serve.flight.service`) takes all three and stores each as a marker in the stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from flight_serve.errors import InvalidInputError
from flight_serve.types import datetime_to_ns

__all__ = ["Marker", "parse_marker", "watermark_request"]

_WATERMARK_FORMS = '{"watermark_ns": <int>} or {"watermark": "<ISO-8601 instant>"}'


@dataclass(frozen=True)
class Marker:
    """A decoded metadata-only message: exactly one of the two is set."""

    watermark_ns: int | None = None
    end_of_input: bool = False


def parse_marker(metadata: bytes, *, rpc: str = "DoPut", allow_end: bool = True) -> Marker:
    """Decode a metadata-only client message (see the module docstring).

    Args:
        metadata: the message's ``app_metadata`` bytes.
        rpc: the call it came with, for the error message.
        allow_end: whether ``{"end_of_input": true}`` is allowed (DoPut) or not (DoExchange,
            whose client ends its input by finishing its write side).

    Raises:
        InvalidInputError: anything else (also a ``watermark_ns`` beyond a signed 64-bit
            integer), naming the accepted forms.

    >>> parse_marker(b'{"watermark": "1970-01-01T00:00:01Z"}')
    Marker(watermark_ns=1000000000, end_of_input=False)
    >>> parse_marker(b'{"end_of_input": true}')
    Marker(watermark_ns=None, end_of_input=True)
    """
    forms = _WATERMARK_FORMS + (' or {"end_of_input": true}' if allow_end else "")
    expected = f"a metadata-only {rpc} message must be JSON {forms}"
    try:
        # not _wire.decode_json: json.loads of bytes also reads UTF-16/32 and a UTF-8 BOM,
        # which clients may send today; decode_json refuses them (strict UTF-8)
        message = json.loads(metadata)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInputError(expected) from None
    if not isinstance(message, dict):
        raise InvalidInputError(expected)
    kinds = [k for k in ("watermark_ns", "watermark", "end_of_input") if k in message]
    if len(kinds) != 1:
        raise InvalidInputError(f"{expected}; got keys {sorted(message)}")
    value = message[kinds[0]]
    if kinds[0] == "watermark_ns" and isinstance(value, int) and not isinstance(value, bool):
        if not -(2**63) <= value < 2**63:
            raise InvalidInputError(
                f"{expected}; watermark_ns {value} does not fit a signed 64-bit integer"
            )
        return Marker(watermark_ns=value)
    if kinds[0] == "watermark" and isinstance(value, str):
        try:
            return Marker(watermark_ns=datetime_to_ns(datetime.fromisoformat(value)))
        except ValueError:
            raise InvalidInputError(f"{expected}; cannot read instant {value!r}") from None
    if kinds[0] == "end_of_input" and allow_end and value is True:
        return Marker(end_of_input=True)
    raise InvalidInputError(expected)


def watermark_request(metadata: bytes, *, rpc: str = "DoExchange") -> int:
    """Decode an explicit watermark (JSON ``{"watermark_ns"}`` or ``{"watermark"}``), in ns.

    Raises:
        InvalidInputError: anything else, naming what was expected.
    """
    marker = parse_marker(metadata, rpc=rpc, allow_end=False)
    assert marker.watermark_ns is not None
    return marker.watermark_ns
