"""SQL planning over streams: table discovery, pinning, batch splitting, view-type conversion,
bare scans served from the stored batches."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, NoReturn

import datafusion
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve._arrow import ColumnMismatch
from flight_serve.errors import QueryError, TicketError
from flight_serve.flight.ops.limits import MemoryBudget, QueryLimits
from flight_serve.flight.sql import engine, query
from flight_serve.flight.sql.query import (
    conform_result,
    execute,
    plain_schema,
    plan,
    split_batch,
    to_plain,
)
from flight_serve.flight.sql.statement import Statement, referenced_tables
from flight_serve.flight.tickets import QueryTicket, StreamPin
from flight_serve.store import StreamStore
from hypothesis import given
from hypothesis import strategies as st


def test_referenced_tables_follow_datafusion_identifier_rules() -> None:
    sql = (
        'WITH w AS (SELECT * FROM "Mixed.Case") '
        "SELECT * FROM Flights f JOIN public.planes p ON true JOIN other.x ON true, w"
    )
    assert referenced_tables(sql) == {"Mixed.Case", "flights", "planes", "w"}
    assert referenced_tables("SELEC nonsense (((") is None


def test_plan_pins_only_the_referenced_streams(store: StreamStore) -> None:
    store.append("a", pa.record_batch({"x": [1]}))
    store.append("a", pa.record_batch({"x": [2]}))
    store.append("b", pa.record_batch({"y": ["q"]}))
    schema, ticket = plan("SELECT x * 2 AS d FROM a", store)
    assert schema == pa.schema([("d", pa.int64())])
    assert ticket == QueryTicket(
        "SELECT x * 2 AS d FROM a", (StreamPin("a", store.info("a").incarnation, 2),)
    )
    store.append("a", pa.record_batch({"x": [3]}))
    out_schema, batches = execute(ticket, store)
    assert out_schema == schema
    assert pa.Table.from_batches(list(batches), schema).sort_by("d").to_pydict() == {"d": [2, 4]}


def test_execute_refuses_a_stale_pin(store: StreamStore) -> None:
    store.append("a", pa.record_batch({"x": [1]}))
    _, ticket = plan("SELECT x FROM a", store)
    store.drop("a")
    with pytest.raises(TicketError, match="stale ticket: stream 'a'"):
        execute(ticket, store)
    store.append("a", pa.record_batch({"x": [1]}))
    with pytest.raises(TicketError, match="stale ticket: stream 'a'"):
        execute(ticket, store)


def test_queries_are_read_only(store: StreamStore) -> None:
    store.append("a", pa.record_batch({"x": [1]}))
    for sql, message in [
        ("COPY (SELECT 1) TO '/tmp/x.csv'", "DML not supported"),
        ("INSERT INTO a VALUES (2)", "DML not supported"),
        ("CREATE VIEW v AS SELECT 1", "DDL not supported"),
        ("SET datafusion.execution.batch_size = 1", "Statement not supported"),
        ("   ", "empty SQL query"),
    ]:
        with pytest.raises(QueryError, match=message):
            plan(sql, store)


def test_list_views_with_nulls_and_slices_become_lists() -> None:
    array = pa.array([[1, 2], None, [], [3], [4, 5, 6]], pa.list_view(pa.int64())).slice(1)
    plain = to_plain(array, pa.list_(pa.int64()))
    plain.validate(full=True)
    assert plain.type == pa.list_(pa.int64())
    assert plain.to_pylist() == [None, [], [3], [4, 5, 6]]


def test_nested_view_types_become_plain() -> None:
    view = pa.struct([("s", pa.string_view()), ("l", pa.large_list_view(pa.binary_view()))])
    schema = plain_schema(pa.schema([("n", view)]))
    target = pa.struct([("s", pa.string()), ("l", pa.large_list(pa.binary()))])
    assert schema == pa.schema([("n", target)])
    array = pa.array([{"s": "a", "l": [b"x"]}, None, {"s": None, "l": None}], type=view).slice(0)
    assert to_plain(array, target).to_pylist() == [
        {"s": "a", "l": [b"x"]},
        None,
        {"s": None, "l": None},
    ]


@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=0, max_size=60),
    st.integers(min_value=1, max_value=2000),
)
def test_split_batch_keeps_rows_in_order_within_the_limit(lengths: list[int], limit: int) -> None:
    batch = pa.record_batch({"s": pa.array(["x" * n for n in lengths], pa.string())})
    pieces = list(split_batch(batch, limit))
    assert pa.Table.from_batches(pieces, batch.schema).column("s").to_pylist() == (
        batch.column(0).to_pylist()
    )
    for piece in pieces:
        assert piece.nbytes <= limit or piece.num_rows == 1


def test_conform_result_gives_plain_types_and_the_schema_flags() -> None:
    schema = pa.schema([pa.field("s", pa.string(), nullable=False)], metadata={b"k": b"v"})
    batch = pa.record_batch({"s": pa.array(["a", "b"], pa.string_view())})
    conformed = conform_result(batch, schema)
    assert conformed.schema.equals(schema, check_metadata=True)
    assert conformed.column(0).to_pylist() == ["a", "b"]
    same = pa.record_batch({"s": pa.array(["a"], pa.string())}, schema=schema)
    assert conform_result(same, schema) is same


def test_conform_result_raises_the_arrow_error_not_the_helpers() -> None:
    # the Flight status of a result column that does not convert is the Arrow error's
    batch = pa.record_batch({"x": pa.array(["not a number"], pa.string_view())})
    with pytest.raises(pa.ArrowInvalid) as raised:
        conform_result(batch, pa.schema([("x", pa.int64())]))
    assert not isinstance(raised.value, ColumnMismatch)
    assert "not a number" in str(raised.value)


# --- bare scans served from the stored batches (query.stored_scan) ------------------------------


def _fill(store: StreamStore) -> None:
    """Stream ``s``: three batches, one of them empty and one with a null, a view column."""
    schema = pa.schema([("x", pa.int64()), ("v", pa.string_view()), ("f", pa.float64())])
    for xs, vs in (([1, 2, 3], ["a", None, "c"]), ([], []), ([4, 5], ["d", "e"])):
        floats = [x / 2 for x in xs]
        store.append("s", pa.record_batch([xs, vs, floats], schema=schema))


def _datafusion_run(
    ticket: QueryTicket, store: StreamStore, monkeypatch: pytest.MonkeyPatch
) -> list[pa.RecordBatch]:
    """The ticket's batches as DataFusion's execution gives them (the stored scan turned off)."""
    with monkeypatch.context() as patched:
        patched.setattr(query, "stored_scan", lambda df, tables: None)
        _, batches = execute(ticket, store, max_batch_bytes=40)
        return list(batches)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM s",
        "SELECT x, f FROM s",
        "SELECT v FROM public.s",
        "SELECT * FROM datafusion.public.s WHERE true",
        "SELECT * FROM (SELECT * FROM s)",
    ],
)
def test_a_bare_scan_sends_the_stored_batches_exactly_as_datafusion_would(
    store: StreamStore, sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store)
    schema, ticket = plan(sql, store)
    late = {"x": [9], "v": pa.array(["late"], pa.string_view()), "f": [9.0]}
    store.append("s", pa.record_batch(late))  # after planning: not in the snapshot
    reference = _datafusion_run(ticket, store, monkeypatch)

    def no_datafusion(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("a bare scan must not run DataFusion")

    monkeypatch.setattr(query, "interruptible_batches", no_datafusion)
    out_schema, batches = execute(ticket, store, max_batch_bytes=40)
    got = list(batches)
    assert out_schema == schema
    assert [b.schema for b in got] == [b.schema for b in reference]
    assert [b.to_pydict() for b in got] == [b.to_pydict() for b in reference]
    assert [b.num_rows for b in got] == [b.num_rows for b in reference]
    assert sum(b.num_rows for b in got) == 5  # the empty batch skipped, the late one unseen
    assert "string_view" not in str(out_schema)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT f, x FROM s",  # reordered
        "SELECT x AS y FROM s",  # renamed
        "SELECT *, 1 AS one FROM s",
        "SELECT * FROM s WHERE x > 1",
        "SELECT * FROM s LIMIT 2",
        "SELECT * FROM s AS t",
        "SELECT * FROM s ORDER BY x",
        "SELECT DISTINCT x FROM s",
        "SELECT * FROM information_schema.tables",
    ],
)
def test_every_other_plan_runs_in_datafusion(store: StreamStore, sql: str) -> None:
    _fill(store)
    ctx = query.new_context(config=datafusion.SessionConfig().with_information_schema(True))
    tables = {"s": store.batches("s"), "tables": store.batches("s")}  # not information_schema's
    ctx.register_record_batches('"s"', [tables["s"]])
    assert query.stored_scan(ctx.sql(sql), tables) is None


def test_a_bare_scan_checks_cancellation_and_the_statement_timeout(store: StreamStore) -> None:
    _fill(store)
    _, ticket = plan("SELECT * FROM s", store)
    _, batches = execute(ticket, store, is_cancelled=lambda: True)
    with pytest.raises(flight.FlightCancelledError, match="the call was cancelled"):
        next(batches)
    limits = QueryLimits(statement_timeout_s=0.0)
    _, batches = execute(ticket, store, limits=limits)
    with pytest.raises(flight.FlightTimedOutError, match="statement timeout"):
        next(batches)
    calls = iter([False, True])  # cancelled after the first batch was sent
    _, batches = execute(ticket, store, is_cancelled=lambda: next(calls))
    assert next(batches).num_rows == 3
    with pytest.raises(flight.FlightCancelledError):
        next(batches)


def test_a_bare_scan_holds_its_memory_reservation_until_it_ends(store: StreamStore) -> None:
    _fill(store)
    budget = MemoryBudget(10 << 20, wait_s=0.0)
    limits = QueryLimits(budget, work_bytes=1 << 20)
    _, ticket = plan("SELECT * FROM s", store)
    _, batches = execute(ticket, store, limits=limits)
    assert budget.in_use() == {"query": (1 << 20) + store.info("s").num_bytes}
    assert next(batches).num_rows == 3  # the reservation is held while it sends
    assert budget.in_use() == {"query": (1 << 20) + store.info("s").num_bytes}
    assert sum(b.num_rows for b in batches) == 2
    assert budget.in_use() == {}


def test_flight_sql_sends_a_bare_scan_from_the_stored_batches_unless_it_has_parameters(
    store: StreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store)
    sql_engine = engine.SqlEngine(store, max_batch_bytes=40)
    schema, ticket = sql_engine.plan_query(Statement.parse("SELECT * FROM s"), None)
    late = {"x": [9], "v": pa.array(["late"], pa.string_view()), "f": [9.0]}
    store.append("s", pa.record_batch(late))
    with monkeypatch.context() as patched:
        patched.setattr(engine, "stored_scan", lambda df, tables: None)
        reference = list(sql_engine.open_query(ticket, None)[1])
    ran: list[str] = []
    real = engine.interruptible_batches

    def counted(*args: Any, **kwargs: Any) -> Any:
        ran.append("datafusion")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "interruptible_batches", counted)
    out_schema, batches = sql_engine.open_query(ticket, None)
    got = list(batches)
    assert (out_schema, ran) == (schema, [])
    assert [b.schema for b in got] == [b.schema for b in reference]
    assert [b.to_pydict() for b in got] == [b.to_pydict() for b in reference]
    assert sum(b.num_rows for b in got) == 5

    # a bound parameter row (even one the plan does not use) runs in DataFusion
    statement = Statement.parse("SELECT * FROM s WHERE x > ?")
    params = pa.table({"1": [1]})
    _, ticket = sql_engine.plan_query(statement, params)
    rows = [b.to_pydict() for b in sql_engine.open_query(ticket, params)[1]]
    assert ran == ["datafusion"]
    assert sum(len(r["x"]) for r in rows) == 5  # 2, 3, 4, 5, 9: the late batch is pinned now


class _BlockingStream:
    """Stands in for a DataFusion DataFrame and its stream: one batch, then an ``__anext__``
    that never completes (a blocking operator still computing), noting when it is cancelled."""

    def __init__(self) -> None:
        self.sent = False
        self.cancelled = threading.Event()

    def execute_stream(self) -> _BlockingStream:
        return self

    def to_pyarrow(self) -> pa.RecordBatch:
        return pa.record_batch({"x": [1]})

    async def __anext__(self) -> _BlockingStream:
        if not self.sent:
            self.sent = True
            return self
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


def test_ending_the_batches_cancels_datafusions_pending_step_at_once() -> None:
    stream = _BlockingStream()
    pulled = query.interruptible_batches(stream, limits=QueryLimits(poll_s=10.0))
    assert next(pulled).num_rows == 1
    pulled.close()  # the client went away while DataFusion computes the next batch
    # at once, not at the worker's next poll (10 s)
    assert stream.cancelled.wait(timeout=2.0)
    deadline = time.monotonic() + 2.0
    while any(t.name == "flight-serve-query" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the query worker did not end"
        time.sleep(0.01)
