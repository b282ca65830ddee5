"""Pipeline glue of the Iceberg connector (:mod:`flight_serve.connectors.iceberg`).

``CREATE SOURCE … WITH (connector = 'iceberg', table = '<namespace>.<table>', …)`` and ``CREATE
SINK … WITH (connector = 'iceberg', table = …, …)``; the options are in :data:`SOURCE_OPTIONS`,
:data:`SINK_OPTIONS` and :data:`CATALOG_OPTIONS` (documented in docs/pipelines.md).

Catalog: ``catalog_uri`` (``sqlite:///…`` / ``postgresql://…`` → a pyiceberg ``sql`` catalog,
``http(s)://…`` → ``rest``), ``catalog_type``, ``warehouse``, ``catalog_name`` (default
``default``) and any pyiceberg catalog property as ``'catalog.<property>' = '…'``. With none of
them, the embedded catalog of the data directory (:func:`default_catalog_properties`): the server's
``--data-dir``; for ``flight-serve run``, ``./flight-data`` under the output directory (the
server's default data directory, so a local run and a local server share one catalog).

Sinks: :class:`IcebergRunSink` for runs without checkpoints (rows are committed every
:data:`RUN_COMMIT_ROWS` rows and when the run ends: at least once across failures),
:class:`EpochIcebergSink` for checkpointed runs (exactly once per epoch: the epoch's batches are
staged in the checkpoint at prepare, committed with markers at commit, re-committed on restore;
the markers make every commit idempotent).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from flight_serve.connectors.iceberg import (
    IcebergSink,
    IcebergSource,
    default_catalog_properties,
    load_iceberg_catalog,
    parse_identifier,
    parse_partition_spec,
)
from flight_serve.connectors.options import (
    ICEBERG_CATALOG_OPTIONS,
    ICEBERG_PASSTHROUGH,
    ICEBERG_SINK_OPTIONS,
    ICEBERG_SOURCE_OPTIONS,
    is_iceberg_catalog_option,
)
from flight_serve.errors import CheckpointError, ConnectorError, ExternalError
from flight_serve.pipelines.dialect import sql_error
from flight_serve.pipelines.epoch_sinks import StagedEpochSink
from flight_serve.pipelines.pipeline import Option, RelationDef, SinkDef
from flight_serve.pipelines.query import option_duration

__all__ = [
    "CATALOG_OPTIONS",
    "RUN_COMMIT_ROWS",
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "EpochIcebergSink",
    "IcebergRunSink",
    "IcebergSinkSpec",
    "catalog_of",
    "iceberg_sink_spec",
    "iceberg_source",
    "is_catalog_option",
]

# the options are in connectors.options, which the connector registry reads without this module
CATALOG_OPTIONS = ICEBERG_CATALOG_OPTIONS
SOURCE_OPTIONS = ICEBERG_SOURCE_OPTIONS
SINK_OPTIONS = ICEBERG_SINK_OPTIONS
#: Rows an unchecked run buffers before it commits them.
RUN_COMMIT_ROWS = 100_000
_PASSTHROUGH = ICEBERG_PASSTHROUGH
is_catalog_option = is_iceberg_catalog_option


def catalog_of(options: dict[str, Option], data_dir: Path) -> tuple[str, dict[str, str]]:
    """``(catalog name, pyiceberg properties)`` from a connector's options (see the module
    docstring)."""
    name = options["catalog_name"].text if "catalog_name" in options else "default"
    props = {k[len(_PASSTHROUGH) :]: o.text for k, o in options.items() if is_catalog_option(k)}
    if "catalog_uri" in options:
        props["uri"] = options["catalog_uri"].text
    if "warehouse" in options:
        props["warehouse"] = options["warehouse"].text
    if "catalog_type" in options:
        props["type"] = options["catalog_type"].text
    if not props:
        return name, default_catalog_properties(data_dir)
    uri = props.get("uri", "")
    if "type" not in props and uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql"):
        props["type"] = "sql"
    return name, props


def _bool(option: Option) -> bool:
    text = option.text.lower()
    if text not in ("true", "false"):
        raise option.error(f"expected true or false, got {option.text!r}")
    return text == "true"


def _positive(option: Option) -> int:
    try:
        value = int(option.text)
    except ValueError:
        raise option.error(f"expected a whole number, got {option.text!r}") from None
    if value < 1:
        raise option.error(f"must be at least 1, got {value}")
    return value


def _table(options: dict[str, Option], node: Any, what: str) -> str:
    if "table" not in options:
        raise sql_error(f"{what} needs WITH (table = '<namespace>.<table>')", node)
    try:
        parse_identifier(options["table"].text)
    except ConnectorError as exc:
        raise options["table"].error(str(exc)) from None
    return options["table"].text


def iceberg_source(
    relation: RelationDef,
    data_dir: Path,
    *,
    batch_rows: int,
    offset: dict[str, Any] | None = None,
    on_gap: Any = None,
) -> IcebergSource:
    """Open the Iceberg source ``relation`` declares (resuming from a checkpoint's ``offset``).

    Raises:
        PipelineSQLError: a bad option (pointing at it), no such table, a declared column the
            table lacks, or a ``WATERMARK FOR`` column it lacks.
    """
    options = relation.connector
    what = f"SOURCE {relation.name}"
    table = _table(options, relation.node, what)
    strategy = options["starting_strategy"].text.lower() if "starting_strategy" in options else None
    if strategy is None:
        strategy = "snapshot_id" if "start_snapshot_id" in options else "earliest"
        strategy = "timestamp" if "start_snapshot_timestamp" in options else strategy
    if strategy not in ("earliest", "latest", "snapshot_id", "timestamp"):
        raise options["starting_strategy"].error(
            f"expected earliest, latest, snapshot_id or timestamp, got {strategy!r}"
        )
    start_id = None
    if "start_snapshot_id" in options:
        try:
            start_id = int(options["start_snapshot_id"].text)
        except ValueError:
            raise options["start_snapshot_id"].error("expected a snapshot id") from None
    elif strategy == "snapshot_id":
        raise sql_error(
            f"{what}: starting_strategy 'snapshot_id' needs start_snapshot_id", relation.node
        )
    start_ts = None
    if "start_snapshot_timestamp" in options:
        option = options["start_snapshot_timestamp"]
        try:
            start_ts = datetime.fromisoformat(option.text)
        except ValueError:
            raise option.error(
                "expected an ISO 8601 instant, e.g. '2013-01-01T00:00:00Z'"
            ) from None
        if start_ts.tzinfo is None:
            start_ts = start_ts.replace(tzinfo=UTC)
    elif strategy == "timestamp":
        raise sql_error(
            f"{what}: starting_strategy 'timestamp' needs start_snapshot_timestamp", relation.node
        )
    monitor_s = 1.0
    if "monitor_interval" in options:
        monitor_s = option_duration(options["monitor_interval"].value).total_seconds()
        if monitor_s <= 0:
            raise options["monitor_interval"].error("must be above 0")
    expired = options["expired_snapshot"].text.lower() if "expired_snapshot" in options else "fail"
    if expired not in ("fail", "reset"):
        raise options["expired_snapshot"].error(f"expected fail or reset, got {expired!r}")
    stop_at: str | int | None = None
    if "stop_at" in options:
        text = options["stop_at"].text.lower()
        if text == "latest":
            stop_at = "latest"
        elif text != "none":
            try:
                stop_at = int(text)
            except ValueError:
                raise options["stop_at"].error(
                    "expected 'latest', 'none' or a snapshot id"
                ) from None
    name, props = catalog_of(options, data_dir)
    try:
        catalog = load_iceberg_catalog(name, props)
        source = IcebergSource(
            catalog,
            table,
            name=relation.name,
            schema=relation.columns,
            starting_strategy=strategy,  # type: ignore[arg-type]
            start_snapshot_id=start_id,
            start_timestamp=start_ts,
            monitor_interval_s=monitor_s,
            max_snapshots_per_poll=(
                _positive(options["max_snapshots_per_poll"])
                if "max_snapshots_per_poll" in options
                else None
            ),
            max_rows_per_poll=(
                _positive(options["max_rows_per_poll"]) if "max_rows_per_poll" in options else None
            ),
            skip_overwrite_snapshots=(
                _bool(options["skip_overwrite_snapshots"])
                if "skip_overwrite_snapshots" in options
                else False
            ),
            skip_delete_snapshots=(
                _bool(options["skip_delete_snapshots"])
                if "skip_delete_snapshots" in options
                else False
            ),
            expired_snapshot=expired,  # type: ignore[arg-type]
            stop_at=stop_at,
            batch_rows=_positive(options["batch_rows"]) if "batch_rows" in options else batch_rows,
            offset=offset,
            on_gap=on_gap,
        )
    except ConnectorError as exc:
        raise sql_error(f"{what}: {exc}", relation.node.this) from exc
    except ExternalError as exc:  # the catalog failed, not the SQL: it stays UNAVAILABLE
        raise exc.within(what) from exc.__cause__
    if relation.time_column is not None and source.schema.get_field_index(relation.time_column) < 0:
        raise sql_error(
            f"WATERMARK FOR {relation.time_column}: iceberg table {table} has no such column "
            f"(columns: {', '.join(source.schema.names)})",
            relation.node.this,
        )
    return source


@dataclass(frozen=True)
class IcebergSinkSpec:
    """An Iceberg sink's options, checked (the table is opened when the run starts)."""

    table: str
    catalog_name: str
    catalog_properties: dict[str, str]
    partition_by: str | None
    allow_schema_evolution: bool
    upsert_keys: tuple[str, ...] | None
    max_retries: int

    def for_emit(
        self, emit: str, key_columns: tuple[str, ...], schema: pa.Schema
    ) -> IcebergSinkSpec:
        """The spec for rows of a windowed query: with ``emit = 'update'`` (a window's row may
        come again, updated) and no ``upsert_keys``, the keys are the GROUP BY columns plus
        ``window_start`` / ``window_end`` (those in ``schema``), so an update replaces its row.

        Raises:
            ConnectorError: a GROUP BY column, or both window bounds, are not in ``schema``
                (renamed by the projection): ``upsert_keys`` must name them.
        """
        if emit != "update" or self.upsert_keys:
            return self
        names = set(schema.names)
        bounds = [b for b in ("window_start", "window_end") if b in names]
        missing = [k for k in key_columns if k not in names]
        if missing or not bounds:
            raise ConnectorError(
                f"emit = 'update' into iceberg table {self.table} upserts each window's row: "
                f"set upsert_keys (the output lacks {', '.join(missing or ['window_start'])})"
            )
        return replace(self, upsert_keys=(*key_columns, *bounds))

    def open(self, writer: str, run: str) -> IcebergSink:
        """The sink of ``writer`` (``<pipeline>/<sink>``) for run ``run``.

        Raises:
            ConnectorError: the catalog cannot be loaded.
        """
        catalog = load_iceberg_catalog(self.catalog_name, self.catalog_properties)
        return IcebergSink(
            catalog,
            self.table,
            writer=writer,
            run=run,
            partition_by=self.partition_by,
            allow_schema_evolution=self.allow_schema_evolution,
            upsert_keys=self.upsert_keys,
            max_retries=self.max_retries,
        )


def iceberg_sink_spec(sink: SinkDef, data_dir: Path) -> IcebergSinkSpec:
    """The checked options of an Iceberg ``CREATE SINK``.

    Raises:
        PipelineSQLError: a bad option, pointing at it.
    """
    options = sink.connector
    table = _table(options, sink.node, f"SINK {sink.name}")
    partition_by = options["partition_by"].text if "partition_by" in options else None
    if partition_by is not None:
        try:
            parse_partition_spec(partition_by)
        except ConnectorError as exc:
            raise options["partition_by"].error(str(exc)) from None
    keys = None
    if "upsert_keys" in options:
        keys = tuple(k.strip() for k in options["upsert_keys"].text.split(",") if k.strip())
        if not keys:
            raise options["upsert_keys"].error("name at least one column")
    name, props = catalog_of(options, data_dir)
    return IcebergSinkSpec(
        table=table,
        catalog_name=name,
        catalog_properties=props,
        partition_by=partition_by,
        allow_schema_evolution=(
            _bool(options["allow_schema_evolution"])
            if "allow_schema_evolution" in options
            else False
        ),
        upsert_keys=keys,
        max_retries=_positive(options["max_retries"]) if "max_retries" in options else 10,
    )


class IcebergRunSink:
    """The Iceberg sink of a run without checkpoints: rows are buffered and committed every
    :data:`RUN_COMMIT_ROWS` rows and at :meth:`close` (each commit with markers of a run id of
    its own, so a commit whose outcome is unknown is not doubled). A failed run keeps what it
    committed (at least once across reruns: use checkpoints for exactly once).

    Raises (from :meth:`write` and :meth:`close`): ConnectorError when a commit fails.
    """

    def __init__(self, spec: IcebergSinkSpec, writer: str, schema: pa.Schema) -> None:
        self.sink = spec.open(writer, uuid.uuid4().hex)
        self.schema = schema
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0
        self._epoch = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; commit when :data:`RUN_COMMIT_ROWS` rows wait."""
        if batch.num_rows:
            self._batches.append(batch)
            self._rows += batch.num_rows
        if self._rows >= RUN_COMMIT_ROWS:
            self.flush()

    def flush(self) -> None:
        """Commit the buffered rows now."""
        if self._batches:
            self._epoch += 1
            self.sink.commit(self._epoch, self._batches)
        self._batches, self._rows = [], 0

    def end_input(self) -> None:
        """Nothing to mark at the end of input (:class:`~flight_serve.connectors.base.Sink`)."""

    def close(self) -> None:
        """Commit what is buffered."""
        self.flush()


class EpochIcebergSink(StagedEpochSink):
    """The Iceberg sink of a checkpointed run (the prepare / commit protocol of
    :mod:`flight_serve.pipelines.epoch_sinks`).

    * write: batches are held in memory for the current epoch;
    * prepare: they are staged in the checkpoint (``sink-<name>.arrow``, Arrow IPC) and the
      commit mark records the run id and the rows so far;
    * commit: :meth:`IcebergSink.commit` of the epoch (markers: exactly once);
    * recover (restore of checkpoint ``r``): commit ``r``'s staged batches again (a no-op when
      its markers are in the table). Epochs after ``r`` never reached the table unless the run is
      resumed from an older epoch than its last (``resume = N``), which is refused.

    Args:
        name: the sink's name.
        spec: its options.
        writer: the marker's writer (``<pipeline>/<sink>``).
        schema: the schema of every batch.
        mark: the commit mark of the checkpoint resumed from, or ``None`` (a fresh run: a new run
            id).
        restored_epoch: the epoch of that checkpoint (:meth:`recover` redoes its commit).
    """

    def __init__(
        self,
        name: str,
        spec: IcebergSinkSpec,
        writer: str,
        schema: pa.Schema,
        *,
        mark: dict[str, Any] | None = None,
        restored_epoch: int | None = None,
    ) -> None:
        super().__init__(name, int(mark.get("rows", 0)) if mark is not None else 0)
        self.schema = schema
        self.restored_epoch = restored_epoch
        run = str(mark["run"]) if mark is not None and mark.get("run") else uuid.uuid4().hex
        self.sink = spec.open(writer, run)

    def recover(self, staged: list[pa.RecordBatch]) -> None:
        """Redo the commit of the checkpoint resumed from (``restored_epoch``: its staged
        batches).

        Raises:
            CheckpointError: the table holds a later epoch of this run (``resume = N`` older than
                the last commit: those results cannot be taken back out of the table).
        """
        try:
            table = self.sink.load_or_create(None)
        except ConnectorError:
            table = None  # not created yet: nothing was committed
        assert self.restored_epoch is not None, "recover() is for a sink built from a checkpoint"
        epoch = self.restored_epoch
        done = self.sink.committed_epoch(table) if table is not None else None
        if done is not None and done > epoch:
            raise CheckpointError(
                f"sink {self.name}: iceberg table {self.sink.name} holds epoch {done} of this run, "
                f"after checkpoint {epoch}: its results cannot be taken back; resume from the "
                "latest checkpoint, or start over (--fresh) into a new table"
            )
        self._staged, self._staged_epoch = staged, epoch
        self.commit(epoch)

    def apply(self, epoch: int, batches: list[pa.RecordBatch]) -> None:
        """Commit the epoch to the table (:meth:`IcebergSink.commit`: its markers make it
        idempotent)."""
        self.sink.commit(epoch, batches)

    def mark(self) -> dict[str, Any]:
        return {"kind": "iceberg", "table": self.sink.name, "run": self.sink.run}
