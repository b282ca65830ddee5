"""Limits on SQL text before a parser or DataFusion sees it: its size, and how deeply its
expressions nest.

DataFusion 55 overflows its stack planning an expression nested about 10,000 deep, and a stack
overflow is a segmentation fault that ends the whole server: ``SELECT 1+1+…+1`` with 12,000
terms (24 KB of SQL) did, from any client allowed to plan a query. sqlglot raises RecursionError
at a few thousand nested parentheses, and parsing megabytes of SQL takes seconds and gigabytes.
So every SQL text is checked first (:func:`check_sql`):

- at most :data:`MAX_SQL_CHARS` characters (1 MiB);
- expressions nested at most :data:`MAX_SQL_DEPTH` (2,000) deep, estimated from sqlglot's tokens:
  each open parenthesis or bracket adds a level, and so does each binary operator in a chain
  (``a + b + c`` parses as ``(a + b) + c``), by precedence (``x = 1 OR x = 2 OR …`` is as deep
  as its ORs, plus one); a comma or a clause keyword (``SELECT``, ``WHERE``, ``WHEN``, ...)
  starts a new chain, so long ``IN`` lists, ``VALUES`` rows and ``CASE`` branches are not deep.

Both limits are INVALID_ARGUMENT naming the limit (:class:`~flight_serve.errors.InvalidInputError`).
"""

from __future__ import annotations

from typing import Final

import sqlglot
from sqlglot import TokenType

from flight_serve.errors import InvalidInputError

__all__ = ["MAX_SQL_CHARS", "MAX_SQL_DEPTH", "check_sql", "check_sql_size", "sql_depth"]

#: The longest SQL text accepted, in characters.
MAX_SQL_CHARS: Final = 1 << 20
#: The deepest expression nesting accepted (DataFusion 55 crashes near 10,000).
MAX_SQL_DEPTH: Final = 2000


def _types(*names: str) -> frozenset[TokenType]:
    return frozenset(getattr(TokenType, n) for n in names if hasattr(TokenType, n))


_OPEN: Final = _types("L_PAREN", "L_BRACKET")
_CLOSE: Final = _types("R_PAREN", "R_BRACKET")
#: Binary (and NOT) operators by precedence level, lowest first: ``a OR b = c`` nests the
#: comparison under the OR, so a run of a higher level ends where a lower-level operator starts.
_LEVELS: Final = (
    _types("OR"),
    _types("AND"),
    _types("NOT"),
    _types("EQ", "NEQ", "LT", "LTE", "GT", "GTE", "NULLSAFE_EQ", "LIKE", "ILIKE", "IS"),
    _types("AMP", "PIPE", "CARET"),
    _types("PLUS", "DASH", "DPIPE"),
    _types("STAR", "SLASH", "MOD"),
)
_LEVEL_OF: Final = {kind: level for level, kinds in enumerate(_LEVELS) for kind in kinds}
_NEW_CHAIN: Final = _types(
    "COMMA", "SEMICOLON", "SELECT", "FROM", "WHERE", "GROUP_BY", "ORDER_BY", "HAVING", "LIMIT",
    "WHEN", "THEN", "ELSE", "END", "CASE", "ON", "VALUES", "UNION", "EXCEPT", "INTERSECT", "JOIN",
)  # fmt: skip


def check_sql_size(sql: str) -> None:
    """Refuse SQL text longer than :data:`MAX_SQL_CHARS` (cheap: its length only).

    Raises:
        InvalidInputError: the text is too long (the message names the limit).
    """
    if len(sql) > MAX_SQL_CHARS:
        raise InvalidInputError(
            f"the SQL text is {len(sql)} characters; the limit is {MAX_SQL_CHARS} (1 MiB)"
        )


def sql_depth(sql: str) -> int:
    """The estimated nesting depth of ``sql``'s expressions (see the module docstring); 0 when
    sqlglot cannot tokenize it (the parser reports that).

    >>> sql_depth("SELECT a FROM t WHERE x IN (1, 2, 3)")
    1
    >>> sql_depth("SELECT * FROM t WHERE " + " OR ".join(f"x = {i}" for i in range(30)))
    30
    >>> sql_depth("SELECT " + "1+" * 50 + "1")
    50
    >>> sql_depth("SELECT " + "(" * 40 + "1" + ")" * 40)
    40
    """
    try:
        tokens = sqlglot.tokenize(sql)
    except sqlglot.errors.TokenError:
        return 0
    outer: list[list[int]] = []  # the operator runs of each enclosing level when it was opened
    depth_outside = 0  # sum over ``outer`` of (its runs + 1)
    runs = [0] * len(_LEVELS)  # per precedence level, the operators chained so far
    deepest = 0
    for token in tokens:
        kind = token.token_type
        level = _LEVEL_OF.get(kind)
        if level is not None:
            for higher in range(level + 1, len(runs)):  # that operand's subtree is closed
                runs[higher] = 0
            runs[level] += 1
        elif kind in _OPEN:
            outer.append(runs)
            depth_outside += sum(runs) + 1
            runs = [0] * len(_LEVELS)
        elif kind in _CLOSE:
            if outer:  # the group is one operand of the chain it sits in
                runs = outer.pop()
                depth_outside -= sum(runs) + 1
        elif kind in _NEW_CHAIN:
            runs = [0] * len(_LEVELS)
        deepest = max(deepest, depth_outside + sum(runs))
    return deepest


def check_sql(sql: str) -> None:
    """Refuse SQL text above :data:`MAX_SQL_CHARS` or nested deeper than :data:`MAX_SQL_DEPTH`.

    Raises:
        InvalidInputError: a limit is exceeded (the message names it).
    """
    check_sql_size(sql)
    depth = sql_depth(sql)
    if depth > MAX_SQL_DEPTH:
        raise InvalidInputError(
            f"the SQL nests expressions about {depth} deep; the limit is {MAX_SQL_DEPTH} "
            "(a longer chain such as a + b + … or x OR y OR … must be split up)"
        )
