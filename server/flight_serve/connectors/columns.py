"""Fitting a source's batches to the columns its ``CREATE SOURCE`` declared.

Every source (file, flight tail, flight ticket, iceberg, a server stream) hands the pipeline
batches with exactly the declared columns: picked by name, in the declared order, each cast to
the declared type. Extra columns are dropped.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal, TypeVar

import numpy as np
import pyarrow as pa

from flight_serve._arrow import same_rows
from flight_serve.errors import ConnectorError

__all__ = ["conform", "floor_timestamps", "iso_duration", "json_value", "same_rows"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def conform(batch: pa.RecordBatch, schema: pa.Schema, what: str) -> pa.RecordBatch:
    """``batch`` with the columns of ``schema``: by name, in its order, cast to its types.

    Args:
        batch: the batch read (any columns, any order).
        schema: the declared columns.
        what: names the source and where the batch came from, for errors (``"file connector:
            /data/a.csv"``, ``"flight source (server …, stream 'x')"``).

    Returns:
        ``batch`` itself when its schema already equals ``schema``, else a new batch of schema
        ``schema`` with the same rows.

    Raises:
        ConnectorError: the batch has no column of a declared name (the error lists the columns
            it has), or a column does not convert to its declared type (the error names the
            column and the type).
    """
    if batch.schema.equals(schema):
        return batch
    arrays = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            raise ConnectorError(
                f"{what}: a batch does not fit the declared columns: it has no column "
                f"{field.name!r}; its columns: {', '.join(batch.schema.names)}"
            )
        try:
            arrays.append(batch.column(index).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConnectorError(
                f"{what}: a batch does not fit the declared columns: column {field.name!r} "
                f"does not convert to {field.type}: {_first_line(exc)}"
            ) from exc
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_A = TypeVar("_A", "pa.Array[Any]", "pa.ChunkedArray[Any]")


def _floor_chunk(chunk: pa.Array[Any], target: pa.DataType, factor: int) -> pa.Array[Any]:
    # integer floor division on the UTC instants, not pc.floor_temporal: that floors in the
    # column's local time and raises for a zoned instant in a DST fall-back hour ("Local time
    # is ambiguous", America/New_York 2021-11-07 01:30, tried with pyarrow 26)
    ints = chunk.cast(pa.int64())
    values = np.asarray(ints.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    mask = np.asarray(ints.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    floored = np.floor_divide(values, factor)
    return pa.array(floored, pa.int64(), mask=mask if mask.any() else None).cast(target)


def floor_timestamps(array: _A, unit: Literal["s", "ms", "us"]) -> _A:
    """A timestamp array (or chunked array) in the coarser ``unit`` (``s``, ``ms``, ``us``),
    each instant floored toward the past: ``1969-12-31T23:59:59.999999999`` becomes
    ``…23:59:59.999999`` in ``us`` (pyarrow's ``cast(..., safe=False)`` truncates toward zero and
    would give ``1970-01-01T00:00:00``). The time zone is kept; nulls stay null. An array already
    in ``unit`` or a finer one is cast exactly (an instant out of range raises
    ``pa.ArrowInvalid``).

    Every sink that stores fewer sub-second digits than its input (Iceberg: microseconds,
    FalkorDB: microsecond text or epoch milliseconds) goes through this one function.
    """
    source = array.type
    assert pa.types.is_timestamp(source), source
    target: pa.DataType = pa.timestamp(unit, source.tz)
    factor = _UNIT_NS[unit] // _UNIT_NS[source.unit]
    if factor <= 1:
        return array.cast(target)
    if isinstance(array, pa.ChunkedArray):
        chunks = [_floor_chunk(c, target, factor) for c in array.chunks]
        return pa.chunked_array(chunks) if chunks else array.cast(target)
    return _floor_chunk(array, target, factor)


def iso_duration(value: timedelta) -> str:
    """``value`` as an ISO 8601 duration in seconds (``PT90.5S``, ``-PT0.000000001S``), exact to
    the nanosecond for pandas' ``Timedelta`` (what pyarrow gives for ``duration[ns]``)."""
    ns = getattr(value, "value", None)  # pandas.Timedelta: an int of nanoseconds
    if not isinstance(ns, int):
        ns = value // timedelta(microseconds=1) * 1_000
    sign = "-" if ns < 0 else ""
    seconds, fraction = divmod(abs(ns), 1_000_000_000)
    text = f"{seconds}.{fraction:09d}".rstrip("0").rstrip(".") if fraction else str(seconds)
    return f"{sign}PT{text}S"


def json_value(value: object) -> object:
    """The JSON form of a value ``json.dumps`` cannot write (its ``default=``): date, time and
    timestamps as ISO 8601 text (nanoseconds kept), durations as :func:`iso_duration`, decimals
    as text, bytes as hex.

    Raises:
        TypeError: another type.
    """
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return iso_duration(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
