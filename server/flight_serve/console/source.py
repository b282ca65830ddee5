"""What the console shows, read through the public methods of the server's parts: the
:class:`~flight_serve.pipelines.manager.PipelineManager` (``pipelines()``, ``status()``,
``logs()``, ``checkpoint()``, ``cancel()``, its ``registry`` for a pipeline's SQL), the
:class:`~flight_serve.store.StreamStore` (``list_streams()``, ``info()``, ``writers()``,
``writer_holder()``, ``read()``) and the SQL planner (:mod:`flight_serve.flight.query`).

This is the one module the console reads the server through: when the pipeline runtime or the
Flight package change shape, only this module is re-pointed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from flight_serve.errors import FlightServeError, NotFoundError
from flight_serve.flight.ops.limits import QueryLimits
from flight_serve.flight.sql import query as sql_query
from flight_serve.pipelines.manager import PipelineManager
from flight_serve.pipelines.pipeline import PipelinePlan, parse_pipeline
from flight_serve.store import StreamStore
from flight_serve.types import MAX_WATERMARK_NS

__all__ = ["ConsoleSource", "QueryResult", "json_value"]


def json_value(value: Any) -> Any:
    """A value of a pyarrow ``to_pylist()`` row as JSON can carry it: instants and dates as
    ISO 8601 text, durations as seconds, bytes as hex, decimals and other objects as text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "total_seconds"):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)


def table_rows(table: pa.Table) -> list[list[Any]]:
    """``table``'s rows as lists of JSON values (column order)."""
    names = table.column_names
    return [[json_value(row[n]) for n in names] for row in table.to_pylist()]


@dataclass(frozen=True)
class QueryResult:
    """A SQL result: the table, and how long planning and running took (ms)."""

    table: pa.Table
    elapsed_ms: float


class ConsoleSource:
    """The server's state as the console shows it.

    Args:
        manager: the server's pipelines (``None``: a server without pipelines).
        store: the server's streams.
        query_limits: the limits Flight queries run under (memory budget, statement timeout).
    """

    def __init__(
        self,
        manager: PipelineManager | None,
        store: StreamStore,
        query_limits: QueryLimits | None = None,
    ) -> None:
        self.manager = manager
        self.store = store
        self.query_limits = query_limits
        self._plans: dict[str, PipelinePlan | None] = {}

    # --- pipelines ---------------------------------------------------------------------------

    def pipeline_ids(self) -> list[str]:
        """Every pipeline's id, in the registry's order."""
        if self.manager is None:
            return []
        return [str(p["id"]) for p in self.manager.pipelines()]

    def pipelines(self) -> list[dict[str, Any]]:
        """``PipelineManager.pipelines()``: id, name, state, submitted_at, epoch, last_error."""
        return [] if self.manager is None else self.manager.pipelines()

    def status(self, pid: str) -> dict[str, Any]:
        """``PipelineManager.status(pid)`` (NotFoundError: no such pipeline)."""
        if self.manager is None:
            raise NotFoundError(f"no pipeline {pid!r}: this server runs no pipelines")
        return self.manager.status(pid)

    def logs(self, pid: str, after: int = 0) -> list[dict[str, Any]]:
        """``pid``'s log lines after sequence number ``after``: ``{seq, ts, level, message}``."""
        if self.manager is None:
            raise NotFoundError(f"no pipeline {pid!r}: this server runs no pipelines")
        return [dict(vars(line)) for line in self.manager.logs(pid, after)]

    def checkpoint(self, pid: str) -> dict[str, Any]:
        """Take a checkpoint of ``pid`` now (waits up to 30 s)."""
        if self.manager is None:
            raise NotFoundError(f"no pipeline {pid!r}: this server runs no pipelines")
        return self.manager.checkpoint(pid)

    def cancel(self, pid: str) -> dict[str, Any]:
        """Checkpoint and stop ``pid``."""
        if self.manager is None:
            raise NotFoundError(f"no pipeline {pid!r}: this server runs no pipelines")
        return self.manager.cancel(pid)

    def sql(self, pid: str) -> str:
        """The pipeline's SQL text, as submitted."""
        if self.manager is None:
            raise NotFoundError(f"no pipeline {pid!r}: this server runs no pipelines")
        return self.manager.registry.get(pid).sql

    def plan(self, pid: str) -> PipelinePlan | None:
        """The parsed pipeline (cached), or ``None`` when its text no longer parses."""
        if pid not in self._plans:
            if self.manager is None:
                raise NotFoundError(f"no pipeline {pid!r}: this server runs no pipelines")
            record = self.manager.registry.get(pid)
            try:
                self._plans[pid] = parse_pipeline(record.sql, base_dir=Path(record.base_dir))
            except FlightServeError:
                self._plans[pid] = None
        return self._plans[pid]

    def graph(self, pid: str, status: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's graph: ``{"nodes": [{id, kind, label, detail, rows_in?, rows_out?,
        late_rows?, watermark?}], "edges": [[from, to]]}``: sources, plugin functions, queries
        (per-row or windowed), views and sinks; the counts are the status's (rows read is the
        sum over every source: given on a single source only; late rows and watermark per
        windowed query; rows per sink). With the status's ``nodes`` (the runtime's per-node
        counts) each function and query node also gets its own ``rows_in``, ``rows_out`` and,
        windowed, ``open_windows`` and ``partitions``: each input partition's own watermark,
        ``[{partition, watermark (ISO 8601, "+inf" once ended, None before progress), idle,
        finished}]`` (a function used by several queries: the sums)."""
        plan = self.plan(pid)
        nodes: list[dict[str, Any]] = []
        edges: list[list[str]] = []
        if plan is None:
            return {"nodes": nodes, "edges": edges}
        rows_in = status.get("rows_in")
        for name, source in plan.sources.items():
            connector = source.connector.get("connector")
            node: dict[str, Any] = {
                "id": f"source:{name}",
                "kind": "source",
                "label": name,
                "detail": connector.text if connector is not None else "",
            }
            if len(plan.sources) == 1:
                node["rows_out"] = rows_in
            nodes.append(node)
        for name in plan.tables:
            nodes.append({"id": f"table:{name}", "kind": "table", "label": name, "detail": "static"})
        counts: dict[str, dict[str, Any]] = {}  # the runtime's per-node counts, by id
        for entry in status.get("nodes") or []:
            seen = counts.setdefault(entry["id"], {"rows_in": 0, "rows_out": 0})
            seen["rows_in"] += entry["rows_in"]
            seen["rows_out"] += entry["rows_out"]
            if entry.get("open_windows") is not None:
                seen["open_windows"] = entry["open_windows"]
            if entry.get("partitions") is not None:
                seen["partitions"] = [
                    {"partition": str(p["partition"]), "watermark": _iso_mark(p["watermark_ns"]),
                     "idle": bool(p["idle"]), "finished": bool(p["finished"])}
                    for p in entry["partitions"]
                ]  # fmt: skip
        for name in plan.functions:
            nodes.append({"id": f"function:{name}", "kind": "function", "label": name,
                          "detail": "plugin", **counts.get(f"function:{name}", {})})  # fmt: skip
        late = status.get("late_rows") or {}
        marks = status.get("watermarks") or {}
        for q in plan.queries:
            qid = f"query:{q.index}"
            window = q.window
            node = {
                "id": qid,
                "kind": "window" if window is not None else "map",
                "label": q.label,
                "detail": _window_kind(window),
                **counts.get(qid, {}),
            }
            if q.label in late:
                node["late_rows"] = late[q.label]
            if q.label in marks:
                node["watermark"] = marks[q.label]
            nodes.append(node)
            if q.late_of is not None:
                edges.append([f"query:{q.late_of}", qid])
            elif q.function is not None:
                edges.append([f"function:{q.function}", qid])
            elif q.input in plan.views:
                edges.append([f"query:{plan.views[q.input]}", qid])
            else:
                edges.append([f"source:{q.input}", qid])
            if q.function is not None:
                edges.append([f"source:{q.input}", f"function:{q.function}"])
            edges.extend([f"table:{t}", qid] for t in q.tables)
            if q.sink is not None:
                edges.append([qid, f"sink:{q.sink}"])
        rows_out = status.get("rows_out") or {}
        outputs = status.get("outputs") or {}
        for name, sink in plan.sinks.items():
            connector = sink.connector.get("connector")
            nodes.append({
                "id": f"sink:{name}",
                "kind": "sink",
                "label": name,
                "detail": str(outputs.get(name) or (connector.text if connector else "")),
                "rows_in": rows_out.get(name, 0),
            })  # fmt: skip
        return {"nodes": nodes, "edges": edges}

    def source_streams(self, pid: str) -> list[str]:
        """The server streams the pipeline reads (``flight`` sources without ``server``)."""
        plan = self.plan(pid)
        if plan is None:
            return []
        names = []
        for name, source in plan.sources.items():
            connector = source.connector.get("connector")
            if connector is None or connector.text != "flight":
                continue
            if "server" in source.connector:
                continue
            stream = source.connector.get("stream")
            names.append(stream.text if stream is not None else name)
        return names

    def partitions(self, pid: str) -> list[dict[str, Any]]:
        """The watermark of every partition (writer) of every server stream the pipeline
        reads: ``[{stream, writer, watermark (ISO 8601 or None), last_offset, ended}]``."""
        out = []
        for stream in self.source_streams(pid):
            if not self.store.exists(stream):
                continue
            for writer in self.store.writers(stream).values():
                out.append({
                    "stream": stream,
                    "writer": writer.name,
                    "watermark": _iso_ns(writer.watermark_ns),
                    "last_offset": writer.last_offset,
                    "ended": writer.ended_at is not None,
                })  # fmt: skip
        return out

    def late_outputs(self, pid: str, status: dict[str, Any]) -> list[dict[str, Any]]:
        """Where the pipeline's late side outputs go: ``[{query, of, sink, stream}]`` for every
        query reading ``LATE(x)`` (``stream``: the server stream its sink writes, or None)."""
        plan = self.plan(pid)
        if plan is None:
            return []
        outputs = status.get("outputs") or {}
        out = []
        for q in plan.queries:
            if q.late_of is None:
                continue
            target = str(outputs.get(q.sink, "")) if q.sink is not None else ""
            stream = target[len("stream "):] if target.startswith("stream ") else None
            out.append({
                "query": q.label,
                "of": plan.queries[q.late_of].label,
                "sink": q.sink,
                "stream": stream,
            })  # fmt: skip
        return out

    # --- streams -----------------------------------------------------------------------------

    def streams(self) -> list[dict[str, Any]]:
        """Every stream: name, rows, bytes, offsets, created_at, writers (with the pipeline
        holding each, if one does)."""
        return [self._stream_row(info) for info in self.store.list_streams()]

    def stream(self, name: str) -> dict[str, Any]:
        """One stream's row (:meth:`streams`), its schema and the store's retention."""
        info = self.store.info(name)
        row = self._stream_row(info)
        row["schema"] = [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                         for f in info.schema]  # fmt: skip
        age = self.store.retention_age
        row["retention"] = {
            "bytes": self.store.retention_bytes,
            "age_s": age.total_seconds() if age is not None else None,
        }
        return row

    def _stream_row(self, info: Any) -> dict[str, Any]:
        writers = []
        for writer in self.store.writers(info.name).values():
            holder = self.store.writer_holder(info.name, writer.name)
            pipeline = holder[len("pipeline "):] if holder and holder.startswith("pipeline ") else None
            writers.append({
                "name": writer.name,
                "first_offset": writer.first_offset,
                "last_offset": writer.last_offset,
                "watermark": _iso_ns(writer.watermark_ns),
                "ended": writer.ended_at is not None,
                "pipeline": pipeline,
                "holder": holder,
            })  # fmt: skip
        return {
            "name": info.name,
            "rows": info.num_rows,
            "bytes": info.num_bytes,
            "first_offset": info.first_offset,
            "next_offset": info.next_offset,
            "created_at": info.created_at.isoformat(),
            "writers": writers,
        }

    def newest_rows(
        self, name: str, limit: int, skip: int = 0
    ) -> tuple[pa.Schema, list[tuple[int, pa.RecordBatch]]]:
        """The newest ``limit`` rows of stream ``name`` (or fewer) after leaving out the
        ``skip`` newest ones (paging back), as ``(offset, batch)`` pairs, oldest first."""
        info = self.store.info(name)
        picked: list[tuple[int, pa.RecordBatch]] = []
        rows = 0
        offset = info.next_offset
        step = 16
        want = limit + skip
        while rows < want and offset > info.first_offset:
            start = max(info.first_offset, offset - step)
            chunk = list(self.store.read(name, start, offset, incarnation=info.incarnation))
            for entry in reversed(chunk):
                picked.append(entry)
                rows += entry[1].num_rows
                if rows >= want:
                    break
            offset = start
            step *= 2
        picked.reverse()
        # leave out the skip newest rows, then keep the last limit of what is left
        while skip > 0 and picked:
            last_offset, last = picked[-1]
            if last.num_rows <= skip:
                skip -= last.num_rows
                rows -= last.num_rows
                picked.pop()
            else:
                picked[-1] = (last_offset, last.slice(0, last.num_rows - skip))
                rows -= skip
                skip = 0
        extra = rows - limit
        if extra > 0 and picked:
            first_offset, first = picked[0]
            picked[0] = (first_offset, first.slice(extra))
        return info.schema, picked

    # --- SQL ---------------------------------------------------------------------------------

    def query(self, sql: str) -> QueryResult:
        """Run a read-only query over the streams (as a Flight query: same planner, same
        limits). Raises QueryError (DataFusion's message), OverloadError, TicketError."""
        started = time.perf_counter()
        _, ticket = sql_query.plan(sql, self.store)
        schema, batches = sql_query.execute(ticket, self.store, limits=self.query_limits)
        table = pa.Table.from_batches(list(_all(batches)), schema=schema)
        return QueryResult(table, (time.perf_counter() - started) * 1000)


def _window_kind(window: Any) -> str:
    """``tumbling`` / ``hopping`` / ``session`` … of a windowed query; ``per row`` without one."""
    if window is None:
        return "per row"
    assign = getattr(window.aggregation, "window", None)
    name = type(assign).__name__.lower() if assign is not None else "window"
    return name.removesuffix("window").removesuffix("windows") or "window"


def _all(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def _iso_mark(ns: int | None) -> str | None:
    """A watermark in ns as :func:`_iso_ns` does, ``"+inf"`` at or past the end of input."""
    if ns is not None and ns >= MAX_WATERMARK_NS:
        return "+inf"
    return _iso_ns(ns)


def _iso_ns(ns: int | None) -> str | None:
    if ns is None:
        return None
    try:
        return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        return None
