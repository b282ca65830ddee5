"""Flight SQL metadata results: the reference result schemas and the rows flight-serve returns.

Every schema here is the one the Arrow Flight SQL reference servers announce, field for field
(names, types, nullability, list item names, dense-union child order and type codes): C++
``arrow::flight::sql::SqlSchema`` (``cpp/src/arrow/flight/sql/server.cc``) and Go
``arrow-go/arrow/flight/flightsql/schema_ref``. Strict drivers compare them (the C++ ADBC driver
refuses a GetSqlInfo result whose schema differs), and ``tests/contract/test_flightsql_schemas.py``
pins them. Where the specification's comment and the reference code disagree (GetPrimaryKeys puts
``key_sequence`` before ``key_name`` in both reference servers), the reference code wins.

Namespace: every stream is a table of type ``TABLE`` in catalog :data:`CATALOG` (``datafusion``)
and schema :data:`DB_SCHEMA` (``public``) -- the names of DataFusion's default catalog and schema,
so the qualified names JDBC tools generate (``SELECT * FROM datafusion.public.flights``) resolve in
every query path. Names are case-sensitive as stored; SQL lower-cases unquoted identifiers.
The Iceberg tables of the server's embedded catalog (:mod:`flight_serve.flight.sql.catalog`)
are tables of type ``TABLE`` in catalog ``datafusion`` and schema ``<namespace>``
(``datafusion.ops.hourly_delays``): each one-level namespace is a schema next to ``public``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.store import plain_type

__all__ = [
    "CATALOG",
    "CATALOGS_SCHEMA",
    "CROSS_REFERENCE_SCHEMA",
    "DB_SCHEMA",
    "DB_SCHEMAS_SCHEMA",
    "PRIMARY_KEYS_SCHEMA",
    "SQL_INFO_SCHEMA",
    "TABLES_SCHEMA",
    "TABLES_WITH_SCHEMA_SCHEMA",
    "TABLE_TYPES",
    "TABLE_TYPES_SCHEMA",
    "XDBC_TYPE_INFO_SCHEMA",
    "TableEntry",
    "catalogs_table",
    "db_schemas_table",
    "empty_keys_table",
    "like_matcher",
    "sql_info_table",
    "sql_info_values",
    "table_types_table",
    "tables_table",
    "xdbc_type_info_table",
]

#: The one catalog: DataFusion's default catalog name.
CATALOG: Final = "datafusion"
#: The one database schema: DataFusion's default schema name.
DB_SCHEMA: Final = "public"
#: Table types, sorted: every stream is a ``TABLE``.
TABLE_TYPES: Final = ("TABLE",)

# --- reference schemas -------------------------------------------------------------------------


def _f(name: str, data_type: pa.DataType, nullable: bool = True) -> pa.Field[Any]:
    field: pa.Field[Any] = pa.field(name, data_type, nullable=nullable)
    return field


CATALOGS_SCHEMA: Final = pa.schema([_f("catalog_name", pa.string(), False)])

DB_SCHEMAS_SCHEMA: Final = pa.schema(
    [
        _f("catalog_name", pa.string()),
        _f("db_schema_name", pa.string(), False),
    ]
)

TABLES_SCHEMA: Final = pa.schema(
    [
        _f("catalog_name", pa.string()),
        _f("db_schema_name", pa.string()),
        _f("table_name", pa.string(), False),
        _f("table_type", pa.string(), False),
    ]
)

TABLES_WITH_SCHEMA_SCHEMA: Final = TABLES_SCHEMA.append(_f("table_schema", pa.binary(), False))

TABLE_TYPES_SCHEMA: Final = pa.schema([_f("table_type", pa.string(), False)])

PRIMARY_KEYS_SCHEMA: Final = pa.schema(
    [
        _f("catalog_name", pa.string()),
        _f("db_schema_name", pa.string()),
        _f("table_name", pa.string(), False),
        _f("column_name", pa.string(), False),
        _f("key_sequence", pa.int32(), False),
        _f("key_name", pa.string()),
    ]
)

#: GetExportedKeys, GetImportedKeys and GetCrossReference share this schema.
CROSS_REFERENCE_SCHEMA: Final = pa.schema(
    [
        _f("pk_catalog_name", pa.string()),
        _f("pk_db_schema_name", pa.string()),
        _f("pk_table_name", pa.string(), False),
        _f("pk_column_name", pa.string(), False),
        _f("fk_catalog_name", pa.string()),
        _f("fk_db_schema_name", pa.string()),
        _f("fk_table_name", pa.string(), False),
        _f("fk_column_name", pa.string(), False),
        _f("key_sequence", pa.int32(), False),
        _f("fk_key_name", pa.string()),
        _f("pk_key_name", pa.string()),
        _f("update_rule", pa.uint8(), False),
        _f("delete_rule", pa.uint8(), False),
    ]
)

# Dense-union children of the SqlInfo ``value`` column, in type-code order 0..5.
_STRING, _BOOL, _BIGINT, _INT32, _STRING_LIST, _INT32_MAP = range(6)
_SQL_INFO_VALUE_FIELDS: Final = [
    _f("string_value", pa.string(), False),
    _f("bool_value", pa.bool_(), False),
    _f("bigint_value", pa.int64(), False),
    _f("int32_bitmask", pa.int32(), False),
    _f("string_list", pa.list_(pa.string()), False),
    _f("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32())), False),
]
_SQL_INFO_VALUE_TYPE: Final = pa.dense_union(_SQL_INFO_VALUE_FIELDS, type_codes=list(range(6)))

SQL_INFO_SCHEMA: Final = pa.schema(
    [
        _f("info_name", pa.uint32(), False),
        _f("value", _SQL_INFO_VALUE_TYPE, False),
    ]
)

XDBC_TYPE_INFO_SCHEMA: Final = pa.schema(
    [
        _f("type_name", pa.string(), False),
        _f("data_type", pa.int32(), False),
        _f("column_size", pa.int32()),
        _f("literal_prefix", pa.string()),
        _f("literal_suffix", pa.string()),
        _f("create_params", pa.list_(_f("item", pa.string(), False))),
        _f("nullable", pa.int32(), False),
        _f("case_sensitive", pa.bool_(), False),
        _f("searchable", pa.int32(), False),
        _f("unsigned_attribute", pa.bool_()),
        _f("fixed_prec_scale", pa.bool_(), False),
        _f("auto_increment", pa.bool_()),
        _f("local_type_name", pa.string()),
        _f("minimum_scale", pa.int32()),
        _f("maximum_scale", pa.int32()),
        _f("sql_data_type", pa.int32(), False),
        _f("datetime_subcode", pa.int32()),
        _f("num_prec_radix", pa.int32()),
        _f("interval_precision", pa.int32()),
    ]
)

# --- name patterns -----------------------------------------------------------------------------


def like_matcher(pattern: str | None) -> re.Pattern[str] | None:
    r"""Compile a Flight SQL filter pattern (``%`` any run, ``_`` any one character, ``\`` escapes
    the next character; see SQL_SEARCH_STRING_ESCAPE) into a full-match regex; ``None`` or
    ``%`` matches everything (returns ``None``).

    >>> like_matcher("fl_ght%").fullmatch("flights") is not None
    True
    >>> like_matcher(r"a\_b").fullmatch("axb") is None
    True
    """
    if pattern is None or pattern == "%":
        return None
    parts: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            parts.append(re.escape(next(chars, "\\")))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def _matches(matcher: re.Pattern[str] | None, value: str) -> bool:
    return matcher is None or matcher.fullmatch(value) is not None


# --- catalogs, schemas, tables -----------------------------------------------------------------


@dataclass(frozen=True)
class TableEntry:
    """One table of the catalog: a stream's name and Arrow schema (schema :data:`DB_SCHEMA`), or
    an Iceberg table of the embedded catalog (``db_schema`` = its namespace)."""

    name: str
    schema: pa.Schema
    db_schema: str = DB_SCHEMA


def catalogs_table() -> pa.Table:
    """GetCatalogs: the one catalog."""
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS_SCHEMA)


def db_schemas_table(
    catalog: str | None, schema_pattern: str | None, extra: Iterable[str] = ()
) -> pa.Table:
    """GetDbSchemas: :data:`DB_SCHEMA` and the ``extra`` schemas (the embedded Iceberg catalog's
    namespaces), sorted, those that ``catalog`` (exact; ``None``: any) and ``schema_pattern`` (a
    LIKE pattern) select."""
    rows = []
    matcher = like_matcher(schema_pattern)
    if catalog is None or catalog == CATALOG:
        for name in sorted({DB_SCHEMA, *extra}):
            if _matches(matcher, name):
                rows.append({"catalog_name": CATALOG, "db_schema_name": name})
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def table_types_table() -> pa.Table:
    """GetTableTypes: ``TABLE``."""
    return pa.Table.from_pylist([{"table_type": t} for t in TABLE_TYPES], schema=TABLE_TYPES_SCHEMA)


def tables_table(
    tables: Iterable[TableEntry],
    *,
    catalog: str | None,
    schema_pattern: str | None,
    table_pattern: str | None,
    table_types: Sequence[str],
    include_schema: bool,
) -> pa.Table:
    """GetTables: the tables the filters select, sorted by name, optionally with each table's
    IPC-encapsulated schema whose fields carry the ``ARROW:FLIGHT:SQL:*`` column metadata."""
    result_schema = TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA
    if catalog is not None and catalog != CATALOG:
        return result_schema.empty_table()
    if table_types and not any(t.upper() in TABLE_TYPES for t in table_types):
        return result_schema.empty_table()
    schema_matcher = like_matcher(schema_pattern)
    matcher = like_matcher(table_pattern)
    rows: list[dict[str, Any]] = []
    for table in sorted(tables, key=lambda t: (t.db_schema, t.name)):
        if not _matches(schema_matcher, table.db_schema) or not _matches(matcher, table.name):
            continue
        row: dict[str, Any] = {
            "catalog_name": CATALOG,
            "db_schema_name": table.db_schema,
            "table_name": table.name,
            "table_type": "TABLE",
        }
        if include_schema:
            row["table_schema"] = annotated_schema(table).serialize().to_pybytes()
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=result_schema)


def annotated_schema(table: TableEntry) -> pa.Schema:
    """``table.schema`` with the Flight SQL column metadata on every field (catalog, schema and
    table name, the SQL type name, precision and scale, and the read-only / searchable flags),
    in the types queries return: view and dictionary types as their plain types."""
    fields = []
    for field in table.schema:
        field = field.with_type(plain_type(field.type))
        meta: dict[bytes | str, bytes | str] = {}
        column = column_metadata(field.type, table=table.name, db_schema=table.db_schema)
        for source in (field.metadata or {}, column):
            for key, value in source.items():
                meta[key] = value
        fields.append(field.with_metadata(meta))
    return pa.schema(fields)


def column_metadata(
    data_type: pa.DataType, *, table: str | None = None, db_schema: str = DB_SCHEMA
) -> dict[bytes, bytes]:
    """The ``ARROW:FLIGHT:SQL:*`` field metadata for a column of ``data_type`` (of ``table`` in
    ``db_schema``, when a table is given)."""
    name, precision, scale = sql_type_name(data_type)
    meta = {
        "ARROW:FLIGHT:SQL:TYPE_NAME": name,
        "ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT": "0",
        "ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE": "1" if pa.types.is_string(data_type) else "0",
        "ARROW:FLIGHT:SQL:IS_READ_ONLY": "0",
        "ARROW:FLIGHT:SQL:IS_SEARCHABLE": "1",
    }
    if table is not None:
        meta["ARROW:FLIGHT:SQL:CATALOG_NAME"] = CATALOG
        # The specification's comment says DB_SCHEMA_NAME; the C++, Java and Go drivers read
        # SCHEMA_NAME. Send both.
        meta["ARROW:FLIGHT:SQL:SCHEMA_NAME"] = db_schema
        meta["ARROW:FLIGHT:SQL:DB_SCHEMA_NAME"] = db_schema
        meta["ARROW:FLIGHT:SQL:TABLE_NAME"] = table
    if precision is not None:
        meta["ARROW:FLIGHT:SQL:PRECISION"] = str(precision)
    if scale is not None:
        meta["ARROW:FLIGHT:SQL:SCALE"] = str(scale)
    return {k.encode(): v.encode() for k, v in meta.items()}


def sql_type_name(data_type: pa.DataType) -> tuple[str, int | None, int | None]:
    """Return the SQL type name DataFusion uses for ``data_type``, with its precision (digits, or
    characters for temporal types) and scale where they apply.

    >>> sql_type_name(pa.decimal128(10, 2))
    ('DECIMAL', 10, 2)
    """
    t: Any = data_type
    checks: list[tuple[Any, str, int | None]] = [
        (pa.types.is_boolean, "BOOLEAN", 1),
        (pa.types.is_int8, "TINYINT", 3),
        (pa.types.is_int16, "SMALLINT", 5),
        (pa.types.is_int32, "INTEGER", 10),
        (pa.types.is_int64, "BIGINT", 19),
        (pa.types.is_uint8, "TINYINT UNSIGNED", 3),
        (pa.types.is_uint16, "SMALLINT UNSIGNED", 5),
        (pa.types.is_uint32, "INTEGER UNSIGNED", 10),
        (pa.types.is_uint64, "BIGINT UNSIGNED", 20),
        (pa.types.is_float16, "REAL", 11),
        (pa.types.is_float32, "REAL", 24),
        (pa.types.is_float64, "DOUBLE", 53),
        (pa.types.is_date, "DATE", 10),
        (pa.types.is_time, "TIME", 8),
        (pa.types.is_interval, "INTERVAL", None),
        (pa.types.is_duration, "INTERVAL", None),
    ]
    for check, name, precision in checks:
        if check(t):
            return name, precision, 0 if precision is not None and name != "DATE" else None
    if pa.types.is_decimal(t):
        return "DECIMAL", int(t.precision), int(t.scale)
    if pa.types.is_timestamp(t):
        return ("TIMESTAMP WITH TIME ZONE" if t.tz else "TIMESTAMP"), 29, None
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "VARCHAR", None, None
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "BYTEA", None, None
    if pa.types.is_fixed_size_binary(t):
        return "BYTEA", int(t.byte_width), None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"{sql_type_name(t.value_type)[0]}[]", None, None
    if pa.types.is_struct(t):
        return "STRUCT", None, None
    if pa.types.is_map(t):
        return "MAP", None, None
    return str(data_type).upper(), None, None


def empty_keys_table(schema: pa.Schema) -> pa.Table:
    """GetPrimaryKeys / GetExportedKeys / GetImportedKeys / GetCrossReference: streams have no
    keys, so an empty table with the reference schema."""
    return schema.empty_table()


# --- XDBC type info ----------------------------------------------------------------------------

_X = sql_pb2
_S = _X.Searchable


def _xdbc(
    name: str,
    data_type: int,
    *,
    size: int | None = None,
    prefix: str | None = None,
    suffix: str | None = None,
    params: list[str] | None = None,
    case_sensitive: bool = False,
    searchable: int = _S.SEARCHABLE_BASIC,
    unsigned: bool | None = None,
    fixed_prec_scale: bool = False,
    min_scale: int | None = None,
    max_scale: int | None = None,
    sql_data_type: int | None = None,
    subcode: int | None = None,
    radix: int | None = None,
) -> dict[str, Any]:
    return {
        "type_name": name,
        "data_type": data_type,
        "column_size": size,
        "literal_prefix": prefix,
        "literal_suffix": suffix,
        "create_params": params,
        "nullable": _X.Nullable.NULLABILITY_NULLABLE,
        "case_sensitive": case_sensitive,
        "searchable": searchable,
        "unsigned_attribute": unsigned,
        "fixed_prec_scale": fixed_prec_scale,
        "auto_increment": False if unsigned is not None else None,
        "local_type_name": name,
        "minimum_scale": min_scale,
        "maximum_scale": max_scale,
        "sql_data_type": data_type if sql_data_type is None else sql_data_type,
        "datetime_subcode": subcode,
        "num_prec_radix": radix,
        "interval_precision": None,
    }


_D = _X.XdbcDataType
_SUB = _X.XdbcDatetimeSubcode
_XDBC_TYPES: Final = [
    _xdbc("BOOLEAN", _D.XDBC_BIT, size=1),
    _xdbc("TINYINT", _D.XDBC_TINYINT, size=3, unsigned=False, radix=10),
    _xdbc("SMALLINT", _D.XDBC_SMALLINT, size=5, unsigned=False, radix=10),
    _xdbc("INTEGER", _D.XDBC_INTEGER, size=10, unsigned=False, radix=10),
    _xdbc("BIGINT", _D.XDBC_BIGINT, size=19, unsigned=False, radix=10),
    _xdbc("REAL", _D.XDBC_REAL, size=24, unsigned=False, radix=2),
    _xdbc("DOUBLE", _D.XDBC_DOUBLE, size=53, unsigned=False, radix=2),
    _xdbc(
        "DECIMAL",
        _D.XDBC_DECIMAL,
        size=38,
        params=["precision", "scale"],
        unsigned=False,
        min_scale=0,
        max_scale=38,
        radix=10,
    ),
    _xdbc(
        "VARCHAR",
        _D.XDBC_VARCHAR,
        prefix="'",
        suffix="'",
        case_sensitive=True,
        searchable=_S.SEARCHABLE_FULL,
    ),
    _xdbc("BYTEA", _D.XDBC_VARBINARY, prefix="X'", suffix="'"),
    _xdbc(
        "DATE",
        _D.XDBC_DATE,
        size=10,
        prefix="DATE '",
        suffix="'",
        sql_data_type=_D.XDBC_DATETIME,
        subcode=_SUB.XDBC_SUBCODE_DATE,
    ),
    _xdbc(
        "TIME",
        _D.XDBC_TIME,
        size=8,
        prefix="TIME '",
        suffix="'",
        sql_data_type=_D.XDBC_DATETIME,
        subcode=_SUB.XDBC_SUBCODE_TIME,
    ),
    _xdbc(
        "TIMESTAMP",
        _D.XDBC_TIMESTAMP,
        size=29,
        prefix="TIMESTAMP '",
        suffix="'",
        sql_data_type=_D.XDBC_DATETIME,
        subcode=_SUB.XDBC_SUBCODE_TIMESTAMP,
    ),
    _xdbc(
        "INTERVAL",
        _D.XDBC_INTERVAL,
        prefix="INTERVAL '",
        suffix="'",
        sql_data_type=_D.XDBC_INTERVAL,
        subcode=_SUB.XDBC_SUBCODE_INTERVAL_DAY_TO_SECOND,
    ),
]


def xdbc_type_info_table(data_type: int | None) -> pa.Table:
    """GetXdbcTypeInfo: the SQL types DataFusion accepts in DDL and casts, ordered by
    ``data_type`` then ``type_name``; only ``data_type``'s row(s) when it is given."""
    rows = [r for r in _XDBC_TYPES if data_type is None or r["data_type"] == data_type]
    rows.sort(key=lambda r: (r["data_type"], r["type_name"]))
    return pa.Table.from_pylist(rows, schema=XDBC_TYPE_INFO_SCHEMA)


# --- SqlInfo -----------------------------------------------------------------------------------

_I = sql_pb2.SqlInfo
_CASE = sql_pb2.SqlSupportedCaseSensitivity

#: SQL keywords beyond SQL:2003 that DataFusion's parser knows (JDBC ``getSQLKeywords``).
_KEYWORDS: Final = [
    "ARRAY_AGG", "COPY", "DESCRIBE", "EXPLAIN", "EXTERNAL", "ILIKE", "LIMIT", "OFFSET",
    "QUALIFY", "REPLACE", "SHOW", "UNNEST",
]  # fmt: skip
_NUMERIC_FUNCTIONS: Final = [
    "abs", "acos", "asin", "atan", "atan2", "cbrt", "ceil", "cos", "cot", "degrees", "exp",
    "floor", "ln", "log", "log10", "log2", "pi", "power", "radians", "random", "round",
    "signum", "sin", "sqrt", "tan", "trunc",
]  # fmt: skip
_STRING_FUNCTIONS: Final = [
    "ascii", "btrim", "char_length", "chr", "concat", "concat_ws", "initcap", "left", "length",
    "lower", "lpad", "ltrim", "md5", "octet_length", "repeat", "replace", "reverse", "right",
    "rpad", "rtrim", "split_part", "starts_with", "strpos", "substr", "translate", "trim",
    "upper",
]  # fmt: skip
_SYSTEM_FUNCTIONS: Final = ["arrow_typeof", "coalesce", "nullif", "version"]
_DATETIME_FUNCTIONS: Final = [
    "current_date", "current_time", "date_bin", "date_part", "date_trunc", "from_unixtime",
    "make_date", "now", "to_char", "to_date", "to_timestamp", "to_unixtime",
]  # fmt: skip

_C = sql_pb2.SqlSupportsConvert
_NUMERIC_CONVERTS: Final = [
    _C.SQL_CONVERT_BIGINT,
    _C.SQL_CONVERT_INTEGER,
    _C.SQL_CONVERT_SMALLINT,
    _C.SQL_CONVERT_TINYINT,
    _C.SQL_CONVERT_FLOAT,
    _C.SQL_CONVERT_REAL,
    _C.SQL_CONVERT_DECIMAL,
    _C.SQL_CONVERT_NUMERIC,
]
#: CAST conversions DataFusion performs (from -> to), as SqlSupportsConvert codes.
_CONVERSIONS: Final = {
    **{
        n: [*_NUMERIC_CONVERTS, _C.SQL_CONVERT_VARCHAR, _C.SQL_CONVERT_BIT]
        for n in _NUMERIC_CONVERTS
    },
    _C.SQL_CONVERT_BIT: [*_NUMERIC_CONVERTS, _C.SQL_CONVERT_VARCHAR, _C.SQL_CONVERT_BIT],
    _C.SQL_CONVERT_VARCHAR: [
        *_NUMERIC_CONVERTS,
        _C.SQL_CONVERT_BIT,
        _C.SQL_CONVERT_VARCHAR,
        _C.SQL_CONVERT_DATE,
        _C.SQL_CONVERT_TIME,
        _C.SQL_CONVERT_TIMESTAMP,
        _C.SQL_CONVERT_VARBINARY,
    ],
    _C.SQL_CONVERT_DATE: [_C.SQL_CONVERT_DATE, _C.SQL_CONVERT_TIMESTAMP, _C.SQL_CONVERT_VARCHAR],
    _C.SQL_CONVERT_TIMESTAMP: [
        _C.SQL_CONVERT_DATE,
        _C.SQL_CONVERT_TIME,
        _C.SQL_CONVERT_TIMESTAMP,
        _C.SQL_CONVERT_VARCHAR,
        _C.SQL_CONVERT_BIGINT,
    ],
}


def sql_info_values(server_version: str, *, max_table_name_length: int) -> dict[int, Any]:
    """Every SqlInfo value flight-serve reports, by SqlInfo code.

    Value types follow the specification (Python ``str`` -> ``string_value``, ``bool`` ->
    ``bool_value``, ``_Bigint`` -> ``bigint_value``, ``int`` -> ``int32_bitmask``, ``list[str]``
    -> ``string_list``, ``dict[int, list[int]]`` -> ``int32_to_int32_list_map``), except where
    arrow-java's JDBC driver reads a key as another type: SQL_DEFAULT_TRANSACTION_ISOLATION is
    an int64 (``bigint_value``), as the Java driver casts it to ``Long``
    (``tests/contract/test_flightsql_schemas.py`` pins every key's member). Transactions
    are reported as unsupported (FLIGHT_SQL_SERVER_TRANSACTION = NONE,
    SQL_TRANSACTIONS_SUPPORTED = false): every statement commits on its own. Substrait is not
    supported, so its version keys are absent. Limits of 0 mean "no limit or unknown".
    """
    big = _Bigint
    return {
        _I.FLIGHT_SQL_SERVER_NAME: "flight-serve",
        _I.FLIGHT_SQL_SERVER_VERSION: server_version,
        _I.FLIGHT_SQL_SERVER_ARROW_VERSION: pa.__version__,
        _I.FLIGHT_SQL_SERVER_READ_ONLY: False,
        _I.FLIGHT_SQL_SERVER_SQL: True,
        _I.FLIGHT_SQL_SERVER_SUBSTRAIT: False,
        _I.FLIGHT_SQL_SERVER_TRANSACTION: sql_pb2.SQL_SUPPORTED_TRANSACTION_NONE,
        _I.FLIGHT_SQL_SERVER_CANCEL: True,  # CancelQuery (flight/cancel.py)
        _I.FLIGHT_SQL_SERVER_BULK_INGESTION: True,
        _I.FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED: False,
        _I.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: 0,
        _I.FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: 0,
        _I.SQL_DDL_CATALOG: False,
        _I.SQL_DDL_SCHEMA: False,
        _I.SQL_DDL_TABLE: True,
        _I.SQL_IDENTIFIER_CASE: _CASE.SQL_CASE_SENSITIVITY_LOWERCASE,
        _I.SQL_IDENTIFIER_QUOTE_CHAR: '"',
        _I.SQL_QUOTED_IDENTIFIER_CASE: _CASE.SQL_CASE_SENSITIVITY_UNKNOWN,
        _I.SQL_ALL_TABLES_ARE_SELECTABLE: True,
        _I.SQL_NULL_ORDERING: sql_pb2.SQL_NULLS_SORTED_HIGH,
        _I.SQL_KEYWORDS: list(_KEYWORDS),
        _I.SQL_NUMERIC_FUNCTIONS: list(_NUMERIC_FUNCTIONS),
        _I.SQL_STRING_FUNCTIONS: list(_STRING_FUNCTIONS),
        _I.SQL_SYSTEM_FUNCTIONS: list(_SYSTEM_FUNCTIONS),
        _I.SQL_DATETIME_FUNCTIONS: list(_DATETIME_FUNCTIONS),
        _I.SQL_SEARCH_STRING_ESCAPE: "\\",
        _I.SQL_EXTRA_NAME_CHARACTERS: "",
        _I.SQL_SUPPORTS_COLUMN_ALIASING: True,
        _I.SQL_NULL_PLUS_NULL_IS_NULL: True,
        _I.SQL_SUPPORTS_CONVERT: {k: sorted(v) for k, v in sorted(_CONVERSIONS.items())},
        _I.SQL_SUPPORTS_TABLE_CORRELATION_NAMES: True,
        _I.SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES: False,
        _I.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: True,
        _I.SQL_SUPPORTS_ORDER_BY_UNRELATED: True,
        _I.SQL_SUPPORTED_GROUP_BY: _bits(
            sql_pb2.SQL_GROUP_BY_UNRELATED, sql_pb2.SQL_GROUP_BY_BEYOND_SELECT
        ),
        _I.SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE: True,
        _I.SQL_SUPPORTS_NON_NULLABLE_COLUMNS: True,
        _I.SQL_SUPPORTED_GRAMMAR: _bits(sql_pb2.SQL_MINIMUM_GRAMMAR, sql_pb2.SQL_CORE_GRAMMAR),
        _I.SQL_ANSI92_SUPPORTED_LEVEL: _bits(
            sql_pb2.ANSI92_ENTRY_SQL, sql_pb2.ANSI92_INTERMEDIATE_SQL
        ),
        _I.SQL_SUPPORTS_INTEGRITY_ENHANCEMENT_FACILITY: False,
        _I.SQL_OUTER_JOINS_SUPPORT_LEVEL: sql_pb2.SQL_FULL_OUTER_JOINS,
        _I.SQL_SCHEMA_TERM: "schema",
        _I.SQL_PROCEDURE_TERM: "procedure",
        _I.SQL_CATALOG_TERM: "catalog",
        _I.SQL_CATALOG_AT_START: True,
        _I.SQL_SCHEMAS_SUPPORTED_ACTIONS: 0,
        _I.SQL_CATALOGS_SUPPORTED_ACTIONS: 0,
        _I.SQL_SUPPORTED_POSITIONED_COMMANDS: 0,
        _I.SQL_SELECT_FOR_UPDATE_SUPPORTED: False,
        _I.SQL_STORED_PROCEDURES_SUPPORTED: False,
        _I.SQL_SUPPORTED_SUBQUERIES: _bits(
            sql_pb2.SQL_SUBQUERIES_IN_COMPARISONS,
            sql_pb2.SQL_SUBQUERIES_IN_EXISTS,
            sql_pb2.SQL_SUBQUERIES_IN_INS,
        ),
        _I.SQL_CORRELATED_SUBQUERIES_SUPPORTED: True,
        _I.SQL_SUPPORTED_UNIONS: _bits(sql_pb2.SQL_UNION, sql_pb2.SQL_UNION_ALL),
        _I.SQL_MAX_BINARY_LITERAL_LENGTH: big(0),
        _I.SQL_MAX_CHAR_LITERAL_LENGTH: big(0),
        _I.SQL_MAX_COLUMN_NAME_LENGTH: big(0),
        _I.SQL_MAX_COLUMNS_IN_GROUP_BY: big(0),
        _I.SQL_MAX_COLUMNS_IN_INDEX: big(0),
        _I.SQL_MAX_COLUMNS_IN_ORDER_BY: big(0),
        _I.SQL_MAX_COLUMNS_IN_SELECT: big(0),
        _I.SQL_MAX_COLUMNS_IN_TABLE: big(0),
        _I.SQL_MAX_CONNECTIONS: big(0),
        _I.SQL_MAX_CURSOR_NAME_LENGTH: big(0),
        _I.SQL_MAX_INDEX_LENGTH: big(0),
        _I.SQL_DB_SCHEMA_NAME_LENGTH: big(len(DB_SCHEMA)),
        _I.SQL_MAX_PROCEDURE_NAME_LENGTH: big(0),
        _I.SQL_MAX_CATALOG_NAME_LENGTH: big(len(CATALOG)),
        _I.SQL_MAX_ROW_SIZE: big(0),
        _I.SQL_MAX_ROW_SIZE_INCLUDES_BLOBS: True,
        _I.SQL_MAX_STATEMENT_LENGTH: big(0),
        _I.SQL_MAX_STATEMENTS: big(0),
        _I.SQL_MAX_TABLE_NAME_LENGTH: big(max_table_name_length),
        _I.SQL_MAX_TABLES_IN_SELECT: big(0),
        _I.SQL_MAX_USERNAME_LENGTH: big(0),
        # The specification says int32; arrow-java's JDBC driver casts this one to Long
        # (ArrowDatabaseMetadata.getDefaultTransactionIsolation) and throws on an int32.
        _I.SQL_DEFAULT_TRANSACTION_ISOLATION: big(sql_pb2.SQL_TRANSACTION_NONE),
        _I.SQL_TRANSACTIONS_SUPPORTED: False,
        _I.SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS: 0,
        _I.SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT: False,
        _I.SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED: False,
        _I.SQL_SUPPORTED_RESULT_SET_TYPES: _bits(sql_pb2.SQL_RESULT_SET_TYPE_FORWARD_ONLY),
        _I.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_UNSPECIFIED: 0,
        _I.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_FORWARD_ONLY: _bits(
            sql_pb2.SQL_RESULT_SET_CONCURRENCY_READ_ONLY
        ),
        _I.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_SENSITIVE: 0,
        _I.SQL_SUPPORTED_CONCURRENCIES_FOR_RESULT_SET_SCROLL_INSENSITIVE: 0,
        _I.SQL_BATCH_UPDATES_SUPPORTED: True,
        _I.SQL_SAVEPOINTS_SUPPORTED: False,
        _I.SQL_NAMED_PARAMETERS_SUPPORTED: False,
        _I.SQL_LOCATORS_UPDATE_COPY: False,
        _I.SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED: False,
    }


class _Bigint(int):
    """An ``int`` reported as ``bigint_value`` (int64) rather than ``int32_bitmask``."""


def _bits(*positions: int) -> int:
    value = 0
    for position in positions:
        value |= 1 << position
    return value


def _type_code(value: Any) -> int:
    if isinstance(value, str):
        return _STRING
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, _Bigint):
        return _BIGINT
    if isinstance(value, int):
        return _INT32
    if isinstance(value, list):
        return _STRING_LIST
    if isinstance(value, dict):
        return _INT32_MAP
    raise TypeError(f"no SqlInfo union member for {type(value).__name__}")


def sql_info_table(values: Mapping[int, Any], wanted: Sequence[int]) -> pa.Table:
    """GetSqlInfo: one row per code in ``wanted`` that ``values`` knows (every known code, in
    code order, when ``wanted`` is empty); unknown codes are left out."""
    codes = sorted(values) if not wanted else [c for c in wanted if c in values]
    type_ids: list[int] = []
    offsets: list[int] = []
    children: list[list[Any]] = [[] for _ in _SQL_INFO_VALUE_FIELDS]
    for code in codes:
        value = values[code]
        type_code = _type_code(value)
        type_ids.append(type_code)
        offsets.append(len(children[type_code]))
        if type_code == _INT32_MAP:
            value = list(value.items())
        children[type_code].append(value)
    child_arrays = [
        pa.array(items, type=field.type)
        for items, field in zip(children, _SQL_INFO_VALUE_FIELDS, strict=True)
    ]
    union: Any = pa.UnionArray.from_buffers(
        _SQL_INFO_VALUE_TYPE,
        len(codes),
        [
            None,
            pa.py_buffer(bytes(type_ids)),
            pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets)),
        ],
        children=child_arrays,
    )
    names = pa.array(codes, pa.uint32())
    return pa.Table.from_arrays([names, union], schema=SQL_INFO_SCHEMA)
