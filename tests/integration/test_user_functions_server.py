"""A submitted pipeline with a Python function read from a ``USING`` file keeps running it after
the server is SIGKILLed and restarted, with the file deleted: the code was stored
content-addressed in the data directory at submit. The in-process Python runner is selected
explicitly for the server process (``FLIGHT_SERVE_PYTHON_FUNCTIONS=inprocess``): the test is about
storage and identity, not the sandbox."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import helpers
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers import ID_EVENTS as SCHEMA
from helpers import ServeProcess, free_port, stream_rows
from helpers import id_batches as batches

pytestmark = [pytest.mark.integration]

CLI = Path(sys.executable).parent / "flight-serve"

act = partial(helpers.act, timeout_s=30)
wait_until = partial(
    helpers.wait_until,
    timeout_s=60.0,
    poll_s=0.1,
    ignoring=(flight.FlightUnavailableError, flight.FlightTimedOutError),
)
SCORE = b"""import pyarrow.compute as pc


def score(v, k):
    return pc.add(pc.multiply(v, 3), pc.utf8_length(k))
"""
PIPELINE = (
    "SET checkpoint_interval = '100ms';\n"
    "CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, "
    "WATERMARK FOR t AS t) WITH (connector = 'flight', stream = 'events');\n"
    "CREATE FUNCTION score(v BIGINT, k VARCHAR) RETURNS BIGINT\n"
    "LANGUAGE python USING 'udfs/score.py';\n"
    "CREATE SINK scored WITH (connector = 'flight', stream = 'scored');\n"
    "INSERT INTO scored SELECT id, score(v, k) AS s FROM events WHERE score(v, k) > 100;\n"
)


def ingest(location: str, items: list[pa.RecordBatch]) -> None:
    with flight.connect(location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("events", "w1"), SCHEMA)
        for batch in items:
            writer.write_batch(batch)
            assert reader.read() is not None
        writer.done_writing()
        writer.close()


def expected(last_id: int) -> list[dict[str, int]]:
    rows = [r for b in batches(1, last_id // 10) for r in b.to_pylist()]
    return [{"id": r["id"], "s": r["v"] * 3 + len(r["k"])} for r in rows if r["v"] * 3 + 1 > 100]


def test_a_submitted_function_survives_a_restart_without_its_file(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    udfs = tmp_path / "client" / "udfs"
    udfs.mkdir(parents=True)
    (udfs / "score.py").write_bytes(SCORE)
    env = {"FLIGHT_SERVE_PYTHON_FUNCTIONS": "inprocess"}
    server = servers["a"] = ServeProcess(tmp_path / "data", free_port(), **env)
    ingest(server.location, batches(1, 6))  # ids 1..60
    pid = act(
        server.location,
        "pipeline.submit",
        {"sql": PIPELINE, "name": "scored", "base_dir": str(tmp_path / "client")},
    )["id"]
    wait_until(lambda: len(stream_rows(server.location, "scored")) >= len(expected(60)), "1..60")

    digest = hashlib.sha256(SCORE).hexdigest()
    functions = act(server.location, "pipeline.status", {"id": pid})["functions"]
    score = functions["score"]
    assert {k: score[k] for k in ("language", "kind", "sha256", "errors")} == {
        "language": "python",
        "kind": "scalar",
        "sha256": digest[:12],
        "errors": 0,
    }
    # DataFusion filters first (score over the 60 rows), then projects (score over the rows kept)
    assert score["rows"] == 60 + len(expected(60)), score
    assert score["calls"] >= 1
    assert isinstance(score["p99_ms"], float)
    stored = tmp_path / "data" / "functions"
    assert (stored / digest).read_bytes() == SCORE
    assert json.loads((stored / "pipelines" / f"{pid}.json").read_text()) == {
        "udfs/score.py": digest
    }

    server.kill()
    (udfs / "score.py").unlink()  # the client and its files are gone
    server = servers["a"] = ServeProcess(tmp_path / "data", server.port, **env)
    ingest(server.location, batches(61, 6))  # ids 61..120
    want = expected(120)
    wait_until(lambda: len(stream_rows(server.location, "scored")) >= len(want), "1..120")
    got = sorted(stream_rows(server.location, "scored"), key=lambda r: r["id"])
    assert got == want
    status = act(server.location, "pipeline.status", {"id": pid})
    assert status["state"] == "running", status
    act(server.location, "pipeline.cancel", {"id": pid})


def test_submit_uploads_the_using_files(servers: dict[str, ServeProcess], tmp_path: Path) -> None:
    """``flight-serve submit`` sends the USING files with the pipeline (``"files"``): the server
    stores them even when ``base_dir`` is a directory it cannot read them from."""
    client_dir = tmp_path / "client"
    (client_dir / "udfs").mkdir(parents=True)
    (client_dir / "udfs" / "score.py").write_bytes(SCORE)
    (client_dir / "scored.sql").write_text(PIPELINE)
    env = {"FLIGHT_SERVE_PYTHON_FUNCTIONS": "inprocess"}
    server = servers["a"] = ServeProcess(tmp_path / "data", free_port(), **env)
    done = subprocess.run(
        [str(CLI), "submit", "--server", server.location, str(client_dir / "scored.sql")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    digest = hashlib.sha256(SCORE).hexdigest()
    index = tmp_path / "data" / "functions" / "pipelines" / f"{pid}.json"
    assert json.loads(index.read_text()) == {"udfs/score.py": digest}

    # the raw action: the file is nowhere on the server's disk, only in the body
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    body = {
        "sql": PIPELINE.replace("'scored'", "'scored2'"),
        "name": "scored2",
        "base_dir": str(elsewhere),
        "files": {"udfs/score.py": base64.b64encode(SCORE).decode()},
    }
    pid2 = act(server.location, "pipeline.submit", body)["id"]
    ingest(server.location, batches(1, 6))
    want = expected(60)
    wait_until(lambda: len(stream_rows(server.location, "scored2")) >= len(want), "scored2")
    assert sorted(stream_rows(server.location, "scored2"), key=lambda r: r["id"]) == want
    with pytest.raises(pa.ArrowInvalid, match="not base64"):
        act(server.location, "pipeline.submit", {**body, "files": {"udfs/score.py": "!!"}})
    for p in (pid, pid2):
        act(server.location, "pipeline.cancel", {"id": p})
