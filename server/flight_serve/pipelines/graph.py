"""The graph of a pipeline run: streams, and the nodes that read them.

Sources feed **streams** (:class:`Stream`: a name, a schema, partitions and the nodes reading
it). Each query of the pipeline is a **node** reading one stream: a windowed aggregation
(:class:`WindowNode`, a :class:`~flight_serve.engine.operator.WindowOperator`), a per-row query
(:class:`RowNode`, DataFusion once per batch) or the plugin stage in front of one
(:class:`PluginNode`). A node emits through its :class:`Collector` (the edges: the streams it
writes, the sink it inserts into); it never sees the runtime.

Every node has the same lifecycle, with safe defaults (Arroyo's ``ArrowOperator``):
``start`` (before the first batch), ``on_batch``, ``on_end``, ``on_partition``,
``on_watermark``, ``on_backlog``, ``on_tick`` (processing time passed), ``on_barrier`` (a
checkpoint is taken next: emit what is in flight), ``on_finish`` (every input ended), ``close``;
and ``snapshot`` (its state for a checkpoint; a node is built with its restored state).

Every node counts ``rows_in`` (rows handed to :meth:`Node.on_batch`) and ``rows_out`` (rows it
emits to its output stream or sink, not its late side output), since the run started: they are
informational and start at 0 after a restore, like Flink's per-operator metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import datafusion
import pyarrow as pa
from sqlglot import exp

from flight_serve.engine.operator import Emission, WindowOperator
from flight_serve.engine.sqlguard import check_sql
from flight_serve.errors import QueryError
from flight_serve.pipelines.dialect import function_named_in, sql_error
from flight_serve.pipelines.pipeline import FunctionDef, QueryDef
from flight_serve.pipelines.query import unknown_column
from flight_serve.pipelines.user_functions import FunctionSet
from flight_serve.types import MAX_WATERMARK_NS

if TYPE_CHECKING:  # cold start: only a pipeline with a plugin stage loads the plugin hub
    from flight_serve.pipelines.plugins import PluginHub

__all__ = [
    "Collector",
    "Node",
    "PluginNode",
    "RowNode",
    "Stream",
    "WindowNode",
    "check_row_columns",
]

_INPUT = "__input"


def one_batch(table: pa.Table) -> pa.RecordBatch | None:
    """``table`` as one batch (``None`` when it has no rows)."""
    if not table.num_rows:
        return None
    batches = table.combine_chunks().to_batches()
    return batches[0]


def columns_text(schema: pa.Schema) -> str:
    """``name type, …`` of ``schema`` (for messages and EXPLAIN)."""
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable."""
    return pa.schema([f.with_nullable(True) for f in schema])


class Collector(Protocol):
    """Where a node's output goes: the edges of the graph (the run loop implements it)."""

    def push(self, stream: Stream, partition: str, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` of ``partition`` to every node reading ``stream``."""
        ...

    def end(self, stream: Stream, partition: str) -> None:
        """End of input of ``partition`` for every node reading ``stream``."""
        ...

    def add_partition(self, stream: Stream, partition: str) -> None:
        """A new partition of ``stream``."""
        ...

    def advance(self, stream: Stream, partition: str, watermark_ns: int) -> None:
        """An explicit watermark of ``partition`` of ``stream``."""
        ...

    def set_backlog(self, stream: Stream, partition: str, backlog: bool) -> None:
        """Whether ``partition`` of ``stream`` has unread input."""
        ...

    def deliver(self, sink: str, batch: pa.RecordBatch) -> None:
        """Insert ``batch`` into sink ``sink``."""
        ...

    def plugin_wait(self, node: PluginNode, waiting: str | None) -> None:
        """A plugin stage waits for a result (``waiting``: why, ``None`` when it is over)."""
        ...


@dataclass
class Stream:
    """A stream inside the run: a source, a view, or a late side output."""

    name: str
    schema: pa.Schema
    partitions: tuple[str, ...]
    consumers: list[Node] = field(default_factory=list)


@dataclass
class Node(ABC):
    """One query of the run; subclasses say what it does with a batch."""

    def __init__(
        self, out: Collector, query: QueryDef, input: Stream, schema: pa.Schema
    ) -> None:
        self.out = out
        self.query = query
        self.input = input
        self.schema = schema
        self.output: Stream | None = None
        self.rows_in = 0  # rows handed to on_batch since the run started
        self.rows_out = 0  # rows emitted (output stream or sink) since the run started
        input.consumers.append(self)

    def start(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called once before the first source batch."""

    def on_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        """One input batch of ``partition`` (counted in ``rows_in``, then :meth:`process`)."""
        self.rows_in += batch.num_rows
        self.process(partition, batch)

    @abstractmethod
    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        """What the node does with one input batch of ``partition``."""

    @abstractmethod
    def on_end(self, partition: str) -> None:
        """End of input of ``partition``."""

    def on_partition(self, partition: str) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """A partition that appeared after the start (a new writer of a live source)."""

    def on_watermark(self, partition: str, watermark_ns: int) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """An explicit watermark of ``partition`` (a writer's watermark marker)."""

    def on_backlog(self, partition: str, backlog: bool) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Whether ``partition`` has unread input (then it is never idle)."""

    def on_tick(self, *, periodic: bool) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Processing time passed: a wake-up instant (:meth:`next_wake_ns`) or, with
        ``periodic``, the run loop's periodic tick."""

    def on_barrier(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """A checkpoint (or the end of input) comes next: emit everything in flight."""

    def on_finish(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Every input of the run ended: emit what is left."""

    def close(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """The run is over (always called)."""

    def snapshot(self, files: dict[str, bytes]) -> dict[str, Any] | None:
        """The node's entry of a checkpoint's manifest (its state goes into ``files``), or
        ``None`` for a stateless node."""
        return None

    def next_wake_ns(self) -> int | None:
        """When (``clock_ns``) :meth:`on_tick` is due next, if the node needs it."""
        return None

    def idle_timeout_s(self) -> float | None:
        """The node's idle timeout (seconds), which sets the run loop's periodic tick."""
        return None

    #: whether the node needs the fastest periodic tick (results arriving from elsewhere)
    ticks_often = False

    def late_rows(self) -> int | None:
        """Rows sent to the late side output so far (every reason), for a windowed node."""
        return None

    def waiting_for(self) -> str | None:
        """What the node waits for now (a plugin instance), else ``None``."""
        return None

    def error(self) -> tuple[str, str] | None:
        """``(function, its last error)`` of a plugin stage, else ``None``."""
        return None

    def open_windows(self) -> int | None:
        """Pane rows held in state now (one per key and open window), for a windowed node."""
        return None

    def emit(self, partition: str, batch: pa.RecordBatch | None) -> None:
        if batch is None or not batch.num_rows:
            return
        self.rows_out += batch.num_rows
        if self.query.sink is not None:
            self.out.deliver(self.query.sink, batch)
        if self.output is not None:
            self.out.push(self.output, partition, batch)


class WindowNode(Node):
    def __init__(
        self, out: Collector, query: QueryDef, input: Stream, op: WindowOperator
    ) -> None:
        super().__init__(out, query, input, op.output_schema)
        self.op = op
        self.late: Stream | None = None
        self.finished = op.watermark_ns == MAX_WATERMARK_NS  # restored after the end
        self.partition = query.view or f"query {query.index + 1}"

    def start(self) -> None:
        for partition in self.input.partitions:
            self.op.add_partition(partition)
            self.op.set_backlog(partition, True)  # embedded: unread input until it ends

    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        self.handle(self.op.process(batch, partition=partition))

    def on_share(self, partition: str, batch: pa.RecordBatch, progress_ns: int | None) -> None:
        """One instance's share of an input batch of ``partition`` (a keyed exchange): its
        rows, and the whole batch's progress (``WindowOperator.batch_progress_ns``), so the
        watermark moves as it does for the whole batch."""
        self.rows_in += batch.num_rows
        self.handle(self.op.process(batch, partition=partition, progress_ns=progress_ns))

    def on_end(self, partition: str) -> None:
        self.op.set_backlog(partition, False)
        self.handle(self.op.finish(partition))

    def on_partition(self, partition: str) -> None:
        self.op.add_partition(partition)

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        self.handle(self.op.advance_watermark(partition, watermark_ns))

    def on_backlog(self, partition: str, backlog: bool) -> None:
        self.op.set_backlog(partition, backlog)

    def on_tick(self, *, periodic: bool) -> None:
        """Re-evaluate idle partitions now (live sources) and fire what that closes."""
        if not self.finished:
            self.handle(self.op.tick())

    def on_finish(self) -> None:
        if not self.finished:
            self.handle(self.op.finish())

    def next_wake_ns(self) -> int | None:
        return None if self.finished else self.op.next_wake_ns()

    def idle_timeout_s(self) -> float | None:
        timeout = self.op.config.idle_timeout
        return timeout.total_seconds() if timeout is not None else None

    def late_rows(self) -> int:
        metrics = self.op.metrics
        return (
            metrics.rows_late
            + metrics.rows_null_time
            + metrics.rows_out_of_range
            + metrics.rows_future
        )

    def open_windows(self) -> int:
        return self.op.open_panes

    def snapshot(self, files: dict[str, bytes]) -> dict[str, Any]:
        """The operator's snapshot (``op-<index>.snapshot``) and its manifest entry."""
        file = f"op-{self.query.index}.snapshot"
        files[file] = self.op.snapshot().to_bytes()
        return {
            "file": file,
            "label": self.query.label,
            "watermark_ns": self.op.watermark_ns,
            "open_panes": self.op.open_panes,
        }

    def handle(self, emission: Emission) -> None:
        self.emit(self.partition, one_batch(emission.output))
        if self.late is not None:
            late = one_batch(emission.late)
            if late is not None:
                self.out.push(self.late, self.late.partitions[0], late)
        if emission.watermark_ns == MAX_WATERMARK_NS and not self.finished:
            self.finished = True
            if self.output is not None:
                self.out.end(self.output, self.partition)
            if self.late is not None:
                self.out.end(self.late, self.late.partitions[0])


class RowNode(Node):
    def __init__(
        self,
        out: Collector,
        query: QueryDef,
        input: Stream,
        tables: dict[str, pa.Table],
        functions: FunctionSet | None = None,
    ) -> None:
        self.ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(1))
        self.functions = functions  # the pipeline's user functions, as UDFs of this session
        if functions is not None:
            functions.register(self.ctx)
        for name in query.tables:
            table = tables[name]
            batches = table.to_batches() or [pa.RecordBatch.from_pylist([], table.schema)]
            self.ctx.register_record_batches(_table_name(name), [batches])
        self.sql = _row_sql(query, input.name)
        check_sql(self.sql)  # DataFusion would crash on a deeply nested expression
        self.label = query.label
        empty = pa.RecordBatch.from_pylist([], input.schema)
        try:
            schema = nullable(self.run_sql(empty).schema)
        except QueryError as exc:  # its message starts with the label already
            said = " ".join(str(exc).split())  # DataFusion's message is on several lines
            raise sql_error(said, function_named_in(query.select, said) or query.select) from None
        super().__init__(out, query, input, schema)

    def run_sql(self, batch: pa.RecordBatch) -> pa.Table:
        self.ctx.register_record_batches(_INPUT, [[batch]])
        try:
            return self.ctx.sql(self.sql).to_arrow_table()
        except Exception as exc:  # DataFusion raises generic exceptions: wrap them
            failure = self.functions.failure() if self.functions is not None else None
            if failure is not None:  # a user function failed: its own error, named
                raise type(failure)(f"{self.label}: {failure}") from failure
            raise QueryError(f"{self.label}: {exc}") from exc
        finally:
            self.ctx.deregister_table(_INPUT)

    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.emit(partition, one_batch(self.run_sql(batch).cast(self.schema)))

    def on_end(self, partition: str) -> None:
        if self.output is not None:
            self.out.end(self.output, partition)

    # a per-row query keeps its input's partitions: pass their progress on
    def on_partition(self, partition: str) -> None:
        if self.output is not None:
            self.out.add_partition(self.output, partition)

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        if self.output is not None:
            self.out.advance(self.output, partition, watermark_ns)

    def on_backlog(self, partition: str, backlog: bool) -> None:
        if self.output is not None:
            self.out.set_backlog(self.output, partition, backlog)


class PluginNode(Node):
    """``<f>(<stream>)``: every batch goes through an attached plugin (a
    :class:`~flight_serve.pipelines.plugins.PluginStage`); its results go on, in the order the
    batches came, to the query's hidden stream ``<f>(<stream>)``, which the per-row query reads.
    Partition events (end, watermark, new partition, backlog) wait behind the batches sent
    before them, so downstream operators see the same sequence as without the plugin.
    """

    def __init__(
        self,
        out: Collector,
        query: QueryDef,
        input: Stream,
        function: FunctionDef,
        hub: PluginHub,
    ) -> None:
        from flight_serve.pipelines.plugins import send_slices

        super().__init__(out, query, input, nullable(function.returns))
        self.function = function
        self._send_slices = send_slices
        self.stage = hub.stage(
            function.plugin,
            input.schema,
            function.returns,
            timeout=function.timeout,
            max_in_flight=function.max_in_flight,
            label=f"FUNCTION {function.name}",
        )
        # per event in arrival order: a submitted batch's seq, or a deferred partition event
        self.events: deque[int | Callable[[], None]] = deque()
        self.hidden = Stream(f"{function.name}({input.name})", self.schema, input.partitions)
        self.output = self.hidden

    def emit(self, partition: str, batch: pa.RecordBatch | None) -> None:
        if batch is not None and batch.num_rows:
            self.rows_out += batch.num_rows
            self.out.push(self.hidden, partition, batch)

    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        for piece in self._send_slices(batch):  # each message under gRPC's default 4 MiB
            while self.stage.outstanding >= self.function.max_in_flight:  # backpressure
                self.pump(block=True)
            self.events.append(self.stage.submit(piece, partition))
        self.pump(block=False)

    def later(self, event: Callable[[], None]) -> None:
        if self.events:
            self.events.append(event)
        else:
            event()

    def on_end(self, partition: str) -> None:
        self.later(lambda: self.out.end(self.hidden, partition))

    def on_partition(self, partition: str) -> None:
        self.later(lambda: self.out.add_partition(self.hidden, partition))

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        self.later(lambda: self.out.advance(self.hidden, partition, watermark_ns))

    def on_backlog(self, partition: str, backlog: bool) -> None:
        self.later(lambda: self.out.set_backlog(self.hidden, partition, backlog))

    def pump(self, *, block: bool) -> None:
        """Emit what is ready at the head; with ``block``, wait until at least the head batch's
        result is in (retrying meanwhile; :meth:`Collector.plugin_wait` sees the wait)."""
        if block and self.events and isinstance(self.events[0], int):
            while not self.stage.wait(0.2):
                self.out.plugin_wait(self, self.stage.waiting_for())
            self.out.plugin_wait(self, None)
        results = {seq: (partition, batch) for seq, partition, batch in self.stage.ready()}
        pending = dict(results)
        while self.events:
            head = self.events[0]
            if isinstance(head, int):
                if head not in pending:
                    break
                partition, batch = pending.pop(head)
                self.events.popleft()
                try:
                    out = batch.cast(self.schema)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
                    raise QueryError(f"{self.stage.label}: a result cannot be read: {exc}") from exc
                self.emit(partition, out)
            else:
                self.events.popleft()
                head()
        assert not pending, "results arrive in order"

    def on_barrier(self) -> None:
        """Wait for every batch sent so far and emit the results (a barrier, the end of input)."""
        while self.events:
            self.pump(block=True)

    def on_tick(self, *, periodic: bool) -> None:
        """Emit the results that came in meanwhile (at the periodic tick)."""
        if periodic:
            self.pump(block=False)

    ticks_often = True  # plugin results are emitted at ticks while the sources are quiet

    def waiting_for(self) -> str | None:
        return self.stage.waiting_for()

    def error(self) -> tuple[str, str] | None:
        error = self.stage.error or self.stage.hub.last_error(self.function.plugin)
        return (self.function.name, error) if error is not None else None

    def close(self) -> None:
        self.stage.close()


def _table_name(name: str) -> str:
    return f"__table_{name}"


def _row_sql(query: QueryDef, input_name: str) -> str:
    """The per-row query as DataFusion SQL: the stream reads ``__input``, each static table
    ``__table_<name>`` (aliased back to the name written); identifiers are quoted, so names are
    case-sensitive as written."""
    select = query.select.copy()
    with_ = select.args.get("with_") or select.args.get("with")
    ctes = {c.alias_or_name for c in with_.expressions} if with_ is not None else set()

    def fix(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Table):
            return node
        alias = node.args.get("alias")
        if isinstance(node.this, exp.Anonymous):  # LATE(x) or f(x): the only stream of the query
            internal = _INPUT
        else:
            name = str(node.this.name)
            if name in ctes:
                return node
            if name == input_name:
                internal = _INPUT
            elif name in query.tables:
                internal = _table_name(name)
            else:
                return node
            if alias is None:
                alias = exp.TableAlias(this=exp.to_identifier(name))
        return exp.Table(this=exp.to_identifier(internal, quoted=True), alias=alias)

    return str(select.transform(fix).sql(dialect="postgres", identify=True))


def check_row_columns(query: QueryDef, input: Stream, tables: dict[str, pa.Table]) -> None:
    """Check that every column a per-row query names exists in the relation it reads: the stream
    or a joined static table (by name or alias, or unqualified in any of them).

    Queries reading a CTE or a subquery are left to DataFusion.

    Raises:
        PipelineSQLError: the first unknown column, with the nearest name and its position.
    """
    select = query.select
    if select.args.get("with_") or select.args.get("with"):
        return
    from_ = select.args.get("from_") or select.args.get("from")
    items = [from_.this] if from_ is not None else []
    items += [join.this for join in select.args.get("joins") or []]
    scope: dict[str, tuple[str, list[str]]] = {}  # name or alias -> (what, columns)
    for item in items:
        if not isinstance(item, exp.Table):
            return
        if isinstance(item.this, exp.Anonymous):  # LATE(x) or f(x): the stream
            what, names = input.name, input.schema.names
        else:
            what = str(item.this.name)
            names = tables[what].schema.names if what in tables else input.schema.names
            scope[what] = (what, names)
        if item.alias:
            scope[item.alias] = (what, names)
    if not scope:
        return
    aliases = {e.alias for e in select.expressions if isinstance(e, exp.Alias)}
    everything = [n for _, names in scope.values() for n in names]
    for column in select.find_all(exp.Column):
        if isinstance(column.this, exp.Star) or column.parent_select is not select:
            continue
        qualifier = column.table
        if qualifier:
            if qualifier not in scope:
                continue  # DataFusion names the unknown table
            what, names = scope[qualifier]
            if column.name not in names:
                raise unknown_column(column.name, names, what, column)
        elif column.name not in everything and column.name not in aliases:
            whats = sorted({w for w, _ in scope.values()})
            where = whats[0] if len(whats) == 1 else " or ".join(whats)
            raise unknown_column(column.name, list(dict.fromkeys(everything)), where, column)
