"""The Arrow Flight service over the stream store.

- ``server.py`` runs it (:func:`~flight_serve.flight.server.start_server`,
  :func:`~flight_serve.flight.server.serve_forever`) from one
  :class:`~flight_serve.flight.config.ServerConfig` (``config.py``);
- ``service.py`` is the Flight handlers; ``doput.py`` DoPut's write path, ``descriptors.py`` the
  descriptors, ``tickets.py`` and ``markers.py`` the wire formats, ``actions.py`` the action
  bodies and the ``pipeline.*`` actions, ``cancel.py`` cancellation, ``exchange.py`` and
  ``plugin_exchange.py`` DoExchange, ``status.py`` the one error -> status mapping,
  ``startup.py`` the startup gate;
- ``sql/`` is Flight SQL and SQL over streams: ``handler.py`` (the protobuf dispatcher),
  ``statement.py`` (one parsed statement per request), ``engine.py``, ``query.py``,
  ``catalog.py`` (Iceberg tables), ``metadata.py``;
- ``ops/`` is operating it: ``auth.py``, ``roles.py``, ``limits.py``, ``metrics.py``,
  ``requestlog.py``, ``health.py``.
"""
