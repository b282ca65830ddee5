"""Window configurations and their assignment rules (DESIGN §4).

Every window is half-open, ``[window_start, window_end)``, and aligned to the Unix epoch plus an
optional ``offset``. Durations in the public API are :class:`datetime.timedelta`; the running
logic works on integer nanoseconds since the epoch (``*_ns``).

Rules (the same words as Flink's ``TimeWindow`` and RisingWave's ``TUMBLE``/``HOP``):

* tumbling(size, offset): a row at ``t`` belongs to exactly one window,
  ``start = t - ((t - offset) mod size)`` (floor modulo, so times before 1970 work too).
* hopping(size, slide, offset): windows start at ``offset + k·slide``; a row belongs to every window
  ``[s, s + size)`` with ``s ≤ t < s + size``: that is ``ceil(size/slide)`` or ``floor(size/slide)``
  windows.
* session(gap): per key, rows closer than ``gap`` (``t2 - t1 < gap``) share a session; a session
  holding rows ``t1 ≤ … ≤ tn`` is ``[t1, tn + gap)``; a row that falls within ``gap`` of two sessions
  merges them. A row alone is the session ``[t, t + gap)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import numpy.typing as npt

from flight_serve.types import timedelta_to_ns

Int64Array = npt.NDArray[np.int64]


def _positive_ns(name: str, value: timedelta) -> int:
    ns = timedelta_to_ns(value)
    if ns <= 0:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    return ns


@dataclass(frozen=True)
class TumblingWindow:
    """Fixed-size, non-overlapping windows ``[offset + k·size, offset + (k+1)·size)``.

    Args:
        size: window length (> 0).
        offset: shift of the window grid from the Unix epoch (may be negative).

    Raises:
        ValueError: if ``size`` is not positive.

    >>> w = TumblingWindow(size=timedelta(seconds=10))
    >>> w.assign_ns(np.array([5, 10, 19], dtype=np.int64) * 10**9)[1] // 10**9
    array([ 0, 10, 10])
    """

    size: timedelta
    offset: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        _positive_ns("size", self.size)

    @property
    def size_ns(self) -> int:
        return timedelta_to_ns(self.size)

    @property
    def offset_ns(self) -> int:
        return timedelta_to_ns(self.offset)

    def assign_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Return ``(row_index, window_start_ns)``: one window per row."""
        size = self.size_ns
        start = ts_ns - np.mod(ts_ns - self.offset_ns, size)
        return np.arange(len(ts_ns), dtype=np.int64), start

    def end_ns(self, start_ns: Int64Array) -> Int64Array:
        """``window_end`` for each ``window_start`` (ns)."""
        return start_ns + self.size_ns


@dataclass(frozen=True)
class HoppingWindow:
    """Overlapping windows of ``size`` that start every ``slide`` (Flink's sliding window).

    Args:
        size: window length (> 0).
        slide: distance between consecutive window starts (> 0).
        offset: shift of the window grid from the Unix epoch.

    Raises:
        ValueError: if ``size`` or ``slide`` is not positive.

    The windows of a row at t = 100 s with size 16 s and slide 7 s are [91, 107) and [98, 114):

    >>> w = HoppingWindow(size=timedelta(seconds=16), slide=timedelta(seconds=7))
    >>> rows, starts = w.assign_ns(np.array([100 * 10**9], dtype=np.int64))
    >>> sorted((starts // 10**9).tolist())
    [91, 98]
    """

    size: timedelta
    slide: timedelta
    offset: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        _positive_ns("size", self.size)
        _positive_ns("slide", self.slide)

    @property
    def size_ns(self) -> int:
        return timedelta_to_ns(self.size)

    @property
    def slide_ns(self) -> int:
        return timedelta_to_ns(self.slide)

    @property
    def offset_ns(self) -> int:
        return timedelta_to_ns(self.offset)

    @property
    def windows_per_row(self) -> int:
        """Upper bound of windows a row belongs to: ``ceil(size / slide)``."""
        return -(-self.size_ns // self.slide_ns)

    def assign_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Return ``(row_index, window_start_ns)``, one entry per (row, window) pair,
        ordered by row, then by window start descending."""
        size, slide = self.size_ns, self.slide_ns
        n = self.windows_per_row
        last = ts_ns - np.mod(ts_ns - self.offset_ns, slide)
        rows = np.repeat(np.arange(len(ts_ns), dtype=np.int64), n)
        starts = np.repeat(last, n) - np.tile(np.arange(n, dtype=np.int64) * slide, len(ts_ns))
        keep = starts + size > np.repeat(ts_ns, n)
        if keep.all():
            return rows, starts
        return rows[keep], starts[keep]

    def end_ns(self, start_ns: Int64Array) -> Int64Array:
        """``window_end`` for each ``window_start`` (ns)."""
        return start_ns + self.size_ns


@dataclass(frozen=True)
class SessionWindow:
    """Per-key activity sessions separated by at least ``gap`` of event time with no rows.

    Args:
        gap: the inactivity gap (> 0). Rows with ``t2 - t1 < gap`` share a session.

    Raises:
        ValueError: if ``gap`` is not positive.

    A row at t is first the session ``[t, t + gap)``; overlapping sessions of one key merge
    (the engine does the merge, see ``flight_serve.engine.operator``).
    """

    gap: timedelta

    def __post_init__(self) -> None:
        _positive_ns("gap", self.gap)

    @property
    def gap_ns(self) -> int:
        return timedelta_to_ns(self.gap)

    def assign_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Return ``(row_index, window_start_ns)``: each row starts its own proto-session."""
        return np.arange(len(ts_ns), dtype=np.int64), ts_ns

    def end_ns(self, start_ns: Int64Array) -> Int64Array:
        """``window_end`` of a one-row proto-session: ``start + gap`` (ns)."""
        return start_ns + self.gap_ns


WindowSpec = TumblingWindow | HoppingWindow | SessionWindow
