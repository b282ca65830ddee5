"""A server pipeline's life to its end: its inputs end, its stream sinks mark their writers'
end of input (so a pipeline chained on its output closes its last windows) and it goes
``finished``; an ended pipeline has no per-pipeline metrics and no checkpoints; status right
after submit says what it waits for; the server log names the pipelines it resumed. Against a
real ``flight-serve serve`` subprocess.

Times are integer seconds since the epoch (``timestamp[s]``); a row is (k, t, v).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers import act, free_port, rows_of, scrape_metrics, wait_until

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
# A: per-row relay of events into stream a_out (writer a_out); B: 10 s windows over a_out
A = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT)
WITH (connector = 'flight', stream = 'events');
CREATE SINK a_out WITH (connector = 'flight', stream = 'a_out');
INSERT INTO a_out SELECT k, t, v * 10 AS v FROM events;
"""
B = """
CREATE SOURCE a_out (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'a_out');
CREATE SINK b_out WITH (connector = 'flight', stream = 'b_out');
INSERT INTO b_out SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(a_out, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


# Private: `flight-serve serve` as a process that a test stops and starts again over the same data dir, with a
# metrics port and a JSON log the tests read; the shared fixtures serve in-process.
class Server:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.log = data.parent / "server.log"
        self.proc: subprocess.Popen[str] | None = None
        self.location = ""
        self.metrics_port = 0

    def start(self) -> None:
        self.metrics_port = free_port()
        with self.log.open("a") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [str(CLI), "serve", "--port", "0", "--data-dir", str(self.data),
                 "--metrics-port", str(self.metrics_port)],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
        assert self.proc.stdout is not None
        self.location = self.proc.stdout.readline().strip()
        assert self.location, "the server did not start"

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(60) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self.proc = None

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "data")
    s.start()
    try:
        yield s
    finally:
        s.stop()


def put(location: str, stream: str, rows: list[tuple[str, int, int]], writer: str) -> None:
    data = pa.RecordBatch.from_pylist(
        [{"k": k, "t": t, "v": v} for k, t, v in rows], schema=SCHEMA
    )
    with flight.connect(location) as client:
        w, reader = client.do_put(flight.FlightDescriptor.for_path(stream, writer), SCHEMA)
        with w:
            w.write_batch(data)
            reader.read()


def end_input(location: str, stream: str, writer: str) -> None:
    with flight.connect(location) as client:
        w, reader = client.do_put(flight.FlightDescriptor.for_path(stream, writer), SCHEMA)
        with w:
            w.write_metadata(b'{"end_of_input": true}')
            reader.read()


def writers_of(location: str, stream: str) -> dict[str, Any]:
    with flight.connect(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    return dict(json.loads(info.app_metadata)["writers"])


def state(location: str, pid: str) -> str:
    return str(act(location, "pipeline.status", {"id": pid})["state"])


def pipelines_in(samples: dict[str, dict[frozenset[tuple[str, str]], float]]) -> set[str]:
    return {
        value
        for name, series in samples.items()
        if name.startswith("flight_serve_pipeline_")
        for labels in series
        for key, value in labels
        if key == "pipeline"
    }


def test_a_chained_pipeline_closes_its_last_window_when_the_first_ones_input_ends(
    server: Server,
) -> None:
    loc = server.location
    a = act(loc, "pipeline.submit", {"sql": A, "name": "a"})["id"]
    b = act(loc, "pipeline.submit", {"sql": B, "name": "b"})["id"]
    # writer w: a@1 v=1, a@4 v=2, a@12 v=3 -> A relays v*10 -> B: [0,10) n=2 total=30 closes at
    # W = 12; [10,20) n=1 total=30 stays open until A's writer a_out ends
    put(loc, "events", [("a", 1, 1), ("a", 4, 2)], "w")
    put(loc, "events", [("a", 12, 3)], "w")
    wait_until(lambda: len(rows_of(loc, "b_out")) == 1, "B's first window")
    assert (state(loc, a), state(loc, b)) == ("running", "running")
    assert writers_of(loc, "a_out")["a_out"]["ended_at"] is None

    end_input(loc, "events", "w")  # A's only input writer ends: A's input has ended
    wait_until(lambda: state(loc, a) == "finished", "A to finish")
    wait_until(lambda: state(loc, b) == "finished", "B to finish (its one writer ended)")
    base = datetime(1970, 1, 1)
    assert [(r["k"], r["window_start"], r["n"], r["total"]) for r in rows_of(loc, "b_out")] == [
        ("a", base.replace(second=0), 2, 30),
        ("a", base.replace(second=10), 1, 30),
    ]
    a_writer = writers_of(loc, "a_out")["a_out"]
    assert a_writer["ended_at"] == a_writer["last_offset"]  # A's end-of-input marker, once
    assert writers_of(loc, "b_out")["b_out"]["ended_at"] is not None
    status = act(loc, "pipeline.status", {"id": a})
    assert (status["rows_in"], status["rows_out"], status["waiting"]) == (3, {"a_out": 3}, None)


def test_status_right_after_submit_says_what_it_waits_for(server: Server) -> None:
    loc = server.location
    pid = act(loc, "pipeline.submit", {"sql": A, "name": "a"})["id"]
    status = act(loc, "pipeline.status", {"id": pid})
    assert status["state"] == "running"
    assert status["waiting"] == "source events: waiting for stream 'events' to be created"
    put(loc, "events", [("a", 1, 1)], "w")
    wait_until(
        lambda: act(loc, "pipeline.status", {"id": pid})["waiting"]
        == "source events: waiting for new entries of stream 'events' (next offset 1)",
        "the status to say the source read every entry",
    )


def test_an_ended_pipeline_has_no_metrics_and_no_checkpoints_and_restarts_name_the_resumed(
    server: Server,
) -> None:
    loc = server.location
    cancelled = act(loc, "pipeline.submit", {"sql": A, "name": "a"})["id"]
    running = act(loc, "pipeline.submit", {"sql": B, "name": "b"})["id"]
    put(loc, "events", [("a", 1, 1)], "w")
    wait_until(lambda: len(rows_of(loc, "a_out")) == 1, "A's relayed row")
    act(loc, "pipeline.checkpoint", {"id": cancelled})
    checkpoints = server.data / "checkpoints"
    assert (checkpoints / cancelled).is_dir()
    assert {cancelled, running} <= pipelines_in(scrape_metrics(server.metrics_port))

    assert act(loc, "pipeline.cancel", {"id": cancelled}) == {"id": cancelled, "state": "cancelled"}
    samples = scrape_metrics(server.metrics_port)
    assert pipelines_in(samples) == {running}
    assert samples["flight_serve_pipeline_rows_in_total"] == {
        frozenset({("pipeline", running)}): pytest.approx(
            act(loc, "pipeline.status", {"id": running})["rows_in"]
        )
    }
    assert not (checkpoints / cancelled).exists()
    assert (checkpoints / running).is_dir()
    messages = [line["message"] for line in act(loc, "pipeline.logs", {"id": cancelled})["lines"]]
    assert messages[-1] == f"checkpoints removed ({checkpoints / cancelled})"

    server.stop()
    server.log.write_text("")  # the second start's lines only
    server.start()

    def resumed_lines() -> list[dict[str, Any]]:
        return [line for line in server.log_lines() if line["msg"].startswith("resumed ")]

    wait_until(lambda: bool(resumed_lines()), "the server's resumed line")
    resumed = resumed_lines()
    assert [(line["msg"], line["pipelines"]) for line in resumed] == [
        (f"resumed 1 pipeline(s) at start: {running}", [running])
    ]
    assert state(server.location, cancelled) == "cancelled"
