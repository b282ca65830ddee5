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
position) and runs one ``fdatasync`` for all of them, while writers go on staging: a DoPut (which
writes on one thread and commits on another) or several concurrent appenders share syncs. A
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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import re
import shutil
import struct
import threading
import uuid
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.errors import (
    AlreadyExistsError,
    InvalidInputError,
    SchemaMismatchError,
    StorageError,
    StreamNameError,
    StreamNotFoundError,
)
from flight_serve.types import plain_type, rewrite_type, value_type

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "STREAM_NAME_PATTERN",
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

FsyncMode = Literal["batch", "never"]

#: A segment is rolled once it would grow past this many bytes.
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024

#: Stream names: 1 to 200 characters out of ``[A-Za-z0-9_.-]``, and not ``.`` or ``..``.
STREAM_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,200}")

_FORMAT = 1
_FRAME_MAGIC = b"FSF2"
_HEADER = struct.Struct("<4sQQIIB3x")  # magic, body_len, num_rows, crc32(body), writer, kind
_FRAME_MAGIC_V1 = b"FSF1"
_HEADER_V1 = struct.Struct("<4sQQI")  # magic, body_len, num_rows, crc32(body)
#: Frame kinds: a batch, a watermark marker, an end-of-input marker.
_BATCH, _WATERMARK, _END = 0, 1, 2
_VALUE = struct.Struct("<q")
_WRITERS_FILE = "writers.jsonl"
#: Writer names in the store: up to 200 characters out of ``[A-Za-z0-9_.:@-]`` (``""`` is the
#: unnamed writer: entries appended without a name).
WRITER_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:@\-]{0,200}")
#: Frames with an IPC message at least this large are written with O_DIRECT (when available).
_DIRECT_MIN_BYTES = 1 << 20
#: O_DIRECT alignment of file offsets, lengths and memory (covers 512 and 4096 byte sectors).
_ALIGN = 4096
_ZEROS = bytes(_ALIGN)
_IPC_CONTINUATION = b"\xff\xff\xff\xff"
#: A store keeps its direct frames' staging buffers for reuse, up to this many bytes of them.
_SPARE_BYTES = 64 << 20
#: write() puts the staged frames in the file itself once they hold this many bytes (so at most
#: twice this is in flight: staged, and being written by a commit; the spare pool covers it).
_MAX_STAGED_BYTES = 32 << 20
_SEGMENT_SUFFIX = ".seg"
_META_FILE = "stream.json"
_SCHEMA_FILE = "schema.arrow"
_RETENTION_FILE = "retention.json"


def validate_stream_name(name: str) -> str:
    """Return ``name`` if it is a valid stream name.

    Raises:
        StreamNameError: ``name`` is empty, longer than 200 characters, holds a character outside
            ``[A-Za-z0-9_.-]``, or is ``.`` / ``..`` (which are not directory names).

    >>> validate_stream_name("flights.v2")
    'flights.v2'
    """
    if not isinstance(name, str) or STREAM_NAME_PATTERN.fullmatch(name) is None:
        raise StreamNameError(
            f"invalid stream name {name!r}: use 1 to 200 characters out of [A-Za-z0-9_.-]"
        )
    if name in (".", ".."):
        raise StreamNameError(f"invalid stream name {name!r}: '.' and '..' are reserved")
    return name


def same_values(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether types ``a`` and ``b`` hold the same values and differ at most in offset width
    (``string`` / ``large_string``, ``binary`` / ``large_binary``, ``list`` / ``large_list``, at
    any depth) or in being a view type (:func:`plain_type`): a batch of one is cast to the other
    on append. (A stream that an earlier flight-serve created with a view type keeps it: plain
    ``string`` / ``binary`` batches are cast to ``string_view`` / ``binary_view`` for it.)

    >>> same_values(pa.list_(pa.large_string()), pa.large_list(pa.string()))
    True
    >>> same_values(pa.string(), pa.binary())
    False
    """
    return a == b or value_type(a) == value_type(b)


def to_plain(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """Return ``array`` converted to ``target``: a type :func:`plain_type` gives for it, or one
    :func:`same_values` matches.

    List views are rebuilt by hand (pyarrow 26's ``list_view`` to ``list`` cast produces an
    invalid offsets buffer); everything else is an Arrow cast.

    Raises:
        pyarrow.ArrowInvalid: the values do not fit ``target`` (more than 2 GiB of strings in
            one batch cast to ``string``).
    """
    source: Any = array.type
    if source == target:
        return array
    goal: Any = target
    if pa.types.is_dictionary(source):
        # values made plain first: pyarrow 26 can neither cast nor take a dictionary of views
        encoded: Any = array
        values = to_plain(encoded.dictionary, plain_type(source.value_type))
        decoded = pa.DictionaryArray.from_arrays(encoded.indices, values).dictionary_decode()
        return to_plain(decoded, target)
    if (pa.types.is_list(goal) or pa.types.is_large_list(goal)) and (
        pa.types.is_list(source)
        or pa.types.is_large_list(source)
        or pa.types.is_list_view(source)
        or pa.types.is_large_list_view(source)
    ):
        values = to_plain(pc.list_flatten(array), goal.value_type)
        sizes = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        offset_type = np.int64 if pa.types.is_large_list(goal) else np.int32
        offsets = np.zeros(len(array) + 1, dtype=offset_type)
        np.cumsum(sizes, out=offsets[1:])
        list_class: Any = pa.LargeListArray if pa.types.is_large_list(goal) else pa.ListArray
        return cast(
            "pa.Array[Any]",
            list_class.from_arrays(
                pa.array(offsets),
                values,
                type=goal,
                mask=array.is_null() if array.null_count else None,
            ),
        )
    if pa.types.is_struct(goal) and pa.types.is_struct(source):
        struct_array: Any = array
        children = [
            to_plain(child, goal.field(i).type) for i, child in enumerate(struct_array.flatten())
        ]
        return cast(
            "pa.Array[Any]",
            pa.StructArray.from_arrays(
                children,
                fields=[goal.field(i) for i in range(goal.num_fields)],
                mask=array.is_null() if array.null_count else None,
            ),
        )
    return array.cast(target)


def _plain_field(field: pa.Field[Any]) -> pa.Field[Any]:
    return field.with_type(plain_type(field.type))


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    metadata: Any = schema.metadata
    return pa.schema([_plain_field(f) for f in schema], metadata=metadata)


def _to_plain_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    schema = _plain_schema(batch.schema)
    if schema.equals(batch.schema):
        return batch
    columns = [
        to_plain(column, field.type) for column, field in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _describe_mismatch(
    stream: str, expected: pa.Schema, got: pa.Schema, batch: pa.RecordBatch | None = None
) -> str | None:
    """Return why schema ``got`` (and, when given, ``batch``'s nulls) does not fit ``expected``.

    Returns ``None`` when it fits.
    """
    expected_names = expected.names
    got_names = got.names
    if len(set(expected_names)) != len(expected_names) or len(set(got_names)) != len(got_names):
        # Duplicate field names: only an identical schema (same order) can be matched safely.
        if got.equals(expected, check_metadata=False):
            return None
        return (
            f"batch schema does not match stream {stream!r} (duplicate field names need the "
            f"identical schema): stream has {expected_names}, batch has {got_names}"
        )
    got_by_name = {f.name: f for f in got}
    expected_by_name = {f.name: f for f in expected}
    missing = [f for f in expected if f.name not in got_by_name]
    unexpected = [f for f in got if f.name not in expected_by_name]
    retyped: list[str] = []
    for field in expected:
        other = got_by_name.get(field.name)
        if other is None:
            continue
        if not same_values(other.type, field.type):
            retyped.append(f"{field.name!r} (stream has {field.type}, batch has {other.type})")
        elif not field.nullable and batch is not None and batch.column(field.name).null_count:
            retyped.append(f"{field.name!r} (not nullable in the stream, batch holds nulls)")
    if not (missing or unexpected or retyped):
        return None
    parts = []
    if missing:
        parts.append("missing field " + ", ".join(f"{f.name!r} ({f.type})" for f in missing))
    if unexpected:
        parts.append("unexpected field " + ", ".join(f"{f.name!r} ({f.type})" for f in unexpected))
    if retyped:
        parts.append("retyped field " + ", ".join(retyped))
    return f"batch schema does not match stream {stream!r}: " + "; ".join(parts)


def check_batch(stream: str, schema: pa.Schema, batch: pa.RecordBatch) -> None:
    """Raise what appending ``batch`` to a stream ``stream`` of ``schema`` would, without a
    stream: for a caller that checks a first batch before it creates or replaces the stream.

    Raises:
        SchemaMismatchError: as :meth:`StreamStore.append` (names each missing, unexpected and
            retyped field).
    """
    problem = _describe_mismatch(stream, _plain_schema(schema), _plain_schema(batch.schema), batch)
    if problem is not None:
        raise SchemaMismatchError(problem)


def _conform(stream: str, expected: pa.Schema, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Return ``batch`` in the stream's field order and schema, or raise SchemaMismatchError."""
    problem = _describe_mismatch(stream, expected, batch.schema, batch)
    if problem is not None:
        raise SchemaMismatchError(problem)
    if batch.schema.equals(expected, check_metadata=True):
        return batch
    if batch.schema.names == expected.names:
        columns = batch.columns
    else:
        columns = [batch.column(name) for name in expected.names]
    try:
        columns = [to_plain(c, f.type) for c, f in zip(columns, expected, strict=True)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(
            f"batch does not fit the types of stream {stream!r}: {exc}"
        ) from None
    return pa.RecordBatch.from_arrays(columns, schema=expected)


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


def validate_writer_name(name: str) -> str:
    """Return ``name`` if it is a valid writer name for the store (see WRITER_NAME_PATTERN).

    Raises:
        InvalidInputError: it is not.
    """
    if not isinstance(name, str) or WRITER_NAME_PATTERN.fullmatch(name) is None:
        raise InvalidInputError(
            f"invalid writer name {name!r}: use up to 200 characters out of [A-Za-z0-9_.:@-]"
        )
    return name


class _Segment:
    """One segment file: frame positions plus a lazily (re)mapped read buffer."""

    def __init__(self, path: Path, first_offset: int, *, created: bool = True) -> None:
        self.path = path
        self.first_offset = first_offset
        self.positions: array[int] = array("Q")  # byte position of each frame body
        self.lengths: array[int] = array("Q")  # body length of each frame
        self.rows: array[int] = array("Q")
        self.writers: array[int] = array("I")  # writer id of each frame
        self.kinds: array[int] = array("B")  # _BATCH, _WATERMARK or _END
        self.values: array[int] = array("q")  # a watermark marker's watermark, else 0
        self.size = 0  # bytes of valid (and reserved) frames
        self.created = created  # False until the first drain into it creates the file
        self._mapped: pa.Buffer | None = None

    @property
    def count(self) -> int:
        return len(self.positions)

    def buffer_covering(self, end: int) -> pa.Buffer:
        """Return a zero-copy buffer over the file mapping covering bytes ``[0, end)``.

        Called with the stream lock held.
        """
        mapped = self._mapped
        if mapped is None or mapped.size < end:
            try:
                with pa.memory_map(str(self.path), "r") as mm:
                    mapped = mm.read_buffer()
            except FileNotFoundError as exc:  # dropped while a reader was running
                raise StreamNotFoundError(f"segment {self.path.name} is gone") from exc
            self._mapped = mapped
        return mapped


class _Staged:
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
        segment: _Segment,
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


class _BufferPool:
    """Page-aligned buffers for direct frames, kept for reuse up to ``_SPARE_BYTES`` in all
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

    def give_back(self, frames: list[_Staged]) -> None:
        """Keep the buffers of written (or discarded) direct frames for reuse."""
        with self._lock:
            for frame in frames:
                aligned = frame.aligned
                if not frame.ready:
                    continue  # still being filled (a discarded frame): not reusable yet
                if aligned is not None and self._bytes + len(aligned) <= _SPARE_BYTES:
                    self._spare.append(aligned)
                    self._bytes += len(aligned)
                frame.aligned = None

    def clear(self) -> None:
        with self._lock:
            self._spare.clear()
            self._bytes = 0


class _Stream:
    """In-memory state of one open stream incarnation. Guarded by ``cond``'s lock.

    Lock order: the store's lock, then ``sync_lock``, then ``cond``.
    """

    def __init__(
        self, name: str, directory: Path, schema: pa.Schema, incarnation: str, created_at: datetime
    ) -> None:
        self.name = name
        self.directory = directory
        self.schema = schema
        self.incarnation = incarnation
        self.created_at = created_at
        self.segments: list[_Segment] = []
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
        self.staged: list[_Staged] = []  # in offset order; written to the file by _drain
        self.staged_bytes = 0
        self.schema_bytes = 0  # length of the IPC schema message of ``schema`` (0: not known)
        self.fd: int | None = None  # write handle of fd_segment
        self.direct_fd: int | None = None  # O_DIRECT handle of fd_segment
        self.fd_segment: _Segment | None = None  # the segment the drains write to
        self.dropped = False
        self.cond = threading.Condition(threading.Lock())
        self.sync_lock = threading.Lock()  # held while staged frames are written and synced
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

    def writer_name(self, writer_id: int) -> str:
        names = self.writer_names
        return names[writer_id] if writer_id < len(names) else f"#{writer_id}"

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
                if kind == _WATERMARK:
                    value = segment.values[i]
                    previous = state[2]
                    state[2] = value if previous is None else max(previous, value)
                elif kind == _END and state[3] is None:
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

    def locate(self, offset: int) -> tuple[_Segment, int]:
        """Return the segment holding ``offset`` and the frame index inside it."""
        lo, hi = 0, len(self.segments) - 1
        while lo < hi:  # last segment whose first_offset <= offset
            mid = (lo + hi + 1) // 2
            if self.segments[mid].first_offset <= offset:
                lo = mid
            else:
                hi = mid - 1
        segment = self.segments[lo]
        return segment, offset - segment.first_offset


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
    _handle: _Stream = dataclass_field(repr=False, compare=False)
    _epoch: int = dataclass_field(default=0, repr=False, compare=False)


def _discarded(stream: _Stream, pending: PendingAppend) -> bool:
    """Whether a failed write discarded ``pending`` (cond held): it was reserved in an earlier
    epoch at or after the offset where that epoch ended."""
    return pending._epoch != stream.epoch and pending.offset >= stream.epoch_ends[pending._epoch]


def _schema_message_bytes(schema: pa.Schema) -> int:
    """Length of the schema message an IPC stream writer puts before the first batch."""
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, schema).close()
    return int(sink.getvalue().size) - 8  # less the end-of-stream marker


def _read_writers(path: Path) -> tuple[list[str], dict[str, int]]:
    """The writer names of ``writers.jsonl`` by id (id 0 is ``""``); a torn line is skipped
    (no durable frame can name it: a writer's line is synced before its first frame)."""
    names = [""]
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            item = json.loads(line)
            writer_id, name = int(item["id"]), str(item["writer"])
        except (ValueError, KeyError, TypeError):
            continue
        if writer_id < 1:
            continue
        while len(names) <= writer_id:
            names.append(f"#{len(names)}")
        names[writer_id] = name
    return names, {name: i for i, name in enumerate(names)}


def _segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}{_SEGMENT_SUFFIX}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes, fsync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def _pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _sync_failure(name: str, exc: OSError) -> str:
    return f"stream {name!r} refuses writes after a failed fdatasync ({exc}); re-open the store"


def _sync(fd: int) -> None:
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


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
        self.fsync: FsyncMode = fsync
        self.segment_bytes = segment_bytes
        self.direct_io = direct_io
        self._buffers = _BufferPool()
        self._root = self.data_dir / "streams"
        self._staging = self.data_dir / "streams-staging"
        self._trash = self.data_dir / "streams-trash"
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
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
                stream = self._load(directory)
                if stream is not None:
                    self._streams[stream.name] = stream
        if retention_bytes is not None or retention_age is not None:
            self.enforce_retention()

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
            self._retire(stream)  # wakes waiters: the store is gone for them
        self._buffers.clear()
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
        plain = _plain_schema(schema)
        stream = self._get_or_create(name, plain)
        problem = _describe_mismatch(name, stream.schema, plain)
        if problem is not None:
            raise SchemaMismatchError(problem)
        with stream.cond:
            return stream.info()

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
        batch = _to_plain_batch(batch)
        while True:
            stream = self._get_or_create(name, batch.schema)
            conformed = _conform(name, stream.schema, batch)
            writer_id = self._writer_id(stream, writer)
            if self.direct_io and self.fsync == "batch" and conformed.nbytes >= _DIRECT_MIN_BYTES:
                size = pa.ipc.get_record_batch_size(conformed)
                reserved = self._reserve(
                    stream, size, conformed.num_rows, None, 0, writer_id, after=after
                )
                if reserved is not None:
                    self._fill(stream, reserved[1], conformed, size, writer_id)
            else:
                body = conformed.serialize()
                crc = zlib.crc32(memoryview(body))  # outside the lock (releases the GIL)
                reserved = self._reserve(
                    stream, body.size, conformed.num_rows, body, crc, writer_id, after=after
                )
            pending = self._staged(stream, reserved)
            if pending is not None:
                return pending

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

        Raises:
            StreamNotFoundError: the stream does not exist.
            InvalidInputError: an invalid writer name, or not exactly one kind of marker.
            StorageError: as :meth:`append`; ``after`` was discarded by a failed write.
        """
        validate_writer_name(writer)
        if (watermark_ns is None) == (not end_of_input):
            raise InvalidInputError("a marker is a watermark or an end of input, exactly one")
        if end_of_input:
            kind, value, body = _END, 0, pa.py_buffer(b"")
        else:
            assert watermark_ns is not None
            kind, value = _WATERMARK, watermark_ns
            body = pa.py_buffer(_VALUE.pack(watermark_ns))
        crc = zlib.crc32(memoryview(body))
        while True:
            stream = self._get(name)
            writer_id = self._writer_id(stream, writer)
            reserved = self._reserve(
                stream, body.size, 0, body, crc, writer_id, kind, value, after=after
            )
            pending = self._staged(stream, reserved)
            if pending is not None:
                return pending

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

    def _writer_id(self, stream: _Stream, writer: str) -> int:
        """The id of ``writer`` in ``stream``; a new writer is appended to ``writers.jsonl``
        (and synced) first, so no durable frame names an unknown id."""
        writer_id = stream.writer_ids.get(writer)
        if writer_id is not None:
            return writer_id
        with stream.writers_lock:
            writer_id = stream.writer_ids.get(writer)
            if writer_id is not None:
                return writer_id
            writer_id = len(stream.writer_names)
            path = stream.directory / _WRITERS_FILE
            line = json.dumps({"id": writer_id, "writer": writer}) + "\n"
            try:
                created = not path.exists()
                with open(path, "ab") as f:
                    f.write(line.encode())
                    f.flush()
                    if self.fsync == "batch":
                        os.fsync(f.fileno())
                if created and self.fsync == "batch":
                    _fsync_dir(stream.directory)
            except OSError as exc:
                raise StorageError(
                    f"cannot record writer {writer!r} of stream {stream.name!r}: {exc}"
                ) from exc
            stream.writer_names.append(writer)
            stream.writer_ids[writer] = writer_id
            return writer_id

    def _staged(
        self, stream: _Stream, reserved: tuple[PendingAppend, _Staged, bool] | None
    ) -> PendingAppend | None:
        """The pending append of a :meth:`_reserve` result, putting the staged frames in the file
        when it asks for that (``fsync="never"``, or too much staged); ``None`` when the stream
        was dropped between lookup and write (a new incarnation: the caller retries)."""
        if reserved is None:
            self._check_open()
            return None
        pending, _, drain = reserved
        if drain:
            with stream.sync_lock:
                self._drain(stream, publish=self.fsync != "batch")
        return pending

    def _reserve(
        self,
        stream: _Stream,
        size: int,
        num_rows: int,
        body: pa.Buffer | None,
        crc: int,
        writer_id: int = 0,
        kind: int = _BATCH,
        value: int = 0,
        *,
        after: PendingAppend | None = None,
    ) -> tuple[PendingAppend, _Staged, bool] | None:
        """Reserve an offset and a file position in ``stream`` for an IPC message of ``size``
        bytes, rolling the segment if needed, and stage the frame: ``body`` with its ``crc``,
        or (``body=None``) a direct frame that the caller must :meth:`_fill`; refused if
        ``after`` was discarded (see :meth:`write`).

        Returns the pending append, the staged frame and whether the caller should drain now
        (``fsync="never"``, or too much staged); ``None`` if the stream was dropped.
        """
        frame_bytes = _HEADER.size + size
        with stream.cond:
            if stream.dropped:
                return None
            if stream.failed is not None:
                raise StorageError(stream.failed)
            if after is not None and (after._handle is not stream or _discarded(stream, after)):
                raise StorageError(
                    f"stream {stream.name!r}: the batch at offset {after.offset} before this one "
                    "was discarded (a failed write, or the stream was dropped); nothing after "
                    "it is written"
                )
            segment = stream.segments[-1]
            if segment.size > 0 and segment.size + frame_bytes > self.segment_bytes:
                first = stream.written_offset  # roll: the next drain creates the file
                segment = _Segment(stream.directory / _segment_name(first), first, created=False)
                stream.segments.append(segment)
            position = segment.size
            if body is None:
                if stream.schema_bytes == 0:
                    stream.schema_bytes = _schema_message_bytes(stream.schema)
                pad = -(position + frame_bytes) % _ALIGN
                head = position % _ALIGN  # where the frame starts inside its first page
                prefix = -(-stream.schema_bytes // _ALIGN) * _ALIGN  # room for the schema message
                end = head + frame_bytes + pad  # a multiple of _ALIGN
                aligned = self._buffers.take(prefix + end + 8)  # + the end-of-stream marker
                frame = _Staged(
                    segment, position, aligned=aligned, prefix=prefix, head=head, size=end
                )
            else:
                pad = 0
                header = _HEADER.pack(_FRAME_MAGIC, size, num_rows, crc, writer_id, kind)
                frame = _Staged(segment, position, header, body)
            stream.staged.append(frame)
            stream.staged_bytes += frame.nbytes
            segment.positions.append(position + _HEADER.size)
            segment.lengths.append(size + pad)
            segment.rows.append(num_rows)
            segment.writers.append(writer_id)
            segment.kinds.append(kind)
            segment.values.append(value)
            segment.size = position + frame_bytes + pad
            offset = stream.written_offset
            stream.written_offset += 1
            stream.written_rows += num_rows
            stream.written_bytes += size + pad
            pending = PendingAppend(stream.name, offset, num_rows, stream, stream.epoch)
            drain = self.fsync != "batch" or stream.staged_bytes > _MAX_STAGED_BYTES
            return pending, frame, drain

    def _fill(
        self, stream: _Stream, frame: _Staged, batch: pa.RecordBatch, size: int, writer_id: int
    ) -> None:
        """Encode ``batch`` (an IPC message of ``size`` bytes) straight into a direct frame's
        aligned buffer, then checksum it, outside the stream lock; mark the frame ready."""
        try:
            assert frame.aligned is not None
            view = memoryview(frame.aligned)
            start = frame.prefix + frame.head + _HEADER.size
            end = frame.prefix + frame.size
            # An IPC stream writer puts the schema message in the scratch room before ``start``
            # and the record batch message at ``start``: the same bytes as batch.serialize(),
            # without a copy. Its end-of-stream marker lands in the padding, zeroed below.
            scratch = start - stream.schema_bytes
            sink = pa.FixedSizeBufferWriter(pa.py_buffer(view[scratch : start + size + 8]))
            with pa.ipc.new_stream(sink, stream.schema) as writer:
                writer.write_batch(batch)
            if (
                sink.tell() != stream.schema_bytes + size + 8
                or view[start : start + 4] != _IPC_CONTINUATION
            ):
                raise StorageError(
                    f"IPC stream writer produced {sink.tell()} bytes, expected "
                    f"{stream.schema_bytes} + {size} + 8"
                )
            view[start + size : end] = _ZEROS[: end - start - size]
            crc = zlib.crc32(view[start:end])
            view[start - _HEADER.size : start] = _HEADER.pack(
                _FRAME_MAGIC, end - start, batch.num_rows, crc, writer_id, _BATCH
            )
            del view
        except BaseException as exc:
            with stream.cond:
                frame.error = exc
                frame.ready = True
                stream.cond.notify_all()
            raise
        with stream.cond:
            frame.ready = True
            stream.cond.notify_all()

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
        while True:
            with stream.cond:
                if self._committed(stream, pending):
                    break
            with stream.sync_lock:
                with stream.cond:
                    if self._committed(stream, pending):
                        break
                self._drain(stream, publish=True)
        if (self.retention_bytes is not None or self.retention_age is not None) and len(
            stream.segments
        ) > 1:
            self._retain(stream, datetime.now(UTC))
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
            count = self._retain(stream, now)
            if count:
                removed[stream.name] = count
        return removed

    def _retain(self, stream: _Stream, now: datetime) -> int:
        """Remove the segments of ``stream`` that retention lets go; return how many."""
        limit_bytes, limit_age = self.retention_bytes, self.retention_age
        if limit_bytes is None and limit_age is None:
            return 0
        cutoff_ns = (
            None if limit_age is None else int((now - limit_age).timestamp() * 1_000_000_000)
        )
        gone: list[_Segment] = []
        with stream.sync_lock, stream.cond:
            if stream.dropped:
                return 0
            total = sum(segment.size for segment in stream.segments)
            while len(stream.segments) > 1:
                segment, following = stream.segments[0], stream.segments[1]
                closed = (
                    segment is not stream.fd_segment
                    and following.created
                    and following.first_offset <= stream.next_offset
                )
                if not closed:
                    break
                over = limit_bytes is not None and total > limit_bytes
                if not over and cutoff_ns is not None:
                    try:  # a closed segment's mtime is when its newest entry was written
                        written_ns = segment.path.stat().st_mtime_ns
                    except OSError:
                        written_ns = 0
                    over = written_ns < cutoff_ns
                if not over:
                    break
                stream.segments.pop(0)
                total -= segment.size
                stream.num_rows -= sum(segment.rows)
                stream.num_bytes -= sum(segment.lengths)
                stream.written_rows -= sum(segment.rows)
                stream.written_bytes -= sum(segment.lengths)
                gone.append(segment)
            if not gone:
                return 0
            stream.rows_removed += sum(sum(segment.rows) for segment in gone)
            record = {"first_offset": stream.segments[0].first_offset, "rows_removed": stream.rows_removed}
            try:  # first: a restart finishes a removal this record names (see _load)
                tmp = stream.directory / (_RETENTION_FILE + ".tmp")
                _write_file(tmp, json.dumps(record).encode(), self.fsync == "batch")
                os.replace(tmp, stream.directory / _RETENTION_FILE)
            except OSError as exc:
                log.warning(
                    "cannot record a retention removal; its rows are not counted",
                    extra={"stream": stream.name, "error": str(exc)},
                )
            stream.writer_state = {}
            stream.note(stream.segments[0].first_offset, stream.next_offset)
            for segment in gone:
                with contextlib.suppress(FileNotFoundError):
                    segment.path.unlink()
            if self.fsync == "batch":
                with contextlib.suppress(OSError):
                    _fsync_dir(stream.directory)
            first = stream.segments[0].first_offset
        log.info(
            "retention removed segments",
            extra={"stream": stream.name, "segments": len(gone), "first_offset": first},
        )
        return len(gone)

    @staticmethod
    def _committed(stream: _Stream, pending: PendingAppend) -> bool:
        """Whether ``pending`` is durable and visible (cond held); raise if it never will be."""
        if _discarded(stream, pending):
            raise StorageError(
                f"batch {pending.offset} of stream {stream.name!r} was discarded: "
                "a write to the stream failed before it was durable"
            )
        if stream.next_offset > pending.offset:
            return True
        if stream.dropped:
            raise StreamNotFoundError(
                f"stream {stream.name!r} was dropped before batch {pending.offset} was durable"
            )
        if stream.failed is not None:
            raise StorageError(stream.failed)
        return False

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
        if stream is not None:
            problem = _describe_mismatch(name, stream.schema, _plain_schema(batch.schema), batch)
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
            self._retire(stream)
            trash = self._trash / f"{name}.{stream.incarnation}"
            try:
                os.rename(stream.directory, trash)
            except OSError as exc:
                raise StorageError(f"cannot drop stream {name!r}: {exc}") from exc
        shutil.rmtree(trash, ignore_errors=True)
        log.info("stream dropped", extra={"stream": name, "incarnation": stream.incarnation})

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
            if incarnation is not None and stream.incarnation != incarnation:
                raise StreamNotFoundError(
                    f"stream {name!r} incarnation {incarnation} no longer exists"
                )
            first = stream.segments[0].first_offset if stream.segments else 0
            begin = max(start, first)
            end = stream.next_offset if stop is None else min(stop, stream.next_offset)
            plan: list[tuple[_Segment, int, int, pa.Buffer]] = []
            offset = begin
            while offset < end:
                segment, index = stream.locate(offset)
                last = min(segment.count, index + (end - offset))
                buffer = segment.buffer_covering(
                    segment.positions[last - 1] + segment.lengths[last - 1]
                )
                plan.append((segment, index, last, buffer))
                offset += last - index
        return self._iterate(stream.schema, plan)

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
            if incarnation is not None and stream.incarnation != incarnation:
                raise StreamNotFoundError(
                    f"stream {name!r} incarnation {incarnation} no longer exists"
                )
            first = stream.segments[0].first_offset if stream.segments else 0
            offset = max(start, first)
            end = stream.next_offset if stop is None else min(stop, stream.next_offset)
            plan: list[tuple[_Segment, int, int, pa.Buffer]] = []
            while offset < end:
                segment, index = stream.locate(offset)
                last = min(segment.count, index + (end - offset))
                buffer = segment.buffer_covering(
                    segment.positions[last - 1] + segment.lengths[last - 1]
                )
                plan.append((segment, index, last, buffer))
                offset += last - index
        return self._iterate_entries(stream, plan)

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
            rows = stream.rows_removed
            for segment in stream.segments:
                if segment.first_offset >= offset:
                    break
                rows += sum(segment.rows[: offset - segment.first_offset])
        return rows

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

    @staticmethod
    def _iterate(
        schema: pa.Schema, plan: list[tuple[_Segment, int, int, pa.Buffer]]
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        for segment, index, last, buffer in plan:
            kinds = segment.kinds
            for i in range(index, last):
                if kinds[i] != _BATCH:
                    continue  # a marker: no rows
                message = buffer.slice(segment.positions[i], segment.lengths[i])
                yield segment.first_offset + i, pa.ipc.read_record_batch(message, schema)

    @staticmethod
    def _iterate_entries(
        stream: _Stream, plan: list[tuple[_Segment, int, int, pa.Buffer]]
    ) -> Iterator[StreamEntry]:
        schema = stream.schema
        for segment, index, last, buffer in plan:
            for i in range(index, last):
                offset = segment.first_offset + i
                writer = stream.writer_name(segment.writers[i])
                kind = segment.kinds[i]
                if kind == _WATERMARK:
                    yield StreamEntry(offset, writer, watermark_ns=segment.values[i])
                elif kind == _END:
                    yield StreamEntry(offset, writer, end_of_input=True)
                else:
                    message = buffer.slice(segment.positions[i], segment.lengths[i])
                    yield StreamEntry(offset, writer, pa.ipc.read_record_batch(message, schema))

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the stream store is closed")

    def _get(self, name: str) -> _Stream:
        validate_stream_name(name)
        with self._lock:
            self._check_open()
            stream = self._streams.get(name)
        if stream is None:
            raise StreamNotFoundError(f"stream {name!r} does not exist")
        return stream

    def _get_or_create(self, name: str, schema: pa.Schema) -> _Stream:
        validate_stream_name(name)
        with self._lock:
            self._check_open()
            stream = self._streams.get(name)
            if stream is None:
                stream = self._create_locked(name, schema)
                self._streams[name] = stream
            return stream

    def _create_locked(self, name: str, schema: pa.Schema) -> _Stream:
        incarnation = str(uuid.uuid4())
        created_at = datetime.now(UTC)
        staged = self._staging / f"{name}.{incarnation}"
        final = self._root / name
        do_sync = self.fsync == "batch"
        try:
            staged.mkdir()
            meta = {
                "format": _FORMAT,
                "name": name,
                "incarnation": incarnation,
                "created_at": created_at.isoformat(),
            }
            _write_file(staged / _META_FILE, json.dumps(meta).encode(), do_sync)
            _write_file(staged / _SCHEMA_FILE, schema.serialize().to_pybytes(), do_sync)
            _write_file(staged / _segment_name(0), b"", do_sync)
            if do_sync:
                _fsync_dir(staged)
            if final.exists():  # a leftover that failed to load: keep it aside, never mix
                os.rename(final, self._trash / f"{name}.broken.{incarnation}")
            os.rename(staged, final)
            if do_sync:
                _fsync_dir(self._root)
        except OSError as exc:
            shutil.rmtree(staged, ignore_errors=True)
            raise StorageError(f"cannot create stream {name!r}: {exc}") from exc
        stream = _Stream(name, final, schema, incarnation, created_at)
        stream.segments.append(_Segment(final / _segment_name(0), 0))
        log.info("stream created", extra={"stream": name, "incarnation": incarnation})
        return stream

    def _drain(self, stream: _Stream, *, publish: bool) -> None:
        """Write the staged frames of ``stream`` to the file; with ``publish``, also sync them
        (``fsync="batch"``) and everything written before, and make them visible.

        Called with ``sync_lock`` held (and not ``cond``): frames reach the file in offset
        order, one drain at a time, while other threads go on staging frames.
        """
        with stream.cond:
            if stream.dropped or stream.failed is not None:
                return
            frames, stream.staged, stream.staged_bytes = stream.staged, [], 0
            target = (stream.written_offset, stream.written_rows, stream.written_bytes)
            if not frames and target[0] == stream.next_offset:
                return
        try:
            for frame in frames:
                if not frame.ready:  # a direct frame still being filled by its writer
                    with stream.cond:
                        stream.cond.wait_for(lambda frame=frame: frame.ready)  # type: ignore[misc]
                if frame.error is not None:
                    raise OSError(errno.EIO, f"encoding the batch failed: {frame.error}")
                if frame.segment is not stream.fd_segment or stream.fd is None:
                    self._open_segment(stream, frame.segment)
                self._write_staged(stream, frame)
        except OSError as exc:
            with stream.cond:
                self._discard_reserved(stream, frames)
            raise StorageError(f"cannot append to stream {stream.name!r}: {exc}") from exc
        if publish and self.fsync == "batch" and stream.fd is not None:
            try:
                _sync(stream.fd)
            except OSError as exc:
                with stream.cond:
                    stream.failed = _sync_failure(stream.name, exc)
                raise StorageError(stream.failed) from exc
        with stream.cond:
            self._buffers.give_back(frames)
            if publish:
                stream.publish(*target)

    def _open_segment(self, stream: _Stream, segment: _Segment) -> None:
        """Point the drains at ``segment`` (``sync_lock`` held): sync and close the segment
        written so far, then create ``segment``'s file if it is new, and open it."""
        if stream.fd is not None and stream.fd_segment is not segment:
            if self.fsync == "batch":
                _sync(stream.fd)  # an OSError here is a failed write: nothing is published
            self._close_fd(stream)
        if not segment.created:
            _write_file(segment.path, b"", self.fsync == "batch")
            if self.fsync == "batch":
                _fsync_dir(stream.directory)
            segment.created = True
        if stream.fd is None:
            stream.fd = os.open(segment.path, os.O_WRONLY)
            stream.fd_segment = segment

    def _write_staged(self, stream: _Stream, frame: _Staged) -> None:
        """Put one staged frame in the segment file (``sync_lock`` held)."""
        assert stream.fd is not None
        if frame.aligned is None:
            assert frame.body is not None
            _pwrite_all(stream.fd, frame.header, frame.position)
            _pwrite_all(stream.fd, memoryview(frame.body), frame.position + _HEADER.size)
            return
        view = memoryview(frame.aligned)[frame.prefix :]
        base = frame.position - frame.head
        first = 0
        if frame.head:  # the rest of a page that earlier frames began: through the page cache
            _pwrite_all(stream.fd, view[frame.head : _ALIGN], frame.position)
            first = _ALIGN
        if first < frame.size and self.direct_io:
            try:
                if stream.direct_fd is None:
                    flags = os.O_WRONLY | getattr(os, "O_DIRECT", 0)
                    stream.direct_fd = os.open(frame.segment.path, flags)
                written = os.pwrite(stream.direct_fd, view[first : frame.size], base + first)
                if written != frame.size - first:  # short: finish through the page cache
                    _pwrite_all(
                        stream.fd, view[first + written : frame.size], base + first + written
                    )
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct_io = False
                log.warning(
                    "O_DIRECT writes unavailable, using the page cache",
                    extra={"data_dir": str(self.data_dir), "error": str(exc)},
                )
        _pwrite_all(stream.fd, view[first : frame.size], base + first)

    def _discard_reserved(self, stream: _Stream, frames: list[_Staged]) -> None:
        """After a failed write (cond held): cut the file back to its durable frames and
        discard every offset reserved after them; their commits raise StorageError."""
        while len(stream.segments) > 1 and stream.segments[-1].first_offset >= stream.next_offset:
            dropped = stream.segments.pop()  # holds reserved frames only
            if dropped is stream.fd_segment:
                self._close_fd(stream)
            if dropped.created:
                with contextlib.suppress(OSError):
                    dropped.path.unlink()
        segment = stream.segments[-1]
        keep = stream.next_offset - segment.first_offset
        size = segment.positions[keep - 1] + segment.lengths[keep - 1] if keep else 0
        if segment.created:
            with contextlib.suppress(OSError):
                os.truncate(segment.path, size)
        del segment.positions[keep:]
        del segment.lengths[keep:]
        del segment.rows[keep:]
        del segment.writers[keep:]
        del segment.kinds[keep:]
        del segment.values[keep:]
        segment.size = size
        self._buffers.give_back(frames + stream.staged)
        stream.staged, stream.staged_bytes = [], 0
        stream.written_offset = stream.next_offset
        stream.written_rows = stream.num_rows
        stream.written_bytes = stream.num_bytes
        stream.epoch_ends.append(stream.next_offset)
        stream.epoch += 1

    def _retire(self, stream: _Stream) -> None:
        """Mark ``stream`` dropped (a drop, or the store closing) and close its files; staged
        frames are made durable first, so their commits succeed rather than fail."""
        with stream.sync_lock:
            with contextlib.suppress(StorageError):
                self._drain(stream, publish=True)
            with stream.cond:
                stream.dropped = True
                self._close_fd(stream)
                stream.cond.notify_all()

    @staticmethod
    def _close_fd(stream: _Stream) -> None:
        for fd in (stream.fd, stream.direct_fd):
            if fd is not None:
                os.close(fd)
        stream.fd = stream.direct_fd = None
        stream.fd_segment = None

    def _load(self, directory: Path) -> _Stream | None:
        """Open the stream in ``directory``, truncating a torn or corrupt tail."""
        try:
            meta = json.loads((directory / _META_FILE).read_text())
            if meta.get("format") != _FORMAT:
                raise ValueError(f"unknown stream format {meta.get('format')!r}")
            name = validate_stream_name(str(meta["name"]))
            if name != directory.name:
                raise ValueError(f"stream.json names {name!r}")
            schema = pa.ipc.read_schema(pa.py_buffer((directory / _SCHEMA_FILE).read_bytes()))
            stream = _Stream(
                name,
                directory,
                schema,
                str(meta["incarnation"]),
                datetime.fromisoformat(meta["created_at"]),
            )
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            log.error(
                "skipping unreadable stream directory",
                extra={"path": str(directory), "error": str(exc)},
            )
            return None
        stream.writer_names, stream.writer_ids = _read_writers(directory / _WRITERS_FILE)
        segment_paths = sorted(directory.glob("*" + _SEGMENT_SUFFIX))
        try:
            retained = json.loads((directory / _RETENTION_FILE).read_text())
            stream.rows_removed = int(retained["rows_removed"])
            removed_below = int(retained["first_offset"])
        except FileNotFoundError:
            removed_below = 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "unreadable retention record; rows removed before are not counted",
                extra={"path": str(directory), "error": str(exc)},
            )
            removed_below = 0
        for path in list(segment_paths):  # a removal cut short by a crash: finish it
            if path.stem.isdigit() and int(path.stem) < removed_below:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                segment_paths.remove(path)
        for i, path in enumerate(segment_paths):
            try:
                first = int(path.stem)
            except ValueError:
                first = -1
            if i == 0 and first >= 0:
                stream.next_offset = first  # retention may have removed older segments
            if first != stream.next_offset:  # not contiguous: the log ends before this file
                self._truncate_tail(stream, None, segment_paths[i:])
                break
            segment = _Segment(path, first)
            intact = self._scan(segment, verify_crc=i == len(segment_paths) - 1)
            stream.segments.append(segment)
            stream.next_offset += segment.count
            stream.num_rows += sum(segment.rows)
            stream.num_bytes += sum(segment.lengths)
            if not intact:
                self._truncate_tail(stream, segment, segment_paths[i + 1 :])
                break
        if stream.segments:
            stream.note(stream.segments[0].first_offset, stream.next_offset)
        stream.written_offset = stream.next_offset
        stream.written_rows = stream.num_rows
        stream.written_bytes = stream.num_bytes
        if not stream.segments:
            segment = _Segment(directory / _segment_name(stream.next_offset), stream.next_offset)
            _write_file(segment.path, b"", self.fsync == "batch")
            stream.segments.append(segment)
        return stream

    def _scan(self, segment: _Segment, verify_crc: bool) -> bool:
        """Index the frames of ``segment``; return ``False`` if it ends in a bad frame."""
        size = segment.path.stat().st_size
        if size == 0:
            return True
        with pa.memory_map(str(segment.path), "r") as mm:
            data = mm.read_buffer()
        view = memoryview(data)
        position = 0
        while position < size:
            magic = bytes(view[position : position + 4])
            if magic == _FRAME_MAGIC and size - position >= _HEADER.size:
                _, body_len, num_rows, crc, writer_id, kind = _HEADER.unpack_from(view, position)
                body_start = position + _HEADER.size
            elif magic == _FRAME_MAGIC_V1 and size - position >= _HEADER_V1.size:
                _, body_len, num_rows, crc = _HEADER_V1.unpack_from(view, position)
                writer_id, kind = 0, _BATCH
                body_start = position + _HEADER_V1.size
            else:
                return False
            if body_start + body_len > size or kind not in (_BATCH, _WATERMARK, _END):
                return False
            if verify_crc and zlib.crc32(view[body_start : body_start + body_len]) != crc:
                return False
            segment.positions.append(body_start)
            segment.lengths.append(body_len)
            segment.rows.append(num_rows)
            segment.writers.append(writer_id)
            segment.kinds.append(kind)
            segment.values.append(
                _VALUE.unpack_from(view, body_start)[0]
                if kind == _WATERMARK and body_len >= _VALUE.size
                else 0
            )
            position = body_start + body_len
            segment.size = position
        return True

    def _truncate_tail(self, stream: _Stream, segment: _Segment | None, later: list[Path]) -> None:
        """Cut ``segment`` after its last good frame and delete the segment files in ``later``."""
        kept = segment.size if segment is not None else 0
        dropped = sum(p.stat().st_size for p in later)
        if segment is not None:
            dropped += segment.path.stat().st_size - kept
        log.warning(
            "truncating a torn or corrupt stream tail",
            extra={
                "stream": stream.name,
                "segment": (segment.path if segment is not None else later[0]).name,
                "next_offset": stream.next_offset,
                "dropped_bytes": dropped,
            },
        )
        if segment is not None:
            os.truncate(segment.path, kept)
        for path in later:
            path.unlink()
        if self.fsync == "batch":
            _fsync_dir(stream.directory)
