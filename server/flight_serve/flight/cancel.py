"""Flight's ``CancelFlightInfo`` action, and Flight SQL's deprecated ``CancelQuery``.

A query runs only while its DoGet streams (GetFlightInfo plans it, nothing more), so cancelling
a FlightInfo cancels the DoGet calls in progress for its endpoints' tickets: each ends with
CANCELLED between two batches, and a query's DataFusion stream is dropped exactly as when the
client cancels the call itself (:func:`flight_serve.flight.sql.query.interruptible_batches`). A
stream range read or a tail of that FlightInfo ends the same way.

Bodies (Flight's ``Flight.proto`` and Flight SQL's ``FlightSql.proto``):

- ``CancelFlightInfo``: body ``CancelFlightInfoRequest {FlightInfo info = 1}`` (not wrapped in
  ``Any``), result ``CancelFlightInfoResult {CancelStatus status = 1}``.
- ``CancelQuery``: body ``Any(ActionCancelQueryRequest {bytes info = 1})`` (``info`` is a
  serialized FlightInfo), result ``Any(ActionCancelQueryResult {CancelResult result = 1})``.

The status is always ``CANCELLED`` (1): calls in progress were told to stop and stop at their
next batch, and a FlightInfo with no call in progress holds no work on this server. Tickets are
deterministic (the same query over the same data has the same ticket), so the DoGet calls of
*every* client reading that ticket are cancelled, as the Flight spec allows ("no matter how many
clients are involved"). A body that does not parse, or a FlightInfo whose tickets are not this
server's, is INVALID_ARGUMENT.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Final, TypeVar

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from flight_serve.errors import InvalidInputError

__all__ = [
    "CANCEL_STATUS_CANCELLED",
    "CancellableContext",
    "RunningTickets",
    "cancel_flight_info_result",
    "flight_info_of",
    "parse_cancel_flight_info",
    "stop_when",
]

#: ``arrow.flight.protocol.CancelStatus`` values.
CANCEL_STATUS_UNSPECIFIED: Final = 0
CANCEL_STATUS_CANCELLED: Final = 1
CANCEL_STATUS_CANCELLING: Final = 2
CANCEL_STATUS_NOT_CANCELLABLE: Final = 3

T = TypeVar("T")


def _messages() -> tuple[Any, Any]:
    """Wire-compatible stand-ins for ``CancelFlightInfoRequest`` (``info`` as its serialized
    bytes: a message field and a bytes field share the wire format) and
    ``CancelFlightInfoResult`` (the enum as an int32: both are varints)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="flight_serve/cancel_flight_info.proto", package="flight_serve.cancel", syntax="proto3"
    )
    request = proto.message_type.add(name="CancelFlightInfoRequest")
    request.field.add(
        name="info",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    result = proto.message_type.add(name="CancelFlightInfoResult")
    result.field.add(
        name="status",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("flight_serve.cancel.CancelFlightInfoRequest")
        ),
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("flight_serve.cancel.CancelFlightInfoResult")
        ),
    )


_REQUEST, _RESULT = _messages()


def parse_cancel_flight_info(body: bytes) -> flight.FlightInfo:
    """The FlightInfo of a ``CancelFlightInfoRequest`` body.

    Raises:
        InvalidInputError: the body is not a ``CancelFlightInfoRequest`` or holds no FlightInfo.
    """
    request = _REQUEST()
    try:
        request.ParseFromString(body)
    except DecodeError:
        raise InvalidInputError(
            "CancelFlightInfo needs a CancelFlightInfoRequest (arrow.flight.protocol) body"
        ) from None
    return flight_info_of(request.info, "CancelFlightInfoRequest.info")


def flight_info_of(data: bytes, what: str) -> flight.FlightInfo:
    """``data`` (a serialized ``FlightInfo``) as a FlightInfo.

    Raises:
        InvalidInputError: ``data`` is empty or not a FlightInfo (``what`` names the field).
    """
    if not data:
        raise InvalidInputError(f"{what} is empty: send the FlightInfo to cancel")
    try:
        return flight.FlightInfo.deserialize(data)
    except (pa.ArrowException, ValueError, TypeError):
        raise InvalidInputError(f"{what} is not a serialized FlightInfo") from None


def cancel_flight_info_result(status: int) -> bytes:
    """A serialized ``CancelFlightInfoResult`` with ``status`` (a ``CancelStatus`` value)."""
    return bytes(_RESULT(status=status).SerializeToString())


class RunningTickets:
    """The DoGet calls in progress, by ticket bytes, each with its cancellation flag.

    A flag is held weakly: it goes away with the call's stream, so an abandoned call never
    needs unregistering.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[bytes, weakref.WeakSet[threading.Event]] = {}

    def begin(self, ticket: bytes) -> threading.Event:
        """A new call of ``ticket``: its flag, set when a cancel names the ticket."""
        flag = threading.Event()
        with self._lock:
            self._calls = {t: s for t, s in self._calls.items() if len(s)}  # drop ended calls
            self._calls.setdefault(ticket, weakref.WeakSet()).add(flag)
        return flag

    def cancel(self, tickets: Iterable[bytes]) -> int:
        """Set the flag of every call in progress of ``tickets``; return how many."""
        count = 0
        with self._lock:
            for ticket in tickets:
                for flag in list(self._calls.pop(ticket, ())):
                    flag.set()
                    count += 1
        return count

    def in_progress(self, ticket: bytes) -> int:
        """How many calls of ``ticket`` are in progress (for tests and metrics)."""
        with self._lock:
            return len(self._calls.get(ticket, ()))


class CancellableContext:
    """A :class:`pyarrow.flight.ServerCallContext` whose ``is_cancelled()`` is also true once
    ``flag`` is set; everything else is the wrapped context's."""

    def __init__(self, context: flight.ServerCallContext, flag: threading.Event) -> None:
        self._context = context
        self._flag = flag

    def is_cancelled(self) -> bool:
        return self._flag.is_set() or bool(self._context.is_cancelled())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def stop_when(flag: threading.Event, items: Iterable[T]) -> Iterator[T]:
    """Yield ``items`` until ``flag`` is set (checked after each item and at the end).

    Raises:
        pyarrow.flight.FlightCancelledError: ``flag`` was set (CANCELLED).
    """
    for item in items:
        if flag.is_set():
            break
        yield item
    if flag.is_set():
        raise flight.FlightCancelledError("cancelled by CancelFlightInfo (or CancelQuery)")

