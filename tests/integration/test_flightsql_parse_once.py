"""One SQL statement, one parse: each Flight SQL (and plain SQL) request parses its statement
with sqlglot at most once and rewrites its ``?`` placeholders at most once.

A real server runs in this process, so counting sqlglot's ``Parser.parse`` (every entry point,
``sqlglot.parse``, ``parse_one`` and ``exp.maybe_parse``, goes through it) and the calls of
``rewrite_placeholders`` counts the server's own work per request. Each request is checked for
its exact counts and for its exact result: a query, a prepared query with bound parameters, an
INSERT (one row, and many parameter rows vectorised into one statement), CREATE / DROP TABLE,
and a query joining a stream with an Iceberg table of the embedded catalog (pyiceberg's real
SqlCatalog), over Flight SQL and as plain SQL text in a CMD descriptor.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.flight.server import start_server
from flight_serve.flight.sql.handler import pack
from google.protobuf import any_pb2
from sqlglot.parser import Parser

pytestmark = pytest.mark.integration

#: The modules that may call ``rewrite_placeholders`` (each binding is counted).
_REWRITERS = (
    "flight_serve.flight.sql.statement",
    "flight_serve.flight.sql.engine",
    "flight_serve.flight.sql.handler",
    "flight_serve.flight.sql.query",
)


class Counts:
    """sqlglot parses and placeholder rewrites since the last :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.parses = 0
        self.rewrites = 0

    def add(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def take(self) -> tuple[int, int]:
        with self._lock:
            taken = (self.parses, self.rewrites)
            self.parses = self.rewrites = 0
            return taken


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    counted = Counts()
    parse = Parser.parse

    def counting_parse(self: Parser, *args: Any, **kwargs: Any) -> Any:
        counted.add("parses")
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(Parser, "parse", counting_parse)
    for name in _REWRITERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        original = getattr(module, "rewrite_placeholders", None)
        if original is None:
            continue

        def counting_rewrite(sql: str, _original: Callable[[str], str] = original) -> str:
            counted.add("rewrites")
            return _original(sql)

        monkeypatch.setattr(module, "rewrite_placeholders", counting_rewrite)
    return counted


@pytest.fixture
def client(tmp_path: Path) -> Iterator[flight.FlightClient]:
    with start_server(tmp_path / "data", fsync="never", pipelines=False) as service:
        service.store.create("flights", pa.schema([("origin", pa.string()), ("n", pa.int64())]))
        service.store.append(
            "flights", pa.record_batch({"origin": ["EWR", "JFK", "LGA"], "n": [1, 2, 3]})
        )
        with flight.connect(service.location) as c:
            yield c


def _command(message: Any) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(pack(message))


def _rows(client: flight.FlightClient, info: flight.FlightInfo) -> list[dict[str, Any]]:
    table = client.do_get(info.endpoints[0].ticket).read_all()
    return table.sort_by([(table.schema.names[0], "ascending")]).to_pylist()


def _update(client: flight.FlightClient, message: Any, params: pa.Table | None = None) -> int:
    writer, reader = client.do_put(
        _command(message), params.schema if params is not None else pa.schema([])
    )
    if params is not None:
        writer.write_table(params)
    writer.done_writing()
    result = reader.read()
    writer.close()
    assert result is not None
    return int(sql_pb2.DoPutUpdateResult.FromString(result.to_pybytes()).record_count)


def _prepare(client: flight.FlightClient, sql: str) -> bytes:
    request = sql_pb2.ActionCreatePreparedStatementRequest(query=sql)
    [body] = list(client.do_action(flight.Action("CreatePreparedStatement", pack(request))))
    wrapper = any_pb2.Any.FromString(body.body.to_pybytes())
    result = sql_pb2.ActionCreatePreparedStatementResult()
    assert wrapper.Unpack(result)
    return bytes(result.prepared_statement_handle)


def _bind(client: flight.FlightClient, handle: bytes, params: pa.Table) -> bytes:
    command = sql_pb2.CommandPreparedStatementQuery(prepared_statement_handle=handle)
    writer, reader = client.do_put(_command(command), params.schema)
    writer.write_table(params)
    writer.done_writing()
    result = reader.read()
    writer.close()
    assert result is not None
    bound = sql_pb2.DoPutPreparedStatementResult.FromString(result.to_pybytes())
    return bytes(bound.prepared_statement_handle)


def test_a_flight_sql_query_is_parsed_once_when_planned_and_once_when_run(
    client: flight.FlightClient, counts: Counts
) -> None:
    """GetFlightInfo of CommandStatementQuery parses and rewrites once; the DoGet of its ticket
    parses once (it needs the Iceberg names) and rewrites nothing (the ticket holds the
    rewritten text)."""
    counts.take()
    query = sql_pb2.CommandStatementQuery(
        query="SELECT origin, n * 10 AS m FROM flights WHERE n > 1"
    )
    info = client.get_flight_info(_command(query))
    assert counts.take() == (1, 1)
    assert _rows(client, info) == [{"origin": "JFK", "m": 20}, {"origin": "LGA", "m": 30}]
    assert counts.take() == (1, 0)
    assert client.get_schema(_command(query)).schema.names == ["origin", "m"]
    assert counts.take() == (1, 1)


def test_a_prepared_query_with_parameters_is_parsed_once_per_request(
    client: flight.FlightClient, counts: Counts
) -> None:
    """CreatePreparedStatement parses once; binding parameters (DoPut) only counts the
    placeholders, so it rewrites once and parses nothing; GetFlightInfo of the bound statement
    parses once; its DoGet parses once and rewrites nothing."""
    counts.take()
    handle = _prepare(client, "SELECT origin, n FROM flights WHERE n >= ? AND origin <> ?")
    assert counts.take() == (1, 1)
    bound = _bind(client, handle, pa.table({"0": [2], "1": ["LGA"]}))
    assert counts.take() == (0, 1)
    command = sql_pb2.CommandPreparedStatementQuery(prepared_statement_handle=bound)
    info = client.get_flight_info(_command(command))
    assert counts.take() == (1, 1)
    assert _rows(client, info) == [{"origin": "JFK", "n": 2}]
    assert counts.take() == (1, 0)


def test_an_insert_is_parsed_once(client: flight.FlightClient, counts: Counts) -> None:
    """An INSERT over DoPut (the role check, the Iceberg-target check, the tables it reads, the
    memory reservation and DataFusion's context all from one parse), and a prepared INSERT run
    for three parameter rows (vectorised into one INSERT … SELECT, still one parse)."""
    counts.take()
    update = sql_pb2.CommandStatementUpdate(
        query="INSERT INTO flights SELECT origin, n + 100 FROM flights"
    )
    assert _update(client, update) == 3
    assert counts.take() == (1, 1)
    handle = _prepare(client, "INSERT INTO flights VALUES (?, ? * 2)")
    assert counts.take() == (1, 1)
    prepared = sql_pb2.CommandPreparedStatementUpdate(prepared_statement_handle=handle)
    params = pa.table({"0": ["BOS", "SFO", "ORD"], "1": [5, 6, 7]})
    assert _update(client, prepared, params) == 3
    assert counts.take() == (1, 1)
    query = sql_pb2.CommandStatementQuery(query="SELECT origin, n FROM flights WHERE n > 3")
    assert _rows(client, client.get_flight_info(_command(query))) == [
        {"origin": "BOS", "n": 10},
        {"origin": "EWR", "n": 101},
        {"origin": "JFK", "n": 102},
        {"origin": "LGA", "n": 103},
        {"origin": "ORD", "n": 14},
        {"origin": "SFO", "n": 12},
    ]


def test_create_and_drop_table_are_parsed_once(client: flight.FlightClient, counts: Counts) -> None:
    """CREATE TABLE … AS SELECT and DROP TABLE: the role (admin for a drop), the name and the
    options come from the one parse."""
    counts.take()
    create = sql_pb2.CommandStatementUpdate(
        query="CREATE TABLE busy AS SELECT origin FROM flights WHERE n >= 2"
    )
    assert _update(client, create) == 2
    assert counts.take() == (1, 1)
    drop = sql_pb2.CommandStatementUpdate(query="DROP TABLE busy")
    assert _update(client, drop) == 0
    assert counts.take() == (1, 1)
    listed = [info.descriptor.path[0] for info in client.list_flights()]
    assert listed == [b"flights"]


def test_an_iceberg_query_is_parsed_once_per_request(
    client: flight.FlightClient, counts: Counts, tmp_path: Path
) -> None:
    """A query joining a stream with an Iceberg table of the embedded catalog: planning
    (schemas), the memory reservation of its data files and the DoGet's snapshot read all use
    the one parse of the request; the same over plain SQL text, which has no ``?`` to rewrite."""
    from pyiceberg.catalog.sql import SqlCatalog

    root = tmp_path / "data" / "iceberg"
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(
        "default", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{root / 'warehouse'}"
    )
    catalog.create_namespace("ops")
    delays = pa.table({"origin": ["EWR", "JFK"], "minutes": [15, 40]})
    catalog.create_table(("ops", "delays"), schema=delays.schema).append(delays)
    sql = "SELECT f.origin, f.n, d.minutes FROM flights f JOIN ops.delays d ON f.origin = d.origin"
    expected = [{"origin": "EWR", "n": 1, "minutes": 15}, {"origin": "JFK", "n": 2, "minutes": 40}]
    counts.take()
    info = client.get_flight_info(_command(sql_pb2.CommandStatementQuery(query=sql)))
    assert counts.take() == (1, 1)
    assert _rows(client, info) == expected
    assert counts.take() == (1, 0)
    plain = client.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
    assert counts.take() == (1, 0)
    assert _rows(client, plain) == expected
    assert counts.take() == (1, 0)
