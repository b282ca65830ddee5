"""The ``stdout`` sink of embedded runs: rows printed as they arrive.

Formats (option ``format``):

* ``table`` (default): each batch of results that arrives (the windows one step closed, or the
  rows one input batch produced) is printed as a table (rich), titled with the sink's name;
* ``csv``: a header once, then one line per row (pyarrow's CSV writer);
* ``jsonl``: one JSON object per row; timestamps and durations as ISO 8601 strings.

A list, struct or map cell (which pyarrow's CSV writer refuses) prints as its JSON text, as in
``jsonl`` (a map as a list of ``[key, value]`` pairs), in a quoted CSV field or a table cell; bytes
print as hex in every format; a null is an empty CSV field, ``NULL`` in a table.

Nothing is buffered across batches, so a result shows as soon as its window closes. Replay: a rerun
prints everything again.
"""

from __future__ import annotations

import io
import json
import sys
from datetime import date, datetime, time
from typing import Any, Final, TextIO

import pyarrow as pa
import pyarrow.csv as pacsv

from flight_serve.connectors.columns import json_value
from flight_serve.errors import ConnectorError

__all__ = ["STDOUT_FORMATS", "StdoutSink"]

STDOUT_FORMATS: Final = ("table", "csv", "jsonl")


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list | dict):
        return _json_text(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime | date | time):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _json_text(value: object) -> str:
    return json.dumps(value, default=json_value, ensure_ascii=False)


def _needs_text(t: pa.DataType) -> bool:
    """Whether pyarrow's CSV writer refuses (or may refuse) a column of type ``t``."""
    if pa.types.is_dictionary(t):
        return _needs_text(t.value_type)
    return (
        pa.types.is_nested(t)
        or pa.types.is_interval(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def _csv_text(value: object) -> str | None:
    if value is None:
        return None
    return value.hex() if isinstance(value, bytes) else _json_text(value)


def _csv_ready(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each list, struct, map, interval or binary column as JSON text (hex for
    bytes); nulls stay null. Other columns are untouched."""
    if not any(_needs_text(f.type) for f in batch.schema):
        return batch
    columns: list[pa.Array[Any]] = []
    fields: list[pa.Field[Any]] = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if _needs_text(field.type):
            texts = [_csv_text(v) for v in column.to_pylist()]
            column = pa.array(texts, pa.string())
            field = pa.field(field.name, pa.string())
        columns.append(column)
        fields.append(field)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


class StdoutSink:
    """Prints every batch written to it (see the module docstring).

    Args:
        name: the sink's name (the title of each table).
        schema: the schema of every batch written.
        format: ``table``, ``csv`` or ``jsonl``.
        stream: where to print (default: ``sys.stdout`` at the time of each write).

    Raises:
        ConnectorError: an unknown format.
    """

    def __init__(
        self, name: str, schema: pa.Schema, format: str = "table", stream: TextIO | None = None
    ) -> None:
        fmt = format.lower()
        if fmt not in STDOUT_FORMATS:
            raise ConnectorError(
                f"stdout connector: unknown format {format!r}; use {', '.join(STDOUT_FORMATS)}"
            )
        self.name = name
        self.schema = schema
        self.format = fmt
        self.rows = 0
        self._stream = stream
        self._header_written = False

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def write(self, batch: pa.RecordBatch) -> None:
        """Print ``batch`` now (nothing for an empty batch)."""
        if not batch.num_rows:
            return
        self.rows += batch.num_rows
        if self.format == "csv":
            buffer = io.BytesIO()
            options = pacsv.WriteOptions(include_header=not self._header_written)
            pacsv.write_csv(_csv_ready(batch), buffer, write_options=options)
            self._header_written = True
            self.stream.write(buffer.getvalue().decode("utf-8"))
        elif self.format == "jsonl":
            for row in batch.to_pylist():
                line = json.dumps(row, default=json_value, ensure_ascii=False)
                self.stream.write(line + "\n")
        else:
            self._print_table(batch)
        self.stream.flush()

    def _print_table(self, batch: pa.RecordBatch) -> None:
        from rich.console import Console  # lazily: only runs that print tables pay for rich
        from rich.table import Table
        from rich.text import Text

        # Text, not str: rich would read square brackets in a value as markup ("[red]" vanished)
        view = Table(title=Text(self.name), title_justify="left")
        for field in batch.schema:
            numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
            view.add_column(Text(field.name), justify="right" if numeric else "left")
        for row in batch.to_pylist():
            view.add_row(*[Text(_cell(v)) for v in row.values()])
        stream = self.stream
        # a pipe or file has no width: do not squeeze the table into rich's default 80 columns
        width = None if stream.isatty() else 200
        Console(file=stream, width=width, soft_wrap=True).print(view)

    def end_input(self) -> None:
        """Nothing to mark at the end of input (:class:`~flight_serve.connectors.base.Sink`)."""

    def close(self) -> None:
        """Flush the output stream."""
        self.stream.flush()
