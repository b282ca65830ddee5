"""The distributed dataflow without a cluster (pipelines/distributed/workers.py, run_local):
every golden case at parallelism 1, 2 and 3 writes the embedded run's rows; what is not
distributed yet is refused by name; SET parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.distributed.workers import JobSpec, run_local
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

GOLDEN = Path(__file__).parents[3] / "golden"
#: golden cases the keyed exchange runs (two_stage_view needs a second exchange)
CASES = sorted(
    p.parent.name for p in GOLDEN.glob("*/pipeline.sql") if p.parent.name != "two_stage_view"
)


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


def test_a_window_after_a_window_is_refused_by_name(tmp_path: Path) -> None:
    path = GOLDEN / "two_stage_view" / "pipeline.sql"
    spec = JobSpec(path.read_text(), str(path), str(tmp_path), 2, 128)
    with pytest.raises(
        PipelineSQLError,
        match=r"view per_20s: reads the output of the windowed query view per_key; a second "
        r"keyed exchange is not built yet",
    ):
        run_local(spec, write=False)


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
