"""The windowed-aggregation operator: event-time windows, watermarks, late side output.

Arrow shapes:

* **input**: record batches with the event-time column (an Arrow ``timestamp`` of any unit, with or
  without a time zone; naive means UTC), the key columns and the aggregated columns.
* **output** (:attr:`WindowOperator.output_schema`): the query's projection over the key columns,
  ``window_start`` and ``window_end`` (same timestamp type as the event-time column, start inclusive,
  end exclusive) and the final aggregates. Rows come out ordered by ``window_end``, then
  ``window_start``, then the keys.
* **late side output** (:attr:`WindowOperator.late_schema`): the input columns plus
  ``_late_reason`` (``late``: every window of the row had closed; ``null_time``: the event time is
  null; ``out_of_range``: the event time cannot be held in nanoseconds since the epoch, i.e. before
  1677 or after 2262) and ``_window_start`` / ``_window_end``: the latest window the row missed
  (null unless the reason is ``late``).

Rules (DESIGN §4), with ``W`` the watermark *before* the batch and ``L`` the allowed lateness:

1. A row is late for a window when ``window_end + L ≤ W``. A row late for every window it belongs
   to goes to the late side output; it never creates or reopens window state. A hopping row is
   dropped only from the windows it is late for. A session row whose own ``[t, t + gap)`` is late is
   still accepted when it overlaps a session of its key that is still open (it merges into it).
2. After the batch, ``W`` folds in the batch's maximum event time (see :mod:`.watermark`).
3. Every window with ``window_end + L ≤ W`` fires once, with its final aggregates, and its pane
   state (one row of partial aggregates per key and window) is evicted.
4. :meth:`WindowOperator.finish` is end of input: ``W = +∞``, every open window fires.

Execution: accepted rows are buffered with their window bounds; DataFusion computes the partial
aggregates of the buffer grouped by key and window and merges them into the pane state
(``UNION ALL`` + ``GROUP BY``; for sessions a windowed ``max``/``sum`` finds the overlapping
proto-sessions first). The merge runs when a window can fire or the buffer reaches
``merge_rows``, so DataFusion sees large inputs and per-call overhead stays small. No Python code
runs per row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import datafusion
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve._arrow import ColumnMismatch, conform_batch, ipc_bytes, read_ipc_table
from flight_serve.engine import fold
from flight_serve.engine.aggregate import AggregateCall, float_sql_type, quote_ident
from flight_serve.engine.sqlguard import check_sql, check_sql_size
from flight_serve.engine.watermark import WatermarkTracker
from flight_serve.engine.windows import (
    CumulateWindow,
    HoppingWindow,
    Int64Array,
    SessionWindow,
    TumblingWindow,
    WindowSpec,
)
from flight_serve.errors import CheckpointError, EventTimeError, InvalidInputError, QueryError
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS, NS_PER_UNIT, timedelta_to_ns

if TYPE_CHECKING:  # cold start: only session windows fold through it
    from flight_serve.engine.fold_session import SessionFoldState

WS, WE, TS = "__ws", "__we", "__ts"
#: pane bookkeeping columns: changed since last emission (0/1), last emitted revision (-1: none)
CHG, REV = "__chg", "__rev"
SID = "__sid"
LAST = "__lt"  # the latest event time (ns) in a pane
REVISION = "_revision"
LATE_REASON, LATE_START, LATE_END = "_late_reason", "_window_start", "_window_end"
DEFAULT_PARTITION = "0"


@dataclass(frozen=True)
class OutputColumn:
    """One column of the default projection: ``source`` is a key column, ``window_start``,
    ``window_end`` or ``__a<i>`` (the i-th aggregate); ``name`` is the output name."""

    name: str
    source: str


@dataclass(frozen=True)
class WindowAggregation:
    """A windowed aggregation, as configuration. :meth:`build` makes the running operator.

    Args:
        window: the window assignment (tumbling, hopping or session).
        time_column: the event-time column (an Arrow timestamp).
        key_columns: the GROUP BY columns besides the window bounds (may be empty).
        aggregates: the aggregates, in order; the i-th is column ``__a<i>`` before projection.
        max_out_of_orderness: the watermark bound ``B`` (``W = max event time - B``).
        allowed_lateness: ``L``; a window fires at ``W ≥ window_end + L``.
        filter_sql: an optional DataFusion boolean expression applied to each input batch first
            (the query's WHERE); rows it removes are not late, they are filtered.
        columns: the default projection; empty means keys, window bounds, aggregates by alias.
        projection_sql: a DataFusion ``SELECT … FROM fired`` run on the fired rows instead of
            ``columns`` (for expressions over aggregates and HAVING).
        merge_rows: buffered rows that trigger a merge into pane state even if nothing fires.
        emit: ``final`` (default): a window emits once, at ``W ≥ window_end + L``. ``update``: it
            emits at ``W ≥ window_end`` (``_revision`` 0), re-emits an updated row with the next
            ``_revision`` after each step that accepted late rows for it, and is evicted at
            ``W ≥ window_end + L``. Update mode adds an int64 ``_revision`` output column.
        idle_timeout: processing time without rows after which a partition with no backlog stops
            holding the watermark back (``None``: never).
        idle_watermark_advance: opt-in ``D``: while every input partition is idle, the
            watermark follows the wall clock, ``W = max(W, now - D)`` (``now``:
            ``wall_clock_ns``), so a window closes ``D`` after its end even when no row follows
            (``None``: ``W`` holds until a row or end of input). Needs ``idle_timeout``.
        max_future_skew: a row whose event time is further ahead of processing (wall-clock) time
            than this goes to the late side output with reason ``future`` and does not move the
            watermark (``None``: no limit).
        empty_windows_key_ttl: opt in to empty windows (tumbling and hopping, emit ``final``):
            when a window fires, every key seen within this TTL that has no row in it gets a row
            with count 0 and every other aggregate NULL. A key counts for window ``[s, e)`` when it
            was first seen before ``e`` and last seen at or after ``s - ttl`` (by event time, among
            the rows accepted when the window fires). Keys with a NULL part are not tracked.
        fold_state: keep tumbling / hopping count, sum, min, max and avg in folded numpy state
            (:mod:`.fold`, updated per batch, no SQL merge) when every aggregate, key and value
            type allows it; ``False`` forces the SQL-merge path (same results).
    """

    window: WindowSpec
    time_column: str
    key_columns: tuple[str, ...]
    aggregates: tuple[AggregateCall, ...]
    max_out_of_orderness: timedelta = timedelta(0)
    allowed_lateness: timedelta = timedelta(0)
    filter_sql: str | None = None
    columns: tuple[OutputColumn, ...] = ()
    projection_sql: str | None = None
    merge_rows: int = 1 << 18
    emit: Literal["final", "update"] = "final"
    idle_timeout: timedelta | None = None
    max_future_skew: timedelta | None = None
    empty_windows_key_ttl: timedelta | None = None
    idle_watermark_advance: timedelta | None = None
    fold_state: bool = True

    def build(
        self,
        input_schema: pa.Schema,
        *,
        clock_ns: Callable[[], int] | None = None,
        wall_clock_ns: Callable[[], int] | None = None,
        restore: OperatorSnapshot | None = None,
    ) -> WindowOperator:
        """Return a running operator for input batches of ``input_schema``, continuing from
        ``restore`` (a :meth:`WindowOperator.snapshot`) when given.

        ``clock_ns`` (monotonic, for idle timeouts) and ``wall_clock_ns`` (ns since the epoch, for
        ``max_future_skew``) default to :func:`time.monotonic_ns` and :func:`time.time_ns`.

        Raises:
            EventTimeError: the event-time column is missing or not a timestamp.
            InvalidInputError: a key or aggregated column is missing, a key column has a nested
                type (list, struct, map, union), or a window duration is finer than the
                event-time column's unit.
            QueryError: DataFusion cannot plan the filter or the projection.
            CheckpointError: ``restore`` does not fit this query and input schema.
        """
        operator = WindowOperator(
            self, input_schema, clock_ns=clock_ns, wall_clock_ns=wall_clock_ns
        )
        if restore is not None:
            operator._restore(restore)
        return operator


@dataclass(frozen=True)
class OperatorSnapshot:
    """One operator's share of a checkpoint: immutable Arrow tables plus JSON-ready ``meta``.

    Attributes:
        panes: the pane state. Version 1: one row of partial aggregates per key and open
            window. Version 2 (folded state): one row per key, open window (``__ws``, ``__we``)
            and pane of it (``__pane``) with that pane's state columns (:mod:`.fold`); version 4
            the same plus a list column of distinct values per ``count(DISTINCT x)``.
        buffer: accepted rows not merged into panes yet (input columns, ``__ts``, ``__ws``,
            ``__we``; int64 ns).
        closed_sessions: emitted sessions still remembered (session windows).
        known_keys: per key, the latest event time of its emitted panes (empty windows).
        meta: version, watermark tracker state, empty-window progress, metrics.
    """

    #: the newest layout: 2 = folded state (:mod:`.fold`): ``panes`` holds one row per key and
    #: pane (key columns, ``__pane``, the state columns), ``buffer`` is empty. 1 = SQL-merged
    #: pane state (one row of partial aggregates per key and window, plus the row buffer), still
    #: written and read by the queries that run on the SQL path.
    VERSION: ClassVar[int] = 2
    VERSION_PANES: ClassVar[int] = 1
    #: folded session state (:mod:`.fold_session`): ``panes`` holds one row per open session
    #: (key columns, ``__ws``, ``__we``, the state columns), ``closed_sessions`` the remembered
    #: emitted ones, ``buffer`` is empty
    VERSION_SESSIONS: ClassVar[int] = 3
    #: folded state with ``count(DISTINCT)`` sets (:mod:`.distinct`): version 2's layout plus,
    #: per ``count(DISTINCT x)``, a ``d:x`` column: the list of the pane's distinct non-NULL
    #: values of ``x`` for the row's key
    VERSION_DISTINCT: ClassVar[int] = 4

    panes: pa.Table
    buffer: pa.Table
    closed_sessions: pa.Table
    known_keys: pa.Table
    meta: dict[str, Any]

    def to_bytes(self) -> bytes:
        """Serialise as one Arrow IPC stream: a one-row table whose columns hold each table as
        Arrow IPC bytes and ``meta`` as JSON."""
        row: dict[str, list[bytes]] = {}
        for name in ("panes", "buffer", "closed_sessions", "known_keys"):
            part: pa.Table = getattr(self, name)
            row[name] = [ipc_bytes(part.schema, part.to_batches())]
        table = pa.table(
            {
                **{k: pa.array(v, pa.large_binary()) for k, v in row.items()},
                "meta": pa.array([json.dumps(self.meta)], pa.large_string()),
            }
        )
        return ipc_bytes(table.schema, table.to_batches())

    @classmethod
    def from_bytes(cls, data: bytes) -> OperatorSnapshot:
        """The inverse of :meth:`to_bytes`.

        Raises:
            CheckpointError: ``data`` is not a serialised operator snapshot.
        """
        try:
            table = read_ipc_table(data)
            tables = {
                name: read_ipc_table(table[name][0].as_py())
                for name in ("panes", "buffer", "closed_sessions", "known_keys")
            }
            meta = json.loads(table["meta"][0].as_py())
        except (pa.ArrowInvalid, KeyError, IndexError, ValueError) as exc:
            raise CheckpointError(f"not an operator snapshot: {exc}") from exc
        return cls(meta=meta, **tables)


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with top-level ``string_view`` / ``binary_view`` fields as ``string`` / ``binary``."""
    fields = []
    for f in schema:
        if f.type == pa.string_view():
            f = f.with_type(pa.string())
        elif f.type == pa.binary_view():
            f = f.with_type(pa.binary())
        fields.append(f)
    return pa.schema(fields)


@dataclass(frozen=True)
class Emission:
    """What one step of the operator produced.

    Attributes:
        output: window results that fired in this step (``output_schema``), possibly empty.
        late: rows sent to the late side output in this step (``late_schema``), possibly empty.
        watermark_ns: the operator watermark after the step (ns since the epoch;
            ``MIN_WATERMARK_NS`` before any row, ``MAX_WATERMARK_NS`` after end of input).
    """

    output: pa.Table
    late: pa.Table
    watermark_ns: int


@dataclass
class OperatorMetrics:
    """Counters of one operator (rows, not bytes)."""

    rows_in: int = 0
    rows_late: int = 0
    rows_null_time: int = 0
    rows_out_of_range: int = 0
    rows_future: int = 0
    windows_fired: int = 0
    merges: int = 0


@dataclass
class _Batch:
    """Buffered accepted rows: the needed input columns plus ``__ts``, ``__ws``, ``__we`` (int64 ns)."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0
    min_end: int | None = None


def _key_codes(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """One int64 code per row of ``table``, equal for rows with equal values in ``keys``, a NULL
    equal to a NULL (as GROUP BY groups them)."""
    codes = np.zeros(table.num_rows, dtype=np.int64)
    for key in keys:
        encoded: Any = pc.dictionary_encode(table[key], null_encoding="encode").combine_chunks()
        idx = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        combined = codes * (len(encoded.dictionary) + 1) + idx
        codes = np.unique(combined, return_inverse=True)[1].astype(np.int64)
    return codes


def _event_time_ns(column: pa.Array[Any]) -> tuple[Int64Array, np.ndarray | None]:
    """``(ts_ns, invalid)`` for a timestamp column: ns since the epoch (0 where invalid), and
    ``None`` when every value is valid, else an int8 mask: 1 = null, 2 = out of the ns range."""
    assert pa.types.is_timestamp(column.type)
    factor = NS_PER_UNIT[column.type.unit]
    raw: pa.Array[Any] = column.cast(pa.int64())
    invalid: np.ndarray | None = None
    if raw.null_count:
        invalid = np.asarray(raw.is_null().to_numpy(zero_copy_only=False), dtype=np.int8)
        raw = raw.fill_null(0)
    values = np.asarray(raw.to_numpy(zero_copy_only=False), dtype=np.int64)
    if factor == 1 or not len(values):
        return values, invalid
    limit = (2**63 - 1) // factor
    if values.max() > limit or values.min() < -limit:
        out_of_range = (values > limit) | (values < -limit)
        invalid = np.zeros(len(values), dtype=np.int8) if invalid is None else invalid
        invalid[out_of_range & (invalid == 0)] = 2
        values = np.where(out_of_range, 0, values)
    return values * factor, invalid


class WindowOperator:
    """The running windowed aggregation built by :meth:`WindowAggregation.build`.

    Call :meth:`process` once per input batch and :meth:`finish` at end of input. Not thread-safe:
    one operator belongs to one pipeline task.
    """

    def __init__(
        self,
        config: WindowAggregation,
        input_schema: pa.Schema,
        *,
        clock_ns: Callable[[], int] | None = None,
        wall_clock_ns: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        # view types (string_view, binary_view) become plain ones: pyarrow's take/filter kernels
        # used on pane state do not handle them, and Flight clients expect plain types anyway
        input_schema = _plain_schema(input_schema)
        self.input_schema = input_schema
        self.metrics = OperatorMetrics()
        #: DataFusion's session, made by the first query that runs SQL (:meth:`_context`): a
        #: folded query without a filter or projection never does (cold start, DESIGN §11)
        self._session: datafusion.SessionContext | None = None
        self._udfs: list[Any] = []  # the sketch functions its partial / merge SQL call
        self._checked_sql: set[str] = set()  # SQL texts check_sql passed
        self._validate()
        ts_type = input_schema.field(config.time_column).type
        self.time_type: pa.TimestampType = ts_type
        self._unit_ns = NS_PER_UNIT[ts_type.unit]
        self._lateness_ns = timedelta_to_ns(config.allowed_lateness)
        if config.emit not in ("final", "update"):
            raise InvalidInputError(f"emit must be 'final' or 'update', got {config.emit!r}")
        self._update = config.emit == "update"
        self._wall_clock_ns = wall_clock_ns or time.time_ns
        advance = config.idle_watermark_advance
        try:
            self._tracker = WatermarkTracker(
                timedelta_to_ns(config.max_out_of_orderness),
                None if config.idle_timeout is None else timedelta_to_ns(config.idle_timeout),
                clock_ns or time.monotonic_ns,
                None if advance is None else timedelta_to_ns(advance),
                self._wall_clock_ns,
            )
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from exc
        self._future_skew_ns = (
            None if config.max_future_skew is None else timedelta_to_ns(config.max_future_skew)
        )
        for key in config.key_columns:  # fired windows are sorted by key: scalars only
            key_type = input_schema.field(key).type
            if pa.types.is_nested(key_type):
                raise InvalidInputError(
                    f"GROUP BY column {key!r} has the nested type {key_type}; a group key must "
                    "be a scalar (number, string, binary, boolean, temporal, decimal)"
                )
        needed: list[str] = []
        for name in (*config.key_columns, *(a.column for a in config.aggregates if a.column)):
            if name not in needed:
                needed.append(name)
        self._buffer_schema = pa.schema(
            [input_schema.field(n) for n in needed]
            + [pa.field(TS, pa.int64()), pa.field(WS, pa.int64()), pa.field(WE, pa.int64())]
        )
        self._buffer = _Batch()
        fold_plan = self._fold_plan()
        self._merge_sql, self._state_schema = self._plan_merge(fold_plan)
        self._state: pa.Table = self._state_schema.empty_table()
        self._state_min_end: int | None = None
        self._state_min_pending_end: int | None = None
        #: sessions already evicted (keys, __ws, __we) that a new row could still overlap
        self._closed: pa.Table = pa.schema(
            [input_schema.field(k) for k in config.key_columns]
            + [pa.field(WS, pa.int64()), pa.field(WE, pa.int64())]
        ).empty_table()
        self._closed_max_end = MIN_WATERMARK_NS
        self._empty_ttl_ns: int | None = None
        if config.empty_windows_key_ttl is not None:
            if not isinstance(config.window, TumblingWindow | HoppingWindow) or self._update:
                raise InvalidInputError(
                    "empty windows need TUMBLE or HOP windows and emit = 'final'"
                )
            if not config.key_columns:
                raise InvalidInputError("empty windows need GROUP BY keys besides the window")
            self._empty_ttl_ns = timedelta_to_ns(config.empty_windows_key_ttl)
        #: per key, the latest event time (ns) of the panes already emitted, for empty windows
        self._known: pa.Table = pa.schema(
            [input_schema.field(k) for k in config.key_columns] + [pa.field(LAST, pa.int64())]
        ).empty_table()
        self._empty_done = MIN_WATERMARK_NS
        self.late_schema = pa.schema(
            [
                *input_schema,
                pa.field(LATE_REASON, pa.string()),
                pa.field(LATE_START, ts_type),
                pa.field(LATE_END, ts_type),
            ]
        )
        if config.filter_sql is not None:  # planned now: a bad WHERE fails here, not at a batch
            self._sql(
                f"SELECT * FROM input WHERE {config.filter_sql}",
                {"input": [pa.RecordBatch.from_pylist([], input_schema)]},
            )
        self._fired_schema = self._finalize(self._state_schema.empty_table()).schema
        output_schema = self._project(self._fired_schema.empty_table()).schema
        if self._update:
            output_schema = output_schema.append(pa.field(REVISION, pa.int64()))
        self.output_schema = output_schema
        self._empty_late = self.late_schema.empty_table()
        self._fold: fold.FoldState | None = None
        self._sfold: SessionFoldState | None = None
        w = config.window
        if fold_plan is not None and isinstance(w, TumblingWindow | HoppingWindow):
            slide = w.slide_ns if isinstance(w, HoppingWindow) else w.size_ns
            self._fold = fold.FoldState(
                fold_plan, w.offset_ns, w.size_ns, slide, input_schema, config.key_columns
            )
        elif fold_plan is not None and isinstance(w, SessionWindow):
            from flight_serve.engine.fold_session import SessionFoldState

            key_map = fold.KeyMap(input_schema, config.key_columns)
            self._sfold = SessionFoldState(fold_plan, w.gap_ns, key_map)

    # --- planning -----------------------------------------------------------------------------

    def _validate(self) -> None:
        cfg, schema = self.config, self.input_schema
        idx = schema.get_field_index(cfg.time_column)
        if idx < 0:
            raise EventTimeError(
                f"event-time column {cfg.time_column!r} is not in the input; input columns: "
                f"{', '.join(schema.names)}"
            )
        ts_type = schema.field(idx).type
        if not pa.types.is_timestamp(ts_type):
            raise EventTimeError(
                f"event-time column {cfg.time_column!r} must be an Arrow timestamp, got {ts_type}"
            )
        for name in (*cfg.key_columns, *(a.column for a in cfg.aggregates if a.column)):
            if schema.get_field_index(name) < 0:
                raise InvalidInputError(
                    f"column {name!r} is not in the input; input columns: {', '.join(schema.names)}"
                )
        unit_ns = NS_PER_UNIT[ts_type.unit]
        durations: dict[str, timedelta] = {}
        w = cfg.window
        if isinstance(w, TumblingWindow):
            durations = {"size": w.size, "offset": w.offset}
        elif isinstance(w, HoppingWindow):
            durations = {"size": w.size, "slide": w.slide, "offset": w.offset}
        elif isinstance(w, SessionWindow):
            durations = {"gap": w.gap}
        elif isinstance(w, CumulateWindow):
            durations = {"step": w.step, "max_size": w.max_size, "offset": w.offset}
        durations["allowed_lateness"] = cfg.allowed_lateness
        for name, value in durations.items():
            if timedelta_to_ns(value) % unit_ns:
                raise InvalidInputError(
                    f"window {name} {value} is finer than the unit {ts_type.unit!r} of event-time "
                    f"column {cfg.time_column!r}"
                )

    def _context(self) -> datafusion.SessionContext:
        """The operator's DataFusion session (one partition), made on first use with the
        sketch functions of its SQL registered."""
        if self._session is None:
            ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(1))
            for udf in self._udfs:
                ctx.register_udf(udf)
            self._session = ctx
        return self._session

    def _sql(self, sql: str, tables: dict[str, Sequence[pa.RecordBatch]]) -> pa.Table:
        if sql not in self._checked_sql:  # DataFusion would crash on a deeply nested expression
            check_sql(sql)
            self._checked_sql.add(sql)
        ctx = self._context()
        for name, batches in tables.items():
            ctx.register_record_batches(name, [list(batches)])
        try:
            return ctx.sql(sql).to_arrow_table()
        except Exception as exc:  # DataFusion raises generic exceptions: wrap at the engine edge
            raise QueryError(str(exc)) from exc
        finally:
            for name in tables:
                ctx.deregister_table(name)

    def _fold_plan(self) -> fold.FoldPlan | None:
        """The query's fold plan (:func:`.fold.plan`) when its state is folded per batch:
        tumbling or hopping windows (``count(DISTINCT)`` in sets too) without empty windows, or
        sessions; emit ``final``; every aggregate, key and value type foldable. ``None``: the
        SQL-merge path."""
        cfg, w = self.config, self.config.window
        if not cfg.fold_state or self._update:
            return None
        if isinstance(w, TumblingWindow | HoppingWindow) and cfg.empty_windows_key_ttl is None:
            return fold.plan(cfg.aggregates, cfg.key_columns, self.input_schema, distinct=True)
        if isinstance(w, SessionWindow):
            return fold.plan(cfg.aggregates, cfg.key_columns, self.input_schema)
        return None

    def _folded_partial_schema(self) -> pa.Schema | None:
        """The schema DataFusion plans for the partial aggregation of a folded query, from its
        input types alone (no SQL run): the keys as they are, ``__ws`` and ``__we`` int64, each
        aggregate's partial columns (count: int64; ``count(DISTINCT x)``: a list of ``x``;
        ``avg``: a float64 sum and an int64 count; ``sum``: int64 of signed integers, uint64 of
        unsigned ones, float64 of floats; ``min`` / ``max``: ``x``'s type), ``__chg`` and
        ``__rev`` int64. ``None`` for a type outside that table, a repeated key, or a key or
        aggregated column whose name is empty or starts with ``__`` (the operator's own
        columns): DataFusion plans those, and refuses the names it refuses. tests/unit/engine/test_fold_state.py
        checks it against DataFusion's plan for every type the fold takes."""
        cfg, schema = self.config, self.input_schema
        used = (*cfg.key_columns, *(a.column for a in cfg.aggregates if a.column is not None))
        if len(set(cfg.key_columns)) < len(cfg.key_columns) or any(
            not name or name.startswith("__") for name in used
        ):
            return None
        fields = [schema.field(k) for k in cfg.key_columns]  # metadata too, as DataFusion
        fields += [pa.field(WS, pa.int64()), pa.field(WE, pa.int64())]
        for i, agg in enumerate(cfg.aggregates):
            p = f"__p{i}"
            if agg.column is None or (agg.func == "count" and not agg.distinct):
                fields.append(pa.field(f"{p}c", pa.int64()))
                continue
            t = schema.field(agg.column).type
            if agg.distinct:
                fields.append(pa.field(f"{p}d", pa.list_(t)))
            elif agg.func == "avg":
                fields += [pa.field(f"{p}s", pa.float64()), pa.field(f"{p}c", pa.int64())]
            elif agg.func in ("min", "max"):
                fields.append(pa.field(f"{p}v", t))
            elif agg.func == "sum" and pa.types.is_signed_integer(t):
                fields.append(pa.field(f"{p}v", pa.int64()))
            elif agg.func == "sum" and pa.types.is_unsigned_integer(t):
                fields.append(pa.field(f"{p}v", pa.uint64()))
            elif agg.func == "sum" and pa.types.is_floating(t):
                fields.append(pa.field(f"{p}v", pa.float64()))
            else:
                return None
        fields += [pa.field(CHG, pa.int64()), pa.field(REV, pa.int64())]
        return pa.schema(fields)

    def _plan_merge(self, fold_plan: fold.FoldPlan | None) -> tuple[str, pa.Schema]:
        cfg = self.config
        keys = [quote_ident(k) for k in cfg.key_columns]
        group = [*keys, quote_ident(WS), quote_ident(WE)]
        partial_items, merge_items = [], []
        # DataFusion names an aggregate by its expression with casts hidden and refuses two with
        # one name (sum(v) next to avg's sum(CAST(v AS DOUBLE))), so each aggregate reads its own
        # zero-copy alias of its input column and of the event time.
        copies = [
            f"{quote_ident(TS)} AS {quote_ident(f'__t{i}')}" for i in range(len(cfg.aggregates))
        ]
        for i, agg in enumerate(cfg.aggregates):
            self._udfs += agg.udfs()  # the sketch functions the partial / merge SQL calls
            own = agg
            if agg.column is not None:
                copies.append(f"{quote_ident(agg.column)} AS {quote_ident(f'__i{i}')}")
                own = replace(agg, column=f"__i{i}")
            floating = (
                None
                if agg.column is None
                else float_sql_type(self.input_schema.field(agg.column).type)
            )
            for name, expr in own.partial_sql(f"__p{i}", quote_ident(f"__t{i}"), floating):
                partial_items.append(f"{expr} AS {quote_ident(name)}")
            for name, expr in agg.merge_sql(f"__p{i}", floating):
                merge_items.append(f"{expr} AS {quote_ident(name)}")
        partial_items += [f"1 AS {quote_ident(CHG)}", f"-1 AS {quote_ident(REV)}"]
        merge_items += [
            f"max({quote_ident(CHG)}) AS {quote_ident(CHG)}",
            f"max({quote_ident(REV)}) AS {quote_ident(REV)}",
        ]
        if cfg.empty_windows_key_ttl is not None:  # empty windows need each pane's latest row
            partial_items.append(f"max({quote_ident(TS)}) AS {quote_ident(LAST)}")
            merge_items.append(f"max({quote_ident(LAST)}) AS {quote_ident(LAST)}")
        group_by = group
        if isinstance(cfg.window, TumblingWindow | HoppingWindow):
            # fixed-size windows: window_end follows from window_start, so group by fewer columns
            size = cfg.window.size_ns
            group = [*keys, quote_ident(WS), f"{quote_ident(WS)} + {size} AS {quote_ident(WE)}"]
            group_by = [*keys, quote_ident(WS)]
        source = f"(SELECT *, {', '.join(copies)} FROM buf) AS b" if copies else "buf"
        partial = (
            f"SELECT {', '.join([*group, *partial_items])} FROM {source} "
            f"GROUP BY {', '.join(group_by)}"
        )
        buffer_schema = self._buffer_schema
        if isinstance(cfg.window, SessionWindow):
            # the buffer arrives with __sid: its rows already split into sessions (see _merge)
            ts = quote_ident(TS)
            bounds = [
                f"min({ts}) AS {quote_ident(WS)}",
                f"max({ts}) + {cfg.window.gap_ns} AS {quote_ident(WE)}",
            ]
            partial = (
                f"SELECT {', '.join([*keys, *bounds, *partial_items])} FROM {source} "
                f"GROUP BY {', '.join([*keys, SID])}"
            )
            buffer_schema = buffer_schema.append(pa.field(SID, pa.int64()))
        partial_schema = self._folded_partial_schema() if fold_plan is not None else None
        if partial_schema is not None:
            # the SQL is not run: only its size is checked, as _sql would (its nesting is that
            # of the text built here, a few levels whatever the query)
            check_sql_size(partial)
        else:
            empty_buf = [pa.RecordBatch.from_pylist([], buffer_schema)]
            partial_schema = self._sql(partial, {"buf": empty_buf}).schema
        partial_schema = pa.schema([f.with_nullable(True) for f in partial_schema])
        union = f"SELECT * FROM state UNION ALL {partial}"
        if isinstance(cfg.window, SessionWindow):
            part = f"PARTITION BY {', '.join(keys)} " if keys else ""
            order = f"ORDER BY {quote_ident(WS)}, {quote_ident(WE)}"
            merge = (
                f"WITH u AS ({union}), "
                f"o AS (SELECT *, max({quote_ident(WE)}) OVER ({part}{order} ROWS BETWEEN "
                f"UNBOUNDED PRECEDING AND 1 PRECEDING) AS __prev FROM u), "
                f"s AS (SELECT *, sum(CASE WHEN __prev IS NULL OR {quote_ident(WS)} >= __prev "
                f"THEN 1 ELSE 0 END) OVER ({part}{order} ROWS UNBOUNDED PRECEDING) AS __sid FROM o) "
                f"SELECT {', '.join([*keys, f'min({quote_ident(WS)}) AS {quote_ident(WS)}', f'max({quote_ident(WE)}) AS {quote_ident(WE)}', *merge_items])} "
                f"FROM s GROUP BY {', '.join([*keys, '__sid'])}"
            )
        else:
            merge = (
                f"SELECT {', '.join([*group, *merge_items])} FROM ({union}) AS u "
                f"GROUP BY {', '.join(group_by)}"
            )
        return merge, partial_schema

    # --- the running operator -----------------------------------------------------------------

    @property
    def watermark_ns(self) -> int:
        """The operator watermark in ns since the epoch (see :mod:`.watermark`)."""
        return self._tracker.watermark_ns

    def partition_watermarks(self) -> dict[str, dict[str, Any]]:
        """Each input partition's own watermark now
        (:meth:`~flight_serve.engine.watermark.WatermarkTracker.partition_watermarks`)."""
        return self._tracker.partition_watermarks()

    @property
    def folded_state(self) -> bool:
        """Whether the state is folded per batch (:mod:`.fold`) rather than SQL-merged, all of it
        fixed-width (count, sum, min, max, avg); a folded query with ``count(DISTINCT)`` holds
        sets besides and is :attr:`distinct_sets` instead."""
        if self._fold is not None:
            return not self._fold.sets
        return self._sfold is not None

    @property
    def distinct_sets(self) -> bool:
        """Whether the state is folded per batch (:mod:`.fold`) with exact ``count(DISTINCT)``
        sets of (key, value) pairs per pane (:mod:`.distinct`) rather than SQL-merged."""
        return self._fold is not None and bool(self._fold.sets)

    @property
    def open_panes(self) -> int:
        """Pane rows held in state (one per key and open window), not counting the buffer."""
        if self._fold is not None:
            return self._fold.open_count()
        if self._sfold is not None:
            return self._sfold.open_count
        return self._state.num_rows

    @property
    def state_bytes(self) -> int:
        """Bytes of window state held now: the pane state (the folded numpy arrays as allocated,
        or the SQL path's state table) plus the rows buffered for the next merge; the key map
        of folded state is not counted."""
        if self._fold is not None:
            held = self._fold.state_bytes()
        elif self._sfold is not None:
            held = self._sfold.state_bytes()
        else:
            held = int(self._state.nbytes)
        return held + sum(int(b.nbytes) for b in self._buffer.batches)

    @property
    def merge_sql(self) -> str:
        """The DataFusion SQL that merges buffered rows into pane state: the pane state (table
        ``state``) ``UNION ALL`` the partial aggregation of the buffered rows (table ``buf``,
        grouped by key and window), merged per key and window (for ``explain``)."""
        return self._merge_sql

    def process(
        self,
        batch: pa.RecordBatch,
        partition: str = DEFAULT_PARTITION,
        *,
        progress_ns: int | None = None,
    ) -> Emission:
        """Consume one input batch of ``partition``; return what fired and what went late.

        ``progress_ns``: ``batch`` is one instance's share of a larger batch (a keyed exchange,
        :mod:`flight_serve.pipelines.distributed`): the partition's progress is the whole
        batch's :meth:`batch_progress_ns` (ns since the epoch, or ``None``), not only this
        share's maximum event time, so every instance's watermark moves as the embedded
        operator's does.

        Raises:
            InvalidInputError: ``batch`` lacks a column of the input schema or cannot be cast to it.
            QueryError: the filter fails on this batch (DataFusion's message).
        """
        if batch.schema != self.input_schema:
            batch = self._conform(batch)
        self.metrics.rows_in += batch.num_rows
        if self.config.filter_sql is not None and batch.num_rows:
            sql = f"SELECT * FROM input WHERE {self.config.filter_sql}"
            filtered = self._sql(sql, {"input": [batch]}).cast(self.input_schema)
            batch = (
                filtered.combine_chunks().to_batches()[0]
                if filtered.num_rows
                else batch.slice(0, 0)
            )
        late_tables: list[pa.Table] = []
        watermark_before = self._tracker.watermark_ns
        ts_ns, invalid = _event_time_ns(batch.column(self.config.time_column))
        if invalid is not None:
            for code, reason in ((1, "null_time"), (2, "out_of_range")):
                idx = np.flatnonzero(invalid == code)
                if len(idx):
                    late_tables.append(self._late_rows(batch, idx, reason, None))
                    if code == 1:
                        self.metrics.rows_null_time += len(idx)
                    else:
                        self.metrics.rows_out_of_range += len(idx)
            valid_idx = np.flatnonzero(invalid == 0)
            batch = batch.take(pa.array(valid_idx, pa.int64()))
            ts_ns = ts_ns[valid_idx]
        if self._future_skew_ns is not None and batch.num_rows:
            future = ts_ns > self._wall_clock_ns() + self._future_skew_ns
            if future.any():
                idx = np.flatnonzero(future)
                late_tables.append(self._late_rows(batch, idx, "future", None))
                self.metrics.rows_future += len(idx)
                keep = np.flatnonzero(~future)
                batch = batch.take(pa.array(keep, pa.int64()))
                ts_ns = ts_ns[keep]
        if batch.num_rows:
            late = self._accept(batch, ts_ns, watermark_before)
            if late is not None:
                late_tables.append(late)
            max_ts: int | None = int(ts_ns.max())
        else:
            max_ts = None
        if progress_ns is not None and (max_ts is None or progress_ns > max_ts):
            max_ts = progress_ns
        watermark = self._tracker.observe(partition, max_ts)
        output = self._fire(watermark) if self._may_fire(watermark) else None
        if output is None and self._buffer.rows >= self.config.merge_rows:
            self._merge()
        return self._emission(output, late_tables)

    def batch_progress_ns(self, batch: pa.RecordBatch) -> int | None:
        """The maximum event time (ns since the epoch) :meth:`process` would fold into the
        watermark for ``batch`` (after the WHERE filter, without NULL, out-of-range and future
        rows), or ``None`` when no row counts; the operator's state is not touched. A keyed
        exchange sends it with every instance's share of ``batch`` (``progress_ns``).

        Raises:
            InvalidInputError, QueryError: as :meth:`process`.
        """
        if batch.schema != self.input_schema:
            batch = self._conform(batch)
        if self.config.filter_sql is not None and batch.num_rows:
            sql = f"SELECT * FROM input WHERE {self.config.filter_sql}"
            table = self._sql(sql, {"input": [batch]}).cast(self.input_schema)
            if not table.num_rows:
                return None
            column: pa.Array[Any] = table.column(self.config.time_column).combine_chunks()
        else:
            column = batch.column(self.config.time_column)
        ts_ns, invalid = _event_time_ns(column)
        if invalid is not None:
            ts_ns = ts_ns[np.flatnonzero(invalid == 0)]
        if self._future_skew_ns is not None and len(ts_ns):
            ts_ns = ts_ns[ts_ns <= self._wall_clock_ns() + self._future_skew_ns]
        return int(ts_ns.max()) if len(ts_ns) else None

    def add_partition(self, partition: str) -> None:
        """Register an input partition before it sends rows, so it holds the watermark back
        (until it sends rows, goes idle or finishes). See :mod:`.watermark`."""
        self._tracker.add_partition(partition)

    def set_backlog(self, partition: str, backlog: bool) -> None:
        """Tell the operator whether ``partition`` has unread input (then it is never idle)."""
        self._tracker.set_backlog(partition, backlog)

    def advance_watermark(self, partition: str, watermark_ns: int) -> Emission:
        """Raise ``partition``'s watermark to ``watermark_ns`` without rows ("no rows before
        this instant will follow"); fire what that closes."""
        watermark = self._tracker.advance(partition, watermark_ns)
        output = self._fire(watermark) if self._may_fire(watermark) else None
        return self._emission(output, [])

    def next_idle_ns(self) -> int | None:
        """When (``clock_ns``, monotonic ns) a partition goes idle if no row comes: call
        :meth:`tick` then (see :meth:`.WatermarkTracker.next_idle_ns`); ``None``: no partition
        can go idle."""
        return self._tracker.next_idle_ns()

    def next_wake_ns(self) -> int | None:
        """When (``clock_ns``, monotonic ns) :meth:`tick` may change something if no row comes:
        a partition goes idle, or (``idle_watermark_advance`` ``D``, every partition idle) the
        wall clock reaches the first open window's ``end + allowed_lateness + D`` (``end + D``
        for a first ``update`` emission). ``None``: nothing is due."""
        wake = self._tracker.next_idle_ns()
        advance = self._tracker.idle_advance_ns
        if advance is None or not self._tracker.all_idle():
            return wake
        ends = [e for e in (self._state_min_end, self._buffer.min_end) if e is not None]
        if self._update and self._state_min_pending_end is not None:
            ends.append(self._state_min_pending_end - self._lateness_ns)
        if not ends:
            return wake
        due_wall = min(ends) + self._lateness_ns + advance  # W' = wall - D reaches end + L
        due = self._tracker.clock_ns() + max(due_wall - self._wall_clock_ns(), 0)
        return due if wake is None else min(wake, due)

    def tick(self) -> Emission:
        """Re-evaluate idle partitions at the current processing time and fire what closes.

        Call it periodically (e.g. every ``idle_timeout / 2``) while inputs are quiet.
        """
        watermark = self._tracker.refresh()
        output = self._fire(watermark) if self._may_fire(watermark) else None
        return self._emission(output, [])

    def finish(self, partition: str | None = None) -> Emission:
        """End of input for ``partition`` (default: every partition seen, i.e. the whole input).

        When no partition is left open the watermark is +∞ and every open window fires.
        """
        if partition is None:
            for p in self._tracker.partitions:
                self._tracker.finish(p)
            watermark = self._tracker.finish(DEFAULT_PARTITION)
        else:
            watermark = self._tracker.finish(partition)
        output = self._fire(watermark) if self._may_fire(watermark) else None
        return self._emission(output, [])

    def snapshot(self) -> OperatorSnapshot:
        """The operator's whole state, as immutable Arrow tables and JSON-ready values.

        Taking a snapshot never consumes or resets live state (Arrow tables are immutable; the
        buffer is copied as it is, not merged; folded state is copied out of its arrays).
        :meth:`WindowAggregation.build` with ``restore=`` continues from it;
        :meth:`OperatorSnapshot.to_bytes` serialises it.
        """
        if self._fold is not None:
            return self._fold_snapshot()
        if self._sfold is not None:
            return self._session_snapshot()
        buffer = (
            pa.Table.from_batches(self._buffer.batches, self._buffer_schema)
            if self._buffer.batches
            else self._buffer_schema.empty_table()
        )
        return OperatorSnapshot(
            panes=self._state,
            buffer=buffer,
            closed_sessions=self._closed,
            known_keys=self._known,
            meta={
                "version": OperatorSnapshot.VERSION_PANES,
                "watermark": self._tracker.snapshot(),
                "empty_done_ns": self._empty_done,
                "metrics": dict(vars(self.metrics)),
            },
        )

    def _fold_schema(self) -> pa.Schema:
        assert self._fold is not None
        return pa.schema(
            [self.input_schema.field(k) for k in self.config.key_columns]
            + [pa.field(WS, pa.int64()), pa.field(WE, pa.int64()), pa.field(fold.PANE, pa.int64())]
            + [pa.field(c.name, pa.from_numpy_dtype(c.dtype)) for c in self._fold.plan.columns]
            + [pa.field(n, pa.list_(s.value_type)) for n, s in self._fold.sets.items()]
        )

    def _fold_snapshot(self) -> OperatorSnapshot:
        assert self._fold is not None
        keys, starts, panes, values = self._fold.pane_table()
        schema = self._fold_schema()
        arrays = [
            *keys,
            pa.array(starts, pa.int64()),
            pa.array(starts + self._fold.size, pa.int64()),
            pa.array(panes, pa.int64()),
            *(v if isinstance(v, pa.Array) else pa.array(v) for v in values.values()),
        ]
        return OperatorSnapshot(
            panes=pa.Table.from_arrays(arrays, schema=schema),
            buffer=self._buffer_schema.empty_table(),
            closed_sessions=self._closed,
            known_keys=self._known,
            meta={
                "version": (
                    OperatorSnapshot.VERSION_DISTINCT
                    if self._fold.sets
                    else OperatorSnapshot.VERSION
                ),
                "watermark": self._tracker.snapshot(),
                "empty_done_ns": self._empty_done,
                "fired_upto_ns": self._fold.fired_upto,
                "metrics": dict(vars(self.metrics)),
            },
        )

    def _restore(self, snapshot: OperatorSnapshot) -> None:
        version = snapshot.meta.get("version")
        want = OperatorSnapshot.VERSION_PANES
        if self._fold is not None:
            want = (
                OperatorSnapshot.VERSION_DISTINCT if self._fold.sets else OperatorSnapshot.VERSION
            )
        elif self._sfold is not None:
            want = OperatorSnapshot.VERSION_SESSIONS
        if version != want:
            layouts: dict[object, str] = {
                OperatorSnapshot.VERSION_PANES: "SQL-merged pane state",
                OperatorSnapshot.VERSION: "folded state",
                OperatorSnapshot.VERSION_SESSIONS: "folded session state",
                OperatorSnapshot.VERSION_DISTINCT: "folded state with count(DISTINCT) sets",
            }
            raise CheckpointError(
                f"operator snapshot version {version!r} "
                f"({layouts.get(version, 'an unknown layout')}) cannot restore this query, which "
                f"keeps {layouts[want]} (version {want}); a version 1 checkpoint of a tumbling, "
                "hopping or session query of count/sum/min/max/avg (or of a tumbling or hopping "
                "count(DISTINCT) of integers, strings, binary, booleans, dates or timestamps) "
                "predates the folded state and is not converted: start the pipeline again from its source"
            )
        if self._fold is not None:
            self._restore_fold(snapshot)
            return
        if self._sfold is not None:
            self._restore_sessions(snapshot)
            return
        self._check_snapshot_schemas(snapshot, self._state_schema)
        self._state = snapshot.panes
        if snapshot.buffer.num_rows:
            batches = snapshot.buffer.combine_chunks().to_batches()
            ends = snapshot.buffer[WE]
            self._buffer = _Batch(batches, snapshot.buffer.num_rows, int(pc.min(ends).as_py()))
        self._closed = snapshot.closed_sessions
        self._closed_max_end = (
            int(pc.max(self._closed[WE]).as_py()) if self._closed.num_rows else MIN_WATERMARK_NS
        )
        self._known = snapshot.known_keys
        self._empty_done = int(snapshot.meta["empty_done_ns"])
        self._tracker.restore(snapshot.meta["watermark"])
        for key, value in snapshot.meta.get("metrics", {}).items():
            if hasattr(self.metrics, key):
                setattr(self.metrics, key, int(value))
        self._refresh_bounds()

    def _check_snapshot_schemas(self, snapshot: OperatorSnapshot, pane_schema: pa.Schema) -> None:
        """Raise CheckpointError when a table of ``snapshot`` does not have this query's schema
        (``pane_schema``: the pane state's, SQL-path or folded)."""
        for name, table, schema in (
            ("pane state", snapshot.panes, pane_schema),
            ("buffer", snapshot.buffer, self._buffer_schema),
            ("closed sessions", snapshot.closed_sessions, self._closed.schema),
            ("key registry", snapshot.known_keys, self._known.schema),
        ):
            if not table.schema.equals(schema):
                raise CheckpointError(
                    f"the checkpoint's {name} does not match this query (was the query or its "
                    f"input schema changed?): {table.schema} vs {schema}"
                )

    def _restore_fold(self, snapshot: OperatorSnapshot) -> None:
        fs = self._fold
        assert fs is not None
        self._check_snapshot_schemas(snapshot, self._fold_schema())
        panes = snapshot.panes.combine_chunks()
        if panes.num_rows:  # one row per (key, pane): the one of the pane's latest window
            pane_ids = np.asarray(panes[fold.PANE].to_numpy(), dtype=np.int64)
            latest = fs.latest_start(pane_ids)
            panes = panes.filter(pa.array(np.asarray(panes[WS].to_numpy()) == latest))
        if panes.num_rows:
            slots = fs.keys.slots([panes[k].combine_chunks() for k in self.config.key_columns])
            if not self.config.key_columns:
                slots = np.zeros(panes.num_rows, dtype=np.int64)
            values = {
                c.name: np.asarray(panes[c.name].to_numpy(), dtype=c.dtype) for c in fs.plan.columns
            }
            pane_ids = np.asarray(panes[fold.PANE].to_numpy(), dtype=np.int64)
            fs.fold(pane_ids, slots, values)
            for name, pane_sets in fs.sets.items():
                pane_sets.restore(pane_ids, slots, panes[name].combine_chunks())
        upto = snapshot.meta.get("fired_upto_ns")
        fs.fired_upto = None if upto is None else int(upto)
        self._empty_done = int(snapshot.meta["empty_done_ns"])
        self._tracker.restore(snapshot.meta["watermark"])
        for key, value in snapshot.meta.get("metrics", {}).items():
            if hasattr(self.metrics, key):
                setattr(self.metrics, key, int(value))
        self._refresh_bounds()

    def _session_schema(self) -> pa.Schema:
        assert self._sfold is not None
        return pa.schema(
            [self.input_schema.field(k) for k in self.config.key_columns]
            + [pa.field(WS, pa.int64()), pa.field(WE, pa.int64())]
            + [pa.field(c.name, pa.from_numpy_dtype(c.dtype)) for c in self._sfold.plan.columns]
        )

    def _session_snapshot(self) -> OperatorSnapshot:
        ss = self._sfold
        assert ss is not None
        panes = pa.Table.from_arrays(
            [
                *ss.keys.keys(ss.slot),
                pa.array(ss.start, pa.int64()),
                pa.array(ss.end, pa.int64()),
                *(pa.array(ss.values[c.name]) for c in ss.plan.columns),
            ],
            schema=self._session_schema(),
        )
        closed = pa.Table.from_arrays(
            [
                *ss.keys.keys(ss.closed_slot),
                pa.array(ss.closed_start, pa.int64()),
                pa.array(ss.closed_end, pa.int64()),
            ],
            schema=self._closed.schema,
        )
        return OperatorSnapshot(
            panes=panes,
            buffer=self._buffer_schema.empty_table(),
            closed_sessions=closed,
            known_keys=self._known,
            meta={
                "version": OperatorSnapshot.VERSION_SESSIONS,
                "watermark": self._tracker.snapshot(),
                "empty_done_ns": self._empty_done,
                "metrics": dict(vars(self.metrics)),
            },
        )

    def _restore_sessions(self, snapshot: OperatorSnapshot) -> None:
        ss = self._sfold
        assert ss is not None
        self._check_snapshot_schemas(snapshot, self._session_schema())

        def slots_of(table: pa.Table) -> np.ndarray:
            if not self.config.key_columns:
                return np.zeros(table.num_rows, dtype=np.int64)
            return ss.keys.slots([table[k].combine_chunks() for k in self.config.key_columns])

        def ints(table: pa.Table, name: str) -> np.ndarray:
            return np.asarray(table[name].to_numpy(), dtype=np.int64)

        panes, closed = snapshot.panes.combine_chunks(), snapshot.closed_sessions.combine_chunks()
        ss.restore(
            slots_of(panes),
            ints(panes, WS),
            ints(panes, WE),
            {c.name: np.asarray(panes[c.name].to_numpy(), dtype=c.dtype) for c in ss.plan.columns},
            (slots_of(closed), ints(closed, WS), ints(closed, WE)),
        )
        self._empty_done = int(snapshot.meta["empty_done_ns"])
        self._tracker.restore(snapshot.meta["watermark"])
        for key, value in snapshot.meta.get("metrics", {}).items():
            if hasattr(self.metrics, key):
                setattr(self.metrics, key, int(value))
        self._refresh_bounds()

    def _accept_sessions(
        self, batch: pa.RecordBatch, ts_ns: Int64Array, watermark: int
    ) -> pa.Table | None:
        """Merge the accepted rows of ``batch`` into the folded sessions; return the late rows:
        first those overlapping a session already emitted (``_window_*``: that session), then
        those whose ``[t, t + gap)`` is closed and overlaps no open session of their key
        (``_window_*``: ``[t, t + gap)``), each part in row order."""
        ss = self._sfold
        assert ss is not None
        n, gap = batch.num_rows, ss.gap
        key_arrays = [batch.column(k) for k in self.config.key_columns]
        slots = ss.keys.slots(key_arrays) if key_arrays else np.zeros(n, dtype=np.int64)
        keep = np.ones(n, dtype=bool)
        late_tables: list[pa.Table] = []
        closed_end = ss.closed_max_end()
        if closed_end is not None and int(ts_ns.min()) < closed_end:
            cand = np.flatnonzero(ts_ns < closed_end)
            j = ss.closed_hit(slots[cand], ts_ns[cand])
            hit = j >= 0
            if hit.any():
                idx, j = cand[hit], j[hit]
                missed = (ss.closed_start[j], ss.closed_end[j])
                late_tables.append(self._late_rows(batch, idx, "late", missed))
                self.metrics.rows_late += len(idx)
                keep[idx] = False
        threshold = self._threshold(watermark)
        if threshold > MIN_WATERMARK_NS:
            dead = keep & (ts_ns + gap <= threshold)
            if dead.any():
                cand = np.flatnonzero(dead)
                idx = cand[~ss.open_hit(slots[cand], ts_ns[cand])]
                if len(idx):
                    missed = (ts_ns[idx], ts_ns[idx] + gap)
                    late_tables.append(self._late_rows(batch, idx, "late", missed))
                    self.metrics.rows_late += len(idx)
                    keep[idx] = False
        take = None if keep.all() else np.flatnonzero(keep)
        if take is None:
            ss.add(slots, ts_ns, fold.row_values(ss.plan, batch, None))
        elif len(take):
            ss.add(slots[take], ts_ns[take], fold.row_values(ss.plan, batch, take))
        self._refresh_bounds()
        if not late_tables:
            return None
        return late_tables[0] if len(late_tables) == 1 else pa.concat_tables(late_tables)

    def _session_fire(self, watermark: int) -> pa.Table | None:
        """The fired sessions as pane rows (keys, ``__ws``, ``__we``, the SQL path's partial
        columns); they leave the open sessions."""
        ss = self._sfold
        assert ss is not None
        threshold = None if watermark == MAX_WATERMARK_NS else self._threshold(watermark)
        fired = ss.take_closed(threshold)
        self._refresh_bounds()
        if fired is None:
            return None
        slots, starts, ends, values = fired
        return self._fold_rows(ss.plan, ss.keys, slots, starts, ends, values)

    def _accept_fold(
        self, batch: pa.RecordBatch, ts_ns: Int64Array, watermark: int
    ) -> pa.Table | None:
        """Fold the accepted rows of ``batch`` into the folded state; return the late rows."""
        fs = self._fold
        assert fs is not None
        panes = fs.pane_of(ts_ns)
        keep = fs.in_some_window(panes)
        threshold = self._threshold(watermark)
        late_table = None
        if threshold > MIN_WATERMARK_NS:
            # windows ending at or before the threshold are closed (fired, or empty when the
            # threshold passed them): a row here is late for them even if it opens their pane
            if fs.fired_upto is None or threshold > fs.fired_upto:
                fs.fired_upto = threshold
            late = panes < fs.first_open_pane(threshold)
            if keep is not None:
                late &= keep
            if late.any():
                idx = np.flatnonzero(late)
                starts = fs.latest_start(panes[idx])
                late_table = self._late_rows(batch, idx, "late", (starts, starts + fs.size))
                self.metrics.rows_late += len(idx)
                keep = ~late if keep is None else keep & ~late
        take: np.ndarray | None = None
        if keep is not None and not keep.all():
            take = np.flatnonzero(keep)
            if not len(take):
                return late_table
            panes = panes[take]
        key_arrays = [batch.column(k) for k in self.config.key_columns]
        if take is not None:
            key_arrays = [a.take(pa.array(take, pa.int64())) for a in key_arrays]
        slots = fs.keys.slots(key_arrays) if key_arrays else np.zeros(len(panes), dtype=np.int64)
        fs.fold(panes, slots, fs.row_values(batch, take))
        self._refresh_bounds()
        return late_table

    def _fold_fire(self, watermark: int) -> pa.Table | None:
        """The pane rows (keys, ``__ws``, ``__we``, the SQL path's partial columns) of the
        windows that close at ``watermark``; their panes are evicted."""
        fs = self._fold
        assert fs is not None
        threshold = (
            MAX_WATERMARK_NS if watermark == MAX_WATERMARK_NS else self._threshold(watermark)
        )
        parts = []
        for k in fs.due_windows(threshold):
            got = fs.window_slots(k)
            if got is not None and len(got[0]):
                parts.append(self._fold_table(k, *got))
        fs.evict(threshold)
        self._refresh_bounds()
        return pa.concat_tables(parts) if parts else None

    def _fold_table(self, k: int, slots: np.ndarray, values: dict[str, Any]) -> pa.Table:
        fs = self._fold
        assert fs is not None
        n = len(slots)
        start = fs.offset + k * fs.slide
        starts = np.full(n, start, dtype=np.int64)
        return self._fold_rows(fs.plan, fs.keys, slots, starts, starts + fs.size, values)

    def _fold_rows(
        self,
        fold_plan: fold.FoldPlan,
        keys: fold.KeyMap,
        slots: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        values: dict[str, Any],
    ) -> pa.Table:
        """Folded state rows as the SQL path's pane rows: keys, ``__ws``, ``__we`` (ns) and the
        partial columns ``__p<i>…`` of each aggregate."""
        cols: dict[str, Any] = dict(zip(self.config.key_columns, keys.keys(slots), strict=True))
        cols[WS] = pa.array(starts, pa.int64())
        cols[WE] = pa.array(ends, pa.int64())
        schema = self._state_schema
        for i, (func, value, count) in enumerate(fold_plan.aggregates):
            p = f"__p{i}"
            cnt = values[count]
            if func == "count":
                cols[f"{p}c"] = pa.array(cnt, pa.int64())
            elif func == "count_distinct":  # the count itself (AggregateCall.final)
                assert value is not None
                cols[f"{p}n"] = pa.array(values[value], pa.int64())
            elif func == "avg":
                assert value is not None
                cols[f"{p}s"] = pa.array(values[value], pa.float64(), mask=cnt == 0)
                cols[f"{p}c"] = pa.array(cnt, pa.int64())
            else:
                assert value is not None
                typ = schema.field(f"{p}v").type
                cols[f"{p}v"] = pa.array(values[value], mask=cnt == 0).cast(typ)
        return pa.table(cols)

    # --- internals ----------------------------------------------------------------------------

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        missing = [n for n in self.input_schema.names if batch.schema.get_field_index(n) < 0]
        if missing:
            raise InvalidInputError(f"input batch lacks column(s) {', '.join(missing)}")
        try:
            return conform_batch(
                batch, self.input_schema, by_name=True, cast="arrow", check_metadata=True
            )
        except ColumnMismatch as exc:
            raise InvalidInputError(
                f"input batch does not match the input schema: {exc.cause}"
            ) from exc.cause

    def _threshold(self, watermark: int) -> int:
        """Windows with ``window_end <= threshold`` are closed (late / ready to fire)."""
        if watermark == MIN_WATERMARK_NS:
            return MIN_WATERMARK_NS
        return max(watermark - self._lateness_ns, MIN_WATERMARK_NS)

    def _accept(self, batch: pa.RecordBatch, ts_ns: Int64Array, watermark: int) -> pa.Table | None:
        if self._fold is not None:
            return self._accept_fold(batch, ts_ns, watermark)
        if self._sfold is not None:
            return self._accept_sessions(batch, ts_ns, watermark)
        window = self.config.window
        rows, starts, ends = window.assign_bounds_ns(ts_ns)
        threshold = self._threshold(watermark)
        late_table = None
        if isinstance(window, SessionWindow) and self._closed.num_rows:
            # a row that would join a session already emitted and evicted is late for it: it
            # must not start a second, overlapping session for the same key
            # only a row that starts before the latest closed session's end can overlap one
            could = starts < self._closed_max_end
            hit, s_start, s_end = self._overlaps(batch, rows, starts, ends, could, self._closed)
            if len(hit):
                late_table = self._late_rows(batch, rows[hit], "late", (s_start, s_end))
                self.metrics.rows_late += len(hit)
                keep = np.ones(len(rows), dtype=bool)
                keep[hit] = False
                rows, starts, ends = rows[keep], starts[keep], ends[keep]
        if threshold > MIN_WATERMARK_NS and len(rows):
            alive = ends > threshold
            if not alive.all():
                if isinstance(window, SessionWindow):
                    # a late proto-session that overlaps a still-open session merges into it
                    self._merge()
                    hit, _, _ = self._overlaps(batch, rows, starts, ends, ~alive, self._state)
                    alive[hit] = True
                n = batch.num_rows
                # a row already sent out above (it hits an emitted session) has no pair left:
                # only rows with pairs here and none of them alive are late now
                pairs = np.bincount(rows, minlength=n)
                live_count = np.bincount(rows[alive], minlength=n)
                late_rows = np.flatnonzero((live_count == 0) & (pairs > 0))
                if len(late_rows):
                    # the first assignment of each row is its latest window (see assign_ns)
                    first = np.searchsorted(rows, late_rows)
                    own = self._late_rows(batch, late_rows, "late", (starts[first], ends[first]))
                    late_table = own if late_table is None else pa.concat_tables([late_table, own])
                    self.metrics.rows_late += len(late_rows)
                rows, starts, ends = rows[alive], starts[alive], ends[alive]
        if len(rows):
            cols = [batch.column(n) for n in self._buffer_schema.names[:-3]]
            row_ts = ts_ns
            if len(rows) != batch.num_rows or isinstance(
                self.config.window, HoppingWindow | CumulateWindow
            ):
                take = pa.array(rows, pa.int64())
                cols = [c.take(take) for c in cols]
                row_ts = ts_ns[rows]
            buf = pa.RecordBatch.from_arrays(
                [
                    *cols,
                    pa.array(row_ts, pa.int64()),
                    pa.array(starts, pa.int64()),
                    pa.array(ends, pa.int64()),
                ],
                schema=self._buffer_schema,
            )
            self._buffer.batches.append(buf)
            self._buffer.rows += buf.num_rows
            low = int(ends.min())
            self._buffer.min_end = (
                low if self._buffer.min_end is None else min(low, self._buffer.min_end)
            )
        return late_table

    def _overlaps(
        self,
        batch: pa.RecordBatch,
        rows: Int64Array,
        starts: Int64Array,
        ends: Int64Array,
        candidates: np.ndarray,
        sessions: pa.Table,
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """Candidate (row, window) pairs whose window overlaps a session of the same key in
        ``sessions`` (keys, ``__ws``, ``__we``): ``(pair index, session start, session end)``."""
        idx = np.flatnonzero(candidates)
        empty = np.zeros(0, dtype=np.int64)
        if not len(idx) or not sessions.num_rows:
            return empty, empty, empty
        keys = self.config.key_columns
        cand = pa.table(
            {
                **{k: batch.column(k).take(pa.array(rows[idx], pa.int64())) for k in keys},
                WS: pa.array(starts[idx], pa.int64()),
                WE: pa.array(ends[idx], pa.int64()),
                "__i": pa.array(idx, pa.int64()),
            }
        )
        on = " AND ".join(
            [f"(c.{quote_ident(k)} IS NOT DISTINCT FROM s.{quote_ident(k)})" for k in keys]
            + [
                f"c.{quote_ident(WS)} < s.{quote_ident(WE)}",
                f"c.{quote_ident(WE)} > s.{quote_ident(WS)}",
            ]
        )
        hits = self._sql(
            f"SELECT c.__i, max(s.{quote_ident(WS)}) AS s, max(s.{quote_ident(WE)}) AS e "
            f"FROM cand c JOIN sessions s ON {on} GROUP BY c.__i",
            {"cand": cand.to_batches(), "sessions": sessions.to_batches()},
        )

        def column(name: str) -> Int64Array:
            return np.asarray(hits[name].to_numpy(), dtype=np.int64)

        return column("__i"), column("s"), column("e")

    def _late_rows(
        self,
        batch: pa.RecordBatch,
        idx: np.ndarray,
        reason: str,
        missed: tuple[Int64Array, Int64Array] | None,
    ) -> pa.Table:
        taken = batch.take(pa.array(idx, pa.int64()))
        n = len(idx)
        start: pa.Array[Any]
        end: pa.Array[Any]
        if missed is None:
            start = pa.nulls(n, self.time_type)
            end = pa.nulls(n, self.time_type)
        else:
            missed_start, missed_end = missed
            start = pa.array(missed_start // self._unit_ns, pa.int64()).cast(self.time_type)
            end = pa.array(missed_end // self._unit_ns, pa.int64()).cast(self.time_type)
        return pa.Table.from_arrays(
            [*taken.columns, pa.array([reason] * n, pa.string()), start, end],
            schema=self.late_schema,
        )

    def _emit_threshold(self, watermark: int) -> int:
        """Windows with ``window_end <= this`` are due to emit (update mode: at ``W``)."""
        return watermark if self._update else self._threshold(watermark)

    def _may_fire(self, watermark: int) -> bool:
        if self._fold is not None:
            if watermark == MAX_WATERMARK_NS:
                return bool(self._fold.pane_row)
            end = self._fold.next_end()
            return end is not None and end <= self._threshold(watermark)
        if self._sfold is not None:
            end = self._sfold.min_end()
            if watermark == MAX_WATERMARK_NS:
                return end is not None
            return end is not None and end <= self._threshold(watermark)
        if self._empty_ttl_ns is not None and (
            self._known.num_rows or self._state.num_rows or self._buffer.rows
        ):
            return self._threshold(watermark) > self._empty_done
        if watermark == MAX_WATERMARK_NS:
            return self._buffer.rows > 0 or self._state.num_rows > 0
        due = [e for e in (self._state_min_pending_end, self._buffer.min_end) if e is not None]
        if due and min(due) <= self._emit_threshold(watermark):
            return True
        return self._state_min_end is not None and self._state_min_end <= self._threshold(watermark)

    def _refresh_bounds(self) -> None:
        if self._fold is not None:
            self._state_min_end, self._state_min_pending_end = self._fold.next_end(), None
            return
        if self._sfold is not None:
            self._state_min_end, self._state_min_pending_end = self._sfold.min_end(), None
            return
        state = self._state
        if not state.num_rows:
            self._state_min_end = self._state_min_pending_end = None
            return
        self._state_min_end = int(pc.min(state[WE]).as_py())
        pending = state.filter(pc.equal(state[CHG], pa.scalar(1, pa.int64())))
        self._state_min_pending_end = int(pc.min(pending[WE]).as_py()) if pending.num_rows else None

    def _merge(self) -> None:
        if not self._buffer.rows:
            return
        state_batches = self._state.to_batches() or [
            pa.RecordBatch.from_pylist([], self._state_schema)
        ]
        buffered: Sequence[pa.RecordBatch] = self._buffer.batches
        if isinstance(self.config.window, SessionWindow):
            buffered = self._split_sessions(buffered, self.config.window.gap_ns)
        merged = self._sql(self._merge_sql, {"state": state_batches, "buf": buffered})
        self._state = merged.cast(self._state_schema)
        self._buffer = _Batch()
        self.metrics.merges += 1
        self._refresh_bounds()

    def _split_sessions(
        self, batches: Sequence[pa.RecordBatch], gap_ns: int
    ) -> list[pa.RecordBatch]:
        """Number the sessions within the buffered rows (``__sid``): sorted by key and event time,
        a row starts a new session when its key changes or it is ``gap`` or more after the
        previous row. Merging with the stored sessions then only sees one row per such session."""
        buf = pa.Table.from_batches(batches).combine_chunks()
        n = buf.num_rows
        codes = _key_codes(buf, self.config.key_columns)
        ts = np.asarray(buf[TS].to_numpy(), dtype=np.int64)
        order = np.lexsort((ts, codes))
        sorted_codes, sorted_ts = codes[order], ts[order]
        new = np.ones(n, dtype=bool)
        new[1:] = (sorted_codes[1:] != sorted_codes[:-1]) | (
            sorted_ts[1:] - sorted_ts[:-1] >= gap_ns
        )
        sid = np.empty(n, dtype=np.int64)
        sid[order] = np.cumsum(new)
        return buf.append_column(SID, pa.array(sid, pa.int64())).to_batches()

    def _fire(self, watermark: int) -> pa.Table | None:
        if self._fold is not None:
            folded = self._fold_fire(watermark)
            return None if folded is None else self._output(folded)
        if self._sfold is not None:
            sessions = self._session_fire(watermark)
            return None if sessions is None else self._output(sessions)
        self._merge()
        state = self._state
        if not state.num_rows and not (self._empty_ttl_ns is not None and self._known.num_rows):
            return None
        n = state.num_rows
        if watermark == MAX_WATERMARK_NS:
            evict = pa.array(np.ones(n, dtype=bool))
            due = evict
        else:
            ends = state[WE]
            evict = pc.less_equal(ends, pa.scalar(self._threshold(watermark), pa.int64()))
            due = pc.less_equal(ends, pa.scalar(self._emit_threshold(watermark), pa.int64()))
        changed = pc.equal(state[CHG], pa.scalar(1, pa.int64()))
        emit_mask = pc.and_(due, changed)
        fired = state.filter(emit_mask)
        if self._update and fired.num_rows:
            # emitted panes that stay (W < end + L) keep their state with the new revision
            revision = pc.add(fired[REV], pa.scalar(1, pa.int64()))
            fired = fired.set_column(fired.schema.get_field_index(REV), REV, revision)
            kept_mask = pc.invert(evict)
            kept = state.filter(kept_mask)
            chg = pc.if_else(
                pc.and_(due, changed).filter(kept_mask), pa.scalar(0, pa.int64()), kept[CHG]
            )
            rev = pc.if_else(
                pc.and_(due, changed).filter(kept_mask), pc.add(kept[REV], 1), kept[REV]
            )
            kept = kept.set_column(kept.schema.get_field_index(CHG), CHG, chg)
            self._state = kept.set_column(kept.schema.get_field_index(REV), REV, rev)
        else:
            self._state = state.filter(pc.invert(evict))
        if isinstance(self.config.window, SessionWindow) and watermark != MAX_WATERMARK_NS:
            self._remember_closed(state.filter(evict), watermark)
        self._refresh_bounds()
        if self._empty_ttl_ns is not None:
            fired = self._with_empty_windows(fired, watermark)
        if not fired.num_rows:
            return None
        return self._output(fired)

    def _output(self, fired: pa.Table) -> pa.Table:
        """Fired pane rows → the output rows, ordered by window end, start and keys."""
        self.metrics.windows_fired += fired.num_rows
        order: list[tuple[str, Literal["ascending", "descending"]]] = [
            (WE, "ascending"),
            (WS, "ascending"),
            *((k, "ascending") for k in self.config.key_columns),
        ]
        fired = fired.sort_by(order)
        output = self._project(self._finalize(fired))
        if self._update:
            output = output.append_column(REVISION, fired[REV])
        return output

    def _with_empty_windows(self, fired: pa.Table, watermark: int) -> pa.Table:
        """``fired`` plus a pane with count 0 (other partials NULL) for every window ending in
        ``(last threshold, threshold]`` of every key that had a row within ``ttl`` before the
        window's start and none in it.

        All rows with an event time before such a window's end are known when it fires (a later
        one would be late), so "the key's latest row before ``s``" is the maximum ``__lt`` over the
        key's earlier panes: the ones fired now that start before ``s`` and those emitted before.
        """
        window = self.config.window
        assert isinstance(window, TumblingWindow | HoppingWindow)
        assert self._empty_ttl_ns is not None
        ttl, size = self._empty_ttl_ns, window.size_ns
        slide = window.slide_ns if isinstance(window, HoppingWindow) else size
        threshold = self._threshold(watermark)
        done, self._empty_done = self._empty_done, max(self._empty_done, threshold)
        keys = list(self.config.key_columns)
        before = self._known
        key_schema = pa.schema([before.schema.field(k) for k in keys])
        fired_now = fired.select([*keys, WS, LAST])
        # every key of the known keys and of this fire as one dense code (a NULL equals a NULL,
        # as GROUP BY groups them: Arrow's joins never match NULL, so the keys are matched by
        # code here and in the SQL below)
        all_keys = pa.concat_tables([before.select(keys), fired_now.select(keys).cast(key_schema)])
        codes = _key_codes(all_keys, keys)
        n_before = before.num_rows
        code_before, code_now = codes[:n_before], codes[n_before:]
        uniq, first_row = np.unique(codes, return_index=True)
        n_keys = len(uniq)  # codes are 0 … n_keys - 1
        unknown = pa.scalar(MIN_WATERMARK_NS, pa.int64())
        lasts = np.concatenate(
            [
                np.asarray(before[LAST].fill_null(unknown).to_numpy(), dtype=np.int64),
                np.asarray(fired_now[LAST].fill_null(unknown).to_numpy(), dtype=np.int64),
            ]
        )
        last = np.full(n_keys, MIN_WATERMARK_NS, dtype=np.int64)
        np.maximum.at(last, codes, lasts)
        latest = all_keys.take(pa.array(first_row, pa.int64())).append_column(
            LAST, pa.array(last, pa.int64())
        )
        if threshold == MAX_WATERMARK_NS:
            self._known = latest
        else:  # a key whose latest row is older than ttl + size can make no more empty windows
            horizon = pa.scalar(threshold - ttl - size, pa.int64())
            self._known = latest.filter(pc.greater_equal(latest[LAST], horizon))
        if not latest.num_rows or threshold <= done:
            return fired
        # candidates per key: window ends on the grid after ``done`` and, for a key not seen in
        # an earlier fire, after its first pane fired now (it had no row before that pane), up
        # to the threshold and to its latest row + ttl
        first_ws = np.full(n_keys, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first_ws, code_now, np.asarray(fired_now[WS].to_numpy(), dtype=np.int64))
        new = np.zeros(n_keys, dtype=bool)
        new[code_now] = True
        new[code_before] = False
        origin = window.offset_ns + size
        floor = max(done, MIN_WATERMARK_NS + 2 * size)
        low = np.maximum(np.where(new, first_ws, floor), floor)
        high = np.minimum(last + ttl + size, threshold)
        k_low = (low - origin) // slide + 1
        counts = np.maximum((high - origin) // slide - k_low + 1, 0)
        total = int(counts.sum())
        if not total:
            return fired
        rows = np.repeat(np.arange(n_keys, dtype=np.int64), counts)
        steps = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        kc, ws, lt = "__kc", quote_ident(WS), quote_ident(LAST)
        cand = pa.table(
            {
                kc: pa.array(rows, pa.int64()),
                WS: pa.array(
                    origin + (np.repeat(k_low, counts) + steps) * slide - size, pa.int64()
                ),
            }
        )
        prior = pa.table(
            {
                kc: pa.array(codes, pa.int64()),
                WS: pa.array(
                    np.concatenate(
                        [
                            np.full(n_before, MIN_WATERMARK_NS, dtype=np.int64),
                            np.asarray(fired_now[WS].to_numpy(), dtype=np.int64),
                        ]
                    ),
                    pa.int64(),
                ),
                LAST: pa.array(lasts, pa.int64()),
            }
        )
        live = self._sql(
            f"SELECT c.{kc}, c.{ws} FROM cand c JOIN prior p ON c.{kc} = p.{kc} "
            f"AND p.{ws} < c.{ws} GROUP BY c.{kc}, c.{ws} HAVING max(p.{lt}) >= c.{ws} - {ttl}",
            {"cand": cand.to_batches(), "prior": prior.to_batches()},
        )
        if fired.num_rows and live.num_rows:
            seen = pa.table({kc: pa.array(code_now, pa.int64()), WS: fired_now[WS]})
            live = live.join(seen, keys=[kc, WS], join_type="left anti")
        if live.num_rows:
            owners = live[kc].combine_chunks()
            live = pa.table(
                {**{k: latest[k].take(owners) for k in keys}, WS: live[WS].combine_chunks()}
            )
        if not live.num_rows:
            return fired
        n = live.num_rows
        arrays: list[Any] = []
        for field_ in self._state_schema:
            if field_.name in keys or field_.name == WS:
                arrays.append(live[field_.name].cast(field_.type))
            elif field_.name == WE:
                arrays.append(pc.add(live[WS], pa.scalar(size, pa.int64())))
            elif field_.name == CHG:
                arrays.append(pa.array(np.ones(n, dtype=np.int64)))
            elif field_.name == REV:
                arrays.append(pa.array(np.full(n, -1, dtype=np.int64)))
            else:
                arrays.append(pa.nulls(n, field_.type))
        empty = pa.Table.from_arrays(arrays, schema=self._state_schema)
        return pa.concat_tables([fired, empty]) if fired.num_rows else empty

    def _remember_closed(self, evicted: pa.Table, watermark: int) -> None:
        """Keep evicted sessions while an accepted row could still overlap them.

        A row is accepted when ``t + gap > W - L`` or when it overlaps an open session of its key,
        so an evicted session may be forgotten once it ends at or before ``W - L - gap`` *and* its
        key has no open session (a row bridging the two would otherwise reopen it).
        """
        assert isinstance(self.config.window, SessionWindow)
        keys = list(self.config.key_columns)
        names = [*keys, WS, WE]
        closed = pa.concat_tables([self._closed, evicted.select(names).cast(self._closed.schema)])
        horizon = self._threshold(watermark) - self.config.window.gap_ns
        recent = pc.greater(closed[WE], pa.scalar(horizon, pa.int64()))
        if not keys:
            keep = recent if not self._state.num_rows else pa.array(np.ones(closed.num_rows, bool))
            self._closed = closed.filter(keep)
        else:
            # the closed sessions whose key has an open session; NULL is a key like any other
            # (GROUP BY's rule), which an Arrow join would not match, so compare key codes
            closed_keys = closed.select(keys)
            open_keys = self._state.select(keys).cast(closed_keys.schema)
            codes = _key_codes(pa.concat_tables([closed_keys, open_keys]), keys)
            n_closed = closed.num_rows
            held = closed.filter(pa.array(np.isin(codes[:n_closed], codes[n_closed:])))
            self._closed = (
                pa.concat_tables([closed.filter(recent), held])
                .group_by(names)
                .aggregate([])
                .select(names)
            )
        self._closed_max_end = (
            int(pc.max(self._closed[WE]).as_py()) if self._closed.num_rows else MIN_WATERMARK_NS
        )

    def _finalize(self, state: pa.Table) -> pa.Table:
        """Pane state → keys, ``window_start``, ``window_end``, ``__a<i>`` (final aggregates)."""
        cfg = self.config
        unit = self._unit_ns
        arrays: list[pa.ChunkedArray[Any] | pa.Array[Any]] = [state[k] for k in cfg.key_columns]
        names = list(cfg.key_columns)
        for name, col in (("window_start", WS), ("window_end", WE)):
            values = pc.divide(state[col], pa.scalar(unit, pa.int64())) if unit != 1 else state[col]
            arrays.append(values.cast(self.time_type))
            names.append(name)
        for i, agg in enumerate(cfg.aggregates):
            arrays.append(agg.final(state, f"__p{i}"))
            names.append(f"__a{i}")
        return pa.Table.from_arrays(arrays, names=names)

    def _project(self, fired: pa.Table) -> pa.Table:
        cfg = self.config
        if cfg.projection_sql is not None:
            batches = fired.to_batches() or [pa.RecordBatch.from_pylist([], fired.schema)]
            return self._sql(cfg.projection_sql, {"fired": batches})
        columns = cfg.columns or (
            *(OutputColumn(k, k) for k in cfg.key_columns),
            OutputColumn("window_start", "window_start"),
            OutputColumn("window_end", "window_end"),
            *(OutputColumn(a.alias, f"__a{i}") for i, a in enumerate(cfg.aggregates)),
        )
        return pa.Table.from_arrays(
            [fired[c.source] for c in columns], names=[c.name for c in columns]
        )

    def _emission(self, output: pa.Table | None, late: list[pa.Table]) -> Emission:
        if output is None:
            output = self.output_schema.empty_table()
        elif output.schema != self.output_schema:
            output = output.cast(self.output_schema)
        late_table = pa.concat_tables(late) if late else self._empty_late
        return Emission(output=output, late=late_table, watermark_ns=self._tracker.watermark_ns)
