"""Golden pipelines as data: every ``tests/golden/<case>/`` runs through the real
``flight-serve run`` command and must write exactly the files in ``<case>/expected/``.

A case holds ``pipeline.sql`` (sources read paths relative to the case directory), its input files
(CSV or JSON lines) and ``expected/<file>`` for each file its sinks write (sinks write into
``--output-dir``). Files are compared byte for byte, in order: the engine specifies the order
(windows fire in ``window_end`` order; within a step rows are ordered by ``window_end``,
``window_start``, keys). A case lists in ``unordered`` the output files whose row order is not
specified (per-row joins); their data lines are compared sorted, after the header.

Every case's process starts at once (module fixture) so the set runs in a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def _lines(text: str, ordered: bool) -> list[str]:
    lines = text.splitlines()
    if ordered or not lines:
        return lines
    return [lines[0], *sorted(lines[1:])]


def test_cases_exist() -> None:
    assert len(CASES) >= 13
    for case in CASES:
        assert (HERE / case / "expected").is_dir(), f"{case} has no expected/ directory"


@pytest.mark.parametrize("case", CASES)
def test_golden_case(case: str, results: dict[str, Result]) -> None:
    result = results[case]
    assert result.returncode == 0, result.stderr
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
