"""The distributed workers (:mod:`.workers`) as Ray actors: ``flight-serve run --runtime ray``.

:func:`run_on_ray` places one :class:`~.workers.WindowWorker` actor per instance
(``parallelism``) and up to ``parallelism`` :class:`~.workers.SourceWorker` actors (one per file
at most), each owning files of the file sources (:func:`~.workers.assign_splits`). A source actor
sends each window actor its records with an actor call (``put``): the batches travel through
Ray's object store (Arrow buffers, pickled out of band), in order per caller, at most
:data:`IN_FLIGHT` calls unanswered per window actor (backpressure). The driver (this process)
writes what the actors collect to the pipeline's sinks, with the same writers as an embedded
run, so sinks are written by one process. Without ``address`` a local Ray is started for the
run (``num_cpus=2``, no dashboard, loopback only) and stopped after it; with one
(``auto``, ``ray://host:10001``), the run joins that cluster, whose nodes must read the same
input paths and the same ``flight_serve`` version.

Ray is imported here only, when a run starts (:func:`import_ray`); without it the error names the
extra: ``pip install 'flight-serve[ray]'``.
"""

from __future__ import annotations

import faulthandler
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from flight_serve.errors import FlightServeError, PipelineSQLError
from flight_serve.pipelines.distributed.keygroups import DEFAULT_MAX_PARALLELISM
from flight_serve.pipelines.distributed.workers import (
    InstanceStatus,
    JobSpec,
    Record,
    SourceWorker,
    WindowWorker,
    assign_splits,
    check_distributable,
    summary_of,
    write_results,
)
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import RunSummary

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
    """``ray.init`` as flight-serve calls it: without an address a local Ray on loopback with two
    CPUs, no dashboard and no log forwarding; with one, a connection to that cluster.

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

    Raises:
        Whatever ``ray.init`` raises (a wrong address, a cluster that does not answer).
    """
    if "RAY_DISABLE_FAILURE_SIGNAL_HANDLER" not in os.environ:
        os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
        from ray._private import ray_constants

        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    had_faulthandler = faulthandler.is_enabled()
    if address is None:
        ray.init(
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
    """

    source_actors: int
    window_actors: int
    put_calls: int
    records: int
    seconds: float
    instances: tuple[InstanceStatus, ...] = ()
    restarts: int = 0


class _Host:
    """A Ray actor hosting one worker of a run at a time: a window worker (``put``, ``take``,
    ``finish``) or a source worker (``run``, sending ``put`` calls to window hosts). Hosts are
    kept between runs of one Ray session (:func:`_hosts`), so a run does not pay a worker
    process start (about 0.6 s each here) per actor."""

    def __init__(self) -> None:
        import ray

        self._ray = ray
        self._window: WindowWorker | None = None
        self._source: SourceWorker | None = None
        self._windows: list[Any] = []
        self._in_flight: list[list[Any]] = []

    def window(self, spec: JobSpec, instance: int) -> None:
        self._source = None
        self._window = WindowWorker(spec, instance)

    def source(self, spec: JobSpec, splits: dict[str, list[int]], windows: list[Any]) -> None:
        self._window = None
        self._windows = windows
        self._in_flight = [[] for _ in windows]
        self._source = SourceWorker(spec, splits, self._send)

    def reset(self) -> None:
        self._window = self._source = None
        self._windows, self._in_flight = [], []

    def _send(self, instance: int, records: list[Record]) -> None:
        pending = self._in_flight[instance]
        pending.append(self._windows[instance].put.remote(records))
        if len(pending) > IN_FLIGHT:
            done, rest = self._ray.wait(pending, num_returns=len(pending) - IN_FLIGHT)
            self._ray.get(done)  # a window's error surfaces here
            self._in_flight[instance] = rest

    def run(self) -> tuple[list[tuple[str, pa.RecordBatch]], int, int]:
        """Read every split; wait for every ``put``; returns ``(the per-row queries' sink
        batches, put calls, records)``."""
        assert self._source is not None
        out = self._source.run()
        for pending in self._in_flight:
            self._ray.get(pending)
        return out, self._source.sent_calls, self._source.sent_records

    def put(self, records: list[Record]) -> None:
        assert self._window is not None
        self._window.put(records)

    def take(self) -> list[tuple[str, pa.RecordBatch]]:
        assert self._window is not None
        return self._window.take()

    def finish(self) -> tuple[list[tuple[str, pa.RecordBatch]], dict[str, int]]:
        assert self._window is not None
        return self._window.finish()

    def status(self) -> InstanceStatus:
        assert self._window is not None
        return self._window.status()


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
    """The driver's writes across attempts of one run (a global restart after a worker died).

    Each producer's output is deterministic: window instance *i* runs its records in the
    embedded order, and source worker *j* gets the same files in every attempt
    (:func:`~.workers.assign_splits`). So, per producer (``("window", i)`` or
    ``("source", j)``) and sink, the driver counts the rows it has written; a later attempt
    drops the first that many rows of the same producer's output to that sink, and every row
    reaches the sinks once."""

    def __init__(self, driver: Any, collect: list[tuple[str, pa.RecordBatch]] | None) -> None:
        self.driver, self.collect = driver, collect
        self.written: dict[tuple[str, int, str], int] = {}
        self.seen: dict[tuple[str, int, str], int] = {}

    def write(self, role: str, index: int, batches: list[tuple[str, pa.RecordBatch]]) -> None:
        for sink, batch in batches:
            key = (role, index, sink)
            seen = self.seen.get(key, 0)
            done = self.written.get(key, 0)
            skip = min(max(done - seen, 0), batch.num_rows)
            self.seen[key] = seen + batch.num_rows
            if skip < batch.num_rows or (batch.num_rows == 0 and seen >= done):
                part = batch.slice(skip) if skip else batch
                write_results(self.driver, [(sink, part)], self.collect)
                self.written[key] = max(done, seen + batch.num_rows)


def _attempt(
    ray: Any,
    spec: JobSpec,
    splits: list[dict[str, list[int]]],
    replay: _Replay,
    on_status: Callable[[list[InstanceStatus]], None] | None,
) -> tuple[dict[str, int], int, int, list[InstanceStatus], int]:
    """One attempt of the run from the start; returns ``(late rows by label, put calls,
    records, the instances' last status, source actors)``."""
    windows = _hosts(ray, "window", spec.parallelism)
    sources = _hosts(ray, "source", len(splits))
    ray.get([w.window.remote(spec, i) for i, w in enumerate(windows)])
    ray.get([h.source.remote(spec, s, windows) for h, s in zip(sources, splits, strict=True)])
    running = [s.run.remote() for s in sources]
    calls = records = 0
    pending = list(running)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=_GATHER_S)
        for i, batches in enumerate(ray.get([w.take.remote() for w in windows])):
            replay.write("window", i, batches)
        if on_status is not None:
            on_status(ray.get([w.status.remote() for w in windows]))
    for j, (batches, c, r) in enumerate(ray.get(running)):
        replay.write("source", j, batches)
        calls, records = calls + c, records + r
    late: dict[str, int] = {}
    for i, (batches, counts) in enumerate(ray.get([w.finish.remote() for w in windows])):
        replay.write("window", i, batches)
        for label, rows in counts.items():
            late[label] = late.get(label, 0) + rows
    instances: list[InstanceStatus] = ray.get([w.status.remote() for w in windows])
    if on_status is not None:
        on_status(instances)
    ray.get([h.reset.remote() for h in (*windows, *sources)])
    return late, calls, records, instances, len(sources)


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


def run_on_ray(
    path: Path,
    *,
    output_dir: Path | None = None,
    parallelism: int | None = None,
    address: str | None = None,
    write: bool = True,
    collect: list[tuple[str, pa.RecordBatch]] | None = None,
    on_status: Callable[[list[InstanceStatus]], None] | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    on_restart: Callable[[int, str], None] | None = None,
) -> tuple[RunSummary, RayRunStats]:
    """Run the pipeline file ``path`` on Ray (see the module docstring).

    Args:
        path: the pipeline SQL file.
        output_dir: where relative sink paths start (default: the working directory).
        parallelism: instances of every windowed query (``None``: ``SET parallelism``, else 1).
        address: a Ray cluster (``auto``, ``ray://…``); ``None``: a local Ray for this run
            (unless this process is connected to one already: then that one).
        write: write the sinks (``False``: only ``collect``).
        collect: if given, every ``(sink, batch)`` is appended to it.
        on_status: if given, called with every window instance's status (by instance) each
            time the driver collects results while the sources run (every 0.2 s) and once at
            the end.
        max_restarts: how many times a run whose worker died (``ray.kill``, a node lost)
            starts over (a global restart from the start: no checkpoints yet); the rows
            written before stay and are not written again (:class:`_Replay`). ``0``: fail at
            once.
        on_restart: if given, called with the restart's number and the error before each.

    Returns:
        The run's summary (rows per sink, targets, late rows summed over instances) and its
        :class:`RayRunStats`.

    Raises:
        FlightServeError: Ray is missing (names the extra), a worker died more than
            ``max_restarts`` times.
        PipelineSQLError: the pipeline is wrong, or has what :mod:`.workers` does not
            distribute yet (named).
        ConnectorError, QueryError: as an embedded run.
    """
    ray = import_ray()
    path = path.resolve()
    sql = path.read_text()
    plan = parse_pipeline(sql, path=path)
    options = plan.run_options
    p, max_p = resolve_parallelism(parallelism, options.parallelism, options.max_parallelism)
    out_dir = (output_dir if output_dir is not None else Path.cwd()).resolve()
    spec = JobSpec(sql, str(path), str(out_dir), p, max_p)
    driver = spec.runtime()
    check_distributable(driver)
    splits = assign_splits(driver, p)
    started = False
    if not ray.is_initialized():
        start_ray(ray, address)
        started = True
    ended = False
    t0 = time.perf_counter()
    replay = _Replay(driver, collect)
    restarts = 0
    if write:
        driver.open_sinks()
    try:
        while True:
            replay.seen.clear()
            try:
                late, calls, records, instances, n_sources = _attempt(
                    ray, spec, splits, replay, on_status
                )
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
            n_sources, p, calls, records, seconds, tuple(instances), restarts=restarts
        )
    finally:
        try:
            if write:
                driver.close_sinks(ended=ended)
        finally:
            if started:
                _POOL.clear()
                ray.shutdown()
    return summary_of(driver, late), stats
