"""The registry keeps the class of a pipeline's last error (``{"domain", "retryable"}``, issue
14), also in a registry file an older server wrote (without that column)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from flight_serve.pipelines.registry import Registry

OLD_SCHEMA = """
CREATE TABLE pipelines (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, sql TEXT NOT NULL, base_dir TEXT NOT NULL,
    output_dir TEXT NOT NULL, state TEXT NOT NULL, submitted_at TEXT NOT NULL,
    updated_at TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT,
    last_checkpoint TEXT, metrics TEXT
);
INSERT INTO pipelines VALUES ('old-1', 'old', 'SELECT 1', '/b', '/o', 'failed',
    '2026-01-01T00:00:00.000+00:00', '2026-01-01T00:00:00.000+00:00', 0, 'boom', NULL, NULL);
"""


def test_a_failure_records_its_domain_and_retryable(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "pipelines.sqlite")
    registry.add("p-1", "p", "SELECT 1", "/b", "/o")
    assert registry.get("p-1").last_error_kind is None
    kind = {"domain": "external", "retryable": True}
    registry.set_state("p-1", "failed", error="sink g: FalkorDB unreachable", error_kind=kind)
    record = registry.get("p-1")
    assert (record.state, record.last_error, record.last_error_kind) == (
        "failed",
        "sink g: FalkorDB unreachable",
        {"domain": "external", "retryable": True},
    )
    registry.close()
    reopened = Registry(tmp_path / "pipelines.sqlite")
    assert reopened.get("p-1").last_error_kind == {"domain": "external", "retryable": True}
    reopened.close()


def test_an_older_registry_gains_the_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "pipelines.sqlite"
    db = sqlite3.connect(str(path))
    db.executescript(OLD_SCHEMA)
    db.close()
    registry = Registry(path)
    record = registry.get("old-1")
    assert (record.name, record.state, record.last_error, record.last_error_kind) == (
        "old",
        "failed",
        "boom",
        None,
    )
    registry.set_state("old-1", "failed", error="x", error_kind={"domain": "input", "retryable": False})
    assert registry.get("old-1").last_error_kind == {"domain": "input", "retryable": False}
    assert [r.id for r in registry.all()] == ["old-1"]
    registry.close()
