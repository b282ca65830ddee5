"""Event-time watermarks over input partitions (DESIGN §4).

For each input partition ``p`` (one DoPut writer, one file, one DoExchange client):

    W_p = max(max event time seen on p - max_out_of_orderness, explicit watermark of p)

The operator watermark ``W`` is the minimum of ``W_p`` over the partitions that are neither
finished nor idle, and it never decreases.

* **Batch boundaries**: the engine judges every row of a batch against ``W`` as it stood *before*
  that batch, then folds the batch into ``W``.
* **Registered partitions hold W back**: a partition added with :meth:`WatermarkTracker.add_partition`
  counts as ``-∞`` until it produces a row, advances explicitly, goes idle, or finishes. (A source
  registers all its partitions before reading any, so one fast file cannot make another's rows late.)
* **Idle partitions** (processing time): a partition with no rows for ``idle_timeout`` and no unread
  backlog is idle and does not hold ``W`` back. When it produces rows again it counts again, but
  ``W`` never moves backwards. If every live partition is idle, ``W`` stays where it is, unless:
* **Idle advance** (opt-in, ``idle_advance_ns = D``): while every live partition is idle,
  ``W = max(W, now - D)`` with ``now`` the wall-clock time (``wall_clock_ns``, event-time
  domain), so windows of a source that went quiet close ``D`` after their end in wall-clock
  time instead of waiting for the next row or the end of input. Only for event times that follow
  the wall clock: a replay of old data would see every window close at once.
* **Explicit advance**: :meth:`WatermarkTracker.advance` sets a floor for ``W_p`` without rows (a
  client saying "no more rows before t").
* **End of input**: a finished partition counts as ``+∞``; when every partition has finished, ``W`` is
  ``+∞`` and every open window fires.

Durations are nanoseconds (``*_ns``); processing time comes from ``clock_ns`` (default
:func:`time.monotonic_ns`), so tests can drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS


@dataclass
class _Partition:
    max_ts: int = MIN_WATERMARK_NS
    explicit: int = MIN_WATERMARK_NS
    last_active_ns: int = 0
    backlog: bool = False
    finished: bool = False


@dataclass
class WatermarkTracker:
    """Per-partition event-time progress and the monotone operator watermark (ns since the epoch).

    Args:
        max_out_of_orderness_ns: the bound ``B`` subtracted from each partition's maximum (>= 0).
        idle_timeout_ns: processing time without rows after which a partition without backlog is
            idle; ``None`` never marks partitions idle.
        clock_ns: processing-time clock in ns (monotonic).
        idle_advance_ns: ``D``: while every live partition is idle, ``W`` rises to
            ``wall_clock_ns() - D`` (``None``: ``W`` holds; needs ``idle_timeout_ns``).
        wall_clock_ns: wall-clock time in ns since the epoch (for ``idle_advance_ns``).

    Raises:
        ValueError: if the bound, the timeout or ``D`` is negative, or ``D`` is given without an
            idle timeout.

    >>> w = WatermarkTracker(max_out_of_orderness_ns=10)
    >>> w.observe("a", 100)
    90
    >>> w.observe("b", 50)  # a new partition cannot move W backwards
    90
    >>> w.observe("b", 120)
    90
    >>> w.finish("a")
    110
    """

    max_out_of_orderness_ns: int = 0
    idle_timeout_ns: int | None = None
    clock_ns: Callable[[], int] = time.monotonic_ns
    idle_advance_ns: int | None = None
    wall_clock_ns: Callable[[], int] = time.time_ns
    _parts: dict[str, _Partition] = field(default_factory=dict)
    _watermark_ns: int = MIN_WATERMARK_NS

    def __post_init__(self) -> None:
        if self.max_out_of_orderness_ns < 0:
            raise ValueError("max_out_of_orderness must not be negative")
        if self.idle_timeout_ns is not None and self.idle_timeout_ns < 0:
            raise ValueError("idle_timeout must not be negative")
        if self.idle_advance_ns is not None:
            if self.idle_advance_ns < 0:
                raise ValueError("idle_watermark_advance must not be negative")
            if self.idle_timeout_ns is None:
                raise ValueError(
                    "idle_watermark_advance needs idle_timeout: it acts once every partition is "
                    "idle (for example idle_timeout = '5s', idle_watermark_advance = '30s')"
                )

    @property
    def watermark_ns(self) -> int:
        """The current operator watermark (``MIN_WATERMARK_NS`` before any progress)."""
        return self._watermark_ns

    @property
    def partitions(self) -> tuple[str, ...]:
        """Every partition known so far, finished or not."""
        return tuple(self._parts)

    def _part(self, partition: str) -> _Partition:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition(last_active_ns=self.clock_ns())
        return part

    def add_partition(self, partition: str) -> None:
        """Register ``partition`` so it holds the watermark back until it makes progress."""
        self._part(partition)

    def observe(self, partition: str, max_event_time_ns: int | None) -> int:
        """Fold one batch's maximum event time of ``partition`` in; return the new watermark.

        ``None`` (a batch with no valid event time) registers the partition and counts as activity.
        """
        part = self._part(partition)
        part.last_active_ns = self.clock_ns()
        if max_event_time_ns is not None and max_event_time_ns > part.max_ts:
            part.max_ts = max_event_time_ns
        return self._advance()

    def advance(self, partition: str, watermark_ns: int) -> int:
        """Explicitly raise ``partition``'s watermark to ``watermark_ns`` (never lowers it)."""
        part = self._part(partition)
        part.last_active_ns = self.clock_ns()
        part.explicit = max(part.explicit, watermark_ns)
        return self._advance()

    def set_backlog(self, partition: str, backlog: bool) -> None:
        """Tell the tracker whether ``partition`` has unread input (a backlogged one is never idle)."""
        self._part(partition).backlog = backlog

    def finish(self, partition: str) -> int:
        """Mark ``partition`` as ended (its watermark becomes +∞) and return the new watermark."""
        self._part(partition).finished = True
        return self._advance()

    def refresh(self) -> int:
        """Re-evaluate idleness at the current processing time; return the watermark."""
        return self._advance()

    def next_idle_ns(self) -> int | None:
        """The processing-time instant (``clock_ns``) at which the first partition that is not
        idle now becomes idle if it stays silent: its last row (or registration) plus
        ``idle_timeout``. ``None`` when none can (no ``idle_timeout``; every partition finished,
        backlogged or idle already). A runtime re-checks idleness (:meth:`refresh`) at this
        instant, so a partition is idle at ``last row + idle_timeout``, not a polling interval
        later."""
        timeout = self.idle_timeout_ns
        if timeout is None:
            return None
        now = self.clock_ns()
        due = [
            p.last_active_ns + timeout
            for p in self._parts.values()
            if not p.finished and not p.backlog and not self._idle(p, now)
        ]
        return min(due) if due else None

    def all_idle(self) -> bool:
        """Whether every live (unfinished) partition is idle now, and there is at least one."""
        now = self.clock_ns()
        live = [p for p in self._parts.values() if not p.finished]
        return bool(live) and all(self._idle(p, now) for p in live)

    def is_idle(self, partition: str) -> bool:
        """Whether ``partition`` is idle now (see the module docstring)."""
        part = self._parts[partition]
        return self._idle(part, self.clock_ns())

    def _idle(self, part: _Partition, now: int) -> bool:
        return (
            self.idle_timeout_ns is not None
            and not part.backlog
            and not part.finished
            and now - part.last_active_ns >= self.idle_timeout_ns
        )

    def _partition_watermark(self, part: _Partition) -> int:
        if part.max_ts == MIN_WATERMARK_NS:
            from_rows = MIN_WATERMARK_NS
        else:
            from_rows = max(part.max_ts - self.max_out_of_orderness_ns, MIN_WATERMARK_NS)
        return max(from_rows, part.explicit)

    def _advance(self) -> int:
        now = self.clock_ns()
        live = [p for p in self._parts.values() if not p.finished]
        if not live:
            candidate = MAX_WATERMARK_NS if self._parts else MIN_WATERMARK_NS
        else:
            active = [p for p in live if not self._idle(p, now)]
            if not active:  # everything idle: hold, or follow the wall clock D behind
                if self.idle_advance_ns is None:
                    return self._watermark_ns
                candidate = self.wall_clock_ns() - self.idle_advance_ns
            else:
                candidate = min(self._partition_watermark(p) for p in active)
        if candidate > self._watermark_ns:
            self._watermark_ns = candidate
        return self._watermark_ns

    def partition_watermarks(self) -> dict[str, dict[str, Any]]:
        """Each known partition's own watermark now, by partition name: ``{"watermark_ns":
        W_p in ns since the epoch (``None`` before the partition made progress; the largest
        int64, +inf, once it finished), "idle": bool, "finished": bool}``. Read-only (for
        status pages: Flink's per-subtask watermarks).

        >>> w = WatermarkTracker(max_out_of_orderness_ns=10)
        >>> w.add_partition("b")
        >>> _ = w.observe("a", 100)
        >>> w.partition_watermarks()["a"]
        {'watermark_ns': 90, 'idle': False, 'finished': False}
        >>> w.partition_watermarks()["b"]["watermark_ns"] is None
        True
        """
        now = self.clock_ns()
        out: dict[str, dict[str, Any]] = {}
        for name, part in self._parts.items():
            mark: int | None = self._partition_watermark(part)
            if part.finished:
                mark = MAX_WATERMARK_NS
            elif mark == MIN_WATERMARK_NS:
                mark = None
            out[name] = {"watermark_ns": mark, "idle": self._idle(part, now),
                         "finished": part.finished}  # fmt: skip
        return out

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of the tracker's state (for checkpoints); live state is untouched.

        Processing-time facts (last activity, backlog) are not part of it: after a restore every
        partition counts as active from the moment of the restore.
        """
        return {
            "partitions": {
                name: [p.max_ts, p.explicit, p.finished] for name, p in self._parts.items()
            },
            "watermark_ns": self._watermark_ns,
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace this tracker's state with ``snapshot`` (from :meth:`snapshot`).

        Raises:
            KeyError, ValueError: ``snapshot`` is not a tracker snapshot.
        """
        now = self.clock_ns()
        self._parts = {
            str(name): _Partition(int(m), int(e), now, False, bool(f))
            for name, (m, e, f) in snapshot["partitions"].items()
        }
        self._watermark_ns = int(snapshot["watermark_ns"])
