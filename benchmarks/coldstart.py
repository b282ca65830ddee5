"""Cold start: ``flight-serve run`` on a small pipeline file, time to its first output row, vs a
fresh ``python -c "import pyarrow, datafusion"``.

Both sides are fresh processes of the benchmark's interpreter (the venv's), timed with the
monotonic ``time.perf_counter`` from just before ``subprocess.Popen``:

* flight-serve: the ``flight-serve`` console script (next to ``sys.executable``), ``run
  pipeline.sql`` on a small CSV (:data:`ROWS` events, 10 keys, 60 s of event time) with a
  ``TUMBLE(…, 10 s)`` count and sum per key into a ``stdout`` sink in ``jsonl`` format; the clock
  stops when the first row's line is read from its stdout (a pipe; the sink flushes every batch).
  The rest of the output is read, and the exit code checked, untimed.
* baseline: ``python -c "import pyarrow, datafusion; print('imported', flush=True)"``; the clock
  stops when that line is read, i.e. when the imports are done. Both clocks stop at a line on a
  pipe, so neither side pays for interpreter shutdown (tearing down pyarrow, DataFusion and the
  pandas that DataFusion imports); the note gives both sides' time to exit as well.

This is a **time** comparison: ratio = flight-serve seconds / baseline seconds (lower is better;
DESIGN §10 target ≤ 1.5). The harness's one warm-up run per side fills the page cache, so both
sides are "warm" cold starts (a fresh interpreter, files cached), the repeatable case. The
warm-up runs also write the bytecode of every module imported into a cache of the benchmark's own
(``PYTHONPYCACHEPREFIX`` in a temporary directory; ``PYTHONDONTWRITEBYTECODE`` is dropped for the
subprocesses): an installed flight-serve has its ``.pyc`` files, and without them every run would
compile flight-serve's modules again (about 25 ms here).

A third process, timed the same way in the same run, imports the baseline's modules plus sqlglot
(the SQL parser the project uses instead of its own, with the RisingWave dialect flight-serve's
dialect extends): its ratio to the baseline is the floor of the row, what ``run`` cannot go
below while it parses SQL with sqlglot (``figures["sqlglot_floor_ratio"]``).

After timing, three untimed runs of each side under ``python -X importtime`` (per-module medians)
attribute the import time of the modules only ``flight-serve run`` imports, by top-level package
(by subpackage for ``flight_serve``).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from benchmarks._harness import Comparison, alternate

#: Rows in the pipeline's input file.
ROWS = 300

_PIPELINE = """\
CREATE SOURCE events (key VARCHAR, t TIMESTAMP(3), v DOUBLE, WATERMARK FOR t AS t)
WITH (connector = 'file', path = 'events.csv');

CREATE SINK out WITH (connector = 'stdout', format = 'jsonl');

INSERT INTO out
SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND)
GROUP BY key, window_start, window_end;
"""

_BASELINE_CODE = "import pyarrow, datafusion"
#: The floor of ``flight-serve run``'s start: the baseline's imports plus the SQL parser the
#: project uses (sqlglot and the RisingWave dialect it builds on, as ``pipelines.dialect``
#: imports them); none of flight-serve's own modules.
_FLOOR_CODE = (
    "import pyarrow, datafusion, sqlglot; from sqlglot.dialects.risingwave import RisingWave"
)
#: What the baseline prints once its imports are done (the line whose arrival stops its clock).
_BASELINE_LINE = "imported"


def _write_inputs(directory: Path, rows: int) -> int:
    """Write ``events.csv`` (``rows`` events, 10 keys, 5 a second in time order) and
    ``pipeline.sql``; return the number of (key, window) rows the pipeline must print."""
    rng = random.Random(7)
    windows: set[tuple[str, int]] = set()
    lines = ["key,t,v"]
    for i in range(rows):
        key = f"k{rng.randrange(10)}"
        ms = i * 200
        windows.add((key, ms // 10_000))
        seconds, millis = divmod(ms, 1000)
        minutes, seconds = divmod(seconds, 60)
        lines.append(
            f"{key},2024-01-01 00:{minutes:02d}:{seconds:02d}.{millis:03d},{rng.random():.4f}"
        )
    (directory / "events.csv").write_text("\n".join(lines) + "\n")
    (directory / "pipeline.sql").write_text(_PIPELINE)
    return len(windows)


def _environment(pycache: Path) -> dict[str, str]:
    """The subprocesses' environment: this one, but with a bytecode cache of their own
    (``PYTHONPYCACHEPREFIX``, filled by the warm-up runs) even if ``PYTHONDONTWRITEBYTECODE`` is
    set here, as an installed package has its ``.pyc`` files; nothing is written to the tree."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _flight_serve_command() -> list[str]:
    script = Path(sys.executable).parent / "flight-serve"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "flight_serve.cli"]


class _FirstLine:
    """Starts ``command`` and returns when the first line of its stdout has been read (the timed
    part); :meth:`finish` reads the rest and waits for the exit (untimed), then ``check`` judges
    the whole output (returns a problem, or ``""``)."""

    def __init__(
        self,
        command: Sequence[str],
        directory: Path,
        check: Callable[[list[str]], str],
        env: dict[str, str],
    ) -> None:
        self.command = list(command)
        self.directory = directory
        self.env = env
        self.check = check
        self.proc: subprocess.Popen[str] | None = None
        self.stderr: IO[bytes] | None = None
        self.first = ""
        self.started = 0.0
        self.to_exit_s: list[float] = []
        self.problems: list[str] = []

    def __call__(self) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in finish)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.command,
            cwd=self.directory,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline()

    def finish(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        assert self.stderr is not None
        rest = self.proc.stdout.read()
        self.proc.wait()
        self.to_exit_s.append(time.perf_counter() - self.started)
        self.proc.stdout.close()
        self.stderr.seek(0)
        err = self.stderr.read().decode("utf-8", "replace")
        self.stderr.close()
        if self.proc.returncode != 0:
            self.problems.append(f"exit {self.proc.returncode}: {err.strip()[-300:]}")
            return
        problem = self.check([line for line in (self.first + rest).splitlines() if line])
        if problem:
            self.problems.append(problem)

    @property
    def median_to_exit(self) -> float:
        return statistics.median(self.to_exit_s[1:] or self.to_exit_s)  # [0]: the warm-up run


def _rows_check(expected_rows: int) -> Callable[[list[str]], str]:
    def check(lines: list[str]) -> str:
        try:
            rows = [json.loads(line) for line in lines]
        except json.JSONDecodeError:
            return f"not JSON lines: {lines[:2]}"
        if len(rows) != expected_rows or not {"key", "window_start", "n"} <= rows[0].keys():
            return f"{len(rows)} rows, expected {expected_rows}: {rows[:1]}"
        return ""

    return check


def _imported_check(lines: list[str]) -> str:
    return "" if lines == [_BASELINE_LINE] else f"printed {lines[:2]}"


def _import_times(command: Sequence[str], directory: Path, env: dict[str, str]) -> dict[str, int]:
    """Self import time (µs) per module of one ``python -X importtime`` run of ``command``."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    times: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line[len("import time:") :].split("|")
        times[name.strip()] = int(self_us)
    return times


def _median_import_times(
    command: Sequence[str], directory: Path, env: dict[str, str], runs: int
) -> dict[str, float]:
    samples = [_import_times(command, directory, env) for _ in range(runs)]
    names = set().union(*samples)
    return {name: statistics.median(s.get(name, 0) for s in samples) for name in names}


def _group(module: str) -> str:
    """Top-level package, but ``flight_serve.<subpackage>`` for flight-serve's own modules."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "flight_serve" else parts[0]


def _import_note(directory: Path, env: dict[str, str], runs: int = 3) -> str:
    """Where ``flight-serve run``'s import time goes beyond the baseline's (untimed runs under
    ``-X importtime``; per-module medians)."""
    command = _flight_serve_command()
    args = command[1:] if command[0] == sys.executable else command
    run = _median_import_times([*args, "run", "pipeline.sql"], directory, env, runs)
    base = _median_import_times(["-c", _BASELINE_CODE], directory, env, runs)
    extra: dict[str, float] = defaultdict(float)
    for name, us in run.items():
        if name not in base:
            extra[_group(name)] += us
    top = sorted(extra.items(), key=lambda item: -item[1])[:8]
    listed = ", ".join(f"{name} {us / 1000:.0f}" for name, us in top)
    return (
        f"\n  imports (python -X importtime, median of {runs} runs, self times summed): "
        f"flight-serve run {sum(run.values()) / 1000:.0f} ms, bare import "
        f"{sum(base.values()) / 1000:.0f} ms; modules only flight-serve run imports "
        f"{sum(extra.values()) / 1000:.0f} ms, the biggest (ms): {listed}"
    )


def _importing(code: str, directory: Path, env: dict[str, str]) -> _FirstLine:
    """A fresh ``python -c "<code>; print(…)"``, timed to the line it prints after ``code``."""
    command = [sys.executable, "-c", f"{code}; print({_BASELINE_LINE!r}, flush=True)"]
    return _FirstLine(command, directory, _imported_check, env)


def _alternate(
    comparison: Comparison, subject: _FirstLine, baseline: _FirstLine, repeat: int
) -> None:
    alternate(
        comparison,
        subject,
        baseline,
        repeat,
        after_subject=subject.finish,
        after_baseline=baseline.finish,
    )


def coldstart(repeat: int, rows: int = ROWS) -> list[Comparison]:
    """``flight-serve run`` time to first row vs the bare ``import pyarrow, datafusion``."""
    with tempfile.TemporaryDirectory(prefix="flight-serve-coldstart-") as tmp:
        directory = Path(tmp)
        expected = _write_inputs(directory, rows)
        env = _environment(directory / "pycache")
        command = [*_flight_serve_command(), "run", "pipeline.sql"]
        first_row = _FirstLine(command, directory, _rows_check(expected), env)
        imported = _importing(_BASELINE_CODE, directory, env)
        comparison = Comparison(
            name="coldstart",
            subject=f"flight-serve run (CSV, {rows} rows, TUMBLE 10 s, stdout jsonl): first row",
            baseline=f"python -c '{_BASELINE_CODE}; print(…)': the line after the imports",
            units=1,
            unit="start",
            ratio_target=1.5,
            lower_is_better=True,
        )
        _alternate(comparison, first_row, imported, repeat)
        with_sqlglot = _importing(_FLOOR_CODE, directory, env)
        floor = Comparison(
            name="coldstart_floor",
            subject=f"python -c '{_FLOOR_CODE}; print(…)'",
            baseline=f"python -c '{_BASELINE_CODE}; print(…)'",
            units=1,
            unit="start",
            lower_is_better=True,
        )
        imported_again = _importing(_BASELINE_CODE, directory, env)
        _alternate(floor, with_sqlglot, imported_again, repeat)
        comparison.figures["sqlglot_floor_ratio"] = floor.ratio
        problems = [
            *first_row.problems,
            *imported.problems,
            *with_sqlglot.problems,
            *imported_again.problems,
        ]
        if problems:
            comparison.note = "[red]MISMATCH[/red]: " + "; ".join(problems[:3])
        else:
            comparison.note = (
                f"check: every flight-serve run exited 0 and printed the {expected} (key, window) "
                "rows"
            )
        comparison.note += (
            f"\n  for reference, median time to exit: flight-serve run "
            f"{first_row.median_to_exit:.3f} s, the bare import {imported.median_to_exit:.3f} s"
        )
        comparison.note += (
            f"\n  floor: the bare imports plus sqlglot take {floor.ratio:.2f} x the bare imports "
            f"({floor.subject_median:.3f} vs {floor.baseline_median:.3f} s, alternated in the "
            "same run): the row cannot go below that while sqlglot parses the SQL"
        )
        comparison.note += _import_note(directory, env)
        floor.note = "the floor of the coldstart row (issue 19): see coldstart's note"
    return [comparison, floor]
