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

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flight_serve._arrow import read_ipc
from flight_serve.connectors.base import Source, SourceEvent
from flight_serve.connectors.file import FileSource
from flight_serve.errors import (
    CheckpointError,
    ConnectorError,
    ExternalError,
    FlightServeError,
    PipelineSQLError,
)
from flight_serve.pipelines.connect import CONNECTORS, REGISTRY, EpochSinkArgs, connector_of
from flight_serve.pipelines.dialect import function_named_in, sql_error
from flight_serve.pipelines.graph import (
    Node,
    PluginNode,
    RowNode,
    Stream,
    WindowNode,
    check_row_columns,
    columns_text,
)
from flight_serve.pipelines.pipeline import PipelinePlan, QueryDef
from flight_serve.pipelines.slots import SinkSlot
from flight_serve.pipelines.user_functions import FunctionSet
from flight_serve.types import MIN_WATERMARK_NS

if TYPE_CHECKING:  # cold start: a run without checkpoints, functions or a server loads none of them
    from flight_serve.functions.python import SandboxConfig
    from flight_serve.pipelines.coordinator import CheckpointCoordinator
    from flight_serve.pipelines.plugins import PluginHub
    from flight_serve.store import StreamStore

# CONNECTORS: see .connect; SinkSlot: see .slots
__all__ = ["CONNECTORS", "PipelineRuntime", "RunSummary", "SinkSlot"]

#: How often (seconds) windowed queries re-check idle partitions while a live source is quiet:
#: a quarter of the smallest ``idle_timeout``, within these bounds.
_TICK_BOUNDS_S = (0.01, 0.5)
#: Events a live source hands out per poll at most.
_LIVE_MAX_EVENTS = 64

log = logging.getLogger("flight_serve.pipelines")


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


def _same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(x.type == y.type for x, y in zip(a, b, strict=True))


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
        python_functions: the runner of ``LANGUAGE python`` functions (``"python"``, the
            sandbox; ``"inprocess"``, not sandboxed); ``None``: see
            :func:`flight_serve.functions.registry.create_function`.
        sandbox: the ``python`` runner's sandbox (``SandboxConfig``: hidden paths, whether
            running without bwrap is allowed); ``None``: its defaults.
        coordinator: the checkpoints of a checkpointed run (:mod:`.coordinator`): sources,
            operators and sinks are built from the checkpoint it resumes from, the run loop
            asks it for a barrier between polls, and the sinks are exactly-once epoch sinks.
        store: a server pipeline's store (``flight`` connectors without ``server`` are its
            streams); ``None`` in a run in this process.
        reconnect_s: how long (seconds) a source on another server waits for it to come back
            (a checkpointed run's: ``RETRY_BUDGET_S``); ``None``: the source's default.
        stream_server: ``(Flight location, bearer token or None)`` of the server whose
            streams the ``flight`` connectors without a ``server`` option name, read over
            Flight (a job a server submitted to Ray); ``None``: the store's, else
            ``DEFAULT_SERVER``.

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
        coordinator: CheckpointCoordinator | None = None,
        python_functions: str | None = None,
        sandbox: SandboxConfig | None = None,
        store: StreamStore | None = None,
        reconnect_s: float | None = None,
        stream_server: tuple[str, str | None] | None = None,
    ) -> None:
        self.plan = plan
        #: the server of ``flight`` connectors without ``server`` when there is no store
        self.stream_server = stream_server
        #: how long a source on another server waits for it to come back (checkpointed runs)
        self.reconnect_s = reconnect_s
        #: a server pipeline's store: its ``flight`` connectors without ``server`` read and
        #: write its streams (``None``: an embedded run)
        self.store = store
        #: the checkpoints of a checkpointed run (the state it resumes from, its barriers)
        self.coordinator = coordinator
        #: inputs skipped under ``offset_reset = 'earliest'`` (see :meth:`report_gap`)
        self.gaps: list[str] = []
        #: processing time (monotonic ns) of the run loop and of every windowed query's idle
        #: timeouts, and wall-clock time (ns since the epoch); injectable for tests
        self.clock_ns: Callable[[], int] = clock_ns or time.monotonic_ns
        self.wall_clock_ns: Callable[[], int] = wall_clock_ns or time.time_ns
        self.writes = load_tables  # explain builds the plan only: it writes nothing
        #: where the embedded Iceberg catalog lives (``<output_dir>/flight-data`` by default)
        self.data_dir = (
            data_dir if data_dir is not None else (output_dir or Path.cwd()) / "flight-data"
        )
        if plugins is None and not load_tables:  # explain: plugin stages are built, never run
            from flight_serve.pipelines.plugins import PluginHub

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
        self.streams: dict[str, Stream] = {}
        self.sources: dict[str, FileSource] = {}
        self.flight_sources: dict[str, Source] = {}
        self.table_sources: dict[str, FileSource] = {}
        self.tables: dict[str, pa.Table] = {}
        self.nodes: list[Node] = []
        self.late_streams: dict[int, Stream] = {}
        self.sinks: dict[str, SinkSlot] = {}
        self._pending: deque[tuple[str, pa.RecordBatch]] = deque()
        self._collect = False
        self._ran = False
        for relation in plan.tables.values():
            table = connector_of(relation.connector, "table", f"TABLE {relation.name}").table
            assert table is not None  # connector_of checked the role
            source = table(self, relation)
            self.table_sources[relation.name] = source
            try:
                self.tables[relation.name] = (
                    source.read_all() if load_tables else source.schema.empty_table()
                )
            except ConnectorError as exc:
                raise sql_error(f"CREATE TABLE {relation.name}: {exc}", relation.node.this) from exc
        for relation in plan.sources.values():
            spec = connector_of(relation.connector, "source", f"SOURCE {relation.name}")
            assert spec.source is not None  # connector_of checked the role
            built = spec.source(self, relation)
            if built.live:
                self.flight_sources[relation.name] = built
                self.streams[relation.name] = Stream(relation.name, built.schema, built.partitions)
                continue
            assert isinstance(built, FileSource)  # the bounded sources, read round-robin
            source = built
            self.sources[relation.name] = source
            try:
                schema = source.schema
            except ConnectorError as exc:
                raise sql_error(
                    f"CREATE SOURCE {relation.name}: {exc}", relation.node.this
                ) from exc
            except ExternalError as exc:  # the server failed, not the SQL: it stays UNAVAILABLE
                raise exc.within(f"CREATE SOURCE {relation.name}") from exc.__cause__
            if (
                relation.time_column is not None
                and schema.get_field_index(relation.time_column) < 0
            ):
                raise relation.no_time_column(schema.names, f"the files of {relation.name}")
            self.streams[relation.name] = Stream(relation.name, schema, source.partitions)
        for sink in plan.sinks.values():
            checked = connector_of(sink.connector, "sink", f"SINK {sink.name}").slot
            assert checked is not None  # connector_of checked the role
            self.sinks[sink.name] = checked(self, sink)
        #: CREATE FUNCTION … LANGUAGE python | wasm, as UDFs (made only when it will run)
        self.user_functions = FunctionSet(
            plan.user_functions, run=load_tables, python_runner=python_functions, sandbox=sandbox
        )
        try:
            self._build_queries()
        except BaseException:
            self.user_functions.close()  # their workers: this runtime never runs
            raise
        if coordinator is not None:
            for name, source in self.sources.items():  # their offsets, checked against the files
                source.measure()
                state = coordinator.source_state(name)
                if state is not None:
                    source.restore(
                        state,
                        coordinator.resumed_from,
                        offset_reset=coordinator.options.offset_reset,
                        on_gap=self.report_gap,
                    )
            for name, slot in self.sinks.items():
                slot.rows = int(coordinator.sink_mark(name).get("rows", 0))

    # --- building -----------------------------------------------------------------------------

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

    def _input_of(self, query: QueryDef) -> Stream | None:
        if query.late_of is not None:
            return self.late_streams.get(query.late_of)
        return self.streams.get(query.input)

    def _build(self, query: QueryDef) -> None:
        input = self._input_of(query)
        assert input is not None
        node: Node
        if query.window is not None:
            restore = (
                self.coordinator.operator_state(query.index, query.label)
                if self.coordinator is not None
                else None
            )
            try:
                op = query.window.build(
                    input.schema,
                    restore=restore,
                    clock_ns=self.clock_ns,
                    wall_clock_ns=self.wall_clock_ns,
                )
            except PipelineSQLError:  # a column of the query, with its own position
                raise
            except CheckpointError as exc:  # the snapshot does not fit the query
                raise CheckpointError(f"{query.label}: {exc}") from exc
            except FlightServeError as exc:
                said = " ".join(str(exc).split())  # DataFusion's message is on several lines
                func = query.select.args["from_"].this.this
                at = function_named_in(query.select, said) or func
                raise sql_error(f"{query.label}: {said}", at) from exc
            window = WindowNode(self, query, input, op)
            if any(q.late_of == query.index for q in self.plan.queries):
                name = f"LATE({query.view or query.input})"
                window.late = self.late_streams[query.index] = Stream(name, op.late_schema, (name,))
            node = window
            partitions: tuple[str, ...] = (window.partition,)
        else:
            if query.function is not None:
                input = self._plugin_stage(query, input)
            check_row_columns(query, input, self.tables)
            node = RowNode(self, query, input, self.tables, self.user_functions)
            partitions = input.partitions
        if query.view is not None:
            node.output = self.streams[query.view] = Stream(query.view, node.schema, partitions)
        if query.sink is not None:
            sink = self.sinks[query.sink]
            if sink.schema is None:
                sink.schema = node.schema
            elif not _same_columns(sink.schema, node.schema):
                raise sql_error(
                    f"{query.label}: its columns ({columns_text(node.schema)}) differ from "
                    f"those {sink.fed_by[0]} inserts into {query.sink} "
                    f"({columns_text(sink.schema)})",
                    query.select,
                )
            sink.fed_by.append(query.label)
            if query.window is not None:
                config = window.op.config
                try:
                    sink.fit_window(config.emit, config.key_columns, node.schema)
                except ConnectorError as exc:
                    raise sql_error(f"{query.label}: {exc}", query.select) from exc
        self.nodes.append(node)

    def _plugin_stage(self, query: QueryDef, input: Stream) -> Stream:
        """The plugin node in front of ``query`` (``FROM <f>(<input>)``); its hidden stream."""
        assert query.function is not None
        if query.function in self.plan.user_functions:  # a user table function, in-process call
            from flight_serve.pipelines.function_nodes import TableFunctionNode

            spec = self.plan.user_functions[query.function]
            udtf = TableFunctionNode(
                self,
                query,
                input,
                spec,
                self.user_functions.tables.get(spec.name),
                self.user_functions.stats[spec.name],
            )
            self.nodes.append(udtf)
            return udtf.hidden
        function = self.plan.functions[query.function]
        if self.plugins is None:
            raise sql_error(
                f"FUNCTION {function.name}: plugins are attached to a server; submit the "
                "pipeline (flight-serve submit) instead of running it embedded",
                function.node.this,
            )
        node = PluginNode(self, query, input, function, self.plugins)
        self.nodes.append(node)
        return node.hidden

    def plugin_wait(self, node: PluginNode, waiting: str | None) -> None:
        """A plugin stage waits for a result (``waiting``: why, or ``None`` when it is over).
        A checkpointed run also stops here when asked to: it resumes from its last checkpoint
        and sends the batches after it again."""
        self.waiting = waiting
        if self.coordinator is not None:
            self.coordinator.stop_if_asked(waiting or "waiting")

    def connector_wait(self, waiting: str | None) -> None:
        """A connector retries its server (``waiting``: why, or ``None`` once through); a
        checkpointed run stops here when asked to."""
        previous, self.connector_waiting = self.connector_waiting, waiting
        if self.on_wait is not None and (previous is None) != (waiting is None):
            self.on_wait(waiting)
        if waiting is not None and self.coordinator is not None:
            self.coordinator.stop_if_asked(waiting)

    def report_gap(self, message: str) -> None:
        """A source offset was gone and ``offset_reset = 'earliest'`` skipped input: log it as
        a warning and keep it (:attr:`gaps`, the checkpoint's metrics)."""
        self.gaps.append(message)
        name = self.coordinator.name if self.coordinator is not None else None
        log.warning(message, extra={"pipeline": name})

    def plugin_waiting(self) -> str | None:
        """``waiting for plugin <name>`` while a plugin stage has batches and no instance that
        can take them (live; a stage blocked in a barrier included), else why a connector
        retries its server now (:meth:`connector_wait`), else ``None``."""
        if self.connector_waiting is not None:
            return self.connector_waiting
        for node in self.nodes:
            waiting = node.waiting_for()
            if waiting is not None:
                return waiting
        return None

    def plugin_errors(self) -> dict[str, str]:
        """The last error of each plugin function's instances (a refused declaration, a wrong
        result schema, garbage, a timeout), by function name."""
        errors: dict[str, str] = {}
        for node in self.nodes:
            error = node.error()
            if error is not None:
                errors[error[0]] = error[1]
        return errors

    def drain(self) -> None:
        """Every node emits what is in flight (plugin stages wait for their results)."""
        for node in self.nodes:
            node.on_barrier()

    # --- running: the edges of the graph (graph.Collector) ----------------------------------

    def push(self, stream: Stream, partition: str, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` of ``partition`` to every query reading ``stream``."""
        for node in stream.consumers:
            node.on_batch(partition, batch)

    def end(self, stream: Stream, partition: str) -> None:
        """End of input of ``partition`` for every query reading ``stream``."""
        for node in stream.consumers:
            node.on_end(partition)

    def add_partition(self, stream: Stream, partition: str) -> None:
        """A new partition of ``stream`` (a live source's new writer): it holds the watermark
        of every windowed query reading ``stream`` back from now on."""
        if partition not in stream.partitions:
            stream.partitions = (*stream.partitions, partition)
        for node in stream.consumers:
            node.on_partition(partition)

    def advance(self, stream: Stream, partition: str, watermark_ns: int) -> None:
        """An explicit watermark of ``partition`` for every query reading ``stream``."""
        for node in stream.consumers:
            node.on_watermark(partition, watermark_ns)

    def set_backlog(self, stream: Stream, partition: str, backlog: bool) -> None:
        """Whether ``partition`` of ``stream`` has unread input."""
        for node in stream.consumers:
            node.on_backlog(partition, backlog)

    def deliver(self, sink: str, batch: pa.RecordBatch) -> None:
        """Write ``batch`` to ``sink``: its epoch (committed at the next checkpoint) in a
        checkpointed run, else its writer (and queue it for :meth:`run`'s caller when
        collecting)."""
        slot = self.sinks[sink]
        slot.rows += batch.num_rows
        if slot.epoch is not None:
            slot.epoch.write(batch)
            return
        if slot.writer is not None:
            slot.writer.write(batch)
        if self._collect:
            self._pending.append((sink, batch))

    def _event(self, stream: Stream, source: Source, event: SourceEvent) -> None:
        """Hand one event of a source to the queries reading ``stream``."""
        if event.kind == "batch":
            assert event.batch is not None
            self.push(stream, event.partition, event.batch)
        elif event.kind == "partition":
            self.add_partition(stream, event.partition)
            self.set_backlog(stream, event.partition, source.backlog)
        elif event.kind == "watermark":
            assert event.watermark_ns is not None
            self.advance(stream, event.partition, event.watermark_ns)
        elif event.kind == "end":
            self.end(stream, event.partition)
        else:  # backlog: the tail has unread entries, and they may hold any writer's rows
            for partition in stream.partitions:
                self.set_backlog(stream, partition, event.backlog)

    def _poll(
        self, stream: Stream, name: str, source: Source, timeout_s: float, max_events: int
    ) -> None:
        """One poll of ``source``, after the checkpoint barrier (a consistent cut: every event
        polled before went through every query and sink)."""
        if self.coordinator is not None:
            self.coordinator.barrier()
        for event in source.poll(timeout_s, max_events):
            if self.coordinator is not None:
                self.coordinator.counted(name, event, bounded=not source.live)
            self._event(stream, source, event)

    def _wake_ns(self, next_tick_ns: int) -> int:
        """When (``clock_ns``) the run loop re-checks its windowed queries next: the periodic
        tick, or earlier the instant a partition reaches ``last row + idle_timeout`` or (with
        ``idle_watermark_advance``) a window closes by the wall clock."""
        wake = next_tick_ns
        for node in self.nodes:
            due = node.next_wake_ns()
            if due is not None and due < wake:
                wake = due
        return wake

    def _tick_s(self) -> float:
        timeouts = [t for t in (n.idle_timeout_s() for n in self.nodes) if t is not None]
        low, high = _TICK_BOUNDS_S
        if any(n.ticks_often for n in self.nodes):
            return low  # plugin results are emitted at ticks while the sources are quiet
        return min(max(min(timeouts) / 4, low), high) if timeouts else high

    def _open_writers(self) -> None:
        """Open the sink of every slot rows are inserted into: its registry row's ``sink``,
        or in a checkpointed run its ``epoch_sink`` (``stdout`` has none: its plain sink),
        which first redoes the commit of the checkpoint resumed from."""
        coordinator = self.coordinator
        manifest = coordinator.manifest if coordinator is not None else None
        if coordinator is not None:
            pipeline = coordinator.name
        else:
            pipeline = self.plan.path.stem if self.plan.path is not None else "pipeline"
        for name, slot in self.sinks.items():
            if slot.schema is None:
                continue  # nothing is inserted into it
            spec = REGISTRY[slot.connector]
            try:
                if coordinator is None or spec.epoch_sink is None:
                    assert spec.sink is not None  # connector_of checked the role
                    slot.writer = spec.sink(slot, pipeline)
                    continue
                mark = coordinator.sink_mark(name)
                restored = manifest.epoch if manifest is not None else None
                finished = manifest is not None and manifest.finished
                args = EpochSinkArgs(
                    self, pipeline, mark, int(mark.get("rows", 0)), restored, finished
                )
                epoch = slot.epoch = spec.epoch_sink(slot, args)
                if manifest is not None:  # redo the commit of the checkpoint resumed from
                    staged = coordinator.staged(mark)
                    epoch.recover(read_ipc(staged) if staged is not None else [])
            except ConnectorError as exc:
                raise sql_error(f"SINK {name}: {exc}", slot.definition.node) from exc

    # --- the pieces a distributed run drives (pipelines.distributed) -------------------------

    def collect_only(self) -> None:
        """Queue every batch inserted into a sink for :meth:`take_collected` and write none:
        a worker of a distributed run, which drives the nodes itself and sends its sinks' rows
        to the driver."""
        self._ran = True
        self._collect = True

    def take_collected(self) -> list[tuple[str, pa.RecordBatch]]:
        """The ``(sink name, batch)`` queued since the last call (see :meth:`collect_only`)."""
        out = list(self._pending)
        self._pending.clear()
        return out

    def open_sinks(self) -> None:
        """Open the sinks' writers (the driver of a distributed run writes what its workers
        collected with :meth:`deliver`); :meth:`close_sinks` ends them."""
        self._ran = True
        self._open_writers()

    def close_sinks(self, *, ended: bool) -> None:
        """End the sinks' input (``ended``: the run reached the end of its input) and close
        them."""
        try:
            if ended:
                for slot in self.sinks.values():
                    if slot.writer is not None:
                        slot.writer.end_input()
        finally:
            for slot in self.sinks.values():
                if slot.writer is not None:
                    slot.writer.close()

    def run(
        self, *, write: bool = True, collect: bool = False
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Run the pipeline to the end of its input.

        Args:
            write: write to the sinks' connectors.
            collect: yield ``(sink name, batch)`` for every batch inserted into a sink, as soon as
                the input batch that produced it has been processed.

        A checkpointed run (a ``coordinator``) writes its sinks and collects nothing: it runs
        from the checkpoint resumed from, taking checkpoints at the barriers, takes the
        *finished* checkpoint at the end, and then its epoch sinks end their input (the file
        sinks' files are written); resumed from a finished run's checkpoint, it only completes
        what a crash interrupted (the last commit).

        Yields nothing unless ``collect``. Raises what the module docstring lists; a
        checkpointed run :class:`~flight_serve.errors.CheckpointError` and
        :class:`~flight_serve.pipelines.coordinator.PipelineStopped` after a stop request.
        """
        coordinator = self.coordinator
        if coordinator is not None and (not write or collect):
            raise ValueError("a durable run writes its sinks; collect with PipelineRuntime")
        try:
            if coordinator is None or not coordinator.finished:
                yield from self._run(write=write, collect=collect)
                if coordinator is not None:
                    coordinator.take(finished=True)
            else:  # a crash after the finished checkpoint: only complete what it interrupted
                self._open_writers()
            for slot in self.sinks.values():
                if slot.epoch is not None:
                    slot.epoch.end_input()
        finally:
            for slot in self.sinks.values():
                if slot.epoch is not None:
                    slot.epoch.close()
            if coordinator is not None:  # old checkpoints pruned before the run returns
                coordinator.checkpoints.settle()

    def _run(self, *, write: bool, collect: bool) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The run loop with its sinks opened; every node, source and plain sink closed."""
        if self._ran:
            raise RuntimeError("a PipelineRuntime runs once; build a new one")
        self._ran = True
        self._collect = collect
        if write:
            self._open_writers()
        try:
            yield from self._loop()
            for slot in self.sinks.values():  # the run reached the end of its input
                if slot.writer is not None:
                    slot.writer.end_input()
        finally:
            for node in self.nodes:
                node.close()
            self.user_functions.close()
            for source in self.flight_sources.values():
                source.close()
            for slot in self.sinks.values():
                if slot.writer is not None:
                    slot.writer.close()

    def _loop(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The run loop: bounded sources one batch each in turn, then the live ones (waiting
        only when no bounded input is left), the nodes' ticks; at the end every node finishes."""
        for node in self.nodes:
            node.start()
        live = [
            (self.streams[name], name, source)
            for name, source in self.flight_sources.items()
            if self.streams[name].consumers
        ]
        for stream, name, source in live:
            for partition, watermark_ns in source.initial_watermarks.items():
                self.advance(stream, partition, watermark_ns)
            for partition in stream.partitions:
                self.set_backlog(stream, partition, source.backlog)
            source.open(self.coordinator.source_state(name) if self.coordinator else None)
        bounded: list[tuple[Stream, str, Source]] = [
            (self.streams[name], name, source)
            for name, source in self.sources.items()
            if self.streams[name].consumers
        ]
        tick_ns = round(self._tick_s() * 1e9)
        clock = self.clock_ns
        next_tick = clock() + tick_ns
        while bounded or live:
            wake = self._wake_ns(next_tick)
            bounded = [entry for entry in bounded if not entry[2].done]
            for stream, name, source in bounded:
                self._poll(stream, name, source, 0.0, 1)
                while self._pending:
                    yield self._pending.popleft()
            for stream, name, source in live:
                if source.done:
                    continue
                # a live source waits for its next entries only when no file is left to read
                wait = 0.0 if bounded else max(wake - clock(), 0) / 1e9 / len(live)
                self._poll(stream, name, source, wait, _LIVE_MAX_EVENTS)
                while self._pending:
                    yield self._pending.popleft()
            live = [entry for entry in live if not entry[2].done]
            now = clock()
            # a tick is due, or a partition has reached its last row + idle_timeout (``wake``
            # from before the wait: once the partition is idle it has no instant left)
            if now >= wake:
                periodic = now >= next_tick
                for node in self.nodes:
                    node.on_tick(periodic=periodic)
                while self._pending:
                    yield self._pending.popleft()
                if periodic:
                    next_tick = clock() + tick_ns
        self.drain()
        for node in self.nodes:
            node.on_finish()
        while self._pending:
            yield self._pending.popleft()

    def summary(self) -> RunSummary:
        """Rows per sink, targets (a server's own stream is ``stream <name>``) and late rows
        so far."""
        late = {n.query.label: rows for n in self.nodes if (rows := n.late_rows()) is not None}
        return RunSummary(
            rows={name: slot.rows for name, slot in self.sinks.items()},
            targets={name: slot.summary_target for name, slot in self.sinks.items()},
            late_rows=late,
        )

    def window_nodes(self) -> list[WindowNode]:
        """The windowed queries' nodes, in build order."""
        return [n for n in self.nodes if isinstance(n, WindowNode)]

    def metrics(self) -> dict[str, Any]:
        """Counters now: rows read from sources, rows written per sink, late rows per windowed
        query, watermark per windowed query, open panes, gaps reported, ``nodes``
        (:meth:`node_metrics`), and ``data_loss_rows``: the rows resumes under
        ``offset_reset = 'earliest'`` skipped because retention had removed them (cumulative
        over the pipeline's resumes: the checkpoint resumed from records the earlier ones)."""
        windows = self.window_nodes()
        sources: list[Source] = [*self.sources.values(), *self.flight_sources.values()]
        manifest = self.coordinator.manifest if self.coordinator is not None else None
        before = int(manifest.metrics.get("data_loss_rows", 0)) if manifest is not None else 0
        return {
            "rows_in": sum(s.rows for s in sources),
            "rows_out": {name: slot.rows for name, slot in self.sinks.items()},
            "late_rows": {n.query.label: n.late_rows() for n in windows},
            "watermark_ns": {n.query.label: n.op.watermark_ns for n in windows},
            "open_panes": sum(n.op.open_panes for n in windows),
            "gaps": list(self.gaps),
            # a source that skipped rows on resume counts them (a server stream's)
            "data_loss_rows": before + sum(getattr(s, "data_loss_rows", 0) for s in sources),
            "nodes": self.node_metrics(),
        }

    def watermark_ns(self) -> int | None:
        """The lowest watermark of the windowed queries (``None`` without one, or before any)."""
        marks = [n.op.watermark_ns for n in self.window_nodes()]
        low = min(marks) if marks else None
        return None if low is None or low == MIN_WATERMARK_NS else low

    # --- checkpoints (coordinator.Checkpointed) ----------------------------------------------

    def has_pending(self) -> bool:
        """Whether an epoch sink holds rows for the next checkpoint."""
        return any(s.epoch is not None and s.epoch.has_pending for s in self.sinks.values())

    def snapshot_operators(self, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """Each windowed query's manifest entry, by query index; snapshots into ``files``."""
        operators: dict[str, dict[str, Any]] = {}
        for node in self.nodes:
            entry = node.snapshot(files)
            if entry is not None:
                operators[str(node.query.index)] = entry
        return operators

    def snapshot_sources(self) -> dict[str, dict[str, Any]]:
        """Each source's offsets, files first."""
        states = {name: source.snapshot() for name, source in self.sources.items()}
        states.update((name, source.snapshot()) for name, source in self.flight_sources.items())
        return states

    def prepare_sinks(self, epoch: int, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """Each sink's commit mark: an epoch sink prepares ``epoch``; another (stdout) records
        its rows."""
        marks: dict[str, dict[str, Any]] = {}
        for name, slot in self.sinks.items():
            if slot.epoch is not None:
                marks[name] = slot.epoch.prepare(epoch, files)
            else:
                marks[name] = {"kind": slot.connector, "rows": slot.rows}
        return marks

    def commit_sinks(self, epoch: int) -> None:
        """Every epoch sink commits ``epoch``."""
        for slot in self.sinks.values():
            if slot.epoch is not None:
                slot.epoch.commit(epoch)

    # --- explain ------------------------------------------------------------------------------

    def explain(self) -> str:
        """The plan as text: sources (connector, partitions, watermark rule), static tables, each
        query (input, window assignment, partial and merge aggregation SQL, final projection,
        output columns, late side output), and sinks (:mod:`~flight_serve.pipelines.explain`)."""
        from flight_serve.pipelines.explain import explain

        return explain(self)

    def node_metrics(self) -> list[dict[str, Any]]:
        """Per node of the graph, in build order: ``{id ("query:<index>", or
        "function:<name>" for a plugin stage), kind ("window" | "map" | "function"), label,
        query (its index), rows_in, rows_out (rows since this run started; a restore starts
        them at 0), late_rows (cumulative, windowed only, else None), open_windows (pane rows
        held now, windowed only, else None)}``; a windowed node also ``partitions``: each input
        partition's own watermark, ``[{partition (a writer's name, "" unnamed; a file's path),
        watermark_ns (None before progress, the largest int64 once ended), idle, finished}]``."""
        from flight_serve.pipelines.function_nodes import TableFunctionNode

        out: list[dict[str, Any]] = []
        for n in self.nodes:
            node_id, kind, label = f"query:{n.query.index}", "map", n.query.label
            if isinstance(n, PluginNode):
                node_id, kind, label = f"function:{n.function.name}", "function", n.function.name
            elif isinstance(n, TableFunctionNode):
                node_id, kind, label = f"function:{n.spec.name}", "function", n.spec.name
            elif isinstance(n, WindowNode):
                kind = "window"
            out.append({
                "id": node_id, "kind": kind, "label": label, "query": n.query.index,
                "rows_in": n.rows_in, "rows_out": n.rows_out,
                "late_rows": n.late_rows(), "open_windows": n.open_windows(),
            })  # fmt: skip
            if isinstance(n, WindowNode):
                out[-1]["partitions"] = [
                    {"partition": name, **mark}
                    for name, mark in n.op.partition_watermarks().items()
                ]
        return out
