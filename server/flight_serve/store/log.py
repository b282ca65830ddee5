"""One open stream incarnation: its log of entries, the staging of frames, group commit and
the writes themselves (see :mod:`flight_serve.store.streams` for the format and the rules).

:class:`StreamLog` holds the in-memory state of a stream and the operations on it: reserving an
offset (:meth:`StreamLog.reserve`), filling a direct frame (:meth:`StreamLog.fill`), writing and
syncing the staged frames (:meth:`StreamLog.drain`), cutting back after a failed write, and
planning reads. :class:`~flight_serve.store.streams.StreamStore` finds the log of a stream name
and calls these.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime
from pathlib import Path
from typing import Literal

import pyarrow as pa

from flight_serve._fs import fsync_dir, write_file
from flight_serve.errors import StorageError, StreamNotFoundError, write_error
from flight_serve.store.frames import (
    ALIGN,
    BATCH,
    END,
    FRAME_MAGIC,
    HEADER,
    IPC_CONTINUATION,
    WATERMARK,
    WRITERS_FILE,
    ZEROS,
    crc32,
    pwrite_all,
    schema_message_bytes,
    segment_name,
)
from flight_serve.store.segment import Segment, locate

__all__ = [
    "BufferPool",
    "LogSettings",
    "PendingAppend",
    "StreamEntry",
    "StreamInfo",
    "StreamLog",
    "WriterInfo",
]

log = logging.getLogger("flight_serve.store.streams")

FsyncMode = Literal["batch", "never"]

#: A store keeps its direct frames' staging buffers for reuse, up to this many bytes of them.
SPARE_BYTES = 64 << 20
#: write() puts the staged frames in the file itself once they hold this many bytes (so at most
#: twice this is in flight: staged, and being written by a commit; the spare pool covers it).
MAX_STAGED_BYTES = 32 << 20


@dataclass(frozen=True)
class StreamInfo:
    """What a stream holds right now.

    Attributes:
        name: the stream name.
        schema: the Arrow schema of every batch (dictionary types already decoded).
        incarnation: UUID (canonical text) made when the stream was created; a dropped and
            re-created stream gets a new one, so a ticket can tell the two apart.
        first_offset: offset of the oldest retained entry (retention moves it up).
        next_offset: offset the next appended batch gets; batches ``[first_offset, next_offset)``
            are readable.
        num_rows: rows in the retained batches.
        num_bytes: bytes of the retained batches' frame bodies on disk: their Arrow IPC
            messages plus any alignment padding (frame headers excluded).
        created_at: aware UTC instant the stream was created.
    """

    name: str
    schema: pa.Schema
    incarnation: str
    first_offset: int
    next_offset: int
    num_rows: int
    num_bytes: int
    created_at: datetime


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a stream's log (:meth:`StreamStore.entries`).

    Attributes:
        offset: its offset.
        writer: the writer that wrote it (``""`` for entries appended without one).
        batch: the rows; ``None`` for a marker.
        watermark_ns: a watermark marker's watermark (ns since the epoch).
        end_of_input: an end-of-input marker.
    """

    offset: int
    writer: str
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    end_of_input: bool = False


@dataclass(frozen=True)
class WriterInfo:
    """What a stream's visible log holds of one writer (:meth:`StreamStore.writers`).

    Attributes:
        name: the writer.
        first_offset, last_offset: its first and last entry.
        watermark_ns: its highest watermark marker, or ``None``.
        ended_at: the offset of its first end-of-input marker, or ``None``.
    """

    name: str
    first_offset: int
    last_offset: int
    watermark_ns: int | None
    ended_at: int | None


@dataclass(frozen=True)
class PendingAppend:
    """A batch written by :meth:`StreamStore.write`, durable (and visible) once
    :meth:`StreamStore.commit` returns for it.

    Attributes:
        stream: the stream name.
        offset: the batch's offset.
        rows: the batch's row count.
    """

    stream: str
    offset: int
    rows: int
    _handle: StreamLog = dataclass_field(repr=False, compare=False)
    _epoch: int = dataclass_field(default=0, repr=False, compare=False)


class Staged:
    """A frame whose offset and file position are reserved but which is not in the file yet.

    A buffered frame is ``header`` + ``body`` (the serialized batch, not copied). A direct frame
    lives in ``aligned``, a page-aligned buffer whose byte ``prefix + k`` goes to file position
    ``position - head + k`` for ``k`` in ``[head, size)``: header, IPC message and zero padding
    up to a 4 KiB boundary. The bytes before ``prefix + head`` are scratch room (the IPC writer
    puts the schema message there). A direct frame is filled outside the stream lock: ``ready``
    tells a drain when it may be written, ``error`` that filling it failed.
    """

    __slots__ = (
        "aligned",
        "body",
        "error",
        "head",
        "header",
        "position",
        "prefix",
        "ready",
        "segment",
        "size",
    )

    def __init__(
        self,
        segment: Segment,
        position: int,
        header: bytes = b"",
        body: pa.Buffer | None = None,
        aligned: mmap.mmap | None = None,
        prefix: int = 0,
        head: int = 0,
        size: int = 0,
    ) -> None:
        self.segment = segment
        self.position = position
        self.header = header
        self.body = body
        self.aligned = aligned
        self.prefix = prefix
        self.head = head
        self.size = size
        self.ready = aligned is None
        self.error: BaseException | None = None

    @property
    def nbytes(self) -> int:
        if self.aligned is not None:
            return len(self.aligned)
        return self.body.size if self.body is not None else 0


class BufferPool:
    """Page-aligned buffers for direct frames, kept for reuse up to ``SPARE_BYTES`` in all
    (fresh anonymous memory costs a page fault per 4 KiB on first touch: more than the copy).
    Shared by the streams of a store; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: list[mmap.mmap] = []
        self._bytes = 0

    def take(self, size: int) -> mmap.mmap:
        """Return a page-aligned buffer of at least ``size`` bytes."""
        with self._lock:
            for i, buffer in enumerate(self._spare):
                if len(buffer) >= size:
                    self._bytes -= len(buffer)
                    return self._spare.pop(i)
        return mmap.mmap(-1, -(-size // (1 << 20)) * (1 << 20))  # unmapped when unreferenced

    def give_back(self, frames: list[Staged]) -> None:
        """Keep the buffers of written (or discarded) direct frames for reuse."""
        with self._lock:
            for frame in frames:
                aligned = frame.aligned
                if not frame.ready:
                    continue  # still being filled (a discarded frame): not reusable yet
                if aligned is not None and self._bytes + len(aligned) <= SPARE_BYTES:
                    self._spare.append(aligned)
                    self._bytes += len(aligned)
                frame.aligned = None

    def clear(self) -> None:
        with self._lock:
            self._spare.clear()
            self._bytes = 0


@dataclass
class LogSettings:
    """What every log of one store shares: the store's options and its buffer pool.

    ``direct_io`` turns itself off (for all streams) where the file system refuses
    ``O_DIRECT``.
    """

    data_dir: Path
    fsync: FsyncMode
    segment_bytes: int
    direct_io: bool
    buffers: BufferPool = dataclass_field(default_factory=BufferPool)


def _sync(fd: int) -> None:
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


def _sync_failure(name: str, exc: OSError) -> str:
    return f"stream {name!r} refuses writes after a failed fdatasync ({exc}); re-open the store"


#: What :meth:`StreamLog.plan` returns: per segment, the first and past-the-last frame index
#: and a buffer covering them.
Plan = list[tuple[Segment, int, int, pa.Buffer]]


class StreamLog:
    """In-memory state of one open stream incarnation, and its writes. Guarded by ``cond``'s
    lock.

    Lock order: the store's lock, then ``write_lock``, then ``sync_lock``, then ``cond``.
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        schema: pa.Schema,
        incarnation: str,
        created_at: datetime,
        settings: LogSettings,
    ) -> None:
        self.name = name
        self.directory = directory
        self.schema = schema
        self.incarnation = incarnation
        self.created_at = created_at
        self.settings = settings
        self.segments: list[Segment] = []
        # Visible (durable) batches: [first_offset, next_offset), num_rows and num_bytes of them.
        self.next_offset = 0
        self.num_rows = 0
        self.rows_removed = 0  # rows of the entries retention removed (all below first_offset)
        self.num_bytes = 0
        # Offsets [next_offset, written_offset) are reserved by write() (staged, or in the file
        # but not synced yet); written_rows/written_bytes count up to written_offset. A roll
        # appends a segment at once, but its file is created by the drain that first writes
        # to it, after syncing the segment before: a segment file exists only once every
        # earlier segment is durable (recovery checks CRCs in the last segment only).
        self.written_offset = 0
        self.written_rows = 0
        self.written_bytes = 0
        self.staged: list[Staged] = []  # in offset order; written to the file by drain()
        # Offsets [next_offset, in_file[0]) are in the segment files but not synced yet; the
        # rows and bytes up to in_file[0] (what a sync of the file makes visible).
        self.in_file = (0, 0, 0)
        self.staged_bytes = 0
        self.schema_bytes = 0  # length of the IPC schema message of ``schema`` (0: not known)
        self.fd: int | None = None  # write handle of fd_segment
        self.direct_fd: int | None = None  # O_DIRECT handle of fd_segment
        self.fd_segment: Segment | None = None  # the segment the drains write to
        self.dropped = False
        self.cond = threading.Condition(threading.Lock())
        # write_lock: held while staged frames go into the file (in offset order, one drain at
        # a time) and while the segment file handles change. sync_lock: held while the file is
        # synced and what the sync covers is published. A sync does not hold write_lock, so
        # the next frames reach the disk while it waits for the device (writes and syncs in
        # turn on one thread wrote at half the disk's speed here: benchmarks/README.md, doput).
        self.write_lock = threading.Lock()
        self.sync_lock = threading.Lock()
        self.failed: str | None = None  # why the stream refuses writes (a failed fdatasync)
        # A failed write discards every reserved offset and starts a new epoch; ends[e] is the
        # next_offset at which epoch e ended (a PendingAppend of epoch e below it is durable).
        self.epoch = 0
        self.epoch_ends: list[int] = []
        # Writers: id -> name (id 0 is ""), name -> id, and what the visible log holds of each
        # ([first_offset, last_offset, watermark_ns, ended_at]); writers_lock guards new ids.
        self.writer_names: list[str] = [""]
        self.writer_ids: dict[str, int] = {"": 0}
        self.writers_lock = threading.Lock()
        self.writer_state: dict[str, list[int | None]] = {}

    # --- what the log holds (cond held) ----------------------------------------------------------

    def writer_name(self, writer_id: int) -> str:
        names = self.writer_names
        return names[writer_id] if writer_id < len(names) else f"#{writer_id}"

    def locate(self, offset: int) -> tuple[Segment, int]:
        """Return the segment holding ``offset`` and the frame index inside it."""
        return locate(self.segments, offset)

    def note(self, start: int, stop: int) -> None:
        """Fold the entries ``[start, stop)`` into ``writer_state`` (cond held)."""
        offset = start
        while offset < stop:
            segment, index = self.locate(offset)
            last = min(segment.count, index + (stop - offset))
            for i in range(index, last):
                at = segment.first_offset + i
                name = self.writer_name(segment.writers[i])
                state = self.writer_state.get(name)
                if state is None:
                    state = self.writer_state[name] = [at, at, None, None]
                state[1] = at
                kind = segment.kinds[i]
                if kind == WATERMARK:
                    value = segment.values[i]
                    previous = state[2]
                    state[2] = value if previous is None else max(previous, value)
                elif kind == END and state[3] is None:
                    state[3] = at
            offset = segment.first_offset + last

    def publish(self, offset: int, rows: int, num_bytes: int) -> None:
        """Make the reserved batches below ``offset`` visible (cond held); wakes waiters."""
        if offset > self.next_offset:
            self.note(self.next_offset, offset)
            self.next_offset = offset
            self.num_rows = rows
            self.num_bytes = num_bytes
            self.cond.notify_all()

    def info(self) -> StreamInfo:
        return StreamInfo(
            name=self.name,
            schema=self.schema,
            incarnation=self.incarnation,
            first_offset=self.segments[0].first_offset if self.segments else 0,
            next_offset=self.next_offset,
            num_rows=self.num_rows,
            num_bytes=self.num_bytes,
            created_at=self.created_at,
        )

    def rows_before(self, offset: int) -> int:
        """Rows of every batch below ``offset``, the rows retention removed included (cond
        held)."""
        rows = self.rows_removed
        for segment in self.segments:
            if segment.first_offset >= offset:
                break
            rows += sum(segment.rows[: offset - segment.first_offset])
        return rows

    # --- reads ---------------------------------------------------------------------------------

    def plan(self, start: int, stop: int | None, incarnation: str | None) -> Plan:
        """What a read of offsets ``[start, stop)`` covers (cond held): clamped to
        ``[first_offset, next_offset)``, each segment's part with a buffer over it.

        Raises:
            StreamNotFoundError: ``incarnation`` is given and is not this one.
        """
        if incarnation is not None and self.incarnation != incarnation:
            raise StreamNotFoundError(
                f"stream {self.name!r} incarnation {incarnation} no longer exists"
            )
        first = self.segments[0].first_offset if self.segments else 0
        offset = max(start, first)
        end = self.next_offset if stop is None else min(stop, self.next_offset)
        plan: Plan = []
        while offset < end:
            segment, index = self.locate(offset)
            last = min(segment.count, index + (end - offset))
            buffer = segment.buffer_covering(segment.end(last))
            plan.append((segment, index, last, buffer))
            offset += last - index
        return plan

    @staticmethod
    def batches(schema: pa.Schema, plan: Plan) -> Iterator[tuple[int, pa.RecordBatch]]:
        """The ``(offset, batch)`` of the batches of ``plan`` (markers skipped)."""
        for segment, index, last, buffer in plan:
            kinds = segment.kinds
            for i in range(index, last):
                if kinds[i] != BATCH:
                    continue  # a marker: no rows
                message = buffer.slice(segment.positions[i], segment.lengths[i])
                yield segment.first_offset + i, pa.ipc.read_record_batch(message, schema)

    def entries(self, plan: Plan) -> Iterator[StreamEntry]:
        """Every entry of ``plan``, markers included, with its writer."""
        schema = self.schema
        for segment, index, last, buffer in plan:
            for i in range(index, last):
                offset = segment.first_offset + i
                writer = self.writer_name(segment.writers[i])
                kind = segment.kinds[i]
                if kind == WATERMARK:
                    yield StreamEntry(offset, writer, watermark_ns=segment.values[i])
                elif kind == END:
                    yield StreamEntry(offset, writer, end_of_input=True)
                else:
                    message = buffer.slice(segment.positions[i], segment.lengths[i])
                    yield StreamEntry(offset, writer, pa.ipc.read_record_batch(message, schema))

    # --- writes --------------------------------------------------------------------------------

    def writer_id(self, writer: str) -> int:
        """The id of ``writer`` in this stream; a new writer is appended to ``writers.jsonl``
        (and synced) first, so no durable frame names an unknown id."""
        writer_id = self.writer_ids.get(writer)
        if writer_id is not None:
            return writer_id
        with self.writers_lock:
            writer_id = self.writer_ids.get(writer)
            if writer_id is not None:
                return writer_id
            writer_id = len(self.writer_names)
            path = self.directory / WRITERS_FILE
            line = json.dumps({"id": writer_id, "writer": writer}) + "\n"
            do_sync = self.settings.fsync == "batch"
            try:
                created = not path.exists()
                with open(path, "ab") as f:
                    f.write(line.encode())
                    f.flush()
                    if do_sync:
                        os.fsync(f.fileno())
                if created and do_sync:
                    fsync_dir(self.directory)
            except OSError as exc:
                raise write_error(
                    f"cannot record writer {writer!r} of stream {self.name!r}: {exc}", exc
                ) from exc
            self.writer_names.append(writer)
            self.writer_ids[writer] = writer_id
            return writer_id

    def discarded(self, pending: PendingAppend) -> bool:
        """Whether a failed write discarded ``pending`` (cond held): it was reserved in an
        earlier epoch at or after the offset where that epoch ended."""
        return pending._epoch != self.epoch and pending.offset >= self.epoch_ends[pending._epoch]

    def reserve(
        self,
        size: int,
        num_rows: int,
        body: pa.Buffer | None,
        crc: int,
        writer_id: int = 0,
        kind: int = BATCH,
        value: int = 0,
        *,
        after: PendingAppend | None = None,
    ) -> tuple[PendingAppend, Staged, bool] | None:
        """Reserve an offset and a file position for an IPC message of ``size`` bytes, rolling
        the segment if needed, and stage the frame: ``body`` with its ``crc``, or
        (``body=None``) a direct frame that the caller must :meth:`fill`; refused if ``after``
        was discarded (see :meth:`StreamStore.write`).

        Returns the pending append, the staged frame and whether the caller should drain now
        (``fsync="never"``, or too much staged); ``None`` if the stream was dropped.
        """
        settings = self.settings
        frame_bytes = HEADER.size + size
        with self.cond:
            if self.dropped:
                return None
            if self.failed is not None:
                raise StorageError(self.failed)
            if after is not None and (after._handle is not self or self.discarded(after)):
                raise StorageError(
                    f"stream {self.name!r}: the batch at offset {after.offset} before this one "
                    "was discarded (a failed write, or the stream was dropped); nothing after "
                    "it is written"
                )
            segment = self.segments[-1]
            if segment.size > 0 and segment.size + frame_bytes > settings.segment_bytes:
                first = self.written_offset  # roll: the next drain creates the file
                segment = Segment(self.directory / segment_name(first), first, created=False)
                self.segments.append(segment)
            position = segment.size
            if body is None:
                if self.schema_bytes == 0:
                    self.schema_bytes = schema_message_bytes(self.schema)
                pad = -(position + frame_bytes) % ALIGN
                head = position % ALIGN  # where the frame starts inside its first page
                prefix = -(-self.schema_bytes // ALIGN) * ALIGN  # room for the schema message
                end = head + frame_bytes + pad  # a multiple of ALIGN
                aligned = settings.buffers.take(prefix + end + 8)  # + the end-of-stream marker
                frame = Staged(
                    segment, position, aligned=aligned, prefix=prefix, head=head, size=end
                )
            else:
                pad = 0
                header = HEADER.pack(FRAME_MAGIC, size, num_rows, crc, writer_id, kind)
                frame = Staged(segment, position, header, body)
            self.staged.append(frame)
            self.staged_bytes += frame.nbytes
            segment.append(position + HEADER.size, size + pad, num_rows, writer_id, kind, value)
            offset = self.written_offset
            self.written_offset += 1
            self.written_rows += num_rows
            self.written_bytes += size + pad
            pending = PendingAppend(self.name, offset, num_rows, self, self.epoch)
            drain = settings.fsync != "batch" or self.staged_bytes > MAX_STAGED_BYTES
            return pending, frame, drain

    def fill(self, frame: Staged, batch: pa.RecordBatch, size: int, writer_id: int) -> None:
        """Encode ``batch`` (an IPC message of ``size`` bytes) straight into a direct frame's
        aligned buffer, then checksum it, outside the stream lock; mark the frame ready."""
        try:
            assert frame.aligned is not None
            view = memoryview(frame.aligned)
            start = frame.prefix + frame.head + HEADER.size
            end = frame.prefix + frame.size
            # An IPC stream writer puts the schema message in the scratch room before ``start``
            # and the record batch message at ``start``: the same bytes as batch.serialize(),
            # without a copy. Its end-of-stream marker lands in the padding, zeroed below.
            scratch = start - self.schema_bytes
            sink = pa.FixedSizeBufferWriter(pa.py_buffer(view[scratch : start + size + 8]))
            with pa.ipc.new_stream(sink, self.schema) as writer:
                writer.write_batch(batch)
            if (
                sink.tell() != self.schema_bytes + size + 8
                or view[start : start + 4] != IPC_CONTINUATION
            ):
                raise StorageError(
                    f"IPC stream writer produced {sink.tell()} bytes, expected "
                    f"{self.schema_bytes} + {size} + 8"
                )
            view[start + size : end] = ZEROS[: end - start - size]
            crc = crc32(view[start:end])
            view[start - HEADER.size : start] = HEADER.pack(
                FRAME_MAGIC, end - start, batch.num_rows, crc, writer_id, BATCH
            )
            del view
        except BaseException as exc:
            with self.cond:
                frame.error = exc
                frame.ready = True
                self.cond.notify_all()
            raise
        with self.cond:
            frame.ready = True
            self.cond.notify_all()

    def stage(self, reserved: tuple[PendingAppend, Staged, bool]) -> PendingAppend:
        """The pending append of a :meth:`reserve` result, putting the staged frames in the
        file when it asks for that (``fsync="never"``, or too much staged)."""
        pending, _, drain = reserved
        if drain:
            self.drain(publish=self.settings.fsync != "batch")
        return pending

    def committed(self, pending: PendingAppend) -> bool:
        """Whether ``pending`` is durable and visible (cond held); raise if it never will be."""
        if self.discarded(pending):
            raise StorageError(
                f"batch {pending.offset} of stream {self.name!r} was discarded: "
                "a write to the stream failed before it was durable"
            )
        if self.next_offset > pending.offset:
            return True
        if self.dropped:
            raise StreamNotFoundError(
                f"stream {self.name!r} was dropped before batch {pending.offset} was durable"
            )
        if self.failed is not None:
            raise StorageError(self.failed)
        return False

    def commit(self, pending: PendingAppend) -> None:
        """Wait until ``pending`` is durable (see :meth:`StreamStore.commit`): drain and sync
        unless an earlier or concurrent drain covered it. A frame already in the file is only
        synced (the frames staged after it are left to whoever writes them)."""
        while True:
            with self.cond:
                if self.committed(pending):
                    return
                in_file = self.in_file[0] > pending.offset
            self.drain(publish=True, write=not in_file)

    def drain(self, *, publish: bool, write: bool = True) -> None:
        """Write the staged frames to the file (unless ``write`` is false); with ``publish``,
        also sync the file (``fsync="batch"``) and make every frame in it visible.

        Called without locks. The frames reach the file in offset order, one drain at a time
        (``write_lock``), while other threads go on staging frames; the sync holds
        ``sync_lock`` only, so another drain may write the next frames meanwhile. A sync
        publishes what was in the file when it began (``fdatasync`` covers every write that
        completed before it), and nothing if a failed write discarded it meanwhile (the epoch
        moved on) or the stream was dropped.
        """
        with self.write_lock:
            if write:
                self._write_out()
            if not publish:
                return
            with self.cond:
                if self.dropped or self.failed is not None:
                    return
                target, epoch = self.in_file, self.epoch
                if target[0] <= self.next_offset:
                    return  # nothing new in the file: an earlier or concurrent sync covered it
                if self.settings.fsync != "batch":
                    self.publish(*target)
                    return
            # The sync runs without write_lock, on a handle of its own: a roll meanwhile
            # closes self.fd (after syncing that segment itself).
            assert self.fd is not None
            fd = os.dup(self.fd)
            # Taken before write_lock is let go, so retention (which takes both) never runs
            # between reading ``target`` and publishing it.
            self.sync_lock.acquire()
        try:
            try:
                _sync(fd)
            except OSError as exc:
                with self.cond:
                    self.failed = _sync_failure(self.name, exc)
                raise StorageError(self.failed) from exc
            with self.cond:
                if self.epoch == epoch and not self.dropped and self.failed is None:
                    self.publish(*target)
        finally:
            self.sync_lock.release()
            os.close(fd)

    def _write_out(self) -> None:
        """Put every staged frame in the file (``write_lock`` held); after a failed write,
        discard every offset not yet durable and raise StorageError."""
        with self.cond:
            if self.dropped or self.failed is not None:
                return
            frames, self.staged, self.staged_bytes = self.staged, [], 0
            target = (self.written_offset, self.written_rows, self.written_bytes)
        if not frames:
            return
        try:
            for frame in frames:
                if not frame.ready:  # a direct frame still being filled by its writer
                    with self.cond:
                        self.cond.wait_for(lambda frame=frame: frame.ready)  # type: ignore[misc]
                if frame.error is not None:
                    raise OSError(errno.EIO, f"encoding the batch failed: {frame.error}")
                if frame.segment is not self.fd_segment or self.fd is None:
                    self._open_segment(frame.segment)
                self._write_staged(frame)
        except OSError as exc:
            with self.cond:
                self._discard_reserved(frames)
            raise write_error(f"cannot append to stream {self.name!r}: {exc}", exc) from exc
        with self.cond:
            self.settings.buffers.give_back(frames)
            self.in_file = target

    def _open_segment(self, segment: Segment) -> None:
        """Point the drains at ``segment`` (``write_lock`` held): sync and close the segment
        written so far, then create ``segment``'s file if it is new, and open it."""
        do_sync = self.settings.fsync == "batch"
        if self.fd is not None and self.fd_segment is not segment:
            if do_sync:
                _sync(self.fd)  # an OSError here is a failed write: nothing is published
            self.close_fd()
        if not segment.created:
            write_file(segment.path, b"", fsync=do_sync)
            if do_sync:
                fsync_dir(self.directory)
            segment.created = True
        if self.fd is None:
            self.fd = os.open(segment.path, os.O_WRONLY)
            self.fd_segment = segment

    def _write_staged(self, frame: Staged) -> None:
        """Put one staged frame in the segment file (``write_lock`` held)."""
        assert self.fd is not None
        if frame.aligned is None:
            assert frame.body is not None
            pwrite_all(self.fd, frame.header, frame.position)
            pwrite_all(self.fd, memoryview(frame.body), frame.position + HEADER.size)
            return
        view = memoryview(frame.aligned)[frame.prefix :]
        base = frame.position - frame.head
        first = 0
        if frame.head:  # the rest of a page that earlier frames began: through the page cache
            pwrite_all(self.fd, view[frame.head : ALIGN], frame.position)
            first = ALIGN
        settings = self.settings
        if first < frame.size and settings.direct_io:
            try:
                if self.direct_fd is None:
                    flags = os.O_WRONLY | getattr(os, "O_DIRECT", 0)
                    self.direct_fd = os.open(frame.segment.path, flags)
                written = os.pwrite(self.direct_fd, view[first : frame.size], base + first)
                if written != frame.size - first:  # short: finish through the page cache
                    pwrite_all(self.fd, view[first + written : frame.size], base + first + written)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                settings.direct_io = False
                log.warning(
                    "O_DIRECT writes unavailable, using the page cache",
                    extra={"data_dir": str(settings.data_dir), "error": str(exc)},
                )
        pwrite_all(self.fd, view[first : frame.size], base + first)

    def _discard_reserved(self, frames: list[Staged]) -> None:
        """After a failed write (cond held): cut the file back to its durable frames and
        discard every offset reserved after them; their commits raise StorageError."""
        while len(self.segments) > 1 and self.segments[-1].first_offset >= self.next_offset:
            dropped = self.segments.pop()  # holds reserved frames only
            if dropped is self.fd_segment:
                self.close_fd()
            if dropped.created:
                with contextlib.suppress(OSError):
                    dropped.path.unlink()
        segment = self.segments[-1]
        keep = self.next_offset - segment.first_offset
        if segment.created:
            with contextlib.suppress(OSError):
                os.truncate(segment.path, segment.end(keep))
        segment.truncate(keep)
        self.settings.buffers.give_back(frames + self.staged)
        self.staged, self.staged_bytes = [], 0
        self.written_offset = self.next_offset
        self.written_rows = self.num_rows
        self.written_bytes = self.num_bytes
        self.in_file = (self.next_offset, self.num_rows, self.num_bytes)
        self.epoch_ends.append(self.next_offset)
        self.epoch += 1

    def retire(self) -> None:
        """Mark the stream dropped (a drop, or the store closing) and close its files; staged
        frames are made durable first, so their commits succeed rather than fail."""
        with contextlib.suppress(StorageError):
            self.drain(publish=True)
        with self.write_lock, self.sync_lock, self.cond:  # no drain in progress
            self.dropped = True
            self.close_fd()
            self.cond.notify_all()

    def retire_if_empty(self) -> bool:
        """:meth:`retire` the stream if it holds no entry and none is reserved (nothing was
        ever written to it, or every write was discarded); return whether it did. Atomic with
        :meth:`reserve`: a write that comes after finds the stream dropped (its caller retries
        on a new incarnation, see :meth:`StreamStore.write`), one before is never dropped."""
        with self.write_lock, self.sync_lock, self.cond:
            if self.dropped or self.written_offset or self.next_offset or self.staged:
                return False
            self.dropped = True
            self.close_fd()
            self.cond.notify_all()
            return True

    def close_fd(self) -> None:
        for fd in (self.fd, self.direct_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.direct_fd = None
        self.fd_segment = None
