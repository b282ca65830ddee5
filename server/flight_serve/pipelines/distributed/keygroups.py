"""Key groups: how keyed state is spread over the instances of a windowed query (Flink's scheme).

A windowed query runs as ``parallelism`` instances. Its keys (the GROUP BY columns besides the
window bounds) are hashed to one of ``max_parallelism`` **key groups** (default 128, fixed for the
life of a job), and each instance owns a contiguous range of key groups::

    key group  = stable_hash(key columns) mod max_parallelism
    instance   = key_group * parallelism // max_parallelism
    range(i)   = [ceil(i * max / p), ceil((i + 1) * max / p))

so state can later move between instances by whole key groups (a rescale), and every key group
belongs to exactly one instance for every ``parallelism`` in ``1 … max_parallelism``.

The hash is computed column by column with numpy over the Arrow buffers (no Python per row) and
is stable across processes and machines: it never uses Python's ``hash()`` (salted per process).
Integers, timestamps, dates, times and durations hash their int64 value, booleans 0/1, floats
their float64 bits (``-0.0`` as ``0.0``, every NaN alike), strings and binaries their bytes
(FNV-1a), NULL a constant; columns are combined in order. A query without key columns puts every
row in key group 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.errors import PipelineSQLError

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "MAX_MAX_PARALLELISM",
    "hash_keys",
    "instance_of_key_group",
    "instances_of",
    "key_group_range",
    "key_groups",
]

#: Key groups of a job unless ``SET max_parallelism`` says otherwise (Flink's default too).
DEFAULT_MAX_PARALLELISM = 128
#: The most key groups a job can have (Flink's limit).
MAX_MAX_PARALLELISM = 32768

_U64 = np.uint64
_NULL_HASH = _U64(0x9E3779B97F4A7C15)
_FNV_OFFSET = _U64(0xCBF29CE484222325)
_FNV_PRIME = _U64(0x100000001B3)
_SEED = _U64(0x2545F4914F6CDD1D)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on a uint64 array (wrapping arithmetic)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> _U64(31))
    return out


def _fnv1a(values: pa.Array[Any]) -> np.ndarray:
    """FNV-1a 64 of every value of a ``large_binary`` array without nulls (uint64 array)."""
    n = len(values)
    if not n:
        return np.zeros(0, dtype=_U64)
    buffers: list[Any] = values.buffers()
    offsets_buf, data_buf = buffers[1], buffers[2]
    assert offsets_buf is not None
    offsets = np.frombuffer(memoryview(offsets_buf), dtype=np.int64)
    offsets = offsets[values.offset : values.offset + n + 1]
    data = (
        np.frombuffer(memoryview(data_buf), dtype=np.uint8)
        if data_buf is not None
        else np.zeros(0, np.uint8)
    )
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = np.full(n, _FNV_OFFSET, dtype=_U64)
    longest = int(lengths.max()) if n else 0
    for j in range(longest):  # one step per byte position, vectorised over the values
        live = lengths > j
        byte = data[starts[live] + j].astype(_U64)
        h[live] = (h[live] ^ byte) * _FNV_PRIME
    # the length too, so b"a" + b"" and b"" + b"a" differ once columns combine
    out: np.ndarray = h ^ lengths.astype(_U64)
    return out


def _column_hash(name: str, column: pa.Array[Any] | pa.ChunkedArray[Any]) -> np.ndarray:
    """A uint64 hash per value of ``column`` (see the module docstring)."""
    values: Any = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = values.type
    if pa.types.is_dictionary(kind):
        values = values.dictionary_decode()
        kind = values.type
    nulls = (
        np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if values.null_count
        else None
    )
    hashed: np.ndarray
    if pa.types.is_integer(kind) or pa.types.is_temporal(kind) or pa.types.is_boolean(kind):
        if pa.types.is_boolean(kind):
            values = values.cast(pa.int8())
        if pa.types.is_unsigned_integer(kind) and kind.bit_width == 64:
            ints = values.fill_null(0).to_numpy(zero_copy_only=False).astype(_U64)
        else:
            if pa.types.is_temporal(kind):  # its physical integer
                values = values.view(pa.int64() if kind.bit_width == 64 else pa.int32())
            as64 = values.cast(pa.int64()).fill_null(0)
            ints = np.asarray(as64.to_numpy(zero_copy_only=False), dtype=np.int64).view(_U64)
        hashed = _splitmix64(ints)
    elif pa.types.is_floating(kind):
        floats = np.asarray(
            values.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False),
            dtype=np.float64,
        )
        floats = np.where(floats == 0.0, 0.0, floats)  # -0.0 as 0.0
        floats = np.where(np.isnan(floats), np.nan, floats)  # one NaN
        hashed = _splitmix64(floats.view(_U64))
    elif (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_binary_view(kind)
    ):
        binary = values.cast(pa.large_binary()).fill_null(b"")
        encoded: Any = pc.dictionary_encode(binary)  # hash each distinct value once
        distinct = _fnv1a(encoded.dictionary)
        hashed = distinct[np.asarray(encoded.indices.to_numpy(zero_copy_only=False))]
    else:
        raise PipelineSQLError(
            f"key column {name} ({kind}): the keyed exchange hashes integer, boolean, float, "
            "string, binary and date/time keys only"
        )
    if nulls is not None:
        hashed = np.where(nulls, _NULL_HASH, hashed)
    return hashed


def hash_keys(batch: pa.RecordBatch | pa.Table, key_columns: Sequence[str]) -> np.ndarray:
    """A stable uint64 hash of each row's key (see the module docstring); zeros without keys.

    Raises:
        PipelineSQLError: a key column of a type the exchange cannot hash (named).
        KeyError: ``batch`` lacks a key column.

    >>> batch = pa.record_batch({"k": ["a", "b", "a"]})
    >>> h = hash_keys(batch, ["k"])
    >>> bool(h[0] == h[2]), bool(h[0] == h[1])
    (True, False)
    """
    n = batch.num_rows
    h = np.full(n, _SEED, dtype=_U64)
    if not key_columns:
        return np.zeros(n, dtype=_U64)
    for name in key_columns:
        index = batch.schema.get_field_index(name)
        if index < 0:
            raise KeyError(name)
        h = _splitmix64(h * _U64(31) + _column_hash(name, batch.column(index)))
    return h


def _check(parallelism: int, max_parallelism: int) -> None:
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(
            f"max_parallelism must be in 1 … {MAX_MAX_PARALLELISM}, got {max_parallelism}"
        )
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in 1 … max_parallelism ({max_parallelism}), got {parallelism}"
        )


def key_groups(
    batch: pa.RecordBatch | pa.Table, key_columns: Sequence[str], max_parallelism: int
) -> np.ndarray:
    """The key group (``0 … max_parallelism - 1``, int64 array) of each row of ``batch``."""
    _check(1, max_parallelism)
    return (hash_keys(batch, key_columns) % _U64(max_parallelism)).astype(np.int64)


def instance_of_key_group(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The instance (``0 … parallelism - 1``) owning ``key_group``.

    Raises:
        ValueError: parallelism outside ``1 … max_parallelism``, or key_group outside
            ``0 … max_parallelism - 1``.

    >>> [instance_of_key_group(g, 3, 8) for g in range(8)]
    [0, 0, 0, 1, 1, 1, 2, 2]
    """
    _check(parallelism, max_parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group must be in 0 … {max_parallelism - 1}, got {key_group}")
    return key_group * parallelism // max_parallelism


def key_group_range(instance: int, parallelism: int, max_parallelism: int) -> range:
    """The key groups instance ``instance`` owns: a contiguous range.

    >>> key_group_range(1, 3, 8)
    range(3, 6)
    """
    _check(parallelism, max_parallelism)
    if not 0 <= instance < parallelism:
        raise ValueError(f"instance must be in 0 … {parallelism - 1}, got {instance}")
    start = (instance * max_parallelism + parallelism - 1) // parallelism
    stop = ((instance + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, stop)


def instances_of(groups: np.ndarray, parallelism: int, max_parallelism: int) -> np.ndarray:
    """The owning instance of each key group of ``groups`` (int64 array, vectorised)."""
    _check(parallelism, max_parallelism)
    return (groups.astype(np.int64) * parallelism) // max_parallelism
