"""What a checkpoint's state belongs to: a pipeline's stateful operators, and whether another
version of the pipeline can resume from it (``flight-serve pipelines update``).

A checkpoint holds state of three kinds: each windowed query's operator snapshot (open panes,
buffered rows, watermarks), each source's offsets, and each sink's commit mark. A new version of
a pipeline may resume from a checkpoint of the old one when that state means the same thing to
it: :func:`stateful_operators` describes it as JSON-ready dicts (one per window operator: its
name, window, time column, GROUP BY keys, aggregates, emit mode and lateness; one per source: its
name and what it reads), the checkpoint records that description in its manifest, and
:func:`diff_stateful` compares two descriptions. The same two functions decide both the
update's compatibility check (old plan against new plan, before anything stops) and the resume
check (the checkpoint's manifest against the new plan), so the two cannot disagree.

Compatible (nothing of the description changes): a per-row query (its SELECT, WHERE, a user
function it calls, a new per-row query), a user function's code, a sink's options, a new sink,
run options (``SET checkpoint_interval`` …). Incompatible: a window's kind, size, slide, gap or
offset, its time column, keys, aggregates (function, column, alias, order), emit mode or allowed
lateness; a window operator removed or added; a source removed or reading another stream or
file. A window operator is matched by its name (its view, else the sink it inserts into), so
inserting a per-row view before it (which renumbers the queries) is compatible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from flight_serve.engine.aggregate import AggregateCall
from flight_serve.engine.windows import (
    CalendarWindow,
    CumulateWindow,
    HoppingWindow,
    SessionWindow,
    TumblingWindow,
    WindowSpec,
)
from flight_serve.types import timedelta_to_ns

if TYPE_CHECKING:
    from flight_serve.pipelines.pipeline import PipelinePlan, QueryDef

__all__ = ["diff_stateful", "operator_index_map", "stateful_operators"]

#: the source options that say what a source reads (its offsets are offsets of that)
_SOURCE_IDENTITY = ("connector", "stream", "path", "server", "table", "format")


def _duration(value: timedelta) -> str:
    """``1 min``, ``10 s``, ``250 ms``: the largest unit that divides the value."""
    ns = timedelta_to_ns(value)
    for unit, size in (
        ("day", 86_400 * 10**9),
        ("h", 3_600 * 10**9),
        ("min", 60 * 10**9),
        ("s", 10**9),
        ("ms", 10**6),
        ("us", 10**3),
    ):
        if ns != 0 and ns % size == 0:
            return f"{ns // size} {unit}"
    return f"{ns} ns"


def _window_text(spec: WindowSpec) -> str:
    if isinstance(spec, TumblingWindow):
        offset = f" offset {_duration(spec.offset)}" if spec.offset else ""
        return f"TUMBLE {_duration(spec.size)}{offset}"
    if isinstance(spec, HoppingWindow):
        offset = f" offset {_duration(spec.offset)}" if spec.offset else ""
        return f"HOP {_duration(spec.size)} every {_duration(spec.slide)}{offset}"
    if isinstance(spec, SessionWindow):
        return f"SESSION gap {_duration(spec.gap)}"
    if isinstance(spec, CumulateWindow):
        offset = f" offset {_duration(spec.offset)}" if spec.offset else ""
        return f"CUMULATE {_duration(spec.step)} up to {_duration(spec.max_size)}{offset}"
    assert isinstance(spec, CalendarWindow)
    return f"TUMBLE 1 {spec.unit} in {spec.time_zone}"


def _aggregate_text(call: AggregateCall) -> str:
    inner = "*" if call.column is None else call.column
    if call.distinct:
        inner = f"DISTINCT {inner}"
    if call.percentile is not None:
        inner = f"{inner}, {call.percentile!r}"
    text = f"{call.func}({inner})"
    if call.ignore_nulls:
        text += " IGNORE NULLS"
    return text if call.alias.lower() in (call.func, text.lower()) else f"{text} AS {call.alias}"


def _operator_name(query: QueryDef) -> str:
    return query.view if query.view is not None else f"INSERT INTO {query.sink}"


def stateful_operators(plan: PipelinePlan) -> dict[str, Any]:
    """The description of ``plan``'s checkpointed state (see the module docstring):
    ``{"windows": [{"index", "name", "window", "time_column", "keys", "aggregates", "emit",
    "allowed_lateness"}, …], "sources": {name: {option: value}}}``, JSON-ready (a manifest
    records it)."""
    windows: list[dict[str, Any]] = []
    for query in plan.queries:
        if query.window is None:
            continue
        agg = query.window.aggregation
        windows.append(
            {
                "index": query.index,
                "name": _operator_name(query),
                "window": _window_text(agg.window),
                "time_column": agg.time_column,
                "keys": list(agg.key_columns),
                "aggregates": [_aggregate_text(a) for a in agg.aggregates],
                "emit": agg.emit,
                "allowed_lateness": _duration(agg.allowed_lateness)
                if agg.allowed_lateness
                else "0",
            }
        )
    sources = {
        name: {
            key: relation.connector[key].text
            for key in _SOURCE_IDENTITY
            if key in relation.connector
        }
        for name, relation in plan.sources.items()
    }
    return {"windows": windows, "sources": sources}


def _title(window: Mapping[str, Any]) -> str:
    keys = window["keys"]
    by = f" by {', '.join(keys)}" if keys else ""
    return f"window operator {window['name']!r} ({window['window']}{by})"


def _listed(values: Sequence[Any]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


_FIELDS = (
    ("window", "windows differ"),
    ("time_column", "time columns differ"),
    ("keys", "keys differ"),
    ("aggregates", "aggregates differ"),
    ("emit", "emit modes differ"),
    ("allowed_lateness", "allowed lateness differs"),
)


def diff_stateful(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Why a checkpoint of the pipeline described by ``old`` cannot resume the one described by
    ``new`` (:func:`stateful_operators`), one line per difference naming the operator, e.g.
    ``window operator 'w' (TUMBLE 1 min by origin): aggregates differ: old [count(*),
    sum(dep_delay)] new [count(*)]``; empty when it can."""
    lines: list[str] = []
    old_windows = {w["name"]: w for w in old.get("windows", [])}
    new_windows = {w["name"]: w for w in new.get("windows", [])}
    for name, was in old_windows.items():
        now = new_windows.get(name)
        if now is None:
            lines.append(f"{_title(was)}: not in the new pipeline (its state would be lost)")
            continue
        for key, what in _FIELDS:
            if was.get(key) != now.get(key):
                shown = (
                    (_listed(was.get(key) or []), _listed(now.get(key) or []))
                    if isinstance(was.get(key), list) or isinstance(now.get(key), list)
                    else (str(was.get(key)), str(now.get(key)))
                )
                lines.append(f"{_title(was)}: {what}: old {shown[0]} new {shown[1]}")
    for name, now in new_windows.items():
        if name not in old_windows:
            lines.append(f"{_title(now)}: new in this version (the checkpoint has no state for it)")
    old_sources: Mapping[str, Any] = old.get("sources", {})
    new_sources: Mapping[str, Any] = new.get("sources", {})
    for name, was in old_sources.items():
        now = new_sources.get(name)
        if now is None:
            lines.append(f"source {name!r}: not in the new pipeline (its offsets would be lost)")
        elif now != was:
            changed = ", ".join(
                f"{k} {was.get(k)!r} -> {now.get(k)!r}"
                for k in sorted(set(was) | set(now))
                if was.get(k) != now.get(k)
            )
            lines.append(f"source {name!r}: reads something else: {changed}")
    for name in new_sources:
        if name not in old_sources:
            lines.append(f"source {name!r}: new in this version (the checkpoint has no offsets)")
    return lines


def operator_index_map(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[int, int]:
    """For compatible descriptions: each new window query's index -> the index its state has
    in the checkpoint described by ``old`` (matched by name)."""
    old_index = {w["name"]: int(w["index"]) for w in old.get("windows", [])}
    return {
        int(w["index"]): old_index[w["name"]]
        for w in new.get("windows", [])
        if w["name"] in old_index
    }
