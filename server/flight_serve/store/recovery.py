"""Opening a stream directory after a restart or a crash: read its metadata and writers,
finish a retention removal a crash cut short, index every segment's frames, and cut a torn or
corrupt tail (see "Recovery" in :mod:`flight_serve.store.streams`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from flight_serve._fs import fsync_dir, write_file
from flight_serve.store.frames import (
    BATCH,
    END,
    FORMAT,
    FRAME_MAGIC,
    FRAME_MAGIC_V1,
    HEADER,
    HEADER_V1,
    META_FILE,
    RETENTION_FILE,
    SCHEMA_FILE,
    SEGMENT_SUFFIX,
    VALUE,
    WATERMARK,
    WRITERS_FILE,
    crc32,
    read_writers,
    segment_name,
)
from flight_serve.store.log import LogSettings, StreamLog
from flight_serve.store.names import validate_stream_name
from flight_serve.store.segment import Segment

__all__ = ["load", "scan"]

log = logging.getLogger("flight_serve.store.streams")


def load(directory: Path, settings: LogSettings) -> StreamLog | None:
    """Open the stream in ``directory``, truncating a torn or corrupt tail; ``None`` (logged as
    an error) for a directory that is not a readable stream."""
    try:
        meta = json.loads((directory / META_FILE).read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"unknown stream format {meta.get('format')!r}")
        name = validate_stream_name(str(meta["name"]))
        if name != directory.name:
            raise ValueError(f"stream.json names {name!r}")
        schema = pa.ipc.read_schema(pa.py_buffer((directory / SCHEMA_FILE).read_bytes()))
        stream = StreamLog(
            name,
            directory,
            schema,
            str(meta["incarnation"]),
            datetime.fromisoformat(meta["created_at"]),
            settings,
        )
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        log.error(
            "skipping unreadable stream directory",
            extra={"path": str(directory), "error": str(exc)},
        )
        return None
    stream.writer_names, stream.writer_ids = read_writers(directory / WRITERS_FILE)
    segment_paths = sorted(directory.glob("*" + SEGMENT_SUFFIX))
    try:
        retained = json.loads((directory / RETENTION_FILE).read_text())
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
            _truncate_tail(stream, None, segment_paths[i:])
            break
        segment = Segment(path, first)
        intact = scan(segment, verify_crc=i == len(segment_paths) - 1)
        stream.segments.append(segment)
        stream.next_offset += segment.count
        stream.num_rows += segment.num_rows()
        stream.num_bytes += segment.num_bytes()
        if not intact:
            _truncate_tail(stream, segment, segment_paths[i + 1 :])
            break
    if stream.segments:
        stream.note(stream.segments[0].first_offset, stream.next_offset)
    stream.written_offset = stream.next_offset
    stream.written_rows = stream.num_rows
    stream.written_bytes = stream.num_bytes
    stream.in_file = (stream.next_offset, stream.num_rows, stream.num_bytes)
    if not stream.segments:
        segment = Segment(directory / segment_name(stream.next_offset), stream.next_offset)
        write_file(segment.path, b"", fsync=settings.fsync == "batch")
        stream.segments.append(segment)
    return stream


def scan(segment: Segment, verify_crc: bool) -> bool:
    """Index the frames of ``segment``'s file; return ``False`` if it ends in a bad frame (its
    :attr:`~Segment.size` is then where the good frames end)."""
    size = segment.path.stat().st_size
    if size == 0:
        return True
    with pa.memory_map(str(segment.path), "r") as mm:
        data = mm.read_buffer()
    view = memoryview(data)
    position = 0
    while position < size:
        magic = bytes(view[position : position + 4])
        if magic == FRAME_MAGIC and size - position >= HEADER.size:
            _, body_len, num_rows, crc, writer_id, kind = HEADER.unpack_from(view, position)
            body_start = position + HEADER.size
        elif magic == FRAME_MAGIC_V1 and size - position >= HEADER_V1.size:
            _, body_len, num_rows, crc = HEADER_V1.unpack_from(view, position)
            writer_id, kind = 0, BATCH
            body_start = position + HEADER_V1.size
        else:
            return False
        if body_start + body_len > size or kind not in (BATCH, WATERMARK, END):
            return False
        if verify_crc and crc32(view[body_start : body_start + body_len]) != crc:
            return False
        value = (
            VALUE.unpack_from(view, body_start)[0]
            if kind == WATERMARK and body_len >= VALUE.size
            else 0
        )
        segment.append(body_start, body_len, num_rows, writer_id, kind, value)
        position = body_start + body_len
    return True


def _truncate_tail(stream: StreamLog, segment: Segment | None, later: list[Path]) -> None:
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
    if stream.settings.fsync == "batch":
        fsync_dir(stream.directory)
