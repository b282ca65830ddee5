"""Requests and settings the server refuses with a clear error that names the field or the limit
(never an internal error, never a crash): ``serve`` flags out of range, SQL nested too deeply, SQL
text above one mebibyte, huge names, action bodies with non-finite or huge numbers, a watermark
marker beyond int64; and a statement timeout of zero, which is no limit rather than a refusal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.server import start_server
from helpers import KTV_COUNTS_SQL, KTV_EVENTS, act

pytestmark = pytest.mark.integration



CLI = Path(sys.executable).parent / "flight-serve"


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
        # before: gRPC took 70000 as 70000 mod 65536 and listened on 4464 without a word
        ("--health-port", "70000", "70000 is not a port: use 0 to 65535 (0 picks a free one)"),
        ("--metrics-port", "65536", "65536 is not a port: use 0 to 65535"),
        ("--console-port", "x", "invalid port 'x': use 0 to 65535"),
        ("--port", "-1", "-1 is not a port: use 0 to 65535"),
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
            writer, reader = c.do_put(flight.FlightDescriptor.for_path("events"), KTV_EVENTS)
            writer.write_batch(
                pa.RecordBatch.from_pylist(
                    [{"k": "a", "t": pa.scalar(1, pa.timestamp("s")).as_py(), "v": 7}],
                    schema=KTV_EVENTS,
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
        pid = act(c, "pipeline.submit", {"sql": KTV_COUNTS_SQL.format(source="connector = 'flight'", sink="o")})[
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


@pytest.mark.parametrize(
    ("port", "says"),
    [
        (65535, "the health port is the Flight port + 1 = 65536 by default, beyond 65535: "
                "give --health-port (0 picks a free one), or a lower --port"),
        (65534, "the metrics port is the Flight port + 2 = 65536 by default, beyond 65535: "
                "give --metrics-port (0 picks a free one), or a lower --port"),
        (65533, "the console port is the Flight port + 3 = 65536 by default, beyond 65535: "
                "give --console-port (0 picks a free one), or a lower --port"),
    ],
)  # fmt: skip
def test_a_port_whose_defaults_pass_65535_is_refused_naming_the_flag(
    tmp_path: Path, port: int, says: str
) -> None:
    """``serve --port 65534`` used to die with a traceback (``OverflowError: bind(): port must
    be 0-65535``) after the Flight and health ports were bound."""
    done = subprocess.run(
        [str(CLI), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert json.loads(done.stderr.splitlines()[-1])["msg"] == f"cannot serve: {says}"
