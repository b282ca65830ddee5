"""The Rust and Java clients against raw pyarrow Flight, on one flight-serve server, in one run
(issue 17).

    cargo build --release --manifest-path clients/rust/Cargo.toml --bin bench_client
    .venv/bin/python -m benchmarks.clients [--rows 10000000] [--repeat 3] [--java]

* ``doget``: GetFlightInfo(``path = [stream]``) + DoGet of a stored stream of ``--rows`` rows
  (x int64, y double; 65,536-row batches) into the Rust client (``bench_client doget``,
  arrow-flight 60.1, release build) vs a raw ``pyarrow.flight`` client (``read_chunk`` until
  the end, the batches kept); with ``--java`` also into the Java client (arrow-java 18.3
  ``FlightClient``, one warm JVM running clients/java's ``DoGetBench --path``, each batch
  loaded into its ``VectorSchemaRoot``; the round trip through the JVM's stdin/stdout is timed);
* ``doput``: the same rows put into a new stream (durable, ``fsync = batch``) by the Rust client
  vs ``FlightServeClient.put`` (pyarrow); each side's batches are made before its clock starts.

Runs rotate the sides' order each round after one untimed warm-up round; each side's median is
reported. Ratio = pyarrow seconds / client seconds (> 1: the client is faster). Only the call is
timed (the Rust process's start is not, nor the JVM's). Every run must read or write exactly
``--rows`` rows. The load average before and after is printed: the machine may be shared.
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

from benchmarks.java_client import _java_command

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


def java_doget(java: subprocess.Popen[str]) -> tuple[float, int]:
    """One DoGet in the warm JVM: the round trip through its stdin and stdout is timed."""
    assert java.stdin is not None
    assert java.stdout is not None
    gc.collect()
    start = time.perf_counter()
    java.stdin.write("run\n")
    java.stdin.flush()
    rows = int(java.stdout.readline())
    return time.perf_counter() - start, rows


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
            assert chunk.data is not None  # a DoGet of a stream sends no metadata-only message
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
    parser.add_argument(
        "--java",
        action="store_true",
        help="also DoGet into the Java client (clients/java's DoGetBench; needs java and mvn)",
    )
    args = parser.parse_args()
    if not args.binary.exists():
        sys.exit(f"no {args.binary}: cargo build --release --bin bench_client in clients/rust")
    data = table(args.rows)
    sides = ["rust", "python", *(["java"] if args.java else [])]
    load_before = os.getloadavg()
    runs: dict[str, dict[str, list[float]]] = {
        "doget": {side: [] for side in sides},
        "doput": {"rust": [], "python": []},
    }
    with tempfile.TemporaryDirectory() as tmp:
        proc, location = start_server(Path(tmp) / "data")
        java: subprocess.Popen[str] | None = None
        try:
            with FlightServeClient(location) as client:
                client.put("big", data, batch_rows=BATCH)
            if args.java:
                java = subprocess.Popen(
                    _java_command(location, "--path", "big"),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            puts = iter(range(10_000))
            for round_ in range(args.repeat + 1):  # round 0: warm-up, not kept
                shift = round_ % len(sides)
                for side in sides[shift:] + sides[:shift]:
                    timed: dict[str, tuple[float, int]] = {}
                    if side == "rust":
                        timed["doget"] = rust(args.binary, "doget", location, "big")
                        target = f"r{next(puts)}"
                        seconds, _ = rust(args.binary, "doput", location, target, str(args.rows))
                        timed["doput"] = (seconds, stored_rows(location, target))
                    elif side == "python":
                        timed["doget"] = py_doget(location, "big")
                        timed["doput"] = py_doput(location, f"p{next(puts)}", data)
                    else:
                        assert java is not None
                        timed["doget"] = java_doget(java)
                    for name, (seconds, rows) in timed.items():
                        assert rows == args.rows, f"{side} {name}: {rows} rows, not {args.rows}"
                        if round_:
                            runs[name][side].append(seconds)
        finally:
            if java is not None:
                assert java.stdin is not None
                java.stdin.close()
                java.wait(30)  # this benchmark's JVM, by its pid
            proc.kill()
            proc.wait()
    load_after = os.getloadavg()
    print(f"{args.rows:,} rows (x int64, y double), {args.repeat} runs per side, medians")
    print("ratio = pyarrow seconds / client seconds (> 1: the client is faster than pyarrow)")
    clients = [side for side in sides if side != "python"]
    header = f"{'':6} {'pyarrow s':>9}" + "".join(f" {c + ' s':>9} {'py/' + c:>8}" for c in clients)
    print(f"{header}   runs (python | {' | '.join(clients)})")
    for name, by_side in runs.items():
        py = statistics.median(by_side["python"])
        line = f"{name:6} {py:9.2f}"
        for c in clients:
            if by_side.get(c):
                median = statistics.median(by_side[c])
                line += f" {median:9.2f} {py / median:8.2f}"
            else:
                line += f" {'-':>9} {'-':>8}"
        spread = " | ".join(
            " ".join(f"{t:.2f}" for t in by_side[side])
            for side in ["python", *clients]
            if by_side.get(side)
        )
        print(f"{line}   {spread}")
    print(f"check: every run moved exactly {args.rows:,} rows")
    print(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in load_after)
    )


if __name__ == "__main__":
    main()
