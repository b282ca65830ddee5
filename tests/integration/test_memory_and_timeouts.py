"""The memory budget (backpressure, then UNAVAILABLE with a retry hint), the statement timeout,
and cancellation reaching DataFusion: a timed-out or cancelled query's DataFusion stream is
dropped (its worker thread ends) while the call ends at once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.errors import InvalidInputError, OverloadError
from flight_serve.flight.ops.limits import MemoryBudget
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve.flight.sql.handler import pack

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("x", pa.int64())])
ROWS = 8000
#: 64 M result rows, made by DataFusion in 8,192-row batches quickly; a client that stops
#: reading holds the query (gRPC flow control, then the worker's queue) without using the CPU.
CROSS_JOIN = "SELECT a.x AS ax, b.x AS bx FROM t a, t b"
#: 64 M pairs through md5, 1 in 256 kept: ~0.3 s of DataFusion work per 8,192-row output
#: batch, ~10 s in all on this machine (so dropping the stream early saves seconds of work).
SLOW = (
    "SELECT a.x AS ax, b.x AS bx FROM t a, t b "
    "WHERE starts_with(md5(CAST(a.x * 8001 + b.x AS VARCHAR)), 'ab')"
)


def put_rows(client: flight.FlightClient, stream: str, n: int) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(stream), SCHEMA)
    writer.write_batch(pa.record_batch([pa.array(range(n), pa.int64())], schema=SCHEMA))
    writer.done_writing()
    reader.read()
    writer.close()


def query_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "flight-serve-query"]


def wait_no_query_threads(limit_s: float = 3.0) -> float:
    """Seconds until no DataFusion worker thread is left (fails after ``limit_s``)."""
    started = time.monotonic()
    while query_threads():
        assert time.monotonic() - started < limit_s, "the DataFusion stream was not dropped"
        time.sleep(0.02)
    return time.monotonic() - started


def sql_ticket(client: flight.FlightClient, sql: str, flightsql: bool) -> flight.Ticket:
    command = pack(sql_pb2.CommandStatementQuery(query=sql)) if flightsql else sql.encode()
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
    return info.endpoints[0].ticket


@pytest.fixture
def timed(start_flight_server: Callable[..., FlightServeService]) -> Iterator[flight.FlightClient]:
    """A client of a server with a 0.5 s statement timeout, holding the stream ``t``."""
    service = start_flight_server(pipelines=False, statement_timeout_s=0.5)
    with flight.FlightClient(service.location) as client:
        put_rows(client, "t", ROWS)
        yield client


@pytest.mark.parametrize("flightsql", [False, True], ids=["sql", "flightsql"])
def test_statement_timeout_ends_the_call_and_drops_the_datafusion_stream(
    timed: flight.FlightClient, flightsql: bool
) -> None:
    # A small query finishes well inside the timeout.
    small = timed.do_get(sql_ticket(timed, "SELECT count(*) AS n FROM t", flightsql)).read_all()
    assert small.column("n").to_pylist() == [ROWS]
    # t=0 DoGet starts | t=0.5 s statement timeout: DEADLINE_EXCEEDED | the worker drops the
    # stream after the batch it is computing (<= ~0.3 s), not after the ~10 s of the query
    started = time.monotonic()
    reader = timed.do_get(sql_ticket(timed, SLOW, flightsql))
    rows = [0]

    def read_all() -> None:
        for chunk in reader:
            rows[0] += chunk.data.num_rows

    with pytest.raises(flight.FlightTimedOutError, match=r"statement timeout.*0\.5 s"):
        read_all()
    assert 0.5 <= time.monotonic() - started < 3.0
    assert rows[0] < 64_000_000 // 256  # it did not finish
    wait_no_query_threads()


@pytest.mark.parametrize("flightsql", [False, True], ids=["sql", "flightsql"])
def test_a_cancelled_doget_drops_the_datafusion_stream(tmp_path: Path, flightsql: bool) -> None:
    with (
        start_server(tmp_path / "data", pipelines=False) as service,
        flight.FlightClient(service.location) as client,
    ):
        put_rows(client, "t", ROWS)
        reader = client.do_get(sql_ticket(client, SLOW, flightsql))
        first = reader.read_chunk()
        assert first.data.num_rows > 0
        assert query_threads()  # DataFusion is producing the rest (~10 s of it)
        reader.cancel()
        wait_no_query_threads()  # dropped after the batch in progress
        # the server still answers
        again = client.do_get(sql_ticket(client, "SELECT max(x) AS m FROM t", flightsql))
        assert again.read_all().column("m").to_pylist() == [ROWS - 1]


def test_memory_budget_backpressure_then_unavailable_then_room(tmp_path: Path) -> None:
    work = 1 << 20
    with start_server(tmp_path / "data", pipelines=False) as probe:
        with flight.FlightClient(probe.location) as client:
            put_rows(client, "t", ROWS)
        input_bytes = probe.store.info("t").num_bytes
    one_query = input_bytes + work
    # Room for one query over t (plus a DoPut batch of 8 KiB or so), not two.
    budget = MemoryBudget(one_query + 40_000, wait_s=1.0)
    with (
        start_server(
            tmp_path / "data", pipelines=False, memory_budget=budget, query_work_bytes=work
        ) as service,
        flight.FlightClient(service.location) as client,
    ):
        # A query that holds its reservation: its reader takes one batch, then stops reading.
        holder = client.do_get(sql_ticket(client, CROSS_JOIN, False))
        assert holder.read_chunk().data.num_rows > 0
        assert budget.in_use() == {"query": one_query}
        # t=0 second query asks | waits (backpressure) | t=1 s UNAVAILABLE, retryable
        started = time.monotonic()
        with pytest.raises(flight.FlightUnavailableError, match="memory budget full") as caught:
            client.do_get(sql_ticket(client, "SELECT count(*) AS n FROM t", False)).read_all()
        assert time.monotonic() - started >= 1.0
        assert "retryable" in str(caught.value)
        assert json.loads(caught.value.extra_info) == {"retryable": True}
        # A DoPut batch that fits is written; one that does not fit waits, then UNAVAILABLE,
        # and the first stays acknowledged.
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("u"), SCHEMA)
        writer.write_batch(pa.record_batch([pa.array(range(1000), pa.int64())], schema=SCHEMA))
        assert json.loads(reader.read().to_pybytes()) == {"offset": 0, "rows": 1000}
        def too_much() -> None:
            writer.write_batch(
                pa.record_batch([pa.array(range(10_000), pa.int64())], schema=SCHEMA)
            )
            writer.done_writing()
            reader.read()
            writer.close()

        with pytest.raises(flight.FlightUnavailableError, match="memory budget full"):
            too_much()
        assert service.store.info("u").num_rows == 1000
        assert budget.refused == 2
        # The holder lets go (cancel): its worker ends, its bytes come back, queries run again.
        holder.cancel()
        wait_no_query_threads()
        assert budget.in_use() == {}
        table = client.do_get(sql_ticket(client, "SELECT count(*) AS n FROM t", False)).read_all()
        assert table.column("n").to_pylist() == [ROWS]
        assert budget.peak_bytes <= budget.limit_bytes
        # A query needing more than the whole budget fails at once, naming it.
        small = MemoryBudget(1000)
        with pytest.raises(InvalidInputError, match="whole memory budget of 1000 bytes"):
            small.reserve(1001, "query", "this query")


def test_window_state_counts_against_the_budget() -> None:
    state = [0]
    budget = MemoryBudget(1000, wait_s=0.2, state_bytes=lambda: state[0])
    with budget.reserve(600, "query", "q1"):
        assert budget.in_use() == {"query": 600}
    state[0] = 700  # re-read at most once a second
    time.sleep(1.05)
    assert budget.in_use() == {"window_state": 700}
    with pytest.raises(OverloadError, match="window state 700"):
        budget.reserve(400, "query", "q2")
    assert budget.reserve(300, "doput", "a batch").nbytes == 300


def test_the_budget_is_scraped() -> None:
    from flight_serve.flight.ops.metrics import Metrics
    from prometheus_client.parser import text_string_to_metric_families

    budget = MemoryBudget(1000, wait_s=0.0)
    metrics = Metrics()
    metrics.watch_budget(budget)
    held = budget.reserve(600, "query", "q1")
    with pytest.raises(OverloadError):
        budget.reserve(500, "doput", "a batch")
    held.release()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render())
        for s in family.samples
        if s.name.startswith("flight_serve_memory")
    }
    assert samples == {
        ("flight_serve_memory_budget_bytes", ()): 1000.0,
        ("flight_serve_memory_held_bytes", (("kind", "doput"),)): 0.0,
        ("flight_serve_memory_held_bytes", (("kind", "query"),)): 0.0,
        ("flight_serve_memory_held_bytes", (("kind", "window_state"),)): 0.0,
        ("flight_serve_memory_peak_held_bytes", ()): 600.0,
        ("flight_serve_memory_refused_total", ()): 1.0,
    }


def test_serve_flags_batch_limit_statement_timeout_and_budget(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import urllib.request

    cli = Path(sys.executable).parent / "flight-serve"
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [str(cli), "serve", "--port", "0", "--health-port", "0", "--metrics-port", "0",
             "--data-dir", str(tmp_path / "data"), "--max-batch-bytes", "64KiB",
             "--statement-timeout", "0.5", "--memory-budget", "256MiB"],
            stdout=subprocess.PIPE, stderr=log_file, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        location = proc.stdout.readline().strip()
        listening = next(
            json.loads(line)
            for line in log_path.read_text().splitlines()
            if '"msg": "listening"' in line
        )
        with flight.FlightClient(location) as client:
            put_rows(client, "t", ROWS)  # 64,000 bytes: at the limit
            with pytest.raises(pa.ArrowInvalid, match="maximum batch size of 65536 bytes"):
                put_rows(client, "t", 8193)
            reader = client.do_get(sql_ticket(client, SLOW, False))
            with pytest.raises(flight.FlightTimedOutError, match="statement timeout"):
                reader.read_all()
        url = f"http://127.0.0.1:{listening['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        assert "flight_serve_memory_budget_bytes 2.68435456e+08" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_running_pipelines_window_state_is_held_in_the_budget(tmp_path: Path) -> None:
    events = pa.schema([("k", pa.string()), ("t", pa.timestamp("ms")), ("v", pa.int64())])
    sql = """
    SET checkpoint_interval = '1s';
    CREATE SOURCE events (k VARCHAR, t TIMESTAMP(3), v BIGINT,
                          WATERMARK FOR t AS t - INTERVAL '1' SECOND)
    WITH (connector = 'flight', stream = 'events');
    CREATE SINK sums WITH (connector = 'flight', stream = 'sums');
    INSERT INTO sums SELECT k, window_start, count(*) AS n, sum(v) AS total
    FROM TUMBLE(events, t, INTERVAL '1' HOUR) GROUP BY k, window_start;
    """
    budget = MemoryBudget(1 << 30)
    with (
        start_server(tmp_path / "data", memory_budget=budget) as service,
        flight.FlightClient(service.location) as client,
    ):
        body = json.dumps({"sql": sql, "name": "state"}).encode()
        pid = json.loads(
            next(iter(client.do_action(flight.Action("pipeline.submit", body)))).body.to_pybytes()
        )["id"]
        # 500 keys in one open hour window: state the pipeline holds and checkpoints.
        rows = pa.record_batch(
            [pa.array([f"key-{i}" for i in range(500)]),
             pa.array([1_700_000_000_000 + i for i in range(500)], pa.timestamp("ms")),
             pa.array(range(500), pa.int64())],
            schema=events,
        )  # fmt: skip
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("events"), events)
        writer.write_batch(rows)
        reader.read()
        writer.done_writing()
        writer.close()
        def status() -> dict[str, Any]:
            action = flight.Action("pipeline.status", json.dumps({"id": pid}).encode())
            result = next(iter(client.do_action(action))).body.to_pybytes()
            return dict(json.loads(result))

        deadline = time.monotonic() + 30
        while True:
            before = status()
            checkpoint = before.get("last_checkpoint") or {}
            if before.get("rows_in") == 500 and checkpoint.get("bytes"):
                break
            assert time.monotonic() < deadline, before
            time.sleep(0.2)
        time.sleep(1.05)  # the budget re-reads the window state at most once a second
        held = budget.in_use()
        # the live operator's state, not the checkpoint's size: 500 keys in one open pane,
        # folded into three int64 arrays of 500 slots (count(*); sum(v) and the non-null count
        # of v that makes a sum of no values NULL)
        manager = service.pipeline_manager
        assert manager is not None
        assert manager.window_state_bytes() == 500 * 3 * 8
        assert held == {"window_state": 500 * 3 * 8}
        assert checkpoint["bytes"] != 500 * 3 * 8  # (the snapshot is larger: IPC + metadata)
