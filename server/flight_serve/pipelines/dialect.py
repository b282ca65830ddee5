"""The pipeline SQL dialect: sqlglot's ``risingwave`` dialect, with ``SESSION`` usable as a table
function name (RisingWave's tokenizer reserves it for ``SET SESSION``), plus helpers that turn
sqlglot's errors and literals into flight-serve's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import sqlglot
from sqlglot import exp
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


def parse_statements(sql: str) -> list[exp.Expression]:
    """Parse ``sql`` (one or more ``;``-separated statements).

    Raises:
        PipelineSQLError: the parser's message with the line and column of the offending token.
    """
    check_sql_size(sql)  # before sqlglot reads it
    try:
        statements = sqlglot.parse(sql, read=FlightServeSQL)
    except sqlglot.errors.ParseError as exc:
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
    return [s for s in statements if isinstance(s, exp.Expression)]


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
