"""connectors.columns.conform: every source's batches get the declared columns, or an error
that names the column."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flight_serve.connectors.columns import conform, same_rows
from flight_serve.errors import ConnectorError

DECLARED = pa.schema([("t", pa.int64()), ("k", pa.string())])


def test_columns_are_picked_by_name_in_declared_order_and_cast() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"extra": [9, 9], "k": ["a", "b"], "t": pa.array([1, 2], pa.int32())}
    )
    out = conform(batch, DECLARED, "src")
    assert out.schema == DECLARED
    assert out.to_pydict() == {"t": [1, 2], "k": ["a", "b"]}


def test_a_batch_of_the_declared_schema_is_returned_as_it_is() -> None:
    batch = pa.RecordBatch.from_pydict({"t": [1], "k": ["a"]}, schema=DECLARED)
    assert conform(batch, DECLARED, "src") is batch


def test_a_missing_column_is_named_with_the_columns_the_batch_has() -> None:
    batch = pa.RecordBatch.from_pydict({"t": [1], "key": ["a"]})
    with pytest.raises(ConnectorError) as e:
        conform(batch, DECLARED, "file connector: /d/a.csv")
    assert str(e.value) == (
        "file connector: /d/a.csv: a batch does not fit the declared columns: it has no column "
        "'k'; its columns: t, key"
    )


def test_a_column_that_does_not_convert_is_named_with_its_type() -> None:
    batch = pa.RecordBatch.from_pydict({"t": ["soon"], "k": ["a"]})
    with pytest.raises(ConnectorError, match=r"^src: a batch does not fit the declared columns: "
                       r"column 't' does not convert to int64: "):  # fmt: skip
        conform(batch, DECLARED, "src")


def test_same_rows_compares_view_large_and_dictionary_columns_by_their_values() -> None:
    """A stream stores view and ``large_*`` types as plain ones: the stream sinks compare a batch
    they sent with its copy read back (exactly once after a restart) through ``same_rows``."""
    stored = pa.record_batch(
        {"s": ["x", None], "b": [b"y", None], "l": [["p"], None], "st": [{"f": "q"}, None]}
    )
    sent_as = {
        "views": pa.schema(
            [
                ("s", pa.string_view()),
                ("b", pa.binary_view()),
                ("l", pa.list_(pa.string_view())),
                ("st", pa.struct([("f", pa.string_view())])),
            ]
        ),
        "large": pa.schema(
            [
                ("s", pa.large_string()),
                ("b", pa.large_binary()),
                ("l", pa.large_list(pa.large_string())),
                ("st", pa.struct([("f", pa.large_string())])),
            ]
        ),
    }
    for kind, schema in sent_as.items():
        sent = pa.RecordBatch.from_pylist(stored.to_pylist(), schema=schema)
        assert same_rows(sent, stored), kind
        assert same_rows(stored, sent), kind
        other = pa.RecordBatch.from_pylist(
            [{"s": "x", "b": b"y", "l": ["p"], "st": {"f": "q"}}, {"s": "z"}], schema=schema
        )
        assert not same_rows(other, stored), kind
    dictionary = pa.record_batch({"s": pa.array(["x", None], pa.string_view()).dictionary_encode()})
    assert same_rows(dictionary, stored.select(["s"]))
