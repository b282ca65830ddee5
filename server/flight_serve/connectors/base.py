"""The contracts between the pipeline runtime and its connectors.

A **source** hands the run loop :class:`SourceEvent` values, a **sink** takes batches, an
**epoch sink** takes batches and commits them exactly once, epoch by epoch, with the
checkpoints. The runtime knows these three shapes and nothing of any connector.

**Source** (:class:`Source`), one thread, driven by the run loop:

1. built from its options (no I/O in a new source's constructor);
2. ``open(resume)``: connect, start reading; ``resume`` is the :meth:`Source.snapshot` of the
   checkpoint the run resumes from (``None``: a fresh run);
3. ``poll(timeout_s, max_events)``: the events read so far (at most ``max_events``), waiting up
   to ``timeout_s`` seconds for the first. Between two polls every event of the previous poll
   has gone through every operator and sink, so that instant is a consistent cut: the run loop
   takes its checkpoint barriers there, before a poll of a source that is not :attr:`done`
   (the source knows nothing of them);
4. ``snapshot()``: the offsets of every event handed out so far, as JSON-able state;
5. ``close()``.

A *bounded* source (``live`` false, files) is read one batch per poll, round-robin with the other
bounded sources, and never waits; a *live* source (a stream's tail, a table's snapshots, a
generator paced by time) may wait in :meth:`Source.poll`, and only once no bounded input is left.

**Sink** (:class:`Sink`): ``write(batch)`` as the rows are produced, ``end_input()`` when the run
reached the end of its input, ``close()`` always.

**Epoch sink** (:class:`EpochSink`), the two-phase commit of a checkpointed run (see
:mod:`flight_serve.pipelines.epoch_sinks`): ``write(batch)`` holds rows for the current epoch;
``prepare(epoch, files)`` makes them durable or stages them in the checkpoint and returns the
commit **mark** for the manifest; ``commit(epoch)`` publishes the epoch once its checkpoint is
complete; on a resume the sink is built from the mark of the checkpoint resumed from and
``recover(staged)`` redoes that checkpoint's commit (``staged``: the rows it staged); then
``end_input()`` once the input ended and the last epoch is committed, and ``close()`` always.

**Files a sink stages** go through ``prepare``'s argument: ``files`` maps a file name in the
checkpoint to its bytes; a sink adds its own (``sink-<name>.arrow``, Arrow IPC) and names it in
its mark (``"staged"``), and the runtime hands those rows back to ``recover``.

Options: each connector parses its ``WITH (…)`` options into a typed object and reports a bad one
as :class:`~flight_serve.errors.ConnectorOptionError` with the option's name and position
(:class:`OptionValue` carries the text and the line and column of the value).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import pyarrow as pa

from flight_serve.errors import ConnectorOptionError

__all__ = [
    "EpochSink",
    "OptionValue",
    "ResumedSource",
    "Sink",
    "Source",
    "SourceEvent",
    "SourceEventKind",
]

SourceEventKind = Literal["batch", "partition", "watermark", "end", "backlog"]


@dataclass(frozen=True)
class SourceEvent:
    """One thing a source read.

    Attributes:
        kind: ``batch`` (rows of ``partition``), ``partition`` (a new partition, e.g. a new
            writer of a stream), ``watermark`` (``partition``'s explicit watermark,
            ``watermark_ns``), ``end`` (``partition`` ended) or ``backlog`` (whether the source
            has unread input, ``backlog``).
        partition: the partition (a file, a writer).
        batch: the rows of a ``batch`` event, in the source's schema.
        offset: the source's offset of a ``batch``, ``watermark`` or ``end`` event (``-1``:
            none).
    """

    kind: SourceEventKind
    partition: str = ""
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    backlog: bool = False
    offset: int = -1


@dataclass(frozen=True)
class OptionValue:
    """One ``key = value`` option as a connector sees it: the text, and where it was written
    (1-based line and column of the value; ``None`` when not known, e.g. a programmatic call).

    :meth:`error` makes the :class:`~flight_serve.errors.ConnectorOptionError` for it.
    """

    key: str
    text: str
    line: int | None = None
    col: int | None = None

    def error(self, message: str) -> ConnectorOptionError:
        """``option <key>: <message>`` at this option's position."""
        return ConnectorOptionError(self.key, message, self.line, self.col)


class Source(Protocol):
    """A source of a pipeline run (see the module docstring for the lifecycle).

    Attributes:
        schema: the schema of every ``batch`` event.
        partitions: the partitions known before the first poll (files, writers); more may come
            as ``partition`` events.
        initial_watermarks: explicit watermarks known before the first poll, by partition.
        rows: rows handed out so far (restored ones included).
    """

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def partitions(self) -> tuple[str, ...]: ...

    @property
    def initial_watermarks(self) -> dict[str, int]: ...

    @property
    def rows(self) -> int: ...

    @property
    def live(self) -> bool:
        """``False`` for bounded input read round-robin (files), ``True`` when polls wait."""
        ...

    @property
    def done(self) -> bool:
        """Whether every partition has ended and every event was handed out."""
        ...

    @property
    def backlog(self) -> bool:
        """Whether the source has unread input (then no partition of it is idle)."""
        ...

    def open(self, resume: Mapping[str, Any] | None, /) -> None:
        """Start reading, from ``resume`` (a :meth:`snapshot` of a checkpoint) or the start."""
        ...

    def poll(self, timeout_s: float, max_events: int, /) -> list[SourceEvent]:
        """The next events (at most ``max_events``), waiting up to ``timeout_s`` seconds."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The offsets of every event handed out so far (JSON-able)."""
        ...

    def close(self) -> None:
        """Stop reading and let go of connections. Idempotent."""
        ...


class ResumedSource(ABC):
    """The :class:`Source` methods of a live source that is built from its offset (the resume
    state goes to its constructor, which checks it): :meth:`open` starts it, :meth:`snapshot`
    is its :meth:`position_state`."""

    #: a live source: polls may wait for input
    live: Final = True

    @abstractmethod
    def start(self) -> None:
        """Start reading (a reading thread, a connection)."""

    @abstractmethod
    def position_state(self) -> Mapping[str, Any]:
        """The offset of every event handed out so far, as checkpoint JSON."""

    def open(self, resume: Mapping[str, Any] | None = None, /) -> None:
        """Start reading (:meth:`start`); the offset to resume from was given when it was built."""
        self.start()

    def snapshot(self) -> dict[str, Any]:
        """The offset as checkpoint JSON (:meth:`position_state`)."""
        return dict(self.position_state())


class Sink(Protocol):
    """A sink of a run without checkpoints: rows go out as they are produced."""

    def write(self, batch: pa.RecordBatch, /) -> object:
        """Write ``batch`` (in the sink's schema); what it returns is not used."""
        ...

    def end_input(self) -> None:
        """The run reached the end of its input (a stream sink ends its writer)."""
        ...

    def close(self) -> None:
        """Flush and let go of files and connections. Idempotent."""
        ...


class EpochSink(Protocol):
    """An exactly-once sink of a checkpointed run (see the module docstring).

    Attributes:
        rows: rows committed or prepared so far (restored ones included).
    """

    rows: int

    @property
    def has_pending(self) -> bool:
        """Whether rows wait for the next checkpoint."""
        ...

    def write(self, batch: pa.RecordBatch, /) -> None:
        """Hold ``batch`` for the current epoch."""
        ...

    def prepare(self, epoch: int, files: dict[str, bytes], /) -> dict[str, Any]:
        """Make epoch ``epoch`` durable or stage it in ``files``; return its commit mark."""
        ...

    def commit(self, epoch: int, /) -> None:
        """Epoch ``epoch`` is in a complete checkpoint: publish it."""
        ...

    def recover(self, staged: list[pa.RecordBatch], /) -> None:
        """Redo the commit of the checkpoint the sink was built from (``staged``: its rows)."""
        ...

    def end_input(self) -> None:
        """The input ended and the last epoch is committed (write the file, end the writer)."""
        ...

    def close(self) -> None:
        """Drop what was not committed (it is replayed from the last checkpoint)."""
        ...

