"""Pipeline SQL files (DESIGN §5): the planner's rules and errors, the file and stdout connectors,
and the embedded Python API (``flight_serve.Pipeline``). The semantics of whole runs are asserted
by the golden cases (tests/golden/); this file covers what they cannot show: error positions,
option precedence, connector details and the API's shapes.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flight_serve.connectors.file import FileSink, FileSource, resolve_paths
from flight_serve.connectors.stdout import StdoutSink
from flight_serve.embedded import Pipeline
from flight_serve.errors import ConnectorError, PipelineSQLError, QueryError
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.query import parse_window_query

SOURCE = (
    "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(0), v BIGINT,\n"
    "    WATERMARK FOR t AS t - INTERVAL '2' SECOND)\n"
    "WITH (connector = 'file', path = 'in.csv', batch_rows = '1');\n"
)
SINK = "CREATE SINK o WITH (connector = 'stdout');\n"
COUNT = (
    "INSERT INTO o SELECT k, window_start, window_end, count(*) AS n\n"
    "FROM TUMBLE(s, t, INTERVAL '10' SECOND{args})\n"
    "GROUP BY k, window_start, window_end;\n"
)


def at(seconds: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(seconds=seconds)


def write_csv(path: Path, rows: list[tuple[str, int | None, int]]) -> Path:
    lines = ["k,t,v"] + [f"{k},{'' if t is None else at(t)},{v}" for k, t, v in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def error_of(sql: str) -> PipelineSQLError:
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(sql)
    return info.value


# --- errors name line and column --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message", "line", "col"),
    [
        (SOURCE + "INSERT INTO o SELEKT k FROM s;", "syntax error", 4, 15),
        (SOURCE + "INSERT INTO nowhere SELECT * FROM s;", "no such sink", 4, 13),
        (SOURCE + SINK + "INSERT INTO o SELECT * FROM nothing;", "unknown source", 5, 29),
        (SINK + "SET emit = 'update';", "SET sets pipeline options", 2, 5),
        (
            SOURCE + SINK + "INSERT INTO o SELECT k, count(*) AS n FROM s GROUP BY k;",
            "GROUP BY needs a window",
            5,
            55,  # the first token sqlglot records under GROUP BY: the key
        ),
        (SOURCE + SINK + "INSERT INTO o SELECT count(*) FROM s;", "needs a window", 5, 22),
        (
            SOURCE + SINK + COUNT.format(args=", lateness => '5s'"),
            "unknown option 'lateness' of TUMBLE",
            6,
            53,  # sqlglot records no position for the option name: its value
        ),
        ("CREATE SOURCE s (k VARCHAR,\n  t INTERVAL) WITH (connector = 'file');", "INTERVAL", 2, 3),
        ("CREATE SOURCE s (k VARCHAR) WITH (path = 'x');", "needs WITH (connector", 1, 15),
        (SINK + "DROP TABLE x;", "unsupported statement", 2, 12),
    ],
)
def test_errors_point_at_the_offending_token(sql: str, message: str, line: int, col: int) -> None:
    error = error_of(sql)
    assert message in str(error)
    assert (error.line, error.col) == (line, col), str(error)
    assert f"(line {line}, column {col})" in str(error)


def test_a_multi_character_token_is_reported_at_its_first_column() -> None:
    # sqlglot reports the last column of a token; `nowhere` spans columns 13-19
    error = error_of(SOURCE + "INSERT INTO nowhere SELECT * FROM s;")
    assert error.col == 13


def test_two_streams_cannot_be_joined() -> None:
    other = SOURCE.replace("CREATE SOURCE s", "CREATE SOURCE u").replace("in.csv", "u.csv")
    error = error_of(SOURCE + other + SINK + "INSERT INTO o SELECT s.k FROM s JOIN u ON s.k = u.k;")
    assert "joining two streams" in str(error)


def test_a_sink_is_not_readable_use_a_view() -> None:
    error = error_of(
        SINK + "CREATE SINK p WITH (connector = 'stdout');\nINSERT INTO p SELECT * FROM o;"
    )
    assert "CREATE VIEW o" in str(error)


def test_late_needs_exactly_one_windowed_reader() -> None:
    late = "CREATE SINK l WITH (connector = 'stdout');\nINSERT INTO l SELECT * FROM LATE(s);\n"
    assert "no windowed query reads s" in str(error_of(SOURCE + late))
    twice = COUNT.format(args="") + COUNT.format(args="").replace("'10'", "'20'")
    assert "ambiguous" in str(error_of(SOURCE + SINK + twice + late))


def test_a_window_over_an_update_mode_view_is_refused() -> None:
    sql = SOURCE + (
        "CREATE VIEW v AS SELECT k, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(s, t, INTERVAL '1' SECOND, emit => 'update') GROUP BY k, window_start, "
        "window_end;\n" + SINK + "INSERT INTO o SELECT window_start, window_end, sum(n) AS n\n"
        "FROM TUMBLE(v, window_end, INTERVAL '10' SECOND) GROUP BY window_start, window_end;"
    )
    assert "count every revision" in str(error_of(sql))


def test_time_zone_as_a_query_option_needs_a_calendar_window() -> None:
    sql = SOURCE + SINK + COUNT.format(args=", time_zone => 'Europe/Paris'")
    assert "time_zone applies to TUMBLE" in str(error_of(sql))


def test_parse_window_query_keeps_its_signature_and_reads_named_options() -> None:
    q = parse_window_query(
        "SELECT k, window_start, window_end, count(*) AS n "
        "FROM TUMBLE(input, t, INTERVAL '10' SECOND, emit => 'update', "
        "allowed_lateness => INTERVAL '5' SECOND) GROUP BY k, window_start, window_end"
    )
    assert (q.source, q.aggregation.emit) == ("input", "update")
    assert q.aggregation.allowed_lateness == timedelta(seconds=5)


# --- options: query > source > pipeline -------------------------------------------------------


def test_option_precedence_query_over_source_over_pipeline() -> None:
    base = "SET allowed_lateness = '1s'; SET emit = 'update'; SET max_future_skew = '1h';\n"
    source = SOURCE.replace("batch_rows = '1'", "batch_rows = '1', allowed_lateness = '3s'")
    plan = parse_pipeline(base + source + SINK + COUNT.format(args=", emit => 'final'"))
    (query,) = plan.queries
    assert query.window is not None
    agg = query.window.aggregation
    assert agg.allowed_lateness == timedelta(seconds=3)  # source over pipeline
    assert agg.emit == "final"  # query over pipeline
    assert agg.max_future_skew == timedelta(hours=1)  # pipeline
    assert agg.max_out_of_orderness == timedelta(seconds=2)  # the WATERMARK bound


def test_a_dotted_with_key_is_kept_whole() -> None:
    """RisingWave writes column options unquoted and dotted (``fields.k.kind = 'sequence'``):
    the key is the whole name, not its last part (``kind``)."""
    plan = parse_pipeline(
        "CREATE SOURCE s (k BIGINT) WITH (connector = 'datagen', fields.k.kind = 'sequence',"
        " datagen.split.num = '2', \"fields.k.start\" = '5');\n"
        "CREATE SINK out WITH (connector = 'stdout');\nINSERT INTO out SELECT * FROM s;"
    )
    options = {key: option.text for key, option in plan.sources["s"].connector.items()}
    assert options == {
        "connector": "datagen",
        "fields.k.kind": "sequence",
        "datagen.split.num": "2",
        "fields.k.start": "5",
    }


def test_a_view_without_the_watermark_column_falls_back_to_max_out_of_orderness() -> None:
    sql = (
        "SET max_out_of_orderness = '7s';\n"
        + SOURCE
        + "CREATE VIEW renamed AS SELECT k, t AS ts FROM s;\n"
        + SINK
        + "INSERT INTO o SELECT window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(renamed, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end;"
    )
    window = parse_pipeline(sql).queries[1].window
    assert window is not None
    assert window.aggregation.max_out_of_orderness == timedelta(seconds=7)


# --- the file connector -----------------------------------------------------------------------


def test_file_source_reads_files_round_robin_in_batches_of_batch_rows(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", [("a", t, 0) for t in (1, 2, 3)])
    write_csv(tmp_path / "b.csv", [("b", 9, 0)])
    source = FileSource(resolve_paths("*.csv", tmp_path), batch_rows=2, base_dir=tmp_path)
    assert source.partitions == ("a.csv", "b.csv")
    events = [(p, None if b is None else b.num_rows) for p, b in source.round_robin()]
    assert events == [("a.csv", 2), ("b.csv", 1), ("a.csv", 1), ("b.csv", None), ("a.csv", None)]


def test_file_source_takes_declared_columns_in_order_and_names_a_missing_one(
    tmp_path: Path,
) -> None:
    path = write_csv(tmp_path / "in.csv", [("a", 1, 5)])
    declared = pa.schema([("v", pa.int32()), ("k", pa.string())])
    source = FileSource((path,), schema=declared)
    (batch,) = source.read_file(0)
    assert batch.schema == declared
    assert batch.to_pylist() == [{"v": 5, "k": "a"}]
    missing = FileSource((path,), schema=pa.schema([("nope", pa.int64())]))
    with pytest.raises(ConnectorError, match="nope"):
        list(missing.read_file(0))


def test_file_source_reads_parquet_and_jsonl_and_infers_columns(tmp_path: Path) -> None:
    table = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    for name in ("t.parquet", "t.jsonl"):
        source = FileSource((tmp_path / name,), batch_rows=2)
        assert source.schema.names == ["k", "v"]
        assert [b.num_rows for b in source.read_file(0)] == [2, 1]
        assert source.read_all().to_pylist() == table.to_pylist()


def test_no_match_and_unknown_format_are_connector_errors(tmp_path: Path) -> None:
    with pytest.raises(ConnectorError, match="no file matches"):
        resolve_paths("missing/*.csv", tmp_path)
    (tmp_path / "x.txt").write_text("k\n")
    with pytest.raises(ConnectorError, match="cannot tell the format"):
        FileSource((tmp_path / "x.txt",))


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_file_sink_writes_one_file_per_run(tmp_path: Path, fmt: str) -> None:
    schema = pa.schema([("k", pa.string()), ("t", pa.timestamp("s", "UTC"))])
    rows = [{"k": "a", "t": datetime(2013, 1, 1, 5, tzinfo=UTC)}]
    path = tmp_path / "out" / f"o.{fmt}"
    for _ in range(2):  # a rerun replaces the file
        sink = FileSink(path, fmt, schema)
        sink.write(pa.RecordBatch.from_pylist(rows, schema))
        sink.close()
    back = FileSource((path,), schema=schema).read_all()
    assert back.to_pylist() == rows


FAILING_RUN = """
CREATE SOURCE src (k VARCHAR) WITH (connector = 'file', path = 'in.csv', batch_rows = '1000');
CREATE SINK out WITH (connector = 'file', path = 'out.{fmt}');
INSERT INTO out SELECT CAST(k AS BIGINT) AS n FROM src;
"""


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_a_failed_run_leaves_the_previous_runs_file_as_it_was(tmp_path: Path, fmt: str) -> None:
    """A run without checkpoints writes ``.out.<fmt>.inprogress`` and moves it onto ``out.<fmt>``
    only when it completes. Run 2 fails at its 5th batch (row 4,500 is not a number): it used to
    leave 4,000 of its rows in ``out.<fmt>``, the first run's 6,000 gone and nothing saying so.
    Now ``out.<fmt>`` holds run 1's 6,000 rows and the in-progress file is removed; run 3
    completes and replaces it."""
    (tmp_path / "p.sql").write_text(FAILING_RUN.format(fmt=fmt))
    out = tmp_path / f"out.{fmt}"

    def run(values: list[str]) -> None:
        (tmp_path / "in.csv").write_text("k\n" + "".join(f"{v}\n" for v in values))
        Pipeline.from_sql(tmp_path / "p.sql", output_dir=tmp_path).run()

    def written() -> list[int]:
        return FileSource((out,), schema=pa.schema([("n", pa.int64())])).read_all()["n"].to_pylist()

    broken = [str(i) for i in range(6000)]
    broken[4500] = "x"
    with pytest.raises(QueryError, match="'x'"):  # a first run that fails writes no file
        run(broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "p.sql"]
    run([str(i) for i in range(6000)])
    assert written() == list(range(6000))
    with pytest.raises(QueryError, match="'x'"):
        run(broken)
    assert written() == list(range(6000))  # run 1's, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", f"out.{fmt}", "p.sql"]
    run([str(i) for i in range(10, 20)])
    assert written() == list(range(10, 20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", f"out.{fmt}", "p.sql"]


def test_stdout_sink_prints_csv_jsonl_and_tables() -> None:
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    batch = pa.RecordBatch.from_pylist([{"k": "a", "n": 1}], schema)
    printed = {}
    for fmt in ("csv", "jsonl", "table"):
        stream = io.StringIO()
        sink = StdoutSink("o", schema, fmt, stream=stream)
        sink.write(batch)
        sink.write(batch)
        printed[fmt] = stream.getvalue()
    assert printed["csv"] == '"k","n"\n"a",1\n"a",1\n'
    assert printed["jsonl"] == '{"k": "a", "n": 1}\n' * 2
    assert printed["table"].count("o\n") == 2
    assert "│ a │" in printed["table"]
    with pytest.raises(ConnectorError, match="unknown format"):
        StdoutSink("o", schema, "xml")


def test_stdout_sink_prints_list_struct_map_and_binary_cells_as_json_and_hex() -> None:
    """pyarrow's CSV writer refuses list, struct and map columns (and non-UTF-8 binary): the
    sink raised ArrowInvalid mid-run. Such a cell is printed as its JSON text (a quoted CSV
    field), bytes as hex (as in jsonl), a null as an empty field; durations in jsonl are ISO 8601."""
    schema = pa.schema(
        [
            ("k", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("pos", pa.struct([("x", pa.int64()), ("at", pa.timestamp("ms", tz="UTC"))])),
            ("attrs", pa.map_(pa.string(), pa.int64())),
            ("raw", pa.binary()),
            ("lag", pa.duration("ms")),
        ]
    )
    at = datetime(2024, 1, 1, 0, 0, 1, tzinfo=UTC)
    rows = [
        {
            "k": "a",
            "tags": ["x", 'q"t'],
            "pos": {"x": 1, "at": at},
            "attrs": [("n", 2)],
            "raw": b"\xff\x00",
            "lag": timedelta(seconds=-1, milliseconds=500),
        },
        {"k": "b", "tags": None, "pos": None, "attrs": None, "raw": None, "lag": None},
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema)
    printed = {}
    for fmt in ("csv", "jsonl", "table"):
        stream = io.StringIO()
        StdoutSink("o", schema, fmt, stream=stream).write(batch)
        printed[fmt] = stream.getvalue()
    assert printed["csv"].splitlines() == [
        '"k","tags","pos","attrs","raw","lag"',
        '"a","[""x"", ""q\\""t""]","{""x"": 1, ""at"": ""2024-01-01T00:00:01+00:00""}",'
        '"[[""n"", 2]]","ff00",-500',
        '"b",,,,,',
    ]
    assert printed["jsonl"].splitlines() == [
        '{"k": "a", "tags": ["x", "q\\"t"], "pos": {"x": 1, "at": "2024-01-01T00:00:01+00:00"}, '
        '"attrs": [["n", 2]], "raw": "ff00", "lag": "-PT0.5S"}',
        '{"k": "b", "tags": null, "pos": null, "attrs": null, "raw": null, "lag": null}',
    ]
    assert '["x", "q\\"t"]' in printed["table"]
    assert '{"x": 1, "at": "2024-01-01T00:00:01+00:00"}' in printed["table"]


def test_stdout_sink_tables_print_brackets_in_values_as_they_are() -> None:
    """rich read square brackets in a cell as markup: ``[red]`` printed as nothing and
    ``[bold]x[/bold]`` as ``x``. Every value prints as its text."""
    schema = pa.schema([("[k]", pa.string())])
    batch = pa.RecordBatch.from_pylist([{"[k]": "[red]"}, {"[k]": "[bold]x[/bold]"}], schema)
    stream = io.StringIO()
    StdoutSink("o[1]", schema, "table", stream=stream).write(batch)
    assert stream.getvalue().splitlines() == [
        "o[1]",
        "┏━━━━━━━━━━━━━━━━┓",
        "┃ [k]            ┃",
        "┡━━━━━━━━━━━━━━━━┩",
        "│ [red]          │",
        "│ [bold]x[/bold] │",
        "└────────────────┘",
    ]


# --- the embedded API -------------------------------------------------------------------------


def pipeline_dir(tmp_path: Path) -> Path:
    write_csv(tmp_path / "in.csv", [("a", 1, 1), ("a", 12, 1), ("a", 3, 1), ("b", 25, 1)])
    late = "CREATE SINK l WITH (connector = 'file', format = 'jsonl');\n"
    (tmp_path / "p.sql").write_text(
        SOURCE.replace("'2'", "'0'")
        + SINK.replace("'stdout'", "'file', format = 'csv'")
        + late
        + COUNT.format(args="")
        + "INSERT INTO l SELECT * FROM LATE(s);\n"
    )
    return tmp_path


def test_iterating_a_pipeline_yields_sink_batches_without_writing(tmp_path: Path) -> None:
    pipeline = Pipeline.from_sql(pipeline_dir(tmp_path) / "p.sql", output_dir=tmp_path / "out")
    got = [(name, batch.to_pylist()) for name, batch in pipeline]
    assert got == [
        ("o", [{"k": "a", "window_start": at(0), "window_end": at(10), "n": 1}]),
        (
            "l",
            [
                {
                    "k": "a",
                    "t": at(3),
                    "v": 1,
                    "_late_reason": "late",
                    "_window_start": at(0),
                    "_window_end": at(10),
                }
            ],
        ),
        ("o", [{"k": "a", "window_start": at(10), "window_end": at(20), "n": 1}]),
        ("o", [{"k": "b", "window_start": at(20), "window_end": at(30), "n": 1}]),
    ]
    assert not (tmp_path / "out").exists()


def test_run_writes_every_sink_and_summarises(tmp_path: Path) -> None:
    directory = pipeline_dir(tmp_path)
    summary = Pipeline.from_sql(str(directory / "p.sql"), output_dir=tmp_path / "out").run()
    assert summary.rows == {"o": 3, "l": 1}
    assert summary.targets["o"] == str(tmp_path / "out" / "o.csv")
    assert list(summary.late_rows.values()) == [1]
    assert (tmp_path / "out" / "l.jsonl").read_text().count("\n") == 1


def test_sql_text_reads_relative_paths_from_base_dir(tmp_path: Path) -> None:
    text = (pipeline_dir(tmp_path) / "p.sql").read_text()
    batches = list(Pipeline.from_sql(text, base_dir=tmp_path))
    assert sum(b.num_rows for name, b in batches if name == "o") == 3


def test_a_missing_input_file_points_at_the_path_option(tmp_path: Path) -> None:
    pipeline = Pipeline.from_sql(SOURCE + SINK + COUNT.format(args=""), base_dir=tmp_path)
    with pytest.raises(PipelineSQLError, match="no file matches") as info:
        pipeline.run()
    assert (info.value.line, info.value.col) == (3, 34)


def test_explain_says_count_distinct_runs_on_folded_sets_not_a_sql_merge(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_text("k,t,v\na,1970-01-01 00:00:01,3\n")
    text = Pipeline.from_sql(
        SOURCE + SINK + "INSERT INTO o SELECT k, window_start, count(DISTINCT v) AS d\n"
        "FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start;\n",
        base_dir=tmp_path,
    ).explain()
    assert "engine/distinct.py" in text
    assert "merge aggregation" not in text


def test_explain_names_partitions_watermark_window_sql_and_sinks(tmp_path: Path) -> None:
    text = Pipeline.from_sql(pipeline_dir(tmp_path) / "p.sql").explain()
    for expected in (
        "SOURCE s",
        "partitions (1, one per file):",
        "W_p = max(t) - 0s per partition",
        "TUMBLE size 10s",
        "state: folded on arrival",  # count(*): fixed-width state, no SQL merge
        "final projection: k, window_start, window_end, n := __a0",
        "late side output: LATE(s), read by INSERT INTO l",
        "SINK o",
        "per-row query",
    ):
        assert expected in text, expected


def test_flight_serve_pipeline_is_exported_lazily() -> None:
    code = (
        "import sys, flight_serve\n"
        "assert 'datafusion' not in sys.modules and 'sqlglot' not in sys.modules\n"
        "assert flight_serve.Pipeline.__name__ == 'Pipeline'\n"
        "assert 'datafusion' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


#: What ``flight-serve run`` of a file -> stdout window pipeline must not load (cold start,
#: DESIGN §11; benchmarks ``coldstart``): the other connectors and their glue, the stream store,
#: checkpoints (pyarrow.fs and ssl), the sandbox of Python functions, the Flight server side;
#: and what only other kinds of pipeline use (plugin stages, table functions, session windows,
#: the approx_* sketches, user functions and their planning, JSON lines files, path globs);
#: and the other sub-commands' CLI (cli_streams).
_NOT_ON_THE_RUN_PATH = {
    "falkordb",
    "flight_serve.cli_streams",
    "flight_serve.functions",
    "flight_serve.pipelines.functions",
    "glob",
    "pyarrow.json",
    "flight_serve.connectors.datagen",
    "flight_serve.connectors.falkordb",
    "flight_serve.connectors.flight",
    "flight_serve.connectors.iceberg",
    "flight_serve.engine.fold_session",
    "flight_serve.engine.sketches",
    "flight_serve.flight",
    "flight_serve.functions.python",
    "flight_serve.pipelines.checkpoint",
    "flight_serve.pipelines.coordinator",
    "flight_serve.pipelines.epoch_sinks",
    "flight_serve.pipelines.flight_io",
    "flight_serve.pipelines.function_nodes",
    "flight_serve.pipelines.graph_io",
    "flight_serve.pipelines.iceberg_io",
    "flight_serve.pipelines.plugins",
    "flight_serve.pipelines.store_io",
    "flight_serve.store",
    "grpc",
    "prometheus_client",
    "pyarrow.flight",
    "pyarrow.fs",
    "pyiceberg",
    "ray",
    "rich",
    "ssl",
    "wasmtime",
}


def test_cli_run_of_a_file_to_stdout_pipeline_loads_no_other_connector(tmp_path: Path) -> None:
    write_csv(tmp_path / "in.csv", [("a", 1, 1), ("a", 12, 2)])
    sink = "CREATE SINK o WITH (connector = 'stdout', format = 'jsonl');\n"
    (tmp_path / "p.sql").write_text(SOURCE + sink + COUNT.format(args=""))
    code = (
        "import json, os, sys\n"
        "from flight_serve.cli import main\n"
        "code = main(['run', sys.argv[1]])\n"
        "tasks = [open(f'/proc/self/task/{t}/comm').read().strip()\n"
        "         for t in os.listdir('/proc/self/task')]\n"
        "print(json.dumps([code, sorted(sys.modules), tasks]), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "p.sql")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    exit_code, modules, threads = json.loads(done.stderr.splitlines()[-1])
    assert exit_code == 0
    assert [json.loads(line)["n"] for line in done.stdout.splitlines()] == [1, 1]  # it ran
    assert {m for m in modules if m in _NOT_ON_THE_RUN_PATH} == set()
    # a folded count ran no DataFusion query: its runtime (tokio) never started
    assert not [t for t in threads if t.startswith("tokio")], threads


def test_cli_run_reports_errors_with_position_and_exit_code_1(tmp_path: Path) -> None:
    (tmp_path / "bad.sql").write_text(SOURCE + "INSERT INTO nowhere SELECT * FROM s;\n")
    cli = Path(sys.executable).parent / "flight-serve"
    done = subprocess.run(
        [str(cli), "run", str(tmp_path / "bad.sql")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "no such sink" in done.stderr
    assert "(line 4, column 13)" in done.stderr


def test_sink_as_select_and_materialized_view_forms(tmp_path: Path) -> None:
    write_csv(tmp_path / "in.csv", [("a", 1, 1), ("b", 2, 5)])
    sql = SOURCE + (
        "CREATE MATERIALIZED VIEW big AS SELECT k, v FROM s WHERE v > 1;\n"
        "CREATE SINK all_big FROM big WITH (connector = 'stdout');\n"
        "CREATE SINK keys AS SELECT k FROM big WITH (connector = 'stdout');\n"
    )
    got = [(name, b.to_pylist()) for name, b in Pipeline.from_sql(sql, base_dir=tmp_path)]
    assert got == [("all_big", [{"k": "b", "v": 5}]), ("keys", [{"k": "b"}])]


def test_a_comment_after_a_statements_semicolon_is_a_comment() -> None:
    """``SET allowed_lateness = '5s';  -- why`` (docs/pipelines.md's first example writes it so)
    used to fail: ``unsupported statement '/* why */'`` (sqlglot's Semicolon node holding the
    comment was read as a statement)."""
    plan = parse_pipeline(
        "SET allowed_lateness = '5s';   -- pipeline options come first\n"
        "CREATE SOURCE s (k VARCHAR, t TIMESTAMP, WATERMARK FOR t AS t)\n"
        "WITH (connector = 'file', path = 'in.csv');  /* a block comment */\n"
        "CREATE SINK out WITH (connector = 'stdout');\n"
        "INSERT INTO out SELECT k, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(s, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end; -- end\n"
    )
    assert list(plan.sources) == ["s"]
    assert list(plan.sinks) == ["out"]
    assert [q.label for q in plan.queries] == ["INSERT INTO out (line 5)"]
    assert plan.settings.allowed_lateness == timedelta(seconds=5)
