"""The distributed workers (:mod:`.workers`) as Ray actors: ``flight-serve run --runtime ray``.

:func:`run_on_ray` places one :class:`~.workers.WindowWorker` actor per instance
(``parallelism``) and up to ``parallelism`` :class:`~.workers.SourceWorker` actors (one per file
or Parquet row-group part at most; ``parallelism`` with a stream source), each owning files of
the file sources and writers of the stream sources (:func:`~.workers.assign_splits`,
:mod:`.streams`; the driver decides where each stream starts and sends it to every actor). A source actor sends each window actor its records with an
actor call (``put``): the batches travel through Ray's object store (Arrow buffers, pickled out
of band), in order per caller, at most :data:`IN_FLIGHT` calls unanswered per window actor
(backpressure). A window actor sends the second exchange's records (a windowed query reading
another's output) to the other window actors the same way, without waiting for the answers
(:class:`_Host`). The driver (this process)
writes what the actors collect to the pipeline's sinks, with the same writers as an embedded
run, so sinks are written by one process. Without ``address`` a local Ray is started for the
run (``num_cpus=2``, no dashboard, loopback only) and stopped after it; with one
(``auto``, ``ray://host:10001``), the run joins that cluster, whose nodes must read the same
input paths and the same ``flight_serve`` version.

While a stream source runs, the driver also ticks the window actors at each collection (every
0.2 s): their idle partitions (``idle_timeout``) are processing time.

**Checkpoints** (``SET checkpoint_interval`` / ``checkpoint_every``, or a ``state_root``): the
driver is the checkpoint coordinator (:class:`~flight_serve.pipelines.coordinator.CheckpointCoordinator`,
the embedded run's): when one is due it arms a barrier on every window actor at a position
ahead of all of them (:meth:`~.workers.WindowWorker.arm`); each actor cuts there and writes its
key groups' state to the state root itself (``op-<query>-i<instance>.snapshot`` in the epoch's
directory). Output an actor produced after its cut is held by the driver until every actor has
cut; then the manifest is written (every instance's file, the sources' offsets in the embedded
file source's format) and the sinks' epoch commits (the exactly-once file sinks of an embedded
checkpointed run). A barrier an actor declines (it was past the position) is retried further
ahead. A run resumes from the newest checkpoint (``resume``), at any parallelism: the actors'
state is merged and split by key group (a rescale). A worker that dies makes the run restore
every actor from the last complete checkpoint (a global restart; the epoch sinks drop what was
not committed), so every row is written once.

Ray is imported here only, when a run starts (:func:`import_ray`); without it the error names the
extra: ``pip install 'flight-serve[ray]'``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flight_serve.errors import FlightServeError, PipelineSQLError
from flight_serve.pipelines.checkpoint import CheckpointStore
from flight_serve.pipelines.connect import check_checkpointed
from flight_serve.pipelines.coordinator import (
    CheckpointCoordinator,
    CheckpointInfo,
    PipelineStopped,
    ResumeFrom,
)
from flight_serve.pipelines.distributed.keygroups import DEFAULT_MAX_PARALLELISM
from flight_serve.pipelines.distributed.streams import fed_streams, stream_starts
from flight_serve.pipelines.distributed.tables import table_plans
from flight_serve.pipelines.distributed.workers import (
    Cut,
    InstanceStatus,
    JobSpec,
    Record,
    Restore,
    SourceCut,
    SourceWorker,
    Splits,
    StreamCut,
    StreamStart,
    TableCut,
    TablePlan,
    Taken,
    WindowWorker,
    assign_splits,
    check_distributable,
    fed_sources,
    summary_of,
    write_results,
)
from flight_serve.pipelines.pipeline import PipelinePlan, parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime, RunSummary
from flight_serve.pipelines.upgrade import stateful_operators
from flight_serve.pipelines.user_functions import code_digests

if TYPE_CHECKING:
    from flight_serve.functions.python import SandboxConfig

__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "IN_FLIGHT",
    "RayRunStats",
    "import_ray",
    "resolve_parallelism",
    "run_on_ray",
]

#: Unanswered ``put`` calls a source actor allows per window actor before it waits.
IN_FLIGHT = 8
#: How often (seconds) the driver collects the window actors' output while sources run.
_GATHER_S = 0.2
#: Unanswered second-exchange calls a window host keeps before it drops the answered ones.
_SENT_PRUNE = 64
#: Global restarts of a run whose worker died before it fails (Flink's fixed-delay restart
#: strategy has attempts too; here without a delay: Ray has already placed the new actors).
DEFAULT_MAX_RESTARTS = 3


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        FlightServeError: Ray is not installed (the message names the ``ray`` extra).
    """
    try:
        import ray
    except ImportError as exc:
        raise FlightServeError(
            "--runtime ray needs Ray: pip install 'flight-serve[ray]' (the ray extra)"
        ) from exc
    return ray


def start_ray(ray: Any, address: str | None = None) -> None:
    """``ray.init`` as flight-serve calls it: without an address a new local Ray on loopback with
    two CPUs, no dashboard and no log forwarding (Ray's ``address="local"``: not a cluster that
    ``ray start`` left running on this machine, nor ``RAY_ADDRESS``; ``auto`` joins those); with
    one, a connection to that cluster.

    ``ray.init`` installs two signal handlers in the driver over wasmtime's (SIGILL, SIGSEGV,
    SIGBUS, SIGFPE): Ray's failure signal handler (abseil's) and Python's ``faulthandler`` when
    it is off. Each prints a stack and raises the signal again from inside its handler, away
    from the wasm instruction that faulted, so wasmtime no longer claims it: a WebAssembly trap
    (``unreachable`` is a ``ud2``, SIGILL; an out-of-bounds load hits a guard page, SIGSEGV)
    killed the process instead of raising ``wasmtime.Trap``. So, measured here with Ray 2.60:

    * ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER=1`` unless the caller set the variable, in the
      environment (the raylet and its workers inherit it) and in ``ray._private.ray_constants``
      (Ray reads the variable there, once, when it is first imported);
    * ``faulthandler`` turned off again if ``ray.init`` turned it on; a process that had it on
      before (pytest does, before any engine exists) keeps it.

    ``ray.init`` also replaces the main thread's SIGTERM handler with its own (which exits with
    status 1 at once); a handler the caller had set (``flight-serve run``'s: checkpoint, then
    stop with status 143) is put back.

    Raises:
        Whatever ``ray.init`` raises (a wrong address, a cluster that does not answer).
    """
    if "RAY_DISABLE_FAILURE_SIGNAL_HANDLER" not in os.environ:
        os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
        from ray._private import ray_constants

        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    had_faulthandler = faulthandler.is_enabled()
    # ray.init replaces the main thread's SIGTERM handler with one that exits at once (status
    # 1): a caller's own (flight-serve run's: checkpoint, then stop) is put back
    on_sigterm = (
        signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    if address is None:  # "local": a new one even when `ray start` left a cluster running here
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            configure_logging=False,
        )
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    if not had_faulthandler and faulthandler.is_enabled():
        faulthandler.disable()
    if callable(on_sigterm):
        signal.signal(signal.SIGTERM, on_sigterm)


def resolve_parallelism(
    flag: int | None, option: int | None, max_option: int | None
) -> tuple[int, int]:
    """``(parallelism, max_parallelism)``: ``--parallelism`` over ``SET parallelism`` over 1;
    ``SET max_parallelism`` over 128.

    Raises:
        PipelineSQLError: parallelism below 1 or above max_parallelism.
    """
    parallelism = flag if flag is not None else option if option is not None else 1
    max_parallelism = max_option if max_option is not None else DEFAULT_MAX_PARALLELISM
    if parallelism < 1:
        raise PipelineSQLError(f"parallelism must be at least 1, got {parallelism}")
    if parallelism > max_parallelism:
        raise PipelineSQLError(
            f"parallelism {parallelism} is above max_parallelism {max_parallelism} (the key "
            "groups: SET max_parallelism = N)"
        )
    return parallelism, max_parallelism


@dataclass(frozen=True)
class RayRunStats:
    """What a Ray run measured.

    Attributes:
        source_actors: source actors started.
        window_actors: window actors started (the parallelism).
        put_calls: ``put`` calls (exchange messages) sent.
        records: records sent (one per split step per instance per windowed query).
        seconds: wall time from the first actor created to the last result written.
        instances: each window actor's last :class:`~.workers.InstanceStatus` (after its
            end of input: its maxima cover the whole run).
        restarts: global restarts after a worker died.
        checkpoints: checkpoints the attempt that finished completed (the finished one
            included).
        declined: barriers an actor declined in that attempt (tried again further ahead).
        resumed_from: the checkpoint the run started from (``None``: the start).
        attempts_from: the checkpoint each attempt started from (``None``: the start); more
            than one attempt after a worker died.
        stage_calls: calls between window actors of the second exchange (a windowed query
            reading another's output), in the attempt that finished.
        stage_records: records in those calls.
    """

    source_actors: int
    window_actors: int
    put_calls: int
    records: int
    seconds: float
    instances: tuple[InstanceStatus, ...] = ()
    restarts: int = 0
    checkpoints: int = 0
    declined: int = 0
    resumed_from: int | None = None
    attempts_from: tuple[int | None, ...] = ()
    stage_calls: int = 0
    stage_records: int = 0


class _Host:
    """A Ray actor hosting one worker of a run at a time: a window worker (``put``, ``take``,
    ``finish``; sending the second exchange's ``put`` calls to the other window hosts) or a
    source worker (``run``, sending ``put`` calls to window hosts). Hosts are kept between runs
    of one Ray session (:func:`_hosts`), so a run does not pay a worker process start (about
    0.6 s each here) per actor.

    No call waits on another actor's call: a window host sends its second-exchange records
    (:meth:`~.workers.WindowWorker.outgoing`) without waiting for the answers (two window
    hosts waiting on each other's ``put`` would deadlock, each running one call at a time), and
    keeps their refs for the driver (:meth:`in_flight`), which waits on them before the end.
    A window worker that failed keeps failing (its state is half-updated): every later call
    raises its error, so the driver's next gather sees it."""

    def __init__(self) -> None:
        import ray

        self._ray = ray
        self._window: WindowWorker | None = None
        self._source: SourceWorker | None = None
        self._windows: list[Any] = []
        self._in_flight: list[list[Any]] = []
        self._sent: list[Any] = []
        self._failed: BaseException | None = None

    def window(
        self,
        spec: JobSpec,
        instance: int,
        restore: Restore | None,
        windows: list[Any],
        streams: dict[str, StreamStart],
        tables: dict[str, TablePlan],
    ) -> None:
        self._source = None
        self._failed = None
        self._windows, self._sent = windows, []
        self._window = WindowWorker(spec, instance, restore, streams, tables)

    def source(
        self,
        spec: JobSpec,
        splits: Splits,
        windows: list[Any],
        start: dict[str, SourceCut | StreamCut | TableCut] | None,
        streams: dict[str, StreamStart],
        tables: dict[str, TablePlan],
    ) -> None:
        self._window = None
        self._windows = windows
        self._in_flight = [[] for _ in windows]
        self._source = SourceWorker(
            spec, splits, self._send, start=start, streams=streams, tables=tables
        )

    def reset(self) -> None:
        self._window = self._source = None
        self._windows, self._in_flight, self._sent = [], [], []
        self._failed = None

    def _send(self, instance: int, records: list[Record]) -> None:
        pending = self._in_flight[instance]
        pending.append(self._windows[instance].put.remote(records))
        if len(pending) > IN_FLIGHT:
            done, rest = self._ray.wait(pending, num_returns=len(pending) - IN_FLIGHT)
            self._ray.get(done)  # a window's error surfaces here
            self._in_flight[instance] = rest

    def run(self) -> tuple[int, int]:
        """Read every split; wait for every ``put``; returns ``(put calls, records)``."""
        assert self._source is not None
        self._source.run()
        for pending in self._in_flight:
            self._ray.get(pending)
        return self._source.sent_calls, self._source.sent_records

    def _worker(self) -> WindowWorker:
        if self._failed is not None:
            raise self._failed
        assert self._window is not None
        return self._window

    def _forward(self, worker: WindowWorker) -> None:
        """Send the second exchange's records to the other window hosts (not waiting)."""
        for instance, records in worker.outgoing():
            self._sent.append(self._windows[instance].put.remote(records))
        if len(self._sent) > _SENT_PRUNE:  # drop the answered ones (never waits)
            _, self._sent = self._ray.wait(self._sent, num_returns=len(self._sent), timeout=0)

    def _run(self, call: Callable[[WindowWorker], Any]) -> Any:
        """``call`` on the window worker, then its records sent on; a failure is kept."""
        worker = self._worker()
        try:
            out = call(worker)
        except BaseException as exc:
            self._failed = exc
            raise
        self._forward(worker)
        return out

    def put(self, records: list[Record]) -> None:
        self._run(lambda w: w.put(records))

    def in_flight(self) -> list[Any]:
        """The refs of the ``put`` calls this host sent other window hosts that have not
        finished yet (each only once: the caller waits on them)."""
        self._worker()
        if not self._sent:
            return []
        _, pending = self._ray.wait(self._sent, num_returns=len(self._sent), timeout=0)
        self._sent = []
        return list(pending)

    def take(self) -> Taken:
        return self._worker().take()

    def tick(self) -> None:
        self._run(lambda w: w.tick())

    def position(self) -> tuple[dict[str, int], dict[str, int]]:
        """Steps consumed per source, and per stream the offset every instance reaches."""
        worker = self._worker()
        return worker.position(), worker.known()

    def arm(self, barrier: int, epoch: int, positions: dict[str, int]) -> bool:
        return bool(self._run(lambda w: w.arm(barrier, epoch, positions)))

    def disarm(self, barrier: int) -> None:
        self._run(lambda w: w.disarm(barrier))

    def finish(self, final: tuple[int, int] | None) -> tuple[Taken, dict[str, int]]:
        out: tuple[Taken, dict[str, int]] = self._run(lambda w: w.finish(final))
        return out

    def status(self) -> InstanceStatus:
        return self._worker().status()


#: The hosts of this process's Ray session, by role: (session id, window hosts, source hosts).
_POOL: dict[str, Any] = {}


def _hosts(ray: Any, role: str, count: int) -> list[Any]:
    """``count`` hosts of ``role`` (``window`` or ``source``) of the current Ray session,
    started when missing."""
    context = ray.get_runtime_context()  # a new local Ray has a new node id, maybe the same job id
    session = f"{context.get_node_id()}/{context.get_job_id()}"
    if _POOL.get("session") != session:
        _POOL.clear()
        _POOL["session"] = session
    pool: list[Any] = _POOL.setdefault(role, [])
    cls = _POOL.get("cls")
    if cls is None:
        cls = _POOL["cls"] = ray.remote(num_cpus=0, max_restarts=0)(_Host)
    while len(pool) < count:
        pool.append(cls.remote())
    return pool[:count]


def _drop_hosts(ray: Any) -> None:
    """Kill every pooled host (after a failed run: their state is unknown)."""
    for role in ("window", "source"):
        for host in _POOL.pop(role, []):
            ray.kill(host)


class _Replay:
    """The driver's writes across attempts of a run without checkpoints (a global restart from
    the start after a worker died).

    Each window instance's output is deterministic: instance *i* runs its records in the
    embedded order. So, per instance and sink, the driver counts the rows it has written; a
    later attempt drops the first that many rows of the same instance's output to that sink,
    and every row reaches the sinks once."""

    def __init__(self, driver: Any, collect: list[tuple[str, pa.RecordBatch]] | None) -> None:
        self.driver, self.collect = driver, collect
        self.written: dict[tuple[int, str], int] = {}
        self.seen: dict[tuple[int, str], int] = {}

    def taken_from(self, instance: int, taken: Taken) -> None:
        self.write(instance, [*taken.before, *taken.after])

    last = taken_from

    def write(self, instance: int, batches: list[tuple[str, pa.RecordBatch]]) -> None:
        for sink, batch in batches:
            key = (instance, sink)
            seen = self.seen.get(key, 0)
            done = self.written.get(key, 0)
            skip = min(max(done - seen, 0), batch.num_rows)
            self.seen[key] = seen + batch.num_rows
            if skip < batch.num_rows or (batch.num_rows == 0 and seen >= done):
                part = batch.slice(skip) if skip else batch
                write_results(self.driver, [(sink, part)], self.collect)
                self.written[key] = max(done, seen + batch.num_rows)

    def begin(self, windows: list[Any], restore: Restore | None) -> None:
        """No checkpoints: no barrier to arm."""

    def settle(self, windows: list[Any]) -> None:
        """No checkpoints: the actors' :meth:`finish` returns what is left."""

    def tick(self, windows: list[Any], ending: bool) -> None:
        """No checkpoints: nothing to do between gathers."""

    def final(self) -> tuple[int, int] | None:
        return None

    def finished(self, cuts: list[Cut]) -> None:
        """No checkpoints: nothing to take at the end."""


class _CutGraph:
    """The graph a distributed checkpoint is taken of (``coordinator.Checkpointed``): the
    driver's sinks, and the state and offsets the window actors wrote at their cuts."""

    def __init__(
        self,
        driver: PipelineRuntime,
        spec: JobSpec,
        cuts: list[Cut],
        tables: dict[str, TablePlan] | None = None,
    ) -> None:
        self.driver, self.spec, self.cuts = driver, spec, sorted(cuts, key=lambda c: c.instance)
        self.tables = tables or {}

    def drain(self) -> None:
        """Nothing in flight: the actors' output before the cut is delivered already."""

    def has_pending(self) -> bool:
        return self.driver.has_pending()

    def snapshot_operators(self, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """Per windowed query: its instances' files (written by the actors) and key groups."""
        operators: dict[str, dict[str, Any]] = {}
        for window in self.driver.window_nodes():
            q = window.query.index
            parts = [c.operators[q] for c in self.cuts]
            marks = [p["watermark_ns"] for p in parts if p["watermark_ns"] is not None]
            operators[str(q)] = {
                "label": window.query.label,
                "watermark_ns": min(marks) if marks else None,
                "open_panes": sum(int(p["open_panes"]) for p in parts),
                "parallelism": self.spec.parallelism,
                "max_parallelism": self.spec.max_parallelism,
                "instances": [
                    {"file": p["file"], "bytes": p["bytes"], "key_groups": p["key_groups"]}
                    for p in parts
                ],
            }
        return operators

    def snapshot_sources(self) -> dict[str, dict[str, Any]]:
        """Each source's offset at the cut, in the embedded source's format (a file source's
        batches per file; a stream's next offset; an Iceberg source's last snapshot)."""
        from flight_serve.connectors.flight import FlightSource
        from flight_serve.connectors.iceberg import IcebergSource

        for name, cut in self.cuts[0].sources.items():  # a source no query reads: never read
            if isinstance(cut, StreamCut):
                source = self.driver.flight_sources[name]
                assert isinstance(source, FlightSource)
                source.cut_at(cut.offset, cut.rows)
            elif isinstance(cut, TableCut):
                table = self.driver.flight_sources[name]
                assert isinstance(table, IcebergSource)
                plan = self.tables[name]
                last = plan.snapshots[cut.snapshots - 1][0] if cut.snapshots else None
                table.cut_at(
                    table.table.snapshot_by_id(last) if last is not None else None,
                    cut.rows,
                    plan.snapshots_read + cut.snapshots,
                    plan.ends and cut.snapshots == len(plan.snapshots),
                )
            else:
                cut.apply(self.driver.sources[name])
        return self.driver.snapshot_sources()

    def prepare_sinks(self, epoch: int, files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        return self.driver.prepare_sinks(epoch, files)

    def commit_sinks(self, epoch: int) -> None:
        self.driver.commit_sinks(epoch)

    def metrics(self) -> dict[str, Any]:
        return {
            "runtime": "ray",
            "parallelism": self.spec.parallelism,
            "max_parallelism": self.spec.max_parallelism,
        }


#: Steps per source a barrier is armed ahead of the furthest actor, at first (doubled after a
#: decline, and at least twice the steps the actors made since the last gather).
_BARRIER_AHEAD = 4


class _Barriers:
    """The checkpoints of a distributed run, from the driver (see the module docstring): when
    one is due, arm a barrier; hold each actor's output after its cut until every actor has
    cut; then take the checkpoint and deliver what was held."""

    def __init__(
        self,
        ray: Any,
        coordinator: CheckpointCoordinator,
        driver: PipelineRuntime,
        spec: JobSpec,
        stop: threading.Event | None,
        checkpoint_now: threading.Event | None = None,
    ) -> None:
        self.ray, self.coordinator, self.driver, self.spec = ray, coordinator, driver, spec
        self.stop = stop
        #: set by a caller that wants a checkpoint now (cleared when its barrier is armed)
        self.checkpoint_now = checkpoint_now or threading.Event()
        coordinator.graph = self.driver  # due() asks it for pending rows
        self.sources = fed_sources(driver)
        #: stream sources: a barrier goes no further than the entries the actors have seen
        self.streams = set(fed_streams(driver))
        #: where each stream starts (its first position) when no checkpoint is resumed
        self.first: dict[str, int] = {}
        #: what each Iceberg source reads in this attempt (a cut names its snapshots)
        self.tables: dict[str, TablePlan] = {}
        self.barrier = 0  # the last barrier's number
        self.armed: int | None = None  # the barrier in flight
        self.cuts: dict[int, Cut] = {}
        self.held: dict[int, list[tuple[str, pa.RecordBatch]]] = {}
        self.ahead = dict.fromkeys(self.sources, _BARRIER_AHEAD)
        self.previous: dict[str, int] = {}
        self.declined = 0
        self.completed = 0
        self._windows: list[Any] = []
        self.base: dict[str, int] = {}
        self.targets: dict[str, int] = {}

    def taken_from(self, instance: int, taken: Taken) -> None:
        driver = self.driver
        if self.armed is not None and instance in self.cuts:  # after its cut: held
            self.held[instance].extend([*taken.before, *taken.after])
        else:
            for sink, batch in taken.before:
                driver.deliver(sink, batch)
            cut = taken.cut
            if cut is not None and cut.barrier == self.armed:
                self.cuts[instance] = cut
                self.held[instance] = list(taken.after)
            else:  # no cut, or a cut of a barrier dropped since: one epoch
                for sink, batch in taken.after:
                    driver.deliver(sink, batch)
        if self.armed is not None and self.armed in taken.declined:
            self.drop()

    def last(self, instance: int, taken: Taken) -> None:
        """An actor's output at its end of input (the finished cut comes after all of it)."""
        for sink, batch in [*taken.before, *taken.after]:
            self.driver.deliver(sink, batch)

    def drop(self) -> None:
        """The barrier in flight was declined: every actor drops it; what was held is this
        epoch's."""
        barrier = self.armed
        assert barrier is not None
        self.declined += 1
        for name in self.ahead:
            self.ahead[name] *= 2
        self.armed = None
        self._release()
        self._windows_call("disarm", barrier)

    def _release(self) -> None:
        for instance in sorted(self.held):
            for sink, batch in self.held[instance]:
                self.driver.deliver(sink, batch)
        self.held.clear()
        self.cuts.clear()

    def _windows_call(self, method: str, *args: Any) -> list[Any]:
        return list(self.ray.get([getattr(w, method).remote(*args) for w in self._windows]))

    def begin(self, windows: list[Any], restore: Restore | None) -> None:
        """The actors are built, the sources not started: with ``checkpoint_every`` (steps of
        the sources: batches and file ends, as the embedded run counts them), arm the first
        barrier that many steps after the start, so no actor can have passed it."""
        self._windows = windows
        cuts = restore.sources if restore is not None else {}
        self.base = {
            n: cuts[n].position if n in cuts else self.first.get(n, 0) for n in self.sources
        }
        every = self.coordinator.options.checkpoint_every
        if every is not None and self.sources:
            self._arm({n: self.base[n] + every for n in self.sources})

    def _arm(self, targets: dict[str, int]) -> None:
        self.barrier += 1
        self.armed = self.barrier
        self.targets = targets
        epoch = self.coordinator.epoch + 1
        if not all(self._windows_call("arm", self.barrier, epoch, targets)):
            self.drop()

    def tick(self, windows: list[Any], ending: bool) -> None:
        """Between gathers: complete the checkpoint in flight when every actor has cut; arm one
        when it is due (not once the sources are done: the end takes the finished one).

        Raises:
            PipelineStopped: :attr:`stop` was set, and the checkpoint it asked for is taken.
        """
        self._windows = windows
        stopping = self.stop is not None and self.stop.is_set()
        if self.armed is not None and len(self.cuts) == len(windows):
            self._complete()
            if self.stop is not None and self.stop.is_set():
                raise PipelineStopped(
                    f"pipeline stopped after checkpoint {self.coordinator.epoch}"
                )
            every = self.coordinator.options.checkpoint_every
            if every is not None and not ending:  # the next one, as far on (else declined)
                self._arm({n: self.targets[n] + every for n in self.sources})
        if self.armed is not None or ending:
            return
        answers = self._windows_call("position")
        positions = [p for p, _ in answers]
        furthest = {n: max(p.get(n, 0) for p in positions) for n in self.sources}
        known = {n: max(k.get(n, 0) for _, k in answers) for n in self.streams}
        coordinator = self.coordinator
        coordinator.events = sum(furthest.values()) - sum(self.base.values())
        forced = self.checkpoint_now.is_set()
        if not stopping and not forced and not coordinator.due():
            self.previous = furthest
            return
        if forced:
            self.checkpoint_now.clear()
        for name in self.sources:  # ahead of what the actors may consume before they hear
            moved = furthest[name] - self.previous.get(name, furthest[name])
            self.ahead[name] = max(self.ahead[name], 2 * moved)
        self.previous = furthest
        targets = {n: furthest[n] + self.ahead[n] for n in self.sources}
        for name in self.streams:  # a live stream may have no entry beyond what arrived
            targets[name] = max(min(targets[name], known[name]), furthest[name])
        self._arm(targets)

    def _complete(self) -> None:
        self._take(list(self.cuts.values()), finished=False)
        self.armed = None
        self._release()

    def _take(self, cuts: list[Cut], *, finished: bool) -> CheckpointInfo:
        coordinator = self.coordinator
        coordinator.graph = _CutGraph(self.driver, self.spec, cuts, self.tables)
        try:
            info = coordinator.take(finished=finished)
        finally:
            coordinator.graph = self.driver
        self.completed += 1
        return info

    def settle(self, windows: list[Any]) -> None:
        """Every record is in (the sources are done): the barrier in flight completes, or is
        dropped when some actors' input ended before it."""
        for i, taken in enumerate(self.ray.get([w.take.remote() for w in windows])):
            self.taken_from(i, taken)
        self.tick(windows, ending=True)
        if self.armed is not None:
            self.drop()

    def final(self) -> tuple[int, int] | None:
        """``(barrier, epoch)`` of the finished checkpoint, for the actors' :meth:`finish`."""
        assert self.armed is None, "the barrier in flight is completed or dropped first"
        self.barrier += 1
        return self.barrier, self.coordinator.epoch + 1

    def finished(self, cuts: list[Cut]) -> None:
        """The input ended: the finished checkpoint, from the actors' last cuts."""
        self._take(cuts, finished=True)


_Output = _Replay | _Barriers


def _attempt(
    ray: Any,
    spec: JobSpec,
    splits: list[Splits],
    output: _Output,
    on_status: Callable[[list[InstanceStatus]], None] | None,
    restore: Restore | None,
    streams: dict[str, StreamStart],
    tables: dict[str, TablePlan],
) -> tuple[dict[str, int], int, int, list[InstanceStatus], int]:
    """One attempt of the run (from the start, or from ``restore``; ``streams``: where the
    driver starts each stream source, ``tables``: what each Iceberg source reads); returns
    ``(late rows by label, put calls, records, the instances' last status, source
    actors)``."""
    windows = _hosts(ray, "window", spec.parallelism)
    sources = _hosts(ray, "source", len(splits))
    start = restore.sources if restore is not None else None
    ray.get(
        [
            w.window.remote(spec, i, restore, windows, streams, tables)
            for i, w in enumerate(windows)
        ]
    )
    ray.get(
        [
            h.source.remote(spec, s, windows, start, streams, tables)
            for h, s in zip(sources, splits, strict=True)
        ]
    )
    output.begin(windows, restore)
    running = [s.run.remote() for s in sources]
    calls = records = 0
    pending = list(running)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=_GATHER_S)
        if streams and pending:  # idle partitions: processing time passed
            ray.get([w.tick.remote() for w in windows])
        for i, taken in enumerate(ray.get([w.take.remote() for w in windows])):
            output.taken_from(i, taken)
        output.tick(windows, ending=not pending)
        if on_status is not None:
            on_status(ray.get([w.status.remote() for w in windows]))
    for c, r in ray.get(running):
        calls, records = calls + c, records + r
    _quiesce(ray, windows)
    output.settle(windows)
    _quiesce(ray, windows)  # a barrier dropped there lets held instances run on
    final = output.final()
    late: dict[str, int] = {}
    cuts: list[Cut] = []
    for i, (taken, counts) in enumerate(ray.get([w.finish.remote(final) for w in windows])):
        output.last(i, taken)
        if taken.cut is not None:
            cuts.append(taken.cut)
        for label, rows in counts.items():
            late[label] = late.get(label, 0) + rows
    output.finished(cuts)
    instances: list[InstanceStatus] = ray.get([w.status.remote() for w in windows])
    if on_status is not None:
        on_status(instances)
    try:
        ray.get([h.reset.remote() for h in (*windows, *sources)])
    except ray.exceptions.RayActorError:  # one died after its work was done: the run is whole
        _drop_hosts(ray)
    return late, calls, records, instances, len(sources)


def _quiesce(ray: Any, windows: list[Any]) -> None:
    """Wait until every second-exchange call between the window actors has run (the sources
    are done): a call may send more (a third stage), so until a round finds none in flight."""
    while True:
        refs = [ref for refs in ray.get([w.in_flight.remote() for w in windows]) for ref in refs]
        if not refs:
            return
        ray.get(refs)  # a window's error surfaces here


def _worker_died(ray: Any, exc: BaseException) -> bool:
    """Whether ``exc`` says an actor of the run died (directly, or as the cause of a task that
    called it), not that a query or connector failed."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ray.exceptions.RayActorError):
            return True
        seen = (
            getattr(seen, "cause", None) if isinstance(seen, ray.exceptions.RayTaskError) else None
        )
    return False


def _unwrap(ray: Any, exc: BaseException) -> BaseException:
    """The flight-serve error inside a Ray task error (else ``exc``)."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, FlightServeError | RuntimeError):
            return cause
    if isinstance(exc, ray.exceptions.RayActorError):
        return FlightServeError(f"a worker of the run died: {exc}")
    return exc


def _restore_of(
    coordinator: CheckpointCoordinator, driver: PipelineRuntime, tables: dict[str, TablePlan]
) -> Restore | None:
    """What the workers need of the checkpoint the coordinator resumes (``None``: none); the
    driver's file sources were restored from its offsets when the driver was built."""
    manifest = coordinator.manifest
    if manifest is None:
        return None
    cuts: dict[str, SourceCut | StreamCut | TableCut] = {
        name: SourceCut.of(driver.sources[name])
        for name in fed_sources(driver)
        if name in driver.sources
    }
    for name, start in _streams_of(coordinator, driver).items():
        cuts[name] = StreamCut(start.offset, start.rows, start.done)
    for name, plan in tables.items():  # the plan starts at the checkpoint's snapshot
        cuts[name] = TableCut(0, plan.rows, plan.done)
    return Restore(manifest.epoch, dict(manifest.operators), cuts)


def _streams_of(
    coordinator: CheckpointCoordinator | None, driver: PipelineRuntime
) -> dict[str, StreamStart]:
    """Where each stream source starts: as the driver's source opens (from the checkpoint's
    offset when one is resumed); after the finished checkpoint every stream has ended."""
    starts = stream_starts(driver)
    if coordinator is not None and coordinator.finished:
        starts = {name: replace(start, done=True) for name, start in starts.items()}
    return starts


@dataclass
class _Job:
    """One run's pieces that outlive an attempt."""

    ray: Any
    plan: PipelinePlan
    spec: JobSpec
    name: str
    options: Any
    out_dir: Path
    on_checkpoint: Callable[[CheckpointInfo], None] | None
    restart_finished: bool = True
    upgrade: bool = False
    checkpoint_now: threading.Event | None = None


def _checkpointed_attempt(
    job: _Job,
    splits: list[Splits],
    on_status: Callable[[list[InstanceStatus]], None] | None,
    resume: ResumeFrom,
    stop: threading.Event | None,
    attempts: list[int | None],
) -> tuple[PipelineRuntime, tuple[dict[str, int], int, int, list[InstanceStatus], int], _Barriers]:
    """One attempt of a checkpointed run: the coordinator picks the checkpoint (``resume``),
    the driver's epoch sinks redo its commit and drop what came after it, the actors start
    from it (its epoch, or ``None``, appended to ``attempts``)."""
    assert job.spec.state_root is not None
    coordinator = CheckpointCoordinator(
        CheckpointStore(job.spec.state_root),
        job.options,
        job.name,
        job.plan.text,
        resume=resume,
        restart_finished=job.restart_finished,
        on_checkpoint=job.on_checkpoint,
        code_digests=code_digests(job.plan.user_functions),
        stateful=stateful_operators(job.plan),
        upgrade=job.upgrade,
    )
    attempts.append(coordinator.resumed_from)
    driver = PipelineRuntime(
        job.plan,
        output_dir=job.out_dir,
        coordinator=coordinator,
        sandbox=job.spec.sandbox,
        stream_server=job.spec.stream_server,
    )
    tables = table_plans(driver, done=coordinator.finished)
    restore = _restore_of(coordinator, driver, tables)
    streams = _streams_of(coordinator, driver)
    for source in driver.flight_sources.values():
        source.close()  # its offset is set at each cut; the actors read the streams
    barriers = _Barriers(job.ray, coordinator, driver, job.spec, stop, job.checkpoint_now)
    barriers.first = {name: start.offset for name, start in streams.items()}
    barriers.tables = tables
    driver.open_sinks()
    ended = False
    try:
        result = _attempt(
            job.ray, job.spec, splits, barriers, on_status, restore, streams, tables
        )
        for slot in driver.sinks.values():
            if slot.epoch is not None:
                slot.epoch.end_input()
        ended = True
    finally:
        driver.close_sinks(ended=ended)
        for slot in driver.sinks.values():
            if slot.epoch is not None:
                slot.epoch.close()
        driver.user_functions.close()  # the driver writes sinks; the actors call functions
    return driver, result, barriers


def run_on_ray(
    path: Path,
    *,
    sql: str | None = None,
    output_dir: Path | None = None,
    parallelism: int | None = None,
    address: str | None = None,
    write: bool = True,
    collect: list[tuple[str, pa.RecordBatch]] | None = None,
    on_status: Callable[[list[InstanceStatus]], None] | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    on_restart: Callable[[int, str], None] | None = None,
    options: Any = None,
    state_root: str | None = None,
    resume: ResumeFrom = "latest",
    on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
    stop: threading.Event | None = None,
    restart_finished: bool = True,
    upgrade: bool = False,
    sandbox: SandboxConfig | None = None,
    function_files: dict[str, bytes] | None = None,
    checkpoint_now: threading.Event | None = None,
    stream_server: tuple[str, str | None] | None = None,
) -> tuple[RunSummary, RayRunStats]:
    """Run the pipeline file ``path`` on Ray (see the module docstring).

    Args:
        path: the pipeline SQL file (relative source paths start at its directory; the
            checkpoints' default root and the run's name come from its stem).
        sql: the pipeline text, when it is not read from ``path`` (a submitted pipeline:
            ``path`` need not exist then).
        output_dir: where relative sink paths start (default: the working directory).
        parallelism: instances of every windowed query (``None``: ``SET parallelism``, else 1).
        address: a Ray cluster (``auto``, ``ray://…``); ``None``: a local Ray for this run
            (unless this process is connected to one already: then that one).
        write: write the sinks (``False``: only ``collect``; not with checkpoints).
        collect: if given, every ``(sink, batch)`` is appended to it (not with checkpoints: a
            checkpointed run writes its sinks, exactly once).
        on_status: if given, called with every window instance's status (by instance) each
            time the driver collects results while the sources run (every 0.2 s) and once at
            the end.
        max_restarts: how many times a run whose worker died (``ray.kill``, a node lost)
            starts over: from its last complete checkpoint when it takes them (the epoch
            sinks drop what was not committed), else from the start (the rows written before
            stay and are not written again: :class:`_Replay`). ``0``: fail at once.
        on_restart: if given, called with the restart's number and the error before each.
        options: the run options (:class:`~flight_serve.pipelines.run_options.RunOptions`;
            default: the pipeline's ``SET``); checkpoints are taken when they set
            ``checkpoint_interval`` or ``checkpoint_every``.
        state_root: the checkpoints' root (a path or a ``pyarrow.fs`` URI every worker
            reaches); default: the options', else ``<output_dir>/checkpoints/<file stem>``
            (the embedded run's default).
        resume: ``"latest"`` (the newest checkpoint of an unfinished run, at any
            parallelism), ``"fresh"`` or an epoch, as an embedded checkpointed run.
        on_checkpoint: called after every completed checkpoint.
        stop: when set, the run takes a checkpoint and stops
            (:class:`~flight_serve.pipelines.coordinator.PipelineStopped`); it resumes from it.
        restart_finished: with ``resume="latest"``, start over when the newest checkpoint is
            the finished one (``flight-serve run`` of a file again); ``False``: a finished
            run only completes its last commit (a server's pipeline).
        upgrade: the checkpoint may be another version's of the pipeline with the same
            stateful operators (``pipelines update``), as an embedded run's ``upgrade``.
        sandbox: how the workers run ``LANGUAGE python`` functions (a
            :class:`~flight_serve.functions.python.SandboxConfig`: hidden paths,
            ``unsandboxed``); ``None``: the default sandbox.
        function_files: the code of the ``CREATE FUNCTION … USING '<file>'`` files by path as
            written (a submitted pipeline's stored code, sent to every worker); ``None``: read
            from ``path``'s directory.
        checkpoint_now: when set, the run arms a barrier at once (unless one is in flight or
            the sources ended) and clears it: a checkpoint on demand (``pipelines
            checkpoint``); with checkpoints only.
        stream_server: ``(Flight location, bearer token or None)`` of the server whose streams
            the ``flight`` connectors without a ``server`` option name (a server's job: its
            own streams, read and written over Flight); ``None``: such connectors are refused
            in a checkpointed run, as in ``flight-serve run``.

    Returns:
        The run's summary (rows per sink, targets, late rows summed over instances) and its
        :class:`RayRunStats`.

    Raises:
        FlightServeError: Ray is missing (names the extra), a worker died more than
            ``max_restarts`` times.
        PipelineSQLError: the pipeline is wrong, or has what :mod:`.workers` does not
            distribute yet (named), or a connector a checkpointed run cannot cover.
        CheckpointError: the checkpoint to resume cannot be restored (the message says why).
        PipelineStopped: ``stop`` was set; the checkpoint is taken.
        ConnectorError, QueryError: as an embedded run.
    """
    ray = import_ray()
    path = path.resolve()
    if sql is None:
        sql = path.read_text()
    plan = parse_pipeline(sql, path=path, function_files=function_files)
    run_options = options if options is not None else plan.run_options
    p, max_p = resolve_parallelism(
        parallelism, run_options.parallelism, run_options.max_parallelism
    )
    out_dir = (output_dir if output_dir is not None else Path.cwd()).resolve()
    checkpointed = bool(run_options.checkpoints or state_root is not None)
    root: str | None = None
    if checkpointed:
        if not run_options.checkpoints:
            raise PipelineSQLError(
                "checkpoints need an interval: SET checkpoint_interval = '1s' (or "
                "checkpoint_every = N)"
            )
        if collect is not None or not write:
            raise ValueError("a checkpointed run writes its sinks; collect without checkpoints")
        check_checkpointed(plan, server=stream_server is not None)
        root = state_root or run_options.state_root
        if root is None:
            root = str(out_dir / "checkpoints" / path.stem)
        if "://" not in root:
            root = str(Path(root).resolve())  # the actors' working directory is not ours
    spec = JobSpec(
        sql, str(path), str(out_dir), p, max_p, root, sandbox, function_files, stream_server
    )
    driver = first = spec.runtime()  # its functions are closed at the end: the actors call them
    try:
        check_distributable(driver)
        splits = assign_splits(driver, p)
        streams = stream_starts(driver)  # a run without checkpoints starts each one here
        tables = {} if checkpointed else table_plans(driver)  # else each attempt's driver
    except BaseException:
        first.user_functions.close()
        for source in first.flight_sources.values():
            source.close()
        raise
    for source in first.flight_sources.values():
        source.close()
    started = False
    if not ray.is_initialized():
        start_ray(ray, address)
        started = True
    ended = False
    t0 = time.perf_counter()
    job = _Job(
        ray,
        plan,
        spec,
        path.stem,
        run_options,
        out_dir,
        on_checkpoint,
        restart_finished,
        upgrade,
        checkpoint_now,
    )
    replay = _Replay(driver, collect)
    restarts = checkpoints = declined = 0
    resumed: int | None = None
    attempts: list[int | None] = []
    if write and not checkpointed:
        driver.open_sinks()
    try:
        while True:
            replay.seen.clear()
            try:
                if checkpointed:
                    driver, result, barriers = _checkpointed_attempt(
                        job,
                        splits,
                        on_status,
                        resume if not restarts else "latest",
                        stop,
                        attempts,
                    )
                    checkpoints += barriers.completed
                    declined += barriers.declined
                    resumed = attempts[0]
                else:
                    result = _attempt(
                        ray, spec, splits, replay, on_status, None, streams, tables
                    )
                late, calls, records, instances, n_sources = result
                break
            except Exception as exc:
                _drop_hosts(ray)
                error = _unwrap(ray, exc)
                if not _worker_died(ray, exc) or restarts >= max_restarts:
                    raise error from exc
                restarts += 1
                if on_restart is not None:
                    on_restart(restarts, str(error))
        ended = True
        seconds = time.perf_counter() - t0
        stats = RayRunStats(
            n_sources,
            p,
            calls,
            records,
            seconds,
            tuple(instances),
            restarts=restarts,
            checkpoints=checkpoints,
            declined=declined,
            resumed_from=resumed,
            attempts_from=tuple(attempts),
            stage_calls=sum(i.calls_sent for i in instances),
            stage_records=sum(i.records_sent for i in instances),
        )
    finally:
        try:
            if write and not checkpointed:
                driver.close_sinks(ended=ended)
        finally:
            first.user_functions.close()
            if started:
                _POOL.clear()
                ray.shutdown()
            if root is not None:  # old checkpoints pruned before the run returns
                CheckpointStore(root).settle()
    return summary_of(driver, late), stats
