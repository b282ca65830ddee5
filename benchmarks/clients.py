"""The Rust client against the Python one, on one flight-serve server, in one run (issue 17).

    cargo build --release --manifest-path clients/rust/Cargo.toml --bin bench_client
    .venv/bin/python -m benchmarks.clients [--rows 10000000] [--repeat 3]

* ``doget``: GetFlightInfo(``path = [stream]``) + DoGet of a stored stream of ``--rows`` rows
  (x int64, y double; 65,536-row batches) into the Rust client (``bench_client doget``,
  arrow-flight 60.1, release build) vs ``FlightServeClient``'s pyarrow client (``read_chunk``
  until the end, the batches kept);
* ``doput``: the same rows put into a new stream (durable, ``fsync = batch``) by the Rust client
  vs ``FlightServeClient.put`` (pyarrow); each side's batches are made before its clock starts.

Runs alternate sides (the Python side first on every other round) after one untimed warm-up
each; each side's median is reported. Ratio = Python seconds / Rust seconds (> 1: Rust faster).
Only the call is timed on both sides (the Rust process's start is not). Both sides must read or
write exactly ``--rows`` rows.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from flight_serve_client import FlightServeClient

ROOT = Path(__file__).resolve().parents[1]
BATCH = 65_536


def table(rows: int) -> pa.Table:
    batches = []
    for lo in range(0, rows, BATCH):
        hi = min(lo + BATCH, rows)
        x = pa.array(range(lo, hi), pa.int64())
        batches.append(pa.record_batch({"x": x, "y": pc.divide(x.cast(pa.float64()), 2.0)}))
    return pa.Table.from_batches(batches)


def start_server(data: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flight_serve.cli", "serve", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    location = proc.stdout.readline().strip()
    if not location:
        proc.kill()
        sys.exit("flight-serve did not start")
    return proc, location


def rust(binary: Path, *args: str) -> tuple[float, int]:
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), int(result["rows"])


def py_doget(location: str, stream: str) -> tuple[float, int]:
    client = flight.connect(location)
    gc.collect()
    start = time.perf_counter()
    info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    rows = 0
    kept = []
    for endpoint in info.endpoints:
        reader = client.do_get(endpoint.ticket)
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            kept.append(chunk.data)
            rows += chunk.data.num_rows
    seconds = time.perf_counter() - start
    client.close()
    return seconds, rows


def py_doput(location: str, stream: str, data: pa.Table) -> tuple[float, int]:
    with FlightServeClient(location) as client:
        gc.collect()
        start = time.perf_counter()
        client.put(stream, data, batch_rows=BATCH)
        seconds = time.perf_counter() - start
    return seconds, stored_rows(location, stream)


def stored_rows(location: str, stream: str) -> int:
    with flight.connect(location) as client:
        return int(client.get_flight_info(flight.FlightDescriptor.for_path(stream)).total_records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--binary",
        type=Path,
        default=Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "clients/rust/target"))
        / "release/bench_client",
    )
    args = parser.parse_args()
    if not args.binary.exists():
        sys.exit(f"no {args.binary}: cargo build --release --bin bench_client in clients/rust")
    data = table(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        proc, location = start_server(Path(tmp) / "data")
        try:
            with FlightServeClient(location) as client:
                client.put("big", data, batch_rows=BATCH)
            runs: dict[str, dict[str, list[float]]] = {
                "doget": {"rust": [], "python": []},
                "doput": {"rust": [], "python": []},
            }
            puts = iter(range(10_000))
            for round_ in range(args.repeat + 1):  # round 0: warm-up, not kept
                order = ["python", "rust"] if round_ % 2 else ["rust", "python"]
                for side in order:
                    if side == "rust":
                        get = rust(args.binary, "doget", location, "big")
                        target = f"r{next(puts)}"
                        seconds, _ = rust(args.binary, "doput", location, target, str(args.rows))
                        put = (seconds, stored_rows(location, target))
                    else:
                        get = py_doget(location, "big")
                        put = py_doput(location, f"p{next(puts)}", data)
                    for name, (seconds, rows) in (("doget", get), ("doput", put)):
                        assert rows == args.rows, f"{side} {name}: {rows} rows, not {args.rows}"
                        if round_:
                            runs[name][side].append(seconds)
        finally:
            proc.kill()
            proc.wait()
    print(f"{args.rows:,} rows (x int64, y double), {args.repeat} runs per side, medians")
    print(f"{'':6} {'python s':>9} {'rust s':>9} {'ratio py/rust':>14}   runs (py | rust)")
    for name, sides in runs.items():
        py, rs = statistics.median(sides["python"]), statistics.median(sides["rust"])
        spread = f"{' '.join(f'{s:.2f}' for s in sides['python'])} | {' '.join(f'{s:.2f}' for s in sides['rust'])}"
        print(f"{name:6} {py:9.2f} {rs:9.2f} {py / rs:14.2f}   {spread}")
    print(f"check: every run moved exactly {args.rows:,} rows")


if __name__ == "__main__":
    main()
