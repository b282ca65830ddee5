"""The contract of a user function shipped with a pipeline (``CREATE FUNCTION``).

A function is code the user hands the engine: Python run in a sandboxed worker process
(:mod:`flight_serve.functions.python`) or a WebAssembly module run in wasmtime
(:mod:`flight_serve.functions.wasm`). Whatever runs it, the runtime sees one of two shapes:

* :class:`ScalarFunction` -- called once per batch with one Arrow array per argument (all of
  the batch's length) and returns one array of that length and of the declared return type.
  Used in any expression of a per-row or windowed query (registered as a DataFusion UDF).
* :class:`TableFunction` -- called once per batch with the whole batch, yields zero or more
  batches of the declared ``RETURNS TABLE`` schema. Used as ``SELECT * FROM f(stream)``.

Calls are per batch, never per row: crossing into a sandbox or linear memory costs the same for
1 row as for thousands (DESIGN 4 "functions"; issue 15). Functions are deterministic by contract:
a batch replayed after a restore gives the same output.

Identity: :attr:`FunctionSpec.digest` is the SHA-256 of the code's bytes (the Python text or the
wasm module), hex; it is part of the pipeline's identity and is shown by ``explain`` and
``pipelines status``.

Errors (:mod:`flight_serve.errors`): :class:`~flight_serve.errors.FunctionDefinitionError` when
a definition cannot be registered (raised by the factories, before anything runs);
:class:`~flight_serve.errors.FunctionCallError` when a call fails because of the function (it
raised, trapped, ran past its deadline or memory limit, returned the wrong type or length);
:class:`~flight_serve.errors.FunctionWorkerError` when the worker running it died (retryable).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import pyarrow as pa

Language = Literal["python", "wasm"]
Kind = Literal["scalar", "table"]


@dataclass(frozen=True)
class FunctionSpec:
    """What ``CREATE FUNCTION`` declares, independent of the language.

    Attributes:
        name: the SQL name (lower case).
        language: ``"python"`` or ``"wasm"``.
        kind: ``"scalar"`` (``RETURNS <type>``) or ``"table"`` (``RETURNS TABLE (...)``).
        arg_names: argument names, in order (may be empty strings when the SQL gives only types).
        arg_types: the Arrow type of each argument.
        returns: the Arrow return type (scalar) or the output schema (table).
        code: the function's code: Python source text (UTF-8) or the wasm module's bytes.
        handler: the Python callable's (or wasm export's base) name; defaults to ``name``.
        options: the ``WITH (...)`` options, as given (e.g. ``vectorized``), lower-case keys.
        line: 1-based line of ``CREATE FUNCTION`` in the pipeline file (0 when not from a file).
        code_line: the pipeline file's line of the code's first line, for messages about a line
            of the code (:func:`~flight_serve.functions.worker.code_line`): the line of the
            opening ``$$`` of an inline body, 0 for code of its own (a ``USING`` file, base64:
            its own lines are given); ``None`` (a spec not from the parser): ``line``.
    """

    name: str
    language: Language
    kind: Kind
    arg_names: tuple[str, ...]
    arg_types: tuple[pa.DataType, ...]
    returns: pa.DataType | pa.Schema
    code: bytes
    handler: str = ""
    options: dict[str, str] = field(default_factory=dict)
    line: int = 0
    code_line: int | None = None

    @property
    def first_code_line(self) -> int:
        """:attr:`code_line`, or :attr:`line` when it is ``None``."""
        return self.line if self.code_line is None else self.code_line

    @property
    def digest(self) -> str:
        """SHA-256 of :attr:`code`, hex (64 characters)."""
        return hashlib.sha256(self.code).hexdigest()


@runtime_checkable
class ScalarFunction(Protocol):
    """A scalar user function, ready to call (its module compiled, its workers started).

    ``call(args)``: ``args`` holds one array per declared argument, each of the batch's length
    ``n`` and of the declared argument type; returns an array of length ``n`` and of the declared
    return type. Raises :class:`~flight_serve.errors.FunctionCallError` or
    :class:`~flight_serve.errors.FunctionWorkerError` (see the module docstring).
    ``close()`` releases instances and workers; idempotent.
    """

    @property
    def spec(self) -> FunctionSpec: ...

    def call(self, args: Sequence[pa.Array[Any]]) -> pa.Array[Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class TableFunction(Protocol):
    """A table user function: ``call_table(batch)`` yields batches of ``spec.returns`` (a
    schema), zero or more per input batch. Errors as :class:`ScalarFunction`."""

    @property
    def spec(self) -> FunctionSpec: ...

    def call_table(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]: ...

    def close(self) -> None: ...
