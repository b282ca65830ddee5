"""One SQL statement of a request, parsed once: what Flight SQL (and plain SQL text in a CMD
descriptor) needs to know about it before DataFusion plans it.

:meth:`Statement.parse` checks the text's size, rewrites its ``?`` placeholders to ``$1, $2, ...``
(:func:`rewrite_placeholders`, once) and parses the rewritten text with sqlglot the first time
something asks for the syntax tree (at most once; binding parameters, which only counts the
placeholders, never parses). Everything else is read from that one value:

- :attr:`Statement.kind`: ``query``, ``insert``, ``create`` or ``drop``, by the first keyword
  (comments skipped); refused statements (``UPDATE``, ``DELETE``, transactions, ``SET``, ...)
  raise :class:`~flight_serve.errors.QueryError` saying why;
- :attr:`Statement.tables`: the one-part table names it reads, as DataFusion resolves them
  (unquoted names lower-cased), ``None`` when sqlglot cannot parse it (every stream is offered);
- :attr:`Statement.iceberg_refs`: the ``(namespace, table)`` two-part names, the Iceberg tables
  of the server's catalog (:mod:`flight_serve.flight.sql.catalog`);
- :attr:`Statement.placeholders` and :meth:`Statement.check_parameters`: the ``$n`` / ``$name``
  placeholders and whether bound parameters match them;
- :meth:`Statement.ddl` and :meth:`Statement.refuse_iceberg_targets`: the parsed ``CREATE TABLE``
  / ``DROP TABLE`` and the refusal to write an Iceberg table.

A statement sqlglot cannot parse is still a value: DataFusion reports what it makes of it, and
only DDL, which is executed from the syntax tree, raises "cannot parse the statement".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import pyarrow as pa
import sqlglot
from sqlglot import Token, TokenType, exp

from flight_serve.engine.sqlguard import check_sql_size
from flight_serve.errors import QueryError

__all__ = [
    "Statement",
    "StatementKind",
    "check_parameters",
    "placeholder_names",
    "referenced_tables",
    "rewrite_placeholders",
    "statement_kind",
    "table_name",
]

StatementKind = Literal["query", "insert", "create", "drop"]

_DEFAULT_CATALOG: Final = "datafusion"  # DataFusion's default catalog: the one Flight SQL lists
_DEFAULT_SCHEMA: Final = "public"

_REFUSED: Final = {
    "UPDATE": "UPDATE is not supported: streams are append-only",
    "DELETE": "DELETE is not supported: streams are append-only",
    "MERGE": "MERGE is not supported: streams are append-only",
    "TRUNCATE": "TRUNCATE is not supported: drop and re-create the table",
    "ALTER": "ALTER is not supported: a stream's schema is fixed when it is created",
    "COPY": "COPY is not supported over Flight SQL; use bulk ingest or DoPut",
    "BEGIN": "transactions are not supported: every statement commits on its own",
    "START": "transactions are not supported: every statement commits on its own",
    "COMMIT": "transactions are not supported: every statement commits on its own",
    "ROLLBACK": "transactions are not supported: every statement commits on its own",
    "SET": "SET is not supported",
}


def _tokens(sql: str) -> list[Token] | None:
    """sqlglot's tokens of ``sql`` (comments and whitespace dropped, string literals and quoted
    identifiers one token each), or ``None`` when it cannot tokenize it (an unterminated
    literal: DataFusion reports it)."""
    try:
        return list(sqlglot.tokenize(sql))
    except sqlglot.errors.SqlglotError:
        return None


def rewrite_placeholders(sql: str) -> str:
    """Return ``sql`` with each ``?`` outside literals, quoted identifiers and comments replaced by
    ``$1``, ``$2``, ... in order (sqlglot's tokenizer finds them).

    >>> rewrite_placeholders("SELECT '?', \\"a?\\" FROM t WHERE x = ? AND y > ? -- ?")
    'SELECT \\'?\\', "a?" FROM t WHERE x = $1 AND y > $2 -- ?'
    """
    check_sql_size(sql)  # every statement passes here first, before sqlglot reads it
    if "?" not in sql:
        return sql  # nothing to rewrite: no need to tokenize
    tokens = _tokens(sql)
    if tokens is None:
        return sql
    pieces: list[str] = []
    done = 0
    counter = 0
    for token in tokens:
        if token.token_type == TokenType.PLACEHOLDER and token.text == "?":
            counter += 1
            pieces.append(sql[done : token.start])
            pieces.append(f"${counter}")
            done = token.end + 1
    pieces.append(sql[done:])
    return "".join(pieces)


def placeholder_names(sql: str) -> list[str] | None:
    """The placeholders of ``sql`` (after :func:`rewrite_placeholders`), each once, in the order
    they bind: ``$1``, ``$2``, ... by number, then ``$name`` ones by name; ``None`` when sqlglot
    cannot tokenize ``sql``.

    >>> placeholder_names("SELECT $2, $1 + $2, $who FROM t WHERE s = '$3'")
    ['1', '2', 'who']
    """
    if "$" not in sql:
        return []
    names = _placeholder_names(sql)
    return None if names is None else list(names)


@functools.lru_cache(maxsize=16)  # a statement is checked when bound, planned and run
def _placeholder_names(sql: str) -> tuple[str, ...] | None:
    tokens = _tokens(sql)
    if tokens is None:
        return None
    names = {
        token.text[1:]
        for token in tokens
        if token.token_type == TokenType.VAR and token.text.startswith("$") and token.text[1:]
    }
    return tuple(sorted(names, key=lambda n: (0, int(n), "") if n.isdigit() else (1, 0, n)))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def check_parameters(sql: str, params: pa.Table | None) -> None:
    """Check that ``params`` (one column per parameter, one row per execution; ``None``: no
    parameters) binds exactly the placeholders of ``sql`` (after :func:`rewrite_placeholders`):
    as many columns as placeholders (for ``$n`` placeholders, as many as the highest ``n``).

    Raises:
        QueryError: naming both counts, e.g. "the statement has 1 placeholder; 2 parameters
            were bound" -- extra values are never dropped silently.

    >>> check_parameters("SELECT $1 AS a", pa.table({"0": [1], "1": [2]}))
    Traceback (most recent call last):
    ...
    flight_serve.errors.QueryError: the statement has 1 placeholder; 2 parameters were bound
    """
    names = placeholder_names(sql)
    if names is None:
        return  # DataFusion reports what it makes of it
    numbers = [int(n) for n in names if n.isdigit()]
    expected = max([len(names), *numbers])
    bound = 0 if params is None else params.num_columns
    if bound != expected:
        raise QueryError(
            f"the statement has {_plural(expected, 'placeholder')}; "
            f"{_plural(bound, 'parameter')} {'was' if bound == 1 else 'were'} bound"
        )


def _first_tokens(sql: str) -> list[Token] | None:
    """The tokens of a prefix of ``sql`` that holds its first token whole (a prefix twice as long
    each time, so a long statement is not tokenized whole for its first keyword)."""
    size = 256
    while size < len(sql):
        tokens = _tokens(sql[:size])  # None: the prefix ends inside a comment or literal
        if tokens and tokens[0].end < size - 1:
            return tokens[:1]
        size *= 2
    return _tokens(sql)


def statement_kind(sql: str) -> StatementKind:
    """Classify ``sql`` by its first keyword (comments skipped, sqlglot's tokenizer).

    >>> statement_kind("/* hi */ insert into t values (1)")
    'insert'

    Raises:
        QueryError: an empty statement, or one flight-serve refuses (``UPDATE``, ``DELETE``,
            transactions, ...; the message says why).
    """
    tokens = _first_tokens(sql)
    if not tokens:
        if not sql.strip() or tokens == []:
            raise QueryError("empty SQL statement")
        return "query"  # let DataFusion report what it makes of it
    word = tokens[0].text.upper()
    if word == "INSERT":
        return "insert"
    if word == "CREATE":
        return "create"
    if word == "DROP":
        return "drop"
    if word in _REFUSED:
        raise QueryError(_REFUSED[word])
    return "query"


def table_name(table: exp.Table) -> str:
    """The name of a one-part table reference as DataFusion resolves it (unquoted: lower-cased)."""
    identifier = table.this
    name: str = identifier.name
    quoted = isinstance(identifier, exp.Identifier) and identifier.quoted
    return name if quoted else name.lower()


def _parse(sql: str) -> tuple[tuple[exp.Expr | None, ...] | None, str | None]:
    """sqlglot's statements of ``sql``, or ``None`` and sqlglot's message."""
    try:
        return tuple(sqlglot.parse(sql)), None
    except sqlglot.errors.SqlglotError as exc:
        return None, str(exc)


def _tables(statements: tuple[exp.Expr | None, ...] | None) -> set[str] | None:
    if statements is None:
        return None
    names: set[str] = set()
    for statement in statements:
        if statement is None:
            continue
        for table in statement.find_all(exp.Table):
            identifier = table.this
            if not isinstance(identifier, exp.Identifier):
                continue
            db, catalog = table.db, table.catalog
            if db and db.lower() != _DEFAULT_SCHEMA:
                continue
            if catalog and catalog.lower() != _DEFAULT_CATALOG:
                continue
            name: str = identifier.name
            names.add(name if identifier.quoted else name.lower())
    return names


def _iceberg_refs(statements: tuple[exp.Expr | None, ...] | None) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for statement in statements or ():
        if statement is None:
            continue
        for table in statement.find_all(exp.Table):
            db = table.args.get("db")
            if not isinstance(table.this, exp.Identifier) or not isinstance(db, exp.Identifier):
                continue
            catalog = table.args.get("catalog")
            if catalog is not None and not (
                isinstance(catalog, exp.Identifier)
                and (catalog.name if catalog.quoted else catalog.name.lower()) == _DEFAULT_CATALOG
            ):
                continue
            namespace = db.name if db.quoted else db.name.lower()
            name = table.this.name if table.this.quoted else table.this.name.lower()
            if namespace != _DEFAULT_SCHEMA and (namespace, name) not in found:
                found.append((namespace, name))
    return found


def referenced_tables(sql: str) -> set[str] | None:
    """Return the table names ``sql`` reads, normalised as DataFusion resolves them (unquoted
    names lower-cased), or ``None`` when sqlglot cannot parse it (then every stream is offered).

    Names qualified with a schema or catalog other than DataFusion's defaults are left out.

    >>> sorted(referenced_tables('SELECT * FROM Flights JOIN "Planes" p ON true'))
    ['Planes', 'flights']
    """
    return _tables(_parse(sql)[0])


@dataclass(frozen=True, eq=False)
class Statement:
    """One statement of a request (see the module docstring). Make it with :meth:`parse`.

    Attributes:
        text: the SQL as the client sent it.
        sql: the text DataFusion runs: ``text`` with ``?`` rewritten to ``$1, $2, ...`` (the
            same as ``text`` without ``?`` placeholders, or when made with
            ``placeholders=False``).
    """

    text: str
    sql: str
    _parsed: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, text: str, *, placeholders: bool = True) -> Statement:
        """The statement of ``text``; ``placeholders=False`` leaves ``?`` as it is (plain SQL
        text in a CMD descriptor, and a ticket's text, which was rewritten when planned).

        Raises:
            InvalidInputError: the text is longer than the SQL size limit
                (:func:`~flight_serve.engine.sqlguard.check_sql_size`).
        """
        if placeholders:
            return cls(text, rewrite_placeholders(text))  # checks the size first
        check_sql_size(text)
        return cls(text, text)

    @classmethod
    def of_expression(cls, expression: exp.Expression) -> Statement:
        """A statement built from a syntax tree (a rewrite of a parsed one): its text is the
        tree's SQL and its tree is ``expression`` itself, so it is not parsed again."""
        sql = expression.sql()
        statement = cls(sql, sql)
        statement._parsed["tree"] = ((expression,), None)
        return statement

    def _tree(self) -> tuple[tuple[exp.Expr | None, ...] | None, str | None]:
        if "tree" not in self._parsed:
            self._parsed["tree"] = _parse(self.sql)  # the one parse
        tree: tuple[tuple[exp.Expr | None, ...] | None, str | None] = self._parsed["tree"]
        return tree

    @property
    def expressions(self) -> tuple[exp.Expr | None, ...] | None:
        """sqlglot's statements of :attr:`sql` (``None`` for an empty one between two
        semicolons), or ``None`` when sqlglot cannot parse it."""
        return self._tree()[0]

    @functools.cached_property
    def kind(self) -> StatementKind:
        """The statement's kind by its first keyword (:func:`statement_kind`).

        Raises:
            QueryError: an empty statement, or one flight-serve refuses (the message says why).
        """
        return statement_kind(self.sql)

    @functools.cached_property
    def tables(self) -> set[str] | None:
        """The one-part table names it reads (:func:`referenced_tables`); ``None`` when sqlglot
        cannot parse it."""
        return _tables(self.expressions)

    @functools.cached_property
    def iceberg_refs(self) -> list[tuple[str, str]]:
        """``(namespace, table)`` of each two-part table name it reads (``public.x`` excluded:
        that is DataFusion's default schema), as DataFusion resolves them (unquoted parts
        lower-cased); ``datafusion.<namespace>.<table>`` counts too. Unparseable SQL: none.

        >>> Statement.parse('SELECT * FROM ops.hourly h JOIN flights f ON true').iceberg_refs
        [('ops', 'hourly')]
        """
        return _iceberg_refs(self.expressions)

    @property
    def placeholders(self) -> list[str] | None:
        """Its placeholders, each once, in binding order (:func:`placeholder_names`)."""
        return placeholder_names(self.sql)

    def check_parameters(self, params: pa.Table | None) -> None:
        """:func:`check_parameters` of this statement.

        Raises:
            QueryError: ``params`` does not bind exactly its placeholders (both counts named).
        """
        check_parameters(self.sql, params)

    def ddl(self, kind: Literal["create", "drop"]) -> exp.Expression:
        """The parsed ``CREATE TABLE`` (``kind="create"``) or ``DROP TABLE``.

        Raises:
            QueryError: sqlglot cannot parse it ("cannot parse the statement: ..."), it holds
                more than one statement, or it is another kind of CREATE / DROP.
        """
        statements, error = self._tree()
        if statements is None:
            raise QueryError(f"cannot parse the statement: {error}")
        found = [s for s in statements if s is not None]
        if len(found) != 1:
            raise QueryError("send one statement at a time")
        statement = found[0]
        if kind == "create":
            if not isinstance(statement, exp.Create) or str(statement.args.get("kind")) != "TABLE":
                raise QueryError("only CREATE TABLE is supported")
        elif not isinstance(statement, exp.Drop) or str(statement.args.get("kind")) != "TABLE":
            raise QueryError("only DROP TABLE is supported")
        return statement

    def refuse_iceberg_targets(self) -> None:
        """Refuse INSERT, CREATE TABLE and DROP TABLE of a two-part name other than
        ``public.x``: that names an Iceberg table of the server's catalog, which SQL reads and
        only pipelines write. Unparseable SQL passes (the statement's own handling reports it).

        Raises:
            QueryError: naming the table and how it is written.
        """
        for statement in self.expressions or ():
            if statement is None:
                continue
            targets: list[Any] = []
            if isinstance(statement, exp.Insert | exp.Create):
                target = statement.this
                targets = [target.this if isinstance(target, exp.Schema) else target]
            elif isinstance(statement, exp.Drop):
                targets = list(statement.args.get("tables") or [statement.this])
            for table in targets:
                if not isinstance(table, exp.Table) or not table.db or table.db.lower() == "public":
                    continue
                name = f"{table.db}.{table.name}"
                raise QueryError(
                    f"{name} is an Iceberg table of the server's catalog (a two-part name): SQL "
                    f"reads it; a pipeline's iceberg sink writes it (CREATE SINK … WITH (connector "
                    f"= 'iceberg', table = '{name}')). Streams have one-part names"
                )
