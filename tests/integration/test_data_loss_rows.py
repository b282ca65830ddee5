"""Rows lost to retention as a number: a server pipeline resuming with ``offset_reset =
'earliest'`` from an offset that retention removed counts the rows it skipped
(``data_loss_rows``) in its checkpoint's metrics, ``pipeline.status`` and Prometheus
(``flight_serve_pipeline_data_loss_rows_total``), next to the gap's text. A real server and its
store; the segments are made small by writing the stream with a store of 4 KiB segments while
the server is down.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.metrics import Metrics
from flight_serve.flight.server import start_server
from flight_serve.store import StreamStore
from helpers import act, wait_until
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])
RELAY = """
SET offset_reset = 'earliest';
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT)
WITH (connector = 'flight', stream = 'events');
CREATE SINK relayed WITH (connector = 'flight', stream = 'relayed');
INSERT INTO relayed SELECT k, t, v FROM events;
"""


def rows(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"k": "a", "t": start + i, "v": i} for i in range(n)], schema=SCHEMA
    )


def data_loss_samples(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["pipeline"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "flight_serve_pipeline_data_loss_rows_total"
    }


def test_rows_skipped_past_retention_are_counted_exactly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_server(data) as service, flight.connect(service.location) as client:
        pid = act(client, "pipeline.submit", {"sql": RELAY, "name": "relay"})["id"]
        writer, reader = client.do_put(flight.FlightDescriptor.for_path("events"), SCHEMA)
        with writer:
            writer.write_batch(rows(3))  # offset 0
            reader.read()

        def read_it() -> bool:
            act(client, "pipeline.checkpoint", {"id": pid})
            return act(client, "pipeline.status", {"id": pid})["rows_in"] == 3

        wait_until(read_it, "a checkpoint after offset 0")
        status = act(client, "pipeline.status", {"id": pid})
        assert status["data_loss_rows"] == 0
    # the server stopped (checkpoint at offset 1); meanwhile a producer writes 500, 700 and
    # 2 rows, each batch in a segment of its own (4 KiB segments): offsets 1, 2, 3
    with StreamStore(data, segment_bytes=4096) as store:
        for n, start in ((500, 100), (700, 1000), (2, 5000)):
            store.append("events", rows(n, start))
        segments = sorted((data / "streams" / "events").glob("*.seg"))
        assert [int(p.stem) for p in segments] == [0, 1, 2, 3]
        keep = sum(p.stat().st_size for p in segments[2:])
    # retention keeps the last two segments: offsets 0 and 1 go; the checkpoint's offset 1 is
    # gone, so the resume skips offset 1 (500 rows) and reads 2 and 3 (702 rows)
    metrics = Metrics()
    with start_server(data, retention_bytes=keep, metrics=metrics) as service:
        port = metrics.serve_http("127.0.0.1", 0)
        try:
            with flight.connect(service.location) as client:

                def read_rest() -> bool:
                    try:
                        act(client, "pipeline.checkpoint", {"id": pid})
                    except pa.ArrowInvalid as exc:  # still resuming: say so, else fail
                        if "is starting" not in str(exc):
                            raise
                        return False
                    return act(client, "pipeline.status", {"id": pid})["rows_in"] == 3 + 702

                wait_until(read_rest, "the resumed pipeline to read offsets 2 and 3")
                status = act(client, "pipeline.status", {"id": pid})
                assert status["data_loss_rows"] == 500
                assert status["gaps"] == [
                    "source events (stream 'events'): the checkpoint's offset 1 is gone "
                    "(retention kept offsets 2 and up): 1 entries were never read (500 rows); "
                    "resuming at 2 (offset_reset = 'earliest')"
                ]
                assert data_loss_samples(port) == {pid: 500.0}
        finally:
            metrics.stop()
        manifest = json.loads(
            max((data / "checkpoints" / pid).glob("epoch-*/MANIFEST.json")).read_text()
        )
        assert manifest["metrics"]["data_loss_rows"] == 500
        assert manifest["sources"]["events"]["stream_rows"] == 3 + 500 + 702
