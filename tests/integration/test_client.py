"""flight_serve_client against a real flight-serve server on a free loopback port.

One server per test (``start_server(tmp_path, port=0)``), a client against it: put → query exact
values, tail seeing later appends, stream_info, list, drop, the error mapping, and DoExchange.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve_client import FlightServeClient
from helpers import free_port

pytestmark = pytest.mark.integration

T0 = datetime(2013, 1, 1, tzinfo=UTC)
SCHEMA = pa.schema(
    [
        pa.field("k", pa.string()),
        pa.field("v", pa.int64()),
        pa.field("t", pa.timestamp("us", tz="UTC")),
    ]
)


def _rows(*rows: tuple[str, int, int]) -> pa.Table:
    """Rows of (key, value, seconds after T0)."""
    return pa.Table.from_pylist(
        [{"k": k, "v": v, "t": T0 + timedelta(seconds=s)} for k, v, s in rows], schema=SCHEMA
    )


def _location(value: object) -> str:
    if isinstance(value, flight.Location):
        return value.uri.decode() if isinstance(value.uri, bytes) else str(value.uri)
    return str(value)


@pytest.fixture
def client(server: FlightServeService) -> Iterator[FlightServeClient]:
    """The Python client (not pyarrow's) connected to the shared ``server``."""
    with FlightServeClient(_location(server.location)) as c:
        yield c


def test_put_then_query_exact_values(client: FlightServeClient) -> None:
    progress: list[int] = []
    table = _rows(("a", 1, 0), ("b", 2, 1), ("c", 3, 2))
    assert client.put("s", table, batch_rows=2, on_progress=progress.append) == 1
    assert progress == [2, 3]
    assert client.put("s", _rows(("d", 4, 3))) == 2
    result = client.query("SELECT k, v, t FROM s ORDER BY v")
    assert result.to_pylist() == [
        {"k": "a", "v": 1, "t": T0},
        {"k": "b", "v": 2, "t": T0 + timedelta(seconds=1)},
        {"k": "c", "v": 3, "t": T0 + timedelta(seconds=2)},
        {"k": "d", "v": 4, "t": T0 + timedelta(seconds=3)},
    ]
    total = client.query("SELECT sum(v) AS total, count(*) AS n FROM s")
    assert total.to_pylist() == [{"total": 10, "n": 4}]
    assert sum(b.num_rows for b in client.query_batches("SELECT * FROM s")) == 4


def test_stream_info_list_and_drop(client: FlightServeClient) -> None:
    client.put("s", _rows(("a", 1, 0), ("b", 2, 1)), batch_rows=1)
    client.put("other", _rows(("x", 9, 0)))
    info = client.stream_info("s")
    assert info["name"] == "s"
    assert info["schema"].names == SCHEMA.names
    assert info["total_records"] == 2
    assert (info["first_offset"], info["next_offset"]) == (0, 2)
    assert "incarnation" in info
    assert client.list_streams() == ["other", "s"]
    client.drop("s")
    assert client.list_streams() == ["other"]
    with pytest.raises(KeyError):
        client.stream_info("s")
    with pytest.raises(KeyError):
        client.drop("s")


def test_tail_sees_later_appends(tmp_path: Path) -> None:
    with start_server(tmp_path / "data", port=0) as service:
        location = _location(service.location)
        with FlightServeClient(location) as writer, FlightServeClient(location) as reader:
            writer.put("s", _rows(("a", 1, 0), ("b", 2, 1)), batch_rows=1)
            seen: queue.Queue[tuple[int, list[str]]] = queue.Queue()
            failures: list[BaseException] = []

            def follow() -> None:
                try:
                    for offset, batch in reader.tail("s", offset=1, follow=True):
                        seen.put((offset, batch.column("k").to_pylist()))
                        if offset == 3:
                            return
                except BaseException as exc:  # pragma: no cover - reported below
                    failures.append(exc)

            thread = threading.Thread(target=follow, daemon=True)
            thread.start()
            assert seen.get(timeout=10) == (1, ["b"])  # existing batches first
            writer.put("s", _rows(("c", 3, 2)))
            assert seen.get(timeout=10) == (2, ["c"])  # then each append as it lands
            writer.put("s", _rows(("d", 4, 3), ("e", 5, 4)))
            assert seen.get(timeout=10) == (3, ["d", "e"])
            thread.join(timeout=10)
            assert not thread.is_alive()
            assert failures == []


#: A user's script: follow ``events`` from 0, printing each batch's ids; on Ctrl-C, say the last
#: offset yielded, wait for a line on stdin, then read the rest from the next offset (no follow).
FOLLOW_SCRIPT = """
import json, sys
from flight_serve_client import FlightServeClient

with FlightServeClient(sys.argv[1]) as client:
    last = -1
    try:
        for offset, batch in client.tail("events", 0, follow=True):
            last = offset
            print(json.dumps({"offset": offset, "ids": batch.column("id").to_pylist()}), flush=True)
    except KeyboardInterrupt:
        print(json.dumps({"interrupted_after": last}), flush=True)
        sys.stdin.readline()
        rest = [i for _, b in client.tail("events", last + 1) for i in b.column("id").to_pylist()]
        print(json.dumps({"rest": rest}), flush=True)
        sys.exit(3)
"""


def test_ctrl_c_ends_a_follow_in_a_users_script_and_a_new_tail_goes_on_exactly_there(
    tmp_path: Path,
) -> None:
    """A follow waits in pyarrow's DoGet read (C++), where Python's Ctrl-C handler never runs:
    a user's script following a stream could not be stopped with Ctrl-C (still running 15 s
    after the SIGINT). Now KeyboardInterrupt comes out of the loop; every batch was yielded
    once, and a tail from the offset after the last one yielded reads the rest, appended before
    and after the interruption, each row once."""
    ids = list(range(50))
    batches = [pa.record_batch({"id": pa.array(ids[i : i + 10], pa.int64())}) for i in ids[::10]]
    script = tmp_path / "follow.py"
    script.write_text(FOLLOW_SCRIPT)
    with start_server(tmp_path / "data", port=0) as service:
        location = _location(service.location)
        with FlightServeClient(location) as writer:
            writer.put("events", batches[:3], batch_rows=10)  # offsets 0, 1, 2
            follow = subprocess.Popen(
                [sys.executable, str(script), location],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                # as on a terminal: SIGINT handled (a background job of a script ignores it)
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )  # fmt: skip
            try:
                assert follow.stdout is not None
                assert follow.stdin is not None
                lines = [json.loads(follow.stdout.readline()) for _ in range(3)]
                writer.put("events", batches[3:4])  # offset 3, while it follows
                lines.append(json.loads(follow.stdout.readline()))
                assert [line["offset"] for line in lines] == [0, 1, 2, 3]
                time.sleep(1)  # it waits in the DoGet read for offset 4 now
                follow.send_signal(signal.SIGINT)
                # (the old client: no line, still running, and a timeout here)
                assert json.loads(_line_within(follow, 15)) == {"interrupted_after": 3}
                writer.put("events", batches[4:])  # offset 4, after the interruption
                follow.stdin.write("go\n")
                follow.stdin.flush()
                rest = json.loads(_line_within(follow, 15))["rest"]
                assert follow.wait(timeout=15) == 3
                assert [i for line in lines for i in line["ids"]] + rest == ids
            finally:
                if follow.poll() is None:
                    follow.kill()
                    follow.wait()
                for pipe in (follow.stdin, follow.stdout):
                    if pipe is not None:
                        pipe.close()


def _line_within(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The next line ``proc`` prints, failing if none comes within ``timeout_s``."""
    got: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: got.put(stdout.readline()), daemon=True).start()
    try:
        return got.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no line within {timeout_s:g} s (still running)") from None


def test_errors_map_to_pyarrow_exceptions(client: FlightServeClient) -> None:
    client.put("s", _rows(("a", 1, 0)))
    with pytest.raises(pa.ArrowInvalid, match="v"):
        client.put("s", pa.table({"k": ["a"], "v": [1.5]}))  # v retyped, t missing
    with pytest.raises(pa.ArrowInvalid):
        client.query("SELEC k FROM s")
    with pytest.raises(KeyError):
        client.stream_info("missing")


def test_exchange_tumbling_window_with_a_late_row(client: FlightServeClient) -> None:
    # Tumbling 10 s, watermark = max event time (no bound).
    #   batch 0:  a@0 b@5 a@12         -> W = 12 s after it: [0, 10) fires
    #   batch 1:  a@3 (late: 10 <= 12)  b@15
    #   finish:   W = +inf: [10, 20) fires
    sql = (
        "SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total "
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end"
    )
    batches = [
        _rows(("a", 1, 0), ("b", 2, 5), ("a", 3, 12)).to_batches()[0],
        _rows(("a", 10, 3), ("b", 4, 15)).to_batches()[0],
    ]
    events = list(client.exchange(sql, batches))
    assert [e.kind for e in events if e.kind in ("ack", "done")] == ["ack", "ack", "done"]
    first_ack = next(e for e in events if e.kind == "ack")
    assert first_ack.metadata["ack"] == 0
    assert first_ack.metadata["late_rows"] == 0
    assert events[-1].metadata["late_rows"] == 1
    closed_by_batch_0 = [e for e in events if e.kind == "result" and e.input_batch == 0]
    assert sum(e.batch.num_rows for e in closed_by_batch_0 if e.batch is not None) == 2

    results, late = client.exchange_table(sql, pa.Table.from_batches(batches), batch_rows=3)
    got = sorted(
        (r["k"], r["window_start"], r["window_end"], r["n"], r["total"])
        for r in results.to_pylist()
    )
    w0, w1, w2 = (T0 + timedelta(seconds=s) for s in (0, 10, 20))
    assert got == [
        ("a", w0, w1, 1, 1),
        ("a", w1, w2, 1, 3),
        ("b", w0, w1, 1, 2),
        ("b", w1, w2, 1, 4),
    ]
    assert late.num_rows == 1
    assert late.column("k").to_pylist() == ["a"]
    assert late.column("v").to_pylist() == [10]
    assert late.column("_late_reason").to_pylist() == ["late"]


def _serve(data_dir: Path, port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flight_serve.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip().endswith(f":{port}")  # the location: listening
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


@pytest.mark.slow
def test_tail_reconnects_after_the_server_is_killed_and_restarted(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    server = _serve(data_dir, port)
    try:
        with FlightServeClient(f"grpc://127.0.0.1:{port}") as client:
            client.put("s", _rows(("a", 1, 0), ("b", 2, 1)), batch_rows=1)
            tail = client.tail("s", follow=True)
            assert [next(tail)[0], next(tail)[0]] == [0, 1]
            _kill(server)  # no clean shutdown: the tail's connection just drops
            server = _serve(data_dir, port)
            with FlightServeClient(f"grpc://127.0.0.1:{port}") as writer:
                writer.put("s", _rows(("c", 3, 2)))
            offset, batch = next(tail)  # reconnected from offset 1; 1 is not yielded again
            assert (offset, batch.column("k").to_pylist()) == (2, ["c"])
            tail.close()
    finally:
        _kill(server)
