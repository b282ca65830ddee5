"""The console's JSON API against a live ``flight-serve serve`` (conftest.py): its numbers equal
the Flight status and query results, auth and roles, the listening line, and the whole API
against schemas/console-openapi.yaml with schemathesis."""

from __future__ import annotations

import io
import json
import socket
import urllib.error
import urllib.request
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from .conftest import ADMIN_TOKEN, READ_TOKEN, Deployment, start_serve, stop_serve, wait_until

pytestmark = pytest.mark.integration

SPEC = Path(__file__).parents[2] / "schemas" / "console-openapi.yaml"


def call(
    base: str, path: str, token: str | None = READ_TOKEN, body: dict[str, Any] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(base.rstrip("/") + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def get_json(base: str, path: str, token: str | None = READ_TOKEN) -> Any:
    status, body, _ = call(base, path, token)
    assert status == 200, body
    return json.loads(body)


def test_pipelines_row_equals_the_flight_status(deployment: Deployment) -> None:
    live, pid = deployment.live, deployment.pid
    deployment.feeder.start()
    wait_until(lambda: deployment.feeder.batches >= 25, "25 batches fed")
    status = deployment.settle()
    row = get_json(live.console_url, "/api/v1/pipelines")["pipelines"][0]
    assert row["id"] == pid
    assert row["state"] == status["state"] == "running"
    assert row["rows_in"] == status["rows_in"] == deployment.feeder.rows
    assert row["late_rows"] == sum(status["late_rows"].values()) == deployment.feeder.late
    assert row["watermark"] == status["watermark"]
    assert row["epoch"] == status["last_checkpoint"]["epoch"]
    assert row["open_panes"] == status["open_panes"]
    assert row["waiting"] == status["waiting"]
    assert abs(row["watermark_lag_s"] - status["watermark_lag_s"]) < 2.0
    assert row["rows_per_s"] is not None  # between the last two checkpoints (or 0 when idle)

    detail = get_json(live.console_url, f"/api/v1/pipelines/{pid}")
    assert detail["sql"].strip().startswith("CREATE SOURCE events")
    nodes = {n["id"]: n for n in detail["graph"]["nodes"]}
    # by hand from what was fed: batch i holds event times t0 + 10 i + j (j < 10, key "ab"[j % 2]),
    # every 5th batch one late row more; the watermark is the newest time - 5 s, and a 10 s
    # window (key, start) fires once start + 10 <= it, the others are open panes
    feeder = deployment.feeder
    rows, late = feeder.rows, feeder.late
    newest = feeder.t0 + 10 * (feeder.batches - 1) + 9
    panes = {("ab"[j % 2], (feeder.t0 + 10 * i + j) // 10 * 10)
             for i in range(feeder.batches) for j in range(10)}  # fmt: skip
    fired = sum(1 for _, start in panes if start + 10 <= newest - 5)
    assert rows == 10 * feeder.batches + late
    assert fired > 0
    assert nodes["source:events"]["rows_out"] == rows
    assert nodes["query:0"]["kind"] == "window"
    assert (nodes["query:0"]["rows_in"], nodes["query:0"]["rows_out"]) == (rows, fired)
    assert nodes["query:0"]["late_rows"] == late
    assert nodes["query:0"]["open_windows"] == len(panes) - fired == status["open_panes"]
    # the window's one input partition (the feeder's unnamed writer): its own watermark
    watermark = datetime.fromtimestamp(newest - 5, UTC).isoformat()
    assert status["watermark"] == watermark
    assert nodes["query:0"]["partitions"] == [
        {"partition": "", "watermark": watermark, "idle": False, "finished": False}
    ]
    assert "partitions" not in nodes["query:1"]
    assert nodes["query:1"]["kind"] == "map"  # SELECT * FROM LATE(events)
    assert (nodes["query:1"]["rows_in"], nodes["query:1"]["rows_out"]) == (late, late)
    assert "open_windows" not in nodes["query:1"]
    assert nodes["sink:counts"]["rows_in"] == fired == status["rows_out"]["counts"]
    assert nodes["sink:late_rows"]["rows_in"] == late
    assert [(n["id"], n["rows_in"], n["rows_out"]) for n in status["nodes"]] == [
        ("query:0", rows, fired), ("query:1", late, late),
    ]  # fmt: skip
    assert sorted(map(tuple, detail["graph"]["edges"])) == [
        ("query:0", "query:1"),
        ("query:0", "sink:counts"),
        ("query:1", "sink:late_rows"),
        ("source:events", "query:0"),
    ]
    assert detail["partitions"] == [
        {"stream": "events", "writer": "", "watermark": None,
         "last_offset": deployment.feeder.batches - 1, "ended": False},
    ]  # fmt: skip
    n = deployment.feeder.late
    late = get_json(live.console_url, f"/api/v1/pipelines/{pid}/late?limit={n + 5}")["outputs"]
    assert [(o["stream"], o["late_rows"], len(o["rows"])) for o in late] == [("late_rows", n, n)]
    t0 = deployment.feeder.t0
    assert [r[:4] for r in late[0]["rows"]] == [["a", _iso(t0), -1, "late"]] * n
    assert (late[0]["total_rows"], late[0]["skipped"]) == (n, 0)
    # paging back, newest first: skip the newest 2, then the next 3 (one row per offset here)
    page = get_json(live.console_url, f"/api/v1/pipelines/{pid}/late?limit=3&skip=2")["outputs"][0]
    assert page["offsets"] == [n - 5, n - 4, n - 3]
    assert (page["total_rows"], page["skipped"]) == (n, 2)
    status, body, _ = call(live.console_url, f"/api/v1/pipelines/{pid}/late?skip=-1")
    assert (status, json.loads(body)) == (400, {"error": "skip must be from 0 to 1000000, got -1"})

    samples = get_json(live.console_url, f"/api/v1/pipelines/{pid}/samples")["samples"]
    assert samples[-1]["rows_in"] == deployment.feeder.rows
    # rows/s: the rows between two checkpoints over the time between them (taken_at)
    checkpoints = get_json(live.console_url, f"/api/v1/pipelines/{pid}/checkpoints")["checkpoints"]
    taken = {c["epoch"]: datetime.fromisoformat(c["taken_at"]).timestamp() for c in checkpoints}
    rates = [
        (s["rows_per_s"], round((s["rows_in"] - p["rows_in"]) / (taken[s["epoch"]] - taken[p["epoch"]]), 3))
        for p, s in pairwise(samples)
        if p["epoch"] is not None and s["epoch"] != p["epoch"]
    ]
    assert len(rates) >= 3
    assert [got for got, _ in rates] == [want for _, want in rates]
    assert max(got for got, _ in rates) > 0


def _iso(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None).isoformat()


def test_streams_equal_the_store(deployment: Deployment) -> None:
    live = deployment.live
    deployment.settle()
    streams = {s["name"]: s for s in get_json(live.console_url, "/api/v1/streams")["streams"]}
    assert sorted(streams) == ["counts", "events", "late_rows"]
    events = streams["events"]
    assert (events["rows"], events["first_offset"], events["next_offset"]) == (
        deployment.feeder.rows, 0, deployment.feeder.batches
    )
    assert [(w["name"], w["pipeline"]) for w in streams["counts"]["writers"]] == [
        ("counts", deployment.pid)
    ]
    one = get_json(live.console_url, "/api/v1/streams/events")
    assert one["schema"] == [
        {"name": "k", "type": "string", "nullable": True},
        {"name": "t", "type": "timestamp[s]", "nullable": True},
        {"name": "v", "type": "int64", "nullable": True},
    ]
    assert one["retention"] == {"bytes": None, "age_s": None}
    rows = get_json(live.console_url, "/api/v1/streams/events/rows?limit=12")
    last = deployment.feeder.batches - 1
    newest = deployment.feeder.batch(last).to_pylist()
    assert rows["offsets"][-len(newest):] == [last] * len(newest)
    assert rows["rows"][-len(newest):] == [[r["k"], r["t"].isoformat(), r["v"]] for r in newest]
    # skip cuts inside a batch: leave out the newest 4 rows, take the 8 before them
    fed = [r for i in range(deployment.feeder.batches) for r in deployment.feeder.batch(i).to_pylist()]
    offsets = [i for i in range(deployment.feeder.batches) for _ in deployment.feeder.batch(i).to_pylist()]
    rows = get_json(live.console_url, "/api/v1/streams/events/rows?limit=8&skip=4")
    assert rows["rows"] == [[r["k"], r["t"].isoformat(), r["v"]] for r in fed[-12:-4]]
    assert rows["offsets"] == offsets[-12:-4]
    assert (rows["total_rows"], rows["skipped"]) == (len(fed), 4)


def test_query_equals_the_flight_query(deployment: Deployment) -> None:
    live = deployment.live
    deployment.settle()
    sql = "SELECT k, count(*) AS n, sum(v) AS total FROM events GROUP BY k ORDER BY k"
    expected = live.query(sql)
    status, body, _ = call(live.console_url, "/api/v1/query", body={"sql": sql})
    assert status == 200, body
    result = json.loads(body)
    assert result["columns"] == [
        {"name": "k", "type": "string"},
        {"name": "n", "type": "int64"},
        {"name": "total", "type": "int64"},
    ]
    assert result["rows"] == [list(r.values()) for r in expected.to_pylist()]
    assert result["row_count"] == 2
    assert result["truncated"] is False
    assert result["elapsed_ms"] > 0
    status, body, headers = call(
        live.console_url, "/api/v1/query/download", body={"sql": sql, "format": "csv"}
    )
    assert status == 200
    assert headers["Content-Disposition"] == 'attachment; filename="result.csv"'
    assert pacsv.read_csv(io.BytesIO(body)).to_pylist() == expected.to_pylist()
    status, body, _ = call(
        live.console_url, "/api/v1/query/download", body={"sql": sql, "format": "parquet"}
    )
    assert status == 200
    assert pq.read_table(io.BytesIO(body)).to_pylist() == expected.to_pylist()
    status, body, _ = call(live.console_url, "/api/v1/query", body={"sql": "SELECT * FROM nope"})
    assert status == 404  # NOT_FOUND over Flight, as every missing thing in the console
    assert json.loads(body)["error"].startswith("table 'nope' does not exist (")


def test_auth_and_roles(deployment: Deployment) -> None:
    base, pid = deployment.live.console_url, deployment.pid
    status, body, headers = call(base, "/api/v1/pipelines", token=None)
    assert (status, json.loads(body)) == (
        401, {"error": "this server needs a token: send Authorization: Bearer <token>"}
    )
    assert headers["WWW-Authenticate"] == 'Bearer realm="flight-serve"'
    status, body, _ = call(base, "/api/v1/pipelines", token="wrong")
    assert (status, json.loads(body)) == (401, {"error": "unknown token or credentials"})
    assert get_json(base, "/api/v1/whoami") == {"name": "reader", "roles": ["read"], "auth": True}
    status, body, _ = call(base, f"/api/v1/pipelines/{pid}/cancel", body={})
    assert (status, json.loads(body)) == (
        403,
        {"error": f"this token lacks the admin role that POST /api/v1/pipelines/{pid}/cancel "
                  "needs"},
    )  # fmt: skip
    assert deployment.live.status(pid)["state"] == "running"
    status, body, _ = call(base, f"/api/v1/pipelines/{pid}/checkpoint", ADMIN_TOKEN, body={})
    result = json.loads(body)
    assert (status, result["completed"]) == (200, True)
    checkpoints = get_json(base, f"/api/v1/pipelines/{pid}/checkpoints")["checkpoints"]
    wait_until(
        lambda: get_json(base, f"/api/v1/pipelines/{pid}/checkpoints")["checkpoints"][0]["epoch"]
        >= result["epoch"],
        "the sampler saw the checkpoint",
    )
    assert [c["epoch"] for c in checkpoints] == sorted({c["epoch"] for c in checkpoints}, reverse=True)
    status, body, _ = call(base, "/static/../../../etc/passwd", token=None)
    assert status == 404
    status, body, headers = call(base, "/", token=None)
    assert status == 200
    assert b"<title>flight-serve console</title>" in body


def test_listening_line_gives_the_console_port_flight_port_plus_3(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import subprocess

    from .conftest import CLI, Live

    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", str(port), "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    live = Live(proc, "", "", 0, tmp_path)
    try:
        assert proc.stderr is not None
        for text in proc.stderr:
            entry = json.loads(text)
            if entry.get("msg") in ("listening", "cannot serve"):
                break
        assert entry["msg"] == "listening", entry
        assert entry["console_port"] == port + 3
        assert entry["console_url"] == f"http://127.0.0.1:{port + 3}/"
        assert get_json(entry["console_url"], "/api/v1/whoami", token=None) == {
            "name": "anonymous", "roles": ["admin", "read", "write"], "auth": False
        }
    finally:
        stop_serve(live)


def test_no_console_flag(tmp_path: Path) -> None:
    live = None
    try:
        with pytest.raises(KeyError, match="console_url"):
            live = start_serve(tmp_path, "--no-console")
    finally:
        if live is not None:
            stop_serve(live)


def test_api_matches_its_openapi_document(deployment: Deployment) -> None:
    """Every operation of schemas/console-openapi.yaml, with cases schemathesis generates
    from it, against the live console: status codes, content types and bodies as documented,
    no 5xx, auth enforced. The admin token: every operation answers (actions on the random ids
    schemathesis makes are 404)."""
    spec = schemathesis.openapi.from_path(str(SPEC))
    base = deployment.live.console_url.rstrip("/")
    operations = [result.ok() for result in spec.get_all_operations()]
    assert len(operations) == 14

    for operation in operations:
        _checker(operation, base)()


def _checker(operation: Any, base: str) -> Any:
    # any text is a schema-valid "sql", and text that is not SQL is rightly 400
    excluded = [schemathesis.checks.positive_data_acceptance] if "query" in operation.path else []

    @given(case=operation.as_strategy())
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)  # fmt: skip
    def check(case: Any) -> None:
        case.call_and_validate(
            base_url=base,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            excluded_checks=excluded,
        )

    return check
