"""Python user functions, run in sandboxed worker processes (issue 15; DESIGN 10 "functions").

:func:`python_function` turns a :class:`~flight_serve.functions.base.FunctionSpec` of language
``python`` into a :class:`PythonScalarFunction` or :class:`PythonTableFunction`. The code never
runs in this process: each function has a pool of worker processes
(``python -m flight_serve.functions.worker``) that the server spawns in a **bubblewrap**
sandbox and feeds batches as Arrow IPC: written into a shared-memory region the worker maps
(two sealed memfds per worker, request and response), with frames over the worker's
stdin/stdout pipes saying what is where; a batch too large for its region, or
``SandboxConfig(shared_memory=False)``, goes through the pipes (the protocol is in
:mod:`flight_serve.functions.worker`).

The sandbox (``bwrap``):

* a read-only view of ``/`` (``--ro-bind / /``), a private ``/tmp`` (tmpfs, 64 MiB), its own
  ``/proc`` and ``/dev``, the working directory ``/tmp``, an empty environment but ``PATH``,
  ``HOME=/tmp``, ``LANG`` and ``PYTHONPATH``;
* new network (no interface but a down loopback), PID, IPC, UTS and cgroup namespaces, a new
  session, killed with its parent (``--die-with-parent``);
* a non-root user (uid/gid 65534, no supplementary groups) and no capabilities. As root, bwrap
  makes its mounts privileged (no user namespace: one would map the sandbox's uid to root
  outside, and root-owned files like ``/etc/shadow`` would stay readable), keeps only
  ``CAP_SETUID``/``CAP_SETGID``/``CAP_SETPCAP`` for ``setpriv``, which becomes uid 65534, clears
  every capability set and sets ``no_new_privs`` before Python starts. Directories that uid
  65534 cannot traverse on the way to the interpreter or its packages (``/root`` holding a
  pyenv) are replaced by an empty tmpfs with just those paths bound back. As another user,
  bwrap uses a user namespace with ``--uid``/``--gid 65534``;
* rlimits set by the worker before the code is loaded: ``RLIMIT_DATA`` =
  ``memory_limit_bytes`` (a data-segment limit: an address-space limit breaks ``import
  pyarrow``; ``WITH (memory_limit = '…')`` sets it per function, as ``deadline`` and
  ``workers`` set ``deadline`` and ``pool_size``: :func:`with_limits`), ``RLIMIT_CPU`` =
  ``cpu_limit_s`` CPU seconds over the worker's life (then the kernel kills it and the pool
  replaces it), no core files;
* a seccomp filter (x86_64; :func:`flight_serve.functions.worker.install_seccomp`) installed
  before the code is loaded: no ``execve``, no new processes (``clone`` makes threads only), no
  sockets, no mounts, namespaces, ``ptrace``, BPF, kernel keys or io_uring. On other
  architectures the filter is left out (the rest applies).

Without ``bwrap`` on the machine, :func:`python_function` raises
:class:`~flight_serve.errors.FunctionDefinitionError` unless ``SandboxConfig(unsandboxed=True)``
says the code is **not sandboxed**: then the worker is a plain subprocess (same protocol, same
rlimits, no filter). ``SandboxConfig(in_process=True)`` runs the code in this process (a library
convenience; off by default, never for a server).

Calls: vectorized by default: the handler is called once per batch with one pyarrow array per
argument and returns an array of the batch's length and declared type.
``options["vectorized"] == "false"`` calls it once per row with Python values (``None`` for
null). A table function's handler gets the batch and returns a RecordBatch or Table, or
yields several, each of the declared schema.

Failures:

* :class:`~flight_serve.errors.FunctionDefinitionError` (before any batch): a syntax error (the
  code is compiled here, not run; the line is mapped to the pipeline file as
  :func:`~flight_serve.functions.worker.code_line` says: code line ``k`` is file line
  ``spec.first_code_line + k - 1``), a missing or non-callable handler, a handler that
  cannot take the declared arguments, module-level code that raises (the worker's hello), no
  ``bwrap``;
* :class:`~flight_serve.errors.FunctionCallError`: the handler raised (the message gives the
  exception's last line and the user code's line), returned the wrong type or length (expected
  and got), ran past ``deadline`` (the worker is killed; the message gives the deadline in
  seconds), ran out of memory (the worker is replaced), or killed its worker on the batch and on
  its one retry;
* a worker that dies mid-batch (killed, crashed) is replaced and the batch retried once on
  another, new worker: every row is computed once in the result;
* :class:`~flight_serve.errors.FunctionWorkerError`: a worker could not start (or did not say
  hello within ``start_timeout``) or broke the protocol.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import fcntl
import json
import mmap
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from flight_serve.errors import FunctionCallError, FunctionDefinitionError, FunctionWorkerError
from flight_serve.functions import worker as proto
from flight_serve.functions.base import FunctionSpec
from flight_serve.functions.limits import format_bytes, function_limits, limit_note

__all__ = [
    "PythonScalarFunction",
    "PythonTableFunction",
    "SandboxConfig",
    "bwrap_path",
    "create",
    "python_function",
    "with_limits",
]

_SANDBOX_UID: Final = 65534
_F_SETPIPE_SZ: Final = 1031
_PIPE_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class SandboxConfig:
    """How a Python function's workers run.

    Attributes:
        pool_size: most workers per function (calls beyond wait for one); at least 1.
        min_workers: workers started (and said hello) when the function is built.
        deadline: wall-clock limit of one call (a batch); past it the worker is killed.
        start_timeout: limit for a worker to start and load the code.
        memory_limit_bytes: the worker's ``RLIMIT_DATA`` (heap and private mappings).
        cpu_limit_s: the worker's ``RLIMIT_CPU``, CPU seconds over its whole life.
        unsandboxed: allow running without bwrap as a plain subprocess (**not sandboxed**).
        in_process: run the code in this process (no isolation; library use only).
        bwrap: the bubblewrap binary (default: ``bwrap`` on ``PATH``).
        shared_memory: batches cross through two shared-memory regions per worker (sealed
            memfds of 64 MiB each, sparse) and the pipes carry only frame headers; ``False``:
            every batch through the pipes (the slower transport, kept for comparison). A
            batch whose IPC stream does not fit a region goes through the pipe either way.
        shared_memory_bytes: each region's size in bytes (sparse: only the pages the largest
            batch wrote take memory, until the worker ends).
        same_cpu: a call runs on one CPU: the worker's processes are bound to the calling
            thread's CPU (again when it changes) and the thread stays there until the answer
            (its affinity is put back after): a wake-up on the same CPU instead of a second
            one's (``_Worker._hold_cpu``; a 1-row call took 249-276 µs across two CPUs,
            165-187 µs on one, here). ``False``: the scheduler places the worker.
        hidden_paths: directories the sandbox sees as empty (each an empty tmpfs): the server's
            data directory, its TLS keys and token files, whatever the read-only root would
            otherwise let the code read.
    """

    pool_size: int = 2
    min_workers: int = 1
    deadline: timedelta = timedelta(seconds=30)
    start_timeout: timedelta = timedelta(seconds=30)
    memory_limit_bytes: int = 1 << 30
    cpu_limit_s: int = 3600
    unsandboxed: bool = False
    in_process: bool = False
    bwrap: str | None = None
    hidden_paths: tuple[str, ...] = ()
    shared_memory: bool = True
    shared_memory_bytes: int = 64 << 20
    same_cpu: bool = True


def bwrap_path(config: SandboxConfig | None = None) -> str | None:
    """The bubblewrap binary that would be used, or ``None`` when there is none."""
    if config is not None and config.bwrap is not None:
        return config.bwrap if os.access(config.bwrap, os.X_OK) else None
    return shutil.which("bwrap")


def _is_vectorized(spec: FunctionSpec) -> bool:
    value = spec.options.get("vectorized", "true").strip().lower()
    if value not in ("true", "false"):
        raise FunctionDefinitionError(
            f"function {spec.name}: vectorized = {value!r}; expected 'true' or 'false'"
        )
    return value == "true"


def _returns_schema(spec: FunctionSpec) -> pa.Schema:
    if spec.kind == "table":
        if not isinstance(spec.returns, pa.Schema):
            raise FunctionDefinitionError(f"function {spec.name}: RETURNS TABLE needs a schema")
        return spec.returns
    if isinstance(spec.returns, pa.Schema):
        raise FunctionDefinitionError(f"function {spec.name}: a scalar function returns a type")
    return pa.schema([pa.field("result", spec.returns)])


def _args_schema(spec: FunctionSpec) -> pa.Schema:
    return pa.schema([pa.field(f"a{i}", t) for i, t in enumerate(spec.arg_types)])


def python_function(
    spec: FunctionSpec, config: SandboxConfig | None = None
) -> PythonScalarFunction | PythonTableFunction:
    """Build ``spec`` (language ``python``): check the definition, start ``min_workers``.

    Raises :class:`~flight_serve.errors.FunctionDefinitionError` (see the module docstring) and
    :class:`~flight_serve.errors.FunctionWorkerError` (a worker did not start).
    """
    config = with_limits(spec, config or SandboxConfig())
    if spec.kind == "table":
        return PythonTableFunction(spec, config)
    return PythonScalarFunction(spec, config)


def with_limits(spec: FunctionSpec, config: SandboxConfig) -> SandboxConfig:
    """``config`` with the limits ``spec``'s ``WITH (...)`` gives
    (:func:`~flight_serve.functions.limits.function_limits`): ``memory_limit`` ->
    ``memory_limit_bytes`` (``RLIMIT_DATA``), ``deadline`` -> ``deadline`` (per call),
    ``workers`` -> ``pool_size`` (and ``min_workers`` at most that). Limits not given keep
    ``config``'s.

    Raises:
        FunctionDefinitionError: a bad limit (naming the option, the function and its line).
    """
    limits = function_limits(spec)
    if limits.memory_limit_bytes is not None:
        config = replace(config, memory_limit_bytes=limits.memory_limit_bytes)
    if limits.deadline is not None:
        config = replace(config, deadline=limits.deadline)
    if limits.workers is not None:
        config = replace(
            config,
            pool_size=limits.workers,
            min_workers=min(config.min_workers, limits.workers),
        )
    return config


def create(
    spec: FunctionSpec, sandbox: SandboxConfig | None = None
) -> PythonScalarFunction | PythonTableFunction:
    """The registry's factory (:func:`flight_serve.functions.registry.create_function`): the
    same as :func:`python_function`, with the host's sandbox (``None``: ``SandboxConfig()``,
    sandboxed, nothing hidden).

    The host configures ``sandbox``: ``flight-serve serve`` hides its data directory and the
    directories of its TLS key, tokens and users files and sets ``unsandboxed`` from
    ``--allow-unsandboxed-python``; ``flight-serve run`` sets only ``unsandboxed``.
    """
    return python_function(spec, sandbox)


class _WorkerDied(Exception):
    pass


class _Deadline(Exception):
    pass


class _Oversized(Exception):
    """The worker announced a frame larger than it can hold (a broken or hostile worker)."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


def _error_frame(name: str, body: bytearray) -> tuple[str, str]:
    """``(kind, message)`` of an ``ERROR`` frame, else FunctionWorkerError."""
    try:
        error = json.loads(bytes(body))
        kind, message = error["kind"], error["message"]
    except (ValueError, KeyError, TypeError):
        raise FunctionWorkerError(f"function {name}: its worker sent an unreadable error") from None
    if not isinstance(kind, str) or not isinstance(message, str):
        raise FunctionWorkerError(f"function {name}: its worker sent an unreadable error")
    return kind, message


_spawner_lock = threading.Lock()
_spawner: concurrent.futures.ThreadPoolExecutor | None = None


def _spawn(
    argv: list[str], env: dict[str, str], pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """Start a worker process from one long-lived thread of this process.

    ``bwrap --die-with-parent`` is ``PR_SET_PDEATHSIG``, which fires when the **thread** that
    started the process ends, not the process: a worker started from a short-lived thread (a
    call's, a restart's) would be killed when that thread returns. One spawner thread, alive
    as long as the server, starts them all.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(1, "function-worker-spawner")
        spawner = _spawner
    future = spawner.submit(
        subprocess.Popen,
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd="/",
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )
    return future.result()


class _SharedRegion:
    """One fixed-size shared-memory region (a sealed ``memfd``) a worker inherits.

    The memfd is ``memfd_create``-d here, sized with ``ftruncate`` (sparse: a page costs memory
    only once written) and sealed against growing, shrinking and further seals, so neither
    side can change its size under the other (no ``SIGBUS`` from a worker shrinking it). Both
    sides ``mmap`` it shared; the worker gets its descriptor through ``pass_fds`` (bwrap and
    setpriv keep inherited descriptors) and its number in the hello.
    """

    def __init__(self, name: str, size: int) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            seals = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
            self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        #: a pyarrow view of the whole mapping (writes go straight into shared memory)
        self.buffer = pa.py_buffer(self.map)

    def close(self) -> None:
        """Close the descriptor (once the worker inherited it; the number stays valid in the
        worker); the mapping goes with the last reference to the region."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _shared_regions(name: str, size: int) -> tuple[_SharedRegion, _SharedRegion] | None:
    """A worker's request and response regions, or ``None`` where the system has no memfd
    (the pipes then carry every batch)."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        request = _SharedRegion(f"flight-serve-{name}-request", size)
    except OSError:
        return None
    try:
        response = _SharedRegion(f"flight-serve-{name}-response", size)
    except OSError:
        request.close()
        return None
    return request, response


class _Worker:
    """One worker process and its two pipes; used by one call at a time."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        name: str,
        shared_bytes: int = 0,
        *,
        same_cpu: bool = False,
    ) -> None:
        self.name = name
        self.shared = _shared_regions(name, shared_bytes) if shared_bytes > 0 else None
        fds = [region.fd for region in self.shared] if self.shared is not None else []
        try:
            self.proc = _spawn(argv, env, fds)
        except OSError as exc:
            raise FunctionWorkerError(f"function {name}: cannot start a worker: {exc}") from None
        finally:  # the worker has its copies; ours are not needed (each mmap holds a dup)
            self._close_shared()
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        for fd in (self.wfd, self.rfd):
            with contextlib.suppress(OSError):  # a larger pipe: fewer wake-ups per batch
                fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        #: the worker mapped the regions (its READY said so); until then, pipes only
        self.shm_ready = False
        #: run on the calling thread's CPU during a call (SandboxConfig.same_cpu); turned off
        #: when the system refuses an affinity
        self.same_cpu = same_cpu
        self._cpu = -1  # the CPU the worker's processes are bound to (-1: none yet)
        self._pids: list[int] = []
        self._drain = threading.Thread(
            target=self._read_stderr, name=f"function-{name}-stderr", daemon=True
        )
        self._drain.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    def _close_shared(self) -> None:
        if self.shared is not None:
            for region in self.shared:
                region.close()

    def shared_hello(self) -> dict[str, int] | None:
        """The hello's ``shm`` entry: the regions' descriptors and size (``None``: pipes only)."""
        if self.shared is None:
            return None
        request, response = self.shared
        return {"request_fd": request.fd, "response_fd": response.fd, "bytes": request.size}

    def call(self, batch: pa.RecordBatch, timeout_s: float, max_bytes: int) -> tuple[int, Any]:
        """One ``CALL`` of ``batch``; the answer's kind and body (a ``RESULT``'s body is its IPC
        stream, copied out of shared memory when it came that way).

        The batch goes through the request region when it fits (the IPC stream written
        straight into it, a ``CALL_SHM`` frame giving its length), else through the pipe.

        With ``same_cpu``, the call runs on one CPU (:meth:`_hold_cpu`), and the calling
        thread's CPU affinity is as before when it returns or raises."""
        held = self._hold_cpu() if self.same_cpu else None
        try:
            return self._call(batch, timeout_s, max_bytes)
        finally:
            if held is not None:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, held)

    def _call(self, batch: pa.RecordBatch, timeout_s: float, max_bytes: int) -> tuple[int, Any]:
        length = 0
        if self.shared is not None and self.shm_ready:
            length = proto.write_ipc_into(self.shared[0].buffer, batch.schema, [batch])
        if length:
            kind, body = self.exchange(
                proto.CALL_SHM, proto.LENGTH.pack(length), timeout_s, max_bytes
            )
        else:
            kind, body = self.exchange(
                proto.CALL, proto.to_ipc(batch.schema, [batch]), timeout_s, max_bytes
            )
        if kind != proto.RESULT_SHM:
            return kind, body
        assert self.shared is not None
        if len(body) != proto.LENGTH.size:
            return proto.RESULT_SHM, body  # not RESULT: the caller reports a broken protocol
        (n,) = proto.LENGTH.unpack(body)
        if n > self.shared[1].size or n > max_bytes:
            raise _Oversized(n)
        # copied out: the worker could change the region after the result was checked
        return proto.RESULT, proto.copy_out(self.shared[1].buffer, n)

    def _hold_cpu(self) -> set[int] | None:
        """Bind the worker's processes and, for this call, the calling thread to the CPU the
        thread is on; returns the thread's affinity to put back (``None``: nothing was bound).

        Why: a call is two wake-ups (the request, the result). Between two CPUs, each is an
        inter-processor interrupt, and on a virtual machine an idle vCPU's wake-up goes
        through the hypervisor: a pipe round trip between two processes measured 63 µs here
        (2 vCPUs), against 5.5 µs with both on one CPU. The call is synchronous (the thread
        waits for the worker), so one CPU loses nothing; the worker is bound again only when
        the caller's CPU changed. A system that refuses an affinity (a cpuset) turns this off
        for the worker."""
        cpu = _current_cpu()
        if cpu < 0:
            return None
        try:
            if cpu != self._cpu:
                if not self._pids:
                    self._pids = self.pids()
                for pid in self._pids:
                    os.sched_setaffinity(pid, (cpu,))
                self._cpu = cpu
            held = os.sched_getaffinity(0)
            os.sched_setaffinity(0, (cpu,))
        except OSError:
            self.same_cpu = False
            return None
        return held

    def exchange(
        self, kind: int, payload: Any, timeout_s: float, max_bytes: int
    ) -> tuple[int, bytearray]:
        """Send one frame, read the answer (at most ``max_bytes``) within ``timeout_s`` s."""
        try:
            proto.write_frame(self.wfd, kind, payload)
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerDied(str(exc)) from None
        deadline = time.monotonic() + timeout_s
        header = self._read(proto.FRAME.size, deadline)
        answer, length = proto.FRAME.unpack(header)
        if length > max_bytes:
            raise _Oversized(length)
        return answer, self._read(length, deadline)

    def _read(self, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        poller = select.poll()
        poller.register(self.rfd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Deadline
            if not poller.poll(left * 1000):
                raise _Deadline
            k = os.readv(self.rfd, [view[got:]])
            if k == 0:
                raise _WorkerDied("end of its output")
            got += k
        return buf

    def died(self) -> str:
        """How the worker ended (after a kill or an end of output)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        tail = f"; its last output: {self.stderr_tail[-1]}" if self.stderr_tail else ""
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}{tail}"
        if code > 128 and code - 128 in signal.valid_signals():  # bwrap: 128 + the signal
            return f"killed by signal {signal.Signals(code - 128).name}{tail}"
        return f"exited with status {code}{tail}"

    def pids(self) -> list[int]:
        """This worker's process and its descendants (bwrap's and the Python worker's pids)."""
        return [self.proc.pid, *_descendants(self.proc.pid)]

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._drain.join(timeout=2)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


_libc = ctypes.CDLL(None, use_errno=True)
_sched_getcpu = getattr(_libc, "sched_getcpu", None)


def _current_cpu() -> int:
    """The CPU the calling thread runs on (glibc's ``sched_getcpu``), -1 where unknown."""
    return int(_sched_getcpu()) if _sched_getcpu is not None else -1


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children[ppid].append(int(entry.name))
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _tmp_binds(paths: Sequence[str]) -> list[str]:
    """bwrap arguments that bind the ``paths`` under ``/tmp`` (the interpreter's venv, the
    package: a checkout or CI clone in ``/tmp``) back, read-only, over the sandbox's private
    ``/tmp``; outermost first, a path inside one already bound is left out."""
    under: set[str] = set()
    for path in paths:
        for candidate in (os.path.abspath(path), os.path.realpath(path)):
            if candidate.startswith("/tmp/") and os.path.isdir(candidate):
                under.add(candidate)
    args: list[str] = []
    bound: list[str] = []
    made: set[str] = set()
    for path in sorted(under):
        if any(path == b or path.startswith(b + "/") for b in bound):
            continue
        parent = Path(path).parent
        for step in reversed([parent, *parent.parents]):  # bwrap would make them 0700
            if str(step).startswith("/tmp/") and str(step) not in made:
                args += ["--perms", "0755", "--dir", str(step)]
                made.add(str(step))
        args += ["--ro-bind", path, path]
        bound.append(path)
    return args


def _reachable(paths: Sequence[str]) -> list[str]:
    """bwrap arguments that let uid 65534 reach ``paths``: every directory on the way that
    others cannot traverse becomes an empty tmpfs with the next step bound back (read-only)."""
    args: list[str] = []
    masked: set[str] = set()
    bound: set[str] = set()
    for path in sorted(set(paths)):
        current = Path("/")
        for part in Path(path).parts[1:]:
            child = current / part
            try:
                mode = current.stat().st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH and str(child) not in bound:
                if str(current) not in masked:
                    args += ["--tmpfs", str(current)]
                    masked.add(str(current))
                if child.exists():
                    args += ["--ro-bind", str(child), str(child)]
                    bound.add(str(child))
            current = child
    return args


def validate_untrusted(batch: pa.RecordBatch) -> None:
    """Check every buffer of ``batch`` (read from a worker's IPC stream) before this process
    touches its values: a worker is never trusted, and Arrow's IPC reader checks only the
    buffers' sizes, not what they hold, so a string column's offsets could point anywhere in
    this process's memory.

    The check is Arrow's full validation (offsets non-decreasing and inside the data buffer,
    dictionary indices in range, union type codes, nested children, UTF-8 of string values).
    Strings (the common result) take a faster path with the same guarantees: the offsets are
    validated on a ``binary`` view, then the UTF-8 check is one pass over the data buffer when
    it is all ASCII (any slice of ASCII is valid UTF-8); otherwise the full per-value check.

    Raises:
        pa.ArrowInvalid: a buffer breaks the Arrow format (the message says which).
    """
    for column in batch.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column.validate()  # the buffers' presence and sizes (offsets then readable)
            _check_offsets(column)
            data = column.buffers()[2]
            if data is None or data.size == 0 or _all_ascii(data):
                continue
        column.validate(full=True)


def _check_offsets(column: pa.Array[Any]) -> None:
    """What Arrow's full validation checks of a (large) string column's offsets, in numpy:
    the ``len + 1`` offsets from the array's offset are non-decreasing, the first is at least
    0 and the last at most the data buffer's size. Call after the structural
    ``validate()``, which checks that the offsets buffer holds them.

    Raises:
        pa.ArrowInvalid: an offset out of order or out of the data buffer (naming which).
    """
    _, offsets_buffer, data = column.buffers()
    width = np.dtype(np.int32 if pa.types.is_string(column.type) else np.int64)
    if offsets_buffer is None:
        if len(column) == 0:
            return
        raise pa.ArrowInvalid("a string column without an offsets buffer")
    count = column.offset + len(column) + 1
    offsets = np.frombuffer(memoryview(offsets_buffer), dtype=width, count=count)
    offsets = offsets[column.offset :]
    size = data.size if data is not None else 0
    ordered = len(offsets) < 2 or not bool((offsets[1:] < offsets[:-1]).any())
    low, high = (int(offsets[0]), int(offsets[-1])) if ordered else (
        int(offsets.min()), int(offsets.max())
    )
    if low < 0 or high > size:
        raise pa.ArrowInvalid(
            f"string offsets out of bounds: {low}..{high} against a data buffer of {size} bytes"
        )
    if not ordered:
        at = int(np.flatnonzero(offsets[1:] < offsets[:-1])[0])
        raise pa.ArrowInvalid(
            f"string offsets out of order: value {at} ends at {int(offsets[at + 1])}, before "
            f"it starts ({int(offsets[at])})"
        )


def _all_ascii(data: pa.Buffer) -> bool:
    """Whether every byte of ``data`` is below 0x80 (numpy's vectorized ``max``)."""
    view = np.frombuffer(memoryview(data), dtype=np.uint8)
    return bool(view.max(initial=0) < 0x80)


class _PythonFunction:
    """What scalar and table functions share: the definition checks, the pool, the retry.

    Counters (for ``pipelines status`` and the metrics): ``calls`` (batches called),
    ``retries`` (batches retried after their worker died), ``restarts`` (workers thrown away:
    died, past the deadline, out of memory); ``seccomp``: whether the last worker started
    installed its seccomp filter.
    """

    def __init__(self, spec: FunctionSpec, config: SandboxConfig) -> None:
        if spec.language != "python":
            raise FunctionDefinitionError(
                f"function {spec.name}: language {spec.language}, not python"
            )
        if config.pool_size < 1 or not 0 <= config.min_workers <= config.pool_size:
            raise FunctionDefinitionError(
                f"function {spec.name}: pool_size must be >= 1 and min_workers in 0..pool_size"
            )
        self._spec = spec
        self._config = config
        self._handler = spec.handler or spec.name
        self._vectorized = _is_vectorized(spec)
        if spec.kind == "table" and not self._vectorized:
            raise FunctionDefinitionError(
                f"function {spec.name}: vectorized = 'false' is for scalar functions; a table "
                "function's handler always gets the whole batch"
            )
        self._returns = _returns_schema(spec)
        self._args = _args_schema(spec)
        try:
            self._code = spec.code.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FunctionDefinitionError(
                f"function {spec.name}: its code is not UTF-8: {exc}"
            ) from None
        try:
            compile(self._code, proto.CODE_FILENAME.format(name=spec.name), "exec")
        except SyntaxError as exc:
            raise FunctionDefinitionError(
                f"function {spec.name}: syntax error at "
                f"{proto.code_line(exc.lineno or 1, spec.first_code_line)}: {exc.msg}"
            ) from None
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0
        self._closed = False
        self.calls = 0
        self.retries = 0
        self.restarts = 0
        self.seccomp = False
        self._refills: list[threading.Thread] = []
        self._runner: proto.Runner | None = None
        if config.in_process:
            self._runner = self._load_in_process()
            return
        self._argv, self._env, self._sandboxed = self._command()
        started: list[_Worker] = []
        try:
            for _ in range(config.min_workers):
                started.append(self._start())
        except BaseException:
            for worker in started:
                worker.kill()
            raise
        with self._lock:
            self._idle.extend(started)

    @property
    def spec(self) -> FunctionSpec:
        return self._spec

    @property
    def sandboxed(self) -> bool:
        """Whether the workers run in bubblewrap (``False``: plain subprocess or in-process)."""
        return not self._config.in_process and self._sandboxed

    def _load_in_process(self) -> proto.Runner:
        try:
            return proto.Runner(
                name=self._spec.name,
                kind=self._spec.kind,
                code=self._code,
                handler=self._handler,
                vectorized=self._vectorized,
                line=self._spec.first_code_line,
                args=self._args,
                returns=self._returns,
            )
        except proto.Problem as problem:
            raise FunctionDefinitionError(problem.message) from None

    def _command(self) -> tuple[list[str], dict[str, str], bool]:
        package_root = str(Path(proto.__file__).resolve().parents[2])
        pythonpath = [
            package_root,
            *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
        ]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONPATH": os.pathsep.join(pythonpath),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        worker = [sys.executable, "-s", "-m", "flight_serve.functions.worker"]
        bwrap = bwrap_path(self._config)
        if bwrap is None:
            if not self._config.unsandboxed:
                raise FunctionDefinitionError(
                    f"function {self._spec.name}: Python functions run in a bubblewrap sandbox and "
                    "bwrap is not installed (Debian: apt-get install bubblewrap); to run the code "
                    "NOT sandboxed, allow it explicitly (--allow-unsandboxed-python)"
                )
            return worker, env, False
        argv = [bwrap, "--ro-bind", "/", "/", "--die-with-parent", "--new-session"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/tmp"]
        argv += ["--clearenv", "--chdir", "/tmp"]
        needed = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
        needed += [p for p in (*sys.path, *pythonpath) if p and os.path.isdir(p)]
        argv += _tmp_binds(needed)  # an interpreter or package under /tmp (a checkout there)
        for hidden in self._config.hidden_paths:
            if os.path.isdir(hidden):
                argv += ["--tmpfs", os.path.realpath(hidden)]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        uid = str(_SANDBOX_UID)
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise FunctionDefinitionError(
                    f"function {self._spec.name}: running as root, the sandbox needs setpriv "
                    "(util-linux) to drop to uid 65534, and it is not installed"
                )
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
            argv += ["--unshare-cgroup-try"]
            needed += [os.path.realpath(sys.executable), setpriv]
            # (paths under /tmp are bound by _tmp_binds, through 0755 directories of its own)
            argv += _reachable(
                [r for r in map(os.path.realpath, needed) if not r.startswith("/tmp/")]
            )
            argv += ["--cap-drop", "ALL"]
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
                argv += ["--cap-add", cap]
            argv += ["--", setpriv, "--reuid", uid, "--regid", uid, "--clear-groups"]
            argv += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        else:
            argv += ["--unshare-all", "--unshare-user", "--uid", uid, "--gid", uid]
            argv += ["--cap-drop", "ALL", "--"]
        return argv + worker, env, True

    def _start(self) -> _Worker:
        shared = self._config.shared_memory_bytes if self._config.shared_memory else 0
        worker = _Worker(
            self._argv, self._env, self._spec.name, shared, same_cpu=self._config.same_cpu
        )
        hello = {
            "name": self._spec.name,
            "kind": self._spec.kind,
            "code": self._code,
            "handler": self._handler,
            "vectorized": self._vectorized,
            "line": self._spec.first_code_line,
            "args": proto.schema_to_text(self._args),
            "returns": proto.schema_to_text(self._returns),
            "memory_limit_bytes": self._config.memory_limit_bytes,
            "cpu_limit_s": self._config.cpu_limit_s,
            "seccomp": self._sandboxed,
            "shm": worker.shared_hello(),
        }
        timeout = self._config.start_timeout.total_seconds()
        try:
            kind, body = worker.exchange(proto.HELLO, json.dumps(hello).encode(), timeout, 1 << 20)
        except _Oversized:
            worker.kill()
            raise FunctionWorkerError(
                f"function {self._spec.name}: its worker broke the protocol"
            ) from None
        except _Deadline:
            worker.kill()
            raise FunctionWorkerError(
                f"function {self._spec.name}: its worker did not start and load the code "
                f"within {timeout:g} s"
            ) from None
        except _WorkerDied:
            worker.kill()
            raise FunctionWorkerError(
                f"function {self._spec.name}: its worker failed to start: {worker.died()}"
            ) from None
        if kind == proto.ERROR:
            worker.kill()
            raise FunctionDefinitionError(_error_frame(self._spec.name, body)[1])
        try:
            ready = json.loads(bytes(body)) if kind == proto.READY else None
        except ValueError:
            ready = None
        if not isinstance(ready, dict):
            worker.kill()
            raise FunctionWorkerError(f"function {self._spec.name}: its worker broke the protocol")
        self.seccomp = bool(ready.get("seccomp"))
        worker.shm_ready = bool(ready.get("shm")) and worker.shared is not None
        with self._lock:
            self._count += 1
        return worker

    def _acquire(self) -> _Worker:
        with self._lock:
            while True:
                if self._closed:
                    raise FunctionWorkerError(f"function {self._spec.name} is closed")
                if self._idle:
                    return self._idle.pop()
                if self._count < self._config.pool_size:
                    self._count += 1  # reserved; _start counts it again
                    break
                self._lock.wait()
        try:
            worker = self._start()
        finally:
            with self._lock:
                self._count -= 1
                self._lock.notify()
        return worker

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                self._count -= 1
                worker.kill()
            else:
                self._idle.append(worker)
            self._lock.notify()

    def _discard(self, worker: _Worker) -> None:
        """Throw ``worker`` away; below ``min_workers``, start its replacement in the
        background (the next call then finds a warm worker)."""
        worker.kill()
        with self._lock:
            self._count -= 1
            self.restarts += 1
            refill = not self._closed and self._count < self._config.min_workers
            if refill:
                self._count += 1  # reserved for the replacement
            self._lock.notify()
        if refill:
            thread = threading.Thread(
                target=self._refill, name=f"function-{self._spec.name}-restart", daemon=True
            )
            self._refills.append(thread)
            thread.start()

    def _refill(self) -> None:
        worker: _Worker | None = None
        try:
            worker = self._start()
        except (FunctionWorkerError, FunctionDefinitionError):
            pass  # the next call starts one itself and reports why it cannot
        finally:
            with self._lock:
                self._count -= 1
                self._lock.notify()
        if worker is not None:
            self._release(worker)

    def worker_pids(self) -> list[list[int]]:
        """The pids of each idle worker (bwrap first, then its descendants: the Python worker
        last). For operations and tests (killing a worker)."""
        with self._lock:
            return [w.pids() for w in self._idle]

    def _call(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """The result batches of one call, with the retry on a dead worker."""
        with self._lock:
            self.calls += 1
        if self._runner is not None:
            try:
                if self._spec.kind == "scalar":
                    result = self._runner.call_scalar(batch)
                    return [pa.record_batch([result], schema=self._returns)]
                return self._runner.call_table(batch)
            except proto.Problem as problem:
                raise FunctionCallError(problem.message) from None
        deadline_s = self._config.deadline.total_seconds()
        how = ""
        for attempt in range(2):
            worker = self._acquire()
            try:
                kind, body = worker.call(batch, deadline_s, self._config.memory_limit_bytes)
            except _Oversized as exc:
                self._discard(worker)
                raise FunctionCallError(
                    f"function {self._spec.name}: its worker announced an answer of {exc.length} "
                    f"bytes, more than its memory limit of {self._config.memory_limit_bytes} "
                    "bytes; the worker was replaced"
                ) from None
            except _Deadline:
                self._discard(worker)
                raise FunctionCallError(
                    f"function {self._spec.name} ran past its deadline of {deadline_s:g} s"
                    f"{limit_note(self._spec, 'deadline')} on a batch of {batch.num_rows} rows; "
                    "its worker was killed"
                ) from None
            except _WorkerDied:
                how = worker.died()
                self._discard(worker)
                if attempt == 0:
                    with self._lock:
                        self.retries += 1
                continue
            except BaseException:
                self._discard(worker)
                raise
            if kind == proto.ERROR:
                try:
                    error_kind, message = _error_frame(self._spec.name, body)
                except FunctionWorkerError:
                    self._discard(worker)
                    raise
                if error_kind == "memory":
                    self._discard(worker)
                    raise FunctionCallError(
                        f"{message} (memory limit {self._memory_text()}; its worker was replaced)"
                    )
                self._release(worker)
                raise FunctionCallError(message)
            if kind != proto.RESULT:
                self._discard(worker)
                raise FunctionWorkerError(
                    f"function {self._spec.name}: its worker broke the protocol"
                )
            try:
                checked = self._check(body, batch.num_rows)
            except FunctionWorkerError:  # an invalid result: the worker is broken or hostile
                self._discard(worker)
                raise
            except BaseException:
                self._release(worker)
                raise
            self._release(worker)
            return checked
        raise FunctionCallError(
            f"function {self._spec.name}: its worker died on the same batch twice (last: {how}); "
            f"the memory limit is {self._memory_text()}, the CPU limit "
            f"{self._config.cpu_limit_s} s"
        )

    def _memory_text(self) -> str:
        """``128 MiB = 134217728 bytes (WITH memory_limit = '128MiB')`` (the option when
        given)."""
        limit = self._config.memory_limit_bytes
        human = format_bytes(limit)
        exact = human if human.endswith(" bytes") else f"{human} = {limit} bytes"
        return exact + limit_note(self._spec, "memory_limit")

    def _check(self, body: pa.Buffer | bytearray, n: int) -> list[pa.RecordBatch]:
        """The worker's answer, checked again here (a worker is never trusted): every buffer
        validated (:func:`validate_untrusted`; FunctionWorkerError), then the type and length
        (FunctionCallError)."""
        try:
            schema, batches = proto.from_ipc(body)
            for item in batches:
                validate_untrusted(item)
        except (pa.ArrowInvalid, OSError) as exc:
            raise FunctionWorkerError(
                f"function {self._spec.name}: unreadable result: {exc}"
            ) from None
        try:
            if self._spec.kind == "scalar":
                column = (
                    batches[0].column(0)
                    if len(batches) == 1
                    else pa.chunked_array([b.column(0) for b in batches], schema.field(0).type)
                )
                proto.check_scalar_result(self._spec.name, column, self._returns.field(0).type, n)
            else:
                for item in batches:
                    proto.check_table_result(self._spec.name, item, self._returns)
        except proto.Problem as problem:
            raise FunctionCallError(problem.message) from None
        return batches

    def close(self) -> None:
        """Stop every worker; idempotent. Calls after it raise FunctionWorkerError."""
        with self._lock:
            self._closed = True
            refills, self._refills = self._refills, []
        for thread in refills:  # a replacement being started is stopped when it is ready
            thread.join(timeout=self._config.start_timeout.total_seconds())
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._lock.notify_all()
        for worker in idle:
            worker.kill()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PythonScalarFunction(_PythonFunction):
    """A scalar Python function (:class:`~flight_serve.functions.base.ScalarFunction`)."""

    def call(self, args: Sequence[pa.Array[Any]]) -> pa.Array[Any]:
        """The handler's result for one batch: ``args`` one array per declared argument, all of
        length ``n`` and of the declared types; returns ``n`` values of the return type."""
        if len(args) != len(self._args):
            raise FunctionCallError(
                f"function {self._spec.name} takes {len(self._args)} argument(s), got {len(args)}"
            )
        try:
            batch = pa.RecordBatch.from_arrays(list(args), schema=self._args)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise FunctionCallError(f"function {self._spec.name}: bad arguments: {exc}") from None
        batches = self._call(batch)
        column = batches[0].column(0)
        return column


class PythonTableFunction(_PythonFunction):
    """A table Python function (:class:`~flight_serve.functions.base.TableFunction`)."""

    def call_table(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """The batches the handler returns or yields for ``batch`` (each of ``spec.returns``)."""
        return iter(self._call(batch))
