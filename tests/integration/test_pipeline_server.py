"""Submitted pipelines on a real in-process server ("submit and walk away"): the
``pipeline.*`` actions, exactly-once results in server streams, failures and retries, and a
pipeline that goes on after a server restart. Crashes (SIGKILL) are in test_pipeline_crashes.py.

Times are integer seconds since the epoch (``timestamp[s]``); a row is (k, t, v).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import helpers
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.flight as flight
import pytest
from flight_serve.flight.server import start_server
from helpers import act, rows_of

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
WAIT_S = 20.0
wait_until = partial(helpers.wait_until, timeout_s=WAIT_S)
COUNTS = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
INSERT INTO counts
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total, count(DISTINCT v) AS d,
       min(k) AS lo, approx_distinct(v) AS ad
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def batch(*rows: tuple[str, int, int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": k, "t": t, "v": v} for k, t, v in rows], schema=SCHEMA)


def put(client: flight.FlightClient, stream: str, *batches: pa.RecordBatch) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(stream), batches[0].schema)
    with writer:
        for b in batches:
            writer.write_batch(b)
            reader.read()


def window(k: str, start: int, n: int, total: int, d: int) -> dict[str, Any]:
    base = datetime(1970, 1, 1)
    return {
        "k": k,
        "window_start": base + timedelta(seconds=start),
        "window_end": base + timedelta(seconds=start + 10),
        "n": n,
        "total": total,
        "d": d,
        "lo": k,
        "ad": d,
    }


def test_submit_status_checkpoint_logs_cancel(client: flight.FlightClient) -> None:
    put(client, "events", batch(("a", 1, 1), ("b", 3, 2)))
    submitted = act(client, "pipeline.submit", {"sql": COUNTS, "name": "Counts per key!"})
    pid = submitted["id"]
    assert pid.startswith("counts-per-key-")
    assert submitted["state"] == "running"
    assert submitted["outputs"] == {"counts": "stream counts"}
    assert rows_of(client, "counts") == []  # the output stream exists at once: tail it any time
    put(client, "events", batch(("a", 12, 3), ("a", 12, 3)), batch(("a", 25, 4)))
    wait_until(lambda: len(rows_of(client, "counts")) == 3, "the windows that W = 25 closes")
    assert rows_of(client, "counts") == [
        window("a", 0, 1, 1, 1),
        window("b", 0, 1, 2, 1),
        window("a", 10, 2, 6, 1),
    ]
    forced = act(client, "pipeline.checkpoint", {"id": pid})
    assert forced["completed"] is True
    status = act(client, "pipeline.status", {"id": pid})
    assert status["state"] == "running"
    assert status["last_checkpoint"]["epoch"] >= forced["epoch"]
    assert status["rows_in"] == 5
    assert status["rows_out"] == {"counts": 3}
    assert status["watermark"] == "1970-01-01T00:00:25+00:00"
    assert status["watermark_lag_s"] > 1e9
    assert status["source_lag_entries"] == 0
    assert status["open_panes"] == 1
    assert status["late_rows"] == {"INSERT INTO counts (line 5)": 0}
    assert status["last_error"] is None
    listed = act(client, "pipeline.list", {})["pipelines"]
    assert [(p["id"], p["state"]) for p in listed] == [(pid, "running")]
    assert act(client, "pipeline.cancel", {"id": pid}) == {"id": pid, "state": "cancelled"}
    put(client, "events", batch(("a", 99, 1)))
    time.sleep(0.3)
    assert len(rows_of(client, "counts")) == 3  # cancelled: nothing more
    lines = [line["message"] for line in act(client, "pipeline.logs", {"id": pid})["lines"]]
    assert lines[:2] == ["submitted", "cancelled"]
    assert lines[2].startswith("checkpoints removed (")  # a cancelled pipeline never resumes
    assert len(lines) == 3


def test_bad_pipelines_and_ids_are_refused(client: flight.FlightClient) -> None:
    """A pipeline that does not plan is INVALID_ARGUMENT with its line and column, and nothing
    is registered; an unknown id is NOT_FOUND."""
    bad = {
        r"no such sink .*\(line 5, column 13\)": COUNTS.replace("INTO counts", "INTO nowhere"),
        r"stream does not exist yet; declare the source's columns": COUNTS.replace(
            "(k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)", ""
        ).replace("t, INTERVAL", "t, INTERVAL"),
        r"unknown option of the flight connector of SINK counts.*\(line 4, column": COUNTS.replace(
            "stream = 'counts'", "server = 'grpc://127.0.0.1:1', path = 'counts'"
        ),
    }
    for message, sql in bad.items():
        with pytest.raises(pa.ArrowInvalid, match=message):
            act(client, "pipeline.submit", {"sql": sql})
    with pytest.raises(pa.ArrowInvalid, match='the body needs "sql"'):
        act(client, "pipeline.submit", {})
    assert act(client, "pipeline.list", {}) == {"pipelines": []}
    for action in ("status", "cancel", "logs", "checkpoint"):
        with pytest.raises(pa.ArrowKeyError, match="no pipeline 'nope'"):
            act(client, f"pipeline.{action}", {"id": "nope"})


def test_a_failing_pipeline_fails_retries_with_backoff_and_others_keep_running(
    client: flight.FlightClient,
) -> None:
    divide = """
    SET on_failure = '{mode}';
    SET max_retries = 2;
    SET retry_backoff = '50ms';
    CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT) WITH (connector = 'flight', stream = 'events');
    CREATE SINK ratios WITH (connector = 'flight', stream = '{out}');
    INSERT INTO ratios SELECT k, 100 / v AS r FROM events;
    """
    failing = act(client, "pipeline.submit", {"sql": divide.format(mode="fail", out="r1")})["id"]
    retrying = act(client, "pipeline.submit", {"sql": divide.format(mode="retry", out="r2")})["id"]
    healthy = act(client, "pipeline.submit", {"sql": COUNTS})["id"]
    put(client, "events", batch(("a", 1, 5)), batch(("a", 2, 0)), batch(("b", 30, 4)))

    def state(pid: str) -> str:
        return str(act(client, "pipeline.status", {"id": pid})["state"])

    wait_until(lambda: state(failing) == "failed", "the failing pipeline to fail")
    wait_until(lambda: state(retrying) == "failed", "the retrying pipeline to give up")
    status = act(client, "pipeline.status", {"id": failing})
    assert "Divide by zero" in status["last_error"]
    assert act(client, "pipeline.status", {"id": retrying})["attempts"] == 2
    messages = [line["message"] for line in act(client, "pipeline.logs", {"id": retrying})["lines"]]
    assert [m.split(":")[0] for m in messages] == ["submitted", "failed", "failed", "failed"]
    assert "retry 1 of 2 in 0.05 s" in messages[1]
    assert "retry 2 of 2 in 0.1 s" in messages[2]
    wait_until(lambda: len(rows_of(client, "counts")) == 1, "the healthy pipeline's window")
    assert state(healthy) == "running"
    # the good row's result was in an epoch that never reached a checkpoint: not committed
    assert rows_of(client, "r1") == []


def test_a_file_pipeline_finishes_and_its_results_survive_restarts(tmp_path: Path) -> None:
    """A bounded pipeline on the server (file source, stream and file sinks) finishes; its
    output equals the embedded run's; a restart neither reruns nor duplicates it."""
    from flight_serve.embedded import Pipeline

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text(
        "k,t,v\n" + "".join(f"{'ab'[i % 2]},1970-01-01 00:00:{i:02d},{i}\n" for i in range(40))
    )
    sql = """
    SET checkpoint_every = 2;
    CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t - INTERVAL '3' SECOND)
    WITH (connector = 'file', path = 'in/a.csv', batch_rows = '3');
    CREATE SINK {sink};
    INSERT INTO {name} SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
    FROM HOP(s, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
    """
    embedded = Pipeline.from_sql(
        sql.format(sink="out WITH (connector = 'file', format = 'csv')", name="out"),
        base_dir=tmp_path,
        output_dir=tmp_path / "embedded",
    )
    embedded.run()
    expected = pacsv.read_csv(tmp_path / "embedded" / "out.csv").to_pylist()
    data = tmp_path / "data"
    with start_server(data) as service, flight.connect(service.location) as client:
        stream_pid = act(
            client,
            "pipeline.submit",
            {
                "sql": sql.format(
                    sink="hops WITH (connector = 'flight', stream = 'hops')", name="hops"
                ),
                "base_dir": str(tmp_path),
            },
        )["id"]
        file_pid = act(
            client,
            "pipeline.submit",
            {
                "sql": sql.format(sink="out WITH (connector = 'file', format = 'csv')", name="out"),
                "base_dir": str(tmp_path),
                "output_dir": str(tmp_path / "server-out"),
            },
        )["id"]
        for pid in (stream_pid, file_pid):
            wait_until(
                lambda pid=pid: act(client, "pipeline.status", {"id": pid})["state"] == "finished",
                f"{pid} to finish",
            )
        got = rows_of(client, "hops")
    assert [
        {**r, "window_start": str(r["window_start"]), "window_end": str(r["window_end"])}
        for r in got
    ] == [
        {**r, "window_start": str(r["window_start"]), "window_end": str(r["window_end"])}
        for r in expected
    ]
    assert (tmp_path / "server-out" / "out.csv").read_text() == (
        tmp_path / "embedded" / "out.csv"
    ).read_text()
    with start_server(data) as service, flight.connect(service.location) as client:
        assert rows_of(client, "hops") == got
        assert {p["state"] for p in act(client, "pipeline.list", {})["pipelines"]} == {"finished"}


def test_status_before_any_row(client: flight.FlightClient) -> None:
    pid = act(client, "pipeline.submit", {"sql": COUNTS})["id"]  # no stream 'events' yet
    assert act(client, "pipeline.status", {"id": pid})["last_checkpoint"] is None
    assert act(client, "pipeline.checkpoint", {"id": pid})["completed"] is True
    status = act(client, "pipeline.status", {"id": pid})
    assert (status["watermark"], status["watermark_lag_s"], status["rows_in"]) == (None, None, 0)
    assert status["last_checkpoint"]["epoch"] >= 1


def test_the_command_line_authenticates_with_a_token_or_a_user(tmp_path: Path) -> None:
    """``flight-serve submit`` / ``pipelines`` against a server with tokens and users: a bearer
    token from ``$FLIGHT_SERVE_TOKEN`` (submit needs the admin role), or ``--user`` with the
    password from ``$FLIGHT_SERVE_PASSWORD``."""
    import os
    import subprocess
    import sys

    from flight_serve.flight.ops.roles import load_tokens_file

    cli = Path(sys.executable).parent / "flight-serve"
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text("tok-read read dashboards\ntok-admin admin ops\n")
    job = tmp_path / "job.sql"
    job.write_text(COUNTS)

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
        return subprocess.run(
            [str(cli), *args], capture_output=True, text=True, timeout=60, env={**clean, **env}
        )

    with start_server(
        tmp_path / "data", tokens=load_tokens_file(tokens_file), users={"alice": "s3cret"}
    ) as service:
        where = ("--server", service.location)
        refused = run("submit", str(job), *where)
        assert refused.returncode == 1
        assert (
            "authentication required" in refused.stderr.lower()
            or "unauth" in refused.stderr.lower()
        )
        reader = run("submit", str(job), *where, FLIGHT_SERVE_TOKEN="tok-read")
        assert reader.returncode == 1
        assert "admin" in reader.stderr, reader.stderr
        submitted = run("submit", str(job), *where, FLIGHT_SERVE_TOKEN="tok-admin")
        assert submitted.returncode == 0, submitted.stderr
        pid = submitted.stdout.strip()
        listed = run("pipelines", "list", *where, FLIGHT_SERVE_TOKEN="tok-read")
        assert listed.returncode == 0, listed.stderr
        assert pid in listed.stdout
        wrong = run(
            "pipelines", "status", pid, *where, "--user", "alice", FLIGHT_SERVE_PASSWORD="x"
        )
        assert wrong.returncode == 1
        assert "wrong user name or password" in wrong.stderr
        status = run(
            "pipelines",
            "status",
            pid,
            *where,
            "--user",
            "alice",
            "--json",
            FLIGHT_SERVE_PASSWORD="s3cret",
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["state"] == "running"
