"""The ``falkordb`` sink against a real FalkorDB server.

Every test writes its own graph on the session's server (``falkordb_url``, tests/integration/
conftest.py) and reads it back with plain Cypher through the ``falkordb`` client.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import falkordb
import pyarrow as pa
import pytest
import redis
from flight_serve._arrow import read_ipc
from flight_serve.connectors.falkordb import FalkorDBSink
from flight_serve.errors import ConnectorError, GraphStoreError, PipelineSQLError
from flight_serve.pipelines.graph_io import EpochGraphSink
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"
EDGE = {
    "edge_type": "LINK",
    "source_label": "Node",
    "source_column": "src",
    "source_key": "id",
    "target_label": "Node",
    "target_column": "dst",
    "target_key": "id",
}


def _rows(handle: Any, query: str) -> list[list[Any]]:
    return [list(row) for row in handle.query(query).result_set]


def _sink(url: str, graph: str, schema: pa.Schema, **options: str) -> FalkorDBSink:
    return FalkorDBSink("s", {"url": url, "graph": graph, **options}, schema, pipeline="test")


def test_edges_between_eight_nodes_read_back_each_edges_own_properties(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph
    # 8 nodes n0..n7; edges i -> i+1 and i -> i+3 (mod 8): 16 edges, each with its own values
    pairs = [(i, (i + step) % 8) for i in range(8) for step in (1, 3)]
    table = pa.table(
        {
            "src": [f"n{i}" for i, _ in pairs],
            "dst": [f"n{j}" for _, j in pairs],
            "weight": [i * 10 + j for i, j in pairs],
            "label": [f"{i}->{j}" for i, j in pairs],
        }
    )
    sink = _sink(falkordb_url, name, table.schema, **EDGE)
    result = sink.write(table)
    assert (result.rows_in, result.rows_written, result.queries) == (16, 16, 1)
    got = _rows(
        handle,
        "MATCH (s)-[r]->(t) RETURN s.id, t.id, r.weight, r.label ORDER BY s.id, t.id",
    )
    assert got == sorted([f"n{i}", f"n{j}", i * 10 + j, f"{i}->{j}"] for i, j in pairs)
    assert _rows(handle, "MATCH (n:Node) RETURN count(n)") == [[8]]
    # written again with new values: the same 16 edges, updated in place
    sink.write(table.set_column(2, "weight", pa.array([-w for w in table["weight"].to_pylist()])))
    assert _rows(handle, "MATCH ()-[r:LINK]->() RETURN count(r), sum(r.weight)") == [
        [16, -sum(i * 10 + j for i, j in pairs)]
    ]
    sink.close()


def test_same_edge_three_times_in_one_batch_leaves_one_edge_with_the_last_values(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph
    table = pa.table(
        {
            "src": ["a", "a", "b", "a"],
            "dst": ["b", "b", "a", "b"],
            "w": [1, 2, 9, 3],
            "note": ["first", "second", "back", "third"],
            "n": [10, 20, 5, 30],
        }
    )
    sink = _sink(falkordb_url, name, table.schema, **EDGE)
    assert sink.write(table).rows_written == 2  # (a, b) three times collapse to the last row
    assert _rows(
        handle, "MATCH (s)-[r]->(t) RETURN s.id, t.id, r.w, r.note, r.n ORDER BY s.id"
    ) == [["a", "b", 3, "third", 30], ["b", "a", 9, "back", 5]]
    # accumulate columns are summed over the collapsed rows instead
    counted = _sink(falkordb_url, name + "_acc", table.schema, accumulate="n", **EDGE)
    counted.write(table)
    counted.write(table)
    again = counted._graph
    assert _rows(again, "MATCH (s)-[r]->(t) RETURN s.id, t.id, r.w, r.n ORDER BY s.id") == [
        ["a", "b", 3, 120],  # 2 writes x (10 + 20 + 30)
        ["b", "a", 9, 10],
    ]
    again.delete()
    counted.close()
    sink.close()


def test_columns_named_user_id_at_type_and_a_dot_b_round_trip(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph
    table = pa.table(
        {
            "user-id": ["u1", "u2"],
            "@type": ["Person", "Bot"],
            "a.b": [1.5, 2.0],
            "plain": [1, 2],
            "nested": pa.array(
                [{"x": 1, "y-z": "p"}, {"x": 2, "y-z": None}],
                pa.struct([("x", pa.int64()), ("y-z", pa.string())]),
            ),
        }
    )
    sink = _sink(falkordb_url, name, table.schema, node_label="User Node", node_key="user-id")
    sink.write(table)
    got = _rows(
        handle,
        "MATCH (n:`User Node`) RETURN n.`user-id`, n.`@type`, n.`a.b`, n.plain, n.`nested.x`, "
        "n.`nested.y-z` ORDER BY n.`user-id`",
    )
    assert got == [["u1", "Person", 1.5, 1, 1, "p"], ["u2", "Bot", 2.0, 2, 2, None]]
    keys = _rows(handle, "MATCH (n:`User Node` {`user-id`: 'u1'}) RETURN keys(n)")[0][0]
    assert sorted(keys) == sorted(["user-id", "@type", "a.b", "plain", "nested.x", "nested.y-z"])
    sink.close()


def test_replaying_an_already_committed_epoch_changes_nothing(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph
    table = pa.table({"src": ["a", "b", "c"], "dst": ["b", "c", "a"], "n": [1, 2, 3]})
    options = {**EDGE, "accumulate": "n", "batch_rows": "2"}  # 2 queries per epoch
    first = _sink(falkordb_url, name, table.schema, **options)
    first.reset_marker(0)  # a fresh run
    assert first.write(table, epoch=1).skipped == 0
    assert first.marker() == (1, 1)
    before = _rows(handle, "MATCH (s)-[r]->(t) RETURN s.id, t.id, r.n ORDER BY s.id")
    assert before == [["a", "b", 1], ["b", "c", 2], ["c", "a", 3]]
    # a restarted writer replays epoch 1 exactly as it was committed: both queries skipped
    replay = _sink(falkordb_url, name, table.schema, **options)
    result = replay.write(table, epoch=1)
    assert (result.queries, result.skipped, result.rows_written) == (2, 2, 0)
    assert _rows(handle, "MATCH (s)-[r]->(t) RETURN s.id, t.id, r.n ORDER BY s.id") == before
    assert _rows(handle, "MATCH (n) RETURN count(n)") == [[4]]  # a, b, c and the marker
    # the next epoch is applied
    assert replay.write(table, epoch=2).skipped == 0
    assert _rows(handle, "MATCH (s)-[r]->(t) RETURN r.n ORDER BY s.id") == [[2], [4], [6]]
    assert replay.marker() == (2, 1)
    first.close()
    replay.close()


def test_the_merge_is_served_by_an_index_scan(falkordb_url: str, graph: tuple[str, Any]) -> None:
    name, handle = graph
    table = pa.table({"src": ["a"], "dst": ["b"], "w": [1]})
    sink = _sink(falkordb_url, name, table.schema, **EDGE, edge_key="w")
    sink.write(table)
    resolve = sink.explain("resolve")
    assert any("Node By Index Scan | (n:Node)" in line for line in resolve), resolve
    merge = sink.explain("merge")
    assert any("Node By Index Scan | (s:Node)" in line for line in merge), merge
    assert any("Node By Index Scan | (t:Node)" in line for line in merge), merge
    upsert = sink.explain("upsert")
    assert any("NodeByIdSeek | (s)" in line for line in upsert), upsert
    assert not any("Label Scan" in line or "All Node Scan" in line for line in resolve + upsert)
    indexes = _rows(handle, "CALL db.indexes() YIELD label, properties RETURN label, properties")
    assert sorted(map(tuple, ((lab, sorted(p)) for lab, p in indexes))) == [
        ("LINK", ["w"]),
        ("Node", ["id"]),
        ("_FlightServeSink", ["pipeline"]),
    ]
    sink.close()


def test_values_are_converted_before_cypher(falkordb_url: str, graph: tuple[str, Any]) -> None:
    name, handle = graph
    schema = pa.schema(
        [
            ("k", pa.int64()),
            ("ts", pa.timestamp("ns", "America/New_York")),
            ("naive", pa.timestamp("s")),
            ("day", pa.date32()),
            ("f", pa.float32()),
            ("whole", pa.float64()),
            ("u", pa.uint64()),
            ("flag", pa.bool_()),
            ("tags", pa.list_(pa.string())),
            ("text", pa.string()),
            ("cat", pa.dictionary(pa.int8(), pa.string())),
        ]
    )
    table = pa.table(
        {
            "k": [1, 2],
            "ts": pa.array([1_357_016_400_123_456_789, None], pa.timestamp("ns", "UTC")).cast(
                schema.field("ts").type
            ),
            "naive": [dt.datetime(2013, 1, 1, 5, 0), dt.datetime(1969, 12, 31, 23, 59, 59)],
            "day": [dt.date(2013, 1, 2), None],
            "f": [float("nan"), 0.5],
            "whole": [1.0, float("-inf")],
            "u": [2**63 - 1, 0],
            "flag": [True, False],
            "tags": [["a", 'q"uote\\'], []],
            "text": ["tab\there\nline \u2028 😀", ""],
            "cat": pa.array(["x", "y"]).dictionary_encode().cast(schema.field("cat").type),
        },
        schema=schema,
    )
    sink = _sink(falkordb_url, name, schema, node_label="V", node_key="k")
    sink.write(table)
    got = _rows(
        handle,
        "MATCH (n:V) RETURN n.k, n.ts, n.naive, n.day, n.f, n.whole, n.u, n.flag, n.tags, "
        "n.text, n.cat ORDER BY n.k",
    )
    assert got == [
        [1, "2013-01-01T05:00:00.123456Z", "2013-01-01T05:00:00.000000Z", "2013-01-02", None,
         1.0, 2**63 - 1, True, ["a", 'q"uote\\'], "tab\there\nline \u2028 😀", "x"],
        [2, None, "1969-12-31T23:59:59.000000Z", None, 0.5, None, 0, False, [], "", "y"],
    ]  # fmt: skip
    assert isinstance(got[0][5], float)  # 1.0 stays a float
    epoch_ms = _sink(
        falkordb_url, name, schema, node_label="W", node_key="k", timestamps="epoch_ms"
    )
    epoch_ms.write(table)
    assert _rows(handle, "MATCH (n:W) RETURN n.ts, n.naive ORDER BY n.k") == [
        [1_357_016_400_123, 1_357_016_400_000],
        [None, -1000],
    ]
    sink.close()
    epoch_ms.close()


def test_values_that_cannot_be_stored_are_rejected_naming_the_column(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph

    def write(table: pa.Table, **options: str) -> None:
        opts = options or {"node_label": "V", "node_key": "k"}
        sink = _sink(falkordb_url, name, table.schema, **opts)
        try:
            sink.write(table)
        finally:
            sink.close()

    with pytest.raises(ConnectorError, match=r"column 'big': uint64 value 9223372036854775808"):
        write(pa.table({"k": [1], "big": pa.array([2**63], pa.uint64())}))
    with pytest.raises(ConnectorError, match=r"column 'x': NaN or infinity"):
        write(
            pa.table({"k": [1], "x": [math.inf]}),
            node_label="V",
            node_key="k",
            non_finite="reject",
        )
    with pytest.raises(ConnectorError, match=r"column 's': a string holds a NUL"):
        write(pa.table({"k": [1], "s": ["a\x00b"]}))
    with pytest.raises(ConnectorError, match=r"column 'a`b'.*backtick"):
        write(pa.table({"k": [1], "a`b": [1]}))
    with pytest.raises(ConnectorError, match=r"column 'd': decimal128\(5, 2\).*CAST"):
        write(pa.table({"k": [1], "d": pa.array([Decimal("1.50")], pa.decimal128(5, 2))}))
    with pytest.raises(ConnectorError, match=r"key column 'k' is null in 1 row"):
        write(pa.table({"k": [1, None], "v": [1, 2]}))
    with pytest.raises(ConnectorError, match=r"no column 'dst'"):
        write(pa.table({"src": ["a"]}), **EDGE)
    with pytest.raises(ConnectorError, match=r"needs target_column"):
        write(pa.table({"src": ["a"]}), edge_type="E", source_label="A", source_column="src",
              target_label="A")  # fmt: skip
    with pytest.raises(ConnectorError, match=r"batch_rows: must be between 1 and 100000"):
        write(pa.table({"k": [1]}), node_label="V", node_key="k", batch_rows="0")
    assert _rows(handle, "MATCH (n:V) RETURN count(n)") == [[0]]  # nothing half-written


class _LosesReplies:
    """The real graph handle, whose first ``fail`` queries land and then raise a
    ConnectionError (the reply is lost)."""

    def __init__(self, real: Any, fail: int) -> None:
        self.real = real
        self.fail = fail
        self.calls = 0

    def query(self, text: str) -> Any:
        result = self.real.query(text)
        self.calls += 1
        if self.fail > 0 and "UNWIND $rows" in text:
            self.fail -= 1
            raise redis.exceptions.ConnectionError("connection lost after the write")
        return result


def test_a_lost_reply_is_retried_and_the_batch_applied_once(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph
    table = pa.table({"src": ["a", "b"], "dst": ["b", "c"], "n": [5, 7]})
    sink = _sink(falkordb_url, name, table.schema, **EDGE, accumulate="n")
    sink.reset_marker(0)
    sink._graph = _LosesReplies(sink._graph, fail=1)
    result = sink.write(table, epoch=1)
    # the query landed, its reply was lost, the retry found the marker at (1, 0): skipped
    assert (result.retries, result.queries, result.skipped) == (1, 1, 1)
    assert _rows(handle, "MATCH (s)-[r]->(t) RETURN s.id, r.n ORDER BY s.id") == [
        ["a", 5],
        ["b", 7],
    ]
    sink.close()


def test_a_killed_connection_is_reopened(falkordb_url: str, graph: tuple[str, Any]) -> None:
    name, handle = graph
    table = pa.table({"src": ["a"], "dst": ["b"], "n": [1]})
    sink = _sink(falkordb_url, name, table.schema, **EDGE, accumulate="n")
    sink.write(table)
    killer = falkordb.FalkorDB.from_url(falkordb_url)
    me = killer.connection.client_id()
    killed = killer.connection.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed >= 1, me
    sink.write(table)  # the sink's socket is dead: reconnected (and retried if need be)
    assert _rows(handle, "MATCH ()-[r]->() RETURN r.n") == [[2]]
    killer.connection.close()
    sink.close()


class _CrashesMidCommit:
    """The real sink, whose epoch writes stop (as a crash would) after ``queries`` queries."""

    def __init__(self, real: FalkorDBSink, queries: int) -> None:
        self.real = real
        self.queries = queries

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def write(self, data: pa.Table, *, epoch: int | None = None) -> Any:
        part = data.slice(0, self.queries * self.real.batch_rows)
        self.real.write(part, epoch=epoch)
        raise SystemExit("crashed in the middle of the commit")


def test_an_epoch_commit_cut_short_is_completed_by_recovery(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    name, handle = graph
    schema = pa.schema([("src", pa.string()), ("dst", pa.string()), ("n", pa.int64())])
    options = {"url": falkordb_url, "graph": name, **EDGE, "accumulate": "n", "batch_rows": "2"}
    epoch1 = pa.record_batch([["a", "b"], ["b", "c"], [1, 1]], schema=schema)
    epoch2 = pa.record_batch([["a", "b", "c", "d", "e"], ["b", "c", "d", "e", "a"], [10] * 5],
                             schema=schema)  # fmt: skip
    run = EpochGraphSink("s", FalkorDBSink("s", options, schema, pipeline="p"), restored_epoch=None)
    run.write(epoch1)
    files: dict[str, bytes] = {}
    run.prepare(1, files)
    run.commit(1)
    run.write(epoch2)
    files = {}
    entry = run.prepare(2, files)
    assert entry == {"kind": "falkordb", "graph": name, "rows": 7, "staged": "sink-s.arrow"}
    # epoch 2's manifest is written; its commit (3 queries of 2, 2, 1 rows) dies after 1 query
    run.sink = _CrashesMidCommit(run.sink, queries=1)  # type: ignore[assignment]
    with pytest.raises(SystemExit):
        run.commit(2)
    assert _rows(handle, "MATCH (s)-[r]->() RETURN s.id, r.n ORDER BY s.id") == [
        ["a", 11], ["b", 11]  # the first query of epoch 2 (a->b, b->c) landed
    ]  # fmt: skip
    # restore from checkpoint 2: its staged rows are written again under epoch 2
    resumed = EpochGraphSink(
        "s", FalkorDBSink("s", options, schema, pipeline="p"), restored_epoch=2, rows=7
    )
    resumed.recover(read_ipc(files["sink-s.arrow"]))
    assert _rows(handle, "MATCH (s)-[r]->(t) RETURN s.id, t.id, r.n ORDER BY s.id") == [
        ["a", "b", 11], ["b", "c", 11], ["c", "d", 10], ["d", "e", 10], ["e", "a", 10],
    ]  # fmt: skip
    assert resumed.sink.marker() == (2, 2**63 - 1)  # epochs after 2 are written again
    resumed.close()
    run.sink.real.close()  # type: ignore[attr-defined]


# --- pipelines --------------------------------------------------------------------------------

# Timeline (event time, minutes after 2013-01-01 05:00 UTC; TUMBLE 10 min, watermark = t - 1 min;
# one row per source batch, so with --checkpoint-every 1 row k ends epoch k):
#
#   rows:     JFK->LAX t=1 d=5 | JFK->LAX t=4 d=15 | LGA->ORD t=8 d=-2 | JFK->LAX t=12 d=30
#             LGA->ORD t=15 d=4 | EWR->LAX t=21 d=0
#   windows:  [0,10): JFK->LAX 2 flights, delay 20; LGA->ORD 1, -2
#             [10,20): JFK->LAX 1, 30; LGA->ORD 1, 4      [20,30): EWR->LAX 1, 0 (end of input)
#   emitted:  [0,10) in epoch 4 (t=12 moves the watermark to 11), [10,20) in epoch 6, [20,30) at
#             the end (epoch 7); so a kill after checkpoint/commit 4 or in epoch 5 replays epoch 4
#   graph:    ROUTE edges accumulate flights and delay_sum; last_window = the latest window_end
FLIGHTS_CSV = """origin,dest,t,delay
JFK,LAX,2013-01-01 05:01:00,5
JFK,LAX,2013-01-01 05:04:00,15
LGA,ORD,2013-01-01 05:08:00,-2
JFK,LAX,2013-01-01 05:12:00,30
LGA,ORD,2013-01-01 05:15:00,4
EWR,LAX,2013-01-01 05:21:00,0
"""
EXPECTED_ROUTES = [
    ["EWR", "LAX", 1, 0.0, "2013-01-01T05:30:00.000000Z"],
    ["JFK", "LAX", 3, 50.0, "2013-01-01T05:20:00.000000Z"],
    ["LGA", "ORD", 2, 2.0, "2013-01-01T05:20:00.000000Z"],
]


def _pipeline(url: str, graph: str) -> str:
    return f"""
CREATE SOURCE flights (origin VARCHAR, dest VARCHAR, t TIMESTAMP(0), delay DOUBLE,
                       WATERMARK FOR t AS t - INTERVAL '1' MINUTE)
WITH (connector = 'file', path = 'flights.csv', batch_rows = '1');
CREATE SINK routes WITH (
    connector = 'falkordb', url = '{url}', graph = '{graph}',
    edge_type = 'ROUTE', source_label = 'Airport', source_column = 'origin',
    source_key = 'faa', target_label = 'Airport', target_column = 'dest', target_key = 'faa',
    accumulate = 'flights, delay_sum', batch_rows = '1000');
INSERT INTO routes
SELECT origin, dest, count(*) AS flights, sum(delay) AS delay_sum, window_end AS last_window
FROM TUMBLE(flights, t, INTERVAL '10' MINUTE)
GROUP BY origin, dest, window_start, window_end;
"""


def _routes(handle: Any) -> list[list[Any]]:
    return _rows(
        handle,
        "MATCH (s:Airport)-[r:ROUTE]->(t:Airport) "
        "RETURN s.faa, t.faa, r.flights, r.delay_sum, r.last_window ORDER BY s.faa, t.faa",
    )


def test_a_pipeline_writes_through_the_sink_from_sql(
    falkordb_url: str, graph: tuple[str, Any], tmp_path: Path
) -> None:
    name, handle = graph
    (tmp_path / "flights.csv").write_text(FLIGHTS_CSV)
    sql = tmp_path / "routes.sql"
    sql.write_text(_pipeline(falkordb_url, name))
    runtime = PipelineRuntime(parse_pipeline(sql.read_text(), path=sql), output_dir=tmp_path)
    assert "connector falkordb -> falkordb graph" in runtime.explain()
    list(runtime.run())
    assert runtime.summary().rows == {"routes": 5}
    assert _routes(handle) == EXPECTED_ROUTES


def test_a_bad_falkordb_option_points_at_the_option(tmp_path: Path) -> None:
    (tmp_path / "flights.csv").write_text(FLIGHTS_CSV)
    text = _pipeline("falkor://127.0.0.1:1", "g").replace("target_key", "target_kee")
    with pytest.raises(PipelineSQLError, match=r"unknown option of the falkordb connector") as err:
        PipelineRuntime(parse_pipeline(text, path=tmp_path / "p.sql"), output_dir=tmp_path)
    assert err.value.line == 8


@pytest.mark.parametrize("crash", ["checkpoint:4", "commit:4", "event:5"])
def test_a_checkpointed_run_killed_and_resumed_leaves_the_straight_runs_graph(
    falkordb_url: str, graph: tuple[str, Any], tmp_path: Path, crash: str
) -> None:
    name, handle = graph
    (tmp_path / "flights.csv").write_text(FLIGHTS_CSV)
    sql = tmp_path / "routes.sql"
    sql.write_text(_pipeline(falkordb_url, name))
    command = [str(CLI), "run", str(sql), "--output-dir", str(tmp_path), "--checkpoint-every", "1"]
    env = {k: v for k, v in os.environ.items() if k != "FLIGHT_SERVE_CRASH_AT"}
    killed = subprocess.run(
        command, env={**env, "FLIGHT_SERVE_CRASH_AT": crash}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    partial = _routes(handle)
    assert partial != EXPECTED_ROUTES  # the crash left the graph behind the straight run
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    # every window's counts added exactly once: what a straight run leaves
    assert _routes(handle) == EXPECTED_ROUTES


_UPDATE_SOURCE = """
CREATE SOURCE f (origin VARCHAR, dest VARCHAR, t TIMESTAMP, WATERMARK FOR t AS t)
  WITH (connector = 'file', path = 'flights.csv');
CREATE SINK g WITH (connector = 'falkordb', url = 'falkor://127.0.0.1:1', edge_type = 'R',
    source_label = 'A', source_column = 'origin', target_label = 'A', target_column = 'dest',
    source_key = 'id', target_key = 'id'{accumulate});
"""
_UPDATE_QUERY = (
    "SELECT origin, dest, count(*) AS n FROM TUMBLE(f, t, INTERVAL '1' HOUR{emit}) "
    "GROUP BY origin, dest, window_start, window_end"
)


@pytest.mark.parametrize(
    ("emit", "via_view", "line"),
    [(", emit => 'update'", False, 7), (", emit => 'update'", True, 8), ("", True, 9)],
)
def test_accumulate_refuses_the_rows_of_an_emit_update_query(
    emit: str, via_view: bool, line: int
) -> None:
    """emit = 'update' sends a window's row again after late rows revise it; ``accumulate``
    would add each revision to the edge (n = 3, then 3 + 4 for the revised window, instead of
    4). Refused at planning, whether the sink reads the windowed query itself or a view of it
    per row, and whether emit is the query's option or ``SET emit``. Without accumulate, the
    same pipeline plans (a revision replaces the properties)."""
    head = "SET emit = 'update';\n" if not emit else ""
    text = head + _UPDATE_SOURCE.format(accumulate=", accumulate = 'n'")
    query = _UPDATE_QUERY.format(emit=emit)
    if via_view:
        text += f"CREATE VIEW w AS {query};\nINSERT INTO g SELECT * FROM w;\n"
    else:
        text += f"INSERT INTO g {query};\n"
    with pytest.raises(PipelineSQLError) as caught:
        parse_pipeline(text)
    assert str(caught.value).startswith(
        "INSERT INTO g: the rows are an emit => 'update' query's (a window's row comes again, "
        "revised), and accumulate = 'n' would add every revision; drop accumulate (the "
        "properties are then set to the latest revision) or emit 'final'"
    )
    assert caught.value.line == line
    parse_pipeline(text.replace(", accumulate = 'n'", ""))  # plans


def test_an_unreachable_servers_error_does_not_show_the_urls_password() -> None:
    """The url may carry credentials (``falkor://user:password@host:port``); the error of an
    unreachable server ends up in logs and in pipeline.status, which the read role sees: the
    password is masked."""
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"falkor://ops:s3cret-pw@127.0.0.1:{port}"
    schema = pa.schema([("k", pa.string())])
    options = {"url": url, "node_label": "X", "node_key": "k", "max_retries": "0"}
    with pytest.raises(GraphStoreError) as caught:
        FalkorDBSink("s", options, schema, pipeline="p")
    message = str(caught.value)
    assert message.startswith(
        f"sink s: FalkorDB at falkor://ops:***@127.0.0.1:{port} unreachable after 0 retries "
        "(connect): "
    )
    assert "s3cret-pw" not in message


def test_a_refused_login_is_the_urls_error_and_is_not_retried(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    """A url whose user and password the real server refuses (``WRONGPASS``; redis raises it
    as a ``ConnectionError``): it used to be retried ``max_retries`` times with backoff and then
    reported as "unreachable" (GraphStoreError, UNAVAILABLE, retryable). It is the sink's option,
    so it is a ConnectorError (INVALID_ARGUMENT) at once, naming the sink and the masked url."""
    name, _ = graph
    host_port = falkordb_url.split("://", 1)[1]
    url = f"falkor://nobody:s3cret-pw@{host_port}"
    options = {"url": url, "graph": name, "node_label": "X", "node_key": "k", "max_retries": "3"}
    with pytest.raises(ConnectorError) as caught:
        FalkorDBSink("s", options, pa.schema([("k", pa.string())]), pipeline="p")
    message = str(caught.value)
    assert message.startswith(
        f"sink s: FalkorDB at falkor://nobody:***@{host_port} refused the login (connect): "
    )
    assert message.endswith("; check the user and password in the sink's url option")
    assert "s3cret-pw" not in message
    assert not isinstance(caught.value, GraphStoreError)


def test_a_nan_or_infinite_key_is_refused_naming_the_column(
    falkordb_url: str, graph: tuple[str, Any]
) -> None:
    """A float key column holding NaN or ±inf: the value would be converted to null (or, under
    non_finite = 'reject', refused as a property), and FalkorDB then refused the MERGE with a
    message that names no column ("Cannot merge node using null property value"). Refused
    before any query, like a null key, naming the column and the count; nothing is written."""
    name, handle = graph
    table = pa.table({"k": [1.0, math.nan, math.inf], "v": [1, 2, 3]})
    sink = _sink(falkordb_url, name, table.schema, node_label="V", node_key="k")
    try:
        with pytest.raises(ConnectorError) as caught:
            sink.write(table)
    finally:
        sink.close()
    assert str(caught.value) == (
        "sink s: key column 'k' is NaN or infinite in 2 row(s); MERGE cannot match on them: "
        "filter them in the query"
    )
    assert _rows(handle, "MATCH (n) RETURN count(n)") == [[0]]


def test_one_label_at_both_ends_keyed_by_two_defaulted_properties_is_refused() -> None:
    """source_key and target_key default to their columns: with source_label = target_label =
    'Airport', source_column 'origin' and target_column 'dest' and no keys given, JFK as an
    origin became (:Airport {origin: 'JFK'}) and as a destination another node (:Airport
    {dest: 'JFK'}): two nodes for one airport, silently. Refused at planning, pointing at
    target_label; explicit keys (equal, or even different on purpose) plan."""
    base = """
CREATE SOURCE f (origin VARCHAR, dest VARCHAR) WITH (connector = 'file', path = 'f.csv');
CREATE SINK g WITH (connector = 'falkordb', url = 'falkor://127.0.0.1:1', edge_type = 'ROUTE',
    source_label = 'Airport', source_column = 'origin',
    target_label = 'Airport', target_column = 'dest'{keys});
INSERT INTO g SELECT origin, dest FROM f;
"""
    from flight_serve.pipelines.graph_io import graph_sink_options

    for keys, pair in [("", "origin, dest"), (", source_key = 'faa'", "faa, dest")]:
        with pytest.raises(PipelineSQLError) as caught:
            graph_sink_options(parse_pipeline(base.format(keys=keys)).sinks["g"])
        assert str(caught.value) == (
            f"option target_label: both ends of the edges are Airport nodes, but keyed by two "
            f"properties ({pair}: a key not given defaults to its column), so one Airport would "
            "become two nodes; set source_key and target_key (e.g. both 'id') (line 5, column 20)"
        )
    for keys in (", source_key = 'faa', target_key = 'faa'", ", source_key = 'a', target_key = 'b'"):
        plan = parse_pipeline(base.format(keys=keys))
        assert graph_sink_options(plan.sinks["g"])["edge_type"] == "ROUTE"
