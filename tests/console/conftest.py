"""A live ``flight-serve serve`` (a subprocess, port 0, a tokens file) with a pipeline fed while
the tests run: the console's API, browser and CLI tests share it.

Tokens: ``read-token`` (read), ``admin-token`` (read, write, admin). The pipeline ``counts``
counts ``events`` in 10 s tumbling windows; its late side output goes to the stream
``late_rows``. The feeder appends one batch of 10 rows (event times 10 s ahead each batch, one
late row every 5th batch) every 0.2 s while it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

CLI = Path(sys.executable).parent / "flight-serve"
READ_TOKEN = "read-token"
ADMIN_TOKEN = "admin-token"
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
PIPELINE = """
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT,
                      WATERMARK FOR t AS t - INTERVAL '5' SECOND)
WITH (connector = 'flight', stream = 'events');
CREATE SINK counts WITH (connector = 'flight', stream = 'counts');
CREATE SINK late_rows WITH (connector = 'flight', stream = 'late_rows');
INSERT INTO counts
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
INSERT INTO late_rows SELECT * FROM LATE(events);
"""


@dataclass
class Live:
    """The running server: its process, Flight location, console URL and log lines."""

    proc: subprocess.Popen[str]
    location: str
    console_url: str
    console_port: int
    data_dir: Path
    log: list[dict[str, Any]] = field(default_factory=list)

    def client(self, token: str = ADMIN_TOKEN) -> flight.FlightClient:
        return flight.FlightClient(self.location)

    def options(self, token: str = ADMIN_TOKEN) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(
            timeout=60, headers=[(b"authorization", f"Bearer {token}".encode())]
        )

    def action(self, name: str, body: dict[str, Any], token: str = ADMIN_TOKEN) -> Any:
        with self.client() as client:
            results = list(
                client.do_action(
                    flight.Action(name, json.dumps(body).encode()), options=self.options(token)
                )
            )
        return json.loads(results[0].body.to_pybytes()) if results else None

    def status(self, pid: str) -> dict[str, Any]:
        return dict(self.action("pipeline.status", {"id": pid}, READ_TOKEN))

    def query(self, sql: str) -> pa.Table:
        with self.client() as client:
            options = self.options(READ_TOKEN)
            info = client.get_flight_info(flight.FlightDescriptor.for_command(sql), options)
            return client.do_get(info.endpoints[0].ticket, options).read_all()

    def put(self, stream: str, table: pa.Table) -> None:
        with self.client() as client:
            writer, reader = client.do_put(
                flight.FlightDescriptor.for_path(stream), table.schema, self.options()
            )
            with writer:
                for batch in table.to_batches():
                    writer.write_batch(batch)
                    reader.read()


def start_serve(tmp: Path, *extra: str, timeout_s: float = 60.0) -> Live:
    """``flight-serve serve --port 0`` in ``tmp``; returns once its ``listening`` line is out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", "0", "--data-dir", str(tmp / "data"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[dict[str, Any]] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for text in proc.stderr:
            try:
                entry = json.loads(text)
            except ValueError:
                continue
            lines.append(entry)
            if entry.get("msg") == "listening":
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout_s) or not any(e.get("msg") == "listening" for e in lines):
        proc.kill()
        raise AssertionError(f"the server did not listen: {lines}")
    listening = next(e for e in lines if e.get("msg") == "listening")
    try:
        return Live(
            proc,
            listening["location"],
            listening["console_url"],
            int(listening["console_port"]),
            tmp / "data",
            lines,
        )
    except KeyError:  # a server without a console (--no-console): never left running
        proc.kill()
        proc.wait(20)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise


def stop_serve(live: Live) -> None:
    live.proc.terminate()
    try:
        live.proc.wait(60)
    except subprocess.TimeoutExpired:
        live.proc.kill()
        live.proc.wait()
    for pipe in (live.proc.stdout, live.proc.stderr):
        if pipe is not None:
            pipe.close()


class Feeder:
    """Appends a batch to ``events`` every ``period_s`` from a thread until :meth:`stop`."""

    def __init__(self, live: Live, period_s: float = 0.2) -> None:
        self.live = live
        self.period_s = period_s
        self.t0 = int(time.time()) - 7200
        self.batches = 0
        self.rows = 0
        self.late = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def batch(self, i: int | None = None) -> pa.Table:
        i = self.batches if i is None else i
        rows = [{"k": "ab"[j % 2], "t": self.t0 + i * 10 + j, "v": j} for j in range(10)]
        if i % 5 == 4:
            rows.append({"k": "a", "t": self.t0, "v": -1})  # older than every open window
        return pa.Table.from_pylist(rows, schema=SCHEMA)

    def feed_one(self) -> None:
        table = self.batch()
        self.live.put("events", table)
        self.batches += 1
        self.rows += table.num_rows
        self.late += int(table.num_rows == 11)

    def feed_late(self, n: int) -> None:
        """Append one batch of ``n`` rows all older than every open window: ``n`` late rows."""
        rows = [{"k": "b", "t": self.t0, "v": -2 - j} for j in range(n)]
        self.live.put("events", pa.Table.from_pylist(rows, schema=SCHEMA))
        self.batches += 1
        self.rows += n
        self.late += n

    def start(self) -> None:
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.period_s):
                self.feed_one()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@dataclass
class Deployment:
    live: Live
    pid: str
    feeder: Feeder

    def settle(self) -> dict[str, Any]:
        """Stop feeding; wait until the pipeline's checkpointed counters hold every row fed."""
        self.feeder.stop()
        wait_until(
            lambda: self.live.status(self.pid)["rows_in"] == self.feeder.rows,
            f"rows_in == {self.feeder.rows}",
        )
        time.sleep(1.5)  # one more checkpoint interval: the sampler has seen the same
        return self.live.status(self.pid)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("console")
    tokens = tmp / "tokens"
    tokens.write_text(f"{READ_TOKEN} read reader\n{ADMIN_TOKEN} read,write,admin ops\n")
    live = start_serve(tmp, "--tokens-file", str(tokens))
    try:
        pid = live.action("pipeline.submit", {"sql": PIPELINE, "name": "counts"})["id"]
        feeder = Feeder(live)
        feeder.feed_one()  # the stream exists before any test looks
        yield Deployment(live, pid, feeder)
        feeder.stop()
    finally:
        stop_serve(live)
