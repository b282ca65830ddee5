"""flight_serve_client: a small Python client for flight-serve that depends on pyarrow only.

It speaks the wire contract of ``schemas/README.md`` with :mod:`pyarrow.flight`; it never imports
the server package. Errors are pyarrow's own Flight exceptions (see :class:`FlightServeClient`).

Example (against a running server)::

    from flight_serve_client import FlightServeClient

    with FlightServeClient("grpc://127.0.0.1:8815") as client:
        client.put("flights", table)                     # -> last durable offset
        client.query("SELECT count(*) FROM flights")     # -> pyarrow.Table
        for offset, batch in client.tail("flights", offset=0):
            ...
"""

from __future__ import annotations

from flight_serve_client._protocol import ProtocolError
from flight_serve_client.client import ExchangeEvent, ExchangeKind, FlightServeClient

__all__ = ["ExchangeEvent", "ExchangeKind", "FlightServeClient", "ProtocolError"]
