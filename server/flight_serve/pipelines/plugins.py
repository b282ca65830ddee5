"""The plugin hub: out-of-process transform plugins attached over DoExchange, called by pipelines.

A plugin process attaches with ``DoExchange(path = ["plugins", <name>])`` (the wire protocol is
specified in schemas/README.md, "Plugin protocol"; the Flight handler is
:mod:`flight_serve.flight.plugin_exchange`). The handler registers one :class:`PluginInstance` per attached
exchange in the server's :class:`PluginHub`; a pipeline stage (``CREATE FUNCTION … WITH
(connector = 'plugin')``, docs/pipelines.md) calls the plugin through a :class:`PluginStage`:

* **sequence tags**: every send of a batch to an instance carries a *wire sequence number*
  ``seq`` (unique in the server, increasing); the instance answers with exactly one result batch
  tagged with the same ``seq``. A result whose ``seq`` is not outstanding on that instance (a
  late answer to a send that timed out and was reassigned) is dropped, so a batch's result is
  taken once;
* **bounded in flight**: an instance never has more than its declared ``max_in_flight`` sends
  outstanding; a stage never has more than its ``max_in_flight`` batches submitted and not yet
  emitted (:meth:`PluginStage.submit` blocks: backpressure to the pipeline's sources);
* **load sharing**: several instances of one name share the work: each queued batch goes to the
  compatible instance with the fewest outstanding sends (ties: the one attached first);
* **per-batch timeout**: a send not answered within the stage's ``timeout`` is taken back and
  sent again, to another instance if one has room, else to the same one (the taken-back send no
  longer counts against its ``max_in_flight``; its late answer is dropped);
* **disconnects**: the outstanding sends of an instance that detaches (its process died, its
  stream broke, it answered with a wrong schema or garbage) go back to the stage's queue, in
  sequence order, and are sent again when an instance has room. A stage without an instance
  waits ("waiting for plugin <name>" in the pipeline's status).

Results leave a stage in the order the batches were submitted (:meth:`PluginStage.ready`), so the
stages downstream see the same batches in the same order however the instances interleave.

Thread safety: every method may be called from any thread; one condition variable guards the
hub. Durations are seconds (``float``) inside, ``timedelta`` in the public configuration.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa

from flight_serve.errors import InvalidInputError

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_TIMEOUT",
    "MAX_IN_FLIGHT_LIMIT",
    "MAX_SEND_BYTES",
    "PROTOCOL_VERSION",
    "PluginDeclaration",
    "PluginHub",
    "PluginInstance",
    "PluginStage",
    "schema_difference",
    "send_slices",
]

#: The plugin protocol version this server speaks (the hello's ``protocol``).
PROTOCOL_VERSION = 1
#: ``max_in_flight`` of a hello without one, and of a stage without the option.
DEFAULT_MAX_IN_FLIGHT = 4
#: The largest ``max_in_flight`` accepted (a hello or a stage option above it is refused).
MAX_IN_FLIGHT_LIMIT = 1024
#: The per-batch timeout of a stage without the ``timeout`` option.
DEFAULT_TIMEOUT = timedelta(seconds=30)
#: How often a waiting stage re-checks timeouts and stop requests (seconds).
_POLL_S = 0.05
#: Round-trip latencies kept per plugin name (:meth:`PluginHub.latencies_s`).
_LATENCIES = 10_000
#: The largest input batch (``nbytes``) sent to a plugin in one message: bigger ones go as row
#: slices, so every message fits gRPC's default 4 MiB receive limit (grpcio, tonic, grpc-java,
#: grpc-go clients) with room for the IPC framing.
MAX_SEND_BYTES = 3 * 1024 * 1024


def schema_difference(got: pa.Schema, expected: pa.Schema) -> str:
    """The fields that differ between two schemas, for an error message; ``""`` when the names
    and types (in order) are equal. Nullability and metadata are ignored."""
    if got.names == expected.names and all(
        a.type == b.type for a, b in zip(got, expected, strict=True)
    ):
        return ""
    parts = []
    missing = [f.name for f in expected if got.get_field_index(f.name) < 0]
    extra = [f.name for f in got if expected.get_field_index(f.name) < 0]
    retyped = [
        f"{f.name} ({got.field(f.name).type}, expected {f.type})"
        for f in expected
        if got.get_field_index(f.name) >= 0 and got.field(f.name).type != f.type
    ]
    if missing:
        parts.append(f"missing {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected {', '.join(extra)}")
    if retyped:
        parts.append(f"retyped {', '.join(retyped)}")
    if not parts:
        parts.append(f"order {', '.join(got.names)} (expected {', '.join(expected.names)})")
    return "; ".join(parts)


def send_slices(batch: pa.RecordBatch, max_bytes: int = MAX_SEND_BYTES) -> list[pa.RecordBatch]:
    """``batch`` as zero-copy row slices of at most ``max_bytes`` (``nbytes``) each, in row
    order (a single row above it goes alone): what a plugin is sent, one slice per ``seq``.

    >>> b = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    >>> [s.num_rows for s in send_slices(b, 3000)]
    [334, 334, 332]
    """
    if batch.nbytes <= max_bytes or batch.num_rows <= 1:
        return [batch]
    parts = -(-batch.nbytes // max_bytes)
    step = max(1, -(-batch.num_rows // parts))
    out: list[pa.RecordBatch] = []
    for start in range(0, batch.num_rows, step):
        piece = batch.slice(start, step)
        if piece.nbytes <= max_bytes or piece.num_rows <= 1:
            out.append(piece)
        else:  # skewed rows: halve until it fits
            half = piece.num_rows // 2
            out += send_slices(piece.slice(0, half), max_bytes)
            out += send_slices(piece.slice(half), max_bytes)
    return out


def _schema_field(payload: dict[str, Any], key: str) -> pa.Schema:
    value = payload.get(key)
    if not isinstance(value, str):
        raise InvalidInputError(
            f"plugin hello: {key!r} must be a base64 string holding an Arrow IPC schema message"
        )
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value, validate=True)))
    except (binascii.Error, ValueError, OSError, pa.ArrowException) as exc:  # OSError: flatbuffer
        raise InvalidInputError(
            f"plugin hello: {key!r} is not a base64 Arrow IPC schema message ({exc})"
        ) from None
    if not schema.names:
        raise InvalidInputError(f"plugin hello: {key!r} has no fields")
    seen: set[str] = set()
    for name in schema.names:
        if name in seen:
            raise InvalidInputError(f"plugin hello: {key!r} names field {name!r} twice")
        seen.add(name)
    return schema


@dataclass(frozen=True)
class PluginDeclaration:
    """What an instance declared in its hello (schemas/README.md, "Plugin protocol").

    Attributes:
        name: the plugin name (the descriptor path's second element).
        input_schema: the columns it reads; the server sends exactly these (selected by name and
            cast from the pipeline's stream).
        output_schema: the columns of every result batch.
        max_in_flight: how many sends it takes before answering one (1 … 1024).
        protocol: the protocol version (1).
    """

    name: str
    input_schema: pa.Schema
    output_schema: pa.Schema
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    protocol: int = PROTOCOL_VERSION

    @classmethod
    def from_hello(cls, name: str, hello: bytes) -> PluginDeclaration:
        """Parse a hello message's app_metadata (UTF-8 JSON).

        Raises:
            InvalidInputError: not JSON, an unknown protocol version, a missing or malformed
                schema (not an IPC schema message, no fields, a name twice), a ``max_in_flight``
                outside 1 … 1024; the message names the field.
        """
        try:
            payload = json.loads(hello.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise InvalidInputError(f"plugin hello: not UTF-8 JSON ({exc})") from None
        if not isinstance(payload, dict):
            raise InvalidInputError("plugin hello: must be a JSON object")
        protocol = payload.get("protocol")
        if type(protocol) is not int or protocol != PROTOCOL_VERSION:  # not True, not 1.0
            raise InvalidInputError(
                f"plugin hello: 'protocol' is {protocol!r}; this server speaks {PROTOCOL_VERSION}"
            )
        declared = payload.get("name")
        if declared is not None and declared != name:
            raise InvalidInputError(
                f"plugin hello: 'name' {declared!r} differs from the descriptor's {name!r}"
            )
        max_in_flight = payload.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT)
        if (
            not isinstance(max_in_flight, int)
            or isinstance(max_in_flight, bool)
            or not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT
        ):
            raise InvalidInputError(
                f"plugin hello: 'max_in_flight' must be a whole number from 1 to "
                f"{MAX_IN_FLIGHT_LIMIT}, got {max_in_flight!r}"
            )
        return cls(
            name,
            _schema_field(payload, "input_schema"),
            _schema_field(payload, "output_schema"),
            max_in_flight,
            protocol,
        )


@dataclass
class _Request:
    """One batch a stage submitted; ``result`` is set once."""

    stage: PluginStage
    seq: int
    batch: pa.RecordBatch
    partition: str
    result: pa.RecordBatch | None = None
    instance: PluginInstance | None = None
    wire: int | None = None
    deadline: float = 0.0
    sent_at: float = 0.0
    sends: int = 0
    #: the instance whose timeout this batch last hit: another one is preferred for the re-send
    timed_out_on: int | None = None


@dataclass
class PluginInstance:
    """One attached plugin exchange (see the module docstring).

    Attributes:
        id: unique in the server, from 1, in attach order.
        declaration: its hello.
        outbox: sends the handler thread writes next: ``(wire seq, batch)``.
        in_flight: outstanding sends by wire seq.
        closed: detached (the handler ends the exchange).
        error: why it was detached, when it was for an error.
        sent, answered, timeouts: counters.
    """

    id: int
    declaration: PluginDeclaration
    outbox: deque[tuple[int, pa.RecordBatch]] = field(default_factory=deque)
    in_flight: dict[int, _Request] = field(default_factory=dict)
    closed: bool = False
    error: str | None = None
    sent: int = 0
    answered: int = 0
    timeouts: int = 0

    @property
    def name(self) -> str:
        return self.declaration.name


class PluginHub:
    """The attached plugin instances of one server, and the pipeline stages calling them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._instances: dict[str, list[PluginInstance]] = {}
        self._stages: dict[str, list[PluginStage]] = {}
        self._errors: dict[str, str] = {}
        self._latency: dict[str, deque[float]] = {}
        self._ids = itertools.count(1)
        self._wire = itertools.count(1)
        self._closed = False

    # --- instances (the Flight handler's side) ----------------------------------------------

    def attach(self, declaration: PluginDeclaration) -> PluginInstance:
        """Register an instance; queued batches of stages of its name go to it at once."""
        with self._cond:
            instance = PluginInstance(next(self._ids), declaration)
            self._instances.setdefault(declaration.name, []).append(instance)
            self._dispatch(declaration.name)
            self._cond.notify_all()
            return instance

    def detach(self, instance: PluginInstance, error: str | None = None) -> None:
        """Unregister ``instance`` (idempotent); its outstanding batches go back to their
        stages' queues. ``error``: why (kept as the name's last error, shown in the status of
        the pipelines calling it)."""
        with self._cond:
            if instance.closed:
                return
            instance.closed = True
            if error is not None:
                instance.error = error
                self._errors[instance.name] = f"plugin {instance.name} instance {instance.id}: {error}"
            peers = self._instances.get(instance.name, [])
            if instance in peers:
                peers.remove(instance)
            for request in instance.in_flight.values():
                request.instance = None
                request.wire = None
                request.stage.requeue(request)
            instance.in_flight.clear()
            instance.outbox.clear()
            self._dispatch(instance.name)
            self._cond.notify_all()

    def next_send(
        self, instance: PluginInstance, timeout_s: float
    ) -> tuple[int, pa.RecordBatch] | None:
        """The next ``(wire seq, batch)`` to write to ``instance``; ``None`` after ``timeout_s``
        seconds without one, or once it is detached."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not instance.outbox and not instance.closed and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            if instance.closed or self._closed or not instance.outbox:
                return None
            instance.sent += 1
            return instance.outbox.popleft()

    def complete(self, instance: PluginInstance, wire: int, batch: pa.RecordBatch) -> bool:
        """A result of ``instance`` for send ``wire``. Returns ``False`` (and drops it) when the
        send is no longer outstanding there (it timed out and was reassigned)."""
        with self._cond:
            request = instance.in_flight.pop(wire, None)
            instance.answered += 1
            if request is None or request.result is not None:
                self._dispatch(instance.name)
                return False
            request.result = batch
            self._latency.setdefault(instance.name, deque(maxlen=_LATENCIES)).append(
                time.monotonic() - request.sent_at
            )
            request.instance = None
            request.wire = None
            self._dispatch(instance.name)
            self._cond.notify_all()
            return True

    def close(self) -> None:
        """The server stops: every waiting handler returns."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def describe(self) -> dict[str, Any]:
        """Attached instances per name (id, max_in_flight, outstanding, sent, answered,
        timeouts) and the last error per name."""
        with self._cond:
            return {
                "instances": {
                    name: [
                        {
                            "id": i.id,
                            "max_in_flight": i.declaration.max_in_flight,
                            "outstanding": len(i.in_flight),
                            "sent": i.sent,
                            "answered": i.answered,
                            "timeouts": i.timeouts,
                        }
                        for i in instances
                    ]
                    for name, instances in self._instances.items()
                    if instances
                },
                "errors": dict(self._errors),
            }

    def latencies_s(self, name: str) -> list[float]:
        """Seconds from handing a batch to an instance of ``name`` to its result, for the last
        10,000 results: the round trip and the wait in the instance's own queue (up to its
        ``max_in_flight`` batches), not the wait for an instance with room."""
        with self._cond:
            return list(self._latency.get(name, ()))

    def last_error(self, name: str) -> str | None:
        """The last error of an instance of ``name`` (``None`` if none failed)."""
        with self._cond:
            return self._errors.get(name)

    # --- stages (the pipelines' side) -------------------------------------------------------

    def stage(
        self,
        name: str,
        input_schema: pa.Schema,
        output_schema: pa.Schema,
        *,
        timeout: timedelta = DEFAULT_TIMEOUT,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT * 4,
        label: str = "",
    ) -> PluginStage:
        """A stage calling plugin ``name`` with batches of ``input_schema``, expecting
        ``output_schema`` (see :class:`PluginStage`)."""
        stage = PluginStage(self, name, input_schema, output_schema, timeout, max_in_flight, label)
        with self._cond:
            self._stages.setdefault(name, []).append(stage)
        return stage

    def _remove_stage(self, stage: PluginStage) -> None:
        with self._cond:
            stages = self._stages.get(stage.name, [])
            if stage in stages:
                stages.remove(stage)
            for instance in self._instances.get(stage.name, []):
                for wire, request in list(instance.in_flight.items()):
                    if request.stage is stage:
                        del instance.in_flight[wire]
                instance.outbox = deque(
                    (w, b) for w, b in instance.outbox if w in instance.in_flight
                )
            self._cond.notify_all()

    def _dispatch(self, name: str) -> None:
        """Hand queued batches of ``name``'s stages to instances with room (lock held)."""
        instances = [i for i in self._instances.get(name, []) if not i.closed]
        if not instances:
            return
        for stage in self._stages.get(name, []):
            while stage.queue:
                usable = [
                    i
                    for i in instances
                    if len(i.in_flight) < i.declaration.max_in_flight and stage.accepts(i)
                ]
                if not usable:
                    break
                request = stage.queue.popleft()
                instance = min(
                    usable, key=lambda i: (i.id == request.timed_out_on, len(i.in_flight), i.id)
                )
                wire = next(self._wire)
                try:
                    batch = stage.adapt(request.batch, instance.declaration.input_schema)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    stage.queue.appendleft(request)
                    stage.refuse(instance, f"cannot cast the input to its input schema: {exc}")
                    continue
                request.instance = instance
                request.wire = wire
                request.sends += 1
                request.sent_at = time.monotonic()
                request.deadline = request.sent_at + stage.timeout_s
                instance.in_flight[wire] = request
                instance.outbox.append((wire, batch))
        self._cond.notify_all()


class PluginStage:
    """One pipeline stage calling plugin ``name`` (see the module docstring).

    Args:
        hub: the hub.
        name: the plugin name.
        input_schema: the schema of the batches :meth:`submit` takes (the pipeline's stream).
        output_schema: the schema every result must have (the function's ``RETURNS TABLE``).
        timeout: per-batch timeout (a send unanswered this long is sent again).
        max_in_flight: batches submitted and not yet taken by :meth:`ready` before
            :meth:`submit` blocks.
        label: for messages (``FUNCTION enrich (line 3)``).
    """

    def __init__(
        self,
        hub: PluginHub,
        name: str,
        input_schema: pa.Schema,
        output_schema: pa.Schema,
        timeout: timedelta,
        max_in_flight: int,
        label: str,
    ) -> None:
        self.hub = hub
        self.name = name
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.timeout_s = timeout.total_seconds()
        self.max_in_flight = max_in_flight
        self.label = label or f"plugin {name}"
        self.queue: deque[_Request] = deque()
        self._requests: deque[_Request] = deque()  # submitted, not yet taken, in seq order
        self._seq = 0
        self._refused: dict[int, str] = {}
        self.error: str | None = None
        self.resends = 0

    # --- called by the hub (lock held) ------------------------------------------------------

    def accepts(self, instance: PluginInstance) -> bool:
        """Whether ``instance`` fits this stage: it declares the stage's output schema and an
        input schema whose columns the stream has. A misfit is refused once, with an error
        naming the fields, and never gets this stage's batches."""
        if instance.id in self._refused:
            return False
        declaration = instance.declaration
        diff = schema_difference(declaration.output_schema, self.output_schema)
        if diff:
            self.refuse(
                instance,
                f"declares output columns that differ from {self.label}'s RETURNS TABLE: {diff}",
            )
            return False
        missing = [f.name for f in declaration.input_schema if self.input_schema.get_field_index(f.name) < 0]
        if missing:
            self.refuse(
                instance,
                f"declares input columns {', '.join(missing)} that the stream "
                f"({', '.join(self.input_schema.names)}) lacks",
            )
            return False
        return True

    def refuse(self, instance: PluginInstance, message: str) -> None:
        self._refused[instance.id] = message
        self.error = f"plugin {self.name} instance {instance.id} {message}"
        self.hub._errors[self.name] = self.error

    def adapt(self, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
        """``batch``'s columns named in ``schema``, in its order, cast to its types."""
        columns = [batch.column(f.name).cast(f.type) for f in schema]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def requeue(self, request: _Request) -> None:
        """Put a taken-back batch back in the queue, in sequence order."""
        self.resends += 1
        position = 0
        for position, queued in enumerate(self.queue):  # noqa: B007 - the index is the result
            if queued.seq > request.seq:
                break
        else:
            position = len(self.queue)
        self.queue.insert(position, request)

    # --- called by the pipeline's thread ------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Batches submitted and not yet taken by :meth:`ready`."""
        return len(self._requests)

    def submit(self, batch: pa.RecordBatch, partition: str) -> int:
        """Queue ``batch`` (of the stream's ``partition``) for the plugin; its sequence number.
        Does not block (call :meth:`wait` first when :attr:`outstanding` is at the bound)."""
        with self.hub._cond:
            request = _Request(self, self._seq, batch, partition)
            self._seq += 1
            self._requests.append(request)
            self.queue.append(request)
            self.hub._dispatch(self.name)
            return request.seq

    def ready(self) -> list[tuple[int, str, pa.RecordBatch]]:
        """The results now ready at the head, in submission order: ``(seq, partition, batch)``.
        Re-sends the batches whose timeout passed first."""
        out: list[tuple[int, str, pa.RecordBatch]] = []
        with self.hub._cond:
            self._expire()
            while self._requests and self._requests[0].result is not None:
                request = self._requests.popleft()
                assert request.result is not None
                out.append((request.seq, request.partition, request.result))
            return out

    def waiting_for(self) -> str | None:
        """``waiting for plugin <name>`` while no attached instance can take this stage's
        batches, else ``None``."""
        with self.hub._cond:
            instances = [
                i
                for i in self.hub._instances.get(self.name, [])
                if not i.closed and i.id not in self._refused
            ]
            if instances or not self._requests:
                return None
            return f"waiting for plugin {self.name}"

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the head's result; re-send timed-out batches
        meanwhile. Returns whether the head's result is ready."""
        deadline = time.monotonic() + timeout_s
        with self.hub._cond:
            while True:
                if not self._requests or self._requests[0].result is not None:
                    return bool(self._requests)
                self._expire()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.hub._cond.wait(min(left, _POLL_S))

    def _expire(self) -> None:
        now = time.monotonic()
        for request in self._requests:
            instance = request.instance
            if instance is None or request.result is not None or now < request.deadline:
                continue
            assert request.wire is not None
            wire = request.wire
            instance.in_flight.pop(wire, None)
            instance.timeouts += 1
            request.timed_out_on = instance.id
            request.instance = None
            request.wire = None
            self.error = (
                f"plugin {self.name} instance {instance.id}: no result for seq {wire} (batch "
                f"{request.seq} of {self.label}) within {self.timeout_s:g} s; sent again"
            )
            self.requeue(request)
        self.hub._dispatch(self.name)

    def close(self) -> None:
        """The pipeline stops: withdraw this stage's queued and outstanding batches."""
        self.hub._remove_stage(self)

