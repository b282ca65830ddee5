"""End to end: ``flight-serve run`` parquet -> TUMBLE count/sum -> parquet vs DataFusion's COPY.

Each side is a fresh process over the same Parquet file of synthetic events
(:func:`benchmarks.data.events`: ``key`` int64, ``t`` timestamp[ns, UTC] in event-time order,
``v`` float64), timed from just before ``Popen`` to its exit:

* flight-serve: ``flight-serve run pipeline.sql`` (the venv's console script): a ``file`` source
  (64 Ki-row batches), ``TUMBLE(…, 10 s)`` ``count(*)`` and ``sum(v)`` per key, a ``file``
  sink writing Parquet;
* baseline: ``python -c`` running DataFusion (default session) ``COPY (SELECT key, date_bin(10 s,
  t) …, count(*), sum(v) … GROUP BY …) TO 'out.parquet'`` over the same file.

**The work alone**: each side's median time minus its own median time on a 1,000-event file
(interpreter start, imports, planning), so the ratio compares the work, not the start-up
(``coldstart`` measures that). Ratio = baseline work seconds / flight-serve work seconds
(throughput ratio, higher is better; target ≥ 0.6). The whole-process medians are printed under
the table. Both outputs are read back and checked equal (rows, counts, sums). Two sizes: 10 M
events over 1,000 keys (1,000 s: 100 K windows) and 4 M events over 20,000 keys.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._harness import Comparison
from benchmarks.coldstart import _flight_serve_command
from benchmarks.data import events

PIPELINE = """
CREATE SOURCE events (key BIGINT, t TIMESTAMPTZ(9), v DOUBLE, WATERMARK FOR t AS t)
WITH (connector = 'file', path = '{input}', batch_rows = '65536');
CREATE SINK out WITH (connector = 'file', path = 'out.parquet');
INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end;
"""

BIN = "date_bin(INTERVAL '10 seconds', t, TIMESTAMP '1970-01-01T00:00:00Z')"
DATAFUSION = f"""
import datafusion
ctx = datafusion.SessionContext()
ctx.register_parquet("events", {{input!r}})
ctx.sql(
    "COPY (SELECT key, {BIN} AS window_start, {BIN} + INTERVAL '10 seconds' AS window_end, "
    "count(*) AS n, sum(v) AS total FROM events GROUP BY key, {BIN}) "
    "TO 'df.parquet' STORED AS PARQUET"
).collect()
"""


def _write(path: Path, count: int, keys: int) -> None:
    pq.write_table(events(count, keys), path, row_group_size=1 << 20)


def _time(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def _sorted(table: pa.Table) -> pa.Table:
    table = table.select(["key", "window_start", "n", "total"])
    table = table.set_column(1, "window_start", table["window_start"].cast(pa.int64()))
    return table.sort_by([("key", "ascending"), ("window_start", "ascending")])


def _check(work: Path) -> str:
    got = _sorted(pq.read_table(work / "out.parquet"))
    want = _sorted(pq.read_table(work / "df.parquet"))
    same = (
        got.num_rows == want.num_rows
        and got["key"].equals(want["key"])
        and got["window_start"].equals(want["window_start"])
        and got["n"].cast(pa.int64()).equals(want["n"].cast(pa.int64()))
        and np.allclose(got["total"].to_numpy(), want["total"].to_numpy())
    )
    if same:
        return f"check: both wrote the same {got.num_rows:,} (key, window) rows"
    return f"[red]MISMATCH[/red]: {got.num_rows} vs {want.num_rows} rows"


def _one(repeat: int, count: int, keys: int) -> Comparison:
    with tempfile.TemporaryDirectory(prefix="flight-serve-e2e-") as tmp:
        work = Path(tmp)
        sides: dict[str, dict[str, list[float]]] = {"fs": {}, "df": {}}
        for size, n in (("small", 1_000), ("big", count)):
            data = work / f"{size}.parquet"
            _write(data, n, min(keys, n))
            (work / f"{size}.sql").write_text(PIPELINE.format(input=data))
            commands = {
                "fs": [*_flight_serve_command(), "run", str(work / f"{size}.sql")],
                "df": [sys.executable, "-c", DATAFUSION.format(input=str(data))],
            }
            for side in ("fs", "df"):  # untimed warm-up (page cache, bytecode)
                _time(commands[side], work)
            for round_ in range(repeat):
                order = ("fs", "df") if round_ % 2 == 0 else ("df", "fs")
                for side in order:
                    sides[side].setdefault(size, []).append(_time(commands[side], work))
            if size == "big":
                note = _check(work)
    med = {s: {z: statistics.median(v) for z, v in d.items()} for s, d in sides.items()}
    comparison = Comparison(
        name=f"end_to_end_{count // 1_000_000}m_{keys // 1000}k_keys",
        subject="flight-serve run parquet -> TUMBLE count/sum -> parquet (work: minus 1 K events)",
        baseline="DataFusion COPY (… GROUP BY key, date_bin) process (work: minus 1 K events)",
        units=count,
        unit="events",
        ratio_target=0.6,
    )
    comparison.subject_s = [t - med["fs"]["small"] for t in sides["fs"]["big"]]
    comparison.baseline_s = [t - med["df"]["small"] for t in sides["df"]["big"]]
    comparison.note = (
        f"{note}; whole process: run {med['fs']['big']:.2f} s vs COPY {med['df']['big']:.2f} s "
        f"(ratio {med['df']['big'] / med['fs']['big']:.2f}); on 1,000 events: run "
        f"{med['fs']['small']:.2f} s, COPY {med['df']['small']:.2f} s"
    )
    return comparison


def end_to_end(repeat: int) -> list[Comparison]:
    """The two sizes of the module docstring."""
    return [_one(repeat, 10_000_000, 1_000), _one(repeat, 4_000_000, 20_000)]
