"""The schema rule for appends (see :mod:`flight_serve.store.streams`): which batches fit a
stream, the message naming each field that does not, and fitting a batch to the stream's types.
"""

from __future__ import annotations

import pyarrow as pa

from flight_serve._arrow import ColumnMismatch, conform_batch, plain_schema
from flight_serve.errors import SchemaMismatchError
from flight_serve.types import value_type

__all__ = ["check_batch", "conform", "describe_mismatch", "fits_as_is", "same_values"]


def same_values(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether types ``a`` and ``b`` hold the same values and differ at most in offset width
    (``string`` / ``large_string``, ``binary`` / ``large_binary``, ``list`` / ``large_list``, at
    any depth) or in being a view type (:func:`~flight_serve.types.plain_type`): a batch of one
    is cast to the other on append. (A stream that an earlier flight-serve created with a view
    type keeps it: plain ``string`` / ``binary`` batches are cast to ``string_view`` /
    ``binary_view`` for it.)

    >>> same_values(pa.list_(pa.large_string()), pa.large_list(pa.string()))
    True
    >>> same_values(pa.string(), pa.binary())
    False
    """
    return a == b or value_type(a) == value_type(b)


def describe_mismatch(
    stream: str, expected: pa.Schema, got: pa.Schema, batch: pa.RecordBatch | None = None
) -> str | None:
    """Return why schema ``got`` (and, when given, ``batch``'s nulls) does not fit ``expected``.

    Returns ``None`` when it fits.
    """
    expected_names = expected.names
    got_names = got.names
    if len(set(expected_names)) != len(expected_names) or len(set(got_names)) != len(got_names):
        # Duplicate field names: only an identical schema (same order) can be matched safely.
        if got.equals(expected, check_metadata=False):
            return None
        return (
            f"batch schema does not match stream {stream!r} (duplicate field names need the "
            f"identical schema): stream has {expected_names}, batch has {got_names}"
        )
    got_by_name = {f.name: f for f in got}
    expected_by_name = {f.name: f for f in expected}
    missing = [f for f in expected if f.name not in got_by_name]
    unexpected = [f for f in got if f.name not in expected_by_name]
    retyped: list[str] = []
    for field in expected:
        other = got_by_name.get(field.name)
        if other is None:
            continue
        if not same_values(other.type, field.type):
            retyped.append(f"{field.name!r} (stream has {field.type}, batch has {other.type})")
        elif not field.nullable and batch is not None and batch.column(field.name).null_count:
            retyped.append(f"{field.name!r} (not nullable in the stream, batch holds nulls)")
    if not (missing or unexpected or retyped):
        return None
    parts = []
    if missing:
        parts.append("missing field " + ", ".join(f"{f.name!r} ({f.type})" for f in missing))
    if unexpected:
        parts.append("unexpected field " + ", ".join(f"{f.name!r} ({f.type})" for f in unexpected))
    if retyped:
        parts.append("retyped field " + ", ".join(retyped))
    return f"batch schema does not match stream {stream!r}: " + "; ".join(parts)


def fits_as_is(expected: pa.Schema, batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` has exactly the stream schema ``expected`` (field order, types,
    nullability flags and metadata) and no null in a field ``expected`` declares not nullable:
    then :func:`conform` returns it as it is, and the per-field comparison is skipped (a
    DoPut's batches nearly always carry the stream's own schema; comparing field by field in
    Python cost ~0.1 ms a batch, twice).

    >>> s = pa.schema([pa.field("x", pa.int64(), nullable=False)])
    >>> fits_as_is(s, pa.record_batch([pa.array([1])], schema=s))
    True
    >>> fits_as_is(s, pa.record_batch([pa.array([None], pa.int64())], names=["x"]))
    False
    """
    if not batch.schema.equals(expected, check_metadata=True):
        return False
    for i, field in enumerate(expected):
        if not field.nullable and batch.column(i).null_count:
            return False
    return True


def check_batch(stream: str, schema: pa.Schema, batch: pa.RecordBatch) -> None:
    """Raise what appending ``batch`` to a stream ``stream`` of ``schema`` would, without a
    stream: for a caller that checks a first batch before it creates or replaces the stream.

    Raises:
        SchemaMismatchError: as :meth:`StreamStore.append` (names each missing, unexpected and
            retyped field).
    """
    problem = describe_mismatch(stream, plain_schema(schema), plain_schema(batch.schema), batch)
    if problem is not None:
        raise SchemaMismatchError(problem)


def conform(stream: str, expected: pa.Schema, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Return ``batch`` in the stream's field order and schema, or raise SchemaMismatchError."""
    problem = describe_mismatch(stream, expected, batch.schema, batch)
    if problem is not None:
        raise SchemaMismatchError(problem)
    try:
        # by name unless the order already matches (duplicate names: only the identical order)
        return conform_batch(
            batch, expected, by_name=batch.schema.names != expected.names, check_metadata=True
        )
    except ColumnMismatch as exc:
        raise SchemaMismatchError(
            f"batch does not fit the types of stream {stream!r}: {exc.cause}"
        ) from None
