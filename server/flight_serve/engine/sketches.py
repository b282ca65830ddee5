"""Mergeable sketches for the approximate aggregates, vectorised over many panes at once.

Every function here takes Arrow list arrays with **one list per pane** (what DataFusion's
``array_agg`` produces per group) and returns one value per pane, computed with numpy over the
flattened values and their pane indices: no Python code runs per row or per pane. They are
registered as DataFusion scalar UDFs (:func:`scalar_udfs`) and called as
``udf(array_agg(...))`` in the partial and merge queries, so DataFusion does the grouping.

Why not DataFusion's Python ``Accumulator`` UDAFs: datafusion-python calls ``update`` once per
group per input batch (1 000 000 calls for 1 000 000 rows over 10 000 groups, about 1.4 µs each,
measured with DataFusion 55), which is row-at-a-time Python on high-cardinality keys.

Sketches:

* **HyperLogLog** (Flajolet, Fusy, Gandouet, Meunier 2007) with ``m = 2**HLL_PRECISION`` = 4096
  registers, over the first 64 bits of the MD5 of the value's text (DataFusion's
  ``digest(CAST(x AS VARCHAR), 'md5')``). Stored as a sparse ``list<uint32>`` of the non-zero
  registers, each ``register_index << 8 | rank``, sorted: a pane with few distinct values holds a
  few entries, a saturated one at most 4096 (16 KiB). Merge = the register-wise maximum, which is
  associative, commutative and idempotent, so the estimate does not depend on how the input was
  cut into batches or merged. Estimate: Ertl's improved estimator (O. Ertl, "New cardinality
  estimation algorithms for HyperLogLog sketches", 2017, section 4; Redis uses it too), which
  folds linear counting into the raw estimate ``m^2 / (2 ln 2 (sum 2^-M[j] + m sigma(V / m)))``
  with ``V`` the zero registers; 64-bit hashes need no large-range correction. Standard error
  ``1.04 / sqrt(m)`` = 1.6 %. Measured over 300 panes per cardinality (random int64s): bias
  within 0.4 % and standard deviation 1.1 % to 1.9 % at every cardinality from 10 to 100 000;
  the textbook switch from linear counting to the raw estimate at ``2.5 m`` had +1.4 % bias and
  2.6 % standard deviation at 10 000 instead.
* **DDSketch** (Masson, Rim, Lee, VLDB 2019) with relative accuracy ``alpha`` =
  ``DD_RELATIVE_ACCURACY`` = 1 %: a value ``x > 0`` counts in bucket ``ceil(log_gamma x)`` with
  ``gamma = (1 + alpha) / (1 - alpha)``, and a bucket stands for ``2 gamma^k / (gamma + 1)``,
  within ``alpha`` of every value in it (negative values mirror, zero has its own bucket). A pane
  of at most ``DD_EXACT_VALUES`` = 100 values keeps the values themselves (with their counts),
  like DataFusion's t-digest keeps up to 100 centroids, so small windows are exact. Stored as a
  sparse ``list<struct<key: int32, count: int64, value: float64>>`` sorted by value (``value``
  null once the pane holds more than 100 values). Merge = the entry-wise sum of counts, exact and
  determined by the multiset of values alone, so again independent of batch cutting. Quantiles
  interpolate like ``percentile_cont``: with ``n`` values and fraction ``q``, rank
  ``r = q (n - 1)``, ``lo = floor(r)``, the result is ``v[lo] + (v[lo + 1] - v[lo]) (r - lo)``,
  so it equals ``percentile_cont`` for at most 100 values and is within
  ``alpha * max(|x[lo]|, |x[lo + 1]|)`` of it beyond. The bucket count grows with
  ``log(max / min)`` of the data, about 115 buckets per decade; no bucket is collapsed. NaN and
  infinities are not counted.
"""

from __future__ import annotations

import math
from typing import Any, cast

import datafusion
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.engine._numpy import unique_sorted

HLL_PRECISION = 12
HLL_REGISTERS = 1 << HLL_PRECISION
HLL_SKETCH = pa.list_(pa.uint32())
HLL_STANDARD_ERROR = 1.04 / math.sqrt(HLL_REGISTERS)

DD_RELATIVE_ACCURACY = 0.01
DD_EXACT_VALUES = 100
DD_BUCKET = pa.struct(
    [pa.field("key", pa.int32()), pa.field("count", pa.int64()), pa.field("value", pa.float64())]
)
DD_SKETCH = pa.list_(DD_BUCKET)
_GAMMA = (1 + DD_RELATIVE_ACCURACY) / (1 - DD_RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
# log_gamma of the smallest subnormal double is about -37 222: shifted keys of non-zero values are > 0
_KEY_SHIFT = 40_000
_KEY_BITS = 18  # |shifted key| < 2**17

MOMENTS = pa.struct(
    [pa.field("n", pa.int64()), pa.field("mean", pa.float64()), pa.field("m2", pa.float64())]
)


def _as_array(values: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values


def _flatten(lists: pa.Array[Any]) -> tuple[pa.Array[Any], np.ndarray]:
    """``(values, pane)``: the list elements and the index of the list each belongs to (null lists
    contribute nothing)."""
    values = pc.list_flatten(lists)
    parents = np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64)
    return values, parents


def _flatten2(lists: pa.Array[Any]) -> tuple[pa.Array[Any], np.ndarray]:
    """Like :func:`_flatten` for a list of lists: the innermost elements and their outer index."""
    inner, outer_parent = _flatten(lists)
    values, inner_parent = _flatten(inner)
    return values, outer_parent[inner_parent]


def _sum_by(pane: np.ndarray, weights: np.ndarray, panes: int) -> np.ndarray:
    """float64 sums of ``weights`` per pane (``np.bincount`` gives int64 zeros on no input)."""
    return np.bincount(pane, weights=weights, minlength=panes).astype(np.float64, copy=False)


def _lists(pane: np.ndarray, values: pa.Array[Any], panes: int) -> pa.Array[Any]:
    """One list per pane of ``values`` sorted by ``pane`` (panes without values: empty lists)."""
    counts = np.bincount(pane, minlength=panes) if len(pane) else np.zeros(panes, np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), pa.int32())
    return cast("pa.Array[Any]", pa.ListArray.from_arrays(offsets, values))


# --- HyperLogLog -------------------------------------------------------------------------------


def _bit_length(x: np.ndarray) -> np.ndarray:
    """The bit length of each uint64 (0 for 0), vectorised by binary search."""
    x = x.copy()
    n = np.zeros(len(x), dtype=np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = x >= (np.uint64(1) << np.uint64(shift))
        n += np.where(big, shift, 0)
        x = np.where(big, x >> np.uint64(shift), x)
    return n + (x > 0)


def _first_u64(digests: pa.Array[Any]) -> np.ndarray:
    """The first 8 bytes (little endian) of each binary value (every value ≥ 8 bytes, no nulls)."""
    large = pa.types.is_large_binary(digests.type)
    offsets_buffer, data_buffer = digests.buffers()[1:3]
    assert offsets_buffer is not None
    assert data_buffer is not None
    offset_type = np.dtype(np.int64) if large else np.dtype(np.int32)
    offsets = np.frombuffer(memoryview(offsets_buffer), dtype=offset_type)[
        digests.offset : digests.offset + len(digests) + 1
    ]
    data = np.frombuffer(memoryview(data_buffer), dtype=np.uint8)
    gathered = data[offsets[:-1, None].astype(np.int64) + np.arange(8)]
    return np.ascontiguousarray(gathered).view("<u8").ravel()


def _hll_reduce(pane: np.ndarray, entries: np.ndarray, panes: int) -> pa.Array[Any]:
    """Sparse registers per pane: for each (pane, register) the entry with the highest rank."""
    key = unique_sorted((pane.astype(np.uint64) << np.uint64(32)) | entries.astype(np.uint64))
    pane_k = (key >> np.uint64(32)).astype(np.int64)
    register = (key & np.uint64(0xFFFFFFFF)) >> np.uint64(8)
    last = np.ones(len(key), dtype=bool)
    last[:-1] = (pane_k[1:] != pane_k[:-1]) | (register[1:] != register[:-1])
    kept = (key[last] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return _lists(pane_k[last], pa.array(kept, pa.uint32()), panes)


def hll_sketch(digests: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """HyperLogLog sketches from lists of hash digests (``list<binary>``, ≥ 8 bytes each; null
    digests and null lists are skipped) → ``list<uint32>``, one sketch per list.

    >>> d = pa.array([[bytes(range(16))], None], pa.list_(pa.binary()))
    >>> [len(s) for s in hll_sketch(d).to_pylist()]
    [1, 0]
    """
    lists = _as_array(digests)
    values, pane = _flatten(lists)
    valid = values.is_valid()
    if values.null_count:
        values = values.filter(valid)
        pane = pane[np.asarray(valid.to_numpy(zero_copy_only=False), dtype=bool)]
    h = _first_u64(values) if len(values) else np.zeros(0, np.uint64)
    rest_bits = 64 - HLL_PRECISION
    index = h >> np.uint64(rest_bits)
    rest = h & np.uint64((1 << rest_bits) - 1)
    rank = rest_bits - _bit_length(rest) + 1
    entries = (index.astype(np.uint32) << np.uint32(8)) | rank.astype(np.uint32)
    return _hll_reduce(pane, entries, len(lists))


def hll_union(sketches: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """Merge lists of HyperLogLog sketches (``list<list<uint32>>``) → one sketch per list."""
    lists = _as_array(sketches)
    values, pane = _flatten2(lists)
    entries = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.uint32)
    return _hll_reduce(pane, entries, len(lists))


def hll_estimate(sketches: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """The distinct-count estimate (``uint64``, 0 for an empty or null sketch) of each sketch.

    >>> hll_estimate(hll_sketch(pa.array([[b"a" * 16, b"b" * 16, b"a" * 16]]))).to_pylist()
    [2]
    """
    lists = _as_array(sketches)
    panes = len(lists)
    values, pane = _flatten(lists)
    entries = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.uint32)
    rank = (entries & np.uint32(0xFF)).astype(np.float64)
    m = float(HLL_REGISTERS)
    zeros = m - np.bincount(pane, minlength=panes)
    # Ertl's z: Σ_{k=1..q} C_k 2^-k + m sigma(C_0 / m); a register of rank q + 1 (all 52 bits zero,
    # chance 2^-52) adds 2^-(q+1) instead of Ertl's tau term, which only matters near 2^64 values
    z = _sum_by(pane, np.exp2(-rank), panes) + m * _sigma(zeros / m)
    with np.errstate(divide="ignore"):
        estimate = np.where(np.isinf(z), 0.0, m * m / (2 * math.log(2)) / z)
    return pa.array(np.rint(estimate).astype(np.uint64), pa.uint64())


def _sigma(x: np.ndarray) -> np.ndarray:
    """Ertl's ``sigma(x) = x + Σ_{k≥1} x^(2^k) 2^(k-1)`` (``+∞`` at ``x = 1``), vectorised."""
    empty = x >= 1
    x = np.where(empty, 0.0, x)
    z = x.copy()
    y = 1.0
    for _ in range(64):  # x^(2^k) underflows to 0 long before k = 64 for x ≤ 1 - 2^-12
        x = x * x
        z += x * y
        y += y
    return np.where(empty, np.inf, z)


# --- DDSketch ----------------------------------------------------------------------------------


def _ordered_bits(x: np.ndarray) -> np.ndarray:
    """int64 keys that sort like the float64 values ``x`` (no NaN; -0.0 already made 0.0)."""
    bits = x.view(np.int64)
    return np.where(bits < 0, bits ^ np.int64(0x7FFFFFFFFFFFFFFF), bits)


def _dd_reduce(
    pane: np.ndarray, keys: np.ndarray, counts: np.ndarray, values: np.ndarray, panes: int
) -> pa.Array[Any]:
    """One sketch per pane from entries ``(pane, key, count, value)`` (value NaN: none kept).

    A pane of at most ``DD_EXACT_VALUES`` values keeps one entry per distinct value (with its
    count); a larger one one entry per bucket, with a null value. Entries sorted by value."""
    total = _sum_by(pane, counts, panes)
    exact = (total[pane] <= DD_EXACT_VALUES) & ~np.isnan(values)
    bits = np.where(exact, _ordered_bits(np.where(exact, values, 0.0)), np.iinfo(np.int64).min)
    order = np.lexsort((bits, keys, pane))
    pane, keys, counts, bits, values = (a[order] for a in (pane, keys, counts, bits, values))
    new = np.ones(len(pane), dtype=bool)
    new[1:] = (pane[1:] != pane[:-1]) | (keys[1:] != keys[:-1]) | (bits[1:] != bits[:-1])
    starts = np.flatnonzero(new)
    summed = np.add.reduceat(counts, starts) if len(starts) else np.zeros(0, np.int64)
    kept = bits[starts] != np.iinfo(np.int64).min
    buckets = pa.StructArray.from_arrays(
        [
            pa.array(keys[starts], pa.int32()),
            pa.array(summed, pa.int64()),
            pa.array(values[starts], pa.float64(), mask=~kept),
        ],
        fields=list(DD_BUCKET),
    )
    return _lists(pane[starts], buckets, panes)


def dd_sketch(values: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """DDSketches from lists of float64 values (nulls, NaN and ±inf skipped) →
    ``list<struct<key: int32, count: int64, value: float64>>``, one sketch per list.

    >>> dd_sketch(pa.array([[1.0, 1.0, 0.0, -2.0]], pa.list_(pa.float64()))).to_pylist()[0]
    [{'key': -40035, 'count': 1, 'value': -2.0}, {'key': 0, 'count': 1, 'value': 0.0}, \
{'key': 40000, 'count': 2, 'value': 1.0}]
    """
    lists = _as_array(values)
    flat, pane = _flatten(lists)
    x = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float64)
    finite = np.isfinite(x)  # nulls arrive as NaN
    x, pane = x[finite] + 0.0, pane[finite]  # + 0.0 turns -0.0 into 0.0
    magnitude = np.abs(x)
    nonzero = magnitude > 0
    keys = np.zeros(len(x), dtype=np.int64)
    logs = np.log(magnitude[nonzero]) / _LOG_GAMMA
    sign = np.sign(x[nonzero]).astype(np.int64)
    keys[nonzero] = (np.ceil(logs).astype(np.int64) + _KEY_SHIFT) * sign
    return _dd_reduce(pane, keys, np.ones(len(x), dtype=np.int64), x, len(lists))


def _dd_columns(buckets: pa.Array[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(key, count, value)`` of flattened sketch entries (value NaN where none is kept)."""

    def field(name: str, dtype: type[np.generic], fill: Any) -> np.ndarray:
        column = pc.struct_field(buckets, name).fill_null(fill)
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=dtype)

    return (
        field("key", np.int64, 0),
        field("count", np.int64, 0),
        field("value", np.float64, math.nan),
    )


def dd_merge(sketches: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """Merge lists of DDSketches (``list<list<struct<key, count, value>>>``) → one sketch per
    list (exact values while the merged pane holds at most ``DD_EXACT_VALUES``)."""
    lists = _as_array(sketches)
    buckets, pane = _flatten2(lists)
    keys, counts, values = _dd_columns(buckets)
    return _dd_reduce(pane, keys, counts, values, len(lists))


def _dd_value(keys: np.ndarray) -> np.ndarray:
    """The value a bucket stands for: ``±2 gamma^k / (gamma + 1)``, 0 for the zero bucket."""
    k = np.abs(keys) - _KEY_SHIFT
    with np.errstate(over="ignore"):
        magnitude = np.exp(k * _LOG_GAMMA) * (2 / (_GAMMA + 1))
    return np.where(keys == 0, 0.0, np.sign(keys) * magnitude)


def dd_quantile(sketches: pa.Array[Any] | pa.ChunkedArray[Any], q: float) -> pa.Array[Any]:
    """The ``q`` quantile (``0 ≤ q ≤ 1``, interpolated like ``percentile_cont``) of each sketch,
    float64, null for an empty or null sketch.

    >>> s = dd_sketch(pa.array([[1.0, 2.0, 3.0, 4.0], []], pa.list_(pa.float64())))
    >>> dd_quantile(s, 0.5).to_pylist()
    [2.5, None]
    """
    lists = _as_array(sketches)
    panes = len(lists)
    keys, counts, kept = _dd_columns(pc.list_flatten(lists))
    lengths = np.asarray(
        pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    ends = np.cumsum(lengths)
    starts = ends - lengths
    cum = np.concatenate([[0], np.cumsum(counts)])
    base = cum[starts]
    n = cum[ends] - base
    has = n > 0
    rank = q * np.maximum(n - 1, 0)
    lo = np.floor(rank).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    frac = rank - lo
    values = np.where(np.isnan(kept), _dd_value(keys), kept)
    # the entry of 0-based rank j is the first with cumulative count > base + j
    at_lo = np.searchsorted(cum[1:], base + lo, side="right")
    at_hi = np.searchsorted(cum[1:], base + hi, side="right")
    if len(values):
        v_lo, v_hi = values[np.where(has, at_lo, 0)], values[np.where(has, at_hi, 0)]
    else:
        v_lo = v_hi = np.zeros(panes)
    result = v_lo + (v_hi - v_lo) * frac
    return pa.array(result, pa.float64(), mask=~has)


# --- moments (count, mean, M2) for stddev / var --------------------------------------------------


def moments(values: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """``struct<n, mean, m2>`` of each list of float64 values (nulls skipped): the corrected
    two-pass algorithm over values shifted by the list's first value (Chan, Golub, LeVeque 1983,
    "Algorithms for computing the sample variance"), accurate to a few ulps even when the mean
    is large next to the spread.

    >>> p = pa.array([[1e9 + 1, 1e9 + 2, None, 1e9 + 3], None], pa.list_(pa.float64()))
    >>> moments(p).to_pylist()
    [{'n': 3, 'mean': 1000000002.0, 'm2': 2.0}, {'n': 0, 'mean': None, 'm2': None}]
    """
    lists = _as_array(values)
    panes = len(lists)
    flat, pane = _flatten(lists)
    x = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float64)
    if flat.null_count:
        keep = ~np.isnan(x)  # nulls arrive as NaN
        x, pane = x[keep], pane[keep]
    n = np.bincount(pane, minlength=panes) if len(pane) else np.zeros(panes, np.int64)
    has = n > 0
    safe_n = np.where(has, n, 1)
    shift = np.zeros(panes)
    shift[pane[::-1]] = x[::-1]  # the first value of each list
    d = x - shift[pane]
    mean_d = _sum_by(pane, d, panes) / safe_n
    dev = d - mean_d[pane]
    m2 = _sum_by(pane, dev * dev, panes)
    m2 -= _sum_by(pane, dev, panes) ** 2 / safe_n
    return pa.StructArray.from_arrays(
        [
            pa.array(n, pa.int64()),
            pa.array(shift + mean_d, pa.float64(), mask=~has),
            pa.array(np.maximum(m2, 0.0), pa.float64(), mask=~has),
        ],
        fields=list(MOMENTS),
    )


def moments_merge(partials: pa.Array[Any] | pa.ChunkedArray[Any]) -> pa.Array[Any]:
    """Merge lists of ``struct<n, mean, m2>`` moments (Chan, Golub, LeVeque 1979: pairwise-stable
    ``M2 = Σ M2_i + Σ n_i (mean_i - mean)²``) → one ``struct<n, mean, m2>`` per list; ``n = 0``
    and null mean / m2 when no value was counted.

    >>> p = pa.array([[{"n": 2, "mean": 1.5, "m2": 0.5}, {"n": 1, "mean": 4.0, "m2": 0.0}]],
    ...              pa.list_(MOMENTS))
    >>> [(m["n"], round(m["mean"], 4), round(m["m2"], 4)) for m in moments_merge(p).to_pylist()]
    [(3, 2.3333, 4.6667)]
    """
    lists = _as_array(partials)
    panes = len(lists)
    items, pane = _flatten(lists)
    n_i = np.asarray(
        pc.struct_field(items, "n").fill_null(0).to_numpy(zero_copy_only=False), np.int64
    )
    mean_i = np.asarray(
        pc.struct_field(items, "mean").fill_null(0.0).to_numpy(zero_copy_only=False), np.float64
    )
    m2_i = np.asarray(
        pc.struct_field(items, "m2").fill_null(0.0).to_numpy(zero_copy_only=False), np.float64
    )
    if items.null_count:
        valid = np.asarray(items.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        n_i = np.where(valid, n_i, 0)
    keep = n_i > 0
    n_i, mean_i, m2_i, pane = n_i[keep], mean_i[keep], m2_i[keep], pane[keep]
    n = _sum_by(pane, n_i, panes)
    count = np.rint(n).astype(np.int64)
    has = count > 0
    # shift by one partial mean per pane before summing, so large offsets do not cancel
    ref = np.zeros(panes)
    ref[pane[::-1]] = mean_i[::-1]  # the first partial of each pane wins
    safe_n = np.where(has, n, 1.0)
    delta = mean_i - ref[pane]
    mean = ref + _sum_by(pane, n_i * delta, panes) / safe_n
    dev = mean_i - mean[pane]
    m2 = _sum_by(pane, m2_i + n_i * dev * dev, panes)
    return pa.StructArray.from_arrays(
        [
            pa.array(count, pa.int64()),
            pa.array(mean, pa.float64(), mask=~has),
            pa.array(m2, pa.float64(), mask=~has),
        ],
        fields=list(MOMENTS),
    )


def scalar_udfs() -> dict[str, Any]:
    """The sketch functions as DataFusion scalar UDFs, by SQL name (register them on the
    ``SessionContext`` that runs the partial and merge queries)."""
    digests = pa.list_(pa.field("item", pa.binary()))
    return {
        "__fs_hll_sketch": datafusion.udf(
            hll_sketch, [digests], HLL_SKETCH, "immutable", name="__fs_hll_sketch"
        ),
        "__fs_hll_union": datafusion.udf(
            hll_union, [pa.list_(HLL_SKETCH)], HLL_SKETCH, "immutable", name="__fs_hll_union"
        ),
        "__fs_dd_sketch": datafusion.udf(
            dd_sketch, [pa.list_(pa.float64())], DD_SKETCH, "immutable", name="__fs_dd_sketch"
        ),
        "__fs_dd_merge": datafusion.udf(
            dd_merge, [pa.list_(DD_SKETCH)], DD_SKETCH, "immutable", name="__fs_dd_merge"
        ),
        "__fs_moments": datafusion.udf(
            moments, [pa.list_(pa.float64())], MOMENTS, "immutable", name="__fs_moments"
        ),
        "__fs_moments_merge": datafusion.udf(
            moments_merge, [pa.list_(MOMENTS)], MOMENTS, "immutable", name="__fs_moments_merge"
        ),
    }
