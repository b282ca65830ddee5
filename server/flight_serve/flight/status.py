"""The one place that turns an exception into a Flight status (DESIGN §6, STYLE habit 4).

Every Flight handler in :mod:`flight_serve.flight.service` ends in
``except Exception as exc: raise to_flight_error(exc) from None``; nothing else picks a status code.

pyarrow has no ``FlightError`` subclass for INVALID_ARGUMENT or NOT_FOUND. A handler that raises
any other exception has it converted by pyarrow through the Arrow status code, so the mapping below
raises plain pyarrow exceptions for those two codes. Verified end to end with a raw gRPC client
against pyarrow 26 (``tests/integration/test_flight_streams.py::test_status_codes_on_the_wire``):

- ``InvalidInputError`` (domain ``input``): INVALID_ARGUMENT; the client raises
  ``pa.ArrowInvalid``.
- ``NotFoundError`` (``not_found``): NOT_FOUND; ``pa.ArrowKeyError``.
- ``AlreadyExistsError`` (``already_exists``): INVALID_ARGUMENT; ``pa.ArrowInvalid`` (pyarrow
  offers no way to send ALREADY_EXISTS from a Python handler).
- ``UnsupportedError`` (``unsupported``): UNIMPLEMENTED; the client raises
  ``pa.ArrowNotImplementedError``.
- ``OverloadError`` (``overload``) and ``ExternalError`` (``external``: a remote server, catalog,
  graph or disk failed): UNAVAILABLE; ``flight.FlightUnavailableError``, with a retry hint in the
  message and ``extra_info`` JSON ``{"retryable": true}``; an ``ExternalRefusalError`` (the
  outside system refused the server's own credentials) without the hint and with
  ``{"retryable": false}``.
- ``StorageError`` and other ``internal`` errors: INTERNAL; ``flight.FlightInternalError``.
- a ``pa.ArrowInvalid`` raised by pyarrow itself (e.g. a malformed upload): INVALID_ARGUMENT.
- any ``flight.FlightError`` (e.g. ``FlightCancelledError``): its class, message and
  ``extra_info`` kept, the request id added.
- a bug (any other exception): INTERNAL; ``flight.FlightInternalError`` ``"internal error <id>
  (<class>): <message>"``, the id being the request id (outside a call: an error id of its
  own) that is also in the server log.

(Raising a bare ``RuntimeError`` from a handler would be UNKNOWN; raising ``FlightServerError``
is UNKNOWN too -- both are avoided here.)

What a client sees: flight-serve's own message, then ``(request id <id>)`` (the call's
``x-request-id``, :mod:`flight_serve.flight.ops.requestlog`), never server internals. The failure is
logged under the same ``request_id`` with its traceback (``exc`` in the JSON line).

pyarrow appends ``". Detail: Python exception: Traceback ..."`` (the handler's frames and file
paths: ``traceback.format_exception`` of the raised exception) to the message of every status
it makes from a Python exception, and pyarrow has no ``FlightError`` for INVALID_ARGUMENT,
NOT_FOUND or UNIMPLEMENTED (a ``FlightError`` gets only ``". Detail: <code>"``). So those three
are raised as :class:`InvalidArgument`, :class:`NotFound` and :class:`Unimplemented`, whose
traceback cannot be formatted (see :class:`_Untraceable`): pyarrow then falls back to the class
name and the client reads ``"<message> (request id <id>). Detail: Python exception:
InvalidArgument"``. (CPython 3.11 / 3.12 read ``__notes__`` unguarded; the test
``tests/integration/test_error_messages.py`` fails if a Python version brings the traceback
back.)

Log level per class: user mistakes (``input``, ``not_found``, ``already_exists``) at INFO,
overload and external failures at WARNING, internal errors and bugs at ERROR with the traceback, a cancelled call at
DEBUG.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any, Final, assert_never

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve.errors import Domain, FlightServeError, InvalidInputError

__all__ = [
    "Failed",
    "InvalidArgument",
    "NotFound",
    "Unimplemented",
    "current_request_id",
    "for_get_schema",
    "log_level",
    "set_current_request_id",
    "to_flight_error",
    "with_request_id",
]

log = logging.getLogger("flight_serve.flight")

# The request id of the call each gRPC thread serves, by OS thread id: pyarrow enters Python
# from a gRPC thread with a fresh thread state each time, so a threading.local set by the
# middleware would be gone when the handler runs.
_request_ids: dict[int, str] = {}
_request_ids_lock = threading.Lock()


def set_current_request_id(request_id: str | None) -> None:
    """Note the id of the call this thread serves from now on (the request log middleware
    does, in the thread that then runs the call's handler and streams its results)."""
    with _request_ids_lock:
        if request_id is None:
            _request_ids.pop(threading.get_ident(), None)
        else:
            _request_ids[threading.get_ident()] = request_id


def current_request_id() -> str | None:
    """The request id of the call this thread serves (``None`` outside a call)."""
    with _request_ids_lock:
        return _request_ids.get(threading.get_ident())


def with_request_id(message: str) -> str:
    """``message`` followed by `` (request id <id>)`` when this thread serves a call.

    >>> set_current_request_id("ab12")
    >>> with_request_id("stream 's' does not exist")
    "stream 's' does not exist (request id ab12)"
    >>> set_current_request_id(None)
    """
    request_id = current_request_id()
    return message if request_id is None else f"{message} (request id {request_id})"


class _Untraceable(Exception):
    """An exception whose traceback ``traceback.format_exception`` cannot format: reading its
    ``__notes__`` fails, so pyarrow's ``PythonErrorDetail`` shows only ``"Python exception:
    <class name>"`` instead of the server's frames and file paths (module docstring)."""

    @property
    def __notes__(self) -> Any:  # type: ignore[override]  # read by traceback.TracebackException
        raise LookupError("flight-serve sends no server traceback to a client")


class InvalidArgument(_Untraceable, pa.ArrowInvalid):
    """INVALID_ARGUMENT, without the server's traceback (the client raises pa.ArrowInvalid)."""


class NotFound(_Untraceable, pa.ArrowKeyError):
    """NOT_FOUND, without the server's traceback (the client raises pa.ArrowKeyError)."""

    def __str__(self) -> str:  # a KeyError would quote its message
        return str(self.args[0]) if self.args else ""


class Unimplemented(_Untraceable, NotImplementedError):
    """UNIMPLEMENTED, without the server's traceback (pa.ArrowNotImplementedError)."""


class Failed(_Untraceable, Exception):
    """A ``FlightError`` where pyarrow cannot send one: its GetSchema handler turns every
    exception, ``FlightError`` included, into a status with the traceback. This one arrives as
    UNKNOWN with the ``FlightError``'s message, without the traceback."""


def for_get_schema(error: Exception) -> Exception:
    """``error`` (from :func:`to_flight_error`) as GetSchema can raise it without leaking the
    traceback: a ``FlightError`` becomes :class:`Failed` (UNKNOWN; pyarrow's GetSchema has no
    way to send INTERNAL or UNAVAILABLE), anything else is returned as it is."""
    return Failed(str(error)) if isinstance(error, flight.FlightError) else error


_LEVEL_BY_DOMAIN: Final = {
    "input": logging.INFO,
    "not_found": logging.INFO,
    "already_exists": logging.INFO,
    "unsupported": logging.INFO,
    "overload": logging.WARNING,
    "external": logging.WARNING,
    "internal": logging.ERROR,
}


def log_level(exc: BaseException) -> int:
    """Return the :mod:`logging` level at which a failed call with ``exc`` is logged.

    >>> from flight_serve.errors import QueryError
    >>> log_level(QueryError("bad SQL")) == logging.INFO
    True
    """
    if isinstance(exc, FlightServeError):
        return _LEVEL_BY_DOMAIN.get(exc.domain, logging.ERROR)
    if isinstance(exc, flight.FlightCancelledError):
        return logging.DEBUG
    if isinstance(exc, flight.FlightError | pa.ArrowInvalid):
        return logging.WARNING
    return logging.ERROR


#: The longest message a status carries: gRPC refuses trailers beyond its metadata limit (a
#: message quoting a 1 MB stream name came back as RESOURCE_EXHAUSTED "Stream removed").
MAX_MESSAGE_CHARS: Final = 2000


def _clip(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE_CHARS`, saying how much was left out.

    >>> _clip("x" * 2005)[-21:]
    '… (5 more characters)'
    """
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_MESSAGE_CHARS]}… ({len(message) - MAX_MESSAGE_CHARS} more characters)"


def _by_domain(domain: Domain, message: str, retryable: bool) -> Exception | None:
    """The client-side exception for a :class:`FlightServeError` of ``domain``, or ``None`` for
    ``internal`` (logged with its traceback and an error id by the caller). Exhaustive over
    :data:`~flight_serve.errors.Domain`: a new domain fails the type check until it is mapped.
    ``retryable`` (the error's own) decides the retry hint of an ``external`` error."""
    match domain:
        case "input" | "already_exists":
            return InvalidArgument(with_request_id(message))
        case "not_found":
            return NotFound(with_request_id(message))
        case "unsupported":
            return Unimplemented(with_request_id(message))
        case "external" if not retryable:
            return flight.FlightUnavailableError(
                with_request_id(message), json.dumps({"retryable": False}).encode()
            )
        case "overload" | "external":
            return flight.FlightUnavailableError(
                with_request_id(f"{message} (retryable: try again after a short delay)"),
                json.dumps({"retryable": True}).encode(),
            )
        case "internal":
            return None
        case _:
            assert_never(domain)


def to_flight_error(exc: BaseException, *, rpc: str = "") -> Exception:
    """Return the exception a Flight handler raises for ``exc`` (see the module table), after
    logging ``exc`` at :func:`log_level`.

    Args:
        exc: what went wrong.
        rpc: the Flight method (``"DoPut"``, ...) for the log line.

    Returns:
        :class:`InvalidArgument` (a ``pa.ArrowInvalid``: INVALID_ARGUMENT), :class:`NotFound`
        (a ``pa.ArrowKeyError``: NOT_FOUND), :class:`Unimplemented`, or a
        ``pyarrow.flight.FlightError`` subclass (UNAVAILABLE, INTERNAL, or ``exc``'s own);
        each message ends with ``(request id <id>)`` inside a call.

    >>> from flight_serve.errors import SchemaMismatchError, StreamNotFoundError
    >>> isinstance(to_flight_error(SchemaMismatchError("missing field 'x'")), pa.ArrowInvalid)
    True
    >>> str(to_flight_error(StreamNotFoundError("stream 's' does not exist")))
    "stream 's' does not exist"
    """
    if isinstance(exc, RecursionError):  # the client's input, not a bug: e.g. SQL in 3,000 parens
        exc = InvalidInputError(
            "the request is nested too deeply to parse (for example SQL with thousands of "
            "nested parentheses or expressions); flatten it"
        )
    level = log_level(exc)
    request_id = current_request_id()
    fields: dict[str, object] = {"rpc": rpc, "error_class": type(exc).__name__}
    if request_id is not None:
        fields["request_id"] = request_id
    if isinstance(exc, FlightServeError):
        fields["domain"] = exc.domain
        fields["retryable"] = exc.retryable
    message = _clip(str(exc))

    def logged(text: str, client: Exception) -> Exception:
        log.log(level, "request failed: %s", text, extra=fields, exc_info=exc)
        return client

    if isinstance(exc, FlightServeError):
        mapped = _by_domain(exc.domain, message, exc.retryable)
        if mapped is not None:
            return logged(message, mapped)
    if isinstance(exc, InvalidArgument | NotFound | Unimplemented):
        return exc  # already mapped (and logged) by an inner handler
    if isinstance(exc, flight.FlightError):
        if request_id is None or f"(request id {request_id})" in message:
            return logged(message, exc)
        return logged(message, type(exc)(with_request_id(message), exc.extra_info))
    if isinstance(exc, pa.ArrowInvalid):
        # pyarrow itself rejected the client's data (e.g. a malformed IPC stream).
        return logged(message, InvalidArgument(with_request_id(message)))
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the server is stopping
        log.warning("request interrupted: %r", exc, extra=fields)
        return flight.FlightUnavailableError(
            with_request_id("the server is shutting down; retry elsewhere")
        )
    error_id = request_id or uuid.uuid4().hex[:12]  # outside a call: an id of its own
    fields["error_id"] = error_id
    log.log(level, "request failed: %s", message, extra=fields, exc_info=exc)
    return flight.FlightInternalError(
        with_request_id(f"internal error {error_id} ({type(exc).__name__}): {message}")
    )
