"""Folded session state: gap-based sessions of count, sum, min, max and avg merged per batch.

The SQL path of :mod:`.operator` buffers session rows and merges them into the open sessions
with a DataFusion window query whenever a session can close; this module keeps the open
sessions in numpy arrays instead (the same state columns as :mod:`.fold`, one row per open
session rather than per pane and slot), and merges each batch into them when it arrives:

1. the batch's rows are sorted by (key slot, event time) and cut into runs: a run ends where the
   key changes or the next row is ``gap`` or more later (each row is the proto-session
   ``[t, t + gap)``; consecutive rows closer than ``gap`` overlap). Each run becomes one
   session: ``[first t, last t + gap)`` and its state columns reduced with ``ufunc.reduceat``.
2. the runs are merged with the open sessions of their keys: sorted by (slot, start), a session
   starts a new group where its start is at or after the latest end so far within its key;
   each group is one merged session (a late row bridging two open sessions merges all three).

Open sessions of one key never overlap, nor do a key's closed (emitted) sessions, which is
what lets a row's overlap with them be found by one search (:func:`last_below`).

State: ``open sessions x (3 + state columns) x 8 bytes`` (slot, start, end, then the columns of
:func:`.fold.plan`), plus ``x 3 x 8`` bytes per remembered closed session; the key map of
:class:`.fold.KeyMap` (every key seen, never compacted).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flight_serve.engine.fold import FoldPlan, KeyMap, StateColumn

_SPAN_LIMIT = 1 << 62  # the offset trick of _new_groups must stay inside int64


def last_below(
    item_group: np.ndarray, item_value: np.ndarray, group: np.ndarray, value: np.ndarray
) -> np.ndarray:
    """For each query ``(group[i], value[i])``: the index of the item of the same group with the
    largest ``item_value < value[i]`` (the last one among equal values), or -1 (int64, 1-D).

    >>> last_below(np.array([0, 0, 1]), np.array([5, 9, 2]), np.array([0, 0, 1, 2]),
    ...            np.array([9, 10, 2, 7])).tolist()
    [0, 1, -1, -1]
    """
    n, m = len(item_group), len(group)
    if not n or not m:
        return np.full(m, -1, dtype=np.int64)
    groups = np.concatenate([item_group, group])
    values = np.concatenate([item_value, value])
    tie = np.concatenate([np.ones(n, dtype=np.int8), np.zeros(m, dtype=np.int8)])  # query first
    order = np.lexsort((tie, values, groups))
    is_item = order < n
    position = np.where(is_item, np.arange(n + m, dtype=np.int64), -1)
    last = np.maximum.accumulate(position)  # sorted position of the latest item so far
    safe = np.maximum(last, 0)
    found = (last >= 0) & (groups[order[safe]] == groups[order])
    result = np.where(found, order[safe], -1)
    out = np.empty(m, dtype=np.int64)
    out[order[~is_item] - n] = result[~is_item]
    return out


def _reduce(
    col: StateColumn, values: Any, order: np.ndarray | None, starts: np.ndarray, n: int
) -> np.ndarray:
    """The state column ``col`` reduced over the runs starting at ``starts`` of the ``n`` values
    taken in ``order``."""
    if np.ndim(values) == 0:  # a count of every row: the run lengths
        return np.diff(np.append(starts, n)).astype(np.int64) * int(values)
    ordered = values if order is None else values[order]
    with np.errstate(invalid="ignore"):  # inf + -inf, NaN in max: NaN is the result
        if col.op == "add":
            return np.add.reduceat(ordered, starts)
        if ordered.dtype.kind == "f":
            return (np.fmin if col.op == "min" else np.maximum).reduceat(ordered, starts)
        return (np.minimum if col.op == "min" else np.maximum).reduceat(ordered, starts)


def _new_groups(slot: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Sessions sorted by (slot, start): True where one starts a merged group (its key changes,
    or it starts at or after every earlier end of its key)."""
    n = len(slot)
    new = np.ones(n, dtype=bool)
    if n < 2:
        return new
    first = np.ones(n, dtype=bool)
    first[1:] = slot[1:] != slot[:-1]
    heads = np.flatnonzero(first)
    lo = start[heads]
    hi = np.maximum.reduceat(end, heads)
    spans = [int(h) - int(low) + 1 for h, low in zip(hi.tolist(), lo.tolist(), strict=True)]
    if sum(spans) < _SPAN_LIMIT:
        # a running max within each key: shift each key's ends into its own disjoint range
        base = np.cumsum(np.array([0, *spans[:-1]], dtype=np.int64))
        group = np.cumsum(first) - 1
        shift = base[group] - lo[group]
        running = np.maximum.accumulate(end + shift) - shift
        new[1:] = first[1:] | (start[1:] >= running[:-1])
        return new
    best = int(end[0])  # spans too wide to shift: one pass in Python (never seen in practice)
    for i in range(1, n):
        if first[i] or int(start[i]) >= best:
            best = int(end[i])
        else:
            new[i] = False
            best = max(best, int(end[i]))
    return new


class SessionFoldState:
    """The open and remembered closed sessions of one session-window operator.

    Args:
        fold_plan: the state columns (:func:`.fold.plan`).
        gap_ns: the session gap (ns, > 0).
        key_map: the GROUP BY keys to slots.

    Attributes (numpy, one element per session): ``slot``, ``start``, ``end`` (ns, end
    exclusive), ``values`` (state column name to array) of the open sessions; ``closed_slot``,
    ``closed_start``, ``closed_end`` of the emitted sessions still remembered.
    """

    def __init__(self, fold_plan: FoldPlan, gap_ns: int, key_map: KeyMap) -> None:
        self.plan, self.gap, self.keys = fold_plan, gap_ns, key_map
        empty = np.zeros(0, dtype=np.int64)
        self.slot, self.start, self.end = empty, empty, empty
        self.values: dict[str, np.ndarray] = {
            c.name: np.zeros(0, dtype=c.dtype) for c in fold_plan.columns
        }
        self.closed_slot, self.closed_start, self.closed_end = empty, empty, empty

    @property
    def open_count(self) -> int:
        return len(self.slot)

    def min_end(self) -> int | None:
        """The earliest end of an open session (ns), ``None`` when none is open."""
        return int(self.end.min()) if len(self.end) else None

    def closed_max_end(self) -> int | None:
        return int(self.closed_end.max()) if len(self.closed_end) else None

    def closed_hit(self, slots: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Per row: the index of the remembered closed session of its key that ``[t, t + gap)``
        overlaps (the latest one), or -1."""
        j = last_below(self.closed_slot, self.closed_start, slots, ts + self.gap)
        hit = j >= 0
        hit[hit] = self.closed_end[j[hit]] > ts[hit]
        return np.where(hit, j, -1)

    def open_hit(self, slots: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Per row: whether ``[t, t + gap)`` overlaps an open session of its key (bool)."""
        j = last_below(self.slot, self.start, slots, ts + self.gap)
        hit = j >= 0
        hit[hit] = self.end[j[hit]] > ts[hit]
        return hit

    def add(self, slots: np.ndarray, ts: np.ndarray, values: dict[str, Any]) -> None:
        """Merge accepted rows (key slots, event times in ns, :func:`.fold.row_values`) into the
        open sessions."""
        n = len(ts)
        if not n:
            return
        if n > 1 and bool(np.all(ts[1:] >= ts[:-1])):
            # event-time order already: a stable sort by slot keeps it within each key
            narrow = slots.astype(np.uint16) if self.keys.size <= 1 << 16 else slots
            order = np.argsort(narrow, kind="stable")
        else:
            order = np.lexsort((ts, slots))
        s, t = slots[order], ts[order]
        new = np.ones(n, dtype=bool)
        new[1:] = (s[1:] != s[:-1]) | (t[1:] - t[:-1] >= self.gap)
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], n) - 1
        run_slot, run_start, run_end = s[starts], t[starts], t[ends] + self.gap
        run_values = {
            c.name: _reduce(c, values[c.name], order, starts, n) for c in self.plan.columns
        }
        if not len(self.slot):
            self.slot, self.start, self.end, self.values = run_slot, run_start, run_end, run_values
            return
        present = np.zeros(max(self.keys.size, int(run_slot.max()) + 1), dtype=bool)
        present[run_slot] = True
        touched = present[self.slot]
        if not touched.any():  # a key's runs never overlap each other (gap or more apart)
            self._append(run_slot, run_start, run_end, run_values, ~touched)
            return
        idx = np.flatnonzero(touched)
        slot = np.concatenate([self.slot[idx], run_slot])
        start = np.concatenate([self.start[idx], run_start])
        end = np.concatenate([self.end[idx], run_end])
        both = {c: np.concatenate([self.values[c][idx], run_values[c]]) for c in run_values}
        order = np.lexsort((start, slot))
        slot, start, end = slot[order], start[order], end[order]
        heads = np.flatnonzero(_new_groups(slot, start, end))
        merged = {
            c.name: _reduce(c, both[c.name], order, heads, len(slot)) for c in self.plan.columns
        }
        self._append(slot[heads], start[heads], np.maximum.reduceat(end, heads), merged, ~touched)

    def _append(
        self,
        slot: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        values: dict[str, np.ndarray],
        keep: np.ndarray,
    ) -> None:
        """The open sessions become those of ``keep`` followed by the given ones."""
        self.slot = np.concatenate([self.slot[keep], slot])
        self.start = np.concatenate([self.start[keep], start])
        self.end = np.concatenate([self.end[keep], end])
        self.values = {c: np.concatenate([self.values[c][keep], values[c]]) for c in values}

    def take_closed(
        self, threshold: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
        """Remove and return the open sessions with ``end <= threshold`` (``None``: every one, end
        of input) as ``(slots, starts, ends, values)``; ``None`` when there is none.

        Below end of input they are remembered as closed sessions, and the remembered ones a
        new row can no longer reach are forgotten: those ending at or before
        ``threshold - gap`` whose key has no open session (a row bridging an open session of the
        key and the closed one would otherwise reopen it)."""
        if not len(self.slot):
            return None
        due = np.ones(len(self.slot), dtype=bool) if threshold is None else self.end <= threshold
        if not due.any():
            return None
        fired = (
            self.slot[due],
            self.start[due],
            self.end[due],
            {c: v[due] for c, v in self.values.items()},
        )
        keep = ~due
        self.slot, self.start, self.end = self.slot[keep], self.start[keep], self.end[keep]
        self.values = {c: v[keep] for c, v in self.values.items()}
        if threshold is not None:
            slot = np.concatenate([self.closed_slot, fired[0]])
            start = np.concatenate([self.closed_start, fired[1]])
            end = np.concatenate([self.closed_end, fired[2]])
            held = np.zeros(max(self.keys.size, 1), dtype=bool)
            held[self.slot] = True
            remember = (end > threshold - self.gap) | held[slot]
            self.closed_slot, self.closed_start, self.closed_end = (
                slot[remember],
                start[remember],
                end[remember],
            )
        return fired

    def restore(
        self,
        slot: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        values: dict[str, np.ndarray],
        closed: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """Set the open and remembered closed sessions (from a snapshot)."""
        self.slot, self.start, self.end, self.values = slot, start, end, values
        self.closed_slot, self.closed_start, self.closed_end = closed

    def state_bytes(self) -> int:
        """Bytes of numpy state held (open and closed sessions; not the key map)."""
        arrays = [self.slot, self.start, self.end, *self.values.values()]
        arrays += [self.closed_slot, self.closed_start, self.closed_end]
        return int(sum(a.nbytes for a in arrays))
