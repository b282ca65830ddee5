"""The console's view of a real :class:`StreamStore` (no server): a stream's retention as the
store was opened with, and pages of its newest rows (``skip``) cut inside batches."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa
from flight_serve.console.source import ConsoleSource
from flight_serve.store import StreamStore


def test_retention_and_pages_of_the_newest_rows(tmp_path: Path) -> None:
    store = StreamStore(tmp_path, fsync="never", direct_io=False, retention_bytes=64 * 1024**2,
                        retention_age=timedelta(days=7))  # fmt: skip
    try:
        schema = pa.schema([("v", pa.int64())])
        store.create("s", schema)
        for start in (0, 3, 6):  # three batches of 3 rows: offsets 0, 1, 2
            store.append("s", pa.record_batch([pa.array(range(start, start + 3))], schema=schema))
        source = ConsoleSource(None, store)
        shown = source.stream("s")
        assert shown["retention"] == {"bytes": 64 * 1024**2, "age_s": 7 * 86400.0}
        assert (shown["rows"], shown["first_offset"], shown["next_offset"]) == (9, 0, 3)

        def page(limit: int, skip: int) -> list[tuple[int, list[int]]]:
            _, picked = source.newest_rows("s", limit, skip)
            return [(offset, batch.column(0).to_pylist()) for offset, batch in picked]

        assert page(4, 0) == [(1, [5]), (2, [6, 7, 8])]
        assert page(4, 2) == [(1, [3, 4, 5]), (2, [6])]  # the newest 2 (7, 8) left out
        assert page(2, 3) == [(1, [4, 5])]
        assert page(5, 6) == [(0, [0, 1, 2])]  # fewer than asked: the oldest
        assert page(5, 9) == []
        assert page(5, 100) == []
    finally:
        store.close()
