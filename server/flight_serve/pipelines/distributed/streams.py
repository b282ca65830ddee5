"""A server stream as a split source of a distributed run: its writers dealt to source workers.

Embedded (:class:`~flight_serve.connectors.flight.FlightSource`,
:class:`~flight_serve.pipelines.store_io.StoreSource`) a stream is **one totally ordered log**:
its entries (batches, watermark markers, end-of-input markers) are processed in **offset
order**, and each DoPut writer is a watermark partition. The writers the stream's history knows
when the source opens (less those that ended before its start offset) are partitions from the
start; a writer that first appears later becomes one at its first entry; the source is done at
the entry where every writer it knows has ended (with ``stop_at_end``: at the offset the stream
had reached when it opened, where every writer still open ends). The checkpoint offset is the
next entry.

Distributed, every source worker reads the whole log in offset order (:class:`StreamReader`,
over Flight from the server that holds the stream), and **owns some writers**
(:func:`stream_owner`): it pushes its writers' entries through the per-row nodes and the
exchange, and every window instance gets one record per entry and windowed query from the
entry's owner, numbered by the entry's **offset**. Entries that make no event (a writer's second
end-of-input marker) are sent as empty records by worker 0, so every offset from the start to
the end has exactly one record: a window instance consumes them in offset order (a reorder by
offset, as the steps of a file), so every row meets the watermark it met embedded, and a
stream's *position* is its offset (every instance cuts at the same entry). What the embedded
source decides when it opens (its start offset, the writers known then and their watermarks,
``stop_at_end``'s end) is decided once by the driver (:func:`stream_starts`) and sent to every
worker, so they agree on the partitions and on where the stream ends.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from flight_serve.errors import PipelineSQLError

if TYPE_CHECKING:
    from flight_serve.connectors.base import Source
    from flight_serve.pipelines.runtime import PipelineRuntime

__all__ = [
    "LogEntry",
    "StreamCut",
    "StreamReader",
    "StreamSplit",
    "StreamStart",
    "fed_streams",
    "stream_owner",
    "stream_starts",
]


@dataclass(frozen=True)
class StreamStart:
    """Where every worker of a run starts one stream source (picklable; the driver's source
    decides it, as the embedded source does when it opens).

    Attributes:
        offset: the first entry to read (the ``start_offset`` option, or the checkpoint's).
        partitions: the writers that are partitions from the start (the stream's history:
            every writer not ended before ``offset``), in the history's order.
        initial_watermarks: explicit watermarks of those writers whose every entry lies
            before ``offset``.
        end_offset: with ``stop_at_end``, the stream's end when the driver opened it (every
            writer still open ends there); ``None``: the stream ends when its writers do.
        rows: rows read before ``offset`` (a checkpoint's).
        done: the stream had ended (a run resumed from its finished checkpoint): nothing is
            read.
    """

    offset: int
    partitions: tuple[str, ...]
    initial_watermarks: dict[str, int] = field(default_factory=dict)
    end_offset: int | None = None
    rows: int = 0
    done: bool = False


@dataclass(frozen=True)
class StreamSplit:
    """What a source worker reads of a stream (picklable): all of it, processing the entries
    of the writers it owns (:func:`stream_owner`); worker 0 also sends the entries no writer
    owns (entries without an event, and ``stop_at_end``'s end).

    Attributes:
        channel: this worker's number among the stream's readers, ``0 … channels - 1``.
        channels: the stream's readers.
    """

    channel: int
    channels: int


@dataclass(frozen=True)
class StreamCut:
    """Where a cut leaves one stream source (picklable): every entry below ``offset`` was
    consumed, none after.

    Attributes:
        offset: the next entry (the embedded source's checkpoint offset).
        rows: rows read below it.
        done: the stream ended before ``offset`` (its last writer's end was consumed).
    """

    offset: int
    rows: int
    done: bool = False

    @property
    def position(self) -> int:
        """The stream's position: its offset."""
        return self.offset

    @property
    def finished(self) -> bool:
        """Whether the stream had ended at the cut."""
        return self.done


def stream_owner(writer: str, start: StreamStart, channels: int) -> int:
    """The channel (source worker) that processes ``writer``'s entries: the writers known at
    the start are dealt round-robin in name order (even shares for the common case), a writer
    that appears later goes by the CRC-32 of its name, so no worker has to tell another.

    >>> start = StreamStart(0, ("b", "a", "c"))
    >>> [stream_owner(w, start, 2) for w in ("a", "b", "c")]
    [0, 1, 0]
    """
    known = sorted(start.partitions)
    if writer in known:
        return known.index(writer) % channels
    return zlib.crc32(writer.encode()) % channels


def fed_streams(runtime: PipelineRuntime) -> list[str]:
    """The stream sources some query reads, in the plan's order."""
    from flight_serve.connectors.flight import FlightSource

    return [
        name
        for name, source in runtime.flight_sources.items()
        if isinstance(source, FlightSource) and runtime.streams[name].consumers
    ]


def stream_starts(runtime: PipelineRuntime) -> dict[str, StreamStart]:
    """Where every fed stream source of the driver's ``runtime`` starts (its sources were
    built as the embedded run builds them: a checkpointed run's from the checkpoint's offset).

    Raises:
        PipelineSQLError: a stream's server was unreachable when the source was built (a
            distributed run needs the stream's history to agree on its partitions).
    """
    from flight_serve.connectors.flight import FlightSource

    out: dict[str, StreamStart] = {}
    for name in fed_streams(runtime):
        source = runtime.flight_sources[name]
        assert isinstance(source, FlightSource)
        if source.waiting_to_open:
            raise PipelineSQLError(
                f"SOURCE {name}: {source.what}: the server is unreachable; a distributed run "
                "reads the stream's writers before it starts: start it when the server is up"
            )
        out[name] = StreamStart(
            source.position,
            tuple(source.partitions),
            dict(source.initial_watermarks),
            source.end_offset if source.stop_at_end else None,
            source.rows,
        )
    return out


@dataclass(frozen=True)
class LogEntry:
    """One offset of the stream as a source worker hands it on.

    Attributes:
        offset: the entry's offset.
        kind: ``batch``, ``watermark``, ``end`` (the writer's end of input), ``none`` (an entry
            that made no event: nothing to do but count it) or ``close`` (``stop_at_end``: the
            writers in ``closes`` end here; not an entry of the stream).
        partition: the writer (``None`` for ``none`` and ``close``).
        batch: a ``batch`` entry's rows (in the source's schema).
        watermark_ns: a ``watermark`` entry's watermark.
        new: the writer's first entry (it becomes a partition here).
        last: the stream ends with this entry (no record comes after it).
        mine: this worker processes it (it owns the writer; worker 0 for ``none``/``close``).
        closes: the writers a ``close`` ends, in name order.
    """

    offset: int
    kind: str
    partition: str | None = None
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    new: bool = False
    last: bool = False
    mine: bool = False
    closes: tuple[str, ...] = ()


class StreamReader:
    """One source worker's read of a stream: the whole log in offset order, from the start
    the driver decided, as :class:`LogEntry` values (the module docstring).

    Args:
        template: the stream source as the worker's runtime built it (its server, stream,
            columns and credentials; never opened).
        start: where the run starts the stream.
        split: this worker's channel.

    Raises (from :meth:`poll`): what :meth:`FlightSource.poll
    <flight_serve.connectors.flight.FlightSource.poll>` raises.
    """

    def __init__(self, template: Source, start: StreamStart, split: StreamSplit) -> None:
        from flight_serve.connectors.flight import FlightSource

        assert isinstance(template, FlightSource), "a stream source"
        self.start = start
        self.split = split
        self.source = FlightSource(
            template.server,
            template.stream,
            schema=template.schema,
            start_offset=start.offset,
            auth=template.auth,
        )
        self.source.reconnect_s = template.reconnect_s
        #: the next offset to hand on
        self.expected = start.offset
        self.known: set[str] = set(start.partitions)
        self.ended: set[str] = set()
        self.done = start.done
        #: whether the stream holds entries not read yet (the source's backlog events)
        self.backlog = True
        self.rows = start.rows

    def _mine(self, writer: str | None) -> bool:
        if writer is None:
            return self.split.channel == 0
        return stream_owner(writer, self.start, self.split.channels) == self.split.channel

    def poll(self, timeout_s: float, max_events: int = 64) -> Iterator[LogEntry]:
        """The next entries (waiting up to ``timeout_s`` seconds for the first)."""
        if self.done:
            return
        end = self.start.end_offset
        if end is not None and self.expected >= end:
            yield from self._close()
            return
        for event in self.source.poll(timeout_s, max_events):
            if event.kind == "backlog":
                self.backlog = event.backlog
            if event.offset < 0:
                continue  # a new writer (known from its entry) or the backlog
            if end is not None and event.offset >= end:
                break
            yield from self._gap(event.offset)
            writer = event.partition
            new = writer not in self.known
            self.known.add(writer)
            kind = event.kind
            if kind == "end":
                self.ended.add(writer)
            last = end is None and self.known <= self.ended
            if event.batch is not None:
                self.rows += event.batch.num_rows
            self.expected = event.offset + 1
            yield LogEntry(
                event.offset,
                kind,
                writer,
                event.batch,
                event.watermark_ns,
                new,
                last,
                self._mine(writer),
            )
            if last:
                self.done = True
                self.source.close()
                return
        yield from self._gap(self.source.position if end is None else min(self.source.position, end))
        if end is not None and self.expected >= end:
            yield from self._close()

    def _gap(self, upto: int) -> Iterator[LogEntry]:
        """Entries below ``upto`` that made no event (counted, worker 0 sends them)."""
        while self.expected < upto:
            yield LogEntry(self.expected, "none", mine=self._mine(None))
            self.expected += 1

    def _close(self) -> Iterator[LogEntry]:
        """``stop_at_end``: every writer still open ends at the stream's end when it opened."""
        closes = tuple(sorted(self.known - self.ended))
        self.ended |= set(closes)
        self.done = True
        self.source.close()
        yield LogEntry(self.expected, "close", last=True, mine=self._mine(None), closes=closes)

    def close(self) -> None:
        """Stop reading."""
        self.source.close()
