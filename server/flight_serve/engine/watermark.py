"""Event-time watermarks over input partitions (DESIGN §4).

For each input partition ``p`` (one DoPut writer, one file, one DoExchange client):

    W_p = max event time seen on p - max_out_of_orderness

The operator watermark is the minimum of ``W_p`` over the partitions that have not finished, and it
never decreases. It advances only at batch boundaries: the engine judges every row of a batch
against the watermark as it stood *before* that batch, then folds the batch into ``W``.
A partition that ends (end of input) counts as ``+∞``; when every partition has ended the
watermark is ``+∞`` and every open window fires.

Idle-partition timeouts are a later addition; the tracker keeps per-partition state so they fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS


@dataclass
class WatermarkTracker:
    """Per-partition maxima and the monotone operator watermark, in ns since the epoch.

    Args:
        max_out_of_orderness_ns: the bound ``B`` subtracted from each partition's maximum (≥ 0).

    Raises:
        ValueError: if the bound is negative.

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
    _max_ts: dict[str, int] = field(default_factory=dict)
    _finished: set[str] = field(default_factory=set)
    _watermark_ns: int = MIN_WATERMARK_NS

    def __post_init__(self) -> None:
        if self.max_out_of_orderness_ns < 0:
            raise ValueError("max_out_of_orderness must not be negative")

    @property
    def watermark_ns(self) -> int:
        """The current operator watermark (``MIN_WATERMARK_NS`` before any row)."""
        return self._watermark_ns

    def observe(self, partition: str, max_event_time_ns: int | None) -> int:
        """Fold one batch's maximum event time of ``partition`` in and return the new watermark.

        ``None`` (a batch with no valid event time) registers the partition without moving it.
        """
        current = self._max_ts.get(partition, MIN_WATERMARK_NS)
        if max_event_time_ns is not None and max_event_time_ns > current:
            current = max_event_time_ns
        self._max_ts[partition] = current
        return self._advance()

    @property
    def partitions(self) -> tuple[str, ...]:
        """Every partition seen so far, finished or not."""
        return tuple(self._max_ts)

    def finish(self, partition: str) -> int:
        """Mark ``partition`` as ended (its watermark becomes +∞) and return the new watermark."""
        self._max_ts.setdefault(partition, MIN_WATERMARK_NS)
        self._finished.add(partition)
        return self._advance()

    def _advance(self) -> int:
        live = [ts for p, ts in self._max_ts.items() if p not in self._finished]
        if not live:
            candidate = MAX_WATERMARK_NS
        else:
            low = min(live)
            candidate = (
                MIN_WATERMARK_NS
                if low == MIN_WATERMARK_NS
                else max(low - self.max_out_of_orderness_ns, MIN_WATERMARK_NS)
            )
        if candidate > self._watermark_ns:
            self._watermark_ns = candidate
        return self._watermark_ns

    def snapshot(self) -> dict[str, object]:
        """An immutable copy of the tracker's state (for checkpoints); live state is untouched."""
        return {
            "max_out_of_orderness_ns": self.max_out_of_orderness_ns,
            "max_ts": dict(self._max_ts),
            "finished": sorted(self._finished),
            "watermark_ns": self._watermark_ns,
        }
