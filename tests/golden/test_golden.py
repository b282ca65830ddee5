"""Golden pipelines as data: every ``tests/golden/<case>/`` runs through the real
``flight-serve run`` command and must write exactly the files in ``<case>/expected/``.

A case holds ``pipeline.sql`` (sources read paths relative to the case directory), its input files
(CSV or JSON lines) and ``expected/<file>`` for each file its sinks write (sinks write into
``--output-dir``). Files are compared byte for byte, in order: the engine specifies the order
(windows fire in ``window_end`` order; within a step rows are ordered by ``window_end``,
``window_start``, keys). A case lists in ``unordered`` the output files whose row order is not
specified (per-row joins); their data lines are compared sorted, after the header.

Every case also runs **killed and resumed** (STYLE habit 9): ``flight-serve run`` with a checkpoint
after every source batch is killed with SIGKILL at a seeded cut (fault injection,
``FLIGHT_SERVE_CRASH_AT``: right after checkpoint k's manifest, right after its sinks commit, or
in the middle of epoch k + 1), then run again, which resumes from the last complete checkpoint. Its
files must equal ``expected/`` exactly too.

Every case's process starts at once (module fixture) so the set runs in a few seconds.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

HERE = Path(__file__).parent
CASES = sorted(p.parent.name for p in HERE.glob("*/pipeline.sql"))
CLI = Path(sys.executable).parent / "flight-serve"


@dataclass
class Result:
    output_dir: Path
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    root = tmp_path_factory.mktemp("golden")
    running = {}
    for case in CASES:
        out = root / case
        running[case] = (
            out,
            subprocess.Popen(
                [str(CLI), "run", str(HERE / case / "pipeline.sql"), "--output-dir", str(out)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    done = {}
    for case, (out, proc) in running.items():
        stdout, stderr = proc.communicate(timeout=120)
        done[case] = Result(out, proc.returncode, stdout, stderr)
    return done


def _source_batches(case: str) -> int:
    """Source batches of a case, a file's end counting as one (the barriers of a run)."""
    path = HERE / case / "pipeline.sql"
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), load_tables=False)
    return sum(
        sum(1 for _ in source.read_file(i)) + 1
        for source in runtime.sources.values()
        for i in range(len(source.paths))
    )


def _cut(case: str) -> str:
    """A seeded kill point strictly inside the run: ``checkpoint:k``, ``commit:k`` or ``event:k``."""
    rng = random.Random(f"golden-kill-{case}")
    return f"{rng.choice(['checkpoint', 'commit', 'event'])}:{rng.randint(1, _source_batches(case) - 1)}"


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Result, Result]]:
    """Per case: the cut, the killed run and the resumed run (output dir of the resumed one)."""
    root = tmp_path_factory.mktemp("golden-resumed")

    def start(case: str, crash: str | None) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != "FLIGHT_SERVE_CRASH_AT"}
        if crash is not None:
            env["FLIGHT_SERVE_CRASH_AT"] = crash
        command = [str(CLI), "run", str(HERE / case / "pipeline.sql")]
        command += ["--output-dir", str(root / case / "out"), "--checkpoint-every", "1"]
        command += ["--state-root", str(root / case / "state")]
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    cuts = {case: _cut(case) for case in CASES}
    done: dict[str, tuple[str, Result, Result]] = {}
    killed = {case: start(case, cuts[case]) for case in CASES}
    first = {}
    for case, proc in killed.items():
        stdout, stderr = proc.communicate(timeout=120)
        first[case] = Result(root / case / "out", proc.returncode, stdout, stderr)
    again = {case: start(case, None) for case in CASES}
    for case, proc in again.items():
        stdout, stderr = proc.communicate(timeout=120)
        done[case] = (
            cuts[case],
            first[case],
            Result(root / case / "out", proc.returncode, stdout, stderr),
        )
    return done


def _lines(text: str, ordered: bool) -> list[str]:
    lines = text.splitlines()
    if ordered or not lines:
        return lines
    return [lines[0], *sorted(lines[1:])]


def test_cases_exist() -> None:
    assert len(CASES) >= 13
    for case in CASES:
        assert (HERE / case / "expected").is_dir(), f"{case} has no expected/ directory"


def _assert_expected(case: str, result: Result) -> None:
    expected_dir = HERE / case / "expected"
    unordered_file = HERE / case / "unordered"
    unordered = set(unordered_file.read_text().split()) if unordered_file.exists() else set()
    expected = sorted(p.name for p in expected_dir.iterdir())
    written = sorted(p.name for p in result.output_dir.iterdir())
    assert written == expected
    for name in expected:
        want = (expected_dir / name).read_text()
        got = (result.output_dir / name).read_text()
        ordered = name not in unordered
        assert _lines(got, ordered) == _lines(want, ordered), f"{case}/{name}"


@pytest.mark.parametrize("case", CASES)
def test_golden_case(case: str, results: dict[str, Result]) -> None:
    result = results[case]
    assert result.returncode == 0, result.stderr
    _assert_expected(case, result)


@pytest.mark.parametrize("case", CASES)
def test_golden_case_killed_and_resumed(
    case: str, resumed: dict[str, tuple[str, Result, Result]]
) -> None:
    cut, killed, result = resumed[case]
    assert killed.returncode == -9, f"{cut}: the run was not killed: {killed.stderr}"
    assert result.returncode == 0, result.stderr
    assert "resuming from checkpoint" in result.stderr or cut.startswith("event:1"), result.stderr
    _assert_expected(case, result)
