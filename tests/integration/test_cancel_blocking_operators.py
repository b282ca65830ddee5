"""Cancel and timeout reach a blocking operator: an aggregate whose first batch comes only at
its end stops computing within moments of the cancel (the CPU falls to idle), and its memory
reservation is held until the work really ended, on the SQL and the Flight SQL paths."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow.flight as flight
import pytest
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.flight.ops.limits import MemoryBudget
from flight_serve.flight.server import start_server
from flight_serve.flight.sql.handler import pack
from helpers import cancel_flight_info_body

pytestmark = pytest.mark.integration

#: ~4-5 s of one core on this machine; max() produces its only batch at the very end.
BLOCKING = "SELECT max(sha256(CAST(value AS VARCHAR))) AS m FROM range(0, 40000000)"
#: Seconds of CPU the whole process may use in the 2 s after the cancel (idle: ~0.02).
IDLE_CPU_S = 0.3


def process_cpu_s() -> float:
    """User + system CPU seconds of this process (the server runs in it), from /proc."""
    with open(f"/proc/{os.getpid()}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flight_info(client: flight.FlightClient, flightsql: bool) -> flight.FlightInfo:
    command = pack(sql_pb2.CommandStatementQuery(query=BLOCKING)) if flightsql else BLOCKING
    return client.get_flight_info(flight.FlightDescriptor.for_command(command))


def query_workers() -> int:
    return sum(t.name == "flight-serve-query" and t.is_alive() for t in threading.enumerate())


def after_the_cancel(budget: MemoryBudget) -> tuple[float, float]:
    """(CPU seconds used in the 2 s after now, seconds until the query's bytes were released);
    fails if the bytes were given back while DataFusion's worker still ran."""
    start_cpu, start = process_cpu_s(), time.monotonic()
    released = None
    while time.monotonic() - start < 2.0:
        workers = query_workers()
        if released is None and not budget.in_use().get("query"):
            released = time.monotonic() - start
            assert workers == 0, "the memory was given back while DataFusion still worked"
        time.sleep(0.01)
    return process_cpu_s() - start_cpu, (2.0 if released is None else released)


def wait_held(budget: MemoryBudget) -> None:
    deadline = time.monotonic() + 20
    while not budget.in_use().get("query"):
        assert time.monotonic() < deadline, "the query never reserved its memory"
        time.sleep(0.01)


@pytest.mark.parametrize("flightsql", [False, True], ids=["sql", "flightsql"])
@pytest.mark.parametrize("how", ["client_deadline", "statement_timeout", "cancel_flight_info"])
def test_a_cancelled_blocking_aggregate_stops_computing_and_then_releases_its_memory(
    tmp_path: Path, how: str, flightsql: bool
) -> None:
    budget = MemoryBudget(1 << 30, wait_s=1.0)
    timeout = 1.0 if how == "statement_timeout" else None
    with (
        start_server(
            tmp_path / "data", pipelines=False, memory_budget=budget, statement_timeout_s=timeout
        ) as service,
        flight.FlightClient(service.location) as client,
    ):
        options = flight.FlightCallOptions(timeout=1.0 if how == "client_deadline" else 30.0)
        info = flight_info(client, flightsql)
        reader = client.do_get(info.endpoints[0].ticket, options=options)
        wait_held(budget)
        if how == "cancel_flight_info":  # Flight's standard action, from another connection
            with flight.FlightClient(service.location) as other:
                body = cancel_flight_info_body(info)
                list(other.do_action(flight.Action("CancelFlightInfo", body)))
        # DEADLINE_EXCEEDED for the client's own deadline and the server's timeout
        expected = (
            flight.FlightCancelledError if how == "cancel_flight_info" else flight.FlightTimedOutError
        )
        with pytest.raises(expected):
            for _chunk in reader:  # read_chunk: read_all would turn CANCELLED into a SIGINT
                pass
        cpu_s, released_s = after_the_cancel(budget)
        print(f"{how}/{'flightsql' if flightsql else 'sql'}: cpu {cpu_s:.2f} s in the 2 s "
              f"after the cancel; memory released after {released_s:.2f} s")
        assert cpu_s < IDLE_CPU_S
        assert released_s < 2.0
        assert budget.in_use().get("query", 0) == 0


def test_adbc_fetch_timeout_stops_a_blocking_aggregate(tmp_path: Path) -> None:
    flightsql = pytest.importorskip("adbc_driver_flightsql.dbapi")
    budget = MemoryBudget(1 << 30, wait_s=1.0)
    with start_server(tmp_path / "data", pipelines=False, memory_budget=budget) as service:
        kwargs = {"adbc.flight.sql.rpc.timeout_seconds.fetch": "1"}
        with (
            flightsql.connect(service.location, db_kwargs=kwargs, autocommit=True) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(BLOCKING)  # plans only (GetFlightInfo); the DoGet runs on fetch
            with pytest.raises(Exception, match=r"(?i)deadline|timed? ?out"):
                cur.fetchall()
            cpu_s, released_s = after_the_cancel(budget)
            print(f"adbc: cpu {cpu_s:.2f} s after the timeout; released after {released_s:.2f}")
            assert cpu_s < IDLE_CPU_S
            assert released_s < 2.0
