"""Durable, append-only, offset-addressed streams of Arrow record batches (DESIGN §3).

A **stream** is a named log of record batches that share one schema. Offsets are sequence
numbers of its entries (batches, and the markers of its writers, below): the first entry ever
appended has offset 0, the next 1, and so on; an offset is never reused within one *incarnation*
of a stream (a dropped and re-created stream is a new incarnation, with a new UUID).

On-disk layout (``data_dir/streams/<name>/``)::

    stream.json                  {"format": 1, "name", "incarnation", "created_at"}
    schema.arrow                 the stream schema, ``pa.Schema.serialize()`` bytes, written once
    writers.jsonl                {"id": <int>, "writer": "<name>"} per writer, appended (and
                                 synced) before the writer's first frame is staged
    retention.json               {"first_offset", "rows_removed"} once retention removed
                                 segments: written (and synced) before their files go
    00000000000000000000.seg     segment: frames for offsets 0, 1, ...
    00000000000000012345.seg     the next segment starts at offset 12345 (its file name)

A segment is a sequence of frames; a frame is a 32-byte header and a body::

    magic b"FSF2" | body_len u64 | num_rows u64 | crc32(body) u32 | writer id u32 | kind u8 |
    3 zero bytes | body (body_len bytes)                                (integers little-endian)

Every frame is one **entry** of the log with its own offset, written by one **writer** (a DoPut
writer: a watermark partition of the pipelines reading the stream; ``""`` is the unnamed
writer). ``kind`` 0 is a batch: the body is one encapsulated Arrow IPC record-batch message (the
bytes of ``pa.RecordBatch.serialize()``), possibly followed by zero padding (fewer than 4096
bytes) that the length and CRC include and readers ignore. ``kind`` 1 is a watermark marker (the
body is the watermark, i64 ns since the epoch), 2 an end-of-input marker (empty body). Markers
have no rows: :meth:`StreamStore.read` skips them, :meth:`StreamStore.entries` yields them.
Frames of format 1 (magic ``b"FSF1"``, a 24-byte header without writer id and kind) are still
read, as batches of the unnamed writer.

A segment is rolled (a new file started) once it would grow past ``segment_bytes`` (64 MiB by
default). A stream directory is staged in ``data_dir/streams-staging/`` and renamed into place,
so a stream either exists completely or not at all; a drop renames it to
``data_dir/streams-trash/`` before deleting it.

Durability: with ``fsync="batch"`` (the default) a batch becomes visible (to :meth:`read`,
:meth:`info`, :meth:`wait_for`) and :meth:`StreamStore.append` returns only after its frame is
written and ``fdatasync``-ed, so an acknowledged batch survives a crash and no reader ever sees a
batch that a crash could take back (an offset is never served with two different batches).
``fdatasync`` is enough for an append: it also flushes the metadata needed to read the data back,
the file size included (POSIX "synchronized I/O data integrity completion"; Linux fdatasync(2):
"a change to the file size ... would require a metadata flush"). With ``fsync="never"`` a batch is
visible once written and the OS decides when data reaches the disk.

Group commit: :meth:`StreamStore.write` reserves the next offset and file position and stages
the frame in memory; :meth:`StreamStore.commit` waits until it is durable. The first commit to
come writes every staged frame of the stream (in offset order, ``pwrite`` at its reserved
position) and runs one ``fdatasync`` for every frame in the file, while writers go on staging: a
DoPut or several concurrent appenders share syncs. :meth:`StreamStore.flush` puts staged frames
in the file without syncing; a sync holds no lock that writing needs, so frames go on reaching
the disk while a sync waits for the device (a DoPut writes, flushes and commits on three
threads). A sync makes visible only what was in the file when it began. A
segment roll only reserves positions in the next segment; the drain that first writes to it
syncs the old segment before creating the new file, so a segment file exists only once every
earlier one is durable (recovery checks CRCs in the last segment only).

Large frames (an IPC message of 1 MiB or more, with ``fsync="batch"``) are encoded straight into
a page-aligned buffer and written with ``O_DIRECT``: the device reads them from that buffer, with
no copy into the page cache (which costs more CPU than encoding the batch, and makes the later
``fdatasync`` write it all out anyway). Their body is padded with zeros so that the frame ends on
a 4 KiB boundary; the part of a frame before its first page boundary is written through the page
cache. Where the file system refuses ``O_DIRECT`` (tmpfs) the same bytes go through the page cache.
``fdatasync`` is still what makes a frame durable (the device's write cache and the file size).

Failures: a failed write cuts the file back to its durable frames and discards every offset
reserved after them (their commits raise :class:`~flight_serve.errors.StorageError`); the
stream goes on from there. A failed ``fdatasync`` leaves the frames it covered in an unknown
state (the kernel may have dropped the dirty pages), so the stream then refuses writes until
the store is re-opened, which re-checks the tail.

Recovery: on open, every segment's frame headers are checked (magic, length inside the file,
segment first offsets contiguous) and the frame bodies of each stream's *last* segment -- the
only one a crash can leave half-written -- are checked against their CRC32. The log ends at the
first bad frame: the segment is truncated there and any later segment is deleted (logged as a
warning with the number of bytes dropped). A torn tail is never served and never makes the
stream unreadable.

Retention (``retention_bytes``, ``retention_age``; :meth:`StreamStore.enforce_retention`)
removes whole, closed segments of a stream, oldest first, while its segment files exceed the
byte limit or while the oldest one's newest entry (the file's mtime) is older than the age; the
segment being written is never removed. ``first_offset`` moves up to the first retained entry
(recovery starts a stream at its first segment file's name), and reads clamp to it.

Reads memory-map segment files and decode batches with ``pa.ipc.read_record_batch`` without
copying: a returned batch's buffers point into the mapping (which stays valid, even after a
drop, for as long as the batch is referenced).

Dictionary-encoded columns (at any nesting depth) are decoded to their plain value type on
append, so the stream schema never contains a dictionary type and every frame is
self-contained (no dictionary batches in the log). View types are stored as their plain types
the same way (``string_view`` as ``string``, ``binary_view`` as ``binary``, ``list_view`` /
``large_list_view`` as ``list`` / ``large_list``; what polars 2.x sends): a stream schema never
holds a view type.

Schema rule for appends: a batch matches the stream when it has the same field names (in any
order) with the same types after that decoding, where a type may differ from the stream's in
offset width only (``large_string`` for ``string``, ``large_binary`` for ``binary``,
``large_list`` for ``list`` and back, at any depth; see :func:`same_values`): such a column is
cast to the stream's type. A batch field may be nullable where the stream's is not as long as
the batch holds no nulls in it. Matching batches are stored in the stream's field order with the
stream's field metadata. Anything else raises :class:`~flight_serve.errors.SchemaMismatchError`
naming each missing, unexpected and retyped field.

One process at a time owns a data directory: :class:`StreamStore` takes an exclusive
``flock`` on ``data_dir/streams.lock`` and raises :class:`~flight_serve.errors.StorageError`
if another store (in this or another process) holds it.

Modules: :mod:`~flight_serve.store.names` (stream and writer names),
:mod:`~flight_serve.store.schema` (the schema rule), :mod:`~flight_serve.store.frames` (the
on-disk format), :mod:`~flight_serve.store.segment` (a segment's frame index),
:mod:`~flight_serve.store.log` (one stream's log: staging, group commit, writes),
:mod:`~flight_serve.store.recovery` (opening a stream directory),
:mod:`~flight_serve.store.retention`; this one is the data-directory facade.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Self, cast

import pyarrow as pa

from flight_serve._arrow import plain_batch, plain_schema, to_plain
from flight_serve._fs import fsync_dir, write_file
from flight_serve.errors import (
    AlreadyExistsError,
    InvalidInputError,
    SchemaMismatchError,
    StorageError,
    StreamNotFoundError,
    write_error,
)
from flight_serve.store import recovery
from flight_serve.store.frames import (
    DIRECT_MIN_BYTES,
    END,
    FORMAT,
    META_FILE,
    SCHEMA_FILE,
    VALUE,
    WATERMARK,
    crc32,
    segment_name,
)
from flight_serve.store.log import (
    FsyncMode,
    LogSettings,
    PendingAppend,
    StreamEntry,
    StreamInfo,
    StreamLog,
    WriterInfo,
)
from flight_serve.store.names import (
    STREAM_NAME_PATTERN,
    WRITER_NAME_PATTERN,
    validate_stream_name,
    validate_writer_name,
)
from flight_serve.store.retention import retain
from flight_serve.store.schema import (
    check_batch,
    conform,
    describe_mismatch,
    fits_as_is,
    same_values,
)
from flight_serve.store.segment import Segment
from flight_serve.types import plain_type, rewrite_type

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "STREAM_NAME_PATTERN",
    "WRITER_NAME_PATTERN",
    "FsyncMode",
    "PendingAppend",
    "StreamEntry",
    "StreamInfo",
    "StreamStore",
    "WriterBusyError",
    "WriterHold",
    "WriterInfo",
    "check_batch",
    "data_dir_holder",
    "plain_type",
    "rewrite_type",
    "same_values",
    "to_plain",
    "validate_stream_name",
    "validate_writer_name",
]

log = logging.getLogger(__name__)

#: A segment is rolled once it would grow past this many bytes.
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


class WriterBusyError(AlreadyExistsError):
    """A second live writer of a stream under a writer name another one holds
    (:meth:`StreamStore.hold_writer`); the message names the stream, the writer and the holder."""


class WriterHold:
    """One live writer's hold on ``(stream, writer)`` (:meth:`StreamStore.hold_writer`);
    :meth:`release` (idempotent) lets the next writer of that name in.

    Attributes:
        stream, writer: what is held.
        holder: who holds it (for messages: ``"pipeline hourly-3f2a9c1e"``, ``"a DoPut from
            ipv4:127.0.0.1:50312 since 2026-12-01T23:40:00+00:00"``).
    """

    def __init__(self, store: StreamStore, stream: str, writer: str, holder: str) -> None:
        self.stream = stream
        self.writer = writer
        self.holder = holder
        self._store = store
        self._released = False

    def release(self) -> None:
        """Let go of the writer name (idempotent)."""
        if not self._released:
            self._released = True
            self._store._release_writer(self)


def data_dir_holder(data_dir: Path) -> str | None:
    """Who holds ``data_dir`` (a :class:`StreamStore` open on it: a ``flight-serve serve``, in
    this or another process) as ``"process <pid>"``; ``None`` when nobody does.

    It tries the store's ``flock`` on ``data_dir/streams.lock`` without waiting and lets go at
    once; a directory without that file is held by nobody.
    """
    path = Path(data_dir) / "streams.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return f"process {pid}" if pid.isdigit() else "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class StreamStore:
    """The streams of one data directory. Thread-safe: appends, reads and waits may run on
    different threads at once.

    Args:
        data_dir: root directory; streams live under ``data_dir/streams/`` (created if missing).
        fsync: ``"batch"`` -- :meth:`append` returns after the frame is fdatasync-ed (default);
            ``"never"`` -- leave flushing to the OS (fast, loses recent batches on a crash).
        segment_bytes: roll to a new segment file once the current one would exceed this many
            bytes (64 MiB by default; a single larger frame still gets a segment of its own).
        direct_io: with ``fsync="batch"``, write frames of 1 MiB and more with ``O_DIRECT``
            (no copy into the page cache; see the module docstring). Turned off by itself where
            the file system refuses it.
        retention_bytes: keep each stream's segment files (frame headers included) at most
            this many bytes in all, by removing its oldest closed segments (``None``: no limit).
        retention_age: remove a closed segment once its newest entry was written longer ago
            than this (``None``: no limit). See :meth:`enforce_retention`.

    Raises:
        StorageError: the directory cannot be created or is already owned by another store.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, StreamStore(Path(d)) as store:
    ...     store.append("t", pa.record_batch({"x": [1, 2]}))
    ...     store.append("t", pa.record_batch({"x": [3]}))
    ...     [(o, b.num_rows) for o, b in store.read("t")]
    0
    1
    [(0, 2), (1, 1)]
    """

    def __init__(
        self,
        data_dir: Path,
        fsync: FsyncMode = "batch",
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        direct_io: bool = True,
        retention_bytes: int | None = None,
        retention_age: timedelta | None = None,
    ) -> None:
        if fsync not in ("batch", "never"):
            raise ValueError(f"fsync must be 'batch' or 'never', not {fsync!r}")
        if retention_bytes is not None and retention_bytes < 0:
            raise ValueError(f"retention_bytes must be >= 0, not {retention_bytes}")
        if retention_age is not None and retention_age < timedelta(0):
            raise ValueError(f"retention_age must be >= 0, not {retention_age}")
        self.retention_bytes = retention_bytes
        self.retention_age = retention_age
        self.data_dir = Path(data_dir)
        self._settings = LogSettings(self.data_dir, fsync, segment_bytes, direct_io)
        self._root = self.data_dir / "streams"
        self._staging = self.data_dir / "streams-staging"
        self._trash = self.data_dir / "streams-trash"
        self._lock = threading.Lock()
        self._streams: dict[str, StreamLog] = {}
        self._holds: dict[tuple[str, str], WriterHold] = {}
        self._closed = False
        try:
            for directory in (self._root, self._staging, self._trash):
                directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.data_dir / "streams.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot open data dir {self.data_dir}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            holder = data_dir_holder(self.data_dir)
            raise StorageError(
                f"data dir {self.data_dir} is in use by another stream store (streams.lock"
                f"{f', {holder}' if holder else ''})"
            ) from exc
        with contextlib.suppress(OSError):  # who holds it, for the refusals' messages
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        for leftover in (*self._staging.iterdir(), *self._trash.iterdir()):
            shutil.rmtree(leftover, ignore_errors=True)
        for directory in sorted(self._root.iterdir()):
            if directory.is_dir():
                stream = recovery.load(directory, self._settings)
                if stream is not None:
                    self._streams[stream.name] = stream
        if retention_bytes is not None or retention_age is not None:
            self.enforce_retention()

    @property
    def fsync(self) -> FsyncMode:
        """``"batch"`` or ``"never"`` (see the class docstring)."""
        return self._settings.fsync

    @property
    def segment_bytes(self) -> int:
        """The size past which a segment is rolled."""
        return self._settings.segment_bytes

    @property
    def direct_io(self) -> bool:
        """Whether large frames are written with ``O_DIRECT`` (turned off by itself where the
        file system refuses it)."""
        return self._settings.direct_io

    @direct_io.setter
    def direct_io(self, value: bool) -> None:
        self._settings.direct_io = value

    # --- live writers ------------------------------------------------------------------------

    def hold_writer(self, stream: str, writer: str, holder: str) -> WriterHold:
        """Register ``holder`` as the one live writer of ``stream`` under the name ``writer``
        until it releases the returned hold: a DoPut call for as long as it runs, a server
        pipeline's stream sink for as long as the pipeline runs. Two live writers under one
        name would put every result in the stream twice as one watermark partition, so the
        second is refused (the store itself never refuses an :meth:`append` it is given).

        Raises:
            WriterBusyError: another live writer holds that name (the message names the stream,
                the writer and who holds it).
        """
        key = (stream, writer)
        with self._lock:
            held = self._holds.get(key)
            if held is not None:
                raise WriterBusyError(
                    f"stream {stream!r}: writer {writer!r} is already being written by "
                    f"{held.holder}; one writer name has one live writer at a time (give this "
                    "writer another name, or stop the other one first)"
                )
            hold = self._holds[key] = WriterHold(self, stream, writer, holder)
        return hold

    def writer_holder(self, stream: str, writer: str) -> str | None:
        """Who holds ``writer`` of ``stream`` now (:meth:`hold_writer`), or ``None``."""
        with self._lock:
            held = self._holds.get((stream, writer))
        return held.holder if held is not None else None

    def _release_writer(self, hold: WriterHold) -> None:
        with self._lock:
            if self._holds.get((hold.stream, hold.writer)) is hold:
                del self._holds[(hold.stream, hold.writer)]

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close every file handle and release the data directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.retire()  # wakes waiters: the store is gone for them
        self._settings.buffers.clear()
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- public API --------------------------------------------------------------------------

    def create(self, name: str, schema: pa.Schema) -> StreamInfo:
        """Create stream ``name`` with ``schema`` (dictionary types decoded) if it is missing.

        Returns the stream's info. Creating an existing stream with a matching schema is a no-op.

        Raises:
            StreamNameError: ``name`` is not a valid stream name.
            SchemaMismatchError: the stream exists with a different schema (the message names
                each missing, unexpected and retyped field).
            StorageError: the stream directory could not be written.
        """
        return self.create_if_missing(name, schema)[0]

    def create_if_missing(self, name: str, schema: pa.Schema) -> tuple[StreamInfo, bool]:
        """:meth:`create`, also saying whether this call created the stream (``False``: it
        existed, with a matching schema). Raises what :meth:`create` raises."""
        plain = plain_schema(schema)
        stream, created = self._open_or_create(name, plain)
        problem = describe_mismatch(name, stream.schema, plain)
        if problem is not None:
            raise SchemaMismatchError(problem)
        with stream.cond:
            return stream.info(), created

    def append(self, name: str, batch: pa.RecordBatch, *, writer: str = "") -> int:
        """Append ``batch`` to stream ``name`` and return its offset.

        The stream is created with the batch's schema on the first append. Empty batches are
        stored (and get an offset) like any other. Returns only after the frame is written, and
        fdatasync-ed when ``fsync="batch"``: ``commit(write(name, batch))``.

        Raises:
            StreamNameError: ``name`` is not a valid stream name.
            SchemaMismatchError: the batch does not match the stream schema; the message names
                each missing, unexpected and retyped field. Nothing is written.
            StorageError: the write or the sync failed (a partial frame is cut off again).
        """
        return self.commit(self.write(name, batch, writer=writer))

    def write(
        self,
        name: str,
        batch: pa.RecordBatch,
        *,
        writer: str = "",
        after: PendingAppend | None = None,
    ) -> PendingAppend:
        """Reserve the next offset of stream ``name`` for ``batch`` without waiting for the disk.

        Like :meth:`append` (same stream creation, schema rule and errors), but with
        ``fsync="batch"`` the frame is only staged: the next :meth:`commit` of the stream puts
        it in the file and syncs it, and only then is the batch visible to readers. With
        ``fsync="never"`` the frame is in the file and visible when this returns. Offsets are
        assigned in call order. ``writer`` is recorded with the batch (see the module docstring).

        A staged frame is made durable by the stream's next commit, whoever calls it: a caller
        that stages several frames must not give up on them. ``after`` (the caller's previous
        pending append to this stream) keeps a caller's frames a prefix of what it wrote: the
        frame is staged only if no failed write discarded ``after`` since (a discard starts a
        new epoch of reserved offsets, see :meth:`commit`), so nothing of the caller's lands
        after a gap.

        Raises:
            InvalidInputError: an invalid writer name (and what :meth:`append` raises).
            StorageError: ``after`` was discarded by a failed write (nothing is staged).
        """
        validate_stream_name(name)
        validate_writer_name(writer)
        plain: pa.RecordBatch | None = None
        while True:
            stream = self._lookup(name)
            if stream is not None and fits_as_is(stream.schema, batch):
                conformed = batch  # what plain_batch and conform would return
            else:
                if plain is None:
                    plain = plain_batch(batch)
                stream = self._get_or_create(name, plain.schema)
                conformed = conform(name, stream.schema, plain)
            writer_id = stream.writer_id(writer)
            if self.direct_io and self.fsync == "batch" and conformed.nbytes >= DIRECT_MIN_BYTES:
                size = pa.ipc.get_record_batch_size(conformed)
                reserved = stream.reserve(size, conformed.num_rows, None, 0, writer_id, after=after)
                if reserved is not None:
                    stream.fill(reserved[1], conformed, size, writer_id)
            else:
                body = conformed.serialize()
                crc = crc32(memoryview(body))  # outside the lock (releases the GIL)
                reserved = stream.reserve(
                    body.size, conformed.num_rows, body, crc, writer_id, after=after
                )
            if reserved is not None:
                return stream.stage(reserved)
            self._check_open()  # dropped between lookup and write: a new incarnation, retry

    def write_marker(
        self,
        name: str,
        writer: str,
        *,
        watermark_ns: int | None = None,
        end_of_input: bool = False,
        after: PendingAppend | None = None,
    ) -> PendingAppend:
        """Reserve the next offset of stream ``name`` for a marker of ``writer`` (an entry with
        no rows): a watermark (``watermark_ns``) or the writer's end of input; durable and
        visible once :meth:`commit` returns for it (see :meth:`write`, also for ``after``).

        End of input is idempotent: when ``writer``'s end of input is already in the visible log,
        nothing is written and the pending append names that first marker's offset (a client
        that lost the PutResult of its end of input and sends it again stores it once, so a
        pipeline that finished on the first one has read the whole stream).

        Raises:
            StreamNotFoundError: the stream does not exist.
            InvalidInputError: an invalid writer name, or not exactly one kind of marker.
            StorageError: as :meth:`append`; ``after`` was discarded by a failed write.
        """
        validate_writer_name(writer)
        if (watermark_ns is None) == (not end_of_input):
            raise InvalidInputError("a marker is a watermark or an end of input, exactly one")
        if end_of_input:
            kind, value, body = END, 0, pa.py_buffer(b"")
        else:
            assert watermark_ns is not None
            kind, value = WATERMARK, watermark_ns
            body = pa.py_buffer(VALUE.pack(watermark_ns))
        crc = crc32(memoryview(body))
        while True:
            stream = self._get(name)
            if end_of_input:
                with stream.cond:
                    state = stream.writer_state.get(writer)
                    ended_at = None if state is None else state[3]
                    if ended_at is not None:
                        return PendingAppend(name, ended_at, 0, stream, stream.epoch)
            writer_id = stream.writer_id(writer)
            reserved = stream.reserve(body.size, 0, body, crc, writer_id, kind, value, after=after)
            if reserved is not None:
                return stream.stage(reserved)
            self._check_open()  # dropped between lookup and write: a new incarnation, retry

    def append_marker(
        self,
        name: str,
        writer: str,
        *,
        watermark_ns: int | None = None,
        end_of_input: bool = False,
    ) -> int:
        """:meth:`write_marker` and :meth:`commit`: the marker's offset, once it is durable."""
        return self.commit(
            self.write_marker(name, writer, watermark_ns=watermark_ns, end_of_input=end_of_input)
        )

    def flush(self, pending: PendingAppend) -> None:
        """Put the frame ``pending`` names, and every frame staged before it, in the segment
        file without syncing it (nothing becomes visible): the :meth:`commit` that follows then
        only syncs. A caller that writes on one thread, flushes on a second and commits on a
        third keeps the disk writing while a sync waits for the device (DoPut does).

        Raises:
            StorageError: writing failed (every batch not yet durable is discarded, as in
                :meth:`commit`, whose call for ``pending`` then raises too).
        """
        stream = pending._handle
        with stream.cond:
            if stream.in_file[0] > pending.offset or stream.discarded(pending):
                return
        stream.drain(publish=False)

    def commit(self, pending: PendingAppend) -> int:
        """Wait until the batch ``pending`` names is durable (and so visible); return its offset.

        Group commit: the first caller writes every staged frame of the stream and runs one
        ``fdatasync`` for all of them; a commit whose batch an earlier or concurrent sync
        covered returns without syncing.

        Raises:
            StreamNotFoundError: the stream was dropped (or the store closed) before the batch
                was durable.
            StorageError: writing or syncing failed. After a failed write every batch not yet
                durable is discarded and the stream goes on; after a failed sync the stream
                refuses writes until the store is re-opened.
        """
        stream = pending._handle
        stream.commit(pending)
        if (self.retention_bytes is not None or self.retention_age is not None) and len(
            stream.segments
        ) > 1:
            retain(stream, self.retention_bytes, self.retention_age, datetime.now(UTC))
        return pending.offset

    def enforce_retention(self, now: datetime | None = None) -> dict[str, int]:
        """Apply the store's retention limits to every stream; return the number of segments
        removed per stream (streams that lost none are left out).

        Only whole, closed segments (never the one being written) are removed, oldest first,
        while the stream's segment files hold more than ``retention_bytes`` or while the
        oldest segment's newest entry (its file's modification time, which survives a
        restart) is older than ``now - retention_age``. The stream's ``first_offset`` moves up
        to the first retained segment; reads clamp their start to it. Commits enforce the
        limits by themselves; call this (``now``: an aware instant, default the current time)
        to apply the age limit to a stream nobody writes to.
        """
        if now is None:
            now = datetime.now(UTC)
        with self._lock:
            self._check_open()
            streams = list(self._streams.values())
        removed: dict[str, int] = {}
        for stream in streams:
            count = retain(stream, self.retention_bytes, self.retention_age, now)
            if count:
                removed[stream.name] = count
        return removed

    def validate(self, name: str, batch: pa.RecordBatch) -> None:
        """Raise what :meth:`write` would for ``batch``'s schema, without writing anything.

        Lets a caller that hands batches to another thread report a mismatch at once. Nothing
        is checked if the stream does not exist (the first write creates it).

        Raises:
            StreamNameError: invalid name. SchemaMismatchError: as :meth:`append`.
        """
        validate_stream_name(name)
        with self._lock:
            stream = self._streams.get(name)
        if stream is not None and not fits_as_is(stream.schema, batch):
            problem = describe_mismatch(name, stream.schema, plain_schema(batch.schema), batch)
            if problem is not None:
                raise SchemaMismatchError(problem)

    def info(self, name: str) -> StreamInfo:
        """Return what stream ``name`` holds now.

        Raises:
            StreamNameError: invalid name. StreamNotFoundError: no such stream.
        """
        stream = self._get(name)
        with stream.cond:
            return stream.info()

    def exists(self, name: str) -> bool:
        """Return whether stream ``name`` exists. Raises StreamNameError for an invalid name."""
        validate_stream_name(name)
        with self._lock:
            return name in self._streams

    def list_streams(self) -> list[StreamInfo]:
        """Return the info of every stream, sorted by name."""
        with self._lock:
            streams = sorted(self._streams.values(), key=lambda s: s.name)
        infos = []
        for stream in streams:
            with stream.cond:
                infos.append(stream.info())
        return infos

    def drop(self, name: str) -> None:
        """Delete stream ``name`` and its files. Waiting tails wake up (:meth:`wait_for` returns
        ``False``); batches already handed to readers stay valid.

        Raises:
            StreamNameError: invalid name. StreamNotFoundError: no such stream.
            StorageError: the stream directory could not be moved away.
        """
        validate_stream_name(name)
        with self._lock:
            self._check_open()
            stream = self._streams.pop(name, None)
            if stream is None:
                raise StreamNotFoundError(f"stream {name!r} does not exist")
            stream.retire()
            trash = self._to_trash(name, stream)
        shutil.rmtree(trash, ignore_errors=True)
        log.info("stream dropped", extra={"stream": name, "incarnation": stream.incarnation})

    def _to_trash(self, name: str, stream: StreamLog) -> Path:
        """Move retired ``stream``'s directory into the trash (under ``self._lock``); return
        where it went, for the caller to delete outside the lock.

        Raises:
            StorageError: the directory could not be moved.
        """
        trash = self._trash / f"{name}.{stream.incarnation}"
        try:
            os.rename(stream.directory, trash)
        except OSError as exc:
            raise StorageError(f"cannot drop stream {name!r}: {exc}") from exc
        return trash

    def drop_if_empty(self, name: str, incarnation: str) -> bool:
        """Drop stream ``name`` if it is still incarnation ``incarnation`` and holds no entry,
        none reserved either; return whether it did. For a caller that created the stream and
        then failed before writing (a refused first DoPut batch): the stream goes away unless
        another writer wrote to it meanwhile (then it stays, with that writer's entries), and a
        stream re-created since is left alone. A write racing with the drop is never lost: it
        lands before the check (the stream stays) or finds the stream dropped and creates a new
        incarnation (:meth:`write`).

        Raises:
            StreamNameError: invalid name. StorageError: the directory could not be moved away.
        """
        validate_stream_name(name)
        with self._lock:
            self._check_open()
            stream = self._streams.get(name)
            if stream is None or stream.incarnation != incarnation:
                return False
            if not stream.retire_if_empty():
                return False
            del self._streams[name]
            trash = self._to_trash(name, stream)
        shutil.rmtree(trash, ignore_errors=True)
        log.info(
            "empty stream dropped", extra={"stream": name, "incarnation": stream.incarnation}
        )
        return True

    def read(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        incarnation: str | None = None,
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Return an iterator of ``(offset, batch)`` for offsets ``[start, stop)``.

        ``stop=None`` means "up to the last batch appended before this call"; both bounds are
        clamped to ``[first_offset, next_offset)``. Batches are zero-copy views of the
        memory-mapped segment files. The stream and its bounds are resolved when ``read`` is
        called, not when iteration starts.

        Args:
            incarnation: when given, the stream must still be this incarnation.

        Raises:
            StreamNameError: invalid name. InvalidInputError: ``start`` or ``stop`` is negative.
            StreamNotFoundError: no such stream, or not the given incarnation.
        """
        if start < 0 or (stop is not None and stop < 0):
            raise InvalidInputError(f"offsets must be >= 0, got start={start}, stop={stop}")
        stream = self._get(name)
        with stream.cond:
            plan = stream.plan(start, stop, incarnation)
        return StreamLog.batches(stream.schema, plan)

    def entries(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        incarnation: str | None = None,
    ) -> Iterator[StreamEntry]:
        """Like :meth:`read`, but every entry, markers included, with its writer."""
        if start < 0 or (stop is not None and stop < 0):
            raise InvalidInputError(f"offsets must be >= 0, got start={start}, stop={stop}")
        stream = self._get(name)
        with stream.cond:
            plan = stream.plan(start, stop, incarnation)
        return stream.entries(plan)

    def rows_before(self, name: str, offset: int) -> int:
        """Rows of every batch of stream ``name`` below ``offset`` (clamped to
        ``[first_offset, next_offset]``), the rows retention removed included: the difference
        of two values is the rows between two offsets, also after those entries are gone
        (a resume that skips entries retention removed counts the rows it lost with it).

        Raises:
            StreamNameError: invalid name. StreamNotFoundError: no such stream.
        """
        stream = self._get(name)
        with stream.cond:
            return stream.rows_before(offset)

    def writers(self, name: str) -> dict[str, WriterInfo]:
        """What the visible log of stream ``name`` holds of each writer, by name.

        Raises:
            StreamNameError: invalid name. StreamNotFoundError: no such stream.
        """
        stream = self._get(name)
        with stream.cond:
            state = {k: list(v) for k, v in stream.writer_state.items()}
        return {
            k: WriterInfo(k, cast(int, v[0]), cast(int, v[1]), v[2], v[3]) for k, v in state.items()
        }

    def batches(
        self, name: str, stop: int | None = None, *, incarnation: str | None = None
    ) -> list[pa.RecordBatch]:
        """Return the batches ``[first_offset, stop)`` of stream ``name`` (see :meth:`read`)."""
        return [batch for _, batch in self.read(name, 0, stop, incarnation=incarnation)]

    def wait_for(self, name: str, offset: int, timeout_s: float) -> bool:
        """Block until the batch at ``offset`` exists, for at most ``timeout_s`` seconds.

        Returns ``True`` as soon as ``next_offset > offset``; ``False`` on timeout, or when the
        stream is dropped (or the store closed) while waiting.

        Raises:
            StreamNameError: invalid name. StreamNotFoundError: no such stream when called.
        """
        stream = self._get(name)
        with stream.cond:
            return (
                stream.cond.wait_for(
                    lambda: stream.dropped or stream.next_offset > offset, timeout=timeout_s
                )
                and not stream.dropped
            )

    # --- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the stream store is closed")

    def _get(self, name: str) -> StreamLog:
        validate_stream_name(name)
        with self._lock:
            self._check_open()
            stream = self._streams.get(name)
        if stream is None:
            raise StreamNotFoundError(f"stream {name!r} does not exist")
        return stream

    def _lookup(self, name: str) -> StreamLog | None:
        with self._lock:
            self._check_open()
            return self._streams.get(name)

    def _get_or_create(self, name: str, schema: pa.Schema) -> StreamLog:
        return self._open_or_create(name, schema)[0]

    def _open_or_create(self, name: str, schema: pa.Schema) -> tuple[StreamLog, bool]:
        """The stream ``name``, created with ``schema`` if missing; whether this call made it."""
        validate_stream_name(name)
        with self._lock:
            self._check_open()
            stream = self._streams.get(name)
            if stream is not None:
                return stream, False
            stream = self._create_locked(name, schema)
            self._streams[name] = stream
            return stream, True

    def _create_locked(self, name: str, schema: pa.Schema) -> StreamLog:
        incarnation = str(uuid.uuid4())
        created_at = datetime.now(UTC)
        staged = self._staging / f"{name}.{incarnation}"
        final = self._root / name
        do_sync = self.fsync == "batch"
        try:
            staged.mkdir()
            meta = {
                "format": FORMAT,
                "name": name,
                "incarnation": incarnation,
                "created_at": created_at.isoformat(),
            }
            write_file(staged / META_FILE, json.dumps(meta).encode(), fsync=do_sync)
            write_file(staged / SCHEMA_FILE, schema.serialize().to_pybytes(), fsync=do_sync)
            write_file(staged / segment_name(0), b"", fsync=do_sync)
            if do_sync:
                fsync_dir(staged)
            if final.exists():  # a leftover that failed to load: keep it aside, never mix
                os.rename(final, self._trash / f"{name}.broken.{incarnation}")
            os.rename(staged, final)
            if do_sync:
                fsync_dir(self._root)
        except OSError as exc:
            shutil.rmtree(staged, ignore_errors=True)
            raise write_error(f"cannot create stream {name!r}: {exc}", exc) from exc
        stream = StreamLog(name, final, schema, incarnation, created_at, self._settings)
        stream.segments.append(Segment(final / segment_name(0), 0))
        log.info("stream created", extra={"stream": name, "incarnation": incarnation})
        return stream
