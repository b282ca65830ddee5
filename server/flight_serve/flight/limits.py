"""A limit on concurrent streaming calls (DoGet, DoPut, DoExchange).

:class:`StreamLimit` counts the streaming calls in flight; a call over ``max_streams`` is refused
at once with UNAVAILABLE (``OverloadError``: ``flight.FlightUnavailableError`` whose message
says it is retryable and whose ``extra_info`` is ``{"retryable": true}``), so a client retries
after a short delay instead of queueing behind the others. Unary calls (GetFlightInfo, actions,
...) are not counted: they are short.

``flight-serve serve --max-streams N`` (default :data:`DEFAULT_MAX_STREAMS`).
"""

from __future__ import annotations

import threading
from typing import Final

import pyarrow.flight as flight

from flight_serve.errors import OverloadError
from flight_serve.flight.metrics import method_name
from flight_serve.flight.status import to_flight_error

__all__ = ["DEFAULT_MAX_STREAMS", "MIDDLEWARE_KEY", "StreamLimit"]

#: Streaming calls served at once by default.
DEFAULT_MAX_STREAMS: Final = 64

#: The key of :class:`StreamLimit` in the server's ``middleware`` mapping.
MIDDLEWARE_KEY: Final = "flight_serve_stream_limit"

_STREAMING: Final = frozenset({"DoGet", "DoPut", "DoExchange"})


class _Slot(flight.ServerMiddleware):
    def __init__(self, limit: StreamLimit) -> None:
        self._limit = limit
        self._released = False

    def call_completed(self, exception: BaseException | None) -> None:
        self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._limit._release()

    def __del__(self) -> None:
        # A middleware after this one refused the call (auth): pyarrow drops this one without
        # call_completed, so the slot comes back when it is collected.
        self._release()


class StreamLimit(flight.ServerMiddlewareFactory):
    """Refuse streaming calls beyond ``max_streams`` in flight (see the module docstring)."""

    def __init__(self, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, got {max_streams}")
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._active = 0

    @property
    def active(self) -> int:
        """Streaming calls in flight now."""
        with self._lock:
            return self._active

    def _release(self) -> None:
        with self._lock:
            self._active -= 1

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        method = method_name(info.method)
        if method not in _STREAMING:
            return None
        with self._lock:
            if self._active >= self.max_streams:
                full = True
            else:
                full = False
                self._active += 1
        if full:
            raise to_flight_error(
                OverloadError(
                    f"too many concurrent streams ({self.max_streams} DoGet/DoPut/DoExchange "
                    "calls in flight)"
                ),
                rpc=method,
            )
        return _Slot(self)
