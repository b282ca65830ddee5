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

from flight_serve.errors import ConnectorError
from flight_serve.types import value_type

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


def _decoded(array: pa.Array[Any]) -> pa.Array[Any]:
    """``array`` in the types a stream stores it in (``store.streams``: dictionaries decoded,
    view types as plain ones; offset width ignored), so a batch that was sent compares with
    its copy read back from a stream."""
    if isinstance(array, pa.DictionaryArray):
        values = _decoded(array.dictionary)  # pyarrow cannot take from a dictionary of views
        array = pa.DictionaryArray.from_arrays(array.indices, values).dictionary_decode()
    target = value_type(array.type)  # list views stay: pyarrow cannot cast them
    if target == array.type:
        return array
    try:
        return array.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return array


def _holds_floats(kind: pa.DataType) -> bool:
    if pa.types.is_floating(kind):
        return True
    return any(_holds_floats(kind.field(i).type) for i in range(kind.num_fields))


def _same_value(x: Any, y: Any) -> bool:
    """Python values equal, NaN equal to NaN (at any depth of a list, struct or map)."""
    if isinstance(x, float) and isinstance(y, float):
        return x == y or (x != x and y != y)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_same_value(p, q) for p, q in zip(x, y, strict=True))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same_value(x[k], y[k]) for k in x)
    return bool(x == y)


def _same_values(x: pa.Array[Any], y: pa.Array[Any]) -> bool:
    x, y = _decoded(x), _decoded(y)
    if x.equals(y):
        return True
    # Arrow's comparison takes NaN for unequal to itself: a batch holding a NaN would never
    # match its own copy read back from a stream
    if x.type != y.type or x.null_count != y.null_count or not _holds_floats(x.type):
        return False
    return _same_value(x.to_pylist(), y.to_pylist())


def same_rows(a: pa.RecordBatch, b: pa.RecordBatch) -> bool:
    """Whether ``a`` and ``b`` hold the same rows: as many rows, the same column names in any
    order, and each column's values equal by name (a dictionary-encoded column compared by its
    values; a view-typed or ``large_*`` column compared by its values as plain ``string`` /
    ``binary`` / ``list``; a NaN equal to a NaN, which Arrow's own comparison denies). A stream
    stores a batch in the stream's column order with dictionaries decoded and view types made
    plain (``store.streams``), so a batch read back from a stream is compared with the batch
    that was sent this way; a batch
    with duplicate column names only matches in the same order.
    """
    names = a.schema.names
    if a.num_rows != b.num_rows or sorted(names) != sorted(b.schema.names):
        return False
    if len(set(names)) != len(names):
        if names != b.schema.names:
            return False
        pairs = list(zip(a.columns, b.columns, strict=True))
    else:
        pairs = [(a.column(name), b.column(name)) for name in names]
    return all(_same_values(x, y) for x, y in pairs)


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
