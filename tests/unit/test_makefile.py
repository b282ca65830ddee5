"""The Makefile's pip command lines parse: every ``pip`` line that ``make -n`` prints for a fresh
virtual environment (the ``venv`` rule, ``.stamp-demo``, ``.stamp-test``, ``.stamp-bench``) runs
with this interpreter's pip and ``--help`` appended, so pip parses every option and prints the
sub-command's help instead of installing. An option before the sub-command that only the
sub-command knows (``pip --progress-bar on install``) is pip's ``no such option`` and exit 2, the
first thing a fresh clone's ``make demo`` used to print."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_every_pip_line_of_a_fresh_setup_parses(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # never created: make -n only prints
    printed = subprocess.run(
        ["make", "-n", "--no-print-directory", f"VENV={venv}",
         f"{venv}/.stamp-demo", f"{venv}/.stamp-bench"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    python = f"{venv}/bin/python"
    pip_lines = [line for line in printed.splitlines() if line.startswith(f"{python} -m pip ")]
    installs = [line for line in pip_lines if " install " in f"{line} "]
    # the venv's pip upgrade, the demo extra, the test extra, the bench extra
    assert len(installs) == 4, printed
    for line in installs:
        argv = [sys.executable, *shlex.split(line)[1:], "--help"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        assert done.stdout.startswith("\nUsage:"), done.stdout[:200]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_demo_runs_without_npm(tmp_path: Path) -> None:
    """``make demo`` builds the console's plotting library with npm when it can, and runs the
    demo without it (the console then says the library is missing), as it does without bwrap:
    README's quick start asks for Python and PyPI only. It used to stop at ``npm: not found``
    (make's Error 127) before the demo. The venv is taken as built (its stamp), and
    ``flight-serve`` is a script that records its arguments: what is checked is make's order of
    steps with no npm on PATH, not the demo itself (``make demo`` runs that)."""
    venv, bin_dir, tools = tmp_path / "venv", tmp_path / "venv" / "bin", tmp_path / "tools"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").touch()
    (venv / ".stamp-demo").touch()  # newer than pyproject.toml: nothing to install
    ran = tmp_path / "ran"
    (bin_dir / "flight-serve").write_text(f'#!/bin/sh\necho "$*" >> {ran}\n')
    (bin_dir / "flight-serve").chmod(0o755)
    tools.mkdir()
    for tool in ("make", "cp", "mkdir", "touch", "bwrap"):  # everything the steps call, no npm
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"no {tool} on PATH")
        (tools / tool).symlink_to(found)
    done = subprocess.run(
        ["make", "--no-print-directory", f"VENV={venv}",
         f"CONSOLE_VENDOR={tmp_path / 'vendor'}", "demo"],
        cwd=ROOT, capture_output=True, text=True, env={"PATH": str(tools)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make demo: no npm (Node.js): the web console runs without its plots" in done.stdout
    assert ran.read_text().splitlines() == ["demo", "demo --sync --month-pause 1"]
