"""Exactly-once sinks: a prepare / commit protocol per epoch (two-phase commit with the checkpoint).

Every sink of a checkpointed run goes through the same steps for epoch ``e``:

1. **write**: the rows of epoch ``e`` go to a place nobody reads as output yet;
2. **prepare** (at the barrier, before the manifest is written): the epoch's rows are made
   durable where a restore can find them, and the sink returns its **commit mark** for the
   manifest;
3. the checkpoint manifest of epoch ``e`` is written: from here on epoch ``e`` *is* committed;
4. **commit**: the epoch's rows become visible output. A crash between 3 and 4 is repaired by the
   next restore, which redoes the commit from the checkpoint (every commit is idempotent);
5. **recover** (on restore from checkpoint ``r``): commit what ``r`` says is committed, throw away
   everything of epochs after ``r``. The replay from ``r`` then produces those epochs again, so no
   row is lost, and none is written twice.

:class:`EpochFileSink` (the ``file`` connector)
    Epoch ``e``'s rows are appended to ``<path>.parts/<e>.arrow.pending`` (an Arrow IPC file,
    batches exactly as produced); prepare closes and ``fsync``-s it; commit renames it to
    ``<e>.arrow``. Recovery renames the pending parts of epochs ``≤ r`` and deletes every part
    of an epoch ``> r``. While the pipeline runs, its committed output is the parts in epoch order.
    When the pipeline reaches the end of its input, :meth:`EpochFileSink.finalize` writes ``path``
    in the sink's format (Parquet, CSV, JSON lines) from the parts, through the same writer as an
    unchecked run (so the file is byte for byte what a straight run writes), moves it into place,
    and removes the parts.

:class:`EpochStreamSink` (a stream of the server)
    Epoch ``e``'s batches are held in memory; prepare stages them in the checkpoint itself
    (``sink-<name>.arrow``) with the commit mark (the stream offset after this sink's last
    committed batch); commit appends them to the stream (each append durable). Recovery reads the
    stream from the mark and matches the staged batches, in order, against what is there: a batch
    already in the stream (a commit cut short by the crash, or a replay of an epoch committed after
    the checkpoint it resumes from) is skipped, so the stream holds every result batch once.
    The stream is the sink's own: a batch another writer appended is passed over, never taken
    for ours unless it is identical to ours, column for column.

Replay semantics, in one line: after a crash the output holds exactly the results of the epochs
whose checkpoint completed, and the resumed run adds the rest, each once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from flight_serve._arrow import ipc_bytes, same_rows
from flight_serve._fs import fsync_dir
from flight_serve.connectors.file import FileSink
from flight_serve.errors import CheckpointError, ConnectorError, DiskFullError, is_disk_full

__all__ = [
    "EpochFileSink",
    "EpochStreamSink",
    "StagedEpochSink",
    "StreamTarget",
]

_PART = re.compile(r"(\d{10})\.arrow(\.pending)?")


class EpochFileSink:
    """The file sink of a checkpointed run (see the module docstring).

    Args:
        name: the sink's name (for messages).
        path: the output file.
        format: ``parquet``, ``csv`` or ``jsonl``.
        schema: the schema of every batch.
        restored_epoch: the checkpoint the run resumes from, or ``None`` for a fresh run (which
            removes the parts of any earlier run).
        rows: rows committed before (from the checkpoint).
        finished: the checkpoint resumed from is the finished one: only :meth:`finalize` is
            left to do (if a crash interrupted it).
    """

    def __init__(
        self,
        name: str,
        path: Path,
        format: str,
        schema: pa.Schema,
        *,
        restored_epoch: int | None,
        rows: int = 0,
        finished: bool = False,
    ) -> None:
        self.name = name
        self.path = path
        self.format = format
        self.schema = schema
        self.parts = path.with_name(path.name + ".parts")
        self._done = path.with_name(path.name + ".parts.done")
        self.rows = rows
        self.epoch = (restored_epoch or 0) + 1  # the epoch being written
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._file: pa.NativeFile | None = None
        self._epoch_rows = 0
        self._prepared = False
        try:
            shutil.rmtree(self._done, ignore_errors=True)
            if restored_epoch is None:
                shutil.rmtree(self.parts, ignore_errors=True)
            else:
                self._recover_parts(restored_epoch)
            if not finished:  # the parts directory exists until the file is written
                self.parts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"file sink {name}: cannot prepare {self.parts}: {exc}"
            raise (DiskFullError if is_disk_full(exc) else ConnectorError)(message) from exc

    def _part(self, epoch: int, pending: bool) -> Path:
        return self.parts / f"{epoch:010d}.arrow{'.pending' if pending else ''}"

    def recover(self, staged: list[pa.RecordBatch]) -> None:
        """Nothing left to redo: a file sink stages no rows in the checkpoint, and building it
        from a checkpoint already published that epoch's parts and deleted the later ones."""

    def _recover_parts(self, epoch: int) -> None:
        """Commit the prepared parts of epochs ``≤ epoch``; delete every part after it."""
        if not self.parts.is_dir():
            return
        for entry in sorted(self.parts.iterdir()):
            match = _PART.fullmatch(entry.name)
            if match is None:
                entry.unlink()
                continue
            part_epoch, pending = int(match.group(1)), match.group(2) is not None
            if part_epoch > epoch:
                entry.unlink()
            elif pending:
                entry.rename(self._part(part_epoch, pending=False))
        fsync_dir(self.parts)

    @property
    def has_pending(self) -> bool:
        """Whether rows wait for the next checkpoint."""
        return self._epoch_rows > 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` to the current epoch's pending part."""
        if not batch.num_rows:
            return
        if self._writer is None:
            self._file = pa.OSFile(str(self._part(self.epoch, pending=True)), "wb")
            self._writer = pa.ipc.new_file(self._file, self.schema)
        self._writer.write_batch(batch)
        self._epoch_rows += batch.num_rows

    def _close_part(self, sync: bool) -> None:
        if self._writer is not None:
            self._writer.close()
            assert self._file is not None
            self._file.close()
            if sync:
                fd = os.open(self._part(self.epoch, pending=True), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self._writer = self._file = None

    def prepare(self, epoch: int, files: dict[str, bytes] | None = None) -> dict[str, Any]:
        """Make epoch ``epoch``'s part durable; return the commit mark for the manifest (the part
        lives beside the output file: nothing goes into the checkpoint's ``files``)."""
        assert epoch == self.epoch, (epoch, self.epoch)
        self._close_part(sync=True)
        self.rows += self._epoch_rows
        self._prepared = self._epoch_rows > 0
        self._epoch_rows = 0
        self.epoch = epoch + 1  # rows from now on belong to the next epoch
        return {"kind": "file", "path": str(self.path), "through_epoch": epoch, "rows": self.rows}

    def commit(self, epoch: int) -> None:
        """Epoch ``epoch`` is in a complete checkpoint: publish its part."""
        if self._prepared:
            self._part(epoch, pending=True).rename(self._part(epoch, pending=False))
            fsync_dir(self.parts)
        self._prepared = False

    def committed_parts(self) -> Iterator[Path]:
        """The committed parts, in epoch order."""
        if self.parts.is_dir():
            for entry in sorted(self.parts.iterdir()):
                match = _PART.fullmatch(entry.name)
                if match is not None and match.group(2) is None:
                    yield entry

    def end_input(self) -> None:
        """The pipeline reached the end of its input: :meth:`finalize`."""
        self.finalize()

    def finalize(self) -> None:
        """The pipeline reached the end of its input and its last epoch is committed: write
        ``path`` from the parts (as an unchecked run writes it), then remove the parts.

        Idempotent: a crash in the middle is finished by the next restore of the final
        checkpoint.
        """
        if not self.parts.is_dir():
            return  # finalized already
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        writer = FileSink(tmp, self.format, self.schema)
        try:
            for part in self.committed_parts():
                with pa.memory_map(str(part)) as source:
                    reader = pa.ipc.open_file(source)
                    for i in range(reader.num_record_batches):
                        writer.write(reader.get_batch(i))
        finally:
            writer.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        tmp.replace(self.path)
        self.parts.rename(self._done)  # the parts are spent: a crash from here on is harmless
        fsync_dir(self.path.parent)
        shutil.rmtree(self._done, ignore_errors=True)

    def close(self) -> None:
        """Close the current part without committing it (a failed or stopped run)."""
        with contextlib.suppress(OSError, pa.ArrowException):
            self._close_part(sync=False)


class StreamTarget(Protocol):
    """A stream an :class:`EpochStreamSink` appends to (the server's store, directly)."""

    @property
    def name(self) -> str:
        """The stream name."""

    def incarnation(self) -> str | None:
        """The stream's incarnation (``None`` if it does not exist)."""

    def next_offset(self) -> int:
        """The offset the next entry gets (0 if the stream does not exist)."""

    def entries(self, start: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """``(offset, batch)`` of the batches from ``start`` on that may be this sink's."""

    def append(self, batch: pa.RecordBatch) -> int:
        """Append ``batch`` durably; return its offset."""

    def end_input(self) -> None:
        """Mark the end of this sink's input in the stream (idempotent)."""

    def committed(self) -> None:
        """The batches of one commit are all appended (a remote target ends its call)."""

    def close(self) -> None:
        """Release connections (the run ends or failed); never raises."""


_appends = 0


def _crash_after_append() -> None:
    """Fault injection for tests (never set in production): ``FLIGHT_SERVE_CRASH_AT=append:N``
    SIGKILLs the process right after the N-th batch a stream sink of this process committed
    (a crash in the middle of an epoch's commit)."""
    global _appends
    _appends += 1
    if os.environ.get("FLIGHT_SERVE_CRASH_AT") == f"append:{_appends}":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # pragma: no cover  (the signal is delivered asynchronously)


class EpochStreamSink:
    """The stream sink of a checkpointed run (see the module docstring).

    Args:
        name: the sink's name; its staged output is the checkpoint file ``sink-<name>.arrow``.
        target: the stream.
        schema: the schema of every batch.
        mark: from the checkpoint resumed from, the commit mark (``None`` for a fresh run: the
            stream's end now).
        incarnation: from the checkpoint, the stream's incarnation then (``None``: it did not
            exist yet).
        rows: rows committed before (from the checkpoint).

    Raises:
        CheckpointError: the stream was dropped and re-created since the checkpoint.
    """

    def __init__(
        self,
        name: str,
        target: StreamTarget,
        schema: pa.Schema,
        *,
        mark: int | None = None,
        incarnation: str | None = None,
        rows: int = 0,
    ) -> None:
        self.name = name
        self.target = target
        self.schema = schema
        self.rows = rows
        self.file = f"sink-{name}.arrow"
        self._buffer: list[pa.RecordBatch] = []
        self._staged: list[pa.RecordBatch] = []
        self._tail: list[tuple[int, pa.RecordBatch]] = []
        self.skipped = 0  # batches found in the stream already (not appended again)
        now = target.incarnation()
        if mark is None:
            self.mark, self.incarnation = target.next_offset(), now
            return
        if incarnation is not None and now != incarnation:
            raise CheckpointError(
                f"sink {name}: stream {target.name!r} was dropped or re-created since the "
                f"checkpoint (incarnation {incarnation}, now {now or 'none'}); its committed "
                "results are gone: start the pipeline over (--fresh, or cancel and submit again)"
            )
        self.mark, self.incarnation = mark, now
        if now is not None:
            self._tail = list(target.entries(mark))

    @property
    def has_pending(self) -> bool:
        """Whether rows wait for the next checkpoint."""
        return bool(self._buffer)

    def recover(self, staged: list[pa.RecordBatch]) -> None:
        """Redo the commit of the checkpoint resumed from (its staged batches)."""
        self._staged = staged
        self._commit_staged()

    def write(self, batch: pa.RecordBatch) -> None:
        """Hold ``batch`` for the current epoch."""
        if batch.num_rows:
            self._buffer.append(batch)

    def prepare(self, epoch: int, files: dict[str, bytes]) -> dict[str, Any]:
        """Stage the epoch's batches in the checkpoint (``files``); return the commit mark."""
        self._staged, self._buffer = self._buffer, []
        self.rows += sum(b.num_rows for b in self._staged)
        entry: dict[str, Any] = {
            "kind": "stream",
            "stream": self.target.name,
            "incarnation": self.incarnation,
            "mark": self.mark,
            "rows": self.rows,
            "staged": None,
        }
        if self._staged:
            files[self.file] = ipc_bytes(self.schema, self._staged)
            entry["staged"] = self.file
        return entry

    def commit(self, epoch: int) -> None:
        """Epoch ``epoch`` is in a complete checkpoint: append its batches to the stream."""
        self._commit_staged()

    def _commit_staged(self) -> None:
        staged = self._staged
        done = 0
        while done < len(staged) and self._tail:
            batch = staged[done]
            found = next(
                (i for i, (_, old) in enumerate(self._tail) if same_rows(old, batch)), None
            )
            if found is None:
                break
            self.mark = self._tail[found][0] + 1  # committed before the crash: skip it
            self._tail = self._tail[found + 1 :]
            self.skipped += 1
            done += 1
        rest = staged[done:]
        if rest:
            self._tail = []  # ours are appended in order: nothing after an append is ours
        append_many = getattr(self.target, "append_many", None)
        if rest and append_many is not None:  # a remote target: sent ahead of their PutResults
            self.mark = append_many(rest, _crash_after_append)[-1] + 1
        else:
            for batch in rest:
                self.mark = self.target.append(batch) + 1
                _crash_after_append()
        if rest and self.incarnation is None:
            self.incarnation = self.target.incarnation()
        if staged:
            self.target.committed()
        self._staged = []

    def end_input(self) -> None:
        """The pipeline's input ended and its last epoch is committed: end the sink's writer
        in the stream (readers' windows over it close). Idempotent."""
        self.target.end_input()

    def close(self) -> None:
        """Drop what was not committed (it is replayed from the last checkpoint)."""
        self._buffer = []
        self._staged = []
        self.target.close()


class StagedEpochSink(ABC):
    """The epoch protocol of a sink into an outside system that marks its own commits (an
    Iceberg table, a FalkorDB graph): an epoch's batches are held in memory, staged in the
    checkpoint at prepare (``sink-<name>.arrow``, Arrow IPC), and written out at commit by
    :meth:`apply`, which must be idempotent per epoch (the outside system's marker).

    Subclasses give :meth:`apply`, :meth:`mark` (their fields of the commit mark) and recovery.
    """

    def __init__(self, name: str, rows: int = 0) -> None:
        self.name = name
        self.file = f"sink-{name}.arrow"
        self.rows = rows
        self._buffer: list[pa.RecordBatch] = []
        self._staged: list[pa.RecordBatch] = []
        self._staged_epoch = 0

    @abstractmethod
    def apply(self, epoch: int, batches: list[pa.RecordBatch]) -> None:
        """Write ``batches`` (not empty) as epoch ``epoch``; a no-op if that epoch is there."""

    @abstractmethod
    def mark(self) -> dict[str, Any]:
        """The sink's own fields of the commit mark (``kind`` and where it writes)."""

    @property
    def has_pending(self) -> bool:
        """Whether rows wait for the next checkpoint."""
        return bool(self._buffer)

    def write(self, batch: pa.RecordBatch) -> None:
        """Hold ``batch`` for the current epoch."""
        if batch.num_rows:
            self._buffer.append(batch)

    def prepare(self, epoch: int, files: dict[str, bytes]) -> dict[str, Any]:
        """Stage the epoch's batches in the checkpoint (``files``); return the commit mark:
        :meth:`mark`, the rows so far and the staged file (``None`` without rows)."""
        self._staged, self._buffer = self._buffer, []
        self._staged_epoch = epoch
        self.rows += sum(b.num_rows for b in self._staged)
        entry: dict[str, Any] = {**self.mark(), "rows": self.rows, "staged": None}
        if self._staged:
            files[self.file] = ipc_bytes(self._staged[0].schema, self._staged)
            entry["staged"] = self.file
        return entry

    def commit(self, epoch: int) -> None:
        """Epoch ``epoch`` is in a complete checkpoint: write its staged batches out."""
        if self._staged:
            self.apply(epoch, self._staged)
        self._staged = []

    def end_input(self) -> None:  # noqa: B027 - a no-op for every subclass
        """Nothing to mark: a table or a graph has no end of input."""

    def close(self) -> None:
        """Drop what was not committed (it is replayed from the last checkpoint)."""
        self._buffer = []
        self._staged = []
