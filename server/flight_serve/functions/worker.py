"""The Python function worker: ``python -m flight_serve.functions.worker`` (issue 15).

:mod:`flight_serve.functions.python` spawns this module in a sandbox (bubblewrap) and talks to
it over the worker's stdin/stdout pipes; user code never runs in the server process. The module
also holds what both sides share: the frame format, the loader (:class:`Runner`) that compiles
the code, finds the handler and checks every result, and the seccomp filter.

Protocol (every frame: a 9-byte header ``!BQ`` = kind, payload length in bytes; then the
payload):

* parent -> worker ``HELLO``: JSON ``{"name", "kind", "code", "handler", "vectorized", "line",
  "args": <base64 Arrow IPC schema of the arguments>, "returns": <base64 IPC schema: one field
  "result" (scalar) or the table's schema>, "memory_limit_bytes", "cpu_limit_s", "seccomp"}``.
  The worker sets its rlimits, installs its seccomp filter, runs the code's module level and
  answers ``READY`` (JSON ``{"seccomp": bool}``) or ``ERROR``.
* parent -> worker ``CALL``: an Arrow IPC stream of one batch (scalar: one column per
  argument; table: the input batch). Answer: ``RESULT``, an Arrow IPC stream (scalar: one
  batch, one column ``result``; table: zero or more batches of the declared schema), or
  ``ERROR``.
* Shared memory (when the hello's ``"shm"`` is ``{"request_fd", "response_fd", "bytes"}``:
  two sealed memfds of ``bytes`` each, inherited; ``null``: pipes only): the worker maps both
  and says ``{"shm": true}`` in its ``READY``. Then a ``CALL_SHM`` (payload: ``!Q`` length)
  means the call's IPC stream is the request region's first ``length`` bytes (a stream that
  does not fit still comes as ``CALL``), and the worker answers ``RESULT_SHM`` (``!Q``
  length: the result's IPC stream is the response region's first bytes) when its result fits,
  else ``RESULT`` through the pipe. The worker reads the request in place (zero-copy: the
  handler's arguments are views of the region, valid during the call; the parent writes the
  next batch over them, so a handler that keeps an argument across calls must copy it); the
  parent copies the result out before reading it (a worker is never trusted, and could change
  the region after the parent checked it). The request region is mapped read-only in the
  worker, and the parent never reads it back.
* ``ERROR``: JSON ``{"kind": "definition" | "call" | "memory", "message": str}``; the message
  already names the function and, for an exception, the user code's line (see
  :func:`code_line`).

The worker exits when its stdin closes. User ``print`` goes to stderr (fd 1 is redirected; the
protocol uses a private copy of the original stdout).
"""

from __future__ import annotations

import base64
import ctypes
import inspect
import json
import mmap
import os
import platform
import resource
import struct
import sys
import traceback
from collections.abc import Iterable
from typing import Any, Final

import pyarrow as pa

FRAME: Final = struct.Struct("!BQ")
#: the payload of ``CALL_SHM`` and ``RESULT_SHM``: a length in bytes
LENGTH: Final = struct.Struct("!Q")
HELLO: Final = 1
READY: Final = 2
CALL: Final = 3
RESULT: Final = 4
ERROR: Final = 5
CALL_SHM: Final = 6
RESULT_SHM: Final = 7

#: The file name user code is compiled under: tracebacks are matched on it.
CODE_FILENAME: Final = "<flight-serve function {name}>"


class Problem(Exception):
    """A failure to report to the parent: ``kind`` is ``definition``, ``call`` or ``memory``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def code_line(line_in_code: int, spec_line: int) -> str:
    """Where line ``line_in_code`` (1-based) of a function's code is, for a message.

    Mapping: the code's first line is the pipeline file's line ``spec_line`` (the line of the
    opening ``$$``, where an inline body begins), so code line ``k`` is file line
    ``spec_line + k - 1``. With ``spec_line == 0`` (code not from a pipeline file, or from its
    own ``USING`` file) the code's own line is given.
    """
    if spec_line > 0:
        return f"line {spec_line + line_in_code - 1} of the pipeline file (line {line_in_code} of the function's code)"
    return f"line {line_in_code} of the function's code"


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def to_ipc(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> pa.Buffer:
    """One Arrow IPC stream holding ``batches`` (schema message first), in one buffer sized
    beforehand (a growing buffer copies the batch again at every doubling)."""
    batches = list(batches)
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    buffer = pa.allocate_buffer(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buffer), schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return buffer


def write_ipc_into(target: pa.Buffer, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> int:
    """Write one Arrow IPC stream of ``batches`` straight into ``target`` (a mutable buffer:
    a shared-memory region) from its first byte, in one pass; its length, or 0 when it does not
    fit (``target``'s bytes are then undefined) or ``target`` is not mutable."""
    if not target.is_mutable:
        return 0
    # the whole buffer: a slice of a pyarrow buffer is not mutable
    sink = pa.FixedSizeBufferWriter(target)
    try:
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    except OSError:  # "Write out of bounds": the stream is larger than the region
        return 0
    return int(sink.tell())


def copy_out(region: pa.Buffer, size: int) -> pa.Buffer:
    """The first ``size`` bytes of ``region`` copied into a new buffer of pyarrow's memory pool
    (which reuses freed memory: no fresh pages to fault in, as a new ``bytes`` would have)."""
    if size > region.size:
        raise ValueError(f"{size} bytes asked of a region of {region.size}")
    out = pa.allocate_buffer(size)
    ctypes.memmove(out.address, region.address, size)
    return out


def from_ipc(data: Any) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """The schema and batches of one Arrow IPC stream (zero-copy over ``data``)."""
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    return reader.schema, list(reader)


class Runner:
    """A function's code loaded and ready to call (in the worker, or in-process when asked).

    ``kind`` ``"scalar"``: :meth:`call_scalar` calls ``handler(*arrays)`` once per batch
    (``vectorized``) or ``handler(*values)`` once per row with Python values (``None`` for
    null), and checks the result: an Arrow array (or chunked array) of the batch's length and
    of the declared type. ``kind`` ``"table"``: :meth:`call_table` calls ``handler(batch)``;
    it returns a RecordBatch, a Table or an iterable (a generator) of them, each of the declared
    schema. Raises :class:`Problem` (``definition`` while loading; ``call`` or ``memory`` while
    calling).
    """

    def __init__(
        self,
        *,
        name: str,
        kind: str,
        code: str,
        handler: str,
        vectorized: bool,
        line: int,
        args: pa.Schema,
        returns: pa.Schema,
    ) -> None:
        self.name = name
        self.kind = kind
        self.vectorized = vectorized
        self.line = line
        self.args = args
        self.returns = returns
        self.filename = CODE_FILENAME.format(name=name)
        try:
            compiled = compile(code, self.filename, "exec")
        except SyntaxError as exc:
            raise Problem(
                "definition",
                f"function {name}: syntax error at {code_line(exc.lineno or 1, line)}: {exc.msg}",
            ) from None
        namespace: dict[str, Any] = {"__name__": f"flight_serve_function_{name}"}
        try:
            exec(compiled, namespace)
        except BaseException as exc:  # the module level failed: the definition is refused
            raise Problem("definition", self._describe(exc, "loading its code")) from None
        if handler not in namespace:
            raise Problem(
                "definition", f"function {name}: its code defines no handler named {handler!r}"
            )
        self.handler = namespace[handler]
        if not callable(self.handler):
            got = type(self.handler).__name__
            raise Problem(
                "definition", f"function {name}: handler {handler!r} is a {got}, not callable"
            )
        arity = 1 if kind == "table" else len(args)
        try:
            inspect.signature(self.handler).bind(*range(arity))
        except TypeError:
            raise Problem(
                "definition",
                f"function {name}: handler {handler!r} cannot take {arity} argument(s)",
            ) from None
        except ValueError:  # no signature (a builtin): let the call tell
            pass

    def _describe(self, exc: BaseException, doing: str) -> str:
        where = ""
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if frame.filename == self.filename and frame.lineno is not None:
                where = f" at {code_line(frame.lineno, self.line)}"
                break
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return f"function {self.name} failed while {doing}{where}: {last}"

    def _invoke(self, *values: Any) -> Any:
        try:
            return self.handler(*values)
        except MemoryError as exc:
            raise Problem("memory", self._describe(exc, "running")) from None
        except Exception as exc:
            raise Problem("call", self._describe(exc, "running")) from None

    def call_scalar(self, batch: pa.RecordBatch) -> pa.Array[Any]:
        """The handler's result for one batch whose columns are the arguments."""
        n = batch.num_rows
        expected = self.returns.field(0).type
        if self.vectorized:
            result = self._invoke(*batch.columns)
        else:
            columns = [column.to_pylist() for column in batch.columns]
            values = (
                [self._invoke(*row) for row in zip(*columns, strict=True)]
                if columns
                else [self._invoke() for _ in range(n)]
            )
            try:
                result = pa.array(values, type=expected)
            except (
                pa.ArrowInvalid,
                pa.ArrowTypeError,
                TypeError,
                ValueError,
                OverflowError,
            ) as exc:
                raise Problem(
                    "call",
                    f"function {self.name} returned values that are not {expected}: {exc}",
                ) from None
        return check_scalar_result(self.name, result, expected, n)

    def call_table(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """The batches the handler returns or yields for ``batch``, each checked."""
        out = self._invoke(batch)
        if isinstance(out, pa.RecordBatch | pa.Table):
            items: Iterable[Any] = [out]
        elif out is None:
            items = []
        else:
            items = out
        batches: list[pa.RecordBatch] = []
        iterator = iter(items)
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                break
            except MemoryError as exc:
                raise Problem("memory", self._describe(exc, "running")) from None
            except Exception as exc:
                raise Problem("call", self._describe(exc, "running")) from None
            batches.extend(check_table_result(self.name, item, self.returns))
        return batches


def check_scalar_result(name: str, result: Any, expected: pa.DataType, n: int) -> pa.Array[Any]:
    """``result`` as one array of ``n`` values of type ``expected``, else :class:`Problem`
    (``call``) naming the function, what was expected and what was got."""
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks() if result.num_chunks != 1 else result.chunk(0)
    if not isinstance(result, pa.Array):
        raise Problem(
            "call",
            f"function {name} returned a {type(result).__name__}, expected an Arrow array of {expected}",
        )
    if result.type != expected:
        raise Problem("call", f"function {name} returned {result.type}, expected {expected}")
    if len(result) != n:
        raise Problem(
            "call",
            f"function {name} returned {len(result)} rows, expected {n} (the batch's length)",
        )
    return result


def check_table_result(name: str, item: Any, schema: pa.Schema) -> list[pa.RecordBatch]:
    """``item`` (a RecordBatch or Table of ``schema``) as batches, else :class:`Problem`."""
    if isinstance(item, pa.Table):
        if not item.schema.equals(schema):
            raise Problem(
                "call",
                f"function {name} returned schema {_fields(item.schema)}, expected {_fields(schema)}",
            )
        return item.to_batches()
    if not isinstance(item, pa.RecordBatch):
        raise Problem(
            "call",
            f"function {name} returned a {type(item).__name__}, expected a RecordBatch of {_fields(schema)}",
        )
    if not item.schema.equals(schema):
        raise Problem(
            "call",
            f"function {name} returned schema {_fields(item.schema)}, expected {_fields(schema)}",
        )
    return [item]


def _fields(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"


# --- seccomp ------------------------------------------------------------------------------------

_AUDIT_ARCH_X86_64: Final = 0xC000003E
_CLONE_THREAD: Final = 0x00010000
#: x86_64 system calls the worker refuses (EPERM) once its code is loaded: new processes and
#: programs, sockets, namespaces and mounts, tracing, kernel keys, modules, BPF, io_uring.
_DENY_X86_64: Final = {
    "socket": 41,
    "socketpair": 53,
    "fork": 57,
    "vfork": 58,
    "execve": 59,
    "ptrace": 101,
    "pivot_root": 155,
    "chroot": 161,
    "mount": 165,
    "umount2": 166,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "execveat": 322,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsmount": 432,
}
_CLONE: Final = 56
_CLONE3: Final = 435


def _seccomp_program() -> bytes:
    """A classic-BPF seccomp program (x86_64): the calls in ``_DENY_X86_64`` fail with EPERM,
    ``clone`` only makes threads (``CLONE_THREAD``), ``clone3`` fails with ENOSYS (so the C
    library falls back to ``clone``), other architectures' and x32 calls kill the process."""
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    deny = sorted(_DENY_X86_64.values())
    # layout: 0 ld arch; 1 jeq; 2 ret kill; 3 ld nr; 4 jge x32; then one jeq per denied call,
    # jeq clone, jeq clone3, ret allow, [deny] ret eperm, [clone] ld arg0, jset, ret eperm,
    # ret allow, [clone3] ret enosys
    prog: list[tuple[int, int, int, int]] = [(ld_abs, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64)]
    prog += [(ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    first = len(prog) + 1  # index of the first jeq after the jge
    n_checks = len(deny) + 2
    allow_at = first + n_checks
    deny_at = allow_at + 1
    clone_at = deny_at + 1
    clone3_at = clone_at + 4
    prog.append((jge, deny_at - (len(prog) + 1), 0, 0x40000000))
    for nr in deny:
        prog.append((jeq, deny_at - (len(prog) + 1), 0, nr))
    prog.append((jeq, clone_at - (len(prog) + 1), 0, _CLONE))
    prog.append((jeq, clone3_at - (len(prog) + 1), 0, _CLONE3))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    prog += [
        (ld_abs, 0, 0, 16),
        (jset, 1, 0, _CLONE_THREAD),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    prog.append((ret, 0, 0, enosys))
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def install_seccomp() -> bool:
    """Install the filter on every thread of this process (``SECCOMP_FILTER_FLAG_TSYNC``);
    ``False`` when not on x86_64 Linux (the other layers of the sandbox still apply)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    program = _seccomp_program()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog)
    if libc.syscall(317, 1, 1, ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
    return True


# --- the worker's loop ---------------------------------------------------------------------------


def read_exact(fd: int, n: int) -> bytearray | None:
    """``n`` bytes from ``fd``, or ``None`` at end of file before the first byte."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            if got == 0:
                return None
            raise EOFError(f"end of stream after {got} of {n} bytes")
        got += k
    return buf


def write_frame(fd: int, kind: int, payload: Any) -> None:
    """One frame (header and payload, any buffer) to ``fd``, however many writes it takes."""
    view = memoryview(payload).cast("B")
    header = FRAME.pack(kind, len(view))
    written = os.writev(fd, [header, view])
    total = len(header) + len(view)
    while written < total:
        if written < len(header):
            written += os.writev(fd, [header[written:], view])
        else:
            written += os.write(fd, view[written - len(header) :])


def _error(fd: int, problem: Problem) -> None:
    write_frame(fd, ERROR, json.dumps({"kind": problem.kind, "message": problem.message}).encode())


def _map_shared(shm: Any) -> tuple[pa.Buffer, pa.Buffer] | None:
    """The request and response regions the hello names, mapped shared (``None``: none)."""
    if not isinstance(shm, dict):
        return None
    try:
        size = int(shm["bytes"])
        fds = int(shm["request_fd"]), int(shm["response_fd"])
        request = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ)
        response = mmap.mmap(fds[1], size, mmap.MAP_SHARED)
    except (KeyError, TypeError, ValueError, OSError):
        return None
    for fd in fds:  # each mmap holds a duplicate of its descriptor
        os.close(fd)
    return pa.py_buffer(request), pa.py_buffer(response)


def main() -> int:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # user prints go to stderr, never into the protocol
    header = read_exact(proto_in, FRAME.size)
    if header is None:
        return 0
    kind, length = FRAME.unpack(header)
    body = read_exact(proto_in, length)
    if kind != HELLO or body is None:
        return 2
    hello = json.loads(bytes(body))
    data_limit = int(hello["memory_limit_bytes"])
    resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
    cpu = int(hello["cpu_limit_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import pyarrow.compute  # noqa: F401  (loaded before the filter; most functions use it)

    shared = _map_shared(hello.get("shm"))
    seccomp = install_seccomp() if hello["seccomp"] else False
    try:
        runner = Runner(
            name=hello["name"],
            kind=hello["kind"],
            code=hello["code"],
            handler=hello["handler"],
            vectorized=bool(hello["vectorized"]),
            line=int(hello["line"]),
            args=schema_from_text(hello["args"]),
            returns=schema_from_text(hello["returns"]),
        )
    except Problem as problem:
        _error(proto_out, problem)
        return 0
    ready = {"seccomp": seccomp, "shm": shared is not None}
    write_frame(proto_out, READY, json.dumps(ready).encode())
    while True:
        header = read_exact(proto_in, FRAME.size)
        if header is None:
            return 0
        kind, length = FRAME.unpack(header)
        payload = read_exact(proto_in, length)
        if payload is None or kind not in (CALL, CALL_SHM) or (kind == CALL_SHM and not shared):
            return 2
        data: Any = payload
        if kind == CALL_SHM:
            assert shared is not None
            (size,) = LENGTH.unpack(payload)
            if size > shared[0].size:
                return 2
            # zero-copy: the arguments are views of the region, valid during this call (the
            # server writes the next batch over them; a handler that keeps one copies it)
            data = shared[0].slice(0, size)
        try:
            _, batches = from_ipc(data)
            batch = batches[0]
            if runner.kind == "scalar":
                result = runner.call_scalar(batch)
                results = [pa.record_batch([result], schema=runner.returns)]
            else:
                results = runner.call_table(batch)
            size = write_ipc_into(shared[1], runner.returns, results) if shared else 0
            out = LENGTH.pack(size) if size else to_ipc(runner.returns, results)
        except Problem as problem:
            _error(proto_out, problem)
            continue
        except MemoryError as exc:
            _error(proto_out, Problem("memory", f"function {runner.name}: out of memory ({exc})"))
            continue
        except Exception as exc:  # the result could not be encoded
            _error(proto_out, Problem("call", f"function {runner.name}: {exc}"))
            continue
        del payload, data, batches, batch, results
        write_frame(proto_out, RESULT_SHM if size else RESULT, out)
        del out


if __name__ == "__main__":
    sys.exit(main())
