"""Arrow helpers that every layer shares: IPC stream bytes, plain (view-free) batches, fitting a
batch to a schema, and comparing rows.

A leaf: it imports pyarrow, numpy and :mod:`flight_serve.types` only. The type rewrites
themselves (:func:`~flight_serve.types.plain_type`, :func:`~flight_serve.types.value_type`)
live in :mod:`flight_serve.types`; this module applies them to arrays, schemas and batches.

>>> batch = pa.record_batch({"x": [1, 2]})
>>> [b.num_rows for b in read_ipc(ipc_bytes(batch.schema, [batch, batch]))]
[2, 2]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.types import plain_type, value_type

__all__ = [
    "ColumnMismatch",
    "conform_batch",
    "ipc_bytes",
    "plain_batch",
    "plain_schema",
    "read_ipc",
    "read_ipc_table",
    "same_rows",
    "to_plain",
]


# --- Arrow IPC streams -------------------------------------------------------------------------


def ipc_bytes(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> bytes:
    """``batches`` (each of ``schema``) as the bytes of one Arrow IPC stream, batch boundaries
    kept; for a table: ``ipc_bytes(table.schema, table.to_batches())``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def read_ipc(data: bytes | pa.Buffer) -> list[pa.RecordBatch]:
    """The batches of an Arrow IPC stream (the inverse of :func:`ipc_bytes`).

    Raises:
        pyarrow.ArrowInvalid: ``data`` is not an Arrow IPC stream.
    """
    return list(pa.ipc.open_stream(data))


def read_ipc_table(data: bytes | pa.Buffer) -> pa.Table:
    """The batches of an Arrow IPC stream as one table (its schema also when it has no batch).

    Raises:
        pyarrow.ArrowInvalid: ``data`` is not an Arrow IPC stream.
    """
    return pa.ipc.open_stream(data).read_all()


# --- plain (view-free, dictionary-free) values ---------------------------------------------------


def to_plain(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """Return ``array`` converted to ``target``: a type :func:`~flight_serve.types.plain_type`
    gives for it, or one with the same :func:`~flight_serve.types.value_type`.

    List views are rebuilt by hand (pyarrow 26's ``list_view`` to ``list`` cast produces an
    invalid offsets buffer); everything else is an Arrow cast.

    Raises:
        pyarrow.ArrowInvalid: the values do not fit ``target`` (more than 2 GiB of strings in
            one batch cast to ``string``).
    """
    source: Any = array.type
    if source == target:
        return array
    goal: Any = target
    if pa.types.is_dictionary(source):
        # values made plain first: pyarrow 26 can neither cast nor take a dictionary of views
        encoded: Any = array
        values = to_plain(encoded.dictionary, plain_type(source.value_type))
        decoded = pa.DictionaryArray.from_arrays(encoded.indices, values).dictionary_decode()
        return to_plain(decoded, target)
    if (pa.types.is_list(goal) or pa.types.is_large_list(goal)) and (
        pa.types.is_list(source)
        or pa.types.is_large_list(source)
        or pa.types.is_list_view(source)
        or pa.types.is_large_list_view(source)
    ):
        values = to_plain(pc.list_flatten(array), goal.value_type)
        sizes = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        offset_type = np.int64 if pa.types.is_large_list(goal) else np.int32
        offsets = np.zeros(len(array) + 1, dtype=offset_type)
        np.cumsum(sizes, out=offsets[1:])
        list_class: Any = pa.LargeListArray if pa.types.is_large_list(goal) else pa.ListArray
        return cast(
            "pa.Array[Any]",
            list_class.from_arrays(
                pa.array(offsets),
                values,
                type=goal,
                mask=array.is_null() if array.null_count else None,
            ),
        )
    if pa.types.is_struct(goal) and pa.types.is_struct(source):
        struct_array: Any = array
        children = [
            to_plain(child, goal.field(i).type) for i, child in enumerate(struct_array.flatten())
        ]
        return cast(
            "pa.Array[Any]",
            pa.StructArray.from_arrays(
                children,
                fields=[goal.field(i) for i in range(goal.num_fields)],
                mask=array.is_null() if array.null_count else None,
            ),
        )
    return array.cast(target)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """Return ``schema`` with view (and dictionary) types replaced by plain ones, at every
    nesting level (:func:`~flight_serve.types.plain_type`); field and schema metadata kept.

    >>> plain_schema(pa.schema([("s", pa.string_view())]))
    s: string
    """
    metadata: Any = schema.metadata
    return pa.schema([f.with_type(plain_type(f.type)) for f in schema], metadata=metadata)


def plain_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with :func:`plain_schema` types (``batch`` itself when it has no view or
    dictionary column)."""
    schema = plain_schema(batch.schema)
    if schema.equals(batch.schema):
        return batch
    columns = [
        to_plain(column, field.type) for column, field in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# --- fitting a batch to a schema ----------------------------------------------------------------


class ColumnMismatch(ValueError):
    """A column of the target schema that a batch cannot supply (:func:`conform_batch`): it is
    missing (``cause`` is ``None``) or its values do not convert (``cause`` is the Arrow error).
    Callers turn it into their own error, with their own wording."""

    def __init__(self, field: pa.Field[Any], cause: BaseException | None) -> None:
        super().__init__(field.name if cause is None else f"{field.name}: {cause}")
        self.field = field
        self.cause = cause


def conform_batch(
    batch: pa.RecordBatch,
    schema: pa.Schema,
    *,
    by_name: bool = False,
    cast: Literal["plain", "arrow"] = "plain",
    check_metadata: bool = False,
) -> pa.RecordBatch:
    """Return ``batch`` with ``schema``: its names, order, types, nullability flags and metadata.

    Args:
        batch: the batch to fit.
        schema: the target schema.
        by_name: pick each of ``schema``'s columns from ``batch`` by name (extra columns are
            dropped); otherwise ``batch`` has ``schema``'s columns in its order.
        cast: ``"plain"`` converts with :func:`to_plain` (views and dictionaries to plain
            types, offset widths); ``"arrow"`` with an Arrow cast (any cast Arrow allows).
        check_metadata: whether a batch whose schema equals ``schema`` but for metadata is
            rebuilt (to carry ``schema``'s metadata) rather than returned as it is.

    Returns:
        ``batch`` itself when its schema already equals ``schema``, else a new batch.

    Raises:
        ColumnMismatch: the first of ``schema``'s columns, in order, that is missing (with
            ``by_name``) or does not convert (the Arrow error is its ``cause``).
        ValueError: without ``by_name``, the batch has another number of columns.

    >>> b = pa.record_batch({"y": ["a"], "x": [1]})
    >>> conform_batch(b, pa.schema([("x", pa.int8())]), by_name=True, cast="arrow").to_pydict()
    {'x': [1]}
    """
    if batch.schema.equals(schema, check_metadata=check_metadata):
        return batch
    if not by_name and batch.num_columns != len(schema):
        raise ValueError(
            f"a batch of {batch.num_columns} columns does not fit a schema of {len(schema)}"
        )
    convert = to_plain if cast == "plain" else _arrow_cast
    columns = []
    for i, field in enumerate(schema):
        if by_name:
            index = batch.schema.get_field_index(field.name)
            if index < 0:
                raise ColumnMismatch(field, None)
        else:
            index = i
        try:
            columns.append(convert(batch.column(index), field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ColumnMismatch(field, exc) from exc
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _arrow_cast(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    return array.cast(target)


# --- comparing rows ------------------------------------------------------------------------------


def _decoded(array: pa.Array[Any]) -> pa.Array[Any]:
    """``array`` in the types a stream stores it in (dictionaries decoded, view types as plain
    ones; offset width ignored), so a batch that was sent compares with its copy read back from
    a stream."""
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
    plain (:mod:`flight_serve.store`), so a batch read back from a stream is compared with the
    batch that was sent this way; a batch with duplicate column names only matches in the same
    order.

    >>> same_rows(pa.record_batch({"x": [1.0, float("nan")]}),
    ...           pa.record_batch({"x": [1.0, float("nan")]}))
    True
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
