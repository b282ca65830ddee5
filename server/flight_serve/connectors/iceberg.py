"""Apache Iceberg tables as pipeline sources and sinks, and as SQL tables (pyiceberg).

**Catalog.** Any pyiceberg catalog (:func:`load_iceberg_catalog`). The embedded default, when no
catalog option is given, is a ``SqlCatalog`` on SQLite at ``<data dir>/iceberg/catalog.db`` with the
warehouse ``file://<data dir>/iceberg/warehouse`` (no server). Table names are
``<namespace>.<table>`` (a dotted namespace is allowed: ``a.b.table``).

**Source** (:class:`IcebergSource`). Every ``monitor_interval`` (seconds) it reloads the table and
walks the current snapshot's ancestry back to the last consumed snapshot; the snapshots in between
are read oldest first, one at a time, each as the rows *its* commit appended (pyiceberg's
``incremental_append_scan`` from that snapshot inclusive to itself inclusive). The **offset** is the
id of the last snapshot consumed: a checkpoint records it, and a resumed source goes on with that
snapshot's child. Snapshot order is commit order, so the source is **one watermark partition**
(named ``iceberg <table>``); a table does not reorder its own history. Snapshots of other
operations:

* ``replace`` (compaction: same rows, new files): skipped, logged at INFO;
* ``overwrite`` and ``delete``: :class:`NonAppendSnapshotError` naming the snapshot id and the
  operation, unless ``skip_overwrite_snapshots`` / ``skip_delete_snapshots`` are set: then the
  snapshot is skipped and a WARNING names it (its appended rows, if any, are not delivered: they
  replace rows the source already delivered, and a stream cannot take rows back).

Start strategies (``starting_strategy``, as Flink's Iceberg source names them): ``earliest`` (the
default: every row the table's history appended, oldest snapshot first; if the oldest surviving
ancestor has an expired parent, that snapshot is read in full, which is the table's content then),
``latest`` (only rows committed after the source starts), ``snapshot_id`` (from
``start_snapshot_id``, inclusive) and ``timestamp`` (from the first snapshot committed at or after
``start_snapshot_timestamp``, inclusive). Rate limits per poll: ``max_snapshots_per_poll`` and
``max_rows_per_poll`` (by the snapshots' ``added-records``; a snapshot is never split, so one
snapshot is always read even if larger). ``stop_at = 'latest'`` bounds the source to the snapshot
current when it starts (then its partition ends).

The source reads only the current snapshot's history (as Flink's and Spark's Iceberg sources
do): an offset (or ``stop_at`` snapshot) that is **not an ancestor** of the current snapshot (the
table rolled back or set to another snapshot, or an id the table never had) fails the source with
:class:`SnapshotNotInHistoryError` naming it and the table. An **expired** offset (the last
consumed snapshot is gone from the metadata): if a surviving snapshot names it as parent (in the
current metadata or an earlier metadata file: pyiceberg's expiry clears the child's parent id),
the source resumes there (nothing is lost: expiry removes metadata, not the child's appended
files); otherwise :class:`SnapshotExpiredError` names the unread snapshot that expired and says
what to do, or, with ``expired_snapshot = 'reset'``, the source resumes with the oldest surviving
ancestor of the current snapshot and reports the gap (``on_gap``). See :meth:`IcebergSource.pending`.

**Sink** (:class:`IcebergSink`). :meth:`IcebergSink.commit` appends one epoch's rows in one
Iceberg transaction that also writes the **commit markers**: snapshot summary properties
``flight-serve.writer`` / ``flight-serve.run`` / ``flight-serve.epoch`` and the table property
``flight-serve.epoch.<writer>`` = ``<run>:<epoch>`` (a table property survives snapshot expiry,
which removes summaries). Before every attempt the table is reloaded and the markers checked: an
epoch already there is not written again. A commit conflict (``CommitFailedException``: another
writer committed first) is retried after a backoff (``backoff_s`` doubling, with jitter, up to
``max_retries``); an unknown outcome (any other error out of the commit call, e.g. the commit landed
and the connection dropped) is never re-appended blindly: the table is reloaded and the markers
decide. Rows are conformed before the write: timestamps to microseconds (Iceberg's unit;
sub-microsecond digits are floored toward the past), unsigned integers to signed ones wide enough (``uint64``
above the ``int64`` range is an error naming the column), view types to plain ones. A column the
table lacks is added (schema evolution by name) only with ``allow_schema_evolution``; otherwise the
commit fails naming it. With ``upsert_keys`` the epoch is written with pyiceberg's ``upsert`` (rows
matching on the keys are replaced, the rest inserted; the last row per key in an epoch wins), in the
same transaction as the markers. A missing table is created from the first epoch's columns, with an
optional partition spec (``partition_by``: ``day(ts)``, ``hour(ts)``, ``month(ts)``, ``year(ts)``,
``bucket(16, k)``, ``truncate(4, s)``, ``identity(k)`` or a bare column; several separated by
commas).

Errors: :class:`~flight_serve.errors.ConnectorError` (and its subclasses below) for a bad option, a
missing table or namespace, a column that does not fit, or a commit that fails after the retries.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.connectors.base import ResumedSource, SourceEvent
from flight_serve.connectors.columns import conform, floor_timestamps
from flight_serve.errors import (
    CatalogError,
    CheckpointError,
    ConnectorError,
    DiskFullError,
    is_disk_full,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = [
    "MARKER_EPOCH",
    "MARKER_RUN",
    "MARKER_WRITER",
    "CommitResult",
    "IcebergSink",
    "IcebergSource",
    "NonAppendSnapshotError",
    "SnapshotExpiredError",
    "SnapshotNotInHistoryError",
    "StartingStrategy",
    "conform_for_iceberg",
    "default_catalog_properties",
    "load_iceberg_catalog",
    "masked_uri",
    "parse_identifier",
    "parse_partition_spec",
]

log = logging.getLogger("flight_serve.connectors.iceberg")

#: Snapshot summary keys of the sink's commit markers.
MARKER_WRITER = "flight-serve.writer"
MARKER_RUN = "flight-serve.run"
MARKER_EPOCH = "flight-serve.epoch"
#: Table property prefix of the sink's commit marker (``<prefix><writer>`` = ``<run>:<epoch>``).
MARKER_PROPERTY_PREFIX = "flight-serve.epoch."

StartingStrategy = Literal["earliest", "latest", "snapshot_id", "timestamp"]

_catalogs: dict[tuple[str, tuple[tuple[str, str], ...]], Catalog] = {}
_catalogs_lock = threading.Lock()


class NonAppendSnapshotError(ConnectorError):
    """An Iceberg source met an ``overwrite`` or ``delete`` snapshot it is not told to skip."""


class SnapshotExpiredError(CheckpointError):
    """An Iceberg source's next snapshot expired before it was read: the checkpointed snapshot
    expired and no surviving snapshot follows it, or a snapshot after it expired (named when
    the table's metadata log still knows its id)."""


class SnapshotNotInHistoryError(CheckpointError):
    """An Iceberg source's checkpointed (or ``stop_at``) snapshot is not in the history of the
    table's current snapshot: the table was rolled back or set to another snapshot, or the id
    never was a snapshot of the table. Not affected by ``expired_snapshot = 'reset'``."""


def default_catalog_properties(data_dir: Path) -> dict[str, str]:
    """The embedded catalog of ``data_dir``: a pyiceberg ``SqlCatalog`` on SQLite at
    ``<data_dir>/iceberg/catalog.db``, warehouse ``file://<data_dir>/iceberg/warehouse``."""
    root = Path(data_dir).absolute() / "iceberg"
    return {
        "type": "sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": f"file://{root / 'warehouse'}",
    }


def load_iceberg_catalog(name: str, properties: dict[str, str]) -> Catalog:
    """A pyiceberg catalog (``pyiceberg.catalog.load_catalog(name, **properties)``), cached per
    name and properties. For a ``sql`` catalog on a ``sqlite:///`` file the file's directory and
    the ``file://`` warehouse directory are created first.

    Raises:
        ConnectorError: pyiceberg cannot load the catalog (its message is included).
    """
    key = (name, tuple(sorted(properties.items())))
    with _catalogs_lock:
        found = _catalogs.get(key)
        if found is not None:
            return found
        uri = properties.get("uri", "")
        try:
            if properties.get("type") == "sql" and uri.startswith("sqlite:///"):
                Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            warehouse = properties.get("warehouse", "")
            if warehouse.startswith("file://"):
                Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a path that cannot be made: the user's, unless the disk is full
            message = f"iceberg catalog {name!r}: cannot create its directory: {exc}"
            raise (DiskFullError if is_disk_full(exc) else ConnectorError)(message) from exc
        from pyiceberg.catalog import load_catalog

        try:
            catalog = load_catalog(name, **properties)
        except Exception as exc:  # pyiceberg raises many kinds: report them as one
            raise _failed(f"iceberg catalog {name!r}: cannot load it: {exc}", exc) from exc
        _catalogs[key] = catalog
        return catalog


def _failed(message: str, exc: BaseException) -> ConnectorError | CatalogError:
    """``message`` as a :class:`CatalogError` when the catalog, its database or its storage
    failed (an ``OSError``: a connection refused, a file system error, which ``requests``'
    errors are; SQLAlchemy's ``OperationalError``; pyiceberg's ``ServerError`` /
    ``ServiceUnavailableError``), else as a :class:`ConnectorError`: pyiceberg refused what it
    was asked (a schema change it cannot make, a bad property)."""
    from pyiceberg.exceptions import ServerError, ServiceUnavailableError

    outside: tuple[type[BaseException], ...] = (OSError, ServerError, ServiceUnavailableError)
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover - the sql catalog's extra is not installed
        pass
    else:
        outside = (*outside, OperationalError)
    return CatalogError(message) if isinstance(exc, outside) else ConnectorError(message)


def parse_identifier(text: str) -> tuple[str, ...]:
    """``"ns.table"`` → ``("ns", "table")`` (a dotted namespace is kept whole: ``a.b.t``).

    Raises:
        ConnectorError: no namespace, or an empty part.
    """
    parts = tuple(text.strip().split("."))
    if len(parts) < 2 or any(not p for p in parts):
        raise ConnectorError(
            f"iceberg table {text!r}: expected <namespace>.<table> (e.g. 'ops.hourly_delays')"
        )
    return parts


def _load_table(catalog: Catalog, identifier: tuple[str, ...]) -> Table:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise ConnectorError(_missing_table(catalog, identifier)) from exc


def masked_uri(uri: str) -> str:
    """``uri`` with its password (if any) replaced by ``***``, for messages and logs.

    >>> masked_uri("postgresql+psycopg2://lake:s3cret@db:5432/iceberg")
    'postgresql+psycopg2://lake:***@db:5432/iceberg'
    >>> masked_uri("sqlite:////data/iceberg/catalog.db")
    'sqlite:////data/iceberg/catalog.db'
    """
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:  # not a URL (a bad port): nothing to find
        return uri
    if password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _missing_table(catalog: Catalog, identifier: tuple[str, ...]) -> str:
    """"iceberg table ns.t does not exist in catalog 'name' (uri; what it holds instead)": a
    wrong catalog option is the likely mistake, so the message names the catalog."""
    where = masked_uri(
        catalog.properties.get("uri") or catalog.properties.get("warehouse") or "no uri"
    )
    try:
        namespaces = [".".join(n) for n in catalog.list_namespaces()]
        namespace = identifier[:-1]
        if ".".join(namespace) in namespaces:
            tables = sorted(t[-1] for t in catalog.list_tables(namespace))
            held = f"namespace {'.'.join(namespace)} holds " + (
                ", ".join(tables) if tables else "no tables"
            )
        else:
            held = "its namespaces: " + ", ".join(sorted(namespaces)) if namespaces else ""
            held = held or "it has no namespaces"
    except Exception:  # listing is a courtesy: a catalog that cannot list says nothing more
        held = "cannot list it"
    return (
        f"iceberg table {'.'.join(identifier)} does not exist in catalog {catalog.name!r} "
        f"({where}; {held})"
    )


# --- conforming rows ---------------------------------------------------------------------------


def _iceberg_type(name: str, t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):  # a zoned one holds instants: Iceberg's timestamptz is UTC
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return pa.int64()
    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return pa.int32()
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if (pa.types.is_time64(t) and t.unit == "ns") or pa.types.is_time32(t):
        return pa.time64("us")
    if pa.types.is_date64(t):
        return pa.date32()
    return t


def conform_for_iceberg(table: pa.Table) -> pa.Table:
    """``table`` with the types Iceberg stores: timestamps (any unit) to microseconds
    (sub-microsecond digits floored toward the past; a zoned one to UTC, the same instants), ``int8``/``int16``/``uint8``/``uint16`` to ``int32``,
    ``uint32``/``uint64`` to ``int64``, ``string_view``/``binary_view`` to plain types,
    ``time64[ns]`` and ``time32`` to ``time64[us]``, ``date64`` to ``date32``; other columns
    unchanged.

    Raises:
        ConnectorError: a ``uint64`` value above the ``int64`` range (the column is named).
    """
    columns = []
    fields = []
    for field, column in zip(table.schema, table.columns, strict=True):
        target = _iceberg_type(field.name, field.type)
        if target != field.type:
            safe = not pa.types.is_time64(field.type)  # a time of day is never negative
            try:
                if pa.types.is_timestamp(field.type):  # floored toward the past
                    column = floor_timestamps(column, "us")
                column = pc.cast(column, target, safe=safe)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ConnectorError(
                    f"column {field.name!r} ({field.type}) does not fit Iceberg's {target}: {exc}"
                ) from exc
        columns.append(column)
        fields.append(pa.field(field.name, target, field.nullable, field.metadata))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _plain(t: pa.DataType) -> pa.DataType:
    """Source batches use ``string``/``binary`` (pyiceberg reads ``large_string``)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


# --- partition specs ----------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_partition_spec(text: str) -> list[tuple[str, str, int | None]]:
    """``partition_by`` text → ``[(transform, column, width or None)]``.

    ``'day(window_start), bucket(16, origin), carrier'`` →
    ``[('day', 'window_start', None), ('bucket', 'origin', 16), ('identity', 'carrier', None)]``.

    Raises:
        ConnectorError: an unknown transform or a malformed term (named).
    """
    out: list[tuple[str, str, int | None]] = []
    for term in _split_top(text):
        if "(" not in term:
            out.append(("identity", term, None))
            continue
        name, _, rest = term.partition("(")
        name = name.strip().lower()
        if not rest.endswith(")"):
            raise ConnectorError(f"partition_by term {term!r}: expected transform(column)")
        args = [a.strip() for a in rest[:-1].split(",")]
        if name in ("year", "month", "day", "hour", "identity") and len(args) == 1 and args[0]:
            out.append((name, args[0], None))
        elif name in ("bucket", "truncate") and len(args) == 2 and args[0].isdigit():
            out.append((name, args[1], int(args[0])))
        else:
            raise ConnectorError(
                f"partition_by term {term!r}: use year/month/day/hour/identity(column), "
                "bucket(n, column) or truncate(width, column)"
            )
    return out


def _transform(name: str, width: int | None) -> Any:
    from pyiceberg import transforms

    if name == "bucket":
        return transforms.BucketTransform(width or 1)
    if name == "truncate":
        return transforms.TruncateTransform(width or 1)
    return {
        "year": transforms.YearTransform(),
        "month": transforms.MonthTransform(),
        "day": transforms.DayTransform(),
        "hour": transforms.HourTransform(),
        "identity": transforms.IdentityTransform(),
    }[name]


# --- the sink ---------------------------------------------------------------------------------


def _without_internal_retries(table: Table) -> Table:
    """``table`` whose local metadata says ``commit.retry.num-retries = 0``.

    pyiceberg 0.12 retries a conflicting commit itself (it rebases the snapshot on the new
    metadata and commits again) without looking at our markers: two instances of one writer
    (a zombie after a failover) could then both land one epoch. With its retries off, every
    retry goes through :meth:`IcebergSink.commit`'s reload and marker check. Only this process's
    copy changes: the catalog applies the transaction's updates to its own metadata, and the
    table's stored properties are untouched.
    """
    from pyiceberg.table import Table as IcebergTable

    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    metadata = table.metadata.model_copy(update={"properties": properties})
    return IcebergTable(table.name(), metadata, table.metadata_location, table.io, table.catalog)


@dataclass(frozen=True)
class CommitResult:
    """What :meth:`IcebergSink.commit` did.

    Attributes:
        committed: ``True``: this call wrote the epoch; ``False``: its markers were there already.
        snapshot_id: the table's current snapshot after the call (``None``: no rows, nothing).
        attempts: commit attempts made (1 without conflicts).
        conflicts: attempts lost to another writer's commit (``CommitFailedException``).
        unknown: attempts whose outcome was unknown (re-checked through the markers).
    """

    committed: bool
    snapshot_id: int | None
    attempts: int
    conflicts: int
    unknown: int


class IcebergSink:
    """Writes epochs into an Iceberg table exactly once (see the module docstring).

    Args:
        catalog: the pyiceberg catalog.
        table: ``<namespace>.<table>``.
        writer: this sink's name in the markers (``<pipeline>/<sink>``): one writer commits one
            epoch once.
        run: the run the epochs belong to (a fresh run starts its epochs over; a resumed run
            keeps its run id, from the checkpoint).
        partition_by: the partition spec of a table created here (see :func:`parse_partition_spec`).
        allow_schema_evolution: add columns the table lacks (by name) instead of failing.
        upsert_keys: write with pyiceberg ``upsert`` on these columns (``emit = 'update'``).
        max_retries: commit attempts after the first, on conflicts and unknown outcomes.
        backoff_s: the first retry's delay in seconds (doubled each retry, up to 2 s, with
            ±50 % jitter).

    Raises:
        ConnectorError: a malformed table name or ``partition_by``.
    """

    def __init__(
        self,
        catalog: Catalog,
        table: str,
        *,
        writer: str,
        run: str,
        partition_by: str | None = None,
        allow_schema_evolution: bool = False,
        upsert_keys: tuple[str, ...] | None = None,
        max_retries: int = 10,
        backoff_s: float = 0.05,
    ) -> None:
        self.catalog = catalog
        self.identifier = parse_identifier(table)
        self.name = ".".join(self.identifier)
        self.writer = writer
        self.run = run
        self.partition_spec = parse_partition_spec(partition_by) if partition_by else []
        self.allow_schema_evolution = allow_schema_evolution
        self.upsert_keys = upsert_keys
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.property_key = MARKER_PROPERTY_PREFIX + writer
        self.conflicts = 0  # over the sink's life
        self._spec_warned = False
        self.unknown = 0

    # --- markers ----------------------------------------------------------------------------

    def committed_epoch(self, table: Table) -> int | None:
        """The highest epoch of this writer's run the table's markers show (``None``: none)."""
        best: int | None = None
        value = table.properties.get(self.property_key)
        if value is not None:
            run, _, epoch = value.rpartition(":")
            if run == self.run and epoch.isdigit():
                best = int(epoch)
        for snapshot in table.metadata.snapshots:
            summary = snapshot.summary
            if summary is None:
                continue
            props = summary.additional_properties
            if props.get(MARKER_WRITER) == self.writer and props.get(MARKER_RUN) == self.run:
                epoch_text = props.get(MARKER_EPOCH, "")
                if epoch_text.isdigit() and (best is None or int(epoch_text) > best):
                    best = int(epoch_text)
        return best

    def is_committed(self, table: Table, epoch: int) -> bool:
        """Whether the table's markers show ``epoch`` (or a later one) of this writer's run.
        Epochs of a run commit in order, so a later one implies this one."""
        done = self.committed_epoch(table)
        return done is not None and done >= epoch

    # --- writing ----------------------------------------------------------------------------

    def load_or_create(self, schema: pa.Schema | None) -> Table:
        """The table, created (with its namespace and partition spec) from ``schema`` if missing
        and ``schema`` is given.

        Raises:
            ConnectorError: it is missing and ``schema`` is ``None``, or it cannot be created.
        """
        from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

        try:
            found = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            if schema is None:
                raise ConnectorError(_missing_table(self.catalog, self.identifier)) from None
        else:
            self._check_spec(found)
            return found
        missing = [c for _, c, _ in self.partition_spec if schema.get_field_index(c) < 0]
        if missing:
            raise ConnectorError(
                f"iceberg table {self.name}: partition_by names {', '.join(missing)}, which "
                f"the rows lack (columns: {', '.join(schema.names)})"
            )
        try:
            self.catalog.create_namespace_if_not_exists(self.identifier[:-1])
            if not self.partition_spec:
                return self.catalog.create_table(self.identifier, schema=schema)
            # the table and its partition spec in one commit: a spec that cannot apply leaves
            # no (unpartitioned) table behind for the next run to write into (pyiceberg stages
            # tables of one-level namespaces only: a deeper one gets the spec right after)
            if len(self.identifier) == 2:
                tx: Any = self.catalog.create_table_transaction(self.identifier, schema=schema)
            else:
                tx = self.catalog.create_table(self.identifier, schema=schema).transaction()
            try:
                with tx.update_spec() as spec:
                    for transform, column, width in self.partition_spec:
                        suffix = "" if transform == "identity" else f"_{transform}"
                        field = f"{column}{suffix}"
                        spec.add_field(column, _transform(transform, width), field)
            except ValueError as exc:  # pyiceberg: the transform does not fit the type
                raise ConnectorError(
                    f"iceberg table {self.name}: partition_by {self._spec_text()} cannot "
                    f"apply: {exc}"
                ) from exc
            created: Table = tx.commit_transaction()
            return created
        except TableAlreadyExistsError:  # another writer created it first
            return self.catalog.load_table(self.identifier)
        except ConnectorError:
            raise
        except Exception as exc:
            raise _failed(f"iceberg table {self.name}: cannot create it: {exc}", exc) from exc

    def _spec_text(self) -> str:
        return ", ".join(
            f"{t}({c})" if w is None else f"{t}({w}, {c})" for t, c, w in self.partition_spec
        )

    def _check_spec(self, table: Table) -> None:
        """Warn once if ``partition_by`` differs from an existing table's spec (it is ignored)."""
        if not self.partition_spec or self._spec_warned:
            return
        names = {f.field_id: f.name for f in table.schema().fields}
        have = [
            (str(f.transform), names.get(f.source_id, "?")) for f in table.spec().fields
        ]
        want = [(t if w is None else f"{t}[{w}]", c) for t, c, w in self.partition_spec]
        if have == want:
            return
        self._spec_warned = True
        current = ", ".join(f"{t}({c})" for t, c in have) or "unpartitioned"
        log.warning(
            "iceberg sink %s: partition_by %s is not the existing table's partition spec (%s) "
            "and is ignored: it applies to a table the sink creates",
            self.name,
            self._spec_text(),
            current,
        )

    def _check_columns(self, table: Table, data: pa.Table) -> bool:
        """Whether the data has columns the table lacks and they may be added."""
        have = {f.name for f in table.schema().fields}
        new = [n for n in data.schema.names if n not in have]
        if new and not self.allow_schema_evolution:
            raise ConnectorError(
                f"iceberg table {self.name} has no column {', '.join(map(repr, new))}; set "
                "allow_schema_evolution = true to add them by name, or change the query"
            )
        return bool(new)

    def _fit(self, schema: Schema, data: pa.Table, epoch: int) -> pa.Table:
        """``data`` as the table's columns take it, or a :class:`ConnectorError` naming every
        column that does not fit, in one line: a required (NOT NULL) column takes rows without
        nulls (their fields are marked non-nullable: DataFusion's never are), and each column
        must fit the table's type by pyiceberg's own rule (a table's ``int`` column takes no
        ``int64`` rows, nor ``timestamp`` a zoned one). With ``allow_schema_evolution`` the
        table's types were widened before (``int`` to ``long``, ``float`` to ``double``)."""
        import contextlib
        import io

        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

        have = {f.name: f for f in schema.fields}
        nulls = []
        fields = []
        for field in data.schema:
            target = have.get(field.name)
            if target is not None and target.required and field.nullable:
                count = data.column(field.name).null_count
                if count:
                    nulls.append(
                        f"column {field.name!r} is required (NOT NULL) in the table and null in "
                        f"{count} row(s)"
                    )
                field = field.with_nullable(False)
            fields.append(field)
        if nulls:
            raise ConnectorError(
                f"iceberg table {self.name}: epoch {epoch} does not fit the table's columns: "
                f"{'; '.join(nulls)} (filter or coalesce them in the query)"
            )
        fitted = data.cast(pa.schema(fields)).replace_schema_metadata(data.schema.metadata)
        wrong = []
        for field in fitted.schema:
            if field.name not in have:
                continue
            try:  # pyiceberg prints its table of fields on stdout before raising: not ours
                with contextlib.redirect_stdout(io.StringIO()):
                    _check_pyarrow_schema_compatible(schema.select(field.name), pa.schema([field]))
            except ValueError:
                wrong.append(
                    f"column {field.name!r} is {have[field.name].field_type} in the table, "
                    f"{field.type} in the rows"
                )
        if wrong:
            raise ConnectorError(
                f"iceberg table {self.name}: epoch {epoch} does not fit the table's columns: "
                f"{'; '.join(wrong)} (CAST them in the query, or write to a new table)"
            )
        return fitted

    def _dedupe(self, data: pa.Table) -> pa.Table:
        assert self.upsert_keys is not None
        missing = [k for k in self.upsert_keys if data.schema.get_field_index(k) < 0]
        if missing:
            raise ConnectorError(
                f"iceberg sink {self.name}: upsert_keys {', '.join(missing)} are not columns of "
                f"the rows ({', '.join(data.schema.names)})"
            )
        indexed = data.append_column("__row", pa.array(range(data.num_rows), pa.int64()))
        last = indexed.group_by(list(self.upsert_keys), use_threads=False).aggregate(
            [("__row", "max")]
        )
        keep = pc.sort_indices(last["__row_max"])
        rows = pc.take(last["__row_max"], keep)
        return data.take(rows)

    def commit(self, epoch: int, batches: list[pa.RecordBatch]) -> CommitResult:
        """Write ``batches`` as ``epoch`` of this writer's run, exactly once (see the module
        docstring). No rows: nothing is written.

        Args:
            epoch: the epoch (ascending per run).
            batches: its rows, any Arrow types :func:`conform_for_iceberg` takes.

        Raises:
            ConnectorError: a column does not fit, the table cannot be created, or the commit
                still fails after ``max_retries`` retries (the last error is named).
        """
        from pyiceberg.exceptions import CommitFailedException

        rows = [b for b in batches if b.num_rows]
        if not rows:
            return CommitResult(False, None, 0, 0, 0)
        data = conform_for_iceberg(pa.Table.from_batches(rows))
        if self.upsert_keys:
            data = self._dedupe(data)
        marker = {MARKER_WRITER: self.writer, MARKER_RUN: self.run, MARKER_EPOCH: str(epoch)}
        conflicts = unknown = 0
        last_error: BaseException | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.backoff_s * 2 ** (attempt - 1), 2.0)
                time.sleep(delay * random.uniform(0.5, 1.5))
            # every column optional: a later epoch may hold nulls where this one has none
            table = self.load_or_create(pa.schema([f.with_nullable(True) for f in data.schema]))
            if self.is_committed(table, epoch):
                current = table.current_snapshot()
                return CommitResult(
                    False,
                    current.snapshot_id if current else None,
                    attempt,
                    conflicts,
                    unknown,
                )
            self._check_columns(table, data)
            try:  # writing the data files: nothing is committed yet, errors are final
                tx = _without_internal_retries(table).transaction()
                if self.allow_schema_evolution:  # new columns, and int -> long, float -> double
                    with tx.update_schema() as update:
                        update.union_by_name(data.schema)
                data = self._fit(tx.table_metadata.schema(), data, epoch)
                if self.upsert_keys:
                    tx.upsert(data, join_cols=list(self.upsert_keys), snapshot_properties=marker)
                else:
                    tx.append(data, snapshot_properties=marker)
                tx.set_properties({self.property_key: f"{self.run}:{epoch}"})
            except ConnectorError:
                raise
            except Exception as exc:  # pyiceberg's schema checks and file writes
                raise _failed(
                    f"iceberg table {self.name}: epoch {epoch} cannot be written: {exc}", exc
                ) from exc
            try:
                table = tx.commit_transaction()
            except CommitFailedException as exc:
                conflicts += 1
                self.conflicts += 1
                last_error = exc
                log.info(
                    "iceberg sink %s: epoch %d lost a commit race (attempt %d), retrying: %s",
                    self.name,
                    epoch,
                    attempt + 1,
                    exc,
                )
                continue
            except Exception as exc:  # the commit may have landed: the markers will tell
                unknown += 1
                self.unknown += 1
                last_error = exc
                log.warning(
                    "iceberg sink %s: epoch %d commit outcome unknown (%s); re-checking the "
                    "markers before any retry",
                    self.name,
                    epoch,
                    exc,
                )
                continue
            current = table.current_snapshot()
            return CommitResult(
                True, current.snapshot_id if current else None, attempt + 1, conflicts, unknown
            )
        raise CatalogError(
            f"iceberg table {self.name}: epoch {epoch} not committed after "
            f"{self.max_retries + 1} attempts ({conflicts} conflicts, {unknown} unknown "
            f"outcomes); last error: {last_error}"
        )


# --- the source --------------------------------------------------------------------------------


def _operation(snapshot: Snapshot) -> str:
    summary = snapshot.summary
    return str(summary.operation.value) if summary is not None else "append"


def _sequence(snapshot: Snapshot) -> int | None:
    """The snapshot's sequence number (``None`` for format v1 tables, which have none)."""
    seq = snapshot.sequence_number
    return int(seq) if seq else None


def _added_records(snapshot: Snapshot) -> int:
    summary = snapshot.summary
    text = summary.additional_properties.get("added-records", "0") if summary else "0"
    return int(text) if text.isdigit() else 0


class IcebergSource(ResumedSource):
    """An Iceberg table as a live pipeline source (see the module docstring).

    Output: batches of ``schema`` (the declared columns, cast; else the table's columns with
    ``large_string``/``large_binary`` read as ``string``/``binary``), at most ``batch_rows`` rows
    each, all in the one partition :attr:`partition`.

    Args:
        catalog: the pyiceberg catalog.
        table: ``<namespace>.<table>``.
        name: the source's name in the pipeline (for messages).
        schema: the declared columns, or ``None`` for the table's.
        starting_strategy: ``earliest``, ``latest``, ``snapshot_id`` or ``timestamp``.
        start_snapshot_id: the first snapshot (inclusive) for ``snapshot_id``.
        start_timestamp: aware UTC instant for ``timestamp``.
        monitor_interval_s: seconds between checks for new snapshots.
        max_snapshots_per_poll, max_rows_per_poll: rate limits per poll (``None``: none).
        skip_overwrite_snapshots, skip_delete_snapshots: skip (and log) such snapshots instead
            of failing.
        expired_snapshot: ``fail`` or ``reset`` (see the module docstring).
        stop_at: ``None`` (run until stopped), ``"latest"`` (the snapshot current at start) or a
            snapshot id (inclusive).
        batch_rows: the largest batch handed out.
        offset: a checkpoint's :meth:`position_state` to resume from.
        on_gap: told about snapshots skipped by ``expired_snapshot = 'reset'``.

    Raises:
        ConnectorError: no such table, a declared column it lacks, or a start snapshot or
            timestamp that names no snapshot.
    """

    server = "iceberg"
    start_offset = 0
    end_offset = 0

    def __init__(
        self,
        catalog: Catalog,
        table: str,
        *,
        name: str,
        schema: pa.Schema | None = None,
        starting_strategy: StartingStrategy = "earliest",
        start_snapshot_id: int | None = None,
        start_timestamp: datetime | None = None,
        monitor_interval_s: float = 1.0,
        max_snapshots_per_poll: int | None = None,
        max_rows_per_poll: int | None = None,
        skip_overwrite_snapshots: bool = False,
        skip_delete_snapshots: bool = False,
        expired_snapshot: Literal["fail", "reset"] = "fail",
        stop_at: str | int | None = None,
        batch_rows: int = 65_536,
        offset: dict[str, Any] | None = None,
        on_gap: Callable[[str], None] | None = None,
    ) -> None:
        self.catalog = catalog
        self.identifier = parse_identifier(table)
        self.stream = ".".join(self.identifier)
        self.what = f"source {name} (iceberg table {self.stream})"
        self._stop_at = stop_at
        self.table = _load_table(catalog, self.identifier)
        table_schema = self.table.schema().as_arrow()
        plain = pa.schema([pa.field(f.name, _plain(f.type)) for f in table_schema])
        if schema is not None:
            missing = [n for n in schema.names if plain.get_field_index(n) < 0]
            if missing:
                raise ConnectorError(
                    f"{self.what}: the table has no column {', '.join(map(repr, missing))}; its "
                    f"columns: {', '.join(plain.names)}"
                )
        self.schema: pa.Schema = schema if schema is not None else plain
        self.partition = f"iceberg {self.stream}"
        self.partitions: tuple[str, ...] = (self.partition,)
        self.initial_watermarks: dict[str, int] = {}
        self.monitor_interval_s = monitor_interval_s
        self.max_snapshots = max_snapshots_per_poll
        self.max_rows = max_rows_per_poll
        self.skip_overwrite = skip_overwrite_snapshots
        self.skip_delete = skip_delete_snapshots
        self.expired_snapshot = expired_snapshot
        self.batch_rows = batch_rows
        self.on_gap = on_gap
        self.starting_strategy = starting_strategy
        #: the last snapshot consumed (the offset); ``None``: none yet
        self.snapshot_id: int | None = None
        #: its sequence number (finds its child after expiry); ``None``: unknown
        self._seq: int | None = None
        #: before the first read: the first snapshot to read (inclusive), or ``None`` for the
        #: oldest ancestor
        self._first: int | None = None
        self.rows = 0
        self.snapshots_read = 0
        self.skipped: list[str] = []
        self._ended = False
        self._done = False
        self._backlog = False
        self._next_check = 0.0
        #: snapshots found by the last look and not read yet, oldest first (no reload per poll)
        self._queue: deque[tuple[Snapshot, bool]] = deque()
        if offset is not None and offset.get("started"):
            self.snapshot_id = offset.get("snapshot_id")
            self._seq = offset.get("sequence_number")
            self._first = offset.get("first")
            self.rows = int(offset.get("rows", 0))
            self.snapshots_read = int(offset.get("snapshots", 0))
            self._stop_id: int | None = offset.get("stop_id")
            self._ended = bool(offset.get("ended", False))
            uuid = offset.get("table_uuid")
            if uuid is not None and uuid != self._uuid():
                self._recreated(uuid, "since the checkpoint")
        else:
            self._start(start_snapshot_id, start_timestamp)
            self._stop_id = self._resolve_stop(stop_at)
        self.stop_at_end = stop_at is not None

    def _uuid(self) -> str:
        return str(self.table.metadata.table_uuid)

    def _recreated(self, uuid: str, when: str) -> None:
        """The table the offset belongs to (``uuid``) was dropped and this one created under
        its name (``when``: since the checkpoint, or while the source read it): its snapshot
        ids and sequence numbers mean nothing here (a restore would otherwise wait for a
        sequence number the new table may never reach)."""
        message = (
            f"{self.what}: the table was dropped and created again {when} (table uuid {uuid}, "
            f"now {self._uuid()}): its snapshot {self.snapshot_id} is not in the new table's "
            "history"
        )
        if self.expired_snapshot != "reset":
            raise SnapshotExpiredError(
                f"{message}. Start over (--fresh), or set expired_snapshot = 'reset' to read the "
                "new table from its oldest snapshot (the gap is reported)"
            )
        if self.on_gap is not None:
            self.on_gap(
                f"{message}; reading the new table from its oldest snapshot "
                "(expired_snapshot = 'reset')"
            )
        self.snapshot_id = self._seq = self._first = None
        self._ended = False
        self._stop_id = self._resolve_stop(self._stop_at)

    def _start(self, snapshot_id: int | None, timestamp: datetime | None) -> None:
        current = self.table.current_snapshot()
        strategy = self.starting_strategy
        if strategy == "latest":  # rows committed after now (an empty table: every row)
            self.snapshot_id = current.snapshot_id if current is not None else None
            self._seq = _sequence(current) if current is not None else None
        elif strategy == "snapshot_id":
            if snapshot_id is None or self.table.snapshot_by_id(snapshot_id) is None:
                raise ConnectorError(
                    f"{self.what}: start_snapshot_id {snapshot_id} is not a snapshot of the table"
                )
            self._first = snapshot_id
        elif strategy == "timestamp":
            if timestamp is None:
                raise ConnectorError(f"{self.what}: starting_strategy 'timestamp' needs a time")
            ms = int(timestamp.timestamp() * 1000)
            lineage = list(reversed(self._ancestors(current)))
            first = next((s for s in lineage if s.timestamp_ms >= ms), None)
            if first is None:  # nothing committed since: wait for the next snapshot
                self.snapshot_id = current.snapshot_id if current is not None else None
                self._seq = _sequence(current) if current is not None else None
            else:
                self._first = first.snapshot_id

    def _resolve_stop(self, stop_at: str | int | None) -> int | None:
        if stop_at is None:
            return None
        if stop_at == "latest":
            current = self.table.current_snapshot()
            if current is None or current.snapshot_id == self.snapshot_id:
                self._ended = True  # nothing to read: the partition ends at once
            return current.snapshot_id if current is not None else None
        if self.table.snapshot_by_id(int(stop_at)) is None:
            raise ConnectorError(f"{self.what}: stop_at {stop_at} is not a snapshot of the table")
        return int(stop_at)

    def _ancestors(self, snapshot: Snapshot | None) -> list[Snapshot]:
        out = []
        while snapshot is not None:
            out.append(snapshot)
            parent = snapshot.parent_snapshot_id
            snapshot = self.table.snapshot_by_id(parent) if parent is not None else None
        return out

    # --- the LiveSource protocol --------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the source ended (``stop_at`` reached and its end handed out)."""
        return self._done

    @property
    def backlog(self) -> bool:
        """Whether snapshots newer than the offset are known and not read yet."""
        return self._backlog

    def start(self) -> None:
        """Nothing to start: reads happen in :meth:`poll`."""

    def close(self) -> None:
        """Nothing to close (the catalog is shared)."""

    def position_state(self) -> dict[str, Any]:
        """The offset as checkpoint JSON: the last consumed snapshot id, and the bounds."""
        return {
            "kind": "iceberg",
            "table": self.stream,
            "table_uuid": self._uuid(),
            "started": True,
            "snapshot_id": self.snapshot_id,
            "sequence_number": self._seq,
            "first": self._first,
            "stop_id": self._stop_id,
            "ended": self._ended,
            "rows": self.rows,
            "snapshots": self.snapshots_read,
        }

    def pending(self) -> list[tuple[Snapshot, bool]]:
        """The snapshots after the offset, oldest first, up to the current one (or ``stop_at``):
        ``(snapshot, full)`` where ``full`` means "read the table at this snapshot in full" (the
        first of a history whose start expired, under ``earliest``).

        The walk goes back from the current snapshot by parent ids to the offset. Where it ends
        without reaching it:

        * at an existing snapshot no newer than the offset (by sequence number), or at the
          table's first snapshot: the offset is not an ancestor of the current snapshot
          (:class:`SnapshotNotInHistoryError`, whatever ``expired_snapshot`` says);
        * at a snapshot whose parent is gone (expired; pyiceberg's expiry also clears the
          child's parent id, the table's earlier metadata files still have it): if that parent
          is the offset, or (parent unknown) the offset is gone too and this snapshot's sequence
          number is the offset's + 1, the source goes on there (nothing is lost); otherwise the
          rows in between expired (:class:`SnapshotExpiredError` naming the offset's child when
          it can, or with ``expired_snapshot = 'reset'`` the gap is reported and the source
          goes on).

        ``stop_at`` must be the current snapshot or one of its ancestors.

        Raises:
            SnapshotExpiredError: unread snapshots expired (``fail``).
            SnapshotNotInHistoryError: see above.
        """
        fresh = self.catalog.load_table(self.identifier)
        old = self._uuid()
        self.table = fresh
        if str(fresh.metadata.table_uuid) != old:
            self._recreated(old, "while the source read it")
        current = self.table.current_snapshot()
        target = self.snapshot_id if self.snapshot_id is not None else self._first
        chain: list[Snapshot] = []  # newest first until reversed
        reached = target is None
        end: Snapshot | None = None  # an existing snapshot older than the offset, if met
        s = current
        while s is not None:
            if self.snapshot_id is not None and s.snapshot_id == self.snapshot_id:
                reached = True
                break
            seq = _sequence(s)
            if self._seq is not None and seq is not None and seq <= self._seq:
                end = s  # older than the offset, and not it: the offset is not in this lineage
                break
            chain.append(s)
            if self._first is not None and s.snapshot_id == self._first:
                reached = True
                break
            parent = s.parent_snapshot_id
            s = self.table.snapshot_by_id(parent) if parent is not None else None
        chain.reverse()
        if target is None and chain:
            # earliest: the oldest surviving ancestor, in full if earlier history expired
            oldest = chain[0]
            seq = _sequence(oldest)
            expired = oldest.parent_snapshot_id is not None or (seq is not None and seq > 1)
            return self._bounded([(oldest, expired)] + [(c, False) for c in chain[1:]], current)
        if not reached and target is not None:
            if end is not None or not chain or not self._parent_gone(chain[0]):
                self._not_in_history(target, current)
            if not self._follows_offset(chain[0]):
                self._expired(chain[0])
        return self._bounded([(c, False) for c in chain], current)

    def _parent_gone(self, oldest: Snapshot) -> bool:
        """Whether the walk back stopped at ``oldest`` because its parent is gone (expired),
        rather than at the table's first snapshot."""
        if oldest.parent_snapshot_id is not None:
            return True  # named, and not in the metadata
        seq = _sequence(oldest)
        if seq is not None:
            return seq > 1  # pyiceberg's expiry cleared the parent id
        return self._history().get(oldest.snapshot_id, (None, None))[0] is not None

    def _original_parent(self, snapshot: Snapshot) -> int | None:
        """``snapshot``'s parent id as first written (the metadata's, else the newest earlier
        metadata file that has one), or ``None`` if no file on hand names one."""
        if snapshot.parent_snapshot_id is not None:
            return snapshot.parent_snapshot_id
        return self._history().get(snapshot.snapshot_id, (None, None))[0]

    def _follows_offset(self, oldest: Snapshot) -> bool:
        """Whether ``oldest`` (whose parent is gone) is the child of the checkpointed offset
        (itself expired): the source may go on there, nothing was lost."""
        if self.snapshot_id is None:
            return False  # the first snapshot to read (inclusive) is itself gone
        parent = self._original_parent(oldest)
        if parent is not None:
            return parent == self.snapshot_id
        # parent unknown: the sequence number says whether it was the very next commit
        seq = _sequence(oldest)
        return (
            self._seq is not None
            and seq == self._seq + 1
            and self.table.snapshot_by_id(self.snapshot_id) is None
        )

    def _history(self) -> dict[int, tuple[int | None, int | None]]:
        """``id -> (parent id, sequence number)`` of every snapshot the current metadata and the
        earlier metadata files of its metadata log (those still on disk) name, with each
        snapshot's parent id as first written. Only read when the walk back fails."""
        from pyiceberg.serializers import FromInputFile

        metadata = [self.table.metadata]
        for entry in reversed(self.table.metadata.metadata_log):
            try:
                metadata.append(
                    FromInputFile.table_metadata(self.table.io.new_input(entry.metadata_file))
                )
            except Exception as exc:  # deleted (write.metadata.delete-after-commit.enabled)
                log.debug("%s: earlier metadata %s: %s", self.what, entry.metadata_file, exc)
        out: dict[int, tuple[int | None, int | None]] = {}
        for meta in metadata:
            for snap in meta.snapshots:
                parent, seq = out.get(snap.snapshot_id, (None, None))
                out[snap.snapshot_id] = (
                    parent if parent is not None else snap.parent_snapshot_id,
                    seq if seq is not None else _sequence(snap),
                )
        return out

    def _not_in_history(self, target: int, current: Snapshot | None, what: str = "") -> None:
        """Raise :class:`SnapshotNotInHistoryError` for ``target`` (the offset, or ``what``)."""
        what = what or (
            "the checkpointed snapshot" if self.snapshot_id is not None else "the first snapshot"
        )
        now = current.snapshot_id if current is not None else None
        if self.table.snapshot_by_id(target) is not None:
            detail = (
                f"{what} {target} is not an ancestor of the table's current snapshot {now}: the "
                "table was rolled back or set to another snapshot since"
            )
        elif target in self._history():
            detail = (
                f"{what} {target} is not a snapshot of the table any more: it expired from a "
                f"history the table no longer has (rolled back; current snapshot {now})"
            )
        else:
            detail = (
                f"{what} {target} is not a snapshot of the table: none of its metadata, current "
                f"or earlier, has that id (current snapshot {now})"
            )
        raise SnapshotNotInHistoryError(
            f"{self.what}: {detail}. The source reads only the current snapshot's history (as "
            "Flink's and Spark's Iceberg sources do), which does not hold it. Start over "
            "(--fresh) to read the "
            "table as it is now, or from one of its snapshots (starting_strategy = "
            "'snapshot_id')"
        )

    def _expired(self, oldest: Snapshot) -> None:
        """Unread snapshots between the offset and ``oldest`` (the oldest surviving one after it)
        expired: raise :class:`SnapshotExpiredError` naming the first that did (when known), or
        under ``expired_snapshot = 'reset'`` report the gap and go on at ``oldest``."""
        target = self.snapshot_id if self.snapshot_id is not None else self._first
        assert target is not None
        gone = self.table.snapshot_by_id(target) is None
        state = "which expired too" if gone else "still in the table"
        if self.snapshot_id is None and gone:
            lost = f"the first snapshot to read, {target}, expired before the source read it"
        elif self.snapshot_id is None:
            lost = (
                f"a snapshot after the first snapshot to read, {target} (still in the table), and "
                f"before snapshot {oldest.snapshot_id} expired before the source read it"
            )
        elif self._seq is not None and _sequence(oldest) == self._seq + 1:
            # committed right after the offset, on another parent: not the offset's history
            self._not_in_history(target, self.table.current_snapshot())
        else:
            child = self._child_in_history(oldest)
            if child is not None:
                lost = (
                    f"snapshot {child}, the next after the checkpointed snapshot {target} "
                    f"({state}), expired before the source read it"
                )
            else:
                lost = (
                    f"a snapshot after the checkpointed snapshot {target} ({state}) and before "
                    f"snapshot {oldest.snapshot_id} expired before the source read it (its id is "
                    "gone with the table's earlier metadata)"
                )
        message = (
            f"{self.what}: {lost}; the oldest snapshot left after it is {oldest.snapshot_id}"
        )
        if self.expired_snapshot != "reset":
            raise SnapshotExpiredError(
                f"{message}. Keep snapshots longer than the pipeline can lag (snapshot "
                "expiry), set expired_snapshot = 'reset' to go on from the oldest surviving "
                "snapshot (the rows in between are skipped and reported), or start over"
            )
        if self.on_gap is not None:
            self.on_gap(
                f"{message}; resuming at snapshot {oldest.snapshot_id} "
                "(expired_snapshot = 'reset'): rows committed in between are not delivered"
            )
        self.snapshot_id, self._first, self._seq = None, oldest.snapshot_id, None

    def _child_in_history(self, oldest: Snapshot) -> int | None:
        """The offset's child on the way back from ``oldest`` through the earlier metadata
        files (the first snapshot that expired), or ``None`` if they do not reach the offset.

        Raises:
            SnapshotNotInHistoryError: they show the offset is not an ancestor of ``oldest``.
        """
        history = self._history()
        child, at = oldest.snapshot_id, self._original_parent(oldest)
        while at is not None and at != self.snapshot_id:
            parent, seq = history.get(at, (None, None))
            if self._seq is not None and seq is not None and seq <= self._seq:
                assert self.snapshot_id is not None
                self._not_in_history(self.snapshot_id, self.table.current_snapshot())
            child, at = at, parent
        return child if at is not None and child != oldest.snapshot_id else None

    def _bounded(
        self, chain: list[tuple[Snapshot, bool]], current: Snapshot | None
    ) -> list[tuple[Snapshot, bool]]:
        """``chain`` cut after the ``stop_at`` snapshot, which must be in it (or be the offset).

        Raises:
            SnapshotNotInHistoryError: the stop snapshot is not the current one or an ancestor.
        """
        if self._stop_id is None or self._stop_id == self.snapshot_id:
            return chain if self._stop_id is None else []
        ids = [c.snapshot_id for c, _ in chain]
        if self._stop_id not in ids:
            if self._stop_id in {a.snapshot_id for a in self._ancestors(current)}:
                self._ended = True  # older than the offset: nothing left to read
                return []
            self._not_in_history(self._stop_id, current, "the stop_at snapshot")
        return chain[: ids.index(self._stop_id) + 1]

    def scan_of(self, snapshot: Snapshot, full: bool) -> Any:
        """The pyiceberg scan :meth:`poll` reads ``snapshot`` with: its appended rows (an
        incremental append scan of that one snapshot), or with ``full`` the table at it."""
        if full:
            return self.table.scan(snapshot_id=snapshot.snapshot_id)
        return self.table.incremental_append_scan(
            to_snapshot_id_inclusive=snapshot.snapshot_id
        ).from_snapshot_id_inclusive(snapshot.snapshot_id)

    def _read(self, snapshot: Snapshot, full: bool) -> Iterator[pa.RecordBatch]:
        yield from self.batches(self.scan_of(snapshot, full).to_arrow_batch_reader())

    def batches(self, reader: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches a poll hands out of a scan's ``reader``: conformed to the source's
        columns, at most ``batch_rows`` rows each, empty ones left out. pyiceberg reads the
        scan's data files (its ``FileScanTask`` s) one after another, each file's batches in
        turn, so no batch holds rows of two files: a reader of one task of the scan
        (:meth:`task_reader`) gives exactly the batches of that file."""
        for batch in reader:
            if not batch.num_rows:
                continue
            conformed = conform(batch, self.schema, self.what)
            for start in range(0, conformed.num_rows, self.batch_rows):
                yield conformed.slice(start, self.batch_rows)

    @staticmethod
    def task_reader(scan: Any, task: Any) -> Iterator[pa.RecordBatch]:
        """The batches of one data file (``task``, a ``FileScanTask`` of ``scan``) as the
        scan's own reader reads them (the same pyiceberg path, for that one task)."""
        from pyiceberg.table import _to_arrow_batch_reader_via_file_scan_tasks

        return iter(_to_arrow_batch_reader_via_file_scan_tasks(scan, scan.projection(), [task]))

    def read_task(self, snapshot_id: int, task: Any, full: bool) -> Iterator[pa.RecordBatch]:
        """The batches of one data file (``task``, a ``FileScanTask`` of the scan of snapshot
        ``snapshot_id``: a distributed run's split), as :meth:`poll` hands them out.

        Raises:
            ConnectorError, CatalogError: the snapshot or the file cannot be read.
        """
        snapshot = self.table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise ConnectorError(f"{self.what}: snapshot {snapshot_id} is gone (expired)")
        try:
            scan = self.scan_of(snapshot, full)
            yield from self.batches(self.task_reader(scan, task))
        except (ConnectorError, CatalogError):
            raise
        except Exception as exc:  # pyiceberg: a data file or the snapshot is gone
            raise _failed(
                f"{self.what}: cannot read snapshot {snapshot_id} "
                f"(file {task.file.file_path}): {exc}",
                exc,
            ) from exc

    def wanted(self, snapshot: Snapshot) -> bool:
        """Whether :meth:`poll` reads ``snapshot`` (an append), as it decides: a replace is
        skipped, an overwrite or delete skipped (and logged) or refused as the options say.

        Raises:
            NonAppendSnapshotError: an overwrite or delete snapshot not to be skipped.
        """
        return self._check(snapshot)

    def cut_at(self, snapshot: Snapshot | None, rows: int, snapshots: int, ended: bool) -> None:
        """Set the offset :meth:`position_state` records: ``snapshot`` consumed (``None``:
        none since the source was made), ``rows`` and ``snapshots`` read in all, and whether
        the source's end comes next (``stop_at`` reached): for a source that other processes
        read (a distributed run's checkpoint, ``pipelines.distributed``). Only for a source
        that is not polled."""
        if snapshot is not None:
            self.snapshot_id, self._first = snapshot.snapshot_id, None
            self._seq = _sequence(snapshot)
        self.rows, self.snapshots_read, self._ended = rows, snapshots, ended

    def _check(self, snapshot: Snapshot) -> bool:
        """Whether to read ``snapshot`` (an append); skips are logged, failures raised."""
        operation = _operation(snapshot)
        if operation == "append":
            return True
        if operation == "replace":
            log.info(
                "%s: snapshot %d is a replace (compaction): skipped",
                self.what,
                snapshot.snapshot_id,
            )
            return False
        skip = self.skip_overwrite if operation == "overwrite" else self.skip_delete
        option = f"skip_{operation}_snapshots"
        if not skip:
            raise NonAppendSnapshotError(
                f"{self.what}: snapshot {snapshot.snapshot_id} is a(n) {operation}, not an "
                f"append: a stream cannot take back rows it delivered. Set {option} = true to "
                "skip such snapshots (each skip is logged), or read the table another way"
            )
        note = f"snapshot {snapshot.snapshot_id} ({operation}) skipped ({option})"
        log.warning("%s: %s", self.what, note)
        self.skipped.append(note)
        return False

    def poll(self, timeout_s: float, max_entries: int = 64) -> list[SourceEvent]:
        """Read the next snapshots (up to the rate limits, and no further snapshot once the poll
        holds ``max_entries`` batches: a snapshot is never split), waiting up to ``timeout_s``
        seconds for the next check when it is not due (every event of the previous poll has
        been processed: a checkpoint barrier may have been taken since).

        Raises:
            NonAppendSnapshotError: an overwrite or delete snapshot not to be skipped.
            SnapshotExpiredError, SnapshotNotInHistoryError: see :meth:`pending`.
            ConnectorError: the table is gone, or a data file does not fit.
        """
        if self._done:
            return []
        if self._ended:
            self._done = True
            return [SourceEvent("end", self.partition)]
        if not self._queue:  # the snapshots known to be unread are all read: look again
            now = time.monotonic()
            if now < self._next_check:
                time.sleep(min(timeout_s, self._next_check - now))
                return []
            try:
                self._queue = deque(self.pending())
            except (CheckpointError, ConnectorError, CatalogError):
                raise
            except Exception as exc:  # pyiceberg: the table or catalog went away
                raise _failed(f"{self.what}: cannot read the table: {exc}", exc) from exc
        events: list[SourceEvent] = []
        taken = 0
        rows = 0
        while self._queue:
            snapshot, full = self._queue[0]
            if self.max_snapshots is not None and taken >= self.max_snapshots:
                break
            if taken and len(events) >= max_entries:  # bounds a poll's memory: whole snapshots
                break
            added = _added_records(snapshot)
            if self.max_rows is not None and taken and rows + added > self.max_rows:
                break
            taken += 1
            rows += added
            if full or self._check(snapshot):
                try:
                    batches = list(self._read(snapshot, full))
                except (ConnectorError, CatalogError):
                    raise
                except Exception as exc:  # pyiceberg: a data file or the snapshot is gone
                    raise _failed(
                        f"{self.what}: cannot read snapshot {snapshot.snapshot_id}: {exc}", exc
                    ) from exc
                for batch in batches:
                    events.append(SourceEvent("batch", self.partition, batch))
                    self.rows += batch.num_rows
            self._queue.popleft()
            self.snapshot_id, self._first = snapshot.snapshot_id, None
            self._seq = _sequence(snapshot)
            self.snapshots_read += 1
        left = len(self._queue)
        if self._stop_id is not None and self.snapshot_id == self._stop_id:
            self._ended = True
        backlog = left > 0
        if backlog != self._backlog:
            self._backlog = backlog
            events.append(SourceEvent("backlog", backlog=backlog))
        if not backlog:
            self._next_check = time.monotonic() + self.monitor_interval_s
        return events

    def describe(self) -> list[str]:
        """Lines for ``explain``."""
        return [
            f"  connector iceberg, table {self.stream}, starting_strategy "
            f"{self.starting_strategy}, offset snapshot {self.snapshot_id}; checks every "
            f"{self.monitor_interval_s:g} s; each snapshot's appended rows, oldest first"
            + ("; stops at the snapshot current at start" if self._stop_id is not None else ""),
            f"  partition: one ({self.partition}): snapshots are read in commit order",
        ]
