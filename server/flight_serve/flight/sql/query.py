"""SQL over streams with DataFusion: plan a query into a ticket, execute a ticket into batches.

Each stream is a table named after it. Table names follow SQL identifier rules as DataFusion
applies them: an unquoted name is lower-cased, so a stream with upper-case letters or a ``.``/``-``
in its name is written quoted (``SELECT * FROM "Flights.v2"``).

Snapshot rule: :func:`plan` pins every stream the query reads at its current ``next_offset``
(and incarnation) in the returned :class:`~flight_serve.flight.tickets.QueryTicket`;
:func:`execute` reads only batches below the pinned offsets, so ``GetFlightInfo`` and ``DoGet``
see the same data even while DoPut keeps appending. A ticket whose stream was dropped or
re-created since planning raises :class:`~flight_serve.errors.TicketError` ("stale").

Queries are read-only: DDL (``CREATE ...``), DML (``INSERT``, ``COPY ... TO``) and statements
(``SET``) are refused with a :class:`~flight_serve.errors.QueryError`, as is anything DataFusion
cannot parse, plan or run; the message is DataFusion's own. Row order is defined only by
``ORDER BY``.

Limits (:class:`~flight_serve.flight.ops.limits.QueryLimits`): under a memory budget a query
reserves the bytes of the streams it reads plus DataFusion's working memory before it loads
them (waiting, then UNAVAILABLE), and DataFusion runs with a fair spill pool of that working
size. DataFusion's stream is pulled on a worker thread (:func:`interruptible_batches`, through
DataFusion's async API) while the call's thread waits, checking every ``poll_s`` for the
client's cancellation and the statement timeout: the call ends at once (CANCELLED /
DEADLINE_EXCEEDED) and the worker cancels the batch in progress, which drops DataFusion's work
even inside a blocking operator (sort, aggregate, join build). Its memory reservation is held
until the worker really ends.

Plain scans skip DataFusion's execution (:func:`stored_scan`): when the optimized plan is one
bare ``TableScan`` of a stream (``SELECT * FROM s``, or columns in the table's order, no filter,
no limit), DataFusion would only hand the registered batches back unchanged, in order; the
stored batches (zero-copy views of the segment files, below the pinned offsets) are then sent
themselves, with the same snapshot, schema, conversions, memory reservation, cancellation and
statement timeout (checked before every batch) as a query DataFusion runs.

Results are sent as record batches of at most :data:`MAX_RESULT_BATCH_BYTES` (3 MiB,
``RecordBatch.nbytes``, so that each message with its IPC framing fits the 4 MiB a gRPC client
receives by default; a single row larger than that is sent alone), with view types
(``string_view``, ``binary_view``, ``list_view``, ``large_list_view``) converted to their plain
counterparts in both the announced schema and the batches, so every Flight client can read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import datafusion
import pyarrow as pa
import pyarrow.flight as flight

from flight_serve._arrow import ColumnMismatch, conform_batch, plain_schema
from flight_serve.engine.sqlguard import check_sql
from flight_serve.errors import QueryError, StreamNotFoundError, TicketError
from flight_serve.flight.ops.limits import QueryLimits, Reservation
from flight_serve.flight.sql.catalog import iceberg_input_bytes, register_iceberg_tables
from flight_serve.flight.sql.statement import Statement
from flight_serve.flight.tickets import QueryTicket, StreamPin
from flight_serve.store import StreamStore, to_plain

__all__ = [
    "MAX_RESULT_BATCH_BYTES",
    "SESSION_TIME_ZONE",
    "checked_batches",
    "conform_result",
    "execute",
    "interruptible_batches",
    "new_context",
    "plain_schema",
    "plan",
    "reserve_input",
    "split_batch",
    "stored_scan",
    "to_plain",
]

#: The session time zone of every SQL context (``datafusion.execution.time_zone``).
SESSION_TIME_ZONE: Final = "UTC"

#: Upper bound on ``RecordBatch.nbytes`` of every batch a DoGet sends: 3 MiB, so each message
#: (the batch's IPC body plus its header and padding) stays below the 4 MiB that gRPC clients
#: receive by default (tonic refused a 4 MiB piece: "decoded message length too large: found
#: 4194521 bytes, the limit is: 4194304 bytes"; grpc-java and grpc-go have the same default).
MAX_RESULT_BATCH_BYTES = 3 * 1024 * 1024


def _sql_options() -> datafusion.SQLOptions:
    return (
        datafusion.SQLOptions()
        .with_allow_ddl(False)
        .with_allow_dml(False)
        .with_allow_statements(False)
    )


def conform_result(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` (a DataFusion result batch, columns in ``schema``'s order) with ``schema``'s
    plain types, names and nullability flags (:func:`flight_serve._arrow.conform_batch`).

    Raises:
        pyarrow.ArrowInvalid / pyarrow.ArrowNotImplementedError: a column does not convert:
            the Arrow error itself, not the helper's :class:`~flight_serve._arrow.ColumnMismatch`.
        ValueError: ``batch`` has another number of columns than ``schema``.
    """
    try:
        return conform_batch(batch, schema)
    except ColumnMismatch as exc:
        raise (exc.cause or exc) from None


def split_batch(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """Yield zero-copy slices of ``batch`` whose ``nbytes`` is at most ``max_bytes`` each (a
    single row larger than ``max_bytes`` is yielded alone). Row order is kept.

    >>> b = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    >>> [s.num_rows for s in split_batch(b, 3000)]
    [334, 334, 332]
    """
    if batch.nbytes <= max_bytes or batch.num_rows <= 1:
        yield batch
        return
    parts = -(-batch.nbytes // max_bytes)
    step = max(1, -(-batch.num_rows // parts))
    for start in range(0, batch.num_rows, step):
        piece = batch.slice(start, step)
        if piece.nbytes <= max_bytes or piece.num_rows <= 1:
            yield piece
        else:  # skewed rows: halve until it fits
            half = piece.num_rows // 2
            yield from split_batch(piece.slice(0, half), max_bytes)
            yield from split_batch(piece.slice(half), max_bytes)


def _datafusion_message(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


#: DataFusion's words for a table it does not find (``table 'datafusion.public.t' not found``);
#: the name as written when it is in the default catalog and schema.
_MISSING_TABLE: Final = re.compile(r"table '(?:datafusion\.public\.)?(.+?)' not found")


def datafusion_error(exc: BaseException) -> QueryError | StreamNotFoundError:
    """DataFusion's exception (it raises bare ``Exception`` / ``ValueError``) as flight-serve's:
    a table it does not find is :class:`~flight_serve.errors.StreamNotFoundError` naming the
    table (NOT_FOUND, DESIGN §6: missing → NOT_FOUND), anything else a
    :class:`~flight_serve.errors.QueryError` (INVALID_ARGUMENT); the message keeps DataFusion's.
    Both query paths, plain Flight and Flight SQL, raise what this returns.

    >>> str(datafusion_error(Exception("Error during planning: table 'datafusion.public.t' not found")))
    "table 't' does not exist (Error during planning: table 'datafusion.public.t' not found)"
    """
    message = _datafusion_message(exc)
    missing = _MISSING_TABLE.search(message)
    if missing is not None:
        return StreamNotFoundError(f"table {missing.group(1)!r} does not exist ({message})")
    return QueryError(message)


def new_context(
    limits: QueryLimits | None = None, config: datafusion.SessionConfig | None = None
) -> datafusion.SessionContext:
    """A DataFusion context with the session time zone UTC (:data:`SESSION_TIME_ZONE`); under a
    memory budget with a fair spill pool of ``limits.work_bytes``.

    The time zone makes ``TIMESTAMPTZ`` / ``TIMESTAMP WITH TIME ZONE`` (casts, DDL), ``now()``
    and ``to_timestamp(…)`` UTC-zoned (``timestamp[ns, tz=UTC]``), as in PostgreSQL with
    ``TimeZone = UTC``; DataFusion 55 has no session time zone by default and returns a
    timestamp without a zone for them. ``TIMESTAMP`` stays without a zone.
    """
    config = (config or datafusion.SessionConfig()).set(
        "datafusion.execution.time_zone", SESSION_TIME_ZONE
    )
    if limits is None or limits.budget is None:
        return datafusion.SessionContext(config)
    runtime = datafusion.RuntimeEnvBuilder().with_fair_spill_pool(limits.work_bytes)
    return datafusion.SessionContext(config, runtime)


_new_context = new_context


def reserve_input(
    limits: QueryLimits | None,
    store: StreamStore,
    pins: Iterable[StreamPin],
    what: str,
    statement: Statement | None = None,
) -> Reservation | None:
    """Reserve, in ``limits.budget``, the on-disk bytes of the streams ``pins`` name (what
    loading them takes, about), the data-file bytes of the Iceberg tables ``statement`` names
    (:func:`~flight_serve.flight.sql.catalog.iceberg_input_bytes`), plus
    ``limits.work_bytes``; ``None`` without a budget.

    Raises:
        OverloadError: no room within the budget's wait (UNAVAILABLE, retryable).
        InvalidInputError: the query needs more than the whole budget.
    """
    if limits is None or limits.budget is None:
        return None
    nbytes = limits.work_bytes
    for pin in pins:
        with contextlib.suppress(StreamNotFoundError):  # a stale ticket, reported later
            nbytes += store.info(pin.stream).num_bytes
    if statement is not None:
        nbytes += iceberg_input_bytes(statement.iceberg_refs, store.data_dir)
    return limits.budget.reserve(nbytes, "query", what)


@dataclass(frozen=True)
class _Failure:
    message: str


def _check_call(
    is_cancelled: Callable[[], bool] | None, deadline: float | None, timeout: float | None
) -> None:
    """Raise if the client cancelled the call or the statement timeout (``deadline``, a
    :func:`time.monotonic` value, ``None`` for none) has passed."""
    if is_cancelled is not None and is_cancelled():
        raise flight.FlightCancelledError(
            "the call was cancelled; the query stopped (DataFusion's stream dropped)"
        )
    if deadline is not None and time.monotonic() >= deadline:
        raise flight.FlightTimedOutError(
            f"statement timeout: the query ran longer than {timeout:g} s "
            "(--statement-timeout); it was stopped"
        )


def _deadline(limits: QueryLimits, started: float | None) -> float | None:
    timeout = limits.statement_timeout_s
    begin = time.monotonic() if started is None else started
    return None if timeout is None else begin + timeout


def checked_batches(
    batches: Iterable[pa.RecordBatch],
    *,
    limits: QueryLimits | None = None,
    is_cancelled: Callable[[], bool] | None = None,
    started: float | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """Yield ``batches`` (already in memory: a :func:`stored_scan`), checking before each one
    and before the end, like :func:`interruptible_batches`, for ``is_cancelled()`` and the
    statement timeout counted from ``started`` (default now).

    Raises:
        pyarrow.flight.FlightCancelledError: the client cancelled the call (CANCELLED).
        pyarrow.flight.FlightTimedOutError: the statement timeout passed (DEADLINE_EXCEEDED).
    """
    limits = limits or QueryLimits()
    deadline = _deadline(limits, started)
    timeout = limits.statement_timeout_s
    for batch in batches:
        _check_call(is_cancelled, deadline, timeout)
        yield batch
    _check_call(is_cancelled, deadline, timeout)


_END: Final = object()


def interruptible_batches(
    df: Any,
    *,
    limits: QueryLimits | None = None,
    is_cancelled: Callable[[], bool] | None = None,
    started: float | None = None,
    translate: Callable[[str], Exception] = QueryError,
    reservation: Reservation | None = None,
) -> Generator[pa.RecordBatch, None, None]:
    """Yield the batches of ``df.execute_stream()`` (pyarrow, as DataFusion makes them), pulled
    on a worker thread at most two batches ahead, while this thread waits checking every
    ``limits.poll_s`` seconds for ``is_cancelled()`` and the statement timeout (counted from
    ``started``, a :func:`time.monotonic` value; default now). The worker holds
    ``reservation`` (:meth:`~flight_serve.flight.ops.limits.Reservation.hold`) while it runs: the
    caller's ``release()`` takes effect only once DataFusion's work has really ended.

    DataFusion's stream is driven through its async API (``__anext__``) on an event loop of the
    worker's own: a blocking operator (an aggregate, a sort) computes inside one ``__anext__``
    for as long as its input lasts, and cancelling that future drops DataFusion's work at its
    next yield point (milliseconds), where the synchronous ``next()`` can only be abandoned
    and keeps computing to its end. The worker awaits each ``__anext__`` without a timeout;
    when this generator ends early (cancellation, timeout, the client gone) it cancels the
    worker's task through its loop (``call_soon_threadsafe``), which cancels the
    ``__anext__`` in progress.

    Raises:
        pyarrow.flight.FlightCancelledError: the client cancelled the call (CANCELLED).
        pyarrow.flight.FlightTimedOutError: the statement timeout passed (DEADLINE_EXCEEDED).
        Exception: ``translate(DataFusion's message)`` when DataFusion fails.
    """
    limits = limits or QueryLimits()
    timeout = limits.statement_timeout_s
    deadline = _deadline(limits, started)
    out: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()
    # the worker's loop and task, so that stopping wakes it (set and read under the lock)
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []
    running_lock = threading.Lock()

    def offer(item: Any) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    async def pump() -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio.run runs pump as a task
        with running_lock:
            running.append((asyncio.get_running_loop(), task))
        stream = df.execute_stream()
        try:
            while not stop.is_set():
                try:
                    # cancelled by stop_worker: drops DataFusion's future, its work stops
                    result = await stream.__anext__()
                except StopAsyncIteration:
                    offer(_END)
                    return
                offer(result.to_pyarrow())
        except asyncio.CancelledError:
            return
        finally:
            del stream  # dropping the stream aborts DataFusion's remaining tasks

    def stop_worker() -> None:
        stop.set()
        with running_lock:
            for loop, task in running:
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(task.cancel)

    def work() -> None:
        try:
            asyncio.run(pump())
        except Exception as exc:  # DataFusion raises bare Exception / ValueError
            offer(_Failure(_datafusion_message(exc)))
        finally:
            if reservation is not None:
                reservation.let_go()

    worker: threading.Thread | None = None
    try:
        worker = threading.Thread(target=work, name="flight-serve-query", daemon=True)
        if reservation is not None:
            reservation.hold()
        try:
            worker.start()
        except BaseException:
            if reservation is not None:
                reservation.let_go()
            raise
        while True:
            _check_call(is_cancelled, deadline, timeout)
            try:
                item = out.get(timeout=limits.poll_s)
            except queue.Empty:
                continue
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise translate(item.message)
            yield item
    finally:
        stop_worker()


def _register(
    ctx: datafusion.SessionContext, name: str, schema: pa.Schema, batches: list[pa.RecordBatch]
) -> None:
    if not batches:  # DataFusion needs one batch to know the schema
        batches = [pa.RecordBatch.from_pylist([], schema=schema)]
    # Quoted, so the table is named exactly like the stream (no lower-casing, dots allowed).
    ctx.register_record_batches(f'"{name}"', [batches])


def stored_scan(df: Any, tables: Mapping[str, list[pa.RecordBatch]]) -> list[pa.RecordBatch] | None:
    """The batches ``df`` yields, taken from ``tables`` (stream name -> the batches registered
    for it, in order) without running DataFusion, when ``df``'s optimized logical plan is one
    bare scan of such a stream; ``None`` for every other plan (the query then runs).

    A bare scan is a ``TableScan`` of a table of the session's default catalog and schema
    (``s``, ``public.s``, ``datafusion.public.s``) with no filter and no fetch (limit), at the
    root of the plan: ``SELECT * FROM s``, ``SELECT a, b FROM s`` (columns in the table's
    order), ``SELECT * FROM (SELECT * FROM s)``, ``... WHERE true``. Anything the optimizer
    leaves above the scan (a projection that renames, reorders or computes, a filter, a limit,
    an alias, a sort, an aggregate, a join) is not one. DataFusion executes a bare scan of a
    registered memory table as one ``DataSourceExec`` over its one partition, which yields the
    registered batches unchanged in their order, projected to the scan's columns: so does
    this (``RecordBatch.select``, zero-copy). Empty batches are kept, as DataFusion keeps them.

    >>> ctx = datafusion.SessionContext()
    >>> b = pa.record_batch({"x": [1, 2], "y": ["a", "b"]})
    >>> ctx.register_record_batches("s", [[b]])
    >>> [t.to_pydict() for t in stored_scan(ctx.sql("SELECT y FROM s"), {"s": [b]})]
    [{'y': ['a', 'b']}]
    >>> stored_scan(ctx.sql("SELECT y, x FROM s"), {"s": [b]}) is None
    True
    """
    try:
        scan = df.optimized_logical_plan().to_variant()
    except Exception:  # DataFusion raises bare Exception; the query then reports it
        return None
    if not isinstance(scan, datafusion.expr.TableScan):
        return None
    if scan.filters() or scan.fetch() is not None:
        return None
    catalog, schema_name, table = scan.fqn()
    if catalog not in (None, "datafusion") or schema_name not in (None, "public"):
        return None
    batches = tables.get(table)
    if batches is None:
        return None
    columns = [index for index, _ in scan.projection()]
    if batches and columns != list(range(batches[0].num_columns)):
        return [batch.select(columns) for batch in batches]
    return list(batches)


def _dataframe(ctx: datafusion.SessionContext, sql: str) -> Any:
    check_sql(sql)  # DataFusion would crash on a deeply nested expression (engine/sqlguard.py)
    try:
        return ctx.sql_with_options(sql, _sql_options())
    except Exception as exc:  # DataFusion raises bare Exception / ValueError
        raise datafusion_error(exc) from None


def _schema_of(df: Any) -> pa.Schema:
    try:
        schema: pa.Schema = df.schema()
    except Exception as exc:
        raise datafusion_error(exc) from None
    return schema


def plan(sql: str, store: StreamStore) -> tuple[pa.Schema, QueryTicket]:
    """Plan ``sql`` over the streams of ``store``; return the result schema and a ticket.

    The schema has no view types (see the module docstring). The ticket pins each stream the
    query references at its incarnation and current ``next_offset``.

    Raises:
        QueryError: DataFusion cannot parse or plan ``sql``, or it is not a read-only query (the
            message is DataFusion's own).
        StreamNotFoundError: a table the query names does not exist (:func:`datafusion_error`).
    """
    if not sql.strip():
        raise QueryError("empty SQL query")
    statement = Statement.parse(sql, placeholders=False)  # checks the size before sqlglot
    wanted = statement.tables
    infos = [info for info in store.list_streams() if wanted is None or info.name in wanted]
    ctx = _new_context()
    for info in infos:
        _register(ctx, info.name, info.schema, [])  # planning needs schemas only
    register_iceberg_tables(ctx, statement.iceberg_refs, store.data_dir, data=False)
    schema = plain_schema(_schema_of(_dataframe(ctx, sql)))
    pins = tuple(StreamPin(i.name, i.incarnation, i.next_offset) for i in infos)
    return schema, QueryTicket(sql, pins)


def execute(
    ticket: QueryTicket,
    store: StreamStore,
    *,
    max_batch_bytes: int = MAX_RESULT_BATCH_BYTES,
    limits: QueryLimits | None = None,
    is_cancelled: Callable[[], bool] | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Run a planned query over the pinned stream snapshots.

    Returns the result schema (no view types) and a lazy iterator of batches of at most
    ``max_batch_bytes`` each. Planning errors raise here; errors while running raise from the
    iterator. With ``limits`` the query reserves memory first and runs interruptibly (module
    docstring); ``is_cancelled`` is polled while it runs.

    Raises:
        TicketError: a pinned stream was dropped or re-created since planning ("stale").
        QueryError: DataFusion rejects the query or fails while running it.
        OverloadError: the memory budget has no room (UNAVAILABLE, retryable).
        pyarrow.flight.FlightCancelledError / FlightTimedOutError: from the iterator, when the
            client cancels / the statement timeout passes.
    """
    started = time.monotonic()
    statement = Statement.parse(ticket.sql, placeholders=False)
    reservation = reserve_input(limits, store, ticket.pins, "this query", statement)
    try:
        ctx = new_context(limits)
        registered: dict[str, list[pa.RecordBatch]] = {}
        for pin in ticket.pins:
            try:
                info = store.info(pin.stream)
                if info.incarnation != pin.incarnation:
                    raise StreamNotFoundError(f"stream {pin.stream!r} was re-created")
                batches = store.batches(
                    pin.stream, stop=pin.stop_offset, incarnation=pin.incarnation
                )
            except StreamNotFoundError:
                raise TicketError(
                    f"stale ticket: stream {pin.stream!r} incarnation {pin.incarnation} no "
                    "longer exists (dropped or re-created); plan the query again"
                ) from None
            _register(ctx, pin.stream, info.schema, batches)
            registered[pin.stream] = batches
        refs = statement.iceberg_refs
        register_iceberg_tables(ctx, refs, store.data_dir, data=True)  # current snapshots
        df = _dataframe(ctx, ticket.sql)
        schema = plain_schema(_schema_of(df))
        stored = None if refs else stored_scan(df, registered)
    except BaseException:
        if reservation is not None:
            reservation.release()
        raise
    pulled: Generator[pa.RecordBatch, None, None]
    if stored is not None:  # a bare scan: the stored batches themselves (module docstring)
        pulled = checked_batches(stored, limits=limits, is_cancelled=is_cancelled, started=started)
    else:
        pulled = interruptible_batches(
            df, limits=limits, is_cancelled=is_cancelled, started=started, reservation=reservation
        )
    return schema, _run(pulled, schema, max_batch_bytes, reservation)


def _run(
    pulled: Generator[pa.RecordBatch, None, None],
    schema: pa.Schema,
    max_batch_bytes: int,
    reservation: Reservation | None,
) -> Iterator[pa.RecordBatch]:
    try:
        for batch in pulled:
            if batch.num_rows == 0:
                continue
            yield from split_batch(conform_result(batch, schema), max_batch_bytes)
    finally:
        pulled.close()  # (a generator) stops the worker before the bytes are given back
        if reservation is not None:
            reservation.release()  # takes effect when the worker really ended
