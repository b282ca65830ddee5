"""A limit on concurrent streaming calls (DoGet, DoPut, DoExchange).

:class:`StreamLimit` counts the streaming calls in flight; a call over ``max_streams`` is refused
at once with UNAVAILABLE (``OverloadError``: ``flight.FlightUnavailableError`` whose message
says it is retryable and whose ``extra_info`` is ``{"retryable": true}``), so a client retries
after a short delay instead of queueing behind the others. Unary calls (GetFlightInfo, actions,
...) are not counted: they are short.

``flight-serve serve --max-streams N`` (default :data:`DEFAULT_MAX_STREAMS`).

:class:`MemoryBudget` bounds the memory the server holds for query inputs and results, DoPut
batches not yet written, and pipelines' window state (``--memory-budget``, bytes). A request
that needs memory reserves it first. When the budget is full the request *waits* for room
(backpressure: a DoPut stops reading, so gRPC flow control stalls the client; a query does not
start) for up to ``wait_s`` seconds, then fails UNAVAILABLE with a retry hint
(:class:`~flight_serve.errors.OverloadError`). A request larger than the whole budget fails at
once with INVALID_ARGUMENT naming the budget (waiting would not help).

:class:`QueryLimits` carries the budget, the statement timeout and the working memory DataFusion
may use per query, to :mod:`flight_serve.flight.sql.query` and :mod:`flight_serve.flight.sql.engine`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import pyarrow.flight as flight

from flight_serve.errors import InvalidInputError, OverloadError
from flight_serve.flight.ops.metrics import method_name
from flight_serve.flight.status import to_flight_error

__all__ = [
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_MEMORY_WAIT_S",
    "DEFAULT_QUERY_WORK_BYTES",
    "MIDDLEWARE_KEY",
    "MemoryBudget",
    "QueryLimits",
    "Reservation",
    "StreamLimit",
]

#: How long a request waits for room in a full memory budget before UNAVAILABLE (seconds).
DEFAULT_MEMORY_WAIT_S: Final = 5.0

#: Working memory DataFusion may use per query (sorts, aggregates, joins) under a budget, bytes.
DEFAULT_QUERY_WORK_BYTES: Final = 64 * 1024 * 1024

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


class Reservation:
    """Bytes held in a :class:`MemoryBudget` until :meth:`release` (idempotent) or the end of a
    ``with`` block, and after that for as long as work still runs on them (:meth:`hold`)."""

    def __init__(self, budget: MemoryBudget | None, nbytes: int, kind: str) -> None:
        self.nbytes = nbytes
        self.kind = kind
        self._budget = budget
        self._lock = threading.Lock()
        self._holds = 0
        self._wanted = False  # release() was called

    def hold(self) -> None:
        """Work on these bytes starts (a DataFusion worker): they stay held until the matching
        :meth:`let_go`, even if :meth:`release` comes first."""
        with self._lock:
            self._holds += 1

    def let_go(self) -> None:
        """The work of one :meth:`hold` really ended; gives the bytes back if :meth:`release`
        was called and no other work holds them."""
        with self._lock:
            self._holds -= 1
            done = self._wanted and self._holds == 0
        if done:
            self._give_back()

    def release(self) -> None:
        """Give the bytes back (wakes requests waiting for room) -- once no work holds them."""
        with self._lock:
            self._wanted = True
            held = self._holds > 0
        if not held:
            self._give_back()

    def _give_back(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._release(self.nbytes, self.kind)

    def __enter__(self) -> Reservation:
        return self

    def __del__(self) -> None:  # a lazily run request dropped before it started
        self.release()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class MemoryBudget:
    """A byte budget shared by query inputs and results, DoPut batches in flight and pipelines'
    window state (see the module docstring).

    Args:
        limit_bytes: the budget, bytes (at least 1).
        wait_s: how long :meth:`reserve` waits for room before UNAVAILABLE, seconds.
        state_bytes: returns the bytes pipelines' window state holds now (the server passes
            its running pipelines' live operator state, ``PipelineManager.window_state_bytes``);
            counted against the budget,
            re-read at most once a second. ``None``: no window state.

    Raises:
        ValueError: ``limit_bytes`` < 1 or ``wait_s`` < 0.
    """

    def __init__(
        self,
        limit_bytes: int,
        *,
        wait_s: float = DEFAULT_MEMORY_WAIT_S,
        state_bytes: Callable[[], int] | None = None,
    ) -> None:
        if limit_bytes < 1:
            raise ValueError(f"the memory budget must be at least 1 byte, got {limit_bytes}")
        if wait_s < 0:
            raise ValueError(f"the memory wait must be >= 0 seconds, got {wait_s}")
        self.limit_bytes = limit_bytes
        self.wait_s = wait_s
        self.state_bytes = state_bytes
        self._cond = threading.Condition()
        self._reserved: dict[str, int] = {}
        self._state = 0
        self._state_read = -1e18
        self.peak_bytes = 0
        self.refused = 0

    def _window_state(self) -> int:
        now = time.monotonic()
        if self.state_bytes is not None and now - self._state_read >= 1.0:
            self._state_read = now
            with contextlib.suppress(Exception):  # unreadable: counts as before
                self._state = max(0, int(self.state_bytes()))
        return self._state

    def in_use(self) -> dict[str, int]:
        """Bytes held now by kind (``query``, ``doput``, ``window_state``, ...)."""
        with self._cond:
            held = {k: v for k, v in self._reserved.items() if v}
            state = self._window_state()
        if state:
            held["window_state"] = state
        return held

    def reserve(self, nbytes: int, kind: str, what: str) -> Reservation:
        """Hold ``nbytes`` for a request of ``kind`` (``query``, ``doput``); ``what`` names it
        in errors. Waits up to ``wait_s`` seconds for room.

        Raises:
            InvalidInputError: ``nbytes`` exceeds the whole budget.
            OverloadError: no room after ``wait_s`` seconds (UNAVAILABLE, retryable).
        """
        nbytes = max(0, int(nbytes))
        if nbytes > self.limit_bytes:
            raise InvalidInputError(
                f"{what} needs {nbytes} bytes of memory, more than the server's whole memory "
                f"budget of {self.limit_bytes} bytes (--memory-budget)"
            )
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while True:
                used = sum(self._reserved.values()) + self._window_state()
                if used + nbytes <= self.limit_bytes:
                    self._reserved[kind] = self._reserved.get(kind, 0) + nbytes
                    self.peak_bytes = max(self.peak_bytes, used + nbytes)
                    return Reservation(self, nbytes, kind)
                left = deadline - time.monotonic()
                if left <= 0:
                    self.refused += 1
                    held = ", ".join(f"{k} {v}" for k, v in sorted(self._reserved.items()) if v)
                    raise OverloadError(
                        f"memory budget full: {what} needs {nbytes} bytes, {used} of "
                        f"{self.limit_bytes} bytes are held ({held or 'none by requests'}, "
                        f"window state {self._state}) and none came free within "
                        f"{self.wait_s:g} s"
                    )
                self._cond.wait(min(left, 0.25))  # re-read the window state now and then

    def _release(self, nbytes: int, kind: str) -> None:
        with self._cond:
            self._reserved[kind] = self._reserved.get(kind, 0) - nbytes
            self._cond.notify_all()


@dataclass(frozen=True)
class QueryLimits:
    """What bounds one query's run.

    Attributes:
        budget: the server's memory budget; a query reserves its pinned input bytes plus
            ``work_bytes`` before it runs (``None``: no budget).
        work_bytes: DataFusion's memory pool per query under a budget (a fair spill pool: sorts
            and aggregates spill or fail with DataFusion's "Resources exhausted" beyond it).
        statement_timeout_s: wall-clock seconds from the start of a query's DoGet (or an
            update's run) to its last batch; past it the call fails DEADLINE_EXCEEDED and the
            DataFusion stream is dropped. ``None``: no timeout.
        poll_s: how often a waiting call checks for cancellation and the timeout, seconds.
    """

    budget: MemoryBudget | None = None
    work_bytes: int = DEFAULT_QUERY_WORK_BYTES
    statement_timeout_s: float | None = None
    poll_s: float = 0.05
