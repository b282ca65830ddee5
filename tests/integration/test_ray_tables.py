"""An Iceberg table as the source of ``--runtime ray`` (pipelines/distributed/tables.py): the
data files of each snapshot dealt to the source actors, every window actor consuming them in
the embedded reader's order, so the output equals the embedded run's at parallelism 1, 2 and
3; a checkpoint cuts between snapshots (recorded as the embedded offset, the last snapshot
consumed), and a run stopped at 2 resumes at 3.

A real pyiceberg SqlCatalog (SQLite, a local warehouse); the table is partitioned by origin, so
every monthly snapshot is three data files. One Ray for the session (``ray_session``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime
from helpers import iceberg_flights, run_on_ray_until_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.ray]

JOB = """{prefix}
CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'iceberg', table = 'lake.flights', stop_at = 'latest', batch_rows = '4096',
      catalog_uri = 'sqlite:///{root}/catalog.db', warehouse = 'file://{root}/warehouse');
CREATE SINK hourly WITH (connector = 'file', format = 'parquet');
CREATE SINK late WITH (connector = 'file', format = 'parquet');
INSERT INTO hourly
SELECT origin, window_start, window_end, count(*) AS departures, avg(dep_delay) AS delay,
       count(DISTINCT dest) AS destinations
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR) GROUP BY origin, window_start, window_end;
INSERT INTO late SELECT origin, sched_dep FROM LATE(flights);
"""
SINKS = ("hourly", "late")


def in_order(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


def by_sink(pairs: list[tuple[str, pa.RecordBatch]]) -> dict[str, pa.Table]:
    tables: dict[str, list[pa.RecordBatch]] = {}
    for sink, batch in pairs:
        tables.setdefault(sink, []).append(batch)
    return {sink: in_order(pa.Table.from_batches(b)) for sink, b in tables.items()}


def embedded(path: Path, out: Path) -> dict[str, pa.Table]:
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=out)
    return by_sink(list(runtime.run(write=False, collect=True)))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six monthly snapshots of three data files each."""
    root = tmp_path_factory.mktemp("lake")
    iceberg_flights(root, range(1, 7))
    return root


def test_an_iceberg_table_on_ray_equals_embedded_at_parallelism_1_2_3(
    ray_session: Any, root: Path, tmp_path: Path
) -> None:
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    path = tmp_path / "job.sql"
    path.write_text(JOB.format(prefix="", root=root))
    expected = embedded(path, tmp_path)
    assert expected["late"].num_rows > 1000  # a later file's rows after an earlier file's month
    for parallelism in (1, 2, 3):
        got: list[tuple[str, pa.RecordBatch]] = []
        _, stats = run_on_ray(path, output_dir=tmp_path, parallelism=parallelism, write=False,
                              collect=got)  # fmt: skip
        assert stats.source_actors == parallelism
        assert by_sink(got) == expected, parallelism


def test_a_checkpointed_iceberg_job_stopped_at_2_resumes_at_3_and_ends_equal(
    ray_session: Any, root: Path, tmp_path: Path
) -> None:
    """``checkpoint_every = 2`` (snapshots): a parallelism-2 run stops after its first
    checkpoint, cut after the second snapshot: the manifest records the embedded Iceberg
    offset (that snapshot's id, 2 snapshots read). Resumed at parallelism 3 the run plans the
    four snapshots after it and ends with the embedded run's rows, each once."""
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray
    from pyiceberg.catalog.sql import SqlCatalog

    out = tmp_path / "run"
    out.mkdir()
    path = out / "job.sql"
    path.write_text(JOB.format(prefix="SET checkpoint_every = 2;", root=root))
    plain = tmp_path / "plain.sql"
    plain.write_text(JOB.format(prefix="", root=root))
    expected = embedded(plain, tmp_path)
    run_on_ray_until_checkpoint(path, 1, 2, output_dir=out)
    manifest = json.loads(
        (out / "checkpoints" / "job" / f"epoch-{1:010d}" / "MANIFEST.json").read_text()
    )
    offset = manifest["sources"]["flights"]
    catalog = SqlCatalog(
        "default", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse"
    )
    snapshots = catalog.load_table("lake.flights").metadata.snapshots
    assert (offset["kind"], offset["snapshot_id"], offset["snapshots"], offset["ended"]) == (
        "iceberg", snapshots[1].snapshot_id, 2, False
    )
    summary, stats = run_on_ray(path, output_dir=out, parallelism=3)
    assert stats.resumed_from == 1
    got = {s: in_order(pq.read_table(out / f"{s}.parquet")) for s in SINKS}
    assert got == expected
    assert summary.rows == {k: v.num_rows for k, v in expected.items()}
