"""Pipeline SQL files → a :class:`PipelinePlan` (DESIGN §5; the grammar is in docs/pipelines.md).

A pipeline file is a list of ``;``-separated statements, parsed with sqlglot (never with regular
expressions)::

    SET <option> = <value>;                                   -- pipeline options, first
    CREATE SOURCE <name> [(<column> <type>, …, WATERMARK FOR <ts> AS <ts> - INTERVAL …)]
        WITH (connector = 'file', path = '…', …);             -- a stream
    CREATE TABLE <name> [(<column> <type>, …)] WITH (connector = 'file', …);  -- static, read once
    CREATE SINK <name> [AS SELECT … | FROM <view>] WITH (connector = 'stdout' | 'file', …);
    CREATE VIEW <name> AS SELECT …;                           -- an intermediate stage
    CREATE FUNCTION <f>() RETURNS TABLE (<column> <type>, …)
        WITH (connector = 'plugin', …);                       -- an attached plugin (server only)
    INSERT INTO <sink> SELECT …;

Queries are windowed (``FROM TUMBLE/HOP/SESSION/CUMULATE(<input>, …)``, see
:mod:`flight_serve.pipelines.query`) or per-row (filters, projections, joins with static tables,
run per batch). ``LATE(<name>)`` in a FROM clause is the late side output of the windowed query that
reads ``<name>`` (or defines the view ``<name>``).

Names are case-sensitive, as written. A statement may only name sources, tables, views and sinks
declared above it, so a pipeline is always a DAG.

Planning opens no file but the code files of ``CREATE FUNCTION … USING '<file>'`` (the plan
carries their bytes; :mod:`flight_serve.pipelines.functions`): connector options are kept as written and checked when the pipeline is built
(:mod:`flight_serve.pipelines.runtime`). Every error is a
:class:`~flight_serve.errors.PipelineSQLError` naming the line and column of the offending token.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from sqlglot import exp

from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.dialect import key_position, parse_statements, position, sql_error
from flight_serve.pipelines.query import (
    OPTION_NAMES,
    QUERY_OPTION_NAMES,
    QueryOptions,
    WindowQuery,
    apply_option,
    did_you_mean,
    nearest,
    no_time_column,
    option_duration,
    property_items,
    source_options,
    window_query_from_select,
    window_table_function,
)
from flight_serve.pipelines.run_options import RUN_OPTION_NAMES, RunOptions, apply_run_option

if TYPE_CHECKING:  # cold start: pipelines.functions (and functions.*) load with CREATE FUNCTION
    from flight_serve.functions.base import FunctionSpec

__all__ = [
    "SETTING_NAMES",
    "FunctionDef",
    "Option",
    "PipelinePlan",
    "QueryDef",
    "RelationDef",
    "SinkDef",
    "arrow_type",
    "parse_pipeline",
    "read_pipeline_file",
]

#: Options of ``SET <option> = <value>`` (the pipeline's defaults).
SETTING_NAMES = (*QUERY_OPTION_NAMES, "batch_rows", *RUN_OPTION_NAMES)
_WINDOW_BOUNDS = ("window_start", "window_end")


@dataclass(frozen=True)
class Option:
    """One ``key = value`` of a ``WITH (…)`` clause, as written.

    Attributes:
        key: the option name, lower-case.
        value: the value's SQL node (a string or number literal, an INTERVAL, a name).
        node: the whole ``key = value`` node, for error positions.
    """

    key: str
    value: exp.Expression
    node: exp.Expression
    sql: str | None = field(default=None, repr=False, compare=False)  # the pipeline text

    @property
    def text(self) -> str:
        """The value as text: a literal's content, a name, or the SQL of anything else."""
        value = self.value
        if isinstance(value, exp.Literal | exp.Identifier | exp.Var | exp.Column):
            return str(value.name)
        if isinstance(value, exp.Boolean):
            return "true" if value.this else "false"
        return str(value.sql())

    def error(self, message: str) -> PipelineSQLError:
        """A :class:`PipelineSQLError` pointing at this option's value."""
        return sql_error(f"option {self.key}: {message}", self.value)

    def unknown(self, what: str, known: Sequence[str]) -> PipelineSQLError:
        """The error for this option's key when ``what`` (e.g. ``the file connector of SOURCE
        s``) has no such option: it suggests the nearest known key and lists them, pointing at
        the key."""
        close = nearest(self.key, known)
        hint = f" (did you mean {close}?)" if close is not None else ""
        return self.key_error(
            f"option {self.key}: unknown option of {what}{hint}; its options: {', '.join(known)}"
        )

    def key_error(self, message: str) -> PipelineSQLError:
        """A :class:`PipelineSQLError` pointing at this option's key (at its value when the
        key's position cannot be found)."""
        key = self.node.this
        if isinstance(key, exp.Expression) and position(key)[0] is not None:
            return sql_error(message, key)
        at = key_position(self.sql, self.value, self.key) if self.sql is not None else None
        return PipelineSQLError(message, *at) if at is not None else sql_error(message, self.value)


def _missing_connector(kind: str, name: str, options: Sequence[Option], node: exp.Expr) -> None:
    """``CREATE <kind> <name>`` without a ``connector`` option: name a misspelled one
    (``conector``), else say that it is needed."""
    for option in options:
        if nearest(option.key, ["connector"]) is not None:
            raise option.key_error(
                f"unknown option {option.key} of CREATE {kind} {name}; did you mean connector? "
                f"(CREATE {kind} {name} needs WITH (connector = …))"
            )
    raise sql_error(f"CREATE {kind} {name} needs WITH (connector = …)", node)


@dataclass(frozen=True)
class RelationDef:
    """A ``CREATE SOURCE`` (a stream read batch by batch) or ``CREATE TABLE`` (static, read once).

    Attributes:
        kind: ``source`` or ``table``.
        name: the declared name.
        node: the statement.
        columns: the declared columns as an Arrow schema, or ``None`` to infer them from the data.
        time_column: the ``WATERMARK FOR`` column, or ``None`` (a stream without a watermark rule).
        options: event-time options of queries reading it: the pipeline's, overridden by the
            source's ``WITH`` options; ``max_out_of_orderness`` is the ``WATERMARK`` bound.
        connector: the other ``WITH`` options (``connector`` included), by key.
    """

    kind: Literal["source", "table"]
    name: str
    node: exp.Create
    columns: pa.Schema | None
    time_column: str | None
    options: QueryOptions
    connector: dict[str, Option]

    def no_time_column(self, columns: Sequence[str], where: str) -> PipelineSQLError:
        """The error for a ``WATERMARK FOR`` column that ``where`` (the files, the stream) does
        not have, pointing at the name after ``WATERMARK FOR``."""
        schema = self.node.this
        items = schema.expressions if isinstance(schema, exp.Schema) else []
        watermark = next((i for i in items if isinstance(i, exp.WatermarkColumnConstraint)), None)
        node = watermark.this if watermark is not None else self.node.this
        return no_time_column(self.time_column or "", columns, where, node)


@dataclass(frozen=True)
class SinkDef:
    """A ``CREATE SINK``: where rows inserted into ``name`` go (``connector`` options by key)."""

    name: str
    node: exp.Create
    connector: dict[str, Option]


@dataclass(frozen=True)
class FunctionDef:
    """A ``CREATE FUNCTION <f>() RETURNS TABLE (…) WITH (connector = 'plugin', …)``: an
    out-of-process plugin as a table function; ``SELECT … FROM <f>(<stream>)`` sends every batch
    of the stream through it (docs/pipelines.md, "Plugins").

    Attributes:
        name: the function name (as written).
        node: the statement.
        returns: the columns of its results (every result batch must have exactly these).
        plugin: the plugin name instances attach under (default: the function name).
        timeout: per-batch timeout (a batch unanswered this long is sent again).
        max_in_flight: batches of one query sent and not yet emitted before the query waits.
    """

    name: str
    node: exp.Create
    returns: pa.Schema
    plugin: str
    timeout: timedelta
    max_in_flight: int


@dataclass(frozen=True)
class QueryDef:
    """One continuous query: a ``CREATE VIEW`` or an ``INSERT INTO`` a sink.

    Attributes:
        index: position among the pipeline's queries (0-based, file order).
        node: the statement.
        select: the query.
        view: the view it defines, or ``None``.
        sink: the sink it inserts into, or ``None``.
        input: the stream it reads: a source or view name, or ``LATE(<name>)``.
        tables: the static tables it joins (per-row queries only).
        window: the windowed aggregation, or ``None`` for a per-row query.
        late_of: for an ``input`` of the form ``LATE(x)``: the index of the windowed query whose
            late side output it reads.
        function: for ``FROM <f>(<stream>)``: the plugin function (or the user table function,
            ``PipelinePlan.user_functions``) the stream goes through first.
    """

    index: int
    node: exp.Expression
    select: exp.Select
    view: str | None
    sink: str | None
    input: str
    tables: tuple[str, ...] = ()
    window: WindowQuery | None = None
    late_of: int | None = None
    function: str | None = None

    @property
    def label(self) -> str:
        """``view <name>`` or ``INSERT INTO <sink> (line n)``."""
        if self.view is not None:
            return f"view {self.view}"
        line, _ = position(self.node)
        return f"INSERT INTO {self.sink}" + (f" (line {line})" if line is not None else "")


@dataclass(frozen=True)
class PipelinePlan:
    """A parsed pipeline (see the module docstring). :func:`parse_pipeline` makes it.

    Attributes:
        text: the SQL text.
        path: the file it was read from, if any.
        base_dir: where relative input paths start (the file's directory, else the working
            directory).
        settings: the ``SET`` options (defaults of every query).
        batch_rows: ``SET batch_rows``, the default rows per batch of file sources.
        sources, tables, sinks: by name.
        queries: views and inserts, in file order.
        run_options: how it runs: checkpoints, failures (``SET checkpoint_interval`` …; see
            :mod:`flight_serve.pipelines.run_options`).
        warnings: what the pipeline does that its author may not mean, each with its line and
            column (a ``HOP`` with the slide larger than the size drops the rows between
            windows); ``flight-serve run``, ``explain`` and ``submit`` print them.
    """

    text: str
    path: Path | None
    base_dir: Path
    settings: QueryOptions
    batch_rows: int | None
    sources: dict[str, RelationDef]
    tables: dict[str, RelationDef]
    sinks: dict[str, SinkDef]
    queries: tuple[QueryDef, ...]
    views: dict[str, int] = field(default_factory=dict)
    run_options: RunOptions = field(default_factory=RunOptions)
    functions: dict[str, FunctionDef] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    #: ``CREATE FUNCTION … LANGUAGE python | wasm`` (:mod:`flight_serve.pipelines.functions`)
    user_functions: dict[str, FunctionSpec] = field(default_factory=dict)
    #: the ``USING '<file>'`` files of those functions, by path as written -> their bytes
    function_files: dict[str, bytes] = field(default_factory=dict)


# --- types ------------------------------------------------------------------------------------

_T = exp.DataType.Type
_SIMPLE_TYPES: dict[object, pa.DataType] = {
    _T.BOOLEAN: pa.bool_(),
    _T.TINYINT: pa.int8(),
    _T.SMALLINT: pa.int16(),
    _T.INT: pa.int32(),
    _T.BIGINT: pa.int64(),
    _T.UTINYINT: pa.uint8(),
    _T.USMALLINT: pa.uint16(),
    _T.UINT: pa.uint32(),
    _T.UBIGINT: pa.uint64(),
    _T.FLOAT: pa.float32(),
    _T.DOUBLE: pa.float64(),
    _T.VARCHAR: pa.string(),
    _T.CHAR: pa.string(),
    _T.NVARCHAR: pa.string(),
    _T.NCHAR: pa.string(),
    _T.BPCHAR: pa.string(),
    _T.TEXT: pa.string(),
    _T.VARBINARY: pa.binary(),
    _T.BINARY: pa.binary(),
    _T.DATE: pa.date32(),
}


def _timestamp_unit(kind: exp.DataType) -> Literal["s", "ms", "us", "ns"]:
    params = kind.expressions
    if not params:
        return "us"
    digits = int(params[0].this.name) if isinstance(params[0].this, exp.Literal) else 6
    if digits == 0:
        return "s"
    if digits <= 3:
        return "ms"
    return "us" if digits <= 6 else "ns"


def arrow_type(kind: exp.DataType, node: exp.Expr | None = None) -> pa.DataType:
    """The Arrow type of a SQL column type.

    ``TIMESTAMP(p)`` is a naive timestamp (UTC) with unit ``s`` for p = 0, ``ms`` for p ≤ 3, ``us``
    for p ≤ 6 (and for plain ``TIMESTAMP``), ``ns`` above; ``TIMESTAMPTZ`` /
    ``TIMESTAMP WITH TIME ZONE`` is the same with time zone UTC. ``DECIMAL(p, s)`` is decimal128.

    Raises:
        PipelineSQLError: a type without an Arrow equivalent here, pointing at ``node`` (the
            column definition) or the type.

    >>> import sqlglot
    >>> arrow_type(sqlglot.parse_one("CAST(x AS TIMESTAMP(0))").to)
    TimestampType(timestamp[s])
    """
    if kind.this in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[kind.this]
    if kind.this in (_T.TIMESTAMP, _T.DATETIME, _T.TIMESTAMPNTZ):
        return pa.timestamp(_timestamp_unit(kind))
    if kind.this in (_T.TIMESTAMPTZ, _T.TIMESTAMPLTZ):
        return pa.timestamp(_timestamp_unit(kind), tz="UTC")
    if kind.this == _T.DECIMAL:
        params = [int(p.this.name) for p in kind.expressions]
        precision, scale = (params + [38, 0][len(params) :])[:2] if params else (38, 9)
        return pa.decimal128(precision, scale)
    raise sql_error(
        f"column type {kind.sql()} is not supported in a pipeline",
        node if node is not None else kind,
    )


# --- statements -------------------------------------------------------------------------------


def _name(node: exp.Expression) -> str:
    """The name of a ``Table`` (or a ``Schema`` wrapping one)."""
    table = node.this if isinstance(node, exp.Schema) else node
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise sql_error(f"expected a name, got {node.sql()}", node)
    if table.args.get("db") or table.args.get("catalog"):
        raise sql_error(f"qualified names are not supported: {table.sql()}", table)
    return str(table.this.name)


def _options(create: exp.Create, sql: str | None = None) -> list[Option]:
    items = []
    seen: set[str] = set()
    props = create.args.get("properties")
    for prop in props.expressions if props is not None else []:
        if not isinstance(prop, exp.Property | exp.FileFormatProperty):
            raise sql_error(f"unsupported WITH option: {prop.sql()}", prop)
    for key, value, node in property_items(create):
        if key in seen:
            raise sql_error(f"option {key} is given twice", node)
        seen.add(key)
        items.append(Option(key, value, node, sql))
    return items


def _columns(create: exp.Create) -> pa.Schema | None:
    schema = create.this
    if not isinstance(schema, exp.Schema):
        return None
    fields = []
    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            kind = item.args.get("kind")
            if not isinstance(kind, exp.DataType):
                raise sql_error(f"column {item.name} needs a type", item)
            fields.append(pa.field(item.name, arrow_type(kind, item)))
        elif not isinstance(item, exp.WatermarkColumnConstraint):
            raise sql_error(f"unsupported column definition: {item.sql()}", item)
    names = [f.name for f in fields]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise sql_error(f"column {duplicate} is declared twice", schema)
    return pa.schema(fields) if fields else None


def _setting(
    item: exp.Expression, settings: QueryOptions, batch_rows: int | None
) -> tuple[QueryOptions, int | None]:
    assign = item.this if isinstance(item, exp.SetItem) else item
    if not isinstance(assign, exp.EQ) or not isinstance(assign.this, exp.Column | exp.Var):
        raise sql_error("write SET <option> = <value>", item)
    key, value = assign.this.name.lower(), assign.expression
    if key == "batch_rows":
        return settings, _positive_int(Option(key, value, item))
    if key == "max_out_of_orderness":
        return replace(settings, max_out_of_orderness=option_duration(value)), batch_rows
    if key in OPTION_NAMES:
        return apply_option(settings, key, value, item), batch_rows
    raise sql_error(
        f"unknown option {key!r}{did_you_mean(key, SETTING_NAMES)}; SET takes "
        f"{', '.join(SETTING_NAMES)}",
        assign.this,
    )


def _positive_int(option: Option) -> int:
    try:
        number = int(option.text)
    except ValueError:
        raise option.error(f"expected a whole number, got {option.text!r}") from None
    if number < 1:
        raise option.error(f"must be at least 1, got {number}")
    return number


def _keeps_column(select: exp.Select, column: str) -> bool:
    """Whether a per-row query's output has ``column`` (``*`` or an item of that name)."""
    return any(
        isinstance(item, exp.Star)
        or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
        or item.alias_or_name == column
        for item in select.expressions
    )


def _late_target(node: exp.Anonymous) -> str:
    if len(node.expressions) != 1 or not isinstance(node.expressions[0], exp.Column):
        raise sql_error("write LATE(<source or view>)", node)
    return str(node.expressions[0].name)


def _check_per_row(select: exp.Select) -> None:
    for key, what in (
        ("group", "GROUP BY"),
        ("having", "HAVING"),
        ("order", "ORDER BY"),
        ("limit", "LIMIT"),
        ("distinct", "DISTINCT"),
    ):
        node = select.args.get(key)
        if node:
            raise sql_error(
                f"{what} needs a window in a streaming query: read the input through "
                "TUMBLE(...), HOP(...), SESSION(...) or CUMULATE(...)",
                node,
            )
    for node in select.walk():
        if isinstance(node, exp.AggFunc | exp.Window) and node.parent_select is select:
            raise sql_error(
                f"{node.sql()[:40]} needs a window in a streaming query: read the input through "
                "TUMBLE(...), HOP(...), SESSION(...) or CUMULATE(...)",
                node,
            )


class _Planner:
    def __init__(
        self,
        text: str,
        path: Path | None,
        base_dir: Path,
        function_files: Mapping[str, bytes] | None = None,
    ) -> None:
        self.text = text
        self.function_files = dict(function_files or {})
        self.path = path
        self.base_dir = base_dir
        self.settings = QueryOptions()
        self.batch_rows: int | None = None
        self.run_options = RunOptions()
        self.sources: dict[str, RelationDef] = {}
        self.tables: dict[str, RelationDef] = {}
        self.sinks: dict[str, SinkDef] = {}
        self.views: dict[str, int] = {}
        self.queries: list[QueryDef] = []
        # per stream name: (options, watermark column, output of an update-mode query)
        self.streams: dict[str, tuple[QueryOptions, str | None, bool]] = {}
        self.late_refs: list[tuple[int, str, exp.Expression]] = []
        self.functions: dict[str, FunctionDef] = {}
        self.user_functions: dict[str, FunctionSpec] = {}
        self.function_ref: str | None = None

    def declare(self, name: str, node: exp.Expression) -> None:
        if (
            name in self.sources
            or name in self.tables
            or name in self.sinks
            or name in self.views
            or name in self.functions
            or name.lower() in self.user_functions
        ):
            raise sql_error(f"{name} is already declared", node)

    def table_function(self, call: exp.Anonymous) -> str | None:
        """The name of the user table function ``call`` calls (``FROM f(<stream>)``), else
        ``None``; a scalar user function there is refused."""
        spec = self.user_functions.get(str(call.name).lower())
        if spec is None:
            return None
        if spec.kind != "table":
            raise sql_error(
                f"FUNCTION {spec.name} is a scalar function: call it in an expression "
                f"(SELECT {spec.name}(…) FROM <stream>); FROM <f>(<stream>) takes a RETURNS "
                "TABLE function",
                call,
            )
        return spec.name

    def plan(self) -> PipelinePlan:
        statements = parse_statements(self.text)
        if not statements:
            raise PipelineSQLError("empty pipeline: expected CREATE SOURCE, CREATE SINK, INSERT")
        started = False
        for statement in statements:
            if isinstance(statement, exp.Set):
                if started:
                    raise sql_error(
                        "SET sets pipeline options: put it before the other statements", statement
                    )
                for item in statement.expressions:
                    assign = item.this if isinstance(item, exp.SetItem) else item
                    if (
                        isinstance(assign, exp.EQ)
                        and isinstance(assign.this, exp.Column | exp.Var)
                        and assign.this.name.lower() in RUN_OPTION_NAMES
                    ):
                        self.run_options = apply_run_option(
                            self.run_options, assign.this.name.lower(), assign.expression, item
                        )
                        continue
                    self.settings, self.batch_rows = _setting(item, self.settings, self.batch_rows)
                continue
            started = True
            if isinstance(statement, exp.Create):
                self.create(statement)
            elif isinstance(statement, exp.Insert):
                self.insert(statement)
            else:
                raise sql_error(
                    f"unsupported statement {statement.sql()[:40]!r}: a pipeline holds SET, "
                    "CREATE SOURCE | TABLE | SINK | VIEW and INSERT INTO",
                    statement,
                )
        queries = self.resolve_late()
        if not queries:
            raise PipelineSQLError(
                "the pipeline has no query: add INSERT INTO <sink> SELECT … (or CREATE SINK … AS "
                "SELECT …)"
            )
        return PipelinePlan(
            text=self.text,
            path=self.path,
            base_dir=self.base_dir,
            settings=self.settings,
            batch_rows=self.batch_rows,
            sources=self.sources,
            tables=self.tables,
            sinks=self.sinks,
            queries=tuple(queries),
            views=dict(self.views),
            run_options=self.run_options,
            functions=dict(self.functions),
            user_functions=dict(self.user_functions),
            function_files=dict(self.function_files),
            warnings=tuple(w for q in queries if q.window is not None for w in q.window.warnings),
        )

    # --- CREATE -----------------------------------------------------------------------------

    def create(self, create: exp.Create) -> None:
        kind = str(create.args.get("kind") or "").upper()
        if kind == "FUNCTION":
            from flight_serve.pipelines.functions import is_user_function, user_function

            if is_user_function(create):
                spec = user_function(create, self.text, self.base_dir, self.function_files)
                self.declare(spec.name, create.this)
                self.user_functions[spec.name] = spec
                return
            self.functions[_function_name(create)] = _function(create, self)
            return
        name = _name(create.this)
        self.declare(name, create.this)
        if kind in ("SOURCE", "TABLE"):
            self.relation(create, name, "source" if kind == "SOURCE" else "table")
        elif kind == "SINK":
            options = _options(create, self.text)
            window_keys = [o for o in options if o.key in QUERY_OPTION_NAMES]
            if window_keys:
                raise window_keys[0].error(
                    "is a query option, not a sink option: set it on the query "
                    "(TUMBLE(…, option => value)) or with SET"
                )
            sink = SinkDef(name, create, {o.key: o for o in options})
            if "connector" not in sink.connector:
                _missing_connector("SINK", name, options, create.this)
            self.sinks[name] = sink
            query = create.args.get("expression")
            if query is not None:
                self.query(create, query, view=None, sink=name)
        elif kind == "VIEW":
            query = create.args.get("expression")
            if query is None:
                raise sql_error(f"CREATE VIEW {name} needs AS SELECT …", create)
            props = create.args.get("properties")
            other = [
                p
                for p in (props.expressions if props is not None else [])
                if not isinstance(p, exp.MaterializedProperty)  # RisingWave's MATERIALIZED VIEW
            ]
            if other:
                raise sql_error(
                    "a view takes no WITH options: set query options as named arguments of the "
                    "window function, e.g. TUMBLE(…, emit => 'update')",
                    other[0],
                )
            self.views[name] = len(self.queries)
            self.query(create, query, view=name, sink=None)
        else:
            raise sql_error(
                f"unsupported CREATE {kind or create.sql()[:20]}: use SOURCE, TABLE, SINK, VIEW "
                "or FUNCTION",
                create,
            )

    def relation(self, create: exp.Create, name: str, kind: Literal["source", "table"]) -> None:
        options = _options(create, self.text)
        columns = _columns(create)
        schema = create.this
        watermark = next(
            (
                w
                for w in (schema.expressions if isinstance(schema, exp.Schema) else [])
                if isinstance(w, exp.WatermarkColumnConstraint)
            ),
            None,
        )
        if kind == "table":
            if watermark is not None:
                raise sql_error(
                    "a TABLE is static and has no watermark: declare a stream with CREATE SOURCE",
                    watermark,
                )
            window_keys = [o for o in options if o.key in QUERY_OPTION_NAMES]
            if window_keys:
                raise window_keys[0].error("is an event-time option; a TABLE is static")
            query_options, time_column = self.settings, None
        else:
            bad = next((o for o in options if o.key == "max_out_of_orderness"), None)
            if bad is not None:
                raise bad.error(
                    "declare the watermark bound in the column list: "
                    "WATERMARK FOR <ts> AS <ts> - INTERVAL '<n>' <unit>"
                )
            _, time_column, query_options = source_options(create, self.settings)
            if (
                time_column is not None
                and columns is not None
                and columns.get_field_index(time_column) < 0
            ):
                assert watermark is not None
                raise no_time_column(time_column, columns.names, f"source {name}", watermark.this)
        connector = {o.key: o for o in options if o.key not in OPTION_NAMES}
        if "connector" not in connector:
            _missing_connector(kind.upper(), name, options, create.this)
        relation = RelationDef(kind, name, create, columns, time_column, query_options, connector)
        if kind == "source":
            self.sources[name] = relation
            self.streams[name] = (query_options, time_column, False)
        else:
            self.tables[name] = relation

    # --- queries ----------------------------------------------------------------------------

    def insert(self, insert: exp.Insert) -> None:
        target = insert.this
        if isinstance(target, exp.Schema):
            raise sql_error(
                "INSERT INTO <sink> (<columns>) is not supported: name the columns in the SELECT",
                target,
            )
        sink = _name(target)
        if sink not in self.sinks:
            known = ", ".join(self.sinks) or "none declared"
            raise sql_error(f"INSERT INTO {sink}: no such sink (sinks: {known})", target)
        query = insert.args.get("expression")
        if query is None:
            raise sql_error("INSERT INTO needs a SELECT", insert)
        self.query(insert, query, view=None, sink=sink)

    def stream_ref(self, node: exp.Table, ctes: set[str]) -> tuple[str, str] | None:
        """``(kind, name)`` of a table reference: ``stream``, ``late`` or ``table``."""
        if isinstance(node.this, exp.Anonymous):
            if node.this.name.upper() == "LATE":
                return "late", _late_target(node.this)
            if node.this.name in self.functions or self.table_function(node.this):
                self.function_ref = self.table_function(node.this) or node.this.name
                return "stream", _plugin_input(node.this, self.streams)
            raise sql_error(
                f"{node.this.name}(…) here: window functions must be the only FROM item of a "
                "windowed query",
                node.this,
            )
        name = _name(node)
        if name in ctes:
            return None
        if name in self.streams:
            return "stream", name
        if name in self.tables:
            return "table", name
        if name in self.sinks:
            raise sql_error(
                f"sink {name} cannot be read: declare the intermediate stage as "
                f"CREATE VIEW {name} AS SELECT … and read the view",
                node,
            )
        raise sql_error(f"unknown source, table or view {name} (declare it above)", node)

    def query(
        self, statement: exp.Expression, query: exp.Expression, view: str | None, sink: str | None
    ) -> None:
        if not isinstance(query, exp.Select):
            raise sql_error("expected a SELECT (UNION and VALUES are not supported)", query)
        index = len(self.queries)
        func = window_table_function(query)
        if (
            func is not None
            and func.name.upper() != "LATE"
            and func.name not in self.functions
            and self.table_function(func) is None
        ):
            if self.user_functions:  # what it refuses are calls of them
                from flight_serve.pipelines.functions import check_windowed_calls

                check_windowed_calls(query, self.user_functions)
            self.windowed(index, statement, query, func, view, sink)
            return
        with_ = query.args.get("with_") or query.args.get("with")
        ctes = {c.alias_or_name for c in with_.expressions} if with_ is not None else set()
        streams: list[tuple[str, str, exp.Table]] = []
        tables: list[str] = []
        self.function_ref = None
        for node in query.find_all(exp.Table):
            ref = self.stream_ref(node, ctes)
            if ref is None:
                continue
            kind, name = ref
            if kind == "table":
                if name not in tables:
                    tables.append(name)
            else:
                streams.append((kind, name, node))
        if not streams:
            raise sql_error(
                "a query must read a source or a view (static tables are joined to a stream)", query
            )
        if len(streams) > 1:
            raise sql_error(
                "a query reads one stream; joining two streams is not supported (join a stream "
                "with a CREATE TABLE)",
                streams[1][2],
            )
        _check_per_row(query)
        kind, name, node = streams[0]
        if kind == "late":
            if name not in self.streams:
                raise sql_error(f"LATE({name}): no source or view {name} declared above", node)
            self.late_refs.append((index, name, node))
            input_name = f"LATE({name})"
        else:
            input_name = name
        function = self.function_ref
        self._check_accumulate(sink, kind != "late" and self.streams[name][2], query)
        self.queries.append(
            QueryDef(
                index, statement, query, view, sink, input_name, tuple(tables), function=function
            )
        )
        if view is not None:
            if function is not None:
                options, time_column, update = self.streams[name]
                returns = (
                    self.functions[function].returns
                    if function in self.functions
                    else self.user_functions[function].returns
                )
                assert isinstance(returns, pa.Schema)
                kept = (
                    time_column
                    if time_column
                    and returns.get_field_index(time_column) >= 0
                    and _keeps_column(query, time_column)
                    else None
                )
                self.streams[view] = (options if kept else self.settings, kept, update)
            elif kind == "late":
                self.streams[view] = (self.settings, None, False)
            else:
                options, time_column, update = self.streams[name]
                kept = time_column if time_column and _keeps_column(query, time_column) else None
                self.streams[view] = (options if kept else self.settings, kept, update)

    def _check_accumulate(self, sink: str | None, update: bool, query: exp.Select) -> None:
        """A falkordb sink's ``accumulate`` adds every row it gets: rows of an emit => 'update'
        query (a window's row again, revised) would be added once per revision."""
        definition = self.sinks.get(sink) if sink is not None else None
        if not update or definition is None:
            return
        connector = definition.connector.get("connector")
        accumulate = definition.connector.get("accumulate")
        if connector is None or connector.text.lower() != "falkordb" or accumulate is None:
            return
        raise sql_error(
            f"INSERT INTO {sink}: the rows are an emit => 'update' query's (a window's row comes "
            f"again, revised), and accumulate = '{accumulate.text}' would add every revision; "
            "drop accumulate (the properties are then set to the latest revision) or emit "
            "'final'",
            query,
        )

    def windowed(
        self,
        index: int,
        statement: exp.Expression,
        query: exp.Select,
        func: exp.Anonymous,
        view: str | None,
        sink: str | None,
    ) -> None:
        if not func.expressions or not isinstance(func.expressions[0], exp.Column):
            raise sql_error(f"{func.name.upper()} needs the input as its first argument", func)
        source_node = func.expressions[0]
        name = str(source_node.name)
        if name in self.tables:
            raise sql_error(
                f"{name} is a static TABLE; a window reads a stream (CREATE SOURCE or a view)",
                source_node,
            )
        if name not in self.streams:
            self.stream_ref(exp.Table(this=exp.to_identifier(name)), set())  # raises the error
        options, time_column, update = self.streams[name]
        if update:
            raise sql_error(
                f"{name} is the output of an emit => 'update' query: a window over it would "
                "count every revision; read it per row, or use emit 'final' upstream",
                source_node,
            )
        relation = self.sources.get(name)
        declared = relation.columns if relation is not None else None
        window = window_query_from_select(
            query,
            options,
            declared_time_column=time_column,
            input_columns=declared.names if declared is not None else None,
        )
        self._check_accumulate(sink, window.aggregation.emit == "update", query)
        self.queries.append(QueryDef(index, statement, query, view, sink, name, (), window))
        if view is not None:
            self.streams[view] = (self.settings, None, window.aggregation.emit == "update")

    def resolve_late(self) -> list[QueryDef]:
        """Point every ``LATE(x)`` at the windowed query whose late side output it is."""
        queries = list(self.queries)
        for index, name, node in self.late_refs:
            if name in self.views and queries[self.views[name]].window is not None:
                producer = self.views[name]
            else:
                readers = [q.index for q in queries if q.window is not None and q.input == name]
                if not readers:
                    raise sql_error(
                        f"LATE({name}): no windowed query reads {name}, so it has no late side "
                        "output",
                        node,
                    )
                if len(readers) > 1:
                    raise sql_error(
                        f"LATE({name}) is ambiguous: {len(readers)} windowed queries read {name}; "
                        "define them as views and read LATE(<view>)",
                        node,
                    )
                producer = readers[0]
            # no cycle is possible: x was declared above this query, so its producer never
            # depends on it, even when the producer comes later in the file
            queries[index] = replace(queries[index], late_of=producer)
        return queries


def _function_name(create: exp.Create) -> str:
    target = create.this
    if isinstance(target, exp.UserDefinedFunction):
        target = target.this
    return _name(target)


def _function(create: exp.Create, planner: _Planner) -> FunctionDef:
    """``CREATE FUNCTION <f>() RETURNS TABLE (…) WITH (connector = 'plugin', …)``."""
    name = _function_name(create)
    planner.declare(name, create.this)
    udf = create.this
    if isinstance(udf, exp.UserDefinedFunction) and udf.expressions:
        raise sql_error(
            f"FUNCTION {name}: a plugin function takes no declared arguments; call it as "
            f"{name}(<source or view>) and declare the columns it reads in the plugin",
            udf.expressions[0],
        )
    props = create.args.get("properties")
    returns: pa.Schema | None = None
    options: dict[str, Option] = {}
    for prop in props.expressions if props is not None else []:
        if isinstance(prop, exp.ReturnsProperty) and isinstance(prop.this, exp.Schema):
            fields = []
            for column in prop.this.expressions:
                if not isinstance(column, exp.ColumnDef) or column.args.get("kind") is None:
                    raise sql_error(f"FUNCTION {name}: RETURNS TABLE (<column> <type>, …)", column)
                fields.append(pa.field(column.name, arrow_type(column.args["kind"], column)))
            returns = pa.schema(fields)
        elif isinstance(prop, exp.Property):
            key = prop.name.lower()
            options[key] = Option(key, prop.args["value"], prop, planner.text)
        else:
            raise sql_error(
                f"FUNCTION {name}: unsupported clause {prop.sql()[:40]!r}; write "
                f"CREATE FUNCTION {name}() RETURNS TABLE (…) WITH (connector = 'plugin', …)",
                prop,
            )
    if returns is None or not len(returns):
        raise sql_error(
            f"FUNCTION {name} needs RETURNS TABLE (<column> <type>, …): the plugin's output columns",
            create.this,
        )
    if create.args.get("expression") is not None:
        raise sql_error(
            f"FUNCTION {name}: a plugin function has no body; name the plugin with "
            "WITH (plugin = '<name>')",
            create.args["expression"],
        )
    known = ("connector", "plugin", "timeout", "max_in_flight")
    for key, option in options.items():
        if key not in known:
            raise option.unknown("a plugin function", known)
    connector = options.get("connector")
    if connector is None or connector.text.lower() != "plugin":
        raise sql_error(
            f"FUNCTION {name} needs WITH (connector = 'plugin'): functions are out-of-process "
            "plugins attached to the server",
            connector.value if connector is not None else create.this,
        )
    plugin = options["plugin"].text if "plugin" in options else name
    timeout = timedelta(seconds=30)
    if "timeout" in options:
        timeout = option_duration(options["timeout"].value)
        if timeout <= timedelta(0):
            raise options["timeout"].error("must be positive")
    max_in_flight = 16
    if "max_in_flight" in options:
        max_in_flight = _positive_int(options["max_in_flight"])
    return FunctionDef(name, create, returns, plugin, timeout, max_in_flight)


def _plugin_input(call: exp.Anonymous, streams: Collection[str]) -> str:
    """The stream a ``<f>(<stream>)`` call reads."""
    args = call.expressions
    if len(args) != 1 or not isinstance(args[0], exp.Column):
        raise sql_error(f"{call.name}(<source or view>): one stream name as its argument", call)
    name = str(args[0].name)
    if name not in streams:
        raise sql_error(f"{call.name}({name}): no source or view {name} declared above", args[0])
    return name


def read_pipeline_file(path: Path) -> str:
    """The text of the pipeline file ``path``: UTF-8, with or without a byte-order mark (which
    Windows editors write and which is not part of the SQL).

    Raises:
        OSError: the file cannot be read.
        PipelineSQLError: the file is not UTF-8: the first byte that is not, with its line and
            column (a file saved as Latin-1 or UTF-16, say).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line_start = before.rfind(b"\n") + 1
        col = len(before[line_start:].decode("utf-8-sig", errors="replace")) + 1
        raise PipelineSQLError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8",
            before.count(b"\n") + 1,
            col,
        ) from None


def parse_pipeline(
    text: str,
    *,
    path: Path | None = None,
    base_dir: Path | None = None,
    function_files: Mapping[str, bytes] | None = None,
) -> PipelinePlan:
    """Parse and check a pipeline (see the module docstring); no file is opened.

    Args:
        text: the pipeline SQL.
        path: the file it came from (for messages and ``explain``).
        base_dir: where relative input paths start (default: ``path``'s directory, else the
            working directory).
        function_files: the code of ``CREATE FUNCTION … USING '<file>'`` by path as written
            (what was stored at submit); such files are not read from ``base_dir``.

    Raises:
        PipelineSQLError: a syntax error or a statement outside the grammar, with line and column.
        FunctionDefinitionError: a ``CREATE FUNCTION`` whose code cannot be read or checked.

    >>> plan = parse_pipeline(
    ...     "CREATE SOURCE s (k VARCHAR, t TIMESTAMP, WATERMARK FOR t AS t - INTERVAL '5' SECOND)"
    ...     " WITH (connector = 'file', path = 'in.csv');"
    ...     "CREATE SINK out WITH (connector = 'stdout');"
    ...     "INSERT INTO out SELECT k, window_start, window_end, count(*) AS n"
    ...     " FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;")
    >>> [(q.input, q.sink, q.window.aggregation.max_out_of_orderness) for q in plan.queries]
    [('s', 'out', datetime.timedelta(seconds=5))]
    """
    if base_dir is None:
        base_dir = path.parent if path is not None else Path.cwd()
    return _Planner(text, path, base_dir, function_files).plan()
