"""Errors a user meets writing a pipeline, through the Python API (``parse_pipeline`` and
``Pipeline.from_sql(...).explain()``): each says what is wrong, where (line and column of the
word at fault) and what to do. The same cases through the CLI are in
tests/integration/test_cli_errors.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from flight_serve.embedded import Pipeline
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.query import parse_window_query

CSV = "k,origin,t\na,x,2020-01-01T00:00:00\n"
SOURCE = (
    "CREATE SOURCE s (WATERMARK FOR t AS t) WITH (connector = 'file', path = 'in.csv');\n"
    "CREATE SINK out WITH (connector = 'stdout');\n"
)
DECLARED = (
    "CREATE SOURCE s (k VARCHAR, origin VARCHAR, t TIMESTAMP, WATERMARK FOR t AS t) "
    "WITH (connector = 'file', path = 'in.csv');\n"
    "CREATE SINK out WITH (connector = 'stdout');\n"
)


def explain(tmp_path: Path, sql: str) -> str:
    (tmp_path / "in.csv").write_text(CSV)
    (tmp_path / "p.sql").write_text(sql)
    return Pipeline.from_sql(tmp_path / "p.sql").explain()


def error(tmp_path: Path, sql: str) -> str:
    with pytest.raises(PipelineSQLError) as info:
        explain(tmp_path, sql)
    return str(info.value)


# --- columns that do not exist ----------------------------------------------------------------

TUMBLE = "FROM TUMBLE(s, t, INTERVAL '10' SECOND) "
COLUMNS = "(columns of s: k, origin, t)"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (  # misspelled in SELECT, right in GROUP BY: not "must appear in GROUP BY"
            "SELECT orign, window_start, window_end, count(*) AS n\n"
            + TUMBLE
            + "GROUP BY origin, window_start, window_end;",
            f"column orign does not exist in s; did you mean origin? {COLUMNS} (line 4, column 8)",
        ),
        (  # misspelled in GROUP BY: the GROUP BY word is named, not the SELECT's right one
            "SELECT origin, window_start, window_end, count(*) AS n\n"
            + TUMBLE
            + "GROUP BY orign, window_start, window_end;",
            f"column orign does not exist in s; did you mean origin? {COLUMNS} (line 5, column 50)",
        ),
        (  # in an aggregate
            "SELECT origin, window_start, window_end, count(*) AS n, max(kk) AS m\n"
            + TUMBLE
            + "GROUP BY origin, window_start, window_end;",
            f"column kk does not exist in s; did you mean k? {COLUMNS} (line 4, column 61)",
        ),
        (  # in WHERE (was only found at the first batch, without a position)
            "SELECT origin, window_start, window_end, count(*) AS n\n"
            + TUMBLE
            + "WHERE orgin = 'x' GROUP BY origin, window_start, window_end;",
            f"column orgin does not exist in s; did you mean origin? {COLUMNS} (line 5, column 47)",
        ),
        (  # per-row query
            "SELECT orign, k FROM s;",
            f"column orign does not exist in s; did you mean origin? {COLUMNS} (line 4, column 8)",
        ),
        (  # per-row WHERE, no near name
            "SELECT origin FROM s WHERE zzz = 1;",
            f"column zzz does not exist in s {COLUMNS} (line 4, column 28)",
        ),
    ],
)
def test_a_column_that_does_not_exist_is_named_with_the_nearest_one(
    tmp_path: Path, query: str, message: str
) -> None:
    assert error(tmp_path, SOURCE + "INSERT INTO out\n" + query) == message


def test_declared_columns_are_checked_when_the_pipeline_is_parsed() -> None:
    sql = (
        DECLARED
        + "INSERT INTO out\nSELECT orign, window_start, window_end, count(*) AS n\n"
        + TUMBLE
        + "GROUP BY origin, window_start, window_end;"
    )
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(sql)
    assert str(info.value) == (
        f"column orign does not exist in s; did you mean origin? {COLUMNS} (line 4, column 8)"
    )


def test_a_column_that_exists_but_is_not_grouped_still_says_group_by(tmp_path: Path) -> None:
    sql = (
        SOURCE
        + "INSERT INTO out\nSELECT origin, k, window_start, window_end, count(*) AS n\n"
        + TUMBLE
        + "GROUP BY origin, window_start, window_end;"
    )
    assert error(tmp_path, sql) == (
        "column k must appear in GROUP BY or be used in an aggregate (line 4, column 16)"
    )


def test_the_exchange_query_names_the_misspelled_column_too() -> None:
    import pyarrow as pa

    schema = pa.schema([("origin", pa.string()), ("t", pa.timestamp("s"))])
    query = parse_window_query(
        "SELECT orign, window_start, window_end, count(*) AS n "
        "FROM TUMBLE(flights, t, INTERVAL '1' HOUR) GROUP BY origin, window_start, window_end"
    )
    with pytest.raises(PipelineSQLError) as info:
        query.build(schema)
    assert str(info.value) == (
        "column orign does not exist in flights; did you mean origin? "
        "(columns of flights: origin, t) (line 1, column 8)"
    )


def test_a_window_time_column_that_does_not_exist_suggests_the_nearest(tmp_path: Path) -> None:
    """A source without ``WATERMARK FOR``: the window function's time column is checked against
    the files' columns, with a did-you-mean, at the name (it used to be the operator's "event-time
    column 'tt' is not in the input; input columns: …", pointing at TUMBLE)."""
    sql = SOURCE.replace("(WATERMARK FOR t AS t) ", "") + (
        "INSERT INTO out SELECT origin, window_start, window_end, count(*) AS n\n"
        "FROM TUMBLE(s, tt, INTERVAL '10' SECOND) GROUP BY origin, window_start, window_end;"
    )
    assert error(tmp_path, sql) == (
        f"event-time column tt does not exist in s; did you mean t? {COLUMNS} (line 4, column 16)"
    )


# --- WATERMARK FOR a column that does not exist -----------------------------------------------


def test_watermark_for_a_missing_column_of_the_files_suggests_the_nearest(tmp_path: Path) -> None:
    sql = SOURCE.replace("WATERMARK FOR t AS t", "WATERMARK FOR tt AS tt") + (
        "INSERT INTO out SELECT origin, window_start, window_end, count(*) AS n "
        "FROM TUMBLE(s, tt, INTERVAL '10' SECOND) GROUP BY origin, window_start, window_end;"
    )
    assert error(tmp_path, sql) == (
        "WATERMARK FOR tt: no column tt in the files of s; did you mean t? (columns: k, origin, "
        "t); name the event-time column, a timestamp (line 1, column 32)"
    )


def test_watermark_for_a_missing_declared_column_suggests_the_nearest() -> None:
    sql = DECLARED.replace("WATERMARK FOR t AS t", "WATERMARK FOR tm AS tm") + (
        "INSERT INTO out SELECT k FROM s;"
    )
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(sql)
    assert str(info.value) == (
        "WATERMARK FOR tm: no column tm in source s; did you mean t? (columns: k, origin, t); "
        "name the event-time column, a timestamp (line 1, column 72)"
    )


# --- misspelled statement words ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            SOURCE.replace("CREATE SINK", "CREAT SINK"),
            "unknown statement CREAT; did you mean CREATE? (a pipeline holds SET, CREATE SOURCE | "
            "TABLE | SINK | VIEW | FUNCTION and INSERT INTO) (line 2, column 1)",
        ),
        (
            SOURCE.replace("CREATE SINK", "CREATE SINKK"),
            "unknown CREATE SINKK; did you mean SINK? (CREATE SOURCE, TABLE, SINK, VIEW or "
            "FUNCTION) (line 2, column 8)",
        ),
        (
            SOURCE + "INSERT INT out SELECT k FROM s;",
            "write INSERT INTO <sink> SELECT …, not INSERT INT (line 3, column 8)",
        ),
        (
            SOURCE.replace("out WITH", "out WIHT"),
            "expected WITH (…) or AS SELECT … after CREATE SINK out, got WIHT; did you mean "
            "WITH? (line 2, column 17)",
        ),
    ],
)
def test_a_misspelled_statement_word_is_named_where_it_is(sql: str, message: str) -> None:
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(sql)
    assert str(info.value) == message


# --- options ----------------------------------------------------------------------------------


def test_a_misspelled_connector_key_is_named_with_connector_suggested() -> None:
    sql = (
        SOURCE.replace("(connector = 'file'", "(conector = 'file'")
        + "INSERT INTO out SELECT k FROM s;"
    )
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(sql)
    assert str(info.value) == (
        "unknown option conector of CREATE SOURCE s; did you mean connector? (CREATE SOURCE s "
        "needs WITH (connector = …)) (line 1, column 46)"
    )


def test_a_misspelled_connector_option_suggests_the_nearest(tmp_path: Path) -> None:
    sql = SOURCE.replace("path = ", "paht = ") + "INSERT INTO out SELECT k FROM s;"
    assert error(tmp_path, sql) == (
        "option paht: unknown option of the file connector of SOURCE s (did you mean path?); its "
        "options: connector, path, format, batch_rows, delimiter (line 1, column 66)"
    )


def test_a_misspelled_connector_name_suggests_the_nearest(tmp_path: Path) -> None:
    sql = SOURCE.replace("'stdout'", "'stdot'") + "INSERT INTO out SELECT k FROM s;"
    assert error(tmp_path, sql) == (
        "option connector: unknown connector 'stdot' for a sink; did you mean stdout? (use "
        "'file' or 'stdout' or 'falkordb' or 'flight' or 'iceberg') (line 2, column 35)"
    )


def test_a_misspelled_set_option_suggests_the_nearest() -> None:
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(
            "SET alowed_lateness = '5s';\n" + SOURCE + "INSERT INTO out SELECT k FROM s;"
        )
    assert str(info.value).startswith(
        "unknown option 'alowed_lateness'; did you mean allowed_lateness?; SET takes "
    )


def test_an_http_server_uri_says_to_use_grpc(tmp_path: Path) -> None:
    sql = (
        "CREATE SOURCE s WITH (connector = 'flight', server = 'http://127.0.0.1:8815');\n"
        "CREATE SINK out WITH (connector = 'stdout');\nINSERT INTO out SELECT * FROM s;"
    )
    assert error(tmp_path, sql) == (
        "option server: http:// is not a Flight scheme: use grpc://127.0.0.1:8815 "
        "(grpc+tls://127.0.0.1:8815 for TLS) (line 1, column 54)"
    )


# --- input files ------------------------------------------------------------------------------


def test_a_missing_relative_input_shows_the_absolute_path(tmp_path: Path) -> None:
    sql = SOURCE.replace("'in.csv'", "'nope.csv'") + "INSERT INTO out SELECT k FROM s;"
    assert error(tmp_path, sql) == (
        f"option path: file connector: no file matches path 'nope.csv' (looked in "
        f"{tmp_path}/nope.csv; relative paths start at {tmp_path}) (line 1, column 73)"
    )


def test_the_examples_missing_flights_file_says_how_to_write_it(tmp_path: Path) -> None:
    example = Path(__file__).parents[3] / "examples" / "hourly_departures.sql"
    (tmp_path / "hourly_departures.sql").write_text(example.read_text())
    with pytest.raises(PipelineSQLError) as info:
        Pipeline.from_sql(tmp_path / "hourly_departures.sql").explain()
    assert str(info.value) == (
        f"option path: file connector: no file matches path 'flights.parquet' (looked in "
        f"{tmp_path}/flights.parquet; relative paths start at {tmp_path}); write it with: "
        f"flight-serve data nycflights13 --out {tmp_path}/flights.parquet (line 12, column 36)"
    )


# --- HOP with the slide larger than the size --------------------------------------------------


def test_hop_with_the_slide_larger_than_the_size_warns_and_shows_the_other_order() -> None:
    sql = SOURCE + (
        "INSERT INTO out SELECT origin, window_start, window_end, count(*) AS n\n"
        "FROM HOP(s, t, INTERVAL '10' MINUTE, INTERVAL '1' MINUTE)\n"
        "GROUP BY origin, window_start, window_end;"
    )
    assert parse_pipeline(sql).warnings == (
        "HOP slide INTERVAL '10' MINUTE is larger than its size INTERVAL '1' MINUTE: the rows "
        "between two windows fall in none and are dropped; HOP takes the slide first, then the "
        "size — for INTERVAL '10' MINUTE windows every INTERVAL '1' MINUTE write "
        "HOP(s, t, INTERVAL '1' MINUTE, INTERVAL '10' MINUTE) (line 4, column 6)",
    )
    assert (
        parse_pipeline(
            sql.replace("'10' MINUTE, INTERVAL '1'", "'1' MINUTE, INTERVAL '10'")
        ).warnings
        == ()
    )


def test_a_per_row_query_datafusion_refuses_is_one_line_labelled_once(tmp_path: Path) -> None:
    sql = SOURCE + "INSERT INTO out SELECT uppr(k) AS u FROM s;"
    assert error(tmp_path, sql) == (
        "INSERT INTO out (line 3): Error during planning: Invalid function 'uppr'. Did you mean "
        "'upper'? (line 3, column 24)"
    )


# --- a function DataFusion does not know: named where it is called ----------------------------

WINDOW = "SELECT origin, window_start, window_end, count(*) AS n"
GROUP = "GROUP BY origin, window_start, window_end"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (  # in a windowed query's SELECT list: used to point at TUMBLE (line 5, column 6), and
            # DataFusion's message went on a second line
            "SELECT origin, window_start, window_end, cnt(*) AS n\n" + TUMBLE + GROUP + ";",
            "INSERT INTO out (line 3): Error during planning: Invalid function 'cnt'. Did you "
            "mean 'cot'? (line 4, column 42)",
        ),
        (  # in HAVING
            WINDOW + "\n" + TUMBLE + GROUP + " HAVING cnt(*) > 3;",
            "INSERT INTO out (line 3): Error during planning: Invalid function 'cnt'. Did you "
            "mean 'cot'? (line 5, column 90)",
        ),
        (  # in a windowed query's WHERE: explain passed and the run failed at its first batch,
            # without the query or a position
            WINDOW + "\n" + TUMBLE + "WHERE lenght(k) > 0 " + GROUP + ";",
            "INSERT INTO out (line 3): Error during planning: Invalid function 'lenght'. Did you "
            "mean 'length'? (line 5, column 47)",
        ),
        (  # a per-row query's second SELECT item: used to point at the first (line 4, column 8)
            "SELECT k,\n       uppr(k) AS u FROM s;",
            "INSERT INTO out (line 3): Error during planning: Invalid function 'uppr'. Did you "
            "mean 'upper'? (line 5, column 8)",
        ),
    ],
)
def test_an_unknown_function_is_named_where_it_is_called(
    tmp_path: Path, query: str, message: str
) -> None:
    assert error(tmp_path, SOURCE + "INSERT INTO out\n" + query) == message


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("out.xlsx", "the file sink cannot tell the format of out.xlsx from its extension '.xlsx'"),
        ("out", "the file sink cannot tell the format of out (it has no extension)"),
    ],
)
def test_a_file_sink_path_without_a_known_extension_says_what_to_write(
    tmp_path: Path, path: str, message: str
) -> None:
    """It used to say ``the file sink writes parquet, csv or jsonl, not None``."""
    sql = (
        "CREATE SOURCE s (WATERMARK FOR t AS t) WITH (connector = 'file', path = 'in.csv');\n"
        f"CREATE SINK out WITH (connector = 'file', path = '{path}');\n"
        "INSERT INTO out SELECT k, t FROM s;"
    )
    assert error(tmp_path, sql) == (
        f"option path: {message}: end the path in .parquet, .csv or .jsonl, or give format = "
        "'parquet' | 'csv' | 'jsonl' (line 2, column 50)"
    )


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (
            "TUMBLE(s, t, INTERVAL '-1' HOUR)",
            "TUMBLE size must be a positive duration, got INTERVAL '-1' HOUR (line 4, column 52)",
        ),
        (
            "HOP(s, t, INTERVAL '0' MINUTE, INTERVAL '1' HOUR)",
            "HOP slide must be a positive duration, got INTERVAL '0' MINUTE (line 4, column 49)",
        ),
        (
            "SESSION(s, t, INTERVAL '-5' MINUTE)",
            "SESSION gap must be a positive duration, got INTERVAL '-5' MINUTE (line 4, column 53)",
        ),
    ],
)
def test_a_window_duration_that_is_not_positive_is_named_as_written(
    window: str, message: str
) -> None:
    """The amount is pointed at. It used to point at the window function and print Python's repr:
    ``size must be a positive duration, got datetime.timedelta(days=-1, seconds=82800)``."""
    sql = (
        SOURCE
        + f"INSERT INTO out\nSELECT k, count(*) AS n FROM {window}\n"
        + "GROUP BY k, window_start, window_end;"
    )
    with pytest.raises(PipelineSQLError) as info:
        parse_pipeline(sql)
    assert str(info.value) == message


def test_a_pipeline_file_that_is_not_utf8_names_the_byte_and_its_place(tmp_path: Path) -> None:
    """A file saved as Latin-1 (``-- café`` in a comment) used to end flight-serve run, explain
    and submit with a Python traceback (UnicodeDecodeError)."""
    (tmp_path / "in.csv").write_text(CSV)
    (tmp_path / "p.sql").write_bytes(
        SOURCE.encode() + "INSERT INTO out SELECT k FROM s; -- é café".encode("latin-1")
    )
    with pytest.raises(PipelineSQLError) as info:
        Pipeline.from_sql(tmp_path / "p.sql")
    assert str(info.value) == (
        "not UTF-8 text: byte 0xe9 is not UTF-8; save the file as UTF-8 (line 3, column 37)"
    )


def test_a_byte_order_mark_is_not_part_of_the_sql(tmp_path: Path) -> None:
    """Windows editors start a UTF-8 file with a byte-order mark; it used to be read as part of
    the first word: ``unknown statement \\ufeffCREATE; did you mean CREATE?``."""
    (tmp_path / "in.csv").write_text(CSV)
    (tmp_path / "p.sql").write_bytes(
        b"\xef\xbb\xbf" + (SOURCE + "INSERT INTO out SELECT k FROM s;").encode()
    )
    assert "SOURCE s  (line 1)" in Pipeline.from_sql(tmp_path / "p.sql").explain()
