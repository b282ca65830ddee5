"""Key groups move (pipelines/distributed/rescale.py): a golden case's windowed query run
embedded for the first third of its input, its state split over 3 instances for the second
third, rescaled to 2 for the rest, writes exactly the embedded run's rows and late rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.engine.operator import Emission, WindowOperator
from flight_serve.errors import CheckpointError
from flight_serve.pipelines.distributed.keygroups import instances_of, key_groups
from flight_serve.pipelines.distributed.rescale import merge_snapshots, rescale, split_snapshot
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

GOLDEN = Path(__file__).parents[3] / "golden"
MAX_P = 128


def _window_on_a_source(case: str) -> bool:
    path = GOLDEN / case / "pipeline.sql"
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), load_tables=False)
    windows = runtime.window_nodes()
    return len(windows) == 1 and windows[0].input.name in runtime.sources


CASES = [
    c
    for c in sorted(p.parent.name for p in GOLDEN.glob("*/pipeline.sql"))
    if _window_on_a_source(c)
]


def _rows(tables: list[pa.Table]) -> list[Any]:
    return sorted((tuple(r.items()) for t in tables for r in t.to_pylist()), key=repr)


class Run:
    """A windowed query's instances driven directly, collecting output and late rows."""

    def __init__(self, case: str, tmp_path: Path) -> None:
        path = GOLDEN / case / "pipeline.sql"
        self.runtime = PipelineRuntime(
            parse_pipeline(path.read_text(), path=path), output_dir=tmp_path
        )
        node = self.runtime.window_nodes()[0]
        self.config = node.query.window
        assert self.config is not None
        self.schema = node.input.schema
        self.keys = node.op.config.key_columns
        self.partitions = node.input.partitions
        source = self.runtime.sources[node.input.name]
        self.events: list[tuple[str, pa.RecordBatch | None]] = []
        while not source.done:
            for event in source.poll(0.0, 1):
                self.events.append((event.partition, event.batch))
        self.out: list[pa.Table] = []
        self.late: list[pa.Table] = []

    def op(self, restore: Any = None) -> WindowOperator:
        assert self.config is not None
        op = self.config.build(self.schema, restore=restore)
        if restore is None:
            for p in self.partitions:
                op.add_partition(p)
                op.set_backlog(p, True)
        return op

    def keep(self, emission: Emission) -> None:
        if emission.output is not None and emission.output.num_rows:
            self.out.append(emission.output)
        if emission.late is not None and emission.late.num_rows:
            self.late.append(emission.late)

    def feed(
        self, ops: list[WindowOperator], events: list[tuple[str, pa.RecordBatch | None]]
    ) -> None:
        n = len(ops)
        for partition, batch in events:
            if batch is None:  # the file's end
                for op in ops:
                    op.set_backlog(partition, False)
                    self.keep(op.finish(partition))
                continue
            progress = ops[0].batch_progress_ns(batch)
            owners = instances_of(key_groups(batch, self.keys, MAX_P), n, MAX_P)
            for i, op in enumerate(ops):
                share = batch.filter(pa.array(owners == i))
                self.keep(op.process(share, partition, progress_ns=progress))


@pytest.mark.parametrize("case", CASES)
def test_state_split_to_3_then_rescaled_to_2_ends_as_the_embedded_run(
    case: str, tmp_path: Path
) -> None:
    embedded = Run(case, tmp_path)
    whole = embedded.op()
    embedded.feed([whole], embedded.events)
    embedded.keep(whole.finish())

    run = Run(case, tmp_path)
    third = max(len(run.events) // 3, 1)
    first = run.op()
    run.feed([first], run.events[:third])
    threes = [run.op(s) for s in split_snapshot(first.snapshot(), run.keys, 3, MAX_P)]
    run.feed(threes, run.events[third : 2 * third])
    twos = [run.op(s) for s in rescale([o.snapshot() for o in threes], run.keys, 2, MAX_P)]
    run.feed(twos, run.events[2 * third :])
    for op in twos:
        run.keep(op.finish())

    assert _rows(run.out) == _rows(embedded.out)
    assert _rows(run.late) == _rows(embedded.late)
    assert sum(op.metrics.rows_in for op in twos) == whole.metrics.rows_in


def test_snapshots_of_different_cuts_are_not_merged(tmp_path: Path) -> None:
    run = Run("tumble_count_keys_late", tmp_path)
    a, b = run.op(), run.op()
    run.feed([a], run.events[:1])
    run.feed([b], run.events[:4])
    with pytest.raises(CheckpointError, match=r"instance 1's snapshot differs .* in watermark"):
        merge_snapshots([a.snapshot(), b.snapshot()])
