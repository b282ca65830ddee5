"""The ``flight`` connector: a stream on a flight-serve server as a pipeline source or sink.

It speaks Arrow Flight (``pyarrow.flight``) to the server, following the wire contract of
``schemas/README.md``; it imports nothing of the server but the errors.

Source (:class:`FlightSource`)
    Tails one stream from ``start_offset`` (action ``stream.tail``, then DoGet) on a reading
    thread; the pipeline's thread takes what it read with :meth:`FlightSource.poll`, as
    :class:`SourceEvent` values:

    * **each DoPut writer of the stream is one watermark partition** (DESIGN §4). The writers
      the stream's history already knows (GetFlightInfo's ``writers``) are partitions from the
      start, so a writer that is behind holds the watermark back before it sends anything; a
      writer that first appears in the tail becomes a partition then (``partition`` event);
    * a writer's watermark marker is a ``watermark`` event, its end-of-input marker an ``end``
      event (that partition's watermark becomes +∞);
    * ``backlog`` events say whether the tail has unread entries (entries read but not yet
      polled, or entries the server holds beyond the last one received); while it has, no
      partition can be idle (its rows may be in the backlog).

    The source is **done** when every writer it knows has ended (and it knows at least one),
    or, with ``stop_at_end``, once it has read every entry the stream held when the source was
    opened (then every writer still open ends there: a bounded read of the stream as it is).

    A dropped connection is retried from the entry it stopped in (no entry is skipped or
    repeated), :data:`RECONNECT_ATTEMPTS` times in a row with doubling pauses (in a checkpointed
    run, for :data:`RETRY_BUDGET_S` seconds: ``reconnect_s``). A stream that
    does not exist yet is waited for when the columns are declared, and so is a server that is
    unreachable when the source is made (:attr:`FlightSource.waiting_to_open`).

Sink (:class:`FlightSink`)
    One DoPut (``path = [stream, writer]``) held open for the run: every batch is written and
    its PutResult (the batch is durable on the server) awaited before :meth:`FlightSink.write`
    returns. :meth:`FlightSink.end_input` ends the writer's partition (the run reached the end of
    its input). This is the sink of a run *without* checkpoints: a failed write fails the run,
    and a rerun appends its rows again.

Exactly-once sink (:class:`FlightStreamTarget`)
    The target of a checkpointed run's stream sink on another server: appends retried while the
    server is unreachable, replayed batches matched and skipped against what the writer already
    has in the stream (flight-serve targets); at-least-once into any other Flight server.

Ticket source (:class:`FlightTicketSource`)
    A bounded source: the batches of one DoGet ticket on any Flight server; its offset is the
    rows handed out, and a cut DoGet is opened again and that many rows skipped.

Errors: :class:`~flight_serve.errors.ConnectorError` naming the server and stream.
"""

from __future__ import annotations

import base64
import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

import pyarrow as pa
import pyarrow.flight as paflight

from flight_serve._arrow import same_rows as _same_rows
from flight_serve.connectors.base import ResumedSource, SourceEvent
from flight_serve.connectors.columns import conform
from flight_serve.errors import ConnectorError, FlightServeError, RemoteFlightError

__all__ = [
    "APPEND_WINDOW",
    "CALL_TIMEOUT_S",
    "DEFAULT_SERVER",
    "OPEN_RETRY_S",
    "RECONNECT_ATTEMPTS",
    "RETRY_BUDGET_S",
    "FlightClientAuth",
    "FlightSink",
    "FlightSource",
    "FlightStreamTarget",
    "FlightTicketSource",
    "SourceEvent",
    "WriterHistory",
]

#: The server of a ``flight`` connector without ``server = …`` (``flight-serve serve``'s default).
DEFAULT_SERVER: Final = "grpc://127.0.0.1:8815"
#: Reconnection attempts of a source's tail in a row, and the first and longest pause (seconds).
RECONNECT_ATTEMPTS: Final = 8
_BACKOFF_S: Final = (0.05, 2.0)
#: Entries the reading thread may hold ahead of the pipeline.
_QUEUE_ENTRIES: Final = 64
#: How often the reading thread looks for a stream that does not exist yet (seconds).
_WAIT_FOR_STREAM_S: Final = 0.1

@dataclass(frozen=True)
class WriterHistory:
    """What a stream's history says of one writer (GetFlightInfo ``writers``)."""

    name: str
    first_offset: int
    last_offset: int
    watermark_ns: int | None
    ended_at: int | None


@dataclass(frozen=True)
class _Opened:
    """A source that waited for its server read the stream's FlightInfo: where it reads from
    and what the stream's history says (the reading thread to the pipeline's)."""

    start: int
    partitions: tuple[str, ...]
    initial_watermarks: dict[str, int]
    end_offset: int
    incarnation: str | None


@dataclass
class _Entry:
    """One complete entry read from the tail (pieces of a split batch joined)."""

    offset: int
    writer: str
    next_offset: int
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    end_of_input: bool = False


#: The URI schemes of a Flight server (pyarrow.flight.Location).
FLIGHT_SCHEMES: Final = ("grpc", "grpc+tcp", "grpc+tls", "grpc+unix")


def server_uri_problem(server: str) -> str | None:
    """What is wrong with ``server`` as a Flight URI, or ``None``: an ``http://`` or other
    non-Flight scheme (Flight speaks gRPC: ``grpc://host:port``, ``grpc+tls://host:port``).

    >>> print(server_uri_problem("http://127.0.0.1:8815"))
    http:// is not a Flight scheme: use grpc://127.0.0.1:8815 (grpc+tls://127.0.0.1:8815 for TLS)
    >>> server_uri_problem("127.0.0.1:8815") is None
    True
    """
    if "://" not in server:
        return None
    scheme, rest = server.split("://", 1)
    if scheme.lower() in FLIGHT_SCHEMES:
        return None
    if scheme.lower() == "https":
        return f"https:// is not a Flight scheme: use grpc+tls://{rest}"
    return (
        f"{scheme}:// is not a Flight scheme: use grpc://{rest} (grpc+tls://{rest} for TLS)"
    )


def _location(server: str) -> str:
    return server if "://" in server else f"grpc+tcp://{server}"


@dataclass(frozen=True)
class FlightClientAuth:
    """How a ``flight`` connector authenticates to another server (``grpc+tls://`` for TLS).

    Attributes:
        tls_ca: PEM text of the CA(s) the server's certificate must chain to (``None``: the
            system's roots).
        tls_cert: PEM text of the client's certificate chain (mutual TLS), with ``tls_key``.
        tls_key: PEM text of the client's private key.
        token: a bearer token, sent as ``authorization: Bearer <token>`` on every call.
    """

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


class _BearerFactory(paflight.ClientMiddlewareFactory):
    def __init__(self, token: str) -> None:
        super().__init__()
        self._header: dict[str, list[str] | list[bytes]] = {
            "authorization": [f"Bearer {token}"]
        }

    def start_call(self, info: Any) -> paflight.ClientMiddleware:
        return _Bearer(self._header)


class _Bearer(paflight.ClientMiddleware):
    def __init__(self, header: dict[str, list[str] | list[bytes]]) -> None:
        super().__init__()
        self._header = header

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        return self._header


def _client(server: str, auth: FlightClientAuth | None) -> paflight.FlightClient:
    """A client of ``server`` (a Flight URI, or ``host:port``) with ``auth``."""
    if auth is None:
        return paflight.FlightClient(_location(server))
    return paflight.FlightClient(
        _location(server),
        tls_root_certs=auth.tls_ca,
        cert_chain=auth.tls_cert,
        private_key=auth.tls_key,
        middleware=[_BearerFactory(auth.token)] if auth.token else None,
    )


def _schema_text(schema: pa.Schema) -> str:
    """``schema`` as checkpoint JSON text: its Arrow IPC schema message in base64 (read back by
    a resumed run that declares no columns)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    # pyarrow appends gRPC details after the message: keep the first line, without the
    # server's ". Detail: Python exception: Traceback ..." tail
    return text.splitlines()[0].split(". Detail: ")[0] if text else type(exc).__name__


def _tls_failure(exc: BaseException) -> bool:
    """Whether a failed call is a TLS handshake that failed (gRPC reports it as UNAVAILABLE,
    with the reason in the message only): not retried."""
    text = str(exc).lower()
    return any(m in text for m in ("handshake failed", "certificate verify failed", "ssl_error"))


def _unreachable(exc: BaseException | None) -> bool:
    """Whether a failed call says the server is down or unreachable (UNAVAILABLE, a timeout;
    not a TLS handshake that failed)."""
    return isinstance(
        exc, (paflight.FlightUnavailableError, paflight.FlightTimedOutError)
    ) and not _tls_failure(exc)


def _external(exc: BaseException | None) -> bool:
    """Whether a failed call is the server's or the network's failure, not the request's: the
    server down, unreachable or timed out, a call cancelled or failed server-side (INTERNAL,
    UNKNOWN), a connection reset. A TLS handshake that failed, a refused login, a bad location
    or a status the server gives a bad request (INVALID_ARGUMENT, NOT_FOUND) is the user's."""
    if exc is None or _tls_failure(exc):
        return False
    return isinstance(
        exc,
        (
            paflight.FlightUnavailableError,
            paflight.FlightTimedOutError,
            paflight.FlightInternalError,
            paflight.FlightCancelledError,
            ConnectionError,
        ),
    ) or type(exc) is paflight.FlightServerError


def _failed(message: str, exc: BaseException | None) -> ConnectorError | RemoteFlightError:
    """``message`` as a :class:`RemoteFlightError` when ``exc`` is the server's or the
    network's failure (:func:`_external`), else as a :class:`ConnectorError`."""
    return RemoteFlightError(message) if _external(exc) else ConnectorError(message)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _writers(metadata: dict[str, Any]) -> dict[str, WriterHistory]:
    raw = metadata.get("writers")
    if not isinstance(raw, dict):
        return {}
    out = {}
    for name, item in raw.items():
        if not isinstance(item, dict):
            continue
        out[str(name)] = WriterHistory(
            str(name),
            _int_or_none(item.get("first_offset")) or 0,
            _int_or_none(item.get("last_offset")) or 0,
            _int_or_none(item.get("watermark_ns")),
            _int_or_none(item.get("ended_at")),
        )
    return out


class _Closed(Exception):
    """The source was closed while its reading thread waited."""


class FlightSource(ResumedSource):
    """Tails a server stream as a pipeline source (see the module docstring).

    Args:
        server: the server's Flight URI (``grpc://host:port``; ``host:port`` alone means
            ``grpc+tcp://``).
        stream: the stream name.
        schema: the declared columns (read exactly these, cast to these types), or ``None`` to
            take the stream's schema (the stream must exist then).
        start_offset: the first offset read (≥ 0).
        stop_at_end: stop after the entries the stream holds now (see the module docstring).

    A server that is unreachable when the source is made (UNAVAILABLE or a timeout, not a
    TLS handshake that failed) is waited for when the columns are declared: the source is made
    at once (:attr:`waiting_to_open`) and its reading thread retries GetFlightInfo with doubling
    pauses (0.05 s to 2 s; :class:`_Retrying`) for ``reconnect_s`` seconds (else
    :data:`OPEN_RETRY_S`), telling ``on_retry`` why; then the stream's history is read as it
    would have been (its writers become partitions, ``partition`` events) and
    ``check_open`` runs. Its failure is raised by :meth:`poll`.

    Raises:
        ConnectorError: the URI is bad; the server refused the call or failed the TLS
            handshake; the server stayed unreachable for :data:`OPEN_RETRY_S` seconds and no
            columns are declared; the stream does not exist and no columns are declared; or a
            declared column is missing from the stream.
    """

    def __init__(
        self,
        server: str,
        stream: str,
        *,
        schema: pa.Schema | None = None,
        start_offset: int = 0,
        stop_at_end: bool = False,
        auth: FlightClientAuth | None = None,
    ) -> None:
        self.auth = auth
        if start_offset < 0:
            raise ConnectorError(f"flight connector: start_offset must be >= 0, got {start_offset}")
        self.server = server
        self.stream = stream
        self.start_offset = start_offset
        self.stop_at_end = stop_at_end
        self.what = f"flight connector (server {server}, stream {stream!r})"
        self._declared = schema
        #: told, from the reading thread, why the source waits for its server (``"<source>:
        #: <call>: the server is unreachable for N s, retrying …"``), and ``None`` once through
        #: (a pipeline shows it as its status' ``waiting``); what it raises is ignored
        self.on_retry: Callable[[str | None], None] | None = None
        self._told = False  # on_retry was told of a wait and not yet that it is over
        self._tail_open = False  # the current tail call's DoGet was opened
        self._opening = False  # the reading thread waits for the server (open_late)
        #: when the first call failed because the server was unreachable, and how
        self._unreachable: tuple[float, BaseException] | None = None
        #: called, on the reading thread, with the source once a source that waited for its
        #: server has read the stream's FlightInfo: returns another start offset, or ``None``;
        #: what it raises fails the source (a checkpointed run's restore checks)
        self.check_open: Callable[[FlightSource], int | None] | None = None
        self._closing = threading.Event()
        self._client = self._connect()
        info = self._first_info()
        if info is None and schema is None:
            raise ConnectorError(
                f"{self.what}: the stream does not exist yet; declare the source's columns to "
                "wait for it"
            )
        self.schema: pa.Schema = schema if schema is not None else info[0]  # type: ignore[index]
        #: rows handed out (from a checkpoint on, when a checkpointed run sets it)
        self.rows = 0
        #: ``None``: give up after :data:`RECONNECT_ATTEMPTS` failed reconnections in a row;
        #: else after this many seconds of them (checkpointed runs: :data:`RETRY_BUDGET_S`;
        #: also the wait of a source whose server was unreachable when it was made)
        self.reconnect_s: float | None = None
        self._from_info(info, start_offset)
        self._known: set[str] = set(self.partitions)
        self._ended: set[str] = set()
        self._position = start_offset  # the next offset the pipeline has not polled
        self._server_end = self.end_offset  # the stream's next_offset as last reported
        self._backlog = self._server_end > start_offset
        self._done = stop_at_end and start_offset >= self.end_offset and not self.waiting_to_open
        self._queue: queue.Queue[_Entry | _Opened | BaseException] = queue.Queue(_QUEUE_ENTRIES)
        self._reader: paflight.FlightStreamReader | None = None
        self._thread: threading.Thread | None = None

    # --- the server -------------------------------------------------------------------------

    def _connect(self) -> paflight.FlightClient:
        try:
            return _client(self.server, self.auth)
        except (pa.ArrowException, OSError) as exc:
            raise _failed(f"{self.what}: cannot connect: {_message(exc)}", exc) from exc

    def _fetch_info(self, timeout_s: float | None = None) -> tuple[pa.Schema, dict[str, Any]] | None:
        """The stream's schema and FlightInfo metadata, or ``None`` if it does not exist;
        raises what the call raises (FlightTimedOutError after ``timeout_s`` seconds, default
        :data:`CALL_TIMEOUT_S`)."""
        timeout = timeout_s if timeout_s is not None else CALL_TIMEOUT_S
        try:
            info = self._client.get_flight_info(
                paflight.FlightDescriptor.for_path(self.stream),
                options=paflight.FlightCallOptions(timeout=timeout),
            )
        except pa.ArrowKeyError:
            return None
        raw = info.app_metadata
        try:
            metadata = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            metadata = {}
        return info.schema, metadata if isinstance(metadata, dict) else {}

    def _info(self, timeout_s: float | None = None) -> tuple[pa.Schema, dict[str, Any]] | None:
        """The stream's schema and FlightInfo metadata, or ``None`` if it does not exist."""
        try:
            return self._fetch_info(timeout_s)
        except (pa.ArrowException, OSError) as exc:
            raise _failed(f"{self.what}: {_message(exc)}", exc) from exc

    def _first_info(self) -> tuple[pa.Schema, dict[str, Any]] | None:
        """The FlightInfo when the source is made. An unreachable server (UNAVAILABLE, a
        timeout; not a TLS handshake) leaves a source with declared columns waiting to open
        (:attr:`waiting_to_open`: its reading thread waits for the server); without columns
        it is retried for :data:`OPEN_RETRY_S` seconds, then refused."""
        #: the server was unreachable when the source was made: the reading thread opens it
        self.waiting_to_open = False
        # a submit waits for this call: a server that does not answer gets OPEN_RETRY_S
        started = time.monotonic()
        try:
            return self._info(OPEN_RETRY_S)
        except (ConnectorError, RemoteFlightError) as exc:
            cause = exc.__cause__
            if cause is None or not _unreachable(cause):
                raise
            self._unreachable = (started, cause)
        if self._declared is not None:
            self.waiting_to_open = True
            return None
        try:
            return cast(
                "tuple[pa.Schema, dict[str, Any]] | None",
                _SourceOpener(self, OPEN_RETRY_S)._retry(
                    "reading the stream's FlightInfo",
                    lambda: self._fetch_info(OPEN_RETRY_S),
                    failed=self._unreachable,
                ),
            )
        except (ConnectorError, RemoteFlightError) as exc:
            raise type(exc)(
                f"{exc}; declare the source's columns to let the pipeline wait for the server"
            ) from exc.__cause__

    def _check_declared(self, stream_schema: pa.Schema | None) -> None:
        """Raise ConnectorError when the stream (``stream_schema``; ``None``: not there yet)
        lacks a declared column."""
        if stream_schema is not None and self._declared is not None:
            missing = [n for n in self._declared.names if stream_schema.get_field_index(n) < 0]
            if missing:
                raise ConnectorError(
                    f"{self.what}: the stream has no column {', '.join(map(repr, missing))}; its "
                    f"columns: {', '.join(stream_schema.names)}"
                )

    def _from_info(self, info: tuple[pa.Schema, dict[str, Any]] | None, start: int) -> None:
        """Set what the stream's FlightInfo says (``None``: no stream yet) for a read from
        offset ``start``.

        Raises:
            ConnectorError: a declared column is missing from the stream.
        """
        stream_schema: pa.Schema | None = info[0] if info is not None else None
        self.stream_schema = stream_schema
        self._check_declared(stream_schema)
        metadata = info[1] if info is not None else {}
        incarnation = metadata.get("incarnation")
        #: the stream's incarnation when the source was opened (``None``: no stream yet)
        self.incarnation: str | None = incarnation if isinstance(incarnation, str) else None
        #: the stream's oldest retained offset when the source was opened
        self.first_offset = _int_or_none(metadata.get("first_offset")) or 0
        #: the stream's end when the source was opened (``stop_at_end`` stops there)
        self.end_offset = _int_or_none(metadata.get("next_offset")) or 0
        self.history = _writers(metadata)
        #: writers that are partitions from the start (ended before ``start``: left out)
        self.partitions: tuple[str, ...] = tuple(
            h.name
            for h in self.history.values()
            if (h.ended_at is None or h.ended_at >= start)
            and (not self.stop_at_end or h.first_offset < self.end_offset)
        )
        #: explicit watermarks of writers whose every entry lies before ``start``
        self.initial_watermarks: dict[str, int] = {
            h.name: h.watermark_ns
            for h in self.history.values()
            if h.name in self.partitions and h.watermark_ns is not None and h.last_offset < start
        }

    # --- the pipeline's side ----------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the source has nothing more to give (see the module docstring)."""
        return self._done

    @property
    def backlog(self) -> bool:
        """Whether the tail has unread entries (as far as the source knows)."""
        return self._backlog

    @property
    def lag_entries(self) -> int:
        """Entries the server held beyond the last one handed out, as of the last message."""
        return max(self._server_end - self._position, 0)

    @property
    def position(self) -> int:
        """The next offset not handed out: entries below it were polled (an entry that made
        no event, such as a writer's second end-of-input marker, included)."""
        return self._position

    def cut_at(self, offset: int, rows: int) -> None:
        """Set the offset :meth:`position_state` records to ``offset`` (``rows`` handed out
        before it), for a source that other processes read: a distributed run's checkpoint
        cuts the stream at an offset its workers reached (``pipelines.distributed``). Only for
        a source that is not open."""
        self._position = offset
        self.rows = rows

    def position_state(self) -> dict[str, object]:
        """The offset as checkpoint JSON: the next entry not handed out, the incarnation, and
        the columns read (``schema``: the Arrow IPC schema in base64; a resumed run whose
        source declares no columns reads these, so it can wait for a server that is down)."""
        return {
            "kind": "flight",
            "server": self.server,
            "stream": self.stream,
            "incarnation": self.incarnation,
            "offset": self._position,
            "rows": self.rows,
            "schema": _schema_text(self.schema),
        }

    def start(self) -> None:
        """Start the reading thread (once)."""
        if self._thread is None and not self._done:
            self._thread = threading.Thread(
                target=self._read, name=f"flight-source-{self.stream}", daemon=True
            )
            self._thread.start()

    def poll(self, timeout_s: float, max_entries: int = 64) -> list[SourceEvent]:
        """The events of the entries read so far (up to ``max_entries``), waiting up to
        ``timeout_s`` seconds for the first one. Starts the reading thread if needed.

        Raises:
            ConnectorError: the tail failed (the stream was dropped, the server is gone after
                every reconnection attempt, a batch does not fit the declared columns), or a
                source that waited for its server failed to open (see the class docstring).
            FlightServeError: what ``check_open`` raised (a restore's ``CheckpointError``).
        """
        if self._done:
            return []
        self.start()
        events: list[SourceEvent] = []
        try:
            item = self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait()
        except queue.Empty:
            return self._backlog_event(events)
        while True:
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, _Opened):
                self._opened(item, events)
            else:
                self._take(item, events)
            if self._done or len(events) >= max_entries:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        return self._backlog_event(events)

    def _backlog_event(self, events: list[SourceEvent]) -> list[SourceEvent]:
        backlog = not self._done and (not self._queue.empty() or self._position < self._server_end)
        if backlog != self._backlog:
            self._backlog = backlog
            events.append(SourceEvent("backlog", backlog=backlog))
        return events

    def _opened(self, opened: _Opened, events: list[SourceEvent]) -> None:
        """A source that waited for its server opened: its history's writers become
        partitions (``partition`` events), with their explicit watermarks."""
        self._position = opened.start
        self.incarnation = opened.incarnation
        self._server_end = max(self._server_end, opened.end_offset)
        for writer in opened.partitions:
            if writer not in self._known:
                self._known.add(writer)
                events.append(SourceEvent("partition", writer))
        for writer, watermark_ns in opened.initial_watermarks.items():
            events.append(SourceEvent("watermark", writer, watermark_ns=watermark_ns))
        if self.stop_at_end and self._position >= opened.end_offset:
            self._stop(events)

    def _take(self, entry: _Entry, events: list[SourceEvent]) -> None:
        if self.stop_at_end and entry.offset >= self.end_offset:
            self._stop(events)
            return
        self._position = entry.offset + 1
        self._server_end = max(self._server_end, entry.next_offset)
        writer = entry.writer
        if writer not in self._known:
            self._known.add(writer)
            events.append(SourceEvent("partition", writer))
        if entry.batch is not None:
            if self.stream_schema is None:  # opened before the stream existed: check it now
                self._check_declared(entry.batch.schema)
                self.stream_schema = entry.batch.schema
            events.append(
                SourceEvent("batch", writer, conform(entry.batch, self.schema, self.what), offset=entry.offset)
            )
            self.rows += entry.batch.num_rows
        elif entry.end_of_input:
            if writer not in self._ended:
                self._ended.add(writer)
                events.append(SourceEvent("end", writer, offset=entry.offset))
        elif entry.watermark_ns is not None:
            events.append(
                SourceEvent(
                    "watermark", writer, watermark_ns=entry.watermark_ns, offset=entry.offset
                )
            )
        if self.stop_at_end and self._position >= self.end_offset:
            self._stop(events)
        elif not self.stop_at_end and self._known and self._known <= self._ended:
            self._done = True
            self.close()

    def _stop(self, events: list[SourceEvent]) -> None:
        """``stop_at_end`` reached: every writer still open ends here."""
        for writer in sorted(self._known - self._ended):
            self._ended.add(writer)
            events.append(SourceEvent("end", writer))
        self._done = True
        self.close()

    def close(self) -> None:
        """Stop the reading thread and close the connection. Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        reader = self._reader
        if reader is not None:
            with contextlib.suppress(pa.ArrowException):
                reader.cancel()
        thread = self._thread
        # a thread waiting for the server may be in a call that takes CALL_TIMEOUT_S (a server
        # that does not answer): not waited for, it stops on its own when the call ends
        if thread is not None and thread is not threading.current_thread() and not self._opening:
            thread.join(timeout=5)
        with contextlib.suppress(pa.ArrowException, OSError):
            self._client.close()

    # --- the reading thread -----------------------------------------------------------------

    def _tell(self, why: str | None) -> None:
        """Tell ``on_retry`` why the source waits for its server (``None``: it does not);
        what it raises is ignored (a pipeline asked to stop stops at its barrier)."""
        tell = self.on_retry
        if tell is not None and (why is not None or self._told):
            self._told = why is not None
            with contextlib.suppress(Exception):
                tell(why)

    def _offer(self, item: _Entry | _Opened | BaseException) -> None:
        while not self._closing.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Closed

    def _read(self) -> None:
        position = self.start_offset
        failures = 0
        down_since = 0.0  # when the failures in a row began
        incarnation: str | None = None
        try:
            if self.waiting_to_open:
                position = self._open_late()
                if self.stop_at_end and position >= self.end_offset:
                    return
            while not self._closing.is_set():
                try:
                    info = self._info()
                    if info is None:
                        if incarnation is not None:
                            raise ConnectorError(f"{self.what}: the stream was dropped")
                        time.sleep(_WAIT_FOR_STREAM_S)
                        continue
                    current = info[1].get("incarnation")
                    if incarnation is not None and current != incarnation:
                        raise ConnectorError(f"{self.what}: the stream was dropped and re-created")
                    incarnation = current if isinstance(current, str) else None
                    if self.incarnation is None:
                        self.incarnation = incarnation  # the stream appeared
                    self._tail_open = False
                    for entry in self._tail(position):
                        failures = 0
                        self._offer(entry)
                        position = entry.offset + 1
                    if self._tail_open:  # it was reached: a later outage starts a new count
                        failures = 0
                    # the server ended the tail (shut down, or the stream was dropped): look again
                    if self._closing.wait(_WAIT_FOR_STREAM_S):
                        return
                except (paflight.FlightUnavailableError, ConnectorError, RemoteFlightError) as exc:
                    cause = exc.__cause__ if isinstance(exc, FlightServeError) else exc
                    if not _unreachable(cause):
                        raise
                    if self._tail_open:  # the tail was open: this outage starts a new count
                        failures, self._tail_open = 0, False
                    down_since = down_since if failures else time.monotonic()
                    budget = (
                        f"{RECONNECT_ATTEMPTS}"
                        if self.reconnect_s is None
                        else f"{self.reconnect_s:g} s"
                    )
                    if (
                        failures >= RECONNECT_ATTEMPTS
                        if self.reconnect_s is None
                        else time.monotonic() - down_since > self.reconnect_s
                    ):
                        self._tell(None)
                        raise RemoteFlightError(
                            f"{self.what}: reading the tail failed: the server stayed unreachable "
                            f"for {time.monotonic() - down_since:.0f} s ({failures + 1} attempts "
                            f"of up to {budget}): {_message(cause or exc)}"
                        ) from exc
                    self._tell(
                        f"{self.what}: reading the tail: the server is unreachable for "
                        f"{time.monotonic() - down_since:.0f} s, retrying ({failures + 1} "
                        f"attempts of up to {budget}): {_message(cause or exc)}"
                    )
                    if self._closing.wait(min(_BACKOFF_S[0] * 2**failures, _BACKOFF_S[1])):
                        return
                    failures += 1
        except _Closed:
            return
        except BaseException as exc:
            if self._closing.is_set():
                return
            error = (
                exc
                if isinstance(exc, FlightServeError)
                else _failed(f"{self.what}: the tail failed: {_message(exc)}", exc)
            )
            with contextlib.suppress(_Closed):
                self._offer(error)

    def _open_late(self) -> int:
        """Wait for the server of a source that could not reach it when it was made (retried
        as :class:`_Retrying` does, for ``reconnect_s`` seconds, else :data:`OPEN_RETRY_S`),
        read the stream's FlightInfo, run :attr:`check_open` and tell the pipeline's thread
        (an :class:`_Opened` item); return the offset to read from.

        Raises:
            ConnectorError: the server stayed unreachable, refused the call, or the stream has
                not a declared column.
            _Closed: the source was closed meanwhile.
        """
        budget = self.reconnect_s if self.reconnect_s is not None else OPEN_RETRY_S
        self._opening = True
        try:
            info = _SourceOpener(self, budget)._retry(
                "reading the stream's FlightInfo", self._fetch_info, failed=self._unreachable
            )
        finally:
            self._opening = False
        self._tell(None)  # through (also when the stream does not exist yet)
        start = self.start_offset
        self._from_info(info, start)
        moved = self.check_open(self) if self.check_open is not None else None
        if moved is not None and moved != start:
            start = moved
            self._from_info(info, start)
        self.start_offset = start
        self._offer(
            _Opened(
                start,
                self.partitions,
                dict(self.initial_watermarks),
                self.end_offset,
                self.incarnation,
            )
        )
        return start

    def _tail(self, position: int) -> Iterator[_Entry]:
        """The complete entries of one tail call from ``position``."""

        def hold(reader: paflight.FlightStreamReader | None) -> bool:
            self._reader = reader
            if reader is not None and not self._tail_open:
                self._tail_open = True
                self._tell(None)  # through, if it waited
            return self._closing.is_set()

        yield from _tail_entries(self._client, self.stream, position, hold)


def _tail_entries(
    client: paflight.FlightClient,
    stream: str,
    position: int,
    hold: Any = None,
    timeout_s: float | None = None,
) -> Iterator[_Entry]:
    """The complete entries of one ``stream.tail`` call from ``position`` (pieces of a split
    batch joined). ``hold(reader)`` is told of the DoGet reader (``None`` at the end) and
    returns whether to stop at once; ``timeout_s`` bounds the calls (seconds)."""
    options = paflight.FlightCallOptions(timeout=timeout_s)
    body = json.dumps({"stream": stream, "offset": position}).encode()
    results = list(client.do_action(paflight.Action("stream.tail", body), options=options))
    ticket = paflight.Ticket(results[0].body.to_pybytes())
    reader = client.do_get(ticket, options=options)
    if hold is not None and hold(reader):
        reader.cancel()
        return
    pieces: list[pa.RecordBatch] = []
    try:
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            if chunk.data is None or chunk.app_metadata is None:
                continue
            message = json.loads(chunk.app_metadata.to_pybytes())
            offset = cast(int, message["offset"])
            writer = str(message.get("writer", ""))
            next_offset = _int_or_none(message.get("next_offset")) or offset + 1
            if "watermark_ns" in message or message.get("end_of_input") is True:
                yield _Entry(
                    offset,
                    writer,
                    next_offset,
                    watermark_ns=_int_or_none(message.get("watermark_ns")),
                    end_of_input=message.get("end_of_input") is True,
                )
                continue
            pieces.append(chunk.data)
            piece = _int_or_none(message.get("piece"))
            count = _int_or_none(message.get("pieces"))
            if piece is not None and count is not None and piece + 1 < count:
                continue  # more pieces of this batch follow
            batch = (
                pieces[0]
                if len(pieces) == 1
                else pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]
            )
            pieces = []
            yield _Entry(offset, writer, next_offset, batch)
    finally:
        if hold is not None:
            hold(None)
        with contextlib.suppress(pa.ArrowException):
            reader.cancel()


class FlightSink:
    """Writes a pipeline sink into a server stream over one DoPut (see the module docstring).

    Args:
        server: the server's Flight URI.
        stream: the stream written (created with ``schema`` if it does not exist).
        schema: the schema of every batch.
        writer: the writer name (the stream's watermark partition these rows belong to).

    Raises:
        ConnectorError: the server cannot be reached, or the stream has another schema.
    """

    def __init__(
        self,
        server: str,
        stream: str,
        schema: pa.Schema,
        writer: str,
        *,
        auth: FlightClientAuth | None = None,
    ) -> None:
        self.server = server
        self.stream = stream
        self.schema = schema
        self.writer_name = writer
        self.what = f"flight connector (server {server}, stream {stream!r}, writer {writer!r})"
        self.rows = 0
        self.last_offset = -1
        try:
            self._client = _client(server, auth)
            descriptor = paflight.FlightDescriptor.for_path(stream, writer)
            writer_, reader = self._client.do_put(descriptor, schema)
        except (pa.ArrowException, OSError) as exc:
            raise _failed(f"{self.what}: cannot open the DoPut: {_message(exc)}", exc) from exc
        self._writer: paflight.FlightStreamWriter | None = writer_
        self._reader = cast(paflight.FlightMetadataReader, reader)

    def _ack(self) -> dict[str, Any]:
        buffer = self._reader.read()
        if buffer is None:
            raise RemoteFlightError(f"{self.what}: the server ended the DoPut without a PutResult")
        message = json.loads(buffer.to_pybytes())
        self.last_offset = int(message["offset"])
        return cast(dict[str, Any], message)

    def _send(self, action: str, send: Any) -> None:
        if self._writer is None:
            raise ConnectorError(f"{self.what}: the sink is closed")
        try:
            send(self._writer)
            self._ack()
        except (pa.ArrowException, OSError) as exc:
            self._abort()
            raise _failed(f"{self.what}: {action} failed: {_message(exc)}", exc) from exc

    def write(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` and wait until the server has it on disk (its PutResult)."""
        if not batch.num_rows:
            return
        self._send("a write", lambda w: w.write_batch(batch))
        self.rows += batch.num_rows

    def end_input(self) -> None:
        """End this writer's partition of the stream (``{"end_of_input": true}``)."""
        payload = pa.py_buffer(b'{"end_of_input": true}')
        self._send("ending the input", lambda w: w.write_metadata(payload))

    def _abort(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                writer.close()
        with contextlib.suppress(pa.ArrowException, OSError):
            self._client.close()

    def close(self) -> None:
        """Finish the DoPut (the writer's partition stays open unless :meth:`end_input` was
        called) and close the connection. Idempotent."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.done_writing()
            writer.close()
        except (pa.ArrowException, OSError) as exc:
            raise _failed(
                f"{self.what}: closing the DoPut failed: {_message(exc)}", exc
            ) from exc
        finally:
            with contextlib.suppress(pa.ArrowException, OSError):
                self._client.close()


# --- exactly-once remote sinks and bounded ticket sources -------------------------------------

#: How long a remote sink or ticket source keeps retrying one call while the server is
#: unreachable (seconds), and its first and longest pause between attempts (seconds).
RETRY_BUDGET_S: Final = 60.0
#: Seconds one call of a remote sink or ticket source may take before it counts as lost.
CALL_TIMEOUT_S: Final = 30.0
#: Batches a remote sink's commit sends ahead of their PutResults.
APPEND_WINDOW: Final = 8
#: How long a ticket source, when the pipeline is planned, retries an unreachable server (s).
OPEN_RETRY_S: Final = 5.0


class _Lost(Exception):
    """The server ended a DoPut without a PutResult (it went away mid-call)."""


#: Failures that say "the server (or the connection to it) is gone": retried.
_RETRYABLE: Final = (
    paflight.FlightUnavailableError,
    paflight.FlightTimedOutError,
    paflight.FlightCancelledError,
    _Lost,
)


class _Retrying:
    """Runs calls against one server, retrying the retryable failures (:data:`_RETRYABLE`) with
    doubling pauses (:data:`_BACKOFF_S`) for up to ``retry_s`` seconds per call."""

    what: str
    retry_s: float
    #: told why a call is being retried (``None`` once it went through); it may raise to stop
    #: the retrying (a pipeline asked to stop)
    on_retry: Callable[[str | None], None] | None = None

    def _drop(self) -> None:
        """Forget the open calls (the connection broke)."""

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` between attempts (it may raise to stop the retrying)."""
        time.sleep(seconds)

    def _retried(self, failures: int, why: str | None) -> None:
        if self.on_retry is not None and (failures or why is not None):
            self.on_retry(why)

    def _retry(
        self,
        action: str,
        call: Any,
        landed: Any = None,
        *,
        failed: tuple[float, BaseException] | None = None,
    ) -> Any:
        """``call()``, retried; after a failed attempt ``landed()`` (if given) is asked first
        whether the failed attempt took effect after all (its result is returned then, or
        ``None``: call again). ``failed``: an attempt made before (its ``time.monotonic()``
        and failure), which the budget and the messages count.

        Raises:
            ConnectorError: a failure that is not retryable, or the server stayed unreachable
                for ``retry_s`` seconds.
        """
        started = time.monotonic() if failed is None else failed[0]
        deadline = started + self.retry_s
        failures = 0
        uncertain = False
        if failed is not None:
            self._retried(
                1,
                f"{self.what}: {action}: the server is unreachable for "
                f"{time.monotonic() - started:.0f} s, retrying (1 attempts of up to "
                f"{self.retry_s:g} s): {_message(failed[1])}",
            )
            failures = 1
        while True:
            try:
                if uncertain and landed is not None:
                    found = landed()
                    if found is not None:
                        self._retried(failures, None)
                        return found
                uncertain = False
                result = call()
                self._retried(failures, None)
                return result
            except _RETRYABLE as exc:
                self._drop()
                uncertain = True
                if _tls_failure(exc):
                    raise _failed(f"{self.what}: {action} failed: {_message(exc)}", exc) from exc
                if time.monotonic() >= deadline:
                    self._retried(failures, None)
                    raise RemoteFlightError(
                        f"{self.what}: {action} failed: the server stayed unreachable for "
                        f"{self.retry_s:g} s ({failures + 1} attempts): {_message(exc)}"
                    ) from exc
                self._retried(
                    failures + 1,
                    f"{self.what}: {action}: the server is unreachable for "
                    f"{time.monotonic() - started:.0f} s, retrying ({failures + 1} attempts "
                    f"of up to {self.retry_s:g} s): {_message(exc)}",
                )
                self._pause(min(_BACKOFF_S[0] * 2**failures, _BACKOFF_S[1]))
                failures += 1
            except (pa.ArrowException, OSError) as exc:
                self._drop()
                raise _failed(f"{self.what}: {action} failed: {_message(exc)}", exc) from exc


class _SourceOpener(_Retrying):
    """Retries a :class:`FlightSource`'s calls while its server is unreachable: a new
    connection after each failure (a gRPC channel that failed waits out its own backoff), the
    source's ``on_retry`` told why (what it raises is ignored), and a pause that a
    :meth:`FlightSource.close` ends at once."""

    def __init__(self, source: FlightSource, retry_s: float) -> None:
        self.source = source
        self.what = source.what
        self.retry_s = retry_s
        self.on_retry = self._tell

    def _tell(self, why: str | None) -> None:
        self.source._tell(why)

    def _drop(self) -> None:
        source = self.source
        with contextlib.suppress(pa.ArrowException, OSError):
            source._client.close()
        if source._closing.is_set():  # closed meanwhile: no new connection to leak
            raise _Closed
        source._client = source._connect()

    def _pause(self, seconds: float) -> None:
        if self.source._closing.wait(seconds):
            raise _Closed


class FlightStreamTarget(_Retrying):
    """A stream on another Flight server as the target of an exactly-once stream sink
    (:class:`~flight_serve.pipelines.epoch_sinks.EpochStreamSink`'s ``StreamTarget``).

    The sink appends as DoPut writer ``writer`` (``path = [stream, writer]``) over one DoPut per
    commit (:meth:`committed` finishes it); :meth:`append` returns once the server's PutResult
    says the batch is durable, :meth:`append_many` keeps up to :data:`APPEND_WINDOW` batches
    ahead of their PutResults. On a flight-serve server the sink's exactly-once rule is the one
    of a local stream: on restore it reads the writer's batches after its commit mark
    (``stream.tail``) and skips the replayed batches that are already there. A call that fails
    because the server or the connection is gone (UNAVAILABLE, a timeout, a DoPut ended without
    a PutResult) is retried with doubling pauses (0.05 s to 2 s) for up to ``retry_s`` seconds;
    before anything is sent again the writer's entries after the last acknowledged batch are
    read, so a batch that landed without its PutResult is not written twice. Every read-back
    first waits (action ``stream.writer_wait``) until the server has written out the writer's
    earlier DoPut calls, e.g. the call of a crashed run, whose received batches it still writes.

    A Flight server that is not flight-serve (ListActions has no ``stream.tail``) gets
    **at-least-once**: every append is one DoPut, finished (``done_writing`` and the call's
    status awaited) before the append returns; nothing can be read back, so a batch replayed
    after a crash is sent again.

    Args:
        server: the Flight URI (``grpc://host:port``; ``host:port`` means ``grpc+tcp://``).
        stream: the stream (created with ``schema`` by the first DoPut if it does not exist).
        schema: the sink's columns.
        writer: the writer name (the stream's watermark partition these rows belong to; the
            sink's own: no other producer may write under it).
        retry_s: seconds to keep retrying one call while the server is unreachable.
        on_retry: told, before each pause, why a call is retried (``"<sink>: <call>: the
            server is unreachable for N s, retrying …"``), and ``None`` once it went through
            (a pipeline shows it as its status' ``waiting``; it may raise to stop retrying).

    Raises:
        ConnectorError: the server stayed unreachable for ``retry_s`` seconds, or refused the
            DoPut (another schema, a bad writer name).
    """

    def __init__(
        self,
        server: str,
        stream: str,
        schema: pa.Schema,
        writer: str,
        *,
        retry_s: float = RETRY_BUDGET_S,
        on_retry: Callable[[str | None], None] | None = None,
        auth: FlightClientAuth | None = None,
    ) -> None:
        self.server = server
        self.auth = auth
        self.on_retry = on_retry
        self._name = stream
        self.schema = schema
        self.writer = writer
        self.retry_s = retry_s
        self.what = f"flight sink (server {server}, stream {stream!r}, writer {writer!r})"
        self._options = paflight.FlightCallOptions(timeout=CALL_TIMEOUT_S)
        self._client: paflight.FlightClient | None = None
        self._put: tuple[paflight.FlightStreamWriter, paflight.FlightMetadataReader] | None = None
        self._can_wait = False  # whether the server has stream.writer_wait
        # a call of this writer may still be in progress (ours dropped unfinished, or a dead
        # run's): _open waits for it first; a fresh target cannot know, so it waits once
        self._stale = True
        #: whether the server is a flight-serve (it lists the ``stream.tail`` action), else the
        #: sink is at-least-once
        self.exactly_once = self._retry("listing the server's actions", self._is_flight_serve)
        if self.exactly_once:
            # creates the stream; a refusal (other columns, a bad writer name, permissions)
            # fails the sink now, not at its first commit after a checkpoint was written
            self._retry("opening the DoPut", self._open_and_finish)
        #: entries before this offset are accounted for (an append's retry looks from here);
        #: read once no earlier call of the writer is in progress (a dead run's call that the
        #: server still writes out would land after it, and a retry would meet it first)
        self._after = self._retry("waiting for the writer's earlier calls", self._settled_end)

    @property
    def name(self) -> str:
        """The stream name."""
        return self._name

    # --- calls ----------------------------------------------------------------------------

    def _connect(self) -> paflight.FlightClient:
        if self._client is None:
            self._client = _client(self.server, self.auth)
        return self._client

    def _drop(self) -> None:
        put, self._put = self._put, None
        if put is not None:
            self._stale = True  # the server may still be writing it out: see _open
            with contextlib.suppress(pa.ArrowException, OSError):
                put[0].close()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                client.close()

    def _is_flight_serve(self) -> bool:
        try:
            actions = self._connect().list_actions(options=self._options)
        except (pa.ArrowNotImplementedError, paflight.FlightServerError):
            return False
        types = {action.type for action in actions}
        self._can_wait = "stream.writer_wait" in types
        return "stream.tail" in types

    def _quiesce(self) -> None:
        """Wait until the server has written every batch of this writer's earlier DoPut calls
        (a call whose client died is drained after the fact): only then is a read-back the
        whole truth.

        Raises:
            _Lost: a call is still in progress after 10 s (retried).
        """
        if not self._can_wait:
            return
        body = json.dumps({"stream": self._name, "writer": self.writer, "timeout_s": 10})
        (result,) = self._connect().do_action(
            paflight.Action("stream.writer_wait", body.encode()), options=self._options
        )
        active = json.loads(result.body.to_pybytes()).get("active", 0)
        if active:
            raise _Lost(f"{active} earlier DoPut call(s) of the writer still in progress")

    def _metadata(self) -> dict[str, Any]:
        """The stream's FlightInfo ``app_metadata`` (``{}`` if it does not exist, or the server
        keeps none)."""
        try:
            info = self._connect().get_flight_info(
                paflight.FlightDescriptor.for_path(self._name), options=self._options
            )
        except (pa.ArrowKeyError, paflight.FlightServerError, pa.ArrowNotImplementedError):
            return {}  # no such stream (or a server without GetFlightInfo for paths)
        raw = info.app_metadata
        try:
            metadata = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            return {}
        return metadata if isinstance(metadata, dict) else {}

    def _open(self) -> tuple[paflight.FlightStreamWriter, paflight.FlightMetadataReader]:
        if self._put is None:
            if self._stale:
                # a call of ours was dropped: the server holds the writer name until it has
                # written that call out, and refuses a second live DoPut of the writer
                self._quiesce()
                self._stale = False
            descriptor = paflight.FlightDescriptor.for_path(self._name, self.writer)
            writer, reader = self._connect().do_put(descriptor, self.schema, options=self._options)
            self._put = writer, cast(paflight.FlightMetadataReader, reader)
        return self._put

    def _settled_end(self) -> int:
        """The stream's next offset once no DoPut of the writer is in progress."""
        self._quiesce()
        return self.next_offset()

    def _open_and_finish(self) -> None:
        """Open a DoPut and finish it at once (no call of ours stays open while we read
        back); raises what the server answered (e.g. INVALID_ARGUMENT for other columns)."""
        writer = self._open()[0]
        self._put = None
        try:
            writer.done_writing()
        finally:
            writer.close()

    def _acknowledged(self) -> int:
        assert self._put is not None
        buffer = self._put[1].read()
        if buffer is None:  # the call ended: its status says why (raised by close)
            writer, self._put = self._put[0], None
            writer.close()
            raise _Lost("the server ended the DoPut without a PutResult")
        result = json.loads(buffer.to_pybytes())
        if "offset" not in result:  # the call's last PutResult: {"error": <message>}
            self._drop()
            raise ConnectorError(
                f"{self.what}: the server failed the DoPut: {result.get('error', result)}"
            )
        return int(result["offset"])

    # --- StreamTarget ---------------------------------------------------------------------

    def incarnation(self) -> str | None:
        """The stream's incarnation now (``None``: it does not exist, or not a flight-serve)."""
        value = self._retry("reading the stream's FlightInfo", self._metadata).get("incarnation")
        return value if isinstance(value, str) else None

    def next_offset(self) -> int:
        """The offset the next entry gets (0 if the stream does not exist, or not a
        flight-serve)."""
        metadata = self._retry("reading the stream's FlightInfo", self._metadata)
        return _int_or_none(metadata.get("next_offset")) or 0

    def entries(self, start: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """This writer's batches from offset ``start`` on, up to the stream's end now (nothing
        on a server that is not flight-serve)."""
        if not self.exactly_once:
            return iter(())
        found, end = self._retry("reading the stream back", lambda: self._read_back_to(start))
        # What was read back is the caller's to account for (a restored sink skips its batches
        # there): an append's retry looks after it. The end seen when this target was made may
        # be stale: a dead run's call of the writer may have been drained since (the read-back
        # waited for it), and a retry reading from there would meet that call's batches first,
        # take the appended batch for missing and send it again.
        self._after = max(self._after, end)
        return iter(found)

    def _read_back(self, start: int) -> list[tuple[int, pa.RecordBatch]]:
        return self._read_back_to(start)[0]

    def _read_back_to(self, start: int) -> tuple[list[tuple[int, pa.RecordBatch]], int]:
        """This writer's batches from ``start`` to the stream's end (once no earlier DoPut of
        the writer is in progress), and that end.

        Every writer's entries are read (the writer's are kept); a tail call that times out
        (:data:`CALL_TIMEOUT_S`) after reading some goes on from the next entry, so a long
        read-back finishes. A tail that ends before the end (the server is shutting down) is
        retried (:class:`_Lost`): a partial read-back would take a landed batch for missing.
        """
        self._quiesce()
        end = self.next_offset()
        found: list[tuple[int, pa.RecordBatch]] = []
        position = start
        while position < end:
            before = position
            try:
                for entry in _tail_entries(
                    self._connect(), self._name, position, timeout_s=CALL_TIMEOUT_S
                ):
                    if entry.offset >= end:
                        return found, end
                    if entry.writer == self.writer and entry.batch is not None:
                        found.append((entry.offset, entry.batch))
                    position = entry.offset + 1
                    if position >= end:
                        return found, end
            except paflight.FlightTimedOutError:
                if position == before:
                    raise  # no progress: the call is retried as a whole
                continue
            raise _Lost(f"the read-back ended at offset {position}, before the end {end}")
        return found, end

    def append(self, batch: pa.RecordBatch) -> int:
        """Append ``batch`` (durable on the server when this returns, retried as the class
        docstring says); return its offset (``-1`` on a server that is not flight-serve)."""
        if not self.exactly_once:
            self._retry("a write", lambda: self._put_once(batch))
            return -1

        def send() -> int:
            self._open()[0].write_batch(batch)
            return self._acknowledged()

        def landed() -> int | None:
            for offset, old in self._read_back(self._after):
                if _same_rows(old, batch):
                    return offset
            return None

        offset = cast(int, self._retry("a write", send, landed))
        self._after = offset + 1
        return offset

    def append_many(self, batches: list[pa.RecordBatch], on_ack: Any = None) -> list[int]:
        """Append ``batches`` in order over the commit's DoPut, up to :data:`APPEND_WINDOW`
        unacknowledged at a time (the server's fsync of one overlaps the sending of the next);
        return their offsets (``-1`` each on a server that is not flight-serve). ``on_ack()`` is
        called once per batch, in order, when it is known durable.

        After a failure the writer's entries after the last acknowledged batch are read back:
        a DoPut's batches are stored in order, so those that landed are a prefix of the
        unacknowledged ones; they count as appended, and only the rest is sent again.

        Raises:
            ConnectorError: as :meth:`append`.
        """
        offsets: list[int] = []
        if not self.exactly_once:
            for batch in batches:
                offsets.append(self.append(batch))
                if on_ack is not None:
                    on_ack()
            return offsets
        remaining = list(batches)

        def acked(offset: int) -> None:
            offsets.append(offset)
            self._after = offset + 1
            remaining.pop(0)
            if on_ack is not None:
                on_ack()

        def send() -> bool:
            writer = self._open()[0]
            in_flight = 0
            for batch in list(remaining):  # acked() takes them off ``remaining`` in order
                writer.write_batch(batch)
                in_flight += 1
                if in_flight >= APPEND_WINDOW:
                    acked(self._acknowledged())
                    in_flight -= 1
            for _ in range(in_flight):
                acked(self._acknowledged())
            return True

        def landed() -> bool | None:
            for offset, old in self._read_back(self._after):
                if not remaining or not _same_rows(old, remaining[0]):
                    break
                acked(offset)
            return True if not remaining else None

        if remaining:
            self._retry("a write", send, landed)
        return offsets

    def _put_once(self, batch: pa.RecordBatch | None, metadata: bytes | None = None) -> None:
        descriptor = paflight.FlightDescriptor.for_path(self._name, self.writer)
        writer, _ = self._connect().do_put(descriptor, self.schema, options=self._options)
        try:
            if batch is not None:
                writer.write_batch(batch)
            if metadata is not None:
                writer.write_metadata(pa.py_buffer(metadata))
            writer.done_writing()
        finally:
            writer.close()

    def end_input(self) -> None:
        """End the writer's partition (``{"end_of_input": true}``), once: nothing if the
        stream's history says the writer ended already."""
        marker = b'{"end_of_input": true}'
        if not self.exactly_once:
            self._retry("ending the input", lambda: self._put_once(None, marker))
            return

        def ended() -> bool | None:
            # only once no earlier call of the writer is in progress: a marker that reached
            # the server without its PutResult (a cut connection) may still be committed;
            # our own open call (every batch acknowledged) is finished first
            self.committed()
            self._quiesce()
            writers = self._metadata().get("writers")
            item = writers.get(self.writer) if isinstance(writers, dict) else None
            return True if isinstance(item, dict) and item.get("ended_at") is not None else None

        def send() -> bool:
            self._open()[0].write_metadata(pa.py_buffer(marker))
            self._acknowledged()
            return True

        if not self._retry("reading the stream's FlightInfo", ended):
            self._retry("ending the input", send, ended)
        self.committed()

    def committed(self) -> None:
        """The commit's appends are done: finish the DoPut, so no call stays open between
        commits (a server draining for shutdown waits for open calls). The partition stays
        open; the next append opens a new DoPut.

        Every batch of the call is acknowledged already, so a call that cannot be finished
        (the server or the connection is gone) is dropped at once, not retried: nothing is
        lost, and the next read-back waits (``stream.writer_wait``) until the server has
        ended it."""
        put, self._put = self._put, None
        if put is None:
            return
        try:
            put[0].done_writing()
            put[0].close()
        except (*_RETRYABLE, pa.ArrowException, OSError):
            self._drop()

    def close(self) -> None:
        """Finish the DoPut (the partition stays open unless :meth:`end_input` was called) and
        close the connection. Idempotent; never raises."""
        put, self._put = self._put, None
        if put is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                put[0].done_writing()
        self._drop()


class FlightTicketSource(_Retrying, ResumedSource):
    """A bounded pipeline source: the batches of one DoGet ticket on any Flight server.

    The source has one watermark partition (``""``) that ends when the DoGet ends. Its offset
    is the number of rows handed out so far: a DoGet cut by a lost connection (UNAVAILABLE, a
    timeout) is opened again with the same ticket and the rows already read are skipped, and a
    checkpointed run resumes the same way. That is exactly-once only if the ticket gives the same
    rows in the same order every time (a flight-serve stream-range ticket does; a query ticket
    of an ordered query does; other servers: see docs/pipelines.md); otherwise the resumed run
    reads what the new DoGet returns after that many rows.

    Args:
        server: the Flight URI.
        ticket: the ticket bytes.
        name: the source's name in the pipeline (for messages).
        schema: the declared columns (read exactly these, cast to these types), or ``None``
            for the DoGet's schema.
        start_rows: rows to skip (a checkpoint's offset).
        retry_s: seconds to keep retrying while the server is unreachable (when the source is
            opened without declared columns: at most :data:`OPEN_RETRY_S`; with them, an
            unreachable server is waited for by the first :meth:`poll`, ``waiting_to_open``).

    Raises:
        ConnectorError: the server stayed unreachable (no columns declared), refused the
            ticket or failed the TLS handshake, or the DoGet lacks a declared column.
    """

    stop_at_end = True

    def __init__(
        self,
        server: str,
        ticket: bytes,
        *,
        name: str,
        schema: pa.Schema | None = None,
        start_rows: int = 0,
        retry_s: float = RETRY_BUDGET_S,
        auth: FlightClientAuth | None = None,
    ) -> None:
        self.server = server
        self.auth = auth
        self.ticket = ticket
        shown = ticket[:60].decode("utf-8", "replace")
        self.stream = f"ticket {shown!r}"
        self.what = f"source {name} (server {server}, {self.stream})"
        self.retry_s = retry_s
        self.start_offset = start_rows
        self.end_offset = -1  # unknown until the DoGet ends
        self.partitions: tuple[str, ...] = ("",)
        self.initial_watermarks: dict[str, int] = {}
        #: rows handed out (the offset a checkpoint records)
        self.rows = start_rows
        self._done = False
        self._skip = 0
        self._options = paflight.FlightCallOptions(timeout=CALL_TIMEOUT_S)
        self._client: paflight.FlightClient | None = None
        self._reader: paflight.FlightStreamReader | None = None
        #: the server was unreachable when the source was made (its columns declared): the
        #: first :meth:`poll` opens the DoGet, retrying for ``retry_s``
        self.waiting_to_open = False
        self._unreachable: tuple[float, BaseException] | None = None
        started = time.monotonic()
        if schema is not None:
            try:
                self._open()
            except (paflight.FlightUnavailableError, paflight.FlightTimedOutError) as exc:
                self._drop()
                if not _unreachable(exc):
                    raise ConnectorError(
                        f"{self.what}: opening the DoGet failed: {_message(exc)}"
                    ) from exc
                self._unreachable = (started, exc)
                self.waiting_to_open = True
            except (pa.ArrowException, OSError) as exc:
                self._drop()
                raise _failed(
                    f"{self.what}: opening the DoGet failed: {_message(exc)}", exc
                ) from exc
        self.schema: pa.Schema = schema  # type: ignore[assignment]
        if not self.waiting_to_open:
            # planning (a submit waits for it) gives an unreachable server a few seconds only;
            # reading, once the run started, retries for ``retry_s``
            self.retry_s = min(retry_s, OPEN_RETRY_S)
            reader = self._retry("opening the DoGet", self._open)
            self.retry_s = retry_s
            self.schema = schema if schema is not None else reader.schema
            self._check_columns(reader.schema)

    @property
    def done(self) -> bool:
        """Whether the DoGet has ended and every row was handed out."""
        return self._done

    @property
    def backlog(self) -> bool:
        """Rows may wait until the DoGet ends (no partition of a bounded read is idle)."""
        return not self._done

    def start(self) -> None:
        """Nothing to start: reads happen in :meth:`poll`."""

    def position_state(self) -> dict[str, object]:
        """The offset as checkpoint JSON: rows handed out, whether the DoGet ended, and the
        columns read (``schema``, as :meth:`FlightSource.position_state`)."""
        return {
            "kind": "ticket",
            "server": self.server,
            "rows": self.rows,
            "done": self._done,
            "schema": _schema_text(self.schema),
        }

    def _check_columns(self, ticket_schema: pa.Schema) -> None:
        """Refuse a DoGet without a declared column (closing the source)."""
        missing = [n for n in self.schema.names if ticket_schema.get_field_index(n) < 0]
        if missing:
            self.close()
            raise ConnectorError(
                f"{self.what}: the DoGet has no column {', '.join(map(repr, missing))}; its "
                f"columns: {', '.join(ticket_schema.names)}"
            )

    def _drop(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                reader.cancel()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                client.close()

    def _open(self) -> paflight.FlightStreamReader:
        if self._reader is None:
            if self._client is None:
                self._client = _client(self.server, self.auth)
            self._reader = self._client.do_get(paflight.Ticket(self.ticket), options=self._options)
            self._skip = self.rows  # a new DoGet starts over: skip what was handed out
        return self._reader

    def _next(self) -> pa.RecordBatch | None:
        """The next rows not handed out yet, or ``None`` at the DoGet's end."""
        while True:
            reader = self._open()
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return None
            batch = chunk.data
            if batch is None or batch.num_rows == 0:
                continue
            if self._skip:
                if batch.num_rows <= self._skip:
                    self._skip -= batch.num_rows
                    continue
                batch, self._skip = batch.slice(self._skip), 0
            return batch

    def poll(self, timeout_s: float, max_entries: int = 64) -> list[SourceEvent]:
        """The next batches (up to ``max_entries``), then an ``end`` event at the DoGet's end.

        Raises:
            ConnectorError: the server stayed unreachable for ``retry_s`` seconds, the DoGet
                failed otherwise, or a batch does not fit the declared columns.
        """
        if self._done:
            return []
        if self.waiting_to_open:  # the server was unreachable when the pipeline was planned
            reader = self._retry("opening the DoGet", self._open, failed=self._unreachable)
            self.waiting_to_open = False
            self._check_columns(reader.schema)
        events: list[SourceEvent] = []
        for _ in range(max_entries):
            batch = self._retry("reading the DoGet", self._next)
            if batch is None:
                self._done = True
                self.end_offset = self.rows
                events.append(SourceEvent("end", ""))
                self.close()
                break
            offset = self.rows
            self.rows += batch.num_rows
            events.append(SourceEvent("batch", "", conform(batch, self.schema, self.what), offset=offset))
        return events

    def close(self) -> None:
        """Cancel the DoGet and close the connection. Idempotent."""
        self._drop()
