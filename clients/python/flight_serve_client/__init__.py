"""flight_serve_client: a small Python client for flight-serve that depends on pyarrow only.

It speaks the wire contract of ``schemas/README.md`` with :mod:`pyarrow.flight`; it never imports
the server package. Errors are pyarrow's own Flight exceptions (see :class:`FlightServeClient`).

Example (against a running server)::

    from flight_serve_client import FlightServeClient

    with FlightServeClient("grpc://127.0.0.1:8815") as client:
        client.put("flights", table)                     # -> last durable offset
        client.put("flights", table, writer="sensor-7")  # one named watermark partition
        client.advance_watermark("flights", ts, writer="sensor-7")  # no rows, W_p >= ts
        client.end_input("flights", writer="sensor-7")   # the partition ends for good
        client.query("SELECT count(*) FROM flights")     # -> pyarrow.Table
        for offset, batch in client.tail("flights", offset=0):   # up to the current end
            ...
        for offset, batch in client.tail("flights", 0, follow=True):  # live, until break
            ...
        client.attach_plugin("enrich", fn, input_schema, output_schema)  # serve a plugin

A server with TLS and credentials::

    FlightServeClient("grpc+tls://host:8815", token="…", tls_ca="ca.pem",
                      tls_cert="client.pem", tls_key="client.key")   # or username=, password=
"""

from __future__ import annotations

from flight_serve_client._protocol import ProtocolError
from flight_serve_client.client import ExchangeEvent, ExchangeKind, FlightServeClient, TailEntry
from flight_serve_client.plugin import PluginStats

__all__ = [
    "ExchangeEvent",
    "ExchangeKind",
    "FlightServeClient",
    "PluginStats",
    "ProtocolError",
    "TailEntry",
]
