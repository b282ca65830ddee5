"""Iceberg tables of the server's embedded catalog as SQL tables, next to streams (issue 5 item 3).

A query names an Iceberg table as ``<namespace>.<table>`` (two parts, e.g. ``SELECT * FROM
ops.hourly_delays``); a stream is a one-part name (``flights``, or quoted ``"ops.x"``), so the two
never collide. The catalog is the server's embedded one (a pyiceberg ``SqlCatalog`` on SQLite at
``<data dir>/iceberg/catalog.db``, where pipelines write by default); a server without that file
has no Iceberg tables and no file is created by a query.

Planning (``GetFlightInfo``, Flight SQL ``GetFlightInfo`` / prepare) registers each table's
*schema* only. Execution (``DoGet``) reads the table's **current snapshot** at DoGet time (pyiceberg
scan → Arrow record batches, registered in DataFusion; pyiceberg's own DataFusion extra is not
used, it pins an older DataFusion): a commit between GetFlightInfo and DoGet is visible, unlike a
stream's rows, which the ticket pins. ``large_string``/``large_binary`` columns are read as
``string``/``binary``. A name that is not a table of the catalog is left to DataFusion, which
reports it as a missing table.
"""

from __future__ import annotations

from pathlib import Path

import datafusion
import pyarrow as pa
import sqlglot
from datafusion.catalog import Schema
from sqlglot import exp

from flight_serve.connectors.iceberg import default_catalog_properties, load_iceberg_catalog
from flight_serve.errors import QueryError

__all__ = ["iceberg_references", "register_iceberg_tables"]

_DEFAULT_SCHEMA = "public"


def iceberg_references(sql: str) -> list[tuple[str, str]]:
    """``(namespace, table)`` of each two-part table name ``sql`` reads (``public.x`` excluded:
    that is DataFusion's default schema), as DataFusion resolves them (unquoted parts
    lower-cased). Unparseable SQL: none.

    >>> iceberg_references('SELECT * FROM ops.hourly h JOIN flights f ON true')
    [('ops', 'hourly')]
    """
    try:
        statements = sqlglot.parse(sql)
    except sqlglot.errors.SqlglotError:
        return []
    found: list[tuple[str, str]] = []
    for statement in statements:
        if statement is None:
            continue
        for table in statement.find_all(exp.Table):
            db = table.args.get("db")
            if not isinstance(table.this, exp.Identifier) or not isinstance(db, exp.Identifier):
                continue
            if table.args.get("catalog") is not None:
                continue
            namespace = db.name if db.quoted else db.name.lower()
            name = table.this.name if table.this.quoted else table.this.name.lower()
            if namespace != _DEFAULT_SCHEMA and (namespace, name) not in found:
                found.append((namespace, name))
    return found


def _plain(schema: pa.Schema) -> pa.Schema:
    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_binary(t):
            return pa.binary()
        return t

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def register_iceberg_tables(
    ctx: datafusion.SessionContext, sql: str, data_dir: Path, *, data: bool
) -> list[str]:
    """Register the Iceberg tables ``sql`` names in ``ctx`` as ``<namespace>.<table>``: their
    schemas only (``data=False``) or their current snapshot's rows. Returns the names registered.

    Raises:
        QueryError: a table exists but cannot be read (pyiceberg's message).
    """
    refs = iceberg_references(sql)
    if not refs or not (Path(data_dir) / "iceberg" / "catalog.db").exists():
        return []
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    catalog = load_iceberg_catalog("default", default_catalog_properties(Path(data_dir)))
    registered = []
    for namespace, name in refs:
        try:
            table = catalog.load_table((namespace, name))
        except (NoSuchTableError, NoSuchNamespaceError):
            continue  # DataFusion says "table not found"
        try:
            schema = _plain(table.schema().as_arrow())
            if data:
                reader = table.scan().to_arrow_batch_reader()
                batches = [
                    pa.RecordBatch.from_arrays(
                        [b.column(f.name).cast(f.type) for f in schema], schema=schema
                    )
                    for b in reader
                    if b.num_rows
                ]
            else:
                batches = []
        except Exception as exc:  # pyiceberg raises many kinds
            raise QueryError(f"iceberg table {namespace}.{name}: cannot read it: {exc}") from exc
        root = ctx.catalog()
        if namespace not in root.names():
            root.register_schema(namespace, Schema.memory_schema())
        ctx.register_record_batches(
            f'"{namespace}"."{name}"', [batches or [pa.RecordBatch.from_pylist([], schema)]]
        )
        registered.append(f"{namespace}.{name}")
    return registered
