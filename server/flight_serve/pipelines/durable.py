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

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from flight_serve._arrow import read_ipc
from flight_serve.connectors.base import EpochSink, Source
from flight_serve.connectors.flight import RETRY_BUDGET_S
from flight_serve.errors import ConnectorError, FlightServeError
from flight_serve.pipelines.checkpoint import CheckpointStore
from flight_serve.pipelines.connect import REGISTRY, EpochSinkArgs, check_checkpointed
from flight_serve.pipelines.coordinator import (
    CRASH_ENV,
    CheckpointCoordinator,
    CheckpointInfo,
    PipelineStopped,
    ResumeFrom,
)
from flight_serve.pipelines.dialect import sql_error
from flight_serve.pipelines.graph import WindowNode
from flight_serve.pipelines.pipeline import PipelinePlan
from flight_serve.pipelines.plugins import PluginHub
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary
from flight_serve.pipelines.store_io import StoreSource
from flight_serve.store import StreamStore
from flight_serve.store.streams import WriterBusyError, WriterHold
from flight_serve.types import MIN_WATERMARK_NS

__all__ = [
    "CRASH_ENV",
    "CheckpointInfo",
    "DurableRuntime",
    "PipelineStopped",
    "ResumeFrom",
]

log = logging.getLogger("flight_serve.pipelines")

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
        check_checkpointed(plan, server=store is not None)
        root = state_root or self.options.state_root
        if root is None:
            base = output_dir if output_dir is not None else Path.cwd()
            root = str(base / "checkpoints" / name)
        self.checkpoints = CheckpointStore(root)
        self._writer_holds: list[WriterHold] = []
        #: the barriers and the checkpoint resumed from (composed into the run loop)
        coordinator = CheckpointCoordinator(
            self.checkpoints,
            self.options,
            name,
            plan.text,
            resume=resume,
            restart_finished=restart_finished,
            on_checkpoint=on_checkpoint,
        )
        self._coordinator = coordinator
        self.manifest = coordinator.manifest
        #: rows skipped by earlier resumes (offset_reset = 'earliest'), from the checkpoint
        self._data_loss_before = (
            int(self.manifest.metrics.get("data_loss_rows", 0)) if self.manifest is not None else 0
        )
        # opens the sources (from their offsets) and builds the operators (from their snapshots)
        super().__init__(
            plan,
            output_dir=output_dir,
            plugins=plugins,
            data_dir=store.data_dir if store is not None else None,
            coordinator=coordinator,
            store=store,
            reconnect_s=RETRY_BUDGET_S,  # a server restarting is waited for
        )
        coordinator.graph = self

    # --- building -----------------------------------------------------------------------------

    def _store_sources(self) -> dict[str, StoreSource]:
        return {n: s for n, s in self.flight_sources.items() if isinstance(s, StoreSource)}

    def _window_nodes(self) -> list[WindowNode]:
        return [n for n in self.nodes if isinstance(n, WindowNode)]

    @property
    def _txn(self) -> dict[str, EpochSink]:
        """The exactly-once sinks, by name."""
        return {n: s.epoch for n, s in self.sinks.items() if s.epoch is not None}

    def _open_writers(self) -> None:
        manifest = self.manifest
        restored = manifest.epoch if manifest is not None else None
        finished = manifest is not None and manifest.finished
        for name, slot in self.sinks.items():
            if slot.schema is None:
                continue
            entry = self._coordinator.sink_mark(name)
            spec = REGISTRY[slot.connector]
            try:
                if spec.epoch_sink is None:  # stdout: its rows are counted in the mark
                    assert spec.sink is not None
                    slot.writer = spec.sink(slot, self.name)
                    continue
                epoch = spec.epoch_sink(
                    slot,
                    EpochSinkArgs(self, self.name, entry, int(entry.get("rows", 0)), restored, finished),
                )
                slot.epoch = epoch
                if manifest is not None:  # redo the commit of the checkpoint resumed from
                    staged = self._coordinator.staged(entry)
                    epoch.recover(read_ipc(staged) if staged is not None else [])
            except ConnectorError as exc:
                raise sql_error(f"SINK {name}: {exc}", slot.definition.node) from exc

    # --- running ------------------------------------------------------------------------------

    def note(self, message: str) -> None:
        """Log ``message`` about this run (info)."""
        log.info(message, extra={"pipeline": getattr(self, "name", None)})

    @property
    def on_checkpoint(self) -> Callable[[CheckpointInfo], None] | None:
        """Called after every completed checkpoint."""
        return self._coordinator.on_checkpoint

    @on_checkpoint.setter
    def on_checkpoint(self, callback: Callable[[CheckpointInfo], None] | None) -> None:
        self._coordinator.on_checkpoint = callback

    @property
    def epoch(self) -> int:
        """The last completed checkpoint's epoch (or the one resumed from; 0: none)."""
        return self._coordinator.epoch

    @property
    def last_checkpoint(self) -> CheckpointInfo | None:
        """The last checkpoint this run completed."""
        return self._coordinator.last_checkpoint

    @property
    def resumed_from(self) -> int | None:
        """The epoch the run resumed from (``None``: it started fresh)."""
        return self._coordinator.resumed_from

    def request_checkpoint(self) -> None:
        """Take a checkpoint at the next barrier."""
        self._coordinator.request()

    def wait_checkpoint(self, after: int, timeout_s: float) -> CheckpointInfo | None:
        """Wait until a checkpoint of an epoch above ``after`` completes; ``None`` on timeout."""
        return self._coordinator.wait(after, timeout_s)

    def request_stop(self) -> None:
        """Checkpoint at the next barrier, then stop (:class:`PipelineStopped`)."""
        self._coordinator.request_stop()

    def metrics(self) -> dict[str, Any]:
        """Counters now: rows read from sources, rows written per sink, late rows per windowed
        query, watermark per windowed query, open panes, gaps reported, ``nodes``
        (:meth:`~flight_serve.pipelines.runtime.PipelineRuntime.node_metrics`), and
        ``data_loss_rows``: the rows resumes under ``offset_reset = 'earliest'`` skipped
        because retention had removed them (cumulative over the pipeline's resumes)."""
        windows = self._window_nodes()
        sources: list[Source] = [*self.sources.values(), *self.flight_sources.values()]
        return {
            "rows_in": sum(s.rows for s in sources),
            "rows_out": {name: slot.rows for name, slot in self.sinks.items()},
            "late_rows": {n.query.label: n.late_rows() for n in windows},
            "watermark_ns": {n.query.label: n.op.watermark_ns for n in windows},
            "open_panes": sum(n.op.open_panes for n in windows),
            "gaps": list(self.gaps),
            "data_loss_rows": self._data_loss_before
            + sum(s.data_loss_rows for s in self._store_sources().values()),
            "nodes": self.node_metrics(),
        }

    def watermark_ns(self) -> int | None:
        """The lowest watermark of the windowed queries (``None`` without one, or before any)."""
        marks = [n.op.watermark_ns for n in self._window_nodes()]
        low = min(marks) if marks else None
        return None if low is None or low == MIN_WATERMARK_NS else low

    def checkpoint(self, *, finished: bool = False) -> CheckpointInfo:
        """Take checkpoint ``epoch + 1`` now (:meth:`CheckpointCoordinator.take`).

        Raises:
            CheckpointError: the state root cannot be written (nothing is committed then).
        """
        return self._coordinator.take(finished=finished)

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
        epochs = self._txn
        try:
            if not self._coordinator.finished:
                yield from super().run(write=True)
                self.checkpoint(finished=True)
            else:  # a crash after the finished checkpoint: only complete what it interrupted
                self._open_writers()
            epochs = self._txn
            for epoch in epochs.values():
                epoch.end_input()
        except FlightServeError:
            raise
        finally:
            for epoch in self._txn.values():
                epoch.close()
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
