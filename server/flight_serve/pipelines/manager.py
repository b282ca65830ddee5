"""Submitted pipelines inside the server: each runs in its own thread, checkpoints, and resumes
after a restart (DESIGN §1 "submit and walk away", §3 pipeline states).

:class:`PipelineManager` owns the :class:`~flight_serve.pipelines.registry.Registry` of a data
directory and one thread per ``running`` pipeline. A pipeline runs as a
:class:`~flight_serve.pipelines.durable.DurableRuntime` against the server's store: ``flight``
sources and sinks without a ``server`` option are the server's streams, read and written
directly; file sources and sinks work as in ``flight-serve run``.

* **submit**: the SQL is planned and every connector opened in the caller's thread (a bad
  pipeline is refused with its line and column and nothing is registered); then the pipeline is
  registered ``running`` and its thread starts. Its output streams exist from that moment, so a
  client can tail them at once and from any offset.
* **checkpoints**: every ``checkpoint_interval`` (1 s unless the pipeline SETs one) in
  ``<data-dir>/checkpoints/<id>/`` (or its ``state_root``); the registry keeps the last one and the
  metrics taken with it.
* **restart**: :meth:`PipelineManager.start` resumes every ``running`` pipeline from its newest
  checkpoint. :meth:`PipelineManager.stop` (server shutdown) asks every pipeline to checkpoint and
  stop; they stay ``running`` in the registry.
* **failure**: a pipeline whose run raises goes to ``failed`` with the error in its status, or,
  with ``SET on_failure = 'retry'``, resumes from its last checkpoint after a pause that doubles
  each time (``retry_backoff``, at most a minute), up to ``max_retries`` times in a row (a
  completed checkpoint resets the count). Other pipelines are not affected.
* **cancel**: checkpoint, stop, state ``cancelled`` (outputs stay).
* **update** (:meth:`PipelineManager.update`, ``flight-serve pipelines update``): a new version
  of a running pipeline resumes from the old version's last checkpoint when their stateful
  operators match (:mod:`flight_serve.pipelines.upgrade`); the registry keeps every version.
* **the end**: a pipeline whose every input ended (a file read to its end, a server stream
  whose every writer sent end of input) flushes its windows, marks its stream sinks' writers'
  end of input and goes ``finished``. A finished or cancelled pipeline's checkpoints are
  deleted (:meth:`PipelineManager.retire`) and it no longer has per-pipeline metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flight_serve.connectors.flight import FlightSource
from flight_serve.errors import (
    AlreadyExistsError,
    CheckpointError,
    FlightServeError,
    IncompatibleUpdateError,
    InvalidInputError,
)
from flight_serve.functions.python import SandboxConfig
from flight_serve.pipelines.checkpoint import CheckpointStore
from flight_serve.pipelines.connect import check_checkpointed
from flight_serve.pipelines.distributed.jobs import (
    JobRequest,
    check_job,
    connect,
    find_job,
    job_name,
    start_job,
)
from flight_serve.pipelines.durable import CheckpointInfo, DurableRuntime, PipelineStopped
from flight_serve.pipelines.graph import WindowNode
from flight_serve.pipelines.pipeline import PipelinePlan, parse_pipeline
from flight_serve.pipelines.plugins import PluginHub
from flight_serve.pipelines.registry import LogLine, PipelineRecord, Registry, sql_digest
from flight_serve.pipelines.runtime import PipelineRuntime
from flight_serve.pipelines.store_io import StoreSource
from flight_serve.pipelines.upgrade import diff_stateful, stateful_operators
from flight_serve.pipelines.user_functions import CodeStore
from flight_serve.store import StreamStore
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS

__all__ = ["DEFAULT_CHECKPOINT_INTERVAL", "PipelineManager"]

log = logging.getLogger("flight_serve.pipelines")

#: The checkpoint interval of a server pipeline that does not SET one.
DEFAULT_CHECKPOINT_INTERVAL = timedelta(seconds=1)
#: How long :meth:`PipelineManager.stop` waits for each pipeline to checkpoint and stop.
STOP_TIMEOUT_S = 30.0
#: How often (seconds) the server reads a Ray job's status.
JOB_POLL_S = 0.5
#: How long (seconds) one status call to a Ray job may take before it counts as unanswered.
JOB_CALL_TIMEOUT_S = 30.0
#: Times in a row a Ray job may be found gone (its coordinator dead for good) and started again
#: from its last checkpoint before the pipeline fails.
JOB_MAX_STARTS = 3
_SLUG = re.compile(r"[^a-z0-9_-]+")


def _slug(name: str) -> str:
    slug = _SLUG.sub("-", name.lower()).strip("-")[:40]
    return slug or "pipeline"


def _function_digests(plan: PipelinePlan) -> dict[str, str]:
    """The plan's functions' code SHA-256 by name (its identity in the registry's versions)."""
    return {name: spec.digest for name, spec in sorted(plan.user_functions.items())}


def _update_result(
    record: PipelineRecord,
    version: int,
    resumed_from: int | None,
    sql: str,
    functions: dict[str, str],
    *,
    changed: bool,
) -> dict[str, Any]:
    """What :meth:`PipelineManager.update` returns: the version now running, the one before,
    the checkpoint it resumed from, the text's and functions' SHA-256, whether it changed."""
    return {
        "id": record.id,
        "version": version,
        "previous_version": record.version,
        "resumed_from": resumed_from,
        "sql_sha256": sql_digest(sql),
        "functions": functions,
        "changed": changed,
    }


def _iso_ns(ns: int | None) -> str | None:
    """An instant in ns as ISO 8601 UTC; ``None`` before any row (or out of range), ``+inf``
    after the end of input."""
    if ns is None or ns <= MIN_WATERMARK_NS:
        return None
    if ns >= MAX_WATERMARK_NS:
        return "+inf"
    try:
        return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        return None


class _Run:
    """One pipeline's thread."""

    def __init__(self, manager: PipelineManager, record: PipelineRecord) -> None:
        self.manager = manager
        self.id = record.id
        self.runtime: DurableRuntime | None = None
        self.cancelled = threading.Event()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.attempts = record.attempts
        #: stopped by :meth:`PipelineManager.update` (a new version takes over)
        self.updating = False
        self.thread = threading.Thread(
            target=self.main, name=f"flight-serve-pipeline-{record.id}", daemon=True
        )

    def main(self) -> None:
        manager, pid = self.manager, self.id
        registry = manager.registry
        while True:
            try:
                runtime = self.runtime
                if runtime is None:
                    runtime = self.runtime = manager.build(registry.get(pid))
                    runtime.hold_writers()
                    if runtime.resumed_from is not None:
                        registry.log(pid, "info", f"resumed from checkpoint {runtime.resumed_from}")
                        manager.resumed(pid, runtime)
                    for gap in runtime.gaps:
                        registry.log(pid, "warning", f"gap: {gap}")
                runtime.on_wait = lambda why: registry.log(  # a connector's server is down
                    pid, "warning" if why else "info", f"waiting: {why}" if why else "going on"
                )
                if self.stopping.is_set() or self.cancelled.is_set():
                    runtime.request_stop()
                for _ in runtime.run():
                    pass
                registry.log(pid, "info", f"finished at epoch {runtime.epoch}")
                registry.set_state(pid, "finished")
                manager.retire(pid)
                return
            except PipelineStopped:
                if self.cancelled.is_set():
                    registry.log(pid, "info", "cancelled")
                    registry.set_state(pid, "cancelled")
                    manager.retire(pid)
                elif self.updating:
                    epoch = self.runtime.epoch if self.runtime is not None else 0
                    registry.log(pid, "info", f"stopped at epoch {epoch} for an update")
                else:
                    registry.log(pid, "info", "stopped with the server; resumes on restart")
                return
            except Exception as exc:  # a failing pipeline must not take the server down
                message = (
                    f"{type(exc).__name__}: {exc}"
                    if not isinstance(exc, FlightServeError)
                    else str(exc)
                )
                kind = {  # what failed it: the user's input, an outside system, …
                    "domain": exc.domain if isinstance(exc, FlightServeError) else "internal",
                    "retryable": exc.retryable if isinstance(exc, FlightServeError) else False,
                }
                log.warning(
                    "pipeline failed", extra={"pipeline": pid, "error": message}, exc_info=True
                )
                self.runtime = None
                options = manager.options_of(pid)
                retry = (
                    options is not None
                    and options.on_failure == "retry"
                    and self.attempts < options.max_retries
                    and not (self.stopping.is_set() or self.cancelled.is_set())
                )
                if not retry or options is None:
                    registry.log(pid, "error", f"failed: {message}")
                    registry.set_state(
                        pid, "failed", error=message, error_kind=kind, attempts=self.attempts
                    )
                    return
                self.attempts += 1
                pause = options.backoff(self.attempts)
                registry.set_state(
                    pid, "running", error=message, error_kind=kind, attempts=self.attempts
                )
                registry.log(
                    pid,
                    "warning",
                    f"failed: {message}; retry {self.attempts} of {options.max_retries} in "
                    f"{pause.total_seconds():g} s from the last checkpoint",
                )
                self.wake.wait(pause.total_seconds())
                if self.cancelled.is_set():
                    registry.log(pid, "info", "cancelled")
                    registry.set_state(pid, "cancelled")
                    manager.retire(pid)
                    return
                if self.stopping.is_set():
                    return

    def stop(self, cancel: bool) -> None:
        (self.cancelled if cancel else self.stopping).set()
        self.wake.set()
        runtime = self.runtime
        if runtime is not None:
            runtime.request_stop()


def _ray_metrics(status: Mapping[str, Any]) -> dict[str, Any]:
    """A Ray job's status as the registry's per-checkpoint metrics: rows into the window
    instances, their lowest watermark, open panes, and the rows per sink once it finished."""
    instances = list(status.get("instances") or [])
    marks = [int(i["watermark_ns"]) for i in instances if i.get("watermark_ns") is not None]
    return {
        "rows_in": sum(int(i["rows_in"]) for i in instances),
        "watermark_ns": {"windows": min(marks)} if marks else {},
        "open_panes": sum(int(i["open_panes"]) for i in instances),
        "rows_out": dict(status.get("rows") or {}),
        "late_rows": dict(status.get("late_rows") or {}),
        "outputs": dict(status.get("targets") or {}),
    }


def _wait_gone(ray: Any, name: str, timeout_s: float = 10.0) -> None:
    """Wait until the killed actor ``name`` is no longer found by name."""
    deadline = time.monotonic() + timeout_s
    while find_job(ray, name) is not None and time.monotonic() < deadline:
        time.sleep(0.1)


class _RayRun:
    """A pipeline that runs on Ray (``runtime = 'ray'``): its job's coordinator is a detached
    actor (:mod:`~flight_serve.pipelines.distributed.jobs`) and this thread follows it. It
    records the job's log lines, checkpoints and end in the registry, and, when the server
    stops, leaves the job running (:meth:`stop` without ``cancel``); a restarted server's
    thread finds the job by name and follows it again."""

    #: no embedded runtime: the job runs in the cluster
    runtime: DurableRuntime | None = None

    def __init__(self, manager: PipelineManager, record: PipelineRecord) -> None:
        self.manager = manager
        self.id = record.id
        self.record = record
        self.attempts = record.attempts
        self.name = job_name(manager.data_dir, record.id, record.version)
        self.cancelled = threading.Event()
        self.detached = threading.Event()
        #: stopped by :meth:`PipelineManager.update` (a new version takes over)
        self.updating = False
        self.job: Any = None
        #: the job's last status (:meth:`~.jobs.JobCoordinator.status`), ``{}`` before one
        self.last: dict[str, Any] = {}
        self.thread = threading.Thread(
            target=self.main, name=f"flight-serve-ray-job-{record.id}", daemon=True
        )

    def main(self) -> None:
        registry, pid = self.manager.registry, self.id
        try:
            ray = self.manager.ray()
            starts = 0
            while True:
                job = find_job(ray, self.name)
                if job is None:
                    if starts >= JOB_MAX_STARTS:
                        raise FlightServeError(
                            f"its job on Ray ({self.name}) was gone {starts} times in a row"
                        )
                    job = start_job(ray, self.name, self.manager.job_request(self.record))
                    registry.log(
                        pid,
                        "info",
                        f"started on Ray as job {self.name}"
                        # again: this thread started or followed it before, and it is gone
                        + (
                            " (again, from its last checkpoint)"
                            if starts or self.job is not None
                            else ""
                        ),
                    )
                    starts += 1
                else:
                    registry.log(pid, "info", f"following its job on Ray ({self.name})")
                self.job = job
                if self.cancelled.is_set():
                    job.stop.remote(True)
                if self.follow(ray, job):
                    return
        except Exception as exc:  # the server keeps serving the other pipelines
            message = (
                str(exc) if isinstance(exc, FlightServeError) else (f"{type(exc).__name__}: {exc}")
            )
            log.warning("ray job failed", extra={"pipeline": pid, "error": message}, exc_info=True)
            registry.log(pid, "error", f"failed: {message}")
            registry.set_state(
                pid, "failed", error=message, error_kind={"domain": "external", "retryable": True}
            )

    def follow(self, ray: Any, job: Any) -> bool:
        """Follow ``job`` until it ends (``True``) or the server detaches (``True``); ``False``:
        the job is gone (its coordinator died for good), to be started again."""
        registry, pid = self.manager.registry, self.id
        # the job's log lines copied already (by this server or one before it): a coordinator
        # (its start time) and its line number; a coordinator Ray restarted numbers from 1 again
        started, _, line = (registry.get(pid).job_log_cursor or "").rpartition(":")
        seen = int(line) if line.isdigit() else 0
        epoch, misses = None, 0
        while True:
            try:
                status = ray.get(job.status.remote(seen), timeout=JOB_CALL_TIMEOUT_S)
                if repr(status["started_at"]) != started:  # another coordinator: all its lines
                    if seen:
                        status = ray.get(job.status.remote(0), timeout=JOB_CALL_TIMEOUT_S)
                    started, seen = repr(status["started_at"]), 0
                misses = 0
            except Exception as exc:  # the actor died, is restarting, or does not answer
                if self.detached.is_set():
                    return True
                misses += 1
                if find_job(ray, self.name) is None:
                    registry.log(pid, "warning", f"its job on Ray is gone: {exc}")
                    return False
                if misses == 1:
                    registry.log(pid, "warning", f"its job on Ray does not answer: {exc}")
                self.detached.wait(1.0)
                continue
            self.last = status
            for seq, level, message in status["log"]:
                registry.log(pid, str(level), str(message))
                seen = int(seq)
            if status["log"]:
                registry.set_job_log_cursor(pid, f"{started}:{seen}")
            checkpoint = status.get("checkpoint")
            if checkpoint is not None and checkpoint["epoch"] != epoch:
                epoch = checkpoint["epoch"]
                registry.checkpointed(pid, checkpoint, _ray_metrics(status))
            state = status["state"]
            if state != "running":
                return self.end(ray, job, status)
            if self.detached.wait(JOB_POLL_S):
                return True

    def end(self, ray: Any, job: Any, status: Mapping[str, Any]) -> bool:
        """The job ended: record how, retire what ended for good, remove its actor. ``False``:
        it stopped for an update that never committed (the server died during it): the same
        version is to start again from the checkpoint it stopped at."""
        manager, pid = self.manager, self.id
        registry, state = manager.registry, status["state"]
        epoch = (status.get("checkpoint") or {}).get("epoch")
        if status.get("checkpoint") is not None:
            registry.checkpointed(pid, status["checkpoint"], _ray_metrics(status))
        if state == "finished":
            registry.log(pid, "info", f"finished at epoch {epoch}")
            registry.set_state(pid, "finished")
            manager.retire(pid)
        elif state == "cancelled":
            registry.log(pid, "info", "cancelled")
            registry.set_state(pid, "cancelled")
            manager.retire(pid)
        elif state == "stopped" and self.updating:
            registry.log(pid, "info", f"stopped at epoch {epoch} for an update")
        elif state == "stopped":
            registry.log(
                pid,
                "warning",
                f"its job stopped at epoch {epoch} for an update that did not commit: "
                "starting it again from that checkpoint",
            )
            ray.kill(job)
            _wait_gone(ray, self.name)
            return False
        else:
            error = str(status.get("error") or "the job failed")
            domain = str(status.get("error_domain") or "internal")
            registry.set_state(
                pid, "failed", error=error, error_kind={"domain": domain, "retryable": False}
            )
        ray.kill(job)
        return True

    def stop(self, cancel: bool) -> None:
        """``cancel``: the job checkpoints and stops for good (this thread records it).
        Otherwise (the server stops) the thread stops following and the job goes on."""
        if cancel:
            self.cancelled.set()
            if self.job is not None:
                self.job.stop.remote(True)
        else:
            self.detached.set()

    def stop_for_update(self) -> None:
        """The job checkpoints and stops (``stopped``); this thread records it and ends."""
        self.updating = True
        if self.job is not None:
            self.job.stop.remote(False)


class PipelineManager:
    """The submitted pipelines of one server (see the module docstring).

    Args:
        store: the server's stream store.
        data_dir: the server's data directory (registry, checkpoints, default outputs).
        checkpoint_interval: for pipelines that do not SET one.
        plugins: the server's plugin hub (pipelines' plugin functions call its instances).
        sandbox: how the pipelines' ``LANGUAGE python`` functions run (``None``: the defaults).
        ray_address: a Ray cluster (``auto``, ``host:port``, ``ray://…``): a submitted pipeline
            whose parallelism is above 1 runs there as a detached job
            (:mod:`~flight_serve.pipelines.distributed.jobs`); ``None``: every pipeline runs in
            this process (at parallelism 1).
        stream_server: ``(Flight location, bearer token or None)`` of this server as its jobs
            reach it: a job's ``flight`` connectors without a ``server`` option read and write
            this server's streams over Flight (``None``: refused in a job).

    Raises:
        StorageError: the registry cannot be opened.
    """

    def __init__(
        self,
        store: StreamStore,
        data_dir: Path,
        *,
        checkpoint_interval: timedelta = DEFAULT_CHECKPOINT_INTERVAL,
        plugins: PluginHub | None = None,
        sandbox: SandboxConfig | None = None,
        ray_address: str | None = None,
        stream_server: tuple[str, str | None] | None = None,
    ) -> None:
        self.store = store
        self.ray_address = ray_address
        #: ``(Flight location, bearer token or None)`` of this server as its jobs on Ray reach
        #: it: their ``flight`` connectors without ``server`` read this store over Flight
        self.stream_server = stream_server
        self._ray: Any = None
        #: Ray was connected by this manager (so :meth:`stop` disconnects it)
        self._ray_connected = False
        self._ray_lock = threading.Lock()
        self.plugins = plugins
        #: the sandbox of the pipelines' LANGUAGE python functions (the server's hidden paths,
        #: ``--allow-unsandboxed-python``); ``None``: ``SandboxConfig()``
        self.sandbox = sandbox
        self.data_dir = Path(data_dir)
        self.checkpoint_interval = checkpoint_interval
        self.registry = Registry(self.data_dir / "pipelines.sqlite")
        self._runs: dict[str, _Run | _RayRun] = {}
        self._lock = threading.Lock()
        #: held by :meth:`update` and :meth:`cancel`: one changes a pipeline's run at a time
        self._switch = threading.Lock()
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Resume every ``running`` pipeline of the registry (each from its last checkpoint)."""
        resumed = [record for record in self.registry.all() if record.state == "running"]
        for record in resumed:
            if record.runtime == "ray" and self.ray_address is None:
                self.registry.log(
                    record.id,
                    "error",
                    "server started without --ray-address: this pipeline's job on Ray is not "
                    "followed (it may still run there); restart the server with its cluster's "
                    "address",
                )
                continue
            self.registry.log(
                record.id,
                "info",
                "server started: " + ("re-attaching" if record.runtime == "ray" else "resuming"),
            )
            self._launch(record, None)
        ids = [record.id for record in resumed]
        log.info(
            f"resumed {len(ids)} pipeline(s) at start" + (f": {', '.join(ids)}" if ids else ""),
            extra={"pipelines": ids},
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every pipeline to checkpoint and stop; wait for them (they stay ``running``)."""
        with self._lock:
            self._closed = True
            runs = list(self._runs.values())
        for run in runs:
            run.stop(cancel=False)
        for run in runs:
            run.thread.join(timeout_s)
        self.registry.close()
        with self._ray_lock:
            if self._ray is not None and self._ray_connected:
                self._ray.shutdown()  # the jobs are detached: they go on
            self._ray = None

    def ray(self) -> Any:
        """The ``ray`` module, connected to :attr:`ray_address` (once; later calls reuse it).

        Raises:
            InvalidInputError: the server has no Ray address.
            FlightServeError: Ray is not installed, or the cluster does not answer
                (:func:`~flight_serve.pipelines.distributed.jobs.connect`).
        """
        with self._ray_lock:
            if self._ray is None:
                if self.ray_address is None:
                    raise InvalidInputError("this server has no Ray cluster (serve --ray-address)")
                from flight_serve.pipelines.distributed.ray_runtime import import_ray

                before = import_ray().is_initialized()
                self._ray = connect(self.ray_address)
                self._ray_connected = not before
            return self._ray

    def job_request(
        self, record: PipelineRecord, function_files: Mapping[str, bytes] | None = None
    ) -> JobRequest:
        """What ``record``'s job on Ray runs: its text, directories, state root (its
        ``state_root``, else ``<data-dir>/checkpoints/<id>``: on a cluster of several nodes, a
        path every node reaches), the server's checkpoint interval in seconds and sandbox, and
        its ``USING`` files' code (``function_files``, else the copy stored for the record's
        version in ``<data-dir>/functions``).

        Raises:
            PipelineSQLError, FunctionDefinitionError: the text does not plan.
            StorageError: the stored code cannot be read.
        """
        if function_files is None:
            function_files = CodeStore(self.data_dir).load(record.code_key or record.id)
        files = dict(function_files) if function_files else None
        options = parse_pipeline(
            record.sql, base_dir=Path(record.base_dir), function_files=files
        ).run_options
        root = options.state_root or str((self.data_dir / "checkpoints" / record.id).absolute())
        return JobRequest(
            pipeline=record.id,
            version=record.version,
            sql=record.sql,
            base_dir=record.base_dir,
            output_dir=record.output_dir,
            state_root=root,
            checkpoint_interval_s=self.checkpoint_interval.total_seconds(),
            upgrade=record.version > 1,
            sandbox=self.sandbox,
            function_files=files,
            stream_server=self.stream_server,
        )

    def _launch(self, record: PipelineRecord, runtime: DurableRuntime | None) -> None:
        run: _Run | _RayRun
        if record.runtime == "ray":
            run = _RayRun(self, record)
        else:
            run = _Run(self, record)
            run.runtime = runtime
        with self._lock:
            if self._closed:
                return
            self._runs[record.id] = run
        run.thread.start()

    def retire(self, pid: str) -> None:
        """``pid`` ended for good (``finished``, ``cancelled``: nothing resumes it), so
        retention keeps none of its checkpoints: delete them (and its default state root
        ``<data-dir>/checkpoints/<id>``). Called after the registry has recorded the state, so
        a crash before this resumes the pipeline (a finished one only completes its last
        commit). The registry keeps the last checkpoint's record and counters."""
        options = self.options_of(pid)
        default = self.data_dir / "checkpoints" / pid
        root = options.state_root if options is not None and options.state_root else None
        try:
            CheckpointStore(root or str(default)).clear()
            if root is None:
                shutil.rmtree(default, ignore_errors=True)
        except (CheckpointError, OSError) as exc:
            self.registry.log(pid, "warning", f"its checkpoints were not removed: {exc}")
            return
        self.registry.log(pid, "info", f"checkpoints removed ({root or default})")

    # --- building ----------------------------------------------------------------------------

    def options_of(self, pid: str) -> Any:
        """The run options of ``pid``'s pipeline (``None`` if its text no longer parses)."""
        try:
            record = self.registry.get(pid)
            return parse_pipeline(record.sql, base_dir=Path(record.base_dir)).run_options
        except FlightServeError:
            return None

    def build(
        self,
        record: PipelineRecord,
        function_files: Mapping[str, bytes] | None = None,
        *,
        upgrade: bool | None = None,
    ) -> DurableRuntime:
        """The runtime of ``record``'s pipeline, resumed from its newest checkpoint; the code of
        its functions' ``USING`` files is ``function_files``, else what was stored with its
        version. ``upgrade``: the checkpoint may be another version's with the same stateful
        operators (default: when ``record`` is version 2 or later, so a restart right after an
        update resumes the old version's checkpoint with the new code)."""
        if function_files is None:
            function_files = CodeStore(self.data_dir).load(record.code_key or record.id)
        plan = parse_pipeline(
            record.sql, base_dir=Path(record.base_dir), function_files=function_files
        )
        options = plan.run_options
        if options.checkpoint_interval is None:  # a live pipeline must commit on time too
            options = replace(options, checkpoint_interval=self.checkpoint_interval)
        pid = record.id
        return DurableRuntime(
            plan,
            name=pid,
            options=options,
            state_root=options.state_root or str(self.data_dir / "checkpoints" / pid),
            output_dir=Path(record.output_dir),
            resume="latest",
            store=self.store,
            on_checkpoint=lambda info: self._checkpointed(pid, info),
            restart_finished=False,  # a finished pipeline never runs again: it only completes
            plugins=self.plugins,
            sandbox=self.sandbox,
            upgrade=record.version > 1 if upgrade is None else upgrade,
        )

    def check(self, plan: PipelinePlan, record: PipelineRecord) -> None:
        """Build ``plan`` as ``record``'s pipeline would run it, and run nothing: the
        connectors a checkpointed run cannot cover, every connector's options and columns, and
        every query planned by DataFusion (a function it does not know is named at its call),
        as :meth:`submit` finds them; static tables are not read and no function worker starts
        (as ``flight-serve explain``). Nothing is opened for writing, nothing is registered.

        Raises:
            PipelineSQLError: what building the pipeline raises, with its line and column.
        """
        check_checkpointed(plan, server=True)
        built = PipelineRuntime(
            plan,
            output_dir=Path(record.output_dir),
            load_tables=False,
            plugins=self.plugins,
            data_dir=self.store.data_dir,
            sandbox=self.sandbox,
            store=self.store,
        )
        for source in built.flight_sources.values():
            source.close()
        built.user_functions.close()

    def _checkpointed(self, pid: str, info: CheckpointInfo) -> None:
        run = self._runs.get(pid)
        runtime = run.runtime if run is not None else None
        metrics = runtime.metrics() if runtime is not None else {}
        if runtime is not None:
            metrics["source_lag_entries"] = self._source_lag_entries(runtime)
            metrics["outputs"] = runtime.summary().targets
        self.registry.checkpointed(
            pid,
            {
                "epoch": info.epoch,
                "taken_at": info.taken_at.isoformat(),
                "duration_ms": round(info.duration_s * 1000, 3),
                "bytes": info.bytes,
                "finished": info.finished,
            },
            metrics,
        )
        if run is not None and run.attempts:
            run.attempts = 0  # a checkpoint after a retry: the retries in a row start over
            self.registry.set_state(pid, "running", attempts=0)

    def _source_lag_entries(self, runtime: DurableRuntime) -> int:
        """Entries of the sources' streams not read yet: this server's streams from the
        sources' positions, another server's as of their last message."""
        return sum(
            max(self.store.info(s.stream).next_offset - s.position, 0)
            for s in runtime.flight_sources.values()
            if isinstance(s, StoreSource) and self.store.exists(s.stream)
        ) + sum(
            s.lag_entries for s in runtime.flight_sources.values() if isinstance(s, FlightSource)
        )

    def resumed(self, pid: str, runtime: DurableRuntime) -> None:
        """Record the checkpoint ``runtime`` resumed from as ``pid``'s last one when the
        registry holds an older one or none: a SIGKILL after a checkpoint commits but before
        :meth:`_checkpointed` records it leaves the registry behind the state root, which is
        the truth (the committed sinks match it)."""
        manifest = runtime.manifest
        if manifest is None:
            return
        record = self.registry.get(pid)
        known = record.last_checkpoint
        if known is not None and int(known.get("epoch") or 0) >= manifest.epoch:
            return
        self.registry.checkpointed(
            pid,
            {
                "epoch": manifest.epoch,
                "taken_at": manifest.taken_at.isoformat(),
                "duration_ms": None,  # not kept in the manifest
                "bytes": sum(manifest.files.values()) + len(manifest.to_json()),
                "finished": manifest.finished,
            },
            {
                **record.metrics,
                **manifest.metrics,
                # from the resumed positions: the registry's figure is an older checkpoint's
                "source_lag_entries": self._source_lag_entries(runtime),
                "outputs": runtime.summary().targets,
            },
        )
        self.registry.log(
            pid, "info", f"checkpoint {manifest.epoch} was not in the registry: recorded"
        )

    # --- the actions -------------------------------------------------------------------------

    def submit(
        self,
        sql: str,
        *,
        name: str | None = None,
        base_dir: str | None = None,
        output_dir: str | None = None,
        replace: bool = False,
        function_files: Mapping[str, bytes] | None = None,
        changed_by: str | None = None,
    ) -> dict[str, Any]:
        """Plan, open and start a pipeline; return ``{"id", "name", "state", "outputs"}``.

        One name, one running pipeline: a second submit under the name of a ``running``
        pipeline (the same file submitted twice; ``flight-serve submit`` names a pipeline after
        its file) is refused, unless ``replace`` asks to cancel
        that one first. A stream sink writes its stream as one writer name, so a pipeline whose
        stream sink would write under a ``(stream, writer)`` another running pipeline or a
        DoPut in progress writes is refused too (every result would be in the stream twice).

        Args:
            sql: the pipeline text.
            name: a name (default ``pipeline``, which any number of pipelines may share); the id
                is the name's slug and 8 hex digits.
            base_dir: where relative source paths start (default: the data directory).
            output_dir: where relative sink paths start (default ``<data-dir>/outputs/<id>``).
            replace: cancel the running pipeline(s) of that name first (once this one planned).
            function_files: the bytes of the ``CREATE FUNCTION … USING '<file>'`` files, by path
                as written (uploaded by ``flight-serve submit``); a file not given is read from
                ``base_dir``. Either way they are stored in ``<data-dir>/functions``.
            changed_by: who submits it (the caller's user name), for its version history.

        Raises:
            PipelineSQLError: the pipeline does not plan, or a connector cannot open (line and
                column given). Nothing is registered then.
            AlreadyExistsError: a pipeline of that name runs and ``replace`` is false (the
                message names its id), or a stream sink's writer is held by another writer
                (:class:`~flight_serve.store.streams.WriterBusyError`, naming sink, stream,
                writer and holder).
        """
        if not sql.strip():
            raise InvalidInputError("pipeline.submit: the pipeline SQL is empty")
        same = [r for r in self.registry.all() if r.name == name and r.state == "running"]
        name = name or "pipeline"  # unnamed submits are not one pipeline: their sinks decide
        if same and not replace:
            ids = ", ".join(r.id for r in same)
            raise AlreadyExistsError(
                f"pipeline.submit: a pipeline named {name!r} is already running ({ids}); "
                'submit it under another name (flight-serve submit --name NEW, "name" in '
                'the body) to run a second copy, or replace it (--replace, "replace": true: '
                "it is cancelled first)"
            )
        for old in same:  # --replace cancels it: refused before anything is built
            self._refuse_unfollowed("pipeline.submit", old)
        pid = f"{_slug(name)}-{uuid.uuid4().hex[:8]}"
        base = str(Path(base_dir) if base_dir else self.data_dir.absolute())
        out = str(Path(output_dir) if output_dir else (self.data_dir / "outputs" / pid).absolute())
        record = PipelineRecord(pid, name, sql, base, out, "running", "", "", 0, None, None, {})
        if self.ray_address is not None:
            plan = parse_pipeline(sql, base_dir=Path(base), function_files=function_files)
            if (plan.run_options.parallelism or 1) > 1:
                return self._submit_ray(
                    dataclasses.replace(record, runtime="ray"), same, changed_by, plan
                )
        # refuses a bad pipeline before anything is registered
        runtime = self.build(record, function_files=function_files)
        for old in same:
            self.registry.log(old.id, "info", f"replaced by {pid}")
            self.cancel(old.id)
        try:
            runtime.hold_writers()  # WriterBusyError names the sink, stream, writer, holder
        except AlreadyExistsError:
            runtime.close_sources()
            raise
        if runtime.plan.function_files:  # a restart reads the code from the data directory
            CodeStore(self.data_dir).save(pid, runtime.plan.function_files)
        record = self.registry.add(
            pid,
            record.name,
            sql,
            base,
            out,
            functions=_function_digests(runtime.plan),
            changed_by=changed_by,
        )
        self.registry.log(pid, "info", "submitted")
        self._launch(record, runtime)
        return {
            "id": pid,
            "name": record.name,
            "state": record.state,
            "outputs": runtime.summary().targets,
        }

    def _submit_ray(
        self,
        record: PipelineRecord,
        same: list[PipelineRecord],
        changed_by: str | None,
        plan: PipelinePlan,
    ) -> dict[str, Any]:
        """:meth:`submit` of a pipeline that runs as a job on the server's Ray cluster
        (``plan``: its text planned, with the code of its ``USING`` files, uploaded or read
        from its base directory: stored with it, sent to the job)."""
        pid = record.id
        request = self.job_request(record, plan.function_files)
        parallelism, targets = check_job(request)  # refuses it before anything is registered
        ray = self.ray()  # refuses it when the cluster does not answer
        for old in same:
            self.registry.log(old.id, "info", f"replaced by {pid}")
            self.cancel(old.id)
        functions = _function_digests(plan)
        if plan.function_files:  # the job and a restarted server read the code from here
            CodeStore(self.data_dir).save(pid, plan.function_files)
        record = self.registry.add(
            pid,
            record.name,
            record.sql,
            record.base_dir,
            record.output_dir,
            functions=functions,
            changed_by=changed_by,
            runtime="ray",
        )
        self.registry.log(pid, "info", f"submitted: runs on Ray at parallelism {parallelism}")
        name = job_name(self.data_dir, pid, record.version)
        try:  # the job exists when submit returns: the server may die the next moment
            start_job(ray, name, request)
        except Exception as exc:
            message = f"cannot start its job on Ray: {type(exc).__name__}: {exc}"
            self.registry.log(pid, "error", message)
            self.registry.set_state(
                pid, "failed", error=message, error_kind={"domain": "external", "retryable": True}
            )
            raise FlightServeError(f"pipeline.submit: {pid}: {message}") from exc
        self.registry.log(pid, "info", f"started on Ray as job {name}")
        self._launch(record, None)
        return {"id": pid, "name": record.name, "state": record.state, "outputs": targets}

    def window_state_bytes(self) -> int:
        """Bytes of window state the running pipelines hold now: each windowed query's
        :attr:`~flight_serve.engine.operator.WindowOperator.state_bytes` (its folded arrays as
        allocated, or its SQL-path state table, plus rows buffered for a merge), read from the
        live operators. A pipeline whose state changed under the read (its thread was resizing
        an array map) counts its last checkpoint's size this time; one not running counts
        nothing, and neither does a job on Ray (its state is on the cluster's workers)."""
        total = 0
        for pid, run in list(self._runs.items()):
            runtime = run.runtime
            if runtime is None or not run.thread.is_alive():
                continue
            try:
                total += sum(
                    int(node.op.state_bytes)
                    for node in list(runtime.nodes)
                    if isinstance(node, WindowNode)
                )
            except RuntimeError:  # "dictionary changed size during iteration"
                checkpoint = self.registry.get(pid).last_checkpoint or {}
                total += int(checkpoint.get("bytes") or 0)
        return total

    def pipelines(self) -> list[dict[str, Any]]:
        """Every pipeline's id, name, state, last checkpoint epoch and last error."""
        return [
            {
                "id": r.id,
                "name": r.name,
                "state": r.state,
                "submitted_at": r.submitted_at,
                "epoch": r.last_checkpoint["epoch"] if r.last_checkpoint else None,
                "last_error": r.last_error,
            }
            for r in self.registry.all()
        ]

    def status(self, pid: str) -> dict[str, Any]:
        """State, watermark and its lag, rows in and out, late rows, last checkpoint, last
        error, retries. Counters are those of the last checkpoint (at most one interval old).

        Raises:
            NotFoundError: no such pipeline.
        """
        record = self.registry.get(pid)
        metrics = record.metrics
        kind = record.last_error_kind if record.last_error is not None else None
        run = self._runs.get(pid)
        live = run.runtime if run is not None and run.thread.is_alive() else None
        marks = [int(v) for v in metrics.get("watermark_ns", {}).values()]
        watermark = min(marks) if marks else None
        lag = None
        if watermark is not None and MIN_WATERMARK_NS < watermark < MAX_WATERMARK_NS:
            lag = round(datetime.now(UTC).timestamp() - watermark / 1e9, 3)
        return {
            "id": record.id,
            "name": record.name,
            "state": record.state,
            "submitted_at": record.submitted_at,
            "updated_at": record.updated_at,
            "watermark": _iso_ns(watermark),
            "watermark_lag_s": lag,
            "watermarks": {k: _iso_ns(int(v)) for k, v in metrics.get("watermark_ns", {}).items()},
            "source_lag_entries": metrics.get("source_lag_entries"),
            "rows_in": metrics.get("rows_in", 0),
            "rows_out": metrics.get("rows_out", {}),
            "late_rows": metrics.get("late_rows", {}),
            "open_panes": metrics.get("open_panes", 0),
            "outputs": metrics.get("outputs", {}),
            "gaps": metrics.get("gaps", []),
            "data_loss_rows": metrics.get("data_loss_rows", 0),
            "nodes": metrics.get("nodes", []),
            "last_checkpoint": record.last_checkpoint,
            "last_error": record.last_error,
            # the last error's class: its domain ("input", "external", "internal", …) and
            # whether the same run may succeed later unchanged (a server that was down)
            "last_error_domain": kind["domain"] if kind is not None else None,
            "last_error_retryable": kind["retryable"] if kind is not None else None,
            "attempts": record.attempts,
            # live, not from the last checkpoint: a plugin stage may block checkpoints
            "waiting": live.waiting_for() if live is not None else None,
            "plugin_errors": live.plugin_errors() if live is not None else {},
            # live: calls, rows, errors and p99 call time of each user function since this run
            "functions": live.user_functions.metrics() if live is not None else {},
            # the version running, and every version: when, the SQL's and the functions'
            # SHA-256, who changed it and how (pipelines update)
            "version": record.version,
            "versions": [vars(v) for v in self.registry.versions(pid)],
            # embedded (a thread of this server) or ray (a detached job on its cluster)
            "runtime": record.runtime,
            "job": self._job_status(run) if isinstance(run, _RayRun) else None,
        }

    @staticmethod
    def _job_status(run: _RayRun) -> dict[str, Any]:
        """A Ray job as :meth:`status` shows it: its actor's name, the job's state, parallelism,
        restarts, checkpoints and each window instance (key groups, rows in and out, watermark,
        queued records, open panes, state bytes, worker pid), as last read from the job."""
        last = run.last
        return {
            "name": run.name,
            "state": last.get("state"),
            "parallelism": last.get("parallelism"),
            "restarts": last.get("restarts", 0),
            "checkpoints": last.get("checkpoints", 0),
            "instances": [
                {**i, "watermark": _iso_ns(i.get("watermark_ns"))}
                for i in last.get("instances", [])
            ],
        }

    def _refuse_unfollowed(self, what: str, record: PipelineRecord) -> None:
        """Refuse to act on a running Ray pipeline from a server without ``--ray-address``: its
        job may still run on the cluster, and this server can neither reach it nor stop it (a
        ``cancelled`` here would leave the job running, its checkpoints removed under it, and no
        server would follow it again).

        Raises:
            InvalidInputError: ``record`` runs on Ray and this server has no Ray address.
        """
        if record.runtime == "ray" and self.ray_address is None and record.state == "running":
            raise InvalidInputError(
                f"{what}: pipeline {record.id} runs as a job on Ray and this server was started "
                "without --ray-address, so it cannot reach the job (it may still run there); "
                "restart the server with its cluster's address (serve --ray-address HOST:PORT)"
            )

    def cancel(self, pid: str) -> dict[str, Any]:
        """Checkpoint and stop ``pid``; its state becomes ``cancelled``.

        Raises:
            NotFoundError: no such pipeline.
        """
        with self._switch:  # not while an update swaps the run
            return self._cancel(pid)

    def _cancel(self, pid: str) -> dict[str, Any]:
        record = self.registry.get(pid)
        self._refuse_unfollowed("pipeline.cancel", record)
        with self._lock:
            run = self._runs.get(pid)
        if run is not None and run.thread.is_alive():
            run.stop(cancel=True)
            run.thread.join(STOP_TIMEOUT_S)
        elif record.state not in ("finished", "cancelled"):
            self.registry.log(pid, "info", "cancelled")
            self.registry.set_state(pid, "cancelled")
            self.retire(pid)
        return {"id": pid, "state": self.registry.get(pid).state}

    def update(
        self,
        pid: str,
        sql: str,
        *,
        function_files: Mapping[str, bytes] | None = None,
        changed_by: str | None = None,
        note: str | None = None,
    ) -> dict[str, Any]:
        """Replace running pipeline ``pid``'s text and code with ``sql`` (and its ``USING``
        files), keeping its state: the savepoint-and-redeploy of Flink in one call.

        1. ``sql`` is planned and built as :meth:`submit` builds it, without running it
           (:meth:`check`: a syntax error, an unknown column or function, a ``USING`` file that
           is neither in ``function_files`` nor under the pipeline's ``base_dir`` is refused
           with its line and column), then its stateful operators are compared with the running version's
           (:func:`~flight_serve.pipelines.upgrade.diff_stateful`); a difference is refused
           with one line per operator. Nothing has stopped so far.
        2. The running version checkpoints and stops (its sinks commit that epoch).
        3. The new version is built resuming from that checkpoint; the checkpoint's recorded
           stateful operators are checked against it by the same function. If this fails (or
           its stream sinks' writers cannot be held), the old version resumes from the same
           checkpoint and the error is raised: nothing changed.
        4. The new code is stored, the registry records version ``n + 1`` in one transaction
           (this is the commit), and the new version runs.

        Every source resumes at the checkpoint's offsets and every sink at its commit mark, so
        each input row is processed exactly once: by the old version up to the checkpoint, by
        the new one after it.

        Args:
            pid: the pipeline.
            sql: the new pipeline text.
            function_files: the bytes of its ``USING`` files by path as written (as
                :meth:`submit`).
            changed_by: who updates it (the caller's user name).
            note: what the change is (``flight-serve pipelines update`` sends the file's name).

        Returns:
            ``{"id", "version", "previous_version", "resumed_from", "sql_sha256",
            "functions", "changed"}`` (``changed`` false: the text and code are the running
            version's; nothing was done).

        Raises:
            NotFoundError: no such pipeline.
            InvalidInputError: it is not running, or is starting; the SQL is empty; or its
                stateful operators differ (``IncompatibleUpdate``: the message lists them).
            PipelineSQLError, FunctionDefinitionError: the new text does not plan.
            IncompatibleUpdateError: the new version could not resume the checkpoint the old
                one took (its operators' state does not fit it, e.g. an aggregated column's
                type changed): the old version resumes from it.
            CheckpointError: the old version did not stop within the timeout.
        """
        with self._switch:  # one update (or cancel) at a time
            return self._update(pid, sql, function_files, changed_by, note)

    def _update(
        self,
        pid: str,
        sql: str,
        function_files: Mapping[str, bytes] | None,
        changed_by: str | None,
        note: str | None,
    ) -> dict[str, Any]:
        what = "pipeline.update"
        record = self.registry.get(pid)
        if not sql.strip():
            raise InvalidInputError(f"{what}: the pipeline SQL is empty")
        if record.state != "running":
            raise InvalidInputError(
                f"{what}: pipeline {pid} is {record.state}; only a running pipeline is updated "
                "(submit the new text instead)"
            )
        self._refuse_unfollowed(what, record)
        with self._lock:
            run = self._runs.get(pid)
        if isinstance(run, _RayRun) and run.thread.is_alive():
            return self._update_ray(run, record, sql, function_files, changed_by, note)
        runtime = run.runtime if run is not None and run.thread.is_alive() else None
        if run is None or runtime is None:
            raise InvalidInputError(
                f"{what}: pipeline {pid} is starting (resuming from its checkpoint, or waiting "
                "to retry); ask again once it runs"
            )
        plan = parse_pipeline(sql, base_dir=Path(record.base_dir), function_files=function_files)
        if self.ray_address is not None and (plan.run_options.parallelism or 1) > 1:
            raise InvalidInputError(
                f"{what}: pipeline {pid} runs in this server (parallelism 1); an update does not "
                f"move it to Ray (SET parallelism = {plan.run_options.parallelism}): cancel it "
                "and submit the new text, which runs on Ray from the start (nothing was changed)"
            )
        # the new text builds (as submit checks it) before its operators are compared: a
        # function DataFusion does not know is named at its call, not an aggregate missing
        self.check(plan, record)
        old, new = stateful_operators(runtime.plan), stateful_operators(plan)
        diff = diff_stateful(old, new)
        if diff:
            raise IncompatibleUpdateError(
                f"{what}: pipeline {pid} version {record.version} cannot be updated with this "
                "text, its stateful operators differ (the running version is unchanged): "
                + "; ".join(diff)
            )
        functions = _function_digests(plan)
        if sql == record.sql and functions == _function_digests(runtime.plan):
            return _update_result(record, record.version, None, sql, functions, changed=False)
        # the switch: the old version checkpoints and stops
        run.updating = True
        run.stop(cancel=False)
        run.thread.join(STOP_TIMEOUT_S)
        if run.thread.is_alive():
            raise CheckpointError(
                f"{what}: pipeline {pid} did not checkpoint and stop within {STOP_TIMEOUT_S:g} s; "
                "it goes on as version "
                f"{record.version} once it does (nothing was changed; try again)"
            )
        stopped_at = runtime.epoch
        current = self.registry.get(pid)
        if current.state != "running":  # it finished or failed just then
            raise InvalidInputError(
                f"{what}: pipeline {pid} became {current.state} while stopping for the update; "
                "nothing was changed"
            )
        version = record.version + 1
        code_key = f"{pid}.v{version}" if plan.function_files else None
        staged = replace(record, sql=sql, version=version, code_key=code_key)
        try:
            fresh = self.build(staged, function_files=plan.function_files, upgrade=True)
            try:
                fresh.hold_writers()
            except BaseException:
                fresh.close_sources()
                raise
        except BaseException as exc:
            self.registry.log(
                pid,
                "warning",
                f"update to version {version} failed, version {record.version} resumes: {exc}",
            )
            self._launch(current, None)  # the old version, from the checkpoint it just took
            if isinstance(exc, CheckpointError):  # the new text does not fit the state
                raise IncompatibleUpdateError(
                    f"{what}: pipeline {pid}: version {version} cannot resume from checkpoint "
                    f"{stopped_at}: {exc}; version {record.version} resumes from it (nothing "
                    "was changed)"
                ) from exc
            raise
        try:
            committed, change = self._commit_version(
                record, sql, functions, code_key, plan.function_files, changed_by, note, stopped_at
            )
        except BaseException:
            fresh.release_writers()
            fresh.close_sources()
            self._launch(current, None)
            raise
        self._log_version(pid, version, change, changed_by, note)
        self._launch(committed, fresh)
        return _update_result(record, version, stopped_at, sql, functions, changed=True)

    def _update_ray(
        self,
        run: _RayRun,
        record: PipelineRecord,
        sql: str,
        function_files: Mapping[str, bytes] | None,
        changed_by: str | None,
        note: str | None,
    ) -> dict[str, Any]:
        """:meth:`update` of a pipeline running on Ray: the job checkpoints and stops
        (``stopped``), and the new version's job resumes from that checkpoint at the new text's
        parallelism (a rescale when it changed: the key groups move to the new instances). The
        checkpoint's stateful operators are checked against the new plan when the new job
        resumes; a mismatch fails that job (the refusal before stopping catches the cases
        :func:`~flight_serve.pipelines.upgrade.diff_stateful` sees)."""
        what, pid = "pipeline.update", record.id
        old_plan = self.job_request(record).plan()
        plan = parse_pipeline(sql, base_dir=Path(record.base_dir), function_files=function_files)
        version = record.version + 1
        code_key = f"{pid}.v{version}" if plan.function_files else None
        staged = dataclasses.replace(record, sql=sql, version=version, code_key=code_key)
        # refused before anything stops; built before the operators are compared (as in _update)
        parallelism, _ = check_job(self.job_request(staged, plan.function_files))
        diff = diff_stateful(stateful_operators(old_plan), stateful_operators(plan))
        if diff:
            raise IncompatibleUpdateError(
                f"{what}: pipeline {pid} version {record.version} cannot be updated with this "
                "text, its stateful operators differ (the running version is unchanged): "
                + "; ".join(diff)
            )
        functions = _function_digests(plan)
        if sql == record.sql and functions == _function_digests(old_plan):
            return _update_result(record, record.version, None, sql, functions, changed=False)
        run.stop_for_update()
        run.thread.join(STOP_TIMEOUT_S)
        if run.thread.is_alive():
            raise CheckpointError(
                f"{what}: pipeline {pid}'s job on Ray did not checkpoint and stop within "
                f"{STOP_TIMEOUT_S:g} s; it goes on as version {record.version} (nothing was "
                "changed; try again)"
            )
        current = self.registry.get(pid)
        last = run.last
        if current.state != "running" or last.get("state") != "stopped":
            raise InvalidInputError(
                f"{what}: pipeline {pid} became {last.get('state') or current.state} while "
                "stopping for the update; nothing was changed"
            )
        stopped_at = (last.get("checkpoint") or {}).get("epoch")
        committed, change = self._commit_version(
            record, sql, functions, code_key, plan.function_files, changed_by, note, stopped_at
        )
        self._log_version(pid, version, f"{change}, parallelism {parallelism}", changed_by, note)
        self._launch(committed, None)
        return _update_result(record, version, stopped_at, sql, functions, changed=True)

    def _commit_version(
        self,
        record: PipelineRecord,
        sql: str,
        functions: dict[str, str],
        code_key: str | None,
        function_files: Mapping[str, bytes],
        changed_by: str | None,
        note: str | None,
        stopped_at: int | None,
    ) -> tuple[PipelineRecord, str]:
        """Store the new version's code (under ``code_key``, if any) and its registry version,
        resumed from checkpoint ``stopped_at``; returns the new record and the change's words.

        Raises:
            StorageError: the code or the registry cannot be written.
        """
        change = f"updated from version {record.version} at checkpoint {stopped_at}"
        if code_key is not None:
            CodeStore(self.data_dir).save(code_key, function_files)
        committed = self.registry.add_version(
            record.id,
            sql,
            functions=functions,
            code_key=code_key,
            changed_by=changed_by,
            change=change + (f": {note}" if note else ""),
            epoch=stopped_at,
        )
        return committed, change

    def _log_version(
        self, pid: str, version: int, change: str, changed_by: str | None, note: str | None
    ) -> None:
        """The log line of an update that committed ``version``."""
        self.registry.log(
            pid,
            "info",
            f"version {version} ({change}"
            + (f" by {changed_by}" if changed_by else "")
            + (f": {note}" if note else "")
            + ")",
        )

    def checkpoint(self, pid: str, wait_s: float = 30.0) -> dict[str, Any]:
        """Take a checkpoint of ``pid`` now and wait (up to ``wait_s``) until it completes.

        Raises:
            NotFoundError: no such pipeline. InvalidInputError: it is not running.
        """
        record = self.registry.get(pid)
        with self._lock:
            run = self._runs.get(pid)
        runtime = run.runtime if run is not None else None
        if record.state != "running":
            raise InvalidInputError(f"pipeline {pid} is {record.state}, not running")
        if record.runtime == "ray" and self.ray_address is None:
            raise InvalidInputError(
                f"pipeline {pid} runs on Ray and this server was started without "
                "--ray-address, so it cannot reach the job; restart the server with its "
                "cluster's address (serve --ray-address HOST:PORT)"
            )
        if isinstance(run, _RayRun):
            return self._checkpoint_ray(run, pid, wait_s)
        if runtime is None:  # its thread is (re)building it: resuming, or between retries
            raise InvalidInputError(
                f"pipeline {pid} is starting (resuming from its checkpoint, or waiting to "
                "retry); ask again once it runs"
            )
        before = runtime.epoch
        runtime.request_checkpoint()
        info = runtime.wait_checkpoint(before, wait_s)
        if info is None:
            return {"id": pid, "epoch": None, "completed": False}
        return {
            "id": pid,
            "epoch": info.epoch,
            "completed": True,
            "taken_at": info.taken_at.isoformat(),
            "bytes": info.bytes,
        }

    def _checkpoint_ray(self, run: _RayRun, pid: str, wait_s: float) -> dict[str, Any]:
        """:meth:`checkpoint` of a pipeline running on Ray: the job arms a barrier now; wait
        for a checkpoint above the last one in the job's status."""
        job = run.job
        if job is None or not run.thread.is_alive():
            raise InvalidInputError(
                f"pipeline {pid} is starting (its job on Ray is being found or started); ask "
                "again once it runs"
            )
        ray = self.ray()
        before = ray.get(job.checkpoint.remote(), timeout=JOB_CALL_TIMEOUT_S)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            status = ray.get(job.status.remote(1 << 62), timeout=JOB_CALL_TIMEOUT_S)
            info = status.get("checkpoint")
            if info is not None and (before is None or info["epoch"] > before):
                return {
                    "id": pid,
                    "epoch": info["epoch"],
                    "completed": True,
                    "taken_at": info["taken_at"],
                    "bytes": info["bytes"],
                }
            if status["state"] != "running":
                break
            time.sleep(0.05)
        return {"id": pid, "epoch": None, "completed": False}

    def logs(self, pid: str, after: int = 0) -> list[LogLine]:
        """``pid``'s log lines after ``after``.

        Raises:
            NotFoundError: no such pipeline.
        """
        return self.registry.logs(pid, after)
