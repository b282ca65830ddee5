"""``flight-serve streams list | show | tail | put | drop``, ``query``, ``pipelines top`` and
``pipelines logs --follow`` as a user runs them (subprocesses) against a real in-process server
with bearer tokens (``$FLIGHT_SERVE_TOKEN``), and one over TLS with ``--tls-ca``."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flight_serve.flight.ops.roles import TlsFiles, TokenGrant
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve_client import FlightServeClient

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
TOKENS = {
    "admin-token": TokenGrant(frozenset({"read", "write", "admin"}), "ops"),
    "read-token": TokenGrant(frozenset({"read"}), "reader"),
}
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
ROWS = [{"k": "a", "t": 1_700_000_000 + i, "v": i} for i in range(5)]


def cli(*args: str, token: str | None = "admin-token", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
    if token is not None:
        env["FLIGHT_SERVE_TOKEN"] = token
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FlightServeService]:
    with start_server(tmp_path / "data", tokens=TOKENS) as service:
        with FlightServeClient(service.location, token="admin-token") as client:
            client.put("events", pa.Table.from_pylist(ROWS, schema=SCHEMA), batch_rows=2)
        yield service


def test_streams_list_show_tail(server: FlightServeService) -> None:
    where = ("--server", server.location)
    done = cli("streams", "list", *where, token="read-token")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert lines[0] == ["STREAM", "ROWS", "BYTES", "FIRST", "NEXT"]
    assert lines[-1][0] == "events"
    assert lines[-1][1:2] + lines[-1][3:] == ["5", "0", "3"]
    done = cli("streams", "show", "events", *where, token="read-token")
    assert done.returncode == 0, done.stderr
    shown = done.stdout.splitlines()
    assert shown[:2] == ["name: events", "total_records: 5"]
    assert "schema:" in shown
    assert shown[shown.index("schema:") + 1:shown.index("schema:") + 4] == [
        "  k: string", "  t: timestamp[s]", "  v: int64"
    ]
    done = cli("streams", "tail", "events", "--offset", "1", *where, token="read-token")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"_offset": 1, "k": "a", "t": "2023-11-14T22:13:22", "v": 2},
        {"_offset": 1, "k": "a", "t": "2023-11-14T22:13:23", "v": 3},
        {"_offset": 2, "k": "a", "t": "2023-11-14T22:13:24", "v": 4},
    ]
    done = cli("streams", "tail", "events", "--last", "1", *where, token="read-token")
    assert [json.loads(line)["v"] for line in done.stdout.splitlines()] == [4]


def test_streams_put_and_drop(server: FlightServeService, tmp_path: Path) -> None:
    where = ("--server", server.location)
    (tmp_path / "more.csv").write_text("k,n\nx,1\ny,2\nz,3\n")
    done = cli("streams", "put", "more", str(tmp_path / "more.csv"), *where)
    assert (done.returncode, done.stderr) == (0, "appended 3 rows to more (last offset 0)\n")
    with FlightServeClient(server.location, token="read-token") as client:
        assert client.query("SELECT k, n FROM more ORDER BY k").to_pylist() == [
            {"k": "x", "n": 1}, {"k": "y", "n": 2}, {"k": "z", "n": 3}
        ]
    done = cli("streams", "drop", "more", *where, token="read-token")
    assert done.returncode == 1
    assert "admin" in done.stderr
    done = cli("streams", "drop", "more", *where)
    assert (done.returncode, done.stderr) == (0, "dropped more\n")
    done = cli("streams", "show", "more", *where)
    assert done.returncode == 1
    assert done.stderr.startswith("flight-serve: ")
    assert "more" in done.stderr
    done = cli("streams", "list", *where, token="wrong")
    assert done.returncode == 1
    assert done.stderr.startswith("flight-serve: ")


def test_query_formats(server: FlightServeService, tmp_path: Path) -> None:
    where = ("--server", server.location)
    sql = "SELECT k, count(*) AS n, sum(v) AS total FROM events GROUP BY k"
    done = cli("query", sql, *where, token="read-token")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert lines[0] == ["k", "n", "total"]
    assert lines[2:] == [["a", "5", "10"], ["(1", "row)"]]
    done = cli("query", sql, "--format", "csv", *where, token="read-token")
    assert list(csv.reader(io.StringIO(done.stdout))) == [["k", "n", "total"], ["a", "5", "10"]]
    done = cli("query", sql, "--format", "json", *where, token="read-token")
    assert done.stdout == '{"k": "a", "n": 5, "total": 10}\n'
    out = tmp_path / "r.parquet"
    done = cli("query", sql, "--format", "parquet", "--out", str(out), *where, token="read-token")
    assert (done.returncode, done.stderr) == (0, f"wrote 1 row to {out}\n")
    assert pq.read_table(out).to_pylist() == [{"k": "a", "n": 5, "total": 10}]
    for fmt, want in (("csv", '"k","n","total"\n"a",5,10\n'), ("json", '{"k": "a", "n": 5, "total": 10}\n')):
        out = tmp_path / f"r.{fmt}.out"  # --format wins over the file's suffix
        done = cli("query", sql, "--format", fmt, "--out", str(out), *where, token="read-token")
        assert (done.returncode, done.stdout, done.stderr) == (0, "", f"wrote 1 row to {out}\n")
        assert out.read_text() == want
    out = tmp_path / "r.csv"  # without --format: the file's suffix
    done = cli("query", sql, "--out", str(out), *where, token="read-token")
    assert (done.returncode, out.read_text()) == (0, '"k","n","total"\n"a",5,10\n')
    done = cli("query", sql, "--format", "parquet", *where, token="read-token")
    assert (done.returncode, done.stderr) == (1, "flight-serve: --format parquet needs --out FILE\n")
    done = cli("query", "SELECT * FROM nope", *where, token="read-token")
    assert done.returncode == 1
    assert "nope" in done.stderr


PIPELINE = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
INSERT INTO counts SELECT k, window_start, window_end, count(*) AS n
FROM TUMBLE(events, t, INTERVAL '2' SECOND) GROUP BY k, window_start, window_end;
"""


def test_pipelines_top_and_logs_follow(server: FlightServeService, tmp_path: Path) -> None:
    import time

    (tmp_path / "p.sql").write_text(PIPELINE)
    where = ("--server", server.location)
    done = cli("submit", str(tmp_path / "p.sql"), *where)
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    deadline = time.monotonic() + 30
    while True:
        status = json.loads(cli("pipelines", "status", pid, "--json", *where).stdout)
        if status["rows_in"] == 5 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status["rows_in"] == 5
    done = cli("pipelines", "top", "--iterations", "2", "--interval", "0.2", *where,
               token="read-token")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    headers = ["ID", "STATE", "WATERMARK", "LAG", "ROWS/S", "ROWS", "IN", "LATE", "CHECKPOINT",
               "WAITING"]  # fmt: skip
    assert [line for line in lines if line[0] == "ID"] == [headers, headers]  # two refreshes
    rows = [line for line in lines if line[0] == pid]
    assert len(rows) == 2
    assert rows[0][1:3] == ["running", status["watermark"]]
    assert rows[0][5:7] == ["5", "0"]  # rows in, late rows
    assert rows[0][4] == "-"  # no rate before a second refresh
    assert rows[1][4] == "0.0"  # nothing read between the two
    follow = subprocess.Popen(
        [str(CLI), "pipelines", "logs", pid, "--follow", "--interval", "0.2", *where],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")},
             "FLIGHT_SERVE_TOKEN": "admin-token"},
    )  # fmt: skip
    time.sleep(1.5)
    assert follow.poll() is None  # still following a running pipeline
    done = cli("pipelines", "cancel", pid, *where)
    assert done.returncode == 0, done.stderr
    out, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    messages = [line.split(": ", 1)[1] for line in out.splitlines()]
    assert messages[0] == "submitted"
    assert messages[-2:] == ["cancelled", messages[-1]]
    assert messages[-1].startswith("checkpoints removed")


def test_tls_with_tls_ca(tmp_path: Path, pki: Path) -> None:
    tls = TlsFiles(pki / "server.pem", pki / "server.key")
    with start_server(tmp_path / "data", tls=tls) as service:
        with FlightServeClient(service.location, tls_ca=pki / "ca.pem") as client:
            client.put("events", pa.Table.from_pylist(ROWS, schema=SCHEMA))
        done = cli("query", "SELECT count(*) AS n FROM events", "--format", "json",
                   "--server", service.location, "--tls-ca", str(pki / "ca.pem"), token=None)  # fmt: skip
        assert (done.returncode, done.stdout) == (0, '{"n": 5}\n')
        done = cli("streams", "list", "--server", service.location, token=None)
        assert done.returncode == 1
        assert done.stderr.splitlines()[-1] == (
            f"flight-serve: cannot reach a server at {service.location} (a TLS server: --tls-ca "
            "names the CA of its certificate; a mutual-TLS server also needs --tls-cert and "
            "--tls-key)"
        )


def test_ctrl_c_ends_a_tail_follow(server: FlightServeService) -> None:
    """``streams tail -f`` waits in pyarrow's DoGet read (C++), where Python's Ctrl-C handler
    never runs: Ctrl-C used to leave it running for good. Now Ctrl-C ends it as it ends
    ``tail -f``: killed by SIGINT (the shell's 130), every line printed before it kept."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
    env["FLIGHT_SERVE_TOKEN"] = "read-token"
    tail = subprocess.Popen(
        [str(CLI), "streams", "tail", "events", "-f", "--offset", "0", "--server",
         server.location],
        stdout=subprocess.PIPE, text=True, env=env,
        # as on a terminal: SIGINT handled (a background job of a script would ignore it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert tail.stdout is not None
        lines = [json.loads(tail.stdout.readline()) for _ in ROWS]  # then it waits for more
        assert [line["v"] for line in lines] == [0, 1, 2, 3, 4]
        time.sleep(1)  # it is in the DoGet read now, waiting for the next entry
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=15) == -signal.SIGINT
        assert tail.stdout.read() == ""
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
        if tail.stdout is not None:
            tail.stdout.close()
