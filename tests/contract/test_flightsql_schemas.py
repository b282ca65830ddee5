"""Flight SQL contract: result schemas exactly as the reference servers announce them, SqlInfo
values in the union members the specification gives them, handles that keep decoding, and
generated protobuf code that matches ``schemas/``.

The expected schemas are written out here from the references (C++
``arrow::flight::sql::SqlSchema`` in ``cpp/src/arrow/flight/sql/server.cc`` and Go
``arrow-go/arrow/flight/flightsql/schema_ref``), not imported from the server, so a change on
either side fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve._proto.flight_serve.v1 import flightsql_pb2
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve.flight.sql import metadata as md
from flight_serve.flight.sql.handler import pack, unpack_command

ROOT = Path(__file__).resolve().parents[2]
utf8, i32 = pa.string(), pa.int32()


def f(name: str, data_type: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, data_type, nullable=nullable)


REFERENCE: dict[str, pa.Schema] = {
    "GetCatalogs": pa.schema([f("catalog_name", utf8, False)]),
    "GetDbSchemas": pa.schema([f("catalog_name", utf8), f("db_schema_name", utf8, False)]),
    "GetTables": pa.schema(
        [
            f("catalog_name", utf8),
            f("db_schema_name", utf8),
            f("table_name", utf8, False),
            f("table_type", utf8, False),
        ]
    ),
    "GetTablesWithSchema": pa.schema(
        [
            f("catalog_name", utf8),
            f("db_schema_name", utf8),
            f("table_name", utf8, False),
            f("table_type", utf8, False),
            f("table_schema", pa.binary(), False),
        ]
    ),
    "GetTableTypes": pa.schema([f("table_type", utf8, False)]),
    "GetPrimaryKeys": pa.schema(
        [
            f("catalog_name", utf8),
            f("db_schema_name", utf8),
            f("table_name", utf8, False),
            f("column_name", utf8, False),
            f("key_sequence", i32, False),
            f("key_name", utf8),
        ]
    ),
    "GetCrossReference": pa.schema(
        [
            f("pk_catalog_name", utf8),
            f("pk_db_schema_name", utf8),
            f("pk_table_name", utf8, False),
            f("pk_column_name", utf8, False),
            f("fk_catalog_name", utf8),
            f("fk_db_schema_name", utf8),
            f("fk_table_name", utf8, False),
            f("fk_column_name", utf8, False),
            f("key_sequence", i32, False),
            f("fk_key_name", utf8),
            f("pk_key_name", utf8),
            f("update_rule", pa.uint8(), False),
            f("delete_rule", pa.uint8(), False),
        ]
    ),
    "GetSqlInfo": pa.schema(
        [
            f("info_name", pa.uint32(), False),
            f(
                "value",
                pa.dense_union(
                    [
                        f("string_value", utf8, False),
                        f("bool_value", pa.bool_(), False),
                        f("bigint_value", pa.int64(), False),
                        f("int32_bitmask", i32, False),
                        f("string_list", pa.list_(f("item", utf8)), False),
                        f(
                            "int32_to_int32_list_map",
                            pa.map_(f("key", i32, False), f("value", pa.list_(f("item", i32)))),
                            False,
                        ),
                    ],
                    type_codes=[0, 1, 2, 3, 4, 5],
                ),
                False,
            ),
        ]
    ),
    "GetXdbcTypeInfo": pa.schema(
        [
            f("type_name", utf8, False),
            f("data_type", i32, False),
            f("column_size", i32),
            f("literal_prefix", utf8),
            f("literal_suffix", utf8),
            f("create_params", pa.list_(f("item", utf8, False))),
            f("nullable", i32, False),
            f("case_sensitive", pa.bool_(), False),
            f("searchable", i32, False),
            f("unsigned_attribute", pa.bool_()),
            f("fixed_prec_scale", pa.bool_(), False),
            f("auto_increment", pa.bool_()),
            f("local_type_name", utf8),
            f("minimum_scale", i32),
            f("maximum_scale", i32),
            f("sql_data_type", i32, False),
            f("datetime_subcode", i32),
            f("num_prec_radix", i32),
            f("interval_precision", i32),
        ]
    ),
}

OURS: dict[str, pa.Schema] = {
    "GetCatalogs": md.CATALOGS_SCHEMA,
    "GetDbSchemas": md.DB_SCHEMAS_SCHEMA,
    "GetTables": md.TABLES_SCHEMA,
    "GetTablesWithSchema": md.TABLES_WITH_SCHEMA_SCHEMA,
    "GetTableTypes": md.TABLE_TYPES_SCHEMA,
    "GetPrimaryKeys": md.PRIMARY_KEYS_SCHEMA,
    "GetCrossReference": md.CROSS_REFERENCE_SCHEMA,
    "GetSqlInfo": md.SQL_INFO_SCHEMA,
    "GetXdbcTypeInfo": md.XDBC_TYPE_INFO_SCHEMA,
}

#: The command whose result each reference schema describes.
COMMANDS: dict[str, Any] = {
    "GetCatalogs": sql_pb2.CommandGetCatalogs(),
    "GetDbSchemas": sql_pb2.CommandGetDbSchemas(),
    "GetTables": sql_pb2.CommandGetTables(),
    "GetTablesWithSchema": sql_pb2.CommandGetTables(include_schema=True),
    "GetTableTypes": sql_pb2.CommandGetTableTypes(),
    "GetPrimaryKeys": sql_pb2.CommandGetPrimaryKeys(table="t"),
    "GetCrossReference": sql_pb2.CommandGetCrossReference(pk_table="t", fk_table="t"),
    "GetSqlInfo": sql_pb2.CommandGetSqlInfo(),
    "GetXdbcTypeInfo": sql_pb2.CommandGetXdbcTypeInfo(),
}


def _same(actual: pa.Schema, expected: pa.Schema) -> None:
    """Equal including every nested field name and nullability, and union type codes."""
    assert actual.equals(expected), f"\n{actual}\n!=\n{expected}"
    assert str(actual) == str(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.nullable == e.nullable, a.name
        assert a.type == e.type, a.name


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_metadata_schemas_equal_the_reference(name: str) -> None:
    _same(OURS[name], REFERENCE[name])


def test_the_sql_info_union_children_and_type_codes() -> None:
    union: Any = md.SQL_INFO_SCHEMA.field("value").type
    assert union.mode == "dense"
    assert list(union.type_codes) == [0, 1, 2, 3, 4, 5]
    assert [union.field(i).name for i in range(union.num_fields)] == [
        "string_value",
        "bool_value",
        "bigint_value",
        "int32_bitmask",
        "string_list",
        "int32_to_int32_list_map",
    ]


# The union member the specification gives each key (FlightSql.proto, enum SqlInfo comments).
_S, _B, _L, _I, _SL, _M = (
    "string_value",
    "bool_value",
    "bigint_value",
    "int32_bitmask",
    "string_list",
    "int32_to_int32_list_map",
)
Info = sql_pb2.SqlInfo
SPEC_MEMBER = {
    Info.FLIGHT_SQL_SERVER_NAME: _S,
    Info.FLIGHT_SQL_SERVER_VERSION: _S,
    Info.FLIGHT_SQL_SERVER_ARROW_VERSION: _S,
    Info.FLIGHT_SQL_SERVER_READ_ONLY: _B,
    Info.FLIGHT_SQL_SERVER_SQL: _B,
    Info.FLIGHT_SQL_SERVER_SUBSTRAIT: _B,
    Info.FLIGHT_SQL_SERVER_TRANSACTION: _I,
    Info.FLIGHT_SQL_SERVER_CANCEL: _B,
    Info.FLIGHT_SQL_SERVER_BULK_INGESTION: _B,
    Info.FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED: _B,
    Info.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: _I,
    Info.FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: _I,
    Info.SQL_DDL_CATALOG: _B,
    Info.SQL_DDL_SCHEMA: _B,
    Info.SQL_DDL_TABLE: _B,
    Info.SQL_IDENTIFIER_CASE: _I,
    Info.SQL_IDENTIFIER_QUOTE_CHAR: _S,
    Info.SQL_QUOTED_IDENTIFIER_CASE: _I,
    Info.SQL_ALL_TABLES_ARE_SELECTABLE: _B,
    Info.SQL_NULL_ORDERING: _I,
    Info.SQL_KEYWORDS: _SL,
    Info.SQL_NUMERIC_FUNCTIONS: _SL,
    Info.SQL_STRING_FUNCTIONS: _SL,
    Info.SQL_SYSTEM_FUNCTIONS: _SL,
    Info.SQL_DATETIME_FUNCTIONS: _SL,
    Info.SQL_SEARCH_STRING_ESCAPE: _S,
    Info.SQL_EXTRA_NAME_CHARACTERS: _S,
    Info.SQL_SUPPORTS_COLUMN_ALIASING: _B,
    Info.SQL_NULL_PLUS_NULL_IS_NULL: _B,
    Info.SQL_SUPPORTS_CONVERT: _M,
    Info.SQL_SUPPORTS_TABLE_CORRELATION_NAMES: _B,
    Info.SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES: _B,
    Info.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: _B,
    Info.SQL_SUPPORTS_ORDER_BY_UNRELATED: _B,
    Info.SQL_SUPPORTED_GROUP_BY: _I,
    Info.SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE: _B,
    Info.SQL_SUPPORTS_NON_NULLABLE_COLUMNS: _B,
    Info.SQL_SUPPORTED_GRAMMAR: _I,
    Info.SQL_ANSI92_SUPPORTED_LEVEL: _I,
    Info.SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY: _B,
    Info.SQL_OUTER_JOINS_SUPPORT_LEVEL: _I,
    Info.SQL_SCHEMA_TERM: _S,
    Info.SQL_PROCEDURE_TERM: _S,
    Info.SQL_CATALOG_TERM: _S,
    Info.SQL_CATALOG_AT_START: _B,
    Info.SQL_SCHEMAS_SUPPORTED_ACTIONS: _I,
    Info.SQL_CATALOGS_SUPPORTED_ACTIONS: _I,
    Info.SQL_SUPPORTED_POSITIONED_COMMANDS: _I,
    Info.SQL_SELECT_FOR_UPDATE_SUPPORTED: _B,
    Info.SQL_STORED_PROCEDURES_SUPPORTED: _B,
    Info.SQL_SUPPORTED_SUBQUERIES: _I,
    Info.SQL_CORRELATED_SUBQUERIES_SUPPORTED: _B,
    Info.SQL_SUPPORTED_UNIONS: _I,
    **{
        code: _L
        for code in range(Info.SQL_MAX_BINARY_LITERAL_LENGTH, Info.SQL_MAX_USERNAME_LENGTH + 1)
        if code != Info.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS
    },
    Info.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS: _B,
    Info.SQL_DEFAULT_TRANSACTION_ISOLATION: _I,  # "Returns a int32 ordinal"; the Java driver: Long
    Info.SQL_TRANSACTIONS_SUPPORTED: _B,
    Info.SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS: _I,
    Info.SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT: _B,
    Info.SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED: _B,
    Info.SQL_SUPPORTED_RESULT_SET_TYPES: _I,
    Info.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_UNSPECIFIED: _I,
    Info.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_FORWARD_ONLY: _I,
    Info.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_SENSITIVE: _I,
    Info.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_INSENSITIVE: _I,
    Info.SQL_BATCH_UPDATES_SUPPORTED: _B,
    Info.SQL_SAVEPOINTS_SUPPORTED: _B,
    Info.SQL_NAMED_PARAMETERS_SUPPORTED: _B,
    Info.SQL_LOCATORS_UPDATE_COPY: _B,
    Info.SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED: _B,
}


# The Java class arrow-java's JDBC driver casts each value it reads to (ArrowDatabaseMetadata.java,
# getSqlInfoAndCacheIfCacheIsEmpty(SqlInfo.X, Class)): a value in another union member throws a
# ClassCastException in the DatabaseMetaData getter. Keys the driver never reads are absent.
JAVA_CAST = {
    Info.FLIGHT_SQL_SERVER_NAME: "String",
    Info.FLIGHT_SQL_SERVER_VERSION: "String",
    Info.FLIGHT_SQL_SERVER_READ_ONLY: "Boolean",
    Info.SQL_IDENTIFIER_QUOTE_CHAR: "String",
    Info.SQL_KEYWORDS: "List",
    Info.SQL_NUMERIC_FUNCTIONS: "List",
    Info.SQL_STRING_FUNCTIONS: "List",
    Info.SQL_SYSTEM_FUNCTIONS: "List",
    Info.SQL_DATETIME_FUNCTIONS: "List",
    Info.SQL_SEARCH_STRING_ESCAPE: "String",
    Info.SQL_EXTRA_NAME_CHARACTERS: "String",
    Info.SQL_SUPPORTS_COLUMN_ALIASING: "Boolean",
    Info.SQL_NULL_PLUS_NULL_IS_NULL: "Boolean",
    Info.SQL_SUPPORTS_CONVERT: "Map",
    Info.SQL_SUPPORTS_TABLE_CORRELATION_NAMES: "Boolean",
    Info.SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES: "Boolean",
    Info.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: "Boolean",
    Info.SQL_SUPPORTS_ORDER_BY_UNRELATED: "Boolean",
    Info.SQL_SUPPORTED_GROUP_BY: "Integer",
    Info.SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE: "Boolean",
    Info.SQL_SUPPORTS_NON_NULLABLE_COLUMNS: "Boolean",
    Info.SQL_SUPPORTED_GRAMMAR: "Integer",
    Info.SQL_ANSI92_SUPPORTED_LEVEL: "Integer",
    Info.SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY: "Boolean",
    Info.SQL_OUTER_JOINS_SUPPORT_LEVEL: "Integer",
    Info.SQL_SCHEMA_TERM: "String",
    Info.SQL_PROCEDURE_TERM: "String",
    Info.SQL_CATALOG_TERM: "String",
    Info.SQL_CATALOG_AT_START: "Boolean",
    Info.SQL_SCHEMAS_SUPPORTED_ACTIONS: "Integer",
    Info.SQL_CATALOGS_SUPPORTED_ACTIONS: "Integer",
    Info.SQL_SUPPORTED_POSITIONED_COMMANDS: "Integer",
    Info.SQL_SELECT_FOR_UPDATE_SUPPORTED: "Boolean",
    Info.SQL_STORED_PROCEDURES_SUPPORTED: "Boolean",
    Info.SQL_SUPPORTED_SUBQUERIES: "Integer",
    Info.SQL_CORRELATED_SUBQUERIES_SUPPORTED: "Boolean",
    Info.SQL_SUPPORTED_UNIONS: "Integer",
    **{
        code: "Long"
        for code in range(Info.SQL_MAX_BINARY_LITERAL_LENGTH, Info.SQL_MAX_USERNAME_LENGTH + 1)
        if code != Info.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS
    },
    Info.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS: "Boolean",
    Info.SQL_DEFAULT_TRANSACTION_ISOLATION: "Long",
    Info.SQL_TRANSACTIONS_SUPPORTED: "Boolean",
    Info.SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS: "Integer",
    Info.SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT: "Boolean",
    Info.SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED: "Boolean",
    Info.SQL_SUPPORTED_RESULT_SET_TYPES: "Integer",
    Info.SQL_BATCH_UPDATES_SUPPORTED: "Boolean",
    Info.SQL_SAVEPOINTS_SUPPORTED: "Boolean",
    Info.SQL_NAMED_PARAMETERS_SUPPORTED: "Boolean",
    Info.SQL_LOCATORS_UPDATE_COPY: "Boolean",
    Info.SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED: "Boolean",
}
#: The union member each Java class is read from (arrow-java's dense-union accessor).
JAVA_MEMBER = {"String": _S, "Boolean": _B, "Long": _L, "Integer": _I, "List": _SL, "Map": _M}
#: What the server must send: what the Java driver casts to where it reads the key (a Java
#: driver that throws is worse than a spec comment), else the specification's member.
WIRE_MEMBER = {
    code: JAVA_MEMBER[JAVA_CAST[code]] if code in JAVA_CAST else member
    for code, member in SPEC_MEMBER.items()
}


def test_the_spec_and_the_java_driver_disagree_only_on_the_default_isolation_level() -> None:
    differing = {
        Info.Name(code)
        for code, java in JAVA_CAST.items()
        if JAVA_MEMBER[java] != SPEC_MEMBER[code]
    }
    assert differing == {"SQL_DEFAULT_TRANSACTION_ISOLATION"}


VALUES = md.sql_info_values("0.0.0", max_table_name_length=200)


def test_every_sql_info_key_of_the_spec_but_substrait_versions_has_a_value() -> None:
    every = {v.number for v in sql_pb2.SqlInfo.DESCRIPTOR.values}
    substrait = {
        Info.FLIGHT_SQL_SERVER_SUBSTRAIT_MIN_VERSION,
        Info.FLIGHT_SQL_SERVER_SUBSTRAIT_MAX_VERSION,
    }
    assert set(VALUES) == every - substrait
    assert set(SPEC_MEMBER) == every - substrait
    assert set(JAVA_CAST) <= set(SPEC_MEMBER)


def _members(table: pa.Table) -> dict[str, str]:
    """SqlInfo key name -> the union member its value travels in."""
    union: Any = table.column("value").combine_chunks()
    return {
        Info.Name(code): union.type.field(union.type_codes[i].as_py()).name
        for i, code in enumerate(table.column("info_name").to_pylist())
    }


def test_each_sql_info_value_is_in_the_union_member_the_java_driver_reads() -> None:
    table = md.sql_info_table(VALUES, [])
    table.validate(full=True)
    _same(table.schema, REFERENCE["GetSqlInfo"])
    assert _members(table) == {Info.Name(c): m for c, m in sorted(WIRE_MEMBER.items())}


def test_transactions_are_reported_as_unsupported() -> None:
    table = md.sql_info_table(
        VALUES,
        [
            Info.FLIGHT_SQL_SERVER_TRANSACTION,
            Info.SQL_TRANSACTIONS_SUPPORTED,
            Info.SQL_SAVEPOINTS_SUPPORTED,
        ],
    )
    assert table.column("value").to_pylist() == [
        sql_pb2.SQL_SUPPORTED_TRANSACTION_NONE,
        False,
        False,
    ]


def test_sql_info_keeps_the_requested_order_and_drops_unknown_codes() -> None:
    table = md.sql_info_table(VALUES, [Info.SQL_DDL_TABLE, 9999, Info.FLIGHT_SQL_SERVER_NAME])
    assert table.to_pylist() == [
        {"info_name": Info.SQL_DDL_TABLE, "value": True},
        {"info_name": Info.FLIGHT_SQL_SERVER_NAME, "value": "flight-serve"},
    ]
    empty = md.sql_info_table(VALUES, [9999])
    assert empty.num_rows == 0
    _same(empty.schema, REFERENCE["GetSqlInfo"])


def test_the_functions_sql_info_lists_exist_in_datafusion() -> None:
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_information_schema(True))
    names = {
        r["routine_name"]
        for r in ctx.sql("SELECT routine_name FROM information_schema.routines").to_pylist()
    }
    for code in (
        Info.SQL_NUMERIC_FUNCTIONS,
        Info.SQL_STRING_FUNCTIONS,
        Info.SQL_SYSTEM_FUNCTIONS,
        Info.SQL_DATETIME_FUNCTIONS,
    ):
        missing = [name for name in VALUES[code] if name not in names]
        assert missing == [], sql_pb2.SqlInfo.Name(code)


def test_metadata_results_keep_the_reference_schema_when_empty() -> None:
    tables = [md.TableEntry("t", pa.schema([("a", pa.int64())]))]
    none = dict(catalog="nope", schema_pattern=None, table_pattern=None, table_types=[])
    _same(md.tables_table(tables, **none, include_schema=False).schema, REFERENCE["GetTables"])
    _same(
        md.tables_table(tables, **none, include_schema=True).schema,
        REFERENCE["GetTablesWithSchema"],
    )
    _same(md.db_schemas_table("nope", None).schema, REFERENCE["GetDbSchemas"])
    _same(md.xdbc_type_info_table(12345).schema, REFERENCE["GetXdbcTypeInfo"])
    _same(md.empty_keys_table(md.PRIMARY_KEYS_SCHEMA).schema, REFERENCE["GetPrimaryKeys"])


def test_xdbc_type_info_is_ordered_by_data_type_then_name() -> None:
    rows = md.xdbc_type_info_table(None).to_pylist()
    assert [(r["data_type"], r["type_name"]) for r in rows] == sorted(
        (r["data_type"], r["type_name"]) for r in rows
    )
    assert [r["type_name"] for r in md.xdbc_type_info_table(sql_pb2.XDBC_VARCHAR).to_pylist()] == [
        "VARCHAR"
    ]


def test_table_name_patterns() -> None:
    tables = [md.TableEntry(n, pa.schema([("a", pa.int64())])) for n in ("a_b", "axb", "flights")]

    def names(pattern: str | None) -> list[str]:
        result = md.tables_table(
            tables,
            catalog=None,
            schema_pattern="pub%",
            table_pattern=pattern,
            table_types=["TABLE"],
            include_schema=False,
        )
        return [str(n) for n in result.column("table_name").to_pylist()]

    assert names(None) == ["a_b", "axb", "flights"]
    assert names("a_b") == ["a_b", "axb"]
    assert names("a\\_b") == ["a_b"]
    assert names("%light%") == ["flights"]


# --- through a server ---------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FlightServeService]:
    with start_server(tmp_path, fsync="never") as service:
        service.store.create("t", pa.schema([("a", pa.int64()), ("s", pa.string())]))
        service.store.append("t", pa.record_batch({"a": [1], "s": ["x"]}))
        yield service


def _descriptor(command: Any) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(pack(command))


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_flight_info_get_schema_and_do_get_all_announce_the_reference_schema(
    server: FlightServeService, name: str
) -> None:
    with flight.connect(server.location) as client:
        descriptor = _descriptor(COMMANDS[name])
        info = client.get_flight_info(descriptor)
        _same(info.schema, REFERENCE[name])
        _same(client.get_schema(descriptor).schema, REFERENCE[name])
        table = client.do_get(info.endpoints[0].ticket).read_all()
        _same(table.schema, REFERENCE[name])


@pytest.mark.integration
@pytest.mark.parametrize("code", sorted(WIRE_MEMBER), ids=Info.Name)
def test_get_sql_info_over_the_wire_sends_each_key_in_the_member_the_java_driver_reads(
    server: FlightServeService, code: int
) -> None:
    with flight.connect(server.location) as client:
        for command in (sql_pb2.CommandGetSqlInfo(), sql_pb2.CommandGetSqlInfo(info=[code])):
            info = client.get_flight_info(_descriptor(command))
            table = client.do_get(info.endpoints[0].ticket).read_all()
            table.validate(full=True)
            assert _members(table)[Info.Name(code)] == WIRE_MEMBER[code]


@pytest.mark.integration
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a, s FROM t",
        "SELECT a, s FROM t WHERE false",
        "SELECT arrow_cast(s, 'Utf8View') AS v FROM t",
    ],
)
def test_a_statement_do_get_equals_its_flight_info_schema(
    server: FlightServeService, sql: str
) -> None:
    with flight.connect(server.location) as client:
        descriptor = _descriptor(sql_pb2.CommandStatementQuery(query=sql))
        info = client.get_flight_info(descriptor)
        table = client.do_get(info.endpoints[0].ticket).read_all()
        _same(table.schema, info.schema)
        assert client.get_schema(descriptor).schema == info.schema
        assert not any(pa.types.is_string_view(field.type) for field in info.schema)


@pytest.mark.integration
def test_get_tables_carries_each_tables_schema_with_column_metadata(
    server: FlightServeService,
) -> None:
    with flight.connect(server.location) as client:
        info = client.get_flight_info(_descriptor(COMMANDS["GetTablesWithSchema"]))
        row = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()[0]
    schema = pa.ipc.read_schema(pa.py_buffer(row["table_schema"]))
    assert schema.remove_metadata() == pa.schema([("a", pa.int64()), ("s", pa.string())])
    meta = schema.field("a").metadata
    assert meta[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"BIGINT"
    assert meta[b"ARROW:FLIGHT:SQL:TABLE_NAME"] == b"t"
    assert meta[b"ARROW:FLIGHT:SQL:DB_SCHEMA_NAME"] == b"public"
    assert meta[b"ARROW:FLIGHT:SQL:SCHEMA_NAME"] == b"public"  # what the drivers read


@pytest.mark.integration
def test_transactions_and_substrait_are_unimplemented(server: FlightServeService) -> None:
    with flight.connect(server.location) as client:
        action = flight.Action("BeginTransaction", pack(sql_pb2.ActionBeginTransactionRequest()))
        with pytest.raises(pa.ArrowNotImplementedError, match="transactions"):
            list(client.do_action(action))
        plan = sql_pb2.CommandStatementSubstraitPlan(plan=sql_pb2.SubstraitPlan(plan=b"x"))
        with pytest.raises(pa.ArrowNotImplementedError, match="Substrait"):
            client.get_flight_info(_descriptor(plan))
        query = sql_pb2.CommandStatementQuery(query="SELECT 1", transaction_id=b"t")
        with pytest.raises(pa.ArrowNotImplementedError, match="transactions"):
            client.get_flight_info(_descriptor(query))


# --- handles and commands -----------------------------------------------------------------------


def test_plain_sql_text_is_never_taken_for_a_flight_sql_command() -> None:
    for text in (b"SELECT 1", b"\nSELECT 1", b"\n\x05hello", b""):
        assert unpack_command(text) is None
    other = b"\n\x1ctype.googleapis.com/foo.Bar"
    assert unpack_command(other) is None


def test_type_urls_are_the_specifications() -> None:
    data = pack(sql_pb2.CommandStatementQuery(query="SELECT 1"))
    assert b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery" in data


# v1 handles as this server writes them; they must keep decoding to the same fields.
PINNED_PREPARED = "0801120853454c4543542031"  # SqlPreparedStatement(version=1, sql="SELECT 1")
PINNED_UPDATE_COUNT = "08011a020803"  # SqlStatementHandle(version=1, update_count=3)


def test_pinned_v1_handles_still_decode() -> None:
    prepared = flightsql_pb2.SqlPreparedStatement.FromString(bytes.fromhex(PINNED_PREPARED))
    assert (prepared.version, prepared.sql, prepared.parameters) == (1, "SELECT 1", b"")
    handle = flightsql_pb2.SqlStatementHandle.FromString(bytes.fromhex(PINNED_UPDATE_COUNT))
    assert handle.version == 1
    assert handle.WhichOneof("kind") == "update_count"
    assert handle.update_count.record_count == 3
    again = flightsql_pb2.SqlPreparedStatement(version=1, sql="SELECT 1")
    assert again.SerializeToString(deterministic=True).hex() == PINNED_PREPARED


@pytest.mark.parametrize(
    ("proto", "generated"),
    [
        ("flight_serve/v1/flightsql.proto", "flight_serve/v1/flightsql_pb2"),
        ("arrow/flight/protocol/sql/FlightSql.proto", "arrow/flight/protocol/sql/FlightSql_pb2"),
    ],
)
def test_the_committed_generated_code_equals_a_fresh_generation(
    tmp_path: Path, proto: str, generated: str
) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'schemas'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(ROOT / "schemas" / proto),
        ],
        check=True,
    )
    committed = ROOT / "server" / "flight_serve" / "_proto"
    for suffix in (".py", ".pyi"):
        fresh = (tmp_path / f"{generated}{suffix}").read_text()
        assert (committed / f"{generated}{suffix}").read_text() == fresh, (
            f"{generated}{suffix} is stale: run `make proto` and commit the result"
        )


@pytest.mark.integration
def test_a_deadline_stops_a_running_statement_on_the_server(server: FlightServeService) -> None:
    sql = "SELECT value FROM generate_series(1, 100000000000)"
    with flight.connect(server.location) as client:
        info = client.get_flight_info(_descriptor(sql_pb2.CommandStatementQuery(query=sql)))
        options = flight.FlightCallOptions(timeout=1.0)
        reader = client.do_get(info.endpoints[0].ticket, options=options)
        assert reader.read_chunk().data.num_rows > 0
        assert server.flightsql.active_streams == 1
        time.sleep(1.5)  # stop reading; the deadline passes
        deadline = time.monotonic() + 10
        while server.flightsql.active_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.flightsql.active_streams == 0
        with pytest.raises(flight.FlightTimedOutError):
            reader.read_all()
