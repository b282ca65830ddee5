"""Flight descriptors as the service reads them (schemas/README.md, "Streams"):

- ``path = [stream]``: one stream (DoPut, GetFlightInfo, GetSchema).
- ``path = [stream, writer]``: DoPut as a named writer (one watermark partition of the stream).
- ``cmd = <SQL text, UTF-8>``: a DataFusion query over the streams (GetFlightInfo, GetSchema).

A Flight SQL command (``cmd = <google.protobuf.Any>``) is recognised before these, by
:func:`flight_serve.flight.sql.handler.flightsql_command`.
"""

from __future__ import annotations

import re

import pyarrow.flight as flight

from flight_serve.errors import InvalidInputError, QueryError
from flight_serve.store import validate_stream_name

__all__ = ["WRITER_NAME_PATTERN", "put_target", "sql_of", "stream_of"]

#: Writer names a client may give (``path = [stream, writer]``); ``path = [stream]`` writes as
#: the stream's unnamed writer ``""``.
WRITER_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:@\-]{1,200}")


def stream_of(descriptor: flight.FlightDescriptor) -> str:
    """The stream a ``path = [stream]`` descriptor names.

    Raises:
        InvalidInputError: not a path descriptor, not exactly one element, not UTF-8, or not a
            valid stream name.
    """
    if descriptor.descriptor_type != flight.DescriptorType.PATH:
        raise InvalidInputError("expected a path descriptor naming one stream")
    path = descriptor.path or []
    if len(path) != 1:
        raise InvalidInputError(
            f"a stream path descriptor has exactly one element, got {len(path)}"
        )
    raw = path[0]
    try:
        name = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidInputError("the stream name is not UTF-8") from None
    return validate_stream_name(name)


def put_target(descriptor: flight.FlightDescriptor) -> tuple[str, str]:
    """``(stream, writer)`` of a DoPut: ``path = [stream]`` (the unnamed writer ``""``) or
    ``[stream, writer]``.

    Raises:
        InvalidInputError: as :func:`stream_of`, or a writer name that is not UTF-8 or does
            not match :data:`WRITER_NAME_PATTERN`.
    """
    path = []
    if descriptor.descriptor_type == flight.DescriptorType.PATH:
        path = list(descriptor.path or [])
    if len(path) != 2:
        return stream_of(descriptor), ""
    stream = stream_of(flight.FlightDescriptor.for_path(path[0]))
    raw = path[1]
    try:
        writer = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidInputError("the writer name is not UTF-8") from None
    if WRITER_NAME_PATTERN.fullmatch(writer) is None:
        raise InvalidInputError(
            f"invalid writer name {writer!r}: use 1 to 200 characters out of [A-Za-z0-9_.:@-]"
        )
    return stream, writer


def sql_of(descriptor: flight.FlightDescriptor) -> str:
    """The SQL text of a ``cmd`` descriptor.

    Raises:
        InvalidInputError: not a command descriptor.
        QueryError: the command is not UTF-8.
    """
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise InvalidInputError("expected a path or command descriptor")
    try:
        return (descriptor.command or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise QueryError("the SQL command is not UTF-8") from None
