"""Exact ``count(DISTINCT x)`` on the folded path (:mod:`.fold`): per pane, the set of distinct
``(key slot, value)`` pairs, deduplicated per batch with Arrow's hash aggregation.

Why not the SQL path's ``array_agg(DISTINCT x)`` partials merged with
``array_distinct(flatten(array_agg(p)))`` at each window close: that merge is a DataFusion query
over every held list per close, about 89 % of the checkpointed ``count(DISTINCT)`` benchmark's
time (``benchmarks/checkpoints.py``, 4 M events, 20 K keys, measured with cProfile).

State, for one ``count(DISTINCT x)`` column and one pane: a list of Arrow tables ``(s, v)`` (key
slot int64, value of ``x``'s type) without NULL values. A batch appends one table per pane it
touches: its non-NULL ``(slot, value)`` pairs as they are. Repeated pairs are removed by
``Table.group_by([s, v])`` (a hash aggregation in C++, no Python per row) when a pane holds more
than :attr:`DistinctSets.MAX_PARTS` tables (they become one table of distinct pairs) and when a
pane or window is read (a window close, a snapshot); the count per slot is then ``np.bincount``
of the slots. So a window's count is the number of distinct
non-NULL values of its rows per key, exactly, whatever the batch cutting, and NULL values are not
counted (a window whose rows of a key are all NULL counts 0), as in DataFusion's
``count(DISTINCT x)``; a NULL key is a key like any other (its slot).

Value types: integers, strings, binary, booleans, dates and timestamps, whose equality is the
bits' (or bytes') equality. Floating-point and decimal values keep the SQL path (NaN and ``-0.0``
would depend on how each engine hashes them).

Memory: 8 bytes per pair for the slot plus the value (8 bytes for integers, the bytes plus a
4-byte offset for strings), for every distinct (key, value) of every open pane, plus the not yet
deduplicated rows of at most :attr:`DistinctSets.MAX_PARTS` batches per pane (16 bytes a row for
integers).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SLOT, VALUE = "s", "v"


def value_ok(t: pa.DataType) -> bool:
    """Whether ``count(DISTINCT x)`` of type ``t`` is kept in :class:`DistinctSets`."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def _dedupe(parts: list[pa.Table]) -> pa.Table:
    """One table of the distinct ``(s, v)`` pairs of ``parts`` (each already NULL-free)."""
    table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    return table.group_by([SLOT, VALUE], use_threads=False).aggregate([])


class DistinctSets:
    """The distinct ``(slot, value)`` pairs of one ``count(DISTINCT x)`` column, per pane.

    Args:
        value_type: the Arrow type of ``x`` (:func:`value_ok`).
    """

    #: a pane holding more tables than this has them grouped into one
    MAX_PARTS: ClassVar[int] = 8

    def __init__(self, value_type: pa.DataType) -> None:
        self.value_type = value_type
        self.schema = pa.schema([pa.field(SLOT, pa.int64()), pa.field(VALUE, value_type)])
        self._parts: dict[int, list[pa.Table]] = {}
        self._dirty: set[int] = set()  # panes whose tables may repeat a pair

    @property
    def nbytes(self) -> int:
        """Bytes of the held pair tables."""
        return sum(t.nbytes for parts in self._parts.values() for t in parts)

    def add(self, panes: np.ndarray, slots: np.ndarray, values: pa.Array[Any]) -> None:
        """Add rows: the pane number and key slot (int64 arrays) and the value of each row;
        rows with a NULL value are skipped."""
        if values.null_count:
            valid = values.is_valid()
            keep = np.asarray(valid.to_numpy(zero_copy_only=False), dtype=bool)
            values, panes, slots = values.filter(valid), panes[keep], slots[keep]
        if not len(values):
            return
        lo, hi = int(panes.min()), int(panes.max())
        if lo == hi:
            self._add_pane(lo, slots, values)
            return
        order = np.argsort(panes, kind="stable")
        sorted_panes = panes[order]
        bounds = np.flatnonzero(sorted_panes[1:] != sorted_panes[:-1]) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(order)]])
        taken = values.take(pa.array(order, pa.int64()))
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            self._add_pane(int(sorted_panes[a]), slots[order[a:b]], taken.slice(a, b - a))

    def _add_pane(self, pane: int, slots: np.ndarray, values: pa.Array[Any]) -> None:
        table = pa.Table.from_arrays([pa.array(slots, pa.int64()), values], schema=self.schema)
        parts = self._parts.setdefault(pane, [])
        parts.append(table)
        self._dirty.add(pane)
        if len(parts) > self.MAX_PARTS:
            parts[:] = [_dedupe(parts)]

    def pane(self, pane: int) -> pa.Table:
        """The distinct pairs of ``pane`` (empty if none), grouped into one table (kept so)."""
        parts = self._parts.get(pane)
        if not parts:
            return self.schema.empty_table()
        if pane in self._dirty:
            parts[:] = [_dedupe(parts)]
            self._dirty.discard(pane)
        return parts[0]

    def window(self, panes: list[int]) -> pa.Table:
        """The distinct pairs of the union of ``panes``."""
        if len(panes) == 1:
            return self.pane(panes[0])
        parts = [t for p in panes for t in self._parts.get(p, ())]
        return _dedupe(parts) if parts else self.schema.empty_table()

    def drop(self, pane: int) -> None:
        """Forget ``pane`` (evicted)."""
        self._parts.pop(pane, None)
        self._dirty.discard(pane)

    def remap(self, new_slot: np.ndarray) -> None:
        """Renumber every held slot ``s`` to ``new_slot[s]`` (after the key map was compacted;
        every held slot is live)."""
        for parts in self._parts.values():
            parts[:] = [
                t.set_column(0, SLOT, pa.array(new_slot[np.asarray(t[SLOT].to_numpy(), np.int64)]))
                for t in parts
            ]

    @staticmethod
    def counts(pairs: pa.Table, slots: np.ndarray, width: int) -> np.ndarray:
        """The number of distinct values of each of ``slots`` in ``pairs`` (``width``: the slot
        range, above every slot)."""
        s = np.asarray(pairs[SLOT].to_numpy(), dtype=np.int64)
        return np.asarray(np.bincount(s, minlength=width)[slots], dtype=np.int64)

    @staticmethod
    def lists(pairs: pa.Table, slots: np.ndarray, width: int) -> pa.Array[Any]:
        """One list per entry of ``slots`` (ascending) of its distinct values in ``pairs``:
        ``list<item: value type>``, empty where a slot has none."""
        s = np.asarray(pairs[SLOT].to_numpy(), dtype=np.int64)
        order = np.argsort(s, kind="stable")
        per_slot = np.bincount(s, minlength=width)
        # a slot of ``slots`` owns the pairs from the start of its run in sorted order
        starts = np.concatenate([[0], np.cumsum(per_slot)])[slots]
        lengths = per_slot[slots]
        take = _runs(starts, lengths)
        values = pairs[VALUE].combine_chunks().take(pa.array(order[take], pa.int64()))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)

    def restore(self, panes: np.ndarray, slots: np.ndarray, lists: pa.Array[Any]) -> None:
        """Add the pairs of a snapshot: per row its pane, slot and list of values."""
        lengths = np.asarray(
            pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False), np.int64
        )
        flat = pc.list_flatten(lists)
        self.add(np.repeat(panes, lengths), np.repeat(slots, lengths), flat)


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(a, a + n) for a, n in zip(starts, lengths))``, vectorised."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    first = ends - lengths  # the output index of each run's first element
    out = np.arange(total, dtype=np.int64)
    out -= np.repeat(first - starts, lengths)
    return out
