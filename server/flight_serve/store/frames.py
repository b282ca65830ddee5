"""The on-disk format of a stream directory: file names, the frame header, frame kinds, and
the writers file (see :mod:`flight_serve.store.streams` for the layout)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pyarrow as pa

# The frame checksum: CRC-32 with zlib's polynomial and values (``zlib.crc32(body)``), computed
# by zlib-ng's SIMD code (PCLMULQDQ / VPCLMULQDQ on x86-64): ~48 GB/s on this VM against
# stdlib zlib's ~4.5 GB/s, which cost ~0.1 s of CPU per 484 MB DoPut. Both release the GIL.
try:
    from zlib_ng.zlib_ng import crc32 as crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; the values are the same
    from zlib import crc32 as crc32

FORMAT = 1
FRAME_MAGIC = b"FSF2"
HEADER = struct.Struct("<4sQQIIB3x")  # magic, body_len, num_rows, crc32(body), writer, kind
FRAME_MAGIC_V1 = b"FSF1"
HEADER_V1 = struct.Struct("<4sQQI")  # magic, body_len, num_rows, crc32(body)
#: Frame kinds: a batch, a watermark marker, an end-of-input marker.
BATCH, WATERMARK, END = 0, 1, 2
#: The body of a watermark marker: the watermark, i64 ns since the epoch.
VALUE = struct.Struct("<q")
#: Frames with an IPC message at least this large are written with O_DIRECT (when available).
DIRECT_MIN_BYTES = 1 << 20
#: O_DIRECT alignment of file offsets, lengths and memory (covers 512 and 4096 byte sectors).
ALIGN = 4096
ZEROS = bytes(ALIGN)
IPC_CONTINUATION = b"\xff\xff\xff\xff"

SEGMENT_SUFFIX = ".seg"
META_FILE = "stream.json"
SCHEMA_FILE = "schema.arrow"
RETENTION_FILE = "retention.json"
WRITERS_FILE = "writers.jsonl"


def segment_name(first_offset: int) -> str:
    """The file name of the segment whose first entry has offset ``first_offset``.

    >>> segment_name(12345)
    '00000000000000012345.seg'
    """
    return f"{first_offset:020d}{SEGMENT_SUFFIX}"


def schema_message_bytes(schema: pa.Schema) -> int:
    """Length of the schema message an IPC stream writer puts before the first batch."""
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, schema).close()
    return int(sink.getvalue().size) - 8  # less the end-of-stream marker


def read_writers(path: Path) -> tuple[list[str], dict[str, int]]:
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


def pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    """Write all of ``data`` at file position ``position`` (``pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written
