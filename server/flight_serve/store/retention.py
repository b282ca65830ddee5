"""Retention: removing whole, closed segments of a stream, oldest first, past a byte or an age
limit (see :meth:`flight_serve.store.streams.StreamStore.enforce_retention`)."""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime, timedelta

from flight_serve._fs import fsync_dir, replace_file
from flight_serve.store.frames import RETENTION_FILE
from flight_serve.store.log import StreamLog
from flight_serve.store.segment import Segment

__all__ = ["retain"]

log = logging.getLogger("flight_serve.store.streams")


def retain(
    stream: StreamLog, limit_bytes: int | None, limit_age: timedelta | None, now: datetime
) -> int:
    """Remove the segments of ``stream`` that the limits let go at ``now``; return how many.

    A segment is closed (removable) once it is not the one being written, the next one's file
    exists and its entries are all visible. The removal is recorded in ``retention.json``
    before the files go, so a restart finishes one a crash cut short (see
    :func:`~flight_serve.store.recovery.load`).
    """
    if limit_bytes is None and limit_age is None:
        return 0
    do_sync = stream.settings.fsync == "batch"
    cutoff_ns = None if limit_age is None else int((now - limit_age).timestamp() * 1_000_000_000)
    gone: list[Segment] = []
    with stream.write_lock, stream.sync_lock, stream.cond:  # no drain or sync in progress
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
            rows, num_bytes = segment.num_rows(), segment.num_bytes()
            stream.num_rows -= rows
            stream.num_bytes -= num_bytes
            stream.written_rows -= rows
            stream.written_bytes -= num_bytes
            in_file = stream.in_file
            stream.in_file = (in_file[0], in_file[1] - rows, in_file[2] - num_bytes)
            gone.append(segment)
        if not gone:
            return 0
        stream.rows_removed += sum(segment.num_rows() for segment in gone)
        record = {
            "first_offset": stream.segments[0].first_offset,
            "rows_removed": stream.rows_removed,
        }
        try:  # first: a restart finishes a removal this record names (see recovery.load)
            replace_file(
                stream.directory / RETENTION_FILE, json.dumps(record).encode(), fsync=do_sync
            )
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
        if do_sync:
            with contextlib.suppress(OSError):
                fsync_dir(stream.directory)
        first = stream.segments[0].first_offset
    log.info(
        "retention removed segments",
        extra={"stream": stream.name, "segments": len(gone), "first_offset": first},
    )
    return len(gone)
