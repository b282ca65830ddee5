"""/metrics: a scrape parses with prometheus_client's parser and shows exactly the rows just
ingested and read, and the calls' latencies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.metrics import Metrics
from flight_serve.flight.server import start_server
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
SCHEMA = pa.schema([("ts", pa.timestamp("ms")), ("v", pa.int64())])


def parse_scrape(text: str) -> dict[str, Any]:
    """Every sample of a scrape: {sample name: {frozen labels: value}}; fails on a series (name
    and labels) that appears twice (Prometheus keeps one of them)."""
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = frozenset(sample.labels.items())
            series = samples.setdefault(sample.name, {})
            assert key not in series, f"series {sample.name}{dict(key)} appears twice in a scrape"
            series[key] = sample.value
    return samples


def scrape(port: int) -> dict[str, Any]:
    """Every sample of a scrape of ``/metrics`` on ``port`` (see :func:`parse_scrape`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return parse_scrape(text)


def batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(range(start, start + n), pa.timestamp("ms")), pa.array(range(n), pa.int64())],
        schema=SCHEMA,
    )


def put(location: str, stream: str, batches: list[pa.RecordBatch]) -> None:
    with flight.FlightClient(location) as client:
        writer, reader = client.do_put(flight.FlightDescriptor.for_path(stream), SCHEMA)
        for b in batches:
            writer.write_batch(b)
            reader.read()
        writer.done_writing()
        writer.close()


def test_a_scrape_shows_the_rows_just_ingested_and_read(tmp_path: Path) -> None:
    metrics = Metrics()
    with start_server(tmp_path / "data", metrics=metrics, pipelines=False) as service:
        port = metrics.serve_http("127.0.0.1", 0)
        try:
            batches = [batch(10), batch(25, 10), batch(7, 35)]
            put(service.location, "events", batches)
            put(service.location, "other", [batch(3)])
            with flight.FlightClient(service.location) as client:
                info = client.get_flight_info(flight.FlightDescriptor.for_path("events"))
                read = client.do_get(info.endpoints[0].ticket).read_all()
                assert read.num_rows == 42
                with pytest.raises(pa.ArrowKeyError):
                    client.get_flight_info(flight.FlightDescriptor.for_path("missing"))
            samples = scrape(port)
        finally:
            metrics.stop()
    events = frozenset({("stream", "events")})
    other = frozenset({("stream", "other")})
    assert samples["flight_serve_stream_rows_in_total"] == {events: 42.0, other: 3.0}
    assert samples["flight_serve_stream_bytes_in_total"][events] == float(
        sum(b.nbytes for b in batches)
    )
    assert samples["flight_serve_stream_rows_out_total"] == {events: 42.0}
    counts = samples["flight_serve_rpc_duration_seconds_count"]
    assert counts[frozenset({("method", "DoPut"), ("code", "OK")})] == 2.0
    assert counts[frozenset({("method", "DoGet"), ("code", "OK")})] == 1.0
    assert counts[frozenset({("method", "GetFlightInfo"), ("code", "NOT_FOUND")})] == 1.0
    buckets = samples["flight_serve_rpc_duration_seconds_bucket"]
    assert buckets[frozenset({("method", "DoPut"), ("code", "OK"), ("le", "+Inf")})] == 2.0


def test_tails_count_rows_out(tmp_path: Path) -> None:
    metrics = Metrics()
    with start_server(tmp_path / "data", metrics=metrics, pipelines=False) as service:
        put(service.location, "tailed", [batch(4), batch(6, 4)])
        with flight.FlightClient(service.location) as client:
            (ticket,) = client.do_action(flight.Action("stream.tail", b'{"stream": "tailed"}'))
            reader = client.do_get(flight.Ticket(ticket.body.to_pybytes()))
            rows = 0
            while rows < 10:
                chunk = reader.read_chunk()
                rows += chunk.data.num_rows if chunk.data is not None else 0
            reader.cancel()
        text = metrics.render()
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("stream") == "tailed"
    }
    assert samples["flight_serve_stream_rows_in_total"] == 10.0
    assert samples["flight_serve_stream_rows_out_total"] == 10.0


def test_serve_exposes_metrics_on_its_own_port(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [str(CLI), "serve", "--port", "0", "--metrics-port", "0", "--data-dir", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    try:
        assert proc.stdout is not None
        location = proc.stdout.readline().strip()
        assert location, log_path.read_text()
        listening = next(
            entry
            for entry in map(json.loads, log_path.read_text().splitlines())
            if entry["msg"] == "listening"
        )
        put(location, "s", [batch(5), batch(6)])
        samples = scrape(int(listening["metrics_port"]))
        assert samples["flight_serve_stream_rows_in_total"] == {frozenset({("stream", "s")}): 11.0}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


PIPELINE = """
CREATE SOURCE events (ts TIMESTAMP(3), v BIGINT, WATERMARK FOR ts AS ts)
WITH (connector = 'flight', stream = 'events');
CREATE SINK {sink} WITH (connector = 'flight', stream = '{sink}');
INSERT INTO {sink}
SELECT window_start, window_end, count(*) AS n
FROM TUMBLE(events, ts, INTERVAL '1' SECOND) GROUP BY window_start, window_end;
"""

#: A blocking aggregate that runs for seconds (its first batch comes at its end).
SLOW_QUERY = "SELECT max(sha256(CAST(value AS VARCHAR))) AS m FROM range(0, 40000000)"


def test_no_series_appears_twice_with_streams_pipelines_and_a_query_in_flight(
    tmp_path: Path,
) -> None:
    import threading
    import time

    from flight_serve.flight.ops.limits import MemoryBudget

    metrics = Metrics()
    budget = MemoryBudget(1 << 30, wait_s=1.0)
    metrics.watch_budget(budget)
    with start_server(tmp_path / "data", metrics=metrics, memory_budget=budget) as service:
        port = metrics.serve_http("127.0.0.1", 0)
        put(service.location, "events", [batch(100), batch(100, start=5000)])
        with flight.FlightClient(service.location) as client:

            def act(action: str, body: dict[str, Any]) -> Any:
                (result,) = client.do_action(flight.Action(action, json.dumps(body).encode()))
                return json.loads(result.body.to_pybytes())

            running = act("pipeline.submit", {"sql": PIPELINE.format(sink="a"), "name": "a"})
            cancelled = act("pipeline.submit", {"sql": PIPELINE.format(sink="b"), "name": "b"})
            act("pipeline.cancel", {"id": cancelled["id"]})
            info = client.get_flight_info(flight.FlightDescriptor.for_command(SLOW_QUERY))
            options = flight.FlightCallOptions(timeout=60)
            done = threading.Event()

            def slow() -> None:
                with flight.FlightClient(service.location) as other:
                    other.do_get(info.endpoints[0].ticket, options=options).read_all()
                done.set()

            worker = threading.Thread(target=slow)
            worker.start()
            try:
                deadline = time.monotonic() + 20
                while budget.in_use().get("query", 0) == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert budget.in_use().get("query", 0) > 0
                samples = scrape(port)  # fails on a duplicate series
                held = samples["flight_serve_memory_held_bytes"]
                assert held[frozenset({("kind", "query")})] == budget.in_use()["query"]
                assert held[frozenset({("kind", "doput")})] == 0
                pids = {dict(k)["pipeline"] for k in samples["flight_serve_pipeline_rows_in_total"]}
                assert running["id"] in pids
                assert samples["flight_serve_stream_rows_in_total"][
                    frozenset({("stream", "events")})
                ] == 200
            finally:
                worker.join(60)
            assert done.is_set()
        scrape(port)
