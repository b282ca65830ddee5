"""Prometheus metrics: ``/metrics`` on its own HTTP port (``flight-serve serve --metrics-port``).

Families (DESIGN §7, named by Prometheus conventions):

- ``flight_serve_stream_rows_in_total{stream}``, ``flight_serve_stream_bytes_in_total{stream}``:
  rows and bytes (``RecordBatch.nbytes``) written into a stream (DoPut, Flight SQL ingest,
  pipeline sinks).
- ``flight_serve_stream_rows_out_total{stream}``, ``flight_serve_stream_bytes_out_total{stream}``:
  rows and bytes read out of a stream (DoGet of a stream range, tails, pipelines reading it;
  markers count no rows).
- ``flight_serve_rpc_duration_seconds{method, code}``: a histogram of every Flight call's
  latency, by method (``DoGet``, ``DoPut``, ...) and gRPC status code (``OK``, ...).
- Per server pipeline (read from the pipeline manager at scrape time; the counters are those of
  the pipeline's last checkpoint): ``flight_serve_pipeline_watermark_seconds{pipeline}``,
  ``flight_serve_pipeline_watermark_lag_seconds{pipeline}``,
  ``flight_serve_pipeline_rows_in_total{pipeline}``,
  ``flight_serve_pipeline_data_loss_rows_total{pipeline}`` (rows skipped by resumes under
  ``offset_reset = 'earliest'`` because retention had removed them),
  ``flight_serve_pipeline_late_rows_total{pipeline, source}``,
  ``flight_serve_pipeline_open_windows{pipeline}``,
  ``flight_serve_pipeline_checkpoint_duration_seconds{pipeline}`` and
  ``flight_serve_pipeline_checkpoint_size_bytes{pipeline}`` (the last checkpoint's). A
  ``finished`` or ``cancelled`` pipeline has none of them (a ``failed`` one keeps them).
- Per user function of a live pipeline (``CREATE FUNCTION … LANGUAGE python | wasm``; read
  from ``pipeline.status``'s ``"functions"`` at scrape time, counted since the pipeline's run
  started: a restart starts them at 0), labelled ``{pipeline, function, digest, language}``
  (``digest``: the code's SHA-256, first 12 hex characters, as ``explain`` shows it):
  ``flight_serve_function_calls_total`` (calls, one per batch),
  ``flight_serve_function_rows_total`` (rows passed in), ``flight_serve_function_errors_total``
  (failed calls) and the histogram ``flight_serve_function_call_duration_seconds`` (one call's
  wall-clock time; buckets 100 µs .. 30 s). A ``finished`` or ``cancelled`` pipeline has none.
- The memory budget (:class:`~flight_serve.flight.ops.limits.MemoryBudget`, when the server has one):
  ``flight_serve_memory_budget_bytes``, ``flight_serve_memory_held_bytes{kind}`` (``query``,
  ``doput``, ``window_state``), ``flight_serve_memory_peak_held_bytes`` and
  ``flight_serve_memory_refused_total`` (requests refused UNAVAILABLE for want of room).

Every server has its own :class:`Metrics` (its own registry), so several servers in one
process (tests) do not mix their numbers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.flight as flight
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from flight_serve.store import FsyncMode, PendingAppend, StreamEntry, StreamStore
from flight_serve.types import MAX_WATERMARK_NS, MIN_WATERMARK_NS

__all__ = [
    "MeteredStreamStore",
    "Metrics",
    "MetricsMiddlewareFactory",
    "PipelineSource",
    "method_name",
    "status_code_of",
]

log = logging.getLogger("flight_serve.metrics")

_METHODS: Final = {
    "HANDSHAKE": "Handshake",
    "LIST_FLIGHTS": "ListFlights",
    "GET_FLIGHT_INFO": "GetFlightInfo",
    "GET_SCHEMA": "GetSchema",
    "DO_GET": "DoGet",
    "DO_PUT": "DoPut",
    "DO_ACTION": "DoAction",
    "LIST_ACTIONS": "ListActions",
    "DO_EXCHANGE": "DoExchange",
}

#: Latency buckets (seconds): 1 ms .. 60 s.
_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def method_name(method: object) -> str:
    """The gRPC name of a :class:`pyarrow.flight.FlightMethod` (``DoGet``, ...).

    >>> method_name(flight.FlightMethod.DO_GET)
    'DoGet'
    """
    name = str(getattr(method, "name", method))
    return _METHODS.get(name, name)


def status_code_of(exception: BaseException | None) -> str:
    """The gRPC status code name a handler's exception reaches the client as.

    >>> status_code_of(None)
    'OK'
    >>> status_code_of(flight.FlightUnavailableError("busy"))
    'UNAVAILABLE'
    >>> status_code_of(pa.ArrowInvalid("bad"))
    'INVALID_ARGUMENT'
    """
    if exception is None:
        return "OK"
    for cls, code in (
        (flight.FlightUnauthenticatedError, "UNAUTHENTICATED"),
        (flight.FlightUnauthorizedError, "PERMISSION_DENIED"),
        (flight.FlightUnavailableError, "UNAVAILABLE"),
        (flight.FlightCancelledError, "CANCELLED"),
        (flight.FlightTimedOutError, "DEADLINE_EXCEEDED"),
        (flight.FlightInternalError, "INTERNAL"),
        (pa.ArrowNotImplementedError, "UNIMPLEMENTED"),
        (pa.ArrowKeyError, "NOT_FOUND"),
        (pa.ArrowIndexError, "OUT_OF_RANGE"),
        (pa.ArrowInvalid, "INVALID_ARGUMENT"),
        (pa.ArrowTypeError, "INVALID_ARGUMENT"),
    ):
        if isinstance(exception, cls):
            return code
    return "UNKNOWN"


class PipelineSource(Protocol):
    """What the pipeline collector needs of a
    :class:`~flight_serve.pipelines.manager.PipelineManager`."""

    def pipelines(self) -> list[dict[str, Any]]: ...

    def status(self, pid: str) -> dict[str, Any]: ...


class BudgetSource(Protocol):
    """What the memory collector needs of a :class:`~flight_serve.flight.ops.limits.MemoryBudget`."""

    limit_bytes: int
    peak_bytes: int
    refused: int

    def in_use(self) -> dict[str, int]: ...


class _BudgetCollector(Collector):
    def __init__(self, budget: BudgetSource) -> None:
        self._budget = budget

    def collect(self) -> Iterable[Metric]:
        held = GaugeMetricFamily(
            "flight_serve_memory_held_bytes",
            "Bytes of the memory budget held now, by kind (query, doput, window_state).",
            labels=["kind"],
        )
        by_kind = dict.fromkeys(("query", "doput", "window_state"), 0)  # always there
        by_kind.update(self._budget.in_use())
        for kind, nbytes in by_kind.items():  # one sample per kind: a repeat hides the value
            held.add_metric([kind], float(nbytes))
        yield GaugeMetricFamily(
            "flight_serve_memory_budget_bytes",
            "The memory budget (--memory-budget).",
            value=float(self._budget.limit_bytes),
        )
        yield held
        yield GaugeMetricFamily(
            "flight_serve_memory_peak_held_bytes",
            "The most bytes of the budget held at once since the start.",
            value=float(self._budget.peak_bytes),
        )
        yield CounterMetricFamily(
            "flight_serve_memory_refused",
            "Requests refused UNAVAILABLE because the memory budget had no room in time.",
            value=float(self._budget.refused),
        )


class _PipelineCollector(Collector):
    def __init__(self, source: PipelineSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        label = ["pipeline"]
        watermark = GaugeMetricFamily(
            "flight_serve_pipeline_watermark_seconds",
            "The pipeline's watermark (event time, seconds since the epoch; the minimum over its "
            "sources) at its last checkpoint.",
            labels=label,
        )
        lag = GaugeMetricFamily(
            "flight_serve_pipeline_watermark_lag_seconds",
            "Wall clock minus the pipeline's watermark.",
            labels=label,
        )
        rows_in = CounterMetricFamily(
            "flight_serve_pipeline_rows_in",
            "Rows the pipeline read from its sources (as of its last checkpoint).",
            labels=label,
        )
        late = CounterMetricFamily(
            "flight_serve_pipeline_late_rows",
            "Rows that arrived behind the watermark (as of the last checkpoint), by source.",
            labels=["pipeline", "source"],
        )
        data_loss = CounterMetricFamily(
            "flight_serve_pipeline_data_loss_rows",
            "Rows the pipeline skipped on resumes with offset_reset = 'earliest' because "
            "retention had removed them (as of its last checkpoint).",
            labels=label,
        )
        open_windows = GaugeMetricFamily(
            "flight_serve_pipeline_open_windows",
            "Window panes open in the pipeline's state (as of its last checkpoint).",
            labels=label,
        )
        duration = GaugeMetricFamily(
            "flight_serve_pipeline_checkpoint_duration_seconds",
            "How long the pipeline's last checkpoint took.",
            labels=label,
        )
        size = GaugeMetricFamily(
            "flight_serve_pipeline_checkpoint_size_bytes",
            "Size of the pipeline's last checkpoint.",
            labels=label,
        )
        # a job on Ray (serve --ray-address): per window-operator instance, as last read from it
        per = ["pipeline", "instance"]
        i_watermark = GaugeMetricFamily(
            "flight_serve_job_instance_watermark_seconds",
            "A Ray job's window instance's input watermark (event time, seconds since the "
            "epoch; the minimum over its input channels).",
            labels=per,
        )
        i_rows_in = CounterMetricFamily(
            "flight_serve_job_instance_rows_in",
            "Rows a Ray job's window instance received through the exchange.",
            labels=per,
        )
        i_rows_out = CounterMetricFamily(
            "flight_serve_job_instance_rows_out",
            "Rows a Ray job's window instance emitted (window results and late rows).",
            labels=per,
        )
        i_state = GaugeMetricFamily(
            "flight_serve_job_instance_state_bytes",
            "Window state bytes a Ray job's window instance holds.",
            labels=per,
        )
        i_queued = GaugeMetricFamily(
            "flight_serve_job_instance_queued_records",
            "Records waiting in a Ray job's window instance's input queue (backpressure).",
            labels=per,
        )
        restarts = CounterMetricFamily(
            "flight_serve_job_restarts",
            "Times a Ray job restored every instance from its last checkpoint after a worker "
            "died (since its coordinator started).",
            labels=label,
        )
        try:
            pids = [  # an ended pipeline has no series (its lag would grow for ever)
                str(p["id"])
                for p in self._source.pipelines()
                if p.get("state") not in ("finished", "cancelled")
            ]
        except Exception:  # a scrape never fails because the registry is odd
            log.exception("cannot list pipelines for the metrics")
            pids = []
        for pid in pids:
            try:
                status = self._source.status(pid)
                mark = status.get("watermark")
                # "+inf" once the input ended (None before any row): no sample
                if mark is not None and mark != "+inf":
                    from datetime import datetime

                    watermark.add_metric([pid], datetime.fromisoformat(mark).timestamp())
                if status.get("watermark_lag_s") is not None:
                    lag.add_metric([pid], float(status["watermark_lag_s"]))
                rows_in.add_metric([pid], float(status.get("rows_in") or 0))
                data_loss.add_metric([pid], float(status.get("data_loss_rows") or 0))
                for source, rows in (status.get("late_rows") or {}).items():
                    late.add_metric([pid, str(source)], float(rows))
                open_windows.add_metric([pid], float(status.get("open_panes") or 0))
                checkpoint = status.get("last_checkpoint") or {}
                if checkpoint.get("duration_ms") is not None:
                    duration.add_metric([pid], float(checkpoint["duration_ms"]) / 1000)
                if checkpoint.get("bytes") is not None:
                    size.add_metric([pid], float(checkpoint["bytes"]))
                job = status.get("job")
                if job:
                    restarts.add_metric([pid], float(job.get("restarts") or 0))
                    for inst in job.get("instances") or []:
                        key = [pid, str(inst["instance"])]
                        ns = inst.get("watermark_ns")
                        if ns is not None and MIN_WATERMARK_NS < ns < MAX_WATERMARK_NS:
                            i_watermark.add_metric(key, ns / 1e9)
                        i_rows_in.add_metric(key, float(inst.get("rows_in") or 0))
                        i_rows_out.add_metric(key, float(inst.get("rows_out") or 0))
                        i_state.add_metric(key, float(inst.get("state_bytes") or 0))
                        i_queued.add_metric(key, float(inst.get("queued_records") or 0))
            except Exception:  # one odd pipeline record does not hide the others
                log.exception("cannot collect pipeline metrics", extra={"pipeline": pid})
        yield from (watermark, lag, rows_in, data_loss, late, open_windows, duration, size)
        yield from (i_watermark, i_rows_in, i_rows_out, i_state, i_queued, restarts)


class _FunctionCollector(Collector):
    """Per user function of every live pipeline, from ``status(pid)["functions"]``."""

    def __init__(self, source: PipelineSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        labels = ["pipeline", "function", "digest", "language"]
        calls = CounterMetricFamily(
            "flight_serve_function_calls",
            "Calls (one per batch) of a user function since its pipeline's run started.",
            labels=labels,
        )
        rows = CounterMetricFamily(
            "flight_serve_function_rows",
            "Rows passed to a user function since its pipeline's run started.",
            labels=labels,
        )
        errors = CounterMetricFamily(
            "flight_serve_function_errors",
            "Calls of a user function that failed (it raised, trapped, ran past its deadline "
            "or memory limit, returned a wrong result, or its worker died twice).",
            labels=labels,
        )
        seconds = HistogramMetricFamily(
            "flight_serve_function_call_duration_seconds",
            "Wall-clock time of one call of a user function (one batch).",
            labels=labels,
        )
        try:
            pids = [
                str(p["id"])
                for p in self._source.pipelines()
                if p.get("state") not in ("finished", "cancelled")
            ]
        except Exception:  # a scrape never fails because the registry is odd
            log.exception("cannot list pipelines for the function metrics")
            pids = []
        for pid in pids:
            try:
                functions = self._source.status(pid).get("functions") or {}
                for name, stats in sorted(functions.items()):
                    values = [pid, str(name), str(stats["sha256"]), str(stats["language"])]
                    calls.add_metric(values, float(stats["calls"]))
                    rows.add_metric(values, float(stats["rows"]))
                    errors.add_metric(values, float(stats["errors"]))
                    histogram = stats["call_seconds"]
                    buckets = [(le, float(n)) for le, n in histogram["buckets"].items()]
                    seconds.add_metric(values, buckets, sum_value=float(histogram["sum"]))
            except Exception:  # one odd pipeline record does not hide the others
                log.exception("cannot collect function metrics", extra={"pipeline": pid})
        yield from (calls, rows, errors, seconds)


class Metrics:
    """One server's metric families (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        stream = ["stream"]
        self.rows_in = Counter(
            "flight_serve_stream_rows_in",
            "Rows written into a stream.",
            stream,
            registry=self.registry,
        )
        self.bytes_in = Counter(
            "flight_serve_stream_bytes_in",
            "Bytes (Arrow buffer sizes) written into a stream.",
            stream,
            registry=self.registry,
        )
        self.rows_out = Counter(
            "flight_serve_stream_rows_out",
            "Rows read out of a stream (DoGet of a stream range, tails, pipelines).",
            stream,
            registry=self.registry,
        )
        self.bytes_out = Counter(
            "flight_serve_stream_bytes_out",
            "Bytes (Arrow buffer sizes) read out of a stream.",
            stream,
            registry=self.registry,
        )
        self.rpc_duration = Histogram(
            "flight_serve_rpc_duration_seconds",
            "Latency of Flight calls, by method and status code.",
            ["method", "code"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._http: Any = None
        self.http_port: int | None = None

    def watch_pipelines(self, source: PipelineSource) -> None:
        """Add the per-pipeline and per-function families, read from ``source`` at each
        scrape."""
        self.registry.register(_PipelineCollector(source))
        self.registry.register(_FunctionCollector(source))

    def watch_budget(self, budget: BudgetSource) -> None:
        """Add the memory budget's families, read from ``budget`` at each scrape."""
        self.registry.register(_BudgetCollector(budget))

    def render(self) -> str:
        """The Prometheus text exposition of every family."""
        return generate_latest(self.registry).decode("utf-8")

    def serve_http(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) until :meth:`stop`; return the
        port.

        Raises:
            OSError: the port cannot be bound.
        """
        try:
            httpd, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen on {host}:{port} for /metrics: {exc.strerror or exc}"
            ) from None
        self._http = httpd
        self.http_port = int(httpd.server_port)
        return self.http_port

    def stop(self) -> None:
        """Stop the HTTP server, if one runs."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _TimedCall(flight.ServerMiddleware):
    def __init__(self, metrics: Metrics, method: str) -> None:
        self._metrics = metrics
        self._method = method
        self._start = time.perf_counter()

    def call_completed(self, exception: BaseException | None) -> None:
        elapsed = time.perf_counter() - self._start
        self._metrics.rpc_duration.labels(self._method, status_code_of(exception)).observe(elapsed)


class MetricsMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Times every Flight call into ``flight_serve_rpc_duration_seconds``."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        return _TimedCall(self.metrics, method_name(info.method))


class MeteredStreamStore(StreamStore):
    """A :class:`~flight_serve.store.StreamStore` that counts the rows and bytes written into
    and read out of each stream in ``metrics``."""

    def __init__(
        self, root: Path, fsync: FsyncMode = "batch", *, metrics: Metrics, **options: Any
    ) -> None:
        super().__init__(root, fsync=fsync, **options)
        self.metrics = metrics

    def write(self, name: str, batch: pa.RecordBatch, **kwargs: Any) -> PendingAppend:
        pending = super().write(name, batch, **kwargs)
        self.metrics.rows_in.labels(name).inc(batch.num_rows)
        self.metrics.bytes_in.labels(name).inc(batch.nbytes)
        return pending

    def read(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        incarnation: str | None = None,
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        items = super().read(name, start, stop, incarnation=incarnation)
        return self._counted(name, items)

    def entries(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        incarnation: str | None = None,
    ) -> Iterator[StreamEntry]:
        items = super().entries(name, start, stop, incarnation=incarnation)
        return self._counted_entries(name, items)

    def _counted_entries(self, name: str, items: Iterator[StreamEntry]) -> Iterator[StreamEntry]:
        rows = self.metrics.rows_out.labels(name)
        nbytes = self.metrics.bytes_out.labels(name)
        for entry in items:
            if entry.batch is not None:
                rows.inc(entry.batch.num_rows)
                nbytes.inc(entry.batch.nbytes)
            yield entry

    def _counted(
        self, name: str, items: Iterator[tuple[int, pa.RecordBatch]]
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        rows = self.metrics.rows_out.labels(name)
        nbytes = self.metrics.bytes_out.labels(name)
        for offset, batch in items:
            rows.inc(batch.num_rows)
            nbytes.inc(batch.nbytes)
            yield offset, batch
