"""The in-memory index of one segment file: where each frame's body is, and what it holds."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from flight_serve.errors import StreamNotFoundError

__all__ = ["Segment", "locate"]


class Segment:
    """One segment file: the index of its frames (entry ``i`` has offset ``first_offset + i``)
    plus a lazily (re)mapped read buffer.

    The index is kept column-wise in typed arrays (8 bytes or less per frame and column, for
    logs of millions of entries); :meth:`append` and :meth:`truncate` are the only writers.

    Attributes:
        path: the segment file.
        first_offset: offset of its first entry (the file's name).
        size: bytes of valid (and reserved) frames.
        created: ``False`` until the first drain into it creates the file.
    """

    def __init__(self, path: Path, first_offset: int, *, created: bool = True) -> None:
        self.path = path
        self.first_offset = first_offset
        self.positions: array[int] = array("Q")  # byte position of each frame body
        self.lengths: array[int] = array("Q")  # body length of each frame
        self.rows: array[int] = array("Q")
        self.writers: array[int] = array("I")  # writer id of each frame
        self.kinds: array[int] = array("B")  # frames.BATCH, WATERMARK or END
        self.values: array[int] = array("q")  # a watermark marker's watermark, else 0
        self.size = 0
        self.created = created
        self._mapped: pa.Buffer | None = None

    @property
    def count(self) -> int:
        """Entries in the segment."""
        return len(self.positions)

    def append(
        self, position: int, length: int, rows: int, writer: int, kind: int, value: int
    ) -> None:
        """Index one more frame: its body at byte ``position`` of ``length`` bytes (padding
        included), ``rows`` rows, written by writer id ``writer``, of ``kind`` (with a
        watermark marker's ``value``); :attr:`size` becomes its end."""
        self.positions.append(position)
        self.lengths.append(length)
        self.rows.append(rows)
        self.writers.append(writer)
        self.kinds.append(kind)
        self.values.append(value)
        self.size = position + length

    def end(self, keep: int) -> int:
        """Byte position where the first ``keep`` frames end (0 for none)."""
        return self.positions[keep - 1] + self.lengths[keep - 1] if keep else 0

    def truncate(self, keep: int) -> int:
        """Forget every frame after the first ``keep``; return (and set) the new :attr:`size`."""
        size = self.end(keep)
        del self.positions[keep:]
        del self.lengths[keep:]
        del self.rows[keep:]
        del self.writers[keep:]
        del self.kinds[keep:]
        del self.values[keep:]
        self.size = size
        return size

    def num_rows(self) -> int:
        """Rows of all its frames."""
        return sum(self.rows)

    def num_bytes(self) -> int:
        """Bytes of all its frame bodies (padding included, headers not)."""
        return sum(self.lengths)

    def buffer_covering(self, end: int) -> pa.Buffer:
        """Return a zero-copy buffer over the file mapping covering bytes ``[0, end)``.

        Called with the stream lock held.

        Raises:
            StreamNotFoundError: the file is gone (the stream was dropped meanwhile).
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


def locate(segments: Sequence[Segment], offset: int) -> tuple[Segment, int]:
    """Return the segment of ``segments`` (ascending, contiguous, non-empty) holding ``offset``
    and the frame index inside it."""
    lo, hi = 0, len(segments) - 1
    while lo < hi:  # last segment whose first_offset <= offset
        mid = (lo + hi + 1) // 2
        if segments[mid].first_offset <= offset:
            lo = mid
        else:
            hi = mid - 1
    segment = segments[lo]
    return segment, offset - segment.first_offset
