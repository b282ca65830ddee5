"""Durable runs: a pipeline that takes checkpoints, and resumes from one after a crash.

:class:`DurableRuntime` is the embedded runtime (:class:`~flight_serve.pipelines.runtime.PipelineRuntime`)
plus checkpoints (:mod:`flight_serve.pipelines.checkpoint`) and exactly-once sinks
(:mod:`flight_serve.pipelines.epoch_sinks`):

* **barriers**: before a source reads its next batch, every batch read so far has gone through
  every operator and sink (one thread), so that instant is a consistent cut. A checkpoint is taken
  there when one is due: every ``checkpoint_every`` source batches (a file's end counts as one),
  every ``checkpoint_interval`` of processing time, on request (:meth:`request_checkpoint`), when
  the run is asked to stop (:meth:`request_stop`: checkpoint, then stop), and once more when the
  input ends (that checkpoint is marked *finished*);
* **resume** (``resume="latest"``, the default): the newest complete checkpoint of an unfinished
  run is restored: operators from their snapshots, file sources from their offsets (per file, the
  batches read and whether it ended; the file read next), sinks from their commit marks. A
  checkpoint of a *finished* run is not resumed: the run starts over (a rerun of a bounded
  pipeline, as without checkpoints). ``resume="fresh"`` deletes the checkpoints first;
  ``resume=N`` restores epoch ``N`` and deletes the newer checkpoints (their output is rolled back
  where it can be: file parts are deleted, stream batches are matched and skipped on replay);
* the restored run emits exactly what the straight run emits from that point: the operators are
  deterministic given their input batches, and the sources replay the same batches.

What a checkpoint cannot see: processing time. A pipeline whose results depend on it
(``idle_timeout``, ``max_future_skew``) may cut its windows differently after a resume, as it
would on a slower or faster machine; everything it emits is still committed exactly once.

Fault injection for tests (never set in production): ``FLIGHT_SERVE_CRASH_AT`` = ``checkpoint:N``
(SIGKILL the process right after checkpoint N's manifest is written, before its sinks commit),
``commit:N`` (after they commit), ``event:N`` (after N source batches, mid-epoch) or
``append:N`` (after the N-th batch a stream sink of the process committed: mid-commit; see
:mod:`~flight_serve.pipelines.epoch_sinks`).

Errors: :class:`~flight_serve.errors.CheckpointError` when a checkpoint cannot be restored (the
pipeline text changed, an input file changed or vanished, a stream offset was deleted by
retention and ``offset_reset`` is ``fail``), always with what to do; building and running raise
what the embedded runtime raises.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from flight_serve.connectors.falkordb import FalkorDBSink
from flight_serve.connectors.file import FileSource
from flight_serve.connectors.flight import (
    RETRY_BUDGET_S,
    FlightSource,
    FlightStreamTarget,
    FlightTicketSource,
)
from flight_serve.connectors.iceberg import IcebergSource
from flight_serve.connectors.stdout import StdoutSink
from flight_serve.engine.operator import OperatorSnapshot
from flight_serve.errors import CheckpointError, ConnectorError, FlightServeError
from flight_serve.pipelines.checkpoint import (
    CheckpointStore,
    Manifest,
    fingerprint,
    now_utc,
    recovery_neutral_fingerprint,
)
from flight_serve.pipelines.dialect import sql_error
from flight_serve.pipelines.epoch_sinks import EpochFileSink, EpochStreamSink, read_ipc
from flight_serve.pipelines.graph_io import EpochGraphSink
from flight_serve.pipelines.iceberg_io import EpochIcebergSink, iceberg_source
from flight_serve.pipelines.pipeline import PipelinePlan, RelationDef
from flight_serve.pipelines.plugins import PluginHub
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.runtime import LiveSource, PipelineRuntime, RunSummary, _WindowNode
from flight_serve.pipelines.store_io import StoreSource, StoreTarget
from flight_serve.store import StreamStore
from flight_serve.store.streams import WriterBusyError, WriterHold
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS

__all__ = [
    "CRASH_ENV",
    "CheckpointInfo",
    "DurableRuntime",
    "PipelineStopped",
    "ResumeFrom",
]

log = logging.getLogger("flight_serve.pipelines")

#: The fault-injection variable (see the module docstring).
CRASH_ENV = "FLIGHT_SERVE_CRASH_AT"

#: ``"latest"`` (resume the newest unfinished checkpoint, else start), ``"fresh"`` or an epoch.
ResumeFrom = Literal["latest", "fresh"] | int


def _schema_of(text: str) -> pa.Schema | None:
    """A schema a checkpoint recorded (Arrow IPC, base64), or ``None`` if it does not read."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except (ValueError, pa.ArrowException):
        return None


class PipelineStopped(Exception):
    """Raised out of :meth:`DurableRuntime.run` after :meth:`DurableRuntime.request_stop`: the
    run took a checkpoint and stopped; it resumes from that checkpoint."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One completed checkpoint.

    Attributes:
        epoch: its epoch.
        taken_at: aware UTC instant.
        duration_s: seconds from the barrier to the committed sinks.
        bytes: bytes written to the state root.
        finished: whether the input had ended.
    """

    epoch: int
    taken_at: datetime
    duration_s: float
    bytes: int
    finished: bool


def _crash_point(kind: str, number: int) -> None:
    if os.environ.get(CRASH_ENV) == f"{kind}:{number}":
        os.kill(os.getpid(), signal.SIGKILL)  # a real, unclean death: nothing after this runs
        time.sleep(60)  # pragma: no cover  (the signal is delivered asynchronously)


class _FileCursor(FileSource):
    """A file source that knows its offset and resumes from one (round-robin order kept).

    The offset: per file, the batches read and whether it ended, and the file read next. Files
    are visited in ascending cyclic order among those that have not ended, which is exactly
    :meth:`FileSource.round_robin`'s order, so a resumed run reads the same batches in the same
    order as the straight run from that point on.
    """

    runtime: DurableRuntime
    read_batches: list[int]
    ended: list[bool]
    next_index: int
    rows: int
    ghosts: list[str]
    sizes: list[int]

    @classmethod
    def wrap(
        cls,
        name: str,
        source: FileSource,
        runtime: DurableRuntime,
        state: dict[str, Any] | None,
        epoch: int | None,
    ) -> _FileCursor:
        cursor = cls.__new__(cls)
        cursor.__dict__.update(source.__dict__)
        cursor.runtime = runtime
        count = len(cursor.paths)
        cursor.read_batches = [0] * count
        cursor.ended = [False] * count
        cursor.next_index = 0
        cursor.rows = 0
        cursor.ghosts = []
        try:
            cursor.sizes = [p.stat().st_size for p in cursor.paths]
        except OSError as exc:
            raise ConnectorError(f"source {name}: {exc}") from exc
        if state is not None:
            cursor._restore(name, state, epoch)
        return cursor

    def _restore(self, name: str, state: dict[str, Any], epoch: int | None) -> None:
        what = f"source {name} (checkpoint {epoch})"
        recorded = [dict(f) for f in state["files"]]
        by_name = {f["partition"]: f for f in recorded}
        current = list(self.partitions)
        added = [p for p in current if p not in by_name]
        if added:
            raise CheckpointError(
                f"{what}: file(s) {', '.join(added)} appeared since the checkpoint; a resume "
                "reads the files it started with: move the new ones away until the run "
                "finishes, or start over with --fresh"
            )
        for i, partition in enumerate(current):
            entry = by_name[partition]
            if int(entry["size"]) != self.sizes[i]:
                raise CheckpointError(
                    f"{what}: {self.paths[i]} changed since the checkpoint ({entry['size']} -> "
                    f"{self.sizes[i]} bytes); its offset (batch {entry['batches']}) no longer "
                    "names the same rows: restore the file, or start over with --fresh"
                )
            self.read_batches[i] = int(entry["batches"])
            self.ended[i] = bool(entry["ended"])
        for entry in recorded:
            if entry["partition"] in current or entry["ended"]:
                continue  # a file read to its end may go: nothing of it is needed
            if self.runtime.options.offset_reset != "earliest":
                raise CheckpointError(
                    f"{what}: {entry['path']} is gone, and the run had read {entry['batches']} "
                    "of its batches (not all): its offset cannot be resumed. Restore the file, "
                    "start over with --fresh, or SET offset_reset = 'earliest' to end that "
                    "partition there and go on (its unread rows are skipped and reported)"
                )
            self.ghosts.append(str(entry["partition"]))
            self.runtime.report_gap(
                f"source {name}: {entry['path']} is gone after {entry['batches']} batches; its "
                "unread rows are skipped and its partition ends (offset_reset = 'earliest')"
            )
        self.rows = int(state.get("rows", 0))
        # the next file: the first one still live at or after the recorded position
        order = [f["partition"] for f in recorded]
        following = order[int(state.get("next", 0)) :] + order
        index = {p: i for i, p in enumerate(current)}
        self.next_index = next(
            (index[p] for p in following if p in index and not self.ended[index[p]]), 0
        )

    def position(self) -> dict[str, Any]:
        """The offset as JSON (see the class docstring)."""
        return {
            "kind": "file",
            "files": [
                {
                    "partition": partition,
                    "path": str(path),
                    "size": size,
                    "batches": batches,
                    "ended": ended,
                }
                for partition, path, size, batches, ended in zip(
                    self.partitions,
                    self.paths,
                    self.sizes,
                    self.read_batches,
                    self.ended,
                    strict=True,
                )
            ],
            "next": self.next_index,
            "rows": self.rows,
        }

    def _skipping(self, index: int) -> Iterator[pa.RecordBatch]:
        batches = self.read_file(index)
        for done in range(self.read_batches[index]):
            if next(batches, None) is None:
                raise CheckpointError(
                    f"{self.paths[index]} has {done} batches, but the checkpoint had read "
                    f"{self.read_batches[index]}: it changed; start over with --fresh"
                )
        return batches

    def round_robin(self) -> Iterator[tuple[str, pa.RecordBatch | None]]:
        """``(partition, batch)`` from the offset on; ``(partition, None)`` ends a partition.
        Before each batch, the runtime's barrier may take a checkpoint."""
        for ghost in self.ghosts:  # files gone under offset_reset = 'earliest': they end here
            yield ghost, None
        self.ghosts = []
        open_files: dict[int, Iterator[pa.RecordBatch]] = {}
        count = len(self.paths)
        while True:
            live = [i for i in range(count) if not self.ended[i]]
            if not live:
                return
            index = next((i for i in live if i >= self.next_index), live[0])
            self.runtime.barrier()
            batches = open_files.get(index)
            if batches is None:
                batches = open_files[index] = self._skipping(index)
            batch = next(batches, None)
            self.next_index = index + 1
            self.runtime.count_event(batch)
            if batch is None:
                self.ended[index] = True
                del open_files[index]
                yield self.partitions[index], None
            else:
                self.read_batches[index] += 1
                self.rows += batch.num_rows
                yield self.partitions[index], batch


class DurableRuntime(PipelineRuntime):
    """A pipeline run that checkpoints and resumes (see the module docstring).

    Args:
        plan: the parsed pipeline.
        name: the pipeline's name in checkpoints (the file stem, or the server's pipeline id).
        options: checkpoint options (default: the pipeline's ``SET`` run options).
        state_root: the checkpoint root (path or ``pyarrow.fs`` URI); default: ``options``'
            ``state_root``, else ``<output_dir>/checkpoints/<name>``.
        output_dir: where relative sink paths start.
        resume: ``"latest"``, ``"fresh"`` or an epoch (see the module docstring).
        store: for server pipelines: the server's store, which ``flight`` sources and sinks
            without a ``server`` option read and write (:mod:`.store_io`); ``None``: such
            connectors are refused.
        on_checkpoint: called after every completed checkpoint.
        restart_finished: with ``resume="latest"``, start over when the newest checkpoint is a
            finished run's (``flight-serve run``); ``False`` (server pipelines): resume it, which
            only completes what a crash interrupted (the last commit, the file sinks' files).
        plugins: the server's plugin hub (plugin functions; a checkpoint first waits for every
            batch sent to a plugin and emits its result, so no batch is in flight at a barrier).

    Raises:
        PipelineSQLError: a connector a checkpointed run cannot cover, with its position; or
            whatever building the pipeline raises.
        CheckpointError: the checkpoint to resume cannot be restored (the message says why and
            what to do).
    """

    def __init__(
        self,
        plan: PipelinePlan,
        *,
        name: str,
        options: RunOptions | None = None,
        state_root: str | None = None,
        output_dir: Path | None = None,
        resume: ResumeFrom = "latest",
        store: StreamStore | None = None,
        on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
        restart_finished: bool = True,
        plugins: PluginHub | None = None,
    ) -> None:
        self.options = options if options is not None else plan.run_options
        self.restart_finished = restart_finished
        self.store = store
        self.name = name
        self._check_connectors(plan)
        root = state_root or self.options.state_root
        if root is None:
            base = output_dir if output_dir is not None else Path.cwd()
            root = str(base / "checkpoints" / name)
        self.checkpoints = CheckpointStore(root)
        # recovery options (offset_reset, expired_snapshot) may be set after a failure
        self.fingerprint = recovery_neutral_fingerprint(plan.text)
        self._text_fingerprint = fingerprint(plan.text)  # what older checkpoints recorded
        self.on_checkpoint = on_checkpoint
        self.gaps: list[str] = []
        self._writer_holds: list[WriterHold] = []
        self.last_checkpoint: CheckpointInfo | None = None
        self.resumed_from: int | None = None
        self._txn: dict[
            str, EpochFileSink | EpochStreamSink | EpochIcebergSink | EpochGraphSink
        ] = {}
        self._events = 0
        self._events_at_checkpoint = 0
        self._force = threading.Event()
        self._stop = threading.Event()
        self._checkpoint_done = threading.Condition()
        interval = self.options.checkpoint_interval
        self._interval_s = interval.total_seconds() if interval is not None else None
        self._next_due = time.monotonic() + (self._interval_s or 0.0)
        self.manifest = self._pick(resume)
        self.epoch = self.manifest.epoch if self.manifest is not None else 0
        #: rows skipped by earlier resumes (offset_reset = 'earliest'), from the checkpoint
        self._data_loss_before = (
            int(self.manifest.metrics.get("data_loss_rows", 0)) if self.manifest is not None else 0
        )
        # opens the sources (from their offsets)
        super().__init__(
            plan,
            output_dir=output_dir,
            plugins=plugins,
            data_dir=store.data_dir if store is not None else None,
        )
        self._restore_operators()
        for name_, source in list(self.sources.items()):
            state = self.manifest.sources.get(name_) if self.manifest is not None else None
            epoch = self.manifest.epoch if self.manifest is not None else None
            self.sources[name_] = _FileCursor.wrap(name_, source, self, state, epoch)

    # --- building -----------------------------------------------------------------------------

    def _check_connectors(self, plan: PipelinePlan) -> None:
        server = self.store is not None
        for relation in plan.sources.values():
            option = relation.connector["connector"]
            connector = option.text.lower()
            if connector in ("file", "iceberg") or (
                connector == "flight" and (server or "server" in relation.connector)
            ):
                continue
            raise option.error(self._refusal(connector, "source", server))
        for sink in plan.sinks.values():
            option = sink.connector["connector"]
            connector = option.text.lower()
            if connector == "falkordb":  # epoch marker in the graph: exactly once anywhere
                continue
            if connector in ("file", "stdout", "iceberg") or (
                connector == "flight" and (server or "server" in sink.connector)
            ):
                continue
            raise option.error(self._refusal(connector, "sink", server))

    def _store_backed(self) -> bool:
        """A server pipeline's ``flight`` connectors without ``server`` are its streams."""
        return self.store is not None

    @staticmethod
    def _refusal(connector: str, role: str, server: bool) -> str:
        if server:
            return (
                f"a server pipeline takes file and iceberg sources and sinks, stdout and "
                f"falkordb sinks, this server's streams (connector 'flight' without a server "
                f"option) and other Flight servers' (connector 'flight' with a server option), "
                f"not a {connector!r} {role}"
            )
        return (
            f"a checkpointed run of flight-serve run covers file and iceberg sources, file, "
            f"stdout, iceberg and falkordb sinks, and flight connectors with a server option, "
            f"not a {connector!r} {role} (a "
            f"'flight' {role} needs server = …): submit the pipeline to the server "
            "(flight-serve submit), where it reads and writes streams exactly once, or run it "
            "without checkpoints"
        )

    def _pick(self, resume: ResumeFrom) -> Manifest | None:
        if resume == "fresh":
            self.checkpoints.clear()
            return None
        if resume == "latest":
            manifest = self.checkpoints.latest()
            if manifest is None:
                return None
            if manifest.finished and self.restart_finished:
                self.note(
                    f"the last run finished at epoch {manifest.epoch}; starting over "
                    f"(state root {self.checkpoints.uri})"
                )
                self.checkpoints.clear()
                return None
        else:
            manifest = self.checkpoints.load(int(resume))
            dropped = self.checkpoints.discard_after(int(resume))
            if dropped:
                self.note(f"resuming from epoch {resume}: checkpoints {dropped} deleted")
        if manifest.fingerprint not in (self.fingerprint, self._text_fingerprint):
            raise CheckpointError(
                f"the pipeline text changed since checkpoint {manifest.epoch} in "
                f"{self.checkpoints.uri} was taken; a checkpoint restores only the pipeline it "
                "was taken of (changing offset_reset or expired_snapshot is allowed): restore "
                "the file, or start over with --fresh"
            )
        self.resumed_from = manifest.epoch
        return manifest

    def _flight_source(self, relation: RelationDef, start_offset: int | None = None) -> LiveSource:
        options = relation.connector
        state = self.manifest.sources.get(relation.name, {}) if self.manifest is not None else {}
        if "server" in options or self.store is None:  # another server (checked for runs)
            return self._remote_source(relation, state)
        stream = options["stream"].text if "stream" in options else relation.name
        try:
            source = StoreSource(
                self.store,
                stream,
                name=relation.name,
                schema=relation.columns,
                start_offset=int(state.get("offset", 0)),
                incarnation=state.get("incarnation"),
                offset_reset=self.options.offset_reset,
                on_gap=self.report_gap,
                rows=int(state.get("rows", 0)),
                stream_rows=int(state["stream_rows"]) if "stream_rows" in state else None,
            )
        except ConnectorError as exc:
            raise sql_error(f"SOURCE {relation.name}: {exc}", relation.node.this) from exc
        if (
            relation.time_column is not None
            and source.schema.get_field_index(relation.time_column) < 0
        ):
            raise sql_error(
                f"WATERMARK FOR {relation.time_column}: stream {stream} has no such column "
                f"(columns: {', '.join(source.schema.names)})",
                relation.node.this,
            )
        source.barrier = self.barrier
        source.counted = self.count_event
        return source

    def _iceberg_source(self, relation: RelationDef) -> LiveSource:
        """The Iceberg source, from the checkpoint's offset (its last consumed snapshot)."""
        state = self.manifest.sources.get(relation.name) if self.manifest is not None else None
        source = iceberg_source(
            relation,
            self.data_dir,
            batch_rows=self.plan.batch_rows or 65_536,
            offset=state,
            on_gap=self.report_gap,
        )
        source.barrier = self.barrier
        source.counted = self.count_event
        return source

    def _iceberg_sources(self) -> dict[str, IcebergSource]:
        return {n: s for n, s in self.flight_sources.items() if isinstance(s, IcebergSource)}

    def _remote_source(self, relation: RelationDef, state: dict[str, Any]) -> LiveSource:
        """A source on another Flight server: a ticket's DoGet, or a stream's tail, resumed
        from the checkpoint's offset (rows of the ticket, or the stream offset)."""
        if relation.columns is None and isinstance(state.get("schema"), str):
            # the columns the checkpointed run read: enough to wait for a server that is down
            relation = replace(relation, columns=_schema_of(state["schema"]))
        ticket = self._ticket(relation)
        if ticket is not None:
            ticket_source = self._ticket_source(relation, ticket, int(state.get("rows", 0)))
            assert isinstance(ticket_source, FlightTicketSource)
            ticket_source.barrier = self.barrier
            ticket_source.counted = self.count_event
            return ticket_source
        start = int(state["offset"]) if "offset" in state else None
        source = super()._flight_source(relation, start_offset=start)
        assert isinstance(source, FlightSource)
        if source.waiting_to_open:
            # its server is unreachable now: the checks run once the source has reached it
            source.check_open = lambda opened: self._check_resume(relation, state, opened)
            known = state.get("incarnation")  # what a checkpoint taken while it waits records
            source.incarnation = known if isinstance(known, str) else None
        else:
            try:
                first = self._check_resume(relation, state, source)
            except CheckpointError:
                source.close()
                raise
            if first is not None:
                source.close()
                source = super()._flight_source(relation, start_offset=first)
                assert isinstance(source, FlightSource)
        source.rows = int(state.get("rows", 0))
        source.reconnect_s = RETRY_BUDGET_S  # a server restarting is waited for
        source.barrier = self.barrier
        source.counted = self.count_event
        return source

    def _check_resume(
        self, relation: RelationDef, state: dict[str, Any], source: FlightSource
    ) -> int | None:
        """Whether a remote tail source can resume from the checkpoint's offset: ``None`` if
        it can; the oldest offset there is when the stream was re-created or the offset is gone
        and ``offset_reset = 'earliest'`` (the gap is reported).

        Raises:
            CheckpointError: the stream was dropped or re-created since the checkpoint, or the
                checkpoint's offset is gone (retention), without ``offset_reset = 'earliest'``.
        """
        start = int(state["offset"]) if "offset" in state else None
        known = state.get("incarnation")
        what = f"source {relation.name} (stream {source.stream!r} on {source.server})"
        message = None
        if known is not None and source.incarnation != known:
            message = (
                f"{what}: the stream was dropped or re-created since the checkpoint "
                f"(incarnation {known}, now {source.incarnation or 'none'}); the offset {start} "
                "names nothing"
            )
            fix = "start over (cancel and submit again, or --fresh), or SET offset_reset = "
            fix += "'earliest' to read the new stream from its start"
        elif start is not None and start < source.first_offset:
            message = (
                f"{what}: the checkpoint's offset {start} is gone (retention kept offsets "
                f"{source.first_offset} and up): {source.first_offset - start} entries were "
                "never read"
            )
            fix = f"SET offset_reset = 'earliest' to go on from {source.first_offset} (the gap "
            fix += "is reported), or start over"
        if message is None:
            return None
        if self.options.offset_reset != "earliest":
            raise CheckpointError(f"{message}. {fix}")
        first = source.first_offset
        self.report_gap(f"{message}; resuming at {first} (offset_reset = 'earliest')")
        return first

    def _store_sources(self) -> dict[str, StoreSource]:
        return {n: s for n, s in self.flight_sources.items() if isinstance(s, StoreSource)}

    def _remote_sources(self) -> dict[str, FlightSource | FlightTicketSource]:
        return {
            n: s
            for n, s in self.flight_sources.items()
            if isinstance(s, (FlightSource, FlightTicketSource))
        }

    def _window_nodes(self) -> list[_WindowNode]:
        return [n for n in self.nodes if isinstance(n, _WindowNode)]

    def _restore_operators(self) -> None:
        manifest = self.manifest
        if manifest is None:
            return
        for node in self._window_nodes():
            entry = manifest.operators.get(str(node.query.index))
            if entry is None:
                raise CheckpointError(
                    f"checkpoint {manifest.epoch} has no state for {node.query.label}; start "
                    "over with --fresh"
                )
            snapshot = OperatorSnapshot.from_bytes(
                self.checkpoints.read(manifest.epoch, str(entry["file"]))
            )
            try:
                node.op = node.query.window.build(  # type: ignore[union-attr]
                    node.input.schema,
                    restore=snapshot,
                    clock_ns=self.clock_ns,
                    wall_clock_ns=self.wall_clock_ns,
                )
            except CheckpointError as exc:
                raise CheckpointError(f"{node.query.label}: {exc}") from exc
            node.finished = node.op.watermark_ns == MAX_WATERMARK_NS
        for name, slot in self.sinks.items():
            slot.rows = int(manifest.sinks.get(name, {}).get("rows", 0))

    def _open_writers(self) -> None:
        manifest = self.manifest
        restored = manifest.epoch if manifest is not None else None
        finished = manifest is not None and manifest.finished
        for name, slot in self.sinks.items():
            if slot.schema is None:
                continue
            entry = manifest.sinks.get(name, {}) if manifest is not None else {}
            rows = int(entry.get("rows", 0))
            try:
                if slot.connector == "stdout":
                    slot.writer = StdoutSink(name, slot.schema, slot.format)
                elif slot.graph is not None:
                    graph = EpochGraphSink(
                        name,
                        FalkorDBSink(name, slot.graph, slot.schema, pipeline=self.name),
                        restored_epoch=restored,
                        rows=rows,
                    )
                    if manifest is not None:
                        staged_graph = entry.get("staged")
                        graph.recover(
                            read_ipc(self.checkpoints.read(manifest.epoch, staged_graph))
                            if staged_graph
                            else []
                        )
                    self._txn[name] = graph
                elif slot.iceberg is not None:
                    txn = EpochIcebergSink(
                        name,
                        slot.iceberg,
                        f"{self.name}/{name}",
                        slot.schema,
                        mark=entry or None,
                    )
                    if manifest is not None:
                        staged = entry.get("staged")
                        txn.recover(
                            manifest.epoch,
                            read_ipc(self.checkpoints.read(manifest.epoch, staged))
                            if staged
                            else [],
                        )
                    self._txn[name] = txn
                elif slot.connector == "file":
                    assert slot.path is not None
                    self._txn[name] = EpochFileSink(
                        name,
                        slot.path,
                        slot.format,
                        slot.schema,
                        restored_epoch=restored,
                        rows=rows,
                        finished=finished,
                    )
                else:
                    assert slot.flight is not None
                    server, stream, writer = slot.flight
                    target: StoreTarget | FlightStreamTarget
                    if "server" in slot.definition.connector or self.store is None:
                        target = FlightStreamTarget(
                            server,
                            stream,
                            slot.schema,
                            writer,
                            on_retry=self.connector_wait,
                            auth=slot.flight_auth,
                        )
                    else:
                        target = StoreTarget(self.store, stream, slot.schema, writer)
                    sink = EpochStreamSink(
                        name,
                        target,
                        slot.schema,
                        mark=entry.get("mark"),
                        incarnation=entry.get("incarnation"),
                        rows=rows,
                    )
                    staged = entry.get("staged")
                    assert manifest is not None or staged is None
                    sink.recover(
                        read_ipc(self.checkpoints.read(manifest.epoch, staged))
                        if manifest is not None and staged
                        else []
                    )
                    self._txn[name] = sink
            except ConnectorError as exc:
                raise sql_error(f"SINK {name}: {exc}", slot.definition.node) from exc

    # --- running ------------------------------------------------------------------------------

    def note(self, message: str) -> None:
        """Log ``message`` about this run (info)."""
        log.info(message, extra={"pipeline": getattr(self, "name", None)})

    def report_gap(self, message: str) -> None:
        """A source offset was gone and ``offset_reset = 'earliest'`` skipped input: log it as
        a warning and keep it (:attr:`gaps`, the checkpoint's metrics)."""
        self.gaps.append(message)
        log.warning(message, extra={"pipeline": getattr(self, "name", None)})

    def count_event(self, batch: pa.RecordBatch | None) -> None:
        """A source handed out one more batch (``None``: a partition's end)."""
        self._events += 1

    def request_checkpoint(self) -> None:
        """Take a checkpoint at the next barrier."""
        self._force.set()

    def wait_checkpoint(self, after: int, timeout_s: float) -> CheckpointInfo | None:
        """Wait until a checkpoint of an epoch above ``after`` completes; ``None`` on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._checkpoint_done:
            while self.last_checkpoint is None or self.last_checkpoint.epoch <= after:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._checkpoint_done.wait(left)
            return self.last_checkpoint

    def request_stop(self) -> None:
        """Checkpoint at the next barrier, then stop (:class:`PipelineStopped`)."""
        self._stop.set()

    def barrier(self) -> None:
        """Called between source batches (every batch so far went through every operator and
        sink): take a checkpoint if one is due; stop if asked to."""
        _crash_point("event", self._events)
        pending = self._events > self._events_at_checkpoint or any(
            t.has_pending for t in self._txn.values()
        )
        every = self.options.checkpoint_every
        due = self._force.is_set() or self._stop.is_set()
        if pending and every is not None and self._events - self._events_at_checkpoint >= every:
            due = True
        if pending and self._interval_s is not None and time.monotonic() >= self._next_due:
            due = True
        if due:
            self._force.clear()
            self.checkpoint()
        if self._stop.is_set():
            raise PipelineStopped(f"pipeline {self.name} stopped after epoch {self.epoch}")

    def plugin_wait(self, node: Any, waiting: str | None) -> None:
        """A plugin stage waits (see the base class); stop here when asked to: the run resumes
        from its last checkpoint and sends the batches after it again."""
        super().plugin_wait(node, waiting)
        if self._stop.is_set():
            raise PipelineStopped(f"pipeline {self.name} stopped while {waiting or 'waiting'}")

    def connector_wait(self, waiting: str | None) -> None:
        """A remote sink retries its server (see the base class); stop here when asked to."""
        super().connector_wait(waiting)
        if waiting is not None and self._stop.is_set():
            raise PipelineStopped(f"pipeline {self.name} stopped while {waiting}")

    def metrics(self) -> dict[str, Any]:
        """Counters now: rows read from sources, rows written per sink, late rows per windowed
        query, watermark per windowed query, open panes, gaps reported, and
        ``data_loss_rows``: the rows resumes under ``offset_reset = 'earliest'`` skipped
        because retention had removed them (cumulative over the pipeline's resumes)."""
        windows = self._window_nodes()
        return {
            "rows_in": self._source_rows(),
            "rows_out": {name: slot.rows for name, slot in self.sinks.items()},
            "late_rows": {
                n.query.label: n.op.metrics.rows_late
                + n.op.metrics.rows_null_time
                + n.op.metrics.rows_out_of_range
                + n.op.metrics.rows_future
                for n in windows
            },
            "watermark_ns": {n.query.label: n.op.watermark_ns for n in windows},
            "open_panes": sum(n.op.open_panes for n in windows),
            "gaps": list(self.gaps),
            "data_loss_rows": self._data_loss_before
            + sum(s.data_loss_rows for s in self._store_sources().values()),
        }

    def _source_rows(self) -> int:
        files = sum(s.rows for s in self.sources.values() if isinstance(s, _FileCursor))
        files += sum(s.rows for s in self._remote_sources().values())
        iceberg = sum(s.rows for s in self._iceberg_sources().values())
        return files + iceberg + sum(s.rows for s in self._store_sources().values())

    def watermark_ns(self) -> int | None:
        """The lowest watermark of the windowed queries (``None`` without one, or before any)."""
        marks = [n.op.watermark_ns for n in self._window_nodes()]
        low = min(marks) if marks else None
        return None if low is None or low == MIN_WATERMARK_NS else low

    def checkpoint(self, *, finished: bool = False) -> CheckpointInfo:
        """Take checkpoint ``epoch + 1`` now (see :mod:`~flight_serve.pipelines.checkpoint`):
        snapshots, offsets, sinks prepared, manifest written last, then the sinks commit and old
        checkpoints are pruned.

        Raises:
            CheckpointError: the state root cannot be written (nothing is committed then).
        """
        self._drain_plugins()  # no batch stays in flight across a barrier
        started = time.perf_counter()
        epoch = self.epoch + 1
        files: dict[str, bytes] = {}
        operators: dict[str, dict[str, Any]] = {}
        for node in self._window_nodes():
            file = f"op-{node.query.index}.snapshot"
            files[file] = node.op.snapshot().to_bytes()
            operators[str(node.query.index)] = {
                "file": file,
                "label": node.query.label,
                "watermark_ns": node.op.watermark_ns,
                "open_panes": node.op.open_panes,
            }
        sources = {
            name: source.position()
            for name, source in self.sources.items()
            if isinstance(source, _FileCursor)
        }
        for name, live in self._store_sources().items():
            sources[name] = live.position_state()
        for name, remote in self._remote_sources().items():
            sources[name] = remote.position_state()
        for name, table in self._iceberg_sources().items():
            sources[name] = table.position_state()
        sinks: dict[str, dict[str, Any]] = {}
        for name, slot in self.sinks.items():
            txn = self._txn.get(name)
            if isinstance(txn, EpochGraphSink):
                sinks[name] = txn.prepare(epoch, files)
            elif isinstance(txn, EpochFileSink):
                sinks[name] = txn.prepare(epoch)
            elif isinstance(txn, EpochStreamSink | EpochIcebergSink):
                sinks[name] = txn.prepare(epoch, files)
            else:
                sinks[name] = {"kind": slot.connector, "rows": slot.rows}
        taken_at = now_utc()
        manifest = Manifest(
            pipeline=self.name,
            epoch=epoch,
            fingerprint=self.fingerprint,
            taken_at=taken_at,
            finished=finished,
            operators=operators,
            sources=sources,
            sinks=sinks,
            metrics=self.metrics(),
        )
        written = self.checkpoints.write(manifest, files)
        _crash_point("checkpoint", epoch)
        for txn in self._txn.values():
            txn.commit(epoch)
        self.epoch = epoch
        _crash_point("commit", epoch)
        self.checkpoints.prune(self.options.checkpoint_retain)
        info = CheckpointInfo(epoch, taken_at, time.perf_counter() - started, written, finished)
        self._events_at_checkpoint = self._events
        if self._interval_s is not None:
            self._next_due = time.monotonic() + self._interval_s
        with self._checkpoint_done:
            self.last_checkpoint = info
            self._checkpoint_done.notify_all()
        if self.on_checkpoint is not None:
            self.on_checkpoint(info)
        return info

    def run(
        self, *, write: bool = True, collect: bool = False
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Run from the restored checkpoint (or the start) to the end of the input, taking
        checkpoints; at the end take the finished checkpoint and write the file sinks' files.

        Yields nothing (a durable run writes its sinks). Raises what
        :class:`~flight_serve.pipelines.runtime.PipelineRuntime` raises, :class:`CheckpointError`,
        and :class:`PipelineStopped` after :meth:`request_stop`.
        """
        if not write or collect:
            raise ValueError("a durable run writes its sinks; collect with PipelineRuntime")
        try:
            if self.manifest is None or not self.manifest.finished:
                yield from super().run(write=True)
                self.checkpoint(finished=True)
            else:  # a crash after the finished checkpoint: only complete what it interrupted
                self._open_writers()
            for txn in self._txn.values():
                if isinstance(txn, EpochFileSink):
                    txn.finalize()
                else:
                    txn.end_input()
        except FlightServeError:
            raise
        finally:
            for txn in self._txn.values():
                txn.close()
            self.release_writers()

    def waiting_for(self) -> str | None:
        """What the run waits for now, as a sentence: a plugin or a connector's server
        (:meth:`plugin_waiting`), else each server stream source that has read every entry
        there is (``source events: waiting for stream 'events' to be created`` / ``… for new
        entries of stream 'events' (next offset 3)``), ``; ``-joined; ``None`` while it has
        input to work on."""
        waiting = self.plugin_waiting()
        if waiting is not None:
            return waiting
        idle = []
        for name, source in self._store_sources().items():
            if source.done or source.backlog:
                continue
            assert self.store is not None
            if not self.store.exists(source.stream):
                idle.append(f"source {name}: waiting for stream {source.stream!r} to be created")
            else:
                idle.append(
                    f"source {name}: waiting for new entries of stream {source.stream!r} "
                    f"(next offset {source.position})"
                )
        return "; ".join(idle) or None

    def store_writers(self) -> dict[str, tuple[str, str]]:
        """``(stream, writer)`` of each stream sink into this server's store, by sink name."""
        if self.store is None:
            return {}
        return {
            name: (slot.flight[1], slot.flight[2])
            for name, slot in self.sinks.items()
            if slot.flight is not None and "server" not in slot.definition.connector
        }

    def hold_writers(self) -> None:
        """Hold the writer name of each stream sink into the server's store
        (:meth:`~flight_serve.store.StreamStore.hold_writer`, as ``pipeline <name>``) until
        :meth:`run` ends or :meth:`release_writers`: no DoPut and no other pipeline writes
        under it meanwhile. Idempotent.

        Raises:
            WriterBusyError: another live writer holds one (the message names the sink, the
                stream, the writer and the holder); nothing is held then.
        """
        if self._writer_holds or self.store is None:
            return
        holds: list[WriterHold] = []
        try:
            for sink, (stream, writer) in self.store_writers().items():
                try:
                    holds.append(self.store.hold_writer(stream, writer, f"pipeline {self.name}"))
                except WriterBusyError as exc:
                    raise WriterBusyError(f"SINK {sink}: {exc}") from None
        except BaseException:
            for hold in holds:
                hold.release()
            raise
        self._writer_holds = holds

    def release_writers(self) -> None:
        """Let go of the writer names :meth:`hold_writers` took (idempotent)."""
        holds, self._writer_holds = self._writer_holds, []
        for hold in holds:
            hold.release()

    def close_sources(self) -> None:
        """Close the sources of a runtime that will not run (a refused submit)."""
        for source in self.flight_sources.values():
            source.close()

    def summary(self) -> RunSummary:
        """Rows per sink, targets (a server stream is ``stream <name>``) and late rows so far."""
        summary = super().summary()
        if self.store is None:
            return summary
        targets = dict(summary.targets)
        for name, slot in self.sinks.items():
            if slot.flight is not None and "server" not in slot.definition.connector:
                targets[name] = f"stream {slot.flight[1]}"
        return RunSummary(summary.rows, targets, summary.late_rows)

    def deliver(self, sink: str, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` to the sink's current epoch (committed at the next checkpoint)."""
        txn = self._txn.get(sink)
        if txn is None:
            super().deliver(sink, batch)
            return
        self.sinks[sink].rows += batch.num_rows
        txn.write(batch)
