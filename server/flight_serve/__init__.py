"""flight-serve: an Arrow Flight data-exchange service with an event-time streaming engine.

The engine is a library first (``flight_serve.engine``); the Flight server
(``flight_serve.flight``) is one consumer of it.
"""

from __future__ import annotations

__version__ = "0.1.0"
