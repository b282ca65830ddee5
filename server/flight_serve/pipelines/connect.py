"""The connector registry: one row per connector of a pipeline.

A row (:class:`ConnectorSpec`) says what a connector is to the runtime: its name, the roles it
plays (``source``, ``table``, ``sink``) with the ``WITH (…)`` options each role takes, and
whether a checkpointed run covers it exactly once. The runtime looks connectors up here and
names none itself; adding a connector is one module (its source or sink, built on the
contracts of :mod:`flight_serve.connectors.base`) plus one row in :data:`REGISTRY`.

Checks:

* :func:`connector_of` (building any run): the connector exists for the role, and every option
  is one it takes (the nearest known one is suggested);
* :func:`check_checkpointed` (a checkpointed run, ``flight-serve run`` with checkpoints or a
  server pipeline): every connector is exactly-once there; a refusal says what to do instead.

Factories, each given the run as a :class:`~.slots.ConnectorHost`: a row's ``source`` (and
``table``) builds a source from its relation (a checkpointed run's from its checkpoint's
offsets), its ``slot`` checks a sink's options into a :class:`~.slots.SinkSlot` (no I/O), its
``sink`` builds the sink of a run without checkpoints and its ``epoch_sink`` the exactly-once
sink of a checkpointed run (a row without one, ``stdout``, writes its plain sink there too).
The runtime calls them and names no connector.

Errors: :class:`~flight_serve.errors.PipelineSQLError` with the line and column of the option.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flight_serve.connectors.base import EpochSink, Sink, Source
from flight_serve.connectors.file import DEFAULT_BATCH_ROWS, FileSink, FileSource, resolve_paths
from flight_serve.connectors.options import (
    DATAGEN_OPTION_ALIASES,
    DATAGEN_SOURCE_OPTIONS,
    FALKORDB_OPTIONS,
    FLIGHT_AUTH_OPTIONS,
    ICEBERG_SINK_OPTIONS,
    ICEBERG_SOURCE_OPTIONS,
    is_iceberg_catalog_option,
)
from flight_serve.errors import ConnectorError, ConnectorOptionError
from flight_serve.pipelines.dialect import sql_error
from flight_serve.pipelines.pipeline import Option, PipelinePlan, RelationDef, SinkDef
from flight_serve.pipelines.query import did_you_mean
from flight_serve.pipelines.slots import ConnectorHost, SinkSlot

# Every other connector's module (and its pipeline glue: flight_io, iceberg_io, graph_io,
# store_io, epoch_sinks) is imported by its factories, when a pipeline names it: a file ->
# stdout run loads no pyarrow.flight, numpy datagen, store or pyiceberg glue (cold start,
# DESIGN §11). The rows below need only the option names (connectors.options).
if TYPE_CHECKING:
    from flight_serve.connectors.falkordb import FalkorDBSink

__all__ = [
    "CONNECTORS",
    "FLIGHT_AUTH_OPTIONS",
    "REGISTRY",
    "ConnectorSpec",
    "EpochSinkArgs",
    "check_checkpointed",
    "connector_of",
]

#: The file sink's formats, by the extension of its files.
_EXTENSION = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}

#: ``(role, options, server pipeline) -> bool``: whether a checkpointed run covers it.
ExactlyOnce = Callable[[str, Mapping[str, Option], bool], bool]


def _always(role: str, options: Mapping[str, Option], server: bool) -> bool:
    return True


def _never(role: str, options: Mapping[str, Option], server: bool) -> bool:
    return False


def _datagen_option(key: str) -> bool:
    # fields.<column>.<option>, and Flink's and RisingWave's spellings (the connector checks them)
    return key.startswith("fields.") or key in DATAGEN_OPTION_ALIASES


def _flight_exactly_once(role: str, options: Mapping[str, Option], server: bool) -> bool:
    # this server's streams (no server option, inside the server) or another Flight server's
    return server or "server" in options


#: ``(host, relation) -> Source``: a source of a run (a checkpointed run's resumes from its
#: checkpoint's offsets: in the factory, or when the run loop opens it).
SourceFactory = Callable[[ConnectorHost, RelationDef], Source]

#: ``(host, relation) -> FileSource``: a static table, read once before the first batch.
TableFactory = Callable[[ConnectorHost, RelationDef], FileSource]

#: ``(host, sink) -> SinkSlot``: a sink's checked options (no I/O: the run opens its sink).
SlotFactory = Callable[[ConnectorHost, SinkDef], SinkSlot]


def _file(host: ConnectorHost, relation: RelationDef, role: str) -> FileSource:
    """The files of a ``file`` source or table (``role``).

    Raises:
        PipelineSQLError: no ``path``, a bad option, no file matches, a file that cannot be read.
    """
    what = f"{role.upper()} {relation.name}"
    options = relation.connector
    if "path" not in options:
        raise sql_error(
            f"{what} needs WITH (path = '<file, directory or glob>')", relation.node
        )
    batch_rows = host.plan.batch_rows or DEFAULT_BATCH_ROWS
    if "batch_rows" in options:
        option = options["batch_rows"]
        try:
            batch_rows = int(option.text)
        except ValueError:
            raise option.error(f"expected a whole number, got {option.text!r}") from None
    try:
        paths = resolve_paths(options["path"].text, host.plan.base_dir)
    except ConnectorError as exc:
        raise options["path"].error(str(exc)) from exc
    try:
        return FileSource(
            paths,
            options["format"].text if "format" in options else None,
            batch_rows=batch_rows,
            schema=relation.columns,
            delimiter=options["delimiter"].text if "delimiter" in options else ",",
            base_dir=host.plan.base_dir,
            name=relation.name,
        )
    except ConnectorError as exc:
        raise sql_error(f"{what}: {exc}", relation.node.this) from exc


def _file_source(host: ConnectorHost, relation: RelationDef) -> Source:
    return _file(host, relation, "source")


def _file_table(host: ConnectorHost, relation: RelationDef) -> FileSource:
    return _file(host, relation, "table")


def _file_slot(host: ConnectorHost, sink: SinkDef) -> SinkSlot:
    """A file sink: its path (relative to the output directory; by default
    ``<sink>.<format>``) and format (by default the path's extension).

    Raises:
        PipelineSQLError: neither a format nor a path with an extension; another format.
    """
    options = sink.connector
    fmt = options["format"].text.lower() if "format" in options else None
    if "path" in options:
        path = Path(options["path"].text).expanduser()
        path = path if path.is_absolute() else host.output_dir / path
        if fmt is None:
            fmt = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}.get(
                path.suffix.lower()
            )
    elif fmt is not None:
        path = host.output_dir / f"{sink.name}.{_EXTENSION.get(fmt, fmt)}"
    else:
        raise sql_error(
            f"SINK {sink.name} needs WITH (format = …) or a path with an extension", sink.node
        )
    if fmt is None:  # a path whose extension names no format
        whence = f"from its extension {path.suffix!r}" if path.suffix else "(it has no extension)"
        raise options["path"].error(
            f"the file sink cannot tell the format of {path.name} {whence}: end the path in "
            ".parquet, .csv or .jsonl, or give format = 'parquet' | 'csv' | 'jsonl'"
        )
    if fmt not in _EXTENSION:
        where = options["format"] if "format" in options else options["path"]
        raise where.error(f"the file sink writes parquet, csv or jsonl, not {fmt!r}")
    return SinkSlot(sink, "file", fmt, path)


def _stdout_slot(host: ConnectorHost, sink: SinkDef) -> SinkSlot:
    options = sink.connector
    fmt = options["format"].text.lower() if "format" in options else None
    return SinkSlot(sink, "stdout", fmt or "table", None)


def _falkordb_slot(host: ConnectorHost, sink: SinkDef) -> SinkSlot:
    from flight_serve.pipelines.graph_io import graph_sink_options

    return SinkSlot(sink, "falkordb", "graph", None, graph=graph_sink_options(sink))


def _iceberg_source(host: ConnectorHost, relation: RelationDef) -> Source:
    """An Iceberg table as a live source; a checkpointed run's from its last consumed
    snapshot (:mod:`~flight_serve.pipelines.iceberg_io`)."""
    from flight_serve.pipelines.iceberg_io import iceberg_source

    coordinator = host.coordinator
    if coordinator is None:
        return iceberg_source(
            relation, host.data_dir, batch_rows=host.plan.batch_rows or DEFAULT_BATCH_ROWS
        )
    return iceberg_source(
        relation,
        host.data_dir,
        batch_rows=host.plan.batch_rows or 65_536,
        offset=coordinator.source_state(relation.name),
        on_gap=host.report_gap,
    )


def _iceberg_slot(host: ConnectorHost, sink: SinkDef) -> SinkSlot:
    """An Iceberg sink's checked options.

    Raises:
        PipelineSQLError: a run in this process would write the embedded catalog of a data
            dir a running server holds; a bad option.
    """
    from flight_serve.connectors.iceberg import default_catalog_properties
    from flight_serve.pipelines.iceberg_io import catalog_of, iceberg_sink_spec
    from flight_serve.store.streams import data_dir_holder

    options = sink.connector
    if (
        host.writes
        and host.store is None
        and catalog_of(options, host.data_dir)[1] == default_catalog_properties(host.data_dir)
        and (holder := data_dir_holder(host.data_dir)) is not None
    ):
        raise options["connector"].error(
            f"SINK {sink.name}: the embedded Iceberg catalog of {host.data_dir} belongs to a "
            f"running server ({holder} holds the data dir): a run in this process "
            "never writes into a server's data dir. Submit the pipeline to that server "
            "(flight-serve submit), or run it with another --output-dir (its catalog "
            "is <output-dir>/flight-data) or a catalog_uri of its own"
        )
    spec = iceberg_sink_spec(sink, host.data_dir)
    return SinkSlot(sink, "iceberg", "iceberg", None, iceberg=spec)


def _datagen_source(host: ConnectorHost, relation: RelationDef) -> Source:
    """A ``datagen`` source (:mod:`~flight_serve.connectors.datagen`): the declared columns
    are its schema; the run loop opens it from its checkpoint's row counters.

    Raises:
        ConnectorOptionError: a bad option, with the option's line and column.
        PipelineSQLError: the ``WATERMARK FOR`` column is not generated.
    """
    from flight_serve.connectors.datagen import DatagenOptions, DatagenSource

    options = relation.connector
    try:
        parsed = DatagenOptions.from_options(
            {key: option.text for key, option in options.items()}, relation.columns
        )
    except ConnectorOptionError as exc:
        given = options.get(exc.option.strip().lower())
        if given is None:
            raise
        at = given.error(exc.reason)
        raise ConnectorOptionError(exc.option, exc.reason, at.line, at.col) from None
    source = DatagenSource(parsed, name=relation.name)
    if relation.time_column is not None and source.schema.get_field_index(relation.time_column) < 0:
        raise relation.no_time_column(source.schema.names, f"datagen source {relation.name}")
    return source


#: ``(slot, pipeline) -> Sink``: the sink of a run without checkpoints; ``pipeline`` names
#: the run in what it writes (the pipeline file's stem).
SinkFactory = Callable[[SinkSlot, str], Sink]


@dataclass(frozen=True)
class EpochSinkArgs:
    """What an exactly-once sink of a checkpointed run is built from.

    Attributes:
        host: the checkpointed run (the server's store, the wait callback).
        pipeline: the run's name in checkpoints (what its sinks write under).
        mark: the sink's commit mark in the checkpoint resumed from (``{}``: none).
        rows: rows the sink had committed by that checkpoint.
        restored_epoch: that checkpoint's epoch (``None``: a fresh run).
        finished: whether it was a finished run's.
    """

    host: ConnectorHost
    pipeline: str
    mark: Mapping[str, Any]
    rows: int
    restored_epoch: int | None
    finished: bool


#: ``(slot, args) -> EpochSink``: the exactly-once sink of a checkpointed run.
EpochSinkFactory = Callable[[SinkSlot, EpochSinkArgs], EpochSink]


def _file_sink(slot: SinkSlot, pipeline: str) -> Sink:
    assert slot.path is not None
    assert slot.schema is not None
    # a run without checkpoints replaces the file only when it completes (docs/pipelines.md)
    return FileSink(slot.path, slot.format, slot.schema, in_progress=True)


def _file_epoch_sink(slot: SinkSlot, args: EpochSinkArgs) -> EpochSink:
    from flight_serve.pipelines.epoch_sinks import EpochFileSink

    assert slot.path is not None
    assert slot.schema is not None
    return EpochFileSink(
        slot.definition.name,
        slot.path,
        slot.format,
        slot.schema,
        restored_epoch=args.restored_epoch,
        rows=args.rows,
        finished=args.finished,
    )


def _stdout_sink(slot: SinkSlot, pipeline: str) -> Sink:
    from flight_serve.connectors.stdout import StdoutSink

    assert slot.schema is not None
    return StdoutSink(slot.definition.name, slot.schema, slot.format)


def _falkordb_sink(slot: SinkSlot, pipeline: str) -> FalkorDBSink:
    from flight_serve.connectors.falkordb import FalkorDBSink

    assert slot.graph is not None
    assert slot.schema is not None
    return FalkorDBSink(slot.definition.name, slot.graph, slot.schema, pipeline=pipeline)


def _falkordb_epoch_sink(slot: SinkSlot, args: EpochSinkArgs) -> EpochSink:
    from flight_serve.pipelines.graph_io import EpochGraphSink

    name = slot.definition.name
    return EpochGraphSink(
        name,
        _falkordb_sink(slot, args.pipeline),
        restored_epoch=args.restored_epoch,
        rows=args.rows,
    )


def _flight_source(host: ConnectorHost, relation: RelationDef) -> Source:
    from flight_serve.pipelines.flight_io import flight_source

    return flight_source(host, relation)


def _flight_slot(host: ConnectorHost, sink: SinkDef) -> SinkSlot:
    from flight_serve.pipelines.flight_io import flight_sink_slot

    return flight_sink_slot(host, sink)


def _flight_sink(slot: SinkSlot, pipeline: str) -> Sink:
    from flight_serve.connectors.flight import FlightSink

    assert slot.flight is not None
    assert slot.schema is not None
    return FlightSink(*slot.flight[:2], slot.schema, slot.flight[2], auth=slot.flight_auth)


def _flight_epoch_sink(slot: SinkSlot, args: EpochSinkArgs) -> EpochSink:
    from flight_serve.connectors.flight import FlightStreamTarget
    from flight_serve.pipelines.epoch_sinks import EpochStreamSink
    from flight_serve.pipelines.store_io import StoreTarget

    assert slot.flight is not None
    assert slot.schema is not None
    server, stream, writer = slot.flight
    host = args.host
    target: StoreTarget | FlightStreamTarget
    if "server" in slot.definition.connector or host.store is None:
        target = FlightStreamTarget(
            server,
            stream,
            slot.schema,
            writer,
            on_retry=host.connector_wait,
            auth=slot.flight_auth,
        )
    else:
        target = StoreTarget(host.store, stream, slot.schema, writer)
    return EpochStreamSink(
        slot.definition.name,
        target,
        slot.schema,
        mark=args.mark.get("mark"),
        incarnation=args.mark.get("incarnation"),
        rows=args.rows,
    )


def _iceberg_sink(slot: SinkSlot, pipeline: str) -> Sink:
    from flight_serve.pipelines.iceberg_io import IcebergRunSink

    assert slot.iceberg is not None
    assert slot.schema is not None
    return IcebergRunSink(slot.iceberg, f"{pipeline}/{slot.definition.name}", slot.schema)


def _iceberg_epoch_sink(slot: SinkSlot, args: EpochSinkArgs) -> EpochSink:
    from flight_serve.pipelines.iceberg_io import EpochIcebergSink

    assert slot.iceberg is not None
    assert slot.schema is not None
    name = slot.definition.name
    return EpochIcebergSink(
        name,
        slot.iceberg,
        f"{args.pipeline}/{name}",
        slot.schema,
        mark=dict(args.mark) or None,
        restored_epoch=args.restored_epoch,
    )


@dataclass(frozen=True)
class ConnectorSpec:
    """One connector (see the module docstring).

    Attributes:
        name: what ``connector = '…'`` says.
        options: the options each role takes, by role (``source``, ``table``, ``sink``); the
            roles are its keys.
        exactly_once: whether a checkpointed run covers it in a role (its sources resume from
            their offsets, its sinks commit each epoch once).
        extra_option: options beyond :attr:`options` it also takes (Iceberg catalog
            properties).
        source: builds its source (source connectors).
        table: builds its static table (table connectors).
        slot: checks a sink's options into its :class:`~.slots.SinkSlot` (sink connectors).
        sink: builds its sink of a run without checkpoints (sink connectors).
        epoch_sink: builds its exactly-once sink of a checkpointed run (``None``: the run
            writes :attr:`sink`'s, as for ``stdout``).
    """

    name: str
    options: Mapping[str, tuple[str, ...]]
    exactly_once: ExactlyOnce = _never
    extra_option: Callable[[str], bool] | None = None
    source: SourceFactory | None = None
    table: TableFactory | None = None
    slot: SlotFactory | None = None
    sink: SinkFactory | None = None
    epoch_sink: EpochSinkFactory | None = None
    roles: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset(self.options))

    def takes(self, role: str, key: str) -> bool:
        """Whether the connector in ``role`` takes option ``key``."""
        return key in self.options[role] or (
            self.extra_option is not None and self.extra_option(key)
        )


#: Every connector of a pipeline run, by name (the order is the one messages list them in).
REGISTRY: dict[str, ConnectorSpec] = {
    spec.name: spec
    for spec in (
        ConnectorSpec(
            "file",
            {
                "source": ("connector", "path", "format", "batch_rows", "delimiter"),
                "table": ("connector", "path", "format", "delimiter"),
                "sink": ("connector", "path", "format"),
            },
            exactly_once=_always,
            source=_file_source,
            table=_file_table,
            slot=_file_slot,
            sink=_file_sink,
            epoch_sink=_file_epoch_sink,
        ),
        ConnectorSpec(
            "stdout", {"sink": ("connector", "format")}, exactly_once=_always,
            slot=_stdout_slot,
            sink=_stdout_sink,
        ),
        # an epoch marker in the graph: exactly once anywhere
        ConnectorSpec(
            "falkordb",
            {"sink": FALKORDB_OPTIONS},
            exactly_once=_always,
            slot=_falkordb_slot,
            sink=_falkordb_sink,
            epoch_sink=_falkordb_epoch_sink,
        ),
        ConnectorSpec(
            "flight",
            {
                "source": (
                    "connector",
                    "server",
                    "stream",
                    "start_offset",
                    "stop_at_end",
                    "ticket",
                    "ticket_base64",
                    *FLIGHT_AUTH_OPTIONS,
                ),
                "sink": ("connector", "server", "stream", "writer", *FLIGHT_AUTH_OPTIONS),
            },
            exactly_once=_flight_exactly_once,
            source=_flight_source,
            slot=_flight_slot,
            sink=_flight_sink,
            epoch_sink=_flight_epoch_sink,
        ),
        ConnectorSpec(
            "iceberg",
            {"source": ICEBERG_SOURCE_OPTIONS, "sink": ICEBERG_SINK_OPTIONS},
            exactly_once=_always,
            extra_option=is_iceberg_catalog_option,
            source=_iceberg_source,
            slot=_iceberg_slot,
            sink=_iceberg_sink,
            epoch_sink=_iceberg_epoch_sink,
        ),
        # its offsets are row counters: a restored run hands out the rows a straight run would
        ConnectorSpec(
            "datagen",
            {"source": DATAGEN_SOURCE_OPTIONS},
            exactly_once=_always,
            extra_option=_datagen_option,
            source=_datagen_source,
        ),
    )
}

#: The options each connector takes, by role and name (the registry's view as a table).
CONNECTORS: dict[str, dict[str, tuple[str, ...]]] = {
    role: {name: spec.options[role] for name, spec in REGISTRY.items() if role in spec.roles}
    for role in ("source", "table", "sink")
}

#: Connectors of DESIGN §5 that only the server will run.
_SERVER_CONNECTORS = ("falkordb", "plugin")


def connector_of(options: Mapping[str, Option], role: str, what: str) -> ConnectorSpec:
    """The connector ``options`` name for ``role`` (``what``: e.g. ``SOURCE s``, for messages).

    Raises:
        PipelineSQLError: an unknown connector (the nearest name is suggested), one that cannot
            play the role in this run, or an option it does not take; at the option.
    """
    option = options["connector"]
    name = option.text.lower()
    available = CONNECTORS[role]
    if name not in available:
        if name in _SERVER_CONNECTORS or (role != "sink" and name == "stdout"):
            raise option.error(
                f"connector {name!r} cannot be a {role} of an embedded run; use "
                f"{' or '.join(repr(c) for c in available)}"
            )
        raise option.error(
            f"unknown connector {name!r} for a {role}{did_you_mean(name, list(available))} "
            f"(use {' or '.join(repr(c) for c in available)})"
        )
    spec = REGISTRY[name]
    for key, extra in options.items():
        if not spec.takes(role, key):
            raise extra.unknown(f"the {name} connector of {what}", available[name])
    return spec


def check_checkpointed(plan: PipelinePlan, *, server: bool) -> None:
    """Refuse a connector a checkpointed run cannot cover exactly once (``server``: a server
    pipeline, whose ``flight`` connectors without ``server`` are its own streams).

    Raises:
        PipelineSQLError: at the ``connector`` option, saying what to do instead.
    """
    for role, relations in (("source", plan.sources.values()), ("sink", plan.sinks.values())):
        for relation in relations:
            option = relation.connector["connector"]
            name = option.text.lower()
            spec = REGISTRY.get(name)
            if (
                spec is not None
                and role in spec.roles
                and spec.exactly_once(role, relation.connector, server)
            ):
                continue
            raise option.error(_refusal(name, role, server))


def _refusal(connector: str, role: str, server: bool) -> str:
    if server:
        return (
            f"a server pipeline takes file and iceberg sources and sinks, stdout and "
            f"falkordb sinks, this server's streams (connector 'flight' without a server "
            f"option) and other Flight servers' (connector 'flight' with a server option), "
            f"not a {connector!r} {role}"
        )
    return (
        f"a checkpointed run of flight-serve run covers file and iceberg sources, file, "
        f"stdout, iceberg and falkordb sinks, and flight connectors with a server option, "
        f"not a {connector!r} {role} (a "
        f"'flight' {role} needs server = …): submit the pipeline to the server "
        "(flight-serve submit), where it reads and writes streams exactly once, or run it "
        "without checkpoints"
    )
