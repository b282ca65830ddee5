"""An Iceberg table as a split source of the distributed dataflow, without a cluster
(pipelines/distributed/tables.py, workers.py, run_local): the data files of each snapshot
dealt to the source workers, every window instance consuming them in the embedded reader's
order, so the output equals the embedded run's at parallelism 1, 2 and 3. A real pyiceberg
SqlCatalog (SQLite, a local warehouse), a table partitioned by origin: every snapshot is three
data files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.distributed.tables import TableSplit, table_plans
from flight_serve.pipelines.distributed.workers import (
    JobSpec,
    assign_splits,
    check_distributable,
    run_local,
)
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime
from helpers import iceberg_flights as lake

JOB = """
CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'iceberg', table = 'lake.flights', {stop}batch_rows = '1024',
      catalog_uri = 'sqlite:///{root}/catalog.db', warehouse = 'file://{root}/warehouse');
CREATE SINK hourly WITH (connector = 'file', format = 'parquet');
CREATE SINK very_late WITH (connector = 'file', format = 'parquet');
CREATE SINK late WITH (connector = 'file', format = 'parquet');
INSERT INTO hourly
SELECT origin, window_start, window_end, count(*) AS departures, avg(dep_delay) AS delay
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR) GROUP BY origin, window_start, window_end;
INSERT INTO very_late SELECT origin, flight, sched_dep, dep_delay FROM flights
WHERE dep_delay > 600;
INSERT INTO late SELECT origin, sched_dep FROM LATE(flights);
"""


def by_sink(pairs: list[tuple[str, pa.RecordBatch]]) -> dict[str, pa.Table]:
    tables: dict[str, list[pa.RecordBatch]] = {}
    for sink, batch in pairs:
        tables.setdefault(sink, []).append(batch)
    return {
        sink: (t := pa.Table.from_batches(b)).sort_by([(n, "ascending") for n in t.column_names])
        for sink, b in tables.items()
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("lake")
    rows = lake(root, range(1, 5))
    path = root / "job.sql"
    path.write_text(JOB.format(root=root, stop="stop_at = 'latest', "))
    return path, rows


def test_the_plan_is_every_snapshot_and_its_data_files(job: tuple[Path, int]) -> None:
    path, _ = job
    spec = JobSpec(path.read_text(), str(path), str(path.parent), 2, 128)
    runtime = spec.runtime()
    plans = table_plans(runtime)
    plan = plans["flights"]
    assert [files for _, files in plan.snapshots] == [3, 3, 3, 3]
    assert len(plan.files) == 12
    assert plan.ends
    assert plan.batch_rows == 1024
    assert [s["flights"] for s in assign_splits(runtime, 2)] == [
        [TableSplit(0, 2)], [TableSplit(1, 2)]
    ]


def test_snapshots_of_several_data_files_equal_the_embedded_run_at_parallelism_1_2_3(
    job: tuple[Path, int],
) -> None:
    """Four monthly snapshots of three data files each (one per origin), batches of 1,024 rows:
    the embedded reader reads a snapshot's files one after another, so a later origin's rows
    of a month come after an earlier origin's whole month and many are late (the table is
    one watermark partition): the same rows are late only if every instance consumes the
    files in the embedded order, whichever worker read them."""
    path, rows = job
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=path.parent)
    expected = by_sink(list(runtime.run(write=False, collect=True)))
    assert expected["late"].num_rows > 1000
    assert pc.sum(expected["hourly"]["departures"]).as_py() + expected["late"].num_rows == rows
    for parallelism in (1, 2, 3):
        spec = JobSpec(path.read_text(), str(path), str(path.parent), parallelism, 128)
        _, got = run_local(spec, write=False)
        assert by_sink(got) == expected, parallelism


def test_an_iceberg_source_without_stop_at_is_refused_by_name(job: tuple[Path, int]) -> None:
    path, _ = job
    text = JOB.format(root=path.parent, stop="")
    runtime = PipelineRuntime(parse_pipeline(text, path=path), output_dir=path.parent)
    with pytest.raises(PipelineSQLError, match=r"SOURCE flights: an Iceberg source without "
                       r"stop_at: the distributed runtime reads a bounded range"):  # fmt: skip
        check_distributable(runtime)
