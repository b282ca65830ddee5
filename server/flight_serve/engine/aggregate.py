"""Incremental, mergeable aggregates (DESIGN §4), computed by DataFusion.

Each aggregate is split the way a distributed query engine splits it:

* a **partial** aggregate, computed by DataFusion over the rows buffered since the last merge,
  grouped by key and window;
* a **merge** aggregate, computed by DataFusion over the union of the stored partial state and the
  new partials (the pane state of one key and window is one row of partial columns);
* a **final** expression, evaluated when the window fires.

| aggregate   | partial columns                      | merge          | final                      |
|-------------|--------------------------------------|----------------|----------------------------|
| count(*)    | ``count(*)`` (int64)                 | sum            | the count                  |
| count(x)    | ``count(x)`` (int64)                 | sum            | the count                  |
| sum(x)      | ``sum(x)``                           | sum            | the sum (NULL if no value) |
| min(x)      | ``min(x)``                           | min            | the min                    |
| max(x)      | ``max(x)``                           | max            | the max                    |
| avg(x)      | ``sum(CAST(x AS DOUBLE))``, ``count(x)`` | sum, sum   | sum / count (NULL if 0)    |

Result types are DataFusion's own for the same aggregate over the same input (count → int64,
sum(int) → int64, sum(float) → float64, min/max → the input type, avg → float64), so a window result
equals DataFusion's batch ``GROUP BY`` over the same rows. For avg over non-integer floats the
summation order differs from a single batch pass, which can change the last bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

SUPPORTED = ("count", "sum", "min", "max", "avg")


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
        func: one of ``count``, ``sum``, ``min``, ``max``, ``avg`` (case-insensitive).
        column: the input column, or ``None`` for ``count(*)``.
        alias: the output column name.

    Raises:
        ValueError: unknown ``func``, or ``column`` missing for anything but ``count``.
    """

    func: str
    column: str | None
    alias: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "func", self.func.lower())
        if self.func not in SUPPORTED:
            raise ValueError(
                f"aggregate {self.func!r} is not supported; supported: {', '.join(SUPPORTED)}"
            )
        if self.column is None and self.func != "count":
            raise ValueError(f"{self.func}(*) is not an aggregate; name a column")

    def partial_sql(self, prefix: str, time_sql: str = '"__ts"') -> list[tuple[str, str]]:
        """``(partial column name, DataFusion SQL over the raw rows)`` pairs.

        ``time_sql`` is the SQL of the buffered event time (int64 ns since the epoch), for
        aggregates ordered by event time.
        """
        if self.column is None:
            return [(f"{prefix}c", "count(*)")]
        col = quote_ident(self.column)
        if self.func == "avg":
            return [(f"{prefix}s", f"sum(CAST({col} AS DOUBLE))"), (f"{prefix}c", f"count({col})")]
        if self.func == "count":
            return [(f"{prefix}c", f"count({col})")]
        return [(f"{prefix}v", f"{self.func}({col})")]

    def merge_sql(self, prefix: str) -> list[tuple[str, str]]:
        """``(partial column name, DataFusion SQL that merges partial rows)`` pairs."""
        out = []
        for name, _ in self.partial_sql(prefix, '"__ts"'):
            fn = self.func if self.func in ("min", "max") else "sum"
            out.append((name, f"{fn}({quote_ident(name)})"))
        return out

    def final(self, state: pa.Table, prefix: str) -> pa.ChunkedArray[Any]:
        """The final value per row of merged ``state`` (pyarrow compute, no Python loop)."""
        if self.column is None or self.func == "count":
            return state[f"{prefix}c"].fill_null(pa.scalar(0, pa.int64()))
        if self.func == "avg":
            count = state[f"{prefix}c"]
            total = state[f"{prefix}s"]
            zero = pc.equal(count, pa.scalar(0, pa.int64()))
            safe = pc.if_else(zero, pa.scalar(None, pa.float64()), total)
            result: pa.ChunkedArray[Any] = pc.divide(safe, count.cast(pa.float64()))
            return result
        return state[f"{prefix}v"]
