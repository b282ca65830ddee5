"""Incremental, mergeable aggregates (DESIGN §4), computed by DataFusion.

Each aggregate is split the way a distributed query engine splits it:

* a **partial** aggregate, computed by DataFusion over the rows buffered since the last merge,
  grouped by key and window;
* a **merge** aggregate, computed by DataFusion over the union of the stored partial state and the
  new partials (the pane state of one key and window is one row of partial columns);
* a **final** expression, evaluated with pyarrow compute when the window fires.

The pane state is an immutable Arrow table, so taking a snapshot never consumes or resets live
state (unlike calling ``state()`` on a live DataFusion accumulator). ``ts`` below is the buffered
event time (int64 ns), ``p``/``t`` the partial columns; "(UDF)" marks the numpy-vectorised
scalar functions of :mod:`.sketches`, applied to DataFusion's ``array_agg`` of each group (one
call per batch of groups, never per row or per group).

| aggregate              | partial columns                                   | merge                        | final                      |
|------------------------|---------------------------------------------------|------------------------------|----------------------------|
| count(*), count(x)     | ``count(*)`` / ``count(x)`` (int64)               | sum                          | the count (0 if none)      |
| count(DISTINCT x)      | ``array_agg(DISTINCT x)`` without NULLs           | ``array_distinct(flatten(array_agg(p)))`` | list length   |
| sum(x)                 | ``sum(x)``                                        | sum                          | the sum (NULL if no value) |
| min(x), max(x)         | ``min(x)`` / ``max(x)`` (any orderable type)      | min / max                    | the min / max              |
| avg(x)                 | ``sum(CAST(x AS DOUBLE))``, ``count(x)``          | sum, sum                     | sum / count (NULL if 0)    |
| stddev, var (6 names)  | ``struct<n, mean, m2>``, two-pass (UDF)           | Chan's parallel update (UDF) | see below                  |
| first_value(x)         | ``first_value(x ORDER BY ts, x)``, ``min(ts)``    | ``first_value(p ORDER BY t, p)``, ``min(t)`` | the value  |
| last_value(x)          | ``last_value(x ORDER BY ts, x NULLS FIRST)``, ``max(ts)`` | same over ``(t, p)``, ``max(t)`` | the value     |
| approx_distinct(x)     | HyperLogLog of ``digest(CAST(x AS VARCHAR), 'md5')`` (UDF) | register-wise max (UDF) | the estimate (uint64) |
| approx_percentile_cont(x, q) | DDSketch of ``CAST(x AS DOUBLE)`` (UDF)     | bucket-wise sum (UDF)        | the interpolated quantile  |

Float min / max use ``coalesce(min(nullif(x, +inf)), max(x))`` (and the mirror for max)
in both steps: DataFusion's grouped min / max start from the largest finite value, so a group of
only infinities would come out finite (:func:`float_bound_sql`).

Result types are DataFusion's own for the same aggregate over the same input (count → int64,
sum(int) → int64, sum(float) → float64, min/max/first_value/last_value → the input type, avg and
stddev/var → float64, approx_distinct → uint64, approx_percentile_cont → float32 for float32 input
else float64), so a window result equals DataFusion's batch ``GROUP BY`` over the same rows; where
it cannot be bit-equal:

* avg: the summation order differs from a single batch pass, which can change the last bits.
* stddev / stddev_samp / var / var_samp (sample, NULL for fewer than 2 values) and stddev_pop /
  var_pop (population, NULL for no value): the partial is ``struct<n, mean, m2>`` of the buffered
  values (``m2`` = sum of squared deviations), computed over DataFusion's ``array_agg`` with the
  corrected two-pass algorithm on values shifted by the first buffered one; partials merge with
  Chan, Golub and LeVeque's update ``M2 = sum M2_i + sum n_i (mean_i - mean)^2``. Not a running
  ``(count, sum x, sum x^2)``: that form cancels catastrophically when the mean is large next to
  the spread (5 000 values 1e9 + {0, 1, 2, 3}: naive var_pop -128; ours exact to the last bit
  after 50 merges; DataFusion's single-pass Welford 1.3e-9 relative). Tests hold it to 1e-9
  relative of DataFusion's batch result.
* first_value / last_value are by event time (DESIGN §4) and, like DataFusion's default, respect
  NULLs: the value of the row with the earliest (latest) event time, even if that value is NULL.
  Rows with equal event times are ordered by value, so the result does not depend on arrival
  order: first_value takes the smallest non-NULL value among the earliest rows, last_value the
  largest among the latest (NULL only if all of those are NULL); DataFusion's oracle is
  ``first_value(x ORDER BY t, x)`` / ``last_value(x ORDER BY t, x NULLS FIRST)``. With
  ``IGNORE NULLS`` (Flink's FIRST_VALUE / LAST_VALUE skip NULLs) NULL values are not considered.
* approx_distinct and approx_percentile_cont use the sketches of :mod:`.sketches` (HyperLogLog
  with 4096 registers, standard error 1.6 %; DDSketch with 1 % relative accuracy, exact for panes
  of at most 100 values), not DataFusion's, so they agree with DataFusion's exact
  ``count(DISTINCT x)`` and ``percentile_cont`` within those errors. Both sketches merge exactly
  (max of registers, sum of counts), so these results do not depend on how the input was cut into
  batches. approx_distinct accepts every type DataFusion can cast to text, and binary (DataFusion's
  own rejects floats, for one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

SUPPORTED = (
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "stddev",
    "stddev_samp",
    "stddev_pop",
    "var",
    "var_samp",
    "var_pop",
    "first_value",
    "last_value",
    "approx_distinct",
    "approx_percentile_cont",
)
_MOMENTS = ("stddev", "stddev_samp", "stddev_pop", "var", "var_samp", "var_pop")
_UDFS: dict[str, tuple[str, ...]] = {
    "approx_distinct": ("__fs_hll_sketch", "__fs_hll_union"),
    "approx_percentile_cont": ("__fs_dd_sketch", "__fs_dd_merge"),
    **{f: ("__fs_moments", "__fs_moments_merge") for f in _MOMENTS},
}
_SCALAR_UDFS: dict[str, Any] = {}


def quote_ident(name: str) -> str:
    """Quote ``name`` as a SQL identifier for DataFusion (double quotes, embedded quotes doubled).

    >>> quote_ident('a"b')
    '"a""b"'
    """
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate in a windowed query.

    Args:
        func: one of :data:`SUPPORTED` (case-insensitive; DataFusion's names).
        column: the input column, or ``None`` for ``count(*)``.
        alias: the output column name.
        distinct: ``count(DISTINCT column)``.
        ignore_nulls: ``first_value`` / ``last_value`` skip NULL values (``IGNORE NULLS``).
        percentile: the fraction ``q`` (``0 ≤ q ≤ 1``) of ``approx_percentile_cont``.

    Raises:
        ValueError: unknown ``func``; ``column`` missing for anything but ``count``; ``distinct``
            on anything but ``count(column)``; ``ignore_nulls`` on anything but first/last_value;
            ``percentile`` missing, outside ``[0, 1]`` or given to another aggregate.

    >>> AggregateCall("APPROX_PERCENTILE_CONT", "v", "p90", percentile=0.9).func
    'approx_percentile_cont'
    """

    func: str
    column: str | None
    alias: str
    distinct: bool = False
    ignore_nulls: bool = False
    percentile: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "func", self.func.lower())
        func = self.func
        if func not in SUPPORTED:
            raise ValueError(
                f"aggregate {func!r} is not supported; supported: {', '.join(SUPPORTED)}"
            )
        if self.column is None and func != "count":
            raise ValueError(f"{func}(*) is not an aggregate; name a column")
        if self.distinct and (func != "count" or self.column is None):
            raise ValueError(f"{func}(DISTINCT ...) is not supported; only count(DISTINCT column)")
        if self.ignore_nulls and func not in ("first_value", "last_value"):
            raise ValueError(f"IGNORE NULLS applies to first_value and last_value, not {func}")
        if func == "approx_percentile_cont":
            if self.percentile is None or not 0.0 <= self.percentile <= 1.0:
                raise ValueError(
                    f"approx_percentile_cont needs a percentile between 0 and 1, got "
                    f"{self.percentile}"
                )
        elif self.percentile is not None:
            raise ValueError(f"{func} takes no percentile")

    @property
    def key(self) -> tuple[object, ...]:
        """What makes two calls the same aggregate (everything but the alias)."""
        return (self.func, self.column, self.distinct, self.ignore_nulls, self.percentile)

    def udfs(self) -> list[Any]:
        """The DataFusion scalar UDFs the partial and merge SQL call (register them first)."""
        names = _UDFS.get(self.func, ())
        if names and not _SCALAR_UDFS:
            from flight_serve.engine import sketches

            _SCALAR_UDFS.update(sketches.scalar_udfs())
        return [_SCALAR_UDFS[n] for n in names]

    def partial_sql(
        self, prefix: str, time_sql: str = '"__ts"', float_sql_type: str | None = None
    ) -> list[tuple[str, str]]:
        """``(partial column name, DataFusion SQL over the raw rows)`` pairs.

        ``time_sql`` is the SQL of the buffered event time (int64 ns since the epoch), for
        aggregates ordered by event time. ``float_sql_type`` (``DOUBLE`` / ``REAL``) says the
        column is floating point, for min / max (:func:`float_bound_sql`).
        """
        if self.column is None:
            return [(f"{prefix}c", "count(*)")]
        col = quote_ident(self.column)
        not_null = f"FILTER (WHERE {col} IS NOT NULL)"
        func = self.func
        if func == "count" and self.distinct:
            return [(f"{prefix}d", f"array_agg(DISTINCT {col}) {not_null}")]
        if func == "count":
            return [(f"{prefix}c", f"count({col})")]
        if func == "avg":
            return [(f"{prefix}s", f"sum(CAST({col} AS DOUBLE))"), (f"{prefix}c", f"count({col})")]
        if func in _MOMENTS:
            # the second column is always NULL: DataFusion's var_pop(col) rejects non-numeric
            # input at planning (CAST alone would turn '1.5' into 1.5)
            return [
                (f"{prefix}m", f"__fs_moments(array_agg(CAST({col} AS DOUBLE)) {not_null})"),
                (f"{prefix}z", f"var_pop({col}) FILTER (WHERE FALSE)"),
            ]
        if func in ("first_value", "last_value"):
            flt = f" {not_null}" if self.ignore_nulls else ""
            if func == "first_value":
                order = f"{time_sql} NULLS LAST, {col} NULLS LAST"
                bound = "min"
            else:
                order = f"{time_sql} NULLS FIRST, {col} NULLS FIRST"
                bound = "max"
            return [
                (f"{prefix}v", f"{func}({col} ORDER BY {order}){flt}"),
                (f"{prefix}t", f"{bound}({time_sql}){flt}"),
            ]
        if func == "approx_distinct":
            # the text of the value; binary (possibly not UTF-8) as the hex of a one-element list.
            # DataFusion folds arrow_typeof at planning, so only one branch runs.
            digest = (
                f"CASE WHEN arrow_typeof({col}) LIKE '%Binary%' "
                f"THEN digest(CAST(make_array({col}) AS VARCHAR), 'md5') "
                f"ELSE digest(CAST({col} AS VARCHAR), 'md5') END"
            )
            return [(f"{prefix}h", f"__fs_hll_sketch(array_agg({digest}) {not_null})")]
        if func == "approx_percentile_cont":
            # the second column is always NULL: it carries DataFusion's result type (and makes
            # DataFusion reject non-numeric input at planning)
            return [
                (f"{prefix}q", f"__fs_dd_sketch(array_agg(CAST({col} AS DOUBLE)) {not_null})"),
                (
                    f"{prefix}z",
                    f"approx_percentile_cont({col}, {self.percentile!r}) FILTER (WHERE FALSE)",
                ),
            ]
        if func in ("min", "max") and float_sql_type is not None:
            return [(f"{prefix}v", float_bound_sql(func, col, float_sql_type))]
        return [(f"{prefix}v", f"{func}({col})")]

    def merge_sql(self, prefix: str, float_sql_type: str | None = None) -> list[tuple[str, str]]:
        """``(partial column name, DataFusion SQL that merges partial rows)`` pairs
        (``float_sql_type``: as for :meth:`partial_sql`)."""
        func = self.func
        if self.column is not None and func == "count" and self.distinct:
            d = quote_ident(f"{prefix}d")
            return [
                (
                    f"{prefix}d",
                    f"array_distinct(flatten(array_agg({d}) FILTER (WHERE {d} IS NOT NULL)))",
                )
            ]
        if func in _MOMENTS:
            return [
                (f"{prefix}m", f"__fs_moments_merge(array_agg({quote_ident(f'{prefix}m')}))"),
                (f"{prefix}z", f"min({quote_ident(f'{prefix}z')})"),
            ]
        if func in ("first_value", "last_value"):
            v, t = quote_ident(f"{prefix}v"), quote_ident(f"{prefix}t")
            if func == "first_value":
                return [
                    (f"{prefix}v", f"first_value({v} ORDER BY {t} NULLS LAST, {v} NULLS LAST)"),
                    (f"{prefix}t", f"min({t})"),
                ]
            return [
                (f"{prefix}v", f"last_value({v} ORDER BY {t} NULLS FIRST, {v} NULLS FIRST)"),
                (f"{prefix}t", f"max({t})"),
            ]
        if func == "approx_distinct":
            return [(f"{prefix}h", f"__fs_hll_union(array_agg({quote_ident(f'{prefix}h')}))")]
        if func == "approx_percentile_cont":
            return [
                (f"{prefix}q", f"__fs_dd_merge(array_agg({quote_ident(f'{prefix}q')}))"),
                (f"{prefix}z", f"min({quote_ident(f'{prefix}z')})"),
            ]
        if func in ("min", "max") and float_sql_type is not None:
            v = quote_ident(f"{prefix}v")
            return [(f"{prefix}v", float_bound_sql(func, v, float_sql_type))]
        out = []
        for name, _ in self.partial_sql(prefix, '"__ts"'):
            fn = func if func in ("min", "max") else "sum"
            out.append((name, f"{fn}({quote_ident(name)})"))
        return out

    def final(self, state: pa.Table, prefix: str) -> pa.ChunkedArray[Any]:
        """The final value per row of merged ``state`` (pyarrow compute and numpy, no Python loop
        per row). ``count(DISTINCT)`` reads the list column ``<prefix>d`` of the SQL path or,
        from the folded path (:mod:`.distinct`), the int64 count ``<prefix>n``."""
        func = self.func
        if self.column is not None and func == "count" and self.distinct:
            if f"{prefix}n" in state.column_names:  # the folded path's exact count (.distinct)
                return state[f"{prefix}n"].fill_null(pa.scalar(0, pa.int64()))
            lengths = pc.list_value_length(state[f"{prefix}d"])
            counts: pa.ChunkedArray[Any] = lengths.cast(pa.int64())
            return counts.fill_null(pa.scalar(0, pa.int64()))
        if self.column is None or func == "count":
            return state[f"{prefix}c"].fill_null(pa.scalar(0, pa.int64()))
        if func == "avg":
            count = state[f"{prefix}c"]
            total = state[f"{prefix}s"]
            zero = pc.equal(count, pa.scalar(0, pa.int64()))
            safe = pc.if_else(zero, pa.scalar(None, pa.float64()), total)
            result: pa.ChunkedArray[Any] = pc.divide(safe, count.cast(pa.float64()))
            return result
        if func in _MOMENTS:
            return _moments_final(state[f"{prefix}m"], func)
        if func == "approx_distinct":
            from flight_serve.engine import sketches

            return _chunked(sketches.hll_estimate(state[f"{prefix}h"]))
        if func == "approx_percentile_cont":
            assert self.percentile is not None
            from flight_serve.engine import sketches

            quantile = sketches.dd_quantile(state[f"{prefix}q"], self.percentile)
            return _chunked(quantile.cast(state.schema.field(f"{prefix}z").type))
        return state[f"{prefix}v"]


def _chunked(array: pa.Array[Any]) -> pa.ChunkedArray[Any]:
    return pa.chunked_array([array], array.type)


def _moments_final(moments: pa.ChunkedArray[Any], func: str) -> pa.ChunkedArray[Any]:
    """stddev / var from merged ``struct<n, mean, m2>``: population divides M2 by n (NULL for
    n = 0), sample by n - 1 (NULL for n < 2), stddev is the square root."""
    n = pc.struct_field(moments, "n").fill_null(pa.scalar(0, pa.int64()))
    m2 = pc.struct_field(moments, "m2")
    population = func.endswith("_pop")
    denominator = n if population else pc.subtract(n, pa.scalar(1, pa.int64()))
    enough = pc.greater_equal(n, pa.scalar(1 if population else 2, pa.int64()))
    safe = pc.if_else(enough, denominator, pa.scalar(None, pa.int64())).cast(pa.float64())
    variance: pa.ChunkedArray[Any] = pc.divide(m2, safe)
    if func.startswith("stddev"):
        return cast("pa.ChunkedArray[Any]", pc.sqrt(variance))
    return variance


def float_sql_type(t: pa.DataType) -> str | None:
    """``DOUBLE`` / ``REAL`` for float64 / float32 (the input types of :func:`float_bound_sql`),
    else ``None``."""
    if t == pa.float64():
        return "DOUBLE"
    if t == pa.float32():
        return "REAL"
    return None


def float_bound_sql(func: str, expr: str, sql_type: str) -> str:
    """DataFusion SQL of ``min`` / ``max`` of the floating-point ``expr`` that is right for
    infinities: DataFusion 55's grouped ``min`` starts from the largest finite value (``max``
    from the lowest), so a group whose values are all +inf (-inf for ``max``) came out as
    ±1.7976931348623157e308. The infinity is left out of the aggregate and only comes back when
    nothing else is there: ``coalesce(min(nullif(x, +inf)), max(x))``."""
    inf = f"CAST('{'inf' if func == 'min' else '-inf'}' AS {sql_type})"
    other = "max" if func == "min" else "min"
    return f"coalesce({func}(nullif({expr}, {inf})), {other}({expr}))"
