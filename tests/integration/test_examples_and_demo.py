"""Every file in clients/examples/ and the `flight-serve demo` command, run as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from flight_serve.demo.functions import (
    functions_skip_reason,
    run_functions,
    run_functions_submitted,
)
from flight_serve.demo.nycflights13 import load_airports, load_flights
from flight_serve.flight.service import FlightServeService
from helpers import build_geo_wasm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "clients" / "examples").glob("*.py"))
#: examples that run to completion with only --server (each also has a test of its output)
RUN_AS_IS = {"put_and_query.py", "exchange_windows.py", "nycflights13_source.py"}
#: examples that need a pipeline or a stream to work on: run by the tests named here
DEDICATED = {
    "tail_to_parquet.py": "test_tail_to_parquet_writes_a_pipeline_output_once_across_restarts",
    "enrich_plugin.py": "tests/integration/test_plugins.py",
}

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def location(module_server: FlightServeService) -> str:
    return module_server.location


def run(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}  # rich wraps at 80 columns without a terminal
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=240, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_example_is_run_by_a_test() -> None:
    names = {p.name for p in EXAMPLES}
    assert names <= RUN_AS_IS | set(DEDICATED), names - RUN_AS_IS - set(DEDICATED)
    assert names >= RUN_AS_IS | {"tail_to_parquet.py"}


@pytest.mark.parametrize(
    "example",
    [p for p in EXAMPLES if p.name in RUN_AS_IS],
    ids=[p.name for p in EXAMPLES if p.name in RUN_AS_IS],
)
def test_example_runs_against_a_live_server(example: Path, location: str) -> None:
    out = run(str(example), "--server", location)
    assert out.strip()


def test_put_and_query_output(location: str) -> None:
    out = run(str(ROOT / "clients/examples/put_and_query.py"), "--server", location)
    assert "durable: offset 0, 2 rows" in out
    assert "durable: offset 1, 2 rows" in out
    assert "{'sensor': 'a', 'n': 2, 'total': 5.0}" in out
    assert "{'sensor': 'c', 'n': 1, 'total': 4.0}" in out


def test_exchange_windows_output(location: str) -> None:
    out = run(str(ROOT / "clients/examples/exchange_windows.py"), "--server", location)
    lines = out.splitlines()
    # batch 2 (rows at 9 and 14) moves W to 12 and closes [0,10): home 2, cart 1
    first_windows = [line for line in lines if line.startswith("window:")][:2]
    assert "'page': 'cart'" in first_windows[0]
    assert "'clicks': 1" in first_windows[0]
    assert "'page': 'home'" in first_windows[1]
    assert "'clicks': 2" in first_windows[1]
    assert "late rows: [{'page': 'cart'" in out
    assert lines[-1].startswith("done:")


def test_demo_command_runs_the_three_jobs(tmp_path: Path) -> None:
    """``flight-serve demo`` as ``make demo`` runs it: the three jobs, then the functions step
    with the module built from examples/udfs/geo.rs, embedded and submitted (SIGKILL, restart,
    equal to the straight run)."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (bwrap): the functions step refuses Python without it")
    build_geo_wasm(tmp_path)
    out = run(
        "-m",
        "flight_serve.cli",
        "demo",
        "--data-dir",
        str(tmp_path / "data"),
        "--geo-wasm",
        str(tmp_path / "geo.wasm"),
    )
    # window counts equal DataFusion's batch GROUP BY over the same data (see test_flights_oracle)
    assert "hourly_departures: 19,486 windows from 336,776 rows" in out
    assert "route_load_3h: 608,926 windows from 336,776 rows" in out
    assert "duty_sessions: 333,095 windows from 336,776 rows" in out
    assert "late rows: 0" in out
    flat = " ".join(out.split())  # rich wraps lines at 80 columns when not a terminal
    # which windows the end of input closed, and totals that match the data
    assert (
        "2 windows (from 2014-01-01 04:00 to 2014-01-01 05:00) were still open at the end of "
        "input (watermark 2014-01-01 04:44 UTC): the end of input closed them" in flat
    )
    assert "sum(departures) = 336,776 matches the 336,776 rows read" in flat
    assert "sum(flights) = 1,010,328 matches the 336,776 rows read x 3" in flat
    assert "sum(legs) = 334,264 matches the 334,264 rows read" in flat
    # progress a person can see: the upload and each job's exchange, batch by batch
    assert "DoPut flights" in flat
    assert "336776/336776" in flat
    assert "DoExchange duty_sessions" in flat
    assert "42/42 batches" in flat
    # the user-functions step, embedded then submitted to a server that is SIGKILLed
    assert "functions: 329,174 flights through delay_class (Python, sandboxed)" in flat
    assert "delay classes (late: 69,300, on time: 251,660, None: 8,214) match" in flat
    assert "by `flight-serve submit`, which exited" in flat
    assert "server SIGKILLed with 197,504 flights in" in flat
    assert "restarted: resumed from checkpoint " in flat
    assert (
        "329,174 rows in classified, EQUAL to the straight run's 329,174, row for row" in flat
    )


def test_the_functions_step_says_why_it_cannot_run(tmp_path: Path) -> None:
    missing = tmp_path / "none.wasm"
    why = functions_skip_reason(missing)
    if shutil.which("bwrap") is None:
        assert why == "bwrap is not installed (make bubblewrap), so Python functions are refused"
    else:
        assert why == f"{missing} is missing (make wasm-examples builds it with Debian's rustc)"


def flights_sql(flights: pa.Table, airports: pa.Table, sql: str) -> pa.Table:
    """DataFusion batch SQL over the tables ``flights`` and ``airports``: the oracle."""
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("flights", [flights.to_batches()])
    ctx.register_record_batches("airports", [airports.to_batches()])
    return ctx.sql(sql).to_arrow_table()


def test_demo_functions_step_runs_python_and_wasm_over_the_flights(tmp_path: Path) -> None:
    """``flight-serve demo``'s last step: delay_class (Python, sandboxed) and great_circle (wasm
    built from examples/udfs/geo.rs) over every flight with both airports known, against
    DataFusion batch SQL over the same join."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (bwrap)")
    build_geo_wasm(tmp_path)
    wasm = tmp_path / "geo.wasm"
    flights, airports = load_flights(), load_airports()
    result = run_functions(flights, airports, wasm)
    oracle = flights_sql(
        flights,
        airports,
        "SELECT CASE WHEN dep_delay > 15 THEN 'late' WHEN dep_delay IS NULL THEN NULL "
        "ELSE 'on time' END AS c, count(*) AS n FROM flights f "
        "JOIN airports o ON f.origin = o.faa JOIN airports d ON f.dest = d.faa GROUP BY c",
    )
    want = {row["c"]: row["n"] for row in oracle.to_pylist()}
    assert want == {"late": 69_300, "on time": 251_660, None: 8_214}
    assert result.classes == want
    assert result.rows.num_rows == 329_174
    assert result.rows.column_names == [
        "origin", "dest", "distance", "delay_class", "great_circle_miles",
    ]  # fmt: skip
    # the haversine on a sphere vs the published distance: within 9 miles on every route
    assert 0 < result.max_miles_off < 9.0


def test_demo_functions_submitted_resume_after_a_sigkill_as_the_straight_run(
    tmp_path: Path,
) -> None:
    """The functions step submitted: 40 % of the flights in, submit (the client process exits),
    a checkpoint, 20 % more, SIGKILL as soon as they are durable, the client's files deleted,
    restart, the last 40 % and end of input. The output equals the straight (embedded) run row
    for row, and DataFusion batch SQL over the same join computing both functions with built-ins
    (the haversine with Rust's formula, to 1e-9 miles)."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (bwrap)")
    build_geo_wasm(tmp_path)
    flights, airports = load_flights(), load_airports()
    steps: list[str] = []
    result = run_functions_submitted(flights, airports, tmp_path / "geo.wasm", on_step=steps.append)
    assert result.input_rows == 329_174
    assert result.input_before_kill == 329_174 * 3 // 5
    assert 0 < result.rows_before_kill <= result.input_before_kill
    assert result.epoch_before_kill >= 1
    assert result.rows.num_rows == result.straight_rows.num_rows == 329_174
    assert result.equal
    assert steps[0].endswith("by `flight-serve submit`, which exited")
    # the restart resumed from the checkpoint seen before the kill (or one that completed after)
    assert result.resumed in {
        f"resumed from checkpoint {result.epoch_before_kill + k}" for k in (0, 1)
    }, result.resumed

    oracle = flights_sql(
        flights,
        airports,
        "SELECT f.origin, f.dest, f.distance, "
        "CASE WHEN dep_delay > 15 THEN 'late' WHEN dep_delay IS NULL THEN NULL "
        "ELSE 'on time' END AS delay_class, "
        "2.0 * 3958.7613 * asin(sqrt(power(sin((radians(d.lat) - radians(o.lat)) / 2.0), 2) "
        "+ cos(radians(o.lat)) * cos(radians(d.lat)) "
        "* power(sin(radians(d.lon - o.lon) / 2.0), 2))) AS great_circle_miles "
        "FROM flights f JOIN airports o ON f.origin = o.faa JOIN airports d ON f.dest = d.faa "
        "ORDER BY 1, 2, 3, 4 NULLS LAST",
    )
    got = result.rows.to_pylist()
    want = oracle.to_pylist()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert {k: g[k] for k in ("origin", "dest", "distance", "delay_class")} == {
            k: w[k] for k in ("origin", "dest", "distance", "delay_class")
        }
        assert abs(g["great_circle_miles"] - w["great_circle_miles"]) < 1e-9, (g, w)


def stream_table(location: str, stream: str) -> tuple[pa.Table, dict[str, Any]]:
    """The stream's rows (DoGet of its FlightInfo ticket) and its FlightInfo metadata."""
    with flight.connect(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
        table = client.do_get(info.endpoints[0].ticket).read_all()
    return table, json.loads(info.app_metadata)


def sql_rows(location: str, sql: str) -> list[dict[str, Any]]:
    with flight.connect(location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
        return list(client.do_get(info.endpoints[0].ticket).read_all().to_pylist())


def test_nycflights13_source_output(location: str) -> None:
    """The source example loads the first 20,000 flights (file order) as writer ``nyc``, in
    batches of 4,000 rows, and ends its input: the stream holds exactly those rows, with the
    types and the ``sched_dep`` event time of flight_serve's own nycflights13 reader."""
    out = run(
        str(ROOT / "clients/examples/nycflights13_source.py"),
        *("--server", location, "--stream", "ex_flights", "--writer", "nyc"),
        *("--limit", "20000", "--batch-rows", "4000", "--replace"),
    )
    assert "durable: 4,000 of 20,000 rows (offset 0)" in out
    assert "durable: 20,000 of 20,000 rows (offset 4)" in out
    assert "done: 20,000 rows in 5 batches as writer 'nyc' of stream 'ex_flights'; end of " in out
    assert "end of input at offset 5" in out
    table, metadata = stream_table(location, "ex_flights")
    assert table.equals(load_flights().slice(0, 20_000))
    assert metadata["writers"]["nyc"]["ended_at"] == 5
    assert metadata["next_offset"] == 6


HOURLY = """
CREATE SOURCE ex_flights2 (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'flight', stream = 'ex_flights2');
CREATE SINK ex_hourly WITH (connector = 'flight', stream = 'ex_hourly');
INSERT INTO ex_hourly
SELECT origin, window_start, window_end, count(*) AS departures
FROM TUMBLE(ex_flights2, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, window_start, window_end;
"""


def test_tail_to_parquet_writes_a_pipeline_output_once_across_restarts(
    location: str, tmp_path: Path
) -> None:
    """A submitted pipeline counts departures per origin and hour over 30,000 flights loaded by
    the source example (in event-time order: no row is late; 15 batches, so the output comes
    in several entries); the sink example tails its output stream into Parquet files of at
    least 100 rows (whole entries): a first run stops after 300 rows in files (--max-rows), a
    second one resumes after the last file and stops when the stream is idle for 2 s. Together
    the files hold the output stream row for row, each row once, which equals the hourly
    GROUP BY over the flights."""
    run(
        str(ROOT / "clients/examples/nycflights13_source.py"),
        *("--server", location, "--stream", "ex_flights2", "--limit", "30000", "--sort"),
        *("--batch-rows", "2000"),
    )
    with flight.connect(location) as client:
        body = json.dumps({"sql": HOURLY, "name": "ex_hourly"}).encode()
        (result,) = client.do_action(flight.Action("pipeline.submit", body))
        pid = json.loads(result.body.to_pybytes())["id"]
    oracle = sql_rows(
        location,
        "SELECT origin, date_trunc('hour', sched_dep) AS window_start, count(*) AS departures "
        "FROM ex_flights2 GROUP BY 1, 2",
    )
    deadline = time.monotonic() + 60
    while len(sql_rows(location, "SELECT origin FROM ex_hourly")) < len(oracle):
        assert time.monotonic() < deadline, "the pipeline did not emit every window"
        time.sleep(0.2)
    out_dir = tmp_path / "parquet"
    tail = str(ROOT / "clients/examples/tail_to_parquet.py")
    common = ("--server", location, "--stream", "ex_hourly", "--out-dir", str(out_dir))
    first = run(tail, *common, "--rows-per-file", "100", "--max-rows", "300")
    assert "tailing 'ex_hourly' from offset 0 into" in first
    assert "rows written (--max-rows)" in first
    files_first = sorted(out_dir.glob("part-*.parquet"))
    assert sum(pq.read_metadata(f).num_rows for f in files_first) >= 300
    second = run(tail, *common, "--rows-per-file", "100", "--idle-seconds", "2")
    resumed_at = int(files_first[-1].stem.split("-")[2]) + 1
    assert f"tailing 'ex_hourly' from offset {resumed_at} into" in second
    # the pipeline's input ended, so it finished and marked its sink's end of input: the tail
    # stops there rather than after 2 s of silence
    assert "done (every writer ended its input)" in second

    files = sorted(out_dir.glob("part-*.parquet"))
    written = pa.concat_tables([pq.read_table(f) for f in files])
    stream, _ = stream_table(location, "ex_hourly")
    assert written.equals(stream)  # every row once, in stream order
    keys = [(r["origin"], r["window_start"]) for r in written.to_pylist()]
    assert len(keys) == len(set(keys)) == len(oracle)
    got = {(r["origin"], r["window_start"]): r["departures"] for r in written.to_pylist()}
    assert got == {(r["origin"], r["window_start"]): r["departures"] for r in oracle}
    with flight.connect(location) as client:
        body = json.dumps({"id": pid}).encode()
        list(client.do_action(flight.Action("pipeline.cancel", body)))
