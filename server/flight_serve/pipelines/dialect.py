"""The pipeline SQL dialect: sqlglot's ``risingwave`` dialect, with ``SESSION`` usable as a table
function name (RisingWave's tokenizer reserves it for ``SET SESSION``), plus helpers that turn
sqlglot's errors and literals into flight-serve's.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, ClassVar

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.risingwave import RisingWave

from flight_serve.engine.sqlguard import check_sql_size
from flight_serve.errors import PipelineSQLError


class FlightServeSQL(RisingWave):
    """RisingWave's dialect where ``SESSION(src, ts, gap)`` parses as a table function."""

    class Tokenizer(RisingWave.Tokenizer):
        KEYWORDS: ClassVar[dict[str, Any]] = {
            k: v for k, v in RisingWave.Tokenizer.KEYWORDS.items() if k != "SESSION"
        }


_UNITS_NS = {
    "NANOSECOND": 1,
    "MICROSECOND": 1_000,
    "MILLISECOND": 1_000_000,
    "SECOND": 1_000_000_000,
    "MINUTE": 60_000_000_000,
    "HOUR": 3_600_000_000_000,
    "DAY": 86_400_000_000_000,
    "WEEK": 7 * 86_400_000_000_000,
}


#: The words a statement starts with, and those after CREATE (docs/pipelines.md, "Grammar").
STATEMENT_WORDS = ("CREATE", "INSERT", "SET", "SELECT", "WITH")
CREATE_KINDS = ("SOURCE", "TABLE", "SINK", "VIEW", "FUNCTION")


def _token_start(token: Token) -> tuple[int, int]:
    """Line and first column (1-based) of ``token`` (sqlglot's ``col`` is its last column)."""
    return token.line, max(1, token.col - (token.end - token.start))


def _suggest(word: str, words: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word.upper(), words, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _statement_hint(sql: str, line: int | None = None) -> PipelineSQLError | None:
    """An error naming a misspelled statement word (``CREAT SINK``, ``CREATE SINKK``, ``INSERT
    INT``, ``CREATE SINK s WIHT (…)``) with its own line and column, for the first statement that
    has one (or the statement on ``line``, the parser's error line); ``None`` if none is wrong.

    sqlglot's error points where the parser gave up, often a word or two later (``CREAT SINK out``
    fails at ``out``); the statement's own words are checked first, with sqlglot's tokenizer.
    """
    try:
        tokens = FlightServeSQL().tokenize(sql)
    except sqlglot.errors.TokenError:
        return None
    statements: list[list[Token]] = [[]]
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            statements.append([])
        else:
            statements[-1].append(token)
    for words in statements:
        if not words or (line is not None and not words[0].line <= line <= words[-1].line):
            continue
        hint = _words_hint(words)
        if hint is not None:
            return hint
    return None


def _words_hint(words: list[Token]) -> PipelineSQLError | None:
    first = words[0].text.upper()
    if first not in STATEMENT_WORDS:
        return PipelineSQLError(
            f"unknown statement {words[0].text}{_suggest(first, STATEMENT_WORDS)} (a pipeline "
            "holds SET, CREATE SOURCE | TABLE | SINK | VIEW | FUNCTION and INSERT INTO)",
            *_token_start(words[0]),
        )
    if first == "INSERT" and len(words) > 1 and words[1].text.upper() != "INTO":
        return PipelineSQLError(
            f"write INSERT INTO <sink> SELECT …, not INSERT {words[1].text}",
            *_token_start(words[1]),
        )
    if first != "CREATE" or len(words) < 2:
        return None
    index = 1
    if words[1].text.upper() == "MATERIALIZED" and len(words) > 2:  # RisingWave's MATERIALIZED VIEW
        index = 2
    kind = words[index].text.upper()
    if kind not in CREATE_KINDS:
        return PipelineSQLError(
            f"unknown CREATE {words[index].text}{_suggest(kind, CREATE_KINDS)} (CREATE SOURCE, "
            "TABLE, SINK, VIEW or FUNCTION)",
            *_token_start(words[index]),
        )
    after = index + 2  # CREATE <kind> <name> …
    if kind == "FUNCTION" or after >= len(words):
        return None
    if words[after].token_type == TokenType.L_PAREN:  # the column list
        depth = 0
        for position_, token in enumerate(words[after:], start=after):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(token.token_type, 0)
            if depth == 0:
                after = position_ + 1
                break
        if after >= len(words) or words[after].token_type == TokenType.L_PAREN:
            return None
    word = words[after].text.upper()
    if word not in ("WITH", "AS"):
        return PipelineSQLError(
            f"expected WITH (…) or AS SELECT … after CREATE {kind} {words[index + 1].text}, got "
            f"{words[after].text}{_suggest(word, ('WITH', 'AS'))}",
            *_token_start(words[after]),
        )
    return None


def key_position(sql: str, value: exp.Expr, key: str) -> tuple[int, int] | None:
    """Line and column of the key of a ``key = value`` whose value is ``value`` in ``sql``
    (sqlglot records no position for such keys), found with sqlglot's tokenizer; ``None`` when
    the value has no position or the key is not just before it."""
    start = value.meta.get("start") if hasattr(value, "meta") else None
    if start is None:
        return None
    try:
        tokens = [t for t in FlightServeSQL().tokenize(sql) if t.start < int(start)]
    except sqlglot.errors.TokenError:
        return None
    if (
        len(tokens) >= 2
        and tokens[-1].token_type == TokenType.EQ
        and tokens[-2].text.lower() == key.lower()
    ):
        return _token_start(tokens[-2])
    return None


class _NoCommandFallback(logging.Filter):
    """Drops sqlglot's "Falling back to parsing as a 'Command'" warning: such statements get a
    clear error of their own (:func:`_statement_hint`, or the planner's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


@contextlib.contextmanager
def _quiet_fallback() -> Iterator[None]:
    logger = logging.getLogger("sqlglot")
    quiet = _NoCommandFallback()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def parse_statements(sql: str) -> list[exp.Expression]:
    """Parse ``sql`` (one or more ``;``-separated statements).

    Raises:
        PipelineSQLError: the parser's message with the line and column of the offending token;
            a misspelled statement word (``CREAT SINK``) is named, with its own line and column.
    """
    check_sql_size(sql)  # before sqlglot reads it
    try:
        with _quiet_fallback():
            statements = sqlglot.parse(sql, read=FlightServeSQL)
    except sqlglot.errors.ParseError as exc:
        first_error = exc.errors[0] if exc.errors else {}
        hint = _statement_hint(sql, first_error.get("line"))
        if hint is not None:
            raise hint from exc
        first = exc.errors[0] if exc.errors else {}
        description = first.get("description") or str(exc)
        highlight = first.get("highlight")
        near = f" near {highlight!r}" if highlight else ""
        line, col = first.get("line"), first.get("col")
        if col is not None and highlight and "\n" not in highlight:
            col = max(1, int(col) - len(highlight) + 1)  # sqlglot reports the token's last column
        raise PipelineSQLError(f"syntax error: {description}{near}", line, col) from exc
    except sqlglot.errors.TokenError as exc:
        raise PipelineSQLError(f"syntax error: {exc}") from exc
    if any(isinstance(s, exp.Command) for s in statements):  # sqlglot gave up on one
        hint = _statement_hint(sql)
        if hint is not None:
            raise hint
    # a comment after a statement's ';' (``SET x = 1;  -- why``) is sqlglot's Semicolon node
    # holding that comment: a comment, not a statement
    return [
        s for s in statements if isinstance(s, exp.Expression) and not isinstance(s, exp.Semicolon)
    ]


def position(node: exp.Expr) -> tuple[int | None, int | None]:
    """Line and column (1-based) where ``node``'s first recorded token starts.

    sqlglot records positions on identifiers, literals and function names only, and its ``col`` is
    the token's *last* column; the start is ``col - (end - start)`` (character offsets). A node
    without a position of its own (a whole statement, an operator) points at the earliest token
    beneath it.
    """
    meta = node.meta if hasattr(node, "meta") else {}
    if "line" not in meta:
        recorded = [c.meta for c in node.walk() if c.meta and "line" in c.meta]
        meta = min(recorded, key=lambda m: int(m.get("start", 0))) if recorded else {}
    line, col = meta.get("line"), meta.get("col")
    if line is None or col is None:
        return None, None
    start, end = meta.get("start"), meta.get("end")
    width = int(end) - int(start) if start is not None and end is not None else 0
    return int(line), max(1, int(col) - width)


def sql_error(message: str, node: exp.Expr) -> PipelineSQLError:
    """A :class:`PipelineSQLError` pointing at ``node``."""
    line, col = position(node)
    return PipelineSQLError(message, line, col)


def function_named_in(select: exp.Select, message: str) -> exp.Anonymous | None:
    """The first call in ``select`` (in the text's order, its FROM's table functions aside) of a
    function that DataFusion's planning error ``message`` names, quoted (``Invalid function
    'cnt'``), or ``None``. DataFusion's message has no position; the call does."""
    said = message.lower()
    calls = [
        node
        for node in select.find_all(exp.Anonymous)
        if not isinstance(node.parent, exp.Table)  # TUMBLE(…), LATE(x), f(x) in FROM
        and f"'{node.name.lower()}'" in said
    ]
    return min(calls, key=lambda node: tuple(n or 0 for n in position(node)), default=None)


def calendar_interval(node: exp.Expression) -> str | None:
    """``'day'``, ``'week'`` or ``'month'`` when ``node`` is ``INTERVAL '1' DAY|WEEK|MONTH``,
    else ``None`` (the sizes a calendar window can take).

    >>> calendar_interval(sqlglot.parse_one("INTERVAL '1' MONTH"))
    'month'
    """
    if not isinstance(node, exp.Interval) or node.this is None:
        return None
    unit_node = node.args.get("unit")
    unit = unit_node.name.upper().rstrip("S") if unit_node is not None else ""
    if node.this.name.strip() == "1" and unit in ("DAY", "WEEK", "MONTH"):
        return unit.lower()
    return None


def interval_to_timedelta(node: exp.Expression) -> timedelta:
    """``INTERVAL '10' SECOND`` (or ``INTERVAL '1 hour'``, or a string like ``'5s'``) → timedelta.

    Raises:
        PipelineSQLError: not an interval, a non-integer amount, or an unknown unit.

    >>> interval_to_timedelta(sqlglot.parse_one("INTERVAL '90' MINUTE"))
    datetime.timedelta(seconds=5400)
    """
    if isinstance(node, exp.Interval):
        amount_node = node.this
        unit_node = node.args.get("unit")
        unit = unit_node.name.upper() if unit_node is not None else "SECOND"
        amount_text = amount_node.name if amount_node is not None else ""
    elif isinstance(node, exp.Literal) and node.is_string:
        return duration_from_text(node.name, node)
    else:
        raise sql_error(f"expected an INTERVAL, got {node.sql()}", node)
    unit = unit.rstrip("S") if unit.endswith("S") and unit[:-1] in _UNITS_NS else unit
    if unit not in _UNITS_NS:
        raise sql_error(f"unknown interval unit {unit!r}", node)
    try:
        amount = int(amount_text)
    except ValueError:
        raise sql_error(f"interval amount must be an integer, got {amount_text!r}", node) from None
    return timedelta(microseconds=amount * _UNITS_NS[unit] // 1_000)


_SHORT_UNITS = {
    "ns": "NANOSECOND",
    "us": "MICROSECOND",
    "ms": "MILLISECOND",
    "s": "SECOND",
    "m": "MINUTE",
    "min": "MINUTE",
    "h": "HOUR",
    "d": "DAY",
    "w": "WEEK",
}


def duration_from_text(text: str, node: exp.Expression | None = None) -> timedelta:
    """A duration option such as ``'30s'``, ``'15 minutes'`` or ``'250ms'`` → timedelta.

    Raises:
        PipelineSQLError: the text is not an integer followed by a unit.

    >>> duration_from_text("15 minutes")
    datetime.timedelta(seconds=900)
    """
    stripped = text.strip()
    digits = len(stripped) - len(stripped.lstrip("0123456789"))
    number, unit = stripped[:digits], stripped[digits:].strip()
    unit_key = _SHORT_UNITS.get(unit.lower(), unit.upper().rstrip("S") if unit else "")
    if not number or unit_key not in _UNITS_NS:
        message = f"cannot read duration {text!r}: write an integer and a unit, such as '30s'"
        raise sql_error(message, node) if node is not None else PipelineSQLError(message)
    return timedelta(microseconds=int(number) * _UNITS_NS[unit_key] // 1_000)
