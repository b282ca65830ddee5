"""Push a few rows into a flight-serve stream and query them back, with pyarrow.flight only.

    python clients/examples/put_and_query.py --server grpc://127.0.0.1:8815

Shows the plain Flight calls any language can make: DoPut(path=[stream]) with one PutResult per
durable batch (app_metadata JSON {"offset", "rows"}), then GetFlightInfo(cmd=<SQL>) and DoGet.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.flight as flight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="grpc://127.0.0.1:8815")
    parser.add_argument("--stream", default="example_readings")
    args = parser.parse_args()

    client = flight.connect(args.server)
    readings = pa.table(
        {
            "sensor": ["a", "b", "a", "c"],
            "t": pa.array(
                [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (1, 2, 3, 4)],
                pa.timestamp("us", tz="UTC"),
            ),
            "value": [1.5, 2.0, 3.5, 4.0],
        }
    )
    writer, metadata = client.do_put(flight.FlightDescriptor.for_path(args.stream), readings.schema)
    for batch in readings.to_batches(max_chunksize=2):
        writer.write_batch(batch)
        ack = json.loads(metadata.read().to_pybytes())
        print(f"durable: offset {ack['offset']}, {ack['rows']} rows")
    writer.close()

    sql = f"SELECT sensor, count(*) AS n, sum(value) AS total FROM {args.stream} GROUP BY sensor ORDER BY sensor"
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql))
    print("result schema:", info.schema)
    for endpoint in info.endpoints:
        table = client.do_get(endpoint.ticket).read_all()
        for row in table.to_pylist():
            print(row)
    client.do_action(flight.Action("stream.drop", json.dumps({"stream": args.stream}).encode()))
    client.close()


if __name__ == "__main__":
    main()
