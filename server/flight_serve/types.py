"""Small shared types and time conversions used by every layer.

Durations in the public API are :class:`datetime.timedelta`; stored and computed values are
integer nanoseconds (``*_ns``). Instants are aware UTC :class:`datetime.datetime`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pyarrow as pa

NS_PER_SECOND = 1_000_000_000
NS_PER_UNIT = {"s": NS_PER_SECOND, "ms": 1_000_000, "us": 1_000, "ns": 1}

#: Watermark before any row was seen (-∞) and after end of input (+∞), in ns since the epoch.
MIN_WATERMARK_NS = -(2**63)
MAX_WATERMARK_NS = 2**63 - 1


def timedelta_to_ns(value: timedelta) -> int:
    """Return ``value`` as whole nanoseconds (exact: uses days/seconds/microseconds).

    >>> timedelta_to_ns(timedelta(seconds=1, microseconds=5))
    1000005000
    """
    return (value.days * 86_400 + value.seconds) * NS_PER_SECOND + value.microseconds * 1_000


def ns_to_datetime(value_ns: int) -> datetime:
    """Return an aware UTC datetime for ``value_ns`` nanoseconds since the Unix epoch
    (truncated to microseconds, the resolution of :class:`datetime.datetime`).

    >>> ns_to_datetime(1_500_000_000)
    datetime.datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=datetime.timezone.utc)
    """
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value_ns // 1_000)


def datetime_to_ns(value: datetime) -> int:
    """Return nanoseconds since the Unix epoch; a naive datetime is taken as UTC.

    >>> datetime_to_ns(datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC))
    2000000000
    """
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return timedelta_to_ns(value - datetime(1970, 1, 1, tzinfo=UTC))


# --- Arrow types as a stream stores them (store.streams; compared by connectors.columns) -----


def rewrite_type(
    data_type: pa.DataType, replace: Callable[[pa.DataType], pa.DataType | None]
) -> pa.DataType:
    """Return ``data_type`` with ``replace`` applied at every nesting level, top down.

    ``replace`` returns a substitute type, or ``None`` to keep the type and descend into its
    children (struct fields, list / large list / fixed-size list values, map keys and items).
    Field names, nullability and metadata are kept.

    >>> rewrite_type(pa.list_(pa.int32()), lambda t: pa.int64() if t == pa.int32() else None)
    ListType(list<item: int64>)
    """
    new = replace(data_type)
    if new is not None and new != data_type:
        return rewrite_type(new, replace)
    t: Any = data_type

    def field(f: Any) -> Any:
        return f.with_type(rewrite_type(f.type, replace))

    if pa.types.is_struct(t):
        return pa.struct([field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        map_: Any = pa.map_
        return cast(pa.DataType, map_(field(t.key_field), field(t.item_field), t.keys_sorted))
    if pa.types.is_large_list(t):
        return pa.large_list(field(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return cast(pa.DataType, pa.list_(field(t.value_field), t.list_size))
    if pa.types.is_list(t):
        return pa.list_(field(t.value_field))
    return data_type


def _view_to_plain(data_type: pa.DataType) -> pa.DataType | None:
    t: Any = data_type
    if pa.types.is_dictionary(t):
        return cast(pa.DataType, t.value_type)
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list_view(t):
        return pa.list_(t.value_field)
    if pa.types.is_large_list_view(t):
        return pa.large_list(t.value_field)
    return None


def plain_type(data_type: pa.DataType) -> pa.DataType:
    """Return ``data_type`` with every dictionary type (at any depth) replaced by its value type
    and every view type by its plain type (``string_view`` -> ``string``, ``binary_view`` ->
    ``binary``, ``list_view`` -> ``list``, ``large_list_view`` -> ``large_list``).

    >>> plain_type(pa.dictionary(pa.int32(), pa.string()))
    DataType(string)
    >>> plain_type(pa.list_(pa.dictionary(pa.int8(), pa.int64())))
    ListType(list<item: int64>)
    >>> plain_type(pa.struct([("s", pa.string_view())]))
    StructType(struct<s: string>)
    """
    return rewrite_type(data_type, _view_to_plain)


def _small_offsets(data_type: pa.DataType) -> pa.DataType | None:
    t: Any = data_type
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t):
        return pa.list_(t.value_field)
    return None


def value_type(data_type: pa.DataType) -> pa.DataType:
    """The type whose values ``data_type`` holds, with views made plain (:func:`plain_type`) and
    offset widths made small (``large_string`` -> ``string``, ``large_binary`` -> ``binary``,
    ``large_list`` -> ``list``), at any depth: two types with one ``value_type`` hold the same
    values, and a stream casts a batch of one to the other on append.

    >>> value_type(pa.large_list(pa.string_view()))
    ListType(list<item: string>)
    """
    return rewrite_type(plain_type(data_type), _small_offsets)
