"""The in-process Python runner: a function's code compiled and called inside this process.

**Not sandboxed**: the code runs with the caller's rights, memory and files. It exists for the
library and for tests; :mod:`flight_serve.functions.registry` uses it only when selected
explicitly (``python_runner="inprocess"`` or ``FLIGHT_SERVE_PYTHON_FUNCTIONS=inprocess``); the
sandboxed runner (:mod:`flight_serve.functions.python`) is the default.

Calling convention (the same as the sandboxed runner's):

* scalar, vectorized (the default): ``handler(*arrays)`` once per batch, one ``pyarrow.Array``
  per argument; returns a ``pyarrow.Array`` (or ``ChunkedArray``) of the batch's length and of
  the declared return type (a Python list is converted to that type);
* scalar, ``WITH (vectorized = false)``: ``handler(*values)`` once per row with Python values
  (``None`` for a null); the results are converted to the declared type;
* table: ``handler(batch)`` once per batch with a ``pyarrow.RecordBatch``; returns (or yields)
  record batches or tables with exactly the declared columns, or ``None`` for none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from flight_serve.errors import FunctionCallError, FunctionDefinitionError
from flight_serve.functions.base import FunctionSpec, ScalarFunction, TableFunction

__all__ = ["InProcessScalar", "InProcessTable", "create", "is_vectorized"]


def _where(spec: FunctionSpec) -> str:
    return f"FUNCTION {spec.name}" + (f" (line {spec.line})" if spec.line else "")


def is_vectorized(spec: FunctionSpec) -> bool:
    """``WITH (vectorized = …)``: true unless given as false (``false``, ``0``, ``off``).

    Raises:
        FunctionDefinitionError: a value that is not a boolean.
    """
    value = spec.options.get("vectorized", "true").strip().lower()
    if value in ("true", "1", "on", "yes"):
        return True
    if value in ("false", "0", "off", "no"):
        return False
    raise FunctionDefinitionError(
        f"{_where(spec)}: option vectorized: expected true or false, got {value!r}"
    )


def _load(spec: FunctionSpec) -> Callable[..., Any]:
    """Compile and run the module body; return its handler."""
    handler = spec.handler or spec.name
    try:
        source = spec.code.decode("utf-8")
        code = compile(source, f"<function {spec.name}>", "exec")
    except (UnicodeDecodeError, SyntaxError) as exc:
        raise FunctionDefinitionError(
            f"{_where(spec)}: the Python code does not compile: {exc}"
        ) from None
    namespace: dict[str, Any] = {"__name__": f"flight_serve_function_{spec.name}"}
    try:
        exec(code, namespace)  # the in-process runner: explicitly not sandboxed
    except Exception as exc:
        raise FunctionDefinitionError(
            f"{_where(spec)}: the Python code failed while loading: {type(exc).__name__}: {exc}"
        ) from exc
    function = namespace.get(handler)
    if not callable(function):
        raise FunctionDefinitionError(
            f"{_where(spec)}: the Python code defines no function {handler}"
            + ("" if spec.handler else " (name another with WITH (handler = '<name>'))")
        )
    return function  # type: ignore[no-any-return]


class InProcessScalar:
    """A scalar function called in this process (see the module docstring)."""

    def __init__(self, spec: FunctionSpec) -> None:
        if not isinstance(spec.returns, pa.DataType):
            raise FunctionDefinitionError(f"{_where(spec)}: a scalar function returns a type")
        self._spec = spec
        self._returns: pa.DataType = spec.returns
        self._vectorized = is_vectorized(spec)
        self._handler = _load(spec)

    @property
    def spec(self) -> FunctionSpec:
        return self._spec

    def call(self, args: Sequence[pa.Array[Any]]) -> pa.Array[Any]:
        """One batch: ``args`` one array per argument, all of one length ``n``; returns an
        array of length ``n`` and the declared type.

        Raises:
            FunctionCallError: the handler raised, or returned the wrong type or length (the
                message names the function, the expected and the returned type or length).
        """
        n = len(args[0]) if args else 0
        try:
            if self._vectorized:
                result = self._handler(*args)
            else:
                columns = [a.to_pylist() for a in args]
                result = [self._handler(*row) for row in zip(*columns, strict=True)]
        except Exception as exc:
            raise FunctionCallError(
                f"FUNCTION {self._spec.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        return self._check(result, n)

    def _check(self, result: object, n: int) -> pa.Array[Any]:
        name, expected = self._spec.name, self._returns
        if isinstance(result, pa.ChunkedArray):
            result = result.combine_chunks()
        elif isinstance(result, list | tuple):
            try:
                result = pa.array(result, type=expected)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise FunctionCallError(
                    f"FUNCTION {name} returned values that are not {expected}: {exc}"
                ) from exc
        if not isinstance(result, pa.Array):
            raise FunctionCallError(
                f"FUNCTION {name} returned {type(result).__name__}; expected a pyarrow array "
                f"of {expected} (length {n})"
            )
        if result.type != expected:
            raise FunctionCallError(
                f"FUNCTION {name} returned an array of {result.type}; expected {expected}"
            )
        if len(result) != n:
            raise FunctionCallError(
                f"FUNCTION {name} returned {len(result)} values for a batch of {n} rows; "
                f"expected {n}"
            )
        return result

    def close(self) -> None:
        """Nothing to release (idempotent)."""


class InProcessTable:
    """A table function called in this process (see the module docstring)."""

    def __init__(self, spec: FunctionSpec) -> None:
        if not isinstance(spec.returns, pa.Schema):
            raise FunctionDefinitionError(f"{_where(spec)}: a table function returns columns")
        self._spec = spec
        self._schema: pa.Schema = spec.returns
        self._handler = _load(spec)

    @property
    def spec(self) -> FunctionSpec:
        return self._spec

    def call_table(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """The batches the handler returns or yields for ``batch``, each with the declared
        columns.

        Raises:
            FunctionCallError: the handler raised, or gave something that is not a batch of the
                declared columns.
        """
        name = self._spec.name
        try:
            result = self._handler(batch)
            if result is None:
                return
            items = [result] if isinstance(result, pa.RecordBatch | pa.Table) else result
            for item in items:
                yield from self._check(item)
        except FunctionCallError:
            raise
        except Exception as exc:
            raise FunctionCallError(f"FUNCTION {name} raised {type(exc).__name__}: {exc}") from exc

    def _check(self, item: object) -> Iterator[pa.RecordBatch]:
        name, expected = self._spec.name, self._schema
        if not isinstance(item, pa.RecordBatch | pa.Table):
            raise FunctionCallError(
                f"FUNCTION {name} gave {type(item).__name__}; expected record batches of "
                f"({expected.to_string(show_schema_metadata=False)})"
            )
        got = pa.schema([(f.name, f.type) for f in item.schema])
        want = pa.schema([(f.name, f.type) for f in expected])
        if not got.equals(want):
            raise FunctionCallError(
                f"FUNCTION {name} gave columns ({_columns(got)}); expected ({_columns(want)})"
            )
        batches = item.to_batches() if isinstance(item, pa.Table) else [item]
        for one in batches:
            yield pa.RecordBatch.from_arrays(one.columns, schema=expected)

    def close(self) -> None:
        """Nothing to release (idempotent)."""


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def create(spec: FunctionSpec) -> ScalarFunction | TableFunction:
    """The in-process function for ``spec`` (the runner factory; see
    :mod:`flight_serve.functions.registry`).

    Raises:
        FunctionDefinitionError: not Python, the code does not compile or fails while loading,
            or it has no handler.
    """
    if spec.language != "python":
        raise FunctionDefinitionError(
            f"{_where(spec)}: the in-process runner runs Python, not {spec.language}"
        )
    if spec.kind == "scalar":
        return InProcessScalar(spec)
    return InProcessTable(spec)
