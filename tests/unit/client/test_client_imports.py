"""The Python client imports the standard library and pyarrow only (it is installed next to
applications that have none of the server's packages). import-linter forbids the server's own
dependencies by name; this checks every import statement against an allow-list instead."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[3] / "clients" / "python" / "flight_serve_client"
ALLOWED = {"pyarrow", "flight_serve_client"}


def _imported_top_level(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_client_imports_only_the_standard_library_and_pyarrow() -> None:
    files = sorted(CLIENT.glob("*.py"))
    assert [f.name for f in files] == ["__init__.py", "_protocol.py", "client.py", "plugin.py"]
    outside = {
        f"{path.name}: {name}"
        for path in files
        for name in _imported_top_level(path)
        if name not in ALLOWED and name not in sys.stdlib_module_names and name != "__future__"
    }
    assert outside == set()
