"""Windowed queries in SQL → :class:`~flight_serve.engine.operator.WindowAggregation`.

Accepted form (DESIGN §5), parsed with sqlglot, never with regular expressions::

    [CREATE SOURCE <name> ([<column defs>,] WATERMARK FOR <ts> AS <ts> - INTERVAL '<n>' <unit>)
        [WITH (allowed_lateness = '<duration>')];]
    SELECT <keys>, window_start, window_end, <aggregates or expressions over them>
    FROM TUMBLE(<name>, <ts>, <size> [, <offset>])
       | HOP(<name>, <ts>, <slide>, <size> [, <offset>])
       | SESSION(<name>, <ts>, <gap>)
    [WHERE <row filter>]
    GROUP BY <keys>, window_start, window_end
    [HAVING <condition over aggregates>]

Without ``CREATE SOURCE`` the watermark bound is 0 (input in event-time order). The argument order of
``HOP`` follows Flink and RisingWave: slide before size. ``SESSION`` windows are per key: the keys
are the GROUP BY columns other than the window bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pyarrow as pa
from sqlglot import exp

from flight_serve.engine.aggregate import AggregateCall
from flight_serve.engine.operator import OutputColumn, WindowAggregation, WindowOperator
from flight_serve.engine.windows import HoppingWindow, SessionWindow, TumblingWindow, WindowSpec
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.dialect import (
    duration_from_text,
    interval_to_timedelta,
    parse_statements,
    sql_error,
)

_AGGREGATES: dict[type[exp.Expression], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
    exp.Avg: "avg",
}
_WINDOW_BOUNDS = ("window_start", "window_end")


@dataclass(frozen=True)
class WindowQuery:
    """A parsed windowed query: which input it reads, and the aggregation to run over it.

    Attributes:
        source: the input name given as the table function's first argument.
        aggregation: the engine configuration; :meth:`build` makes the running operator.
    """

    source: str
    aggregation: WindowAggregation

    def build(self, input_schema: pa.Schema) -> WindowOperator:
        """The running operator for input batches of ``input_schema`` (see
        :meth:`WindowAggregation.build` for the errors)."""
        return self.aggregation.build(input_schema)


def _column_name(node: exp.Expression) -> str:
    if not isinstance(node, exp.Column):
        raise sql_error(f"expected a column name, got {node.sql()}", node)
    return node.name


def _window(func: exp.Anonymous) -> tuple[str, str, WindowSpec]:
    name = func.name.upper()
    args = list(func.expressions)
    arity = {"TUMBLE": (3, 4), "HOP": (4, 5), "SESSION": (3, 3)}
    if name not in arity:
        raise sql_error(
            f"unknown window table function {func.name}; use TUMBLE, HOP or SESSION", func
        )
    low, high = arity[name]
    if not low <= len(args) <= high:
        raise sql_error(f"{name} takes {low} to {high} arguments, got {len(args)}", func)
    source = _column_name(args[0])
    time_column = _column_name(args[1])
    durations = [interval_to_timedelta(a) for a in args[2:]]
    try:
        window: WindowSpec
        if name == "TUMBLE":
            window = TumblingWindow(durations[0], *(durations[1:2]))
        elif name == "HOP":
            window = HoppingWindow(
                size=durations[1], slide=durations[0], offset=(durations[2:3] or [timedelta(0)])[0]
            )
        else:
            window = SessionWindow(durations[0])
    except ValueError as exc:
        raise sql_error(str(exc), func) from exc
    return source, time_column, window


def _source_options(create: exp.Create) -> tuple[str, str | None, timedelta, timedelta]:
    schema = create.this
    table = schema.this if isinstance(schema, exp.Schema) else schema
    name = table.name
    time_column: str | None = None
    bound = timedelta(0)
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
    lateness = timedelta(0)
    props = create.args.get("properties")
    for prop in props.expressions if props is not None else []:
        key = (
            prop.name.lower()
            if not isinstance(prop.this, exp.Expression)
            else prop.this.name.lower()
        )
        value = prop.args.get("value")
        if key == "allowed_lateness" and value is not None:
            lateness = (
                interval_to_timedelta(value)
                if isinstance(value, exp.Interval)
                else duration_from_text(value.name, value)
            )
    return name, time_column, bound, lateness


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
    from_ = select.args.get("from_") or select.args.get("from")
    func = from_.this.this if from_ is not None and isinstance(from_.this, exp.Table) else None
    if not isinstance(func, exp.Anonymous):
        raise sql_error(
            "FROM must be a window table function: TUMBLE(...), HOP(...) or SESSION(...)",
            from_ if from_ is not None else select,
        )
    if select.args.get("joins"):
        raise sql_error("joins are not supported in a windowed query", select.args["joins"][0])
    source, time_column, window = _window(func)

    bound, lateness = timedelta(0), timedelta(0)
    for create in creates:
        if str(create.args.get("kind", "")).upper() != "SOURCE":
            raise sql_error("only CREATE SOURCE may precede the query", create)
        name, declared_ts, bound_i, lateness_i = _source_options(create)
        if name != source:
            raise sql_error(f"CREATE SOURCE {name} is not the query's input {source}", create)
        if declared_ts is not None and declared_ts != time_column:
            raise sql_error(
                f"the watermark is declared on {declared_ts} but the window uses {time_column}",
                create,
            )
        bound, lateness = bound_i, lateness_i

    group = select.args.get("group")
    group_names = [_column_name(g) for g in (group.expressions if group else [])]
    keys = tuple(n for n in group_names if n not in _WINDOW_BOUNDS)

    aggregates: list[AggregateCall] = []

    def register(node: exp.Expression, alias: str | None) -> str:
        func_name = _AGGREGATES[type(node)]
        arg = node.this
        if isinstance(arg, exp.Distinct):
            raise sql_error(f"{func_name}(DISTINCT ...) is not supported yet", node)
        column = None if isinstance(arg, exp.Star) else _column_name(arg)
        call = AggregateCall(func_name, column, alias or f"{func_name}({column or '*'})")
        for i, existing in enumerate(aggregates):
            if (existing.func, existing.column) == (call.func, call.column):
                return f"__a{i}"
        aggregates.append(call)
        return f"__a{len(aggregates) - 1}"

    columns: list[OutputColumn] = []
    simple = select.args.get("having") is None
    for item in select.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else None
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Column):
            name = inner.name
            if name not in keys and name not in _WINDOW_BOUNDS:
                raise sql_error(
                    f"column {name} must appear in GROUP BY or be used in an aggregate", inner
                )
            columns.append(OutputColumn(alias or name, name))
        elif type(inner) in _AGGREGATES:
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
        max_out_of_orderness=bound,
        allowed_lateness=lateness,
        filter_sql=filter_sql,
        columns=tuple(columns) if projection_sql is None else (),
        projection_sql=projection_sql,
    )
    return WindowQuery(source=source, aggregation=aggregation)


def _projection_sql(select: exp.Select, register: object) -> str:
    """Rewrite the SELECT list and HAVING over the fired rows: aggregates become ``__a<i>``."""
    assert callable(register)
    items = []
    for item in select.expressions:
        copy = item.copy()
        alias = copy.alias if isinstance(copy, exp.Alias) else None
        if alias is None and not isinstance(copy, exp.Column):
            alias = copy.sql()
            copy = exp.alias_(copy, alias, quoted=True)

        def rewrite(node: exp.Expression) -> exp.Expression:
            if type(node) in _AGGREGATES:
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
                if type(n) in _AGGREGATES
                else (exp.column(n.name, quoted=True) if isinstance(n, exp.Column) else n)
            )
        )
        where = f" WHERE {cond.sql(dialect='postgres')}"
    # fired rows arrive ordered by window_end, window_start, keys; a projection keeps that order
    return f"SELECT {', '.join(items)} FROM fired{where}"
