"""DoGet of 10 M rows into the Java client (clients/java, arrow-java 18.3) vs the Python client.

Both read ``SELECT * FROM s`` (``x`` int64, ``y`` float64) from one flight-serve server, alternating
runs. The Java side is one warm JVM (``DoGetBench``, which runs the query once per line on its
stdin and prints the row count); the time of a run is the round trip from the harness, so it
includes GetFlightInfo, DoGet and loading every batch into a ``VectorSchemaRoot``. Python's is
``FlightServeClient.query`` (a ``pyarrow.Table``). Needs java and mvn (``make java-test``'s).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from flight_serve_client import FlightServeClient

from benchmarks._harness import Comparison, alternate
from benchmarks.flight_io import flight_serve_location

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "clients" / "java"
ROWS = 10_000_000
BATCH_ROWS = 65_536


def _java_command(location: str, *args: str) -> list[str]:
    """Compile clients/java's test classes and return the DoGetBench command line (``args``:
    the SQL, or ``--path STREAM``)."""
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None or mvn is None:
        raise RuntimeError("the Java benchmark needs java and mvn on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        classpath_file = Path(tmp) / "classpath.txt"
        subprocess.run(
            [mvn, "-q", "-B", "-T1", "test-compile", "dependency:build-classpath",
             f"-Dmdep.outputFile={classpath_file}", "-Dmdep.includeScope=test"],
            cwd=MODULE,
            check=True,
        )  # fmt: skip
        classpath = classpath_file.read_text().strip()
    classes = f"{MODULE / 'target' / 'classes'}:{MODULE / 'target' / 'test-classes'}:{classpath}"
    return [java, "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", classes,
            "io.flightserve.client.DoGetBench", location, *args]  # fmt: skip


def doget_java(repeat: int, rows: int = ROWS) -> list[Comparison]:
    """DoGet of ``rows`` rows into the Java client vs the Python client (rows/s; ratio Java / Python)."""
    table = pa.table({"x": np.arange(rows, dtype=np.int64), "y": np.arange(rows, dtype=np.float64)})
    batches = table.to_batches(BATCH_ROWS)
    sql = "SELECT * FROM s"
    comparison = Comparison(
        name="doget_java",
        subject="Java client (arrow-java 18.3 FlightClient) GetFlightInfo + DoGet",
        baseline="Python client (pyarrow) GetFlightInfo + DoGet",
        units=rows,
        unit="rows",
        nbytes=table.nbytes,
    )
    seen: dict[str, int] = {}
    with flight_serve_location(fsync="never") as location, FlightServeClient(location) as client:
        client.put("s", batches, batch_rows=BATCH_ROWS)
        java = subprocess.Popen(
            _java_command(location, sql), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        stdin, stdout = java.stdin, java.stdout
        assert stdin is not None
        assert stdout is not None
        try:

            def java_run() -> None:
                stdin.write("run\n")
                stdin.flush()
                seen["subject"] = int(stdout.readline())

            alternate(
                comparison,
                java_run,
                lambda: seen.__setitem__("baseline", client.query(sql).num_rows),
                repeat,
            )
        finally:
            stdin.close()
            java.wait(30)  # this benchmark's JVM, by its pid
    comparison.note = (
        f"check: both read {rows:,} rows"
        if seen == {"subject": rows, "baseline": rows}
        else f"[red]MISMATCH[/red]: {seen}"
    )
    return [comparison]
