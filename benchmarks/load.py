"""Load on one ``flight-serve serve`` (loopback only, bounded in time): 8 concurrent DoPut writers,
8 DoGet readers (SQL counts and stream range reads) and 2 server pipelines over the written
stream, for ``--seconds`` (60). Reports per-kind p50/p99 latencies, the server's peak RSS, and
checks that no acknowledged row was lost (the stream holds exactly the acknowledged rows).

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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--readers", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "serve.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [str(CLI), "serve", "--port", "0", "--metrics-port", "0", "--health-port", "0",
             "--data-dir", str(Path(tmp) / "data")],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        location = proc.stdout.readline().strip()
        stop = threading.Event()
        lat: dict[str, list[float]] = {"doput": [], "query": [], "range": []}
        acked = [0] * args.writers
        errors: list[str] = []
        peak = [0.0]
        start_t = int(time.time() * 1000)

        def writer(i: int) -> None:
            rng = random.Random(i)
            name = f"w{i}"
            with flight.FlightClient(location) as client:
                w, r = client.do_put(flight.FlightDescriptor.for_path("events", name), SCHEMA)
                n = 0
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
                        break
                    n += ROWS_PER_BATCH
                    acked[i] = n
                w.done_writing()
                w.close()

        def reader(i: int) -> None:
            with flight.FlightClient(location) as client:
                while not stop.is_set():
                    try:
                        t0 = time.perf_counter()
                        if i % 2:
                            d = flight.FlightDescriptor.for_command(
                                "SELECT k, count(*) FROM events GROUP BY k"
                            )
                            info = client.get_flight_info(d)
                            client.do_get(info.endpoints[0].ticket).read_all()
                            lat["query"].append(time.perf_counter() - t0)
                        else:
                            info = client.get_flight_info(
                                flight.FlightDescriptor.for_path("events")
                            )
                            client.do_get(info.endpoints[0].ticket).read_all()
                            lat["range"].append(time.perf_counter() - t0)
                    except flight.FlightError as exc:
                        if "does not exist" not in str(exc):
                            errors.append(str(exc).splitlines()[0])
                        time.sleep(0.1)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(args.writers)]
        for t in threads:
            t.start()
        time.sleep(1)
        with flight.FlightClient(location) as client:
            for sql in PIPELINES:
                body = json.dumps({"sql": sql, "name": "load"}).encode()
                list(client.do_action(flight.Action("pipeline.submit", body)))
        readers = [threading.Thread(target=reader, args=(i,)) for i in range(args.readers)]
        for t in readers:
            t.start()
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            peak[0] = max(peak[0], rss_mb(proc.pid))
            time.sleep(0.5)
        stop.set()
        for t in threads + readers:
            t.join(60)
        with flight.FlightClient(location) as client:
            d = flight.FlightDescriptor.for_command("SELECT count(*) AS n FROM events")
            info = client.get_flight_info(d)
            stored = client.do_get(info.endpoints[0].ticket).read_all().column("n")[0].as_py()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        log.close()
        result: dict[str, Any] = {
            "seconds": args.seconds,
            "writers": args.writers,
            "readers": args.readers,
            "pipelines": len(PIPELINES),
            "rows_acked": sum(acked),
            "rows_stored": stored,
            "lost": sum(acked) - stored,
            "peak_rss_mb": round(peak[0], 1),
            "exit_code": code,
            "errors": errors[:5],
        }
        for kind, values in lat.items():
            result[kind] = {
                "n": len(values),
                "p50_ms": round(statistics.median(values) * 1000, 2) if values else None,
                "p99_ms": round(p(values, 0.99), 2),
            }
        print(json.dumps(result, indent=2))
        return 0 if result["lost"] == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
