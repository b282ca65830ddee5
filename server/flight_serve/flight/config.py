"""One server's settings as one frozen value: :class:`ServerConfig`, what
:func:`~flight_serve.flight.server.start_server` and
:func:`~flight_serve.flight.server.serve_forever` (``flight-serve serve``) take.

The fields are the ``flight-serve serve`` flags (docs/operations.md) plus, for a server embedded
in a program or a test, the objects those flags would make: ``users`` and ``tokens`` (instead of
the files), a shared :class:`~flight_serve.flight.ops.limits.MemoryBudget` (instead of its size)
and a :class:`~flight_serve.flight.ops.metrics.Metrics` registry.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from flight_serve.flight.ops.limits import (
    DEFAULT_MAX_STREAMS,
    DEFAULT_MEMORY_WAIT_S,
    DEFAULT_QUERY_WORK_BYTES,
    MemoryBudget,
)
from flight_serve.flight.ops.roles import TlsFiles, TokenGrant
from flight_serve.functions.python import SandboxConfig
from flight_serve.store import FsyncMode

if TYPE_CHECKING:
    from flight_serve.flight.ops.metrics import Metrics

__all__ = ["DEFAULT_DRAIN_TIMEOUT_S", "DEFAULT_MAX_BATCH_BYTES", "ServerConfig"]

#: Largest DoPut batch accepted, in bytes of ``RecordBatch.nbytes`` (64 MiB).
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024

#: How long ``flight-serve serve`` waits for calls in flight after SIGTERM (seconds).
DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServerConfig:
    """Every setting of one flight-serve server.

    Attributes:
        data_dir: the store's data directory (created if missing).
        host: the address to listen on; ``port`` 0 picks a free port.
        fsync: the store's durability mode (``batch``, ``always`` or ``never``).
        pipelines: run submitted pipelines (the ``pipeline.*`` actions) and resume the running
            ones at start.
        users / users_file: user name -> password, or a file of ``user:password`` lines
            (:func:`~flight_serve.flight.ops.auth.load_users_file`); every call then needs them.
        tokens / tokens_file: bearer tokens with roles, or their file
            (:func:`~flight_serve.flight.ops.roles.load_tokens_file`).
        tls: the server's certificate and key (and a client CA for mutual TLS).
        insecure_allow_remote: ``serve_forever`` listens beyond loopback without TLS and
            credentials (it refuses to otherwise).
        max_streams: DoGet / DoPut / DoExchange calls running at once; more are UNAVAILABLE.
        max_batch_bytes: largest DoPut batch (``RecordBatch.nbytes``); above is INVALID_ARGUMENT.
        retention_bytes / retention_age: per-stream retention limits of the store (``None``:
            keep everything).
        memory_budget / memory_budget_bytes: the memory budget shared by queries, DoPut batches
            and window state, as an object or as its size in bytes (waiting up to
            ``memory_wait_s`` seconds for room); ``None``: no budget.
        statement_timeout_s: seconds a SQL query or Flight SQL statement may run (``None``: no
            limit); DEADLINE_EXCEEDED after it.
        query_work_bytes: DataFusion's memory pool per query under a budget, bytes.
        metrics: the Prometheus registry the server reports to (``serve_forever`` makes one).
        health_port / metrics_port: ``serve_forever``'s gRPC health and ``/metrics`` ports
            (``None``: the Flight port + 1 / + 2, or a free port when ``port`` is 0).
        drain_timeout_s: how long ``serve_forever`` waits for calls in flight after SIGTERM.
        allow_unsandboxed_python: pipelines' ``LANGUAGE python`` functions may run as plain
            subprocesses, **not sandboxed**, when bwrap is missing (``serve
            --allow-unsandboxed-python``); otherwise they are refused (see
            :meth:`python_sandbox`).
        ray_address: a Ray cluster where submitted pipelines whose parallelism is above 1 run
            as detached jobs (``serve --ray-address``; ``None``: every pipeline runs in the
            server; docs/scaling.md).

    Raises:
        ValueError: both ``users`` and ``users_file``, both ``tokens`` and ``tokens_file``, or
            both ``memory_budget`` and ``memory_budget_bytes`` (the message names them).
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    fsync: FsyncMode = "batch"
    pipelines: bool = True
    users: Mapping[str, str] | None = None
    users_file: Path | None = None
    tokens: Mapping[str, TokenGrant] | None = None
    tokens_file: Path | None = None
    tls: TlsFiles | None = None
    insecure_allow_remote: bool = False
    max_streams: int = DEFAULT_MAX_STREAMS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    retention_bytes: int | None = None
    retention_age: timedelta | None = None
    memory_budget: MemoryBudget | None = None
    memory_budget_bytes: int | None = None
    memory_wait_s: float = DEFAULT_MEMORY_WAIT_S
    statement_timeout_s: float | None = None
    query_work_bytes: int = DEFAULT_QUERY_WORK_BYTES
    metrics: Metrics | None = None
    health_port: int | None = None
    metrics_port: int | None = None
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    allow_unsandboxed_python: bool = False
    ray_address: str | None = None

    def python_sandbox(self) -> SandboxConfig:
        """The sandbox of this server's Python functions (docs/python-functions.md).

        ``hidden_paths`` (each an empty tmpfs inside the sandbox): the data directory and the
        directories of the TLS key, the tokens file and the users file, resolved; a directory
        that holds the Python interpreter or the flight_serve package is left visible (the
        worker could not start without it). ``unsandboxed``: :attr:`allow_unsandboxed_python`.
        """
        candidates = [Path(self.data_dir)]
        for file in (
            self.tls.key if self.tls is not None else None,
            self.tokens_file,
            self.users_file,
        ):
            if file is not None:
                candidates.append(Path(file).parent)
        needed = [
            resolved
            for p in (sys.prefix, sys.base_prefix, sys.executable, Path(__file__).parents[1])
            for resolved in (Path(p).absolute(), Path(p).resolve())
        ]
        hidden: list[str] = []
        for candidate in candidates:
            path = candidate.resolve()
            if any(n == path or path in n.parents for n in needed):
                continue
            if str(path) not in hidden:
                hidden.append(str(path))
        return SandboxConfig(
            unsandboxed=self.allow_unsandboxed_python, hidden_paths=tuple(hidden)
        )

    def __post_init__(self) -> None:
        for given, other in (
            ("users", "users_file"),
            ("tokens", "tokens_file"),
            ("memory_budget", "memory_budget_bytes"),
        ):
            if getattr(self, given) is not None and getattr(self, other) is not None:
                raise ValueError(f"ServerConfig: give {given} or {other}, not both")
