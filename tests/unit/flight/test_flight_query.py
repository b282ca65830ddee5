"""SQL planning over streams: table discovery, pinning, batch splitting, view-type conversion."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flight_serve._arrow import ColumnMismatch
from flight_serve.errors import QueryError, TicketError
from flight_serve.flight.sql.query import (
    conform_result,
    execute,
    plain_schema,
    plan,
    split_batch,
    to_plain,
)
from flight_serve.flight.sql.statement import referenced_tables
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
