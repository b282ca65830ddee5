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
- ``OverloadError`` (``overload``): UNAVAILABLE; ``flight.FlightUnavailableError``, with a retry
  hint in the message and ``extra_info`` JSON ``{"retryable": true}``.
- ``StorageError`` and other ``internal`` errors: INTERNAL; ``flight.FlightInternalError``.
- a ``pa.ArrowInvalid`` raised by pyarrow itself (e.g. a malformed upload): INVALID_ARGUMENT.
- any ``flight.FlightError`` (e.g. ``FlightCancelledError``): passed through unchanged.
- a bug (any other exception): INTERNAL; ``flight.FlightInternalError`` whose message carries an
  error id that is also in the server log.

(Raising a bare ``RuntimeError`` from a handler would be UNKNOWN; raising ``FlightServerError``
is UNKNOWN too -- both are avoided here.)

Known pyarrow behaviour: for INVALID_ARGUMENT and NOT_FOUND, pyarrow appends
``". Detail: Python exception: Traceback ..."`` (the handler frames) to the message the client
sees. The message always *starts* with flight-serve's own text.

Log level per class: user mistakes (``input``, ``not_found``, ``already_exists``) at INFO,
overload at WARNING, internal errors and bugs at ERROR with the traceback, a cancelled call at
DEBUG.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Final

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve.errors import FlightServeError, InvalidInputError

__all__ = ["log_level", "to_flight_error"]

log = logging.getLogger("flight_serve.flight")

_LEVEL_BY_DOMAIN: Final = {
    "input": logging.INFO,
    "not_found": logging.INFO,
    "already_exists": logging.INFO,
    "unsupported": logging.INFO,
    "overload": logging.WARNING,
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


def to_flight_error(exc: BaseException, *, rpc: str = "") -> Exception:
    """Return the exception a Flight handler raises for ``exc`` (see the module table), after
    logging ``exc`` at :func:`log_level`.

    Args:
        exc: what went wrong.
        rpc: the Flight method (``"DoPut"``, ...) for the log line.

    Returns:
        ``pa.ArrowInvalid`` (INVALID_ARGUMENT), ``pa.ArrowKeyError`` (NOT_FOUND), or a
        ``pyarrow.flight.FlightError`` subclass (UNAVAILABLE, INTERNAL, or ``exc`` unchanged).

    >>> from flight_serve.errors import SchemaMismatchError, StreamNotFoundError
    >>> type(to_flight_error(SchemaMismatchError("missing field 'x'"))).__name__
    'ArrowInvalid'
    >>> type(to_flight_error(StreamNotFoundError("stream 's' does not exist"))).__name__
    'ArrowKeyError'
    """
    if isinstance(exc, RecursionError):  # the client's input, not a bug: e.g. SQL in 3,000 parens
        exc = InvalidInputError(
            "the request is nested too deeply to parse (for example SQL with thousands of "
            "nested parentheses or expressions); flatten it"
        )
    level = log_level(exc)
    fields: dict[str, object] = {"rpc": rpc, "error_class": type(exc).__name__}
    if isinstance(exc, FlightServeError):
        fields["domain"] = exc.domain
        fields["retryable"] = exc.retryable
    message = _clip(str(exc))

    if isinstance(exc, FlightServeError) and exc.domain != "internal":
        log.log(level, "request failed: %s", message, extra=fields)
        if exc.domain in ("input", "already_exists"):
            return pa.ArrowInvalid(message)
        if exc.domain == "not_found":
            return pa.ArrowKeyError(message)
        if exc.domain == "unsupported":
            return NotImplementedError(message)
        if exc.domain == "overload":
            return flight.FlightUnavailableError(
                f"{message} (retryable: try again after a short delay)",
                json.dumps({"retryable": True}).encode(),
            )
    if isinstance(exc, flight.FlightError):
        log.log(level, "request failed: %s", message, extra=fields)
        return exc
    if isinstance(exc, pa.ArrowInvalid):
        # pyarrow itself rejected the client's data (e.g. a malformed IPC stream).
        log.log(level, "request failed: %s", message, extra=fields)
        return pa.ArrowInvalid(message)
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the server is stopping
        log.warning("request interrupted: %r", exc, extra=fields)
        return flight.FlightUnavailableError("the server is shutting down; retry elsewhere")
    error_id = uuid.uuid4().hex[:12]
    fields["error_id"] = error_id
    log.log(level, "request failed: %s", message, extra=fields, exc_info=exc)
    return flight.FlightInternalError(
        f"internal error {error_id} ({type(exc).__name__}): {message}"
    )
