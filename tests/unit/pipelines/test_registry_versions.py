"""The registry keeps every version of a pipeline (``pipelines update``): its text's and its
functions' SHA-256, who changed it and how; also for a registry file an older server wrote
(without the version columns and table)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from flight_serve.pipelines.registry import PipelineVersion, Registry

OLD_SCHEMA = """
CREATE TABLE pipelines (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, sql TEXT NOT NULL, base_dir TEXT NOT NULL,
    output_dir TEXT NOT NULL, state TEXT NOT NULL, submitted_at TEXT NOT NULL,
    updated_at TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT,
    last_checkpoint TEXT, metrics TEXT
);
INSERT INTO pipelines VALUES ('old-1', 'old', 'SELECT 1', '/b', '/o', 'running',
    '2026-01-01T00:00:00.000+00:00', '2026-01-01T00:00:00.000+00:00', 0, NULL, NULL, NULL);
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_versions_are_recorded_in_order(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "pipelines.sqlite")
    first = registry.add(
        "p-1", "p", "SELECT 1", "/b", "/o", functions={"f": "a" * 64}, changed_by="ann"
    )
    assert (first.version, first.code_key) == (1, None)
    second = registry.add_version(
        "p-1",
        "SELECT 2",
        functions={"f": "b" * 64},
        code_key="p-1.v2",
        changed_by=None,
        change="updated from version 1 at checkpoint 7: v2.sql",
        epoch=7,
    )
    assert (second.version, second.sql, second.code_key) == (2, "SELECT 2", "p-1.v2")
    registry.close()
    reopened = Registry(tmp_path / "pipelines.sqlite")
    versions = reopened.versions("p-1")
    got = [
        (v.version, v.sql_sha256, v.functions, v.changed_by, v.change, v.epoch) for v in versions
    ]
    change = "updated from version 1 at checkpoint 7: v2.sql"
    assert got == [
        (1, sha("SELECT 1"), {"f": "a" * 64}, "ann", "submitted", None),
        (2, sha("SELECT 2"), {"f": "b" * 64}, None, change, 7),
    ]
    assert versions[0].at <= versions[1].at
    reopened.close()


def test_an_older_registry_gains_versions(tmp_path: Path) -> None:
    path = tmp_path / "pipelines.sqlite"
    db = sqlite3.connect(str(path))
    db.executescript(OLD_SCHEMA)
    db.close()
    registry = Registry(path)
    assert registry.get("old-1").version == 1
    at = "2026-01-01T00:00:00.000+00:00"
    assert registry.versions("old-1") == [
        PipelineVersion(1, at, sha("SELECT 1"), {}, None, "submitted", None)
    ]
    registry.add_version(
        "old-1", "SELECT 2", functions={}, code_key=None, changed_by=None, change="u", epoch=3
    )
    versions = registry.versions("old-1")
    assert [(v.version, v.sql_sha256, v.at if v.version == 1 else None) for v in versions] == [
        (1, sha("SELECT 1"), at),
        (2, sha("SELECT 2"), None),
    ]
    registry.close()


def test_the_runtime_is_kept_and_an_older_registry_runs_embedded(tmp_path: Path) -> None:
    """``runtime`` (``embedded`` or ``ray``: where the server runs the pipeline) survives a
    reopen and a new version; a pipeline an older server registered is ``embedded``."""
    path = tmp_path / "pipelines.sqlite"
    db = sqlite3.connect(str(path))
    db.executescript(OLD_SCHEMA)
    db.close()
    registry = Registry(path)
    assert registry.get("old-1").runtime == "embedded"
    assert registry.add("p-ray", "p", "SELECT 1", "/b", "/o", runtime="ray").runtime == "ray"
    assert registry.add("p-emb", "p", "SELECT 1", "/b", "/o").runtime == "embedded"
    registry.add_version(
        "p-ray", "SELECT 2", functions={}, code_key=None, changed_by=None, change="u", epoch=1
    )
    registry.close()
    reopened = Registry(path)
    assert {r.id: r.runtime for r in reopened.all()} == {
        "old-1": "embedded",
        "p-ray": "ray",
        "p-emb": "embedded",
    }
    assert reopened.get("p-ray").version == 2
    reopened.close()
