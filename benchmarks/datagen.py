"""Generated rows: the ``datagen`` source vs numpy's own random streams for the same columns.

Both sides make :data:`ROWS` rows of five columns as Arrow record batches of
:data:`BATCH_ROWS` rows: ``id`` (int64, 0, 1, 2, …), ``key`` (int64 uniform in 0..999), ``v``
(float64 uniform in [0, 1)), ``s`` (8 characters of ``[0-9A-Za-z]``) and ``t``
(``timestamp[ns, UTC]``, 100 µs apart, minus a jitter uniform in [0, 5 ms]).

* flight-serve: a ``DatagenSource`` (``rows_per_second = 'unlimited'``, one partition) polled to
  its end: every random value a pure function of (seed, column, partition, row index) through
  numpy's counter-based Philox, so a restored run or another batching gives the same rows;
* baseline: one ``numpy.random.default_rng`` (PCG64, a stateful stream, the fastest numpy
  way) drawing the same columns batch after batch, and the same Arrow construction; its values
  depend on every draw before them, so it cannot restore at a row or re-batch.

The ratio (flight-serve rows/s over the baseline's) is the price of reproducible rows; there is
no target. The note gives the CPU time of one subject run.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from benchmarks._harness import Comparison, alternate

ROWS = 2_000_000
BATCH_ROWS = 65_536
_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("key", pa.int64()),
        ("v", pa.float64()),
        ("s", pa.string()),
        ("t", pa.timestamp("ns", tz="UTC")),
    ]
)
_ALPHABET = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_TRANSLATE = _ALPHABET + bytes(256 - len(_ALPHABET))


def _baseline(rows: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    out = []
    for first in range(0, rows, BATCH_ROWS):
        n = min(BATCH_ROWS, rows - first)
        ids = np.arange(first, first + n, dtype=np.int64)
        chars = rng.integers(0, 62, n * 8, dtype=np.uint8).tobytes().translate(_TRANSLATE)
        strings = pa.Array.from_buffers(
            pa.string(),
            n,
            [None, pa.py_buffer(np.arange(0, (n + 1) * 8, 8, dtype=np.int32)), pa.py_buffer(chars)],
        )
        t = ids * 100_000 - rng.integers(0, 5_000_001, n, dtype=np.int64)
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(ids),
                    pa.array(rng.integers(0, 1000, n, dtype=np.int64)),
                    pa.array(rng.random(n)),
                    strings,
                    pa.array(t).view(pa.timestamp("ns", tz="UTC")),
                ],
                schema=_SCHEMA,
            )
        )
    return out


def _subject(rows: int) -> list[pa.RecordBatch]:
    from flight_serve.connectors.datagen import DatagenOptions, DatagenSource

    options = DatagenOptions.from_options(
        {
            "rows_per_second": "unlimited",
            "number_of_rows": str(rows),
            "batch_rows": str(BATCH_ROWS),
            "seed": "7",
            "fields.id.kind": "sequence",
            "fields.key.min": "0",
            "fields.key.max": "999",
            "fields.s.length": "8",
            "fields.t.interval": "100us",
            "fields.t.max_out_of_orderness": "5ms",
        },
        _SCHEMA,
    )
    source = DatagenSource(options)
    source.open(None)
    out: list[pa.RecordBatch] = []
    while not source.done:
        out += [e.batch for e in source.poll(0.0, 64) if e.batch is not None]
    return out


def datagen(repeat: int) -> list[Comparison]:
    """The comparison described in the module docstring (``repeat`` runs per side)."""
    made: dict[str, list[pa.RecordBatch]] = {}

    def subject() -> None:
        made["subject"] = _subject(ROWS)

    def baseline() -> None:
        made["baseline"] = _baseline(ROWS)

    comparison = Comparison(
        name="datagen",
        subject=f"DatagenSource polled to the end ({ROWS:,} rows, 5 columns)",
        baseline="numpy default_rng (PCG64) draws + the same Arrow arrays",
        units=ROWS,
        unit="rows",
    )
    alternate(comparison, subject, baseline, repeat)
    cpu = time.process_time()
    _subject(ROWS)
    cpu = time.process_time() - cpu
    ours = pa.Table.from_batches(made["subject"])
    theirs = pa.Table.from_batches(made["baseline"])
    assert ours.schema == theirs.schema == _SCHEMA
    assert ours.num_rows == theirs.num_rows == ROWS
    assert ours.column("id").to_pylist()[-1] == ROWS - 1
    assert pa.Table.from_batches(_subject(ROWS)).equals(ours)  # the same rows every run
    comparison.nbytes = ours.nbytes
    comparison.note = (
        f"both sides: {ROWS:,} rows, the same schema; datagen's rows equal on a second run; one "
        f"subject run takes {cpu:.3f} CPU-s ({ROWS / cpu / 1e6:.2f} M rows/s of CPU)"
    )
    return [comparison]
