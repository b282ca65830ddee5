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

import bisect
import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datafusion
import pyarrow as pa

from flight_serve.errors import FlightServeError, FunctionCallError, StorageError

if TYPE_CHECKING:  # cold start: a pipeline without functions loads none of flight_serve.functions
    from flight_serve.functions.base import FunctionSpec, ScalarFunction, TableFunction
    from flight_serve.functions.python import SandboxConfig

__all__ = [
    "CALL_SECONDS_BUCKETS",
    "CodeStore",
    "FunctionSet",
    "FunctionStats",
    "code_digests",
    "explain_lines",
]


#: the call-time histogram's upper bounds, seconds (Prometheus ``le``): 100 µs .. 30 s
CALL_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class FunctionStats:
    """Calls of one function since the run started: ``calls`` (batches), ``rows`` (rows in),
    ``errors`` (failed calls), the call time's p99 over the last :attr:`WINDOW` calls, and a
    histogram of every call's time (:data:`CALL_SECONDS_BUCKETS`; the server's ``/metrics``).
    Thread-safe (DataFusion may call from several threads)."""

    WINDOW = 1024

    def __init__(self, spec: FunctionSpec) -> None:
        self.spec = spec
        self.calls = 0
        self.rows = 0
        self.errors = 0
        self.seconds = 0.0
        #: calls per bucket (not cumulative), the last one past every bound (+Inf)
        self.bucket_counts = [0] * (len(CALL_SECONDS_BUCKETS) + 1)
        self._times: deque[float] = deque(maxlen=self.WINDOW)
        self._lock = threading.Lock()

    def record(self, seconds: float, rows: int, *, failed: bool) -> None:
        """One call of ``rows`` rows that took ``seconds`` (``failed``: it raised)."""
        bucket = bisect.bisect_left(CALL_SECONDS_BUCKETS, seconds)  # the first le >= seconds
        with self._lock:
            self.calls += 1
            self.rows += rows
            self.errors += int(failed)
            self.seconds += seconds
            self.bucket_counts[bucket] += 1
            self._times.append(seconds)

    def as_dict(self) -> dict[str, Any]:
        """``{language, kind, sha256 (12 hex), calls, rows, errors, p99_ms, call_seconds}``
        (``p99_ms`` is ``None`` before the first call; ``call_seconds`` is the histogram:
        ``{"sum": seconds, "buckets": {"<le>": calls at or under it, cumulative, …, "+Inf":
        calls}}``)."""
        with self._lock:
            times = sorted(self._times)
            counts = list(self.bucket_counts)
            calls, rows, errors, total = self.calls, self.rows, self.errors, self.seconds
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else None
        buckets: dict[str, int] = {}
        running = 0
        for bound, count in zip((*map(repr, CALL_SECONDS_BUCKETS), "+Inf"), counts, strict=True):
            running += count
            buckets[bound] = running
        return {
            "language": self.spec.language,
            "kind": self.spec.kind,
            "sha256": self.spec.digest[:12],
            "calls": calls,
            "rows": rows,
            "errors": errors,
            "p99_ms": round(p99 * 1000, 3) if p99 is not None else None,
            "call_seconds": {"sum": total, "buckets": buckets},
        }


class FunctionSet:
    """The user functions of one pipeline run.

    Args:
        specs: the plan's functions by name (``PipelinePlan.user_functions``).
        run: make them with their runners (``False``, for ``explain``: the UDFs are registered
            with the declared types and return nulls; no code is loaded or run).
        python_runner: the runner of ``LANGUAGE python`` (``None``: the registry's default,
            :data:`~flight_serve.functions.registry.PYTHON_RUNNER_ENV` or the sandbox).
        sandbox: the sandbox of the ``python`` runner (the host's hidden paths, whether
            running without bwrap is allowed; ``None``: the defaults).

    Raises:
        FunctionDefinitionError: a runner refuses a function (what was made is closed first).
    """

    def __init__(
        self,
        specs: Mapping[str, FunctionSpec],
        *,
        run: bool = True,
        python_runner: str | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        self.specs = dict(specs)
        self.scalars: dict[str, ScalarFunction] = {}
        self.tables: dict[str, TableFunction] = {}
        #: the function error of the failing call (DataFusion may call from its own threads)
        self._failure: FlightServeError | None = None
        self._closed = False
        if run and self.specs:
            from flight_serve.functions.base import ScalarFunction, TableFunction
            from flight_serve.functions.registry import create_function

            try:
                for spec in self.specs.values():
                    made = create_function(spec, python_runner=python_runner, sandbox=sandbox)
                    if isinstance(made, ScalarFunction) and spec.kind == "scalar":
                        self.scalars[spec.name] = made
                    elif isinstance(made, TableFunction):
                        self.tables[spec.name] = made
            except BaseException:
                self.close()
                raise
        self.stats = {name: FunctionStats(spec) for name, spec in self.specs.items()}
        self.udfs = [self._udf(spec) for spec in self.specs.values() if spec.kind == "scalar"]

    def _udf(self, spec: FunctionSpec) -> datafusion.ScalarUDF:
        assert isinstance(spec.returns, pa.DataType)
        returns: pa.DataType = spec.returns
        function = self.scalars.get(spec.name)
        stats = self.stats[spec.name]

        def call(*args: pa.Array[Any]) -> pa.Array[Any]:
            if function is None:  # explain: never run on data
                return pa.array([None] * (len(args[0]) if args else 1), type=returns)
            rows = len(args[0]) if args else 0
            if args and not rows:  # an empty batch (DataFusion sends some): no call, no count
                return pa.array([], type=returns)
            started = time.perf_counter()
            try:
                result = function.call(list(args))
            except FlightServeError as exc:
                stats.record(time.perf_counter() - started, rows, failed=True)
                self._failure = exc
                raise
            except Exception as exc:  # a runner's bug: still name the function
                stats.record(time.perf_counter() - started, rows, failed=True)
                error = FunctionCallError(f"FUNCTION {spec.name}: {type(exc).__name__}: {exc}")
                self._failure = error
                raise error from exc
            stats.record(time.perf_counter() - started, rows, failed=False)
            return result

        return datafusion.udf(call, list(spec.arg_types), returns, "immutable", name=spec.name)

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per function: :meth:`FunctionStats.as_dict` (``pipeline.status``'s
        ``"functions"``)."""
        return {name: stats.as_dict() for name, stats in self.stats.items()}

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


def code_digests(specs: Mapping[str, FunctionSpec]) -> tuple[str, ...]:
    """``<name>:<sha256>`` of every function, sorted by name: what the pipeline's identity
    (its checkpoints' fingerprint) adds for its code (empty without functions)."""
    return tuple(f"{name}:{specs[name].digest}" for name in sorted(specs))


class CodeStore:
    """The code of submitted pipelines' functions, content-addressed in the data directory.

    ``<data-dir>/functions/<sha256>`` holds one function's code (Python text or wasm bytes);
    ``<data-dir>/functions/pipelines/<pipeline id>.json`` maps each ``USING '<file>'`` of that
    pipeline, as written, to the SHA-256 of the bytes read at submit. A restarted server reads
    the code from here, so the files (and the client) need not exist any more.

    Raises (every method): :class:`~flight_serve.errors.StorageError` when the directory
    cannot be written or a stored file is missing or does not match its hash.
    """

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "functions"

    def save(self, pipeline_id: str, files: Mapping[str, bytes]) -> None:
        """Store ``files`` (``USING`` path as written -> bytes) for ``pipeline_id``; each
        file is written then renamed, so a crash leaves whole files only."""
        index = {}
        try:
            (self.root / "pipelines").mkdir(parents=True, exist_ok=True)
            for using, code in files.items():
                digest = hashlib.sha256(code).hexdigest()
                _write_atomic(self.root / digest, code)
                index[using] = digest
            _write_atomic(
                self.root / "pipelines" / f"{pipeline_id}.json",
                json.dumps(index, sort_keys=True).encode(),
            )
        except OSError as exc:
            raise StorageError(f"cannot store the functions' code in {self.root}: {exc}") from exc

    def load(self, pipeline_id: str) -> dict[str, bytes] | None:
        """The stored ``USING`` files of ``pipeline_id`` (``None``: nothing stored for it)."""
        index_path = self.root / "pipelines" / f"{pipeline_id}.json"
        try:
            index = json.loads(index_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot read {index_path}: {exc}") from exc
        files: dict[str, bytes] = {}
        for using, digest in index.items():
            path = self.root / str(digest)
            try:
                code = path.read_bytes()
            except OSError as exc:
                raise StorageError(f"the stored code of USING {using!r} is gone: {exc}") from exc
            if hashlib.sha256(code).hexdigest() != digest:
                raise StorageError(f"{path}: the stored code of USING {using!r} is corrupt")
            files[str(using)] = code
        return files


def _write_atomic(path: Path, data: bytes) -> None:
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
