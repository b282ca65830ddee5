"""``EXPLAIN`` of a pipeline: the graph of a built :class:`~flight_serve.pipelines.runtime.PipelineRuntime`
as text (sources with their partitions and watermark rule, static tables, each query's node,
the sinks)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from flight_serve.connectors.datagen import DatagenSource
from flight_serve.connectors.flight import FlightSource, FlightTicketSource
from flight_serve.connectors.iceberg import IcebergSource
from flight_serve.engine.windows import (
    CalendarWindow,
    CumulateWindow,
    HoppingWindow,
    SessionWindow,
    TumblingWindow,
    WindowSpec,
)
from flight_serve.pipelines.dialect import position
from flight_serve.pipelines.function_nodes import TableFunctionNode
from flight_serve.pipelines.graph import Node, PluginNode, RowNode, WindowNode, columns_text
from flight_serve.pipelines.query import QueryOptions
from flight_serve.pipelines.user_functions import explain_lines
from flight_serve.types import timedelta_to_ns

if TYPE_CHECKING:
    from flight_serve.pipelines.runtime import PipelineRuntime

__all__ = ["explain"]


def _duration(value: timedelta | None) -> str:
    """``1h``, ``15m``, ``90s``, ``250ms``, …: the largest unit that divides the value."""
    if value is None:
        return "none"
    ns = timedelta_to_ns(value)
    if ns == 0:
        return "0s"
    for unit, size in (
        ("d", 86_400 * 10**9),
        ("h", 3_600 * 10**9),
        ("m", 60 * 10**9),
        ("s", 10**9),
        ("ms", 10**6),
        ("us", 10**3),
    ):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def _describe_window(spec: WindowSpec, time_column: str) -> str:
    t = time_column
    if isinstance(spec, TumblingWindow):
        return (
            f"TUMBLE size {_duration(spec.size)} offset {_duration(spec.offset)}: one window per "
            f"row, window_start = {t} - (({t} - offset) mod size)"
        )
    if isinstance(spec, HoppingWindow):
        return (
            f"HOP size {_duration(spec.size)} slide {_duration(spec.slide)} offset "
            f"{_duration(spec.offset)}: windows start at offset + k*slide; a row belongs to every "
            f"window [s, s + size) holding {t} (up to {spec.windows_per_row})"
        )
    if isinstance(spec, SessionWindow):
        return (
            f"SESSION gap {_duration(spec.gap)} per key: each row opens [{t}, {t} + gap); "
            "overlapping sessions of a key merge into [first, last + gap)"
        )
    if isinstance(spec, CumulateWindow):
        return (
            f"CUMULATE step {_duration(spec.step)} max_size {_duration(spec.max_size)} offset "
            f"{_duration(spec.offset)}: windows [p, p + k*step) within each max_size period p"
        )
    assert isinstance(spec, CalendarWindow)
    return (
        f"TUMBLE one calendar {spec.unit} in {spec.time_zone}: from local midnight to the next "
        "(23 or 25 hours across a DST change)"
    )


def _pretty_sql(sql: str) -> str:
    try:
        return str(sqlglot.parse_one(sql).sql(pretty=True))
    except sqlglot.errors.SqlglotError:
        return sql


def _partial_sql(merge_sql: str) -> str:
    """The per-batch partial aggregation: the right side of the merge's ``UNION ALL``."""
    try:
        union = sqlglot.parse_one(merge_sql).find(exp.Union)
    except sqlglot.errors.SqlglotError:
        union = None
    if union is None or union.expression is None:
        return merge_sql
    return str(union.expression.sql(pretty=True))


def _indent(text: str, spaces: int = 4) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


def explain(runtime: PipelineRuntime) -> str:
    """The plan as text: sources (connector, partitions, watermark rule), static tables, each
    query (input, window assignment, partial and merge aggregation SQL, final projection,
    output columns, late side output), and sinks."""
    plan = runtime.plan
    out: list[str] = [f"pipeline {plan.path if plan.path is not None else '(SQL text)'}"]
    out.append(f"settings: {_options_text(plan.settings)}")
    for name, source in runtime.sources.items():
        relation = plan.sources[name]
        stream = runtime.streams[name]
        out += ["", f"SOURCE {name}{_at(relation.node)}"]
        out.append(
            f"  connector file, format {source.format}, batch_rows {source.batch_rows}; "
            f"read round-robin, one batch per file in turn"
        )
        out.append(f"  partitions ({len(source.partitions)}, one per file):")
        out += [f"    {p}" for p in source.partitions]
        out.append(f"  columns: {columns_text(stream.schema)}")
        if relation.time_column is not None:
            bound = _duration(relation.options.max_out_of_orderness)
            out.append(
                f"  watermark: W_p = max({relation.time_column}) - {bound} per partition; "
                "W = min over live partitions, never decreasing; a file's end sets W_p = +inf"
            )
        else:
            out.append("  watermark: none declared (windows over it use max_out_of_orderness)")
        out.append(f"  options: {_options_text(relation.options)}")
        if not stream.consumers:
            out.append("  not read by any query")
    live: Any  # a source's own attributes (server, stream, offsets) describe it
    for name, live in runtime.flight_sources.items():
        relation = plan.sources[name]
        stream = runtime.streams[name]
        out += ["", f"SOURCE {name}{_at(relation.node)}"]
        if isinstance(live, IcebergSource):
            out += [*live.describe(), f"  columns: {columns_text(stream.schema)}"]
            continue
        if isinstance(live, DatagenSource):
            head, *columns = live.options.describe()
            out += [f"  connector {head}", *columns]
            if relation.time_column is not None:
                bound = _duration(relation.options.max_out_of_orderness)
                out.append(
                    f"  watermark: W_p = max({relation.time_column}) - {bound} per partition; "
                    "W = min over partitions, never decreasing; a partition's end sets "
                    "W_p = +inf"
                )
            out.append(f"  options: {_options_text(relation.options)}")
            if not stream.consumers:
                out.append("  not read by any query")
            continue
        if isinstance(live, FlightTicketSource):
            out.append(
                f"  connector flight, server {live.server}, {live.stream}: one DoGet, bounded; "
                "offset = rows handed out (a cut DoGet is opened again and they are skipped)"
            )
            out.append("  partitions: one, ended when the DoGet ends")
            if live.waiting_to_open:
                out.append("  the server is unreachable now: the run waits for it")
        else:
            out.append(
                f"  connector flight, server {live.server}, stream {live.stream}, from offset "
                f"{live.start_offset}; "
                + (
                    f"stop_at_end: reads up to offset {live.end_offset} (the stream's end "
                    "now), then every writer ends"
                    if live.stop_at_end
                    and not (isinstance(live, FlightSource) and live.waiting_to_open)
                    else "stop_at_end: reads up to the stream's end when the run reaches the "
                    "server, then every writer ends"
                    if live.stop_at_end
                    else "runs until every writer it knows has sent end_of_input"
                )
            )
            out.append(
                f"  partitions: one per DoPut writer; known now ({len(stream.partitions)}): "
                + (", ".join(stream.partitions) or "none")
            )
            if isinstance(live, FlightSource) and live.waiting_to_open:
                out.append(
                    "  the server is unreachable now: the run waits for it (the stream's "
                    "writers are read then)"
                )
        out.append(f"  columns: {columns_text(stream.schema)}")
        if relation.time_column is not None:
            bound = _duration(relation.options.max_out_of_orderness)
            out.append(
                f"  watermark: W_p = max(max({relation.time_column}) - {bound}, the writer's "
                "watermark markers) per writer; W = min over writers neither ended nor idle, "
                "never decreasing; end_of_input sets W_p = +inf"
            )
        out.append(f"  options: {_options_text(relation.options)}")
        if not stream.consumers:
            out.append("  not read by any query")
        live.close()
    for name, table_source in runtime.table_sources.items():
        relation = plan.tables[name]
        out += ["", f"TABLE {name}{_at(relation.node)}"]
        out.append(
            f"  connector file, format {table_source.format}; static: read once, in full, "
            f"before the first source batch ({len(table_source.paths)} file(s))"
        )
        out.append(f"  columns: {columns_text(table_source.schema)}")
    out += explain_lines(plan.user_functions)  # CREATE FUNCTION … LANGUAGE python | wasm
    for node in runtime.nodes:
        out += ["", *_explain_query(node, plan.user_functions)]
    for name, slot in runtime.sinks.items():
        out += ["", f"SINK {name}{_at(slot.definition.node)}"]
        if slot.connector == "stdout":
            out.append(f"  connector stdout, format {slot.format}: rows printed as they arrive")
        elif slot.graph is not None:
            out.append(
                f"  connector falkordb -> {slot.target}: UNWIND … MERGE … SET upserts in "
                "batches (per batch as it arrives; with checkpoints: per epoch, under the "
                "sink's epoch marker)"
            )
        elif slot.iceberg is not None:
            out.append(
                f"  connector iceberg -> {slot.target}: one Iceberg commit per checkpoint "
                "epoch, with exactly-once markers (without checkpoints: every "
                "100,000 rows and at the end)"
            )
        elif slot.flight is not None and plan.run_options.checkpoints:
            out.append(
                f"  connector flight -> {slot.target}: checkpointed: each epoch's batches "
                "committed after its checkpoint, one DoPut per commit (up to 8 batches ahead "
                "of their PutResults), retried while the server is unreachable; a replay is "
                "matched against the writer's batches (exactly-once into flight-serve, "
                "at-least-once into other Flight servers); end_of_input when the run ends"
            )
        elif slot.flight is not None:
            out.append(
                f"  connector flight -> {slot.target}: one DoPut for the run, each batch "
                "acknowledged (durable) before the next; end_of_input when the run ends"
            )
        else:
            out.append(
                f"  connector file, format {slot.format} -> {slot.path} (one file per run, "
                "replaced when a run completes)"
            )
        if slot.schema is None:
            out.append("  nothing is inserted into it (no file is written)")
        else:
            out.append(f"  fed by: {'; '.join(slot.fed_by)}")
            out.append(f"  columns: {columns_text(slot.schema)}")
    return "\n".join(out) + "\n"

def _explain_query(node: Node, user_functions: Collection[str] = ()) -> list[str]:
    query = node.query
    out = [f"QUERY {query.index + 1}: {query.label}"]
    reads = query.input if query.late_of is None else f"{node.input.name} (late side output)"
    if query.function is not None:  # two stages: the plugin, then the per-row query
        plugin_stage = isinstance(node, PluginNode | TableFunctionNode)
        out[0] += f", stage {1 if plugin_stage else 2} of 2"
        results = "the function's" if query.function in user_functions else "the plugin's"
        reads = query.input if plugin_stage else f"{node.input.name} ({results} results)"
    out.append(f"  reads: {reads} ({len(node.input.partitions)} partition(s))")
    if isinstance(node, WindowNode):
        op, cfg = node.op, node.op.config
        out.append(f"  windowed aggregation, emit {cfg.emit}")
        out.append(f"  window assignment: {_describe_window(cfg.window, cfg.time_column)}")
        out.append(
            f"  watermark: W = min over input partitions of max({cfg.time_column}) - "
            f"{_duration(cfg.max_out_of_orderness)}; a window fires when W >= window_end + "
            f"allowed_lateness {_duration(cfg.allowed_lateness)}"
            + (
                ", first at W >= window_end, then once per step with late rows"
                if cfg.emit == "update"
                else ""
            )
        )
        out.append(
            f"  idle_timeout {_duration(cfg.idle_timeout)}, max_future_skew "
            f"{_duration(cfg.max_future_skew)}"
            + (
                ""
                if cfg.idle_watermark_advance is None
                else f", idle_watermark_advance {_duration(cfg.idle_watermark_advance)} "
                "(while every partition is idle, W = max(W, wall clock - it))"
            )
        )
        out.append(f"  keys: {', '.join(cfg.key_columns) or '(none)'}")
        if cfg.filter_sql is not None:
            out.append(f"  filter (before windowing): {cfg.filter_sql}")
        aggregates = [
            f"__a{i} = {a.func}({a.column or '*'})" for i, a in enumerate(cfg.aggregates)
        ]
        out.append(f"  aggregates: {', '.join(aggregates)}")
        if op.folded_state and isinstance(cfg.window, SessionWindow):
            out.append(
                "  state: folded on arrival (engine/fold_session.py): each batch's runs of a key "
                "are merged into its open sessions, fixed-width numpy state per session; a "
                "session's close reads its row, no SQL merge"
            )
        elif op.folded_state:
            out.append(
                "  state: folded on arrival (engine/fold.py): each batch is added into "
                "fixed-width numpy state per (pane, key slot); a window's close reads its "
                "slots, no SQL merge"
            )
        elif op.distinct_sets:
            out.append(
                "  state: folded on arrival (engine/fold.py, engine/distinct.py): fixed-width "
                "numpy state per (pane, key slot), and per count(DISTINCT) the pane's (key slot, "
                "value) pairs deduplicated by Arrow's hash group_by; a window's close reads its "
                "slots and counts its sets, no SQL merge"
            )
        else:
            merge = op.merge_sql
            out.append("  partial aggregation (DataFusion, over the buffered rows `buf`):")
            out.append(_indent(_partial_sql(merge)))
            out.append(
                "  merge aggregation (DataFusion, pane state `state` UNION ALL the partials):"
            )
            out.append(_indent(_pretty_sql(merge)))
        if cfg.projection_sql is not None:
            out.append("  final projection (DataFusion, over the fired windows `fired`):")
            out.append(_indent(_pretty_sql(cfg.projection_sql)))
        else:
            columns = cfg.columns or ()
            text = ", ".join(
                c.name if c.name == c.source else f"{c.name} := {c.source}" for c in columns
            )
            out.append(
                f"  final projection: {text or 'keys, window_start, window_end, aggregates'}"
            )
        if node.late is not None:
            readers = [n.query.label for n in node.late.consumers]
            out.append(f"  late side output: {node.late.name}, read by {'; '.join(readers)}")
        else:
            out.append("  late side output: not read (late rows are counted)")
    elif isinstance(node, PluginNode):
        fn = node.function
        out.append(
            f"  plugin {fn.plugin} (FUNCTION {fn.name}): every batch sent to an attached "
            f"instance, results in order; timeout {_duration(fn.timeout)}, max_in_flight "
            f"{fn.max_in_flight}"
        )
    elif isinstance(node, TableFunctionNode):
        spec = node.spec
        out.append(
            f"  FUNCTION {spec.name} (language {spec.language}, table, sha256 "
            f"{spec.digest[:12]}): called once per batch, in order; its batches go on"
        )
    else:
        assert isinstance(node, RowNode)
        tables = f", joined with {', '.join(query.tables)}" if query.tables else ""
        out.append(f"  per-row query (DataFusion, once per input batch{tables}):")
        out.append(_indent(_pretty_sql(node.sql)))
    out.append(f"  output: {columns_text(node.schema)}")
    if query.view is not None:
        out.append(f"  view {query.view}: a stream read by later queries")
    return out


def _at(node: exp.Expr) -> str:
    line, _ = position(node)
    return f"  (line {line})" if line is not None else ""


def _options_text(options: QueryOptions) -> str:
    return (
        f"allowed_lateness {_duration(options.allowed_lateness)}, emit {options.emit}, "
        f"idle_timeout {_duration(options.idle_timeout)}, max_future_skew "
        f"{_duration(options.max_future_skew)}, time_zone {options.time_zone or 'UTC'}, "
        f"max_out_of_orderness {_duration(options.max_out_of_orderness)}"
        + (
            ""
            if options.idle_watermark_advance is None
            else f", idle_watermark_advance {_duration(options.idle_watermark_advance)}"
        )
    )
