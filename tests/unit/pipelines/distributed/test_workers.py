"""The distributed dataflow without a cluster (pipelines/distributed/workers.py, run_local):
every golden case at parallelism 1, 2 and 3 writes the embedded run's rows (two_stage_view and
two_stage_keyed_late through the second exchange); what is not distributed yet is refused by
name; SET parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.distributed.keygroups import instances_of, key_groups
from flight_serve.pipelines.distributed.workers import JobSpec, run_local
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

GOLDEN = Path(__file__).parents[3] / "golden"
CASES = sorted(p.parent.name for p in GOLDEN.glob("*/pipeline.sql"))


def rows_by_sink(pairs: list[tuple[str, pa.RecordBatch]]) -> dict[str, list[Any]]:
    """Every sink's rows as sorted tuples (order within a step is not part of the contract
    across instances)."""
    out: dict[str, list[Any]] = {}
    for sink, batch in pairs:
        out.setdefault(sink, []).extend(tuple(r.items()) for r in batch.to_pylist())
    return {k: sorted(v, key=repr) for k, v in out.items()}


def embedded(path: Path, tmp_path: Path) -> dict[str, list[Any]]:
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=tmp_path)
    return rows_by_sink(list(runtime.run(write=False, collect=True)))


@pytest.mark.parametrize("case", CASES)
def test_every_golden_case_equals_the_embedded_run_at_parallelism_1_2_3(
    case: str, tmp_path: Path
) -> None:
    path = GOLDEN / case / "pipeline.sql"
    expected = embedded(path, tmp_path)
    assert expected, "the case writes rows"
    for parallelism in (1, 2, 3):
        spec = JobSpec(path.read_text(), str(path), str(tmp_path), parallelism, 128)
        summary, got = run_local(spec, write=False)
        assert rows_by_sink(got) == expected, f"parallelism {parallelism}"
        assert summary.rows == {k: len(v) for k, v in expected.items()} | {
            k: 0 for k in summary.rows if k not in expected
        }


def test_the_instances_split_the_keys(tmp_path: Path) -> None:
    """At parallelism 3 the windows of tumble_count_keys_late are spread over instances (the
    exchange partitions; a single instance would pass the equality test too)."""
    from flight_serve.pipelines.distributed.workers import SourceWorker, WindowWorker

    path = GOLDEN / "tumble_count_keys_late" / "pipeline.sql"
    spec = JobSpec(path.read_text(), str(path), str(tmp_path), 3, 128)
    windows = [WindowWorker(spec, i) for i in range(3)]
    SourceWorker(spec, {"input": [0]}, lambda i, records: windows[i].put(records)).run()
    per_instance = [w.rows_in for w in windows]
    assert sum(per_instance) == 6
    assert sum(1 for n in per_instance if n) >= 2, per_instance


def test_the_golden_cases_include_the_second_exchange() -> None:
    assert {"two_stage_view", "two_stage_keyed_late"} <= set(CASES)


def seconds(pairs: list[tuple[str, pa.RecordBatch]], sink: str) -> pa.Table:
    """Sink ``sink``'s rows with every timestamp[s] column as int64 seconds."""
    table = pa.Table.from_batches([b for s, b in pairs if s == sink])
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, pc.cast(table[field.name], pa.int64()))
    return table


def tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


def oracle(sql: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    """DataFusion batch SQL over ``tables`` (one partition each)."""
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(1))
    for name, table in tables.items():
        ctx.register_record_batches(name, [table.to_batches()])
    return tuples(ctx.sql(sql).to_arrow_table())


KEYED = GOLDEN / "two_stage_keyed_late"


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_a_keyed_window_over_another_and_one_over_its_late_rows_at_parallelism_1_2_3(
    parallelism: int, tmp_path: Path
) -> None:
    """The golden case two_stage_keyed_late through run_local (its timeline is drawn in its
    pipeline.sql): stage 2 keyed by region over stage 1's sessions per region and shop, with
    a row late for stage 2 only, and a window over LATE(visits). Exact rows by hand, and each
    stage against DataFusion batch SQL over the rows that stage accepted."""
    path = KEYED / "pipeline.sql"
    spec = JobSpec(path.read_text(), str(path), str(tmp_path), parallelism, 128)
    _, got = run_local(spec, write=False)
    stage1, out = seconds(got, "stage1"), seconds(got, "out")
    late1, late2, counts = seconds(got, "late1"), seconds(got, "late2"), seconds(got, "late_counts")
    assert tuples(stage1) == [
        ("east", "s1", 1, 43, 5, 4753), ("east", "s2", 4, 14, 1, 8),
        ("east", "s3", 52, 62, 1, 16384), ("north", "s1", 13, 23, 1, 32),
        ("north", "s2", 39, 49, 1, 8192), ("west", "s1", 21, 38, 2, 2304),
        ("west", "s3", 2, 12, 1, 4), ("west", "s4", 2, 12, 1, 2),
    ]  # fmt: skip
    assert tuples(out) == [
        ("east", 0, 20, 1, 1, "s2", "s2"), ("east", 40, 60, 1, 1, "s3", "s3"),
        ("north", 0, 20, 1, 1, "s1", "s1"), ("north", 20, 40, 1, 1, "s2", "s2"),
        ("west", 0, 20, 2, 2, "s3", "s4"), ("west", 20, 40, 2, 1, "s1", "s1"),
    ]  # fmt: skip
    # east s1's session [1,43) reaches stage 2 when its watermark is 21: late for [0,20)
    assert tuples(late2) == [("east", "s1", 1, 43, 5, 4753, "late", 0, 20)]
    assert tuples(late1) == [
        ("north", "s2", 9, 1024, "late", 9, 19), ("west", "s2", 3, 64, "late", 3, 13)
    ]
    assert tuples(counts) == [("north", 0, 30, 1, 1024), ("west", 0, 30, 1, 64)]

    # the oracles: stage 1's sessions over the input rows it did not send to LATE(visits) ...
    inputs = pa.concat_tables(
        pa.csv.read_csv(KEYED / "parts" / name) for name in ("a.csv", "b.csv")
    )
    inputs = inputs.set_column(2, "t", pc.cast(pc.cast(inputs["t"], pa.timestamp("s")), pa.int64()))
    assert tuples(stage1) == oracle(
        """WITH accepted AS (
               SELECT i.* FROM input i WHERE NOT EXISTS (
                   SELECT 1 FROM late l WHERE l.region = i.region AND l.shop = i.shop
                   AND l.t = i.t AND l.v = i.v)),
           marked AS (
               SELECT *, CASE WHEN t - lag(t) OVER (PARTITION BY region, shop ORDER BY t) < 10
                         THEN 0 ELSE 1 END AS starts
               FROM accepted),
           numbered AS (
               SELECT *, sum(starts) OVER (PARTITION BY region, shop ORDER BY t
                                           ROWS UNBOUNDED PRECEDING) AS session
               FROM marked)
           SELECT region, shop, min(t), max(t) + 10, count(*), sum(v)
           FROM numbered GROUP BY region, shop, session""",
        input=inputs,
        late=late1,
    )
    # ... stage 2's tumbling windows over the sessions it did not send to LATE(per_region)
    assert tuples(out) == oracle(
        """SELECT region, window_start / 20 * 20, window_start / 20 * 20 + 20, sum(n), count(*),
                  first_value(shop ORDER BY window_start, shop),
                  last_value(shop ORDER BY window_start, shop NULLS FIRST)
           FROM stage1 s WHERE NOT EXISTS (
               SELECT 1 FROM late l WHERE l.region = s.region AND l.shop = s.shop
               AND l.window_start = s.window_start)
           GROUP BY region, window_start / 20""",
        stage1=stage1,
        late=late2,
    )
    # ... and the window over the late rows
    assert tuples(counts) == oracle(
        "SELECT region, t / 30 * 30, t / 30 * 30 + 30, count(*), sum(v) FROM late "
        "GROUP BY region, t / 30",
        late=late1,
    )


def test_the_keyed_case_spreads_both_stages_and_splits_a_tie_over_instances() -> None:
    """What makes two_stage_keyed_late a test of the second exchange at parallelism 2 and 3:
    stage 2's keys live on two instances, and at 3 the two sessions tied at window_start 2
    (west s3 and west s4) come from different stage-1 instances, so stage 2 gets them in
    instance order (s4's instance first), not the embedded order, and first_value /
    last_value still say s3 / s4."""
    regions = pa.record_batch({"region": ["east", "north", "west"]})
    assert instances_of(key_groups(regions, ["region"], 128), 2, 128).tolist() == [1, 0, 0]
    assert instances_of(key_groups(regions, ["region"], 128), 3, 128).tolist() == [2, 0, 0]
    tied = pa.record_batch({"region": ["west", "west"], "shop": ["s3", "s4"]})
    assert instances_of(key_groups(tied, ["region", "shop"], 128), 3, 128).tolist() == [2, 1]


THREE_STAGES = """
CREATE SOURCE input (key VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'file', path = 'in.csv', batch_rows = '2');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE VIEW s1 AS SELECT key, window_start, window_end, sum(v) AS v
FROM TUMBLE(input, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end;
CREATE VIEW s2 AS SELECT key, window_start, window_end, sum(v) AS v, count(*) AS n
FROM TUMBLE(s1, window_start, INTERVAL '20' SECOND) GROUP BY key, window_start, window_end;
INSERT INTO out SELECT key, window_start, window_end, sum(v) AS v, sum(n) AS n
FROM TUMBLE(s2, window_start, INTERVAL '40' SECOND) GROUP BY key, window_start, window_end;
"""


def test_a_third_stage_reads_the_second_through_the_same_exchange(tmp_path: Path) -> None:
    """Three windowed queries in a row (10 s, 20 s, 40 s per key), batches of two rows: the
    third stage's records are numbered by the same source steps. Equal to the embedded run at
    parallelism 1, 2 and 3, and to the sums by hand."""
    keys = ["a", "b", "c", "d"]
    rows = [(keys[i % 4], 3 * i, i) for i in range(40)]  # t = 0, 3, …, 117 s
    (tmp_path / "in.csv").write_text(
        "key,t,v\n" + "".join(f"{k},1970-01-01 00:{t // 60:02d}:{t % 60:02d},{v}\n"
                              for k, t, v in rows)
    )  # fmt: skip
    path = tmp_path / "p.sql"
    path.write_text(THREE_STAGES)
    expected = embedded(path, tmp_path)
    # by hand: per key and 40 s window, the sum of v and the stage-1 windows (10 s) it saw
    sums: dict[tuple[str, int], list[int]] = {}
    for k, t, v in rows:
        entry = sums.setdefault((k, t // 40 * 40), [0, 0])
        entry[0] += v
    for k, start in sums:
        sums[(k, start)][1] = len({t // 10 for kk, t, _ in rows if kk == k and t // 40 * 40 == start})
    got = {(r[0][1], int(r[1][1].timestamp())): [r[3][1], r[4][1]] for r in expected["out"]}
    assert got == sums
    for parallelism in (1, 2, 3):
        spec = JobSpec(path.read_text(), str(path), str(tmp_path), parallelism, 128)
        _, pairs = run_local(spec, write=False)
        assert rows_by_sink(pairs) == expected, f"parallelism {parallelism}"


def test_a_table_function_between_two_windowed_queries_is_refused_by_name(
    tmp_path: Path,
) -> None:
    from flight_serve.pipelines.distributed.workers import check_distributable

    path = tmp_path / "p.sql"
    path.write_text(
        "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t) "
        "WITH (connector = 'file', path = 'in.csv');\n"
        "CREATE FUNCTION spread() RETURNS TABLE (k VARCHAR, window_start TIMESTAMP(0)) "
        "LANGUAGE python AS $$\ndef spread(batch):\n    yield batch\n$$;\n"
        "CREATE SINK o WITH (connector = 'file', format = 'csv');\n"
        "CREATE VIEW w1 AS SELECT k, window_start, window_end, count(*) AS n "
        "FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;\n"
        "CREATE VIEW spread_out AS SELECT * FROM spread(w1);\n"
        "INSERT INTO o SELECT k, window_start, window_end, count(*) AS n "
        "FROM TUMBLE(spread_out, window_start, INTERVAL '20' SECOND) "
        "GROUP BY k, window_start, window_end;\n"
    )
    (tmp_path / "in.csv").write_text("k,t\na,1970-01-01 00:00:01\n")
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), load_tables=False)
    with pytest.raises(
        PipelineSQLError,
        match=r"INSERT INTO o \(line 9\): reads the results of view w1 through the table "
        r"function spread; between two windowed queries it would see each instance's share of "
        r"the results, not all of them: run it embedded",
    ):
        check_distributable(runtime)


PIPELINE = (
    "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t) "
    "WITH (connector = 'file', path = 'in.csv');\n"
    "CREATE SINK o WITH (connector = 'file', format = 'csv');\n"
    "INSERT INTO o SELECT k, window_start, window_end, count(*) AS n "
    "FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;\n"
)


def test_set_parallelism_is_a_run_option() -> None:
    plan = parse_pipeline("SET parallelism = 3;\nSET max_parallelism = 64;\n" + PIPELINE)
    assert (plan.run_options.parallelism, plan.run_options.max_parallelism) == (3, 64)
    with pytest.raises(PipelineSQLError, match=r"option parallelism: must be at least 1, got 0"):
        parse_pipeline("SET parallelism = 0;\n" + PIPELINE)
    with pytest.raises(PipelineSQLError, match=r"option max_parallelism: must be at most 32768"):
        parse_pipeline("SET max_parallelism = 40000;\n" + PIPELINE)


def test_a_share_moves_the_watermark_as_the_whole_batch_after_its_where_filter(
    tmp_path: Path,
) -> None:
    """WindowOperator.batch_progress_ns counts the rows the query's WHERE keeps, and
    process(progress_ns) moves an instance that got none of a batch's rows to that progress."""
    path = tmp_path / "p.sql"
    (tmp_path / "in.csv").write_text("k,t\na,1970-01-01 00:00:05\nb,1970-01-01 00:00:25\n")
    path.write_text(
        "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), WATERMARK FOR t AS t) "
        "WITH (connector = 'file', path = 'in.csv');\n"
        "CREATE SINK o WITH (connector = 'file', format = 'csv');\n"
        "INSERT INTO o SELECT k, window_start, window_end, count(*) AS n "
        "FROM TUMBLE(s, t, INTERVAL '10' SECOND) WHERE k = 'a' "
        "GROUP BY k, window_start, window_end;\n"
    )
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=tmp_path)
    op = runtime.window_nodes()[0].op
    batch = next(runtime.sources["s"].read_file(0))
    assert op.batch_progress_ns(batch) == 5 * 10**9  # b's row is filtered out: not progress
    share = batch.slice(0, 0)
    op.add_partition("p")
    op.process(share, "p", progress_ns=25 * 10**9)
    assert op.watermark_ns == 25 * 10**9


ONE_FILE = """
CREATE SOURCE input (key VARCHAR, t TIMESTAMP(3), v BIGINT, WATERMARK FOR t AS t - INTERVAL '2' SECOND)
WITH (connector = 'file', path = 'one.parquet', batch_rows = '700');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'csv');
CREATE SINK big WITH (connector = 'file', format = 'csv');
INSERT INTO out SELECT key, window_start, window_end, count(*) AS n, sum(v) AS v
FROM TUMBLE(input, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(input);
INSERT INTO big SELECT key, t, v FROM input WHERE v % 97 = 0;
"""


def test_a_single_parquet_file_is_read_in_row_group_parts_with_the_embedded_output(
    tmp_path: Path,
) -> None:
    """One Parquet file of 10,000 rows in row groups of 1,500 (7 groups) and batches of 700
    (15 steps; most batches straddle two row groups): at parallelism 2 and 3 the file is read
    by 2 and 3 source workers, interleaved by row group, and the windows (with late rows: the
    times run 1.2 s forward with a 30 s step back every 7 rows, the watermark 2 s behind) and
    the per-row sink equal the embedded run's."""
    import pyarrow.parquet as pq
    from flight_serve.pipelines.distributed.workers import FileSplit, assign_splits

    n = 10_000
    times = [1_200 * i - (30_000 if i % 7 == 6 else 0) for i in range(n)]  # ms
    table = pa.table({
        "key": [f"k{i % 13}" for i in range(n)],
        "t": pa.array(times, pa.timestamp("ms")),
        "v": pa.array(range(n), pa.int64()),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "one.parquet", row_group_size=1_500)
    path = tmp_path / "p.sql"
    path.write_text(ONE_FILE)
    expected = embedded(path, tmp_path)
    # every row is in one window's count or late; the per-row sink: v = 0, 97, …, 9991
    counted = sum(dict(row)["n"] for row in expected["out"])
    assert counted + len(expected["late"]) == n
    assert 0 < len(expected["late"]) < n // 7
    assert sorted(dict(row)["v"] for row in expected["big"]) == list(range(0, n, 97))
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=tmp_path)
    assert assign_splits(runtime, 3) == [
        {"input": [FileSplit(0, 0, 3)]},
        {"input": [FileSplit(0, 1, 3)]},
        {"input": [FileSplit(0, 2, 3)]},
    ]
    for parallelism in (1, 2, 3):
        spec = JobSpec(path.read_text(), str(path), str(tmp_path), parallelism, 128)
        _, got = run_local(spec, write=False)
        assert rows_by_sink(got) == expected, f"parallelism {parallelism}"
