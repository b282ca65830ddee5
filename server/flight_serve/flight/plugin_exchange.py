"""``DoExchange(path = ["plugins", <name>])``: an out-of-process plugin attaches (schemas/README.md,
"Plugin protocol").

1. The plugin's first message is metadata-only: the **hello**, UTF-8 JSON
   ``{"protocol": 1, "input_schema": <b64 IPC schema>, "output_schema": <b64 IPC schema>,
   "max_in_flight": n}``. A bad hello ends the call INVALID_ARGUMENT naming the field.
2. The server starts its stream with the declared input schema and answers metadata-only
   ``{"accepted": true, "protocol": 1, "instance": <id>, "heartbeat_ms": 1000}``.
3. The server writes input batches, each with app_metadata ``{"seq": N}``; the plugin writes
   exactly one result batch per input batch (zero rows allowed), with app_metadata
   ``{"seq": N}``, its stream's schema being the declared output schema.
4. With nothing to send for ``heartbeat_ms`` the server writes ``{"heartbeat": true}``; the
   plugin may write metadata-only ``{"heartbeat": true}`` too (ignored), or
   ``{"error": "<text>"}`` to give up (the server detaches it with that error).

5. When the server stops it writes ``{"closing": true}`` and waits (up to :data:`CLOSE_WAIT_S`)
   for the plugin to finish writing: the handler must not return while its reader thread still
   reads the call's stream (the stream is freed then, and the pending read crashes the process).

A result with a wrong schema, without a ``seq``, for a ``seq`` never sent, or a second result
for one ``seq`` detaches the instance: its outstanding batches go to another instance (or wait
for one), the error is kept for the status of the pipelines calling it, and the call ends
INVALID_ARGUMENT with the same text. Other calls of the server are not affected.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve._wire import WireError, decode_json
from flight_serve.errors import InvalidInputError, PluginProcessError
from flight_serve.flight.ops.roles import require_role
from flight_serve.pipelines.plugins import (
    PROTOCOL_VERSION,
    PluginDeclaration,
    PluginHub,
    PluginInstance,
    schema_difference,
)

__all__ = ["CLOSE_WAIT_S", "HEARTBEAT_S", "HELLO_TIMEOUT_S", "handle_plugin_exchange"]

#: Seconds without a batch to send after which the server writes a heartbeat.
HEARTBEAT_S = 1.0
#: Seconds after the call opened without a hello after which the server writes an ``{"error"}``
#: message saying what it waits for (it goes on waiting: the call ends when the client ends it).
HELLO_TIMEOUT_S = 10.0
#: Seconds the server waits, when it stops, for an attached plugin to end its write side after
#: the ``{"closing": true}`` message (its handler must not return while its results are read).
CLOSE_WAIT_S = 10.0
_NAME_LIMIT = 200


def _json(payload: dict[str, Any]) -> pa.Buffer:
    return pa.py_buffer(json.dumps(payload, separators=(",", ":")).encode())


def _metadata(buffer: pa.Buffer | None) -> dict[str, Any] | None:
    """A plugin message's app_metadata as a JSON object; ``None`` when there is none or it is
    not one (the caller says what it expected)."""
    try:
        return decode_json(buffer, "plugin message")
    except (WireError, RecursionError):  # RecursionError: JSON nested too deep to decode
        return None


def plugin_name(descriptor: flight.FlightDescriptor) -> str:
    """The plugin name of ``path = ["plugins", name]``.

    Raises:
        InvalidInputError: the path has another shape, or the name is empty or longer than 200.
    """
    path = [p.decode("utf-8", errors="replace") if isinstance(p, bytes) else str(p) for p in descriptor.path or []]
    if len(path) != 2 or path[0] != "plugins":
        raise InvalidInputError(
            f"DoExchange path {path!r}: a plugin attaches with path [\"plugins\", <name>]"
        )
    name = path[1]
    if not name or len(name) > _NAME_LIMIT or not name.isprintable():
        raise InvalidInputError(
            f"DoExchange path: the plugin name must be 1 to {_NAME_LIMIT} printable characters"
        )
    return name


class _Reader:
    """Reads the plugin's results on its own thread (the handler's thread writes)."""

    def __init__(
        self,
        hub: PluginHub,
        instance: PluginInstance,
        context: flight.ServerCallContext,
        reader: flight.MetadataRecordBatchReader,
        sent: set[int],
        lock: threading.Lock,
    ) -> None:
        self.hub = hub
        self.context = context
        self.instance = instance
        self.reader = reader
        self.sent = sent
        self.lock = lock
        self.error: str | None = None
        #: the error is the process's or the connection's (it died, the stream broke), not a
        #: message of the plugin's that breaks the protocol
        self.broke = False
        self.thread = threading.Thread(
            target=self.main, name=f"flight-serve-plugin-{instance.id}", daemon=True
        )

    def fail(self, message: str, *, broke: bool = False) -> None:
        self.error = message
        self.broke = broke
        self.hub.detach(self.instance, message)

    def main(self) -> None:
        declared = self.instance.declaration.output_schema
        checked = False
        try:
            while not self.instance.closed:
                chunk = self.reader.read_chunk()
                meta = _metadata(chunk.app_metadata)
                if chunk.data is None:
                    if meta is None:
                        self.fail("a metadata-only message that is not a JSON object")
                        return
                    if "error" in meta:
                        self.fail(f"the plugin reported: {meta['error']}")
                        return
                    continue  # a heartbeat (or anything else metadata-only): ignored
                if not checked:
                    diff = schema_difference(self.reader.schema, declared)
                    if diff:
                        self.fail(f"results have other columns than its declared output: {diff}")
                        return
                    checked = True
                seq = meta.get("seq") if meta is not None else None
                if not isinstance(seq, int) or isinstance(seq, bool):
                    self.fail(
                        f"a result batch without an integer \"seq\" in its app_metadata "
                        f"(got {chunk.app_metadata.to_pybytes()[:80]!r})"
                        if chunk.app_metadata is not None
                        else "a result batch without app_metadata (expected {\"seq\": N})"
                    )
                    return
                with self.lock:
                    known = seq in self.sent
                    self.sent.discard(seq)
                if not known:
                    self.fail(f"a result for seq {seq}, which is not outstanding")
                    return
                self.hub.complete(self.instance, seq, chunk.data)
        except StopIteration:
            if self.context.is_cancelled():  # the process died or the connection broke
                self.fail(
                    "its call was cancelled (the process ended or the connection broke)", broke=True
                )
            else:  # the plugin finished writing: it leaves (not an error)
                self.hub.detach(self.instance, None)
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            if not self.instance.closed:
                # pyarrow reports undecodable bytes (a second schema mid-stream) and a broken
                # connection alike: kept the plugin's (INVALID_ARGUMENT), as before
                self.fail(f"its stream broke: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        except Exception as exc:  # never let a plugin's bytes take the server down
            self.fail(f"unreadable message: {exc!r}")


def _read_hello(
    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter
) -> flight.FlightStreamChunk:
    """The call's first message after the descriptor (and the output schema, if sent first).

    The read blocks until the client sends something (pyarrow cannot time it out, and the
    handler must not return while a read is pending: the call's stream is freed then). A
    watchdog tells a client that has sent nothing readable :data:`HELLO_TIMEOUT_S` seconds
    after the call opened why it waits, with a metadata-only ``{"error": …}``.

    Raises:
        InvalidInputError: the client finished writing without a hello.
    """
    done = threading.Event()
    lock = threading.Lock()  # the watchdog writes only before the handler moves on

    def watchdog() -> None:
        if done.wait(HELLO_TIMEOUT_S):
            return
        with lock:
            if done.is_set():
                return
            with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
                writer.write_metadata(
                    _json(
                        {
                            "error": f"plugin exchange: no hello within {HELLO_TIMEOUT_S:g} s. "
                            "The hello is the first metadata-only message after the descriptor; "
                            "the server does not see app_metadata on a message that carries the "
                            "descriptor or a schema, so send the hello as a message of its own "
                            "(schemas/README.md)"
                        }
                    )
                )

    threading.Thread(target=watchdog, name="flight-serve-plugin-hello", daemon=True).start()
    try:
        return reader.read_chunk()
    except StopIteration:
        raise InvalidInputError("plugin exchange: no hello message") from None
    finally:
        with lock:
            done.set()


def _wait_for_reader(
    results: _Reader, writer: flight.MetadataRecordBatchWriter, closing: threading.Event
) -> None:
    """Let the reader thread end before the handler returns: the call's stream is freed when
    the handler returns, and a read still pending then crashes the process. When the server
    stops, the plugin is asked to finish writing (``{"closing": true}``); a plugin that does
    not within :data:`CLOSE_WAIT_S` seconds is left (the handler returns regardless)."""
    if not results.thread.is_alive() or results.thread.ident is None:
        return
    if closing.is_set():
        with contextlib.suppress(flight.FlightError, pa.ArrowException, OSError):
            writer.write_metadata(_json({"closing": True}))
    results.thread.join(CLOSE_WAIT_S)


def handle_plugin_exchange(
    hub: PluginHub,
    context: flight.ServerCallContext,
    descriptor: flight.FlightDescriptor,
    reader: flight.MetadataRecordBatchReader,
    writer: flight.MetadataRecordBatchWriter,
    closing: threading.Event,
) -> None:
    """Serve one attached plugin instance until it leaves, fails, or the server stops.

    Raises:
        InvalidInputError: a bad path or hello (nothing is attached then), or the instance was
            detached for an error (wrong result schema, a bad tag, a reported error).
        pyarrow.flight.FlightUnauthorizedError: the server has tokens and the caller's lacks the
            ``write`` role.
    """
    name = plugin_name(descriptor)
    # a plugin's results become pipeline output: attaching one writes (DoExchange alone is read)
    require_role(context, "write", "DoExchange attaching a plugin")
    first = _read_hello(reader, writer)
    if first.data is not None or first.app_metadata is None:
        raise InvalidInputError(
            "plugin exchange: the first message must be metadata-only: the hello JSON "
            "{\"protocol\": 1, \"input_schema\": …, \"output_schema\": …, \"max_in_flight\": n}"
        )
    declaration = PluginDeclaration.from_hello(name, first.app_metadata.to_pybytes())
    instance = hub.attach(declaration)
    sent: set[int] = set()
    lock = threading.Lock()
    results = _Reader(hub, instance, context, reader, sent, lock)
    try:
        writer.begin(declaration.input_schema)
        writer.write_metadata(
            _json(
                {
                    "accepted": True,
                    "protocol": PROTOCOL_VERSION,
                    "instance": instance.id,
                    "heartbeat_ms": int(HEARTBEAT_S * 1000),
                }
            )
        )
        results.thread.start()
        while not instance.closed and not closing.is_set() and not context.is_cancelled():
            item = hub.next_send(instance, HEARTBEAT_S)
            if item is None:
                if not instance.closed:
                    writer.write_metadata(_json({"heartbeat": True}))
                continue
            wire, batch = item
            with lock:
                sent.add(wire)
            writer.write_with_metadata(batch, _json({"seq": wire}))
        if context.is_cancelled() and not instance.closed:
            hub.detach(instance, "its call was cancelled (the process ended or the connection broke)")
    except (flight.FlightError, pa.ArrowException, OSError) as exc:
        hub.detach(instance, None if instance.closed else f"its stream broke: {exc}")
    finally:
        hub.detach(instance, None)
        _wait_for_reader(results, writer, closing)
    if results.error is not None:
        error = PluginProcessError if results.broke else InvalidInputError
        raise error(f"plugin {name} instance {instance.id}: {results.error}")
