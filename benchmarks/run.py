"""``python -m benchmarks.run [NAME ...]``: run the side-by-side benchmarks, print ratios.

Names: ``doput``, ``doget``, ``tumbling`` (the DESIGN §10 targets, run by default), ``hopping``,
``session``, ``bytewax`` (the tumbling job in Bytewax), ``pathway`` (the same job in Pathway's
static mode, results checked equal), ``coldstart`` (``flight-serve run``
time to first row vs the bare imports), ``checkpoints`` (a checkpoint every second vs none) and
``restore`` (1 M open windows from a checkpoint), ``flightsql_fetch`` / ``flightsql_ingest``
(the ADBC Flight SQL driver vs plain Flight), ``doget_java`` (10 M rows into the Java client vs
the Python client), ``datagen`` (the datagen source vs numpy's own random streams),
``functions_wasm`` (WebAssembly functions vs pyarrow.compute, the two ABIs, per-call overhead,
compile vs cached load), ``functions_python`` (a Python function in its bwrap sandbox vs in
this process); all run by default. ``--repeat N`` sets the
runs per side (median reported); ``--json PATH`` also writes every measurement as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from benchmarks import (
    checkpoints,
    coldstart,
    datagen,
    end_to_end,
    falkordb,
    flight_io,
    flightsql,
    functions_python,
    functions_wasm,
    iceberg,
    issue19,
    java_client,
    plugins,
    remote,
    state_memory,
    sync_lag,
    tail_latency,
    vs_bytewax,
    vs_pathway,
    windows,
)
from benchmarks._harness import Comparison, render, render_summary

BENCHMARKS: dict[str, Callable[[int], list[Comparison]]] = {
    "doput": flight_io.doput,
    "doget": flight_io.doget,
    "tumbling": windows.tumbling,
    "hopping": windows.hopping,
    "session": windows.session,
    "bytewax": vs_bytewax.bytewax,
    "pathway": vs_pathway.pathway,
    "coldstart": coldstart.coldstart,
    "checkpoints": checkpoints.checkpoints,
    "restore": checkpoints.restore,
    "flightsql_fetch": flightsql.fetch,
    "flightsql_ingest": flightsql.ingest,
    "iceberg_commit": iceberg.sink_commit,
    "falkordb_upserts": falkordb.edge_upserts,
    "sync_lag": sync_lag.sync_lag,
    "plugins": plugins.plugins,
    "remote_sink": remote.remote_sink,
    "doget_java": java_client.doget_java,
    "datagen": datagen.datagen,
    "functions_python": functions_python.functions_python,
    "functions_wasm": functions_wasm.functions_wasm,
    "tail_latency": tail_latency.tail_latency,
    "state_memory": state_memory.state_memory,
    "end_to_end": end_to_end.end_to_end,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})",
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per side (default 5)")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    names = args.names or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    console = Console(width=None if sys.stdout.isatty() else 110)
    console.print(
        f"[bold]flight-serve benchmarks[/bold]: {', '.join(names)}; {args.repeat} runs per side, "
        f"median; {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.machine()}"
    )
    console.print()
    results: list[Comparison] = []
    started = time.perf_counter()
    for name in names:
        console.rule(name)
        for comparison in BENCHMARKS[name](args.repeat):
            render(console, comparison)
            results.append(comparison)
    render_summary(console, results)
    issue19.render(console, results)
    console.print(f"total {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"cpus": os.cpu_count(), "results": [c.as_dict() for c in results]}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
