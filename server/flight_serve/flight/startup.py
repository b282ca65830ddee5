"""Hold every call until the server is whole (``flight-serve serve``, :func:`start_server`).

pyarrow's Flight server answers from the moment it is constructed, but the server is not whole
until later: the ``pipeline.*`` actions are registered and running pipelines are resumed after
the port opens. :class:`StartupGate` is the first middleware of every call: until
:meth:`StartupGate.open` it holds the call (up to ``wait_s`` seconds, then UNAVAILABLE with a
retry hint), so no client ever sees a half-built server (an action missing, a check not yet in
place).
"""

from __future__ import annotations

import json
import threading
from typing import Final

import pyarrow.flight as flight

__all__ = ["DEFAULT_STARTUP_WAIT_S", "MIDDLEWARE_KEY", "StartupGate"]

#: The gate's key in the server's ``middleware`` mapping.
MIDDLEWARE_KEY: Final = "flight_serve_startup"

#: How long a call that arrives during startup waits for the server to be whole (seconds).
DEFAULT_STARTUP_WAIT_S: Final = 30.0


class StartupGate(flight.ServerMiddlewareFactory):
    """Holds calls until :meth:`open`; a call still held after ``wait_s`` seconds fails
    UNAVAILABLE (``extra_info`` JSON ``{"retryable": true}``)."""

    def __init__(self, wait_s: float = DEFAULT_STARTUP_WAIT_S) -> None:
        self._open = threading.Event()
        self._refused = False
        self._wait_s = wait_s

    def open(self) -> None:
        """The server is whole: let every call through, from now on."""
        self._open.set()

    def refuse(self) -> None:
        """The server will not become whole (its start failed): every held and later call
        fails UNAVAILABLE at once (unless :meth:`open` came first)."""
        if not self._open.is_set():
            self._refused = True
            self._open.set()

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` was called (and not :meth:`refuse` before it)."""
        return self._open.is_set() and not self._refused

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        if not self._open.wait(self._wait_s):
            raise flight.FlightUnavailableError(
                "the server is still starting (retryable: try again after a short delay)",
                json.dumps({"retryable": True}).encode(),
            )
        if self._refused:
            raise flight.FlightUnavailableError(
                "the server failed to start (retryable: try again after a short delay)",
                json.dumps({"retryable": True}).encode(),
            )
        return None
