"""A request id per Flight call, and one JSON log line when the call ends.

:class:`RequestLogMiddlewareFactory` gives every call a request id: the client's
``x-request-id`` header when it sends one (up to 128 printable characters), else 16 random hex
digits. The id goes back to the client in the ``x-request-id`` response header, and when the
call ends one ``rpc`` record is logged (JSON lines under ``flight-serve serve``) with
``request_id``, ``method``, ``code`` (the gRPC status code name) and ``duration_ms``;
failed calls are logged at warning level with the error's first line (cut before pyarrow's
``". Detail: "``). Handlers find the id of their call with :func:`request_id_of`; every error a
client receives ends with ``(request id <id>)`` (:mod:`flight_serve.flight.status`).
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Final

import pyarrow.flight as flight

from flight_serve.flight.ops.metrics import method_name, status_code_of
from flight_serve.flight.status import current_request_id, set_current_request_id

__all__ = ["MIDDLEWARE_KEY", "REQUEST_ID_HEADER", "RequestLogMiddlewareFactory", "request_id_of"]

#: The header carrying the request id, both ways.
REQUEST_ID_HEADER: Final = "x-request-id"

#: The middleware's key in the server's ``middleware`` mapping.
MIDDLEWARE_KEY: Final = "flight_serve_request_log"

log = logging.getLogger("flight_serve.rpc")


def _client_id(headers: dict[str, list[str] | list[bytes]]) -> str | None:
    """The client's request id, if it sent a usable one.

    >>> _client_id({"x-request-id": ["abc-1"]})
    'abc-1'
    >>> _client_id({"x-request-id": ["bad\\nid"]}) is None
    True
    """
    for key, values in headers.items():
        if key.lower() == REQUEST_ID_HEADER and values:
            value = values[0]
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            if 0 < len(text) <= 128 and text.isprintable():
                return text
    return None


class RequestLog(flight.ServerMiddleware):
    """The middleware instance of one call (its :attr:`request_id`)."""

    def __init__(self, request_id: str, method: str) -> None:
        self.request_id = request_id
        self.method = method
        self._start = time.perf_counter()

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        return {REQUEST_ID_HEADER: [self.request_id]}

    def call_completed(self, exception: BaseException | None) -> None:
        if current_request_id() == self.request_id:
            set_current_request_id(None)
        code = status_code_of(exception)
        fields: dict[str, object] = {
            "request_id": self.request_id,
            "method": self.method,
            "code": code,
            "duration_ms": round((time.perf_counter() - self._start) * 1000, 3),
        }
        if exception is None:
            log.info("rpc", extra=fields)
        else:
            lines = str(exception).strip().splitlines()
            first = lines[0].split(". Detail: ", 1)[0] if lines else ""
            fields["error"] = first or type(exception).__name__
            log.warning("rpc", extra=fields)


class RequestLogMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Assigns request ids and logs each call's end (see the module docstring)."""

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        request_id = _client_id(headers) or secrets.token_hex(8)
        # gRPC runs the call's handler (and streams its results) on this thread: errors made
        # there carry the id (flight_serve.flight.status.with_request_id)
        set_current_request_id(request_id)
        return RequestLog(request_id, method_name(info.method))


def request_id_of(context: flight.ServerCallContext) -> str | None:
    """The request id of the call ``context`` belongs to (None without the middleware)."""
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return middleware.request_id if isinstance(middleware, RequestLog) else None
