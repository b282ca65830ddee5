"""A ring buffer of pipeline status samples, fed by a sampling thread (the console's plots).

Every ``interval_s`` (1 s) the :class:`Sampler` reads each running pipeline's public status
(:meth:`~flight_serve.console.source.ConsoleSource.status`) and keeps, per pipeline, the last
``keep`` samples (3600: an hour at 1 s) of::

    {"t": unix seconds, "watermark_lag_s": float | None, "rows_in": int,
     "rows_per_s": float | None, "open_panes": int, "late_rows": int, "epoch": int | None}

The status's counters are those of the last checkpoint, so ``rows_per_s`` is the rows read
between the last two checkpoints over the time between them (``taken_at``); it drops to 0 once
no checkpoint came for three sampling intervals plus the last gap between checkpoints (a
pipeline with nothing to read does not checkpoint). Each new checkpoint seen (a new epoch in ``last_checkpoint``)
is also kept, the last ``keep_checkpoints`` (200): the checkpoint history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from datetime import datetime
from typing import Any

from flight_serve.console.source import ConsoleSource
from flight_serve.errors import FlightServeError

__all__ = ["Sampler"]

log = logging.getLogger("flight_serve.console")


class Sampler:
    """Samples of every running pipeline (see the module docstring).

    Args:
        source: what the console reads.
        interval_s: seconds between samples.
        keep: samples kept per pipeline.
        keep_checkpoints: checkpoints kept per pipeline.
    """

    def __init__(
        self,
        source: ConsoleSource,
        interval_s: float = 1.0,
        keep: int = 3600,
        keep_checkpoints: int = 200,
    ) -> None:
        self.source = source
        self.interval_s = interval_s
        self.keep = keep
        self.keep_checkpoints = keep_checkpoints
        self._samples: dict[str, deque[dict[str, Any]]] = {}
        self._checkpoints: dict[str, deque[dict[str, Any]]] = {}
        #: per pipeline: the last checkpoint's epoch, time, rows_in, the rate and the gap to it
        self._last: dict[str, tuple[Any, float, int, float | None, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flight-serve-console-sampler",
                                        daemon=True)  # fmt: skip

    def start(self) -> None:
        """Start the sampling thread (a first sample is taken at once)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampling thread (waits for it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # never let a sampling error end the console's plots
                log.exception("console sampler failed")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def sample_once(self, now: float | None = None) -> None:
        """Take one sample of every running pipeline (and note new checkpoints of all)."""
        for entry in self.source.pipelines():
            pid = str(entry["id"])
            try:
                status = self.source.status(pid)
            except FlightServeError:
                continue
            self._note_checkpoint(pid, status.get("last_checkpoint"))
            if status.get("state") != "running":
                continue
            t = time.time() if now is None else now
            rows_in = int(status.get("rows_in") or 0)
            rate = self._rate_of(pid, status, rows_in, t)
            with self._lock:
                ring = self._samples.setdefault(pid, deque(maxlen=self.keep))
                ring.append({
                    "t": round(t, 3),
                    "watermark_lag_s": status.get("watermark_lag_s"),
                    "rows_in": rows_in,
                    "rows_per_s": rate,
                    "open_panes": int(status.get("open_panes") or 0),
                    "late_rows": sum(int(v) for v in (status.get("late_rows") or {}).values()),
                    "epoch": (status.get("last_checkpoint") or {}).get("epoch"),
                })  # fmt: skip

    def _rate_of(self, pid: str, status: dict[str, Any], rows_in: int, now: float) -> float | None:
        """Rows per second between the last two checkpoints (see the module docstring)."""
        checkpoint = status.get("last_checkpoint") or {}
        epoch, taken = checkpoint.get("epoch"), checkpoint.get("taken_at")
        if epoch is None or not taken:
            return None
        try:
            at = datetime.fromisoformat(str(taken)).timestamp()
        except ValueError:
            return None
        last = self._last.get(pid)
        if last is None or last[0] != epoch:
            rate = None
            if last is not None and at > last[1]:
                rate = round(max(rows_in - last[2], 0) / (at - last[1]), 3)
            gap = at - last[1] if last is not None else self.interval_s
            self._last[pid] = (epoch, at, rows_in, rate, gap)
            return rate
        _, at, _, rate, gap = last
        if now - at > 3 * self.interval_s + gap:
            return 0.0
        return rate

    def _note_checkpoint(self, pid: str, checkpoint: dict[str, Any] | None) -> None:
        if not checkpoint or checkpoint.get("epoch") is None:
            return
        with self._lock:
            ring = self._checkpoints.setdefault(pid, deque(maxlen=self.keep_checkpoints))
            if ring and ring[-1]["epoch"] == checkpoint["epoch"]:
                return
            ring.append({
                "epoch": checkpoint["epoch"],
                "taken_at": checkpoint.get("taken_at"),
                "duration_ms": checkpoint.get("duration_ms"),
                "bytes": checkpoint.get("bytes"),
            })  # fmt: skip

    def samples(self, pid: str, since: float | None = None) -> list[dict[str, Any]]:
        """``pid``'s samples, oldest first (those after unix time ``since`` when given)."""
        with self._lock:
            ring = list(self._samples.get(pid, ()))
        return ring if since is None else [s for s in ring if s["t"] > since]

    def rate(self, pid: str) -> float | None:
        """The last sample's ``rows_per_s`` (``None`` before a rate is known)."""
        with self._lock:
            ring = self._samples.get(pid)
            return ring[-1]["rows_per_s"] if ring else None

    def checkpoints(self, pid: str) -> list[dict[str, Any]]:
        """The checkpoints seen of ``pid``, newest first: ``{epoch, taken_at, duration_ms,
        bytes}``."""
        with self._lock:
            return list(reversed(self._checkpoints.get(pid, ())))
