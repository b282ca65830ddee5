"""Fixtures shared by every test directory (the integration ones add theirs in
``integration/conftest.py``; plain helpers are in ``helpers.py``).

``data_dir``: ``tmp_path / "data"``, not created (the store creates it).

``start_flight_server``: ``start(data=None, **options)`` starts an in-process flight-serve
server (``flight_serve.flight.server.start_server``) on ``data`` (default ``data_dir``) with
``options`` as ``start_server`` takes them (``pipelines``, ``fsync``, ``tokens``, ``tls``,
``users``, ``metrics``, ``max_batch_bytes``, ``memory_budget``, ...) and returns the running
service; every server it started stops when the test ends.

``server``: one such server with the defaults (pipelines on, ``fsync="batch"``, port 0);
``client``: a ``pyarrow.flight`` client connected to it.

``module_server``: one default server for a whole test module, on its own data directory
(for Hypothesis tests, whose examples share the fixtures of their test, and for tests that
only read what they wrote themselves).

``store``: a ``StreamStore`` on ``data_dir`` with ``fsync="never"``; ``open_store(**options)``
opens more (or one with other options) on ``data_dir``, all closed when the test ends.

``ray_session``: one local Ray for the whole test session (``start_ray``: ``num_cpus=2``, no
dashboard, 127.0.0.1, Ray's failure signal handler off; about 3-6 s), started by the first test
that asks for it (tests marked ``ray``); they skip, naming the ``ray`` extra, when Ray is not installed.

flight_serve is imported inside the fixtures, so a unit test that uses none of them does not
import the Flight server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight
import pytest

if TYPE_CHECKING:
    from flight_serve.flight.service import FlightServeService
    from flight_serve.store import StreamStore


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory for a server or a store (``tmp_path / "data"``, not created)."""
    return tmp_path / "data"


@pytest.fixture
def start_flight_server(data_dir: Path) -> Iterator[Callable[..., FlightServeService]]:
    """``start(data=None, **options) -> FlightServeService``: a running in-process server."""
    from flight_serve.flight.server import start_server

    with contextlib.ExitStack() as servers:

        def start(data: Path | None = None, **options: Any) -> FlightServeService:
            service: FlightServeService = servers.enter_context(
                start_server(data_dir if data is None else data, **options)
            )
            return service

        yield start


@pytest.fixture
def server(start_flight_server: Callable[..., FlightServeService]) -> FlightServeService:
    """A running flight-serve server with the default options, on ``data_dir``."""
    return start_flight_server()


@pytest.fixture
def client(server: FlightServeService) -> Iterator[flight.FlightClient]:
    """A Flight client connected to ``server``."""
    with flight.connect(server.location) as c:
        yield c


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlightServeService]:
    """One running flight-serve server with the default options for the whole module."""
    from flight_serve.flight.server import start_server

    with start_server(tmp_path_factory.mktemp("module") / "data") as service:
        yield service


@pytest.fixture
def open_store(data_dir: Path) -> Iterator[Callable[..., StreamStore]]:
    """``open_store(**options) -> StreamStore`` on ``data_dir``; closed when the test ends."""
    from flight_serve.store import StreamStore

    with contextlib.ExitStack() as stores:

        def open_(**options: Any) -> StreamStore:
            return stores.enter_context(StreamStore(data_dir, **options))

        yield open_


@pytest.fixture
def store(open_store: Callable[..., StreamStore]) -> StreamStore:
    """A ``StreamStore`` on ``data_dir`` that never fsyncs (the tests do not crash the host)."""
    return open_store(fsync="never")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    ray = pytest.importorskip(
        "ray", reason="the ray tests need the ray extra: pip install 'flight-serve[ray]'"
    )
    from flight_serve.pipelines.distributed.ray_runtime import start_ray

    # start_ray turns off Ray's failure signal handler: with it on, any WebAssembly trap in a
    # later test of this process killed pytest with SIGILL (the CI run of stop 23).
    start_ray(ray)
    try:
        yield ray
    finally:
        ray.shutdown()
