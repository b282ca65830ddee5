"""Load on one ``flight-serve serve`` (loopback only, bounded in time): 8 concurrent DoPut writers,
8 DoGet readers (SQL group-by counts and stream range reads) and 2 server pipelines over the
written stream, for ``--seconds`` (60), under ``--memory-budget`` (1 GiB). Reports per-kind
p50/p99 latencies, rows/s acknowledged, the server's peak RSS (sampled every 0.2 s from
/proc) against its budget, the calls refused UNAVAILABLE (a full budget; the clients retry them),
and checks that no acknowledged row was lost: for each writer, every id it had acknowledged is
in the stream. :func:`run_load` is also what ``tests/integration/test_load.py`` runs.

    .venv/bin/python -m benchmarks.load --seconds 60
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from flight_serve.pipelines.registry import Registry

CLI = Path(sys.executable).parent / "flight-serve"
SCHEMA = pa.schema(
    [("w", pa.string()), ("id", pa.int64()), ("k", pa.string()), ("t", pa.timestamp("ms")),
     ("v", pa.int64())]
)  # fmt: skip
SOURCE = """
SET checkpoint_interval = '1s';
CREATE SOURCE events (w VARCHAR, id BIGINT, k VARCHAR, t TIMESTAMP(3), v BIGINT,
                      WATERMARK FOR t AS t - INTERVAL '2' SECOND)
WITH (connector = 'flight', stream = 'events');
"""
PIPELINES = [
    SOURCE
    + """CREATE SINK p1 WITH (connector = 'flight', stream = 'p1');
INSERT INTO p1 SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '5' SECOND) GROUP BY k, window_start, window_end;""",
    SOURCE
    + """CREATE SINK p2 WITH (connector = 'flight', stream = 'p2');
INSERT INTO p2 SELECT k, window_start, window_end, max(v) AS m
FROM HOP(events, t, INTERVAL '2' SECOND, INTERVAL '6' SECOND) GROUP BY k, window_start, window_end;""",
]
ROWS_PER_BATCH = 1000


def p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _sql(client: flight.FlightClient, sql: str) -> pa.Table:
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
    return client.do_get(info.endpoints[0].ticket).read_all()


def run_load(
    seconds: float = 60.0,
    writers: int = 8,
    readers: int = 8,
    memory_budget: int = 1 << 30,
    data_dir: Path | None = None,
    writer_rows_per_s: float | None = None,
) -> dict[str, Any]:
    """Run the load (module docstring) against a fresh ``flight-serve serve`` subprocess and
    return the figures: ``rows_acked``, ``rows_acked_per_s``, ``missing`` (acknowledged rows not
    found, per writer), ``peak_rss_bytes``, ``memory_budget``, ``unavailable`` (refused calls per
    kind), ``errors`` (other failures, first 5), ``exit_code`` (after SIGTERM), and per kind
    (``doput``, ``query``, ``range``) ``n``, ``p50_ms``, ``p99_ms``. ``writer_rows_per_s`` caps
    each writer's offered rate (``None``: as fast as acknowledgements come), so the stream the
    readers query does not outgrow the budget on a faster machine."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if data_dir is None else data_dir
        log = open(Path(tmp) / "serve.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [str(CLI), "serve", "--port", "0", "--metrics-port", "0", "--health-port", "0",
             "--data-dir", str(root / "data"), "--memory-budget", str(memory_budget)],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        try:
            return _drive(
                proc, seconds, writers, readers, memory_budget, root / "data", writer_rows_per_s
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
            log.close()


def _drive(
    proc: subprocess.Popen[str],
    seconds: float,
    writers: int,
    readers: int,
    memory_budget: int,
    data: Path,
    writer_rows_per_s: float | None = None,
) -> dict[str, Any]:
    assert proc.stdout is not None
    location = proc.stdout.readline().strip()
    stop = threading.Event()
    lat: dict[str, list[float]] = {"doput": [], "query": [], "range": []}
    unavailable = {"doput": 0, "query": 0, "range": 0}
    acked = [0] * writers
    errors: list[str] = []
    peak = [0.0]
    start_t = int(time.time() * 1000)

    def writer(i: int) -> None:
        rng = random.Random(i)
        name = f"w{i}"
        n = 0
        began = time.monotonic()
        with flight.FlightClient(location) as client:
            while not stop.is_set():
                try:  # one DoPut call until the end, or until refused (then a new one)
                    w, r = client.do_put(flight.FlightDescriptor.for_path("events", name), SCHEMA)
                    while not stop.is_set():
                        rows = [
                            {"w": name, "id": n + j, "k": rng.choice("abcd"),
                             "t": start_t + (n + j), "v": rng.randint(0, 30)}
                            for j in range(ROWS_PER_BATCH)
                        ]  # fmt: skip
                        b = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
                        t0 = time.perf_counter()
                        w.write_batch(b)
                        ack = json.loads(r.read().to_pybytes())
                        lat["doput"].append(time.perf_counter() - t0)
                        if "error" in ack:
                            errors.append(ack["error"])
                            return
                        n += ROWS_PER_BATCH
                        acked[i] = n
                        if writer_rows_per_s:  # wait for this writer's next slot
                            stop.wait(max(0.0, began + n / writer_rows_per_s - time.monotonic()))
                    w.done_writing()
                    w.close()
                except flight.FlightUnavailableError:
                    unavailable["doput"] += 1
                    time.sleep(0.1)
                except flight.FlightError as exc:
                    errors.append(str(exc).splitlines()[0])
                    return

    def reader(i: int) -> None:
        kind = "query" if i % 2 else "range"
        with flight.FlightClient(location) as client:
            while not stop.is_set():
                try:
                    t0 = time.perf_counter()
                    if kind == "query":
                        _sql(client, "SELECT k, count(*) FROM events GROUP BY k")
                    else:
                        info = client.get_flight_info(flight.FlightDescriptor.for_path("events"))
                        client.do_get(info.endpoints[0].ticket).read_all()
                    lat[kind].append(time.perf_counter() - t0)
                except flight.FlightUnavailableError:
                    unavailable[kind] += 1
                    time.sleep(0.1)
                except flight.FlightError as exc:
                    errors.append(str(exc).splitlines()[0])
                    time.sleep(0.1)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    time.sleep(1)
    with flight.FlightClient(location) as client:
        for n, sql in enumerate(PIPELINES):  # one live pipeline per name: each its own
            body = json.dumps({"sql": sql, "name": f"load-{n}"}).encode()
            list(client.do_action(flight.Action("pipeline.submit", body)))
    reading = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in reading:
        t.start()
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        peak[0] = max(peak[0], rss_mb(proc.pid))
        time.sleep(0.2)
    stop.set()
    for t in threads + reading:
        t.join(120)
    elapsed = time.monotonic() - started
    peak[0] = max(peak[0], rss_mb(proc.pid))
    missing: dict[str, int] = {}
    with flight.FlightClient(location) as client:
        events = client.get_flight_info(flight.FlightDescriptor.for_path("events"))
        for i, n in enumerate(acked):
            found = -1
            for _attempt in range(100):  # a refusal while the last readers let go: retry
                try:
                    found = _sql(
                        client,
                        f"SELECT count(DISTINCT id) AS n FROM events WHERE w = 'w{i}' AND id < {n}",
                    ).column("n")[0].as_py()
                    break
                except flight.FlightUnavailableError:
                    time.sleep(0.5)
            if found != n:
                missing[f"w{i}"] = n - found
    sigterm_at = datetime.now(UTC)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    # SIGTERM checkpoints the pipelines before the exit: each one's last checkpoint is later.
    registry = Registry(data / "pipelines.sqlite")
    try:
        checkpoints = [r.last_checkpoint for r in registry.all()]
    finally:
        registry.close()
    result: dict[str, Any] = {
        "seconds": round(elapsed, 1),
        "writers": writers,
        "readers": readers,
        "pipelines": len(PIPELINES),
        "rows_acked": sum(acked),
        "rows_acked_per_s": round(sum(acked) / elapsed),
        "missing": missing,
        "stream_rows": events.total_records,
        "stream_bytes": events.total_bytes,
        "peak_rss_bytes": int(peak[0] * 1024 * 1024),
        "memory_budget": memory_budget,
        "unavailable": unavailable,
        "exit_code": code,
        "pipelines_checkpointed_at_sigterm": sum(
            1
            for c in checkpoints
            if c and datetime.fromisoformat(str(c["taken_at"])) >= sigterm_at
        ),
        "errors": errors[:5],
    }
    for kind, values in lat.items():
        result[kind] = {
            "n": len(values),
            "p50_ms": round(statistics.median(values) * 1000, 2) if values else None,
            "p99_ms": round(p(values, 0.99), 2),
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--memory-budget", type=int, default=1 << 30, help="bytes")
    parser.add_argument("--writer-rows-per-s", type=float, default=None)
    args = parser.parse_args()
    result = run_load(
        args.seconds,
        args.writers,
        args.readers,
        args.memory_budget,
        writer_rows_per_s=args.writer_rows_per_s,
    )
    print(json.dumps(result, indent=2))
    return 0 if not result["missing"] and result["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
