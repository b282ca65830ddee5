"""The durable registry of a server's pipelines: one SQLite file in the data directory.

``<data-dir>/pipelines.sqlite`` holds, per pipeline, what it is (id, name, SQL text, where its
relative paths start), its state (``running``, ``failed``, ``cancelled``, ``finished``), its last
error, retry attempts, its last checkpoint and the metrics taken with it; and a log of what
happened to it (submitted, resumed, retried, failed, …). Every change is committed (SQLite WAL,
``synchronous = FULL``) before the call returns, so a pipeline that was acknowledged as submitted
is found again after a crash, and a server restart resumes every ``running`` pipeline.

Thread-safe: one connection guarded by a lock.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from flight_serve.errors import NotFoundError, StorageError

__all__ = ["LogLine", "PipelineRecord", "PipelineState", "PipelineVersion", "Registry"]

PipelineState = Literal["running", "failed", "cancelled", "finished"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pipelines (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    sql TEXT NOT NULL,
    base_dir TEXT NOT NULL,
    output_dir TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    last_checkpoint TEXT,
    metrics TEXT,
    last_error_kind TEXT
);
CREATE TABLE IF NOT EXISTS pipeline_logs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    ts TEXT NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS pipeline_logs_by_pipeline ON pipeline_logs (pipeline, seq);
CREATE TABLE IF NOT EXISTS pipeline_versions (
    pipeline TEXT NOT NULL,
    version INTEGER NOT NULL,
    at TEXT NOT NULL,
    sql_sha256 TEXT NOT NULL,
    functions TEXT NOT NULL,
    changed_by TEXT,
    change TEXT NOT NULL,
    epoch INTEGER,
    PRIMARY KEY (pipeline, version)
);
"""


#: the columns :class:`PipelineRecord` is read from, in its order (named: an older registry's
#: added columns come last in ``SELECT *``)
_COLUMNS = (
    "id, name, sql, base_dir, output_dir, state, submitted_at, updated_at, attempts, "
    "last_error, last_checkpoint, metrics, last_error_kind, version, code_key, runtime, "
    "job_log_cursor"
)


def sql_digest(sql: str) -> str:
    """The SHA-256 (hex) of a pipeline's text, as ``pipelines status`` shows its versions."""
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class PipelineRecord:
    """One pipeline as the registry holds it.

    Attributes:
        id: the pipeline id.
        name: a human name (the submitted file's stem, or given).
        sql: the pipeline text.
        base_dir: where its relative source paths start.
        output_dir: where its relative sink paths start.
        state: ``running``, ``failed``, ``cancelled`` or ``finished``.
        submitted_at, updated_at: ISO 8601 UTC.
        attempts: retries in a row after failures.
        last_error: the last error's message, if any.
        last_error_kind: that error's ``{"domain", "retryable"}`` (its
            :class:`~flight_serve.errors.FlightServeError` class's; ``internal`` and not
            retryable for any other exception), or ``None``.
        last_checkpoint: ``{"epoch", "taken_at", "duration_ms", "bytes", "finished"}`` or ``None``.
        metrics: the counters taken with the last checkpoint.
        version: its version (1 at submit, one more per ``pipelines update``).
        code_key: the key of its ``USING`` files in the
            :class:`~flight_serve.pipelines.user_functions.CodeStore` (``None``: its id).
        runtime: where it runs: ``embedded`` (a thread of the server) or ``ray`` (a detached
            job on the server's Ray cluster: :mod:`~flight_serve.pipelines.distributed.jobs`).
        job_log_cursor: for a Ray pipeline, the last of its job's log lines copied into this
            log (``<coordinator start time>:<line number>``), so a restarted server copies
            none twice; ``None`` before any.
    """

    id: str
    name: str
    sql: str
    base_dir: str
    output_dir: str
    state: PipelineState
    submitted_at: str
    updated_at: str
    attempts: int
    last_error: str | None
    last_checkpoint: dict[str, Any] | None
    metrics: dict[str, Any]
    last_error_kind: dict[str, Any] | None = None
    version: int = 1
    code_key: str | None = None
    runtime: str = "embedded"
    job_log_cursor: str | None = None


@dataclass(frozen=True)
class PipelineVersion:
    """One version of a pipeline (``pipelines status``'s ``"versions"``).

    Attributes:
        version: 1 at submit, then one more per update.
        at: when it started, ISO 8601 UTC.
        sql_sha256: the SHA-256 (hex) of its text.
        functions: its user functions' code SHA-256 (hex), by function name.
        changed_by: who submitted or updated it (the caller's user name; ``None`` without
            authentication).
        change: what happened (``submitted``, ``updated from version 1 at checkpoint 7: …``).
        epoch: the checkpoint it resumed from (``None`` for version 1).
    """

    version: int
    at: str
    sql_sha256: str
    functions: dict[str, str]
    changed_by: str | None
    change: str
    epoch: int | None


@dataclass(frozen=True)
class LogLine:
    """One line of a pipeline's log."""

    seq: int
    ts: str
    level: str
    message: str


class Registry:
    """The pipelines of one data directory (see the module docstring).

    Raises:
        StorageError: the database cannot be opened or written.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(pipelines)")}
            for column, kind in (  # a registry of an older server
                ("last_error_kind", "TEXT"),
                ("version", "INTEGER NOT NULL DEFAULT 1"),
                ("code_key", "TEXT"),
                ("runtime", "TEXT NOT NULL DEFAULT 'embedded'"),
                ("job_log_cursor", "TEXT"),
            ):
                if column not in columns:
                    self._db.execute(f"ALTER TABLE pipelines ADD COLUMN {column} {kind}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the pipeline registry {path}: {exc}") from exc

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StorageError(f"pipeline registry {self.path}: {exc}") from exc

    @staticmethod
    def _record(row: tuple[Any, ...]) -> PipelineRecord:
        pid, name, sql, base, out, state, submitted, updated, attempts = row[:9]
        error, ckpt, metrics, kind, version, code_key, runtime, cursor = row[9:]
        return PipelineRecord(
            pid,
            name,
            sql,
            base,
            out,
            state,
            submitted,
            updated,
            int(attempts),
            error,
            json.loads(ckpt) if ckpt else None,
            json.loads(metrics) if metrics else {},
            json.loads(kind) if kind else None,
            int(version or 1),
            code_key,
            runtime or "embedded",
            cursor,
        )

    def add(
        self,
        pid: str,
        name: str,
        sql: str,
        base_dir: str,
        output_dir: str,
        *,
        functions: dict[str, str] | None = None,
        changed_by: str | None = None,
        runtime: str = "embedded",
    ) -> PipelineRecord:
        """Register a new ``running`` pipeline, as version 1 (``functions``: its functions'
        code SHA-256 by name; ``changed_by``: who submitted it; ``runtime``: ``embedded`` or
        ``ray``)."""
        now = _now()
        with self._lock:
            try:
                with self._db:  # one transaction: the pipeline and its version 1
                    self._db.execute("BEGIN")
                    self._db.execute(
                        "INSERT INTO pipelines (id, name, sql, base_dir, output_dir, state, "
                        "submitted_at, updated_at, runtime) "
                        "VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?)",
                        (pid, name, sql, base_dir, output_dir, now, now, runtime),
                    )
                    self._db.execute(
                        "INSERT INTO pipeline_versions VALUES (?, 1, ?, ?, ?, ?, 'submitted', NULL)",
                        (pid, now, sql_digest(sql), json.dumps(functions or {}), changed_by),
                    )
            except sqlite3.Error as exc:
                raise StorageError(f"pipeline registry {self.path}: {exc}") from exc
        return self.get(pid)

    def add_version(
        self,
        pid: str,
        sql: str,
        *,
        functions: dict[str, str],
        code_key: str | None,
        changed_by: str | None,
        change: str,
        epoch: int | None,
    ) -> PipelineRecord:
        """Make ``sql`` (with the code stored under ``code_key``) ``pid``'s next version, in
        one transaction: a crash leaves the old version or the new one, never a mix."""
        now = _now()
        with self._lock:
            try:
                with self._db:
                    self._db.execute("BEGIN")
                    version, old_sql, submitted = self._db.execute(
                        "SELECT version, sql, submitted_at FROM pipelines WHERE id = ?", (pid,)
                    ).fetchone()
                    version = int(version) + 1
                    self._db.execute(  # a pipeline of an older server: its version 1 first
                        "INSERT OR IGNORE INTO pipeline_versions VALUES "
                        "(?, 1, ?, ?, '{}', NULL, 'submitted', NULL)",
                        (pid, submitted, sql_digest(old_sql)),
                    )
                    self._db.execute(
                        "UPDATE pipelines SET sql = ?, version = ?, code_key = ?, updated_at = ? "
                        "WHERE id = ?",
                        (sql, version, code_key, now, pid),
                    )
                    self._db.execute(
                        "INSERT INTO pipeline_versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            pid,
                            version,
                            now,
                            sql_digest(sql),
                            json.dumps(functions),
                            changed_by,
                            change,
                            epoch,
                        ),
                    )
            except sqlite3.Error as exc:
                raise StorageError(f"pipeline registry {self.path}: {exc}") from exc
        return self.get(pid)

    def versions(self, pid: str) -> list[PipelineVersion]:
        """``pid``'s versions, oldest first (a pipeline of an older server: its version 1 as
        the registry knows it, without function digests)."""
        record = self.get(pid)
        rows = self._run(
            "SELECT version, at, sql_sha256, functions, changed_by, change, epoch FROM "
            "pipeline_versions WHERE pipeline = ? ORDER BY version",
            (pid,),
        )
        if not rows:
            return [
                PipelineVersion(
                    1, record.submitted_at, sql_digest(record.sql), {}, None, "submitted", None
                )
            ]
        return [
            PipelineVersion(
                int(v), at, digest, json.loads(functions), by, change, None if e is None else int(e)
            )
            for v, at, digest, functions, by, change, e in rows
        ]

    def get(self, pid: str) -> PipelineRecord:
        """The pipeline ``pid``.

        Raises:
            NotFoundError: no such pipeline.
        """
        rows = self._run(f"SELECT {_COLUMNS} FROM pipelines WHERE id = ?", (pid,))
        if not rows:
            raise NotFoundError(f"no pipeline {pid!r}; flight-serve pipelines list shows them")
        return self._record(rows[0])

    def all(self) -> list[PipelineRecord]:
        """Every pipeline, oldest first."""
        rows = self._run(f"SELECT {_COLUMNS} FROM pipelines ORDER BY submitted_at, id")
        return [self._record(r) for r in rows]

    def set_state(
        self,
        pid: str,
        state: PipelineState,
        *,
        error: str | None = None,
        error_kind: dict[str, Any] | None = None,
        attempts: int | None = None,
    ) -> None:
        """Set ``pid``'s state (and its last error, the error's ``{"domain", "retryable"}``
        and attempts when given)."""
        sets, args = ["state = ?", "updated_at = ?"], [state, _now()]
        if error is not None:
            sets.append("last_error = ?")
            args.append(error)
        if error_kind is not None:
            sets.append("last_error_kind = ?")
            args.append(json.dumps(error_kind))
        if attempts is not None:
            sets.append("attempts = ?")
            args.append(str(attempts))
        self._run(f"UPDATE pipelines SET {', '.join(sets)} WHERE id = ?", (*args, pid))

    def checkpointed(self, pid: str, checkpoint: dict[str, Any], metrics: dict[str, Any]) -> None:
        """Record ``pid``'s latest checkpoint and the metrics taken with it."""
        self._run(
            "UPDATE pipelines SET last_checkpoint = ?, metrics = ?, updated_at = ? WHERE id = ?",
            (json.dumps(checkpoint), json.dumps(metrics), _now(), pid),
        )

    def set_job_log_cursor(self, pid: str, cursor: str | None) -> None:
        """Record the last job log line copied into ``pid``'s log
        (:attr:`PipelineRecord.job_log_cursor`)."""
        self._run("UPDATE pipelines SET job_log_cursor = ? WHERE id = ?", (cursor, pid))

    def log(self, pid: str, level: str, message: str) -> None:
        """Append a line to ``pid``'s log."""
        self._run(
            "INSERT INTO pipeline_logs (pipeline, ts, level, message) VALUES (?, ?, ?, ?)",
            (pid, _now(), level, message),
        )

    def logs(self, pid: str, after: int = 0, limit: int = 1000) -> list[LogLine]:
        """``pid``'s log lines after sequence number ``after`` (oldest first)."""
        self.get(pid)
        rows = self._run(
            "SELECT seq, ts, level, message FROM pipeline_logs WHERE pipeline = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (pid, after, limit),
        )
        return [LogLine(int(seq), ts, level, message) for seq, ts, level, message in rows]
