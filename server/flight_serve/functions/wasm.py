"""WebAssembly user functions in wasmtime: ABI v1 of ``schemas/functions-wasm-abi.md``.

:func:`wasm_scalar_function` turns a :class:`~flight_serve.functions.base.FunctionSpec` with
``language == "wasm"`` into a :class:`WasmScalarFunction` (a
:class:`~flight_serve.functions.base.ScalarFunction`). A call is one batch: every argument's
values buffer (fixed width, little-endian; a null row's value zeroed) and the rows' combined
validity bitmap are copied into an instance's linear memory, the export runs over the ``n`` rows
and writes ``n`` values, which are copied out. The result's validity is the AND of the
arguments' validity (a row with any null argument is null).

:func:`wasm_table_function` makes a :class:`WasmTableFunction` (``RETURNS TABLE``): the whole
batch in (each column's values and its own validity), and the rows the module allocated and
described out (zero or one batch per call).

* The module is compiled once per process and cached by its SHA-256 (:func:`compile_module`);
  a second function from the same bytes (or a restart of the pipeline) loads it from the cache.
* Instances are pooled (one call at a time per instance); each has its own store with a memory
  limit (``memory_limit_bytes``, wasmtime's store limits: ``memory.grow`` fails beyond it) and
  each call a deadline (``deadline_s``, wasmtime's epoch interruption, ticked every 10 ms).
  ``CREATE FUNCTION … WITH (memory_limit = '…', deadline = '…', workers = …)`` sets them (and
  the pool size) per function: :func:`create`, :func:`spec_limits`.
* A trap (``unreachable``, an integer divide by zero, an out-of-bounds access, the deadline)
  fails the call with :class:`~flight_serve.errors.FunctionCallError` naming the function and
  the trap, and the instance is thrown away (the next call gets a fresh one).
* A module that is not valid WebAssembly, imports anything, lacks the ABI's exports or whose
  export has another signature is refused at construction with
  :class:`~flight_serve.errors.FunctionDefinitionError` (expected vs found).
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import wasmtime

from flight_serve.errors import FunctionCallError, FunctionDefinitionError
from flight_serve.functions.base import FunctionSpec
from flight_serve.functions.limits import function_limits, limit_note

ABI_VERSION = 1
"""The ABI version this runner speaks; a module's ``flight_serve_abi_version()`` must return it."""

DEFAULT_MEMORY_LIMIT_BYTES = 256 * 1024 * 1024
"""Linear memory per instance: 256 MiB (a 1 Mi-row batch of four DOUBLE arguments needs 40 MiB)."""

DEFAULT_DEADLINE_S = 5.0
"""Wall-clock time one call (one batch) may run before it is interrupted."""

DEFAULT_POOL_SIZE = 4
"""Idle instances kept per function (more are created while calls overlap, then dropped)."""

EPOCH_TICK_S = 0.01
"""The epoch interruption's tick: deadlines are honoured to about this granularity."""

_ALIGN = 8


# --- the engine, its epoch ticker and the module cache ---------------------------------------


class _Runtime:
    """The process's wasmtime engine (epoch interruption on), its ticker thread and the module
    cache keyed by SHA-256."""

    def __init__(self) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        self.modules: dict[str, wasmtime.Module] = {}
        self.lock = threading.Lock()
        self.compiled = 0
        self.cache_hits = 0
        ticker = threading.Thread(target=self._tick, name="wasm-epoch", daemon=True)
        ticker.start()

    def _tick(self) -> None:
        while True:
            time.sleep(EPOCH_TICK_S)
            self.engine.increment_epoch()


_runtime: _Runtime | None = None
_runtime_lock = threading.Lock()


def _rt() -> _Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = _Runtime()
        return _runtime


def wasm_engine() -> wasmtime.Engine:
    """The process's wasmtime engine (epoch interruption on) that every module is compiled for."""
    return _rt().engine


@dataclass(frozen=True)
class ModuleCacheStats:
    """How many modules were compiled and how many loads were served from the cache."""

    compiled: int
    cache_hits: int
    cached_modules: int


def module_cache_stats() -> ModuleCacheStats:
    """The in-process module cache's counters (for tests, benchmarks and metrics)."""
    rt = _rt()
    with rt.lock:
        return ModuleCacheStats(rt.compiled, rt.cache_hits, len(rt.modules))


def clear_module_cache() -> None:
    """Forget every compiled module (the next load compiles again; for benchmarks and tests)."""
    rt = _rt()
    with rt.lock:
        rt.modules.clear()


def compile_module(code: bytes, digest: str, name: str = "") -> wasmtime.Module:
    """The compiled module of ``code`` (a binary module, or its WAT text), from the cache keyed
    by ``digest`` (the code's SHA-256, hex) when it was compiled before.

    Raises :class:`FunctionDefinitionError` naming function ``name`` when ``code`` is not a
    valid module."""
    rt = _rt()
    with rt.lock:
        cached = rt.modules.get(digest)
        if cached is not None:
            rt.cache_hits += 1
            return cached
    try:
        module = wasmtime.Module(rt.engine, code)
    except wasmtime.WasmtimeError as exc:
        raise FunctionDefinitionError(
            f"function {name}: not a valid WebAssembly module: {_first_line(str(exc))}"
        ) from exc
    with rt.lock:
        rt.compiled += 1
        return rt.modules.setdefault(digest, module)


# --- types -------------------------------------------------------------------------------------


def _width(t: pa.DataType) -> int | None:
    """Bytes per value in linear memory for a supported Arrow type, else None.

    Fixed-width numbers and temporals use their Arrow width; BOOLEAN is one byte (0 or 1)."""
    if pa.types.is_boolean(t):
        return 1
    if (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or (pa.types.is_temporal(t) and not pa.types.is_interval(t))
    ):
        return int(t.bit_width) // 8
    return None


_SUPPORTED = (
    "BOOLEAN, TINYINT..BIGINT (signed and unsigned), REAL, DOUBLE, DATE, TIME, TIMESTAMP, DURATION"
)


def _signature(ft: wasmtime.FuncType) -> str:
    params = ", ".join(str(p) for p in ft.params)
    results = ", ".join(str(r) for r in ft.results)
    return f"({params}) -> ({results})"


def _first_line(s: str) -> str:
    return s.strip().splitlines()[0] if s.strip() else s


def _trap_message(s: str) -> str:
    """The trap's cause from wasmtime's message (its ``wasm trap: ...`` line, without the
    backtrace), else its last line."""
    lines = [line.strip() for line in s.strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith("wasm trap:"):
            return line
    return lines[-1] if lines else s


# --- instances --------------------------------------------------------------------------------


def _func(export: object) -> wasmtime.Func:
    assert isinstance(export, wasmtime.Func)  # checked by _check_exports
    return export


try:  # wasmtime-py's C bindings, for a call without per-argument conversion
    from wasmtime import _ffi as _wffi
    from wasmtime._func import enter_wasm as _enter_wasm

    _FAST_CALLS = hasattr(_wffi, "wasmtime_func_call") and hasattr(_wffi, "wasmtime_val_t")
except ImportError:  # pragma: no cover - another wasmtime-py layout: the public API below
    _FAST_CALLS = False


class _I32Call:
    """A call of an export whose parameters and results are all i32.

    ``Func.__call__`` reads the function's type and converts every argument on each call
    (about 50 µs for 6 arguments); this keeps the argument and result arrays and sets their
    ``i32`` fields (a few µs). Traps raise :class:`wasmtime.Trap` as ``Func.__call__`` does."""

    def __init__(self, store: wasmtime.Store, func: wasmtime.Func) -> None:
        ty = func.type(store)
        self._store = store
        self._func = func
        self._n_params = len(ty.params)
        self._n_results = len(ty.results)
        self._fast = _FAST_CALLS
        if self._fast:
            self._ctx = store._context()
            self._params = (_wffi.wasmtime_val_t * max(1, self._n_params))()
            self._results = (_wffi.wasmtime_val_t * max(1, self._n_results))()
            for v in self._params:
                v.kind = _wffi.WASMTIME_I32  # a c_uint8
            self._ref = ctypes.byref(func._func)

    def __call__(self, *args: int) -> int:
        if not self._fast:
            result = self._func(self._store, *(a - (1 << 32) if a >= 1 << 31 else a for a in args))
            return int(result or 0) & 0xFFFFFFFF
        params = self._params
        for i, a in enumerate(args):
            params[i].of.i32 = a - (1 << 32) if a >= 1 << 31 else a
        with _enter_wasm(self._store) as trap:
            error = _wffi.wasmtime_func_call(
                self._ctx, self._ref, params, self._n_params, self._results, self._n_results, trap
            )
            if error:
                raise wasmtime.WasmtimeError._from_ptr(error)
        return int(self._results[0].of.i32) & 0xFFFFFFFF if self._n_results else 0


class _Instance:
    """One instantiation with its own store (memory limit), its exports and its scratch region
    (one allocation, reused by every call whose batch fits, grown when one does not)."""

    def __init__(self, module: wasmtime.Module, handler: str, memory_limit: int) -> None:
        engine = _rt().engine
        self.store = wasmtime.Store(engine)
        self.store.set_limits(memory_size=memory_limit)
        self.store.set_epoch_deadline(int(DEFAULT_DEADLINE_S / EPOCH_TICK_S) + 1)
        inst = wasmtime.Instance(self.store, module, [])
        exports = inst.exports(self.store)
        memory = exports["memory"]
        assert isinstance(memory, wasmtime.Memory)  # checked by _check_exports
        self.memory = memory
        self.alloc = _I32Call(self.store, _func(exports["alloc"]))
        self.dealloc = _I32Call(self.store, _func(exports["dealloc"]))
        self.version = _I32Call(self.store, _func(exports["flight_serve_abi_version"]))
        self.func = _I32Call(self.store, _func(exports[handler]))
        self.scratch = 0
        self.scratch_size = 0

    def reserve(self, size: int) -> int:
        """A region of at least ``size`` bytes (8-aligned) in linear memory; 0 when the module's
        allocator cannot get it (its memory limit)."""
        if size > self.scratch_size:
            if self.scratch:
                self.dealloc(self.scratch, self.scratch_size, _ALIGN)
                self.scratch, self.scratch_size = 0, 0
            ptr = self.alloc(size, _ALIGN)
            if ptr == 0:
                return 0
            self.scratch, self.scratch_size = ptr, size
        return self.scratch

    def base(self) -> int:
        """The host address of linear memory's byte 0 (changes when memory grows)."""
        addr = ctypes.cast(self.memory.data_ptr(self.store), ctypes.c_void_p).value
        assert addr is not None
        return addr

    def memory_bytes(self) -> int:
        return int(self.memory.data_len(self.store))


def _check_exports(
    spec: FunctionSpec,
    module: wasmtime.Module,
    handler: str,
    handler_params: int,
    handler_what: str,
    handler_suffix: str,
) -> None:
    """FunctionDefinitionError unless ``module`` has ABI v1's exports with their signatures
    (the handler: ``handler_params`` i32 parameters, one i32 result)."""
    name = spec.name
    if module.imports:
        imported = ", ".join(f"{i.module}.{i.name}" for i in module.imports)
        raise FunctionDefinitionError(
            f"function {name}: the module imports {imported}; an ABI v{ABI_VERSION} module "
            "imports nothing (build for wasm32-unknown-unknown, not wasm32-wasi)"
        )
    exports = {e.name: e.type for e in module.exports}
    if handler not in exports and any(n.startswith("arrowudf_") for n in exports):
        raise FunctionDefinitionError(
            f"function {name}: the module is an arrow-udf (RisingWave) module; flight-serve runs "
            f"ABI v{ABI_VERSION} modules (schemas/functions-wasm-abi.md), which export "
            f"{handler!r} with the raw-buffer signature"
        )
    handler_sig = "(" + ", ".join(["i32"] * handler_params) + ") -> (i32)"
    expected = {
        "flight_serve_abi_version": "() -> (i32)",
        "alloc": "(i32, i32) -> (i32)",
        "dealloc": "(i32, i32, i32) -> ()",
        handler: handler_sig,
    }
    for export, sig in expected.items():
        ty = exports.get(export)
        what = handler_what if export == handler else ""
        if ty is None:
            raise FunctionDefinitionError(
                f"function {name}: the module has no export {export!r}; expected a function "
                f"{export}{what} {sig} (ABI v{ABI_VERSION}, schemas/functions-wasm-abi.md)"
            )
        if not isinstance(ty, wasmtime.FuncType):
            raise FunctionDefinitionError(
                f"function {name}: the module's export {export!r} is not a function; expected {sig}"
            )
        found = _signature(ty)
        if found != sig:
            raise FunctionDefinitionError(
                f"function {name}: the module's export {export!r} has the signature {found}; "
                f"expected {export}{what} {sig}{handler_suffix if export == handler else ''}"
            )
    mem = exports.get("memory")
    if not isinstance(mem, wasmtime.MemoryType):
        raise FunctionDefinitionError(
            f"function {name}: the module exports no linear memory named 'memory'"
        )


# --- the functions -----------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def _signed(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def _zero_nulls(a: pa.Array[Any]) -> pa.Array[Any]:
    """``a`` with null slots' values zeroed and booleans as one byte (0/1) per value."""
    if a.null_count:
        a = pc.fill_null(a, pa.scalar(False if pa.types.is_boolean(a.type) else 0, a.type))
    if pa.types.is_boolean(a.type):
        a = pc.cast(a, pa.uint8())
    return a


def _bitmap(valid: pa.Array[Any]) -> pa.Buffer:
    """The bitmap of a null-free boolean array, starting at bit 0."""
    if valid.offset:
        valid = pa.concat_arrays([valid])
    buf = valid.buffers()[1]
    assert buf is not None
    return buf


def _from_wasm(
    t: pa.DataType, m: int, values: pa.Buffer, bitmap: pa.Buffer | None
) -> pa.Array[Any]:
    """An Arrow array of ``m`` values of ``t`` from the module's values (and validity) bytes."""
    if pa.types.is_boolean(t):
        as_bytes = pa.Array.from_buffers(pa.uint8(), m, [None, values])
        bools = pc.not_equal(as_bytes, pa.scalar(0, pa.uint8()))
        return pa.Array.from_buffers(pa.bool_(), m, [bitmap, bools.buffers()[1]], -1, bools.offset)
    return pa.Array.from_buffers(t, m, [bitmap, values], -1)


def _layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """8-aligned offsets of regions of ``sizes`` bytes, and the total."""
    offsets: list[int] = []
    total = 0
    for size in sizes:
        offsets.append(total)
        total += (size + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, total


class _WasmFunction:
    """What scalar and table functions share: the checks, the module, the instance pool, the
    limits and the errors."""

    _handler_params: int
    _handler_what: str
    _handler_suffix: str

    def __init__(
        self,
        spec: FunctionSpec,
        *,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
        deadline_s: float = DEFAULT_DEADLINE_S,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        name = spec.name
        self._spec = spec
        self._handler = spec.handler or name
        self._memory_limit = memory_limit_bytes
        self._deadline_ticks = max(1, int(deadline_s / EPOCH_TICK_S) + 1)
        self._deadline_s = deadline_s
        self._pool_size = pool_size
        self._idle: list[_Instance] = []
        self._lock = threading.Lock()
        self._closed = False
        self.instances_created = 0
        """Instances made so far (a trap throws one away; the next call makes a new one)."""
        self._module = compile_module(spec.code, spec.digest, name)
        _check_exports(
            spec,
            self._module,
            self._handler,
            self._handler_params,
            self._handler_what,
            self._handler_suffix,
        )
        first = self._new_instance()
        version = self._version(first)
        if version != ABI_VERSION:
            raise FunctionDefinitionError(
                f"function {name}: the module's flight_serve_abi_version() is {version}; "
                f"this server runs ABI version {ABI_VERSION}"
            )
        self._idle.append(first)

    @property
    def spec(self) -> FunctionSpec:
        return self._spec

    def _version(self, inst: _Instance) -> int:
        try:
            return inst.version()
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise FunctionDefinitionError(
                f"function {self._spec.name}: flight_serve_abi_version() trapped: "
                f"{_first_line(str(exc))}"
            ) from exc

    def _new_instance(self) -> _Instance:
        try:
            inst = _Instance(self._module, self._handler, self._memory_limit)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise FunctionDefinitionError(
                f"function {self._spec.name}: the module cannot be instantiated within its "
                f"memory limit of {_mib(self._memory_limit)}: {_first_line(str(exc))}"
            ) from exc
        with self._lock:
            self.instances_created += 1
        return inst

    def _take(self) -> _Instance:
        with self._lock:
            if self._closed:
                raise FunctionCallError(f"function {self._spec.name}: closed")
            if self._idle:
                return self._idle.pop()
        try:
            return self._new_instance()
        except FunctionDefinitionError as exc:
            raise FunctionCallError(str(exc)) from exc

    def _give_back(self, inst: _Instance) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(inst)

    def _check_fits(self, total: int, n: int) -> None:
        if total > self._memory_limit:
            raise FunctionCallError(
                f"function {self._spec.name}: a batch of {n} rows needs {_mib(total)} of linear "
                f"memory, more than the instance's memory limit of {_mib(self._memory_limit)}"
            )

    def _reserve(self, inst: _Instance, total: int, n: int) -> int:
        ptr = inst.reserve(total)
        if ptr == 0:
            raise FunctionCallError(
                f"function {self._spec.name}: could not allocate {_mib(total)} for a batch of "
                f"{n} rows within the instance's memory limit of {_mib(self._memory_limit)}"
            )
        return ptr

    def _check_status(self, status: int, n: int) -> None:
        if status != 0:
            raise FunctionCallError(
                f"function {self._spec.name}: returned status {_signed(status)} (0 is success) "
                f"on a batch of {n} rows"
            )

    def _trap_error(self, inst: _Instance, exc: Exception, n: int) -> FunctionCallError:
        """The error for a trap; ``inst`` is not given back (it is dropped with its store)."""
        name = self._spec.name
        message = _trap_message(exc.message if isinstance(exc, wasmtime.Trap) else str(exc))
        code = exc.trap_code if isinstance(exc, wasmtime.Trap) else None
        if code == wasmtime.TrapCode.INTERRUPT:
            return FunctionCallError(
                f"function {name}: ran past its deadline of {self._deadline_s:g} s"
                f"{limit_note(self._spec, 'deadline')} on a batch of {n} rows and was "
                f"interrupted ({message})"
            )
        used = inst.memory_bytes()
        memory = (
            f"linear memory {_mib(used)} of its {_mib(self._memory_limit)} limit"
            f"{limit_note(self._spec, 'memory_limit')}"
        )
        if used * 2 > self._memory_limit:
            # memory.grow past the store's limit returns -1; the module's allocator then traps
            # (Rust: abort -> unreachable). More than half the limit in use: say so.
            memory = f"probably at its memory limit: {memory}"
        return FunctionCallError(
            f"function {name}: trapped on a batch of {n} rows: {message} ({memory})"
        )

    def close(self) -> None:
        """Drop every idle instance; later calls fail. Idempotent."""
        with self._lock:
            self._closed = True
            self._idle.clear()


def _check_types(name: str, spec: FunctionSpec) -> list[int]:
    widths: list[int] = []
    for i, t in enumerate(spec.arg_types):
        w = _width(t)
        if w is None:
            arg = spec.arg_names[i] if i < len(spec.arg_names) and spec.arg_names[i] else i + 1
            raise FunctionDefinitionError(
                f"function {name}: argument {arg} has type {t}; WebAssembly functions take "
                f"fixed-width types ({_SUPPORTED})"
            )
        widths.append(w)
    return widths


def _check_language(spec: FunctionSpec) -> None:
    if spec.language != "wasm":
        raise FunctionDefinitionError(f"function {spec.name}: language {spec.language}, not wasm")


class WasmScalarFunction(_WasmFunction):
    """A scalar function in a WebAssembly module (ABI v1); see the module docstring.

    Args:
        spec: the definition; ``spec.code`` is the module's bytes (or its WAT text),
            ``spec.handler`` (default ``spec.name``) the export called per batch.
        memory_limit_bytes: each instance's linear memory limit, bytes.
        deadline_s: wall-clock seconds one call may run (epoch interruption, ~10 ms ticks).
        pool_size: idle instances kept.

    Raises:
        FunctionDefinitionError: not a scalar function, an argument or return type without a
            fixed width, an invalid module, a missing export or another signature, or a module
            whose ``flight_serve_abi_version()`` is not 1 or that cannot be instantiated within
            its memory limit.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        *,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
        deadline_s: float = DEFAULT_DEADLINE_S,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        name = spec.name
        _check_language(spec)
        if spec.kind != "scalar" or isinstance(spec.returns, pa.Schema):
            raise FunctionDefinitionError(
                f"function {name}: RETURNS TABLE is a table function (WasmTableFunction), "
                "not a scalar one"
            )
        self._widths = _check_types(name, spec)
        out_width = _width(spec.returns)
        if out_width is None:
            raise FunctionDefinitionError(
                f"function {name}: return type {spec.returns}; WebAssembly functions return a "
                f"fixed-width type ({_SUPPORTED})"
            )
        self._returns: pa.DataType = spec.returns
        self._out_width = out_width
        k = len(spec.arg_types)
        plural = "s" if k != 1 else ""
        self._handler_params = k + 3
        self._handler_what = f"(n, {k} argument pointer{plural}, valid, out)"
        self._handler_suffix = f" for {k} argument{plural}"
        super().__init__(
            spec, memory_limit_bytes=memory_limit_bytes, deadline_s=deadline_s, pool_size=pool_size
        )

    def call(self, args: Sequence[pa.Array[Any]]) -> pa.Array[Any]:
        """One batch: ``args`` (one array per argument, all of length ``n``) -> an array of
        ``n`` values of the return type, null where any argument is null.

        Raises:
            FunctionCallError: a wrong number, type or length of arguments; the module trapped
                (the trap's message; the instance is replaced), ran past its deadline, could
                not get the batch's memory within its limit, or returned a nonzero status.
        """
        spec = self._spec
        name = spec.name
        if len(args) != len(spec.arg_types):
            raise FunctionCallError(
                f"function {name}: expected {len(spec.arg_types)} arguments, got {len(args)}"
            )
        n = len(args[0]) if args else 0
        for i, (a, t) in enumerate(zip(args, spec.arg_types, strict=True)):
            if a.type != t:
                raise FunctionCallError(
                    f"function {name}: argument {i + 1} expected type {t}, got {a.type}"
                )
            if len(a) != n:
                raise FunctionCallError(
                    f"function {name}: argument {i + 1} has {len(a)} rows, argument 1 has {n}"
                )
        if n == 0:
            return pa.array([], type=self._returns)

        # Validity: the AND of the arguments'; a null row's values are zeroed so the module never
        # sees undefined bytes (a zeroed divisor still traps: skip rows that are not valid).
        valid: pa.Array[Any] | None = None
        for a in args:
            if a.null_count:
                v = pc.is_valid(a)
                valid = v if valid is None else pc.and_(valid, v)
        columns = [_zero_nulls(a) for a in args]
        bitmap = _bitmap(valid) if valid is not None else None

        sizes = [n * w for w in self._widths]
        bitmap_size = (n + 7) // 8 if bitmap is not None else 0
        out_size = n * self._out_width
        offsets, total = _layout([*sizes, bitmap_size, out_size])
        self._check_fits(total, n)
        inst = self._take()
        try:
            ptr = self._reserve(inst, total, n)
            base = inst.base()
            for col, w, off, size in zip(columns, self._widths, offsets, sizes, strict=False):
                buf = col.buffers()[1]
                assert buf is not None
                ctypes.memmove(base + ptr + off, buf.address + col.offset * w, size)
            valid_ptr = 0
            if bitmap is not None:
                valid_ptr = ptr + offsets[-2]
                ctypes.memmove(base + valid_ptr, bitmap.address, bitmap_size)
            out_ptr = ptr + offsets[-1]
            inst.store.set_epoch_deadline(self._deadline_ticks)
            status = inst.func(n, *(ptr + o for o in offsets[:-2]), valid_ptr, out_ptr)
            self._check_status(status, n)
            out = pa.allocate_buffer(out_size)
            ctypes.memmove(out.address, inst.base() + out_ptr, out_size)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise self._trap_error(inst, exc, n) from exc
        self._give_back(inst)
        return _from_wasm(self._returns, n, out, bitmap)


class WasmTableFunction(_WasmFunction):
    """A table function in a WebAssembly module (ABI v1, ``RETURNS TABLE``): a batch in, zero or
    one batch of ``spec.returns`` out per call (schemas/functions-wasm-abi.md, "Table functions").

    The input is the whole batch: every column fixed-width; when ``spec.arg_types`` is not empty
    the batch's column types must equal it. Args and errors as :class:`WasmScalarFunction`;
    FunctionDefinitionError also for an output column without a fixed width.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        *,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
        deadline_s: float = DEFAULT_DEADLINE_S,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        name = spec.name
        _check_language(spec)
        if spec.kind != "table" or not isinstance(spec.returns, pa.Schema):
            raise FunctionDefinitionError(
                f"function {name}: a table function RETURNS TABLE (...), not {spec.returns}"
            )
        _check_types(name, spec)
        self._schema: pa.Schema = spec.returns
        self._out_widths: list[int] = []
        for field in self._schema:
            w = _width(field.type)
            if w is None:
                raise FunctionDefinitionError(
                    f"function {name}: output column {field.name} has type {field.type}; "
                    f"WebAssembly functions return fixed-width types ({_SUPPORTED})"
                )
            self._out_widths.append(w)
        self._handler_params = 3
        self._handler_what = "(n, in, out)"
        self._handler_suffix = " (a table function)"
        super().__init__(
            spec, memory_limit_bytes=memory_limit_bytes, deadline_s=deadline_s, pool_size=pool_size
        )

    def call_table(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """The module's output for ``batch``: one batch of ``spec.returns``, or none when it
        returns zero rows. Runs at once (errors raise here, not while iterating).

        Raises:
            FunctionCallError: a column without a fixed width or of another type than declared;
                a trap, the deadline or the memory limit (as :meth:`WasmScalarFunction.call`);
                an output descriptor or buffer outside the module's memory.
        """
        out = self._run(batch)
        return iter([out] if out is not None and out.num_rows else [])

    def _run(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        spec = self._spec
        name = spec.name
        widths: list[int] = []
        for i, field in enumerate(batch.schema):
            w = _width(field.type)
            if w is None:
                raise FunctionCallError(
                    f"function {name}: input column {field.name} has type {field.type}; "
                    f"WebAssembly table functions take fixed-width columns ({_SUPPORTED})"
                )
            if spec.arg_types and (i >= len(spec.arg_types) or field.type != spec.arg_types[i]):
                raise FunctionCallError(
                    f"function {name}: expected input columns "
                    f"({', '.join(str(t) for t in spec.arg_types)}), got "
                    f"({', '.join(str(f.type) for f in batch.schema)})"
                )
            widths.append(w)
        if spec.arg_types and len(batch.schema) != len(spec.arg_types):
            raise FunctionCallError(
                f"function {name}: expected {len(spec.arg_types)} input columns, got "
                f"{len(batch.schema)}"
            )
        n = batch.num_rows
        if n == 0:
            return None
        k = batch.num_columns
        r = len(self._out_widths)
        columns = [_zero_nulls(c) for c in batch.columns]
        bitmaps = [_bitmap(pc.is_valid(c)) if c.null_count else None for c in batch.columns]
        sizes = [n * w for w in widths]
        bitmap_size = (n + 7) // 8
        regions = [8 * k, *sizes, *(bitmap_size if b is not None else 0 for b in bitmaps)]
        regions.append(4 + 8 * r)
        offsets, total = _layout(regions)
        self._check_fits(total, n)
        inst = self._take()
        try:
            ptr = self._reserve(inst, total, n)
            base = inst.base()
            descriptor = []
            for j, (col, w) in enumerate(zip(columns, widths, strict=True)):
                values = ptr + offsets[1 + j]
                buf = col.buffers()[1]
                assert buf is not None
                ctypes.memmove(base + values, buf.address + col.offset * w, sizes[j])
                valid = 0
                bm = bitmaps[j]
                if bm is not None:
                    valid = ptr + offsets[1 + k + j]
                    ctypes.memmove(base + valid, bm.address, bitmap_size)
                descriptor += [values, valid]
            packed = struct.pack(f"<{2 * k}I", *descriptor)
            ctypes.memmove(base + ptr, packed, len(packed))
            out_desc = ptr + offsets[-1]
            inst.store.set_epoch_deadline(self._deadline_ticks)
            status = inst.func(n, ptr, out_desc)
            self._check_status(status, n)
            result = self._read_output(inst, out_desc, n)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise self._trap_error(inst, exc, n) from exc
        self._give_back(inst)
        return result

    def _read_output(self, inst: _Instance, out_desc: int, n: int) -> pa.RecordBatch:
        name = self._spec.name
        r = len(self._out_widths)
        size = inst.memory_bytes()
        base = inst.base()
        m, *pairs = struct.unpack(f"<I{2 * r}I", ctypes.string_at(base + out_desc, 4 + 8 * r))
        arrays: list[pa.Array[Any]] = []
        frees: list[tuple[int, int, int]] = []
        for j, (field, w) in enumerate(zip(self._schema, self._out_widths, strict=True)):
            values, valid = pairs[2 * j], pairs[2 * j + 1]
            spans = [(values, m * w, "values")]
            if valid:
                spans.append((valid, (m + 7) // 8, "validity"))
            for p, length, what in spans:
                if (p == 0 and length) or p + length > size:
                    raise FunctionCallError(
                        f"function {name}: output column {field.name}'s {what} "
                        f"({length} bytes at {p}) is outside the module's {_mib(size)} of "
                        f"memory ({m} rows returned for a batch of {n})"
                    )
            out = pa.allocate_buffer(m * w)
            ctypes.memmove(out.address, base + values, m * w)
            frees.append((values, m * w, _ALIGN))
            bitmap = None
            if valid:
                bitmap = pa.allocate_buffer((m + 7) // 8)
                ctypes.memmove(bitmap.address, base + valid, (m + 7) // 8)
                frees.append((valid, (m + 7) // 8, 1))
            arrays.append(_from_wasm(field.type, m, out, bitmap))
        for p, length, align in frees:
            if p:
                inst.dealloc(p, length, align)
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)


def spec_limits(spec: FunctionSpec) -> dict[str, Any]:
    """The keyword arguments ``spec``'s ``WITH (...)`` limits give
    (:func:`~flight_serve.functions.limits.function_limits`): ``memory_limit`` ->
    ``memory_limit_bytes`` (linear memory per instance), ``deadline`` -> ``deadline_s`` (per
    call, epoch interruption), ``workers`` -> ``pool_size`` (idle instances kept). Limits not
    given are left out (the defaults hold).

    Raises:
        FunctionDefinitionError: a bad limit (naming the option, the function and its line).
    """
    limits = function_limits(spec)
    out: dict[str, Any] = {}
    if limits.memory_limit_bytes is not None:
        out["memory_limit_bytes"] = limits.memory_limit_bytes
    if limits.deadline is not None:
        out["deadline_s"] = limits.deadline.total_seconds()
    if limits.workers is not None:
        out["pool_size"] = limits.workers
    return out


def create(spec: FunctionSpec) -> WasmScalarFunction | WasmTableFunction:
    """The registry's factory (:func:`flight_serve.functions.registry.create_function`): a
    ready scalar or table function for ``spec``, with its ``WITH (...)`` limits
    (:func:`spec_limits`).

    Raises:
        FunctionDefinitionError: as :class:`WasmScalarFunction` / :class:`WasmTableFunction`,
            and a bad limit.
    """
    if spec.kind == "table":
        return WasmTableFunction(spec, **spec_limits(spec))
    return WasmScalarFunction(spec, **spec_limits(spec))


def wasm_scalar_function(spec: FunctionSpec, **limits: Any) -> WasmScalarFunction:
    """A ready :class:`WasmScalarFunction` for ``spec`` (``limits``: its keyword arguments)."""
    return WasmScalarFunction(spec, **limits)


def wasm_table_function(spec: FunctionSpec, **limits: Any) -> WasmTableFunction:
    """A ready :class:`WasmTableFunction` for ``spec`` (``limits``: its keyword arguments)."""
    return WasmTableFunction(spec, **limits)
