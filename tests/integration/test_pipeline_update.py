"""``flight-serve pipelines update``: a running submitted pipeline, a 10 s TUMBLE per key over a
view that calls a Python function from a ``USING`` file, gets a new version (a changed function,
a changed per-row query, a new per-row query inserted before the window, which renumbers the
queries) from the checkpoint the old one took. The window open at the update holds rows of both
versions; every output equals what each version computes over its own rows (computed here
exactly), each row once. Refused updates (a changed window size or aggregate, a syntax error, a
missing USING file, an unknown id) change nothing and the old version goes on. A SIGKILL right
after the update, before the new version took any checkpoint of its own, resumes version 2 from
version 1's checkpoint with version 2's code."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import helpers
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers import ID_EVENTS as SCHEMA
from helpers import ServeProcess, free_port, stream_rows
from helpers import id_batches as batches

pytestmark = [pytest.mark.integration]

CLI = Path(sys.executable).parent / "flight-serve"
act = partial(helpers.act, timeout_s=60)
wait_until = partial(
    helpers.wait_until,
    timeout_s=60.0,
    poll_s=0.1,
    ignoring=(flight.FlightUnavailableError, flight.FlightTimedOutError),
)

ADJ_V1 = b"import pyarrow.compute as pc\n\n\ndef adj(v):\n    return pc.multiply(v, 2)\n"
ADJ_V2 = b"import pyarrow.compute as pc\n\n\ndef adj(v):\n    return pc.add(v, 1000)\n"
SOURCE = (
    "SET checkpoint_interval = '100ms';\n"
    "CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, "
    "WATERMARK FOR t AS t) WITH (connector = 'flight', stream = 'events');\n"
    "CREATE FUNCTION adj(v BIGINT) RETURNS BIGINT LANGUAGE python USING 'udfs/adj.py';\n"
)
WINDOW = (
    "CREATE SINK counts WITH (connector = 'flight', stream = 'counts');\n"
    "INSERT INTO counts SELECT k, window_start, window_end, count(*) AS n, sum(a) AS total\n"
    "FROM TUMBLE(scored, t, INTERVAL '{size}' SECOND) GROUP BY k, window_start, window_end;\n"
)
V1 = (
    SOURCE
    + "CREATE VIEW scored AS SELECT id, k, t, adj(v) AS a FROM events;\n"
    + WINDOW.format(size=10)
    + "CREATE SINK rows WITH (connector = 'flight', stream = 'rows');\n"
    + "INSERT INTO rows SELECT id, a FROM scored;\n"
)
#: a new per-row query first (every later query's index moves by one), the same window, a
#: changed per-row query into the same sink, and (in the file) a changed function
V2 = (
    SOURCE
    + "CREATE SINK sevens WITH (connector = 'flight', stream = 'sevens');\n"
    + "INSERT INTO sevens SELECT id FROM events WHERE id % 7 = 0;\n"
    + "CREATE VIEW scored AS SELECT id, k, t, adj(v) AS a FROM events;\n"
    + WINDOW.format(size=10)
    + "CREATE SINK rows WITH (connector = 'flight', stream = 'rows');\n"
    + "INSERT INTO rows SELECT id, a * 10 AS a FROM scored WHERE k <> 'c';\n"
)


def ingest(location: str, items: list[pa.RecordBatch]) -> None:
    with flight.connect(location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("events", "w1"), SCHEMA)
        for batch in items:
            writer.write_batch(batch)
            assert reader.read() is not None
        writer.done_writing()
        writer.close()


def v(i: int) -> int:
    return i * i % 97


def adj(i: int, version: int) -> int:
    return v(i) * 2 if version == 1 else v(i) + 1000


def key(i: int) -> str:
    return "abc"[i % 3]


def expected_rows(last_v1: int, last: int) -> list[dict[str, int]]:
    """``rows``: version 1 (``a``) for ids up to ``last_v1``, version 2 (``a * 10``, keys but
    c) after."""
    out = [{"id": i, "a": adj(i, 1)} for i in range(1, last_v1 + 1)]
    out += [{"id": i, "a": adj(i, 2) * 10} for i in range(last_v1 + 1, last + 1) if key(i) != "c"]
    return out


def expected_counts(last_v1: int, last: int) -> list[dict[str, Any]]:
    """``counts``: the windows that closed by id ``last`` (t = id s; the watermark is the
    newest t), each row's ``a`` from the version that read it."""
    windows: dict[tuple[str, int], list[int]] = {}
    for i in range(1, last + 1):
        windows.setdefault((key(i), i // 10 * 10), []).append(adj(i, 1 if i <= last_v1 else 2))
    base = datetime(1970, 1, 1)
    return sorted(
        (
            {
                "k": k,
                "window_start": base + timedelta(seconds=start),
                "window_end": base + timedelta(seconds=start + 10),
                "n": len(values),
                "total": sum(values),
            }
            for (k, start), values in windows.items()
            if start + 10 <= last
        ),
        key=lambda r: (r["window_start"], r["k"]),
    )


def by_window(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["window_start"], r["k"]))


def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: int(r["id"]))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=120)


def test_update_resumes_the_new_version_from_the_old_state_and_refuses_incompatible_changes(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    client = tmp_path / "client"
    (client / "udfs").mkdir(parents=True)
    (client / "udfs" / "adj.py").write_bytes(ADJ_V1)
    (client / "v1.sql").write_text(V1)
    server = servers["a"] = ServeProcess(tmp_path / "data", free_port())
    where = ("--server", server.location)
    done = cli("submit", *where, str(client / "v1.sql"))
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    ingest(server.location, batches(1, 3))  # ids 1..30
    wait_until(lambda: len(stream_rows(server.location, "rows")) == 30, "ids 1..30")

    # --- refused: nothing changes, version 1 goes on --------------------------------------
    def refused(sql: str, *, files: dict[str, str] | None = None, who: str = pid) -> str:
        body: dict[str, Any] = {"id": who, "sql": sql}
        if files is not None:
            body["files"] = files
        with pytest.raises((flight.FlightError, pa.ArrowException)) as info:
            act(server.location, "pipeline.update", body)
        return str(info.value)

    size = refused(V1.replace("INTERVAL '10' SECOND", "INTERVAL '20' SECOND"))
    assert (
        "window operator 'INSERT INTO counts' (TUMBLE 10 s by k): windows differ: "
        "old TUMBLE 10 s new TUMBLE 20 s"
    ) in size, size
    aggregate = refused(V1.replace("count(*) AS n, sum(a) AS total", "count(*) AS n"))
    assert (
        "window operator 'INSERT INTO counts' (TUMBLE 10 s by k): aggregates differ: "
        "old [count(*) AS n, sum(a) AS total] new [count(*) AS n]"
    ) in aggregate, aggregate
    syntax = refused(V1.replace("INSERT INTO rows SELECT", "INSERT INTO rows SELEC"))
    assert "line 9" in syntax, syntax
    missing = refused(V1.replace("udfs/adj.py", "udfs/gone.py"))
    assert "udfs/gone.py" in missing, missing
    unknown = refused(V2, who="nope-00000000")
    assert "no pipeline 'nope-00000000'" in unknown, unknown
    # found only once version 1 stopped: the window's state holds int64 sums, the new text
    # aggregates a double; version 1 resumes from the checkpoint it took
    typed = refused(V1.replace("adj(v) AS a", "CAST(adj(v) AS DOUBLE) AS a"))
    assert "version 2 cannot resume from checkpoint" in typed, typed
    assert "pane state does not match this query" in typed, typed
    assert "version 1 resumes from it (nothing was changed)" in typed, typed

    def lines() -> list[str]:
        return [x["message"] for x in act(server.location, "pipeline.logs", {"id": pid})["lines"]]

    wait_until(lambda: lines()[-1].startswith("resumed from checkpoint"), "version 1 resumed")
    # the command line shows the operator diff and exits 1
    (client / "v1-20s.sql").write_text(V1.replace("'10' SECOND", "'20' SECOND"))
    done = cli("pipelines", "update", *where, pid, str(client / "v1-20s.sql"))
    assert done.returncode == 1
    assert "windows differ: old TUMBLE 10 s new TUMBLE 20 s" in done.stderr, done.stderr

    status = act(server.location, "pipeline.status", {"id": pid})
    assert (status["state"], status["version"], len(status["versions"])) == ("running", 1, 1)
    ingest(server.location, batches(31, 3))  # ids 31..60, still version 1
    wait_until(lambda: len(stream_rows(server.location, "rows")) == 60, "ids 1..60")
    assert by_id(stream_rows(server.location, "rows")) == expected_rows(60, 60)
    wait_until(
        lambda: by_window(stream_rows(server.location, "counts")) == expected_counts(60, 60),
        "version 1's windows up to 60 s",
    )

    # --- the update, by the command line: the changed USING file is uploaded ------------
    (client / "udfs" / "adj.py").write_bytes(ADJ_V2)
    (client / "v2.sql").write_text(V2)
    epoch_before = act(server.location, "pipeline.status", {"id": pid})["last_checkpoint"]["epoch"]
    done = cli("pipelines", "update", *where, pid, str(client / "v2.sql"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{pid}: version 2 resumed from checkpoint "), done.stdout
    (client / "udfs" / "adj.py").unlink()  # the code was stored with version 2

    status = act(server.location, "pipeline.status", {"id": pid})
    assert status["version"] == 2
    history = status["versions"]
    assert [(h["version"], h["sql_sha256"], h["functions"]) for h in history] == [
        (1, hashlib.sha256(V1.encode()).hexdigest(), {"adj": hashlib.sha256(ADJ_V1).hexdigest()}),
        (2, hashlib.sha256(V2.encode()).hexdigest(), {"adj": hashlib.sha256(ADJ_V2).hexdigest()}),
    ]
    assert history[0]["change"] == "submitted"
    assert history[0]["epoch"] is None
    resumed = history[1]["epoch"]
    assert resumed > epoch_before
    assert history[1]["change"] == f"updated from version 1 at checkpoint {resumed}: v2.sql"
    printed = cli("pipelines", "status", *where, pid)
    assert printed.returncode == 0, printed.stderr
    assert f"  2  {history[1]['at']}  sql {history[1]['sql_sha256'][:12]}  functions adj:" in (
        printed.stdout
    ), printed.stdout
    # the same text and code again: nothing to do
    files = {"udfs/adj.py": base64.b64encode(ADJ_V2).decode()}
    same = act(server.location, "pipeline.update", {"id": pid, "sql": V2, "files": files})
    assert (same["changed"], same["version"]) == (False, 2)

    # --- SIGKILL before version 2 took a checkpoint of its own: it resumes version 1's -----
    server.kill()
    server = servers["a"] = ServeProcess(tmp_path / "data", server.port)
    ingest(server.location, batches(61, 6))  # ids 61..120, version 2
    want = expected_rows(60, 120)
    wait_until(lambda: len(stream_rows(server.location, "rows")) >= len(want), "ids 61..120")
    assert by_id(stream_rows(server.location, "rows")) == want  # each row once
    # the window [60 s, 70 s) was open at the update: id 60 by version 1, 61..69 by version 2
    wait_until(
        lambda: len(stream_rows(server.location, "counts")) >= len(expected_counts(60, 120)),
        "the windows up to 120 s",
    )
    assert by_window(stream_rows(server.location, "counts")) == expected_counts(60, 120)
    assert by_id(stream_rows(server.location, "sevens")) == [{"id": i} for i in range(63, 121, 7)]
    status = act(server.location, "pipeline.status", {"id": pid})
    assert (status["state"], status["version"], len(status["versions"])) == ("running", 2, 2)
    logs = lines()
    assert f"stopped at epoch {resumed} for an update" in logs, logs
    after = logs[logs.index(f"stopped at epoch {resumed} for an update") :]
    assert any(m.startswith("resumed from checkpoint") for m in after), logs
    act(server.location, "pipeline.cancel", {"id": pid})


#: a windowed query without functions: per key, count and sum of v over 10 s windows
PLAIN = (
    "SET checkpoint_interval = '100ms';\n"
    "CREATE SOURCE events (id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT, "
    "WATERMARK FOR t AS t) WITH (connector = 'flight', stream = 'events');\n"
    "CREATE SINK counts WITH (connector = 'flight', stream = 'counts');\n"
    "INSERT INTO counts SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total\n"
    "FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;\n"
)


def test_an_update_to_a_text_that_does_not_build_names_its_error_and_changes_nothing(
    servers: dict[str, ServeProcess], tmp_path: Path
) -> None:
    """``cnt(*)`` for ``count(*)``: the new text is built (as submit builds it) before its
    operators are compared, so the update is refused with DataFusion's word on the function and
    its line and column, as submit and run say it. It used to be compared first and refused as
    'aggregates differ: old [count(*) AS n, sum(v) AS total] new [sum(v) AS total]' (the
    unknown call read as no aggregate). Version 1 never stops and goes on."""
    server = servers["a"] = ServeProcess(tmp_path / "data", free_port())
    where = ("--server", server.location)
    (tmp_path / "v1.sql").write_text(PLAIN)
    done = cli("submit", *where, str(tmp_path / "v1.sql"))
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    ingest(server.location, batches(1, 3))  # ids 1..30 (t = id s): windows up to 30 s close
    typo = PLAIN.replace("count(*)", "cnt(*)")
    (tmp_path / "v2.sql").write_text(typo)
    done = cli("pipelines", "update", *where, pid, str(tmp_path / "v2.sql"))
    assert done.returncode == 1, done.stdout
    said = done.stderr.split(" (request id ")[0]
    assert said == (
        "flight-serve: INSERT INTO counts (line 4): Error during planning: Invalid function "
        "'cnt'. Did you mean 'cot'? (line 4, column 56)"
    ), done.stderr
    # submit says the same of the same text
    submitted = cli("submit", *where, "--name", "other", str(tmp_path / "v2.sql"))
    assert submitted.returncode == 1
    assert submitted.stderr.split(" (request id ")[0] == said.replace(
        "flight-serve: ", f"flight-serve: {tmp_path / 'v2.sql'}: "
    ), submitted.stderr

    status = act(server.location, "pipeline.status", {"id": pid})
    assert (status["state"], status["version"], len(status["versions"])) == ("running", 1, 1)
    logs = [x["message"] for x in act(server.location, "pipeline.logs", {"id": pid})["lines"]]
    assert not [m for m in logs if "update" in m], logs  # it never stopped for the update
    ingest(server.location, batches(31, 3))  # ids 31..60: version 1 goes on
    base = datetime(1970, 1, 1)
    # ids i in [s, s + 10) of key k (i % 3): n and sum of i * i % 97, for windows closed by 60 s
    want = sorted(
        (
            {
                "k": k,
                "window_start": base + timedelta(seconds=s),
                "window_end": base + timedelta(seconds=s + 10),
                "n": len(ids),
                "total": sum(v(i) for i in ids),
            }
            for s in range(0, 60, 10)
            for k in "abc"
            if (ids := [i for i in range(max(s, 1), s + 10) if key(i) == k])
        ),
        key=lambda r: (r["window_start"], r["k"]),
    )
    wait_until(
        lambda: len(stream_rows(server.location, "counts")) >= len(want), "windows up to 60 s"
    )
    assert by_window(stream_rows(server.location, "counts")) == want
    act(server.location, "pipeline.cancel", {"id": pid})
