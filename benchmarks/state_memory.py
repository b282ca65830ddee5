"""Bytes of window state per open window, for each folded aggregate (issue 19), measured.

For each window kind (TUMBLE 10 s; HOP 40 s / 10 s, i.e. 4 panes a window; SESSION gap 5 s)
and each aggregate alone (``count(*)``, ``count(v)``, ``sum(v)``, ``min(v)``, ``max(v)``,
``avg(v)`` over a float64 ``v``), an operator is fed ``KEYS`` int64 keys with one row each in
one window (nothing fires), and its state is read back:

* **numpy state / open window**: the bytes of the folded arrays as allocated (capacity
  included: slots grow by doubling, tumbling / hopping pane rows by at least 4), divided by the
  open (key, window) pairs (``open_panes``);
* **key map / key**: the key → slot map (the keys' values and the direct-address table);
* **SQL path / open window**: the same query with ``fold_state = false``: the Arrow bytes of its
  snapshot (pane state plus unmerged row buffer), divided by the open windows, for reference.

Printed as a table; no ratio (``benchmarks.run state_memory``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
from flight_serve.pipelines.query import parse_window_query
from rich.console import Console
from rich.table import Table

from benchmarks._harness import Comparison
from benchmarks.data import EVENTS_START_NS

KEYS = 100_000
WINDOWS = {
    "tumble": "TUMBLE(input, t, INTERVAL '10' SECOND)",
    "hop 40/10": "HOP(input, t, INTERVAL '10' SECOND, INTERVAL '40' SECOND)",
    "session 5 s": "SESSION(input, t, INTERVAL '5' SECOND)",
}
AGGREGATES = ("count(*)", "count(v)", "sum(v)", "min(v)", "max(v)", "avg(v)")


def _batch() -> pa.RecordBatch:
    keys = np.random.default_rng(3).permutation(KEYS).astype(np.int64)
    t = EVENTS_START_NS + np.arange(KEYS, dtype=np.int64) * (5_000_000_000 // KEYS)  # < 5 s
    return pa.RecordBatch.from_pydict(
        {
            "key": keys,
            "t": pa.array(t, pa.timestamp("ns", tz="UTC")),
            "v": np.linspace(0.0, 1.0, KEYS),
        }
    )


def measure() -> list[tuple[str, str, float, float, float]]:
    """``(window, aggregate, numpy bytes / open window, key map bytes / key, SQL path bytes /
    open window)`` for every window kind and aggregate."""
    batch = _batch()
    out = []
    for wname, window in WINDOWS.items():
        for agg in AGGREGATES:
            sql = (
                f"SELECT key, window_start, window_end, {agg} AS a FROM {window} "
                "GROUP BY key, window_start, window_end"
            )
            spec = parse_window_query(sql).aggregation
            folded = spec.build(batch.schema)
            assert folded.folded_state, sql
            assert not folded.process(batch).output.num_rows
            state = folded._fold if folded._fold is not None else folded._sfold
            assert state is not None
            numpy_bytes = state.state_bytes()
            per_window = numpy_bytes / folded.open_panes
            per_key = state.keys.nbytes / KEYS
            plain = replace(spec, fold_state=False).build(batch.schema)
            plain.process(batch)
            snap = plain.snapshot()
            sql_bytes = snap.panes.nbytes + snap.buffer.nbytes
            out.append((wname, agg, per_window, per_key, sql_bytes / folded.open_panes))
    return out


def state_memory(repeat: int) -> list[Comparison]:
    """Print the table of :func:`measure` (``repeat`` is not used: the sizes are exact)."""
    table = Table(
        title=f"State per open window ({KEYS:,} keys, one open window each)", title_justify="left"
    )
    for column in ("window", "aggregate", "folded numpy B / window", "key map B / key",
                   "SQL path B / window"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("window", "aggregate") else "right")
    for wname, agg, per_window, per_key, sql_bytes in measure():
        table.add_row(wname, agg, f"{per_window:.1f}", f"{per_key:.1f}", f"{sql_bytes:.1f}")
    Console(width=110).print(table)
    return []
