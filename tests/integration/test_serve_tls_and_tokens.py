"""``flight-serve`` with TLS and a tokens file: the command line manages pipelines over mutual TLS,
a tokens file saved with a byte order mark keeps its first token, and bad TLS files are named
before the server starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flight_serve.flight.ops.roles import TlsFiles, load_tokens_file
from flight_serve.flight.server import start_server
from helpers import KTV_COUNTS_SQL

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "flight-serve"


def test_the_command_line_manages_pipelines_over_mutual_tls(pki: Path, tmp_path: Path) -> None:
    """``flight-serve submit`` / ``pipelines`` present a client certificate (``--tls-cert``,
    ``--tls-key``) to a server started with ``--tls-client-ca``; without one the error says
    what is missing."""
    (tmp_path / "tokens.txt").write_text("tok-ops read,admin ops\n")
    (tmp_path / "p.sql").write_text(KTV_COUNTS_SQL.format(source="connector = 'flight'", sink="out"))
    tls = TlsFiles(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    tokens = load_tokens_file(tmp_path / "tokens.txt")
    env = {**os.environ, "FLIGHT_SERVE_TOKEN": "tok-ops"}
    with start_server(tmp_path / "data", tls=tls, tokens=tokens) as service:
        tls_args = ["--server", service.location, "--tls-ca", str(pki / "ca.pem")]
        mutual = [*tls_args, "--tls-cert", str(pki / "client.pem"),
                  "--tls-key", str(pki / "client.key")]  # fmt: skip

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(CLI), *args], env=env, capture_output=True, text=True, timeout=60
            )

        submitted = cli("submit", str(tmp_path / "p.sql"), *mutual)
        assert submitted.returncode == 0, submitted.stderr
        pid = submitted.stdout.strip()
        listed = cli("pipelines", "list", *mutual)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines() if line.strip()]
        assert (rows[0], rows[2:]) == (
            ["ID", "STATE", "EPOCH", "NAME"],
            [[pid, "running", "-", "p"]],
        )
        refused = cli("pipelines", "list", *tls_args)
        assert refused.returncode == 1
        assert "needs --tls-cert and --tls-key" in refused.stderr
        half = cli("pipelines", "list", *tls_args, "--tls-cert", str(pki / "client.pem"))
        assert (half.returncode, half.stderr) == (
            1,
            "flight-serve: --tls-cert and --tls-key go together\n",
        )


def test_a_tokens_file_saved_with_a_byte_order_mark_keeps_its_first_token(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a BOM; the first token must not absorb it."""
    path = tmp_path / "tokens.txt"
    path.write_bytes(b"\xef\xbb\xbftok-a read first\r\ntok-b write,admin\r\n")
    tokens = load_tokens_file(path)
    assert {t: (sorted(g.roles), g.name) for t, g in tokens.items()} == {
        "tok-a": (["read"], "first"),
        "tok-b": (["admin", "write"], "line 2"),
    }
    from flight_serve.flight.ops.auth import load_users_file

    users = tmp_path / "users.txt"
    users.write_bytes(b"\xef\xbb\xbfalice:s3cret\r\nbob:pw:with:colons\r\n")
    assert load_users_file(users) == {"alice": "s3cret", "bob": "pw:with:colons"}


def test_bad_tls_files_are_named_before_the_server_starts(pki: Path, tmp_path: Path) -> None:
    """Before: gRPC's "Server did not start properly", whatever was wrong."""
    from flight_serve.errors import InvalidInputError

    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        (TlsFiles(garbage, pki / "server.key"), "not a PEM certificate chain and its"),
        (TlsFiles(pki / "server.pem", pki / "client.key"), "not a PEM certificate chain and its"),
        (TlsFiles(pki / "server.pem", pki / "server.key", client_ca=garbage), "--tls-client-ca"),
    ]
    for files, says in cases:
        with pytest.raises(InvalidInputError, match=says):
            files.server_options()
    assert set(TlsFiles(pki / "server.pem", pki / "server.key", pki / "ca.pem").server_options()) == {
        "tls_certificates",
        "verify_client",
        "root_certificates",
    }
