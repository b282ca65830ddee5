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

Rows that per-row queries insert into a sink straight from a source (no window in between)
travel to instance 0 as *direct* records, one per step of the split, and instance 0 hands them
to its sinks in the same merged order: so every row a job writes comes out of a window worker,
and a checkpoint's cut (below) splits them all.

**Checkpoints** (:meth:`WindowWorker.arm`): every instance consumes the same sequence of steps
per source (the round-robin over its splits), so a *position* (steps consumed) names the same
cut on every instance: per split, the batches read and whether it ended, the offset the
embedded file source checkpoints. The coordinator arms a barrier at a position ahead of every
instance; each instance stops consuming a source when it reaches the barrier's position (the
alignment: records of the sources that reached it queue), and once all have, writes each
windowed query's snapshot to the state root and marks the cut in its output (what came before
belongs to the checkpoint's epoch). An instance already past the position declines the
barrier (and one whose splits end before it, at the end of input): the coordinator tries again
further ahead. Restored (:class:`Restore`), an instance builds its operators from the
checkpoint's snapshots, merged and split by key group when the parallelism changed
(:mod:`.rescale`), and its merges from the cut; source workers start each split after its cut.

The transport is the caller's: ``send(instance, records)`` (a Ray actor call in
:mod:`.ray_runtime`, a direct call in :func:`run_local`). Records of one split arrive in order.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from flight_serve.connectors.file import FileSource
from flight_serve.engine.operator import OperatorSnapshot
from flight_serve.errors import CheckpointError, PipelineSQLError
from flight_serve.pipelines.checkpoint import CheckpointStore
from flight_serve.pipelines.distributed.keygroups import instances_of, key_group_range, key_groups
from flight_serve.pipelines.distributed.rescale import merge_snapshots, split_snapshot
from flight_serve.pipelines.graph import Collector, Node, PluginNode, Stream, WindowNode
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary
from flight_serve.types import MAX_WATERMARK_NS

if TYPE_CHECKING:
    from flight_serve.functions.python import SandboxConfig

__all__ = [
    "Cut",
    "ExchangeNode",
    "InstanceStatus",
    "JobSpec",
    "Record",
    "Restore",
    "SourceCut",
    "SourceWorker",
    "Taken",
    "WindowWorker",
    "assign_splits",
    "check_distributable",
    "direct_key",
    "fed_sources",
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
    #: rows the source read in this step (the whole batch's; 0 for an end)
    read_rows: int = 0
    #: a direct record's ``(sink, batch)`` (per-row queries' rows; module docstring)
    direct: tuple[tuple[str, pa.RecordBatch], ...] = ()

    @property
    def rows(self) -> int:
        shared = sum(b.num_rows for b, _ in self.shares if b is not None)
        return shared + sum(b.num_rows for _, b in self.direct)


def direct_key(ordinal: int) -> int:
    """The ``Record.query`` of the direct records of the ``ordinal``-th fed source
    (:func:`fed_sources`): negative, so it never is a query's index."""
    return -1 - ordinal


def fed_sources(runtime: PipelineRuntime) -> list[str]:
    """The file sources some query reads, in the plan's order (their direct records' order)."""
    return [name for name in runtime.sources if runtime.streams[name].consumers]


@dataclass(frozen=True)
class SourceCut:
    """Where a cut leaves one file source (picklable).

    Attributes:
        steps: per file (partition index), the steps consumed: its batches, plus 1 once its
            end was.
        ended: per file, whether its end was consumed.
        next_index: the file the round-robin reads next (``FileSource.next_index``).
        rows: rows read from the source before the cut.
    """

    steps: tuple[int, ...]
    ended: tuple[bool, ...]
    next_index: int
    rows: int

    @property
    def position(self) -> int:
        """Steps consumed over every file."""
        return sum(self.steps)

    @classmethod
    def of(cls, source: FileSource) -> SourceCut:
        """The cut a file source's offset names (restored from a checkpoint)."""
        steps = tuple(b + int(e) for b, e in zip(source.read_batches, source.ended, strict=True))
        return cls(steps, tuple(source.ended), source.next_index, source.rows)

    def apply(self, source: FileSource) -> None:
        """Set ``source``'s offset to this cut (``FileSource.snapshot`` then records it)."""
        source.read_batches = [s - int(e) for s, e in zip(self.steps, self.ended, strict=True)]
        source.ended = list(self.ended)
        source.next_index = self.next_index
        source.rows = self.rows


@dataclass(frozen=True)
class Cut:
    """One instance's part of a checkpoint (picklable): what it wrote at the barrier.

    Attributes:
        barrier: the barrier's number (a declined barrier's is not reused).
        epoch: the checkpoint's epoch (its directory in the state root).
        instance: the instance.
        operators: per windowed query index, ``{"file", "bytes", "label", "watermark_ns",
            "open_panes", "key_groups"}`` (``key_groups``: ``[first, stop)``).
        sources: the cut of every source this instance consumes, by name.
    """

    barrier: int
    epoch: int
    instance: int
    operators: dict[int, dict[str, Any]]
    sources: dict[str, SourceCut]


@dataclass(frozen=True)
class Restore:
    """The checkpoint a job resumes from, as its workers need it (picklable).

    Attributes:
        epoch: the checkpoint's epoch.
        operators: the manifest's operator entries by query index (as text): a distributed
            run's (``instances``: one file per instance) or an embedded run's (``file``).
        sources: the cut of every fed file source (from the manifest's source offsets).
    """

    epoch: int
    operators: dict[str, dict[str, Any]]
    sources: dict[str, SourceCut]


@dataclass(frozen=True)
class Taken:
    """What a window worker produced since the last :meth:`WindowWorker.take` (picklable).

    Attributes:
        before: ``(sink, batch)`` before the cut (all of them when ``cut`` is ``None``).
        cut: the cut the worker made, if any.
        after: ``(sink, batch)`` after the cut (they belong to the next epoch).
        declined: barriers the worker declined (it had passed their position, or its input
            ended before it).
    """

    before: list[tuple[str, pa.RecordBatch]]
    cut: Cut | None = None
    after: list[tuple[str, pa.RecordBatch]] = field(default_factory=list)
    declined: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobSpec:
    """What every worker needs to rebuild the pipeline (picklable).

    Attributes:
        sql: the pipeline file's text.
        path: the pipeline file (relative source paths start at its directory).
        output_dir: where relative sink paths start.
        parallelism: instances of every windowed query (≥ 1).
        max_parallelism: key groups (≥ parallelism).
        state_root: the checkpoints' state root (a path or ``pyarrow.fs`` URI every worker
            reaches), ``None``: no checkpoints.
        sandbox: how the workers run the pipeline's ``LANGUAGE python`` functions (the
            submitting server's: its hidden paths, ``--allow-unsandboxed-python``); ``None``:
            ``SandboxConfig()``.
        function_files: the code of its ``CREATE FUNCTION … USING '<file>'`` by path as
            written (what the server stored at submit); ``None``: read from the file's directory.
    """

    sql: str
    path: str
    output_dir: str
    parallelism: int
    max_parallelism: int
    state_root: str | None = None
    sandbox: SandboxConfig | None = None
    function_files: dict[str, bytes] | None = None

    def runtime(self, *, load_tables: bool = True) -> PipelineRuntime:
        """The pipeline's runtime, built as an embedded run builds it."""
        plan = parse_pipeline(self.sql, path=Path(self.path), function_files=self.function_files)
        return PipelineRuntime(
            plan, output_dir=Path(self.output_dir), load_tables=load_tables, sandbox=self.sandbox
        )


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
        for name in fed_sources(runtime)
        for index in range(len(runtime.sources[name].paths))
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


@dataclass
class _Split:
    """A file a source worker reads: its source, index, next step and batches."""

    source: str
    index: int
    seq: int
    batches: Iterator[pa.RecordBatch]
    exchanges: list[ExchangeNode]


class SourceWorker:
    """Reads its splits through the per-row nodes into the exchanges (module docstring).

    Args:
        spec: the job.
        splits: file indices per source this worker owns (:func:`assign_splits`).
        send: ``send(instance, records)``: the transport to window worker ``instance``.
        flush_rows: rows buffered per instance before a send (the exchange's batch size).
        flush_interval_s: seconds at most between a record's buffering and its send, in
            seconds (Flink's ``execution.buffer-timeout``, 100 ms by default there too): a slow
            source or per-row stage still feeds the window instances (and lets a checkpoint's
            barrier align) at least this often.
        start: per source, the cut of the checkpoint resumed from: each file starts after its
            cut (a file ended there is not read).

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
        flush_interval_s: float = 0.1,
        start: dict[str, SourceCut] | None = None,
    ) -> None:
        self.spec = spec
        self.splits = splits
        self.send = send
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._flushed_at = time.monotonic()
        self.start = start or {}
        self.runtime = runtime = spec.runtime()
        runtime.collect_only()
        self.roots = check_distributable(runtime)
        self.exchanges = {
            w.query.index: ExchangeNode(runtime, w, spec.parallelism, spec.max_parallelism)
            for w in runtime.window_nodes()
        }
        self.ordinals = {name: k for k, name in enumerate(fed_sources(runtime))}
        self._buffers: list[list[Record]] = [[] for _ in range(spec.parallelism)]
        self._buffered = [0] * spec.parallelism
        #: records and batches sent, rows read
        self.sent_records = 0
        self.sent_calls = 0
        self.rows_read = 0

    def _record(self, ex: ExchangeNode, split: int, seq: int, read_rows: int) -> None:
        step, ended = ex.take_step()
        for i, shares in enumerate(step):
            self._buffer(i, Record(ex.query.index, split, seq, tuple(shares), ended, read_rows))

    def _direct(self, source: str, split: int, seq: int, read_rows: int, end: bool) -> None:
        """The step's direct record to instance 0: the rows per-row queries inserted."""
        direct = tuple(self.runtime.take_collected())
        key = direct_key(self.ordinals[source])
        self._buffer(0, Record(key, split, seq, (), end, read_rows, direct))

    def _buffer(self, instance: int, record: Record) -> None:
        self._buffers[instance].append(record)
        self._buffered[instance] += record.rows
        if self._buffered[instance] >= self.flush_rows:
            self._flush(instance)

    def _flush(self, instance: int) -> None:
        records = self._buffers[instance]
        if records:
            self._buffers[instance] = []
            self._buffered[instance] = 0
            self.sent_records += len(records)
            self.sent_calls += 1
            self.send(instance, records)

    def run(self) -> None:
        """Read every split to its end (from its cut when restored).

        Raises:
            ConnectorError: a file cannot be read; QueryError: a per-row query fails.
        """
        runtime = self.runtime
        try:
            for node in runtime.nodes:
                if not isinstance(node, WindowNode):
                    node.start()
            # its splits one step each in turn (the embedded round-robin), so every split's
            # records reach the window actors at the same pace: their merges (and a barrier's
            # alignment) never wait for a split this worker has not started
            live: deque[_Split] = deque()
            for name, indices in self.splits.items():
                source = runtime.sources[name]
                exchanges = [ex for q, ex in self.exchanges.items() if self.roots[q] == name]
                cut = self.start.get(name)
                for index in indices:
                    if cut is not None and cut.ended[index]:
                        continue  # read to its end before the checkpoint
                    first = cut.steps[index] if cut is not None else 0
                    batches = islice(source.read_file(index), first, None)
                    live.append(_Split(name, index, first, batches, exchanges))
            while live:
                split = live.popleft()
                stream = runtime.streams[split.source]
                partition = runtime.sources[split.source].partitions[split.index]
                batch = next(split.batches, None)
                if batch is None:
                    runtime.end(stream, partition)
                    rows = 0
                else:
                    self.rows_read += batch.num_rows
                    runtime.push(stream, partition, batch)
                    rows = batch.num_rows
                for ex in split.exchanges:
                    self._record(ex, split.index, split.seq, rows)
                self._direct(split.source, split.index, split.seq, rows, end=batch is None)
                split.seq += 1
                if batch is not None:
                    live.append(split)
                if time.monotonic() - self._flushed_at >= self.flush_interval_s:
                    for i in range(self.spec.parallelism):
                        self._flush(i)
                    self._flushed_at = time.monotonic()
            for i in range(self.spec.parallelism):
                self._flush(i)
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
    #: per split, the steps consumed; their sum (the position); rows the source read in them
    steps: list[int] = field(default_factory=list)
    position: int = 0
    rows: int = 0

    def __post_init__(self) -> None:
        n = len(self.partitions)
        self.queues = [deque() for _ in range(n)]
        self.expected = [0] * n
        self.ended = [False] * n
        self.steps = [0] * n

    def restore(self, cut: SourceCut) -> None:
        """Continue after ``cut`` (the checkpoint's position of this merge's source)."""
        self.steps = list(cut.steps)
        self.expected = list(cut.steps)
        self.ended = list(cut.ended)
        self.next_index = cut.next_index
        self.position = cut.position
        self.rows = cut.rows

    def cut(self) -> SourceCut:
        """Where the merge is now."""
        return SourceCut(tuple(self.steps), tuple(self.ended), self.next_index, self.rows)

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
        self.steps[index] += 1
        self.position += 1
        self.rows += record.read_rows
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
        records_in: exchange records received for its windowed queries (one per split step;
            instance 0's direct records are not counted).
        rows_in: rows in those records.
        rows_out: rows its queries produced (the windows' results and what runs after them).
        watermark_ns: the lowest operator watermark over its windowed queries, ns since the
            epoch (``MAX_WATERMARK_NS`` once every split has ended; ``None`` before any input).
        queued_records: exchange records received and not run yet (the rest of a ``put``
            call's records, those waiting for another split's record: the embedded order, and
            those held at an armed barrier): the instance's input backlog.
        queued_records_max: the most seen after any step of a split (a record processed).
        open_panes: pane rows held in state now (one per key and open window).
        open_panes_max: the most seen after any step.
        state_bytes: window state bytes held now
            (:attr:`~flight_serve.engine.operator.WindowOperator.state_bytes`).
        state_bytes_max: the most seen after any step.
        pid: the id of the process it runs in (a Ray worker's).
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
    pid: int = 0


class WindowWorker:
    """Instance ``instance`` of every windowed query and what runs after it (module docstring);
    instance 0 also hands on the direct records' rows.

    Args:
        spec: the job.
        instance: ``0 … parallelism - 1``.
        restore: the checkpoint to resume from (``None``: from the start).

    Raises:
        PipelineSQLError: building the pipeline fails, or it cannot be distributed.
        CheckpointError: the checkpoint's state cannot be read or does not fit the query.
    """

    def __init__(self, spec: JobSpec, instance: int, restore: Restore | None = None) -> None:
        self.spec = spec
        self.instance = instance
        self.runtime = runtime = spec.runtime()
        runtime.collect_only()
        roots = check_distributable(runtime)
        self.windows = {w.query.index: w for w in runtime.window_nodes()}
        #: the merge of every windowed query, and on instance 0 of every fed source's direct
        #: records; the source each reads
        self.merges = {q: _Merge(runtime.sources[roots[q]].partitions) for q in self.windows}
        self.roots = {q: roots[q] for q in self.windows}
        if instance == 0:
            for k, name in enumerate(fed_sources(runtime)):
                self.merges[direct_key(k)] = _Merge(runtime.sources[name].partitions)
                self.roots[direct_key(k)] = name
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
        #: the barrier armed: ``(barrier, epoch, position per source)``
        self._armed: tuple[int, int, dict[str, int]] | None = None
        #: output held for :meth:`take`, and the cut in it (its index)
        self._out: list[tuple[str, pa.RecordBatch]] = []
        self._cut: tuple[int, Cut] | None = None
        self._declined: list[int] = []
        if restore is not None:
            self._restore(restore)
        for node in runtime.nodes:
            node.start()

    # --- restoring --------------------------------------------------------------------------

    def _restore(self, restore: Restore) -> None:
        assert self.spec.state_root is not None
        store = CheckpointStore(self.spec.state_root)
        for q, window in self.windows.items():
            snapshot = self._snapshot_of(store, restore, q, window)
            try:
                window.op = window.query.window.build(  # type: ignore[union-attr]
                    window.input.schema,
                    restore=snapshot,
                    clock_ns=self.runtime.clock_ns,
                    wall_clock_ns=self.runtime.wall_clock_ns,
                )
            except CheckpointError as exc:
                raise CheckpointError(f"{window.query.label}: {exc}") from exc
            window.finished = window.op.watermark_ns == MAX_WATERMARK_NS
        for key, merge in self.merges.items():
            cut = restore.sources.get(self.roots[key])
            if cut is None:
                raise CheckpointError(
                    f"checkpoint {restore.epoch} has no offsets of source {self.roots[key]}; "
                    "start over with --fresh"
                )
            merge.restore(cut)

    def _snapshot_of(
        self, store: CheckpointStore, restore: Restore, q: int, window: WindowNode
    ) -> OperatorSnapshot:
        """This instance's share of query ``q``'s state in the checkpoint: its own file when
        the checkpoint was taken with the same instances, else every instance's (or the
        embedded operator's) merged and split by key group (a rescale)."""
        entry = restore.operators.get(str(q))
        if entry is None:
            raise CheckpointError(
                f"checkpoint {restore.epoch} has no state for {window.query.label}; start "
                "over with --fresh"
            )
        spec = self.spec
        parts = entry.get("instances")
        if (
            parts is not None
            and len(parts) == spec.parallelism
            and entry.get("max_parallelism") == spec.max_parallelism
        ):
            file = str(parts[self.instance]["file"])
            return OperatorSnapshot.from_bytes(store.read(restore.epoch, file))
        if parts is not None:
            whole = merge_snapshots(
                [
                    OperatorSnapshot.from_bytes(store.read(restore.epoch, str(part["file"])))
                    for part in parts
                ]
            )
        else:
            whole = OperatorSnapshot.from_bytes(store.read(restore.epoch, str(entry["file"])))
        keys = window.op.config.key_columns
        return split_snapshot(whole, keys, spec.parallelism, spec.max_parallelism)[self.instance]

    # --- running ----------------------------------------------------------------------------

    def put(self, records: Sequence[Record]) -> None:
        """Take records from a source worker and run every query as far as the embedded order
        (and an armed barrier) allows.

        Raises:
            RuntimeError: a split's records out of order (a transport bug).
            QueryError, InvalidInputError: a query fails on a batch.
            CheckpointError: the state root cannot be written at a barrier.
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
            if record.query >= 0:  # a windowed query's (direct records are not counted)
                self.records_in += 1
                self.rows_in += record.rows
        self._advance()

    def _advance(self) -> None:
        """Consume every merge up to what has arrived or the armed barrier's position."""
        armed = self._armed
        for key, merge in self.merges.items():
            limit = armed[2].get(self.roots[key]) if armed is not None else None
            while limit is None or merge.position < limit:
                step = merge.next()
                if step is None:
                    break
                self._step(key, merge, step)
        if armed is not None:
            self._at_barrier(armed)

    def _step(self, key: int, merge: _Merge, step: Record) -> None:
        partition = merge.partitions[step.split]
        if key < 0:  # a direct record: per-row queries' rows, in the merged order
            for sink, rows in step.direct:
                self.runtime.deliver(sink, rows)
            return
        window = self.windows[key]
        for batch, progress in step.shares:
            if batch is None:
                empty = self._empty[key]
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

    # --- barriers ---------------------------------------------------------------------------

    def position(self) -> dict[str, int]:
        """Steps consumed per source (the furthest of its merges)."""
        out: dict[str, int] = {}
        for key, merge in self.merges.items():
            name = self.roots[key]
            out[name] = max(out.get(name, 0), merge.position)
        return out

    def arm(self, barrier: int, epoch: int, positions: dict[str, int]) -> bool:
        """Arm barrier ``barrier`` of checkpoint ``epoch`` at ``positions`` (steps per source):
        consume up to there, then cut (module docstring). ``False``: declined, a merge is past
        its position already (nothing is armed)."""
        if self._armed is not None or self._cut is not None:
            return False
        for key, merge in self.merges.items():
            if merge.position > positions.get(self.roots[key], -1):
                return False
        self._armed = (barrier, epoch, dict(positions))
        self._advance()
        return True

    def disarm(self, barrier: int) -> None:
        """Drop barrier ``barrier`` if it is still armed (another instance declined it)."""
        if self._armed is not None and self._armed[0] == barrier:
            self._armed = None
            self._advance()

    def _at_barrier(self, armed: tuple[int, int, dict[str, int]]) -> None:
        barrier, epoch, positions = armed
        at = [merge.position == positions[self.roots[k]] for k, merge in self.merges.items()]
        if all(at):
            self._armed = None
            self._take_cut(barrier, epoch)
            self._advance()
        elif any(
            merge.done and merge.position < positions[self.roots[k]]
            for k, merge in self.merges.items()
        ):  # its input ends before the barrier: it never gets there
            self._armed = None
            self._declined.append(barrier)
            self._advance()

    def _take_cut(self, barrier: int, epoch: int) -> None:
        """Write every windowed query's snapshot to the state root; mark the cut."""
        spec = self.spec
        assert spec.state_root is not None, "a job without a state root takes no checkpoint"
        store = CheckpointStore(spec.state_root)
        groups = key_group_range(self.instance, spec.parallelism, spec.max_parallelism)
        operators: dict[int, dict[str, Any]] = {}
        for q, window in self.windows.items():
            name = f"op-{q}-i{self.instance}.snapshot"
            data = window.op.snapshot().to_bytes()
            store.put(epoch, name, data)
            operators[q] = {
                "file": name,
                "bytes": len(data),
                "label": window.query.label,
                "watermark_ns": window.op.watermark_ns,
                "open_panes": window.op.open_panes,
                "key_groups": [groups.start, groups.stop],
            }
        sources = {self.roots[k]: merge.cut() for k, merge in self.merges.items()}
        self._out.extend(self.runtime.take_collected())
        self._cut = (len(self._out), Cut(barrier, epoch, self.instance, operators, sources))

    # --- status and output ------------------------------------------------------------------

    def _queued(self) -> int:
        return sum(len(q) for k, m in self.merges.items() if k >= 0 for q in m.queues)

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
            pid=os.getpid(),
        )

    def take(self) -> Taken:
        """The ``(sink, batch)`` produced since the last call, split at the cut if one was
        made, and the barriers declined."""
        out = self._out + self.runtime.take_collected()
        self._out = []
        self.rows_out += sum(batch.num_rows for _, batch in out)
        declined = tuple(self._declined)
        self._declined.clear()
        if self._cut is None:
            return Taken(out, declined=declined)
        at, cut = self._cut
        self._cut = None
        return Taken(out[:at], cut, out[at:], declined)

    def finish(self, final: tuple[int, int] | None = None) -> tuple[Taken, dict[str, int]]:
        """Every split has ended: emit what is left; returns the last output and the late rows
        of each windowed query's instance, by label. ``final``: ``(barrier, epoch)`` of the
        finished checkpoint: the state after the end is cut there too.

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
            if self._armed is not None:
                self._declined.append(self._armed[0])
                self._armed = None
            if final is not None:
                self._take_cut(*final)
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
            worker.run()
            for w in windows:
                write_results(driver, w.take().before, collected)
        late: dict[str, int] = {}
        for w in windows:
            taken, counts = w.finish()
            write_results(driver, taken.before, collected)
            for label, rows in counts.items():
                late[label] = late.get(label, 0) + rows
        ended = True
    finally:
        if write:
            driver.close_sinks(ended=ended)
    return summary_of(driver, late), collected
