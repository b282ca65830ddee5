"""Prometheus pipeline metrics with a finished pipeline among the running ones: every pipeline's
counters are scraped, and no watermark sample for one whose watermark is not finite."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.flight.ops.metrics import Metrics
from flight_serve.flight.server import start_server
from helpers import KTV_COUNTS_SQL, KTV_EVENTS, act, scrape_metrics, wait_until

pytestmark = pytest.mark.integration



def test_a_finished_pipeline_does_not_hide_the_others_metrics(tmp_path: Path) -> None:
    """A finished pipeline's watermark is +inf (its input ended); the scrape must still show
    every pipeline's counters, and no watermark sample for the one without a finite one."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "e.csv").write_text(
        "k,t,v\na,1970-01-01 00:00:01,10\na,1970-01-01 00:00:04,5\nb,1970-01-01 00:00:12,7\n"
    )
    metrics = Metrics()
    with start_server(tmp_path / "data", metrics=metrics, pipelines=True) as service:
        port = metrics.serve_http("127.0.0.1", 0)
        try:
            with flight.FlightClient(service.location) as client:
                finished = act(
                    client,
                    "pipeline.submit",
                    {
                        "sql": KTV_COUNTS_SQL.format(
                            source="connector = 'file', path = 'in/e.csv'", sink="done"
                        ),
                        "base_dir": str(tmp_path),
                    },
                )["id"]
                wait_until(
                    lambda: act(client, "pipeline.status", {"id": finished})["state"]
                    == "finished",
                    "the file pipeline to finish",
                )
                # event time (s): a@1, a@4, b@12 -> watermark (W = max t) 12 s
                writer, reader = client.do_put(flight.FlightDescriptor.for_path("events"), KTV_EVENTS)
                writer.write_batch(
                    pa.RecordBatch.from_pylist(
                        [
                            {"k": k, "t": pa.scalar(t, pa.timestamp("s")).as_py(), "v": v}
                            for k, t, v in [("a", 1, 10), ("a", 4, 5), ("b", 12, 7)]
                        ],
                        schema=KTV_EVENTS,
                    )
                )
                writer.done_writing()
                reader.read()
                writer.close()
                running = act(
                    client,
                    "pipeline.submit",
                    {"sql": KTV_COUNTS_SQL.format(source="connector = 'flight'", sink="live")},
                )["id"]

                def read_all() -> bool:  # a checkpoint's counters show the rows were read
                    act(client, "pipeline.checkpoint", {"id": running})
                    return act(client, "pipeline.status", {"id": running})["rows_in"] == 3

                wait_until(read_all, "the stream pipeline to read the three rows")
                done_bytes = act(client, "pipeline.status", {"id": finished})["last_checkpoint"][
                    "bytes"
                ]
            samples = scrape_metrics(port)
        finally:
            metrics.stop()

    def one(pid: str) -> frozenset[tuple[str, str]]:
        return frozenset({("pipeline", pid)})

    # an ended (finished) pipeline has no series at all; the running one has them all
    assert samples["flight_serve_pipeline_rows_in_total"] == {one(running): 3.0}
    assert samples["flight_serve_pipeline_watermark_seconds"] == {one(running): 12.0}
    assert one(finished) not in samples["flight_serve_pipeline_checkpoint_size_bytes"]
    assert done_bytes > 0
    assert set(samples["flight_serve_pipeline_open_windows"]) == {one(running)}
