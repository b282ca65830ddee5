"""Operations found in the issue 8 review: the pipeline families of /metrics with a finished
pipeline among the running ones, and Flight's ``CancelFlightInfo`` (and Flight SQL's
``CancelQuery``) cancelling a query's DoGet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.metrics import Metrics
from flight_serve.flight.ops.roles import TlsFiles, load_tokens_file
from flight_serve.flight.server import start_server
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

EVENTS = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
COUNTS = """
SET checkpoint_interval = '1h';
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH ({source});
CREATE SINK {sink} WITH (connector = 'flight', stream = '{sink}');
INSERT INTO {sink}
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""


def act(client: flight.FlightClient, action: str, body: object) -> Any:
    results = list(client.do_action(flight.Action(action, json.dumps(body).encode())))
    return json.loads(results[0].body.to_pybytes())


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def scrape(port: int) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def test_a_finished_pipeline_does_not_hide_the_others_metrics(tmp_path: Path) -> None:
    """A finished pipeline's watermark is +inf (its input ended); the scrape must still show
    every pipeline's counters, and no watermark sample for the one without a finite one."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "e.csv").write_text(
        "k,t,v\na,1970-01-01 00:00:01,10\na,1970-01-01 00:00:04,5\nb,1970-01-01 00:00:12,7\n"
    )
    metrics = Metrics()
    with start_server(tmp_path / "data", metrics=metrics, pipelines=True) as service:
        port = metrics.serve_http("127.0.0.1", 0)
        try:
            with flight.FlightClient(service.location) as client:
                finished = act(
                    client,
                    "pipeline.submit",
                    {
                        "sql": COUNTS.format(
                            source="connector = 'file', path = 'in/e.csv'", sink="done"
                        ),
                        "base_dir": str(tmp_path),
                    },
                )["id"]
                wait_until(
                    lambda: act(client, "pipeline.status", {"id": finished})["state"]
                    == "finished",
                    "the file pipeline to finish",
                )
                # event time (s): a@1, a@4, b@12 -> watermark (W = max t) 12 s
                writer, reader = client.do_put(flight.FlightDescriptor.for_path("events"), EVENTS)
                writer.write_batch(
                    pa.RecordBatch.from_pylist(
                        [
                            {"k": k, "t": pa.scalar(t, pa.timestamp("s")).as_py(), "v": v}
                            for k, t, v in [("a", 1, 10), ("a", 4, 5), ("b", 12, 7)]
                        ],
                        schema=EVENTS,
                    )
                )
                writer.done_writing()
                reader.read()
                writer.close()
                running = act(
                    client,
                    "pipeline.submit",
                    {"sql": COUNTS.format(source="connector = 'flight'", sink="live")},
                )["id"]

                def read_all() -> bool:  # a checkpoint's counters show the rows were read
                    act(client, "pipeline.checkpoint", {"id": running})
                    return act(client, "pipeline.status", {"id": running})["rows_in"] == 3

                wait_until(read_all, "the stream pipeline to read the three rows")
                done_bytes = act(client, "pipeline.status", {"id": finished})["last_checkpoint"][
                    "bytes"
                ]
            samples = scrape(port)
        finally:
            metrics.stop()

    def one(pid: str) -> frozenset[tuple[str, str]]:
        return frozenset({("pipeline", pid)})

    # an ended (finished) pipeline has no series at all; the running one has them all
    assert samples["flight_serve_pipeline_rows_in_total"] == {one(running): 3.0}
    assert samples["flight_serve_pipeline_watermark_seconds"] == {one(running): 12.0}
    assert one(finished) not in samples["flight_serve_pipeline_checkpoint_size_bytes"]
    assert done_bytes > 0
    assert set(samples["flight_serve_pipeline_open_windows"]) == {one(running)}


def _cancel_flight_info_body(info: flight.FlightInfo) -> bytes:
    """``CancelFlightInfoRequest {FlightInfo info = 1}`` encoded by hand (pyarrow has no
    binding), independently of the server's message classes."""
    data = info.serialize()
    length, size = bytearray(), len(data)
    while True:
        length.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return b"\x0a" + bytes(length) + data


def test_cancel_query_stops_a_flight_sql_doget_and_only_it(tmp_path: Path) -> None:
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    def statement(sql: str) -> flight.FlightDescriptor:
        return flight.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=sql)))

    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        info = c.get_flight_info(statement("SELECT value FROM generate_series(1, 200000000)"))
        other = c.get_flight_info(statement("SELECT value FROM generate_series(7, 100000000)"))
        ticket = info.endpoints[0].ticket
        reader = c.do_get(ticket)
        bystander = c.do_get(other.endpoints[0].ticket)
        first = reader.read_chunk().data.column(0).to_pylist()
        assert first == list(range(1, 8193))  # DataFusion's 8192-row batches
        assert bystander.read_chunk().data.column(0).to_pylist() == list(range(7, 7 + 8192))
        assert service.running.in_progress(ticket.ticket) == 1
        request = sql_pb2.ActionCancelQueryRequest(info=info.serialize())
        [result] = c.do_action(flight.Action("CancelQuery", pack(request)))
        assert result.body.to_pybytes() == pack(
            sql_pb2.ActionCancelQueryResult(
                result=sql_pb2.ActionCancelQueryResult.CANCEL_RESULT_CANCELLED
            )
        )
        started = time.monotonic()

        def drain() -> None:  # a few batches may be in flight already
            for _ in range(200000000 // 8192):
                reader.read_chunk()

        with pytest.raises(flight.FlightCancelledError):
            drain()
        assert time.monotonic() - started < 5.0
        # the other query, with its own ticket, goes on
        assert bystander.read_chunk().data.column(0).to_pylist() == list(
            range(7 + 8192, 7 + 2 * 8192)
        )
        bystander.cancel()


def test_cancel_flight_info_ends_a_tail(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        writer, reader = c.do_put(flight.FlightDescriptor.for_path("s"), schema)
        writer.write_batch(pa.record_batch([pa.array([1, 2])], schema=schema))
        writer.done_writing()
        reader.read()
        writer.close()
        [tail] = c.do_action(flight.Action("stream.tail", json.dumps({"stream": "s"}).encode()))
        ticket = flight.Ticket(tail.body.to_pybytes())
        stream = c.do_get(ticket)
        assert stream.read_chunk().data.column(0).to_pylist() == [1, 2]
        info = flight.FlightInfo(
            schema, flight.FlightDescriptor.for_path("s"), [flight.FlightEndpoint(ticket, [])]
        )
        [result] = c.do_action(flight.Action("CancelFlightInfo", _cancel_flight_info_body(info)))
        assert result.body.to_pybytes() == b"\x08\x01"  # CancelFlightInfoResult{CANCELLED}
        with pytest.raises(flight.FlightCancelledError, match="CancelFlightInfo"):
            stream.read_chunk()
        # nothing in progress: still CANCELLED (no work is held for it)
        [again] = c.do_action(flight.Action("CancelFlightInfo", _cancel_flight_info_body(info)))
        assert again.body.to_pybytes() == b"\x08\x01"
        # a body that is not a request, and a FlightInfo of another server's ticket
        with pytest.raises(pa.ArrowInvalid, match="CancelFlightInfoRequest"):
            list(c.do_action(flight.Action("CancelFlightInfo", b"\xff\xff")))
        foreign = flight.FlightInfo(
            schema,
            flight.FlightDescriptor.for_path("s"),
            [flight.FlightEndpoint(b"not-a-ticket", [])],
        )
        with pytest.raises(pa.ArrowInvalid, match="ticket"):
            list(c.do_action(flight.Action("CancelFlightInfo", _cancel_flight_info_body(foreign))))


# --- the command line against a mutual-TLS server -------------------------------------------------

CLI = Path(sys.executable).parent / "flight-serve"


def test_the_command_line_manages_pipelines_over_mutual_tls(pki: Path, tmp_path: Path) -> None:
    """``flight-serve submit`` / ``pipelines`` present a client certificate (``--tls-cert``,
    ``--tls-key``) to a server started with ``--tls-client-ca``; without one the error says
    what is missing."""
    (tmp_path / "tokens.txt").write_text("tok-ops read,admin ops\n")
    (tmp_path / "p.sql").write_text(COUNTS.format(source="connector = 'flight'", sink="out"))
    tls = TlsFiles(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    tokens = load_tokens_file(tmp_path / "tokens.txt")
    env = {**os.environ, "FLIGHT_SERVE_TOKEN": "tok-ops"}
    with start_server(tmp_path / "data", tls=tls, tokens=tokens) as service:
        tls_args = ["--server", service.location, "--tls-ca", str(pki / "ca.pem")]
        mutual = [*tls_args, "--tls-cert", str(pki / "client.pem"),
                  "--tls-key", str(pki / "client.key")]  # fmt: skip

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(CLI), *args], env=env, capture_output=True, text=True, timeout=60
            )

        submitted = cli("submit", str(tmp_path / "p.sql"), *mutual)
        assert submitted.returncode == 0, submitted.stderr
        pid = submitted.stdout.strip()
        listed = cli("pipelines", "list", *mutual)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines() if line.strip()]
        assert (rows[0], rows[2:]) == (
            ["ID", "STATE", "EPOCH", "NAME"],
            [[pid, "running", "-", "p"]],
        )
        refused = cli("pipelines", "list", *tls_args)
        assert refused.returncode == 1
        assert "needs --tls-cert and --tls-key" in refused.stderr
        half = cli("pipelines", "list", *tls_args, "--tls-cert", str(pki / "client.pem"))
        assert (half.returncode, half.stderr) == (
            1,
            "flight-serve: --tls-cert and --tls-key go together\n",
        )


def test_a_tokens_file_saved_with_a_byte_order_mark_keeps_its_first_token(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a BOM; the first token must not absorb it."""
    path = tmp_path / "tokens.txt"
    path.write_bytes(b"\xef\xbb\xbftok-a read first\r\ntok-b write,admin\r\n")
    tokens = load_tokens_file(path)
    assert {t: (sorted(g.roles), g.name) for t, g in tokens.items()} == {
        "tok-a": (["read"], "first"),
        "tok-b": (["admin", "write"], "line 2"),
    }
    from flight_serve.flight.ops.auth import load_users_file

    users = tmp_path / "users.txt"
    users.write_bytes(b"\xef\xbb\xbfalice:s3cret\r\nbob:pw:with:colons\r\n")
    assert load_users_file(users) == {"alice": "s3cret", "bob": "pw:with:colons"}


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--memory-budget", "0", "at least 1 byte"),
        ("--max-batch-bytes", "0", "at least 1 byte"),
        ("--max-streams", "0", "at least 1"),
        ("--max-streams", "-1", "at least 1"),
        ("--memory-wait", "-1", ">= 0 seconds"),
        ("--drain-timeout", "-1", ">= 0 seconds"),
        ("--statement-timeout", "-5", ">= 0 seconds"),
        ("--statement-timeout", "nan", ">= 0 seconds"),
    ],
)
def test_serve_refuses_a_bad_limit_naming_the_flag(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a Python traceback from deep in the server (or a server where every query
    timed out at once, every batch was refused, the drain never waited)."""
    from flight_serve.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", flag, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"flight-serve serve: error: argument {flag}: ")
    assert says in error


def test_a_statement_timeout_of_zero_is_no_limit() -> None:
    """As Postgres' ``statement_timeout = 0``."""
    from flight_serve.cli import build_parser

    args = build_parser().parse_args(["serve", "--statement-timeout", "0"])
    assert args.statement_timeout is None
    assert build_parser().parse_args(["serve", "--statement-timeout", "2.5"]).statement_timeout == 2.5


def test_bad_tls_files_are_named_before_the_server_starts(pki: Path, tmp_path: Path) -> None:
    """Before: gRPC's "Server did not start properly", whatever was wrong."""
    from flight_serve.errors import InvalidInputError

    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        (TlsFiles(garbage, pki / "server.key"), "not a PEM certificate chain and its"),
        (TlsFiles(pki / "server.pem", pki / "client.key"), "not a PEM certificate chain and its"),
        (TlsFiles(pki / "server.pem", pki / "server.key", client_ca=garbage), "--tls-client-ca"),
    ]
    for files, says in cases:
        with pytest.raises(InvalidInputError, match=says):
            files.server_options()
    assert set(TlsFiles(pki / "server.pem", pki / "server.key", pki / "ca.pem").server_options()) == {
        "tls_certificates",
        "verify_client",
        "root_certificates",
    }


def test_deeply_nested_sql_and_huge_names_get_a_clear_invalid_argument(tmp_path: Path) -> None:
    """Before: 3,000 nested parentheses (6 KB of SQL) were INTERNAL (Python's RecursionError in
    sqlglot) on every SQL entry point; a 1 MB stream name came back in the error message and
    broke gRPC's metadata limit (RESOURCE_EXHAUSTED, "Stream removed")."""
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    deep = "SELECT " + "(" * 3000 + "1" + ")" * 3000
    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        calls: dict[str, Callable[[], object]] = {
            "sql": lambda: c.get_flight_info(flight.FlightDescriptor.for_command(deep.encode())),
            "flight sql": lambda: c.get_flight_info(
                flight.FlightDescriptor.for_command(
                    pack(sql_pb2.CommandStatementQuery(query=deep))
                )
            ),
            "prepare": lambda: list(
                c.do_action(
                    flight.Action(
                        "CreatePreparedStatement",
                        pack(sql_pb2.ActionCreatePreparedStatementRequest(query=deep)),
                    )
                )
            ),
            "submit": lambda: list(
                c.do_action(
                    flight.Action(
                        "pipeline.submit", json.dumps({"sql": f"CREATE VIEW v AS {deep}"}).encode()
                    )
                )
            ),
        }
        for what, call in calls.items():
            with pytest.raises(pa.ArrowInvalid, match="nested too deeply") as error:
                call()
            assert "internal error" not in str(error.value), what
        name = "n" * 1_000_000
        with pytest.raises(pa.ArrowInvalid) as error:
            list(c.do_action(flight.Action("stream.tail", json.dumps({"stream": name}).encode())))
        first_line = str(error.value).splitlines()[0]
        assert len(first_line) < 3000
        assert "more characters)" in first_line
        assert [i.descriptor.path for i in c.list_flights()] == []  # still serving


def test_sql_text_above_one_mebibyte_is_refused_before_parsing(tmp_path: Path) -> None:
    """Before: 30 MB of SQL kept a request thread parsing for ~40 s and took gigabytes (a
    MemoryError under an 8 GB address-space limit; the OOM killer without one)."""
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    big = "SELECT " + "1+" * (1 << 20) + "1"  # 2 MiB + 8 characters
    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        calls: dict[str, Callable[[], object]] = {
            "sql": lambda: c.get_flight_info(flight.FlightDescriptor.for_command(big.encode())),
            "flight sql": lambda: c.get_flight_info(
                flight.FlightDescriptor.for_command(pack(sql_pb2.CommandStatementQuery(query=big)))
            ),
            "prepare": lambda: list(
                c.do_action(
                    flight.Action(
                        "CreatePreparedStatement",
                        pack(sql_pb2.ActionCreatePreparedStatementRequest(query=big)),
                    )
                )
            ),
            "submit": lambda: list(
                c.do_action(flight.Action("pipeline.submit", json.dumps({"sql": big}).encode()))
            ),
        }
        for what, call in calls.items():
            started = time.monotonic()
            with pytest.raises(pa.ArrowInvalid, match=r"2097160 characters; the limit is 1048576"):
                call()
            assert time.monotonic() - started < 5.0, what


def test_a_deeply_nested_expression_is_refused_instead_of_crashing_the_server(
    tmp_path: Path,
) -> None:
    """Before: ``SELECT 1+1+…+1`` with 12,000 terms (24 KB) overflowed DataFusion's stack while
    planning: a segmentation fault that ended ``flight-serve serve``. The server runs as its own
    process here, so a crash fails the test instead of ending pytest."""
    from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
    from flight_serve.flight.sql.handler import pack

    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    location = proc.stdout.readline().strip()
    try:
        deep = "SELECT " + "1+" * 12000 + "1 AS x"
        where = " OR ".join(f"v = {i}" for i in range(12000))
        with flight.FlightClient(location) as c:
            writer, reader = c.do_put(flight.FlightDescriptor.for_path("events"), EVENTS)
            writer.write_batch(
                pa.RecordBatch.from_pylist(
                    [{"k": "a", "t": pa.scalar(1, pa.timestamp("s")).as_py(), "v": 7}],
                    schema=EVENTS,
                )
            )
            writer.done_writing()
            reader.read()
            writer.close()
            calls: dict[str, Callable[[], object]] = {
                "sql": lambda: c.get_flight_info(
                    flight.FlightDescriptor.for_command(deep.encode())
                ),
                "flight sql": lambda: c.get_flight_info(
                    flight.FlightDescriptor.for_command(
                        pack(sql_pb2.CommandStatementQuery(query=deep))
                    )
                ),
                "where": lambda: c.get_flight_info(
                    flight.FlightDescriptor.for_command(
                        f"SELECT k FROM events WHERE {where}".encode()
                    )
                ),
            }
            for what, call in calls.items():
                with pytest.raises(pa.ArrowInvalid, match="nests expressions about 12000 deep"):
                    call()
                assert proc.poll() is None, f"the server died on {what}"
            # a long flat list and a chain within the limit still run
            sql = (
                "SELECT k, v FROM events WHERE v IN ("
                + ", ".join(str(i) for i in range(20000))
                + ") AND ("
                + " OR ".join(f"v = {i}" for i in range(1500))
                + ")"
            )
            info = c.get_flight_info(flight.FlightDescriptor.for_command(sql.encode()))
            assert c.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [
                {"k": "a", "v": 7}
            ]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        proc.stdout.close()


def test_action_bodies_with_non_finite_or_huge_numbers_are_invalid_argument(
    tmp_path: Path,
) -> None:
    """Before: ``"wait_s": Infinity`` and ``"after": 10**23`` were INTERNAL (OverflowError), and
    NaN waits were accepted (``NaN``/``Infinity`` are not JSON; Python's parser takes them)."""
    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:
        pid = act(c, "pipeline.submit", {"sql": COUNTS.format(source="connector = 'flight'", sink="o")})[
            "id"
        ]
        cases = [
            ("pipeline.checkpoint", f'{{"id": "{pid}", "wait_s": Infinity}}', "not UTF-8 JSON"),
            ("pipeline.checkpoint", f'{{"id": "{pid}", "wait_s": NaN}}', "not UTF-8 JSON"),
            ("pipeline.checkpoint", f'{{"id": "{pid}", "wait_s": 1e400}}', "not UTF-8 JSON"),
            ("pipeline.logs", f'{{"id": "{pid}", "after": 99999999999999999999999}}', "after"),
            ("pipeline.checkpoint", f'{{"id": "{pid}", "wait_s": 1e12}}', "at most 3600"),
            ("stream.writer_wait", '{"stream": "s", "writer": "", "timeout_s": NaN}', "not UTF-8 JSON"),
            ("stream.tail", '{"stream": "s", "offset": -Infinity}', "not UTF-8 JSON"),
        ]
        for action, body, says in cases:
            with pytest.raises(pa.ArrowInvalid, match=says):
                list(c.do_action(flight.Action(action, body.encode())))
        assert act(c, "pipeline.logs", {"id": pid, "after": 2**63 - 1}) == {"lines": []}


def test_a_watermark_marker_beyond_int64_is_invalid_argument(tmp_path: Path) -> None:
    """Before: ``{"watermark_ns": 10**25}`` in a DoPut marker was INTERNAL (struct.error while
    storing it); a DoExchange got the same input."""
    from flight_serve.flight.markers import parse_marker

    schema = pa.schema([("t", pa.timestamp("ns")), ("x", pa.int64())])
    with start_server(tmp_path / "data") as service, flight.FlightClient(service.location) as c:

        def mark(value: int) -> None:
            writer, reader = c.do_put(flight.FlightDescriptor.for_path("s", "w"), schema)
            writer.write_metadata(pa.py_buffer(json.dumps({"watermark_ns": value}).encode()))
            writer.done_writing()
            reader.read()
            writer.close()  # the call's status arrives here at the latest

        for value in (2**63, -(2**63) - 1, 10**25):
            with pytest.raises(pa.ArrowInvalid, match="signed 64-bit"):
                mark(value)
    assert parse_marker(json.dumps({"watermark_ns": 2**63 - 1}).encode()).watermark_ns == 2**63 - 1
