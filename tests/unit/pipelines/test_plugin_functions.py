"""Plugin functions in pipeline SQL (``CREATE FUNCTION … WITH (connector = 'plugin')``)
and the hub's bookkeeping (sequence order, bounded in-flight, timeouts, detach), without a server:
instances are registered on a real :class:`PluginHub` and answered by the test."""

from __future__ import annotations

import base64
import json
import time
from datetime import timedelta
from pathlib import Path

import flight_serve
import pyarrow as pa
import pytest
from flight_serve.errors import InvalidInputError, PipelineSQLError
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.plugins import PluginDeclaration, PluginHub, schema_difference
from flight_serve.pipelines.runtime import PipelineRuntime

IN = pa.schema([("k", pa.string()), ("v", pa.int64())])
OUT = pa.schema([("k", pa.string()), ("v2", pa.int64())])
SOURCE = (
    "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(3), v BIGINT, WATERMARK FOR t AS t) "
    "WITH (connector = 'flight', stream = 's');\n"
)


def plan(sql: str) -> object:
    return parse_pipeline(SOURCE + sql)


def test_a_function_declares_the_output_and_its_options() -> None:
    p = parse_pipeline(
        SOURCE
        + "CREATE FUNCTION enrich() RETURNS TABLE (k VARCHAR, t TIMESTAMP(3), v2 BIGINT)\n"
        "WITH (connector = 'plugin', plugin = 'enricher', timeout = '250ms', max_in_flight = '3');\n"
        "CREATE VIEW e AS SELECT * FROM enrich(s);\n"
        "CREATE SINK out WITH (connector = 'stdout');\n"
        "INSERT INTO out SELECT k, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(e, t, INTERVAL '1' SECOND) GROUP BY k, window_start, window_end;"
    )
    f = p.functions["enrich"]
    assert (f.plugin, f.timeout, f.max_in_flight) == ("enricher", timedelta(milliseconds=250), 3)
    assert f.returns == pa.schema(
        [("k", pa.string()), ("t", pa.timestamp("ms")), ("v2", pa.int64())]
    )
    view, windowed = p.queries
    assert (view.input, view.function, view.view) == ("s", "enrich", "e")
    # the function returns the source's event-time column and the view keeps it: the window
    # over the view uses it (a window over a view without one would refuse WATERMARK rules)
    assert windowed.window is not None
    assert windowed.window.aggregation.time_column == "t"


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "CREATE FUNCTION f() WITH (connector = 'plugin');",
            "FUNCTION f needs RETURNS TABLE (<column> <type>, …): the plugin's output columns",
        ),
        (
            "CREATE FUNCTION f() RETURNS TABLE (a INT) WITH (plugin = 'x');",
            "FUNCTION f needs WITH (connector = 'plugin')",
        ),
        (
            "CREATE FUNCTION f() RETURNS TABLE (a INT) WITH (connector = 'plugin', retries = '3');",
            "option retries: unknown option of a plugin function; its options: connector, plugin, "
            "timeout, max_in_flight",
        ),
        (
            "CREATE FUNCTION f(x INT) RETURNS TABLE (a INT) WITH (connector = 'plugin');",
            "FUNCTION f: a plugin function takes no declared arguments",
        ),
        (
            "CREATE FUNCTION f() RETURNS TABLE (a INT) WITH (connector = 'plugin');\n"
            "CREATE SINK o WITH (connector = 'stdout');\nINSERT INTO o SELECT * FROM f(nope);",
            "f(nope): no source or view nope declared above",
        ),
        (
            "CREATE FUNCTION f() RETURNS TABLE (a INT) WITH (connector = 'plugin');\n"
            "CREATE SINK o WITH (connector = 'stdout');\nINSERT INTO o SELECT * FROM f(s, s);",
            "f(<source or view>): one stream name as its argument",
        ),
        (
            "CREATE FUNCTION s() RETURNS TABLE (a INT) WITH (connector = 'plugin');",
            "s is already declared",
        ),
    ],
)
def test_bad_functions_are_refused_with_their_position(sql: str, message: str) -> None:
    with pytest.raises(PipelineSQLError, match="line") as info:
        plan(sql)
    assert message in str(info.value)


def test_an_embedded_run_refuses_a_plugin_function(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("k,v\na,1\n")
    p = parse_pipeline(
        "CREATE SOURCE s (k VARCHAR, v BIGINT) WITH (connector = 'file', path = 'x.csv');\n"
        "CREATE FUNCTION f() RETURNS TABLE (k VARCHAR, v2 BIGINT) WITH (connector = 'plugin');\n"
        "CREATE SINK o WITH (connector = 'stdout');\nINSERT INTO o SELECT * FROM f(s);",
        base_dir=tmp_path,
    )
    with pytest.raises(PipelineSQLError, match="plugins are attached to a server; submit the"):
        PipelineRuntime(p)


# --- the hub ------------------------------------------------------------------------------------


def b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def hello(**extra: object) -> bytes:
    body = {"protocol": 1, "input_schema": b64(IN), "output_schema": b64(OUT), **extra}
    return json.dumps(body).encode()


def batch(*values: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": "a", "v": v} for v in values], schema=IN)


def answer(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([b["k"], pa.compute.multiply(b["v"], 2)], schema=OUT)


def test_hello_fields_are_checked_by_name() -> None:
    d = PluginDeclaration.from_hello("p", hello(max_in_flight=2))
    assert (d.input_schema, d.output_schema, d.max_in_flight) == (IN, OUT, 2)
    cases = [
        (b"[]", "plugin hello: must be a JSON object"),
        (hello(protocol=2), "plugin hello: 'protocol' is 2; this server speaks 1"),
        (hello(name="q"), "plugin hello: 'name' 'q' differs from the descriptor's 'p'"),
        (hello(max_in_flight=True), "'max_in_flight' must be a whole number from 1 to 1024"),
        (hello(output_schema=None), "'output_schema' must be a base64 string"),
    ]
    for raw, message in cases:
        with pytest.raises(InvalidInputError) as info:
            PluginDeclaration.from_hello("p", raw)
        assert message in str(info.value)


def test_schema_difference_names_the_fields() -> None:
    got = pa.schema([("k", pa.string()), ("v2", pa.float64()), ("x", pa.int8())])
    assert schema_difference(got, OUT) == "unexpected x; retyped v2 (double, expected int64)"
    assert schema_difference(OUT.remove(1), OUT) == "missing v2"
    assert schema_difference(pa.schema([OUT.field(1), OUT.field(0)]), OUT) == (
        "order v2, k (expected k, v2)"
    )
    assert schema_difference(OUT, OUT) == ""


def test_results_leave_in_order_and_in_flight_is_bounded() -> None:
    hub = PluginHub()
    stage = hub.stage("p", IN, OUT, max_in_flight=8)
    instance = hub.attach(PluginDeclaration.from_hello("p", hello(max_in_flight=2)))
    seqs = [stage.submit(batch(i), "w") for i in range(3)]
    assert seqs == [0, 1, 2]
    sends = [hub.next_send(instance, 0.1) for _ in range(3)]
    assert sends[2] is None  # two outstanding: the third waits for an answer
    (w0, b0), (w1, b1) = (s for s in sends if s is not None)
    assert w0 < w1
    hub.complete(instance, w1, answer(b1))  # the second answered first
    assert stage.ready() == []  # the head is not back yet
    third = hub.next_send(instance, 0.1)  # room again
    assert third is not None
    hub.complete(instance, w0, answer(b0))
    hub.complete(instance, third[0], answer(third[1]))
    assert [(s, b["v2"].to_pylist()) for s, _, b in stage.ready()] == [(0, [0]), (1, [2]), (2, [4])]
    assert not hub.complete(instance, w0, answer(b0))  # a second answer is dropped


def test_a_detached_instance_s_batches_go_to_the_next_one_in_order() -> None:
    hub = PluginHub()
    stage = hub.stage("p", IN, OUT)
    first = hub.attach(PluginDeclaration.from_hello("p", hello(max_in_flight=4)))
    for i in range(3):
        stage.submit(batch(i), "w")
    taken = [hub.next_send(first, 0.1) for _ in range(3)]
    assert all(t is not None for t in taken)
    hub.detach(first, "its stream broke: killed")
    assert stage.waiting_for() == "waiting for plugin p"
    assert hub.last_error("p") == "plugin p instance 1: its stream broke: killed"
    second = hub.attach(PluginDeclaration.from_hello("p", hello(max_in_flight=4)))
    assert stage.waiting_for() is None
    resent = [s for s in (hub.next_send(second, 0.1) for _ in range(3)) if s is not None]
    assert [b["v"].to_pylist() for _, b in resent] == [[0], [1], [2]]
    for wire, b in resent:
        hub.complete(second, wire, answer(b))
    assert [s for s, _, _ in stage.ready()] == [0, 1, 2]


def test_a_timed_out_batch_is_sent_again_and_the_late_answer_dropped() -> None:
    hub = PluginHub()
    stage = hub.stage("p", IN, OUT, timeout=timedelta(milliseconds=50))
    slow = hub.attach(PluginDeclaration.from_hello("p", hello(max_in_flight=1)))
    stage.submit(batch(7), "w")
    sent = hub.next_send(slow, 0.1)
    assert sent is not None
    fast = hub.attach(PluginDeclaration.from_hello("p", hello(max_in_flight=1)))
    time.sleep(0.08)
    assert stage.ready() == []  # expires the send: it goes to the other instance
    again = hub.next_send(fast, 0.1)
    assert again is not None
    assert again[0] > sent[0]
    assert again[1].equals(sent[1])
    assert not hub.complete(slow, sent[0], answer(sent[1]))  # late: dropped
    assert hub.complete(fast, again[0], answer(again[1]))
    assert [b["v2"].to_pylist() for _, _, b in stage.ready()] == [[14]]
    assert stage.error == (
        f"plugin p instance {slow.id}: no result for seq {sent[0]} (batch 0 of plugin p) "
        "within 0.05 s; sent again"
    )


def test_an_instance_that_does_not_fit_is_refused_with_the_fields() -> None:
    hub = PluginHub()
    stage = hub.stage("p", pa.schema([("k", pa.string())]), OUT, label="FUNCTION p")
    instance = hub.attach(PluginDeclaration.from_hello("p", hello()))
    stage.submit(pa.RecordBatch.from_pylist([{"k": "a"}], schema=stage.input_schema), "w")
    assert hub.next_send(instance, 0.05) is None
    assert stage.error == "plugin p instance 1 declares input columns v that the stream (k) lacks"
    assert stage.waiting_for() == "waiting for plugin p"


def test_explain_shows_the_plugin_stage_without_a_server(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("k,v\na,1\n")
    text = (
        "CREATE SOURCE s (k VARCHAR, v BIGINT) WITH (connector = 'file', path = 'x.csv');\n"
        "CREATE FUNCTION f() RETURNS TABLE (k VARCHAR, v2 BIGINT)\n"
        "WITH (connector = 'plugin', timeout = '5s');\n"
        "CREATE SINK o WITH (connector = 'stdout');\nINSERT INTO o SELECT * FROM f(s);"
    )
    out = flight_serve.Pipeline.from_sql(text, base_dir=tmp_path).explain()
    assert (
        "QUERY 1: INSERT INTO o (line 5), stage 1 of 2\n"
        "  reads: s (1 partition(s))\n"
        "  plugin f (FUNCTION f): every batch sent to an attached instance, results in order; "
        "timeout 5s, max_in_flight 16\n"
        "  output: k string, v2 int64\n"
    ) in out
    assert "QUERY 1: INSERT INTO o (line 5), stage 2 of 2\n  reads: f(s) (the plugin's results)" in out
