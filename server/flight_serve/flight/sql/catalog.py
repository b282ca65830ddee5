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
reports it as a missing table. ``datafusion.<namespace>.<table>`` (the three-part name JDBC and
ADBC tools build from Flight SQL GetTables, where each namespace is a schema of catalog
``datafusion``) names the same table. Only one-level namespaces other than ``public`` are tables
in SQL (and listed by :func:`iceberg_namespaces` / :func:`iceberg_tables`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
from datafusion.catalog import Schema

from flight_serve.connectors.iceberg import default_catalog_properties, load_iceberg_catalog
from flight_serve.errors import QueryError

__all__ = [
    "iceberg_input_bytes",
    "iceberg_namespaces",
    "iceberg_tables",
    "register_iceberg_tables",
]

_DEFAULT_SCHEMA = "public"


def _plain(schema: pa.Schema) -> pa.Schema:
    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_binary(t):
            return pa.binary()
        return t

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def register_iceberg_tables(
    ctx: datafusion.SessionContext,
    refs: Sequence[tuple[str, str]],
    data_dir: Path,
    *,
    data: bool,
) -> list[str]:
    """Register the Iceberg tables ``refs`` names (``(namespace, table)``, a statement's
    :attr:`~flight_serve.flight.sql.statement.Statement.iceberg_refs`) in ``ctx`` as
    ``<namespace>.<table>``: their schemas only (``data=False``) or their current snapshot's
    rows. Returns the names registered.

    Raises:
        QueryError: a table exists but cannot be read (pyiceberg's message).
    """
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


def _embedded_catalog(data_dir: Path) -> Any:
    if not (Path(data_dir) / "iceberg" / "catalog.db").exists():
        return None
    return load_iceberg_catalog("default", default_catalog_properties(Path(data_dir)))


def iceberg_namespaces(data_dir: Path) -> list[str]:
    """The one-level namespaces of the server's embedded catalog other than ``public``, sorted:
    the SQL schemas that hold Iceberg tables (none without ``<data_dir>/iceberg/catalog.db``).

    Raises:
        QueryError: the catalog cannot be listed (pyiceberg's message).
    """
    catalog = _embedded_catalog(data_dir)
    if catalog is None:
        return []
    try:
        found = catalog.list_namespaces()
    except Exception as exc:  # pyiceberg raises many kinds
        raise QueryError(f"iceberg catalog: cannot list its namespaces: {exc}") from exc
    return sorted(n[0] for n in found if len(n) == 1 and n[0] != _DEFAULT_SCHEMA)


def iceberg_tables(data_dir: Path, *, with_schemas: bool) -> list[tuple[str, str, pa.Schema]]:
    """``(namespace, table, Arrow schema)`` of every table in :func:`iceberg_namespaces`, the
    schema as SQL reads it (``large_string`` as ``string``), or empty unless ``with_schemas``
    (listing names does not load the tables' metadata).

    Raises:
        QueryError: the catalog or a table's metadata cannot be read (pyiceberg's message).
    """
    catalog = _embedded_catalog(data_dir)
    found: list[tuple[str, str, pa.Schema]] = []
    for namespace in iceberg_namespaces(data_dir):
        try:
            for identifier in catalog.list_tables(namespace):
                name = identifier[-1]
                schema = pa.schema([])
                if with_schemas:
                    schema = _plain(catalog.load_table((namespace, name)).schema().as_arrow())
                found.append((namespace, name, schema))
        except Exception as exc:  # pyiceberg raises many kinds
            raise QueryError(f"iceberg namespace {namespace}: cannot list it: {exc}") from exc
    return found


def iceberg_input_bytes(refs: Sequence[tuple[str, str]], data_dir: Path) -> int:
    """The data-file bytes (the current snapshot summary's ``total-files-size``) of the Iceberg
    tables ``refs`` names (``(namespace, table)``): what a query reserves in the memory budget for them, as it reserves a
    stream's on-disk bytes. A name the catalog does not hold, or a table without a snapshot,
    counts 0.

    Raises:
        QueryError: a table exists but its metadata cannot be read (pyiceberg's message).
    """
    catalog = _embedded_catalog(data_dir) if refs else None
    if catalog is None:
        return 0
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    total = 0
    for namespace, name in refs:
        try:
            snapshot = catalog.load_table((namespace, name)).current_snapshot()
        except (NoSuchTableError, NoSuchNamespaceError):
            continue
        except Exception as exc:  # pyiceberg raises many kinds
            raise QueryError(f"iceberg table {namespace}.{name}: cannot read it: {exc}") from exc
        summary = snapshot.summary if snapshot is not None else None
        size = summary.additional_properties.get("total-files-size", "0") if summary else "0"
        total += int(size) if size.isdigit() else 0
    return total
