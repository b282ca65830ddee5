"""Running the Flight service: in-process for tests and embedding, or as the daemon.

:func:`start_server` is a context manager (STYLE habit 6: a server on port 0 per test) and
:func:`serve_forever` is what ``flight-serve serve`` runs: JSON-lines logs on stderr, the listening
location on stdout, and SIGTERM / SIGINT shut the server down cleanly (exit code 0).

pyarrow's Flight server serves on its own gRPC threads from the moment it is constructed, so no
Python thread is needed to run it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve.errors import FlightServeError
from flight_serve.flight.config import ServerConfig
from flight_serve.flight.ops.auth import load_users_file
from flight_serve.flight.ops.health import HealthServer
from flight_serve.flight.ops.limits import MIDDLEWARE_KEY as STREAM_LIMIT_KEY
from flight_serve.flight.ops.limits import (
    MemoryBudget,
    StreamLimit,
)
from flight_serve.flight.ops.metrics import MeteredStreamStore, Metrics, MetricsMiddlewareFactory
from flight_serve.flight.ops.requestlog import MIDDLEWARE_KEY as REQUEST_LOG_KEY
from flight_serve.flight.ops.requestlog import RequestLogMiddlewareFactory
from flight_serve.flight.ops.roles import MIDDLEWARE_KEY as ROLES_KEY
from flight_serve.flight.ops.roles import (
    RoleAuth,
    TokenGrant,
    UsersAndTokensAuth,
    load_tokens_file,
)
from flight_serve.flight.service import FlightServeService
from flight_serve.flight.startup import MIDDLEWARE_KEY as STARTUP_KEY
from flight_serve.flight.startup import StartupGate
from flight_serve.store import StreamStore

__all__ = ["JsonLinesFormatter", "configure_json_logging", "serve_forever", "start_server"]

log = logging.getLogger("flight_serve.server")

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is logged.
_STANDARD_RECORD_KEYS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName"}


class JsonLinesFormatter(logging.Formatter):
    """Format a record as one JSON object: ``ts`` (UTC ISO 8601, ms), ``level``, ``logger``,
    ``msg``, every ``extra=`` field, and ``exc`` (the traceback) when there is one.

    >>> record = logging.LogRecord("x", logging.INFO, "", 0, "hi %s", ("there",), None)
    >>> record.created = 0.0
    >>> record.stream = "flights"
    >>> JsonLinesFormatter().format(record)
    '{"ts": "1970-01-01T00:00:00.000+00:00", "level": "info", "logger": "x", "msg": "hi there", "stream": "flights"}'
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_RECORD_KEYS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _JsonLinesHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_json_logging` installs (recognised so it is added once)."""


def configure_json_logging(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Send every log record of the process to ``stream`` (stderr) as JSON lines.

    Idempotent: a second call replaces the handler installed by the first.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _JsonLinesHandler):
            root.removeHandler(handler)
    handler = _JsonLinesHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLinesFormatter())
    root.addHandler(handler)
    root.setLevel(level)


@contextmanager
def start_server(
    config: ServerConfig | Path | str, /, **options: Any
) -> Iterator[FlightServeService]:
    """Open the store in ``config.data_dir``, serve it on ``config.host:config.port`` and yield
    the running service.

    ``config`` is a :class:`~flight_serve.flight.config.ServerConfig`; ``options`` override its
    fields. A data directory instead is short for ``ServerConfig(data_dir, **options)``
    (``start_server(tmp_path, port=0, pipelines=False)``).

    The service has ``.port`` (the real port when ``port=0``), ``.location``
    (``grpc://HOST:PORT``) and ``.store``. On exit the server shuts down (running tails end,
    in-flight calls finish) and the store is closed.

    With ``pipelines`` (the default) the server runs submitted pipelines
    (:class:`~flight_serve.pipelines.manager.PipelineManager`, the ``pipeline.*`` actions): it
    resumes every ``running`` one at start, and on exit asks each to checkpoint and stop first.

    No call is answered before the server is whole: until the pipeline actions are registered
    and the running pipelines resumed, calls wait (:mod:`flight_serve.flight.startup`).
    Every call gets a request id and one JSON log line when it ends
    (:mod:`flight_serve.flight.ops.requestlog`). With ``metrics`` the server counts rows and
    bytes per stream, times every call and reports its pipelines there
    (:mod:`flight_serve.flight.ops.metrics`).

    With ``tokens`` / ``tokens_file`` (:func:`~flight_serve.flight.ops.roles.load_tokens_file`)
    every call needs a bearer token with the role its method and action need
    (:mod:`flight_serve.flight.ops.roles`); with ``users`` / ``users_file`` the Basic handshake.
    With ``tls`` the server speaks TLS (mutual TLS with ``tls.client_ca``) and its location is
    ``grpc+tls://``. At most ``max_streams`` DoGet/DoPut/DoExchange calls run at once; more are
    refused UNAVAILABLE with a retry hint (:mod:`flight_serve.flight.ops.limits`).
    ``retention_bytes`` / ``retention_age`` are the store's per-stream retention limits
    (:class:`~flight_serve.store.streams.StreamStore`). With a memory budget
    (:class:`~flight_serve.flight.ops.limits.MemoryBudget`) the running pipelines' window state
    (the size of each one's last checkpoint) counts against it.

    Raises:
        TypeError: an option that is not a :class:`ServerConfig` field.
        ValueError: contradicting options (:class:`ServerConfig`).
        StorageError: the data directory cannot be opened or another store owns it.
        FlightServeError: the users or tokens file cannot be read.
    """
    if isinstance(config, ServerConfig):
        config = replace(config, **options) if options else config
    else:
        config = ServerConfig(Path(config), **options)
    tokens, users = _credentials(config)
    job_token = None
    if config.ray_address is not None and config.pipelines and (tokens or users):
        # its jobs on Ray read its streams over Flight: a token of their own (read, write)
        from flight_serve.pipelines.distributed.jobs import job_token as read_job_token

        job_token = read_job_token(Path(config.data_dir))
        grant = TokenGrant(frozenset({"read", "write"}), "ray-jobs")
        tokens = {**(tokens or {}), job_token: grant}
    metrics = config.metrics
    budget = config.memory_budget
    if config.memory_budget_bytes is not None:
        budget = MemoryBudget(config.memory_budget_bytes, wait_s=config.memory_wait_s)
        if metrics is not None:
            metrics.watch_budget(budget)
    data_dir = Path(config.data_dir)
    store = (
        StreamStore(
            data_dir,
            fsync=config.fsync,
            retention_bytes=config.retention_bytes,
            retention_age=config.retention_age,
        )
        if metrics is None
        else MeteredStreamStore(
            data_dir,
            fsync=config.fsync,
            metrics=metrics,
            retention_bytes=config.retention_bytes,
            retention_age=config.retention_age,
        )
    )
    gate = StartupGate()  # first: no call is answered before the server is whole
    middleware: dict[str, flight.ServerMiddlewareFactory] = {STARTUP_KEY: gate}
    middleware[REQUEST_LOG_KEY] = RequestLogMiddlewareFactory()
    middleware[STREAM_LIMIT_KEY] = StreamLimit(config.max_streams)
    if tokens is not None:
        users_auth = None
        if users is not None:  # both files: handshake tokens have every role
            users_auth = UsersAndTokensAuth(users, tokens)
            middleware["flight_serve_auth"] = users_auth  # instead of the users-only check
        middleware[ROLES_KEY] = RoleAuth(tokens, users_auth)
    scheme = "grpc"
    tls_options: dict[str, Any] = {}
    if config.tls is not None:
        scheme = "grpc+tls"
        try:
            tls_options = config.tls.server_options()
        except BaseException:
            store.close()
            raise
    if metrics is not None:
        middleware["flight_serve_metrics"] = MetricsMiddlewareFactory(metrics)
    host, port = config.host, config.port
    try:
        uri_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        service = FlightServeService(
            f"{scheme}://{uri_host}:{port}",
            store=store,
            max_batch_bytes=config.max_batch_bytes,
            users=users,
            memory_budget=budget,
            statement_timeout_s=config.statement_timeout_s,
            query_work_bytes=config.query_work_bytes,
            middleware=middleware,
            **tls_options,
        )
    except pa.ArrowException as exc:  # pyarrow says "Server did not start properly"
        store.close()
        raise type(exc)(
            f"cannot listen on {uri_host}:{port} for Flight (is the port in use?): {exc}"
        ) from None
    except BaseException:
        store.close()
        raise
    manager = None
    try:
        if config.pipelines:
            from flight_serve.flight.actions import register_pipeline_actions
            from flight_serve.pipelines.manager import PipelineManager

            manager = PipelineManager(
                store,
                data_dir,
                plugins=service.plugins,
                sandbox=config.python_sandbox(),
                ray_address=config.ray_address,
                stream_server=(_reachable(service.location), job_token)
                if config.ray_address is not None
                else None,
            )
            register_pipeline_actions(service.register_action, manager)
            service.pipeline_manager = manager
            if service.memory_budget is not None:
                service.memory_budget.state_bytes = _window_state_bytes(manager)
            if metrics is not None:
                metrics.watch_pipelines(manager)
            manager.start()
        gate.open()
        yield service
    finally:
        gate.refuse()  # a start that failed half-way: held calls end now (no-op once open)
        try:
            if manager is not None:
                manager.stop()
            service.shutdown()
            service.wait()
        finally:
            store.close()


def _credentials(
    config: ServerConfig,
) -> tuple[Mapping[str, TokenGrant] | None, Mapping[str, str] | None]:
    """``(tokens, users)`` of ``config``: given, or read from ``tokens_file`` then ``users_file``.

    Raises:
        InvalidInputError: a file cannot be read or a line is malformed (naming the line).
    """
    tokens = config.tokens
    if config.tokens_file is not None:
        tokens = load_tokens_file(config.tokens_file)
    users = config.users
    if config.users_file is not None:
        users = load_users_file(config.users_file)
    return tokens, users


def _reachable(location: str) -> str:
    """``location`` as another process reaches it: a wildcard host (``0.0.0.0``, ``::``) is
    this machine's loopback (a job on a cluster of several machines needs the server to
    listen on an address its nodes reach: ``serve --host``)."""
    scheme, _, rest = location.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "[::]", "::", ""):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{port}"


def _window_state_bytes(manager: Any) -> Callable[[], int]:
    """Bytes of window state the running pipelines of ``manager`` hold now
    (:meth:`~flight_serve.pipelines.manager.PipelineManager.window_state_bytes`: their live
    operators' state, not their last checkpoint's size)."""

    def state_bytes() -> int:
        return int(manager.window_state_bytes())

    return state_bytes


def _drain_deadline(timeout_s: float) -> None:
    """Called when the drain after SIGTERM took longer than ``timeout_s``: exit now."""
    log.warning(
        "drain deadline passed: exiting with calls still in flight",
        extra={"drain_timeout_s": timeout_s},
    )
    logging.shutdown()
    os._exit(0)


def serve_forever(
    config: ServerConfig,
    *,
    console_port: int | None = None,
    start_console: Callable[..., Any] | None = None,
) -> int:
    """Run the daemon until SIGTERM or SIGINT; return the process exit code.

    Logs JSON lines to stderr (a ``listening`` line with the ``location``) and prints the
    location on stdout. Returns 0 after a clean shutdown, 1 if the server could not start (the
    data dir is unusable or owned by another server, the port is taken, or ``users_file`` /
    ``tokens_file`` cannot be read). With users (``users_file``: ``user:password`` lines, see
    :func:`flight_serve.flight.ops.auth.load_users_file`) every call needs those credentials;
    without them the server is open, and a warning is logged when it listens beyond loopback.

    The gRPC health service (:class:`~flight_serve.flight.ops.health.HealthServer`) listens on
    ``health_port`` (``None``: the Flight port + 1, or a free port when ``port`` is 0); it answers
    NOT_SERVING from the signal on, while the server drains. Prometheus metrics are served at
    ``/metrics`` on ``metrics_port`` (``None``: the Flight port + 2, or a free port when ``port``
    is 0).

    On SIGTERM / SIGINT: health turns NOT_SERVING, running pipelines checkpoint and stop, the
    server stops accepting calls and waits for the calls in flight. If they have not ended
    after ``drain_timeout_s`` seconds the process logs the fact and exits 0 anyway (every
    acknowledged batch is already durable).

    ``tokens_file`` (:func:`~flight_serve.flight.ops.roles.load_tokens_file`) turns on bearer
    tokens with roles, ``tls`` TLS or mutual TLS. On an address other than loopback the server
    refuses to start (exit 1) without TLS and credentials (tokens or users), unless
    ``insecure_allow_remote``.

    ``memory_budget_bytes`` (waiting up to ``memory_wait_s`` seconds for room) and
    ``statement_timeout_s`` are :mod:`flight_serve.flight.ops.limits`' and
    :mod:`flight_serve.flight.sql.query`'s limits (``None``: none); a DoPut batch above
    ``max_batch_bytes`` (``RecordBatch.nbytes``) is INVALID_ARGUMENT. All the settings are
    :class:`~flight_serve.flight.config.ServerConfig`'s.

    With ``start_console`` (:func:`flight_serve.console.start_console`, passed in by the CLI:
    the console sits above this package) the web console listens on ``console_port``
    (``None``: the Flight port + 3, or a free port when ``port`` is 0) with the server's tokens,
    users and TLS; the ``listening`` line gives its ``console_url``.
    """
    configure_json_logging()
    host, port, data_dir = config.host, config.port, Path(config.data_dir)
    try:
        tokens, users = _credentials(config)
    except FlightServeError as exc:
        log.error("cannot serve: %s", exc, extra={"error_class": type(exc).__name__})
        return 1
    if users is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "open server: no --users-file, so anyone who can reach %s may read and write",
            host,
            extra={"host": host},
        )
    loopback = host in ("localhost", "::1", "[::1]") or host.startswith("127.")
    unprotected = config.tls is None or (tokens is None and users is None)
    if not loopback and unprotected and not config.insecure_allow_remote:
        log.error(
            "refusing to listen on %s without TLS and credentials (--tls-cert/--tls-key, and "
            "--tokens-file or --users-file); pass --insecure-allow-remote to do it anyway",
            host,
            extra={"host": host},
        )
        return 1
    defaults = (  # the ports that follow the Flight port, where none was given
        ("health", "--health-port", 1, config.health_port),
        ("metrics", "--metrics-port", 2, config.metrics_port),
        ("console", "--console-port", 3, console_port if start_console is not None else 0),
    )
    for what, flag, step, given in defaults:
        if port and given is None and port + step > 65535:
            log.error(
                "cannot serve: the %s port is the Flight port + %d = %d by default, beyond 65535: "
                "give %s (0 picks a free one), or a lower --port",
                what,
                step,
                port + step,
                flag,
                extra={"port": port},
            )
            return 1
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    health: HealthServer | None = None
    console: Any = None
    watchdog: threading.Timer | None = None
    metrics = config.metrics if config.metrics is not None else Metrics()
    budget = config.memory_budget
    if config.memory_budget_bytes is not None:
        budget = MemoryBudget(config.memory_budget_bytes, wait_s=config.memory_wait_s)
        metrics.watch_budget(budget)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        resolved = replace(  # the files read, the budget made: start_server takes the objects
            config,
            users=users,
            users_file=None,
            tokens=tokens,
            tokens_file=None,
            metrics=metrics,
            memory_budget=budget,
            memory_budget_bytes=None,
        )
        with start_server(resolved) as service:
            health_port = config.health_port
            if health_port is None:
                health_port = service.port + 1 if port else 0
            health = HealthServer(host, health_port, data_dir, flight_port=service.port)
            metrics_port = config.metrics_port
            if metrics_port is None:
                metrics_port = service.port + 2 if port else 0
            metrics.serve_http(host, metrics_port)
            if start_console is not None:
                if console_port is None:
                    console_port = service.port + 3 if port else 0
                console = start_console(
                    service, host, console_port, tokens=tokens, users=users, tls=config.tls
                )
            log.info(
                "listening",
                extra={
                    "location": service.location,
                    "health_port": health.port,
                    "metrics_port": metrics.http_port,
                    **(
                        {"console_port": console.port, "console_url": console.url}
                        if console is not None
                        else {}
                    ),
                    "data_dir": str(data_dir),
                    "fsync": config.fsync,
                },
            )
            print(service.location, flush=True)
            next_retention = time.monotonic() + 60.0
            while not stop.wait(0.5):
                if config.retention_age is not None and time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + 60.0
                    try:
                        service.store.enforce_retention()
                    except FlightServeError:
                        log.exception("retention failed")
            health.set_draining()  # NOT_SERVING while pipelines checkpoint and calls drain
            if console is not None:  # before the store and the pipelines close
                console.stop()
                console = None
            log.info(
                "shutting down",
                extra={
                    "signal": received[0] if received else None,
                    "drain_timeout_s": config.drain_timeout_s,
                },
            )
            drain = config.drain_timeout_s
            watchdog = threading.Timer(drain, _drain_deadline, (drain,))
            watchdog.daemon = True
            watchdog.start()
    except (FlightServeError, pa.ArrowException, OSError) as exc:
        # The store could not open the data dir, or gRPC could not bind (port in use).
        log.error("cannot serve: %s", exc, extra={"error_class": type(exc).__name__})
        return 1
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if console is not None:
            console.stop()
        if health is not None:
            health.stop()
        metrics.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped")
    return 0
