"""What a connector's factories see of the run (:class:`ConnectorHost`) and what a sink factory
hands the run (:class:`SinkSlot`).

The factories of the registry (:mod:`.connect`) build every source and sink of a run from its
``WITH (…)`` options and these; the runtime (:mod:`.runtime`) looks the connector up and names
none itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from flight_serve.connectors.base import EpochSink, Sink
from flight_serve.pipelines.pipeline import PipelinePlan, SinkDef

if TYPE_CHECKING:
    from flight_serve.connectors.flight import FlightClientAuth
    from flight_serve.pipelines.coordinator import CheckpointCoordinator
    from flight_serve.pipelines.iceberg_io import IcebergSinkSpec
    from flight_serve.store import StreamStore

__all__ = ["ConnectorHost", "SinkSlot"]


class ConnectorHost(Protocol):
    """The run a connector is built for (the pipeline runtime).

    Attributes:
        plan: the parsed pipeline (its ``batch_rows``, its directory).
        output_dir: where relative sink paths start.
        data_dir: where the embedded Iceberg catalog lives.
        writes: whether the run writes (``False``: :meth:`explain` only builds the plan).
        store: a server pipeline's store: ``flight`` connectors without a ``server`` option are
            its streams (``None``: an embedded run, which has none).
        coordinator: the checkpoints of a checkpointed run (its resumed offsets and options),
            else ``None``.
        reconnect_s: how long a source on another server waits for that server to come back
            (a checkpointed run's), seconds; ``None``: the source's own default.
        stream_server: ``(Flight location, bearer token or None)`` of the server ``flight``
            connectors without a ``server`` option read and write over Flight (a server's job
            on Ray), else ``None``.
    """

    plan: PipelinePlan
    output_dir: Path
    data_dir: Path
    writes: bool
    store: StreamStore | None
    coordinator: CheckpointCoordinator | None
    reconnect_s: float | None
    stream_server: tuple[str, str | None] | None

    def report_gap(self, message: str) -> None:
        """An ``offset_reset = 'earliest'`` resume skipped input (``message`` says what)."""
        ...

    def connector_wait(self, waiting: str | None) -> None:
        """A connector retries its server (``waiting``: why; ``None`` once through)."""
        ...


@dataclass
class SinkSlot:
    """A sink of the run: its definition and checked options (built by its registry row's
    ``slot`` factory), and the sink its ``sink`` or ``epoch_sink`` factory built for it."""

    definition: SinkDef
    connector: str
    format: str
    path: Path | None
    schema: pa.Schema | None = None
    #: falkordb sinks: the options (text)
    graph: dict[str, str] | None = None
    fed_by: list[str] = field(default_factory=list)
    #: the sink of a run without checkpoints (and stdout's in any run)
    writer: Sink | None = None
    #: the exactly-once sink of a checkpointed run
    epoch: EpochSink | None = None
    rows: int = 0
    #: flight sinks: (server, stream, writer), and how to authenticate there
    flight: tuple[str, str, str] | None = None
    flight_auth: FlightClientAuth | None = None
    #: flight sinks of a server pipeline without ``server``: (stream, writer) in its own store
    store_writer: tuple[str, str] | None = None
    #: iceberg sinks: the checked options
    iceberg: IcebergSinkSpec | None = None

    @property
    def target(self) -> str:
        """Where the sink writes, as ``explain`` prints it."""
        if self.graph is not None:
            return f"falkordb graph {self.graph.get('graph') or self.definition.name}"
        if self.iceberg is not None:
            return f"iceberg table {self.iceberg.table}"
        if self.flight is not None:
            server, stream, writer = self.flight
            return f"{server} stream {stream} (writer {writer})"
        return str(self.path) if self.path is not None else "stdout"

    @property
    def summary_target(self) -> str:
        """Where the sink writes, as a run's summary says it (a server's own stream is
        ``stream <name>``)."""
        if self.store_writer is not None:
            return f"stream {self.store_writer[0]}"
        return self.target

    def fit_window(self, emit: str, key_columns: tuple[str, ...], schema: pa.Schema) -> None:
        """Adapt to rows of a windowed query (``emit``, its GROUP BY columns, its output).

        Raises:
            ConnectorError: the sink cannot take them as they are (Iceberg: ``emit = 'update'``
                without the keys to upsert on).
        """
        if self.iceberg is not None:
            self.iceberg = self.iceberg.for_emit(emit, key_columns, schema)
