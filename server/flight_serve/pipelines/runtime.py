"""Running a :class:`~flight_serve.pipelines.pipeline.PipelinePlan` in this process (embedded).

:class:`PipelineRuntime` opens the connectors, builds one operator per query and pushes batches
through them:

* every **file** of a source is a watermark partition; all are registered with every windowed
  operator that reads the source (directly or through per-row views) before any is read, then the
  files are read round-robin, one batch each in turn (DESIGN §4). A file's end is its partition's
  end of input. In an embedded run every partition has unread backlog until it ends, so
  ``idle_timeout`` never marks one idle;
* a **windowed** query is a :class:`~flight_serve.engine.operator.WindowOperator`. Its output is a
  stream with one partition, so a windowed query reading it keeps its own watermark, computed from
  the rows it receives (their time column, ``window_end`` typically, never decreases), and never
  judges the first stage's rows against the first stage's watermark. Its late side output is the
  stream ``LATE(<input or view>)``;
* a **per-row** query (filter, projection, join with static tables) runs through DataFusion once per
  input batch; its output keeps the batch's partition;
* a **sink** receives every batch inserted into it, as it is produced.

Static tables are read once, in full, before the first source batch.

Errors: building raises :class:`~flight_serve.errors.PipelineSQLError` with the line and column of
the statement at fault (a missing file, a bad option, a column the input lacks, SQL DataFusion
cannot plan); running raises :class:`~flight_serve.errors.ConnectorError` (a file that cannot be
read) or :class:`~flight_serve.errors.QueryError` (DataFusion fails on a batch).
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import datafusion
import pyarrow as pa
import sqlglot
from sqlglot import exp

from flight_serve.connectors.falkordb import FALKORDB_OPTIONS, FalkorDBSink
from flight_serve.connectors.file import DEFAULT_BATCH_ROWS, FileSink, FileSource, resolve_paths
from flight_serve.connectors.flight import (
    DEFAULT_SERVER,
    FlightClientAuth,
    FlightSink,
    FlightSource,
    FlightTicketSource,
    SourceEvent,
    server_uri_problem,
)
from flight_serve.connectors.iceberg import IcebergSource, default_catalog_properties
from flight_serve.connectors.stdout import StdoutSink
from flight_serve.engine.operator import Emission, WindowOperator
from flight_serve.engine.sqlguard import check_sql
from flight_serve.engine.windows import (
    CalendarWindow,
    CumulateWindow,
    HoppingWindow,
    SessionWindow,
    TumblingWindow,
    WindowSpec,
)
from flight_serve.errors import ConnectorError, FlightServeError, PipelineSQLError, QueryError
from flight_serve.pipelines.dialect import position, sql_error
from flight_serve.pipelines.graph_io import graph_sink_options
from flight_serve.pipelines.iceberg_io import SINK_OPTIONS as ICEBERG_SINK_OPTIONS
from flight_serve.pipelines.iceberg_io import SOURCE_OPTIONS as ICEBERG_SOURCE_OPTIONS
from flight_serve.pipelines.iceberg_io import (
    IcebergRunSink,
    IcebergSinkSpec,
    catalog_of,
    iceberg_sink_spec,
    iceberg_source,
    is_catalog_option,
)
from flight_serve.pipelines.pipeline import (
    FunctionDef,
    Option,
    PipelinePlan,
    QueryDef,
    RelationDef,
    SinkDef,
)
from flight_serve.pipelines.plugins import PluginHub, send_slices
from flight_serve.pipelines.query import QueryOptions, did_you_mean, unknown_column
from flight_serve.store.streams import data_dir_holder
from flight_serve.types import MAX_WATERMARK_NS, timedelta_to_ns

__all__ = ["CONNECTORS", "PipelineRuntime", "RunSummary"]

#: Options of a ``flight`` connector with a ``server``: TLS trust and identity, bearer token.
FLIGHT_AUTH_OPTIONS: tuple[str, ...] = ("tls_ca", "tls_cert", "tls_key", "token_env")
#: Connectors of embedded runs and the options each takes, by role.
CONNECTORS: dict[str, dict[str, tuple[str, ...]]] = {
    "source": {
        "file": ("connector", "path", "format", "batch_rows", "delimiter"),
        "flight": (
            "connector",
            "server",
            "stream",
            "start_offset",
            "stop_at_end",
            "ticket",
            "ticket_base64",
            *FLIGHT_AUTH_OPTIONS,
        ),
        "iceberg": ICEBERG_SOURCE_OPTIONS,
    },
    "table": {"file": ("connector", "path", "format", "delimiter")},
    "sink": {
        "file": ("connector", "path", "format"),
        "stdout": ("connector", "format"),
        "falkordb": FALKORDB_OPTIONS,
        "flight": ("connector", "server", "stream", "writer", *FLIGHT_AUTH_OPTIONS),
        "iceberg": ICEBERG_SINK_OPTIONS,
    },
}
#: Connectors of DESIGN §5 that only the server will run.
_SERVER_CONNECTORS = ("falkordb", "plugin")
#: How often (seconds) windowed queries re-check idle partitions while a live source is quiet:
#: a quarter of the smallest ``idle_timeout``, within these bounds.
_TICK_BOUNDS_S = (0.01, 0.5)
_EXTENSION = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}
_INPUT = "__input"


@dataclass(frozen=True)
class RunSummary:
    """What a run wrote.

    Attributes:
        rows: rows written per sink.
        targets: where each sink wrote (a file path, or ``stdout``).
        late_rows: rows each windowed query sent to its late side output (every reason), by label.
    """

    rows: dict[str, int]
    targets: dict[str, str]
    late_rows: dict[str, int]


def _duration(value: timedelta | None) -> str:
    """``1h``, ``15m``, ``90s``, ``250ms``, …: the largest unit that divides the value."""
    if value is None:
        return "none"
    ns = timedelta_to_ns(value)
    if ns == 0:
        return "0s"
    for unit, size in (
        ("d", 86_400 * 10**9),
        ("h", 3_600 * 10**9),
        ("m", 60 * 10**9),
        ("s", 10**9),
        ("ms", 10**6),
        ("us", 10**3),
    ):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def _columns_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _one_batch(table: pa.Table) -> pa.RecordBatch | None:
    if not table.num_rows:
        return None
    batches = table.combine_chunks().to_batches()
    return batches[0]


def _same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(x.type == y.type for x, y in zip(a, b, strict=True))


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def _describe_window(spec: WindowSpec, time_column: str) -> str:
    t = time_column
    if isinstance(spec, TumblingWindow):
        return (
            f"TUMBLE size {_duration(spec.size)} offset {_duration(spec.offset)}: one window per "
            f"row, window_start = {t} - (({t} - offset) mod size)"
        )
    if isinstance(spec, HoppingWindow):
        return (
            f"HOP size {_duration(spec.size)} slide {_duration(spec.slide)} offset "
            f"{_duration(spec.offset)}: windows start at offset + k*slide; a row belongs to every "
            f"window [s, s + size) holding {t} (up to {spec.windows_per_row})"
        )
    if isinstance(spec, SessionWindow):
        return (
            f"SESSION gap {_duration(spec.gap)} per key: each row opens [{t}, {t} + gap); "
            "overlapping sessions of a key merge into [first, last + gap)"
        )
    if isinstance(spec, CumulateWindow):
        return (
            f"CUMULATE step {_duration(spec.step)} max_size {_duration(spec.max_size)} offset "
            f"{_duration(spec.offset)}: windows [p, p + k*step) within each max_size period p"
        )
    assert isinstance(spec, CalendarWindow)
    return (
        f"TUMBLE one calendar {spec.unit} in {spec.time_zone}: from local midnight to the next "
        "(23 or 25 hours across a DST change)"
    )


def _pretty_sql(sql: str) -> str:
    try:
        return str(sqlglot.parse_one(sql).sql(pretty=True))
    except sqlglot.errors.SqlglotError:
        return sql


def _partial_sql(merge_sql: str) -> str:
    """The per-batch partial aggregation: the right side of the merge's ``UNION ALL``."""
    try:
        union = sqlglot.parse_one(merge_sql).find(exp.Union)
    except sqlglot.errors.SqlglotError:
        union = None
    if union is None or union.expression is None:
        return merge_sql
    return str(union.expression.sql(pretty=True))


def _indent(text: str, spaces: int = 4) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


class LiveSource(Protocol):
    """What the run loop needs of a live source: :class:`~flight_serve.connectors.flight.FlightSource`
    (a stream over Flight), or a server pipeline's stream read from the store directly."""

    schema: pa.Schema
    partitions: tuple[str, ...]
    initial_watermarks: dict[str, int]
    server: str
    stream: str
    start_offset: int
    stop_at_end: bool
    end_offset: int

    @property
    def done(self) -> bool: ...

    @property
    def backlog(self) -> bool: ...

    def start(self) -> None: ...

    def poll(self, timeout_s: float, max_entries: int = 64) -> list[SourceEvent]: ...

    def close(self) -> None: ...


# --- the graph --------------------------------------------------------------------------------


@dataclass
class _Stream:
    """A stream inside the run: a source, a view, or a late side output."""

    name: str
    schema: pa.Schema
    partitions: tuple[str, ...]
    consumers: list[_Node] = field(default_factory=list)


@dataclass
class _Sink:
    definition: SinkDef
    connector: str
    format: str
    path: Path | None
    schema: pa.Schema | None = None
    #: falkordb sinks: the options (text), and the writer of an unchecked run
    graph: dict[str, str] | None = None
    graph_writer: FalkorDBSink | None = None
    fed_by: list[str] = field(default_factory=list)
    writer: FileSink | StdoutSink | FlightSink | IcebergRunSink | None = None
    rows: int = 0
    #: flight sinks: (server, stream, writer), and how to authenticate there
    flight: tuple[str, str, str] | None = None
    flight_auth: FlightClientAuth | None = None
    #: iceberg sinks: the checked options
    iceberg: IcebergSinkSpec | None = None

    @property
    def target(self) -> str:
        if self.graph is not None:
            return f"falkordb graph {self.graph.get('graph') or self.definition.name}"
        if self.iceberg is not None:
            return f"iceberg table {self.iceberg.table}"
        if self.flight is not None:
            server, stream, writer = self.flight
            return f"{server} stream {stream} (writer {writer})"
        return str(self.path) if self.path is not None else "stdout"


class _Node(ABC):
    """One query of the run; subclasses say what it does with a batch."""

    def __init__(
        self, runtime: PipelineRuntime, query: QueryDef, input: _Stream, schema: pa.Schema
    ) -> None:
        self.runtime = runtime
        self.query = query
        self.input = input
        self.schema = schema
        self.output: _Stream | None = None
        input.consumers.append(self)

    def start(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called once before the first source batch."""

    @abstractmethod
    def on_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        """One input batch of ``partition``."""

    @abstractmethod
    def on_end(self, partition: str) -> None:
        """End of input of ``partition``."""

    def on_partition(self, partition: str) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """A partition that appeared after the start (a new writer of a live source)."""

    def on_watermark(self, partition: str, watermark_ns: int) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """An explicit watermark of ``partition`` (a writer's watermark marker)."""

    def on_backlog(self, partition: str, backlog: bool) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Whether ``partition`` has unread input (then it is never idle)."""

    def emit(self, partition: str, batch: pa.RecordBatch | None) -> None:
        if batch is None or not batch.num_rows:
            return
        if self.query.sink is not None:
            self.runtime.deliver(self.query.sink, batch)
        if self.output is not None:
            self.runtime.push(self.output, partition, batch)


class _WindowNode(_Node):
    def __init__(
        self, runtime: PipelineRuntime, query: QueryDef, input: _Stream, op: WindowOperator
    ) -> None:
        super().__init__(runtime, query, input, op.output_schema)
        self.op = op
        self.late: _Stream | None = None
        self.finished = False
        self.partition = query.view or f"query {query.index + 1}"

    def start(self) -> None:
        for partition in self.input.partitions:
            self.op.add_partition(partition)
            self.op.set_backlog(partition, True)  # embedded: unread input until it ends

    def on_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        self.handle(self.op.process(batch, partition=partition))

    def on_end(self, partition: str) -> None:
        self.op.set_backlog(partition, False)
        self.handle(self.op.finish(partition))

    def on_partition(self, partition: str) -> None:
        self.op.add_partition(partition)

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        self.handle(self.op.advance_watermark(partition, watermark_ns))

    def on_backlog(self, partition: str, backlog: bool) -> None:
        self.op.set_backlog(partition, backlog)

    def tick(self) -> None:
        """Re-evaluate idle partitions now (live sources) and fire what that closes."""
        if not self.finished:
            self.handle(self.op.tick())

    def finish_all(self) -> None:
        if not self.finished:
            self.handle(self.op.finish())

    def handle(self, emission: Emission) -> None:
        self.emit(self.partition, _one_batch(emission.output))
        if self.late is not None:
            late = _one_batch(emission.late)
            if late is not None:
                self.runtime.push(self.late, self.late.partitions[0], late)
        if emission.watermark_ns == MAX_WATERMARK_NS and not self.finished:
            self.finished = True
            if self.output is not None:
                self.runtime.end(self.output, self.partition)
            if self.late is not None:
                self.runtime.end(self.late, self.late.partitions[0])


class _RowNode(_Node):
    def __init__(
        self,
        runtime: PipelineRuntime,
        query: QueryDef,
        input: _Stream,
        tables: dict[str, pa.Table],
    ) -> None:
        self.ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(1))
        for name in query.tables:
            table = tables[name]
            batches = table.to_batches() or [pa.RecordBatch.from_pylist([], table.schema)]
            self.ctx.register_record_batches(_table_name(name), [batches])
        self.sql = _row_sql(query, input.name)
        check_sql(self.sql)  # DataFusion would crash on a deeply nested expression
        self.label = query.label
        empty = pa.RecordBatch.from_pylist([], input.schema)
        try:
            schema = _nullable(self.run_sql(empty).schema)
        except QueryError as exc:  # its message starts with the label already
            said = " ".join(str(exc).split())  # DataFusion's message is on several lines
            raise sql_error(said, query.select) from None
        super().__init__(runtime, query, input, schema)

    def run_sql(self, batch: pa.RecordBatch) -> pa.Table:
        self.ctx.register_record_batches(_INPUT, [[batch]])
        try:
            return self.ctx.sql(self.sql).to_arrow_table()
        except Exception as exc:  # DataFusion raises generic exceptions: wrap them
            raise QueryError(f"{self.label}: {exc}") from exc
        finally:
            self.ctx.deregister_table(_INPUT)

    def on_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.emit(partition, _one_batch(self.run_sql(batch).cast(self.schema)))

    def on_end(self, partition: str) -> None:
        if self.output is not None:
            self.runtime.end(self.output, partition)

    # a per-row query keeps its input's partitions: pass their progress on
    def on_partition(self, partition: str) -> None:
        if self.output is not None:
            self.runtime.add_partition(self.output, partition)

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        if self.output is not None:
            self.runtime.advance(self.output, partition, watermark_ns)

    def on_backlog(self, partition: str, backlog: bool) -> None:
        if self.output is not None:
            self.runtime.set_backlog(self.output, partition, backlog)


class _PluginNode(_Node):
    """``<f>(<stream>)``: every batch goes through an attached plugin (a
    :class:`~flight_serve.pipelines.plugins.PluginStage`); its results go on, in the order the
    batches came, to the query's hidden stream ``<f>(<stream>)``, which the per-row query reads.
    Partition events (end, watermark, new partition, backlog) wait behind the batches sent
    before them, so downstream operators see the same sequence as without the plugin.
    """

    def __init__(
        self,
        runtime: PipelineRuntime,
        query: QueryDef,
        input: _Stream,
        function: FunctionDef,
        hub: PluginHub,
    ) -> None:
        super().__init__(runtime, query, input, _nullable(function.returns))
        self.function = function
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
        self.hidden = _Stream(f"{function.name}({input.name})", self.schema, input.partitions)
        self.output = self.hidden

    def emit(self, partition: str, batch: pa.RecordBatch | None) -> None:
        if batch is not None and batch.num_rows:
            self.runtime.push(self.hidden, partition, batch)

    def on_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        for piece in send_slices(batch):  # each message under gRPC's default 4 MiB
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
        self.later(lambda: self.runtime.end(self.hidden, partition))

    def on_partition(self, partition: str) -> None:
        self.later(lambda: self.runtime.add_partition(self.hidden, partition))

    def on_watermark(self, partition: str, watermark_ns: int) -> None:
        self.later(lambda: self.runtime.advance(self.hidden, partition, watermark_ns))

    def on_backlog(self, partition: str, backlog: bool) -> None:
        self.later(lambda: self.runtime.set_backlog(self.hidden, partition, backlog))

    def pump(self, *, block: bool) -> None:
        """Emit what is ready at the head; with ``block``, wait until at least the head batch's
        result is in (retrying meanwhile; :meth:`PipelineRuntime.plugin_wait` sees the wait)."""
        if block and self.events and isinstance(self.events[0], int):
            while not self.stage.wait(0.2):
                self.runtime.plugin_wait(self, self.stage.waiting_for())
            self.runtime.plugin_wait(self, None)
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

    def drain(self) -> None:
        """Wait for every batch sent so far and emit the results (a barrier, the end of input)."""
        while self.events:
            self.pump(block=True)

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


def check_row_columns(query: QueryDef, input: _Stream, tables: dict[str, pa.Table]) -> None:
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


# --- the runtime ------------------------------------------------------------------------------


class PipelineRuntime:
    """One run of a pipeline: connectors opened, operators built (see the module docstring).

    Args:
        plan: the parsed pipeline.
        output_dir: where relative sink paths start (default: the working directory).
        load_tables: read static tables now (``False`` for :meth:`explain`, which only needs
            their schemas).
        plugins: the server's plugin hub, for ``CREATE FUNCTION … (connector = 'plugin')``
            (``None``: such functions are refused, as in embedded runs, except by
            :meth:`explain`, which builds them without a server).

    Raises:
        PipelineSQLError: a connector option, a file, a column or a query that cannot work,
            with the line and column of the statement at fault.

    A runtime runs once: call :meth:`run` (or only :meth:`explain`).
    """

    def __init__(
        self,
        plan: PipelinePlan,
        *,
        output_dir: Path | None = None,
        load_tables: bool = True,
        plugins: PluginHub | None = None,
        data_dir: Path | None = None,
        clock_ns: Callable[[], int] | None = None,
        wall_clock_ns: Callable[[], int] | None = None,
    ) -> None:
        self.plan = plan
        #: processing time (monotonic ns) of the run loop and of every windowed query's idle
        #: timeouts, and wall-clock time (ns since the epoch); injectable for tests
        self.clock_ns: Callable[[], int] = clock_ns or time.monotonic_ns
        self.wall_clock_ns: Callable[[], int] = wall_clock_ns or time.time_ns
        self._writes = load_tables  # explain builds the plan only: it writes nothing
        #: where the embedded Iceberg catalog lives (``<output_dir>/flight-data`` by default)
        self.data_dir = (
            data_dir if data_dir is not None else (output_dir or Path.cwd()) / "flight-data"
        )
        if plugins is None and not load_tables:  # explain: plugin stages are built, never run
            plugins = PluginHub()
        self.plugins = plugins
        #: "waiting for plugin <name>" while a plugin stage waits for an instance, else None
        self.waiting: str | None = None
        #: why a connector retries its server now (a remote sink's server down), else None
        self.connector_waiting: str | None = None
        #: told when a connector starts waiting for its server (why) and when no connector
        #: waits any more (``None``); called from the connector's thread (the CLI prints it)
        self.on_wait: Callable[[str | None], None] | None = None
        self.output_dir = output_dir if output_dir is not None else Path.cwd()
        self.streams: dict[str, _Stream] = {}
        self.sources: dict[str, FileSource] = {}
        self.flight_sources: dict[str, LiveSource] = {}
        self.table_sources: dict[str, FileSource] = {}
        self.tables: dict[str, pa.Table] = {}
        self.nodes: list[_Node] = []
        self.late_streams: dict[int, _Stream] = {}
        self.sinks: dict[str, _Sink] = {}
        self._pending: deque[tuple[str, pa.RecordBatch]] = deque()
        self._collect = False
        self._ran = False
        for relation in plan.tables.values():
            source = self._file_source(relation, "table")
            self.table_sources[relation.name] = source
            try:
                self.tables[relation.name] = (
                    source.read_all() if load_tables else source.schema.empty_table()
                )
            except ConnectorError as exc:
                raise sql_error(f"CREATE TABLE {relation.name}: {exc}", relation.node.this) from exc
        for relation in plan.sources.values():
            kind = self._connector(relation.connector, "source", f"SOURCE {relation.name}")
            if kind in ("flight", "iceberg"):
                live = (
                    self._flight_source(relation)
                    if kind == "flight"
                    else self._iceberg_source(relation)
                )
                self.flight_sources[relation.name] = live
                self.streams[relation.name] = _Stream(relation.name, live.schema, live.partitions)
                continue
            source = self._file_source(relation, "source")
            self.sources[relation.name] = source
            try:
                schema = source.schema
            except ConnectorError as exc:
                raise sql_error(
                    f"CREATE SOURCE {relation.name}: {exc}", relation.node.this
                ) from exc
            if (
                relation.time_column is not None
                and schema.get_field_index(relation.time_column) < 0
            ):
                raise relation.no_time_column(schema.names, f"the files of {relation.name}")
            self.streams[relation.name] = _Stream(relation.name, schema, source.partitions)
        for sink in plan.sinks.values():
            self.sinks[sink.name] = self._sink(sink)
        self._build_queries()

    # --- building -----------------------------------------------------------------------------

    def _connector(self, options: dict[str, Option], role: str, what: str) -> str:
        option = options["connector"]
        name = option.text.lower()
        available = CONNECTORS[role]
        if name not in available:
            if name in _SERVER_CONNECTORS or (role != "sink" and name == "stdout"):
                raise option.error(
                    f"connector {name!r} cannot be a {role} of an embedded run; use "
                    f"{' or '.join(repr(c) for c in available)}"
                )
            raise option.error(
                f"unknown connector {name!r} for a {role}{did_you_mean(name, list(available))} "
                f"(use {' or '.join(repr(c) for c in available)})"
            )
        for key, extra in options.items():
            if key not in available[name] and not (name == "iceberg" and is_catalog_option(key)):
                raise extra.unknown(f"the {name} connector of {what}", available[name])
        return name

    def _file_source(self, relation: RelationDef, role: str) -> FileSource:
        what = f"{role.upper()} {relation.name}"
        self._connector(relation.connector, role, what)
        options = relation.connector
        if "path" not in options:
            raise sql_error(
                f"{what} needs WITH (path = '<file, directory or glob>')", relation.node
            )
        batch_rows = self.plan.batch_rows or DEFAULT_BATCH_ROWS
        if "batch_rows" in options:
            option = options["batch_rows"]
            try:
                batch_rows = int(option.text)
            except ValueError:
                raise option.error(f"expected a whole number, got {option.text!r}") from None
        try:
            paths = resolve_paths(options["path"].text, self.plan.base_dir)
        except ConnectorError as exc:
            raise options["path"].error(str(exc)) from exc
        try:
            return FileSource(
                paths,
                options["format"].text if "format" in options else None,
                batch_rows=batch_rows,
                schema=relation.columns,
                delimiter=options["delimiter"].text if "delimiter" in options else ",",
                base_dir=self.plan.base_dir,
            )
        except ConnectorError as exc:
            raise sql_error(f"{what}: {exc}", relation.node.this) from exc

    def flight_auth(self, options: dict[str, Option]) -> FlightClientAuth | None:
        """The ``tls_ca``, ``tls_cert`` / ``tls_key`` (PEM files; relative paths start at the
        pipeline's directory) and ``token_env`` (the name of an environment variable of the
        process running the pipeline that holds a bearer token) options of a ``flight``
        connector; ``None`` if none is given.

        Raises:
            PipelineSQLError: such an option without ``server``, ``tls_cert`` without
                ``tls_key`` (or the reverse), a file that cannot be read, an unset variable.
        """
        given = [key for key in FLIGHT_AUTH_OPTIONS if key in options]
        if not given:
            return None
        if "server" not in options:
            raise options[given[0]].error(
                f"{given[0]} is for another server: give its server = 'grpc+tls://host:port' too"
            )
        if ("tls_cert" in options) != ("tls_key" in options):
            key = "tls_cert" if "tls_cert" in options else "tls_key"
            raise options[key].error("tls_cert and tls_key go together (mutual TLS)")
        pem: dict[str, str] = {}
        for key in ("tls_ca", "tls_cert", "tls_key"):
            if key in options:
                path = Path(options[key].text).expanduser()
                path = path if path.is_absolute() else self.plan.base_dir / path
                try:
                    pem[key] = path.read_text()
                except (OSError, UnicodeDecodeError) as exc:
                    raise options[key].error(f"cannot read {path}: {exc}") from None
        token = None
        if "token_env" in options:
            name = options["token_env"].text
            token = os.environ.get(name)
            if not token:
                raise options["token_env"].error(
                    f"the environment variable {name} (the bearer token) is not set or empty"
                )
        return FlightClientAuth(pem.get("tls_ca"), pem.get("tls_cert"), pem.get("tls_key"), token)

    def _server(self, options: dict[str, Option]) -> str:
        """The ``server`` option of a flight connector (default :data:`DEFAULT_SERVER`).

        Raises:
            PipelineSQLError: not a Flight URI (``http://…``), pointing at the value.
        """
        if "server" not in options:
            return DEFAULT_SERVER
        problem = server_uri_problem(options["server"].text)
        if problem is not None:
            raise options["server"].error(problem)
        return options["server"].text

    def _ticket(self, relation: RelationDef) -> bytes | None:
        """The ``ticket`` (UTF-8 text) or ``ticket_base64`` option of a flight source."""
        options = relation.connector
        if "ticket" in options and "ticket_base64" in options:
            raise options["ticket_base64"].error("give ticket or ticket_base64, not both")
        for key in ("stream", "start_offset", "stop_at_end"):
            if key in options and ("ticket" in options or "ticket_base64" in options):
                raise options[key].error(f"a ticket source takes no {key} (it reads one DoGet)")
        if "ticket" in options:
            return options["ticket"].text.encode()
        if "ticket_base64" in options:
            option = options["ticket_base64"]
            try:
                return base64.b64decode(option.text, validate=True)
            except binascii.Error as exc:
                raise option.error(f"not base64: {exc}") from None
        return None

    def _ticket_source(self, relation: RelationDef, ticket: bytes, rows: int) -> LiveSource:
        options = relation.connector
        server = self._server(options)
        try:
            source = FlightTicketSource(
                server,
                ticket,
                name=relation.name,
                schema=relation.columns,
                start_rows=rows,
                auth=self.flight_auth(options),
            )
        except ConnectorError as exc:
            raise sql_error(f"SOURCE {relation.name}: {exc}", relation.node.this) from exc
        source.on_retry = self.connector_wait  # its retries show in the pipeline's status
        if (
            relation.time_column is not None
            and source.schema.get_field_index(relation.time_column) < 0
        ):
            source.close()
            raise relation.no_time_column(source.schema.names, "the DoGet")
        return source

    def _flight_source(self, relation: RelationDef, start_offset: int | None = None) -> LiveSource:
        """A ``flight`` source: a ticket's DoGet, or a stream's tail from ``start_offset``
        (default: the ``start_offset`` option, else 0)."""
        options = relation.connector
        ticket = self._ticket(relation)
        if ticket is not None:
            return self._ticket_source(relation, ticket, 0)
        resume_at = start_offset
        server = self._server(options)
        stream = options["stream"].text if "stream" in options else relation.name
        start_offset = 0
        if "start_offset" in options:
            option = options["start_offset"]
            try:
                start_offset = int(option.text)
            except ValueError:
                raise option.error(f"expected a whole number, got {option.text!r}") from None
            if start_offset < 0:
                raise option.error(f"must be at least 0, got {start_offset}")
        stop_at_end = False
        if "stop_at_end" in options:
            option = options["stop_at_end"]
            if option.text.lower() not in ("true", "false"):
                raise option.error(f"expected 'true' or 'false', got {option.text!r}")
            stop_at_end = option.text.lower() == "true"
        try:
            source = FlightSource(
                server,
                stream,
                schema=relation.columns,
                start_offset=start_offset if resume_at is None else resume_at,
                stop_at_end=stop_at_end,
                auth=self.flight_auth(options),
            )
        except ConnectorError as exc:
            raise sql_error(f"SOURCE {relation.name}: {exc}", relation.node.this) from exc
        source.on_retry = self.connector_wait  # its wait for its server shows in the status
        if (
            relation.time_column is not None
            and source.schema.get_field_index(relation.time_column) < 0
        ):
            source.close()
            raise relation.no_time_column(source.schema.names, f"stream {stream}")
        return source

    def _iceberg_source(self, relation: RelationDef) -> LiveSource:
        """An Iceberg table as a live source (:mod:`~flight_serve.pipelines.iceberg_io`)."""
        return iceberg_source(
            relation, self.data_dir, batch_rows=self.plan.batch_rows or DEFAULT_BATCH_ROWS
        )

    def _sink(self, sink: SinkDef) -> _Sink:
        what = f"SINK {sink.name}"
        connector = self._connector(sink.connector, "sink", what)
        options = sink.connector
        fmt = options["format"].text.lower() if "format" in options else None
        if connector == "iceberg":
            if (
                self._writes
                and not self._store_backed()
                and catalog_of(options, self.data_dir)[1]
                == default_catalog_properties(self.data_dir)
                and (holder := data_dir_holder(self.data_dir)) is not None
            ):
                raise options["connector"].error(
                    f"{what}: the embedded Iceberg catalog of {self.data_dir} belongs to a "
                    f"running server ({holder} holds the data dir): a run in this process "
                    "never writes into a server's data dir. Submit the pipeline to that server "
                    "(flight-serve submit), or run it with another --output-dir (its catalog "
                    "is <output-dir>/flight-data) or a catalog_uri of its own"
                )
            spec = iceberg_sink_spec(sink, self.data_dir)
            return _Sink(sink, connector, "iceberg", None, iceberg=spec)
        if connector == "falkordb":
            return _Sink(sink, connector, "graph", None, graph=graph_sink_options(sink))
        if connector == "stdout":
            return _Sink(sink, connector, fmt or "table", None)
        if connector == "flight":
            if "server" not in options and self._writes and not self._store_backed():
                raise options["connector"].error(
                    f"{what}: a run in this process writes only into a server the pipeline "
                    f"names: add server = '{DEFAULT_SERVER}' (the server's Flight URI) to the "
                    "sink. Submitted to a server (flight-serve submit), a flight sink without "
                    "a server option writes that server's own stream"
                )
            server = self._server(options)
            stream = options["stream"].text if "stream" in options else sink.name
            writer = options["writer"].text if "writer" in options else sink.name
            return _Sink(
                sink,
                connector,
                "arrow",
                None,
                flight=(server, stream, writer),
                flight_auth=self.flight_auth(options),
            )
        if "path" in options:
            path = Path(options["path"].text).expanduser()
            path = path if path.is_absolute() else self.output_dir / path
            if fmt is None:
                fmt = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}.get(
                    path.suffix.lower()
                )
        elif fmt is not None:
            path = self.output_dir / f"{sink.name}.{_EXTENSION.get(fmt, fmt)}"
        else:
            raise sql_error(
                f"{what} needs WITH (format = …) or a path with an extension", sink.node
            )
        if fmt not in _EXTENSION:
            where = options["format"] if "format" in options else options["path"]
            raise where.error(f"the file sink writes parquet, csv or jsonl, not {fmt!r}")
        return _Sink(sink, connector, fmt, path)

    def _store_backed(self) -> bool:
        """Whether ``flight`` connectors without a ``server`` option are a server's own
        streams (a pipeline inside the server); an embedded run is not."""
        return False

    def _build_queries(self) -> None:
        pending = list(self.plan.queries)
        while pending:
            ready = [q for q in pending if self._input_of(q) is not None]
            if not ready:  # the planner rules this out (inputs are declared above)
                raise PipelineSQLError(
                    f"cannot order the queries: {', '.join(q.label for q in pending)}"
                )
            for query in ready:
                self._build(query)
                pending.remove(query)

    def _input_of(self, query: QueryDef) -> _Stream | None:
        if query.late_of is not None:
            return self.late_streams.get(query.late_of)
        return self.streams.get(query.input)

    def _build(self, query: QueryDef) -> None:
        input = self._input_of(query)
        assert input is not None
        node: _Node
        if query.window is not None:
            try:
                op = query.window.build(
                    input.schema, clock_ns=self.clock_ns, wall_clock_ns=self.wall_clock_ns
                )
            except PipelineSQLError:  # a column of the query, with its own position
                raise
            except FlightServeError as exc:
                func = query.select.args["from_"].this.this
                raise sql_error(f"{query.label}: {exc}", func) from exc
            node = _WindowNode(self, query, input, op)
            if any(q.late_of == query.index for q in self.plan.queries):
                name = f"LATE({query.view or query.input})"
                node.late = self.late_streams[query.index] = _Stream(name, op.late_schema, (name,))
            partitions: tuple[str, ...] = (node.partition,)
        else:
            if query.function is not None:
                input = self._plugin_stage(query, input)
            check_row_columns(query, input, self.tables)
            node = _RowNode(self, query, input, self.tables)
            partitions = input.partitions
        if query.view is not None:
            node.output = self.streams[query.view] = _Stream(query.view, node.schema, partitions)
        if query.sink is not None:
            sink = self.sinks[query.sink]
            if sink.schema is None:
                sink.schema = node.schema
            elif not _same_columns(sink.schema, node.schema):
                raise sql_error(
                    f"{query.label}: its columns ({_columns_text(node.schema)}) differ from "
                    f"those {sink.fed_by[0]} inserts into {query.sink} "
                    f"({_columns_text(sink.schema)})",
                    query.select,
                )
            sink.fed_by.append(query.label)
            if sink.iceberg is not None and isinstance(node, _WindowNode):
                config = node.op.config
                try:
                    sink.iceberg = sink.iceberg.for_emit(
                        config.emit, config.key_columns, node.schema
                    )
                except ConnectorError as exc:
                    raise sql_error(f"{query.label}: {exc}", query.select) from exc
        self.nodes.append(node)

    def _plugin_stage(self, query: QueryDef, input: _Stream) -> _Stream:
        """The plugin node in front of ``query`` (``FROM <f>(<input>)``); its hidden stream."""
        assert query.function is not None
        function = self.plan.functions[query.function]
        if self.plugins is None:
            raise sql_error(
                f"FUNCTION {function.name}: plugins are attached to a server; submit the "
                "pipeline (flight-serve submit) instead of running it embedded",
                function.node.this,
            )
        node = _PluginNode(self, query, input, function, self.plugins)
        self.nodes.append(node)
        return node.hidden

    def plugin_wait(self, node: _PluginNode, waiting: str | None) -> None:
        """A plugin stage waits for a result (``waiting``: why, or ``None`` when it is over).
        Durable runs also stop here when asked to."""
        self.waiting = waiting

    def connector_wait(self, waiting: str | None) -> None:
        """A connector retries its server (``waiting``: why, or ``None`` once through)."""
        previous, self.connector_waiting = self.connector_waiting, waiting
        if self.on_wait is not None and (previous is None) != (waiting is None):
            self.on_wait(waiting)

    def plugin_waiting(self) -> str | None:
        """``waiting for plugin <name>`` while a plugin stage has batches and no instance that
        can take them (live; a stage blocked in a barrier included), else why a connector
        retries its server now (:meth:`connector_wait`), else ``None``."""
        if self.connector_waiting is not None:
            return self.connector_waiting
        for node in self.nodes:
            if isinstance(node, _PluginNode):
                waiting = node.stage.waiting_for()
                if waiting is not None:
                    return waiting
        return None

    def plugin_errors(self) -> dict[str, str]:
        """The last error of each plugin function's instances (a refused declaration, a wrong
        result schema, garbage, a timeout), by function name."""
        errors: dict[str, str] = {}
        for node in self.nodes:
            if isinstance(node, _PluginNode):
                error = node.stage.error or node.stage.hub.last_error(node.function.plugin)
                if error is not None:
                    errors[node.function.name] = error
        return errors

    def _drain_plugins(self) -> None:
        for node in self.nodes:
            if isinstance(node, _PluginNode):
                node.drain()

    # --- running ------------------------------------------------------------------------------

    def push(self, stream: _Stream, partition: str, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` of ``partition`` to every query reading ``stream``."""
        for node in stream.consumers:
            node.on_batch(partition, batch)

    def end(self, stream: _Stream, partition: str) -> None:
        """End of input of ``partition`` for every query reading ``stream``."""
        for node in stream.consumers:
            node.on_end(partition)

    def add_partition(self, stream: _Stream, partition: str) -> None:
        """A new partition of ``stream`` (a live source's new writer): it holds the watermark
        of every windowed query reading ``stream`` back from now on."""
        if partition not in stream.partitions:
            stream.partitions = (*stream.partitions, partition)
        for node in stream.consumers:
            node.on_partition(partition)

    def advance(self, stream: _Stream, partition: str, watermark_ns: int) -> None:
        """An explicit watermark of ``partition`` for every query reading ``stream``."""
        for node in stream.consumers:
            node.on_watermark(partition, watermark_ns)

    def set_backlog(self, stream: _Stream, partition: str, backlog: bool) -> None:
        """Whether ``partition`` of ``stream`` has unread input."""
        for node in stream.consumers:
            node.on_backlog(partition, backlog)

    def _live_event(self, stream: _Stream, event: SourceEvent) -> None:
        """Hand one event of a live (flight) source to the queries reading ``stream``."""
        if event.kind == "batch":
            assert event.batch is not None
            self.push(stream, event.partition, event.batch)
        elif event.kind == "partition":
            self.add_partition(stream, event.partition)
            self.set_backlog(stream, event.partition, self.flight_sources[stream.name].backlog)
        elif event.kind == "watermark":
            assert event.watermark_ns is not None
            self.advance(stream, event.partition, event.watermark_ns)
        elif event.kind == "end":
            self.end(stream, event.partition)
        else:  # backlog: the tail has unread entries, and they may hold any writer's rows
            for partition in stream.partitions:
                self.set_backlog(stream, partition, event.backlog)

    def _wake_ns(self, next_tick_ns: int) -> int:
        """When (``clock_ns``) the run loop re-checks its windowed queries next: the periodic
        tick, or earlier the instant a partition reaches ``last row + idle_timeout`` or (with
        ``idle_watermark_advance``) a window closes by the wall clock."""
        wake = next_tick_ns
        for node in self.nodes:
            if isinstance(node, _WindowNode) and not node.finished:
                due = node.op.next_wake_ns()
                if due is not None and due < wake:
                    wake = due
        return wake

    def _tick_s(self) -> float:
        timeouts = [
            n.op.config.idle_timeout.total_seconds()
            for n in self.nodes
            if isinstance(n, _WindowNode) and n.op.config.idle_timeout is not None
        ]
        low, high = _TICK_BOUNDS_S
        if any(isinstance(n, _PluginNode) for n in self.nodes):
            return low  # plugin results are emitted at ticks while the sources are quiet
        return min(max(min(timeouts) / 4, low), high) if timeouts else high

    def deliver(self, sink: str, batch: pa.RecordBatch) -> None:
        """Write ``batch`` to ``sink`` (and queue it for :meth:`run`'s caller when collecting)."""
        slot = self.sinks[sink]
        slot.rows += batch.num_rows
        if slot.writer is not None:
            slot.writer.write(batch)
        if slot.graph_writer is not None:
            slot.graph_writer.write(batch)
        if self._collect:
            self._pending.append((sink, batch))

    def _open_writers(self) -> None:
        for slot in self.sinks.values():
            if slot.schema is None:
                continue  # nothing is inserted into it
            try:
                if slot.connector == "stdout":
                    slot.writer = StdoutSink(slot.definition.name, slot.schema, slot.format)
                elif slot.graph is not None:
                    stem = self.plan.path.stem if self.plan.path is not None else "pipeline"
                    slot.graph_writer = FalkorDBSink(
                        slot.definition.name, slot.graph, slot.schema, pipeline=stem
                    )
                elif slot.flight is not None:
                    slot.writer = FlightSink(
                        *slot.flight[:2], slot.schema, slot.flight[2], auth=slot.flight_auth
                    )
                elif slot.iceberg is not None:
                    stem = self.plan.path.stem if self.plan.path is not None else "pipeline"
                    writer = f"{stem}/{slot.definition.name}"
                    slot.writer = IcebergRunSink(slot.iceberg, writer, slot.schema)
                else:
                    assert slot.path is not None
                    slot.writer = FileSink(slot.path, slot.format, slot.schema)
            except ConnectorError as exc:
                raise sql_error(
                    f"SINK {slot.definition.name}: {exc}", slot.definition.node
                ) from exc

    def run(
        self, *, write: bool = True, collect: bool = False
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Run the pipeline to the end of its input.

        Args:
            write: write to the sinks' connectors.
            collect: yield ``(sink name, batch)`` for every batch inserted into a sink, as soon as
                the input batch that produced it has been processed.

        Yields nothing unless ``collect``. Raises what the module docstring lists.
        """
        if self._ran:
            raise RuntimeError("a PipelineRuntime runs once; build a new one")
        self._ran = True
        self._collect = collect
        if write:
            self._open_writers()
        try:
            for node in self.nodes:
                node.start()
            live = [
                (self.streams[name], source)
                for name, source in self.flight_sources.items()
                if self.streams[name].consumers
            ]
            for stream, source in live:
                for partition, watermark_ns in source.initial_watermarks.items():
                    self.advance(stream, partition, watermark_ns)
                for partition in stream.partitions:
                    self.set_backlog(stream, partition, source.backlog)
                source.start()
            readers: list[tuple[_Stream, Iterator[tuple[str, pa.RecordBatch | None]]]] = [
                (self.streams[name], source.round_robin())
                for name, source in self.sources.items()
                if self.streams[name].consumers
            ]
            tick_ns = round(self._tick_s() * 1e9)
            clock = self.clock_ns
            next_tick = clock() + tick_ns
            while readers or live:
                wake = self._wake_ns(next_tick)
                still = []
                for stream, reader in readers:
                    event = next(reader, None)
                    if event is None:
                        continue
                    partition, batch = event
                    if batch is None:
                        self.end(stream, partition)
                    else:
                        self.push(stream, partition, batch)
                    while self._pending:
                        yield self._pending.popleft()
                    still.append((stream, reader))
                readers = still
                for stream, source in live:
                    # a live source waits for its next entries only when no file is left to read
                    wait = 0.0 if readers else max(wake - clock(), 0) / 1e9 / len(live)
                    for live_event in source.poll(wait):
                        self._live_event(stream, live_event)
                        while self._pending:
                            yield self._pending.popleft()
                live = [(stream, source) for stream, source in live if not source.done]
                now = clock()
                # a tick is due, or a partition has reached its last row + idle_timeout (``wake``
                # from before the wait: once the partition is idle it has no instant left)
                if now >= wake:
                    for node in self.nodes:
                        if isinstance(node, _WindowNode):
                            node.tick()
                        elif isinstance(node, _PluginNode) and now >= next_tick:
                            node.pump(block=False)
                    while self._pending:
                        yield self._pending.popleft()
                    if now >= next_tick:
                        next_tick = clock() + tick_ns
            self._drain_plugins()
            for node in self.nodes:
                if isinstance(node, _WindowNode):
                    node.finish_all()
            while self._pending:
                yield self._pending.popleft()
            for slot in self.sinks.values():  # the run reached the end of its input
                if isinstance(slot.writer, FlightSink):
                    slot.writer.end_input()
        finally:
            for node in self.nodes:
                if isinstance(node, _PluginNode):
                    node.close()
            for source in self.flight_sources.values():
                source.close()
            for slot in self.sinks.values():
                if slot.writer is not None:
                    slot.writer.close()
                if slot.graph_writer is not None:
                    slot.graph_writer.close()

    def summary(self) -> RunSummary:
        """Rows per sink, targets and late rows so far."""
        late = {
            n.query.label: n.op.metrics.rows_late
            + n.op.metrics.rows_null_time
            + n.op.metrics.rows_out_of_range
            + n.op.metrics.rows_future
            for n in self.nodes
            if isinstance(n, _WindowNode)
        }
        return RunSummary(
            rows={name: slot.rows for name, slot in self.sinks.items()},
            targets={name: slot.target for name, slot in self.sinks.items()},
            late_rows=late,
        )

    # --- explain ------------------------------------------------------------------------------

    def explain(self) -> str:
        """The plan as text: sources (connector, partitions, watermark rule), static tables, each
        query (input, window assignment, partial and merge aggregation SQL, final projection,
        output columns, late side output), and sinks."""
        plan = self.plan
        out: list[str] = [f"pipeline {plan.path if plan.path is not None else '(SQL text)'}"]
        out.append(f"settings: {_options_text(plan.settings)}")
        for name, source in self.sources.items():
            relation = plan.sources[name]
            stream = self.streams[name]
            out += ["", f"SOURCE {name}{_at(relation.node)}"]
            out.append(
                f"  connector file, format {source.format}, batch_rows {source.batch_rows}; "
                f"read round-robin, one batch per file in turn"
            )
            out.append(f"  partitions ({len(source.partitions)}, one per file):")
            out += [f"    {p}" for p in source.partitions]
            out.append(f"  columns: {_columns_text(stream.schema)}")
            if relation.time_column is not None:
                bound = _duration(relation.options.max_out_of_orderness)
                out.append(
                    f"  watermark: W_p = max({relation.time_column}) - {bound} per partition; "
                    "W = min over live partitions, never decreasing; a file's end sets W_p = +inf"
                )
            else:
                out.append("  watermark: none declared (windows over it use max_out_of_orderness)")
            out.append(f"  options: {_options_text(relation.options)}")
            if not stream.consumers:
                out.append("  not read by any query")
        for name, live in self.flight_sources.items():
            relation = plan.sources[name]
            stream = self.streams[name]
            out += ["", f"SOURCE {name}{_at(relation.node)}"]
            if isinstance(live, IcebergSource):
                out += [*live.describe(), f"  columns: {_columns_text(stream.schema)}"]
                continue
            if isinstance(live, FlightTicketSource):
                out.append(
                    f"  connector flight, server {live.server}, {live.stream}: one DoGet, bounded; "
                    "offset = rows handed out (a cut DoGet is opened again and they are skipped)"
                )
                out.append("  partitions: one, ended when the DoGet ends")
                if live.waiting_to_open:
                    out.append("  the server is unreachable now: the run waits for it")
            else:
                out.append(
                    f"  connector flight, server {live.server}, stream {live.stream}, from offset "
                    f"{live.start_offset}; "
                    + (
                        f"stop_at_end: reads up to offset {live.end_offset} (the stream's end "
                        "now), then every writer ends"
                        if live.stop_at_end
                        and not (isinstance(live, FlightSource) and live.waiting_to_open)
                        else "stop_at_end: reads up to the stream's end when the run reaches the "
                        "server, then every writer ends"
                        if live.stop_at_end
                        else "runs until every writer it knows has sent end_of_input"
                    )
                )
                out.append(
                    f"  partitions: one per DoPut writer; known now ({len(stream.partitions)}): "
                    + (", ".join(stream.partitions) or "none")
                )
                if isinstance(live, FlightSource) and live.waiting_to_open:
                    out.append(
                        "  the server is unreachable now: the run waits for it (the stream's "
                        "writers are read then)"
                    )
            out.append(f"  columns: {_columns_text(stream.schema)}")
            if relation.time_column is not None:
                bound = _duration(relation.options.max_out_of_orderness)
                out.append(
                    f"  watermark: W_p = max(max({relation.time_column}) - {bound}, the writer's "
                    "watermark markers) per writer; W = min over writers neither ended nor idle, "
                    "never decreasing; end_of_input sets W_p = +inf"
                )
            out.append(f"  options: {_options_text(relation.options)}")
            if not stream.consumers:
                out.append("  not read by any query")
            live.close()
        for name, table_source in self.table_sources.items():
            relation = plan.tables[name]
            out += ["", f"TABLE {name}{_at(relation.node)}"]
            out.append(
                f"  connector file, format {table_source.format}; static: read once, in full, "
                f"before the first source batch ({len(table_source.paths)} file(s))"
            )
            out.append(f"  columns: {_columns_text(table_source.schema)}")
        for node in self.nodes:
            out += ["", *self._explain_query(node)]
        for name, slot in self.sinks.items():
            out += ["", f"SINK {name}{_at(slot.definition.node)}"]
            if slot.connector == "stdout":
                out.append(f"  connector stdout, format {slot.format}: rows printed as they arrive")
            elif slot.graph is not None:
                out.append(
                    f"  connector falkordb -> {slot.target}: UNWIND … MERGE … SET upserts in "
                    "batches (per batch as it arrives; with checkpoints: per epoch, under the "
                    "sink's epoch marker)"
                )
            elif slot.iceberg is not None:
                out.append(
                    f"  connector iceberg -> {slot.target}: one Iceberg commit per checkpoint "
                    "epoch, with exactly-once markers (without checkpoints: every "
                    "100,000 rows and at the end)"
                )
            elif slot.flight is not None and plan.run_options.checkpoints:
                out.append(
                    f"  connector flight -> {slot.target}: checkpointed: each epoch's batches "
                    "committed after its checkpoint, one DoPut per commit (up to 8 batches ahead "
                    "of their PutResults), retried while the server is unreachable; a replay is "
                    "matched against the writer's batches (exactly-once into flight-serve, "
                    "at-least-once into other Flight servers); end_of_input when the run ends"
                )
            elif slot.flight is not None:
                out.append(
                    f"  connector flight -> {slot.target}: one DoPut for the run, each batch "
                    "acknowledged (durable) before the next; end_of_input when the run ends"
                )
            else:
                out.append(
                    f"  connector file, format {slot.format} -> {slot.path} (one file per run, "
                    "replaced on every run)"
                )
            if slot.schema is None:
                out.append("  nothing is inserted into it (no file is written)")
            else:
                out.append(f"  fed by: {'; '.join(slot.fed_by)}")
                out.append(f"  columns: {_columns_text(slot.schema)}")
        return "\n".join(out) + "\n"

    def _explain_query(self, node: _Node) -> list[str]:
        query = node.query
        out = [f"QUERY {query.index + 1}: {query.label}"]
        reads = query.input if query.late_of is None else f"{node.input.name} (late side output)"
        if query.function is not None:  # two stages: the plugin, then the per-row query
            plugin_stage = isinstance(node, _PluginNode)
            out[0] += f", stage {1 if plugin_stage else 2} of 2"
            reads = query.input if plugin_stage else f"{node.input.name} (the plugin's results)"
        out.append(f"  reads: {reads} ({len(node.input.partitions)} partition(s))")
        if isinstance(node, _WindowNode):
            op, cfg = node.op, node.op.config
            out.append(f"  windowed aggregation, emit {cfg.emit}")
            out.append(f"  window assignment: {_describe_window(cfg.window, cfg.time_column)}")
            out.append(
                f"  watermark: W = min over input partitions of max({cfg.time_column}) - "
                f"{_duration(cfg.max_out_of_orderness)}; a window fires when W >= window_end + "
                f"allowed_lateness {_duration(cfg.allowed_lateness)}"
                + (
                    ", first at W >= window_end, then once per step with late rows"
                    if cfg.emit == "update"
                    else ""
                )
            )
            out.append(
                f"  idle_timeout {_duration(cfg.idle_timeout)}, max_future_skew "
                f"{_duration(cfg.max_future_skew)}"
                + (
                    ""
                    if cfg.idle_watermark_advance is None
                    else f", idle_watermark_advance {_duration(cfg.idle_watermark_advance)} "
                    "(while every partition is idle, W = max(W, wall clock - it))"
                )
            )
            out.append(f"  keys: {', '.join(cfg.key_columns) or '(none)'}")
            if cfg.filter_sql is not None:
                out.append(f"  filter (before windowing): {cfg.filter_sql}")
            aggregates = [
                f"__a{i} = {a.func}({a.column or '*'})" for i, a in enumerate(cfg.aggregates)
            ]
            out.append(f"  aggregates: {', '.join(aggregates)}")
            merge = op.merge_sql
            out.append("  partial aggregation (DataFusion, over the buffered rows `buf`):")
            out.append(_indent(_partial_sql(merge)))
            out.append(
                "  merge aggregation (DataFusion, pane state `state` UNION ALL the partials):"
            )
            out.append(_indent(_pretty_sql(merge)))
            if cfg.projection_sql is not None:
                out.append("  final projection (DataFusion, over the fired windows `fired`):")
                out.append(_indent(_pretty_sql(cfg.projection_sql)))
            else:
                columns = cfg.columns or ()
                text = ", ".join(
                    c.name if c.name == c.source else f"{c.name} := {c.source}" for c in columns
                )
                out.append(
                    f"  final projection: {text or 'keys, window_start, window_end, aggregates'}"
                )
            if node.late is not None:
                readers = [n.query.label for n in node.late.consumers]
                out.append(f"  late side output: {node.late.name}, read by {'; '.join(readers)}")
            else:
                out.append("  late side output: not read (late rows are counted)")
        elif isinstance(node, _PluginNode):
            fn = node.function
            out.append(
                f"  plugin {fn.plugin} (FUNCTION {fn.name}): every batch sent to an attached "
                f"instance, results in order; timeout {_duration(fn.timeout)}, max_in_flight "
                f"{fn.max_in_flight}"
            )
        else:
            assert isinstance(node, _RowNode)
            tables = f", joined with {', '.join(query.tables)}" if query.tables else ""
            out.append(f"  per-row query (DataFusion, once per input batch{tables}):")
            out.append(_indent(_pretty_sql(node.sql)))
        out.append(f"  output: {_columns_text(node.schema)}")
        if query.view is not None:
            out.append(f"  view {query.view}: a stream read by later queries")
        return out


def _at(node: exp.Expr) -> str:
    line, _ = position(node)
    return f"  (line {line})" if line is not None else ""


def _options_text(options: QueryOptions) -> str:
    return (
        f"allowed_lateness {_duration(options.allowed_lateness)}, emit {options.emit}, "
        f"idle_timeout {_duration(options.idle_timeout)}, max_future_skew "
        f"{_duration(options.max_future_skew)}, time_zone {options.time_zone or 'UTC'}, "
        f"max_out_of_orderness {_duration(options.max_out_of_orderness)}"
        + (
            ""
            if options.idle_watermark_advance is None
            else f", idle_watermark_advance {_duration(options.idle_watermark_advance)}"
        )
    )
