"""Sub-second digits a sink cannot store are floored toward the past, before 1970 too.

pyarrow's ``cast(..., safe=False)`` truncates toward zero: ``1969-12-31T23:59:59.999999999``
became ``1970-01-01T00:00:00`` and its Iceberg row moved to the next day's partition. Every sink
that keeps fewer digits (Iceberg: microseconds; FalkorDB: microsecond text or epoch
milliseconds) floors instead; the file and stdout sinks keep every nanosecond. Real components:
a pyiceberg SqlCatalog on SQLite, a FalkorDB server, files read back.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flight_serve.connectors.columns import floor_timestamps
from flight_serve.connectors.falkordb import FalkorDBSink
from flight_serve.connectors.file import FileSink
from flight_serve.connectors.iceberg import IcebergSink
from flight_serve.connectors.stdout import StdoutSink
from pyiceberg.catalog.sql import SqlCatalog

NS = pa.timestamp("ns", "UTC")
#: ns since the epoch: 1969-12-31T23:59:59.999999999, …:59.9999985, …:58.999999999,
#: 1970-01-01T00:00:00.000001999, null
INSTANTS = [-1, -1_500, -1_000_000_001, 1_999, None]
FLOORED_US = [
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999998, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 58, 999999, tzinfo=UTC),
    datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    None,
]


def rows() -> pa.Table:
    return pa.table(
        {"k": pa.array(range(len(INSTANTS)), pa.int64()), "ts": pa.array(INSTANTS, NS)}
    )


def test_floor_timestamps_floors_every_unit_toward_the_past() -> None:
    ts = pa.array(INSTANTS, NS)
    assert floor_timestamps(ts, "us").cast(pa.int64()).to_pylist() == [-1, -2, -1_000_001, 1, None]
    assert floor_timestamps(ts, "ms").cast(pa.int64()).to_pylist() == [-1, -1, -1_001, 0, None]
    assert floor_timestamps(ts, "s").cast(pa.int64()).to_pylist() == [-1, -1, -2, 0, None]
    chunked = floor_timestamps(pa.chunked_array([ts[:2], ts[2:]]), "us")
    assert chunked.type == pa.timestamp("us", "UTC")
    assert chunked.to_pylist() == FLOORED_US


def test_iceberg_rows_before_1970_keep_their_day_partition(tmp_path: Path) -> None:
    (tmp_path / "warehouse").mkdir()
    catalog = SqlCatalog(
        "default",
        uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=f"file://{tmp_path / 'warehouse'}",
    )
    sink = IcebergSink(catalog, "ops.before", writer="p/out", run="r", partition_by="day(ts)")
    assert sink.commit(1, rows().to_batches()).committed
    table = catalog.load_table("ops.before")
    got = table.scan().to_arrow().sort_by("k")
    assert got.column("ts").to_pylist() == FLOORED_US
    files = table.scan().plan_files()
    days = sorted((t.file.partition[0], t.file.record_count) for t in files if t.file.partition[0] is not None)
    assert days == [(-1, 3), (0, 1)]  # 1969-12-31 holds the three rows before 1970


@pytest.mark.parametrize(
    ("timestamps", "expected"),
    [
        (
            "iso",
            [
                "1969-12-31T23:59:59.999999Z",
                "1969-12-31T23:59:59.999998Z",
                "1969-12-31T23:59:58.999999Z",
                "1970-01-01T00:00:00.000001Z",
                None,
            ],
        ),
        ("epoch_ms", [-1, -1, -1_001, 0, None]),
    ],
)
def test_falkordb_properties_before_1970_are_floored(
    falkordb_url: str, graph: tuple[str, Any], timestamps: str, expected: list[Any]
) -> None:
    name, handle = graph
    table = rows()
    options = {"url": falkordb_url, "graph": name, "node_label": "V", "node_key": "k"}
    sink = FalkorDBSink("s", {**options, "timestamps": timestamps}, table.schema, pipeline="t")
    sink.write(table)
    sink.close()
    got = [r[0] for r in handle.query("MATCH (n:V) RETURN n.ts ORDER BY n.k").result_set]
    assert got == expected


def with_duration() -> pa.Table:
    return rows().append_column(
        "d", pa.array([-1, 1_500, -1_000_000_001, 0, None], pa.duration("ns"))
    )


def test_file_sinks_keep_every_nanosecond_before_1970(tmp_path: Path) -> None:
    table = with_duration()
    for fmt in ("parquet", "csv", "jsonl"):
        sink = FileSink(tmp_path / f"out.{fmt}", fmt, table.schema)
        sink.write(table.to_batches()[0])
        sink.close()
    assert pq.read_table(tmp_path / "out.parquet").equals(table)
    assert (tmp_path / "out.csv").read_text().splitlines() == [
        '"k","ts","d"',
        "0,1969-12-31 23:59:59.999999999Z,-1",
        "1,1969-12-31 23:59:59.999998500Z,1500",
        "2,1969-12-31 23:59:58.999999999Z,-1000000001",
        "3,1970-01-01 00:00:00.000001999Z,0",
        "4,,",
    ]
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert lines == [
        {"k": 0, "ts": "1969-12-31T23:59:59.999999999+00:00", "d": "-PT0.000000001S"},
        {"k": 1, "ts": "1969-12-31T23:59:59.999998500+00:00", "d": "PT0.0000015S"},
        {"k": 2, "ts": "1969-12-31T23:59:58.999999999+00:00", "d": "-PT1.000000001S"},
        {"k": 3, "ts": "1970-01-01T00:00:00.000001999+00:00", "d": "PT0S"},
        {"k": 4, "ts": None, "d": None},
    ]


def test_stdout_jsonl_keeps_every_nanosecond_of_times_and_durations() -> None:
    table = with_duration()
    out = io.StringIO()
    StdoutSink("s", table.schema, "jsonl", out).write(table.to_batches()[0])
    assert [json.loads(x) for x in out.getvalue().splitlines()] == [
        {"k": 0, "ts": "1969-12-31T23:59:59.999999999+00:00", "d": "-PT0.000000001S"},
        {"k": 1, "ts": "1969-12-31T23:59:59.999998500+00:00", "d": "PT0.0000015S"},
        {"k": 2, "ts": "1969-12-31T23:59:58.999999999+00:00", "d": "-PT1.000000001S"},
        {"k": 3, "ts": "1970-01-01T00:00:00.000001999+00:00", "d": "PT0S"},
        {"k": 4, "ts": None, "d": None},
    ]
