"""A server without ``--ray-address`` on a data directory with a running Ray pipeline must not
act on it: ``cancel`` used to mark it ``cancelled`` and remove its checkpoints while the job went
on running on the cluster (its detached coordinator was never removed, and no server followed it
again); ``update`` said it was "starting; ask again once it runs", which it never would.

Reproduction by hand (found with ``flight-serve serve --ray-address``):

1. ``serve --ray-address H:P``; ``submit`` a file with ``SET parallelism = 2``; stop the server.
2. ``serve`` on the same ``--data-dir`` without ``--ray-address``; ``pipelines cancel ID``:
   ``state=cancelled``, yet ``ray.util.list_named_actors(all_namespaces=True)`` still lists
   ``pipeline-…-ID-v1``, which goes on writing the sink and re-creates
   ``<data-dir>/checkpoints/ID``; once finished its actor stays forever.

Also: the CLI printed ``cannot reach a server at grpc://…`` for any UNAVAILABLE answer, hiding
flight-serve's own message (here: the Ray cluster is down) behind a wrong one; and a
``--ray-address`` where nothing listens held ``pipeline.submit`` in ``ray.init`` for minutes
(the client's 60 s deadline came first).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from flight_serve.errors import ExternalError, InvalidInputError
from flight_serve.pipelines.distributed.jobs import _check_reachable
from flight_serve.pipelines.manager import PipelineManager
from flight_serve.store import StreamStore

SQL = "SET parallelism = 2;\nSELECT 1"


def _manager(store: StreamStore, data: Path) -> tuple[PipelineManager, str]:
    manager = PipelineManager(store, data)  # no ray_address
    record = manager.registry.add("p-ray", "p", SQL, str(data), str(data / "out"), runtime="ray")
    (data / "checkpoints" / record.id).mkdir(parents=True)
    return manager, record.id


def test_a_server_without_ray_address_refuses_to_cancel_or_update_a_ray_pipeline(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with StreamStore(data, fsync="never") as store:
        manager, pid = _manager(store, data)
        try:
            manager.start()  # logs that it does not follow the job
            with pytest.raises(InvalidInputError, match="without --ray-address"):
                manager.cancel(pid)
            with pytest.raises(InvalidInputError, match="without --ray-address"):
                manager.update(pid, SQL.replace("= 2", "= 3"))
            with pytest.raises(InvalidInputError, match="runs on Ray"):
                manager.checkpoint(pid)
            with pytest.raises(InvalidInputError, match="without --ray-address"):
                manager.submit("SELECT 1", name="p", replace=True)
            assert manager.registry.get(pid).state == "running"  # a --ray-address server follows it
            assert (data / "checkpoints" / pid).is_dir()  # its checkpoints are kept
        finally:
            manager.stop()


def test_a_ray_address_where_nothing_listens_is_refused_at_once() -> None:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ExternalError, match=f"nothing answers at 127.0.0.1:{port}"):
        _check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(ExternalError, match="nothing answers"):
        _check_reachable(f"ray://127.0.0.1:{port}")
    _check_reachable("auto")  # left to Ray


LIVE = (
    "CREATE SOURCE events (k VARCHAR, t TIMESTAMP(3), WATERMARK FOR t AS t) "
    "WITH (connector = 'flight', stream = 'events');\n"
    "CREATE SINK counts WITH (connector = 'flight', stream = 'counts');\n"
    "INSERT INTO counts SELECT k, window_start, window_end, count(*) AS n "
    "FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;\n"
)


def test_an_update_does_not_move_a_pipeline_of_the_server_to_ray(tmp_path: Path) -> None:
    """On a ``--ray-address`` server, a pipeline submitted at parallelism 1 runs in the server;
    an update to ``SET parallelism = 3`` is refused by name (it used to make version 2 at
    parallelism 1 in the server, silently), and version 1 goes on."""
    data = tmp_path / "data"
    with StreamStore(data, fsync="never") as store:
        manager = PipelineManager(store, data, ray_address="127.0.0.1:1")  # never reached
        try:
            pid = manager.submit(LIVE, name="live")["id"]
            with pytest.raises(InvalidInputError, match="does not move it to Ray"):
                manager.update(pid, "SET parallelism = 3;\n" + LIVE)
            record = manager.registry.get(pid)
            assert (record.state, record.version, record.runtime) == ("running", 1, "embedded")
        finally:
            manager.stop()
