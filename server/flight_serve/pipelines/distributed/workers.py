"""The workers of a distributed run, without any cluster: the same graph nodes, split by key.

A job has two kinds of worker, each building the pipeline's ordinary
:class:`~flight_serve.pipelines.runtime.PipelineRuntime` from the same SQL and driving part of it:

* a **source worker** (:class:`SourceWorker`) owns some *splits*: files of the file sources (a
  file is a watermark partition, as embedded), or parts of a Parquet file's row groups when a
  source has fewer files than workers (:class:`FileSplit`: the file's own batches, each with
  its step, so the window workers still consume the file's batches in order). It reads them
  batch by batch through the per-row nodes; in front of every windowed query that reads a source (through per-row nodes only) sits
  an :class:`ExchangeNode` in place of the window: it hashes each batch's rows by the query's key
  columns to key groups to instances (:mod:`.keygroups`) and records, per *step* of the file (one
  source batch, or its end), each instance's share and the whole batch's progress (its maximum
  event time). Rows of per-row queries that insert into a sink directly are collected and sent
  to the driver;
* a **window worker** (:class:`WindowWorker`), instance ``i`` of ``parallelism``, runs instance
  ``i`` of every windowed query (the real :class:`~flight_serve.pipelines.graph.WindowNode`) and
  everything downstream of it (views, late side outputs, sinks). It consumes each query's steps in
  the order the embedded run polls the files (round-robin, one step each in turn,
  ``FileSource.poll``), so every instance judges every row against the watermark the embedded
  operator had at that row, and the union of the instances' output equals the embedded run's,
  row for row. Each partition's watermark is the split's (from the progress sent with every
  share, also an empty one), and the operator's watermark is the minimum over its input
  channels, as embedded; a split's end flows through as its partition's end.

**The second exchange** (a windowed query reading another windowed query's output, or its late
side output, through per-row nodes: *stage 2*; a third reads a second's the same way). Embedded,
stage 1's output is a stream with one partition (the view, or ``LATE(…)``): each call of stage
1's operator (one per input batch, and one at a partition's end) emits its results as **one**
batch, which per-row views pass on as one batch (or none, when they keep no row), and stage 2
processes it as one batch: its rows are judged against stage 2's watermark before the batch,
then the batch's maximum event time moves that watermark (DESIGN §4). Its input's end is stage
1's watermark reaching +∞ (the last file's end). So, distributed:

* on every window worker a :class:`StageExchange` sits in front of stage 2 (in place of the
  window, as the source workers' exchange does): for each **slot** (one call of stage 1's
  operator on this instance: every instance makes the same calls, one per share and one per
  end, since every instance gets a share of every batch) it hashes what reached it by stage 2's
  keys and keeps, per stage-2 instance, its share and the progress of what reached it (the
  maximum event time after stage 2's ``WHERE``), or ``None`` when nothing reached it;
* after each step of stage 1 (position ``n`` of its source), every instance sends every stage-2
  instance one record (``seq = n``, ``split`` = the sender) with its slots, also when every
  slot is empty (the record carries the step) and the end when stage 1 ended its output;
* a stage-2 instance (:class:`_Gather`) runs step ``n`` only when every instance's record ``n``
  is there, slot by slot: it processes the **union** of the instances' shares (in instance
  order) with the maximum of their progress as one batch, and skips a slot in which nothing
  reached stage 2 on any instance (the embedded node got no batch then). So every stage-2
  instance sees the embedded batches with the embedded watermark before and after each, and
  its output is its key groups' part of the embedded output.

Rows within one union come in instance order, not in the embedded batch's order (stage 1's
results ordered by window end, start and keys over all instances). No aggregate's result
depends on that order except in the last bits of a float ``sum`` / ``avg`` / ``stddev`` / ``var``
(summation order; a rescale or a different ``merge_rows`` changes those bits as well):
``first_value`` / ``last_value`` break a tie of equal event times by value, not by arrival
(:mod:`flight_serve.engine.aggregate`), and count, min, max, count(DISTINCT) and the sketches
are order-free. A table function between two windowed queries is refused: it would see each
instance's share of stage 1's results instead of all of them.

**A stream source** (:mod:`.streams`): every source worker reads the whole log and owns some of
its writers; an entry's owner sends every instance a record numbered by the entry's offset
(every offset has one), and each instance consumes them in offset order (:class:`_LogMerge`),
the embedded order: so a stream's position is its offset, its cut (:class:`~.streams.StreamCut`)
is the embedded source's checkpoint offset, and the second exchange numbers its records by
offsets. What the embedded source decides when it opens (the writers it starts with) comes
from the driver (:class:`~.streams.StreamStart`). Idle partitions are re-evaluated when the
driver ticks the instances (:meth:`WindowWorker.tick`).

**An Iceberg source** (:mod:`.tables`): the driver plans the snapshots to read and their data
files; the files are dealt to the source workers by index, each read as the embedded reader
reads it (its batches never cross files), and every instance consumes the files in plan order,
each to its end (:class:`_TableMerge`); the position counts snapshots, so a cut falls between
snapshots as embedded (:class:`~.tables.TableCut`).

What the keyed exchange cannot run yet is refused when the job is built
(:func:`check_distributable`): live sources other than server streams and Iceberg tables read
to ``stop_at`` (datagen, a Flight ticket, a table watched for new snapshots), plugin
functions, a table function between two windowed queries, a windowed query over an Iceberg
table that another windowed query reads, and an ``idle_timeout`` on a stream query whose
results another windowed query reads.

Rows that per-row queries insert into a sink straight from a source (no window in between)
travel to instance 0 as *direct* records, one per step of the split, and instance 0 hands them
to its sinks in the same merged order: so every row a job writes comes out of a window worker,
and a checkpoint's cut (below) splits them all.

**Checkpoints** (:meth:`WindowWorker.arm`): every instance consumes the same sequence of steps
per source (the round-robin over its splits), so a *position* (steps consumed) names the same
cut on every instance: per split, the batches read and whether it ended, the offset the
embedded file source checkpoints. A stage-2 query's steps are numbered by the same position
(the step of its source that stage 1 was running), so the same position cuts it. The coordinator
arms a barrier at a position ahead of every instance; each instance stops consuming a source
when it reaches the barrier's position (the alignment: records of the sources that reached it
queue, and the stage-2 records of steps at or after it), and once all its queries have, writes
each windowed query's snapshot to the state root and marks the cut in its output (what came
before belongs to the checkpoint's epoch). Nothing between the stages is stored: at the cut,
stage 2 on every instance has run every record of the steps before the position (it cannot
cut before), and the records of the later steps are sent again after a restore, when every
instance's stage 1 runs those steps again. An instance already past the position declines the
barrier (and one whose splits end before it, at the end of input): the coordinator tries again
further ahead. Restored (:class:`Restore`), an instance builds its operators from the
checkpoint's snapshots, merged and split by key group when the parallelism changed
(:mod:`.rescale`), and its merges from the cut; source workers start each split after its cut.

**The end**: stage 1 ends its output in the step of its source's last file end (its watermark
reaches +∞ there), so stage 2's end arrives as a record of that step; the ``finish`` of the
embedded run (``drain``, ``on_finish``) emits nothing more from a window whose input ended,
and :meth:`WindowWorker.finish` checks that (a stage-2 record made then would have nowhere to
go). The driver calls ``finish`` after every record, stage 2's included, is delivered.

The transport is the caller's: ``send(instance, records)`` from a source worker, and
:meth:`WindowWorker.outgoing` for the stage-2 records a window worker made for the other
instances (a Ray actor call in :mod:`.ray_runtime`, a direct call in :func:`run_local`). The
records from one sender arrive in order; a window worker never waits on another.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
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
from flight_serve.pipelines.distributed.streams import (
    LogEntry,
    StreamCut,
    StreamReader,
    StreamSplit,
    StreamStart,
    fed_streams,
    stream_starts,
)
from flight_serve.pipelines.distributed.tables import (
    TableCut,
    TablePlan,
    TableSplit,
    fed_tables,
    read_file,
    table_plans,
)
from flight_serve.pipelines.graph import (
    Collector,
    Node,
    PluginNode,
    Stream,
    WindowNode,
    one_batch,
)
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary
from flight_serve.types import MAX_WATERMARK_NS

if TYPE_CHECKING:
    from flight_serve.functions.python import SandboxConfig

__all__ = [
    "Cut",
    "ExchangeNode",
    "FileSplit",
    "InstanceStatus",
    "JobSpec",
    "Record",
    "Restore",
    "SourceCut",
    "SourceWorker",
    "Splits",
    "StageExchange",
    "StreamCut",
    "StreamSplit",
    "StreamStart",
    "TableCut",
    "TablePlan",
    "TableSplit",
    "Taken",
    "WindowInput",
    "WindowWorker",
    "assign_splits",
    "check_distributable",
    "direct_key",
    "fed_sources",
    "idle_ticks",
    "run_local",
    "window_inputs",
]

#: A walk of the window state for the status maxima shorter than this (seconds) is taken after
#: every step; a longer one at most every 20 times its time (``WindowWorker._sample``).
_SAMPLE_EXACT_S = 0.001

#: One instance's share of one input batch: its rows (``None``: none) and the whole batch's
#: progress (ns since the epoch, ``None``: no row with a valid time).
Share = tuple[pa.RecordBatch | None, int | None]


@dataclass(frozen=True)
class Record:
    """One step of one split for one instance of one windowed query.

    Attributes:
        query: the windowed query's index in the plan.
        split: the file's index in its source (its watermark partition); for a windowed query
            reading another's output (a second exchange), the upstream instance that sent it.
        seq: the step's number within the split (0, 1, …), checked on arrival; for a second
            exchange, the step of the source (its position) the upstream ran.
        shares: what reached the window in this step (none when a per-row query filtered the
            whole batch out; several after a table function). For a second exchange one entry
            per slot (a call of the upstream operator), ``None`` when nothing reached the
            query from the sender in that slot.
        end: the step is the split's end of input (for a second exchange: the upstream ended
            its output in this step).
    """

    query: int
    split: int
    seq: int
    shares: tuple[Share | None, ...]
    end: bool = False
    #: rows the source read in this step (the whole batch's; 0 for an end)
    read_rows: int = 0
    #: a direct record's ``(sink, batch)`` (per-row queries' rows; module docstring)
    direct: tuple[tuple[str, pa.RecordBatch], ...] = ()
    #: a stream's record (``seq`` is the entry's offset): the writer (``None``: an entry
    #: without one), its watermark marker, whether it is the writer's first entry, whether
    #: the stream ends with it, and the writers ``stop_at_end`` ends in it
    partition: str | None = None
    watermark_ns: int | None = None
    new: bool = False
    last: bool = False
    closes: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        shared = sum(s[0].num_rows for s in self.shares if s is not None and s[0] is not None)
        return shared + sum(b.num_rows for _, b in self.direct)


def direct_key(ordinal: int) -> int:
    """The ``Record.query`` of the direct records of the ``ordinal``-th fed source
    (:func:`fed_sources`): negative, so it never is a query's index."""
    return -1 - ordinal


def fed_sources(runtime: PipelineRuntime) -> list[str]:
    """The file, stream and Iceberg sources some query reads, in the plan's order, files first
    (their direct records' order)."""
    files = [name for name in runtime.sources if runtime.streams[name].consumers]
    return files + fed_streams(runtime) + fed_tables(runtime)


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

    @property
    def finished(self) -> bool:
        """Whether every file had ended at the cut."""
        return all(self.ended)

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


#: Where a cut leaves a source: a file source's steps, a stream's offset, an Iceberg
#: source's snapshots.
AnyCut = SourceCut | StreamCut | TableCut


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
    sources: dict[str, AnyCut]


@dataclass(frozen=True)
class Restore:
    """The checkpoint a job resumes from, as its workers need it (picklable).

    Attributes:
        epoch: the checkpoint's epoch.
        operators: the manifest's operator entries by query index (as text): a distributed
            run's (``instances``: one file per instance) or an embedded run's (``file``).
        sources: the cut of every fed file and stream source (from the manifest's source
            offsets).
    """

    epoch: int
    operators: dict[str, dict[str, Any]]
    sources: dict[str, AnyCut]


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
        stream_server: ``(Flight location, bearer token or None)`` of the server whose streams
            its ``flight`` connectors without a ``server`` option name (a job a server
            submitted: the workers read the server's streams over Flight); ``None``: none.
    """

    sql: str
    path: str
    output_dir: str
    parallelism: int
    max_parallelism: int
    state_root: str | None = None
    sandbox: SandboxConfig | None = None
    function_files: dict[str, bytes] | None = None
    stream_server: tuple[str, str | None] | None = None

    def runtime(self, *, load_tables: bool = True) -> PipelineRuntime:
        """The pipeline's runtime, built as an embedded run builds it."""
        plan = parse_pipeline(self.sql, path=Path(self.path), function_files=self.function_files)
        return PipelineRuntime(
            plan,
            output_dir=Path(self.output_dir),
            load_tables=load_tables,
            sandbox=self.sandbox,
            stream_server=self.stream_server,
        )


@dataclass(frozen=True)
class WindowInput:
    """Where a windowed query's rows come from (:func:`window_inputs`).

    Attributes:
        source: the file source at the root of its input (the steps that number its records).
        upstream: the windowed query (index) whose output or late side output it reads through
            per-row nodes (a second exchange), ``None``: it reads ``source`` through per-row
            nodes (the source workers' exchange).
        late: it reads ``upstream``'s late side output.
    """

    source: str
    upstream: int | None = None
    late: bool = False


def window_inputs(runtime: PipelineRuntime) -> dict[int, WindowInput]:
    """Every windowed query's input, by query index, in build order.

    Raises:
        PipelineSQLError: an input comes from a live source or through a plugin stage, or a
            table function stands between two windowed queries (the module docstring).
    """
    from flight_serve.pipelines.function_nodes import TableFunctionNode

    producers = {id(n.output): n for n in runtime.nodes if n.output is not None}
    roots = {*runtime.sources, *fed_streams(runtime), *fed_tables(runtime)}
    late_of = {id(s): q for q, s in runtime.late_streams.items()}
    labels = {w.query.index: w.query.label for w in runtime.window_nodes()}
    out: dict[int, WindowInput] = {}
    for window in runtime.window_nodes():
        label = window.query.label
        stream: Stream = window.input
        through: TableFunctionNode | None = None
        while True:
            if stream.name in roots and runtime.streams.get(stream.name) is stream:
                out[window.query.index] = WindowInput(stream.name)
                break
            if stream.name in runtime.flight_sources:
                raise PipelineSQLError(
                    f"{label}: reads the live source {stream.name}; the distributed runtime "
                    "splits file sources and server streams only so far (docs/scaling.md)"
                )
            producer = producers.get(id(stream))
            upstream = late_of.get(id(stream))
            if upstream is None and isinstance(producer, WindowNode):
                upstream = producer.query.index
            if upstream is not None:
                if through is not None:
                    raise PipelineSQLError(
                        f"{label}: reads the results of {labels[upstream]} through the table "
                        f"function {through.spec.name}; between two windowed queries it would "
                        "see each instance's share of the results, not all of them: run it "
                        "embedded (docs/scaling.md)"
                    )
                # built after its upstream (the runtime builds a query once its input exists)
                source = out[upstream].source
                out[window.query.index] = WindowInput(source, upstream, id(stream) in late_of)
                break
            if producer is None:
                raise PipelineSQLError(f"{label}: cannot trace its input {stream.name}")
            if isinstance(producer, PluginNode):
                raise PipelineSQLError(
                    f"{label}: its input goes through the plugin function "
                    f"{producer.function.name}; plugins run on a server, not in the "
                    "distributed runtime"
                )
            if isinstance(producer, TableFunctionNode):
                through = producer
            stream = producer.input
    return out


def check_distributable(runtime: PipelineRuntime) -> dict[int, str]:
    """The root source (a file or stream source) of every windowed query, by query index
    (:func:`window_inputs`).

    Raises:
        PipelineSQLError: what the module docstring lists as not distributed yet.
    """
    streams = fed_streams(runtime)
    tables = fed_tables(runtime)
    for name, source in runtime.flight_sources.items():
        if runtime.streams[name].consumers and name not in streams + tables:
            raise PipelineSQLError(
                f"SOURCE {name}: a live source ({type(source).__name__}); the distributed "
                "runtime splits file sources, server streams and Iceberg tables only so far "
                "(docs/scaling.md)"
            )
        if name in tables and not getattr(source, "stop_at_end", False):
            raise PipelineSQLError(
                f"SOURCE {name}: an Iceberg source without stop_at: the distributed runtime "
                "reads a bounded range of snapshots so far (stop_at = 'latest' or a snapshot "
                "id; docs/scaling.md)"
            )
    for node in runtime.nodes:
        if isinstance(node, PluginNode):
            raise PipelineSQLError(
                f"FUNCTION {node.function.name}: plugins run on a server, not in the "
                "distributed runtime"
            )
    inputs = window_inputs(runtime)
    read = {entry.upstream for entry in inputs.values() if entry.upstream is not None}
    for window in runtime.window_nodes():
        q = window.query.index
        if q in read and inputs[q].source in tables:
            raise PipelineSQLError(
                f"{window.query.label}: reads the Iceberg table {inputs[q].source}, and "
                "another windowed query reads its results: the second exchange over an "
                "Iceberg source is not built yet (docs/scaling.md); run it embedded"
            )
        if q in read and inputs[q].source in streams and idle_ticks(window):
            raise PipelineSQLError(
                f"{window.query.label}: idle_timeout over the stream {inputs[q].source}, and "
                "another windowed query reads its results: an idle partition fires its "
                "windows at a processing time each instance meets on its own, which the "
                "second exchange cannot number; drop idle_timeout there or run it embedded "
                "(docs/scaling.md)"
            )
    return {q: entry.source for q, entry in inputs.items()}


def idle_ticks(window: WindowNode) -> bool:
    """Whether a windowed query fires on processing time (``idle_timeout``, so also
    ``idle_watermark_advance``): over a stream, its instances tick."""
    return window.op.config.idle_timeout is not None


@dataclass(frozen=True)
class FileSplit:
    """What a source worker reads of one file (picklable): the whole file, or part ``part`` of
    ``parts`` of a Parquet file's row groups (:meth:`FileSource.read_part
    <flight_serve.connectors.file.FileSource.read_part>`: the batches starting in its row
    groups ``g % parts == part``). Part 0 sends the file's end.

    Attributes:
        file: the file's index in its source (its watermark partition).
        part: ``0 … parts - 1``.
        parts: readers of the file (1: the whole file).
    """

    file: int
    part: int = 0
    parts: int = 1


#: What a source worker owns: per source, its files (an index: the whole file) or parts, or
#: its channel of a stream (one :class:`StreamSplit`) or of an Iceberg source's data files
#: (one :class:`TableSplit`).
Splits = dict[str, list[FileSplit | StreamSplit | TableSplit]]


def assign_splits(runtime: PipelineRuntime, workers: int) -> list[Splits]:
    """Every file of every file source that feeds a query, dealt round-robin to ``workers``
    source workers (fewer when there are fewer splits; at least one): per worker, its splits
    of each source. A stream source is read by all ``workers``, each owning some of its
    writers (:class:`StreamSplit`; :mod:`.streams`); an Iceberg source's data files are dealt
    to all ``workers`` by index (:class:`TableSplit`; :mod:`.tables`).

    With fewer files than workers, a Parquet file with several row groups is read in parts
    (interleaved row groups: ``ceil(workers / files)`` parts at most, one per row group at
    most), so a single large file is read by several workers; the window workers consume its
    batches in order all the same (the module docstring), so the output does not change.

    Raises:
        ConnectorError: a Parquet file's footer cannot be read.
    """
    files = [
        (name, index)
        for name in fed_sources(runtime)
        if name in runtime.sources
        for index in range(len(runtime.sources[name].paths))
    ]
    per_file = -(-workers // len(files)) if files and len(files) < workers else 1
    splits: list[tuple[str, FileSplit]] = []
    for name, index in files:
        parts = 1
        if per_file > 1 and runtime.sources[name].format == "parquet":
            parts = max(1, min(per_file, len(runtime.sources[name].row_groups(index))))
        splits += [(name, FileSplit(index, part, parts)) for part in range(parts)]
    streams = fed_streams(runtime)
    tables = fed_tables(runtime)
    count = max(1, min(workers, len(splits)))
    if streams or tables:
        count = max(count, workers)
    out: list[Splits] = [{} for _ in range(count)]
    for k, (name, split) in enumerate(splits):
        out[k % (min(workers, len(splits)) or 1)].setdefault(name, []).append(split)
    for name in streams:
        for channel in range(count):
            out[channel][name] = [StreamSplit(channel, count)]
    for name in tables:  # the files are the attempt's plan's: dealt by index
        for channel in range(count):
            out[channel][name] = [TableSplit(channel, count)]
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


class StageExchange(ExchangeNode):
    """In a window worker, the second exchange in place of a windowed query reading another's
    output (the module docstring): per *slot* (a call of the upstream operator), what reached
    the query split by instance, with its progress, or nothing.

    Raises (:meth:`process`):
        RuntimeError: two batches reached it in one slot (a graph this exchange cannot carry).
    """

    def __init__(
        self, out: Collector, window: WindowNode, parallelism: int, max_parallelism: int
    ) -> None:
        super().__init__(out, window, parallelism, max_parallelism)
        self.slot: list[Share] | None = None
        self.slots: list[list[Share | None]] = [[] for _ in range(parallelism)]

    def process(self, partition: str, batch: pa.RecordBatch) -> None:
        if self.slot is not None:
            raise RuntimeError(
                f"{self.query.label}: two batches from one call of the windowed query it reads"
            )
        self.step = [[] for _ in range(self.parallelism)]
        super().process(partition, batch)
        self.slot = [shares[0] for shares in self.step]

    def close_slot(self) -> None:
        """The upstream operator's call is over: record what reached the query in it."""
        for i in range(self.parallelism):
            self.slots[i].append(self.slot[i] if self.slot is not None else None)
        self.slot = None

    def take_slots(self) -> tuple[list[list[Share | None]], bool]:
        """This step's slots per instance and whether the input ended in it; resets both."""
        slots, ended = self.slots, self.ended
        self.slots = [[] for _ in range(self.parallelism)]
        self.ended = False
        return slots, ended


Send = Callable[[int, list[Record]], None]


@dataclass
class _Split:
    """A file (or part) a source worker reads: its source, index, ``(step, batch)`` and
    exchanges; whether it sends the file's end, and at which step (``None``: the step after
    its last batch, a whole file's)."""

    source: str
    index: int
    batches: Iterator[tuple[int, pa.RecordBatch]]
    exchanges: list[ExchangeNode]
    sends_end: bool
    end: int | None
    next: int = 0


class SourceWorker:
    """Reads its splits through the per-row nodes into the exchanges (module docstring).

    Args:
        spec: the job.
        splits: the files (an index: the whole file) or parts of files per source this
            worker owns, and its channel of each stream source (:func:`assign_splits`).
        send: ``send(instance, records)``: the transport to window worker ``instance``.
        flush_rows: rows buffered per instance before a send (the exchange's batch size).
        flush_interval_s: seconds at most between a record's buffering and its send, in
            seconds (Flink's ``execution.buffer-timeout``, 100 ms by default there too): a slow
            source or per-row stage still feeds the window instances (and lets a checkpoint's
            barrier align) at least this often.
        start: per file source, the cut of the checkpoint resumed from: each file starts after
            its cut (a file ended there is not read).
        streams: where every stream source starts (:func:`~.streams.stream_starts`: the
            driver's; required when ``splits`` holds a stream).
        tables: what every Iceberg source reads (:func:`~.tables.table_plans`: the driver's;
            required when ``splits`` holds one).

    Raises:
        PipelineSQLError: building the pipeline fails, or it cannot be distributed.
    """

    def __init__(
        self,
        spec: JobSpec,
        splits: Mapping[str, Sequence[int | FileSplit | StreamSplit | TableSplit]],
        send: Send,
        *,
        flush_rows: int = 1 << 16,
        flush_interval_s: float = 0.1,
        start: Mapping[str, AnyCut] | None = None,
        streams: Mapping[str, StreamStart] | None = None,
        tables: Mapping[str, TablePlan] | None = None,
    ) -> None:
        self.spec = spec
        self.splits: Splits = {
            name: [
                e if isinstance(e, FileSplit | StreamSplit | TableSplit) else FileSplit(e)
                for e in owned
            ]
            for name, owned in splits.items()
        }
        self.send = send
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._flushed_at = time.monotonic()
        self.start = {k: c for k, c in (start or {}).items() if isinstance(c, SourceCut)}
        self.streams = dict(streams or {})
        self.tables = dict(tables or {})
        self.runtime = runtime = spec.runtime()
        runtime.collect_only()
        self.roots = check_distributable(runtime)
        inputs = window_inputs(runtime)
        #: an exchange in front of every windowed query reading a source (the second
        #: exchange runs in the window workers)
        self.exchanges = {
            w.query.index: ExchangeNode(runtime, w, spec.parallelism, spec.max_parallelism)
            for w in runtime.window_nodes()
            if inputs[w.query.index].upstream is None
        }
        self.ordinals = {name: k for k, name in enumerate(fed_sources(runtime))}
        self._buffers: list[list[Record]] = [[] for _ in range(spec.parallelism)]
        self._buffered = [0] * spec.parallelism
        #: records and batches sent, rows read
        self.sent_records = 0
        self.sent_calls = 0
        self.rows_read = 0

    def _record(
        self, ex: ExchangeNode, split: int, seq: int, read_rows: int, **stream: Any
    ) -> None:
        step, ended = ex.take_step()
        end = stream.pop("end", ended)
        for i, shares in enumerate(step):
            self._buffer(
                i, Record(ex.query.index, split, seq, tuple(shares), end, read_rows, **stream)
            )

    def _direct(
        self, source: str, split: int, seq: int, read_rows: int, end: bool, **stream: Any
    ) -> None:
        """The step's direct record to instance 0: the rows per-row queries inserted."""
        direct = tuple(self.runtime.take_collected())
        key = direct_key(self.ordinals[source])
        self._buffer(0, Record(key, split, seq, (), end, read_rows, direct, **stream))

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

    def _flush_due(self) -> None:
        if time.monotonic() - self._flushed_at >= self.flush_interval_s:
            for i in range(self.spec.parallelism):
                self._flush(i)
            self._flushed_at = time.monotonic()

    def _open(
        self, name: str, entry: FileSplit, exchanges: list[ExchangeNode], cut: SourceCut | None
    ) -> _Split | None:
        """The reader of one split, after ``cut`` (``None``: nothing left of it)."""
        source = self.runtime.sources[name]
        index = entry.file
        if cut is not None and cut.ended[index]:
            return None  # read to its end before the checkpoint
        first = cut.steps[index] if cut is not None else 0
        if entry.parts == 1:
            batches: Iterator[tuple[int, pa.RecordBatch]] = enumerate(
                islice(source.read_file(index), first, None), start=first
            )
            return _Split(name, index, batches, exchanges, True, None, first)
        parts = source.read_part(index, entry.part, entry.parts)
        batches = ((k, b) for k, b in parts if k >= first)
        # part 0 sends the end, at the step after the file's last batch
        end = -(-sum(source.row_groups(index)) // source.batch_rows)
        return _Split(name, index, batches, exchanges, entry.part == 0, end, first)

    def _file_step(self, split: _Split) -> bool:
        """One step of a file split (a batch, or its end); whether it has more."""
        runtime = self.runtime
        stream = runtime.streams[split.source]
        partition = runtime.sources[split.source].partitions[split.index]
        step = next(split.batches, None)
        if step is None:
            if not split.sends_end:
                return False  # a part that does not send the end: done
            runtime.end(stream, partition)
            seq, rows = split.end if split.end is not None else split.next, 0
        else:
            seq, batch = step
            split.next = seq + 1
            self.rows_read += batch.num_rows
            runtime.push(stream, partition, batch)
            rows = batch.num_rows
        for ex in split.exchanges:
            self._record(ex, split.index, seq, rows)
        self._direct(split.source, split.index, seq, rows, end=step is None)
        return step is not None

    def _log_entry(
        self, name: str, channel: int, exchanges: list[ExchangeNode], entry: LogEntry
    ) -> None:
        """One offset of a stream: the records of an entry this worker processes (its owner's
        writer, or worker 0's entries without one), to every instance."""
        if not entry.mine:
            return
        runtime = self.runtime
        stream = runtime.streams[name]
        writer = entry.partition
        rows = 0
        if writer is not None and entry.new:
            runtime.add_partition(stream, writer)
        if entry.kind == "batch" and writer is not None and entry.batch is not None:
            rows = entry.batch.num_rows
            self.rows_read += rows
            runtime.push(stream, writer, entry.batch)
        elif entry.kind == "watermark" and writer is not None and entry.watermark_ns is not None:
            runtime.advance(stream, writer, entry.watermark_ns)
        elif entry.kind == "end" and writer is not None:
            runtime.end(stream, writer)
        for closed in entry.closes:
            runtime.end(stream, closed)
        fields: dict[str, Any] = {
            "end": entry.kind == "end",
            "partition": writer,
            "watermark_ns": entry.watermark_ns if entry.kind == "watermark" else None,
            "new": entry.new,
            "last": entry.last,
            "closes": entry.closes,
        }
        for ex in exchanges:
            self._record(ex, channel, entry.offset, rows, **fields)
        self._direct(name, channel, entry.offset, rows, **fields)

    def _table_steps(
        self, name: str, split: TableSplit, exchanges: list[ExchangeNode]
    ) -> Iterator[None]:
        """One step per ``next``: this worker's files of an Iceberg source, each batch (the
        records ``(file, batch)``) and the file's end (a record with ``last``); channel 0
        then sends the partition's end (``(files, 0)``)."""
        runtime = self.runtime
        plan = self.tables[name]
        if plan.done:
            return
        stream = runtime.streams[name]
        source = runtime.flight_sources[name]
        for index in range(split.channel, len(plan.files), split.channels):
            seq = 0
            for batch in read_file(source, plan, index):
                self.rows_read += batch.num_rows
                runtime.push(stream, plan.partition, batch)
                for ex in exchanges:
                    self._record(ex, index, seq, batch.num_rows)
                self._direct(name, index, seq, batch.num_rows, end=False)
                seq += 1
                yield None
            for ex in exchanges:  # the file ended
                self._record(ex, index, seq, 0, last=True)
            self._direct(name, index, seq, 0, end=False, last=True)
            yield None
        if split.channel == 0 and plan.ends:
            runtime.end(stream, plan.partition)
            for ex in exchanges:
                self._record(ex, len(plan.files), 0, 0)
            self._direct(name, len(plan.files), 0, 0, end=True)

    def run(self) -> None:
        """Read every split to its end (from its cut when restored): files (and Iceberg data
        files) one step each in turn, streams as their entries come, until every stream has
        ended.

        Raises:
            ConnectorError: a file or stream cannot be read; QueryError: a per-row query fails.
        """
        runtime = self.runtime
        readers: list[tuple[str, int, list[ExchangeNode], StreamReader]] = []
        try:
            for node in runtime.nodes:
                if not isinstance(node, WindowNode):
                    node.start()
            # its splits one step each in turn (the embedded round-robin), so every split's
            # records reach the window actors at the same pace: their merges (and a barrier's
            # alignment) never wait for a split this worker has not started
            live: deque[Callable[[], bool]] = deque()
            for name, owned in self.splits.items():
                exchanges = [ex for q, ex in self.exchanges.items() if self.roots[q] == name]
                cut = self.start.get(name)
                for entry in owned:
                    if isinstance(entry, StreamSplit):
                        template = runtime.flight_sources[name]
                        reader = StreamReader(template, self.streams[name], entry)
                        readers.append((name, entry.channel, exchanges, reader))
                    elif isinstance(entry, TableSplit):
                        live.append(_stepper(self._table_steps(name, entry, exchanges)))
                    else:
                        split = self._open(name, entry, exchanges, cut)
                        if split is not None:
                            live.append(partial(self._file_step, split))
            while live or any(not r.done for *_, r in readers):
                if live:
                    step = live.popleft()
                    if step():
                        live.append(step)
                reading = [entry for entry in readers if not entry[3].done]
                for name, channel, exchanges, reader in reading:
                    # a stream waits for entries only when no file is left to read
                    wait = 0.0 if live else self.flush_interval_s / len(reading)
                    for log_entry in reader.poll(wait):
                        self._log_entry(name, channel, exchanges, log_entry)
                        self._flush_due()
                self._flush_due()
            for i in range(self.spec.parallelism):
                self._flush(i)
        finally:
            for *_, reader in readers:
                reader.close()
            for node in runtime.nodes:
                node.close()
            runtime.user_functions.close()
            for source in runtime.flight_sources.values():
                source.close()


def _stepper(steps: Iterator[None]) -> Callable[[], bool]:
    """A step function over a generator of steps: runs one, says whether more may follow."""

    def step() -> bool:
        return next(steps, False) is None

    return step


@dataclass
class _Merge:
    """The embedded order of one windowed query's splits (``FileSource.poll``'s round-robin)."""

    partitions: tuple[str, ...]
    #: per split, its records by step (they may come from several source workers: parts)
    queues: list[dict[int, Record]] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    next_index: int = 0
    #: per split, the steps consumed; their sum (the position); rows the source read in them
    steps: list[int] = field(default_factory=list)
    position: int = 0
    rows: int = 0

    def __post_init__(self) -> None:
        n = len(self.partitions)
        self.queues = [{} for _ in range(n)]
        self.ended = [False] * n
        self.steps = [0] * n

    def restore(self, cut: AnyCut) -> None:
        """Continue after ``cut`` (the checkpoint's position of this merge's source)."""
        assert isinstance(cut, SourceCut), "a file source's cut"
        self.steps = list(cut.steps)
        self.ended = list(cut.ended)
        self.next_index = cut.next_index
        self.position = cut.position
        self.rows = cut.rows

    def cut(self) -> SourceCut:
        """Where the merge is now."""
        return SourceCut(tuple(self.steps), tuple(self.ended), self.next_index, self.rows)

    def arrive(self, record: Record, instance: int) -> None:
        """Queue ``record`` (the parts of one file come from several source workers, each in
        order: their steps interleave).

        Raises:
            RuntimeError: a step of the split consumed already or arrived twice (a transport
                bug).
        """
        queue = self.queues[record.split]
        if record.seq < self.steps[record.split] or record.seq in queue:
            raise RuntimeError(
                f"instance {instance}: query {record.query} split {record.split}: record "
                f"{record.seq} arrived again (at step {self.steps[record.split]})"
            )
        queue[record.seq] = record

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def next(self) -> Record | None:
        """The next record in the embedded order, or ``None`` until it has arrived (or at the
        end of every split)."""
        live = [i for i, done in enumerate(self.ended) if not done]
        if not live:
            return None
        index = next((i for i in live if i >= self.next_index), live[0])
        record = self.queues[index].pop(self.steps[index], None)
        if record is None:
            return None
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


@dataclass
class _Gather:
    """The steps of a windowed query reading another's output (a second exchange): step ``n``
    once every upstream instance's record ``n`` is in (the module docstring).

    Attributes:
        channels: the upstream instances (the parallelism).
        queues: per channel, its records by step.
        position: steps consumed (the position of the source, as the upstream's merge).
        ended: the end of input was consumed.
    """

    channels: int
    queues: list[dict[int, Record]] = field(default_factory=list)
    position: int = 0
    ended: bool = False

    def __post_init__(self) -> None:
        self.queues = [{} for _ in range(self.channels)]

    def restore(self, cut: AnyCut) -> None:
        """Continue after ``cut`` (the checkpoint's position of the source at the root)."""
        self.position = cut.position
        self.ended = cut.finished

    def arrive(self, record: Record, instance: int) -> None:
        """Queue ``record`` from upstream instance ``record.split``.

        Raises:
            RuntimeError: a step that was consumed already or arrived twice (a transport bug).
        """
        queue = self.queues[record.split]
        if record.seq < self.position or record.seq in queue:
            raise RuntimeError(
                f"instance {instance}: query {record.query} from instance {record.split}: "
                f"record {record.seq} arrived again (at step {self.position})"
            )
        queue[record.seq] = record

    def next(self) -> list[Record] | None:
        """Every channel's record of the next step, or ``None`` until all are in (or after
        the end)."""
        if self.ended or any(self.position not in q for q in self.queues):
            return None
        records = [q.pop(self.position) for q in self.queues]
        self.position += 1
        if records[0].end:
            self.ended = True
        return records

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    @property
    def done(self) -> bool:
        return self.ended


@dataclass
class _LogMerge:
    """The entries of one stream in offset order (:mod:`.streams`): every offset from the
    start has exactly one record, from the source worker that owns its writer (worker 0 for
    an entry without one), so the next record is the one numbered :attr:`position`.

    Attributes:
        position: the next offset (every entry below it was consumed).
        rows: rows the stream's batches held below it.
        done: the stream's last entry was consumed.
        queue: the records that arrived, by offset.
    """

    position: int
    rows: int = 0
    done: bool = False
    queue: dict[int, Record] = field(default_factory=dict)

    def restore(self, cut: AnyCut) -> None:
        """Continue after ``cut`` (the checkpoint's offset of the stream)."""
        assert isinstance(cut, StreamCut), "a stream source's cut"
        self.position, self.rows, self.done = cut.offset, cut.rows, cut.done

    def cut(self) -> StreamCut:
        """Where the merge is now."""
        return StreamCut(self.position, self.rows, self.done)

    def arrive(self, record: Record, instance: int) -> None:
        """Queue ``record``.

        Raises:
            RuntimeError: an offset consumed already or arrived twice (a transport bug).
        """
        if record.seq < self.position or record.seq in self.queue:
            raise RuntimeError(
                f"instance {instance}: query {record.query}: the record of offset "
                f"{record.seq} arrived again (at offset {self.position})"
            )
        self.queue[record.seq] = record

    def next(self) -> Record | None:
        """The record of the next offset, or ``None`` until it has arrived (or after the
        stream's end)."""
        if self.done:
            return None
        record = self.queue.pop(self.position, None)
        if record is None:
            return None
        self.position += 1
        self.rows += record.read_rows
        self.done = record.last
        return record

    @property
    def queued(self) -> int:
        return len(self.queue)

    @property
    def known(self) -> int:
        """The offset every instance reaches for sure: past the last record that arrived
        (its entry exists, and so do those before it)."""
        return max(self.position, max(self.queue, default=-1) + 1)


@dataclass
class _TableMerge:
    """The embedded order of an Iceberg source's batches (:mod:`.tables`): the plan's files in
    order, each to its end, then the partition's end. Records are numbered ``split`` = the
    file (the plan's index), ``seq`` = its batch; a file's last record (``last``) says it
    ended; the end is ``(files, 0)``.

    Attributes:
        plan: the attempt's plan.
        key: the query (or direct key) whose records these are.
        position: snapshots consumed, and 1 more once the end was: a barrier's unit (a cut
            falls between snapshots, as embedded).
        rows: rows read, the plan's earlier ones included.
        done: the end was consumed.
    """

    plan: TablePlan
    key: int
    position: int = 0
    rows: int = 0
    done: bool = False
    queue: dict[tuple[int, int], Record] = field(default_factory=dict)
    #: the file being consumed, its next batch, and how many of the snapshot's files ended
    file: int = 0
    batch: int = 0
    in_snapshot: int = 0

    def __post_init__(self) -> None:
        self.rows, self.done = self.plan.rows, self.plan.done

    def restore(self, cut: AnyCut) -> None:
        """Start at a restored attempt's plan, which begins at the checkpoint."""
        assert isinstance(cut, TableCut), "an Iceberg source's cut"
        self.rows, self.done = cut.rows, cut.done

    def cut(self) -> TableCut:
        """Where the merge is now."""
        return TableCut(self.position - int(self.done), self.rows, self.done)

    def arrive(self, record: Record, instance: int) -> None:
        """Queue ``record`` (the files come from several workers: their records interleave).

        Raises:
            RuntimeError: a record consumed already or arrived twice (a transport bug).
        """
        key = (record.split, record.seq)
        if key < (self.file, self.batch) or key in self.queue:
            raise RuntimeError(
                f"instance {instance}: query {record.query}: the record of file "
                f"{record.split} batch {record.seq} arrived again"
            )
        self.queue[key] = record

    def next(self) -> Record | None:
        """The next record in the embedded order (an empty one for a snapshot the source
        skips), or ``None`` until it has arrived, or after the end."""
        snapshots = self.plan.snapshots
        if self.done:
            return None
        if self.position < len(snapshots) and snapshots[self.position][1] == 0:
            self.position += 1  # nothing to read in it: a step of its own
            return Record(self.key, -1, -1, ())
        if self.position >= len(snapshots):
            record = self.queue.pop((len(self.plan.files), 0), None)
            if record is not None:
                self.position += 1
                self.done = True
            return record
        record = self.queue.pop((self.file, self.batch), None)
        if record is None:
            return None
        self.rows += record.read_rows
        if record.last:  # the file ended: the next one, and maybe the snapshot's end
            self.file, self.batch = self.file + 1, 0
            self.in_snapshot += 1
            if self.in_snapshot == snapshots[self.position][1]:
                self.position, self.in_snapshot = self.position + 1, 0
        else:
            self.batch += 1
        return record

    @property
    def queued(self) -> int:
        return len(self.queue)


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
        records_sent: second-exchange records it sent the other instances (one per step of a
            windowed query it runs that another reads, per other instance; 0 without one).
        calls_sent: the sends they went in (one per other instance after each call of this
            instance that made some: a Ray actor call each).
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
    records_sent: int = 0
    calls_sent: int = 0


class WindowWorker:
    """Instance ``instance`` of every windowed query and what runs after it (module docstring);
    instance 0 also hands on the direct records' rows.

    Args:
        spec: the job.
        instance: ``0 … parallelism - 1``.
        restore: the checkpoint to resume from (``None``: from the start).
        streams: where every stream source starts (:func:`~.streams.stream_starts`: the
            driver's, so every instance has the same partitions; required with a stream).
        tables: what every Iceberg source reads (:func:`~.tables.table_plans`: the driver's;
            required with one).

    Raises:
        PipelineSQLError: building the pipeline fails, or it cannot be distributed.
        CheckpointError: the checkpoint's state cannot be read or does not fit the query.
    """

    def __init__(
        self,
        spec: JobSpec,
        instance: int,
        restore: Restore | None = None,
        streams: Mapping[str, StreamStart] | None = None,
        tables: Mapping[str, TablePlan] | None = None,
    ) -> None:
        self.spec = spec
        self.instance = instance
        self.runtime = runtime = spec.runtime()
        runtime.collect_only()
        for source in runtime.flight_sources.values():
            source.close()  # built for its columns: the source workers read it
        check_distributable(runtime)
        self.streams = starts = dict(streams or {})
        self.inputs = inputs = window_inputs(runtime)
        self.windows = {w.query.index: w for w in runtime.window_nodes()}

        plans = dict(tables or {})

        def merge_of(name: str, key: int) -> _Merge | _LogMerge | _TableMerge:
            if name in runtime.sources:
                return _Merge(runtime.sources[name].partitions)
            if name in plans:
                return _TableMerge(plans[name], key)
            return _LogMerge(starts[name].offset, starts[name].rows, starts[name].done)

        def first(name: str) -> int:
            return starts[name].offset if name in starts else 0

        #: the merge of every windowed query (in build order: an upstream before the queries
        #: reading it), and on instance 0 of every fed source's direct records; the source
        #: at the root of each
        self.merges: dict[int, _Merge | _Gather | _LogMerge | _TableMerge] = {
            q: merge_of(inputs[q].source, q)
            if inputs[q].upstream is None
            else _Gather(spec.parallelism, position=first(inputs[q].source))
            for q in self.windows
        }
        self.roots = {q: inputs[q].source for q in self.windows}
        #: the second exchange in front of every windowed query reading another's output, by
        #: that upstream query (module docstring)
        self.stages: dict[int, list[StageExchange]] = {}
        for q, entry in inputs.items():
            if entry.upstream is not None:
                exchange = StageExchange(
                    runtime, self.windows[q], spec.parallelism, spec.max_parallelism
                )
                self.stages.setdefault(entry.upstream, []).append(exchange)
        #: records for the other instances, made since the last :meth:`outgoing`
        self._outbox: list[list[Record]] = [[] for _ in range(spec.parallelism)]
        if instance == 0:
            for k, name in enumerate(fed_sources(runtime)):
                self.merges[direct_key(k)] = merge_of(name, direct_key(k))
                self.roots[direct_key(k)] = name
        self._empty = {
            q: w.input.schema.empty_table().to_batches() for q, w in self.windows.items()
        }
        #: records and rows received, rows produced; second-exchange records and sends out
        self.records_in = 0
        self.rows_in = 0
        self.rows_out = 0
        self.records_sent = 0
        self.calls_sent = 0
        self._seen = False
        #: the largest backlog, open panes and state bytes seen after a step
        self._queued_max = self._panes_max = self._bytes_max = 0
        self._sample_at = 0.0  # when (perf_counter) the state's maxima are taken again
        #: the barrier armed: ``(barrier, epoch, position per source)``
        self._armed: tuple[int, int, dict[str, int]] | None = None
        #: output held for :meth:`take`, and the cut in it (its index)
        self._out: list[tuple[str, pa.RecordBatch]] = []
        self._cut: tuple[int, Cut] | None = None
        self._declined: list[int] = []
        if restore is not None:
            self._restore(restore)
        for q, window in self.windows.items():  # a stream's partitions: the driver's
            name = inputs[q].source
            if inputs[q].upstream is None and name in starts:
                window.input.partitions = starts[name].partitions
        for node in runtime.nodes:
            node.start()
        for q, window in self.windows.items():  # as the embedded run opens a live source
            name = inputs[q].source
            if inputs[q].upstream is None and name in starts:
                for partition, mark in starts[name].initial_watermarks.items():
                    window.on_watermark(partition, mark)
                    self._slot(q)

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
            self._arrive(record)
        self._advance()

    def _arrive(self, record: Record) -> None:
        self.merges[record.query].arrive(record, self.instance)
        if record.query >= 0:  # a windowed query's (direct records are not counted)
            self.records_in += 1
            self.rows_in += record.rows

    def outgoing(self) -> list[tuple[int, list[Record]]]:
        """The second exchange's records for the other instances made since the last call,
        as ``(instance, records)`` in the order made: the transport hands each list to
        :meth:`put` of that instance, in order (records for this instance are queued here)."""
        out = [(i, records) for i, records in enumerate(self._outbox) if records]
        self._outbox = [[] for _ in range(self.spec.parallelism)]
        self.calls_sent += len(out)
        self.records_sent += sum(len(records) for _, records in out)
        return out

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

    def _step(
        self,
        key: int,
        merge: _Merge | _Gather | _LogMerge | _TableMerge,
        step: Record | list[Record],
    ) -> None:
        if key < 0:  # a direct record: per-row queries' rows, in the merged order
            assert isinstance(step, Record)
            for sink, rows in step.direct:
                self.runtime.deliver(sink, rows)
            return
        window = self.windows[key]
        if isinstance(merge, _TableMerge):  # an Iceberg source: its one partition
            assert isinstance(step, Record)
            partition = merge.plan.partition
            for share in step.shares:
                assert share is not None
                window.on_share(partition, self._batch(key, share[0]), share[1])
            if step.end:
                window.on_end(partition)
            else:
                self._sample()
            self._seen = True
            return
        if isinstance(merge, _LogMerge):
            assert isinstance(step, Record)
            self._entry(key, step)
            self._seen = True
            if not step.last:  # the maxima after each step: the end fires what it closes
                self._sample()
            self._send_stage(key, step.seq)
            return
        if isinstance(step, Record):
            assert isinstance(merge, _Merge)
            partition = merge.partitions[step.split]
            for share in step.shares:
                assert share is not None  # a source's record has a share per batch
                window.on_share(partition, self._batch(key, share[0]), share[1])
                self._slot(key)
            end = step.end
        else:
            partition = window.input.partitions[0]  # the upstream's output: one partition
            end = self._gathered(key, partition, step)
        self._seen = True
        if end:
            window.on_end(partition)
            self._slot(key)
        else:  # the maxima after each step: an end fires what it closes
            self._sample()
        self._send_stage(key, merge.position - 1)

    def _entry(self, key: int, record: Record) -> None:
        """One entry of a stream for windowed query ``key``, as the embedded run hands the
        source's events to it: a new writer becomes a partition, then its batch (this
        instance's share, with the whole batch's progress), watermark marker or end of input;
        ``stop_at_end`` ends the writers still open. Every call of the operator is a slot of
        the second exchange (every instance makes the same calls)."""
        window = self.windows[key]
        partition = record.partition
        if partition is not None:
            if record.new:
                window.on_partition(partition)
                window.on_backlog(partition, True)
            for share in record.shares:
                assert share is not None  # a source's record has a share per batch
                window.on_share(partition, self._batch(key, share[0]), share[1])
                self._slot(key)
            if record.watermark_ns is not None:
                window.on_watermark(partition, record.watermark_ns)
                self._slot(key)
            if record.end:
                window.on_end(partition)
                self._slot(key)
        for closed in record.closes:
            window.on_end(closed)
            self._slot(key)

    def _sample(self) -> None:
        """The status maxima after a step. Open panes and state bytes walk the state (about
        30 ms for 8,000 keys with a ``count(DISTINCT)``): a walk that took a millisecond or
        more is taken again only once 20 times its time has passed, so the walks cost at most
        about 5 % of the run; a smaller state is walked after every step (exact maxima)."""
        self._queued_max = max(self._queued_max, self._queued())
        started = time.perf_counter()
        if started < self._sample_at:
            return
        self._panes_max = max(self._panes_max, self._open_panes())
        self._bytes_max = max(self._bytes_max, self._state_bytes())
        ended = time.perf_counter()
        cost = ended - started
        self._sample_at = ended + 20 * cost if cost >= _SAMPLE_EXACT_S else 0.0

    def _batch(self, key: int, batch: pa.RecordBatch | None) -> pa.RecordBatch:
        if batch is not None:
            return batch
        empty = self._empty[key]
        schema = self.windows[key].input.schema
        return empty[0] if empty else pa.RecordBatch.from_pylist([], schema=schema)

    def _gathered(self, key: int, partition: str, records: list[Record]) -> bool:
        """Run one step of a second exchange: slot by slot, the union of every upstream
        instance's share as one batch with the highest progress (none where nothing reached
        the query on any instance); returns whether the input ended in the step.

        Raises:
            RuntimeError: the instances' records disagree on the step's slots or end.
        """
        window = self.windows[key]
        slots = {len(r.shares) for r in records}
        ends = {r.end for r in records}
        if len(slots) != 1 or len(ends) != 1:
            raise RuntimeError(
                f"instance {self.instance}: {window.query.label}: step {records[0].seq}: the "
                f"upstream instances disagree (slots {sorted(slots)}, end {sorted(ends)})"
            )
        for slot in zip(*(r.shares for r in records), strict=True):
            present = [share for share in slot if share is not None]
            if not present:
                continue  # nothing reached the query on any instance: no batch embedded
            batches = [batch for batch, _ in present if batch is not None]
            marks = [mark for _, mark in present if mark is not None]
            union = batches[0] if len(batches) == 1 else one_batch(pa.Table.from_batches(
                batches, window.input.schema))  # fmt: skip
            window.on_share(partition, self._batch(key, union), max(marks) if marks else None)
            self._slot(key)
        return ends.pop()

    def _slot(self, key: int) -> None:
        """A call of query ``key``'s operator is over: a slot of the exchanges it feeds."""
        for exchange in self.stages.get(key, ()):
            exchange.close_slot()

    def _send_stage(self, key: int, seq: int) -> None:
        """After step ``seq`` of query ``key``: every instance's record of each query reading
        its output (also with empty slots: the record carries the step)."""
        for exchange in self.stages.get(key, ()):
            slots, ended = exchange.take_slots()
            q = exchange.query.index
            for i, shares in enumerate(slots):
                record = Record(q, self.instance, seq, tuple(shares), ended)
                if i == self.instance:
                    self._arrive(record)  # consumed in this _advance: its merge comes later
                else:
                    self._outbox[i].append(record)

    # --- barriers ---------------------------------------------------------------------------

    def position(self) -> dict[str, int]:
        """Steps consumed per source (the furthest of its merges; a stream's: its offset)."""
        out: dict[str, int] = {}
        for key, merge in self.merges.items():
            name = self.roots[key]
            out[name] = max(out.get(name, 0), merge.position)
        return out

    def known(self) -> dict[str, int]:
        """Per stream source, the offset every instance reaches for sure: past the furthest
        record that arrived (a barrier armed further may wait for entries a live stream does
        not have yet)."""
        out: dict[str, int] = {}
        for key, merge in self.merges.items():
            if isinstance(merge, _LogMerge):
                name = self.roots[key]
                out[name] = max(out.get(name, 0), merge.known)
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
        sources: dict[str, AnyCut] = {
            self.roots[k]: merge.cut()
            for k, merge in self.merges.items()
            if isinstance(merge, _Merge | _LogMerge | _TableMerge)
        }
        self._out.extend(self.runtime.take_collected())
        self._cut = (len(self._out), Cut(barrier, epoch, self.instance, operators, sources))

    # --- status and output ------------------------------------------------------------------

    def _queued(self) -> int:
        return sum(m.queued for k, m in self.merges.items() if k >= 0)

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
            records_sent=self.records_sent,
            calls_sent=self.calls_sent,
        )

    def tick(self) -> None:
        """Processing time passed (the driver calls this as it collects output, every 0.2 s):
        every windowed query over a stream with an ``idle_timeout`` re-evaluates its idle
        partitions, as the embedded run loop's tick does, and fires what that closes. A
        partition has backlog while the instance holds records of the stream it has not run
        (embedded: while the tail has unread entries); without it, a writer silent for
        ``idle_timeout`` stops holding the watermark back.

        Raises:
            QueryError: the query fails on the windows it fires.
        """
        for q, window in self.windows.items():
            merge = self.merges[q]
            if not isinstance(merge, _LogMerge) or not idle_ticks(window) or window.finished:
                continue
            backlog = merge.queued > 0
            for partition in window.op.partition_watermarks():
                window.on_backlog(partition, backlog)
            window.on_tick(periodic=True)

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
            RuntimeError: a split's end never arrived (or a second exchange's: the driver
                calls this after every record is delivered); a windowed query emitted rows
                for a second exchange at the finish, after its input ended.
        """
        runtime = self.runtime
        try:
            for q, merge in self.merges.items():
                if isinstance(merge, _Gather) and not merge.done:
                    raise RuntimeError(
                        f"instance {self.instance}: query {q}: no end of input from the "
                        f"upstream instances (step {merge.position})"
                    )
                if isinstance(merge, _Merge) and not merge.done:
                    missing = [merge.partitions[i] for i, e in enumerate(merge.ended) if not e]
                    raise RuntimeError(
                        f"instance {self.instance}: query {q}: no end of input from "
                        f"{', '.join(missing)}"
                    )
                if isinstance(merge, _TableMerge) and not merge.done:
                    raise RuntimeError(
                        f"instance {self.instance}: query {q}: no end of input from the "
                        f"Iceberg source {self.roots[q]} (at snapshot {merge.position})"
                    )
                if isinstance(merge, _LogMerge) and not merge.done:
                    raise RuntimeError(
                        f"instance {self.instance}: query {q}: the stream {self.roots[q]} "
                        f"has not ended (at offset {merge.position})"
                    )
            runtime.drain()
            for node in runtime.nodes:
                node.on_finish()
            for key, exchanges in self.stages.items():
                for exchange in exchanges:
                    if exchange.slot is not None or exchange.ended:
                        raise RuntimeError(
                            f"instance {self.instance}: {self.windows[key].query.label} emitted "
                            f"rows for {exchange.query.label} after its input ended"
                        )
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
    spec: JobSpec,
    *,
    write: bool = True,
    source_workers: int | None = None,
    streams: Mapping[str, StreamStart] | None = None,
) -> tuple[RunSummary, list[tuple[str, pa.RecordBatch]]]:
    """The distributed dataflow in this process, without a cluster (for tests and as the
    reference of the Ray runtime): source workers run one after another, records are handed
    over directly, and after each the second exchange's records a window worker made for the
    others (:meth:`WindowWorker.outgoing`), in the order made, until none is left. Returns the
    summary and every ``(sink, batch)``. ``streams``: where the stream sources start
    (:func:`~.streams.stream_starts` taken earlier: the writers known then); default: now.

    Raises:
        PipelineSQLError, ConnectorError, QueryError: as an embedded run.
    """
    driver = spec.runtime()
    check_distributable(driver)
    streams = dict(streams) if streams is not None else stream_starts(driver)
    tables = table_plans(driver)
    for source in driver.flight_sources.values():
        source.close()
    windows = [
        WindowWorker(spec, i, streams=streams, tables=tables) for i in range(spec.parallelism)
    ]
    collected: list[tuple[str, pa.RecordBatch]] = []
    if write:
        driver.open_sinks()
    ended = False

    def send(instance: int, records: list[Record]) -> None:
        pending = deque([(instance, records)])
        while pending:
            i, batch = pending.popleft()
            windows[i].put(batch)
            pending.extend(windows[i].outgoing())

    try:
        for splits in assign_splits(driver, source_workers or spec.parallelism):
            worker = SourceWorker(spec, splits, send, streams=streams, tables=tables)
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
