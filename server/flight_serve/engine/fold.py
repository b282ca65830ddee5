"""Folded window state: tumbling and hopping aggregates updated per batch on arrival (DESIGN §4).

The SQL path of :mod:`.operator` buffers rows and merges partial aggregates into pane state with
DataFusion (``UNION ALL`` + ``GROUP BY``) whenever a window can fire; this module keeps the state
of the fixed-width, mergeable aggregates in numpy arrays instead, so a batch is folded into the
state once, when it arrives, and closing a window only reads the arrays of that window.

* **slots**: a persistent map from group key to a slot number (:class:`KeyMap`): integer keys of a
  small range through a direct-address table, other keys through ``pyarrow.compute.index_in``
  against the keys already seen (new keys are appended); several key columns combine the slots of
  each column pairwise into one int64 code, mapped the same way.
* **panes**: event time is cut into panes of ``g = gcd(size, slide)`` (tumbling: ``g = size``);
  pane ``p`` holds the rows with ``offset + p·g ≤ t < offset + (p+1)·g``, and window ``k``
  (``[offset + k·slide, offset + k·slide + size)``) is the panes ``k·r … k·r + m - 1`` with
  ``r = slide / g``, ``m = size / g``. A hopping row is folded into one pane, not into each of its
  windows; a window sums (min, max) its panes when it fires.
* **state**: for each state column a flat array of ``pane rows x slot capacity``, updated with
  ``np.add.at`` / ``np.fmin.at`` / ``np.maximum.at`` at ``pane row · capacity + slot``.

| aggregate          | state columns (per pane and slot)                    | null handling            |
|--------------------|------------------------------------------------------|--------------------------|
| (every query)      | ``n:*`` rows (int64, add): the pane exists if > 0     |                          |
| count(*)           | ``n:*``                                              |                          |
| count(x)           | ``n:x`` non-NULL values (int64, add)                 | NULLs not counted        |
| sum(x)             | ``add:x`` (int64 for integers, float64), ``n:x``      | NULL when ``n:x = 0``    |
| min(x) / max(x)    | ``min:x`` / ``max:x`` (int64 or float64), ``n:x``     | NULL when ``n:x = 0``    |
| avg(x)             | ``addf:x`` (float64), ``n:x``                        | NULL when ``n:x = 0``    |
| count(DISTINCT x)  | ``d:x``: the pane's distinct (slot, value) pairs     | NULLs not counted        |

``count(DISTINCT x)`` (tumbling and hopping only; integer, string, binary, boolean, date and
timestamp ``x``) keeps a set per pane, not an array (:mod:`.distinct`): a window reads the union
of its panes' sets and counts the pairs per slot.

NaN orders above every number (PostgreSQL's rule, and DataFusion's ungrouped ``min`` / ``max``):
``max`` is NaN when a value is NaN, ``min`` skips NaN unless every value is NaN. DataFusion's
grouped ``min`` / ``max`` (the SQL path) depend on the order the NaN arrives in, so the two paths
agree on NaN only where that order happens to match. Integer sums wrap on int64 overflow. Only integer (not uint64) and
float32/float64 inputs take this path, keys of integer, string, binary, boolean, date and
timestamp types; anything else (and every other aggregate, ``emit = 'update'``, empty windows,
cumulate / calendar windows) keeps the SQL path: :func:`plan` returns ``None``. Session windows
of the same aggregates are folded too, by :mod:`.fold_session` (one state row per open session).

Memory: the key map keeps the keys it has seen, and each open pane's arrays are as wide as that
map, so the state is ``open panes x keys in the map x 8 bytes`` per state column; a checkpoint
holds only the (key, pane) pairs with rows. When windows are evicted and the map has grown past
:attr:`FoldState.COMPACT_MIN_SLOTS` and twice its size at the last check, the keys with no row in
any open pane are dropped (:meth:`FoldState.compact`: a new map of the live keys, the arrays
narrowed to them), so a stream whose keys keep changing (ever-new ids) holds about the keys of
its open windows, not every key it ever saw. (The session state's key map is not compacted yet.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.engine._numpy import unique_sorted
from flight_serve.engine.aggregate import AggregateCall
from flight_serve.engine.distinct import DistinctSets, value_ok

Int64Array = np.ndarray  # int64, 1-D

ROWS = "n:*"
#: the snapshot column of the pane number
PANE = "__pane"
_LUT_SPAN = 1 << 22  # the widest integer key range kept in a direct-address table
_FOLDABLE_FUNCS = ("count", "sum", "min", "max", "avg")


def _numeric_kind(t: pa.DataType) -> str | None:
    """``int`` or ``float`` for the value types folded exactly, else ``None``."""
    if pa.types.is_integer(t) and t != pa.uint64():
        return "int"
    if t in (pa.float32(), pa.float64()):
        return "float"
    return None


#: the key types the key map hashes exactly: the value types of the distinct sets (Arrow's hash
#: kernels; floats are not, NaN and -0.0 have no single identity there)
_key_ok = value_ok


@dataclass(frozen=True)
class StateColumn:
    """One state array: ``op`` ``add`` / ``min`` / ``max`` over the input ``source`` column
    (``None``: the row count), ``kind`` ``ones`` (1 per row), ``valid`` (1 per non-NULL value) or
    ``value`` (the value, NULL as the identity)."""

    name: str
    dtype: Any
    op: str
    source: str | None
    kind: str

    @property
    def identity(self) -> float | int:
        if self.op == "add":
            return 0
        if np.dtype(self.dtype).kind == "f":
            # fmin from NaN: NaN only when every value is NaN; max from -inf propagates NaN
            return math.nan if self.op == "min" else -math.inf
        info = np.iinfo(np.int64)
        return int(info.max) if self.op == "min" else int(info.min)


@dataclass(frozen=True)
class FoldPlan:
    """The state columns of a query and, per aggregate, which of them hold its partial."""

    columns: tuple[StateColumn, ...]
    #: per aggregate: (function, value column name or None, count column name); function
    #: ``count_distinct``: the value column is a set column of :attr:`sets`
    aggregates: tuple[tuple[str, str | None, str], ...]
    #: the set columns of the ``count(DISTINCT x)`` aggregates: (name ``d:x``, source ``x``)
    sets: tuple[tuple[str, str], ...] = ()


def plan(
    aggregates: tuple[AggregateCall, ...],
    key_columns: tuple[str, ...],
    schema: pa.Schema,
    *,
    distinct: bool = False,
) -> FoldPlan | None:
    """The fold plan of ``aggregates`` over ``schema``, or ``None`` if one of them (or a key type)
    needs the SQL path. ``distinct``: ``count(DISTINCT x)`` may be kept in sets
    (:mod:`.distinct`; :class:`FoldState` holds them, the session state does not)."""
    if any(not _key_ok(schema.field(k).type) for k in key_columns):
        return None
    cols: dict[str, StateColumn] = {ROWS: StateColumn(ROWS, np.int64, "add", None, "ones")}
    specs: list[tuple[str, str | None, str]] = []
    sets: dict[str, str] = {}

    def add(col: StateColumn) -> str:
        cols.setdefault(col.name, col)
        return col.name

    for agg in aggregates:
        if agg.distinct and agg.column is not None:
            if not distinct or not value_ok(schema.field(agg.column).type):
                return None
            sets.setdefault(f"d:{agg.column}", agg.column)
            specs.append(("count_distinct", f"d:{agg.column}", ROWS))
            continue
        if agg.func not in _FOLDABLE_FUNCS or agg.distinct:
            return None
        if agg.column is None:
            specs.append(("count", None, ROWS))
            continue
        src = agg.column
        valid = add(StateColumn(f"n:{src}", np.int64, "add", src, "valid"))
        if agg.func == "count":
            specs.append(("count", None, valid))
            continue
        kind = _numeric_kind(schema.field(src).type)
        if kind is None:
            return None
        if agg.func == "avg":
            value = add(StateColumn(f"addf:{src}", np.float64, "add", src, "value"))
        else:
            dtype = np.int64 if kind == "int" else np.float64
            op = "add" if agg.func == "sum" else agg.func
            value = add(StateColumn(f"{op}:{src}:{kind}", dtype, op, src, "value"))
        specs.append((agg.func, value, valid))
    return FoldPlan(tuple(cols.values()), tuple(specs), tuple(sets.items()))


def row_values(
    fold_plan: FoldPlan, batch: pa.RecordBatch | pa.Table, take: np.ndarray | None
) -> dict[str, Any]:
    """The per-row inputs of the state columns of ``fold_plan`` from the rows ``take`` of
    ``batch`` (all rows when ``None``): a numpy array of the state column's dtype per column
    (NULL values replaced by the column's identity), or the scalar 1 where every row counts;
    for each set column (:attr:`FoldPlan.sets`) the Arrow array of its source values."""
    out: dict[str, Any] = {}
    for name, source in fold_plan.sets:
        arr = batch.column(source)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        out[name] = arr if take is None else arr.take(pa.array(take, pa.int64()))
    for col in fold_plan.columns:
        if col.source is None:
            out[col.name] = 1
            continue
        arr = batch.column(col.source)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if take is not None:
            arr = arr.take(pa.array(take, pa.int64()))
        if col.kind == "valid":
            out[col.name] = (
                1
                if arr.null_count == 0
                else np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), np.int64)
            )
            continue
        values = np.asarray(
            arr.fill_null(0).to_numpy(zero_copy_only=False) if arr.null_count else arr.to_numpy()
        ).astype(col.dtype, copy=arr.null_count > 0)
        if arr.null_count:
            values[~np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False))] = col.identity
        out[col.name] = values
    return out


class _ValueMap:
    """A persistent map from the values of one Arrow column type to dense slots ``0, 1, …``."""

    def __init__(self, dtype: pa.DataType) -> None:
        self.dtype = dtype
        self._chunks: list[pa.Array[Any]] = []
        self._known: pa.Array[Any] = pa.array([], dtype)
        self._stale = False
        self.size = 0
        self._int = pa.types.is_integer(dtype)
        self._lut: np.ndarray | None = None  # slot of value ``base + i`` (-1: unknown)
        self._base = 0

    def known(self) -> pa.Array[Any]:
        if self._stale:
            self._known = pa.concat_arrays([self._known, *self._chunks])
            self._chunks, self._stale = [], False
        return self._known

    def _append(self, new: pa.Array[Any]) -> None:
        if self._int and self._lut is not None:
            vals = np.asarray(new.drop_null().to_numpy(zero_copy_only=False), dtype=np.int64)
            offset = np.flatnonzero(pc.is_valid(new).to_numpy(zero_copy_only=False))
            if len(vals) and self._cover(int(vals.min()), int(vals.max())):
                assert self._lut is not None
                self._lut[vals - self._base] = self.size + offset
        self._chunks.append(new)
        self._stale = True
        self.size += len(new)

    def _cover(self, lo: int, hi: int) -> bool:
        """Widen the direct-address table to ``[lo, hi]``; ``False`` (and no table) if too wide."""
        lut = self._lut
        if lut is None:
            return False
        base, top = self._base, self._base + len(lut) - 1
        if lo >= base and hi <= top:
            return True
        new_lo, new_hi = min(lo, base) if len(lut) else lo, max(hi, top) if len(lut) else hi
        if new_lo > 0 and new_hi < _LUT_SPAN:
            new_lo = 0  # non-negative keys index the table directly
        if new_hi - new_lo + 1 > _LUT_SPAN:
            self._lut = None
            return False
        grown = np.full(new_hi - new_lo + 1, -1, dtype=np.int64)
        if len(lut):
            grown[base - new_lo : base - new_lo + len(lut)] = lut
        self._lut, self._base = grown, new_lo
        return True

    @property
    def nbytes(self) -> int:
        """Bytes held: the known values and the direct-address table."""
        lut = 0 if self._lut is None else self._lut.nbytes
        return lut + self._known.nbytes + sum(c.nbytes for c in self._chunks)

    def slots(self, column: pa.Array[Any]) -> np.ndarray:
        """The slot of each value of ``column`` (new values get new slots; NULL is a value)."""
        if self._int and column.null_count == 0 and len(column):
            if self.size == 0 and self._lut is None:
                self._lut = np.zeros(0, dtype=np.int64)
            vals = np.asarray(column.to_numpy(), dtype=np.int64)
            if self._lut is not None and self._cover(int(vals.min()), int(vals.max())):
                lut = self._lut
                assert lut is not None
                out = np.take(lut, vals - self._base if self._base else vals)
                if out.min() < 0:
                    new = unique_sorted(vals[out < 0])
                    lut[new - self._base] = self.size + np.arange(len(new), dtype=np.int64)
                    self._chunks.append(pa.array(new, pa.int64()).cast(self.dtype))
                    self._stale = True
                    self.size += len(new)
                    out = lut[vals - self._base]
                return np.asarray(out, dtype=np.int64)
        idx = pc.index_in(column, value_set=self.known(), skip_nulls=False)
        if idx.null_count:
            self._append(pc.unique(column.filter(pc.is_null(idx))))
            idx = pc.index_in(column, value_set=self.known(), skip_nulls=False)
        return np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64)


class KeyMap:
    """Group keys (one or more columns, or none) to slots, persistent across batches."""

    def __init__(self, schema: pa.Schema, key_columns: tuple[str, ...]) -> None:
        self.key_columns = key_columns
        self._columns = [_ValueMap(schema.field(k).type) for k in key_columns]
        #: per extra key column: the map of the packed (slot so far, column slot) codes
        self._pairs = [_ValueMap(pa.int64()) for _ in key_columns[1:]]

    @property
    def size(self) -> int:
        if not self.key_columns:
            return 1
        return (self._pairs[-1] if self._pairs else self._columns[0]).size

    @property
    def nbytes(self) -> int:
        """Bytes held by the maps of every key column and column pair."""
        return sum(m.nbytes for m in (*self._columns, *self._pairs))

    def slots(self, columns: list[pa.Array[Any]]) -> np.ndarray:
        """The slot of each row of the key ``columns`` (in ``key_columns`` order)."""
        if not self.key_columns:
            return np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
        slot = self._columns[0].slots(columns[0])
        for vmap, pair, col in zip(self._columns[1:], self._pairs, columns[1:], strict=True):
            packed = (slot << 32) | vmap.slots(col)
            slot = pair.slots(pa.array(packed, pa.int64()))
        return slot

    def keys(self, slots: np.ndarray) -> list[pa.Array[Any]]:
        """The key values of ``slots``, one array per key column."""
        if not self.key_columns:
            return []
        parts: list[np.ndarray] = [slots]
        for pair in reversed(self._pairs):
            packed = np.asarray(pair.known().to_numpy(), dtype=np.int64)[parts[0]]
            parts[0:1] = [packed >> 32, packed & 0xFFFFFFFF]
        take = [pa.array(p, pa.int64()) for p in parts]
        return [vm.known().take(t) for vm, t in zip(self._columns, take, strict=True)]


class FoldState:
    """The folded state of one operator: panes x slots arrays for each state column.

    Args:
        fold_plan: the state columns (:func:`plan`).
        offset_ns, size_ns, slide_ns: the window grid (tumbling: ``slide = size``).
        schema: the operator's input schema; key_columns: the GROUP BY columns.
    """

    #: the key map is compacted only above this many slots (and twice its size at the last check)
    COMPACT_MIN_SLOTS: ClassVar[int] = 1 << 16

    def __init__(
        self,
        fold_plan: FoldPlan,
        offset_ns: int,
        size_ns: int,
        slide_ns: int,
        schema: pa.Schema,
        key_columns: tuple[str, ...],
    ) -> None:
        self.plan = fold_plan
        self._schema = schema
        self._compact_at = 0  # the map size that triggers the next compaction check
        self.offset, self.size, self.slide = offset_ns, size_ns, slide_ns
        self.pane_ns = math.gcd(size_ns, slide_ns)
        self.r, self.m = slide_ns // self.pane_ns, size_ns // self.pane_ns
        self.keys = KeyMap(schema, key_columns)
        self._cap = 0  # slot capacity of every pane row
        self._rows_cap = 0
        self._arrays: dict[str, np.ndarray] = {
            c.name: np.zeros(0, dtype=c.dtype) for c in fold_plan.columns
        }
        self.pane_row: dict[int, int] = {}
        self._free: list[int] = []
        #: the pane sets of each count(DISTINCT) column (:attr:`FoldPlan.sets`)
        self.sets = {
            name: DistinctSets(schema.field(source).type) for name, source in fold_plan.sets
        }
        #: windows with window_end <= this have fired
        self.fired_upto: int | None = None

    # --- geometry ---------------------------------------------------------------------------

    def pane_of(self, ts_ns: np.ndarray) -> np.ndarray:
        """The pane number of each event time (ns); a batch spanning few panes is cut by
        comparison with the pane bounds instead of a division per row."""
        g, off = self.pane_ns, self.offset
        lo, hi = (int(ts_ns.min()) - off) // g, (int(ts_ns.max()) - off) // g
        if lo == hi:
            return np.full(len(ts_ns), lo, dtype=np.int64)
        if hi - lo <= 16:
            bounds = off + np.arange(lo + 1, hi + 1, dtype=np.int64) * g
            return lo + np.searchsorted(bounds, ts_ns, side="right").astype(np.int64)
        return np.asarray(np.floor_divide(ts_ns - off, g), dtype=np.int64)

    def first_open_pane(self, threshold: int) -> int:
        """The smallest pane whose latest window ends after ``threshold``: rows of earlier panes
        are late for every window they belong to."""
        # latest end of pane p: offset + (p // r) * slide + size > threshold
        return ((threshold - self.offset - self.size) // self.slide + 1) * self.r

    def latest_start(self, panes: np.ndarray) -> np.ndarray:
        """Start (ns) of the latest window that pane ``p`` can belong to."""
        return self.offset + (panes // self.r) * self.slide

    def in_some_window(self, panes: np.ndarray) -> np.ndarray | None:
        """False for panes in the gap between hopping windows (``slide > size``); ``None`` when
        every pane is in a window."""
        if self.m >= self.r:
            return None
        return np.asarray((panes - (panes // self.r) * self.r) < self.m)

    def windows_of(self, pane: int) -> range:
        """The window numbers ``k`` whose window holds pane ``pane``."""
        lo = -((self.m - 1 - pane) // self.r)  # ceil((pane - m + 1) / r)
        return range(lo, pane // self.r + 1)

    def window_end(self, k: int) -> int:
        return self.offset + k * self.slide + self.size

    # --- folding ------------------------------------------------------------------------------

    def _grow(self, slots_needed: int, rows_needed: int) -> None:
        cap, rows = self._cap, self._rows_cap
        new_cap = cap if slots_needed <= cap else max(slots_needed, 2 * cap, 64)
        new_rows = rows if rows_needed <= rows else max(rows_needed, 2 * rows)
        if (new_cap, new_rows) == (cap, rows):
            return
        for col in self.plan.columns:
            old = self._arrays[col.name].reshape(rows, cap) if rows and cap else None
            grown = np.full((new_rows, new_cap), col.identity, dtype=col.dtype)
            if old is not None:
                grown[:rows, :cap] = old
            self._arrays[col.name] = grown.reshape(-1)
        self._cap, self._rows_cap = new_cap, new_rows

    def _rows_for(self, panes: np.ndarray) -> np.ndarray | int:
        """The state row of each pane number (allocated when new); one row if all are one."""
        lo, hi = int(panes.min()), int(panes.max())
        if lo == hi:
            return self._row(lo)
        if hi - lo == 1:  # both present
            pair = np.array([self._row(lo), self._row(hi)], dtype=np.int64)
            return np.asarray(np.take(pair, panes - lo), dtype=np.int64)
        if hi - lo < 4096:
            present = np.flatnonzero(np.bincount(panes - lo)) + lo
            lut = np.full(hi - lo + 1, -1, dtype=np.int64)
            for p in present.tolist():
                lut[p - lo] = self._row(p)
            return np.asarray(lut[panes - lo], dtype=np.int64)
        uniq, inverse = np.unique(panes, return_inverse=True)
        rows = np.array([self._row(p) for p in uniq.tolist()], dtype=np.int64)
        return np.asarray(rows[inverse], dtype=np.int64)

    def _row(self, pane: int) -> int:
        row = self.pane_row.get(pane)
        if row is None:
            row = self._free.pop() if self._free else len(self.pane_row)
            self.pane_row[pane] = row
        return row

    def fold(self, panes: np.ndarray, slots: np.ndarray, values: dict[str, Any]) -> None:
        """Fold rows into the state: ``values[name]`` is the per-row input of each state column
        (a numpy array, or the scalar 1 for a count of every row)."""
        if not len(panes):
            return
        rows = self._rows_for(panes)
        self._grow(self.keys.size, len(self.pane_row) + len(self._free))
        pos = rows * self._cap + slots
        with np.errstate(invalid="ignore"):  # NaN in max: NaN is the result, not an error
            self._fold_at(pos, values)
        for name, sets in self.sets.items():
            if name in values:
                sets.add(panes, slots, values[name])

    def _fold_at(self, pos: np.ndarray, values: dict[str, Any]) -> None:
        for col in self.plan.columns:
            arr, val = self._arrays[col.name], values[col.name]
            if col.op == "add":
                np.add.at(arr, pos, val)
            elif arr.dtype.kind == "f":
                (np.fmin if col.op == "min" else np.maximum).at(arr, pos, val)
            else:
                (np.minimum if col.op == "min" else np.maximum).at(arr, pos, val)

    def row_values(
        self, batch: pa.RecordBatch | pa.Table, take: np.ndarray | None
    ) -> dict[str, Any]:
        """The per-row inputs of the state columns from the rows ``take`` of ``batch``."""
        return row_values(self.plan, batch, take)

    def state_bytes(self) -> int:
        """Bytes of the pane x slot arrays as allocated (capacity included; not the key map)
        and of the distinct sets."""
        held = sum(a.nbytes for a in self._arrays.values())
        return int(held + sum(s.nbytes for s in self.sets.values()))

    # --- reading ------------------------------------------------------------------------------

    def _window_arrays(self, k: int) -> dict[str, np.ndarray] | None:
        """The state of window ``k`` combined over its open panes (``None``: no open pane)."""
        panes = [p for p in range(k * self.r, k * self.r + self.m) if p in self.pane_row]
        if not panes:
            return None
        cap = self._cap
        out: dict[str, np.ndarray] = {}
        rows = [self.pane_row[p] for p in panes]
        for col in self.plan.columns:
            arr = self._arrays[col.name]
            if len(rows) == 1:
                out[col.name] = arr[rows[0] * cap : (rows[0] + 1) * cap]
                continue
            block = arr.reshape(self._rows_cap, cap)[rows]
            if col.op == "add":
                # IEEE sums as DataFusion's: inf + -inf is NaN, 1e308 + 1e308 is inf (no warning)
                with np.errstate(invalid="ignore", over="ignore"):
                    out[col.name] = block.sum(axis=0)
            elif block.dtype.kind == "f":
                with np.errstate(invalid="ignore"):
                    reduce = np.fmin if col.op == "min" else np.maximum
                    out[col.name] = reduce.reduce(block, axis=0)
            else:
                out[col.name] = block.min(axis=0) if col.op == "min" else block.max(axis=0)
        return out

    def due_windows(self, threshold: int) -> list[int]:
        """Window numbers with ``fired_upto < end <= threshold`` that hold an open pane, in
        order."""
        ks: set[int] = set()
        for p in self.pane_row:
            for k in self.windows_of(p):
                end = self.window_end(k)
                if end <= threshold and (self.fired_upto is None or end > self.fired_upto):
                    ks.add(k)
        return sorted(ks)

    def next_end(self) -> int | None:
        """The smallest ``window_end`` not fired yet among the windows of the open panes."""
        if not self.pane_row:
            return None
        best: int | None = None
        for p in self.pane_row:  # open panes are few; their windows are at most m each
            for k in self.windows_of(p):
                end = self.window_end(k)
                if (self.fired_upto is None or end > self.fired_upto) and (
                    best is None or end < best
                ):
                    best = end
                    break
        return best

    def window_slots(
        self, k: int, *, sets: bool = True
    ) -> tuple[np.ndarray, dict[str, Any]] | None:
        """``(slots, state column values)`` of the keys with a row in window ``k``, ascending;
        with ``sets``, each set column's value is the number of distinct values of each slot in
        the window (int64)."""
        arrays = self._window_arrays(k)
        if arrays is None:
            return None
        slots = np.flatnonzero(arrays[ROWS][: self.keys.size] > 0)
        out: dict[str, Any] = {name: a[slots] for name, a in arrays.items()}
        if sets and self.sets:
            panes = [p for p in range(k * self.r, k * self.r + self.m) if p in self.pane_row]
            for name, pane_sets in self.sets.items():
                pairs = pane_sets.window(panes)
                out[name] = DistinctSets.counts(pairs, slots, self.keys.size)
        return slots, out

    def open_count(self) -> int:
        """(key, window) pairs held: the windows not fired that hold an open pane."""
        ks: set[int] = set()
        for p in self.pane_row:
            for k in self.windows_of(p):
                if self.fired_upto is None or self.window_end(k) > self.fired_upto:
                    ks.add(k)
        total = 0
        for k in ks:
            got = self.window_slots(k, sets=False)
            total += 0 if got is None else len(got[0])
        return total

    def evict(self, threshold: int) -> None:
        """Drop the panes whose every window ends at or before ``threshold``; mark fired."""
        for p in list(self.pane_row):
            if self.window_end(p // self.r) <= threshold:
                row = self.pane_row.pop(p)
                lo, hi = row * self._cap, (row + 1) * self._cap
                for col in self.plan.columns:
                    self._arrays[col.name][lo:hi] = col.identity
                for pane_sets in self.sets.values():
                    pane_sets.drop(p)
                self._free.append(row)
        if self.fired_upto is None or threshold > self.fired_upto:
            self.fired_upto = threshold
        size = self.keys.size
        if size > max(self.COMPACT_MIN_SLOTS, self._compact_at):
            self.compact()
            self._compact_at = 2 * self.keys.size

    def compact(self) -> bool:
        """Drop the slots of the keys with no row in any open pane: a new key map of the live
        keys and every state array narrowed to them. ``False`` (nothing done) when over half the
        slots are live, or the query has no keys."""
        n, cap, rows = self.keys.size, self._cap, self._rows_cap
        if not self.keys.key_columns or not n:
            return False
        if rows and cap:
            counts = self._arrays[ROWS].reshape(rows, cap)[:, :n]
            live = np.flatnonzero((counts > 0).any(axis=0))
        else:
            live = np.zeros(0, dtype=np.int64)
        if 2 * len(live) >= n:
            return False
        keys = KeyMap(self._schema, self.keys.key_columns)
        new = keys.slots(self.keys.keys(live)) if len(live) else np.zeros(0, dtype=np.int64)
        new_cap = max(len(live), 64)
        for col in self.plan.columns:
            grown = np.full((rows, new_cap), col.identity, dtype=col.dtype)
            if rows and cap and len(live):
                grown[:, new] = self._arrays[col.name].reshape(rows, cap)[:, live]
            self._arrays[col.name] = grown.reshape(-1)
        if self.sets:
            remap = np.full(n, -1, dtype=np.int64)
            remap[live] = new
            for pane_sets in self.sets.values():
                pane_sets.remap(remap)
        self.keys, self._cap = keys, new_cap
        return True

    def pane_table(
        self,
    ) -> tuple[list[pa.Array[Any]], np.ndarray, np.ndarray, dict[str, Any]]:
        """Every held (key, open window, pane): key arrays, window starts (ns), pane numbers and
        the pane's state values (copies; for a set column the Arrow ``list`` of the pane's
        distinct values of the key). A pane in ``j`` open windows is listed ``j`` times,
        so the rows name every open window like the SQL path's pane state; the row of a pane's
        latest window is the one to restore from."""
        cap = self._cap
        starts, pane_parts, slot_parts, row_parts = [], [], [], []
        set_parts: dict[str, list[pa.Array[Any]]] = {name: [] for name in self.sets}
        n_slots = self.keys.size
        rows_arr = self._arrays[ROWS]
        for p, row in sorted(self.pane_row.items()):
            slots = np.flatnonzero(rows_arr[row * cap : row * cap + n_slots] > 0)
            lists = {
                name: DistinctSets.lists(pane_sets.pane(p), slots, n_slots)
                for name, pane_sets in self.sets.items()
            }
            for k in self.windows_of(p):
                if self.fired_upto is not None and self.window_end(k) <= self.fired_upto:
                    continue
                for name, listed in lists.items():
                    set_parts[name].append(listed)
                starts.append(np.full(len(slots), self.offset + k * self.slide, dtype=np.int64))
                pane_parts.append(np.full(len(slots), p, dtype=np.int64))
                slot_parts.append(slots)
                row_parts.append(row * cap + slots)
        empty = np.zeros(0, dtype=np.int64)
        ws = np.concatenate(starts) if starts else empty
        panes = np.concatenate(pane_parts) if pane_parts else empty
        slots = np.concatenate(slot_parts) if slot_parts else empty
        pos = np.concatenate(row_parts) if row_parts else empty
        values: dict[str, Any] = {
            c.name: self._arrays[c.name][pos].copy() for c in self.plan.columns
        }
        for name, pane_sets in self.sets.items():
            parts = set_parts[name]
            list_type = pa.list_(pane_sets.value_type)
            values[name] = pa.concat_arrays(parts) if parts else pa.array([], list_type)
        return self.keys.keys(slots), ws, panes, values
