"""SQL statements for Flight SQL: queries with bound parameters, INSERT / CREATE TABLE / DROP TABLE
against the stream store, and bulk ingest. Each method takes the request's
:class:`~flight_serve.flight.sql.statement.Statement` (parsed once) rather than its text.

Every stream is a table named after it (see :mod:`flight_serve.flight.sql.query` for identifier
rules). Statement kinds, by their first keyword:

- a **query** (``SELECT``, ``WITH``, ``VALUES``, ``EXPLAIN``, ``SHOW``, ...): planned and run by
  DataFusion, read-only, over the streams pinned at planning time (the snapshot rule of
  :func:`flight_serve.flight.sql.query.plan`).
- ``INSERT INTO t [(cols)] VALUES ... | SELECT ...``: DataFusion plans the INSERT (column list,
  defaults to NULL, casts to the table's types, NOT NULL checks) and runs its input; the rows
  are appended to stream ``t`` in batches of at most 3 MiB. The count is the rows appended.
- ``CREATE TABLE [IF NOT EXISTS] t (col type, ...)`` / ``CREATE [OR REPLACE] TABLE t AS
  SELECT ...``: creates stream ``t`` (empty, or holding the query's rows). Count: rows written.
- ``DROP TABLE [IF EXISTS] t [, ...]``: drops the streams. Count: 0.
- anything else (``UPDATE``, ``DELETE``, ``ALTER``, ``COPY``, transactions, ``SET``): refused with
  :class:`~flight_serve.errors.QueryError` -- streams are append-only and every statement commits
  on its own.

Parameters: ``?`` placeholders are rewritten to ``$1, $2, ...`` in order (outside string
literals, quoted identifiers and comments; sqlglot's tokenizer finds them); DataFusion's ``$n``
and ``$name`` work as they are. Bound parameters are an Arrow table: column *i* binds ``$i+1``
(and ``$<column name>``). A statement with several parameter rows runs once per row; query
results are concatenated in row order, update counts are summed. The columns must bind exactly
the placeholders (as many as the highest ``$n``, or as distinct placeholders): more or fewer is
:class:`~flight_serve.errors.QueryError` naming both counts ("the statement has 1 placeholder;
2 parameters were bound"), as are parameters for a statement without placeholders -- values are
never dropped silently.

Errors: a statement DataFusion cannot parse or plan is :class:`~flight_serve.errors.QueryError`
(INVALID_ARGUMENT) with DataFusion's message; a table that does not exist is
:class:`~flight_serve.errors.StreamNotFoundError` (NOT_FOUND); creating a table that exists is
:class:`~flight_serve.errors.AlreadyExistsError`. A cancelled call stops between batches with
``pyarrow.flight.FlightCancelledError`` (CANCELLED).
"""

from __future__ import annotations

import itertools
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

import datafusion
import pyarrow as pa
import pyarrow.flight as flight
from sqlglot import exp

from flight_serve.engine.sqlguard import check_sql
from flight_serve.errors import (
    AlreadyExistsError,
    QueryError,
    StreamNotFoundError,
    TicketError,
)
from flight_serve.flight.ops.limits import QueryLimits, Reservation
from flight_serve.flight.sql.catalog import register_iceberg_tables
from flight_serve.flight.sql.query import (
    MAX_RESULT_BATCH_BYTES,
    checked_batches,
    conform_result,
    datafusion_error,
    interruptible_batches,
    new_context,
    plain_schema,
    reserve_input,
    split_batch,
    stored_scan,
    to_plain,
)
from flight_serve.flight.sql.statement import Statement, StatementKind, table_name
from flight_serve.flight.tickets import QueryTicket, StreamPin
from flight_serve.store import StreamInfo, StreamStore, check_batch, validate_stream_name

__all__ = ["UPDATE_COUNT_SCHEMA", "IngestMode", "PreparedInfo", "SqlEngine"]

#: The result of a data-changing statement sent as a query: one row, the affected row count.
UPDATE_COUNT_SCHEMA: Final = pa.schema([pa.field("count", pa.int64(), nullable=False)])

#: A function the engine polls between batches; true once the client cancelled the call.
IsCancelled = Callable[[], bool]

# A DataFusion type in a plan's repr: a parametrised timestamp or decimal, or a plain name.
_DF_TYPE = r'(Timestamp\(\w+, (?:None|Some\("[^"]*"\))\)|Decimal128\(\d+, -?\d+\)|\w+)'
_PLACEHOLDER = re.compile(
    r'Placeholder \{ id: "\$([^"]+)", field: (?:Some\(Field \{ name: "[^"]*", data_type: '
    + _DF_TYPE
    + "|None)"
)
# An untyped placeholder cast to a type (``CAST(? AS DATE)``) takes the cast's type, as the
# JDBC driver needs a typed parameter vector to bind into.
_CAST_PLACEHOLDER = re.compile(
    r'Cast \{ expr: Placeholder\(Placeholder \{ id: "\$([^"]+)", field: None \}\), '
    r'(?:field: Field \{ name: "[^"]*", )?data_type: ' + _DF_TYPE
)
_TIMESTAMP_TYPE = re.compile(r'Timestamp\(\w+, (?:None|Some\("([^"]*)"\))\)')
_DECIMAL_TYPE = re.compile(r"Decimal128\((\d+), (-?\d+)\)")
_DF_TYPES: Final[dict[str, pa.DataType]] = {
    "Boolean": pa.bool_(),
    "Int8": pa.int8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "UInt8": pa.uint8(),
    "UInt16": pa.uint16(),
    "UInt32": pa.uint32(),
    "UInt64": pa.uint64(),
    "Float32": pa.float32(),
    "Float64": pa.float64(),
    "Utf8": pa.string(),
    "LargeUtf8": pa.string(),
    "Utf8View": pa.string(),
    "Binary": pa.binary(),
    "LargeBinary": pa.binary(),
    "BinaryView": pa.binary(),
    "Date32": pa.date32(),
}


def _arrow_type(df_type: str) -> pa.DataType | None:
    """The Arrow type of a DataFusion type as a plan prints it (``Int64``,
    ``Timestamp(Microsecond, Some("UTC"))``, ``Decimal128(10, 3)``), ``None`` for another; a
    timestamp of any unit is announced in milliseconds, with its zone."""
    if (timestamp := _TIMESTAMP_TYPE.fullmatch(df_type)) is not None:
        # Milliseconds whatever the column's unit: arrow-java's JDBC driver (18.3) writes a
        # java.sql.Timestamp's epoch milliseconds into the vector of the announced unit as they
        # are. DataFusion casts the bound value to the column's unit.
        return pa.timestamp("ms", timestamp.group(1))
    if (decimal := _DECIMAL_TYPE.fullmatch(df_type)) is not None:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    return _DF_TYPES.get(df_type)


def _translate(exc: BaseException) -> Exception:
    """DataFusion's exception as a flight-serve error (a missing table is NOT_FOUND), as the
    plain Flight query path has it (:func:`~flight_serve.flight.sql.query.datafusion_error`)."""
    return datafusion_error(exc)


def _options(*, dml: bool = False, ddl: bool = False) -> datafusion.SQLOptions:
    return (
        datafusion.SQLOptions().with_allow_ddl(ddl).with_allow_dml(dml).with_allow_statements(False)
    )


def _param_values(params: pa.Table, row: int) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for i, name in enumerate(params.column_names):
        scalar = params.column(i)[row]
        values[str(i + 1)] = scalar
        if name and not name.isdigit():
            values[name.lstrip("$")] = scalar
    return values


def _param_rows(params: pa.Table | None) -> list[dict[str, Any] | None]:
    if params is None:
        return [None]
    return [_param_values(params, row) for row in range(params.num_rows)]


def _check(is_cancelled: IsCancelled | None) -> None:
    if is_cancelled is not None and is_cancelled():
        raise flight.FlightCancelledError("the call was cancelled; the statement stopped")


_ROWS_TABLE: Final = "__flight_serve_parameter_rows"

#: Batches a bulk load may read ahead of the thread that writes them to the store.
_APPEND_QUEUE_BATCHES: Final = 4


def _vectorized_insert(statement: Statement, params: pa.Table) -> tuple[Statement, pa.Table] | None:
    """Rewrite ``INSERT INTO t [(cols)] VALUES (<one row of placeholders and expressions>)``
    run once per parameter row into one ``INSERT INTO t [(cols)] SELECT <the row's expressions>
    FROM <the parameter rows>`` (placeholders become columns of that table), so N rows cost one
    statement and one group commit. ``None`` when ``statement`` has another shape or names a
    placeholder the parameters do not bind. The rewritten statement is built from the parsed
    one's tree (not parsed again).

    >>> rows = pa.table({"0": [1, 2], "1": ["a", "b"]})
    >>> _vectorized_insert(Statement.parse("INSERT INTO t VALUES ($1, upper($2))"), rows)[0].sql
    'INSERT INTO t SELECT _1, UPPER(_2) FROM __flight_serve_parameter_rows'
    """
    statements = statement.expressions
    if statements is None or len(statements) != 1 or not isinstance(statements[0], exp.Insert):
        return None
    insert = statements[0]
    values = insert.expression
    if not isinstance(values, exp.Values) or len(values.expressions) != 1:
        return None
    row = values.expressions[0]
    if not isinstance(row, exp.Tuple) or any(True for _ in row.find_all(exp.Table, exp.Subquery)):
        return None
    names = params.column_names
    by_name = {name.lstrip("$"): i for i, name in enumerate(names) if not name.isdigit()}

    def column_of(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or node.table or not node.name.startswith("$"):
            return node
        key = node.name[1:]
        index = int(key) - 1 if key.isdigit() else by_name.get(key, -1)
        if not 0 <= index < len(names):
            raise LookupError(key)
        return exp.column(f"_{index + 1}")

    try:
        expressions = [e.copy().transform(column_of) for e in row.expressions]
    except LookupError:
        return None
    rows_table = exp.Table(this=exp.to_identifier(_ROWS_TABLE))  # a node: nothing to parse
    select = exp.select(*expressions).from_(rows_table)
    rewritten = exp.Insert(this=insert.this.copy(), expression=select)
    renamed = params.rename_columns([f"_{i + 1}" for i in range(len(names))])
    return Statement.of_expression(rewritten), renamed


@dataclass(frozen=True)
class PreparedInfo:
    """What CreatePreparedStatement reports.

    Attributes:
        kind: the statement kind.
        dataset_schema: the result schema of a query (``None`` for data-changing statements, and
            for a query whose schema depends on untyped parameters).
        parameter_schema: one field per placeholder (``$1``, ``$2``, ... or ``$name``) with the
            type DataFusion infers, ``null`` where it infers none; ``None`` without placeholders.
    """

    kind: StatementKind
    dataset_schema: pa.Schema | None
    parameter_schema: pa.Schema | None


IngestMode = tuple[Literal["create", "fail"], Literal["fail", "append", "replace"]]


class SqlEngine:
    """Runs Flight SQL statements over a :class:`~flight_serve.store.StreamStore`.

    Args:
        store: the streams (tables).
        max_batch_bytes: largest result batch sent (``RecordBatch.nbytes``), 3 MiB by default.
        limits: memory budget, statement timeout and DataFusion working memory for queries and
            updates (:mod:`flight_serve.flight.sql.query`, "Limits"); the service sets it.
    """

    def __init__(
        self,
        store: StreamStore,
        *,
        max_batch_bytes: int = MAX_RESULT_BATCH_BYTES,
        limits: QueryLimits | None = None,
    ):
        self.store = store
        self.max_batch_bytes = max_batch_bytes
        self.limits = limits or QueryLimits()

    # --- contexts ----------------------------------------------------------------------------

    def _streams_for(self, statement: Statement) -> list[StreamInfo]:
        wanted = statement.tables
        return [i for i in self.store.list_streams() if wanted is None or i.name in wanted]

    @staticmethod
    def _register(ctx: datafusion.SessionContext, info: StreamInfo, batches: list[Any]) -> None:
        if not batches:
            batches = [pa.RecordBatch.from_pylist([], schema=info.schema)]
        ctx.register_record_batches(f'"{info.name}"', [batches])

    def _schema_context(
        self, statement: Statement
    ) -> tuple[datafusion.SessionContext, list[StreamInfo]]:
        ctx = new_context()  # the session settings the query runs with (time zone)
        infos = self._streams_for(statement)
        for info in infos:
            self._register(ctx, info, [])
        data_dir = self.store.data_dir
        register_iceberg_tables(ctx, statement.iceberg_refs, data_dir, data=False)  # <ns>.<table>
        return ctx, infos

    def _data_context(
        self,
        pins: Iterable[StreamPin],
        *,
        ordered: bool = False,
        registered: dict[str, list[pa.RecordBatch]] | None = None,
    ) -> datafusion.SessionContext:
        # ordered: one partition, so an INSERT appends rows in the order its source yields them;
        # registered: filled with each stream's registered batches (for query.stored_scan)
        config = datafusion.SessionConfig().with_target_partitions(1) if ordered else None
        ctx = new_context(self.limits, config)
        for pin in pins:
            try:
                info = self.store.info(pin.stream)
                if info.incarnation != pin.incarnation:
                    raise StreamNotFoundError(pin.stream)
                batches = self.store.batches(
                    pin.stream, stop=pin.stop_offset, incarnation=pin.incarnation
                )
            except StreamNotFoundError:
                raise TicketError(
                    f"stale statement: table {pin.stream!r} was dropped or re-created since the "
                    "statement was planned; run it again"
                ) from None
            self._register(ctx, info, batches)
            if registered is not None:
                registered[pin.stream] = batches
        return ctx

    def _live_context(self, statement: Statement) -> datafusion.SessionContext:
        """A context over the streams ``statement`` names as they are now (for data-changing
        statements, which run at once), with one partition so rows keep their order."""
        infos = self._streams_for(statement)
        pins = [StreamPin(i.name, i.incarnation, i.next_offset) for i in infos]
        ctx = self._data_context(pins, ordered=True)
        data_dir = self.store.data_dir
        register_iceberg_tables(ctx, statement.iceberg_refs, data_dir, data=True)  # never written
        return ctx

    @staticmethod
    def _dataframe(
        ctx: datafusion.SessionContext,
        sql: str,
        options: datafusion.SQLOptions,
        values: dict[str, Any] | None = None,
    ) -> Any:
        check_sql(sql)  # DataFusion would crash on a deeply nested expression (engine/sqlguard.py)
        try:
            return ctx.sql(sql, options=options, param_values=values)
        except Exception as exc:  # DataFusion raises bare Exception / ValueError
            raise _translate(exc) from None

    @staticmethod
    def _schema(df: Any) -> pa.Schema:
        try:
            schema: pa.Schema = df.schema()
        except Exception as exc:
            raise _translate(exc) from None
        return plain_schema(schema)

    # --- prepare -----------------------------------------------------------------------------

    def prepare(self, statement: Statement) -> PreparedInfo:
        """Check ``statement`` and describe it (result schema, parameter schema) without
        running it.

        Raises:
            QueryError: DataFusion cannot parse or plan it, or it is a refused statement.
            StreamNotFoundError: it reads or inserts into a table that does not exist.
        """
        kind = statement.kind
        if kind != "query":
            statement.refuse_iceberg_targets()
        if kind == "create" or kind == "drop":
            statement.ddl(kind)
            return PreparedInfo(kind, None, None)
        ctx, _ = self._schema_context(statement)
        df = self._dataframe(ctx, statement.sql, _options(dml=kind == "insert"))
        parameters = self._parameter_schema(df, statement)
        dataset: pa.Schema | None = None
        if kind == "query":
            try:
                dataset = self._schema(df)
            except QueryError:
                if parameters is None:
                    raise
        return PreparedInfo(kind, dataset, parameters)

    @staticmethod
    def _parameter_schema(df: Any, statement: Statement) -> pa.Schema | None:
        """One field per placeholder of ``statement`` (every ``$1`` .. ``$n`` up to the highest, then
        the ``$name`` ones), typed as DataFusion infers it (``null`` where it infers none, or
        where the plan does not show the placeholder, as in a subquery)."""
        names = statement.placeholders or []
        highest = max([0, *(int(n) for n in names if n.isdigit())])
        order = [str(i) for i in range(1, highest + 1)] + [n for n in names if not n.isdigit()]
        if not order:
            return None
        try:
            plan = repr(df.logical_plan())
        except Exception:
            plan = ""
        types: dict[str, pa.DataType] = {}
        for name, df_type in [*_PLACEHOLDER.findall(plan), *_CAST_PLACEHOLDER.findall(plan)]:
            known = _arrow_type(df_type) if df_type else None
            if known is not None:
                types.setdefault(name, known)
        return pa.schema([pa.field(f"${n}", types.get(n, pa.null())) for n in order])

    def required_role(self, statement: Statement) -> Literal["read", "write", "admin"]:
        """The role (:mod:`flight_serve.flight.ops.roles`) running ``statement`` needs: ``read`` for a
        query, ``write`` for ``INSERT`` and ``CREATE TABLE``, ``admin`` for ``DROP TABLE`` and for
        ``CREATE OR REPLACE TABLE`` of a table that exists (both drop a stream).

        Raises:
            QueryError: a refused statement, or DDL that does not parse.
        """
        kind = statement.kind
        if kind == "query":
            return "read"
        if kind == "drop":
            return "admin"
        if kind == "create":
            create = statement.ddl("create")
            target = create.this
            table = target.this if isinstance(target, exp.Schema) else target
            if (
                create.args.get("replace")
                and isinstance(table, exp.Table)
                and self.store.exists(table_name(table))
            ):
                return "admin"
        return "write"

    # --- queries -----------------------------------------------------------------------------

    def plan_query(
        self, statement: Statement, params: pa.Table | None
    ) -> tuple[pa.Schema, QueryTicket]:
        """Plan a query (placeholders rewritten) with the first parameter row bound; return the
        result schema (plain types) and a ticket pinning the streams it reads.

        Raises:
            QueryError: ``params`` (when given) does not bind exactly the statement's
                placeholders (:func:`check_parameters`), or DataFusion rejects the query.
        """
        if params is not None:
            statement.check_parameters(params)
        ctx, infos = self._schema_context(statement)
        rows = _param_rows(params)
        df = self._dataframe(ctx, statement.sql, _options(), rows[0] if rows else None)
        schema = self._schema(df)
        pins = tuple(StreamPin(i.name, i.incarnation, i.next_offset) for i in infos)
        return schema, QueryTicket(statement.sql, pins)

    def open_query(
        self,
        ticket: QueryTicket,
        params: pa.Table | None,
        is_cancelled: IsCancelled | None = None,
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """Plan a ticket's query over its pinned streams; return the result schema (plain types)
        and a lazy iterator of its batches (once per parameter row, concatenated) of at most
        ``max_batch_bytes``, which checks ``is_cancelled`` (and the statement timeout) while it
        waits for DataFusion. Under a memory budget the query reserves its input first. A bare
        scan without parameters (:func:`~flight_serve.flight.sql.query.stored_scan`) sends the
        stored batches DataFusion would return unchanged, with the same checks, and runs nothing.

        Raises:
            OverloadError: the memory budget has no room (UNAVAILABLE, retryable).
            QueryError: ``params`` does not bind exactly the query's placeholders.
        """
        statement = Statement.parse(ticket.sql, placeholders=False)  # rewritten when planned
        statement.check_parameters(params)
        started = time.monotonic()
        reservation = reserve_input(self.limits, self.store, ticket.pins, "this query", statement)
        try:
            registered: dict[str, list[pa.RecordBatch]] = {}
            ctx = self._data_context(ticket.pins, registered=registered)
            register_iceberg_tables(ctx, statement.iceberg_refs, self.store.data_dir, data=True)
            rows = _param_rows(params)
            first = self._dataframe(ctx, ticket.sql, _options(), rows[0] if rows else None)
            schema = self._schema(first)
            # a bare scan without parameters: its stored batches (query.stored_scan)
            bare = params is None and not statement.iceberg_refs
            stored = stored_scan(first, registered) if bare else None
        except BaseException:
            if reservation is not None:
                reservation.release()
            raise

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for i, values in enumerate(rows):
                    _check(is_cancelled)
                    df = first if i == 0 else self._dataframe(ctx, ticket.sql, _options(), values)
                    yield from self._stream(df, schema, is_cancelled, started, reservation, stored)
            finally:
                if reservation is not None:
                    reservation.release()

        return schema, batches()

    def _stream(
        self,
        df: Any,
        schema: pa.Schema,
        is_cancelled: IsCancelled | None,
        started: float | None = None,
        reservation: Reservation | None = None,
        stored: list[pa.RecordBatch] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        pulled: Iterator[pa.RecordBatch]
        if stored is not None:  # the batches DataFusion would return unchanged: no run
            pulled = checked_batches(
                stored, limits=self.limits, is_cancelled=is_cancelled, started=started
            )
        else:
            pulled = interruptible_batches(  # its worker holds the reservation while it runs
                df,
                limits=self.limits,
                is_cancelled=is_cancelled,
                started=started,
                reservation=reservation,
                translate=lambda message: _translate(Exception(message)),
            )
        for batch in pulled:
            if batch.num_rows == 0:
                continue
            if len(batch.schema) != len(schema) or batch.schema.names != schema.names:
                raise QueryError(
                    "the result schema changed with the bound parameters; "
                    f"planned {schema}, got {batch.schema}"
                )
            for piece in split_batch(conform_result(batch, schema), self.max_batch_bytes):
                yield piece
                _check(is_cancelled)

    # --- updates -----------------------------------------------------------------------------

    def execute_update(
        self,
        statement: Statement,
        params: pa.Table | None = None,
        is_cancelled: IsCancelled | None = None,
    ) -> int:
        """Run a data-changing statement (once per parameter row); return the rows it changed.

        Raises:
            QueryError: ``statement`` is a query (use a query command), or DataFusion rejects
                it.
            StreamNotFoundError: the target table does not exist.
            AlreadyExistsError: CREATE TABLE of an existing table without IF NOT EXISTS.
            QueryError: ``params`` does not bind exactly the statement's placeholders (both
                counts named; :func:`check_parameters`).
        """
        kind = statement.kind
        if kind == "query":
            raise QueryError("not an update: the statement returns rows; send it as a query")
        statement.check_parameters(params)
        statement.refuse_iceberg_targets()
        if kind == "insert" and params is not None and params.num_rows > 1:
            vectorized = _vectorized_insert(statement, params)
            if vectorized is not None:
                return self._insert(vectorized[0], None, is_cancelled, vectorized[1])
        total = 0
        for values in _param_rows(params):
            _check(is_cancelled)
            if kind == "insert":
                total += self._insert(statement, values, is_cancelled)
            elif kind == "create":
                total += self._create(statement, values)
            else:
                self._drop(statement)
        return total

    def _insert(
        self,
        statement: Statement,
        values: dict[str, Any] | None,
        is_cancelled: IsCancelled | None,
        rows_table: pa.Table | None = None,
    ) -> int:
        started = time.monotonic()
        infos = self._streams_for(statement)
        pins = [StreamPin(i.name, i.incarnation, i.next_offset) for i in infos]
        reservation = reserve_input(self.limits, self.store, pins, "this INSERT", statement)
        try:
            return self._insert_reserved(
                statement, values, is_cancelled, rows_table, started, reservation
            )
        finally:
            if reservation is not None:
                reservation.release()

    def _insert_reserved(
        self,
        statement: Statement,
        values: dict[str, Any] | None,
        is_cancelled: IsCancelled | None,
        rows_table: pa.Table | None,
        started: float,
        reservation: Reservation | None = None,
    ) -> int:
        ctx = self._live_context(statement)
        if rows_table is not None:
            ctx.register_record_batches(_ROWS_TABLE, [rows_table.to_batches()])
        df = self._dataframe(ctx, statement.sql, _options(dml=True), values)
        try:
            plan = df.logical_plan()
            dml = plan.to_variant()
            target_ref = str(dml.table_name())
            source = ctx.create_dataframe_from_logical_plan(plan.inputs()[0])
        except Exception as exc:
            raise _translate(exc) from None
        target = self._resolve(target_ref)
        schema = self.store.info(target).schema
        batches = self._stream(source, self._schema(source), is_cancelled, started, reservation)
        return self._append_all(target, (self._to_stream_schema(b, schema) for b in batches))

    def _append_all(
        self,
        name: str,
        batches: Iterable[pa.RecordBatch],
        is_cancelled: IsCancelled | None = None,
    ) -> int:
        """Append ``batches`` to stream ``name`` with one group commit at the end (the store
        drains staged frames early when they grow large); return the rows appended. Batches
        written before a failure are still committed (there are no transactions).

        A writing thread encodes and stages each batch (:meth:`StreamStore.write`) while this
        thread reads the next one from ``batches`` (a DoPut upload, a DataFusion stream), at most
        :data:`_APPEND_QUEUE_BATCHES` ahead.
        """
        pending: queue.Queue[pa.RecordBatch | None] = queue.Queue(_APPEND_QUEUE_BATCHES)
        state: dict[str, Any] = {"last": None, "error": None}

        def write() -> None:
            while (batch := pending.get()) is not None:
                if state["error"] is None:
                    try:
                        state["last"] = self.store.write(name, batch, after=state["last"])
                    except BaseException as exc:
                        state["error"] = exc

        writer = threading.Thread(target=write, name="flight-serve-sql-append")
        writer.start()
        rows = 0
        try:
            for batch in batches:
                _check(is_cancelled)
                if state["error"] is not None:
                    break
                if batch.num_rows:
                    pending.put(batch)
                    rows += batch.num_rows
        finally:
            pending.put(None)
            writer.join()
            if state["last"] is not None:
                self.store.commit(state["last"])
        if state["error"] is not None:
            raise state["error"]
        return rows

    def _resolve(self, table_ref: str) -> str:
        """The stream a DataFusion table reference (``t``, ``public.t``, ``datafusion.public.t``)
        names."""
        for prefix in ("datafusion.public.", "public."):
            if table_ref.startswith(prefix) and not self.store.exists(table_ref):
                table_ref = table_ref[len(prefix) :]
        if not self.store.exists(table_ref):
            raise StreamNotFoundError(f"table {table_ref!r} does not exist")
        return table_ref

    @staticmethod
    def _to_stream_schema(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
        columns = [
            to_plain(batch.column(i), field.type).cast(field.type) for i, field in enumerate(schema)
        ]
        return pa.RecordBatch.from_arrays(columns, names=schema.names)

    def _create(self, statement: Statement, values: dict[str, Any] | None) -> int:
        create = statement.ddl("create")
        target = create.this
        table = target.this if isinstance(target, exp.Schema) else target
        if not isinstance(table, exp.Table):
            raise QueryError("CREATE TABLE needs a table name")
        name = validate_stream_name(table_name(table))
        replace = bool(create.args.get("replace"))
        exists = self.store.exists(name)
        if exists and create.args.get("exists"):
            return 0  # IF NOT EXISTS
        if exists and not replace:
            raise AlreadyExistsError(f"table {name!r} already exists")
        ctx = self._live_context(statement)
        self._dataframe(ctx, statement.sql, _options(ddl=True), values)  # DDL runs as planned
        try:
            created = ctx.table(f'"{name}"')
            schema = plain_schema(created.schema())
            batches = [b for b in created.collect() if b.num_rows]
        except Exception as exc:
            raise _translate(exc) from None
        if exists:
            self.store.drop(name)
        self.store.create(name, schema)
        return self._append_all(name, (conform_result(b, schema) for b in batches))

    def _drop(self, statement: Statement) -> None:
        drop = statement.ddl("drop")
        tables = drop.args.get("tables") or [drop.this]
        if_exists = bool(drop.args.get("exists"))
        names = [table_name(t) for t in tables if isinstance(t, exp.Table)]
        for name in names:
            if not self.store.exists(name):
                if if_exists:
                    continue
                raise StreamNotFoundError(f"table {name!r} does not exist")
        for name in names:
            if self.store.exists(name):
                self.store.drop(name)

    # --- bulk ingest -------------------------------------------------------------------------

    def ingest(
        self,
        table: str,
        schema: pa.Schema,
        batches: Iterable[pa.RecordBatch],
        mode: IngestMode,
        is_cancelled: IsCancelled | None = None,
    ) -> int:
        """Load ``batches`` (of ``schema``) into stream ``table``; return the rows loaded.

        ``mode`` is (if the table does not exist: ``create`` | ``fail``, if it exists:
        ``fail`` | ``append`` | ``replace``); ADBC's modes are create = (create, fail),
        append = (fail, append), replace = (create, replace), create_append = (create, append).
        The upload may use view types and ``large_*`` types where the stream has the plain
        ones (:func:`flight_serve.store.same_values`); they are cast to the stream's types, and
        a table created here has the plain types. The first batch is checked before a table is
        replaced or created; a load that fails after creating its table drops that table again
        (so a refused ``create`` leaves no table behind, and a refused ``replace`` of a first
        batch keeps the old one). Batches appended to an existing table before a failure stay
        (there are no transactions).

        Raises:
            StreamNotFoundError: the table does not exist and ``mode[0]`` is ``fail``.
            AlreadyExistsError: the table exists and ``mode[1]`` is ``fail``.
            SchemaMismatchError: appending batches whose schema differs from the table's.
        """
        name = validate_stream_name(table)
        if_not_exist, if_exists = mode
        exists = self.store.exists(name)
        if exists and if_exists == "fail":
            raise AlreadyExistsError(f"table {name!r} already exists")
        if not exists and if_not_exist == "fail":
            raise StreamNotFoundError(f"table {name!r} does not exist")
        schema = plain_schema(schema)
        pending = iter(batches)
        first = next(pending, None)
        if first is not None:  # refused before anything is replaced or created
            if exists and if_exists == "append":
                self.store.validate(name, first)
            else:
                check_batch(name, schema, first)
        if exists and if_exists == "replace":
            self.store.drop(name)
            exists = False
        created = None if exists else self.store.create(name, schema)
        loaded = pending if first is None else itertools.chain([first], pending)
        try:
            return self._append_all(name, loaded, is_cancelled)
        except BaseException:
            if created is not None:
                self._drop_created(name, created.incarnation)
            raise

    def _drop_created(self, name: str, incarnation: str) -> None:
        """Drop the stream a failed create (or replace) made, unless it was re-created since."""
        try:
            if self.store.info(name).incarnation == incarnation:
                self.store.drop(name)
        except StreamNotFoundError:
            pass
