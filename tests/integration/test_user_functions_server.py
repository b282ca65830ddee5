"""A submitted pipeline with a Python function and a WebAssembly function (examples/udfs/geo.rs,
built here by Debian's rustc) read from ``USING`` files keeps running them after the server is
SIGKILLed and restarted, with the files deleted: the code was stored content-addressed in the
data directory at submit. The server runs Python in its default runner, the bubblewrap sandbox;
its output is compared row for row with DataFusion batch SQL computing the same expressions
with built-ins, and with an embedded run of the same functions over the same rows."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import datafusion
import flight_serve
import helpers
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from helpers import ID_EVENTS as SCHEMA
from helpers import ServeProcess, build_geo_wasm, free_port, stream_rows
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
#: the same rows through a Python and a wasm function (one pipeline, both USING files)
FUNCTIONS = (
    "CREATE FUNCTION who(v BIGINT) RETURNS BIGINT LANGUAGE python AS $$\n"
    "import os\n"
    "import pyarrow as pa\n"
    "def who(v):\n"
    "    return pa.array([os.getuid()] * len(v), pa.int64())\n"
    "$$;\n"
    "CREATE FUNCTION score(v BIGINT, k VARCHAR) RETURNS BIGINT\n"
    "LANGUAGE python USING 'udfs/score.py';\n"
    "CREATE FUNCTION gcd(a BIGINT, b BIGINT) RETURNS BIGINT LANGUAGE wasm USING 'udfs/geo.wasm';\n"
    "CREATE FUNCTION great_circle(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE) "
    "RETURNS DOUBLE\nLANGUAGE wasm USING 'udfs/geo.wasm';\n"
)
MIXED_QUERY = (
    "SELECT id, score(v, k) AS s, gcd(v, id) AS g, who(v) AS uid, "
    "great_circle(CAST(v AS DOUBLE) - 48.0, CAST(id AS DOUBLE), 40.64, -73.78) AS km "
    "FROM events WHERE score(v, k) > 100;\n"
)
MIXED = (
    "SET checkpoint_interval = '100ms';\n"
    "CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, "
    "WATERMARK FOR t AS t) WITH (connector = 'flight', stream = 'events');\n"
    + FUNCTIONS
    + "CREATE SINK mixed WITH (connector = 'flight', stream = 'mixed');\n"
    + "INSERT INTO mixed "
    + MIXED_QUERY
)
#: the straight run: the same functions and query over a file of the same rows, in this process
EMBEDDED = (
    "CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, "
    "WATERMARK FOR t AS t) WITH (connector = 'file', path = 'events.parquet');\n"
    + FUNCTIONS
    + "CREATE SINK mixed WITH (connector = 'stdout');\n"
    + "INSERT INTO mixed "
    + MIXED_QUERY
)


@pytest.fixture(scope="module")
def geo_wasm(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """examples/udfs/geo.rs built for wasm32-unknown-unknown with Debian's rustc."""
    return build_geo_wasm(tmp_path_factory.mktemp("udfs"))


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
    server = servers["a"] = ServeProcess(tmp_path / "data", free_port())
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
    server = servers["a"] = ServeProcess(tmp_path / "data", server.port)
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
    server = servers["a"] = ServeProcess(tmp_path / "data", free_port())
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


def oracle(last_id: int) -> list[dict[str, Any]]:
    """DataFusion batch SQL over ids 1..last_id with built-ins for score and gcd (the sandbox's
    uid is 65534); ``km`` comes from the embedded run."""
    table = pa.Table.from_batches(batches(1, last_id // 10))
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("events", [table.to_batches()])
    out = ctx.sql(
        "SELECT id, v * 3 + character_length(k) AS s, gcd(v, id) AS g, 65534 AS uid "
        "FROM events WHERE v * 3 + character_length(k) > 100 ORDER BY id"
    ).to_arrow_table()
    return out.to_pylist()


def straight_run(workdir: Path, last_id: int) -> list[dict[str, Any]]:
    """The same functions and query run by ``flight_serve.Pipeline`` in this process (the
    default, sandboxed Python runner) over a Parquet file of ids 1..last_id."""
    pq.write_table(pa.Table.from_batches(batches(1, last_id // 10)), workdir / "events.parquet")
    pipeline = flight_serve.Pipeline.from_sql(EMBEDDED, base_dir=workdir)
    rows = [row for _, batch in pipeline.batches() for row in batch.to_pylist()]
    return sorted(rows, key=lambda r: int(r["id"]))


def test_python_and_wasm_functions_survive_a_sigkill_as_a_straight_run_computes_them(
    servers: dict[str, ServeProcess], tmp_path: Path, geo_wasm: bytes
) -> None:
    client = tmp_path / "client"
    (client / "udfs").mkdir(parents=True)
    (client / "udfs" / "score.py").write_bytes(SCORE)
    (client / "udfs" / "geo.wasm").write_bytes(geo_wasm)
    straight = straight_run(client, 120)
    want = oracle(120)
    assert [{k: r[k] for k in ("id", "s", "g", "uid")} for r in straight] == want
    assert [r["g"] for r in want] == [math.gcd(r["id"] * r["id"] % 97, r["id"]) for r in want]
    assert len(want) == len(expected(120))

    server = servers["a"] = ServeProcess(tmp_path / "data", free_port())
    ingest(server.location, batches(1, 6))  # ids 1..60
    pid = act(
        server.location,
        "pipeline.submit",
        {"sql": MIXED, "name": "mixed", "base_dir": str(client)},
    )["id"]
    first = [r for r in straight if r["id"] <= 60]
    wait_until(lambda: len(stream_rows(server.location, "mixed")) >= len(first), "1..60")
    functions = act(server.location, "pipeline.status", {"id": pid})["functions"]
    assert {name: (f["language"], f["kind"], f["errors"]) for name, f in functions.items()} == {
        "who": ("python", "scalar", 0),
        "score": ("python", "scalar", 0),
        "gcd": ("wasm", "scalar", 0),
        "great_circle": ("wasm", "scalar", 0),
    }
    assert functions["gcd"]["sha256"] == hashlib.sha256(geo_wasm).hexdigest()[:12]

    server.kill()
    for name in ("score.py", "geo.wasm"):
        (client / "udfs" / name).unlink()  # the client and its files are gone
    server = servers["a"] = ServeProcess(tmp_path / "data", server.port)
    ingest(server.location, batches(61, 6))  # ids 61..120
    wait_until(lambda: len(stream_rows(server.location, "mixed")) >= len(straight), "1..120")
    got = sorted(stream_rows(server.location, "mixed"), key=lambda r: r["id"])
    assert got == straight  # row for row, each exactly once, km bit for bit
    status = act(server.location, "pipeline.status", {"id": pid})
    assert status["state"] == "running", status
    act(server.location, "pipeline.cancel", {"id": pid})


RUN_WHO = (
    "CREATE SOURCE s (x DOUBLE) WITH (connector = 'file', path = 'in.csv');\n"
    "CREATE FUNCTION who(x DOUBLE) RETURNS BIGINT LANGUAGE python AS $$\n"
    "import os\n"
    "import pyarrow as pa\n"
    "def who(x):\n"
    "    return pa.array([os.getuid()] * len(x), pa.int64())\n"
    "$$;\n"
    "CREATE SINK out WITH (connector = 'file', path = 'out.csv');\n"
    "INSERT INTO out SELECT x, who(x) AS uid FROM s;\n"
)


def test_run_without_bwrap_refuses_python_unless_allowed(tmp_path: Path) -> None:
    """``flight-serve run`` with no bwrap on PATH: refused naming bwrap and the flag;
    ``--allow-unsandboxed-python`` runs the code as this user."""
    (tmp_path / "in.csv").write_text("x\n1.5\n2.5\n")
    (tmp_path / "who.sql").write_text(RUN_WHO)
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}  # no bwrap, no setpriv
    assert shutil.which("bwrap", path=env["PATH"]) is None
    command = [str(CLI), "run", str(tmp_path / "who.sql"), "--output-dir", str(tmp_path)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0
    assert "bwrap is not installed" in refused.stderr, refused.stderr
    assert "--allow-unsandboxed-python" in refused.stderr, refused.stderr
    allowed = subprocess.run(
        [*command, "--allow-unsandboxed-python"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert allowed.returncode == 0, allowed.stderr
    out = sorted((tmp_path / "out.csv").rglob("*.csv")) or [tmp_path / "out.csv"]
    rows = [row for f in out for row in pa_csv.read_csv(f).to_pylist()]
    assert rows == [{"x": 1.5, "uid": os.getuid()}, {"x": 2.5, "uid": os.getuid()}]


METERED = (
    "SET checkpoint_interval = '100ms';\n"
    "CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, "
    "WATERMARK FOR t AS t) WITH (connector = 'flight', stream = 'events');\n"
    "CREATE FUNCTION score(v BIGINT, k VARCHAR) RETURNS BIGINT\n"
    "LANGUAGE python USING 'udfs/score.py';\n"
    "CREATE FUNCTION gcd(a BIGINT, b BIGINT) RETURNS BIGINT LANGUAGE wasm USING 'udfs/geo.wasm';\n"
    "CREATE SINK metered WITH (connector = 'flight', stream = 'metered');\n"
    "INSERT INTO metered SELECT id, score(v, k) AS s, gcd(v, id) AS g FROM events;\n"
)


def test_the_metrics_endpoint_counts_each_functions_calls_rows_and_times(
    servers: dict[str, ServeProcess], tmp_path: Path, geo_wasm: bytes
) -> None:
    """Three batches of 10 rows, each ingested once the one before is out: each function is
    called once per batch; /metrics (scraped over HTTP) says so, labelled by pipeline,
    function, digest and language, and agrees with ``pipeline.status``."""
    client = tmp_path / "client"
    (client / "udfs").mkdir(parents=True)
    (client / "udfs" / "score.py").write_bytes(SCORE)
    (client / "udfs" / "geo.wasm").write_bytes(geo_wasm)
    server = servers["m"] = ServeProcess(tmp_path / "data", free_port(), free_port())
    body = {"sql": METERED, "name": "metered", "base_dir": str(client)}
    pid = act(server.location, "pipeline.submit", body)["id"]
    for n in range(3):
        ingest(server.location, batches(1 + 10 * n, 1))
        wait_until(lambda n=n: len(stream_rows(server.location, "metered")) == 10 * (n + 1), "out")

    samples = helpers.scrape_metrics(server.metrics_port)
    digests = {
        "score": hashlib.sha256(SCORE).hexdigest()[:12],
        "gcd": hashlib.sha256(geo_wasm).hexdigest()[:12],
    }
    status = act(server.location, "pipeline.status", {"id": pid})["functions"]
    for name, language in (("score", "python"), ("gcd", "wasm")):
        labels = {"pipeline": pid, "function": name, "digest": digests[name], "language": language}
        key = frozenset(labels.items())
        assert samples["flight_serve_function_calls_total"][key] == 3.0, name
        assert samples["flight_serve_function_rows_total"][key] == 30.0, name
        assert samples["flight_serve_function_errors_total"][key] == 0.0, name
        assert samples["flight_serve_function_call_duration_seconds_count"][key] == 3.0, name
        inf = frozenset({**labels, "le": "+Inf"}.items())
        assert samples["flight_serve_function_call_duration_seconds_bucket"][inf] == 3.0, name
        total = samples["flight_serve_function_call_duration_seconds_sum"][key]
        assert total == pytest.approx(status[name]["call_seconds"]["sum"]), name
        assert 0 < total < 30, name
        by_le = {
            dict(labelset)["le"]: value
            for labelset, value in samples[
                "flight_serve_function_call_duration_seconds_bucket"
            ].items()
            if dict(labelset)["function"] == name
        }
        # 17 bounds and +Inf, cumulative, as the status's histogram says
        assert by_le == {
            le: float(n) for le, n in status[name]["call_seconds"]["buckets"].items()
        }, name
        assert len(by_le) == 18, name
        assert list(by_le.values()) == sorted(by_le.values()), name
        assert {k: status[name][k] for k in ("calls", "rows", "errors")} == {
            "calls": 3,
            "rows": 30,
            "errors": 0,
        }
    act(server.location, "pipeline.cancel", {"id": pid})
    after = helpers.scrape_metrics(server.metrics_port)
    assert not any(  # a cancelled pipeline has no series
        dict(labelset).get("pipeline") == pid
        for labelset in after.get("flight_serve_function_calls_total", {})
    )
