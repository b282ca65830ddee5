"""Checkpoints (DESIGN §10): the throughput cost of a checkpoint every second, and the time to
restore 1 M open windows.

``checkpoints``
    The same pipeline file run twice over the same Parquet file: a file source (64 Ki-row
    batches), ``TUMBLE(…, 10 s)`` with ``count(*)``, ``sum(v)`` and ``count(DISTINCT)`` per key
    (20,000 keys, so every checkpoint snapshots ~20 k open panes plus the buffered rows), and a
    Parquet file sink. Subject: :class:`~flight_serve.pipelines.durable.DurableRuntime` with
    ``checkpoint_interval = '1s'`` (operator snapshots, file offsets, the sink's epoch parts
    fsync-ed and renamed, the manifest written last, on the local disk). Baseline: the embedded
    :class:`~flight_serve.pipelines.runtime.PipelineRuntime`, no checkpoints. Target: ratio ≥ 0.9
    (≤ 10 % overhead). Both runs must write the same rows. ``count(DISTINCT)`` of integers is on
    the folded path (``engine/distinct.py``), so the 4 M events take well under a second and a
    run takes only its last checkpoint (at the end of input): the figure of the issue-19 row.

``checkpoints_100ms``
    The same with ``checkpoint_interval = '100ms'``, so that a run takes several checkpoints in
    the middle of the stream (each snapshots ≈ 20 k open panes with their distinct sets) and
    their cost shows. Informative; same target.

``restore``
    A tumbling operator holding 1,000,000 open windows (1 M keys, one window each, none closed),
    checkpointed with a :class:`~flight_serve.pipelines.checkpoint.CheckpointStore`. Subject:
    restore it: read the snapshot file, decode it (``OperatorSnapshot.from_bytes``) and build the
    operator from it (``build(restore=…)``). Baseline: take the snapshot and write it (the other
    half of the round trip). Target: the restore at ≥ 1 M windows/s, i.e. ≤ 1 s for 1 M windows.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from flight_serve.engine.operator import OperatorSnapshot
from flight_serve.pipelines.checkpoint import CheckpointStore, Manifest, fingerprint, now_utc
from flight_serve.pipelines.durable import DurableRuntime
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.query import parse_window_query
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.runtime import PipelineRuntime

from benchmarks._harness import Comparison, alternate
from benchmarks.data import events

BATCH_ROWS = 65_536
KEYS = 20_000
PIPELINE = """
CREATE SOURCE events (key BIGINT, t TIMESTAMPTZ(9), v DOUBLE, WATERMARK FOR t AS t)
WITH (connector = 'file', path = 'events.parquet', batch_rows = '65536');
CREATE SINK out WITH (connector = 'file', path = 'out.parquet');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total, count(DISTINCT key) AS d
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end;
"""


def checkpoints(repeat: int, count: int = 4_000_000) -> list[Comparison]:
    """A checkpoint every second vs none, then every 100 ms vs none, over ``count`` events
    (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="flight-serve-bench-ckpt-"))
    pq.write_table(events(count, KEYS), work / "events.parquet", row_group_size=BATCH_ROWS)
    plan = parse_pipeline(PIPELINE, base_dir=work)
    return [
        _checkpointed(repeat, count, work, plan, "checkpoints", timedelta(seconds=1)),
        _checkpointed(repeat, count, work, plan, "checkpoints_100ms", timedelta(milliseconds=100)),
    ]


def _checkpointed(
    repeat: int, count: int, work: Path, plan: Any, name: str, interval: timedelta
) -> Comparison:
    taken: list[int] = []
    rows: dict[str, int] = {}

    def durable() -> None:
        runtime = DurableRuntime(
            plan,
            name="bench",
            options=RunOptions(checkpoint_interval=interval),
            state_root=str(work / "state"),
            output_dir=work / "durable",
            resume="fresh",
        )
        for _ in runtime.run():
            pass
        taken.append(runtime.epoch)
        rows["durable"] = pq.read_metadata(work / "durable" / "out.parquet").num_rows

    def straight() -> None:
        runtime = PipelineRuntime(plan, output_dir=work / "straight")
        for _ in runtime.run():
            pass
        rows["straight"] = pq.read_metadata(work / "straight" / "out.parquet").num_rows

    every = f"{interval.total_seconds():g} s"
    comparison = Comparison(
        name=name,
        subject=f"pipeline with a checkpoint every {every}",
        baseline="the same pipeline, no checkpoints",
        units=count,
        unit="events",
        ratio_target=0.9,
    )
    alternate(comparison, durable, straight, repeat)
    same = rows["durable"] == rows["straight"]
    comparison.note = (
        f"{'check' if same else '[red]MISMATCH[/red]'}: both wrote {rows['straight']:,} window "
        f"rows; {min(taken)}-{max(taken)} checkpoints per run (the last one at the end of input)"
    )
    return comparison


def _open_windows(count: int) -> tuple[pa.Schema, object, object]:
    """An operator holding ``count`` open windows: ``count`` keys, one 1-hour window each."""
    sql = (
        "SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total "
        "FROM TUMBLE(input, t, INTERVAL '1' HOUR) GROUP BY key, window_start, window_end"
    )
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "key": np.arange(count, dtype=np.int64),
            "t": pa.array(
                np.full(count, 1_700_000_000_000_000_000, dtype=np.int64)
                + rng.integers(0, 10**9, count),
                pa.timestamp("ns", tz="UTC"),
            ),
            "v": rng.random(count),
        }
    )
    spec = parse_window_query(sql)
    op = spec.build(table.schema)
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        op.process(batch)
    return table.schema, spec, op


def restore(repeat: int, count: int = 1_000_000) -> list[Comparison]:
    """Restore ``count`` open windows from a checkpoint (see the module docstring)."""
    schema, spec, op = _open_windows(count)
    work = Path(tempfile.mkdtemp(prefix="flight-serve-bench-restore-"))
    store = CheckpointStore(str(work))
    epoch = [0]
    restored: list[int] = []

    def take() -> None:
        epoch[0] += 1
        data = op.snapshot().to_bytes()  # type: ignore[attr-defined]
        manifest = Manifest("bench", epoch[0], fingerprint(""), now_utc())
        store.write(manifest, {"op-0.snapshot": data})
        store.prune(1)

    def load() -> None:
        latest = store.latest()
        assert latest is not None
        snapshot = OperatorSnapshot.from_bytes(store.read(latest.epoch, "op-0.snapshot"))
        resumed = spec.build(schema, restore=snapshot)  # type: ignore[attr-defined]
        restored.append(resumed.open_panes + snapshot.buffer.num_rows)

    take()
    comparison = Comparison(
        name="restore",
        subject=f"restore {count:,} open windows (read, decode, build)",
        baseline="take and write the same snapshot",
        units=count,
        unit="windows",
        rate_target=1e6,
    )
    alternate(comparison, load, take, repeat)
    size = (work / f"epoch-{epoch[0]:010d}" / "op-0.snapshot").stat().st_size
    comparison.note = (
        f"{'check' if restored[-1] == count else '[red]MISMATCH[/red]'}: {restored[-1]:,} windows "
        f"restored (panes + buffered rows); snapshot {size / 1e6:,.1f} MB; restore median "
        f"{comparison.subject_median:.3f} s (target ≤ 1 s)"
    )
    return [comparison]
