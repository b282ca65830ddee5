"""Out-of-process transform plugins (pipeline stages, ``attach_plugin``, the plugin protocol) against
a real in-process server and real plugin processes (killed with SIGKILL by pid).

Rows of the pass-through tests are (k, t, v) with t in integer seconds and v unique; the plugin
``double`` (tests/integration/plugin_proc.py) answers (k, t, v2 = 2 v). "Exactly once" is: the
output stream's v2 values are exactly {2 v} of the input, each once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from flight_serve.demo.nycflights13 import load_airports, load_flights, load_weather
from flight_serve.flight.ops.roles import load_tokens_file
from flight_serve.flight.server import start_server
from flight_serve.flight.service import FlightServeService
from flight_serve_client import FlightServeClient
from flight_serve_client.plugin import hello_message
from helpers import act, rows_of, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROC = Path(__file__).with_name("plugin_proc.py")
EXAMPLE = ROOT / "clients" / "examples" / "enrich_plugin.py"
IN = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
OUT = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v2", pa.int64())])
WAIT_S = 30.0

DOUBLE = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH (connector = 'flight', stream = 'events');
CREATE FUNCTION double() RETURNS TABLE (k VARCHAR, t TIMESTAMP(0), v2 BIGINT)
WITH (connector = 'plugin', timeout = '{timeout}', max_in_flight = '8');
CREATE SINK doubled WITH (connector = 'flight', stream = 'doubled');
INSERT INTO doubled SELECT k, t, v2 FROM double(events);
"""


# --- helpers ------------------------------------------------------------------------------------


def status(client: flight.FlightClient, pid: str) -> dict[str, Any]:
    return dict(act(client, "pipeline.status", {"id": pid}))


def events(n_batches: int, rows: int) -> list[pa.RecordBatch]:
    """Batch b holds v = b*rows … b*rows + rows - 1, at t = v seconds."""
    return [
        pa.RecordBatch.from_pylist(
            [{"k": f"k{v % 3}", "t": v, "v": v} for v in range(b * rows, (b + 1) * rows)],
            schema=IN,
        )
        for b in range(n_batches)
    ]


def instances(server: FlightServeService, name: str) -> list[dict[str, Any]]:
    return list(server.plugins.describe()["instances"].get(name, []))


def spawn(location: str, name: str, mode: str, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'server'}{os.pathsep}{ROOT / 'clients' / 'python'}")
    return subprocess.Popen(
        [sys.executable, str(PROC), location, name, mode, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def feed(server: FlightServeService, batches: list[pa.RecordBatch], end: bool = True) -> None:
    with FlightServeClient(server.location) as fs:
        for b in batches:  # one DoPut per batch: one stream entry each
            fs.put("events", [b], writer="w")
        if end:
            fs.end_input("events", writer="w")


_SUBMITS = itertools.count(1)


def submit(client: flight.FlightClient, sql: str) -> str:
    # one name per pipeline: a second submit of a running pipeline's name is refused
    name = f"plugged{next(_SUBMITS)}"
    return str(act(client, "pipeline.submit", {"sql": sql, "name": name})["id"])


def count(client: flight.FlightClient, stream: str) -> int:
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    except pa.ArrowKeyError:
        return 0  # created by the sink's first commit
    return int(info.total_records)


def delivered(
    client: flight.FlightClient, pid: str, stream: str, rows: int
) -> Callable[[], bool]:
    """Wait until the pipeline's output holds ``rows`` rows (committed at its checkpoints,
    every second); it runs, or finished once the stream's writers all ended."""

    def check() -> bool:
        state = status(client, pid)["state"]
        assert state in ("running", "finished"), status(client, pid)
        return count(client, stream) >= rows

    return check


def settled(client: flight.FlightClient, pid: str, stream: str, rows: int) -> None:
    """Wait for ``rows`` rows, then for one more checkpoint: nothing more may arrive."""
    wait_until(delivered(client, pid, stream, rows), f"{rows} rows in {stream}")
    try:
        completed = act(client, "pipeline.checkpoint", {"id": pid})["completed"]
    except pa.ArrowInvalid as exc:  # finished meanwhile: it took its last checkpoint itself
        completed = "is finished, not running" in str(exc)
    assert completed or status(client, pid)["state"] == "finished"
    assert count(client, stream) == rows


# --- the enrichment plugin = the same transform in SQL -----------------------------------------


def test_enrich_plugin_matches_the_sql_join(
    server: FlightServeService, client: flight.FlightClient, tmp_path: Path
) -> None:
    flights = load_flights().slice(0, 6000)  # 2013-01-01 05:15 … 2013-01-08 (sorted by sched_dep)
    columns = ["carrier", "flight", "origin", "dest", "sched_dep", "time_hour"]
    pq.write_table(load_airports().select(["faa", "name"]), tmp_path / "airports.parquet")
    weather = load_weather().select(["origin", "time_hour", "temp", "wind_speed", "precip", "visib"])
    pq.write_table(weather, tmp_path / "weather.parquet")
    source = """
CREATE SOURCE flights (carrier VARCHAR, flight INT, origin VARCHAR, dest VARCHAR,
    sched_dep TIMESTAMPTZ(6), time_hour TIMESTAMPTZ(6), WATERMARK FOR sched_dep AS sched_dep)
WITH (connector = 'flight', stream = 'flights');
"""
    plugged = source + """
CREATE FUNCTION enrich() RETURNS TABLE (carrier VARCHAR, flight INT, origin VARCHAR, dest VARCHAR,
    sched_dep TIMESTAMPTZ(6), time_hour TIMESTAMPTZ(6), origin_name VARCHAR, dest_name VARCHAR,
    temp DOUBLE, wind_speed DOUBLE, precip DOUBLE, visib DOUBLE)
WITH (connector = 'plugin');
CREATE SINK by_plugin WITH (connector = 'flight', stream = 'by_plugin');
INSERT INTO by_plugin SELECT * FROM enrich(flights);
"""
    in_sql = source + f"""
CREATE TABLE airports (faa VARCHAR, name VARCHAR)
WITH (connector = 'file', path = '{tmp_path / "airports.parquet"}');
CREATE TABLE weather (origin VARCHAR, time_hour TIMESTAMPTZ(6), temp DOUBLE, wind_speed DOUBLE,
    precip DOUBLE, visib DOUBLE) WITH (connector = 'file', path = '{tmp_path / "weather.parquet"}');
CREATE SINK by_sql WITH (connector = 'flight', stream = 'by_sql');
INSERT INTO by_sql
SELECT f.carrier, f.flight, f.origin, f.dest, f.sched_dep, f.time_hour,
       o.name AS origin_name, d.name AS dest_name, w.temp, w.wind_speed, w.precip, w.visib
FROM flights f
LEFT JOIN airports o ON f.origin = o.faa
LEFT JOIN airports d ON f.dest = d.faa
LEFT JOIN weather w ON f.origin = w.origin AND f.time_hour = w.time_hour;
"""
    with FlightServeClient(server.location) as fs:
        fs.put("flights", flights.select(columns), writer="nyc", batch_rows=1000)
        fs.end_input("flights", writer="nyc")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the example needs pyarrow only
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--server", server.location],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        a = submit(client, plugged)
        b = submit(client, in_sql)
        settled(client, a, "by_plugin", 6000)
        settled(client, b, "by_sql", 6000)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert "attached as enrich instance 1" in out, out
    # per node: the plugin stage and the per-row query over its output each had every row
    assert sorted((n["id"], n["kind"], n["rows_in"], n["rows_out"], n["open_windows"])
                  for n in status(client, a)["nodes"]) == [
        ("function:enrich", "function", 6000, 6000, None), ("query:0", "map", 6000, 6000, None),
    ]  # fmt: skip

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["sched_dep"], r["carrier"], r["flight"], r["origin"])

    by_plugin = sorted(rows_of(client, "by_plugin"), key=key)
    by_sql = sorted(rows_of(client, "by_sql"), key=key)
    assert len(by_plugin) == 6000
    assert by_plugin == by_sql
    first = by_plugin[0]  # UA 1545 EWR -> IAH, scheduled 2013-01-01 05:15 local (10:15 UTC)
    assert (first["carrier"], first["flight"], first["origin"], first["dest"]) == (
        "UA",
        1545,
        "EWR",
        "IAH",
    )
    assert first["origin_name"] == "Newark Liberty Intl"
    assert first["dest_name"] == "George Bush Intercontinental"
    # weather.csv: EWR,2013,1,1,5,39.02,28.04,64.43,260,12.65858,NA,0,1011.9,10,2013-01-01T10:00:00Z
    assert (first["temp"], first["wind_speed"], first["precip"], first["visib"]) == (
        39.02,
        pytest.approx(12.65858),
        0.0,
        10.0,
    )
    # a destination outside airports.csv (BQN, SJU, STT, PSE are missing there) stays null
    assert any(r["dest"] == "BQN" and r["dest_name"] is None for r in by_plugin)


# --- kill and restart; two instances ------------------------------------------------------------


def test_kill_the_plugin_mid_stream_then_restart_it_every_row_once(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    # 30 batches of 20 rows; the plugin answers one batch per 40 ms, so it is killed with
    # batches in flight (sent, unanswered) and others not sent yet:
    #   batches   0 ... k ... 29
    #   plugin 1  |answered|X (SIGKILL)          pipeline: "waiting for plugin double"
    #   plugin 2               |re-sent ... done|
    batches = events(30, 20)
    feed(server, batches)
    pid = submit(client, DOUBLE.format(timeout="30s"))
    first = spawn(server.location, "double", "pass", "--delay-ms", "40")
    try:
        wait_until(lambda: len(instances(server, "double")) == 1, "the first instance")
        wait_until(
            lambda: instances(server, "double")[0]["answered"] >= 5, "five answered batches"
        )
        os.kill(first.pid, signal.SIGKILL)
        wait_until(
            lambda: status(client, pid)["waiting"] == "waiting for plugin double",
            "the status to show the wait",
        )
        assert status(client, pid)["state"] == "running"
        # the broken call is the instance's last error ("its stream broke: …" when the read
        # saw it first, "its call was cancelled …" when the write loop did)
        wait_until(lambda: "double" in status(client, pid)["plugin_errors"], "the error")
        assert status(client, pid)["plugin_errors"]["double"].startswith(
            "plugin double instance 1: its "
        )
        second = spawn(server.location, "double", "pass")
        try:
            settled(client, pid, "doubled", 600)
        finally:
            stop(second)
    finally:
        stop(first)
    got = sorted(r["v2"] for r in rows_of(client, "doubled"))
    assert got == [2 * v for v in range(600)]  # every row, exactly once
    assert status(client, pid)["waiting"] is None


def test_two_instances_share_the_work_and_one_killed_loses_nothing(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    batches = events(40, 10)
    feed(server, batches)
    procs = [spawn(server.location, "double", "pass", "--delay-ms", "30") for _ in range(2)]
    try:
        wait_until(lambda: len(instances(server, "double")) == 2, "two instances")
        listed = act(client, "plugin.list", {})["instances"]["double"]
        assert [(i["id"], i["max_in_flight"], i["outstanding"]) for i in listed] == [
            (1, 4, 0),
            (2, 4, 0),
        ]
        pid = submit(client, DOUBLE.format(timeout="30s"))
        wait_until(
            lambda: all(i["answered"] >= 3 for i in instances(server, "double")),
            "both instances to answer batches",
        )
        os.kill(procs[0].pid, signal.SIGKILL)
        settled(client, pid, "doubled", 400)
    finally:
        for proc in procs:
            stop(proc)
    got = sorted(r["v2"] for r in rows_of(client, "doubled"))
    assert got == [2 * v for v in range(400)]


# --- bad plugins: a clear error, and the server keeps serving -----------------------------------


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("wrong_schema", "results have other columns than its declared output: retyped v2 (string, expected int64)"),
        ("no_seq", 'a result batch without app_metadata (expected {"seq": N})'),
    ],
)
def test_a_plugin_answering_garbage_gets_a_clear_error_and_others_are_served(
    server: FlightServeService, client: flight.FlightClient, mode: str, message: str
) -> None:
    feed(server, events(3, 5))
    pid = submit(client, DOUBLE.format(timeout="30s"))
    proc = spawn(server.location, "double", mode)
    try:
        wait_until(lambda: bool(status(client, pid)["plugin_errors"]), "the plugin error")
        error = status(client, pid)["plugin_errors"]["double"]
        assert error == f"plugin double instance 1: {message}"
        assert status(client, pid)["state"] == "running"
        assert status(client, pid)["waiting"] == "waiting for plugin double"
        # meanwhile another client's DoGet is answered
        assert len(rows_of(client, "events")) == 15
        out, _ = proc.communicate(timeout=10)
        assert message in out  # the plugin's call ended INVALID_ARGUMENT with the same text
        good = spawn(server.location, "double", "pass")
        try:
            settled(client, pid, "doubled", 15)
        finally:
            stop(good)
    finally:
        stop(proc)
    assert sorted(r["v2"] for r in rows_of(client, "doubled")) == [2 * v for v in range(15)]


def test_a_declaration_that_does_not_fit_the_function_is_refused_naming_fields(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    feed(server, events(1, 5))
    pid = submit(client, DOUBLE.format(timeout="30s"))
    other = pa.schema([("k", pa.string()), ("v2", pa.float64())])
    stopped = threading.Event()
    with FlightServeClient(server.location) as fs:
        thread = threading.Thread(
            target=lambda: fs.attach_plugin("double", lambda b: b, IN, other, stop=stopped)
        )
        thread.start()
        try:
            wait_until(lambda: bool(status(client, pid)["plugin_errors"]), "the refusal")
        finally:
            stopped.set()
            thread.join(10)
    assert status(client, pid)["plugin_errors"]["double"] == (
        "plugin double instance 1 declares output columns that differ from FUNCTION double's "
        "RETURNS TABLE: missing t; retyped v2 (double, expected int64)"
    )


def test_a_bad_hello_is_invalid_argument_naming_the_field(server: FlightServeService) -> None:
    with flight.connect(server.location) as c:
        writer, reader = c.do_exchange(flight.FlightDescriptor.for_path("plugins", "x"))
        writer.write_metadata(pa.py_buffer(b'{"protocol": 1, "input_schema": "nope"}'))
        writer.done_writing()
        with pytest.raises(pa.ArrowInvalid, match="'input_schema' is not a base64 Arrow IPC"):
            reader.read_chunk()
        writer, reader = c.do_exchange(flight.FlightDescriptor.for_path("plugins", "x"))
        writer.write_metadata(pa.py_buffer(hello_message("x", IN, OUT, 0)))
        writer.done_writing()
        with pytest.raises(pa.ArrowInvalid, match="'max_in_flight' must be a whole number from 1"):
            reader.read_chunk()


# --- protocol: sequence tags, bounded in-flight, per-batch timeout ------------------------------


class RawPlugin:
    """A plugin written with pyarrow.flight on a thread: the test decides when it answers."""

    def __init__(self, location: str, name: str, max_in_flight: int) -> None:
        self.client = flight.connect(location)
        self.writer, self.reader = self.client.do_exchange(
            flight.FlightDescriptor.for_path("plugins", name)
        )
        self.writer.write_metadata(pa.py_buffer(hello_message(name, IN, OUT, max_in_flight)))
        self.writer.begin(OUT)
        self.accept = self.next()

    def next(self) -> tuple[pa.RecordBatch | None, dict[str, Any]]:
        chunk = self.reader.read_chunk()
        meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
        return chunk.data, meta

    def next_batch(self) -> tuple[pa.RecordBatch, int, int]:
        """The next input batch (heartbeats skipped), its seq and the heartbeats skipped."""
        beats = 0
        while True:
            assert beats < 20, "no input batch for 20 heartbeats"
            data, meta = self.next()
            if data is not None:
                return data, int(meta["seq"]), beats
            assert meta == {"heartbeat": True}
            beats += 1

    def answer(self, batch: pa.RecordBatch, seq: int) -> None:
        out = pa.RecordBatch.from_arrays(
            [batch["k"], batch["t"], pa.compute.multiply(batch["v"], 2)], schema=OUT
        )
        self.writer.write_with_metadata(out, pa.py_buffer(json.dumps({"seq": seq}).encode()))

    def close(self) -> None:
        self.writer.done_writing()
        self.client.close()


def test_results_are_matched_by_seq_and_emitted_in_input_order(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    plugin = RawPlugin(server.location, "double", max_in_flight=3)
    assert plugin.accept[1] == {"accepted": True, "protocol": 1, "instance": 1, "heartbeat_ms": 1000}
    feed(server, events(3, 2))
    pid = submit(client, DOUBLE.format(timeout="30s"))
    got = [plugin.next_batch() for _ in range(3)]
    seqs = [seq for _, seq, _ in got]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 3
    assert [b["v"].to_pylist() for b, _, _ in got] == [[0, 1], [2, 3], [4, 5]]
    for batch, seq, _ in reversed(got):  # answered last first
        plugin.answer(batch, seq)
    settled(client, pid, "doubled", 6)
    plugin.close()
    assert [r["v2"] for r in rows_of(client, "doubled")] == [0, 2, 4, 6, 8, 10]  # input order


def test_in_flight_is_bounded_by_the_declared_max(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    plugin = RawPlugin(server.location, "double", max_in_flight=2)
    feed(server, events(5, 1))
    pid = submit(client, DOUBLE.format(timeout="30s"))
    first = [plugin.next_batch() for _ in range(2)]
    # with two outstanding, the server only sends heartbeats (one per second) until an answer
    data, meta = plugin.next()
    assert data is None
    assert meta == {"heartbeat": True}
    assert instances(server, "double")[0]["outstanding"] == 2
    plugin.answer(first[0][0], first[0][1])
    batch, seq, _ = plugin.next_batch()  # room for one more: batch 2 comes
    assert batch["v"].to_pylist() == [2]
    plugin.answer(first[1][0], first[1][1])
    plugin.answer(batch, seq)
    for _ in range(2):
        b, s, _ = plugin.next_batch()
        plugin.answer(b, s)
    settled(client, pid, "doubled", 5)
    plugin.close()
    assert [r["v2"] for r in rows_of(client, "doubled")] == [0, 2, 4, 6, 8]


def test_a_batch_unanswered_within_the_timeout_goes_to_another_instance_once(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    # timeline (timeout 1 s):  0 s  slow gets batch 0 (seq a), keeps it
    #                          1 s  timeout: batch 0 re-sent to fast (seq b), answered
    #                          then slow answers seq a late: dropped, no duplicate
    slow = RawPlugin(server.location, "double", max_in_flight=1)
    feed(server, events(1, 3))
    pid = submit(client, DOUBLE.format(timeout="1s"))
    batch, seq, _ = slow.next_batch()
    fast = RawPlugin(server.location, "double", max_in_flight=1)
    again, seq2, _ = fast.next_batch()
    assert seq2 > seq
    assert again.equals(batch)
    fast.answer(again, seq2)
    wait_until(delivered(client, pid, "doubled", 3), "the re-sent batch's rows")
    slow.answer(batch, seq)  # too late: dropped
    settled(client, pid, "doubled", 3)
    assert [r["v2"] for r in rows_of(client, "doubled")] == [0, 2, 4]
    assert [i["timeouts"] for i in instances(server, "double")] == [1, 0]
    slow.close()
    fast.close()


# --- a server crash with batches in flight ------------------------------------------------------

CLI = Path(sys.executable).parent / "flight-serve"


class ServeProcess:
    """``flight-serve serve`` on a free port over ``data``, as a real process (SIGKILL-able)."""

    def __init__(self, data: Path) -> None:
        self.proc = subprocess.Popen(
            [str(CLI), "serve", "--port", "0", "--data-dir", str(data)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.location = self.proc.stdout.readline().strip()
        assert self.location, "the server did not start"

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(20)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_a_server_killed_with_batches_in_flight_resumes_and_delivers_every_row_once(
    tmp_path: Path,
) -> None:
    # 40 batches of 10 rows; the plugin answers a batch per 200 ms. The first 10 batches are
    # committed (100 rows), then 30 more are written and the server is SIGKILLed 0.5 s later,
    # while they are at the plugin (their commit would come at the barrier after all 30, 6 s
    # after the first of them reached it: room for a loaded machine's slow puts):
    #   server 1  | 10 batches -> ckpt (100 rows) | 30 batches ... 8 in flight  SIGKILL
    #   server 2  resume from that checkpoint: the 30 batches are read and sent again
    data = tmp_path / "data"
    sql = "SET checkpoint_interval = '100ms';\n" + DOUBLE.format(timeout="30s")
    first = ServeProcess(data)
    plugin = spawn(first.location, "double", "pass", "--delay-ms", "200")
    batches = events(40, 10)
    try:
        with flight.connect(first.location) as c:

            def put(part: list[pa.RecordBatch]) -> None:
                writer, reader = c.do_put(flight.FlightDescriptor.for_path("events", "w"), IN)
                with writer:
                    for b in part:
                        writer.write_batch(b)
                        reader.read()

            put(batches[:10])
            pid = submit(c, sql)
            wait_until(lambda: count(c, "doubled") == 100, "the first 100 rows committed")
            put(batches[10:])
            time.sleep(0.5)
            before = count(c, "doubled")
        first.kill()
        assert before == 100  # killed with the last 30 batches in the plugin stage
    finally:
        stop(plugin)
    second = ServeProcess(data)
    plugin = spawn(second.location, "double", "pass")
    try:
        with flight.connect(second.location) as c:
            settled(c, pid, "doubled", 400)
            got = sorted(r["v2"] for r in rows_of(c, "doubled"))
    finally:
        stop(plugin)
        second.kill()
    assert got == [2 * v for v in range(400)]


def test_attaching_a_plugin_needs_the_write_role(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text("tok-read read\ntok-rw read,write\n")  # every DoExchange needs read
    with start_server(tmp_path / "data", tokens=load_tokens_file(tokens_file)) as service:
        for token, refused in (("tok-read", True), ("tok-rw", False)):
            headers = [(b"authorization", f"Bearer {token}".encode())]
            with flight.connect(service.location) as c:
                writer, reader = c.do_exchange(
                    flight.FlightDescriptor.for_path("plugins", "double"),
                    flight.FlightCallOptions(headers=headers),
                )
                hello = pa.py_buffer(hello_message("double", IN, OUT, 1))

                def attach(
                    writer: flight.FlightStreamWriter = writer,
                    reader: flight.FlightStreamReader = reader,
                    hello: pa.Buffer = hello,
                ) -> flight.FlightStreamChunk:
                    writer.write_metadata(hello)
                    return reader.read_chunk()

                if refused:  # refused before the hello is read: the write may fail already
                    with pytest.raises(
                        flight.FlightUnauthorizedError,
                        match="DoExchange attaching a plugin needs the 'write' role",
                    ):
                        attach()
                else:
                    data, meta = attach()
                    assert data is None
                    assert json.loads(meta.to_pybytes())["accepted"] is True
                with contextlib.suppress(flight.FlightError):
                    writer.done_writing()
                    writer.close()


@pytest.mark.parametrize("end", [False, True])
def test_a_window_over_the_plugin_s_output_keeps_the_source_watermark(
    server: FlightServeService, client: flight.FlightClient, end: bool
) -> None:
    # v = 0 … 59 at t = v seconds, 6 batches; the plugin returns t, so the view keeps the
    # source's WATERMARK (W = max(t)): after the last batch W = 59 s, windows ending by 50 s fire
    #   t:   0 ........ 10 ........ 20 ........ 30 ........ 40 ........ 50 ...... 59
    #        [  fired  )[  fired  )[  fired  )[  fired  )[  fired  )[ open (W = 59 < 60)
    # with the writer's end of input (behind the batches, through the plugin) W = +inf: the
    # last window fires too
    feed(server, events(6, 10), end=end)
    starts = (0, 10, 20, 30, 40, 50) if end else (0, 10, 20, 30, 40)
    sql = DOUBLE.format(timeout="30s").replace(
        "CREATE SINK doubled WITH (connector = 'flight', stream = 'doubled');\n"
        "INSERT INTO doubled SELECT k, t, v2 FROM double(events);",
        "CREATE VIEW d AS SELECT * FROM double(events);\n"
        "CREATE SINK sums WITH (connector = 'flight', stream = 'sums');\n"
        "INSERT INTO sums SELECT window_start, count(*) AS n, sum(v2) AS total\n"
        "FROM TUMBLE(d, t, INTERVAL '10' SECOND) GROUP BY window_start, window_end;",
    )
    proc = spawn(server.location, "double", "pass")
    try:
        pid = submit(client, sql)
        settled(client, pid, "sums", len(starts))
    finally:
        stop(proc)
    got = sorted((r["window_start"].second, r["n"], r["total"]) for r in rows_of(client, "sums"))
    assert got == [(s, 10, 2 * sum(range(s, s + 10))) for s in starts]


def test_two_plugin_stages_in_a_row_share_one_instance(
    server: FlightServeService, client: flight.FlightClient
) -> None:
    # events -> double(events) = (k, t, v2 = 2v) -> again(d) = (k, t, v2 = 4v): two stages of one
    # pipeline calling one plugin name; the second reads the first's view (v2 renamed to v)
    feed(server, events(8, 5))
    sql = DOUBLE.format(timeout="30s").replace(
        "CREATE SINK doubled WITH (connector = 'flight', stream = 'doubled');\n"
        "INSERT INTO doubled SELECT k, t, v2 FROM double(events);",
        "CREATE FUNCTION again() RETURNS TABLE (k VARCHAR, t TIMESTAMP(0), v2 BIGINT)\n"
        "WITH (connector = 'plugin', plugin = 'double');\n"
        "CREATE VIEW d AS SELECT k, t, v2 AS v FROM double(events);\n"
        "CREATE SINK quadrupled WITH (connector = 'flight', stream = 'quadrupled');\n"
        "INSERT INTO quadrupled SELECT k, t, v2 AS v4 FROM again(d);",
    )
    proc = spawn(server.location, "double", "pass")
    try:
        pid = submit(client, sql)
        settled(client, pid, "quadrupled", 40)
    finally:
        stop(proc)
    assert sorted(r["v4"] for r in rows_of(client, "quadrupled")) == [4 * v for v in range(40)]
    wait_until(lambda: instances(server, "double") == [], "the killed instance to be detached")
