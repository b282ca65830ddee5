"""A plugin process for tests/integration/test_plugins.py (run as a script, killed by pid).

    python plugin_proc.py SERVER NAME MODE [--delay-ms N] [--max-in-flight N]

Rows are (k string, t timestamp[s], v int64). Modes:

* ``pass``: answers every batch with ``v`` doubled (``v2``), through
  ``FlightServeClient.attach_plugin``;
* ``wrong_schema``: declares the right output schema but sends results of another
  (``v2`` as a string);
* ``no_seq``: answers with the right schema but without the ``seq`` tag (garbage).

Prints ``attached`` once the server's accept message arrived (the tests wait for that line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from flight_serve_client import FlightServeClient
from flight_serve_client.plugin import hello_message

IN = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
OUT = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v2", pa.int64())])


def double(batch: pa.RecordBatch, delay_s: float) -> pa.RecordBatch:
    if delay_s:
        time.sleep(delay_s)
    return pa.RecordBatch.from_arrays(
        [batch["k"], batch["t"], pc.multiply(batch["v"], 2)], schema=OUT
    )


def bad(server: str, name: str, mode: str, max_in_flight: int) -> None:
    client = flight.connect(server)
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_path("plugins", name))
    writer.write_metadata(pa.py_buffer(hello_message(name, IN, OUT, max_in_flight)))
    wrong = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v2", pa.string())])
    writer.begin(wrong if mode == "wrong_schema" else OUT)
    for chunk in reader:
        meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
        if chunk.data is None:
            if meta.get("accepted"):
                print("attached", flush=True)
            continue
        batch = chunk.data
        if mode == "wrong_schema":
            out = pa.RecordBatch.from_arrays(
                [batch["k"], batch["t"], batch["v"].cast(pa.string())], schema=wrong
            )
            writer.write_with_metadata(out, pa.py_buffer(json.dumps(meta).encode()))
        else:
            writer.write_batch(double(batch, 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("name")
    parser.add_argument("mode", choices=["pass", "wrong_schema", "no_seq"])
    parser.add_argument("--delay-ms", type=float, default=0)
    parser.add_argument("--max-in-flight", type=int, default=4)
    args = parser.parse_args()
    if args.mode != "pass":
        try:
            bad(args.server, args.name, args.mode, args.max_in_flight)
        except flight.FlightError as exc:
            print(f"ended: {exc}", flush=True)
        except pa.ArrowException as exc:
            print(f"ended: {exc}", flush=True)
        return
    delay_s = args.delay_ms / 1000

    def fn(batch: pa.RecordBatch) -> pa.RecordBatch:
        return double(batch, delay_s)

    print("attached", flush=True)  # attach_plugin blocks; the hello goes out at once
    with FlightServeClient(args.server) as client:
        client.attach_plugin(args.name, fn, IN, OUT, max_in_flight=args.max_in_flight)


if __name__ == "__main__":
    sys.exit(main())
