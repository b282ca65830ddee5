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
* cumulate(step, max_size, offset): Flink's CUMULATE: windows share the start
  ``s = offset + k·max_size`` and end at ``s + step, s + 2·step, …, s + max_size``; a row at ``t``
  belongs to every one of them that ends after ``t``.
* calendar(unit, time_zone): tumbling day / week (Monday) / month windows that start at local
  midnight in an IANA time zone, so a day window across a DST change lasts 23 or 25 hours.

Every window type has ``assign_bounds_ns(ts) -> (row_index, window_start_ns, window_end_ns)``, one
entry per (row, window) pair, the latest window of a row first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.types import timedelta_to_ns

Int64Array = npt.NDArray[np.int64]


def _positive_ns(name: str, value: timedelta) -> int:
    ns = timedelta_to_ns(value)
    if ns <= 0:
        raise ValueError(f"{name} must be a positive duration, got {value.total_seconds():g} s")
    return ns


class _AssignedByStart(ABC):
    """Windows whose end follows from their start: ``assign_bounds_ns`` from ``assign_ns`` and
    ``end_ns``."""

    @abstractmethod
    def assign_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array]:
        """``(row_index, window_start_ns)`` per (row, window) pair."""

    @abstractmethod
    def end_ns(self, start_ns: Int64Array) -> Int64Array:
        """``window_end`` for each ``window_start`` (ns)."""

    def assign_bounds_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array, Int64Array]:
        """``(row_index, window_start_ns, window_end_ns)`` per (row, window) pair."""
        rows, starts = self.assign_ns(ts_ns)
        return rows, starts, self.end_ns(starts)


@dataclass(frozen=True)
class TumblingWindow(_AssignedByStart):
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
class HoppingWindow(_AssignedByStart):
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
class SessionWindow(_AssignedByStart):
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


@dataclass(frozen=True)
class CumulateWindow:
    """Flink's cumulating windows: within each ``max_size`` period, windows that all start at the
    period's start and grow by ``step``.

    Args:
        step: growth of consecutive windows (> 0).
        max_size: the period; a multiple of ``step``.
        offset: shift of the period grid from the Unix epoch.

    Raises:
        ValueError: non-positive durations, or ``max_size`` not a multiple of ``step``.

    A row at 25 s with step 10 s and max size 30 s is in [0, 30) only; one at 5 s is in [0, 10),
    [0, 20) and [0, 30):

    >>> w = CumulateWindow(step=timedelta(seconds=10), max_size=timedelta(seconds=30))
    >>> rows, starts, ends = w.assign_bounds_ns(np.array([25, 5], dtype=np.int64) * 10**9)
    >>> rows.tolist(), (ends // 10**9).tolist()
    ([0, 1, 1, 1], [30, 30, 20, 10])
    """

    step: timedelta
    max_size: timedelta
    offset: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        step = _positive_ns("step", self.step)
        size = _positive_ns("max_size", self.max_size)
        if size % step:
            raise ValueError(f"max_size {self.max_size} must be a multiple of step {self.step}")

    @property
    def step_ns(self) -> int:
        return timedelta_to_ns(self.step)

    @property
    def max_size_ns(self) -> int:
        return timedelta_to_ns(self.max_size)

    @property
    def offset_ns(self) -> int:
        return timedelta_to_ns(self.offset)

    def assign_bounds_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array, Int64Array]:
        """``(row_index, window_start_ns, window_end_ns)``, largest window of each row first."""
        step, size = self.step_ns, self.max_size_ns
        n = size // step
        base = ts_ns - np.mod(ts_ns - self.offset_ns, size)
        rows = np.repeat(np.arange(len(ts_ns), dtype=np.int64), n)
        starts = np.repeat(base, n)
        ends = starts + np.tile(np.arange(n, 0, -1, dtype=np.int64) * step, len(ts_ns))
        keep = ends > np.repeat(ts_ns, n)
        return rows[keep], starts[keep], ends[keep]


_CALENDAR_BUMP_NS = {
    "day": 26 * 3_600_000_000_000,
    "week": (7 * 24 + 2) * 3_600_000_000_000,
    "month": 32 * 86_400_000_000_000,
}


@dataclass(frozen=True)
class CalendarWindow:
    """Tumbling windows of one local calendar ``day``, ``week`` (from Monday) or ``month`` in an
    IANA ``time_zone``: they start at local midnight, so across a DST change a day window lasts 23
    or 25 hours (the time-zone rules are pyarrow's tz database).

    Raises:
        ValueError: an unknown unit or time zone.

    >>> w = CalendarWindow("day", "America/New_York")
    >>> spring = 1772971200 * 10**9  # 2026-03-08 12:00 UTC, the day clocks go forward
    >>> rows, starts, ends = w.assign_bounds_ns(np.array([spring], dtype=np.int64))
    >>> int(ends[0] - starts[0]) // 3_600_000_000_000
    23
    """

    unit: Literal["day", "week", "month"]
    time_zone: str

    def __post_init__(self) -> None:
        if self.unit not in _CALENDAR_BUMP_NS:
            raise ValueError(f"calendar windows are day, week or month, not {self.unit!r}")
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {self.time_zone!r}") from exc

    def _floor(self, ns: Int64Array) -> Int64Array:
        local: pa.Array[Any] = pa.array(ns, pa.timestamp("ns", tz=self.time_zone))
        floored = pc.floor_temporal(local, unit=self.unit, week_starts_monday=True)
        return np.asarray(floored.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)

    def assign_bounds_ns(self, ts_ns: Int64Array) -> tuple[Int64Array, Int64Array, Int64Array]:
        """``(row_index, window_start_ns, window_end_ns)``: one window per row."""
        if not len(ts_ns):
            return ts_ns, ts_ns, ts_ns
        starts = self._floor(ts_ns)
        ends = self._floor(starts + _CALENDAR_BUMP_NS[self.unit])
        return np.arange(len(ts_ns), dtype=np.int64), starts, ends


WindowSpec = TumblingWindow | HoppingWindow | SessionWindow | CumulateWindow | CalendarWindow
