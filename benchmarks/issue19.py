"""The table of issue 19 ("a streaming engine within reach of batch DataFusion"), every row,
filled from the comparisons of one ``benchmarks.run`` (``make bench`` runs them all).

A row whose benchmark did not run in this invocation says which one to run; a row no benchmark
measures yet says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from benchmarks._harness import Comparison


@dataclass(frozen=True)
class Row:
    measure: str
    target: str
    benchmark: str | None  #: the comparison's name (None: not measured, ``reason`` says why)
    now: Callable[[Comparison], str] | None = None
    met: Callable[[Comparison], bool] | None = None
    reason: str = ""


def _ratio(c: Comparison) -> str:
    return f"{c.ratio:.2f} ({c.subject_rate / 1e6:.1f} vs {c.baseline_rate / 1e6:.1f} M {c.unit}/s)"


def _rate(c: Comparison) -> str:
    return f"{c.subject_rate / 1e6:.2f} M {c.unit}/s"


def _doput(c: Comparison) -> str:
    text = _ratio(c)
    if "floor_ratio" in c.figures:
        text += (
            f"; disk O_DIRECT {c.figures['disk_gb_s']:.2f} GB/s, "
            f"disk-bound ceiling {c.figures['floor_ratio']:.2f}"
        )
    return text


def _tail(c: Comparison) -> str:
    f = c.figures
    return (
        f"p50 {f['p50_ms']:.1f} / p99 {f['p99_ms']:.1f} ms (floor DoPut -> tail: "
        f"p50 {f['floor_p50_ms']:.1f} / p99 {f['floor_p99_ms']:.1f} ms)"
    )


def _coldstart(c: Comparison) -> str:
    text = f"{c.ratio:.2f}"
    if "sqlglot_floor_ratio" in c.figures:
        text += f" (floor: the imports plus sqlglot alone {c.figures['sqlglot_floor_ratio']:.2f})"
    return text


ROWS = (
    Row("tumbling vs DataFusion batch GROUP BY (10 M events, 1 K keys)", "≥ 0.8", "tumbling",
        _ratio, lambda c: c.ratio >= 0.8),
    Row("end to end: run parquet → TUMBLE → parquet vs DataFusion COPY, 10 M / 1 K keys, work "
        "alone", "≥ 0.6", "end_to_end_10m_1k_keys", _ratio, lambda c: c.ratio >= 0.6),
    Row("the same, 4 M events, 20 K keys", "≥ 0.6", "end_to_end_4m_20k_keys", _ratio,
        lambda c: c.ratio >= 0.6),
    Row("session (gap 5 s, 4 M events)", "≥ 5 M events/s", "session", _rate,
        lambda c: c.subject_rate >= 5e6),
    Row("hopping (size/slide 4)", "≥ 10 M events/s", "hopping", _rate,
        lambda c: c.subject_rate >= 10e6),
    Row("checkpointed pipeline with count(DISTINCT), 20 K keys", "≥ 5 M events/s",
        "checkpoints", _rate, lambda c: c.subject_rate >= 5e6),
    Row("DoPut into a durable stream vs raw pyarrow DoPut", "≥ 0.8", "doput", _doput,
        lambda c: c.ratio >= 0.8),
    Row("DoGet of a query result vs raw pyarrow DoGet", "≥ 0.9", "doget", _ratio,
        lambda c: c.ratio >= 0.9),
    Row("vs Bytewax on the same job", "≥ 200 x", "bytewax", lambda c: f"{c.ratio:.1f} x",
        lambda c: c.ratio >= 200),
    Row("cold start to first row vs bare imports", "≤ 1.1", "coldstart",
        _coldstart, lambda c: c.ratio <= 1.1),
    Row("a window's result at a tailing client after the batch that closed it",
        "p99 ≤ 10 ms", "tail_latency_every_batch", _tail,
        lambda c: c.figures["p99_ms"] <= 10),
    Row("peer engine on the same job (Pathway)", "results equal", "pathway",
        lambda c: f"{c.ratio:.0f} x; results "
        + ("equal" if c.figures.get("results_equal") else "DIFFER"),
        lambda c: c.figures.get("results_equal") == 1.0),
)  # fmt: skip


def render(console: Console, comparisons: list[Comparison]) -> None:
    """Print every row of the issue's table with this run's figure, or why there is none."""
    by_name = {c.name: c for c in comparisons}
    table = Table(title="Issue 19: every row of its table (this run)", title_justify="left")
    for column in ("measure", "target", "now", "verdict"):
        table.add_column(column)
    for row in ROWS:
        c = by_name.get(row.benchmark) if row.benchmark else None
        if c is not None and row.now is not None and row.met is not None:
            table.add_row(row.measure, row.target, row.now(c), "met" if row.met(c) else "below")
        elif row.benchmark is None:
            table.add_row(row.measure, row.target, row.reason, "not measurable")
        else:
            bench = row.benchmark.split("_every")[0]
            bench = "end_to_end" if bench.startswith("end_to_end") else bench
            table.add_row(row.measure, row.target, f"not run (python -m benchmarks.run {bench})",
                          "-")  # fmt: skip
    console.print(table)
