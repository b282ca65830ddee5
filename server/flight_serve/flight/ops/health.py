"""The standard gRPC health service (``grpc.health.v1``) on its own port.

pyarrow's Flight server cannot host another gRPC service on the Flight port, so
``flight-serve serve`` runs :class:`HealthServer` beside it (``--health-port``, by default the
Flight port + 1). It answers ``Check`` and ``Watch`` for the empty service name (the whole server)
and for :data:`FLIGHT_SERVICE_NAME`:

- ``SERVING`` while the server runs and its data directory is writable;
- ``NOT_SERVING`` once :meth:`HealthServer.set_draining` is called (SIGTERM: the server is
  draining and will not accept new work), or while the data directory is not writable (checked
  every ``check_interval_s`` seconds by creating, writing and removing a probe file).

Probe it with any standard client, e.g. ``grpc_health_probe -addr=127.0.0.1:8816``.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import grpc  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

__all__ = ["FLIGHT_SERVICE_NAME", "HealthServer", "data_dir_writable"]

#: The Flight service's full gRPC name, the second name the health service answers for.
FLIGHT_SERVICE_NAME: Final = "arrow.flight.protocol.FlightService"

_SERVICES: Final = ("", FLIGHT_SERVICE_NAME)

log = logging.getLogger("flight_serve.health")


def data_dir_writable(data_dir: Path) -> bool:
    """True when a file can be created, written and removed in ``data_dir``.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     data_dir_writable(Path(d))
    True
    >>> data_dir_writable(Path("/nonexistent/flight-serve"))
    False
    """
    probe = Path(data_dir) / f".health-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError:
        return False
    return True


class _NotFlight(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers every call but the health service's with UNIMPLEMENTED and a message saying that
    this is the health port and which port is the Flight one: a Flight client given the health
    port by mistake reads what to do instead of a bare "Method not found"."""

    def __init__(self, flight_port: int | None) -> None:
        where = f"the Flight port is {flight_port}" if flight_port else "use the Flight port"
        self.message = f"this is flight-serve's health port (grpc.health.v1 only); {where}"

    def service(self, handler_call_details: Any) -> Any:
        if str(handler_call_details.method).startswith("/grpc.health.v1.Health/"):
            return None

        def refuse(requests: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, self.message)

        # one handler kind for every method: on the wire a unary call is a stream of one
        return grpc.stream_stream_rpc_method_handler(refuse)


class HealthServer:
    """A gRPC server carrying only ``grpc.health.v1.Health``.

    Listens on ``host:port`` (``port=0`` picks a free one; :attr:`port` is the real one) from
    construction until :meth:`stop`. Any other call (a Flight client given this port) fails
    UNIMPLEMENTED with a message naming ``flight_port``.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(
        self,
        host: str,
        port: int,
        data_dir: Path,
        check_interval_s: float = 5.0,
        flight_port: int | None = None,
    ) -> None:
        self._data_dir = Path(data_dir)
        self._interval = check_interval_s
        self._draining = False
        self._writable: bool | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._servicer: Any = health.HealthServicer(experimental_non_blocking=True)
        self._server: Any = grpc.server(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="health")
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, self._server)
        self._server.add_generic_rpc_handlers((_NotFlight(flight_port),))
        uri_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        try:
            bound = self._server.add_insecure_port(f"{uri_host}:{port}")
        except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
            raise OSError(f"cannot listen on {uri_host}:{port} for health: {exc}") from None
        if not bound:
            raise OSError(f"cannot listen on {uri_host}:{port} for health")
        self.port: int = bound
        self.check()
        self._server.start()
        self._thread = threading.Thread(target=self._run, name="health-check", daemon=True)
        self._thread.start()

    @property
    def serving(self) -> bool:
        """Whether the health service currently answers ``SERVING``."""
        with self._lock:
            return not self._draining and bool(self._writable)

    def check(self) -> bool:
        """Probe the data directory now and publish the result; return :attr:`serving`."""
        writable = data_dir_writable(self._data_dir)
        with self._lock:
            previous, self._writable = self._writable, writable
        if writable != previous and not writable:
            log.error(
                "data directory is not writable: health NOT_SERVING",
                extra={"data_dir": str(self._data_dir)},
            )
        elif writable != previous and previous is not None:
            log.info("data directory writable again", extra={"data_dir": str(self._data_dir)})
        self._publish()
        return self.serving

    def set_draining(self) -> None:
        """Answer ``NOT_SERVING`` from now on (the server is shutting down)."""
        with self._lock:
            self._draining = True
        self._publish()

    def _publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in _SERVICES:
            self._servicer.set(name, status)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.check()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop answering (open ``Watch`` calls end after ``grace_s`` seconds)."""
        self._stop.set()
        self.set_draining()
        self._server.stop(grace_s).wait()
        self._thread.join()
