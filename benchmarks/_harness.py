"""Timing and reporting shared by every benchmark: alternate subject and baseline, take medians.

A :class:`Comparison` holds the wall-clock seconds of each repetition of a subject (flight-serve)
and its baseline over the same work (``units`` items: rows or events). Throughput is
``units / median(seconds)``; the ratio is subject throughput / baseline throughput (higher is
better for flight-serve; 1.0 = as fast as the baseline). A slow baseline may process fewer items
(``baseline_units``): the throughputs are still what the ratio compares.

A **time** comparison (``lower_is_better``, e.g. cold start) compares seconds instead: the ratio
is subject median / baseline median and its target is a ceiling.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table


@dataclass
class Comparison:
    """One side-by-side measurement.

    Attributes:
        name: the benchmark's name (``doput``, ``doget``, ``tumbling``...).
        subject: what flight-serve runs; ``baseline``: what it is compared with.
        units: items processed per repetition; ``unit``: their name (``rows``, ``events``).
        baseline_units: items the baseline processes per repetition, when fewer (default
            ``units``).
        lower_is_better: a time comparison: ratio = subject / baseline median seconds, and
            ``ratio_target`` is a ceiling (``≤``); no throughputs are shown.
        nbytes: Arrow bytes moved per repetition (0 when not meaningful).
        subject_s / baseline_s: seconds of each repetition.
        ratio_target: the DESIGN §10 target for the ratio, if any.
        rate_target: the target for the subject's throughput (units/s), if any.
        note: a line printed under the table (checks, caveats).
    """

    name: str
    subject: str
    baseline: str
    units: int
    unit: str
    nbytes: int = 0
    subject_s: list[float] = field(default_factory=list)
    baseline_s: list[float] = field(default_factory=list)
    ratio_target: float | None = None
    rate_target: float | None = None
    note: str = ""
    baseline_units: int | None = None
    lower_is_better: bool = False
    #: extra measured figures by name (``p99_ms`` of a latency, the disk's ``floor_ratio``)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def subject_median(self) -> float:
        return statistics.median(self.subject_s)

    @property
    def baseline_median(self) -> float:
        return statistics.median(self.baseline_s) if self.baseline_s else float("nan")

    @property
    def subject_rate(self) -> float:
        return self.units / self.subject_median

    @property
    def baseline_rate(self) -> float:
        units = self.units if self.baseline_units is None else self.baseline_units
        return units / self.baseline_median

    @property
    def ratio(self) -> float:
        if self.lower_is_better:
            return self.subject_median / self.baseline_median
        return self.subject_rate / self.baseline_rate

    def verdict(self) -> str:
        """``ratio met``/``ratio below`` and ``rate met``/``rate below`` for each target set."""
        parts = []
        if self.ratio_target is not None:
            if self.lower_is_better:
                ok = self.ratio <= self.ratio_target
            else:
                ok = self.ratio >= self.ratio_target
            parts.append("[green]ratio met[/green]" if ok else "[red]ratio below[/red]")
        if self.rate_target is not None:
            ok = self.subject_rate >= self.rate_target
            parts.append("[green]rate met[/green]" if ok else "[red]rate below[/red]")
        return ", ".join(parts) or "-"

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "subject": self.subject,
            "baseline": self.baseline,
            "units": self.units,
            "unit": self.unit,
            "baseline_units": self.baseline_units,
            "lower_is_better": self.lower_is_better,
            "nbytes": self.nbytes,
            "figures": self.figures,
            "subject_s": self.subject_s,
            "baseline_s": self.baseline_s,
            "subject_median_s": self.subject_median,
            "baseline_median_s": self.baseline_median,
            "ratio": self.ratio,
            "ratio_target": self.ratio_target,
            "subject_rate": self.subject_rate,
            "rate_target": self.rate_target,
        }


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes (garbage collected before, not during)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def alternate(
    comparison: Comparison,
    subject: Callable[[], object],
    baseline: Callable[[], object],
    repeat: int,
    *,
    after_subject: Callable[[], object] | None = None,
    after_baseline: Callable[[], object] | None = None,
) -> Comparison:
    """Run subject and baseline ``repeat`` times each, alternating (baseline first on odd
    rounds) so slow drift of a shared machine hits both alike, after one untimed warm-up run of
    each (first-touch page faults, lazy initialisation); ``after_*`` run untimed after every run."""
    for fn, after in ((subject, after_subject), (baseline, after_baseline)):
        fn()
        if after is not None:
            after()
    for round_ in range(repeat):
        order = [(subject, comparison.subject_s, after_subject)]
        order.append((baseline, comparison.baseline_s, after_baseline))
        if round_ % 2:
            order.reverse()
        for fn, times, after in order:
            times.append(timed(fn))
            if after is not None:
                after()
    return comparison


def _rate(value: float, unit: str) -> str:
    return f"{value / 1e6:,.2f} M {unit}/s"


def render(console: Console, comparison: Comparison) -> None:
    """Print one comparison as a rich table: medians, throughputs, the ratio and its target."""
    c = comparison
    title = f"{c.name}: {c.units:,} {c.unit}"
    if c.baseline_units is not None:
        title += f" (baseline: {c.baseline_units:,})"
    table = Table(title=title, title_justify="left")
    table.add_column("side")
    table.add_column("median s", justify="right")
    table.add_column("runs (s)", justify="right")
    if not c.lower_is_better:
        table.add_column("throughput", justify="right")
    if c.nbytes:
        table.add_column("MB/s", justify="right")
    for label, median, runs, rate in (
        (f"flight-serve: {c.subject}", c.subject_median, c.subject_s, c.subject_rate),
        (f"baseline: {c.baseline}", c.baseline_median, c.baseline_s, c.baseline_rate),
    ):
        row = [label, f"{median:.3f}", " ".join(f"{t:.3f}" for t in runs)]
        if not c.lower_is_better:
            row.append(_rate(rate, c.unit))
        if c.nbytes:
            row.append(f"{c.nbytes / median / 1e6:,.0f}")
        table.add_row(*row)
    console.print(table)
    targets = []
    if c.ratio_target is not None:
        targets.append(f"ratio {_bound(c)} {c.ratio_target}")
    if c.rate_target is not None:
        targets.append(f"≥ {c.rate_target / 1e6:g} M {c.unit}/s")
    measure = "seconds" if c.lower_is_better else "throughput"
    console.print(
        f"  ratio (flight-serve / baseline {measure}) = [bold]{c.ratio:.2f}[/bold]"
        + (f"; target {', '.join(targets)}: {c.verdict()}" if targets else "")
    )
    if c.note:
        console.print(f"  {c.note}")
    console.print()


def _bound(comparison: Comparison) -> str:
    return "≤" if comparison.lower_is_better else "≥"


def render_summary(console: Console, comparisons: list[Comparison]) -> None:
    """Print every comparison's ratio first, then throughput and target, in one table."""
    table = Table(title="Summary (medians; ratio = flight-serve / baseline)", title_justify="left")
    for column in ("benchmark", "ratio", "ratio target", "flight-serve", "rate target", "verdict"):
        table.add_column(column, justify="left" if column == "benchmark" else "right")
    for c in comparisons:
        table.add_row(
            c.name,
            f"{c.ratio:.2f}",
            "-" if c.ratio_target is None else f"{_bound(c)} {c.ratio_target}",
            f"{c.subject_median:.3f} s" if c.lower_is_better else _rate(c.subject_rate, c.unit),
            "-" if c.rate_target is None else f"≥ {c.rate_target / 1e6:g} M/s",
            c.verdict(),
        )
    console.print(table)
