"""Every file in clients/examples/ and the `flight-serve demo` command, run as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flight_serve.flight.server import start_server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "clients" / "examples").glob("*.py"))

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def location(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_server(tmp_path_factory.mktemp("data")) as service:
        yield service.location


def run(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}  # rich wraps at 80 columns without a terminal
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=240, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_example_is_listed() -> None:
    assert {p.name for p in EXAMPLES} >= {"put_and_query.py", "exchange_windows.py"}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_against_a_live_server(example: Path, location: str) -> None:
    out = run(str(example), "--server", location)
    assert out.strip()


def test_put_and_query_output(location: str) -> None:
    out = run(str(ROOT / "clients/examples/put_and_query.py"), "--server", location)
    assert "durable: offset 0, 2 rows" in out
    assert "durable: offset 1, 2 rows" in out
    assert "{'sensor': 'a', 'n': 2, 'total': 5.0}" in out
    assert "{'sensor': 'c', 'n': 1, 'total': 4.0}" in out


def test_exchange_windows_output(location: str) -> None:
    out = run(str(ROOT / "clients/examples/exchange_windows.py"), "--server", location)
    lines = out.splitlines()
    # batch 2 (rows at 9 and 14) moves W to 12 and closes [0,10): home 2, cart 1
    first_windows = [line for line in lines if line.startswith("window:")][:2]
    assert "'page': 'cart'" in first_windows[0]
    assert "'clicks': 1" in first_windows[0]
    assert "'page': 'home'" in first_windows[1]
    assert "'clicks': 2" in first_windows[1]
    assert "late rows: [{'page': 'cart'" in out
    assert lines[-1].startswith("done:")


def test_demo_command_runs_the_three_jobs(tmp_path: Path) -> None:
    out = run("-m", "flight_serve.cli", "demo", "--data-dir", str(tmp_path / "data"))
    # window counts equal DataFusion's batch GROUP BY over the same data (see test_flights_oracle)
    assert "hourly_departures: 19,486 windows from 336,776 rows" in out
    assert "route_load_3h: 608,926 windows from 336,776 rows" in out
    assert "duty_sessions: 333,095 windows from 336,776 rows" in out
    assert "late rows: 0" in out
