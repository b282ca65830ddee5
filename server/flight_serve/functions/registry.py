"""Which runner makes a :class:`~flight_serve.functions.base.FunctionSpec` callable.

The seam every runner plugs into: a runner is a module with module-level factories, either one::

    def create(spec: FunctionSpec) -> ScalarFunction | TableFunction

or one per kind, named after the runner (``wasm_scalar_function`` / ``wasm_table_function``,
``python_scalar_function`` / ``python_table_function``, ``inprocess_…``)::

    def <runner>_scalar_function(spec: FunctionSpec) -> ScalarFunction
    def <runner>_table_function(spec: FunctionSpec) -> TableFunction

(``create`` is used when the module has it). The ``python`` runner's factory takes the host's
sandbox too (``create(spec, sandbox)``, a
:class:`~flight_serve.functions.python.SandboxConfig` or ``None``), passed down from
:func:`create_function`. A factory compiles / checks the code (raising
:class:`~flight_serve.errors.FunctionDefinitionError` naming ``spec.name`` and ``spec.line`` when
it cannot be registered) and returns a ready function (``spec.kind == "scalar"``: a
:class:`~flight_serve.functions.base.ScalarFunction`; ``"table"``: a
:class:`~flight_serve.functions.base.TableFunction`). The runner reads its own options (limits,
pool sizes) from ``spec.options``.

Runners by name (:data:`RUNNERS`):

* ``python`` -- :mod:`flight_serve.functions.python`, sandboxed worker processes (the default
  for ``LANGUAGE python``);
* ``wasm`` -- :mod:`flight_serve.functions.wasm`, wasmtime (the only runner of
  ``LANGUAGE wasm``);
* ``inprocess`` -- :mod:`flight_serve.functions.inprocess`, Python run inside the calling
  process, **not sandboxed**: used for ``LANGUAGE python`` only when selected explicitly
  (``python_runner="inprocess"``, or the environment variable
  ``FLIGHT_SERVE_PYTHON_FUNCTIONS=inprocess``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

from flight_serve.errors import FunctionDefinitionError
from flight_serve.functions.base import FunctionSpec, ScalarFunction, TableFunction

if TYPE_CHECKING:
    from flight_serve.functions.python import SandboxConfig

__all__ = [
    "PYTHON_RUNNERS",
    "PYTHON_RUNNER_ENV",
    "RUNNERS",
    "create_function",
    "python_runner_from_env",
]

#: runner name -> the module that holds its ``create(spec)`` factory
RUNNERS: dict[str, str] = {
    "python": "flight_serve.functions.python",
    "wasm": "flight_serve.functions.wasm",
    "inprocess": "flight_serve.functions.inprocess",
}
#: the runners ``LANGUAGE python`` may use (the first is the default)
PYTHON_RUNNERS = ("python", "inprocess")
#: the environment variable that selects the Python runner (``python`` or ``inprocess``)
PYTHON_RUNNER_ENV = "FLIGHT_SERVE_PYTHON_FUNCTIONS"


def python_runner_from_env() -> str:
    """The Python runner :data:`PYTHON_RUNNER_ENV` selects (``python`` when unset).

    Raises:
        FunctionDefinitionError: the variable names no Python runner.
    """
    value = os.environ.get(PYTHON_RUNNER_ENV, "").strip().lower() or PYTHON_RUNNERS[0]
    if value not in PYTHON_RUNNERS:
        raise FunctionDefinitionError(
            f"{PYTHON_RUNNER_ENV}={value!r}: expected one of {', '.join(PYTHON_RUNNERS)}"
        )
    return value


def _where(spec: FunctionSpec) -> str:
    return f"FUNCTION {spec.name}" + (f" (line {spec.line})" if spec.line else "")


def _runner_module(runner: str, spec: FunctionSpec) -> ModuleType:
    module_name = RUNNERS[runner]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:  # the runner exists and one of its imports is missing
            raise FunctionDefinitionError(
                f"{_where(spec)}: the {runner} runner cannot start: {exc}"
            ) from exc
        raise FunctionDefinitionError(
            f"{_where(spec)}: the {runner} runner ({module_name}) is not installed in this "
            f"build, so LANGUAGE {spec.language} functions cannot run"
        ) from exc


def create_function(
    spec: FunctionSpec,
    *,
    python_runner: str | None = None,
    sandbox: SandboxConfig | None = None,
) -> ScalarFunction | TableFunction:
    """A ready function for ``spec``, made by its language's runner.

    Args:
        spec: the definition (its ``code`` loaded).
        python_runner: ``python`` (sandboxed, the default) or ``inprocess`` (not sandboxed);
            ``None`` reads :data:`PYTHON_RUNNER_ENV`. Ignored for wasm.
        sandbox: how the ``python`` runner's workers run (the host's hidden paths, whether
            running without bwrap is allowed); ``None``: ``SandboxConfig()``. Used by the
            ``python`` runner only.

    Raises:
        FunctionDefinitionError: an unknown runner, a runner missing from this build, or the
            runner's own refusal (the message names the function and its line).
    """
    if spec.language == "wasm":
        runner = "wasm"
    elif spec.language == "python":
        runner = python_runner if python_runner is not None else python_runner_from_env()
        if runner not in PYTHON_RUNNERS:
            raise FunctionDefinitionError(
                f"{_where(spec)}: unknown Python runner {runner!r}; expected one of "
                f"{', '.join(PYTHON_RUNNERS)}"
            )
    else:
        raise FunctionDefinitionError(f"{_where(spec)}: unknown language {spec.language!r}")
    module = _runner_module(runner, spec)
    per_kind = f"{runner}_{spec.kind}_function"
    factory = getattr(module, "create", None) or getattr(module, per_kind, None)
    if not callable(factory):
        raise FunctionDefinitionError(
            f"{_where(spec)}: the {runner} runner has no create(spec) or {per_kind}(spec) "
            "factory"
        )
    function = factory(spec, sandbox) if runner == "python" else factory(spec)
    expected = ScalarFunction if spec.kind == "scalar" else TableFunction
    if not isinstance(function, expected):
        raise FunctionDefinitionError(
            f"{_where(spec)}: the {runner} runner returned {type(function).__name__}, not a "
            f"{spec.kind} function"
        )
    return function
