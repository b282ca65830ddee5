"""Flight SQL through the real ADBC driver (``adbc-driver-flightsql``, a Go driver nobody on this
team wrote), against an in-process flight-serve server (one per test, STYLE habit 6).

Everything goes through ``adbc_driver_flightsql.dbapi``, the way a pandas / polars user connects.
flight-serve reports transactions as unsupported, so connections use ``autocommit=True`` (without
it the DB-API layer warns that it cannot turn autocommit off).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_manager import AdbcStatusCode, ProgrammingError
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.demo.nycflights13 import load_flights
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve.flight.sql.handler import pack

pytestmark = pytest.mark.integration

T_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string())])


@pytest.fixture
def server(start_flight_server: Callable[..., FlightServeService]) -> FlightServeService:
    """The shared server factory's, with fsync off and a table ``t`` of three rows."""
    service = start_flight_server(fsync="never")
    service.store.create("t", T_SCHEMA)
    service.store.append("t", pa.record_batch({"a": [1, 2, 3], "b": ["x", "y", "z"]}))
    return service


@pytest.fixture(scope="module")
def flights() -> pa.Table:
    return load_flights()


def connect(service: FlightServeService, **db_kwargs: str) -> Any:
    return flightsql.connect(service.location, db_kwargs=db_kwargs or None, autocommit=True)


def plain_flight_query(service: FlightServeService, sql: str) -> pa.Table:
    with flight.connect(service.location) as client:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
        return pa.concat_tables(
            [client.do_get(e.ticket).read_all() for e in info.endpoints], promote_options="none"
        )


def fetch(service: FlightServeService, sql: str, parameters: Any = None) -> pa.Table:
    with connect(service) as conn, conn.cursor() as cur:
        cur.execute(sql, parameters)
        table: pa.Table = cur.fetch_arrow_table()
        return table


def run_select_1(service: FlightServeService, credentials: dict[str, str]) -> None:
    with connect(service, **credentials) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1")


def run_select_1_at(location: str) -> None:
    with flightsql.connect(location, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1")


def read_to_the_end(reader: Any) -> None:
    while True:
        reader.read_next_batch()


# --- connecting ---------------------------------------------------------------------------------


def test_connect_without_credentials_to_an_open_server(server: FlightServeService) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 AS one")
        assert cur.fetchall() == [(1,)]
        assert conn.adbc_get_info()["vendor_name"] == "flight-serve"


def test_an_open_server_accepts_any_user_and_password(server: FlightServeService) -> None:
    with connect(server, username="anyone", password="anything") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM t")
        assert cur.fetchall() == [(3,)]


def test_connect_with_user_and_password(tmp_path: Path) -> None:
    with start_server(tmp_path, fsync="never", users={"alice": "s3cret:x"}) as service:
        with connect(service, username="alice", password="s3cret:x") as conn, conn.cursor() as cur:
            cur.execute("SELECT 41 + 1 AS answer")
            assert cur.fetchall() == [(42,)]
        for credentials in (
            {},
            {"username": "alice", "password": "wrong"},
            {"username": "bob", "password": "s3cret:x"},
        ):
            with pytest.raises(ProgrammingError) as caught:
                run_select_1(service, credentials)
            assert caught.value.status_code == AdbcStatusCode.UNAUTHENTICATED


def test_a_bearer_token_from_the_basic_handshake_works_on_later_calls(tmp_path: Path) -> None:
    with (
        start_server(tmp_path, fsync="never", users={"alice": "pw"}) as service,
        flight.connect(service.location) as client,
    ):
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_flights())
        header = client.authenticate_basic_token(b"alice", b"pw")
        assert header[0] == b"authorization"
        assert header[1].startswith(b"Bearer ")
        options = flight.FlightCallOptions(headers=[header])
        assert list(client.list_flights(options=options)) == []
        bad = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer nope")])
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_flights(options=bad))


# --- queries --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t ORDER BY a",
        "SELECT b, a * 10 AS a10 FROM t WHERE a >= 2 ORDER BY b DESC",
        "SELECT count(*) AS n, sum(a) AS total FROM t",
        "SELECT arrow_cast(b, 'Utf8View') AS v FROM t ORDER BY v",
    ],
)
def test_execute_and_fetch_arrow_table_equal_plain_flight(
    server: FlightServeService, sql: str
) -> None:
    assert fetch(server, sql).equals(plain_flight_query(server, sql), check_metadata=True)


def test_a_false_filter_returns_no_rows_and_keeps_the_schema(server: FlightServeService) -> None:
    table = fetch(server, "SELECT a, b FROM t WHERE false")
    assert table.num_rows == 0
    assert table.schema == T_SCHEMA


def test_execute_with_parameters(server: FlightServeService) -> None:
    table = fetch(server, "SELECT a, b FROM t WHERE a > ? AND b <> ? ORDER BY a", (1, "z"))
    assert table.to_pylist() == [{"a": 2, "b": "y"}]
    table = fetch(server, "SELECT a FROM t WHERE b = $1", ["x"])
    assert table.to_pylist() == [{"a": 1}]


@pytest.mark.parametrize(
    ("sql", "parameters", "message"),
    [
        ("SELECT ? AS a", (1, 2), "the statement has 1 placeholder; 2 parameters were bound"),
        ("SELECT 1 AS a", (1,), "the statement has 0 placeholders; 1 parameter was bound"),
        ("SELECT ? AS a, ? AS b", (1,), "the statement has 2 placeholders; 1 parameter was bound"),
        ("SELECT $2 AS a", (1,), "the statement has 2 placeholders; 1 parameter was bound"),
        ("SELECT $1 AS a, $1 + 1 AS b", (1, 2), "the statement has 1 placeholder; 2 parameters"),
        ("SELECT '?' AS q, ? AS a", (1, 2), "the statement has 1 placeholder; 2 parameters"),
        ("INSERT INTO t VALUES (?, ?)", (1, "a", 3), "the statement has 2 placeholders; 3 par"),
        ("INSERT INTO t VALUES (3, 'c')", (1,), "the statement has 0 placeholders; 1 parameter"),
    ],
)
def test_parameters_that_do_not_match_the_placeholders_are_refused_with_both_counts(
    server: FlightServeService, sql: str, parameters: tuple[Any, ...], message: str
) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        with pytest.raises(ProgrammingError) as refused:
            cur.execute(sql, parameters)
        assert refused.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
        assert message in str(refused.value)
    assert server.store.info("t").num_rows == 3  # nothing was inserted


def test_executemany_rows_longer_or_shorter_than_the_placeholders_are_refused(
    server: FlightServeService,
) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        for rows, message in (
            ([(1, "a", 3), (2, "b", 4)], "the statement has 2 placeholders; 3 parameters were"),
            ([(1,), (2,)], "the statement has 2 placeholders; 1 parameter was bound"),
        ):
            with pytest.raises(ProgrammingError) as refused:
                cur.executemany("INSERT INTO t VALUES (?, ?)", rows)
            assert refused.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
            assert message in str(refused.value)
        cur.executemany("INSERT INTO t VALUES (?, ?)", [(7, "g")])  # the matching shape runs
    assert server.store.info("t").num_rows == 4


def test_a_query_with_placeholders_run_without_parameters_names_the_counts(
    server: FlightServeService,
) -> None:
    with pytest.raises(ProgrammingError) as refused:
        fetch(server, "SELECT ? AS a")
    assert refused.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
    assert "the statement has 1 placeholder; 0 parameters were bound" in str(refused.value)


def test_the_parameter_schema_lists_every_placeholder_a_statement_binds(
    server: FlightServeService,
) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        for sql, fields in (
            ("SELECT a FROM t WHERE a > ? AND b = ?", [("$1", pa.int64()), ("$2", pa.string())]),
            ("SELECT a FROM t WHERE a IN (SELECT ?)", [("$1", pa.null())]),
            ("SELECT $2 AS x", [("$1", pa.null()), ("$2", pa.null())]),
            ("SELECT a FROM t WHERE b = $who", [("$who", pa.string())]),
        ):
            assert cur.adbc_prepare(sql) == pa.schema(fields), sql
        cur.execute("SELECT a FROM t WHERE a IN (SELECT ?)", (2,))
        assert cur.fetchall() == [(2,)]


def test_executemany_inserts_every_parameter_row_in_order(server: FlightServeService) -> None:
    rows = [(1000 - i, f"r{i}") for i in range(2500)]
    with connect(server) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (?, ?)", rows)
        assert cur.rowcount == len(rows)
        cur.executemany("INSERT INTO t (b, a) VALUES (upper(?), ? * 2)", [("x", 1), ("y", 2)])
        assert cur.rowcount == 2
    stored = pa.Table.from_batches(server.store.batches("t")).to_pylist()
    assert [(r["a"], r["b"]) for r in stored[3:-2]] == rows
    assert stored[-2:] == [{"a": 2, "b": "X"}, {"a": 4, "b": "Y"}]


def test_insert_create_and_drop_through_execute(server: FlightServeService) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO t (b, a) VALUES ('w', 4), ('v', 5)")
        assert cur.fetchall() == [(2,)]
        cur.execute("SELECT count(*) FROM t")
        assert cur.fetchall() == [(5,)]
        cur.execute("CREATE TABLE events (id BIGINT NOT NULL, label VARCHAR)")
        cur.execute("INSERT INTO events SELECT a, b FROM t WHERE a > 3")
        assert cur.fetchall() == [(2,)]
        cur.execute("SELECT id, label FROM events ORDER BY id")
        assert cur.fetch_arrow_table().to_pylist() == [
            {"id": 4, "label": "w"},
            {"id": 5, "label": "v"},
        ]
        assert server.store.info("events").schema == pa.schema(
            [pa.field("id", pa.int64(), nullable=False), ("label", pa.string())]
        )
        cur.execute("DROP TABLE events")
        assert not server.store.exists("events")


def test_a_statement_update_reports_the_rows_it_changed(server: FlightServeService) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.adbc_statement.set_sql_query("INSERT INTO t VALUES (7, 'q'), (8, 'r'), (9, 's')")
        assert cur.adbc_statement.execute_update() == 3
        cur.adbc_statement.set_sql_query("CREATE TABLE copy AS SELECT * FROM t WHERE a > 7")
        assert cur.adbc_statement.execute_update() == 2
    assert server.store.info("copy").num_rows == 2


def test_a_result_of_64_mib_reads_with_default_driver_options(
    server: FlightServeService, flights: pa.Table
) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.adbc_ingest("flights", flights, mode="create")
    sql = "SELECT * FROM flights UNION ALL SELECT * FROM flights"
    table = fetch(server, sql)
    assert table.num_rows == 2 * flights.num_rows
    assert table.nbytes >= 60 * 1024 * 1024  # about 64 MiB (62 MiB)
    assert table.schema == flights.schema
    assert table.slice(0, 0).schema == plain_flight_query(server, sql).schema


# --- errors -------------------------------------------------------------------------------------


def test_a_syntax_error_is_a_programming_error_with_the_parsers_message(
    server: FlightServeService,
) -> None:
    with pytest.raises(ProgrammingError) as caught:
        fetch(server, "SELEC a FROM t")
    assert caught.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
    assert "Expected: an SQL statement, found: SELEC" in str(caught.value)


def test_a_missing_table_is_a_programming_error_not_found(server: FlightServeService) -> None:
    for sql in ("SELECT * FROM nope", "INSERT INTO nope VALUES (1)"):
        with pytest.raises(ProgrammingError) as caught:
            fetch(server, sql)
        assert caught.value.status_code == AdbcStatusCode.NOT_FOUND
        assert "table 'nope' does not exist" in str(caught.value)


def test_append_only_statements_are_refused_as_invalid_arguments(
    server: FlightServeService,
) -> None:
    for sql in ("UPDATE t SET a = 0", "DELETE FROM t", "BEGIN"):
        with pytest.raises(ProgrammingError) as caught:
            fetch(server, sql)
        assert caught.value.status_code == AdbcStatusCode.INVALID_ARGUMENT


# --- metadata -----------------------------------------------------------------------------------


def test_get_objects_lists_streams_as_tables_with_their_columns(
    server: FlightServeService,
) -> None:
    with connect(server) as conn:
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
        assert [c["catalog_name"] for c in objects] == ["datafusion"]
        schemas = objects[0]["catalog_db_schemas"]
        assert [s["db_schema_name"] for s in schemas] == ["public"]
        tables = schemas[0]["db_schema_tables"]
        assert [(x["table_name"], x["table_type"]) for x in tables] == [("t", "TABLE")]
        columns = tables[0]["table_columns"]
        assert [
            (c["column_name"], c["ordinal_position"], c["xdbc_type_name"]) for c in columns
        ] == [
            ("a", 1, "BIGINT"),
            ("b", 2, "VARCHAR"),
        ]
        filtered = conn.adbc_get_objects(depth="tables", table_name_filter="n%").read_all()
        assert filtered.to_pylist()[0]["catalog_db_schemas"][0]["db_schema_tables"] == []


def test_get_table_schema_and_table_types(server: FlightServeService) -> None:
    with connect(server) as conn:
        schema = conn.adbc_get_table_schema("t")
        assert schema.remove_metadata() == T_SCHEMA
        assert [f.metadata[b"ARROW:FLIGHT:SQL:TYPE_NAME"] for f in schema] == [
            b"BIGINT",
            b"VARCHAR",
        ]
        assert conn.adbc_get_table_types() == ["TABLE"]
        with pytest.raises(ProgrammingError):
            conn.adbc_get_table_schema("nope")


# --- bulk ingest --------------------------------------------------------------------------------


def test_ingest_flights_in_each_mode(server: FlightServeService, flights: pa.Table) -> None:
    n = flights.num_rows

    def count(table: str) -> int:
        return int(fetch(server, f"SELECT count(*) AS n FROM {table}").column("n")[0].as_py())

    with connect(server) as conn, conn.cursor() as cur:
        assert cur.adbc_ingest("flights", flights, mode="create") == n
        assert count("flights") == n
        assert cur.adbc_ingest("flights", flights, mode="append") == n
        assert count("flights") == 2 * n
        assert cur.adbc_ingest("flights", flights, mode="replace") == n
        assert count("flights") == n
        assert cur.adbc_ingest("flights", flights, mode="create_append") == n
        assert count("flights") == 2 * n
        assert cur.adbc_ingest("fresh", flights.slice(0, 1000), mode="create_append") == 1000
        assert count("fresh") == 1000
        assert cur.adbc_ingest("replaced", flights.slice(0, 10), mode="replace") == 10
        assert count("replaced") == 10

        with pytest.raises(ProgrammingError) as exists:
            cur.adbc_ingest("flights", flights, mode="create")
        # pyarrow cannot send ALREADY_EXISTS from a Python handler; INVALID_ARGUMENT it is.
        assert exists.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
        assert "table 'flights' already exists" in str(exists.value)
        with pytest.raises(ProgrammingError) as missing:
            cur.adbc_ingest("absent", flights, mode="append")
        assert missing.value.status_code == AdbcStatusCode.NOT_FOUND
        with pytest.raises(ProgrammingError) as mismatch:
            cur.adbc_ingest("flights", flights.select(["year", "month"]), mode="append")
        assert mismatch.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
    assert count("flights") == 2 * n
    assert fetch(server, "SELECT * FROM fresh ORDER BY sched_dep, flight, carrier").num_rows == 1000


# --- view and large types (what polars 2.x sends) ------------------------------------------------

#: The plain stream every view- or large-typed upload below must land in, and what queries return.
PLAIN = pa.schema(
    [
        ("a", pa.int64()),
        ("s", pa.string()),
        ("b", pa.binary()),
        ("l", pa.list_(pa.string())),
        ("st", pa.struct([("x", pa.string())])),
    ]
)
PLAIN_ROWS = [
    {"a": 1, "s": "x", "b": b"\x00", "l": ["p", None], "st": {"x": "u"}},
    {"a": 2, "s": None, "b": None, "l": None, "st": None},
    {"a": 3, "s": "zz", "b": b"bb", "l": [], "st": {"x": None}},
]
VIEW_SCHEMAS = {
    "views": pa.schema(
        [
            ("a", pa.int64()),
            ("s", pa.string_view()),
            ("b", pa.binary_view()),
            ("l", pa.list_view(pa.string_view())),
            ("st", pa.struct([("x", pa.string_view())])),
        ]
    ),
    "large": pa.schema(
        [
            ("a", pa.int64()),
            ("s", pa.large_string()),
            ("b", pa.large_binary()),
            ("l", pa.large_list(pa.large_string())),
            ("st", pa.struct([("x", pa.large_string())])),
        ]
    ),
}


def typed_table(schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(PLAIN_ROWS, schema=schema)


def table_rows(service: FlightServeService, table: str) -> tuple[pa.Schema, list[dict[str, Any]]]:
    result = fetch(service, f"SELECT * FROM {table} ORDER BY a")
    return result.schema, result.to_pylist()


@pytest.mark.parametrize("kind", sorted(VIEW_SCHEMAS))
def test_ingest_of_view_and_large_typed_columns_into_a_plain_table_in_every_mode(
    server: FlightServeService, kind: str
) -> None:
    upload = typed_table(VIEW_SCHEMAS[kind])
    with connect(server) as conn, conn.cursor() as cur:
        for mode, table in (
            ("append", "plain_append"),
            ("create_append", "plain_create_append"),
            ("replace", "plain_replace"),
        ):
            server.store.create(table, PLAIN)
            server.store.append(table, pa.RecordBatch.from_pylist(PLAIN_ROWS, schema=PLAIN))
            assert cur.adbc_ingest(table, upload, mode=mode) == 3
            # replace re-creates the table with the upload's types, views made plain
            expected_schema = PLAIN if mode != "replace" or kind == "views" else upload.schema
            schema, rows = table_rows(server, table)
            assert schema == expected_schema, mode
            expected = PLAIN_ROWS if mode == "replace" else sorted(
                PLAIN_ROWS * 2, key=lambda r: r["a"]
            )
            assert rows == expected, mode
            assert server.store.info(table).schema == expected_schema, mode
            assert conn.adbc_get_table_schema(table).remove_metadata() == expected_schema, mode


def test_ingest_of_view_typed_columns_creates_a_plain_table(server: FlightServeService) -> None:
    upload = typed_table(VIEW_SCHEMAS["views"])
    with connect(server) as conn, conn.cursor() as cur:
        for mode in ("create", "create_append", "replace"):
            table = f"new_{mode}"
            assert cur.adbc_ingest(table, upload, mode=mode) == 3
            schema, rows = table_rows(server, table)
            assert (schema, rows) == (PLAIN, PLAIN_ROWS), mode
            # GetTables' table_schema: the types queries return, never a view type
            assert conn.adbc_get_table_schema(table).remove_metadata() == PLAIN, mode
            assert cur.adbc_ingest(table, upload, mode="append") == 3
            assert len(table_rows(server, table)[1]) == 6


def test_dictionary_encoded_view_columns_load_as_plain_strings(server: FlightServeService) -> None:
    upload = pa.table(
        {
            "a": pa.array([4, 5], pa.int64()),
            "b": pa.array(["p", None], pa.string_view()).dictionary_encode(),
        }
    )
    with connect(server) as conn, conn.cursor() as cur:
        assert cur.adbc_ingest("t", upload, mode="append") == 2
        assert cur.adbc_ingest("dict_new", upload, mode="create") == 2
    with flight.connect(server.location) as client:
        writer, _ = client.do_put(flight.FlightDescriptor.for_path("t"), upload.schema)
        with writer:
            writer.write_table(upload)
    assert server.store.info("dict_new").schema == T_SCHEMA
    assert fetch(server, "SELECT a, b FROM dict_new ORDER BY a").to_pylist() == [
        {"a": 4, "b": "p"},
        {"a": 5, "b": None},
    ]
    assert fetch(server, "SELECT a, b FROM t WHERE a > 3 ORDER BY a").to_pylist() == [
        {"a": 4, "b": "p"},
        {"a": 4, "b": "p"},
        {"a": 5, "b": None},
        {"a": 5, "b": None},
    ]


def test_polars_write_database_over_adbc_in_every_mode(server: FlightServeService) -> None:
    pl = pytest.importorskip("polars", reason="polars (the [test] extra) is not installed")
    frame = pl.DataFrame({"a": [1, 2], "s": ["x", None], "b": [b"\x00", None]})
    with connect(server) as conn:
        for if_table_exists, rows in (("fail", 2), ("append", 4), ("replace", 2)):
            assert frame.write_database(
                "from_polars", connection=conn, engine="adbc", if_table_exists=if_table_exists
            ) == 2
            assert server.store.info("from_polars").num_rows == rows, if_table_exists
        back = pl.read_database("SELECT * FROM from_polars ORDER BY a", connection=conn)
        assert back.to_dicts() == frame.to_dicts()
        # polars 2.x sends string_view / binary_view; the table holds the plain types
        assert conn.adbc_get_table_schema("from_polars").remove_metadata() == pa.schema(
            [("a", pa.int64()), ("s", pa.string()), ("b", pa.binary())]
        )


def test_a_refused_create_ingest_leaves_no_table_behind(server: FlightServeService) -> None:
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False)])
    with_null = pa.Table.from_arrays([pa.array([1, None], pa.int64())], schema=schema)
    with connect(server) as conn, conn.cursor() as cur:
        for mode in ("create", "create_append", "replace"):
            with pytest.raises(ProgrammingError) as refused:
                cur.adbc_ingest(f"refused_{mode}", with_null, mode=mode)
            assert refused.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
            assert "'a' (not nullable in the stream, batch holds nulls)" in str(refused.value)
        # a refused replace keeps the table it would have replaced
        with pytest.raises(ProgrammingError):
            cur.adbc_ingest("t", with_null.rename_columns(["a"]), mode="replace")
    assert [i.name for i in server.store.list_streams()] == ["t"]
    assert fetch(server, "SELECT a, b FROM t ORDER BY a").to_pylist() == [
        {"a": 1, "b": "x"},
        {"a": 2, "b": "y"},
        {"a": 3, "b": "z"},
    ]


def test_plain_flight_do_put_of_string_view_columns(server: FlightServeService) -> None:
    upload = typed_table(VIEW_SCHEMAS["views"])
    with flight.connect(server.location) as client:
        for stream in ("plain_t", "fresh_t"):
            if stream == "plain_t":
                server.store.create(stream, PLAIN)
            writer, _ = client.do_put(flight.FlightDescriptor.for_path(stream), upload.schema)
            with writer:
                writer.write_table(upload)
            assert server.store.info(stream).schema == PLAIN, stream
            assert table_rows(server, stream) == (PLAIN, PLAIN_ROWS), stream
    with connect(server) as conn:
        assert conn.adbc_get_table_schema("fresh_t").remove_metadata() == PLAIN


# --- time zones ---------------------------------------------------------------------------------

TZ_SQL = (
    "SELECT CAST('2021-03-28T00:15:00Z' AS TIMESTAMPTZ) AS a, "
    "CAST('2021-03-28T02:15:00+02:00' AS TIMESTAMP WITH TIME ZONE) AS b, "
    "CAST('2021-03-28T00:15:00' AS TIMESTAMP) AS c"
)
TZ_SCHEMA = pa.schema(
    [
        pa.field("a", pa.timestamp("ns", tz="UTC"), nullable=False),
        pa.field("b", pa.timestamp("ns", tz="UTC"), nullable=False),
        pa.field("c", pa.timestamp("ns"), nullable=False),
    ]
)


def test_timestamptz_is_utc_zoned_over_flight_sql_and_the_plain_sql_command(
    server: FlightServeService,
) -> None:
    instant = datetime(2021, 3, 28, 0, 15, tzinfo=UTC)
    expected = [{"a": instant, "b": instant, "c": datetime(2021, 3, 28, 0, 15)}]
    with flight.connect(server.location) as client:
        for command in (TZ_SQL.encode(), pack(sql_pb2.CommandStatementQuery(query=TZ_SQL))):
            info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
            assert info.schema == TZ_SCHEMA
            table = client.do_get(info.endpoints[0].ticket).read_all()
            assert table.schema == TZ_SCHEMA
            assert table.to_pylist() == expected
    assert fetch(server, TZ_SQL).to_pylist() == expected


def test_a_timestamptz_column_of_create_table_is_utc_zoned(server: FlightServeService) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE z (t TIMESTAMP WITH TIME ZONE, u TIMESTAMP)")
        cur.execute("INSERT INTO z VALUES ('2021-03-28T02:15:00+02:00', '2021-03-28T00:15:00')")
    assert server.store.info("z").schema == pa.schema(
        [("t", pa.timestamp("ns", tz="UTC")), ("u", pa.timestamp("ns"))]
    )
    assert fetch(server, "SELECT t, u FROM z").to_pylist() == [
        {"t": datetime(2021, 3, 28, 0, 15, tzinfo=UTC), "u": datetime(2021, 3, 28, 0, 15)}
    ]


# --- cancellation -------------------------------------------------------------------------------


def test_adbc_cancel_stops_a_long_query_on_the_server(server: FlightServeService) -> None:
    handler = server.flightsql
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT value, value * 2 AS twice FROM generate_series(1, 100000000000)")
        reader = cur.fetch_record_batch()
        for _ in range(3):
            assert reader.read_next_batch().num_rows > 0
        assert handler.active_streams == 1
        cur.adbc_cancel()
        with pytest.raises(Exception, match=r"(?i)cancel"):
            read_to_the_end(reader)
        deadline = time.monotonic() + 10
        while handler.active_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handler.active_streams == 0


def test_cancel_from_another_thread_while_fetching(server: FlightServeService) -> None:
    with connect(server) as conn, conn.cursor() as cur:
        cur.execute("SELECT value FROM generate_series(1, 100000000000)")
        reader = cur.fetch_record_batch()
        reader.read_next_batch()
        timer = threading.Timer(0.3, cur.adbc_cancel)
        timer.start()
        try:
            with pytest.raises(Exception, match=r"(?i)cancel"):
                read_to_the_end(reader)
        finally:
            timer.join()


# --- the daemon -----------------------------------------------------------------------------------


def test_flight_serve_serve_with_a_users_file(tmp_path: Path, flights: pa.Table) -> None:
    users = tmp_path / "users.txt"
    users.write_text("# who may connect\nalice:wonder land\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flight_serve.cli",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--fsync",
            "never",
            "--users-file",
            str(users),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        location = process.stdout.readline().strip()
        assert location.startswith("grpc://127.0.0.1:")
        credentials = {"username": "alice", "password": "wonder land"}
        with (
            flightsql.connect(location, db_kwargs=credentials, autocommit=True) as conn,
            conn.cursor() as cur,
        ):
            assert cur.adbc_ingest("flights", flights, mode="create") == flights.num_rows
            cur.execute("SELECT origin, count(*) AS n FROM flights GROUP BY origin ORDER BY origin")
            assert cur.fetchall() == [("EWR", 120835), ("JFK", 111279), ("LGA", 104662)]
        with pytest.raises(ProgrammingError) as caught:
            run_select_1_at(location)
        assert caught.value.status_code == AdbcStatusCode.UNAUTHENTICATED
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        if process.stdout is not None:
            process.stdout.close()
