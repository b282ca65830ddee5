"""The web console with TLS: HTTPS only, with the server's certificate; users-file credentials
(Basic) have every role. In-process server and console (the browser tests, in tests/console/,
run against a subprocess)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from flight_serve.console import start_console
from flight_serve.flight.ops.roles import TlsFiles
from flight_serve.flight.server import start_server

pytestmark = pytest.mark.integration


def test_https_with_the_servers_certificate(tmp_path: Path, pki: Path) -> None:
    tls = TlsFiles(pki / "server.pem", pki / "server.key")
    users = {"ann": "secret"}
    with (
        start_server(tmp_path / "data", tls=tls, users=users) as service,
        start_console(service, tls=tls, users=users) as console,
    ):
        assert console.url == f"https://127.0.0.1:{console.port}/"
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        basic = base64.b64encode(b"ann:secret").decode()
        request = urllib.request.Request(
            console.url + "api/v1/whoami", headers={"Authorization": f"Basic {basic}"}
        )
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            assert json.loads(response.read()) == {
                "name": "ann", "roles": ["admin", "read", "write"], "auth": True
            }
        wrong = base64.b64encode(b"ann:nope").decode()
        request = urllib.request.Request(
            console.url + "api/v1/whoami", headers={"Authorization": f"Basic {wrong}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=30)
        assert refused.value.code == 401
        refused.value.close()
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
            urllib.request.urlopen(f"http://127.0.0.1:{console.port}/", timeout=10)
        with pytest.raises(urllib.error.URLError):  # nor HTTPS to a client not trusting its CA
            urllib.request.urlopen(console.url, context=ssl.create_default_context(), timeout=10)
