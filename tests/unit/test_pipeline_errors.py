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
