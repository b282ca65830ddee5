"""A ``datagen`` source's rows through a real pipeline: each partition's batches DoPut into a
server stream as that partition's writer (a pipeline reading ``connector = 'datagen'``
itself: test_datagen_pipelines.py), a windowed pipeline tails the stream, and its windows
equal DataFusion batch SQL over the same generated table.

The event time has bounded out-of-orderness (jitter ≤ 300 ms) and the source declares
``WATERMARK FOR t AS t - INTERVAL '300' MILLISECOND``, so no row is late and every row is
counted in its window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve import Pipeline
from flight_serve.connectors.datagen import DatagenOptions, DatagenSource
from flight_serve.flight.server import start_server
from flight_serve_client import FlightServeClient

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.int32()), ("v", pa.int64()), ("t", pa.timestamp("ms", "UTC"))])
OPTIONS = {
    "connector": "datagen",
    "rows_per_second": "unlimited",
    "number_of_rows": "6000",
    "partitions": "3",
    "batch_rows": "50",
    "seed": "11",
    "fields.k.min": "0",
    "fields.k.max": "4",
    "fields.v.min": "-100",
    "fields.v.max": "100",
    "fields.t.start": "2026-01-01T00:00:00Z",
    "fields.t.interval": "7ms",
    "fields.t.max_out_of_orderness": "300ms",
}


def _location(service: Any) -> str:
    location = service.location
    if isinstance(location, flight.Location):
        uri = location.uri
        return uri.decode() if isinstance(uri, bytes) else str(uri)
    return str(location)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, FlightServeClient]]:
    with start_server(tmp_path / "data", port=0) as service:
        location = _location(service)
        with FlightServeClient(location) as client:
            yield location, client


def test_datagen_rows_windowed_by_a_pipeline_equal_datafusion_batch_sql(
    server: tuple[str, FlightServeClient],
) -> None:
    location, client = server
    source = DatagenSource(DatagenOptions.from_options(OPTIONS, SCHEMA))
    source.open(None)
    generated: list[pa.RecordBatch] = []
    while not source.done:
        for event in source.poll(0.0, 16):
            if event.kind == "batch":
                assert event.batch is not None
                client.put("events", pa.Table.from_batches([event.batch]), writer=event.partition)
                generated.append(event.batch)
            elif event.kind == "end":
                client.end_input("events", writer=event.partition)
    assert sum(b.num_rows for b in generated) == 6_000

    sql = f"""
    CREATE SOURCE events (k INT, v BIGINT, t TIMESTAMPTZ(3),
        WATERMARK FOR t AS t - INTERVAL '300' MILLISECOND)
    WITH (connector = 'flight', server = '{location}', stream = 'events');
    CREATE SINK out WITH (connector = 'stdout');
    INSERT INTO out
    SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
    FROM TUMBLE(events, t, INTERVAL '2' SECOND)
    GROUP BY k, window_start, window_end;
    """
    batches = [batch for sink, batch in Pipeline.from_sql(sql) if sink == "out"]
    got = {
        (row["k"], row["window_start"], row["n"], row["total"])
        for batch in batches
        for row in batch.to_pylist()
    }

    ctx = datafusion.SessionContext()
    ctx.register_record_batches("generated", [generated])
    expected_table = ctx.sql(
        """
        SELECT k, date_bin(INTERVAL '2 seconds', t, TIMESTAMP '1970-01-01T00:00:00Z') AS ws,
               count(*) AS n, sum(v) AS total
        FROM generated GROUP BY k, ws
        """
    ).to_arrow_table()
    expected = {(row["k"], row["ws"], row["n"], row["total"]) for row in expected_table.to_pylist()}
    assert len(expected) >= 5 * 21  # 5 keys, 42 s of event time in 2 s windows
    assert got == expected
    assert sum(n for _, _, n, _ in got) == 6_000  # no row was late
