"""Durable runs: a pipeline that takes checkpoints, and resumes from one after a crash.

:class:`DurableRuntime` is one run of the runtime (:class:`~flight_serve.pipelines.runtime.PipelineRuntime`)
composed with a checkpoint coordinator (:mod:`flight_serve.pipelines.coordinator`, over the
state root of :mod:`flight_serve.pipelines.checkpoint`) and, for a server pipeline, the
server's store (its streams, and the writer names its stream sinks hold). The runtime builds
the sources from their checkpoint's offsets, the operators from their snapshots and the
exactly-once sinks (:mod:`flight_serve.pipelines.epoch_sinks`) from their commit marks, and
asks the coordinator for a barrier between polls; this class is the run's handle (stop,
checkpoint on request, metrics, writer holds):

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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from flight_serve.connectors.base import EpochSink, Source
from flight_serve.connectors.file import FileSource
from flight_serve.connectors.flight import RETRY_BUDGET_S
from flight_serve.functions.python import SandboxConfig
from flight_serve.pipelines.checkpoint import CheckpointStore, Manifest
from flight_serve.pipelines.connect import check_checkpointed
from flight_serve.pipelines.coordinator import (
    CRASH_ENV,
    CheckpointCoordinator,
    CheckpointInfo,
    PipelineStopped,
    ResumeFrom,
)
from flight_serve.pipelines.graph import Node, WindowNode
from flight_serve.pipelines.pipeline import PipelinePlan
from flight_serve.pipelines.plugins import PluginHub
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary
from flight_serve.pipelines.slots import SinkSlot
from flight_serve.pipelines.store_io import StoreSource
from flight_serve.pipelines.upgrade import stateful_operators
from flight_serve.pipelines.user_functions import FunctionSet, code_digests
from flight_serve.store import StreamStore
from flight_serve.store.streams import WriterBusyError, WriterHold

__all__ = [
    "CRASH_ENV",
    "CheckpointInfo",
    "DurableRuntime",
    "PipelineStopped",
    "ResumeFrom",
]


class DurableRuntime:
    """A pipeline run that checkpoints and resumes (see the module docstring): a
    :class:`~flight_serve.pipelines.runtime.PipelineRuntime` (:attr:`runtime`) built with a
    :class:`~flight_serve.pipelines.coordinator.CheckpointCoordinator` (:attr:`coordinator`)
    and the server's store.

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
        sandbox: the ``python`` runner's sandbox (see :class:`PipelineRuntime`).
        upgrade: resume a checkpoint of another version of the pipeline whose stateful
            operators match (``pipelines update``; see :class:`CheckpointCoordinator`).

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
        sandbox: SandboxConfig | None = None,
        upgrade: bool = False,
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
        self.coordinator = CheckpointCoordinator(
            self.checkpoints,
            self.options,
            name,
            plan.text,
            resume=resume,
            restart_finished=restart_finished,
            on_checkpoint=on_checkpoint,
            code_digests=code_digests(plan.user_functions),
            stateful=stateful_operators(plan),
            upgrade=upgrade,
        )
        self.manifest: Manifest | None = self.coordinator.manifest
        #: the run: sources opened from their offsets, operators built from their snapshots
        self.runtime = PipelineRuntime(
            plan,
            output_dir=output_dir,
            plugins=plugins,
            data_dir=store.data_dir if store is not None else None,
            coordinator=self.coordinator,
            sandbox=sandbox,
            store=store,
            reconnect_s=RETRY_BUDGET_S,  # a server restarting is waited for
        )
        self.coordinator.graph = self.runtime

    # --- the run's graph (PipelineRuntime) ------------------------------------------------

    @property
    def plan(self) -> PipelinePlan:
        return self.runtime.plan

    @property
    def sources(self) -> dict[str, FileSource]:
        """The bounded (file) sources, by name."""
        return self.runtime.sources

    @property
    def flight_sources(self) -> dict[str, Source]:
        """The live sources, by name."""
        return self.runtime.flight_sources

    @property
    def user_functions(self) -> FunctionSet:
        """The run's user functions (``CREATE FUNCTION … LANGUAGE python | wasm``)."""
        return self.runtime.user_functions

    @property
    def sinks(self) -> dict[str, SinkSlot]:
        return self.runtime.sinks

    @property
    def nodes(self) -> list[Node]:
        return self.runtime.nodes

    @property
    def gaps(self) -> list[str]:
        """Inputs skipped under ``offset_reset = 'earliest'``."""
        return self.runtime.gaps

    @property
    def connector_waiting(self) -> str | None:
        """Why a connector retries its server now, else ``None``."""
        return self.runtime.connector_waiting

    @property
    def on_wait(self) -> Callable[[str | None], None] | None:
        """Told when a connector starts waiting for its server and when none waits any more."""
        return self.runtime.on_wait

    @on_wait.setter
    def on_wait(self, callback: Callable[[str | None], None] | None) -> None:
        self.runtime.on_wait = callback

    def connector_wait(self, waiting: str | None) -> None:
        """See :meth:`PipelineRuntime.connector_wait`."""
        self.runtime.connector_wait(waiting)

    def explain(self) -> str:
        """The plan as text (:meth:`PipelineRuntime.explain`)."""
        return self.runtime.explain()

    def snapshot_sources(self) -> dict[str, dict[str, Any]]:
        """Each source's offsets now."""
        return self.runtime.snapshot_sources()

    def metrics(self) -> dict[str, Any]:
        """The run's counters (:meth:`PipelineRuntime.metrics`)."""
        return self.runtime.metrics()

    def watermark_ns(self) -> int | None:
        """The lowest watermark of the windowed queries (:meth:`PipelineRuntime.watermark_ns`)."""
        return self.runtime.watermark_ns()

    def plugin_errors(self) -> dict[str, str]:
        """The last error of each plugin function (:meth:`PipelineRuntime.plugin_errors`)."""
        return self.runtime.plugin_errors()

    def summary(self) -> RunSummary:
        """Rows per sink, targets (a server stream is ``stream <name>``) and late rows so far."""
        return self.runtime.summary()

    def _window_nodes(self) -> list[WindowNode]:
        return self.runtime.window_nodes()

    @property
    def _txn(self) -> dict[str, EpochSink]:
        """The exactly-once sinks, by name."""
        return {n: s.epoch for n, s in self.sinks.items() if s.epoch is not None}

    # --- checkpoints (CheckpointCoordinator) ----------------------------------------------

    @property
    def on_checkpoint(self) -> Callable[[CheckpointInfo], None] | None:
        """Called after every completed checkpoint."""
        return self.coordinator.on_checkpoint

    @on_checkpoint.setter
    def on_checkpoint(self, callback: Callable[[CheckpointInfo], None] | None) -> None:
        self.coordinator.on_checkpoint = callback

    @property
    def epoch(self) -> int:
        """The last completed checkpoint's epoch (or the one resumed from; 0: none)."""
        return self.coordinator.epoch

    @property
    def last_checkpoint(self) -> CheckpointInfo | None:
        """The last checkpoint this run completed."""
        return self.coordinator.last_checkpoint

    @property
    def resumed_from(self) -> int | None:
        """The epoch the run resumed from (``None``: it started fresh)."""
        return self.coordinator.resumed_from

    def request_checkpoint(self) -> None:
        """Take a checkpoint at the next barrier."""
        self.coordinator.request()

    def wait_checkpoint(self, after: int, timeout_s: float) -> CheckpointInfo | None:
        """Wait until a checkpoint of an epoch above ``after`` completes; ``None`` on timeout."""
        return self.coordinator.wait(after, timeout_s)

    def request_stop(self) -> None:
        """Checkpoint at the next barrier, then stop (:class:`PipelineStopped`)."""
        self.coordinator.request_stop()

    def checkpoint(self, *, finished: bool = False) -> CheckpointInfo:
        """Take checkpoint ``epoch + 1`` now (:meth:`CheckpointCoordinator.take`).

        Raises:
            CheckpointError: the state root cannot be written (nothing is committed then).
        """
        return self.coordinator.take(finished=finished)

    # --- running --------------------------------------------------------------------------

    def run(
        self, *, write: bool = True, collect: bool = False
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Run from the restored checkpoint (or the start) to the end of the input, taking
        checkpoints; at the end take the finished checkpoint and write the file sinks' files
        (:meth:`PipelineRuntime.run` with a coordinator); then let go of the writer names
        :meth:`hold_writers` took.

        Yields nothing (a durable run writes its sinks). Raises what
        :class:`~flight_serve.pipelines.runtime.PipelineRuntime` raises, :class:`CheckpointError`,
        and :class:`PipelineStopped` after :meth:`request_stop`.
        """
        if not write or collect:
            raise ValueError("a durable run writes its sinks; collect with PipelineRuntime")
        try:
            yield from self.runtime.run(write=True)
        finally:
            self.release_writers()

    def _store_sources(self) -> dict[str, StoreSource]:
        return {n: s for n, s in self.flight_sources.items() if isinstance(s, StoreSource)}

    def waiting_for(self) -> str | None:
        """What the run waits for now, as a sentence: a plugin or a connector's server
        (:meth:`PipelineRuntime.plugin_waiting`), else each server stream source that has
        read every entry there is (``source events: waiting for stream 'events' to be
        created`` / ``… for new entries of stream 'events' (next offset 3)``), ``; ``-joined;
        ``None`` while it has input to work on."""
        waiting = self.runtime.plugin_waiting()
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
        return {
            name: slot.store_writer
            for name, slot in self.sinks.items()
            if slot.store_writer is not None
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
        """Close the sources (and the functions) of a runtime that will not run (a refused
        submit)."""
        for source in self.flight_sources.values():
            source.close()
        self.user_functions.close()
