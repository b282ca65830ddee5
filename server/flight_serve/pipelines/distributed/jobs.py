"""Detached Ray jobs: a server's submitted pipeline whose coordinator outlives the server.

A server started with ``--ray-address`` runs each submitted pipeline whose parallelism is above 1
(``SET parallelism = N``) as a **job** on that Ray cluster. The job's coordinator is a detached
named actor (:class:`JobCoordinator`, ``lifetime="detached"`` in namespace :data:`NAMESPACE`,
named by :func:`job_name`); it runs :func:`~.ray_runtime.run_on_ray` in a thread of its own, so the
job's source and window actors are its children and live as long as it does, not as long as the
client or the server that submitted it. The server follows the job by calling
:meth:`JobCoordinator.status` (twice a second) and reaches it for ``pipelines cancel`` and
``pipelines update`` (:meth:`JobCoordinator.stop`); a restarted server finds its running jobs by
name (``ray.get_actor``) and re-attaches to them.

The job checkpoints as a ``flight-serve run --runtime ray`` with checkpoints does (every
``checkpoint_interval``, 1 s unless the pipeline SETs one; state under the server's
``<data-dir>/checkpoints/<id>`` or the pipeline's ``state_root``, which every node must reach). A
worker that dies restores every instance from the last complete checkpoint
(:data:`~.ray_runtime.DEFAULT_MAX_RESTARTS` times); the coordinator actor itself is restarted by
Ray (:data:`COORDINATOR_MAX_RESTARTS` times) and resumes from the last checkpoint too.

Ray is imported only when a server with an address starts or a job is made; this module imports
no Ray at import time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flight_serve.errors import ExternalError, ExternalRefusalError, FlightServeError
from flight_serve.pipelines.connect import check_checkpointed
from flight_serve.pipelines.coordinator import CheckpointInfo, PipelineStopped
from flight_serve.pipelines.distributed.ray_runtime import (
    import_ray,
    resolve_parallelism,
    run_on_ray,
    start_ray,
)
from flight_serve.pipelines.distributed.workers import (
    InstanceStatus,
    JobSpec,
    check_distributable,
    summary_of,
)
from flight_serve.pipelines.pipeline import PipelinePlan, parse_pipeline

if TYPE_CHECKING:
    from flight_serve.functions.python import SandboxConfig

__all__ = [
    "COORDINATOR_MAX_RESTARTS",
    "NAMESPACE",
    "JobCoordinator",
    "JobRequest",
    "check_job",
    "connect",
    "find_job",
    "job_name",
    "job_token",
    "start_job",
]

#: The Ray namespace of flight-serve's detached jobs.
NAMESPACE = "flight-serve"
#: How many times Ray restarts a job's coordinator actor whose process died (each restart
#: resumes the job from its last checkpoint).
COORDINATOR_MAX_RESTARTS = 3
#: Log lines a coordinator keeps for the server to read (older ones are dropped).
_LOG_KEPT = 1000


@dataclass(frozen=True)
class JobRequest:
    """What a job's coordinator needs (picklable; the actor's constructor argument, so a
    restarted coordinator gets it again).

    Attributes:
        pipeline: the pipeline's id (its run's name: the checkpoints' ``pipeline`` field).
        version: the pipeline's version (``pipelines update`` makes a new job per version).
        sql: the pipeline text.
        base_dir: where relative source paths (and ``USING`` files) start; every node reads it.
        output_dir: where relative sink paths start; every node writes there.
        state_root: the checkpoints' root (a path or ``pyarrow.fs`` URI every node reaches).
        checkpoint_interval_s: seconds between checkpoints for a pipeline that SETs neither
            ``checkpoint_interval`` nor ``checkpoint_every``.
        upgrade: the checkpoint resumed may be another version's with the same stateful
            operators (a version after ``pipelines update``).
        sandbox: how the job runs ``LANGUAGE python`` functions: the server's
            (:class:`~flight_serve.functions.python.SandboxConfig`, its hidden paths and
            ``--allow-unsandboxed-python``); ``None``: ``SandboxConfig()``.
        function_files: the code of its ``USING '<file>'`` functions by path as written (the
            server's stored copy, so no node needs the files); ``None``: read from ``base_dir``.
        stream_server: ``(Flight location, bearer token or None)`` of the submitting server:
            its ``flight`` connectors without a ``server`` option read (and write) that
            server's streams over Flight; ``None``: such connectors are refused.
    """

    pipeline: str
    version: int
    sql: str
    base_dir: str
    output_dir: str
    state_root: str
    checkpoint_interval_s: float
    upgrade: bool = False
    sandbox: SandboxConfig | None = None
    function_files: dict[str, bytes] | None = None
    stream_server: tuple[str, str | None] | None = None

    def plan(self) -> PipelinePlan:
        """The pipeline, planned as its job plans it.

        Raises:
            PipelineSQLError, FunctionDefinitionError: it does not plan.
        """
        return parse_pipeline(self.sql, path=self.path(), function_files=self.function_files)

    def path(self) -> Path:
        """The pipeline's name as a file in ``base_dir`` (it need not exist: relative paths
        start at its directory)."""
        return Path(self.base_dir) / f"{self.pipeline}.sql"


def job_token(data_dir: Path) -> str:
    """The bearer token a server's jobs on Ray present to that server (read and write roles)
    when they read its streams over Flight: made once and kept in ``<data-dir>/ray-job-token``
    (mode 0600, beside the registry), so a restarted server accepts the jobs that outlived
    the one before it.

    Raises:
        OSError: the file cannot be read or written.
    """
    path = Path(data_dir) / "ray-job-token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(staged, path)
    return token


def job_name(data_dir: Path, pipeline: str, version: int) -> str:
    """The detached actor's name of ``pipeline``'s ``version``: unique per server data
    directory, so two servers on one cluster never share a job.

    >>> job_name(Path("/srv/a"), "flights-0a1b2c3d", 2)[:9]
    'pipeline-'
    """
    digest = hashlib.sha256(str(Path(data_dir).absolute()).encode()).hexdigest()[:12]
    return f"pipeline-{digest}-{pipeline}-v{version}"


def check_job(request: JobRequest) -> tuple[int, dict[str, str]]:
    """Refuse what a job cannot run before anything is registered; returns its parallelism and
    its sinks' targets (sink name → path or stream, as a run's summary gives them).

    Raises:
        PipelineSQLError: the pipeline does not plan, has what the distributed runtime does not
            take yet (a live source, a plugin: named), a connector checkpoints cannot cover, or a
            parallelism above ``max_parallelism``.
    """
    plan = request.plan()
    options = plan.run_options
    parallelism = resolve_parallelism(None, options.parallelism, options.max_parallelism)
    check_checkpointed(plan, server=request.stream_server is not None)
    spec = JobSpec(
        request.sql,
        str(request.path()),
        request.output_dir,
        parallelism[0],
        parallelism[1],
        request.state_root,
        request.sandbox,
        request.function_files,
        request.stream_server,
    )
    driver = spec.runtime()
    try:
        check_distributable(driver)
        return parallelism[0], dict(summary_of(driver, {}).targets)
    finally:  # building it started a sandbox worker per Python function: none is kept
        driver.user_functions.close()
        for source in driver.flight_sources.values():
            source.close()


def connect(address: str) -> Any:
    """The ``ray`` module, connected to the cluster at ``address`` (``start_ray``).

    A cluster started by Ray 2.5x or later uses token authentication by default: its clients
    need ``RAY_AUTH_MODE=token`` and the token (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN`` or
    ``RAY_AUTH_TOKEN_PATH``), as every Ray client does.

    Raises:
        FlightServeError: Ray is not installed (the message names the extra).
        ExternalError: nothing answers at the address within :data:`CONNECT_TIMEOUT_S` s
            (retryable).
        ExternalRefusalError: the address answers but Ray does not take this client, most
            often a missing or wrong token (not retryable; the message says what to set).
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    _check_reachable(address)
    try:
        start_ray(ray, address)
    except (ConnectionError, RuntimeError) as exc:
        # something accepts TCP at the address (checked above), and Ray's own retries (several
        # seconds) did not get it to take this client: a token it refuses (Ray logs
        # "InvalidAuthToken" on stderr, its exception only says "Failed to connect"), or not
        # a Ray GCS; sending the submit again will not help
        raise ExternalRefusalError(
            f"cannot connect to the Ray cluster at {address}: {exc}; the address answers, so "
            "the cluster refused this server: a cluster with token authentication (Ray's "
            "default) needs RAY_AUTH_MODE=token and its token (~/.ray/auth_token, or "
            "RAY_AUTH_TOKEN) in the server's environment"
        ) from exc
    return ray


#: Seconds :func:`connect` waits for a TCP connection to the cluster's address before it gives
#: up (``ray.init`` itself retries a port where nothing listens for many minutes).
CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """Refuse at once an address (``host:port`` or ``ray://host:port``) where nothing accepts
    a TCP connection: ``ray.init`` would retry it for many minutes, holding the caller (a
    ``pipeline.submit``) past any client's deadline. ``auto`` and addresses without a port are
    left to Ray.

    Raises:
        ExternalError: nothing answers at that host and port.
    """
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ExternalError(
            f"cannot connect to the Ray cluster at {address}: nothing answers at {host}:{port} "
            f"within {CONNECT_TIMEOUT_S:g} s ({exc}); start it (ray start --head --port {port}) "
            "or give serve --ray-address the GCS address of a running cluster"
        ) from exc


def start_job(ray: Any, name: str, request: JobRequest) -> Any:
    """Start the job of ``request`` as detached actor ``name``; returns its handle.

    Raises:
        ValueError: an actor of that name exists (Ray's error).
    """
    cls = ray.remote(num_cpus=0, max_restarts=COORDINATOR_MAX_RESTARTS)(JobCoordinator)
    return cls.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(request)


def find_job(ray: Any, name: str) -> Any | None:
    """The handle of job ``name`` if its actor is alive (or being restarted), else ``None``."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def _reconstructed() -> bool:
    """Whether this process is a Ray actor that Ray restarted after its process died."""
    try:
        return bool(import_ray().get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not in an actor (a test builds one directly), or no Ray
        return False


def _checkpoint_dict(info: CheckpointInfo) -> dict[str, Any]:
    return {
        "epoch": info.epoch,
        "taken_at": info.taken_at.isoformat(),
        "duration_ms": round(info.duration_s * 1000, 3),
        "bytes": info.bytes,
        "finished": info.finished,
    }


class JobCoordinator:
    """A job's coordinator (run as a detached Ray actor by :func:`start_job`): the driver of
    :func:`~.ray_runtime.run_on_ray` in a thread, started by the constructor, so a coordinator
    Ray restarts resumes the job from its last checkpoint with no one asking.

    Its state is one of ``running``, ``finished`` (every input ended; the finished checkpoint
    is taken), ``cancelled`` (:meth:`stop` with ``cancel``: checkpointed and stopped),
    ``stopped`` (:meth:`stop` without: checkpointed and stopped for a new version) or ``failed``
    (the run raised: the error is kept).
    """

    def __init__(self, request: JobRequest) -> None:
        self.request = request
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._checkpoint_now = threading.Event()
        self._cancel = False
        self._state = "running"
        self._error: str | None = None
        self._error_domain: str | None = None
        self._log: list[tuple[int, str, str]] = []
        self._seq = 0
        self._checkpoint: dict[str, Any] | None = None
        self._checkpoints = 0
        self._instances: list[InstanceStatus] = []
        self._restarts = 0
        self._attempts_from: tuple[int | None, ...] = ()
        self._rows: dict[str, int] = {}
        self._targets: dict[str, str] = {}
        self._late: dict[str, int] = {}
        self._parallelism: int | None = None
        self._started = time.time()
        if _reconstructed():
            self._say(
                "warning",
                "the job's coordinator was restarted by Ray (its process died): resuming from "
                "the last checkpoint; its counters (checkpoints, restarts, the instances' rows) "
                "start again",
            )
        self._thread = threading.Thread(target=self._main, name="flight-serve-job", daemon=True)
        self._thread.start()

    def _say(self, level: str, message: str) -> None:
        with self._lock:
            self._seq += 1
            self._log.append((self._seq, level, message))
            del self._log[:-_LOG_KEPT]

    def _on_checkpoint(self, info: CheckpointInfo) -> None:
        with self._lock:
            self._checkpoint = _checkpoint_dict(info)
            self._checkpoints += 1

    def _on_status(self, instances: list[InstanceStatus]) -> None:
        with self._lock:
            self._instances = list(instances)

    def _on_restart(self, restart: int, error: str) -> None:
        with self._lock:
            self._restarts = restart
            where = self._checkpoint["epoch"] if self._checkpoint else None
        self._say(
            "warning",
            f"a worker died ({error}); restart {restart}: every instance from "
            + (f"checkpoint {where}" if where is not None else "the last checkpoint"),
        )

    def _main(self) -> None:
        request = self.request
        try:
            plan = request.plan()
            options = plan.run_options
            if not options.checkpoints:  # a server's pipeline commits on time
                interval = timedelta(seconds=request.checkpoint_interval_s)
                options = replace(options, checkpoint_interval=interval)
            self._parallelism = resolve_parallelism(
                None, options.parallelism, options.max_parallelism
            )[0]
            self._say("info", f"running on Ray at parallelism {self._parallelism}")
            summary, stats = run_on_ray(
                request.path(),
                sql=request.sql,
                output_dir=Path(request.output_dir),
                options=options,
                state_root=request.state_root,
                resume="latest",
                restart_finished=False,
                upgrade=request.upgrade,
                sandbox=request.sandbox,
                function_files=request.function_files,
                stream_server=request.stream_server,
                checkpoint_now=self._checkpoint_now,
                on_checkpoint=self._on_checkpoint,
                on_status=self._on_status,
                on_restart=self._on_restart,
                stop=self._stop,
            )
        except PipelineStopped as exc:
            with self._lock:
                self._state = "cancelled" if self._cancel else "stopped"
            self._say("info", str(exc))
            return
        except BaseException as exc:  # the job's error is the server's to show
            message = (
                str(exc) if isinstance(exc, FlightServeError) else f"{type(exc).__name__}: {exc}"
            )
            with self._lock:
                self._state, self._error = "failed", message
                self._error_domain = exc.domain if isinstance(exc, FlightServeError) else "internal"
            self._say("error", f"failed: {message}")
            return
        with self._lock:
            self._rows, self._targets = dict(summary.rows), dict(summary.targets)
            self._late = dict(summary.late_rows)
            self._instances = list(stats.instances)
            self._attempts_from = stats.attempts_from
            self._state = "finished"
        self._say(
            "info",
            f"finished on Ray: {stats.window_actors} window and {stats.source_actors} source "
            f"actors, {stats.checkpoints} checkpoint(s), {stats.restarts} restart(s), "
            f"{stats.seconds:.1f} s",
        )

    def status(self, after: int = 0) -> dict[str, Any]:
        """The job now: ``state``, ``error``, ``error_domain``, ``checkpoint`` (the last one:
        epoch, taken_at, duration_ms, bytes, finished), ``checkpoints`` (taken by this
        coordinator), ``restarts``, ``parallelism``, ``instances`` (each window instance's
        :class:`~.workers.InstanceStatus` as a dict: key groups, rows in and out, watermark in ns,
        queued records, open panes, state bytes, the worker's pid), ``rows``/``targets``/
        ``late_rows`` once finished, ``attempts_from`` and the log lines after sequence number
        ``after`` (``log``: ``[seq, level, message]``)."""
        with self._lock:
            return {
                "state": self._state,
                "error": self._error,
                "error_domain": self._error_domain,
                "checkpoint": self._checkpoint,
                "checkpoints": self._checkpoints,
                "restarts": self._restarts,
                "parallelism": self._parallelism,
                "instances": [dataclasses.asdict(i) for i in self._instances],
                "rows": dict(self._rows),
                "targets": dict(self._targets),
                "late_rows": dict(self._late),
                "attempts_from": list(self._attempts_from),
                "started_at": self._started,
                "log": [list(line) for line in self._log if line[0] > after],
            }

    def checkpoint(self) -> int | None:
        """Ask for a checkpoint now (``pipelines checkpoint``); returns the epoch of the last
        completed one (the caller waits for a higher one in :meth:`status`), ``None`` if none.
        A job that is not running ignores it."""
        with self._lock:
            last = self._checkpoint["epoch"] if self._checkpoint else None
            if self._state == "running":
                self._checkpoint_now.set()
        return int(last) if last is not None else None

    def stop(self, cancel: bool) -> None:
        """Checkpoint and stop the job: ``cancelled`` (``cancel``) or ``stopped`` (a new version
        takes over from the checkpoint). A job that ended already stays as it is."""
        with self._lock:
            self._cancel = self._cancel or cancel
        self._stop.set()
