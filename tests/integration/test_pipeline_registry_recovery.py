"""The server's pipeline registry after a SIGKILL that falls between a checkpoint's commit and
its record in the registry.

A checkpoint is committed (manifest written, sinks committed) before the registry hears of it;
``FLIGHT_SERVE_CRASH_AT=commit:1`` kills ``flight-serve serve`` exactly there. After the restart
the pipeline resumes from that checkpoint, so ``pipeline.status`` must report it as the last
checkpoint, with the counters taken with it, not ``null``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import helpers
import pyarrow.flight as flight
import pytest
from helpers import wait_until

pytestmark = pytest.mark.integration
act = partial(helpers.act, timeout_s=30)

CLI = Path(sys.executable).parent / "flight-serve"
# A bounded pipeline with no checkpoint on a timer: its one checkpoint is the finished one
# (epoch 1), taken when the file ends and every window has fired.
PIPELINE = """
SET checkpoint_interval = '1h';
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'file', path = 'in/events.csv');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
INSERT INTO counts
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def start(data: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    location = proc.stdout.readline().strip()
    assert location, "the server did not start"
    return proc, location


def test_status_keeps_a_checkpoint_committed_just_before_a_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (tmp_path / "in").mkdir()
    # event time (s): a@1 v=10, a@4 v=5, b@12 v=7; the file's end closes every window:
    # [0,10): a n=2 total=15 | [10,20): b n=1 total=7
    (tmp_path / "in" / "events.csv").write_text(
        "k,t,v\na,1970-01-01 00:00:01,10\na,1970-01-01 00:00:04,5\nb,1970-01-01 00:00:12,7\n"
    )
    proc, location = start(data, {"FLIGHT_SERVE_CRASH_AT": "commit:1"})
    try:
        body = {"sql": PIPELINE, "name": "counts", "base_dir": str(tmp_path)}
        with contextlib.suppress(flight.FlightUnavailableError):  # the kill may beat the answer
            act(location, "pipeline.submit", body)
        # the finished checkpoint (epoch 1) commits the counts, then the process kills itself
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(20)
        assert proc.stdout is not None
        proc.stdout.close()

    proc, location = start(data, {})
    try:
        [pid] = [p["id"] for p in act(location, "pipeline.list", {})["pipelines"]]
        wait_until(
            lambda: act(location, "pipeline.status", {"id": pid})["state"] == "finished",
            "the pipeline to finish after the restart",
        )
        status = act(location, "pipeline.status", {"id": pid})
        checkpoint = status["last_checkpoint"]
        assert checkpoint is not None, "the committed checkpoint 1 is missing from the registry"
        assert (checkpoint["epoch"], checkpoint["finished"]) == (1, True)
        assert checkpoint["bytes"] > 0
        assert (status["rows_in"], status["rows_out"]) == (3, {"counts": 2})
        assert status["outputs"] == {"counts": "stream counts"}
        with flight.connect(location) as client:
            info = client.get_flight_info(flight.FlightDescriptor.for_path("counts"))
            got = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
        assert [(r["k"], r["n"], r["total"]) for r in got] == [("a", 2, 15), ("b", 1, 7)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout is not None
        proc.stdout.close()


STREAM_PIPELINE = """
SET checkpoint_interval = '1h';
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(3), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
INSERT INTO counts
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def test_a_recorded_checkpoint_of_a_stream_pipeline_reports_its_sources_lag(
    tmp_path: Path,
) -> None:
    # stream events: a@1 v=10, b@12 v=7 (offset 0), writer w's end of input (offset 1); the
    # finished checkpoint (epoch 1) read both, then the SIGKILL comes before the registry hears
    # of it: after the restart the recorded checkpoint's lag is 0 entries (read from the resumed
    # source's position), not what an older record said (here: nothing)
    import pyarrow as pa
    from flight_serve_client import FlightServeClient

    data = tmp_path / "data"
    proc, location = start(data, {"FLIGHT_SERVE_CRASH_AT": "commit:1"})
    try:
        batch = pa.RecordBatch.from_pylist(
            [{"k": "a", "t": 1000, "v": 10}, {"k": "b", "t": 12000, "v": 7}],
            schema=pa.schema([("k", pa.string()), ("t", pa.timestamp("ms")), ("v", pa.int64())]),
        )
        client = FlightServeClient(location)
        client.put("events", [batch], writer="w", end_input=True)
        client.close()
        with contextlib.suppress(flight.FlightUnavailableError):  # the kill may beat the answer
            act(location, "pipeline.submit", {"sql": STREAM_PIPELINE, "name": "counts"})
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(20)
        assert proc.stdout is not None
        proc.stdout.close()

    proc, location = start(data, {})
    try:
        [pid] = [p["id"] for p in act(location, "pipeline.list", {})["pipelines"]]
        wait_until(
            lambda: act(location, "pipeline.status", {"id": pid})["state"] == "finished",
            "the pipeline to finish after the restart",
        )
        status = act(location, "pipeline.status", {"id": pid})
        assert status["last_checkpoint"]["epoch"] == 1
        assert (status["rows_in"], status["source_lag_entries"]) == (2, 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout is not None
        proc.stdout.close()
