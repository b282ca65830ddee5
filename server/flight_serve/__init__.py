"""flight-serve: an Arrow Flight data-exchange service with an event-time streaming engine.

The engine is a library first (``flight_serve.engine``); the Flight server
(``flight_serve.flight``) is one consumer of it. ``flight_serve.Pipeline`` runs a pipeline SQL file
in this process (see docs/pipelines.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flight_serve.embedded import Pipeline

__version__ = "0.1.0"
__all__ = ["Pipeline", "__version__"]


def __getattr__(name: str) -> Any:
    """``flight_serve.Pipeline`` loads the engine on first use, so ``import flight_serve`` stays
    light (no DataFusion, no sqlglot): cold start matters."""
    if name == "Pipeline":
        from flight_serve.embedded import Pipeline

        return Pipeline
    raise AttributeError(f"module 'flight_serve' has no attribute {name!r}")
