"""Flight SQL through the ADBC driver vs plain Flight, same server process, same data.

* ``flightsql_fetch``: ``adbc_driver_flightsql.dbapi`` ``cursor.execute("SELECT * FROM s")`` +
  ``fetch_arrow_table()`` against flight-serve (CreatePreparedStatement, GetFlightInfo of the
  prepared statement, DoGet, the Go driver decoding into Arrow C data) vs raw ``pyarrow.flight``
  GetFlightInfo + DoGet of the same table held in memory by a minimal pyarrow server
  (``RecordBatchStream``): the DoGet baseline of ``flight_io.doget``.
* ``flightsql_ingest``: ``cursor.adbc_ingest("bench", table, mode="replace")`` (DoPut with
  CommandStatementIngest) vs :meth:`FlightServeClient.put` (plain DoPut to a path descriptor)
  of the same batches, both into durable flight-serve streams (fsync per batch).

All servers run in this process on loopback ports, as does the client (the Go driver runs its own
threads inside this process), so both sides pay the same gRPC costs.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import adbc_driver_flightsql.dbapi as adbc_flightsql
import pyarrow as pa
import pyarrow.flight as flight
from flight_serve_client import FlightServeClient

from benchmarks._harness import Comparison, alternate
from benchmarks.data import flights_like
from benchmarks.flight_io import BATCH_ROWS, TableServer, _raw_get, _uri

FETCH_ROWS = 10_000_000
INGEST_ROWS = 2_000_000


@contextlib.contextmanager
def _server(fsync: Literal["batch", "never"]) -> Iterator[Any]:
    from flight_serve.flight.server import start_server

    with (
        tempfile.TemporaryDirectory(prefix="flight-serve-bench-") as data_dir,
        start_server(Path(data_dir), port=0, fsync=fsync) as service,
    ):
        yield service


def fetch(repeat: int, rows: int = FETCH_ROWS) -> list[Comparison]:
    """ADBC ``fetch_arrow_table`` of ``SELECT * FROM s`` (``rows`` flights-like rows) vs raw
    pyarrow GetFlightInfo + DoGet of the same table."""
    batches = flights_like(rows, BATCH_ROWS)
    table = pa.Table.from_batches(batches)
    comparison = Comparison(
        name="flightsql_fetch",
        subject="ADBC Flight SQL execute + fetch_arrow_table (SELECT * FROM s)",
        baseline="raw pyarrow GetFlightInfo + DoGet of the table in memory",
        units=rows,
        unit="rows",
        nbytes=table.nbytes,
        ratio_target=0.7,
    )
    seen: dict[str, int] = {}
    with (
        _server("never") as service,
        TableServer(table) as raw_server,
        flight.FlightClient(f"grpc://127.0.0.1:{raw_server.port}") as raw,
        adbc_flightsql.connect(_uri(service.location), autocommit=True) as conn,
    ):
        service.store.create("s", table.schema)
        for batch in batches:
            service.store.append("s", batch)

        def adbc_fetch() -> None:
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM s")
                seen["subject"] = cur.fetch_arrow_table().num_rows

        alternate(
            comparison,
            adbc_fetch,
            lambda: seen.__setitem__("baseline", _raw_get(raw).num_rows),
            repeat,
        )
    comparison.note = (
        f"check: both returned {rows:,} rows"
        if seen == {"subject": rows, "baseline": rows}
        else f"[red]MISMATCH[/red]: {seen}"
    )
    return [comparison]


def ingest(repeat: int, rows: int = INGEST_ROWS) -> list[Comparison]:
    """ADBC ``adbc_ingest`` (replace) of ``rows`` flights-like rows in 64 Ki-row batches vs
    :meth:`FlightServeClient.put` of the same batches; both durable."""
    batches = flights_like(rows, BATCH_ROWS)
    table = pa.Table.from_batches(batches)
    comparison = Comparison(
        name="flightsql_ingest",
        subject="ADBC adbc_ingest(mode='replace'): DoPut with CommandStatementIngest",
        baseline="FlightServeClient.put: plain DoPut to a path descriptor",
        units=rows,
        unit="rows",
        nbytes=table.nbytes,
    )
    stored: list[int] = []
    with (
        _server("batch") as service,
        FlightServeClient(_uri(service.location)) as client,
        adbc_flightsql.connect(_uri(service.location), autocommit=True) as conn,
    ):

        def adbc_ingest() -> None:
            with conn.cursor() as cur:
                cur.adbc_ingest("bench", table, mode="replace")

        def after() -> None:
            stored.append(service.store.info("bench").num_rows)
            service.store.drop("bench")

        alternate(
            comparison,
            adbc_ingest,
            lambda: client.put("bench", batches, batch_rows=BATCH_ROWS),
            repeat,
            after_subject=after,
            after_baseline=after,
        )
    comparison.note = (
        f"check: the stream held {rows:,} rows after every ingest and every put"
        if all(n == rows for n in stored)
        else f"[red]MISMATCH[/red]: stream rows {stored}"
    )
    return [comparison]
