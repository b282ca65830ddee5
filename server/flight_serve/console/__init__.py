"""The web console of ``flight-serve serve`` (``--console-port``): pages of the pipelines, one
pipeline (graph, watermarks, plots, checkpoints, logs, SQL, admin actions), the streams, a SQL
editor and the late rows, over a JSON API (``schemas/console-openapi.yaml``).

:func:`start_console` starts it beside a running
:class:`~flight_serve.flight.service.FlightServeService`; the console reads the server only
through :mod:`flight_serve.console.source`. The page's plotting library (uPlot, from npm) is
built into ``static/vendor/`` by ``make console-assets``; without it the pages work and the
plots say the library is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flight_serve.console.http import STATIC_DIR, ConsoleServer
from flight_serve.console.samples import Sampler
from flight_serve.console.source import ConsoleSource
from flight_serve.flight.ops.roles import TlsFiles, TokenGrant

__all__ = ["STATIC_DIR", "ConsoleServer", "ConsoleSource", "Sampler", "start_console"]


def start_console(
    service: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tokens: Mapping[str, TokenGrant] | None = None,
    users: Mapping[str, str] | None = None,
    tls: TlsFiles | None = None,
    sample_interval_s: float = 1.0,
) -> ConsoleServer:
    """Serve the console of ``service`` (a running FlightServeService) on ``host:port``
    (0: a free port); returns the started :class:`ConsoleServer` (``.port``, ``.url``,
    ``.stop()``). Samples every running pipeline each ``sample_interval_s`` seconds and keeps
    an hour of them (at 1 s).

    Raises:
        OSError: the port is taken (or the TLS files cannot be read).
    """
    source = ConsoleSource(
        getattr(service, "pipeline_manager", None),
        service.store,
        getattr(service, "query_limits", None),
    )
    keep = max(1, round(3600 / sample_interval_s))
    sampler = Sampler(source, interval_s=sample_interval_s, keep=keep)
    console = ConsoleServer(source, sampler, host, port, tokens=tokens, users=users, tls=tls)
    console.start()
    return console
