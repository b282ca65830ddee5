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
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import pyarrow as pa

from flight_serve.errors import FlightServeError
from flight_serve.flight.auth import load_users_file
from flight_serve.flight.service import FlightServeService
from flight_serve.store import FsyncMode, StreamStore

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
    data_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    fsync: FsyncMode = "batch",
    pipelines: bool = True,
    **service_options: Any,
) -> Iterator[FlightServeService]:
    """Open the store in ``data_dir``, serve it on ``host:port`` and yield the running service.

    The service has ``.port`` (the real port when ``port=0``), ``.location``
    (``grpc://HOST:PORT``) and ``.store``. On exit the server shuts down (running tails end,
    in-flight calls finish) and the store is closed. ``service_options`` go to
    :class:`~flight_serve.flight.service.FlightServeService` (``max_batch_bytes``, ...).

    With ``pipelines`` (the default) the server runs submitted pipelines
    (:class:`~flight_serve.pipelines.manager.PipelineManager`, the ``pipeline.*`` actions): it
    resumes every ``running`` one at start, and on exit asks each to checkpoint and stop first.

    Raises:
        StorageError: the data directory cannot be opened or another store owns it.
    """
    store = StreamStore(Path(data_dir), fsync=fsync)
    try:
        uri_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        service = FlightServeService(f"grpc://{uri_host}:{port}", store=store, **service_options)
    except BaseException:
        store.close()
        raise
    manager = None
    try:
        if pipelines:
            from flight_serve.flight.pipeline_actions import register_pipeline_actions
            from flight_serve.pipelines.manager import PipelineManager

            manager = PipelineManager(store, Path(data_dir))
            register_pipeline_actions(service, manager)
            manager.start()
        yield service
    finally:
        try:
            if manager is not None:
                manager.stop()
            service.shutdown()
            service.wait()
        finally:
            store.close()


def serve_forever(
    host: str, port: int, data_dir: Path, fsync: FsyncMode, users_file: Path | None = None
) -> int:
    """Run the daemon until SIGTERM or SIGINT; return the process exit code.

    Logs JSON lines to stderr (a ``listening`` line with the ``location``) and prints the
    location on stdout. Returns 0 after a clean shutdown, 1 if the server could not start (the
    data dir is unusable or owned by another server, the port is taken, or ``users_file`` cannot
    be read). With ``users_file`` (``user:password`` lines, see
    :func:`flight_serve.flight.auth.load_users_file`) every call needs those credentials;
    without it the server is open, and a warning is logged when it listens beyond loopback.
    """
    configure_json_logging()
    users = None
    if users_file is not None:
        try:
            users = load_users_file(users_file)
        except FlightServeError as exc:
            log.error("cannot serve: %s", exc, extra={"error_class": type(exc).__name__})
            return 1
    elif host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "open server: no --users-file, so anyone who can reach %s may read and write",
            host,
            extra={"host": host},
        )
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        with start_server(
            Path(data_dir), host=host, port=port, fsync=fsync, users=users
        ) as service:
            log.info(
                "listening",
                extra={"location": service.location, "data_dir": str(data_dir), "fsync": fsync},
            )
            print(service.location, flush=True)
            while not stop.wait(0.5):
                pass
            log.info("shutting down", extra={"signal": received[0] if received else None})
    except (FlightServeError, pa.ArrowException, OSError) as exc:
        # The store could not open the data dir, or gRPC could not bind (port in use).
        log.error("cannot serve: %s", exc, extra={"error_class": type(exc).__name__})
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped")
    return 0
