"""The ``stdout`` sink of embedded runs: rows printed as they arrive.

Formats (option ``format``):

* ``table`` (default): each batch of results that arrives (the windows one step closed, or the
  rows one input batch produced) is printed as a table (rich), titled with the sink's name;
* ``csv``: a header once, then one line per row (pyarrow's CSV writer);
* ``jsonl``: one JSON object per row; timestamps as ISO 8601 strings.

Nothing is buffered across batches, so a result shows as soon as its window closes. Replay: a rerun
prints everything again.
"""

from __future__ import annotations

import io
import json
import sys
from datetime import date, datetime, time
from decimal import Decimal
from typing import Final, TextIO

import pyarrow as pa
import pyarrow.csv as pacsv

from flight_serve.errors import ConnectorError

__all__ = ["STDOUT_FORMATS", "StdoutSink"]

STDOUT_FORMATS: Final = ("table", "csv", "jsonl")


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, datetime | date | time):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _json_value(value: object) -> object:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


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
            pacsv.write_csv(batch, buffer, write_options=options)
            self._header_written = True
            self.stream.write(buffer.getvalue().decode("utf-8"))
        elif self.format == "jsonl":
            for row in batch.to_pylist():
                line = json.dumps(row, default=_json_value, ensure_ascii=False)
                self.stream.write(line + "\n")
        else:
            self._print_table(batch)
        self.stream.flush()

    def _print_table(self, batch: pa.RecordBatch) -> None:
        from rich.console import Console  # lazily: only runs that print tables pay for rich
        from rich.table import Table

        view = Table(title=self.name, title_justify="left")
        for field in batch.schema:
            numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
            view.add_column(field.name, justify="right" if numeric else "left")
        for row in batch.to_pylist():
            view.add_row(*[_cell(v) for v in row.values()])
        stream = self.stream
        # a pipe or file has no width: do not squeeze the table into rich's default 80 columns
        width = None if stream.isatty() else 200
        Console(file=stream, width=width, soft_wrap=True).print(view)

    def close(self) -> None:
        """Flush the output stream."""
        self.stream.flush()
