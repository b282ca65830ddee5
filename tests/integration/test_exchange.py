"""DoExchange(cmd=<windowed query>) through a real in-process Flight server, with raw pyarrow.flight.

Notation: times are integer seconds (timestamp[s, UTC]); rows are (key, t); W is the watermark.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.service import FlightServeService

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("key", pa.string()), ("t", pa.timestamp("s", tz="UTC"))])
TUMBLE_10 = (
    "SELECT key, window_start, window_end, count(*) AS n "
    "FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY key, window_start, window_end"
)


def at(second: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC).fromtimestamp(second, UTC)


def batch(rows: list[tuple[str, int | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _ in rows]),
            pa.array([None if t is None else at(t) for _, t in rows], SCHEMA.field("t").type),
        ],
        schema=SCHEMA,
    )


@pytest.fixture(scope="module")
def client(module_server: FlightServeService) -> Iterator[flight.FlightClient]:
    """One client for the module (on the module's server)."""
    c = flight.connect(module_server.location)
    yield c
    c.close()


def read_until(
    reader: flight.FlightStreamReader, key: str
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]], dict[str, Any]]:
    """Read messages until a JSON metadata message holding ``key``; return (results, late, it)."""
    results: list[tuple[Any, ...]] = []
    late: list[dict[str, Any]] = []
    while True:
        chunk = reader.read_chunk()
        meta = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else b""
        if chunk.data is not None and chunk.data.num_rows:
            for row in chunk.data.to_pylist():
                results.append(
                    (
                        row["key"],
                        int(row["window_start"].timestamp()),
                        int(row["window_end"].timestamp()),
                        row["n"],
                    )
                )
        elif meta.startswith(b"\xff\xff\xff\xff"):
            late.extend(pa.ipc.open_stream(meta).read_all().to_pylist())
        elif meta.startswith(b"{"):
            message: dict[str, Any] = json.loads(meta)
            if key in message:
                return results, late, message


def test_result_comes_back_in_response_to_the_batch_that_closed_it(
    client: flight.FlightClient,
) -> None:
    # one batch [(a,1), (a,12)]: W = 12 after it, so [0,10) closes in response to that batch
    #   0        10        20
    #   |--a1----|--a12----|
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(TUMBLE_10))
    writer.begin(SCHEMA)
    writer.write_batch(batch([("a", 1), ("a", 12)]))
    results, late, ack = read_until(reader, "ack")  # the stream is still open for writing
    assert results == [("a", 0, 10, 1)]
    assert late == []
    assert ack == {"ack": 0, "watermark_ns": 12 * 10**9, "late_rows": 0}
    writer.done_writing()
    results, late, done = read_until(reader, "done")
    assert results == [("a", 10, 20, 1)]
    assert done == {"done": True, "watermark_ns": None, "late_rows": 0}
    writer.close()


def test_explicit_watermark_closes_windows_without_rows(client: flight.FlightClient) -> None:
    # (a,3) then an explicit watermark at 10: [0,10) closes with no further row
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(TUMBLE_10))
    writer.begin(SCHEMA)
    writer.write_batch(batch([("a", 3)]))
    assert read_until(reader, "ack")[0] == []
    writer.write_metadata(
        pa.py_buffer(json.dumps({"watermark": "1970-01-01T00:00:10+00:00"}).encode())
    )
    results, _, ack = read_until(reader, "watermark_ack")
    assert results == [("a", 0, 10, 1)]
    assert ack == {"watermark_ack": 10 * 10**9, "watermark_ns": 10 * 10**9, "late_rows": 0}
    writer.write_batch(batch([("a", 4)]))  # [0,10) is closed: late
    results, late, ack = read_until(reader, "ack")
    assert results == []
    assert [(r["key"], r["_late_reason"]) for r in late] == [("a", "late")]
    assert ack["late_rows"] == 1
    writer.done_writing()
    assert read_until(reader, "done")[0] == []
    writer.close()


def test_null_event_time_goes_to_the_late_side_output(client: flight.FlightClient) -> None:
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(TUMBLE_10))
    writer.begin(SCHEMA)
    writer.write_batch(batch([("a", 1), ("b", None)]))
    _, late, ack = read_until(reader, "ack")
    assert [(r["key"], r["t"], r["_late_reason"]) for r in late] == [("b", None, "null_time")]
    assert ack["late_rows"] == 1
    writer.done_writing()
    assert read_until(reader, "done")[0] == [("a", 0, 10, 1)]
    writer.close()


def exchange_all(client: flight.FlightClient, command: str, metadata: bytes | None = None) -> None:
    """One whole exchange: a batch [(a,1)] (or a metadata message), finish, read to the end."""
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(command))
    try:
        writer.begin(SCHEMA)
        if metadata is None:
            writer.write_batch(batch([("a", 1)]))
        else:
            writer.write_metadata(pa.py_buffer(metadata))
        writer.done_writing()
        read_until(reader, "done")
    finally:
        with contextlib.suppress(pa.ArrowException):
            writer.close()


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("SELECT key, count(* FROM TUMBLE(events, t, INTERVAL '10' SECOND)", "line 1, column"),
        ("SELECT key, count(*) FROM SLIDE(events, t, INTERVAL '1' SECOND) GROUP BY key", "SLIDE"),
        (TUMBLE_10.replace("count(*)", "sum(missing)"), r"column missing does not exist in events"),
        # the window's time column misspelled: a did-you-mean and its position, as in a
        # pipeline (it was "event-time column 'tt' is not in the input; input columns: key, t")
        (
            TUMBLE_10.replace("(events, t,", "(events, tt,"),
            r"^event-time column tt does not exist in events; did you mean t\? \(columns of "
            r"events: key, t\) \(line 1, column 73\)",
        ),
        # DataFusion's message on one line, the call named where it is (it used to be two
        # lines, no position)
        (
            TUMBLE_10.replace("count(*)", "cnt(*)"),
            r"^Error during planning: Invalid function 'cnt'\. Did you mean 'cot'\? "
            r"\(line 1, column 39\)",
        ),
    ],
)
def test_bad_queries_are_invalid_argument_and_the_server_keeps_serving(
    client: flight.FlightClient, command: str, message: str
) -> None:
    with pytest.raises(pa.ArrowInvalid, match=message):
        exchange_all(client, command)
    test_result_comes_back_in_response_to_the_batch_that_closed_it(client)


def test_malformed_watermark_message_is_invalid_argument(client: flight.FlightClient) -> None:
    with pytest.raises(pa.ArrowInvalid, match="watermark_ns"):
        exchange_all(client, TUMBLE_10, metadata=b"not json")
