"""Checkpoints and resume: the state root's layout and retention, exactly-once file
sinks, a run cut at every batch and resumed from its checkpoint equal to the straight run, and the
errors a resume gives when its checkpoint cannot be restored.

A "crash" in these tests is an exception thrown out of the run at a chosen source batch, with no
cleanup of what the run wrote: the on-disk state is what a killed process leaves. The golden
cases (tests/golden/) kill a real ``flight-serve run`` process with SIGKILL.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from flight_serve.errors import CheckpointError, PipelineSQLError
from flight_serve.pipelines.checkpoint import CheckpointStore, Manifest, fingerprint
from flight_serve.pipelines.durable import DurableRuntime, PipelineStopped, ResumeFrom
from flight_serve.pipelines.epoch_sinks import EpochFileSink
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.run_options import RunOptions

CLI = Path(sys.executable).parent / "flight-serve"


class Crash(Exception):
    """Stands for a process dying at a barrier (nothing is cleaned up)."""


def at(seconds: int) -> str:
    return str(datetime(1970, 1, 1) + timedelta(seconds=seconds))


def write_csv(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("k,t,v\n" + "".join(f"{k},{at(t)},{v}\n" for k, t, v in rows))
    return path


PIPELINE = """
SET allowed_lateness = '2s';
CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t - INTERVAL '3' SECOND)
WITH (connector = 'file', path = 'in/*.csv', batch_rows = '2');
CREATE SINK out WITH (connector = 'file', format = 'csv');
CREATE SINK late WITH (connector = 'file', format = 'jsonl');
CREATE SINK rows WITH (connector = 'file', format = 'parquet');
INSERT INTO out
SELECT k, window_start, window_end, count(*) AS n, count(DISTINCT v) AS d, min(k) AS lo,
       approx_distinct(v) AS ad, sum(v) AS total
FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
INSERT INTO late SELECT * FROM LATE(s);
INSERT INTO rows SELECT k, t, v * 2 AS v2 FROM s WHERE v > 3;
"""


def inputs(base: Path) -> None:
    write_csv(
        base / "in" / "a.csv",
        [
            ("a", 1, 1),
            ("b", 4, 7),
            ("a", 12, 3),
            ("c", 7, 5),
            ("a", 16, 9),
            ("b", 8, 2),
            ("a", 30, 4),
            ("b", 33, 6),
            ("c", 5, 1),
            ("a", 41, 8),
        ],
    )
    write_csv(base / "in" / "b.csv", [("c", 2, 2), ("c", 13, 4), ("b", 25, 6), ("a", 44, 1)])


def plan_of(base: Path, text: str = PIPELINE) -> Any:
    return parse_pipeline(text, base_dir=base)


def durable(
    base: Path,
    every: int | None = 1,
    resume: ResumeFrom = "latest",
    text: str = PIPELINE,
    **options: Any,
) -> DurableRuntime:
    return DurableRuntime(
        plan_of(base, text),
        name="p",
        options=RunOptions(checkpoint_every=every, **options),
        state_root=str(base / "state"),
        output_dir=base / "out",
        resume=resume,
    )


def run_to_end(runtime: DurableRuntime) -> DurableRuntime:
    for _ in runtime.run():
        pass
    return runtime


def crash_after(runtime: DurableRuntime, events: int) -> None:
    """Run until ``events`` source batches went through, then "die" at the next barrier."""

    def dying(counted: int) -> None:
        if counted >= events:
            raise Crash

    runtime.coordinator.barrier_hooks.append(dying)
    with pytest.raises(Crash):
        run_to_end(runtime)


def outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.fixture
def straight(tmp_path: Path) -> dict[str, bytes]:
    """The outputs of the same pipeline run without checkpoints (the embedded runtime)."""
    from flight_serve.embedded import Pipeline

    base = tmp_path / "straight"
    inputs(base)
    Pipeline.from_sql(PIPELINE, base_dir=base, output_dir=base / "out").run()
    return outputs(base / "out")


# --- the state root ---------------------------------------------------------------------------


def manifest(epoch: int, finished: bool = False) -> Manifest:
    return Manifest("p", epoch, fingerprint("x"), datetime(2026, 1, 1), finished)


@pytest.mark.parametrize("uri", [False, True])
def test_a_checkpoint_is_complete_once_its_manifest_is_written_and_retention_keeps_n(
    tmp_path: Path, uri: bool
) -> None:
    root = tmp_path / "root"
    store = CheckpointStore(root.as_uri() if uri else str(root))
    for epoch in range(1, 6):
        assert store.write(manifest(epoch), {"op-0.snapshot": b"x" * epoch}) > epoch
    (root / "epoch-0000000006").mkdir()  # a checkpoint cut short before its manifest
    (root / "epoch-0000000006" / "op-0.snapshot").write_bytes(b"partial")
    assert store.epochs() == [1, 2, 3, 4, 5]
    latest = store.latest()
    assert latest is not None
    assert (latest.epoch, latest.files) == (5, {"op-0.snapshot": 5})
    assert store.read(5, "op-0.snapshot") == b"xxxxx"
    assert store.prune(2) == [1, 2, 3]
    assert store.epochs() == [4, 5]
    assert (root / "epoch-0000000006").is_dir()  # newer than the newest complete: kept
    store.write(manifest(6), {})
    assert store.prune(2) == [4]
    assert store.epochs() == [5, 6]
    with pytest.raises(
        CheckpointError, match=r"no complete checkpoint of epoch 2 .*\(complete epochs: 5, 6\)"
    ):
        store.load(2)
    assert not list(root.glob("*/*.tmp"))


class _GatedFs:
    """The state root's file system with every ``delete_dir`` held until ``gate`` is set;
    records the deletions in order."""

    def __init__(self, fs: Any) -> None:
        self.fs, self.done = fs, []
        self.gate, self.entered = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def delete_file(self, path: str) -> None:
        self.done.append(("file", Path(path).parent.name, Path(path).name))
        self.fs.delete_file(path)

    def delete_dir(self, path: str) -> None:
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.done.append(("dir", Path(path).name, ""))
        self.fs.delete_dir(path)


def test_prune_later_deletes_on_the_roots_thread_manifest_first_and_settle_waits(
    tmp_path: Path,
) -> None:
    """A running pipeline prunes off its run loop: prune_later returns while the deletion is
    still held; an old checkpoint loses its manifest before its files (a deletion cut short
    leaves an incomplete checkpoint, never a complete one with files missing); settle waits."""
    store = CheckpointStore(str(tmp_path))
    for epoch in range(1, 6):
        store.write(manifest(epoch), {"op-0.snapshot": b"x"})
    gated = _GatedFs(store.fs)
    store.fs = gated  # type: ignore[assignment]
    store.prune_later(2)  # returns with epoch 1's directory deletion held at the gate
    assert gated.entered.wait(30)
    assert (tmp_path / "epoch-0000000001").is_dir()
    assert not (tmp_path / "epoch-0000000001" / "MANIFEST.json").exists()
    assert store.epochs() == [2, 3, 4, 5]
    gated.gate.set()
    store.settle()
    assert store.epochs() == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0000000004", "epoch-0000000005"]
    assert gated.done == [
        step
        for epoch in ("epoch-0000000001", "epoch-0000000002", "epoch-0000000003")
        for step in (("file", epoch, "MANIFEST.json"), ("dir", epoch, ""))
    ]


@pytest.mark.parametrize("stop", [False, True])
def test_a_run_returns_with_its_old_checkpoints_pruned(tmp_path: Path, stop: bool) -> None:
    """Checkpoints are pruned on the state root's thread while the run goes on; when the run
    returns (finished, or stopped at a barrier) the state root holds what retention keeps."""
    inputs(tmp_path)
    runtime = durable(tmp_path, every=1, checkpoint_retain=2)
    if stop:
        runtime.coordinator.barrier_hooks.append(
            lambda counted: runtime.request_stop() if counted >= 5 else None
        )
        with pytest.raises(PipelineStopped):
            run_to_end(runtime)
    else:
        run_to_end(runtime)
    last = runtime.epoch
    assert last > 3
    dirs = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert dirs == [f"epoch-{last - 1:010d}", f"epoch-{last:010d}"]


def test_a_corrupt_manifest_is_a_checkpoint_error(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    store.write(manifest(1), {})
    (tmp_path / "epoch-0000000001" / "MANIFEST.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable checkpoint manifest"):
        store.load(1)


def test_file_sink_commits_prepared_parts_and_drops_later_ones(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    target = tmp_path / "o.csv"
    sink = EpochFileSink("o", target, "csv", schema, restored_epoch=None)
    for epoch in (1, 2, 3):
        sink.write(pa.record_batch({"x": [epoch]}, schema=schema))
        sink.prepare(epoch)
        if epoch < 3:
            sink.commit(epoch)  # epoch 3: its manifest is written, the process dies before commit
    sink.write(pa.record_batch({"x": [4]}, schema=schema))  # epoch 4: never prepared
    sink.close()
    parts = sorted(p.name for p in (tmp_path / "o.csv.parts").iterdir())
    assert parts == [
        "0000000001.arrow",
        "0000000002.arrow",
        "0000000003.arrow.pending",
        "0000000004.arrow.pending",
    ]
    resumed = EpochFileSink("o", target, "csv", schema, restored_epoch=3, rows=3)
    assert [p.name for p in resumed.committed_parts()] == [
        "0000000001.arrow",
        "0000000002.arrow",
        "0000000003.arrow",
    ]
    resumed.write(pa.record_batch({"x": [4]}, schema=schema))
    resumed.prepare(4)
    resumed.commit(4)
    resumed.finalize()
    assert target.read_text() == '"x"\n1\n2\n3\n4\n'
    assert not (tmp_path / "o.csv.parts").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.csv"]


# --- resume equals the straight run ------------------------------------------------------------


def test_checkpointed_run_equals_the_straight_run(
    tmp_path: Path, straight: dict[str, bytes]
) -> None:
    inputs(tmp_path)
    runtime = run_to_end(durable(tmp_path, every=3))
    assert outputs(tmp_path / "out") == straight
    assert runtime.last_checkpoint is not None
    assert runtime.last_checkpoint.finished
    assert runtime.summary().rows == {"out": 9, "late": 1, "rows": 8}


@pytest.mark.parametrize("every", [1, 2, 5])
def test_killed_at_any_batch_and_resumed_equals_the_straight_run(
    tmp_path: Path, straight: dict[str, bytes], every: int
) -> None:
    """Every cut: the run dies after k source batches (k = 1 … all), possibly in the middle of
    an epoch with rows written to pending parts, and a new run resumes from the last checkpoint.
    The windows of count(DISTINCT), min over strings and approx_distinct are open across the
    checkpoints; their results equal the straight run's."""
    total = 9  # a.csv: 5 batches of 2 rows and its end; b.csv: 2 batches and its end
    for cut in range(1, total):
        base = tmp_path / f"cut{cut}"
        inputs(base)
        crash_after(durable(base, every=every), cut)
        resumed = run_to_end(durable(base, every=every))
        assert outputs(base / "out") == straight, f"cut after {cut} batches"
        assert resumed.summary().rows == {"out": 9, "late": 1, "rows": 8}


def test_killed_twice_and_resumed_from_an_older_epoch(
    tmp_path: Path, straight: dict[str, bytes]
) -> None:
    inputs(tmp_path)
    crash_after(durable(tmp_path), 4)  # checkpoints 1, 2, 3 (after batches 1, 2, 3)
    crash_after(durable(tmp_path), 4)  # resumed from 3: checkpoints 4, 5, 6
    store = CheckpointStore(str(tmp_path / "state"))
    assert store.epochs() == [4, 5, 6]  # retention keeps 3
    resumed = durable(tmp_path, resume=4)
    assert resumed.resumed_from == 4
    assert store.epochs() == [4]  # newer checkpoints go: the run goes on from 4
    run_to_end(resumed)
    assert outputs(tmp_path / "out") == straight


def test_a_finished_run_starts_over_and_fresh_deletes_checkpoints(
    tmp_path: Path, straight: dict[str, bytes]
) -> None:
    inputs(tmp_path)
    run_to_end(durable(tmp_path))
    again = durable(tmp_path)
    assert again.resumed_from is None  # finished: nothing to resume
    run_to_end(again)
    assert outputs(tmp_path / "out") == straight
    crash_after(durable(tmp_path), 5)
    fresh = durable(tmp_path, resume="fresh")
    assert fresh.resumed_from is None
    assert CheckpointStore(str(tmp_path / "state")).epochs() == []
    run_to_end(fresh)
    assert outputs(tmp_path / "out") == straight


def test_request_stop_checkpoints_then_stops(tmp_path: Path, straight: dict[str, bytes]) -> None:
    inputs(tmp_path)
    runtime = durable(tmp_path, every=None, checkpoint_interval=timedelta(hours=1))
    runtime.request_stop()
    with pytest.raises(PipelineStopped):
        run_to_end(runtime)
    assert CheckpointStore(str(tmp_path / "state")).epochs() == [1]
    run_to_end(durable(tmp_path, every=None, checkpoint_interval=timedelta(hours=1)))
    assert outputs(tmp_path / "out") == straight


# --- a checkpoint that cannot be restored fails fast -------------------------------------------


def test_a_changed_pipeline_is_refused(tmp_path: Path) -> None:
    inputs(tmp_path)
    crash_after(durable(tmp_path), 3)
    with pytest.raises(
        CheckpointError, match=r"pipeline text changed since checkpoint 2 .*--fresh"
    ):
        durable(tmp_path, text=PIPELINE.replace("'2s'", "'3s'"))


def test_a_changed_input_file_is_refused(tmp_path: Path) -> None:
    inputs(tmp_path)
    crash_after(durable(tmp_path), 3)
    with (tmp_path / "in" / "a.csv").open("a") as f:
        f.write(f"a,{at(50)},1\n")
    with pytest.raises(CheckpointError, match=r"a\.csv changed since the checkpoint .*--fresh"):
        durable(tmp_path)
    write_csv(tmp_path / "in" / "c.csv", [("a", 1, 1)])
    with pytest.raises(CheckpointError):
        durable(tmp_path)


def test_a_new_input_file_is_refused(tmp_path: Path) -> None:
    inputs(tmp_path)
    crash_after(durable(tmp_path), 3)
    write_csv(tmp_path / "in" / "c.csv", [("a", 1, 1)])
    with pytest.raises(CheckpointError, match=r"in/c\.csv appeared since the checkpoint"):
        durable(tmp_path)


def test_a_vanished_input_file_fails_fast_or_resets_with_a_reported_gap(tmp_path: Path) -> None:
    inputs(tmp_path)
    crash_after(durable(tmp_path), 3)  # a.csv and b.csv both half read
    (tmp_path / "in" / "b.csv").unlink()
    with pytest.raises(CheckpointError, match=r"b\.csv is gone.*offset_reset = 'earliest'"):
        durable(tmp_path)
    runtime = run_to_end(durable(tmp_path, offset_reset="earliest"))
    assert len(runtime.gaps) == 1
    assert "b.csv is gone after 1 batches" in runtime.gaps[0]
    assert runtime.last_checkpoint is not None
    assert runtime.last_checkpoint.finished
    store = CheckpointStore(str(tmp_path / "state"))
    latest = store.latest()
    assert latest is not None
    assert latest.metrics["gaps"] == runtime.gaps


def test_embedded_checkpoints_refuse_stream_connectors(tmp_path: Path) -> None:
    text = PIPELINE.replace(
        "CREATE SINK rows WITH (connector = 'file', format = 'parquet');",
        "CREATE SINK rows WITH (connector = 'flight', stream = 'x');",
    )
    inputs(tmp_path)
    with pytest.raises(PipelineSQLError, match=r"flight-serve submit.*\(line 7, column"):
        durable(tmp_path, text=text)


# --- the command line ------------------------------------------------------------------------


def test_run_resumes_by_default_and_takes_fresh_and_from_epoch(tmp_path: Path) -> None:
    inputs(tmp_path)
    sql = tmp_path / "job.sql"
    sql.write_text(PIPELINE)
    state = tmp_path / "state"

    def run(*extra: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        env = None
        if crash is not None:
            import os

            env = {**os.environ, "FLIGHT_SERVE_CRASH_AT": crash}
        return subprocess.run(
            [
                str(CLI),
                "run",
                str(sql),
                "--output-dir",
                str(tmp_path / "out"),
                "--checkpoint-every",
                "1",
                "--state-root",
                str(state),
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    killed = run(crash="checkpoint:4")
    assert killed.returncode == -9  # SIGKILL: the process really died
    resumed = run()
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint 4" in resumed.stderr
    assert "sink out: 9 rows" in resumed.stderr
    table = pacsv.read_csv(tmp_path / "out" / "out.csv")
    assert table.num_rows == 9
    missing = run("--from-epoch", "2")
    assert missing.returncode == 1
    assert "no complete checkpoint of epoch 2" in missing.stderr
    fresh = run("--fresh")
    assert fresh.returncode == 0
    assert "resuming" not in fresh.stderr
    no_interval = subprocess.run(
        [str(CLI), "run", str(sql), "--output-dir", str(tmp_path / "o2"), "--from-epoch", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_interval.returncode == 1
    assert "checkpoints need an interval" in no_interval.stderr


def test_a_crash_after_the_finished_checkpoint_is_completed_not_rerun(
    tmp_path: Path, straight: dict[str, bytes]
) -> None:
    """Server pipelines (``restart_finished=False``): the process dies right after the finished
    checkpoint's manifest, before the sinks commit and the files are written; the restart only
    completes the commit and writes the files (a rerun would append stream results again)."""
    inputs(tmp_path)
    runtime = durable(tmp_path)
    write = runtime.checkpoints.write

    def dying(manifest: Manifest, files: dict[str, bytes]) -> int:
        written = write(manifest, files)
        if manifest.finished:
            raise Crash
        return written

    runtime.checkpoints.write = dying  # type: ignore[method-assign]
    with pytest.raises(Crash):
        run_to_end(runtime)
    assert not (tmp_path / "out" / "out.csv").exists()
    resumed = DurableRuntime(
        plan_of(tmp_path),
        name="p",
        options=RunOptions(checkpoint_every=1),
        state_root=str(tmp_path / "state"),
        output_dir=tmp_path / "out",
        restart_finished=False,
    )
    assert resumed.manifest is not None
    assert resumed.manifest.finished
    run_to_end(resumed)
    assert outputs(tmp_path / "out") == straight
    assert resumed.epoch == resumed.manifest.epoch  # no new checkpoint: nothing ran again


def test_distinct_min_string_and_sketches_equal_with_checkpoints_while_windows_are_open(
    tmp_path: Path,
) -> None:
    """count(DISTINCT), min and max over strings, approx_distinct and approx_percentile_cont over
    windows that stay open across every checkpoint (and two crashes): the same results as a run
    without checkpoints."""
    from flight_serve.embedded import Pipeline

    text = """
    CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), v BIGINT, w VARCHAR, WATERMARK FOR t AS t)
    WITH (connector = 'file', path = 'in/*.csv', batch_rows = '7');
    CREATE SINK out WITH (connector = 'file', format = 'jsonl');
    INSERT INTO out
    SELECT k, window_start, window_end, count(DISTINCT v) AS d, min(w) AS lo, max(w) AS hi,
           approx_distinct(v) AS ad, approx_percentile_cont(v, 0.5) AS p50
    FROM TUMBLE(s, t, INTERVAL '1' HOUR) GROUP BY k, window_start, window_end;
    """
    (tmp_path / "in").mkdir()
    for name, part in (("a.csv", range(200)), ("b.csv", range(200, 300))):
        lines = [f"{'ab'[i % 2]},{at(i * 7 % 3000)},{i * 37 % 101},w{i * 7 % 13}" for i in part]
        (tmp_path / "in" / name).write_text("k,t,v,w\n" + "\n".join(lines) + "\n")
    Pipeline.from_sql(text, base_dir=tmp_path, output_dir=tmp_path / "plain").run()
    panes: list[int] = []

    def runtime() -> DurableRuntime:
        built = DurableRuntime(
            plan_of(tmp_path, text),
            name="p",
            options=RunOptions(checkpoint_every=2),
            state_root=str(tmp_path / "state"),
            output_dir=tmp_path / "out",
        )
        built.on_checkpoint = lambda info: panes.append(
            sum(n.op.open_panes + n.op._buffer.rows for n in built._window_nodes())
        )
        return built

    crash_after(runtime(), 9)
    crash_after(runtime(), 11)
    run_to_end(runtime())
    assert len(panes) >= 10
    assert all(p > 0 for p in panes[:-1])  # every checkpoint but the last saw the windows open
    plain = (tmp_path / "plain" / "out.jsonl").read_text()
    assert (tmp_path / "out" / "out.jsonl").read_text() == plain
    assert plain.count("\n") == 2  # one window per key, open until the end of input


FOLDED_DISTINCT = """
SET allowed_lateness = '2s';
CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t - INTERVAL '3' SECOND)
WITH (connector = 'file', path = 'in/*.csv', batch_rows = '2');
CREATE SINK out WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT k, window_start, window_end, count(*) AS n, count(DISTINCT v) AS d, count(DISTINCT k) AS dk,
       sum(v) AS total
FROM HOP(s, t, INTERVAL '5' SECOND, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def test_folded_count_distinct_killed_at_any_batch_and_resumed_equals_the_straight_run(
    tmp_path: Path,
) -> None:
    """count(DISTINCT) of integers and strings on the folded path (snapshot version 4), hopping
    windows open across the checkpoints: every cut resumes to the straight run's output."""
    from flight_serve.embedded import Pipeline

    base = tmp_path / "straight"
    inputs(base)
    Pipeline.from_sql(FOLDED_DISTINCT, base_dir=base, output_dir=base / "out").run()
    expected = outputs(base / "out")
    text = (base / "out" / "out.csv").read_text()
    # a at t=41 (v 8) and t=44 (v 1): [35, 45) and [40, 50) hold both: n 2, d 2, dk 1, total 9
    assert '"a",1970-01-01 00:00:35,1970-01-01 00:00:45,2,2,1,9\n' in text, text
    for cut in range(1, 9):
        run_base = tmp_path / f"cut{cut}"
        inputs(run_base)
        crash_after(durable(run_base, text=FOLDED_DISTINCT), cut)
        run_to_end(durable(run_base, text=FOLDED_DISTINCT))
        assert outputs(run_base / "out") == expected, f"cut after {cut} batches"
