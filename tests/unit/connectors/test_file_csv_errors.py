"""A CSV file with a bad row fails the read with the file's line, and for a value that does not
convert the column's name and the value (connectors/file.py). pyarrow's own messages name
neither the line nor the column (``In CSV column #1: CSV conversion error to int64: invalid
value 'zzz'``, ``CSV parse error: Expected 3 columns, got 4: …``). Empty lines, which the reader
skips, still count in the line numbers a text editor shows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from flight_serve.connectors.file import FileSource
from flight_serve.errors import ConnectorError

DECLARED = pa.schema([("k", pa.string()), ("v", pa.int64()), ("t", pa.timestamp("us"))])


def read(path: Path, schema: pa.Schema | None) -> list[pa.RecordBatch]:
    source = FileSource((path,), "csv", batch_rows=2, schema=schema, name="s")
    return list(source.read_file(0))


@pytest.mark.parametrize(
    ("rows", "schema", "message"),
    [
        (  # line 1 the header, line 2 empty
            "k,v,t\n\na,1,2026-01-01 00:00:00\nb,2,2026-01-01 00:00:10\n"
            "c,zzz,2026-01-01 00:00:20\n",
            DECLARED,
            "line 5, column v (int64): cannot convert 'zzz'",
        ),
        (
            "k,v,t\na,1,2026-01-01 00:00:00\nb,2,never\n",
            DECLARED,
            "line 3, column t (timestamp[us]): cannot convert 'never'",
        ),
        (
            "k,v,t\n\na,1,2026-01-01 00:00:00\nc,3,2026-01-01 00:00:20,extra\n",
            DECLARED,
            "line 4: 4 fields where the header has 3: c,3,2026-01-01 00:00:20,extra",
        ),
        (  # the same, the columns inferred
            "k,v,t\n\na,1,2026-01-01 00:00:00\nc,3,2026-01-01 00:00:20,extra\n",
            None,
            "line 4: 4 fields where the header has 3: c,3,2026-01-01 00:00:20,extra",
        ),
        (  # a quoted delimiter is part of the field
            "k,v,t\na,1,2026-01-01 00:00:00\n\"b,2\",2026-01-01 00:00:20\n",
            None,
            "line 3: 2 fields where the header has 3: \"b,2\",2026-01-01 00:00:20",
        ),
    ],
    ids=["value", "timestamp", "more fields", "more fields inferred", "fewer fields"],
)
def test_a_bad_row_is_named_by_its_line(
    tmp_path: Path, rows: str, message: str, schema: pa.Schema | None
) -> None:
    path = tmp_path / "in.csv"
    path.write_text(rows)
    with pytest.raises(ConnectorError) as info:
        read(path, schema)
    assert str(info.value) == f"file connector: cannot read {path}: {message}"


def test_a_bad_value_past_the_first_block_is_found_on_its_line(tmp_path: Path) -> None:
    """The types are inferred from the first 1 MiB block; a value of a later block that does not
    fit them is on line 80,083 (a header, 80,000 rows before it and an empty line every 1,000)."""
    lines = ["k,v,t"]
    for i in range(100_000):
        if i % 1000 == 0:
            lines.append("")
        lines.append(f"k{i % 7},{'zzz' if i == 80_000 else i},2026-01-01 00:00:{i % 60:02d}")
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n")
    assert lines[80_082] == "k4,zzz,2026-01-01 00:00:20"  # line 80,083
    with pytest.raises(ConnectorError) as info:
        read(path, None)
    assert str(info.value) == (
        f"file connector: cannot read {path}: line 80083, column v (int64): cannot convert 'zzz'"
    )


def test_a_value_that_is_not_utf8_is_named_by_its_line_and_bytes(tmp_path: Path) -> None:
    """A CSV saved as Latin-1 used to say ``In CSV column #0: CSV conversion error to string:
    invalid UTF8 data`` (no line, no value)."""
    path = tmp_path / "in.csv"
    rows = "k,v,t\na,1,2026-01-01 00:00:00\ncafé,2,2026-01-01 00:00:10\n"
    path.write_bytes(rows.encode("latin-1"))
    with pytest.raises(ConnectorError) as info:
        read(path, DECLARED)
    assert str(info.value) == (
        f"file connector: cannot read {path}: line 3, column k (string): b'caf\\xe9' is not "
        "UTF-8 (save the file as UTF-8)"
    )
