"""The checkpoint coordinator: when a checkpoint is due, and taking it.

The run loop is one thread: between two polls of its sources every event polled so far has gone
through every operator and sink, so that gap is an aligned cut. The loop calls
:meth:`CheckpointCoordinator.barrier` there, before each poll of a source that is not done (the
sources know nothing of it), and :meth:`CheckpointCoordinator.counted` for each event a poll
handed out. A checkpoint is due (:meth:`CheckpointCoordinator.due`) when something happened since
the last one and ``checkpoint_every`` source batches went by (a bounded source's partition end
counts as one), or ``checkpoint_interval`` of processing time passed; or at once when asked
(:meth:`~CheckpointCoordinator.request`, :meth:`~CheckpointCoordinator.request_stop`).

:meth:`CheckpointCoordinator.take` takes one, in numbered steps (quix-streams'
``Checkpoint.commit`` order):

1. the graph drains what is in flight (plugin batches);
2. the window operators snapshot their state, the sources their offsets, and every epoch sink
   prepares its epoch (:class:`~flight_serve.connectors.base.EpochSink`), staging files in the
   checkpoint;
3. the manifest is written last (the checkpoint is complete);
4. the epoch sinks commit; old checkpoints are pruned (on the state root's pruning thread,
   :meth:`~flight_serve.pipelines.checkpoint.CheckpointStore.prune_later`; at once after the
   finished checkpoint).

The graph it checkpoints is given as a :class:`Checkpointed`.

Fault injection for tests (never set in production): ``FLIGHT_SERVE_CRASH_AT`` = ``checkpoint:N``
(SIGKILL the process right after checkpoint N's manifest is written, before its sinks commit),
``commit:N`` (after they commit), ``event:N`` (after N source batches, mid-epoch) or
``append:N`` (after the N-th batch a stream sink of the process committed: mid-commit; see
:mod:`~flight_serve.pipelines.epoch_sinks`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from flight_serve.connectors.base import SourceEvent
from flight_serve.engine.operator import OperatorSnapshot
from flight_serve.errors import CheckpointError
from flight_serve.pipelines.checkpoint import (
    CheckpointStore,
    Manifest,
    fingerprint,
    now_utc,
    recovery_neutral_fingerprint,
)
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.upgrade import diff_stateful, operator_index_map

__all__ = [
    "CRASH_ENV",
    "CheckpointCoordinator",
    "CheckpointInfo",
    "Checkpointed",
    "PipelineStopped",
    "ResumeFrom",
]

log = logging.getLogger("flight_serve.pipelines")

#: The fault-injection variable (see the module docstring).
CRASH_ENV = "FLIGHT_SERVE_CRASH_AT"

#: ``"latest"`` (resume the newest unfinished checkpoint, else start), ``"fresh"`` or an epoch.
ResumeFrom = Literal["latest", "fresh"] | int


class PipelineStopped(Exception):
    """Raised out of a checkpointed run after :meth:`CheckpointCoordinator.request_stop`: the
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


def crash_point(kind: str, number: int) -> None:
    """SIGKILL this process if ``FLIGHT_SERVE_CRASH_AT`` is ``<kind>:<number>``."""
    if os.environ.get(CRASH_ENV) == f"{kind}:{number}":
        os.kill(os.getpid(), signal.SIGKILL)  # a real, unclean death: nothing after this runs
        time.sleep(60)  # pragma: no cover  (the signal is delivered asynchronously)


class Checkpointed(Protocol):
    """What the coordinator needs of the graph it checkpoints (the pipeline runtime)."""

    def drain(self) -> None:
        """Wait for every batch in flight (plugin stages) and emit its results."""
        ...

    def has_pending(self) -> bool:
        """Whether an epoch sink holds rows for the next checkpoint."""
        ...

    def snapshot_operators(self, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """Each stateful operator's entry of the manifest; their state goes into ``files``."""
        ...

    def snapshot_sources(self) -> dict[str, dict[str, Any]]:
        """Each source's offsets (:meth:`~flight_serve.connectors.base.Source.snapshot`)."""
        ...

    def prepare_sinks(self, epoch: int, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """Each sink's commit mark (epoch sinks prepare ``epoch``, staging into ``files``)."""
        ...

    def commit_sinks(self, epoch: int) -> None:
        """Every epoch sink commits ``epoch``."""
        ...

    def metrics(self) -> dict[str, Any]:
        """The run's counters, recorded in the manifest."""
        ...


@dataclass
class CheckpointCoordinator:
    """Checkpoints of one pipeline run: the checkpoint resumed from, and the barriers.

    Args:
        checkpoints: the state root.
        options: ``checkpoint_every``, ``checkpoint_interval``, ``checkpoint_retain``.
        name: the pipeline's name in the manifests.
        text: the pipeline's text (its fingerprint is checked on resume).
        resume: ``"latest"``, ``"fresh"`` or an epoch (see :mod:`~flight_serve.pipelines.durable`).
        restart_finished: with ``"latest"``, start over when the newest checkpoint is a
            finished run's.
        on_checkpoint: called after every completed checkpoint.
        stateful: the pipeline's stateful operators and sources
            (:func:`~flight_serve.pipelines.upgrade.stateful_operators`), recorded in every
            manifest.
        upgrade: resume a checkpoint of another version of the pipeline (another text or
            code) when its recorded ``stateful`` matches this one's
            (:func:`~flight_serve.pipelines.upgrade.diff_stateful` is empty): what
            ``pipelines update`` and a restart after it do. ``False``: only the same pipeline.

    Raises:
        CheckpointError: the checkpoint to resume was taken of another pipeline text (with
            ``upgrade``: of a pipeline whose stateful operators differ, one line per operator).

    Hooks for tests (never set in production): :attr:`barrier_hooks` are called at the start of
    every barrier with the number of events counted so far (one may raise to "die" there), and
    :attr:`event_hooks` with each counted event's source name and event.
    """

    checkpoints: CheckpointStore
    options: RunOptions
    name: str
    text: str
    resume: ResumeFrom = "latest"
    restart_finished: bool = True
    on_checkpoint: Callable[[CheckpointInfo], None] | None = None
    barrier_hooks: list[Callable[[int], None]] = field(default_factory=list)
    event_hooks: list[Callable[[str, SourceEvent], None]] = field(default_factory=list)
    #: ``<name>:<sha256>`` of each user function's code (CREATE FUNCTION … LANGUAGE …): code
    #: read from a USING file is not in the text, and is part of the pipeline's identity too
    code_digests: tuple[str, ...] = ()
    stateful: dict[str, Any] = field(default_factory=dict)
    upgrade: bool = False

    def __post_init__(self) -> None:
        # recovery options (offset_reset, expired_snapshot) may be set after a failure
        self.fingerprint = recovery_neutral_fingerprint(self.text)
        self._text_fingerprint = fingerprint(self.text)  # what older checkpoints recorded
        if self.code_digests:  # a pipeline without functions keeps its fingerprint
            codes = "\n".join(self.code_digests)
            self.fingerprint = fingerprint(f"{self.fingerprint}\n{codes}")
            self._text_fingerprint = fingerprint(f"{self._text_fingerprint}\n{codes}")
        self.graph: Checkpointed | None = None
        #: a new version's window query index -> its state's index in the resumed checkpoint
        self._operator_index: dict[int, int] = {}
        #: whether the checkpoint resumed from is another version's (``upgrade``)
        self.upgraded = False
        self.last_checkpoint: CheckpointInfo | None = None
        self.resumed_from: int | None = None
        self.events = 0
        self._events_at_checkpoint = 0
        self._force = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Condition()
        interval = self.options.checkpoint_interval
        self._interval_s = interval.total_seconds() if interval is not None else None
        self._next_due = time.monotonic() + (self._interval_s or 0.0)
        self.manifest = self._pick(self.resume)
        self.epoch = self.manifest.epoch if self.manifest is not None else 0

    def _note(self, message: str) -> None:
        log.info(message, extra={"pipeline": self.name})

    def _pick(self, resume: ResumeFrom) -> Manifest | None:
        self.checkpoints.settle()  # an earlier run's pruning in this process is done
        if resume == "fresh":
            self.checkpoints.clear()
            return None
        if resume == "latest":
            manifest = self.checkpoints.latest()
            if manifest is None:
                return None
            if manifest.finished and self.restart_finished:
                self._note(
                    f"the last run finished at epoch {manifest.epoch}; starting over "
                    f"(state root {self.checkpoints.uri})"
                )
                self.checkpoints.clear()
                return None
        else:
            manifest = self.checkpoints.load(int(resume))
            dropped = self.checkpoints.discard_after(int(resume))
            if dropped:
                self._note(f"resuming from epoch {resume}: checkpoints {dropped} deleted")
        if manifest.fingerprint not in (self.fingerprint, self._text_fingerprint):
            if self.upgrade:
                self._check_upgrade(manifest)
                self.resumed_from = manifest.epoch
                return manifest
            raise CheckpointError(
                f"the pipeline text changed since checkpoint {manifest.epoch} in "
                f"{self.checkpoints.uri} was taken; a checkpoint restores only the pipeline it "
                "was taken of (changing offset_reset or expired_snapshot is allowed): restore "
                "the file, or start over with --fresh"
            )
        self.resumed_from = manifest.epoch
        return manifest

    def _check_upgrade(self, manifest: Manifest) -> None:
        """Accept ``manifest`` of another version when its stateful operators match."""
        if not manifest.stateful:
            raise CheckpointError(
                f"checkpoint {manifest.epoch} in {self.checkpoints.uri} was taken of another "
                "version of the pipeline by a server that did not record its stateful "
                "operators; take a checkpoint with this server first (the old version), then "
                "update"
            )
        diff = diff_stateful(manifest.stateful, self.stateful)
        if diff:
            raise CheckpointError(
                f"the new version cannot resume from checkpoint {manifest.epoch} in "
                f"{self.checkpoints.uri}: its stateful operators differ: " + "; ".join(diff)
            )
        self._operator_index = operator_index_map(manifest.stateful, self.stateful)
        self.upgraded = True
        self._note(f"resuming checkpoint {manifest.epoch} of another version of {self.name}")

    # --- the checkpoint resumed from --------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Whether the checkpoint resumed from is a finished run's."""
        return self.manifest is not None and self.manifest.finished

    def source_state(self, name: str) -> dict[str, Any] | None:
        """Source ``name``'s offsets in the checkpoint resumed from (``None``: a fresh run)."""
        return self.manifest.sources.get(name) if self.manifest is not None else None

    def sink_mark(self, name: str) -> dict[str, Any]:
        """Sink ``name``'s commit mark in the checkpoint resumed from (``{}``: a fresh run)."""
        return self.manifest.sinks.get(name, {}) if self.manifest is not None else {}

    def staged(self, mark: dict[str, Any]) -> bytes | None:
        """The bytes a sink staged in the checkpoint resumed from (its mark's ``staged``)."""
        file = mark.get("staged")
        if self.manifest is None or not file:
            return None
        return self.checkpoints.read(self.manifest.epoch, str(file))

    def operator_state(self, index: int, label: str) -> OperatorSnapshot | None:
        """The snapshot of windowed query ``index`` in the checkpoint resumed from (of a
        distributed run's checkpoint, its instances' snapshots merged:
        :func:`~flight_serve.pipelines.distributed.rescale.merge_snapshots`).

        Raises:
            CheckpointError: the checkpoint has none for it.
        """
        manifest = self.manifest
        if manifest is None:
            return None
        entry = manifest.operators.get(str(self._operator_index.get(index, index)))
        if entry is None:
            raise CheckpointError(
                f"checkpoint {manifest.epoch} has no state for {label}; start over with --fresh"
            )
        if "file" not in entry and "instances" in entry:
            # a distributed run's checkpoint: one file per instance, each with the rows of the
            # key groups it owned; as one operator, their union
            from flight_serve.pipelines.distributed.rescale import merge_snapshots

            return merge_snapshots(
                [
                    OperatorSnapshot.from_bytes(
                        self.checkpoints.read(manifest.epoch, str(part["file"]))
                    )
                    for part in entry["instances"]
                ]
            )
        return OperatorSnapshot.from_bytes(
            self.checkpoints.read(manifest.epoch, str(entry["file"]))
        )

    # --- barriers ---------------------------------------------------------------------------

    def counted(self, source: str, event: SourceEvent, *, bounded: bool) -> None:
        """A source handed out ``event``: a batch counts, and so does a partition's end of a
        ``bounded`` source (a file's end)."""
        if event.kind == "batch" or (bounded and event.kind == "end"):
            self.events += 1
            for hook in self.event_hooks:
                hook(source, event)

    def due(self) -> bool:
        """Whether a checkpoint is due now (see the module docstring)."""
        if self._force.is_set() or self._stop.is_set():
            return True
        assert self.graph is not None
        pending = self.events > self._events_at_checkpoint or self.graph.has_pending()
        if not pending:
            return False
        every = self.options.checkpoint_every
        if every is not None and self.events - self._events_at_checkpoint >= every:
            return True
        return self._interval_s is not None and time.monotonic() >= self._next_due

    def barrier(self) -> None:
        """Called by the run loop between source polls: take a checkpoint if one is due; stop
        if asked to (:class:`PipelineStopped`)."""
        for hook in self.barrier_hooks:
            hook(self.events)
        crash_point("event", self.events)
        if self.due():
            self._force.clear()
            self.take()
        self.stop_if_asked()

    def stop_if_asked(self, waiting: str | None = None) -> None:
        """Raise :class:`PipelineStopped` if :meth:`request_stop` was called (a barrier, or a
        wait for a plugin or a server: ``waiting`` says which)."""
        if not self._stop.is_set():
            return
        if waiting is None:
            raise PipelineStopped(f"pipeline {self.name} stopped after epoch {self.epoch}")
        raise PipelineStopped(f"pipeline {self.name} stopped while {waiting}")

    def request(self) -> None:
        """Take a checkpoint at the next barrier."""
        self._force.set()

    def request_stop(self) -> None:
        """Checkpoint at the next barrier, then stop (:class:`PipelineStopped`)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`request_stop` was called."""
        return self._stop.is_set()

    def wait(self, after: int, timeout_s: float) -> CheckpointInfo | None:
        """Wait until a checkpoint of an epoch above ``after`` completes; ``None`` on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._done:
            while self.last_checkpoint is None or self.last_checkpoint.epoch <= after:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._done.wait(left)
            return self.last_checkpoint

    # --- taking one -------------------------------------------------------------------------

    def take(self, *, finished: bool = False) -> CheckpointInfo:
        """Take checkpoint ``epoch + 1`` now (the steps of the module docstring).

        Raises:
            CheckpointError: the state root cannot be written (nothing is committed then).
        """
        graph = self.graph
        assert graph is not None, "bind the graph first"
        graph.drain()  # no batch stays in flight across a barrier
        started = time.perf_counter()
        epoch = self.epoch + 1
        files: dict[str, bytes] = {}
        operators = graph.snapshot_operators(files)
        sources = graph.snapshot_sources()
        sinks = graph.prepare_sinks(epoch, files)
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
            metrics=graph.metrics(),
            stateful=self.stateful,
        )
        written = self.checkpoints.write(manifest, files)
        crash_point("checkpoint", epoch)
        graph.commit_sinks(epoch)
        self.epoch = epoch
        crash_point("commit", epoch)
        if finished:  # the run ends here: leave the state root as retention says
            self.checkpoints.settle()
            self.checkpoints.prune(self.options.checkpoint_retain)
        else:  # off the run loop (see the checkpoint module's Retention)
            self.checkpoints.prune_later(self.options.checkpoint_retain)
        info = CheckpointInfo(epoch, taken_at, time.perf_counter() - started, written, finished)
        self._events_at_checkpoint = self.events
        if self._interval_s is not None:
            self._next_due = time.monotonic() + self._interval_s
        with self._done:
            self.last_checkpoint = info
            self._done.notify_all()
        if self.on_checkpoint is not None:
            self.on_checkpoint(info)
        return info
