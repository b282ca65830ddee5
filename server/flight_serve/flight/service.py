"""The Flight service: streams in (DoPut), query results and live tails out (DoGet).

The wire contract is ``schemas/README.md``; this module implements its "Streams", "Tickets" and
"Actions" sections (DoExchange is delegated to :mod:`flight_serve.flight.exchange`). Every handler
turns failures into Flight statuses through :func:`flight_serve.flight.status.to_flight_error`
and nowhere else.

Descriptors (read by :mod:`flight_serve.flight.descriptors`):

- ``path = [stream]``: one stream (DoPut, GetFlightInfo, GetSchema).
- ``path = [stream, writer]``: DoPut as a named writer (one watermark partition of the stream).
- ``cmd = <SQL text, UTF-8>``: a DataFusion query over the streams (GetFlightInfo, GetSchema).
- ``cmd = <google.protobuf.Any of an arrow.flight.protocol.sql message>``: Flight SQL, handed to
  :class:`~flight_serve.flight.sql.handler.FlightSqlHandler` (GetFlightInfo, GetSchema, DoPut; its
  tickets come back to DoGet and its actions are registered here).

Actions (body and result are UTF-8 JSON unless noted; unknown body keys are ignored):

- ``stream.drop`` ``{"stream": name}`` -> ``{"dropped": name}``.
- ``stream.tail`` ``{"stream": name, "offset": 0}`` -> the tail ticket bytes (``offset`` defaults
  to 0).

Other layers add actions with :meth:`FlightServeService.register_action`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve.errors import (
    ActionError,
    BatchTooLargeError,
    FlightServeError,
    InvalidInputError,
    StreamNotFoundError,
    TicketError,
)
from flight_serve.flight.actions import ActionHandler, body_stream, json_action_body
from flight_serve.flight.cancel import (
    CANCEL_STATUS_CANCELLED,
    CancellableContext,
    RunningTickets,
    cancel_flight_info_result,
    flight_info_of,
    parse_cancel_flight_info,
    stop_when,
)
from flight_serve.flight.config import DEFAULT_MAX_BATCH_BYTES
from flight_serve.flight.descriptors import put_target, sql_of, stream_of
from flight_serve.flight.doput import PutPipeline
from flight_serve.flight.markers import parse_marker
from flight_serve.flight.ops.auth import auth_server_options
from flight_serve.flight.ops.limits import DEFAULT_QUERY_WORK_BYTES, MemoryBudget, QueryLimits
from flight_serve.flight.ops.roles import require_action_role, require_role
from flight_serve.flight.sql.handler import (
    FlightSqlHandler,
    flightsql_command,
    pack,
    unpack_command,
)
from flight_serve.flight.sql.query import MAX_RESULT_BATCH_BYTES, execute, plan, split_batch
from flight_serve.flight.status import for_get_schema, to_flight_error
from flight_serve.flight.tickets import (
    QueryTicket,
    StreamRangeTicket,
    TailTicket,
    decode_ticket,
    encode_ticket,
)
from flight_serve.pipelines.plugins import PluginHub
from flight_serve.store import StreamInfo, StreamStore
from flight_serve.store.streams import WriterHold

__all__ = ["FlightServeService"]

log = logging.getLogger("flight_serve.flight")


@dataclass(frozen=True)
class _Action:
    description: str
    handler: ActionHandler


def _url_host(host: str) -> str:
    """Return ``host`` as it goes in a URI (IPv6 addresses in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _fail(exc: BaseException, rpc: str) -> NoReturn:
    raise to_flight_error(exc, rpc=rpc) from None


class FlightServeService(flight.FlightServerBase):
    """flight-serve's Flight service over a :class:`~flight_serve.store.StreamStore`.

    The server listens as soon as the object exists (pyarrow starts it in ``__init__``); use it
    as a context manager, or call :meth:`shutdown`, which also ends running tails.

    Args:
        location: where to listen, e.g. ``"grpc://127.0.0.1:0"`` (port 0 picks a free port).
        store: the streams to serve; the caller owns it and closes it after shutdown.
        max_batch_bytes: largest DoPut batch accepted (``RecordBatch.nbytes``), 64 MiB by default.
        tail_poll_s: how often (seconds) a waiting tail checks for cancellation and shutdown.
        users: user name -> password; every call then needs them (Basic handshake, then the
            bearer token it returns; :mod:`flight_serve.flight.ops.auth`). ``None``: open.
        memory_budget: bounds query inputs, DoPut batches in flight and window state
            (:class:`~flight_serve.flight.ops.limits.MemoryBudget`); ``None``: no budget.
        statement_timeout_s: seconds a SQL query (DoGet) or Flight SQL statement may run
            before DEADLINE_EXCEEDED (:mod:`flight_serve.flight.sql.query`); ``None``: no limit.
        query_work_bytes: DataFusion's memory pool per query under a budget, bytes.
        **kwargs: passed to :class:`pyarrow.flight.FlightServerBase` (auth, TLS, middleware).

    Attributes:
        store: the stream store.
        location: the URI clients connect to, with the real port (``grpc://127.0.0.1:PORT``).
    """

    def __init__(
        self,
        location: str = "grpc://127.0.0.1:0",
        *,
        store: StreamStore,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        tail_poll_s: float = 0.1,
        users: Mapping[str, str] | None = None,
        memory_budget: MemoryBudget | None = None,
        statement_timeout_s: float | None = None,
        query_work_bytes: int = DEFAULT_QUERY_WORK_BYTES,
        **kwargs: Any,
    ) -> None:
        # Set before super().__init__: pyarrow starts serving inside it.
        self.store = store
        self.memory_budget = memory_budget
        self.query_limits = QueryLimits(memory_budget, query_work_bytes, statement_timeout_s)
        self.max_batch_bytes = max_batch_bytes
        self.tail_poll_s = tail_poll_s
        self._closing = threading.Event()
        self._actions: dict[str, _Action] = {}
        self.register_action(
            "stream.drop",
            'Drop a stream and its data. Body: {"stream": name}. Result: {"dropped": name}.',
            self._action_stream_drop,
        )
        self.register_action(
            "stream.tail",
            'Make a tail ticket that follows a stream live. Body: {"stream": name, "offset": 0}. '
            "Result: the ticket bytes, for DoGet.",
            self._action_stream_tail,
        )
        # DoPut calls in progress per (stream, writer): stream.writer_wait waits for none
        self._puts: dict[tuple[str, str], int] = {}
        self._puts_changed = threading.Condition()
        self.register_action(
            "stream.writer_wait",
            "Wait until no DoPut of a named writer is in progress (the batches of a call whose "
            'client is gone are all written first). Body: {"stream": name, "writer": name, '
            '"timeout_s": 10}. Result: {"active": <DoPut calls still in progress>}.',
            self._action_writer_wait,
        )
        self.flightsql = FlightSqlHandler(store)
        self.flightsql.engine.limits = self.query_limits
        self.plugins = PluginHub()  # attached plugin instances (flight/plugin_exchange.py)
        #: the server's PipelineManager, set by start_server (None: no pipelines); the console
        #: reads pipelines through it (flight_serve.console.source)
        self.pipeline_manager: Any = None
        self.register_action(
            "plugin.list",
            'The attached plugin instances. Body: {} (or empty). Result: {"instances": {name: '
            '[{id, max_in_flight, outstanding, sent, answered, timeouts}]}, "errors": {name: '
            "last error}}.",
            lambda context, body: [json.dumps(self.plugins.describe()).encode()],
        )
        self.flightsql.register_actions(self.register_action)
        # DoGet calls in progress, for CancelFlightInfo / CancelQuery (flight/cancel.py)
        self.running = RunningTickets()
        self.register_action(
            "CancelFlightInfo",
            "Cancel the DoGet calls in progress of a FlightInfo's tickets (Flight's standard "
            "action). Body: CancelFlightInfoRequest. Result: CancelFlightInfoResult (CANCELLED).",
            self._action_cancel_flight_info,
        )
        self.register_action(
            "CancelQuery",
            "Flight SQL (deprecated in favour of CancelFlightInfo): cancel a query's DoGet. Body: "
            "Any(ActionCancelQueryRequest). Result: Any(ActionCancelQueryResult).",
            self._action_cancel_query,
        )
        kwargs = auth_server_options(users, kwargs)
        super().__init__(location, **kwargs)
        parts = urlsplit(location)
        host = parts.hostname or "127.0.0.1"
        self.location = f"{parts.scheme}://{_url_host(host)}:{self.port}"

    # --- lifecycle ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop serving: end running tails, then wait for in-flight calls to finish."""
        self._closing.set()
        self.plugins.close()
        super().shutdown()

    def register_action(self, action_type: str, description: str, handler: ActionHandler) -> None:
        """Add (or replace) the DoAction ``action_type``; ListActions shows ``description``.

        The handler's exceptions go through ``to_flight_error`` like every other handler's.
        """
        self._actions[action_type] = _Action(description, handler)

    # --- DoPut -------------------------------------------------------------------------------

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """Append every batch of the upload to stream ``path[0]`` (created on first put).

        Each batch is acknowledged by a PutResult after it is durable; its app_metadata is JSON
        ``{"offset": <int>, "rows": <int>}``. Batches appended before a failure stay.

        The call writes as one writer of the stream (a watermark partition): ``path[1]``, else
        the stream's unnamed writer ``""`` (shared by every unnamed call). A metadata-only message is a marker
        (:mod:`flight_serve.flight.markers`): a watermark or the writer's end of input, stored
        as an entry without rows and acknowledged like a batch. Ending the call without
        ``{"end_of_input": true}`` does not end the writer.

        Pipelined with group commit (see :class:`~flight_serve.flight.doput.PutPipeline`): reading, encoding and the
        disk overlap, one fdatasync covers every batch written so far, and each PutResult is
        sent only after the fdatasync that covers its batch.

        Errors: INVALID_ARGUMENT for a non-path descriptor, an invalid stream name, a schema
        mismatch (naming the fields) or a batch above ``max_batch_bytes`` (naming the limit).
        A call that created the stream and fails before anything is in it (its first batch
        refused) drops that stream again, unless another writer wrote to it meanwhile
        (:meth:`~flight_serve.store.StreamStore.drop_if_empty`): a refused first put leaves no
        stream behind, as Flight SQL ingest does. A stream that existed before is left as it is.
        """
        try:
            if (command := flightsql_command(descriptor)) is not None:
                self.flightsql.do_put(context, command, reader, writer)
                return
        except Exception as exc:
            _fail(exc, "DoPut")
        pipeline: PutPipeline | None = None
        target: tuple[str, str] | None = None
        hold: WriterHold | None = None
        created: str | None = None  # the incarnation of the stream this call created
        try:
            require_role(context, "write", "DoPut")
            name, writer_name = put_target(descriptor)
            if writer_name:  # a named writer has one live DoPut (the unnamed one is shared)
                since = datetime.now(UTC).isoformat(timespec="seconds")
                hold = self.store.hold_writer(
                    name, writer_name, f"a DoPut from {context.peer()} since {since}"
                )
            target = self._put_begins(name, writer_name)
            info, made = self.store.create_if_missing(name, reader.schema)
            created = info.incarnation if made else None
            pipeline = PutPipeline(self.store, name, writer, writer_name, self.memory_budget)
            for chunk in reader:
                batch = chunk.data
                if batch is None:  # metadata-only message: a marker
                    if chunk.app_metadata is not None:
                        pipeline.put(parse_marker(chunk.app_metadata.to_pybytes()))
                    continue
                if batch.nbytes > self.max_batch_bytes:
                    raise BatchTooLargeError(
                        f"batch of {batch.nbytes} bytes exceeds the maximum batch size of "
                        f"{self.max_batch_bytes} bytes; split it into smaller batches"
                    )
                self.store.validate(name, batch)  # a mismatch is answered at once
                pipeline.put(batch)
            pipeline.finish()
        except Exception as exc:
            error: BaseException = exc
            if pipeline is not None:
                # Acknowledge what was written before the failure (it stays), then report the
                # first error (a pipeline thread's error came before this one).
                try:
                    pipeline.finish()
                except Exception as first:
                    error = first
            if created is not None:  # nothing of this call is in it: the stream it made goes
                try:
                    self.store.drop_if_empty(name, created)
                except FlightServeError as dropping:
                    log.warning("DoPut: the empty stream %r stays: %s", name, dropping)
            _fail(error, "DoPut")
        finally:
            if target is not None:
                self._put_ends(target)
            if hold is not None:
                hold.release()

    def _put_begins(self, stream: str, writer: str) -> tuple[str, str]:
        with self._puts_changed:
            self._puts[(stream, writer)] = self._puts.get((stream, writer), 0) + 1
        return stream, writer

    def _put_ends(self, target: tuple[str, str]) -> None:
        """The DoPut's batches are all written (or skipped after a failure)."""
        with self._puts_changed:
            left = self._puts[target] - 1
            if left:
                self._puts[target] = left
            else:
                del self._puts[target]
            self._puts_changed.notify_all()

    # --- GetFlightInfo / GetSchema / ListFlights ---------------------------------------------

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        """Describe a stream (``path``) or plan a SQL query (``cmd``); see schemas/README.md.

        Errors: INVALID_ARGUMENT for bad SQL (DataFusion's message) or a bad descriptor,
        NOT_FOUND for an unknown stream or a table the SQL names that does not exist (as Flight
        SQL says it: :func:`~flight_serve.flight.sql.query.datafusion_error`).
        """
        try:
            if (command := flightsql_command(descriptor)) is not None:
                return self.flightsql.get_flight_info(context, descriptor, command)
            if descriptor.descriptor_type == flight.DescriptorType.PATH:
                return self._stream_flight_info(self.store.info(stream_of(descriptor)))
            schema, ticket = plan(sql_of(descriptor), self.store)
            endpoint = flight.FlightEndpoint(encode_ticket(ticket), [])
            return flight.FlightInfo(schema, descriptor, [endpoint], -1, -1)
        except Exception as exc:
            _fail(exc, "GetFlightInfo")

    def get_schema(  # type: ignore[override]  # pyarrow wants a SchemaResult, not a Schema
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.SchemaResult:
        """Return the schema of a stream (``path``) or of a SQL query's result (``cmd``)."""
        try:
            if (command := flightsql_command(descriptor)) is not None:
                return flight.SchemaResult(self.flightsql.get_schema(context, command))
            if descriptor.descriptor_type == flight.DescriptorType.PATH:
                schema = self.store.info(stream_of(descriptor)).schema
            else:
                schema, _ = plan(sql_of(descriptor), self.store)
            return flight.SchemaResult(schema)
        except Exception as exc:
            raise for_get_schema(to_flight_error(exc, rpc="GetSchema")) from None

    def list_flights(
        self, context: flight.ServerCallContext, criteria: str | bytes
    ) -> Iterator[flight.FlightInfo]:
        """Yield one FlightInfo per stream, sorted by name (``criteria`` is ignored)."""
        try:
            infos = [self._stream_flight_info(info) for info in self.store.list_streams()]
        except Exception as exc:
            _fail(exc, "ListFlights")
        yield from infos

    def _stream_flight_info(self, info: StreamInfo) -> flight.FlightInfo:
        ticket = StreamRangeTicket(info.name, info.incarnation, info.first_offset, info.next_offset)
        try:
            writers = self.store.writers(info.name)
        except StreamNotFoundError:
            writers = {}
        metadata = {
            "first_offset": info.first_offset,
            "next_offset": info.next_offset,
            "incarnation": info.incarnation,
            "writers": {
                w.name: {
                    "first_offset": w.first_offset,
                    "last_offset": w.last_offset,
                    "watermark_ns": w.watermark_ns,
                    "ended_at": w.ended_at,
                }
                for w in writers.values()
            },
        }
        return flight.FlightInfo(
            info.schema,
            flight.FlightDescriptor.for_path(info.name),
            [flight.FlightEndpoint(encode_ticket(ticket), [])],
            info.num_rows,
            info.num_bytes,
            True,
            json.dumps(metadata).encode(),
        )

    # --- DoGet -------------------------------------------------------------------------------

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        """Stream what ``ticket`` names: a query result, a stream offset range, or a live tail.

        Every batch is at most 3 MiB (``RecordBatch.nbytes``). Tail batches carry app_metadata
        JSON ``{"offset": <int>}``; a stored batch above 3 MiB arrives as ``n`` consecutive
        pieces with the same offset, each also carrying ``"piece": i, "pieces": n`` (``i`` from
        0). A tail ends when the stream is dropped, the client cancels, or the server shuts
        down.

        Errors: INVALID_ARGUMENT for a malformed, unknown-version or stale ticket, and for a
        query DataFusion rejects (also mid-stream).
        """
        try:
            flag = self.running.begin(ticket.ticket)  # CancelFlightInfo sets it
            call: Any = CancellableContext(context, flag)
            if (command := unpack_command(ticket.ticket)) is not None:
                return self.flightsql.do_get(call, command)
            decoded = decode_ticket(ticket.ticket)
            if isinstance(decoded, QueryTicket):
                schema, batches = execute(
                    decoded, self.store, limits=self.query_limits, is_cancelled=call.is_cancelled
                )
                return flight.GeneratorStream(schema, self._guarded(stop_when(flag, batches)))
            schema = self._pinned_schema(decoded.stream, decoded.incarnation)
            if isinstance(decoded, StreamRangeTicket):
                items = self.store.read(
                    decoded.stream,
                    decoded.start_offset,
                    decoded.stop_offset,
                    incarnation=decoded.incarnation,
                )
                pieces = (p for _, b in items for p in split_batch(b, MAX_RESULT_BATCH_BYTES))
                return flight.GeneratorStream(schema, self._guarded(stop_when(flag, pieces)))
            tail: Iterator[Any] = self._tail(call, decoded)
            return flight.GeneratorStream(schema, self._guarded(stop_when(flag, tail)))
        except Exception as exc:
            _fail(exc, "DoGet")

    def _pinned_schema(self, stream: str, incarnation: str) -> pa.Schema:
        try:
            info = self.store.info(stream)
        except StreamNotFoundError:
            info = None
        if info is None or info.incarnation != incarnation:
            raise TicketError(
                f"stale ticket: stream {stream!r} incarnation {incarnation} no longer exists "
                "(dropped or re-created); ask for a new ticket"
            )
        return info.schema

    def _tail(
        self, context: flight.ServerCallContext, ticket: TailTicket
    ) -> Iterator[tuple[pa.RecordBatch, pa.Buffer]]:
        offset = ticket.start_offset
        empty: pa.RecordBatch | None = None  # a marker travels as a message without rows
        while not self._closing.is_set() and not context.is_cancelled():
            try:
                entries = self.store.entries(ticket.stream, offset, incarnation=ticket.incarnation)
                end = self.store.info(ticket.stream).next_offset  # >= the end of this read
                for entry in entries:
                    message: dict[str, Any] = {
                        "offset": entry.offset,
                        "writer": entry.writer,
                        "next_offset": end,
                    }
                    offset = entry.offset + 1
                    if entry.batch is None:
                        if empty is None:
                            schema = self.store.info(ticket.stream).schema
                            empty = pa.RecordBatch.from_pylist([], schema=schema)
                        if entry.end_of_input:
                            message["end_of_input"] = True
                        else:
                            message["watermark_ns"] = entry.watermark_ns
                        yield empty, pa.py_buffer(json.dumps(message).encode())
                        continue
                    pieces = list(split_batch(entry.batch, MAX_RESULT_BATCH_BYTES))
                    for i, piece in enumerate(pieces):
                        if len(pieces) > 1:
                            message.update(piece=i, pieces=len(pieces))
                        yield piece, pa.py_buffer(json.dumps(message).encode())
                self.store.wait_for(ticket.stream, offset, timeout_s=self.tail_poll_s)
            except StreamNotFoundError:
                return  # dropped or re-created: the tail ends

    @staticmethod
    def _guarded(items: Iterable[Any]) -> Iterator[Any]:
        """Re-raise errors from a lazily produced DoGet stream as Flight statuses."""
        try:
            yield from items
        except Exception as exc:
            _fail(exc, "DoGet")

    def _action_cancel_flight_info(
        self, context: flight.ServerCallContext, body: bytes
    ) -> list[bytes]:
        info = parse_cancel_flight_info(body)
        self._cancel_info(info)
        return [cancel_flight_info_result(CANCEL_STATUS_CANCELLED)]

    def _action_cancel_query(self, context: flight.ServerCallContext, body: bytes) -> list[bytes]:
        request = unpack_command(body)
        if not isinstance(request, sql_pb2.ActionCancelQueryRequest):
            raise InvalidInputError("CancelQuery needs Any(ActionCancelQueryRequest)")
        self._cancel_info(flight_info_of(request.info, "ActionCancelQueryRequest.info"))
        result = sql_pb2.ActionCancelQueryResult(
            result=sql_pb2.ActionCancelQueryResult.CANCEL_RESULT_CANCELLED
        )
        return [pack(result)]

    def _cancel_info(self, info: flight.FlightInfo) -> None:
        tickets = [endpoint.ticket.ticket for endpoint in info.endpoints]
        for ticket in tickets:  # each must be one of this server's tickets
            if unpack_command(ticket) is None:
                decode_ticket(ticket)
        cancelled = self.running.cancel(tickets)
        log.info("cancel", extra={"tickets": len(tickets), "calls_cancelled": cancelled})

    # --- DoExchange --------------------------------------------------------------------------

    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        """Run an inline streaming transform (:mod:`flight_serve.flight.exchange`), or serve an
        attached plugin for ``path = ["plugins", name]`` (:mod:`flight_serve.flight.plugin_exchange`)."""
        from flight_serve.flight.exchange import handle_exchange
        from flight_serve.flight.plugin_exchange import handle_plugin_exchange

        try:
            if descriptor.descriptor_type == flight.DescriptorType.PATH:
                handle_plugin_exchange(
                    self.plugins, context, descriptor, reader, writer, self._closing
                )
                return
            handle_exchange(self, context, descriptor, reader, writer)
        except Exception as exc:
            _fail(exc, "DoExchange")

    # --- DoAction / ListActions --------------------------------------------------------------

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[bytes]:
        """Run ``action`` (see :meth:`list_actions`); returns the result bodies.

        Errors: INVALID_ARGUMENT for an unknown action or a malformed body, NOT_FOUND for an
        unknown stream.
        """
        try:
            require_action_role(context, action.type)  # before saying which actions exist
            entry = self._actions.get(action.type)
            if entry is None:
                known = ", ".join(sorted(self._actions))
                raise ActionError(f"unknown action {action.type!r}; known actions: {known}")
            return list(entry.handler(context, action.body.to_pybytes()))
        except Exception as exc:
            _fail(exc, "DoAction")

    def list_actions(self, context: flight.ServerCallContext) -> list[flight.ActionType]:  # type: ignore[override]
        """Describe every action, sorted by type."""
        return [
            flight.ActionType(name, self._actions[name].description)
            for name in sorted(self._actions)
        ]

    def _action_stream_drop(self, context: flight.ServerCallContext, body: bytes) -> list[bytes]:
        name = body_stream(json_action_body(body, "stream.drop"), "stream.drop")
        self.store.drop(name)
        return [json.dumps({"dropped": name}).encode()]

    def _action_writer_wait(self, context: flight.ServerCallContext, body: bytes) -> list[bytes]:
        """Wait (up to ``timeout_s`` seconds, at most 30) until no DoPut of the writer is in
        progress: a producer that lost its connection calls it before it reads back what
        landed, so that no batch of its old call is written after the read."""
        parsed = json_action_body(body, "stream.writer_wait")
        name = body_stream(parsed, "stream.writer_wait")
        writer = parsed.get("writer")
        if not isinstance(writer, str):
            raise ActionError('stream.writer_wait: "writer" must be a writer name (a string)')
        timeout = parsed.get("timeout_s", 10)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ActionError('stream.writer_wait: "timeout_s" must be a number >= 0')
        with self._puts_changed:
            self._puts_changed.wait_for(
                lambda: (name, writer) not in self._puts, timeout=min(float(timeout), 30.0)
            )
            active = self._puts.get((name, writer), 0)
        return [json.dumps({"active": active}).encode()]

    def _action_stream_tail(self, context: flight.ServerCallContext, body: bytes) -> list[bytes]:
        parsed = json_action_body(body, "stream.tail")
        name = body_stream(parsed, "stream.tail")
        offset = parsed.get("offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ActionError('stream.tail: "offset" must be an integer >= 0')
        info = self.store.info(name)
        return [encode_ticket(TailTicket(name, info.incarnation, offset))]
