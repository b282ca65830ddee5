"""Iceberg sink overhead per epoch commit: ``IcebergSink.commit`` (exactly-once markers) vs a
plain pyiceberg ``Table.append`` of the same batch.

Both sides write to their own table in one real pyiceberg ``SqlCatalog`` on SQLite in a temporary
directory (``file://`` warehouse on local disk), each repetition one commit of the same
:data:`ROWS`-row batch shaped like a window result (``origin``, ``window_start``, ``window_end``
as ``timestamp[ns, UTC]`` as DataFusion makes them, ``departures``, ``avg_delay``):

* flight-serve: ``IcebergSink.commit(epoch, [batch])``: reload the table from the catalog, check
  the markers (table property and snapshot summaries), conform the types (ns → us), then one
  transaction: append with the summary markers + set the marker property, commit;
* baseline: ``table.append(batch)`` on a table object loaded once (the types pre-cast to
  microseconds, which pyiceberg needs), i.e. the least a commit of these rows costs.

A **time** comparison: ratio = flight-serve median seconds / baseline median seconds (lower is
better). DESIGN §10's target is absolute: the sink's overhead per epoch commit (flight-serve
median - baseline median) ≤ 100 ms; the note reports it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa

from benchmarks._harness import Comparison, alternate

#: Rows per epoch (one window result batch).
ROWS = 1_000
#: DESIGN §10: the sink's overhead per epoch commit, in milliseconds.
OVERHEAD_TARGET_MS = 100.0


def _batch(rows: int) -> pa.RecordBatch:
    hour_ns = 3_600 * 10**9
    origins = ["EWR", "JFK", "LGA"]
    starts = pa.array([(i // 3) * hour_ns for i in range(rows)], pa.timestamp("ns", tz="UTC"))
    ends = pa.array([(i // 3 + 1) * hour_ns for i in range(rows)], pa.timestamp("ns", tz="UTC"))
    return pa.record_batch(
        {
            "origin": [origins[i % 3] for i in range(rows)],
            "window_start": starts,
            "window_end": ends,
            "departures": pa.array([i % 40 for i in range(rows)], pa.int64()),
            "avg_delay": pa.array([(i % 17) * 1.5 for i in range(rows)], pa.float64()),
        }
    )


def sink_commit(repeat: int) -> list[Comparison]:
    """The comparison described in the module docstring (``repeat`` commits per side)."""
    from flight_serve.connectors.iceberg import IcebergSink, conform_for_iceberg
    from pyiceberg.catalog.sql import SqlCatalog

    with tempfile.TemporaryDirectory(prefix="bench-iceberg-") as tmp:
        root = Path(tmp)
        (root / "warehouse").mkdir()
        catalog = SqlCatalog(
            "bench",
            uri=f"sqlite:///{root / 'catalog.db'}",
            warehouse=f"file://{root / 'warehouse'}",
        )
        batch = _batch(ROWS)
        plain = conform_for_iceberg(pa.Table.from_batches([batch]))
        catalog.create_namespace("bench")
        table = catalog.create_table("bench.plain", schema=plain.schema)
        sink = IcebergSink(catalog, "bench.marked", writer="bench/out", run="r1")
        epoch = {"n": 0}

        def subject() -> None:
            epoch["n"] += 1
            result = sink.commit(epoch["n"], [batch])
            assert result.committed, result

        def baseline() -> None:
            table.append(plain)

        comparison = Comparison(
            name="iceberg_commit",
            subject=f"IcebergSink.commit ({ROWS:,} rows, markers, reload + check)",
            baseline=f"pyiceberg Table.append ({ROWS:,} rows)",
            units=1,
            unit="commits",
            lower_is_better=True,
        )
        alternate(comparison, subject, baseline, repeat)
        overhead_ms = (comparison.subject_median - comparison.baseline_median) * 1000
        marked = catalog.load_table("bench.marked")
        snapshots = len(marked.metadata.snapshots)
        rows = marked.scan().to_arrow().num_rows
        assert rows == snapshots * ROWS, (rows, snapshots)  # each epoch once
        verdict = "met" if overhead_ms <= OVERHEAD_TARGET_MS else "NOT met"
        comparison.note = (
            f"overhead per epoch commit {overhead_ms:.1f} ms (flight-serve "
            f"{comparison.subject_median * 1000:.1f} ms, plain append "
            f"{comparison.baseline_median * 1000:.1f} ms); target <= "
            f"{OVERHEAD_TARGET_MS:g} ms: {verdict}; {snapshots} epochs, each in the table once"
        )
    return [comparison]
