"""The contracts between the runtime and its connectors (connectors/base.py), the connector
registry (pipelines/connect.py) and the checkpoint coordinator's barriers
(pipelines/coordinator.py), against real files and a real checkpointed run."""

from __future__ import annotations

from pathlib import Path

import pytest
from flight_serve.connectors.base import Source, SourceEvent
from flight_serve.connectors.file import FileSource
from flight_serve.errors import CheckpointError, PipelineSQLError
from flight_serve.pipelines.connect import CONNECTORS, REGISTRY, check_checkpointed
from flight_serve.pipelines.durable import DurableRuntime
from flight_serve.pipelines.pipeline import PipelinePlan, parse_pipeline
from flight_serve.pipelines.run_options import RunOptions


def files(base: Path) -> tuple[Path, ...]:
    """Two CSV files: a.csv with 5 rows, b.csv with 2 (batches of 2 rows)."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "a.csv").write_text("k,v\n" + "".join(f"a,{i}\n" for i in range(5)))
    (base / "b.csv").write_text("k,v\n" + "".join(f"b,{i}\n" for i in range(2)))
    return (base / "a.csv", base / "b.csv")


def drain(source: Source) -> list[tuple[str, str, list[int]]]:
    events = []
    while not source.done:
        for event in source.poll(0.0, 1):
            values = event.batch.column("v").to_pylist() if event.batch is not None else []
            events.append((event.kind, event.partition, values))
    return events


def test_a_file_source_polls_round_robin_and_resumes_from_its_snapshot(tmp_path: Path) -> None:
    paths = files(tmp_path / "in")
    straight = FileSource(paths, batch_rows=2, base_dir=tmp_path, name="s")
    assert not straight.live
    assert drain(straight) == [
        ("batch", "in/a.csv", [0, 1]),
        ("batch", "in/b.csv", [0, 1]),
        ("batch", "in/a.csv", [2, 3]),
        ("end", "in/b.csv", []),
        ("batch", "in/a.csv", [4]),
        ("end", "in/a.csv", []),
    ]
    assert straight.rows == 7
    # the same order as the plain reader of a run without checkpoints
    plain = FileSource(paths, batch_rows=2, base_dir=tmp_path)
    assert [(p, b is None) for p, b in plain.round_robin()] == [
        ("in/a.csv", False),
        ("in/b.csv", False),
        ("in/a.csv", False),
        ("in/b.csv", True),
        ("in/a.csv", False),
        ("in/a.csv", True),
    ]

    cut = FileSource(paths, batch_rows=2, base_dir=tmp_path, name="s")
    cut.measure()
    for _ in range(3):
        cut.poll(0.0, 1)
    state = cut.snapshot()
    assert state == {
        "kind": "file",
        "files": [
            {"partition": "in/a.csv", "path": str(paths[0]), "size": 24, "batches": 2, "ended": False},
            {"partition": "in/b.csv", "path": str(paths[1]), "size": 12, "batches": 1, "ended": False},
        ],
        "next": 1,
        "rows": 6,
    }
    resumed = FileSource(paths, batch_rows=2, base_dir=tmp_path, name="s")
    resumed.measure()
    resumed.restore(state, 4)
    assert drain(resumed) == [
        ("end", "in/b.csv", []),
        ("batch", "in/a.csv", [4]),
        ("end", "in/a.csv", []),
    ]
    assert resumed.rows == 7


def test_a_file_source_refuses_a_changed_file_and_ends_a_gone_one_under_earliest(
    tmp_path: Path,
) -> None:
    paths = files(tmp_path / "in")
    cut = FileSource(paths, batch_rows=2, base_dir=tmp_path, name="s")
    cut.measure()
    cut.poll(0.0, 1)
    cut.poll(0.0, 1)
    state = cut.snapshot()
    with paths[0].open("a") as f:
        f.write("a,5\n")
    changed = FileSource(paths, batch_rows=2, base_dir=tmp_path, name="s")
    changed.measure()
    with pytest.raises(CheckpointError, match=r"source s \(checkpoint 7\): .*a\.csv changed"):
        changed.restore(state, 7)

    paths[0].write_text("k,v\n" + "".join(f"a,{i}\n" for i in range(5)))
    paths[1].unlink()
    left = FileSource(paths[:1], batch_rows=2, base_dir=tmp_path, name="s")
    left.measure()
    gaps: list[str] = []
    left.restore(state, 7, offset_reset="earliest", on_gap=gaps.append)
    assert len(gaps) == 1
    assert "b.csv is gone after 1 batches" in gaps[0]
    assert drain(left) == [
        ("end", "in/b.csv", []),  # the gone file's partition ends first
        ("batch", "in/a.csv", [2, 3]),
        ("batch", "in/a.csv", [4]),
        ("end", "in/a.csv", []),
    ]


def test_the_registry_has_one_row_per_connector_with_its_roles_and_options() -> None:
    assert {name: sorted(spec.roles) for name, spec in REGISTRY.items()} == {
        "file": ["sink", "source", "table"],
        "stdout": ["sink"],
        "falkordb": ["sink"],
        "flight": ["sink", "source"],
        "iceberg": ["sink", "source"],
        "datagen": ["source"],
    }
    assert list(CONNECTORS["source"]) == ["file", "flight", "iceberg", "datagen"]
    assert list(CONNECTORS["table"]) == ["file"]
    assert list(CONNECTORS["sink"]) == ["file", "stdout", "falkordb", "flight", "iceberg"]
    assert CONNECTORS["sink"]["file"] == ("connector", "path", "format")
    assert REGISTRY["iceberg"].takes("sink", "catalog_uri")
    assert not REGISTRY["file"].takes("sink", "catalog_uri")


def test_a_checkpointed_run_takes_only_exactly_once_connectors() -> None:
    def plan(sink: str) -> PipelinePlan:
        return parse_pipeline(
            "CREATE SOURCE s (k VARCHAR) WITH (connector = 'file', path = 'x.csv');\n"
            f"CREATE SINK out WITH ({sink});\nINSERT INTO out SELECT k FROM s;"
        )

    check_checkpointed(plan("connector = 'flight', server = 'grpc://h:1'"), server=False)
    check_checkpointed(plan("connector = 'flight'"), server=True)
    with pytest.raises(PipelineSQLError, match=r"needs server = .*\(line 2, column"):
        check_checkpointed(plan("connector = 'flight'"), server=False)


def test_the_coordinator_takes_its_barrier_before_each_poll_and_counts_batches_and_file_ends(
    tmp_path: Path,
) -> None:
    files(tmp_path / "in")
    plan = parse_pipeline(
        "CREATE SOURCE s (k VARCHAR, v BIGINT) WITH (connector = 'file', path = 'in/*.csv', "
        "batch_rows = '2');\nCREATE SINK out WITH (connector = 'file', format = 'csv');\n"
        "INSERT INTO out SELECT k, v FROM s;",
        base_dir=tmp_path,
    )
    runtime = DurableRuntime(
        plan,
        name="p",
        options=RunOptions(checkpoint_every=2),
        state_root=str(tmp_path / "state"),
        output_dir=tmp_path / "out",
    )
    barriers: list[int] = []
    counted: list[tuple[str, str]] = []
    runtime.coordinator.barrier_hooks.append(barriers.append)
    runtime.coordinator.event_hooks.append(
        lambda name, event: counted.append((name, f"{event.kind} {event.partition}"))
    )
    epochs: list[int] = []
    runtime.on_checkpoint = lambda info: epochs.append(info.epoch)
    for _ in runtime.run():
        pass
    assert barriers == [0, 1, 2, 3, 4, 5]  # one before each of the 6 polls
    assert counted == [
        ("s", "batch in/a.csv"),
        ("s", "batch in/b.csv"),
        ("s", "batch in/a.csv"),
        ("s", "end in/b.csv"),
        ("s", "batch in/a.csv"),
        ("s", "end in/a.csv"),
    ]
    assert epochs == [1, 2, 3]  # at 2 and 4 events, then the finished one
    assert (tmp_path / "out" / "out.csv").read_text().count("\n") == 8  # header + 7 rows
    assert SourceEvent("end", "x").batch is None
