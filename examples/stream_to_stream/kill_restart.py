"""The kill-and-restart check of the stream-to-stream example, end to end:

    flight-serve data nycflights13 --out flights.parquet
    python examples/stream_to_stream/kill_restart.py --flights flights.parquet --rows 40000

1. starts ``flight-serve serve`` on a free loopback port with a fresh data directory;
2. submits ``hourly_delays.sql`` (``flight-serve submit``);
3. feeds the first half of the rows (``feed.py``), waits until the pipeline has written some
   windows into ``hourly_delays``, then kills the server with SIGKILL (no shutdown, no last
   checkpoint);
4. restarts the server on the same data directory (it resumes the pipeline from its last
   checkpoint), feeds the rest of the rows and ends the input;
5. waits for every window and checks ``hourly_delays`` against a DataFusion batch
   ``GROUP BY origin, date_trunc('hour', sched_dep)`` over the same rows: every window exactly
   once, with the same count and delay sum.

Prints what it does; exits 0 when the check holds, 1 (with the differences) when it does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import datafusion
import pyarrow as pa
import pyarrow.parquet as pq
from flight_serve_client import FlightServeClient

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from feed import feed_rows  # noqa: E402

Window = tuple[str, int, int, int | None]  # origin, window start (us), departures, delay sum


def flight_serve() -> str:
    """The ``flight-serve`` next to this interpreter, else the one on the PATH."""
    beside = Path(sys.executable).parent / "flight-serve"
    return str(beside) if beside.exists() else (shutil.which("flight-serve") or "flight-serve")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [flight_serve(), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--health-port", "0", "--metrics-port", "0", "--data-dir", str(data_dir)],
            stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip
    location = f"grpc://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with FlightServeClient(location) as client:
                client.list_streams()
                client._action("pipeline.list", {})  # every action is in place
                return process
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start; its log: {log}") from None
            time.sleep(0.2)


def windows(location: str) -> list[Window]:
    """Every row of ``hourly_delays`` (empty when the stream does not exist yet)."""
    with FlightServeClient(location) as client:
        if "hourly_delays" not in client.list_streams():
            return []
        table = client.query(
            "SELECT origin, CAST(window_start AS BIGINT) AS ws, departures, total_dep_delay "
            "FROM hourly_delays"
        )
    return [
        (r["origin"], r["ws"], r["departures"], r["total_dep_delay"]) for r in table.to_pylist()
    ]


def expected_windows(rows: pa.Table) -> list[Window]:
    """The same windows computed in one batch by DataFusion over ``rows``."""
    ctx = datafusion.SessionContext()
    ctx.from_arrow(rows, "rows")
    table = ctx.sql(
        "SELECT origin, CAST(date_trunc('hour', sched_dep) AS BIGINT) AS ws, "
        "count(*) AS departures, sum(dep_delay) AS total_dep_delay FROM rows GROUP BY 1, 2"
    ).to_arrow_table()
    return [
        (r["origin"], r["ws"], r["departures"], r["total_dep_delay"]) for r in table.to_pylist()
    ]


def feed(location: str, flights: Path, rows: str, end_input: bool) -> None:
    command = [sys.executable, str(HERE / "feed.py"), "--server", location,
               "--flights", str(flights), "--rows", rows]  # fmt: skip
    subprocess.run(command + (["--end-input"] if end_input else []), check=True)


def compare(got: list[Window], want: list[Window]) -> list[str]:
    """The differences, as lines (none when every window is there exactly once)."""
    counts = Counter(got)
    problems = [f"twice or more: {w} x{n}" for w, n in counts.items() if n > 1]
    problems += [f"missing: {w}" for w in sorted(set(want) - set(counts))]
    problems += [f"not expected: {w}" for w in sorted(set(counts) - set(want))]
    return problems


def run(flights: Path, total: int, data_dir: Path, timeout_s: float = 120) -> list[str]:
    """Run the check; return the differences (empty: it holds)."""
    port = free_port()
    location = f"grpc://127.0.0.1:{port}"
    log = data_dir.parent / f"{data_dir.name}-server.log"
    half = total // 2
    want = expected_windows(feed_rows(pq.read_table(flights), 0, total))
    server = serve(data_dir, port, log)
    try:
        subprocess.run(
            [flight_serve(), "submit", str(HERE / "hourly_delays.sql"), "--server", location],
            check=True,
        )
        feed(location, flights, f"0:{half}", end_input=False)
        deadline = time.monotonic() + timeout_s
        while not windows(location):
            if time.monotonic() > deadline:
                return ["no window was written before the kill"]
            time.sleep(0.2)
        before = len(windows(location))
        print(f"{before} windows written; kill -9 {server.pid}")
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        server = serve(data_dir, port, log)
        print("restarted; the pipeline resumes from its last checkpoint")
        feed(location, flights, f"{half}:{total}", end_input=True)
        while len(windows(location)) < len(want) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.5)  # two more checkpoints: anything written twice would show now
        got = windows(location)
        print(f"{len(got)} windows written, {len(want)} expected")
        return compare(got, want)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flights", default="flights.parquet", help="flight-serve data's output")
    parser.add_argument("--rows", type=int, default=40000, help="rows fed in all")
    parser.add_argument("--data-dir", default=None, help="a fresh data directory (default: in a temp one)")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir or Path(tempfile.mkdtemp(prefix="flight-serve-s2s-")) / "data")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    problems = run(Path(args.flights), args.rows, data_dir)
    for line in problems:
        print(line)
    print("every window once" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
