"""A server pipeline's streams, read and written through the server's own store (no network).

In a pipeline running inside the server, ``CREATE SOURCE … WITH (connector = 'flight', stream =
…)`` and ``CREATE SINK … WITH (connector = 'flight', stream = …)`` without a ``server`` option
name a stream of *this* server, and go straight to its
:class:`~flight_serve.store.StreamStore`:

:class:`StoreSource`
    Reads the stream from an offset, entry by entry, as the runtime polls it; its **offset** (the
    next entry to read) is what a checkpoint records. Each DoPut writer of the stream is one
    watermark partition, as with the ``flight`` connector: the writers the stream's history knows
    (less those that ended before the offset) are partitions from the start, a new writer becomes
    one when its first entry is read, and its watermark and end-of-input markers advance and end
    its partition. The source is **done** (its input has ended) once every writer it knows
    has ended, and it knows at least one: as the ``flight`` connector's source, and as Flink's
    bounded sources, a writer that first appears after that is not read by this pipeline. Until
    then windows over it fire as its watermark advances.
    On restore, an offset that retention removed (``offset < first_offset``), or a stream that was
    dropped and re-created since the checkpoint, is a :class:`~flight_serve.errors.CheckpointError`,
    unless ``offset_reset = 'earliest'``: then the read resumes at the oldest entry there is and
    the gap (entries skipped) is reported.

:class:`StoreTarget`
    The stream an exactly-once stream sink
    (:class:`~flight_serve.pipelines.epoch_sinks.EpochStreamSink`) appends to; it is created,
    with the sink's columns, when the pipeline starts, so a client can tail it at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pyarrow as pa

from flight_serve.connectors.base import ResumedSource, SourceEvent
from flight_serve.connectors.columns import conform
from flight_serve.errors import (
    CheckpointError,
    ConnectorError,
    FlightServeError,
    StreamNotFoundError,
)
from flight_serve.store import StreamStore
from flight_serve.store.streams import validate_writer_name

__all__ = ["PARTITION", "StoreSource", "StoreTarget"]

#: The watermark partition of entries written without a writer name (see the module docstring).
PARTITION = ""
_WAIT_FOR_STREAM_S = 0.05


class StoreSource(ResumedSource):
    """A stream of this server as a pipeline source (see the module docstring).

    Args:
        store: the server's store.
        stream: the stream name.
        name: the source's name in the pipeline (for messages).
        schema: the declared columns, or ``None`` to take the stream's (it must exist then).
        start_offset: the first entry to read (a checkpoint's offset, or 0).
        incarnation: the stream incarnation the offset belongs to (from a checkpoint).
        offset_reset: ``fail`` or ``earliest`` (see the module docstring).
        on_gap: told about a gap skipped under ``offset_reset = 'earliest'``.
        rows: rows read before (from a checkpoint).
        stream_rows: the stream's rows below ``start_offset`` when the checkpoint was taken
            (:meth:`~flight_serve.store.StreamStore.rows_before`; ``None`` from a checkpoint
            that did not record it): a resume that skips entries retention removed counts
            the rows skipped as :attr:`data_loss_rows`.

    Raises:
        ConnectorError: no such stream and no declared columns, or a declared column is missing.
        CheckpointError: the offset is gone and ``offset_reset`` is ``fail``.
    """

    server = "this server (its store)"
    stop_at_end = False

    def __init__(
        self,
        store: StreamStore,
        stream: str,
        *,
        name: str,
        schema: pa.Schema | None = None,
        start_offset: int = 0,
        incarnation: str | None = None,
        offset_reset: str = "fail",
        on_gap: Callable[[str], None] | None = None,
        rows: int = 0,
        stream_rows: int | None = None,
    ) -> None:
        self.store = store
        self.stream = stream
        self.what = f"source {name} (stream {stream!r})"
        info = store.info(stream) if store.exists(stream) else None
        if info is None and schema is None:
            raise ConnectorError(
                f"{self.what}: the stream does not exist yet; declare the source's columns to "
                "wait for it"
            )
        self.schema: pa.Schema = schema if schema is not None else info.schema  # type: ignore[union-attr]
        if info is not None:
            missing = [n for n in self.schema.names if info.schema.get_field_index(n) < 0]
            if missing:
                raise ConnectorError(
                    f"{self.what}: the stream has no column {', '.join(map(repr, missing))}; its "
                    f"columns: {', '.join(info.schema.names)}"
                )
        self.partitions: tuple[str, ...] = ()
        self.initial_watermarks: dict[str, int] = {}
        self.rows = rows
        self.gap_entries = 0
        #: rows this resume skipped (entries retention removed, under offset_reset = 'earliest')
        self.data_loss_rows = 0
        self.incarnation = info.incarnation if info is not None else None
        reset = offset_reset == "earliest"
        if incarnation is not None and self.incarnation != incarnation:
            message = (
                f"{self.what}: the stream was dropped or re-created since the checkpoint "
                f"(incarnation {incarnation}, now {self.incarnation or 'none'}); the offset "
                f"{start_offset} names nothing"
            )
            if not reset:
                raise CheckpointError(
                    f"{message}. Start over (cancel and submit again), or SET offset_reset = "
                    "'earliest' to read the new stream from its start"
                )
            start_offset = info.first_offset if info is not None else 0
            if on_gap is not None:
                on_gap(f"{message}: reading the new stream from offset {start_offset}")
        elif info is not None and start_offset < info.first_offset:
            gap = info.first_offset - start_offset
            message = (
                f"{self.what}: the checkpoint's offset {start_offset} is gone (retention kept "
                f"offsets {info.first_offset} and up): {gap} entries were never read"
            )
            if not reset:
                raise CheckpointError(
                    f"{message}. SET offset_reset = 'earliest' to skip them and go on from "
                    f"{info.first_offset} (the gap is reported), or start over"
                )
            self.gap_entries = gap
            if stream_rows is not None:
                self.data_loss_rows = max(store.rows_before(stream, info.first_offset) - stream_rows, 0)
                message += f" ({self.data_loss_rows} rows)"
            start_offset = info.first_offset
            if on_gap is not None:
                on_gap(f"{message}; resuming at {start_offset} (offset_reset = 'earliest')")
        self.start_offset = start_offset
        # the stream's rows below the position, less the rows read: position_state adds them
        self._rows_base = (store.rows_before(stream, start_offset) if info is not None else 0) - rows
        if info is not None:
            writers = store.writers(stream)
            self.partitions = tuple(
                w.name for w in writers.values() if w.ended_at is None or w.ended_at >= start_offset
            )
            self.initial_watermarks = {
                w.name: w.watermark_ns
                for w in writers.values()
                if w.name in self.partitions
                and w.watermark_ns is not None
                and w.last_offset < start_offset
            }
        self._known: set[str] = set(self.partitions)
        self._ended: set[str] = set()
        self.position = start_offset  # the next entry to read
        self.end_offset = info.next_offset if info is not None else 0
        self._backlog = self.end_offset > start_offset

    @property
    def done(self) -> bool:
        """Whether every writer the source knows (at least one) has ended."""
        return bool(self._known) and self._known <= self._ended

    @property
    def backlog(self) -> bool:
        """Whether the stream holds entries not read yet."""
        return self._backlog and not self.done

    def start(self) -> None:
        """Nothing to start: reads happen in :meth:`poll`."""

    def position_state(self) -> dict[str, object]:
        """The offset as checkpoint JSON."""
        return {
            "kind": "stream",
            "stream": self.stream,
            "incarnation": self.incarnation,
            "offset": self.position,
            "rows": self.rows,
            "gap_entries": self.gap_entries,
            "stream_rows": self._rows_base + self.rows,
        }

    def poll(self, timeout_s: float, max_entries: int = 64) -> list[SourceEvent]:
        """The next entries (up to ``max_entries``), waiting up to ``timeout_s`` seconds when
        there are none. Every event returned by the previous poll has been processed when this
        is called (a checkpoint barrier may have been taken since).

        Raises:
            ConnectorError: the stream was dropped, or a batch does not fit the declared columns.
        """
        if self.incarnation is None:
            if not self.store.exists(self.stream):
                time.sleep(min(timeout_s, _WAIT_FOR_STREAM_S))
                return []
            self.incarnation = self.store.info(self.stream).incarnation
        events: list[SourceEvent] = []
        try:
            entries = self.store.entries(
                self.stream,
                self.position,
                self.position + max_entries,
                incarnation=self.incarnation,
            )
            for entry in entries:
                offset, writer, batch = entry.offset, entry.writer, entry.batch
                self.position = offset + 1
                if writer not in self._known:
                    self._known.add(writer)
                    events.append(SourceEvent("partition", writer))
                if batch is not None:
                    events.append(SourceEvent("batch", writer, conform(batch, self.schema, self.what), offset=offset))
                    self.rows += batch.num_rows
                elif entry.end_of_input:
                    if writer not in self._ended:  # a writer ends once
                        self._ended.add(writer)
                        events.append(SourceEvent("end", writer, offset=offset))
                    if self.done:
                        break  # the input ended: entries after it are not this run's
                else:
                    events.append(
                        SourceEvent(
                            "watermark", writer, watermark_ns=entry.watermark_ns, offset=offset
                        )
                    )
            if not events and timeout_s > 0:
                self.store.wait_for(self.stream, self.position, timeout_s)
            next_offset = self.store.info(self.stream).next_offset
        except StreamNotFoundError as exc:
            raise ConnectorError(f"{self.what}: the stream was dropped ({exc})") from exc
        backlog = next_offset > self.position
        if backlog != self._backlog:
            self._backlog = backlog
            events.append(SourceEvent("backlog", backlog=backlog))
        return events

    def close(self) -> None:
        """Nothing to close."""


class StoreTarget:
    """A stream of this server as an exactly-once sink's target (see the module docstring).

    The sink appends as DoPut writer ``writer`` (the sink's ``writer`` option, default its
    name), so a pipeline reading the stream sees it as one watermark partition, and the replay
    matching of :class:`~flight_serve.pipelines.epoch_sinks.EpochStreamSink` looks at that
    writer's batches only.

    Args:
        store: the server's store.
        stream: the stream name; created now with ``schema`` if missing.
        schema: the sink's columns.
        writer: the writer name of every entry the sink appends.

    Raises:
        ConnectorError: the stream exists with other columns, cannot be created, or ``writer``
            is not a valid writer name.
    """

    def __init__(self, store: StreamStore, stream: str, schema: pa.Schema, writer: str) -> None:
        self.store = store
        self._name = stream
        self.writer = writer
        try:
            validate_writer_name(writer)
            store.create(stream, schema)
        except FlightServeError as exc:
            raise ConnectorError(f"stream {stream!r}: {exc}") from exc

    @property
    def name(self) -> str:
        """The stream name."""
        return self._name

    def incarnation(self) -> str | None:
        """The stream's incarnation now (``None`` if it was dropped)."""
        return self.store.info(self._name).incarnation if self.store.exists(self._name) else None

    def next_offset(self) -> int:
        """The offset the next entry gets."""
        return self.store.info(self._name).next_offset if self.store.exists(self._name) else 0

    def entries(self, start: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """This sink's writer's batches from offset ``start`` on."""
        for entry in self.store.entries(self._name, start):
            if entry.writer == self.writer and entry.batch is not None:
                yield entry.offset, entry.batch

    def append(self, batch: pa.RecordBatch) -> int:
        """Append ``batch`` (durable when this returns); return its offset."""
        return self.store.append(self._name, batch, writer=self.writer)

    def committed(self) -> None:
        """Nothing to finish: every append is durable when it returns."""

    def close(self) -> None:
        """Nothing to release (the store is the server's)."""

    def end_input(self) -> None:
        """Mark the writer's end of input (once: nothing if the stream already holds it)."""
        info = self.store.writers(self._name).get(self.writer)
        if info is None or info.ended_at is None:
            self.store.append_marker(self._name, self.writer, end_of_input=True)
