"""A pipeline's user functions at run time: made by their runners, registered as DataFusion UDFs.

:class:`FunctionSet` makes every ``CREATE FUNCTION … LANGUAGE python | wasm`` of a plan callable
(:func:`flight_serve.functions.registry.create_function`) and registers each scalar one in a
DataFusion ``SessionContext`` (:meth:`FunctionSet.register`): a per-row query's session calls
``ScalarFunction.call`` once per batch with one Arrow array per argument, in SELECT items,
WHERE, joins' ON. A windowed query reads them through a view (its own expressions run in the
window operator; the planner refuses a call there).

DataFusion reports a failed Python UDF as a generic exception with the error's text; the set
remembers the function's own error (:class:`~flight_serve.errors.FunctionCallError` /
:class:`~flight_serve.errors.FunctionWorkerError`) so the query can raise it
(:meth:`FunctionSet.failure`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import datafusion
import pyarrow as pa

from flight_serve.errors import FlightServeError, FunctionCallError
from flight_serve.functions.base import FunctionSpec, ScalarFunction, TableFunction
from flight_serve.functions.registry import create_function

__all__ = ["FunctionSet", "explain_lines"]


class FunctionSet:
    """The user functions of one pipeline run.

    Args:
        specs: the plan's functions by name (``PipelinePlan.user_functions``).
        run: make them with their runners (``False``, for ``explain``: the UDFs are registered
            with the declared types and return nulls; no code is loaded or run).
        python_runner: the runner of ``LANGUAGE python`` (``None``: the registry's default,
            :data:`~flight_serve.functions.registry.PYTHON_RUNNER_ENV` or the sandbox).

    Raises:
        FunctionDefinitionError: a runner refuses a function (what was made is closed first).
    """

    def __init__(
        self,
        specs: Mapping[str, FunctionSpec],
        *,
        run: bool = True,
        python_runner: str | None = None,
    ) -> None:
        self.specs = dict(specs)
        self.scalars: dict[str, ScalarFunction] = {}
        self.tables: dict[str, TableFunction] = {}
        #: the function error of the failing call (DataFusion may call from its own threads)
        self._failure: FlightServeError | None = None
        self._closed = False
        if run:
            try:
                for spec in self.specs.values():
                    made = create_function(spec, python_runner=python_runner)
                    if isinstance(made, ScalarFunction) and spec.kind == "scalar":
                        self.scalars[spec.name] = made
                    elif isinstance(made, TableFunction):
                        self.tables[spec.name] = made
            except BaseException:
                self.close()
                raise
        self.udfs = [self._udf(spec) for spec in self.specs.values() if spec.kind == "scalar"]

    def _udf(self, spec: FunctionSpec) -> datafusion.ScalarUDF:
        assert isinstance(spec.returns, pa.DataType)
        returns: pa.DataType = spec.returns
        function = self.scalars.get(spec.name)

        def call(*args: pa.Array[Any]) -> pa.Array[Any]:
            if function is None:  # explain: never run on data
                return pa.array([None] * (len(args[0]) if args else 1), type=returns)
            try:
                return function.call(list(args))
            except FlightServeError as exc:
                self._failure = exc
                raise
            except Exception as exc:  # a runner's bug: still name the function
                error = FunctionCallError(f"FUNCTION {spec.name}: {type(exc).__name__}: {exc}")
                self._failure = error
                raise error from exc

        return datafusion.udf(call, list(spec.arg_types), returns, "immutable", name=spec.name)

    def register(self, ctx: datafusion.SessionContext) -> None:
        """Register every scalar function in ``ctx`` (by its lower-case name)."""
        for udf in self.udfs:
            ctx.register_udf(udf)

    def failure(self) -> FlightServeError | None:
        """The function error of the last failed query (then forgotten), or
        ``None`` when the query failed for another reason."""
        error, self._failure = self._failure, None
        return error

    def close(self) -> None:
        """Close every function's runner (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for scalar in self.scalars.values():
            scalar.close()
        for table in self.tables.values():
            table.close()


def explain_lines(specs: Mapping[str, FunctionSpec]) -> list[str]:
    """``explain``'s lines for the functions: per function, its signature, language, kind, the
    first 12 hex characters of its code's SHA-256 and its line."""
    out: list[str] = []
    for spec in specs.values():
        args = ", ".join(
            f"{n} {t}".strip() for n, t in zip(spec.arg_names, spec.arg_types, strict=True)
        )
        if isinstance(spec.returns, pa.Schema):
            returns = "TABLE (" + ", ".join(f"{f.name} {f.type}" for f in spec.returns) + ")"
        else:
            returns = str(spec.returns)
        at = f" (line {spec.line})" if spec.line else ""
        out += ["", f"FUNCTION {spec.name}({args}) RETURNS {returns}{at}"]
        options = "".join(f", {k} = {v}" for k, v in sorted(spec.options.items()))
        out.append(
            f"  language {spec.language}, kind {spec.kind}, handler {spec.handler or spec.name}"
            f"{options}"
        )
        out.append(f"  code {len(spec.code)} bytes, sha256 {spec.digest[:12]}")
    return out
