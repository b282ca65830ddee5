"""Helpers shared by the test files (importable as ``helpers``: pytest puts ``tests/`` on the path).

``wait_until``: poll a condition until it holds or a deadline passes.
``act``: a Flight action with a JSON body, its one result read as JSON.
``rows_of``: a stream's rows, read through GetFlightInfo and DoGet.
``tuples`` and ``Run``: a window operator's emissions, step by step, as rows.
``KTV_EVENTS`` and ``KTV_COUNTS_SQL``: rows (k, t, v) and a tumbling count over them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight

if TYPE_CHECKING:
    from flight_serve.engine.operator import Emission, WindowOperator

WAIT_S = 30.0


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = WAIT_S,
    poll_s: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
) -> None:
    """Call ``condition`` every ``poll_s`` seconds until it returns true.

    An exception of a class in ``ignoring`` counts as "not yet" (a server that is restarting).
    Raises ``AssertionError`` naming ``what`` after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except ignoring:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def act(
    client: flight.FlightClient | str, action: str, body: object, timeout_s: float | None = None
) -> Any:
    """Run the Flight action ``action`` with ``body`` sent as JSON; its one result read as JSON.

    ``client`` is a connected client, or a location (``grpc://HOST:PORT``) to connect to for
    this one call. ``timeout_s`` bounds the call (None: no bound). Fails unless the action
    answers with exactly one result.
    """
    if isinstance(client, str):
        with flight.connect(client) as connected:
            return act(connected, action, body, timeout_s)
    options = flight.FlightCallOptions(timeout=timeout_s) if timeout_s is not None else None
    (result,) = client.do_action(flight.Action(action, json.dumps(body).encode()), options=options)
    return json.loads(result.body.to_pybytes())


def rows_of(client: flight.FlightClient | str, stream: str) -> list[dict[str, Any]]:
    """The rows of ``stream`` (its first endpoint) as dicts, in stream order.

    ``client`` is a connected client, or a location to connect to for this one read.
    """
    if isinstance(client, str):
        with flight.connect(client) as connected:
            return rows_of(connected, stream)
    info = client.get_flight_info(flight.FlightDescriptor.for_path(stream))
    rows: list[dict[str, Any]] = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
    return rows


def tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table`` as tuples, in column order."""
    return [tuple(r.values()) for r in table.to_pylist()]


@dataclass
class Run:
    """A window operator fed step by step: ``steps[i]`` is the emission after the i-th feed and
    ``steps[-1]`` the one of ``finish()``."""

    op: WindowOperator
    steps: list[Emission]

    @property
    def outputs(self) -> list[list[tuple[Any, ...]]]:
        """Output rows per step (last: end of input)."""
        return [tuples(e.output) for e in self.steps]

    @property
    def late(self) -> list[list[tuple[Any, ...]]]:
        """Late side-output rows per step: key, t, v, _late_reason, _window_start, _window_end."""
        return [tuples(e.late) for e in self.steps]


#: rows ``(k, t, v)``: a key, an event time in whole seconds, a value
KTV_EVENTS = pa.schema([("k", pa.string()), ("t", pa.timestamp("s")), ("v", pa.int64())])

#: a pipeline counting and summing ``v`` per key in 10 s tumbling windows of a source ``events``
#: of :data:`KTV_EVENTS`; ``.format(source=<its WITH options>, sink=<the output stream>)``
KTV_COUNTS_SQL = """
SET checkpoint_interval = '1h';
CREATE SOURCE events (k VARCHAR, t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
WITH ({source});
CREATE SINK {sink} WITH (connector = 'flight', stream = '{sink}');
INSERT INTO {sink}
SELECT k, window_start, window_end, count(*) AS n, sum(v) AS total
FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;
"""
