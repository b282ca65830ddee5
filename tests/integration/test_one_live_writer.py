"""One writer name, one live writer: two writers of a stream under one name would put every
result in it twice as one watermark partition (submitting one file twice, or running a server
pipeline's file with ``flight-serve run`` while the server runs it). Against a real
``flight-serve serve`` subprocess and the real CLI.

Times are integer seconds since the epoch (``timestamp[s]``); a row is (k, t, v).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers import act, rows_of, wait_until

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
COUNTS = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
INSERT INTO counts
SELECT k, window_start, window_end, count(*) AS n
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def batch(*rows: tuple[str, int, int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": k, "t": t, "v": v} for k, t, v in rows], schema=SCHEMA)


# Private: a `flight-serve serve` process (its pid and data dir are under test), not the shared in-process server.
@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """``(location, data dir, pid)`` of a ``flight-serve serve`` subprocess."""
    data = tmp_path / "flight-data"  # serve's default, in the directory the runs start in
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    location = proc.stdout.readline().strip()
    assert location, "the server did not start"
    try:
        yield location, data, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "FLIGHT_SERVE_TOKEN": ""},
    )  # fmt: skip


def put(location: str, stream: str, *batches: pa.RecordBatch, writer: str | None = None) -> None:
    path = (stream,) if writer is None else (stream, writer)
    with flight.connect(location) as client:
        w, reader = client.do_put(flight.FlightDescriptor.for_path(*path), SCHEMA)
        with w:
            for b in batches:
                w.write_batch(b)
                reader.read()


def doput_error(
    client: flight.FlightClient, stream: str, writer: str, data: pa.RecordBatch
) -> str | None:
    """The INVALID_ARGUMENT message of a DoPut of ``data`` as ``writer``, or ``None``."""
    w, r = client.do_put(flight.FlightDescriptor.for_path(stream, writer), data.schema)
    try:
        w.write_batch(data)
        r.read()
        w.close()
    except pa.ArrowInvalid as exc:
        return str(exc)
    return None


def test_a_second_submit_of_one_file_is_refused_unless_renamed_or_replacing(
    server: tuple[str, Path, int], tmp_path: Path
) -> None:
    location, _, _ = server
    (tmp_path / "counts.sql").write_text(COUNTS)
    first = cli("submit", "counts.sql", "--server", location, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    pid = first.stdout.strip()
    assert re.fullmatch(r"counts-[0-9a-f]{8}", pid)

    again = cli("submit", "counts.sql", "--server", location, cwd=tmp_path)
    assert again.returncode == 1
    assert again.stdout == ""
    assert (
        f"a pipeline named 'counts' is already running ({pid}); submit it under another name "
        "(flight-serve submit --name NEW"
    ) in again.stderr
    # a new name is another pipeline, but its sink would write counts as writer counts too
    renamed = cli("submit", "counts.sql", "--server", location, "--name", "copy", cwd=tmp_path)
    assert renamed.returncode == 1
    assert (
        f"SINK counts: stream 'counts': writer 'counts' is already being written by pipeline "
        f"{pid}; one writer name has one live writer at a time"
    ) in renamed.stderr
    listed = act(location, "pipeline.list", {})["pipelines"]
    assert [(p["id"], p["state"]) for p in listed] == [(pid, "running")]

    replaced = cli("submit", "counts.sql", "--server", location, "--replace", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    new = replaced.stdout.strip()
    states = {p["id"]: p["state"] for p in act(location, "pipeline.list", {})["pipelines"]}
    assert states == {pid: "cancelled", new: "running"}
    # one writer of the results: every window once
    put(location, "events", batch(("a", 1, 1), ("a", 2, 2)), batch(("a", 15, 3)))
    wait_until(lambda: len(rows_of(location, "counts")) >= 1, "the window [0, 10)")
    time.sleep(1.5)  # a second writer would have committed its copy by now (1 s interval)
    assert [(r["k"], r["n"]) for r in rows_of(location, "counts")] == [("a", 2)]


def test_a_second_live_doput_of_one_writer_name_is_refused_naming_the_holder(
    server: tuple[str, Path, int],
) -> None:
    location, _, _ = server
    with flight.connect(location) as first, flight.connect(location) as second:
        w1, r1 = first.do_put(flight.FlightDescriptor.for_path("events", "sensor-7"), SCHEMA)
        w1.write_batch(batch(("a", 1, 1)))
        assert json.loads(r1.read().to_pybytes()) == {"offset": 0, "rows": 1}
        message = doput_error(second, "events", "sensor-7", batch(("a", 2, 2)))
        assert message is not None
        assert (
            "stream 'events': writer 'sensor-7' is already being written by a DoPut from "
            in message
        )
        assert re.search(r"from ipv[46]:\S+ since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00;", message)
        # another name, and the unnamed writer, are other writers: accepted meanwhile
        put(location, "events", batch(("b", 3, 3)), writer="sensor-8")
        put(location, "events", batch(("c", 4, 4)))
        w1.write_batch(batch(("a", 5, 5)))
        assert json.loads(r1.read().to_pybytes())["rows"] == 1
        w1.done_writing()
        w1.close()
    put(location, "events", batch(("a", 6, 6)), writer="sensor-7")  # the first call ended
    assert [(r["k"], r["v"]) for r in rows_of(location, "events")] == [
        ("a", 1), ("b", 3), ("c", 4), ("a", 5), ("a", 6)
    ]  # fmt: skip


def test_a_doput_under_a_running_pipelines_sink_writer_is_refused(
    server: tuple[str, Path, int],
) -> None:
    location, _, _ = server
    pid = act(location, "pipeline.submit", {"sql": COUNTS, "name": "counts"})["id"]
    schema = pa.schema(
        [("k", pa.string()), ("window_start", pa.timestamp("s")),
         ("window_end", pa.timestamp("s")), ("n", pa.int64())]
    )  # fmt: skip
    row = pa.RecordBatch.from_pylist(
        [{"k": "x", "window_start": 0, "window_end": 10, "n": 99}], schema=schema
    )

    def refused() -> str | None:
        with flight.connect(location) as client:
            return doput_error(client, "counts", "counts", row)

    message = refused()  # the submit's answer came after the pipeline took its writer
    assert message is not None
    assert (
        f"stream 'counts': writer 'counts' is already being written by pipeline {pid}; "
        in message
    )
    assert rows_of(location, "counts") == []
    act(location, "pipeline.cancel", {"id": pid})
    assert refused() is None  # a cancelled pipeline lets go of its writer
    assert [r["n"] for r in rows_of(location, "counts")] == [99]


def test_run_never_writes_into_a_server_the_file_does_not_name(
    server: tuple[str, Path, int], tmp_path: Path
) -> None:
    location, data, server_pid = server
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.csv").write_text("k,t,v\na,1970-01-01 00:00:01,1\n")
    file_source = (
        "CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)\n"
        "WITH (connector = 'file', path = 'in/events.csv');\n"
    )
    query = (
        "INSERT INTO counts SELECT k, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;\n"
    )
    # the server runs the pipeline writing its stream counts as writer counts
    pid = act(location, "pipeline.submit", {"sql": COUNTS, "name": "counts"})["id"]

    # 1. the same sink without a server option: refused, nothing is sent anywhere
    (tmp_path / "unnamed.sql").write_text(
        file_source + "CREATE SINK counts WITH (connector = 'flight', stream = 'counts');\n" + query
    )
    run = cli("run", "unnamed.sql", cwd=tmp_path)
    assert run.returncode == 1
    assert (
        "SINK counts: a run in this process writes only into a server the pipeline names: add "
        "server = 'grpc://127.0.0.1:8815'"
    ) in run.stderr
    # 2. naming the server: the server pipeline holds writer counts of stream counts
    (tmp_path / "named.sql").write_text(
        file_source
        + f"CREATE SINK counts WITH (connector = 'flight', server = '{location}', "
        "stream = 'counts');\n"
        + query
    )
    run = cli("run", "named.sql", cwd=tmp_path)
    assert run.returncode == 1
    assert (
        f"stream 'counts': writer 'counts' is already being written by pipeline {pid}"
        in run.stderr
    )
    assert rows_of(location, "counts") == []
    # 3. an Iceberg sink into the embedded catalog of the server's data dir: refused
    (tmp_path / "lake.sql").write_text(
        file_source
        + "CREATE SINK counts WITH (connector = 'iceberg', table = 'db.counts');\n"
        + query
    )
    run = cli("run", "lake.sql", cwd=tmp_path)  # its catalog: ./flight-data, the server's
    assert run.returncode == 1
    assert (
        f"SINK counts: the embedded Iceberg catalog of {data} belongs to a running server "
        f"(process {server_pid} holds the data dir)"
    ) in run.stderr
