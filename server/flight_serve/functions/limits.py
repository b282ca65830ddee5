"""The ``WITH (...)`` limits of a user function: ``memory_limit``, ``deadline``, ``workers``.

::

    CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python
    WITH (memory_limit = '128MiB', deadline = '2s', workers = 2) AS $$ … $$;

Each is optional; a limit not given keeps the runner's default (the Python runner's
:class:`~flight_serve.functions.python.SandboxConfig`, the wasm runner's ``DEFAULT_*``).

=================  ==================================================  ===========================
option             Python (sandboxed worker)                           wasm (wasmtime instance)
=================  ==================================================  ===========================
``memory_limit``   each worker's ``RLIMIT_DATA``, bytes                each instance's linear
                   (at least 128 MiB: ``import pyarrow.compute``         memory (64 KiB .. 4 GiB)
                   needs more than 96 MiB here)
``deadline``       wall-clock limit of one call (one batch); past it   the same, by epoch
                   the worker is killed and replaced                   interruption (~10 ms ticks)
``workers``        most worker processes (the pool's size)             idle instances kept
=================  ==================================================  ===========================

Values carry explicit units: sizes an integer and ``B``, ``KiB``, ``MiB``, ``GiB`` or ``TiB``
(``'128MiB'``, ``'64 KiB'``; ``MB`` and friends are refused: they are ambiguous), durations a
number (a decimal fraction is fine) and ``ms``, ``s``, ``min`` or ``h`` (``'500ms'``,
``'0.5s'``, ``'2s'``); ``workers`` an integer 1..64. The in-process runner (not sandboxed)
cannot enforce them and ignores them.

:func:`function_limits` reads and checks them; :data:`OPTIONS` lists every option a language
accepts (the parser refuses the others, suggesting the nearest).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from flight_serve.errors import FunctionDefinitionError
from flight_serve.functions.base import FunctionSpec, Language

__all__ = [
    "LIMIT_OPTIONS",
    "OPTIONS",
    "FunctionLimits",
    "check_option_names",
    "format_bytes",
    "function_limits",
    "limit_note",
    "parse_duration",
    "parse_size",
]

#: the limit options, shared by both languages
LIMIT_OPTIONS: Final = ("memory_limit", "deadline", "workers")
#: every ``WITH (...)`` option a language takes (``handler`` aside, which the parser reads)
OPTIONS: Final[dict[Language, tuple[str, ...]]] = {
    "python": ("vectorized", *LIMIT_OPTIONS),
    "wasm": LIMIT_OPTIONS,
}

_SIZE_UNITS: Final = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}
#: memory_limit bounds per language, bytes
MEMORY_BOUNDS: Final[dict[Language, tuple[int, int]]] = {
    "python": (128 << 20, 1 << 40),
    "wasm": (64 << 10, 4 << 30),
}
DEADLINE_BOUNDS_S: Final = (0.01, 86400.0)
WORKERS_BOUNDS: Final = (1, 64)


@dataclass(frozen=True)
class FunctionLimits:
    """The limits a function's ``WITH (...)`` gives; ``None``: not given (the default holds).

    Attributes:
        memory_limit_bytes: ``memory_limit``, bytes.
        deadline: ``deadline``, per call (one batch).
        workers: ``workers``, the pool's size.
    """

    memory_limit_bytes: int | None = None
    deadline: timedelta | None = None
    workers: int | None = None


def _where(spec: FunctionSpec) -> str:
    return f"FUNCTION {spec.name}" + (f" (line {spec.line})" if spec.line else "")


def parse_size(text: str) -> int:
    """``'128MiB'``, ``'64 KiB'``, ``'1048576B'`` -> bytes.

    Raises:
        ValueError: not an integer followed by B, KiB, MiB, GiB or TiB (the message says so).
    """
    stripped = text.strip()
    digits = len(stripped) - len(stripped.lstrip("0123456789"))
    number, unit = stripped[:digits], stripped[digits:].strip().lower()
    if not number or unit not in _SIZE_UNITS:
        raise ValueError("write an integer and a unit: B, KiB, MiB, GiB or TiB (such as '128MiB')")
    return int(number) * _SIZE_UNITS[unit]


def parse_duration(text: str) -> timedelta:
    """``'500ms'``, ``'0.5s'``, ``'2 s'``, ``'1min'``, ``'1h'`` -> timedelta.

    Raises:
        ValueError: not a number followed by ms, s, min or h (the message says so).
    """
    stripped = text.strip()
    digits = len(stripped) - len(stripped.lstrip("0123456789."))
    number, unit = stripped[:digits], stripped[digits:].strip().lower()
    try:
        value = float(number) if number and number.count(".") <= 1 else math.nan
    except ValueError:
        value = math.nan
    if math.isnan(value) or unit not in _DURATION_UNITS:
        raise ValueError("write a number and a unit: ms, s, min or h (such as '500ms' or '2s')")
    return timedelta(seconds=value * _DURATION_UNITS[unit])


def format_bytes(n: int) -> str:
    """``134217728`` -> ``'128 MiB'`` (an exact binary unit when there is one, else bytes)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def check_option_names(spec: FunctionSpec) -> None:
    """Refuse a ``WITH (...)`` option ``spec.language`` does not take, suggesting the nearest.

    Raises:
        FunctionDefinitionError: names the option, the function and its line.
    """
    known = OPTIONS[spec.language]
    for key in spec.options:
        if key in known:
            continue
        if key in OPTIONS["python"]:
            raise FunctionDefinitionError(
                f"{_where(spec)}: option {key} is for LANGUAGE python functions"
            )
        near = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise FunctionDefinitionError(
            f"{_where(spec)}: unknown option {key} ({hint}LANGUAGE {spec.language} functions "
            f"take {', '.join(('handler', *known))})"
        )


def function_limits(spec: FunctionSpec) -> FunctionLimits:
    """The limits in ``spec.options`` (see the module docstring), checked.

    Raises:
        FunctionDefinitionError: a value without its unit, not a number, or out of bounds;
            the message names the function, its line, the option and the value, such as
            ``FUNCTION f (line 3): option memory_limit = '128MB': write an integer and a unit:
            B, KiB, MiB, GiB or TiB (such as '128MiB')``.
    """
    options = spec.options

    def bad(key: str, why: str) -> FunctionDefinitionError:
        return FunctionDefinitionError(f"{_where(spec)}: option {key} = {options[key]!r}: {why}")

    memory: int | None = None
    if "memory_limit" in options:
        try:
            memory = parse_size(options["memory_limit"])
        except ValueError as exc:
            raise bad("memory_limit", str(exc)) from None
        low, high = MEMORY_BOUNDS[spec.language]
        if not low <= memory <= high:
            raise bad(
                "memory_limit",
                f"LANGUAGE {spec.language} functions take {format_bytes(low)} .. "
                f"{format_bytes(high)}",
            )
    deadline: timedelta | None = None
    if "deadline" in options:
        try:
            deadline = parse_duration(options["deadline"])
        except ValueError as exc:
            raise bad("deadline", str(exc)) from None
        low_s, high_s = DEADLINE_BOUNDS_S
        if not low_s <= deadline.total_seconds() <= high_s:
            raise bad("deadline", "a deadline is 10ms .. 24h")
    workers: int | None = None
    if "workers" in options:
        text = options["workers"].strip()
        low_w, high_w = WORKERS_BOUNDS
        if not text.isdigit() or not low_w <= int(text) <= high_w:
            raise bad("workers", f"an integer {low_w} .. {high_w}")
        workers = int(text)
    return FunctionLimits(memory, deadline, workers)


def limit_note(spec: FunctionSpec, key: str) -> str:
    """`` (WITH deadline = '500ms')`` when ``spec`` gives the limit ``key``, else ``""``: for
    an error message, so the user sees which knob was hit."""
    value = spec.options.get(key)
    return f" (WITH {key} = {value!r})" if value is not None else ""
