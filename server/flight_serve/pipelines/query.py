"""Windowed queries in SQL → :class:`~flight_serve.engine.operator.WindowAggregation`.

Accepted form (DESIGN §5), parsed with sqlglot, never with regular expressions::

    [CREATE SOURCE <name> ([<column defs>,] WATERMARK FOR <ts> AS <ts> - INTERVAL '<n>' <unit>)
        [WITH (allowed_lateness = '<duration>')];]
    SELECT <keys>, window_start, window_end, <aggregates or expressions over them>
    FROM TUMBLE(<name>, <ts>, <size> [, <offset>] [, <option> => <value> ...])
       | HOP(<name>, <ts>, <slide>, <size> [, <offset>] [, <option> => <value> ...])
       | SESSION(<name>, <ts>, <gap> [, <option> => <value> ...])
       | CUMULATE(<name>, <ts>, <step>, <max_size> [, <offset>] [, <option> => <value> ...])
    [WHERE <row filter>]
    GROUP BY <keys>, window_start, window_end
    [HAVING <condition over aggregates>]

Without ``CREATE SOURCE`` the watermark bound is 0 (input in event-time order). The argument order of
``HOP`` follows Flink and RisingWave: slide before size. ``SESSION`` windows are per key: the keys
are the GROUP BY columns other than the window bounds. Named arguments (``emit => 'update'``) are
per-query options (:data:`QUERY_OPTION_NAMES`) that override the source's.
:func:`window_query_from_select` builds the same thing from an already parsed SELECT (the pipeline
planner's entry).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
from sqlglot import exp

from flight_serve.engine.aggregate import AggregateCall
from flight_serve.engine.operator import (
    OperatorSnapshot,
    OutputColumn,
    WindowAggregation,
    WindowOperator,
)
from flight_serve.engine.windows import (
    CalendarWindow,
    CumulateWindow,
    HoppingWindow,
    SessionWindow,
    TumblingWindow,
    WindowSpec,
)
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.dialect import (
    calendar_interval,
    duration_from_text,
    interval_to_timedelta,
    parse_statements,
    position,
    sql_error,
)

_AGGREGATES: dict[type[exp.Expression], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
    exp.Avg: "avg",
    exp.Stddev: "stddev",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",  # variance, var_samp
    exp.VariancePop: "var_pop",
    exp.FirstValue: "first_value",
    exp.LastValue: "last_value",
    exp.ApproxDistinct: "approx_distinct",  # approx_distinct, approx_count_distinct
}
# aggregates sqlglot parses as anonymous functions (DataFusion's names)
_ANONYMOUS_AGGREGATES = {"var": "var", "approx_percentile_cont": "approx_percentile_cont"}
_WINDOW_BOUNDS = ("window_start", "window_end")


def _aggregate_name(node: exp.Expression) -> str | None:
    """The engine name of the aggregate ``node`` calls (see :data:`_AGGREGATES`), or ``None``."""
    if isinstance(node, exp.IgnoreNulls | exp.RespectNulls | exp.WithinGroup):
        node = node.this
    if isinstance(node, exp.Anonymous):
        return _ANONYMOUS_AGGREGATES.get(node.name.lower())
    return _AGGREGATES.get(type(node))


def _fraction(node: exp.Expression) -> float:
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
    raise sql_error(f"the percentile must be a number literal, got {node.sql()}", node)


def _aggregate_call(node: exp.Expression, alias: str | None) -> AggregateCall:
    """The :class:`AggregateCall` of an aggregate ``node`` (``_aggregate_name(node)`` is set)."""
    func_name = _aggregate_name(node)
    assert func_name is not None
    ignore_nulls = isinstance(node, exp.IgnoreNulls)
    call = node.this if isinstance(node, exp.IgnoreNulls | exp.RespectNulls) else node
    distinct = False
    percentile: float | None = None
    column: str | None
    if isinstance(call, exp.WithinGroup):
        # approx_percentile_cont(q) WITHIN GROUP (ORDER BY x [ASC | DESC])
        args, order = call.this.expressions, call.expression
        if len(args) != 1 or not isinstance(order, exp.Order) or len(order.expressions) != 1:
            raise sql_error(f"{func_name}(q) WITHIN GROUP takes one ORDER BY column", node)
        ordered = order.expressions[0]
        column = _column_name(ordered.this)
        percentile = _fraction(args[0])
        if ordered.args.get("desc"):
            percentile = 1.0 - percentile
    elif isinstance(call, exp.Anonymous):
        args = list(call.expressions)
        arity = 2 if func_name == "approx_percentile_cont" else 1
        if len(args) != arity:
            usage = "(column, percentile)" if arity == 2 else "(column)"
            raise sql_error(f"{func_name} takes {usage}, got {len(args)} arguments", node)
        column = _column_name(args[0])
        if arity == 2:
            percentile = _fraction(args[1])
    else:
        arg = call.this
        if isinstance(arg, exp.Distinct):
            if len(arg.expressions) != 1:
                raise sql_error(f"{func_name}(DISTINCT ...) takes one column", node)
            distinct, arg = True, arg.expressions[0]
        if isinstance(arg, exp.Order):
            raise sql_error(f"{func_name} is ordered by event time; remove the ORDER BY", node)
        column = None if isinstance(arg, exp.Star) else _column_name(arg)
    if alias is None:
        inner = f"{'DISTINCT ' if distinct else ''}{column or '*'}"
        inner += f", {percentile!r}" if percentile is not None else ""
        alias = f"{func_name}({inner})" + (" IGNORE NULLS" if ignore_nulls else "")
    try:
        return AggregateCall(
            func_name,
            column,
            alias,
            distinct=distinct,
            ignore_nulls=ignore_nulls,
            percentile=percentile,
        )
    except ValueError as exc:
        raise sql_error(str(exc), node) from exc


def nearest(name: str, names: Sequence[str]) -> str | None:
    """The name in ``names`` closest to a misspelled ``name`` (difflib's ratio ≥ 0.6), or ``None``.

    >>> nearest("orign", ["dest", "origin", "sched_dep"])
    'origin'
    """
    close = difflib.get_close_matches(name, list(names), n=1)
    if not close:  # a different case only: "Origin" for "origin"
        close = [n for n in names if n.lower() == name.lower()][:1]
    return close[0] if close else None


def did_you_mean(name: str, names: Sequence[str]) -> str:
    """``"; did you mean <nearest>?"`` or ``""`` (see :func:`nearest`)."""
    close = nearest(name, names)
    return f"; did you mean {close}?" if close is not None else ""


def unknown_column(
    name: str, columns: Sequence[str], where: str, node: exp.Expr, what: str = "column"
) -> PipelineSQLError:
    """The error for a column ``name`` that the input ``where`` does not have: it says so, suggests
    the nearest name and lists the columns, pointing at ``node`` (``what``: the column's role,
    ``"event-time column"`` for a window function's time column)."""
    return sql_error(
        f"{what} {name} does not exist in {where}{did_you_mean(name, columns)} "
        f"(columns of {where}: {', '.join(columns)})",
        node,
    )


def check_window_columns(
    select: exp.Select, columns: Sequence[str], where: str = "the input"
) -> None:
    """Check that every column a windowed ``select`` names exists in its input.

    The columns looked at are those of the SELECT list, WHERE, GROUP BY and HAVING (a SELECT
    alias there is allowed); ``window_start`` / ``window_end`` are the window's own. The window
    function's time column is checked by :meth:`WindowQuery.check` (its type by the operator:
    an ``EventTimeError``).

    Raises:
        PipelineSQLError: the first unknown column, with the nearest existing name and the line
            and column of the name.
    """
    known = set(columns)
    aliases = {item.alias for item in select.expressions if isinstance(item, exp.Alias)}
    having = select.args.get("having")
    parts: list[exp.Expression | None] = [
        *select.expressions,
        select.args.get("where"),
        select.args.get("group"),
        having,
    ]
    for part in parts:
        if part is None:
            continue
        for column in part.find_all(exp.Column):
            if isinstance(column.this, exp.Star) or column.parent_select is not select:
                continue
            name = column.name
            if name in known or name in _WINDOW_BOUNDS or (part is having and name in aliases):
                continue
            raise unknown_column(name, columns, where, column)


def _check_grouped(select: exp.Select, keys: Sequence[str]) -> None:
    """A SELECT item that is a bare column must be a GROUP BY key or a window bound."""
    for item in select.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if (
            isinstance(inner, exp.Column)
            and not isinstance(inner.this, exp.Star)
            and inner.name not in keys
            and inner.name not in _WINDOW_BOUNDS
        ):
            raise sql_error(
                f"column {inner.name} must appear in GROUP BY or be used in an aggregate", inner
            )


@dataclass(frozen=True)
class WindowQuery:
    """A parsed windowed query: which input it reads, and the aggregation to run over it.

    Attributes:
        source: the input name given as the table function's first argument.
        aggregation: the engine configuration; :meth:`build` makes the running operator.
        select: the parsed SELECT, for checking its columns against the input's in
            :meth:`check` (``None``: not checked).
        warnings: what the query does that the user may not mean (a ``HOP`` whose slide is
            larger than its size), each with its line and column.
    """

    source: str
    aggregation: WindowAggregation
    select: exp.Select | None = field(default=None, compare=False, repr=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def check(self, columns: Sequence[str]) -> None:
        """Check the query against its input's ``columns``: every column named exists (the
        window function's time column too), and every bare SELECT column is a GROUP BY key.

        Raises:
            PipelineSQLError: an unknown column (with the nearest name), or a SELECT column that
                is neither grouped nor aggregated; with line and column.
        """
        if self.select is not None:
            check_window_columns(self.select, columns, self.source)
            time_column = self.aggregation.time_column
            func = window_table_function(self.select)
            if time_column not in columns and func is not None:
                args = [a for a in func.expressions if not isinstance(a, exp.Kwarg)]
                raise unknown_column(
                    time_column, columns, self.source, args[1], what="event-time column"
                )
            _check_grouped(self.select, self.aggregation.key_columns)

    def build(
        self,
        input_schema: pa.Schema,
        *,
        restore: OperatorSnapshot | None = None,
        clock_ns: Callable[[], int] | None = None,
        wall_clock_ns: Callable[[], int] | None = None,
    ) -> WindowOperator:
        """The running operator for input batches of ``input_schema``, resumed from ``restore``
        when given, with the processing-time clocks given (:meth:`check` first; see
        :meth:`WindowAggregation.build` for the clocks and the other errors)."""
        self.check(input_schema.names)
        return self.aggregation.build(
            input_schema, restore=restore, clock_ns=clock_ns, wall_clock_ns=wall_clock_ns
        )


def _column_name(node: exp.Expression) -> str:
    if not isinstance(node, exp.Column):
        raise sql_error(f"expected a column name, got {node.sql()}", node)
    return node.name


def _window(func: exp.Anonymous, time_zone: str | None = None) -> tuple[str, str, WindowSpec]:
    name = func.name.upper()
    args = [a for a in func.expressions if not isinstance(a, exp.Kwarg)]
    arity = {"TUMBLE": (3, 4), "HOP": (4, 5), "SESSION": (3, 3), "CUMULATE": (4, 5)}
    if name not in arity:
        raise sql_error(
            f"unknown window table function {func.name}; use TUMBLE, HOP, SESSION or CUMULATE",
            func,
        )
    low, high = arity[name]
    if not low <= len(args) <= high:
        raise sql_error(f"{name} takes {low} to {high} arguments, got {len(args)}", func)
    source = _column_name(args[0])
    time_column = _column_name(args[1])
    calendar = calendar_interval(args[2]) if name == "TUMBLE" and len(args) == 3 else None
    if calendar == "month" or (calendar is not None and time_zone is not None):
        try:
            return source, time_column, CalendarWindow(calendar, time_zone or "UTC")  # type: ignore[arg-type]
        except ValueError as exc:
            raise sql_error(str(exc), func) from exc
    durations = [interval_to_timedelta(a) for a in args[2:]]
    roles = {"TUMBLE": ("size",), "HOP": ("slide", "size"), "SESSION": ("gap",)}.get(
        name, ("step", "max_size")
    )
    for role, arg, duration in zip(roles, args[2:], durations, strict=False):  # offsets aside
        if duration <= timedelta(0):
            raise sql_error(f"{name} {role} must be a positive duration, got {arg.sql()}", arg)
    try:
        window: WindowSpec
        if name == "TUMBLE":
            window = TumblingWindow(durations[0], *(durations[1:2]))
        elif name == "CUMULATE":
            window = CumulateWindow(
                step=durations[0],
                max_size=durations[1],
                offset=(durations[2:3] or [timedelta(0)])[0],
            )
        elif name == "HOP":
            window = HoppingWindow(
                size=durations[1], slide=durations[0], offset=(durations[2:3] or [timedelta(0)])[0]
            )
        else:
            window = SessionWindow(durations[0])
    except ValueError as exc:
        raise sql_error(str(exc), func) from exc
    return source, time_column, window


@dataclass(frozen=True)
class QueryOptions:
    """Event-time options of a windowed query (DESIGN §4, §5); durations are timedeltas.

    Set on ``CREATE SOURCE … WITH (…)`` (durations as ``'5s'``, ``'15 minutes'`` or an INTERVAL):
    ``allowed_lateness``, ``emit`` (``final`` | ``update``), ``idle_timeout``,
    ``idle_watermark_advance`` (opt-in ``D``: while every partition is idle, ``W`` follows the
    wall clock ``D`` behind; needs ``idle_timeout``),
    ``max_future_skew``, ``time_zone`` (IANA name, for calendar windows), ``empty_windows``
    (``'true'`` | ``'false'``) with ``key_ttl`` (how long after its last row a key still gets
    empty windows; required with ``empty_windows``). The watermark bound comes from
    ``WATERMARK FOR ts AS ts - INTERVAL …``.
    """

    max_out_of_orderness: timedelta = timedelta(0)
    allowed_lateness: timedelta = timedelta(0)
    emit: Literal["final", "update"] = "final"
    idle_timeout: timedelta | None = None
    max_future_skew: timedelta | None = None
    time_zone: str | None = None
    idle_watermark_advance: timedelta | None = None
    empty_windows: bool = False
    key_ttl: timedelta | None = None


_DURATION_OPTIONS = (
    "allowed_lateness",
    "idle_timeout",
    "idle_watermark_advance",
    "max_future_skew",
    "key_ttl",
)
OPTION_NAMES = (*_DURATION_OPTIONS, "emit", "time_zone", "empty_windows")


def _empty_windows_ttl(options: QueryOptions, node: exp.Expression) -> timedelta | None:
    if not options.empty_windows:
        return None
    if options.key_ttl is None:
        raise sql_error("empty_windows = 'true' needs key_ttl (for example key_ttl = '1h')", node)
    return options.key_ttl


def _idle_advance(options: QueryOptions, node: exp.Expression) -> timedelta | None:
    if options.idle_watermark_advance is not None and options.idle_timeout is None:
        raise sql_error(
            "idle_watermark_advance needs idle_timeout: the watermark follows the wall clock "
            "only once every partition is idle (for example idle_timeout = '5s', "
            "idle_watermark_advance = '30s')",
            node,
        )
    return options.idle_watermark_advance


def option_duration(value: exp.Expression) -> timedelta:
    """An option value (``INTERVAL …`` or a string such as ``'5s'``) as a timedelta."""
    if isinstance(value, exp.Interval):
        return interval_to_timedelta(value)
    return duration_from_text(value.name, value)


def apply_option(
    options: QueryOptions, key: str, value: exp.Expression, node: exp.Expression
) -> QueryOptions:
    """``options`` with ``key`` set from the SQL ``value``; unknown keys are ignored (connector
    options share the WITH clause).

    Raises:
        PipelineSQLError: a bad value, naming the option.
    """
    if key == "allowed_lateness":
        return replace(options, allowed_lateness=option_duration(value))
    if key == "idle_timeout":
        return replace(options, idle_timeout=option_duration(value))
    if key == "idle_watermark_advance":
        return replace(options, idle_watermark_advance=option_duration(value))
    if key == "max_future_skew":
        return replace(options, max_future_skew=option_duration(value))
    if key == "key_ttl":
        return replace(options, key_ttl=option_duration(value))
    if key == "empty_windows":
        flag = value.name.lower()
        if flag not in ("true", "false"):
            raise sql_error(f"empty_windows must be 'true' or 'false', got {value.name!r}", node)
        return replace(options, empty_windows=flag == "true")
    if key == "emit":
        mode = value.name.lower()
        if mode == "final":
            return replace(options, emit="final")
        if mode == "update":
            return replace(options, emit="update")
        raise sql_error(f"emit must be 'final' or 'update', got {value.name!r}", node)
    if key == "time_zone":
        try:
            ZoneInfo(value.name)
        except (ZoneInfoNotFoundError, ValueError):
            raise sql_error(f"unknown time zone {value.name!r} (use an IANA name)", node) from None
        return replace(options, time_zone=value.name)
    return options


def _dotted(key: exp.Expression) -> str:
    """A ``WITH`` key as written: ``fields.k.kind`` (a dotted name, as RisingWave's ``datagen``
    options are written) whole, not only its last part."""
    if isinstance(key, exp.Dot):
        return f"{_dotted(key.this)}.{key.expression.name}"
    return str(key.name)


def property_items(create: exp.Create) -> list[tuple[str, exp.Expression, exp.Expression]]:
    """``(lower-case key, value, node)`` for each ``WITH (key = value)`` property
    (``format = …`` too, which sqlglot reads as a file-format property)."""
    props = create.args.get("properties")
    items: list[tuple[str, exp.Expression, exp.Expression]] = []
    for prop in props.expressions if props is not None else []:
        if isinstance(prop, exp.FileFormatProperty) and isinstance(prop.this, exp.Expression):
            items.append(("format", prop.this, prop))
            continue
        key = _dotted(prop.this) if isinstance(prop.this, exp.Expression) else str(prop.name)
        value = prop.args.get("value")
        if value is not None:
            items.append((key.lower(), value, prop))
    return items


def source_options(
    create: exp.Create, base: QueryOptions | None = None
) -> tuple[str, str | None, QueryOptions]:
    """``(name, watermark column or None, options)`` of a ``CREATE SOURCE``: ``base`` (the
    pipeline's options) overridden by the source's ``WITH`` options and its ``WATERMARK`` bound."""
    schema = create.this
    table = schema.this if isinstance(schema, exp.Schema) else schema
    name = table.name
    time_column: str | None = None
    options = base or QueryOptions()
    for item in schema.expressions if isinstance(schema, exp.Schema) else []:
        if isinstance(item, exp.WatermarkColumnConstraint):
            time_column = _column_name(item.this)
            rule = item.expression
            if isinstance(rule, exp.Sub) and _column_name(rule.this) == time_column:
                bound = interval_to_timedelta(rule.expression)
            elif isinstance(rule, exp.Column) and rule.name == time_column:
                bound = timedelta(0)
            else:
                raise sql_error(
                    "WATERMARK must be '<ts> AS <ts> - INTERVAL ...' or '<ts> AS <ts>'", item
                )
            options = replace(options, max_out_of_orderness=bound)
    for key, value, node in property_items(create):
        options = apply_option(options, key, value, node)
    return name, time_column, options


def parse_window_query(sql: str) -> WindowQuery:
    """Parse a windowed query (with an optional ``CREATE SOURCE``) into a :class:`WindowQuery`.

    Raises:
        PipelineSQLError: a syntax error, or a query outside the accepted form; the message names
            the line and column.

    >>> q = parse_window_query(
    ...     "SELECT k, window_start, window_end, count(*) AS n "
    ...     "FROM TUMBLE(input, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end")
    >>> q.source, q.aggregation.key_columns, q.aggregation.window.size
    ('input', ('k',), datetime.timedelta(seconds=10))
    """
    statements = parse_statements(sql)
    selects = [s for s in statements if isinstance(s, exp.Select)]
    creates = [s for s in statements if isinstance(s, exp.Create)]
    others = [s for s in statements if not isinstance(s, exp.Select | exp.Create)]
    if others:
        raise sql_error(f"unexpected statement: {others[0].sql()[:60]}", others[0])
    if not statements:
        raise PipelineSQLError("empty query: expected a SELECT over TUMBLE, HOP or SESSION")
    if len(selects) != 1:
        where = selects[1] if len(selects) > 1 else statements[0]
        raise sql_error(f"expected exactly one SELECT, got {len(selects)}", where)
    select = selects[0]
    func = window_table_function(select)
    options = QueryOptions()
    source_name = _column_name(func.expressions[0]) if func is not None and func.expressions else ""
    declared_ts: str | None = None
    declared: list[str] | None = None
    for create in creates:
        if str(create.args.get("kind", "")).upper() != "SOURCE":
            raise sql_error("only CREATE SOURCE may precede the query", create)
        name, declared_ts, options = source_options(create)
        if name != source_name:
            raise sql_error(f"CREATE SOURCE {name} is not the query's input {source_name}", create)
        schema = create.this
        items = schema.expressions if isinstance(schema, exp.Schema) else []
        declared = [c.name for c in items if isinstance(c, exp.ColumnDef)] or None
        if declared is not None and declared_ts is not None and declared_ts not in declared:
            watermark = next(i for i in items if isinstance(i, exp.WatermarkColumnConstraint))
            raise no_time_column(declared_ts, declared, f"source {name}", watermark.this)
    return window_query_from_select(
        select, options, declared_time_column=declared_ts, input_columns=declared
    )


def no_time_column(
    name: str, columns: Sequence[str], where: str, node: exp.Expr
) -> PipelineSQLError:
    """The error for ``WATERMARK FOR <name>`` when ``where`` has no column ``name``: it suggests
    the nearest column and lists them, pointing at ``node`` (the name after ``WATERMARK FOR``)."""
    return sql_error(
        f"WATERMARK FOR {name}: no column {name} in {where}{did_you_mean(name, columns)} "
        f"(columns: {', '.join(columns)}); name the event-time column, a timestamp",
        node,
    )


#: Named arguments a window table function accepts (``TUMBLE(…, emit => 'update')``): the
#: per-query options, overriding the source's and the pipeline's.
QUERY_OPTION_NAMES = (*OPTION_NAMES, "max_out_of_orderness")


def window_table_function(select: exp.Select) -> exp.Anonymous | None:
    """The ``TUMBLE``/``HOP``/``SESSION``/``CUMULATE`` call in ``select``'s FROM, if it has one."""
    from_ = select.args.get("from_") or select.args.get("from")
    func = from_.this.this if from_ is not None and isinstance(from_.this, exp.Table) else None
    return func if isinstance(func, exp.Anonymous) else None


def query_options(func: exp.Anonymous, options: QueryOptions) -> QueryOptions:
    """``options`` overridden by the named arguments of the window table function ``func``.

    Raises:
        PipelineSQLError: an unknown option name or a bad value, pointing at it.
    """
    for arg in func.expressions:
        if not isinstance(arg, exp.Kwarg):
            continue
        key, value = arg.this.name.lower(), arg.expression
        if key == "max_out_of_orderness":
            options = replace(options, max_out_of_orderness=option_duration(value))
        elif key in OPTION_NAMES:
            options = apply_option(options, key, value, arg)
        else:
            raise sql_error(
                f"unknown option {key!r} of {func.name.upper()}"
                f"{did_you_mean(key, QUERY_OPTION_NAMES)}; options: "
                f"{', '.join(QUERY_OPTION_NAMES)}",
                arg,
            )
    return options


def window_query_from_select(
    select: exp.Select,
    options: QueryOptions | None = None,
    *,
    declared_time_column: str | None = None,
    input_columns: Sequence[str] | None = None,
) -> WindowQuery:
    """Build the :class:`WindowQuery` of a parsed SELECT over a window table function.

    Args:
        select: the parsed query (see the module docstring for the accepted form).
        options: the defaults from the pipeline and the source (the source's ``WATERMARK`` bound
            is ``options.max_out_of_orderness``); named arguments of the window table function
            (``TUMBLE(src, ts, INTERVAL '10' SECOND, allowed_lateness => INTERVAL '5' SECOND)``)
            override them for this query.
        declared_time_column: the column the input's ``WATERMARK FOR`` names, if any; the window
            must use it.
        input_columns: the input's columns when they are known now (declared in ``CREATE
            SOURCE``): the query is checked against them (:meth:`WindowQuery.check`) here;
            otherwise :meth:`WindowQuery.build` checks it against the input schema.

    Raises:
        PipelineSQLError: a query outside the accepted form, pointing at the offending token.
    """
    func = window_table_function(select)
    if func is None:
        from_ = select.args.get("from_") or select.args.get("from")
        raise sql_error(
            "FROM must be a window table function: TUMBLE(...), HOP(...), SESSION(...) or "
            "CUMULATE(...)",
            from_ if from_ is not None else select,
        )
    if select.args.get("joins"):
        raise sql_error("joins are not supported in a windowed query", select.args["joins"][0])
    given = options or QueryOptions()
    options = query_options(func, given)
    source, time_column, window = _window(func, options.time_zone)
    if input_columns is not None:
        check_window_columns(select, input_columns, source)
    if options.time_zone != given.time_zone and not isinstance(window, CalendarWindow):
        raise sql_error(
            "time_zone applies to TUMBLE with INTERVAL '1' DAY, WEEK or MONTH only", func
        )
    if declared_time_column is not None and declared_time_column != time_column:
        raise sql_error(
            f"the watermark is declared on {declared_time_column} but the window uses "
            f"{time_column}: write {func.name.upper()}({source}, {declared_time_column}, …)",
            func.expressions[1],
        )

    group = select.args.get("group")
    group_names = [_column_name(g) for g in (group.expressions if group else [])]
    keys = tuple(n for n in group_names if n not in _WINDOW_BOUNDS)
    if input_columns is not None:
        _check_grouped(select, keys)

    aggregates: list[AggregateCall] = []

    def register(node: exp.Expression, alias: str | None) -> str:
        call = _aggregate_call(node, alias)
        for i, existing in enumerate(aggregates):
            if existing.key == call.key:
                return f"__a{i}"
        aggregates.append(call)
        return f"__a{len(aggregates) - 1}"

    columns: list[OutputColumn] = []
    simple = select.args.get("having") is None
    for item in select.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else None
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Column):
            # a column that is not a key is refused by check(), once the input columns are known
            # (a misspelled name must say that it does not exist, not that it is not grouped)
            columns.append(OutputColumn(alias or inner.name, inner.name))
        elif _aggregate_name(inner) is not None:
            source_col = register(inner, alias)
            columns.append(OutputColumn(alias or aggregates[int(source_col[3:])].alias, source_col))
        else:
            simple = False
    projection_sql = None
    if not simple:
        projection_sql = _projection_sql(select, register)
    where_clause = select.args.get("where")
    filter_sql = where_clause.this.sql(dialect="postgres") if where_clause is not None else None
    if not aggregates and projection_sql is None:
        raise sql_error("a windowed query needs at least one aggregate", select)
    aggregation = WindowAggregation(
        window=window,
        time_column=time_column,
        key_columns=keys,
        aggregates=tuple(aggregates),
        max_out_of_orderness=options.max_out_of_orderness,
        allowed_lateness=options.allowed_lateness,
        emit=options.emit,
        idle_timeout=options.idle_timeout,
        idle_watermark_advance=_idle_advance(options, select),
        max_future_skew=options.max_future_skew,
        empty_windows_key_ttl=_empty_windows_ttl(options, select),
        filter_sql=filter_sql,
        columns=tuple(columns) if projection_sql is None else (),
        projection_sql=projection_sql,
    )
    return WindowQuery(
        source=source, aggregation=aggregation, select=select, warnings=_hop_warnings(func, window)
    )


def _hop_warnings(func: exp.Anonymous, window: WindowSpec) -> tuple[str, ...]:
    """A ``HOP`` whose slide is larger than its size leaves gaps: rows between two windows are in
    none, and are dropped (they are not late). Flink and RisingWave take the slide first, so the
    warning shows the call with the two swapped."""
    if not isinstance(window, HoppingWindow) or window.slide <= window.size:
        return ()
    args = [a for a in func.expressions if not isinstance(a, exp.Kwarg)]
    swapped = [*args[:2], args[3], args[2], *args[4:]]
    call = f"{func.name.upper()}({', '.join(a.sql() for a in swapped)})"
    line, col = position(func)
    where = f" (line {line}, column {col})" if line is not None else ""
    return (
        f"HOP slide {args[2].sql()} is larger than its size {args[3].sql()}: the rows between "
        f"two windows fall in none and are dropped; HOP takes the slide first, then the size — "
        f"for {args[2].sql()} windows every {args[3].sql()} write {call}{where}",
    )


def _projection_sql(
    select: exp.Select, register: Callable[[exp.Expression, str | None], str]
) -> str:
    """Rewrite the SELECT list and HAVING over the fired rows: aggregates become ``__a<i>``."""
    items = []
    for item in select.expressions:
        copy = item.copy()
        alias = copy.alias if isinstance(copy, exp.Alias) else None
        if alias is None and not isinstance(copy, exp.Column):
            alias = copy.sql()
            copy = exp.alias_(copy, alias, quoted=True)

        def rewrite(node: exp.Expression) -> exp.Expression:
            if _aggregate_name(node) is not None:
                return exp.column(register(node, None), quoted=True)
            if isinstance(node, exp.Column):
                return exp.column(node.name, quoted=True)
            return node

        items.append(copy.transform(rewrite).sql(dialect="postgres"))
    having = select.args.get("having")
    where = ""
    if having is not None:
        cond = having.this.copy().transform(
            lambda n: (
                exp.column(register(n, None), quoted=True)
                if _aggregate_name(n) is not None
                else (exp.column(n.name, quoted=True) if isinstance(n, exp.Column) else n)
            )
        )
        where = f" WHERE {cond.sql(dialect='postgres')}"
    # fired rows arrive ordered by window_end, window_start, keys; a projection keeps that order
    return f"SELECT {', '.join(items)} FROM fired{where}"
