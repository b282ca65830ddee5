"""The ``flight-serve`` commands on a running server's streams and pipelines that are not
pipeline actions: ``streams list | show | tail | put | drop``, ``query "SQL"``,
``pipelines top`` (a live table of every pipeline) and ``pipelines logs --follow``.

Every command takes ``--server``, ``--user`` (or a bearer token in ``$FLIGHT_SERVE_TOKEN``) and
``--tls-ca`` / ``--tls-cert`` / ``--tls-key`` as ``submit`` does, and talks to the server with
:class:`flight_serve_client.FlightServeClient`. Errors are one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["add_query_command", "add_stream_commands", "follow_logs", "pipelines_top", "run"]

_FORMATS = ("table", "csv", "json", "parquet")


def add_stream_commands(sub: Any, server: argparse.ArgumentParser, make: Callable[..., Any]) -> None:
    """Add ``streams <command>`` to the sub-parsers ``sub`` (``server``: the common options;
    ``make``: cli.py's ``_sub``)."""
    streams = make(sub, "streams", help="list, show, tail, append to or drop a server's streams")
    commands = streams.add_subparsers(dest="what", required=True, metavar="COMMAND")
    make(commands, "list", help="every stream: rows, bytes, offsets", parents=[server])
    show = make(commands, "show", help="a stream's schema, counts, offsets and writers",
                parents=[server])  # fmt: skip
    show.add_argument("name", help="the stream")
    tail = make(commands, "tail", help="print a stream's rows as JSON lines", parents=[server])
    tail.add_argument("name", help="the stream")
    tail.add_argument("--offset", type=int, default=None,
                      help="first offset (default: the newest --last batches)")  # fmt: skip
    tail.add_argument("--last", type=int, default=10,
                      help="without --offset: start this many batches before the end (default 10)")  # fmt: skip
    tail.add_argument("--follow", "-f", action="store_true",
                      help="go on printing new rows as they come (Ctrl+C stops)")  # fmt: skip
    put = make(commands, "put", help="append a .parquet, .csv or .jsonl file to a stream",
               parents=[server])  # fmt: skip
    put.add_argument("name", help="the stream (created with the file's schema if missing)")
    put.add_argument("file", type=Path, help="the rows: .parquet, .csv or .jsonl")
    put.add_argument("--writer", default=None, help="the writer name (its watermark partition)")
    put.add_argument("--batch-rows", type=int, default=65536, help="rows per DoPut batch")
    drop = make(commands, "drop", help="drop a stream and its batches", parents=[server])
    drop.add_argument("name", help="the stream")


def add_query_command(sub: Any, server: argparse.ArgumentParser, make: Callable[..., Any]) -> None:
    """Add ``query "SQL"``."""
    query = make(sub, "query", help="run a read-only SQL query over a server's streams",
                 parents=[server])  # fmt: skip
    query.add_argument("sql", help="the query (DataFusion SQL; each stream is a table)")
    query.add_argument("--format", choices=_FORMATS, default=None,
                       help="table (default on a terminal), csv, json (lines) or parquet "
                       "(needs --out)")  # fmt: skip
    query.add_argument("--out", type=Path, default=None, help="write the result to this file")


def _client(args: argparse.Namespace) -> Any:
    from flight_serve_client import FlightServeClient

    from flight_serve.connectors.flight import server_uri_problem

    problem = server_uri_problem(args.server)
    if problem is not None:
        raise RuntimeError(f"--server {args.server}: {problem}")
    location = args.server if "://" in args.server else f"grpc://{args.server}"
    options: dict[str, Any] = {}
    if args.user is not None:
        password = os.environ.get("FLIGHT_SERVE_PASSWORD")
        if password is None:
            import getpass

            password = getpass.getpass(f"password of {args.user} on {location}: ")
        options.update(username=args.user, password=password)
    elif os.environ.get("FLIGHT_SERVE_TOKEN"):
        options["token"] = os.environ["FLIGHT_SERVE_TOKEN"]
    for key in ("tls_ca", "tls_cert", "tls_key"):
        value = getattr(args, key, None)
        if value is not None:
            options[key] = str(value)
    try:
        return FlightServeClient(location, **options)
    except ValueError as exc:
        raise RuntimeError(str(exc).replace("tls_", "--tls-")) from None


def _message(exc: BaseException, location: str) -> str:
    import pyarrow.flight as flight

    if isinstance(exc, flight.FlightUnavailableError):
        hint = ""
        if location.startswith("grpc+tls://"):
            hint = (
                " (a TLS server: --tls-ca names the CA of its certificate; a mutual-TLS server "
                "also needs --tls-cert and --tls-key)"
            )
        return f"cannot reach a server at {location}{hint}"
    text = str(exc).strip().split(". Detail: ", 1)[0].strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _console() -> Any:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a pipe or a file: never cut a line at 80 columns
        console = Console(width=1000, no_color=True, highlight=False)
    return console


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[str] = ()) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(Text(header), no_wrap=True, justify="right" if header in right else "left")
    for row in rows:  # Text: a value such as "timestamp[s]" is not rich markup
        table.add_row(*(Text("-" if v is None else str(v)) for v in row))
    return table


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "total_seconds"):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _read_file(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pq.read_table(path)
        if suffix == ".csv":
            return pacsv.read_csv(path)
        if suffix in (".jsonl", ".ndjson", ".json"):
            return pajson.read_json(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise RuntimeError(f"cannot read {path}: {exc}") from None
    raise RuntimeError(f"{path}: the file must end in .parquet, .csv or .jsonl")


def _streams(args: argparse.Namespace, client: Any) -> int:
    console = _console()
    if args.what == "list":
        rows = []
        for name in client.list_streams():
            info = client.stream_info(name)
            rows.append((name, f"{info['total_records']:,}", f"{info['total_bytes']:,}",
                         info.get("first_offset"), info.get("next_offset")))  # fmt: skip
        console.print(_table(("STREAM", "ROWS", "BYTES", "FIRST", "NEXT"), rows,
                             right=("ROWS", "BYTES", "FIRST", "NEXT")))  # fmt: skip
        if not rows:
            console.print("(no streams)")
    elif args.what == "show":
        info = client.stream_info(args.name)
        for key in ("name", "total_records", "total_bytes", "first_offset", "next_offset",
                    "incarnation", "created_at"):  # fmt: skip
            if key in info:
                print(f"{key}: {info[key]}")
        print("schema:")
        for schema_field in info["schema"]:
            print(f"  {schema_field.name}: {schema_field.type}")
        for key, value in sorted(info.items()):
            if key not in ("name", "schema", "total_records", "total_bytes", "first_offset",
                           "next_offset", "incarnation", "created_at"):  # fmt: skip
                print(f"{key}: {json.dumps(value, default=_json_default)}")
    elif args.what == "tail":
        offset = args.offset
        if offset is None:
            info = client.stream_info(args.name)
            offset = max(int(info.get("first_offset") or 0), int(info["next_offset"]) - args.last)
        import signal

        if args.follow and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # A follow waits in pyarrow's DoGet read, in C++, where Python's Ctrl-C handler
            # never runs (the tail used to ignore Ctrl-C for good): Ctrl-C ends the process
            # as it ends tail -f (status 130); every line printed is flushed already.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            for entry_offset, batch in client.tail(args.name, offset, follow=args.follow):
                for row in batch.to_pylist():
                    line = {"_offset": entry_offset, **row}
                    print(json.dumps(line, default=_json_default), flush=True)
        except KeyboardInterrupt:
            return 0
    elif args.what == "put":
        table = _read_file(args.file)
        last = client.put(args.name, table, batch_rows=args.batch_rows, writer=args.writer)
        print(f"appended {table.num_rows:,} rows to {args.name} (last offset {last})",
              file=sys.stderr)  # fmt: skip
    elif args.what == "drop":
        client.drop(args.name)
        print(f"dropped {args.name}", file=sys.stderr)
    return 0


def _query(args: argparse.Namespace, client: Any) -> int:
    fmt = args.format
    if fmt is None:
        fmt = "table" if args.out is None else _format_of(args.out)
    if fmt == "parquet" and args.out is None:
        raise RuntimeError("--format parquet needs --out FILE")
    table = client.query(args.sql)
    if fmt == "table":
        console = _console()
        if args.out is not None:
            from rich.console import Console

            with open(args.out, "w", encoding="utf-8") as f:
                console = Console(file=f, width=1000, no_color=True, highlight=False)
                _print_result(console, table)
        else:
            _print_result(console, table)
        return 0
    if fmt == "csv":
        import pyarrow.csv as pacsv

        if args.out is not None:
            pacsv.write_csv(table, args.out)
        else:
            pacsv.write_csv(table, sys.stdout.buffer)
    elif fmt == "json":
        lines = [json.dumps(row, default=_json_default) for row in table.to_pylist()]
        text = "".join(line + "\n" for line in lines)
        if args.out is not None:
            args.out.write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, args.out)
    if args.out is not None:
        rows = f"{table.num_rows:,} row{'s' if table.num_rows != 1 else ''}"
        print(f"wrote {rows} to {args.out}", file=sys.stderr)
    return 0


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet",
            ".pq": "parquet"}.get(suffix, "table")  # fmt: skip


def _print_result(console: Any, table: Any) -> None:
    import pyarrow as pa

    numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    rows = [[row[n] for n in table.column_names] for row in table.to_pylist()]
    console.print(_table(table.column_names, rows, right=numeric))
    console.print(f"({table.num_rows:,} row{'s' if table.num_rows != 1 else ''})")


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = round(abs(seconds))
    return f"{sign}{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _age(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        return _hms(datetime.now(UTC).timestamp() - datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return iso


def pipelines_top(args: argparse.Namespace, act: Callable[[str, dict[str, Any]], Any]) -> int:
    """``pipelines top``: every pipeline's state, watermark, lag, rows/s, rows in, late rows
    and last checkpoint age, redrawn every ``--interval`` seconds (``--iterations`` times, or
    until Ctrl+C). ``act(action, body)`` runs a Flight action (cli.py's ``_action``)."""
    from rich.live import Live

    last: dict[str, tuple[float, int]] = {}

    def frame() -> Any:
        now = time.monotonic()
        rows = []
        for entry in act("pipeline.list", {})["pipelines"]:
            status = act("pipeline.status", {"id": entry["id"]})
            rows_in = int(status.get("rows_in") or 0)
            seen = last.get(entry["id"])
            rate = None
            if seen is not None and now > seen[0]:
                rate = f"{max(rows_in - seen[1], 0) / (now - seen[0]):,.1f}"
            last[entry["id"]] = (now, rows_in)
            checkpoint = status.get("last_checkpoint") or {}
            rows.append((
                status["id"], status["state"], status.get("watermark"),
                _hms(status.get("watermark_lag_s")), rate, f"{rows_in:,}",
                f"{sum((status.get('late_rows') or {}).values()):,}",
                _age(checkpoint.get("taken_at")), status.get("waiting") or status.get("last_error"),
            ))  # fmt: skip
        headers = ("ID", "STATE", "WATERMARK", "LAG", "ROWS/S", "ROWS IN", "LATE", "CHECKPOINT",
                   "WAITING")  # fmt: skip
        return _table(headers, rows, right=("LAG", "ROWS/S", "ROWS IN", "LATE", "CHECKPOINT"))

    console = _console()
    count = 0
    try:
        if not console.is_terminal:  # a pipe: one table per refresh, no cursor movement
            while args.iterations is None or count < args.iterations:
                console.print(frame())
                count += 1
                if args.iterations is None or count < args.iterations:
                    time.sleep(args.interval)
            return 0
        with Live(frame(), console=console, auto_refresh=False) as live:
            count = 1
            while args.iterations is None or count < args.iterations:
                time.sleep(args.interval)
                live.update(frame(), refresh=True)
                count += 1
    except KeyboardInterrupt:
        pass
    return 0


def follow_logs(args: argparse.Namespace, act: Callable[[str, dict[str, Any]], Any]) -> int:
    """``pipelines logs ID --follow``: print the log lines, then each new one (every
    ``--interval`` s) until the pipeline ends (finished, failed, cancelled) or Ctrl+C.

    A pipeline that ended still logs what it does after recording its state (its checkpoints
    removed): after the end, the lines are polled until one interval brings none."""
    after = 0

    def drain() -> int:
        nonlocal after
        lines = act("pipeline.logs", {"id": args.id, "after": after})["lines"]
        for line in lines:
            print(f"{line['ts']} {line['level']}: {line['message']}", flush=True)
            after = int(line["seq"])
        return len(lines)

    try:
        while True:
            drain()
            state = act("pipeline.status", {"id": args.id})["state"]
            if state != "running":
                drain()
                time.sleep(args.interval)
                while drain():
                    time.sleep(args.interval)
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def run(args: argparse.Namespace) -> int:
    """Run ``streams ...`` or ``query``; return the exit code."""
    import pyarrow as pa
    import pyarrow.flight as flight

    try:
        with _client(args) as client:
            if args.command == "query":
                return _query(args, client)
            return _streams(args, client)
    except RuntimeError as exc:
        print(f"flight-serve: {exc}", file=sys.stderr)
        return 1
    except (flight.FlightError, pa.ArrowException) as exc:
        print(f"flight-serve: {_message(exc, args.server)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # | head
        return 0
