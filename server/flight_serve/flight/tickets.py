"""The DoGet ticket codec: typed, versioned ``flight_serve.v1.Ticket`` protobuf messages.

Wire format: ``schemas/flight_serve/v1/ticket.proto`` (``schemas/README.md``, "Tickets"). A ticket
is never ``eval``-ed or unpickled: :func:`decode_ticket` parses the protobuf message and checks
every field, and raises :class:`~flight_serve.errors.TicketError` for anything else.

>>> pin = StreamPin("flights", "1b4e28ba-2fa1-11d2-883f-0016d3cca427", 3)
>>> decode_ticket(encode_ticket(QueryTicket("SELECT 1", (pin,)))).pins[0].stop_offset
3
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from flight_serve._proto.flight_serve.v1 import ticket_pb2
from flight_serve.errors import StreamNameError, TicketError
from flight_serve.store import validate_stream_name

__all__ = [
    "TICKET_VERSION",
    "AnyTicket",
    "QueryTicket",
    "StreamPin",
    "StreamRangeTicket",
    "TailTicket",
    "decode_ticket",
    "encode_query_ticket",
    "encode_stream_range_ticket",
    "encode_tail_ticket",
    "encode_ticket",
]

#: The ticket codec version this server writes and reads.
TICKET_VERSION = 1

_MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True)
class StreamPin:
    """One stream as it was when a query was planned.

    Attributes:
        stream: the stream name.
        incarnation: the stream's incarnation UUID (canonical text form).
        stop_offset: exclusive end offset; the query reads batches ``[first_offset, stop_offset)``.
    """

    stream: str
    incarnation: str
    stop_offset: int


@dataclass(frozen=True)
class QueryTicket:
    """A SQL query (DataFusion dialect) over the pinned streams."""

    sql: str
    pins: tuple[StreamPin, ...]


@dataclass(frozen=True)
class StreamRangeTicket:
    """The batches ``[start_offset, stop_offset)`` of one stream incarnation."""

    stream: str
    incarnation: str
    start_offset: int
    stop_offset: int


@dataclass(frozen=True)
class TailTicket:
    """Follow one stream incarnation live from ``start_offset`` until cancelled or dropped."""

    stream: str
    incarnation: str
    start_offset: int


AnyTicket = QueryTicket | StreamRangeTicket | TailTicket


def encode_ticket(ticket: AnyTicket) -> bytes:
    """Return the wire bytes (a serialized ``flight_serve.v1.Ticket``, version 1) of ``ticket``.

    Raises:
        TicketError: a field is out of range (so a ticket that encodes always decodes).
    """
    _validate(ticket)
    message = ticket_pb2.Ticket(version=TICKET_VERSION)
    if isinstance(ticket, QueryTicket):
        message.query.sql = ticket.sql
        for pin in ticket.pins:
            message.query.streams.add(
                stream=pin.stream, incarnation=pin.incarnation, stop_offset=pin.stop_offset
            )
    elif isinstance(ticket, StreamRangeTicket):
        message.stream_range.stream = ticket.stream
        message.stream_range.incarnation = ticket.incarnation
        message.stream_range.start_offset = ticket.start_offset
        message.stream_range.stop_offset = ticket.stop_offset
    else:
        message.tail.stream = ticket.stream
        message.tail.incarnation = ticket.incarnation
        message.tail.start_offset = ticket.start_offset
    data: bytes = message.SerializeToString(deterministic=True)
    return data


def encode_query_ticket(sql: str, pins: tuple[StreamPin, ...]) -> bytes:
    """Return the wire bytes of a :class:`QueryTicket`."""
    return encode_ticket(QueryTicket(sql, pins))


def encode_stream_range_ticket(
    stream: str, incarnation: str, start_offset: int, stop_offset: int
) -> bytes:
    """Return the wire bytes of a :class:`StreamRangeTicket`."""
    return encode_ticket(StreamRangeTicket(stream, incarnation, start_offset, stop_offset))


def encode_tail_ticket(stream: str, incarnation: str, start_offset: int) -> bytes:
    """Return the wire bytes of a :class:`TailTicket`."""
    return encode_ticket(TailTicket(stream, incarnation, start_offset))


def decode_ticket(data: bytes) -> AnyTicket:
    """Decode ticket bytes into a :class:`QueryTicket`, :class:`StreamRangeTicket` or
    :class:`TailTicket`.

    Raises:
        TicketError: the bytes are not a ``flight_serve.v1.Ticket``, its version is not 1, it
            holds no ticket kind, or a field is invalid (bad stream name, incarnation that is not
            a canonical UUID, empty SQL, stop before start, offset past 2**63-1).
    """
    message = ticket_pb2.Ticket()
    try:
        message.ParseFromString(bytes(data))
    except (DecodeError, ValueError, TypeError) as exc:
        raise TicketError(f"malformed ticket: not a flight_serve.v1.Ticket ({exc})") from None
    if message.version != TICKET_VERSION:
        raise TicketError(
            f"unknown ticket version {message.version} (this server reads version "
            f"{TICKET_VERSION}); ask GetFlightInfo for a new ticket"
        )
    kind = message.WhichOneof("kind")
    ticket: AnyTicket
    if kind == "query":
        ticket = QueryTicket(
            message.query.sql,
            tuple(StreamPin(p.stream, p.incarnation, p.stop_offset) for p in message.query.streams),
        )
    elif kind == "stream_range":
        r = message.stream_range
        ticket = StreamRangeTicket(r.stream, r.incarnation, r.start_offset, r.stop_offset)
    elif kind == "tail":
        t = message.tail
        ticket = TailTicket(t.stream, t.incarnation, t.start_offset)
    else:
        raise TicketError("malformed ticket: it names no query, stream range or tail")
    _validate(ticket)
    return ticket


def _validate(ticket: AnyTicket) -> None:
    if isinstance(ticket, QueryTicket):
        if not ticket.sql.strip():
            raise TicketError("malformed ticket: empty SQL")
        for pin in ticket.pins:
            _check_stream(pin.stream, pin.incarnation)
            _check_offset("stop_offset", pin.stop_offset)
    elif isinstance(ticket, StreamRangeTicket):
        _check_stream(ticket.stream, ticket.incarnation)
        _check_offset("start_offset", ticket.start_offset)
        _check_offset("stop_offset", ticket.stop_offset)
        if ticket.stop_offset < ticket.start_offset:
            raise TicketError(
                f"malformed ticket: stop_offset {ticket.stop_offset} < "
                f"start_offset {ticket.start_offset}"
            )
    elif isinstance(ticket, TailTicket):
        _check_stream(ticket.stream, ticket.incarnation)
        _check_offset("start_offset", ticket.start_offset)
    else:
        raise TicketError(f"not a ticket: {type(ticket).__name__}")


def _check_stream(stream: str, incarnation: str) -> None:
    try:
        validate_stream_name(stream)
    except StreamNameError as exc:
        raise TicketError(f"malformed ticket: {exc}") from None
    try:
        canonical = str(uuid.UUID(incarnation))
    except ValueError:
        canonical = ""
    if canonical != incarnation:
        raise TicketError(f"malformed ticket: incarnation {incarnation!r} is not a UUID")


def _check_offset(name: str, value: int) -> None:
    if not 0 <= value <= _MAX_OFFSET:
        raise TicketError(f"malformed ticket: {name} {value} is out of range")
