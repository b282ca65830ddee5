"""The workers of a distributed run, without any cluster: the same graph nodes, split by key.

A job has two kinds of worker, each building the pipeline's ordinary
:class:`~flight_serve.pipelines.runtime.PipelineRuntime` from the same SQL and driving part of it:

* a **source worker** (:class:`SourceWorker`) owns some *splits*: files of the file sources (a
  file is a watermark partition, as embedded). It reads them batch by batch through the per-row
  nodes; in front of every windowed query sits an :class:`ExchangeNode` in place of the window:
  it hashes each batch's rows by the query's key columns to key groups to instances
  (:mod:`.keygroups`) and records, per *step* of the file (one source batch, or its end), each
  instance's share and the whole batch's progress (its maximum event time). Rows of per-row
  queries that insert into a sink directly are collected and sent to the driver;
* a **window worker** (:class:`WindowWorker`), instance ``i`` of ``parallelism``, runs instance
  ``i`` of every windowed query (the real :class:`~flight_serve.pipelines.graph.WindowNode`) and
  everything downstream of it (views, late side outputs, sinks). It consumes each query's steps in
  the order the embedded run polls the files (round-robin, one step each in turn,
  ``FileSource.poll``), so every instance judges every row against the watermark the embedded
  operator had at that row, and the union of the instances' output equals the embedded run's,
  row for row. Each partition's watermark is the split's (from the progress sent with every
  share, also an empty one), and the operator's watermark is the minimum over its input
  channels, as embedded; a split's end flows through as its partition's end.

What the keyed exchange cannot run yet is refused when the job is built
(:func:`check_distributable`): live sources (streams, Iceberg), plugin functions, and a windowed
query reading another windowed query's output or a late side output (a second exchange).

The transport is the caller's: ``send(instance, records)`` (a Ray actor call in
:mod:`.ray_runtime`, a direct call in :func:`run_local`). Records of one split arrive in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.distributed.keygroups import instances_of, key_group_range, key_groups
from flight_serve.pipelines.graph import Collector, Node, PluginNode, Stream, WindowNode
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary

__all__ = [
    "ExchangeNode",
    "InstanceStatus",
    "JobSpec",
    "Record",
    "SourceWorker",
    "WindowWorker",
    "assign_splits",
    "check_distributable",
    "run_local",
]

#: One instance's share of one input batch: its rows (``None``: none) and the whole batch's
#: progress (ns since the epoch, ``None``: no row with a valid time).
Share = tuple[pa.RecordBatch | None, int | None]


@dataclass(frozen=True)
class Record:
    """One step of one split for one instance of one windowed query.

    Attributes:
        query: the windowed query's index in the plan.
        split: the file's index in its source (its watermark partition).
        seq: the step's number within the split (0, 1, …), checked on arrival.
        shares: what reached the window in this step (none when a per-row query filtered the
            whole batch out; several after a table function).
        end: the step is the split's end of input.
    """

    query: int
    split: int
    seq: int
    shares: tuple[Share, ...]
    end: bool = False

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b, _ in self.shares if b is not None)


@dataclass(frozen=True)
class JobSpec:
    """What every worker needs to rebuild the pipeline (picklable).

    Attributes:
        sql: the pipeline file's text.
        path: the pipeline file (relative source paths start at its directory).
        output_dir: where relative sink paths start.
        parallelism: instances of every windowed query (≥ 1).
        max_parallelism: key groups (≥ parallelism).
    """

    sql: str
    path: str
    output_dir: str
    parallelism: int
    max_parallelism: int

    def runtime(self, *, load_tables: bool = True) -> PipelineRuntime:
        """The pipeline's runtime, built as an embedded run builds it."""
        plan = parse_pipeline(self.sql, path=Path(self.path))
        return PipelineRuntime(plan, output_dir=Path(self.output_dir), load_tables=load_tables)


def _root_source(runtime: PipelineRuntime, window: WindowNode) -> str:
    """The file source whose rows reach ``window`` through per-row nodes only.

    Raises:
        PipelineSQLError: the input comes from another windowed query, a late side output,
            a plugin stage or a live source.
    """
    producers = {id(n.output): n for n in runtime.nodes if n.output is not None}
    late = {id(s) for s in runtime.late_streams.values()}
    stream: Stream = window.input
    while True:
        if stream.name in runtime.sources and runtime.streams.get(stream.name) is stream:
            return stream.name
        if stream.name in runtime.flight_sources:
            raise PipelineSQLError(
                f"{window.query.label}: reads the live source {stream.name}; the distributed "
                "runtime splits file sources only so far (docs/scaling.md)"
            )
        if id(stream) in late:
            raise PipelineSQLError(
                f"{window.query.label}: reads the late side output {stream.name}; a windowed "
                "query after a late side output is not distributed yet (docs/scaling.md)"
            )
        producer = producers.get(id(stream))
        if producer is None:
            raise PipelineSQLError(f"{window.query.label}: cannot trace its input {stream.name}")
        if isinstance(producer, WindowNode):
            raise PipelineSQLError(
                f"{window.query.label}: reads the output of the windowed query "
                f"{producer.query.label}; a second keyed exchange is not built yet, run it "
                "embedded (docs/scaling.md)"
            )
        if isinstance(producer, PluginNode):
            raise PipelineSQLError(
                f"{window.query.label}: its input goes through the plugin function "
                f"{producer.function.name}; plugins run on a server, not in the distributed "
                "runtime"
            )
        stream = producer.input


def check_distributable(runtime: PipelineRuntime) -> dict[int, str]:
    """The root file source of every windowed query, by query index.

    Raises:
        PipelineSQLError: what the module docstring lists as not distributed yet.
    """
    for name, source in runtime.flight_sources.items():
        if runtime.streams[name].consumers:
            raise PipelineSQLError(
                f"SOURCE {name}: a live source ({type(source).__name__}); the distributed "
                "runtime splits file sources only so far (docs/scaling.md)"
            )
    for node in runtime.nodes:
        if isinstance(node, PluginNode):
            raise PipelineSQLError(
                f"FUNCTION {node.function.name}: plugins run on a server, not in the "
                "distributed runtime"
            )
    return {w.query.index: _root_source(runtime, w) for w in runtime.window_nodes()}


def assign_splits(runtime: PipelineRuntime, workers: int) -> list[dict[str, list[int]]]:
    """Every file of every file source that feeds a query, dealt round-robin to ``workers``
    source workers (fewer when there are fewer files; at least one): per worker, the file
    indices of each source."""
    splits = [
        (name, index)
        for name, source in runtime.sources.items()
        if runtime.streams[name].consumers
        for index in range(len(source.paths))
    ]
    count = max(1, min(workers, len(splits)))
    out: list[dict[str, list[int]]] = [{} for _ in range(count)]
    for k, (name, index) in enumerate(splits):
        out[k % count].setdefault(name, []).append(index)
    return out


class ExchangeNode(Node):
    """In a source worker, the keyed exchange in place of a windowed query (see the module
    docstring): each batch's rows split by instance, with the batch's progress."""

    def __init__(
        self, out: Collector, window: WindowNode, parallelism: int, max_parallelism: int
    ) -> None:
        super().__init__(out, window.query, window.input, window.schema)
        window.input.consumers.remove(window)
        self.window = window
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.keys = window.op.config.key_columns
        self.step: list[list[Share]] = [[] for _ in range(parallelism)]
        self.ended = False

    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        progress = self.window.op.batch_progress_ns(batch)
        if self.parallelism == 1:
            self.step[0].append((batch, progress))
            return
        owners = instances_of(
            key_groups(batch, self.keys, self.max_parallelism),
            self.parallelism,
            self.max_parallelism,
        )
        for i in range(self.parallelism):
            rows = np.flatnonzero(owners == i)
            share = batch.take(pa.array(rows, pa.int64())) if len(rows) else None
            self.step[i].append((share, progress))

    def on_end(self, partition: str) -> None:
        self.ended = True

    def take_step(self) -> tuple[list[list[Share]], bool]:
        """This step's shares per instance and whether it was the split's end; resets both."""
        step, ended = self.step, self.ended
        self.step = [[] for _ in range(self.parallelism)]
        self.ended = False
        return step, ended


Send = Callable[[int, list[Record]], None]


class SourceWorker:
    """Reads its splits through the per-row nodes into the exchanges (module docstring).

    Args:
        spec: the job.
        splits: file indices per source this worker owns (:func:`assign_splits`).
        send: ``send(instance, records)``: the transport to window worker ``instance``.
        flush_rows: rows buffered per instance before a send (the exchange's batch size).

    Raises:
        PipelineSQLError: building the pipeline fails, or it cannot be distributed.
    """

    def __init__(
        self,
        spec: JobSpec,
        splits: dict[str, list[int]],
        send: Send,
        *,
        flush_rows: int = 1 << 16,
    ) -> None:
        self.spec = spec
        self.splits = splits
        self.send = send
        self.flush_rows = flush_rows
        self.runtime = runtime = spec.runtime()
        runtime.collect_only()
        self.roots = check_distributable(runtime)
        self.exchanges = {
            w.query.index: ExchangeNode(runtime, w, spec.parallelism, spec.max_parallelism)
            for w in runtime.window_nodes()
        }
        self._buffers: list[list[Record]] = [[] for _ in range(spec.parallelism)]
        self._buffered = [0] * spec.parallelism
        #: records and batches sent, rows read
        self.sent_records = 0
        self.sent_calls = 0
        self.rows_read = 0

    def _record(self, ex: ExchangeNode, split: int, seq: int) -> None:
        step, ended = ex.take_step()
        for i, shares in enumerate(step):
            record = Record(ex.query.index, split, seq, tuple(shares), ended)
            self._buffers[i].append(record)
            self._buffered[i] += record.rows
            if self._buffered[i] >= self.flush_rows:
                self._flush(i)

    def _flush(self, instance: int) -> None:
        records = self._buffers[instance]
        if records:
            self._buffers[instance] = []
            self._buffered[instance] = 0
            self.sent_records += len(records)
            self.sent_calls += 1
            self.send(instance, records)

    def run(self) -> list[tuple[str, pa.RecordBatch]]:
        """Read every split to its end; returns the rows per-row queries inserted into sinks.

        Raises:
            ConnectorError: a file cannot be read; QueryError: a per-row query fails.
        """
        runtime = self.runtime
        try:
            for node in runtime.nodes:
                if not isinstance(node, WindowNode):
                    node.start()
            for name, indices in self.splits.items():
                stream = runtime.streams[name]
                source = runtime.sources[name]
                exchanges = [ex for q, ex in self.exchanges.items() if self.roots[q] == name]
                for index in indices:
                    partition = source.partitions[index]
                    seq = 0
                    for batch in source.read_file(index):
                        self.rows_read += batch.num_rows
                        runtime.push(stream, partition, batch)
                        for ex in exchanges:
                            self._record(ex, index, seq)
                        seq += 1
                    runtime.end(stream, partition)
                    for ex in exchanges:
                        self._record(ex, index, seq)
            for i in range(self.spec.parallelism):
                self._flush(i)
            return runtime.take_collected()
        finally:
            for node in runtime.nodes:
                node.close()
            runtime.user_functions.close()


@dataclass
class _Merge:
    """The embedded order of one windowed query's splits (``FileSource.poll``'s round-robin)."""

    partitions: tuple[str, ...]
    queues: list[deque[Record]] = field(default_factory=list)
    expected: list[int] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    next_index: int = 0

    def __post_init__(self) -> None:
        n = len(self.partitions)
        self.queues = [deque() for _ in range(n)]
        self.expected = [0] * n
        self.ended = [False] * n

    def next(self) -> Record | None:
        """The next record in the embedded order, or ``None`` until it has arrived (or at the
        end of every split)."""
        live = [i for i, done in enumerate(self.ended) if not done]
        if not live:
            return None
        index = next((i for i in live if i >= self.next_index), live[0])
        if not self.queues[index]:
            return None
        record = self.queues[index].popleft()
        self.next_index = index + 1
        if record.end:
            self.ended[index] = True
        return record

    @property
    def done(self) -> bool:
        return all(self.ended)


@dataclass(frozen=True)
class InstanceStatus:
    """One window instance of a distributed run, as its worker reports it (``status``).

    Attributes:
        instance: its number, ``0 … parallelism - 1``.
        key_groups: the key groups it owns, ``(first, stop)``: a half-open range of
            ``0 … max_parallelism`` (:func:`~.keygroups.key_group_range`).
        records_in: exchange records received (one per split step).
        rows_in: rows in those records.
        rows_out: rows its queries produced (the windows' results and what runs after them).
        watermark_ns: the lowest operator watermark over its windowed queries, ns since the
            epoch (``MAX_WATERMARK_NS`` once every split has ended; ``None`` before any input).
        queued_records: records received and not run yet (the rest of a ``put`` call's
            records, and those waiting for another split's record: the embedded order): the
            instance's input backlog.
        queued_records_max: the most seen after any step of a split (a record processed).
        open_panes: pane rows held in state now (one per key and open window).
        open_panes_max: the most seen after any step.
        state_bytes: window state bytes held now
            (:attr:`~flight_serve.engine.operator.WindowOperator.state_bytes`).
        state_bytes_max: the most seen after any step.
    """

    instance: int
    key_groups: tuple[int, int]
    records_in: int
    rows_in: int
    rows_out: int
    watermark_ns: int | None
    queued_records: int
    queued_records_max: int
    open_panes: int
    open_panes_max: int
    state_bytes: int
    state_bytes_max: int


class WindowWorker:
    """Instance ``instance`` of every windowed query and what runs after it (module docstring).

    Raises:
        PipelineSQLError: building the pipeline fails, or it cannot be distributed.
    """

    def __init__(self, spec: JobSpec, instance: int) -> None:
        self.spec = spec
        self.instance = instance
        self.runtime = runtime = spec.runtime()
        runtime.collect_only()
        roots = check_distributable(runtime)
        self.windows = {w.query.index: w for w in runtime.window_nodes()}
        self.merges = {q: _Merge(runtime.sources[roots[q]].partitions) for q in self.windows}
        self._empty = {
            q: w.input.schema.empty_table().to_batches() for q, w in self.windows.items()
        }
        #: records and rows received, rows produced
        self.records_in = 0
        self.rows_in = 0
        self.rows_out = 0
        self._seen = False
        #: the largest backlog, open panes and state bytes seen after a step
        self._queued_max = self._panes_max = self._bytes_max = 0
        for node in runtime.nodes:
            node.start()

    def put(self, records: Sequence[Record]) -> None:
        """Take records from a source worker and run every query as far as the embedded order
        allows.

        Raises:
            RuntimeError: a split's records out of order (a transport bug).
            QueryError, InvalidInputError: a query fails on a batch.
        """
        for record in records:
            merge = self.merges[record.query]
            if record.seq != merge.expected[record.split]:
                raise RuntimeError(
                    f"instance {self.instance}: query {record.query} split {record.split}: "
                    f"record {record.seq} arrived, {merge.expected[record.split]} expected"
                )
            merge.expected[record.split] += 1
            merge.queues[record.split].append(record)
            self.records_in += 1
            self.rows_in += record.rows
        for q, merge in self.merges.items():
            window = self.windows[q]
            while (step := merge.next()) is not None:
                partition = merge.partitions[step.split]
                for batch, progress in step.shares:
                    if batch is None:
                        empty = self._empty[q]
                        batch = (
                            empty[0]
                            if empty
                            else pa.RecordBatch.from_pylist([], schema=window.input.schema)
                        )
                    window.on_share(partition, batch, progress)
                self._seen = True
                if step.end:
                    window.on_end(partition)
                else:  # the maxima after each step: an end fires what it closes
                    self._queued_max = max(self._queued_max, self._queued())
                    self._panes_max = max(self._panes_max, self._open_panes())
                    self._bytes_max = max(self._bytes_max, self._state_bytes())

    def _queued(self) -> int:
        return sum(len(q) for merge in self.merges.values() for q in merge.queues)

    def _open_panes(self) -> int:
        return sum(w.op.open_panes for w in self.windows.values())

    def _state_bytes(self) -> int:
        return sum(w.op.state_bytes for w in self.windows.values())

    def status(self) -> InstanceStatus:
        """What this instance holds and has done so far (see :class:`InstanceStatus`)."""
        groups = key_group_range(self.instance, self.spec.parallelism, self.spec.max_parallelism)
        marks = [w.op.watermark_ns for w in self.windows.values()]
        return InstanceStatus(
            instance=self.instance,
            key_groups=(groups.start, groups.stop),
            records_in=self.records_in,
            rows_in=self.rows_in,
            rows_out=self.rows_out,
            watermark_ns=min(marks) if marks and self._seen else None,
            queued_records=self._queued(),
            queued_records_max=self._queued_max,
            open_panes=self._open_panes(),
            open_panes_max=self._panes_max,
            state_bytes=self._state_bytes(),
            state_bytes_max=self._bytes_max,
        )

    def take(self) -> list[tuple[str, pa.RecordBatch]]:
        """The ``(sink, batch)`` produced since the last call."""
        out = self.runtime.take_collected()
        self.rows_out += sum(batch.num_rows for _, batch in out)
        return out

    def finish(self) -> tuple[list[tuple[str, pa.RecordBatch]], dict[str, int]]:
        """Every split has ended: emit what is left; returns the last ``(sink, batch)`` and the
        late rows of each windowed query's instance, by label.

        Raises:
            RuntimeError: a split's end never arrived.
        """
        runtime = self.runtime
        try:
            for q, merge in self.merges.items():
                if not merge.done:
                    missing = [merge.partitions[i] for i, e in enumerate(merge.ended) if not e]
                    raise RuntimeError(
                        f"instance {self.instance}: query {q}: no end of input from "
                        f"{', '.join(missing)}"
                    )
            runtime.drain()
            for node in runtime.nodes:
                node.on_finish()
            late = {w.query.label: w.late_rows() for w in self.windows.values()}
            return self.take(), late
        finally:
            for node in runtime.nodes:
                node.close()
            runtime.user_functions.close()


def write_results(
    driver: PipelineRuntime,
    batches: Sequence[tuple[str, pa.RecordBatch]],
    collected: list[tuple[str, pa.RecordBatch]] | None = None,
) -> None:
    """Hand workers' ``(sink, batch)`` to the driver's sinks (and to ``collected``)."""
    for sink, batch in batches:
        driver.deliver(sink, batch)
        if collected is not None:
            collected.append((sink, batch))


def summary_of(driver: PipelineRuntime, late: dict[str, int]) -> RunSummary:
    """The run's summary: the driver's sink rows and targets, late rows summed over instances."""
    base = driver.summary()
    return RunSummary(rows=base.rows, targets=base.targets, late_rows=late)


def run_local(
    spec: JobSpec, *, write: bool = True, source_workers: int | None = None
) -> tuple[RunSummary, list[tuple[str, pa.RecordBatch]]]:
    """The distributed dataflow in this process, without a cluster (for tests and as the
    reference of the Ray runtime): source workers run one after another, records are handed
    over directly. Returns the summary and every ``(sink, batch)``.

    Raises:
        PipelineSQLError, ConnectorError, QueryError: as an embedded run.
    """
    driver = spec.runtime()
    check_distributable(driver)
    windows = [WindowWorker(spec, i) for i in range(spec.parallelism)]
    collected: list[tuple[str, pa.RecordBatch]] = []
    if write:
        driver.open_sinks()
    ended = False
    try:
        for splits in assign_splits(driver, source_workers or spec.parallelism):
            worker = SourceWorker(spec, splits, lambda i, records: windows[i].put(records))
            write_results(driver, worker.run(), collected)
            for w in windows:
                write_results(driver, w.take(), collected)
        late: dict[str, int] = {}
        for w in windows:
            batches, counts = w.finish()
            write_results(driver, batches, collected)
            for label, rows in counts.items():
                late[label] = late.get(label, 0) + rows
        ended = True
    finally:
        if write:
            driver.close_sinks(ended=ended)
    return summary_of(driver, late), collected
