"""``CREATE FUNCTION … LANGUAGE python | wasm`` in a pipeline file → a
:class:`~flight_serve.functions.base.FunctionSpec` (docs/pipelines.md, "Functions").

The forms (RisingWave's)::

    CREATE FUNCTION f(x DOUBLE) RETURNS VARCHAR LANGUAGE python AS $$ … $$;
    CREATE FUNCTION f() RETURNS TABLE (a VARCHAR, b DOUBLE)
        LANGUAGE python USING 'udfs/f.py' WITH (handler = 'f');
    CREATE FUNCTION f(a DOUBLE) RETURNS DOUBLE LANGUAGE wasm USING 'udfs/f.wasm';
    CREATE FUNCTION f(a BIGINT) RETURNS BIGINT LANGUAGE wasm USING BASE64 '…';
    … WITH (vectorized = false, …)           -- options, lower-case keys, kept as text
    … WITH (memory_limit = '128MiB', deadline = '2s', workers = 2)   -- limits (functions.limits)

sqlglot's ``risingwave`` dialect parses every form: the body is a ``Heredoc`` (or a string
literal), ``LANGUAGE`` a ``LanguageProperty``, ``USING '<file>'`` a ``FileFormatProperty`` with
a string, ``USING BASE64 '…'`` a ``FileFormatProperty`` ``BASE64`` with the text as the
statement's expression, ``handler = …`` a ``HandlerProperty``. sqlglot records no position for a
``$$`` body; its first line is found with sqlglot's tokenizer (:func:`_body_line`).

Files named by ``USING`` are read relative to the pipeline file's directory (``base_dir``), at
parse time: the spec carries the code's bytes, so a submitted pipeline needs no file afterwards.
Python code is checked here without running it (``ast``): a syntax error is reported at its line
in the pipeline file (or in the ``USING`` file), a handler the module never binds is refused.
"""

from __future__ import annotations

import ast
import base64
import binascii
from pathlib import Path

import pyarrow as pa
import sqlglot
from sqlglot import TokenType, exp

from flight_serve.errors import FunctionDefinitionError, PipelineSQLError
from flight_serve.functions.base import FunctionSpec, Kind, Language
from flight_serve.functions.limits import check_option_names, function_limits
from flight_serve.pipelines.dialect import FlightServeSQL, position, sql_error

__all__ = ["LANGUAGES", "check_windowed_calls", "is_user_function", "user_function"]

#: the languages of ``CREATE FUNCTION … LANGUAGE <language>``
LANGUAGES: tuple[Language, ...] = ("python", "wasm")
_PYTHON_ONLY = ("vectorized",)


def is_user_function(create: exp.Create) -> bool:
    """Whether a ``CREATE FUNCTION`` is a user function (it has ``LANGUAGE``, ``USING`` or a
    body) rather than a plugin (``WITH (connector = 'plugin')``)."""
    props = create.args.get("properties")
    items = props.expressions if props is not None else []
    return create.args.get("expression") is not None or any(
        isinstance(p, exp.LanguageProperty | exp.FileFormatProperty) for p in items
    )


def _where(name: str, line: int | None) -> str:
    return f"FUNCTION {name}" + (f" (line {line})" if line is not None else "")


def _name(create: exp.Create) -> str:
    target = create.this
    if isinstance(target, exp.UserDefinedFunction):
        target = target.this
    if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
        raise sql_error(f"expected a function name, got {create.this.sql()}", create)
    if target.args.get("db") or target.args.get("catalog"):
        raise sql_error(f"qualified function names are not supported: {target.sql()}", target)
    return str(target.this.name).lower()


def _type(kind: exp.DataType, node: exp.Expr, where: str) -> pa.DataType:
    from flight_serve.pipelines.pipeline import arrow_type  # pipeline.py imports this module

    try:
        return arrow_type(kind, node)
    except PipelineSQLError as exc:
        raise PipelineSQLError(f"{where}: {exc.args[0]}") from None


def _arguments(create: exp.Create, where: str) -> tuple[tuple[str, ...], tuple[pa.DataType, ...]]:
    udf = create.this
    items = udf.expressions if isinstance(udf, exp.UserDefinedFunction) else []
    names: list[str] = []
    types: list[pa.DataType] = []
    for item in items:
        if isinstance(item, exp.ColumnDef) and isinstance(item.args.get("kind"), exp.DataType):
            names.append(str(item.name))
            types.append(_type(item.args["kind"], item, where))
        elif isinstance(item, exp.ColumnDef | exp.DataType):  # a type only: f(DOUBLE)
            text = item.sql(dialect=FlightServeSQL)
            try:
                kind = exp.DataType.build(text, dialect=FlightServeSQL)
            except (sqlglot.errors.ParseError, ValueError):
                raise sql_error(f"{where}: argument {text!r} needs a type", item) from None
            names.append("")
            types.append(_type(kind, item, where))
        else:
            raise sql_error(f"{where}: write its arguments as (<name> <type>, …)", item)
    duplicate = next((n for n in names if n and names.count(n) > 1), None)
    if duplicate is not None:
        raise sql_error(f"{where}: argument {duplicate} is declared twice", udf)
    return tuple(names), tuple(types)


def _returns(prop: exp.ReturnsProperty, where: str) -> tuple[Kind, pa.DataType | pa.Schema]:
    if isinstance(prop.this, exp.Schema):
        fields = []
        for column in prop.this.expressions:
            kind = column.args.get("kind") if isinstance(column, exp.ColumnDef) else None
            if not isinstance(kind, exp.DataType):
                raise sql_error(f"{where}: write RETURNS TABLE (<column> <type>, …)", column)
            fields.append(pa.field(column.name, _type(kind, column, where)))
        if not fields:
            raise sql_error(f"{where}: RETURNS TABLE needs at least one column", prop)
        return "table", pa.schema(fields)
    if isinstance(prop.this, exp.DataType):
        return "scalar", _type(prop.this, prop.this, where)
    raise sql_error(f"{where}: write RETURNS <type> or RETURNS TABLE (…)", prop)


def _option_text(value: exp.Expression) -> str:
    if isinstance(value, exp.Boolean):
        return "true" if value.this else "false"
    if isinstance(value, exp.Literal | exp.Identifier | exp.Var | exp.Column):
        return str(value.name)
    return str(value.sql(dialect=FlightServeSQL))


def _body_line(text: str, create: exp.Create, body: str) -> int | None:
    """The pipeline line the ``$$`` body's first character is on (sqlglot keeps no position for
    a heredoc): the first heredoc token after the function's name whose text is ``body``."""
    after = int(create.this.find(exp.Identifier).meta.get("start", 0))
    try:
        tokens = FlightServeSQL().tokenize(text)
    except sqlglot.errors.TokenError:
        return None
    for token in tokens:
        heredoc = token.token_type == TokenType.HEREDOC_STRING
        if heredoc and token.start > after and token.text == body:
            # token.end is the body's last character; count back to its first line
            return text.count("\n", 0, token.end + 1) - body.count("\n") + 1
    return None


def _check_python(source: bytes, handler: str, where: str, origin: str, first_line: int) -> None:
    """Compile-check Python code without running it: syntax (line mapped to ``origin``'s,
    ``first_line`` being the code's line 1) and a top-level binding of ``handler``."""
    try:
        tree = ast.parse(source.decode("utf-8"), filename=origin)
    except UnicodeDecodeError as exc:
        raise FunctionDefinitionError(f"{where}: the Python code is not UTF-8: {exc}") from None
    except SyntaxError as exc:
        line = (exc.lineno or 1) + first_line - 1
        raise FunctionDefinitionError(
            f"{where}: Python syntax error at {origin} line {line}: {exc.msg}"
        ) from None
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if handler not in bound:
        raise FunctionDefinitionError(
            f"{where}: the Python code defines no function {handler} (name the handler with "
            "WITH (handler = '<name>'))"
        )


def user_function(
    create: exp.Create, text: str, base_dir: Path, files: dict[str, bytes] | None = None
) -> FunctionSpec:
    """The spec of a ``CREATE FUNCTION … LANGUAGE …`` (see the module docstring).

    Args:
        create: the statement (:func:`is_user_function` holds).
        text: the whole pipeline text (for the ``$$`` body's line).
        base_dir: where ``USING '<file>'`` paths start.
        files: ``USING`` files by path as written: a file found here is not read (a
            restarted server passes the code stored at submit); a file read is added.

    Raises:
        PipelineSQLError: a clause outside the grammar, an unknown language, a type without an
            Arrow equivalent (the message names the function and its line).
        FunctionDefinitionError: a ``USING`` file that cannot be read, bad base64, a Python
            syntax error (at its line), a handler the Python code never defines, an unknown
            ``WITH`` option or a bad limit (:func:`~flight_serve.functions.limits.function_limits`:
            the option, its value and the line).
    """
    name = _name(create)
    line, _ = position(create)
    where = _where(name, line)
    arg_names, arg_types = _arguments(create, where)
    props = create.args.get("properties")
    kind: Kind | None = None
    returns: pa.DataType | pa.Schema | None = None
    language: str | None = None
    using: exp.Expression | None = None
    handler = ""
    options: dict[str, str] = {}
    for prop in props.expressions if props is not None else []:
        if isinstance(prop, exp.ReturnsProperty):
            kind, returns = _returns(prop, where)
        elif isinstance(prop, exp.LanguageProperty):
            language = prop.name.lower()
            if language not in LANGUAGES:
                raise sql_error(
                    f"{where}: unknown language {prop.name!r}; expected one of "
                    f"{', '.join(LANGUAGES)}",
                    prop.this if position(prop.this)[0] is not None else create.this,
                )
        elif isinstance(prop, exp.FileFormatProperty):
            using = prop.this
        elif isinstance(prop, exp.HandlerProperty):
            handler = _option_text(prop.this)
        elif isinstance(prop, exp.Property):
            key = prop.name.lower()
            if key in options or (key == "handler" and handler):
                raise sql_error(f"{where}: option {key} is given twice", prop)
            if key == "handler":
                handler = _option_text(prop.args["value"])
            else:
                options[key] = _option_text(prop.args["value"])
        else:
            raise sql_error(f"{where}: unsupported clause {prop.sql()[:40]!r}", prop)
    if language is None:
        raise sql_error(f"{where} needs LANGUAGE python or LANGUAGE wasm", create.this)
    if kind is None or returns is None:
        raise sql_error(f"{where} needs RETURNS <type> or RETURNS TABLE (…)", create.this)
    if language != "python":
        bad = next((k for k in options if k in _PYTHON_ONLY), None) or (
            "handler" if handler else None
        )
        if bad is not None:
            raise PipelineSQLError(f"{where}: option {bad} is for LANGUAGE python functions")
    body = create.args.get("expression")
    code: bytes
    inline = False  # the code is an AS $$ … $$ body (its lines are the pipeline's)
    first_line = 1
    origin = "the pipeline"
    if isinstance(using, exp.Var) and using.name.upper() == "BASE64":
        if not isinstance(body, exp.Literal) or not body.is_string:
            raise sql_error(f"{where}: write USING BASE64 '<base64 text>'", using)
        try:
            code = base64.b64decode("".join(body.name.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise FunctionDefinitionError(f"{where}: USING BASE64: not base64 ({exc})") from None
    elif isinstance(using, exp.Literal) and using.is_string:
        if body is not None:
            raise sql_error(
                f"{where}: give its code with USING '<file>' or AS $$ … $$, not both", body
            )
        path = Path(using.name)
        path = path if path.is_absolute() else base_dir / path
        if files is not None and using.name in files:
            code = files[using.name]
        else:
            try:
                code = path.read_bytes()
            except OSError as exc:
                raise FunctionDefinitionError(
                    f"{where}: USING {using.name!r}: cannot read {path}: {exc.strerror or exc}"
                ) from None
            if files is not None:
                files[using.name] = code
        origin = using.name
    elif using is not None:
        raise sql_error(f"{where}: write USING '<file>' or USING BASE64 '…'", using)
    elif isinstance(body, exp.Heredoc | exp.Literal) and (
        not isinstance(body, exp.Literal) or body.is_string
    ):
        if language == "wasm":
            raise sql_error(
                f"{where}: a wasm function's code is a module: USING '<file>.wasm' or "
                "USING BASE64 '…'",
                create.this,
            )
        source = str(body.name) if isinstance(body, exp.Literal) else str(body.this)
        code = source.encode("utf-8")
        inline = True
        if isinstance(body, exp.Heredoc):
            first_line = _body_line(text, create, source) or line or 1
        else:
            first_line = line or 1
    else:
        raise sql_error(f"{where} needs its code: AS $$ … $$ or USING '<file>'", create.this)
    if language == "python":
        _check_python(code, handler or name, where, origin, first_line)
    spec = FunctionSpec(
        name=name,
        language="python" if language == "python" else "wasm",
        kind=kind,
        arg_names=arg_names,
        arg_types=arg_types,
        returns=returns,
        code=code,
        handler=handler or name,
        options=options,
        line=line or 0,
        # an inline body's line 1 is on the $$ line; a USING file or base64 has its own lines
        code_line=first_line if inline else 0,
    )
    check_option_names(spec)
    function_limits(spec)  # a bad limit is refused here, before anything is registered
    return spec


def check_windowed_calls(select: exp.Select, functions: dict[str, FunctionSpec]) -> None:
    """A windowed query's own expressions run inside the window operator, which knows no user
    function: a call there is refused, pointing at it (call it in a view the window reads).

    Raises:
        PipelineSQLError: the first call of a user function in ``select``.
    """
    for call in select.find_all(exp.Anonymous):
        name = str(call.name).lower()
        if name in functions:
            raise sql_error(
                f"FUNCTION {name} is called in a windowed query: call it in a view the window "
                f"reads (CREATE VIEW v AS SELECT …, {name}(…) AS x FROM …; … FROM TUMBLE(v, …))",
                call,
            )
