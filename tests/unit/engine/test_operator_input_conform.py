"""What the window operator does with an input batch whose columns differ from its input
schema: picked by name (extra columns dropped, any order), cast to the declared types, or
refused with an error naming the missing columns or the failed cast."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.errors import InvalidInputError
from flight_serve.pipelines.query import parse_window_query

INPUT = pa.schema([("key", pa.string()), ("t", pa.timestamp("s", "UTC")), ("v", pa.int64())])
COUNT_PER_10S = (
    "SELECT key, window_start, window_end, count(*) AS n, sum(v) AS total\n"
    "FROM TUMBLE(input, t, INTERVAL '10' SECOND)\n"
    "GROUP BY key, window_start, window_end"
)


def _at(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in table.to_pylist()]


def test_a_batch_with_other_columns_order_and_widths_is_picked_by_name_and_cast() -> None:
    op = parse_window_query(COUNT_PER_10S).build(INPUT)
    batch = pa.record_batch(
        {
            "extra": pa.array([1.5, 2.5, 3.5]),
            "v": pa.array([1, 2, 4], pa.int32()),
            "t": pa.array([1, 3, 12], pa.timestamp("s", "UTC")),
            "key": pa.array(["a", "a", "a"], pa.large_string()),
        }
    )
    first = op.process(batch)
    last = op.finish()
    assert _rows(first.output) + _rows(last.output) == [
        ("a", _at(0), _at(10), 2, 3),
        ("a", _at(10), _at(20), 1, 4),
    ]


def test_a_batch_without_a_declared_column_names_every_missing_one() -> None:
    op = parse_window_query(COUNT_PER_10S).build(INPUT)
    batch = pa.record_batch({"t": pa.array([1], pa.timestamp("s", "UTC"))})
    with pytest.raises(InvalidInputError) as raised:
        op.process(batch)
    assert str(raised.value) == "input batch lacks column(s) key, v"


def test_a_column_that_does_not_cast_is_refused_with_arrows_reason() -> None:
    op = parse_window_query(COUNT_PER_10S).build(INPUT)
    batch = pa.record_batch(
        {
            "key": ["a"],
            "t": pa.array([1], pa.timestamp("s", "UTC")),
            "v": ["seven"],
        }
    )
    with pytest.raises(InvalidInputError) as raised:
        op.process(batch)
    message = str(raised.value)
    assert message.startswith("input batch does not match the input schema: ")
    assert "'seven'" in message
    assert "int64" in message
    assert isinstance(raised.value.__cause__, pa.ArrowInvalid)
