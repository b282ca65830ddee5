"""A ``connector = 'datagen'`` source in pipeline files: run embedded, checkpointed, stopped or
killed mid-run and resumed, and with a bad option.

The pipeline generates 5,000 rows over 2 partitions, with an event time of bounded
out-of-orderness (jitter ≤ 300 ms) and ``WATERMARK FOR t AS t - INTERVAL '300' MILLISECOND``,
so no row is late: its 1 s TUMBLE count/sum equals DataFusion batch SQL over
:func:`~flight_serve.connectors.datagen.generate_rows` of the same options, row by row.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datafusion
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from flight_serve import Pipeline
from flight_serve.connectors.datagen import DatagenOptions, generate_rows
from flight_serve.errors import ConnectorOptionError
from flight_serve.pipelines.durable import DurableRuntime, PipelineStopped
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.run_options import RunOptions

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"

OPTIONS = {
    "rows_per_second": "unlimited",
    "number_of_rows": "5000",
    "partitions": "2",
    "batch_rows": "10",
    "seed": "11",
    "fields.k.min": "0",
    "fields.k.max": "4",
    "fields.v.min": "-100",
    "fields.v.max": "100",
    "fields.t.start": "2026-01-01T00:00:00Z",
    "fields.t.interval": "7ms",
    "fields.t.max_out_of_orderness": "300ms",
}
SCHEMA = pa.schema([("k", pa.int32()), ("v", pa.int64()), ("t", pa.timestamp("ms"))])
PIPELINE = (
    "CREATE SOURCE orders (\n"
    "    k INT, v BIGINT, t TIMESTAMP(3),\n"
    "    WATERMARK FOR t AS t - INTERVAL '300' MILLISECOND\n"
    ") WITH (connector = 'datagen',\n"
    + "".join(f"        {key} = '{value}',\n" for key, value in OPTIONS.items()).rstrip(",\n")
    + ");\n"
    "CREATE SINK out WITH (connector = 'file', path = 'out.parquet');\n"
    "INSERT INTO out\n"
    "SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total\n"
    "FROM TUMBLE(orders, t, INTERVAL '1' SECOND)\n"
    "GROUP BY window_start, window_end, k;\n"
)
#: source batches of a run: 2 partitions of 2,500 rows in batches of 10
BATCHES = 500
#: source batches counted at each barrier (between polls) of a run: a live source's poll hands
#: out 64 events at most, the first poll's 2 partition events included
BARRIERS = (0, 62, 126, 190, 254, 318, 382, 446)

Row = tuple[int, int, int, int, int]


def expected_rows() -> list[Row]:
    """``(window_start ms, window_end ms, k, n, total)`` by DataFusion batch SQL over the
    generated rows, sorted."""
    options = DatagenOptions.from_options(OPTIONS, SCHEMA)
    batches = []
    for p in range(options.partitions):
        rows = options.partition_rows(p)
        assert rows == 2_500
        batches.append(generate_rows(options, p, 0, rows))
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("generated", [batches])
    table = ctx.sql(
        """
        SELECT ms - ms % 1000 AS ws, ms - ms % 1000 + 1000 AS we, k,
               count(*) AS n, sum(v) AS total
        FROM (SELECT arrow_cast(t, 'Int64') AS ms, k, v FROM generated)
        GROUP BY ms - ms % 1000, k
        """
    ).to_arrow_table()
    return sorted((r["ws"], r["we"], r["k"], r["n"], r["total"]) for r in table.to_pylist())


def rows_of(path: Path) -> list[Row]:
    """The sink file's rows, in file order, timestamps as epoch milliseconds."""
    table = pq.read_table(path)
    assert table.schema.names == ["window_start", "window_end", "k", "n", "total"]
    ws = table.column("window_start").cast(pa.int64()).to_pylist()
    we = table.column("window_end").cast(pa.int64()).to_pylist()
    return list(
        zip(
            ws,
            we,
            table.column("k").to_pylist(),
            table.column("n").to_pylist(),
            table.column("total").to_pylist(),
            strict=True,
        )
    )


@pytest.fixture(scope="module")
def expected() -> list[Row]:
    rows = expected_rows()
    assert len(rows) >= 5 * 30  # 5 keys over 35 s of event time
    assert sum(r[3] for r in rows) == 5_000
    return rows


def durable(base: Path, every: int = 4) -> DurableRuntime:
    return DurableRuntime(
        parse_pipeline(PIPELINE, base_dir=base),
        name="dg",
        options=RunOptions(checkpoint_every=every),
        state_root=str(base / "state"),
        output_dir=base / "out",
    )


def run_to_end(runtime: DurableRuntime) -> None:
    for _ in runtime.run():
        pass


def test_embedded_run_equals_datafusion_batch_sql(tmp_path: Path, expected: list[Row]) -> None:
    summary = Pipeline.from_sql(PIPELINE, base_dir=tmp_path, output_dir=tmp_path).run()
    got = rows_of(tmp_path / "out.parquet")
    assert sorted(got) == expected
    assert summary.rows == {"out": len(expected)}
    assert summary.late_rows == {"INSERT INTO out (line 18)": 0}


def test_checkpointed_run_equals_the_embedded_one(tmp_path: Path, expected: list[Row]) -> None:
    runtime = durable(tmp_path)
    run_to_end(runtime)
    assert sorted(rows_of(tmp_path / "out" / "out.parquet")) == expected
    assert runtime.epoch == len(BARRIERS)  # at every barrier after the first, then finished
    assert runtime.metrics()["rows_in"] == 5_000
    assert runtime.snapshot_sources() == {"orders": {"next_row": {"p0": 2_500, "p1": 2_500}}}


@pytest.mark.parametrize("cut", [1, 100, 300, 446])
def test_stopped_mid_run_and_resumed_gives_the_identical_file(
    tmp_path: Path, stop_after: Callable[[Any, Any, int], None], cut: int
) -> None:
    straight = tmp_path / "straight"
    run_to_end(durable(straight))
    resumed = tmp_path / "resumed"
    first = durable(resumed)
    stop_after(first, first.flight_sources["orders"], cut)
    with pytest.raises(PipelineStopped):
        run_to_end(first)
    # it stops at the next barrier: the partitions' batches alternate, 10 rows each
    barrier = next(b for b in BARRIERS if b >= cut)
    assert first.snapshot_sources()["orders"]["next_row"] == {
        "p0": barrier // 2 * 10,
        "p1": barrier // 2 * 10,
    }
    second = durable(resumed)
    assert second.resumed_from == first.epoch
    run_to_end(second)
    assert (resumed / "out" / "out.parquet").read_bytes() == (
        straight / "out" / "out.parquet"
    ).read_bytes()


def test_sigkilled_mid_epoch_and_resumed_by_the_cli_gives_the_identical_file(
    tmp_path: Path, expected: list[Row]
) -> None:
    sql = tmp_path / "dg.sql"
    sql.write_text(PIPELINE)

    def run(out: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **({"FLIGHT_SERVE_CRASH_AT": crash} if crash else {})}
        return subprocess.run(
            [
                str(CLI),
                "run",
                str(sql),
                "--output-dir",
                str(tmp_path / out),
                "--checkpoint-every",
                "4",
                "--state-root",
                str(tmp_path / out / "state"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    straight = run("straight")
    assert straight.returncode == 0, straight.stderr
    # at the barrier after 190 batches, before its checkpoint: epoch 3's batches are written,
    # not committed; the run resumes from checkpoint 2 (126 batches)
    killed = run("resumed", crash="event:190")
    assert killed.returncode == -9, killed.stderr  # SIGKILL: the process really died
    resumed = run("resumed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint 2" in resumed.stderr
    assert (tmp_path / "resumed" / "out.parquet").read_bytes() == (
        tmp_path / "straight" / "out.parquet"
    ).read_bytes()
    assert sorted(rows_of(tmp_path / "resumed" / "out.parquet")) == expected


def test_a_bad_option_names_the_option_and_its_line(tmp_path: Path) -> None:
    text = PIPELINE.replace("fields.k.min = '0'", "fields.k.min = '10'")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "fields.k.min" in ln)
    col = text.splitlines()[line - 1].index("'10'") + 1
    with pytest.raises(ConnectorOptionError) as caught:
        Pipeline.from_sql(text, base_dir=tmp_path, output_dir=tmp_path).run()
    assert (caught.value.option, caught.value.line, caught.value.col) == ("fields.k.min", line, col)
    assert str(caught.value) == (
        f"option 'fields.k.min': min (10) is greater than max (4) (line {line}, column {col})"
    )
    assert not (tmp_path / "out.parquet").exists()

    sql = tmp_path / "bad.sql"
    sql.write_text(PIPELINE.replace("batch_rows = '10'", "batch_rows = 'many'"))
    result = subprocess.run(
        [str(CLI), "run", str(sql), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "option 'batch_rows'" in result.stderr
    assert "(line 8, column " in result.stderr


def test_the_docs_pipeline_runs_and_counts_every_click(tmp_path: Path) -> None:
    """docs/pipelines.md's whole ``datagen`` pipeline (``CREATE SOURCE clicks`` …), run as
    written, and its error example."""
    text = (Path(__file__).parents[2] / "docs" / "pipelines.md").read_text()
    start = text.index("CREATE SOURCE clicks")
    sql = text[start : text.index("```", start)]
    summary = Pipeline.from_sql(sql, base_dir=tmp_path, output_dir=tmp_path).run()
    assert summary.rows == {"page_counts": 50}
    table = pacsv.read_csv(tmp_path / "page_counts.csv")
    assert table.num_rows == 50
    assert sum(table.column("clicks").to_pylist()) == 18_000
    assert sorted(set(table.column("page").to_pylist())) == [1, 2, 3, 4, 5]
    with pytest.raises(ConnectorOptionError) as caught:
        Pipeline.from_sql(
            sql.replace("fields.page.min = '1'", "fields.page.min = '9'"), base_dir=tmp_path
        ).run()
    assert f"`{caught.value}`" in " ".join(text.split())  # the docs wrap it
