"""Run a tumbling-window query over DoExchange with pyarrow.flight only.

    python clients/examples/exchange_windows.py --server grpc://127.0.0.1:8815

The client streams events in; after each batch the server answers with the windows that batch
closed, any late rows (a metadata-only message holding an Arrow IPC stream) and an acknowledgement
(JSON). When the client finishes writing, the rest of the windows arrive. See schemas/README.md.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.flight as flight

QUERY = """
CREATE SOURCE clicks (WATERMARK FOR t AS t - INTERVAL '2' SECOND);
SELECT page, window_start, window_end, count(*) AS clicks
FROM TUMBLE(clicks, t, INTERVAL '10' SECOND)
GROUP BY page, window_start, window_end
"""


def ts(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


def read_until_ack(reader: flight.FlightStreamReader) -> dict[str, object]:
    while True:
        chunk = reader.read_chunk()
        meta = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else b""
        if chunk.data is not None and chunk.data.num_rows:
            for row in chunk.data.to_pylist():
                print("window:", row)
        elif meta.startswith(b"\xff\xff\xff\xff"):
            late = pa.ipc.open_stream(meta).read_all()
            print("late rows:", late.select(["page", "t", "_late_reason"]).to_pylist())
        elif meta.startswith(b"{"):
            message: dict[str, object] = json.loads(meta)
            if "ack" in message or message.get("done"):
                return message


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="grpc://127.0.0.1:8815")
    args = parser.parse_args()

    schema = pa.schema([("page", pa.string()), ("t", pa.timestamp("s", tz="UTC"))])
    batches = [
        [("home", 1), ("cart", 3)],
        [("home", 9), ("home", 14)],  # W = 12 after this batch: [0,10) closes
        [("cart", 5)],  # late: [0,10) has fired
        [("cart", 25)],  # W = 23: [10,20) closes
    ]
    client = flight.connect(args.server)
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(QUERY.encode()))
    writer.begin(schema)
    for rows in batches:
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([p for p, _ in rows]),
                pa.array([ts(s) for _, s in rows], schema.field("t").type),
            ],
            schema=schema,
        )
        writer.write_batch(batch)
        print("ack:", read_until_ack(reader))
    writer.done_writing()
    print("done:", read_until_ack(reader))
    writer.close()
    client.close()


if __name__ == "__main__":
    main()
