"""The flight-serve client: DoPut, queries, stream metadata, tails and DoExchange, over pyarrow.flight.

The wire contract is ``schemas/README.md``; this module is its reference client. It imports
pyarrow only (an import-linter contract forbids ``flight_serve``).

Errors. Every method lets pyarrow's Flight exceptions through unchanged; the server maps its
errors to Flight status codes, which pyarrow raises on the client as:

==========================  ============================================  =========================
status code                 raised here as                                 typical cause
==========================  ============================================  =========================
``INVALID_ARGUMENT``        :class:`pyarrow.ArrowInvalid` (a ValueError)   bad SQL, schema mismatch,
                                                                           stale ticket, bad name
``NOT_FOUND``               :class:`pyarrow.ArrowKeyError` (a KeyError)    unknown stream or table
``UNAVAILABLE``             :class:`pyarrow.flight.FlightUnavailableError`  server down or overloaded
``UNAUTHENTICATED``         :class:`pyarrow.flight.FlightUnauthenticatedError`
``PERMISSION_DENIED``       :class:`pyarrow.flight.FlightUnauthorizedError`
``DEADLINE_EXCEEDED``       :class:`pyarrow.flight.FlightTimedOutError`
``INTERNAL`` / ``UNKNOWN``  :class:`pyarrow.flight.FlightInternalError` /  a server bug
                            :class:`pyarrow.flight.FlightServerError`
==========================  ============================================  =========================

A reply that breaks the wire contract itself raises :class:`~flight_serve_client.ProtocolError`
(a :class:`pyarrow.flight.FlightError`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import chain
from os import PathLike, fspath
from types import TracebackType
from typing import Any, Literal, Self, cast

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve_client._protocol import (
    ProtocolError,
    decode_int,
    decode_json,
    decode_late_rows,
    is_late_rows,
)
from flight_serve_client.plugin import PluginStats, serve_plugin

__all__ = ["ExchangeEvent", "ExchangeKind", "FlightServeClient", "TailEntry"]

#: Batches written by :meth:`FlightServeClient.put` before it waits for the oldest PutResult.
#: Bounds client-side buffering; PutResults are read as they arrive anyway.
MAX_UNACKED_BATCHES = 16

#: Reconnection attempts of :meth:`FlightServeClient.tail` in a row (without a batch in between).
TAIL_RECONNECT_ATTEMPTS = 8
#: First and longest pause between reconnection attempts of a tail, in seconds (doubling).
TAIL_BACKOFF_S = (0.05, 2.0)
#: How long a ``follow`` tail waits for an unreachable server (seconds without a message).
TAIL_FOLLOW_TIMEOUT_S = 60.0

_REUSE_CONNECTION = b"arrow-flight-reuse-connection://"

ExchangeKind = Literal["result", "late", "ack", "done"]


@dataclass(frozen=True, slots=True)
class ExchangeEvent:
    """One message read from a DoExchange windowed query (schemas/README.md, "DoExchange").

    Attributes:
        kind: ``"result"``: window results closed by an input batch (``batch`` has the query's
            result schema: group keys, ``window_start``, ``window_end``, aggregates);
            ``"late"``: rows that input batch sent to the late side output (``batch`` has the
            input columns plus ``_late_reason`` (utf8: ``late`` or ``null_time``),
            ``_window_start`` and ``_window_end``);
            ``"ack"``: the server finished input batch ``input_batch`` (``batch`` is None;
            ``metadata`` is ``{"ack": i, "watermark_ns": int | None, "late_rows": int}``, the
            watermark in nanoseconds since the Unix epoch, ``late_rows`` cumulative);
            ``"done"``: the flush after the client finished writing (``metadata`` is
            ``{"done": true, "watermark_ns": None, "late_rows": n}``); always the last event.
        batch: the rows of a ``result`` or ``late`` event, else None.
        metadata: the decoded JSON app_metadata (``{"input_batch": i}`` for results; empty for
            late rows).
        input_batch: index (from 0) of the input batch this event answers; None for events
            read after the client finished writing.
    """

    kind: ExchangeKind
    batch: pa.RecordBatch | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    input_batch: int | None = None


@dataclass(slots=True)
class _ExchangeState:
    result_schema: pa.Schema | None = None


@dataclass(frozen=True, slots=True)
class TailEntry:
    """One entry of a stream read by :meth:`FlightServeClient.tail_entries` (schemas/README.md,
    "Tail DoGet").

    Attributes:
        offset: the entry's offset in the stream.
        writer: the DoPut writer (watermark partition) that wrote it.
        batch: the rows (or the next piece of a batch split above 4 MiB); ``None`` for a marker.
        watermark_ns: for a watermark marker: the writer's explicit watermark, in ns since the
            Unix epoch ("no row with an earlier event time will follow from this writer").
        end_of_input: for an end-of-input marker: the writer is done for good.
    """

    offset: int
    writer: str
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    end_of_input: bool = False

    @property
    def is_marker(self) -> bool:
        """Whether this entry is a marker (no rows) rather than a batch."""
        return self.batch is None


class FlightServeClient:
    """A connection to one flight-serve server.

    Args:
        location: the server's Flight URI, e.g. ``grpc://127.0.0.1:8815``, or
            ``grpc+tls://host:8815`` for a server with TLS (``host:port`` alone means
            ``grpc+tcp://host:port``).
        token: a bearer token from the server's tokens file (``--tokens-file``); sent as
            ``authorization: Bearer <token>`` on every call. Its roles decide what the calls
            may do (README, "Operations").
        username, password: credentials from the server's users file (``--users-file``): the
            client runs Flight's Basic handshake once, here, and sends the bearer token it
            returns on every call (the server keeps it valid for 24 h; a handshake token has
            every role). Not together with ``token``.
        tls_ca: the CA certificate(s) that sign the server's certificate (PEM: a path, or the
            PEM bytes); without it a ``grpc+tls://`` server is checked against the system CAs.
        tls_cert, tls_key: this client's certificate chain and private key (PEM, paths or
            bytes) for a server that asks for client certificates (``--tls-client-ca``).
        override_hostname: the name to check the server's certificate against instead of the
            location's host (e.g. ``localhost`` when connecting to an IP the certificate lacks).

    The same token, credentials and TLS files are used for a query endpoint the server names at
    another location.

    Raises:
        ValueError: ``token`` together with ``username``; ``username`` without ``password``
            (or the reverse); ``tls_cert`` without ``tls_key`` (or the reverse); TLS options
            for a location that is not ``grpc+tls://``; a TLS path that does not exist. Each
            message names the argument.
        pyarrow.flight.FlightUnauthenticatedError: the handshake refused the user or password.
        pyarrow.flight.FlightUnavailableError: the handshake could not reach the server.

    Use it as a context manager (or call :meth:`close`). One client may be used by one thread
    at a time; the iterators it returns hold a call open until exhausted or closed.
    """

    def __init__(
        self,
        location: str,
        *,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        tls_ca: str | PathLike[str] | bytes | None = None,
        tls_cert: str | PathLike[str] | bytes | None = None,
        tls_key: str | PathLike[str] | bytes | None = None,
        override_hostname: str | None = None,
    ) -> None:
        if "://" not in location:
            location = f"grpc+tcp://{location}"
        if token is not None and (username is not None or password is not None):
            raise ValueError("give either token or username and password, not both")
        if (username is None) != (password is None):
            missing = "password" if password is None else "username"
            raise ValueError(f"username and password go together: {missing} is missing")
        if (tls_cert is None) != (tls_key is None):
            missing = "tls_key" if tls_key is None else "tls_cert"
            raise ValueError(f"tls_cert and tls_key go together: {missing} is missing")
        tls_given = [
            name
            for name, value in (
                ("tls_ca", tls_ca),
                ("tls_cert", tls_cert),
                ("override_hostname", override_hostname),
            )
            if value is not None
        ]
        if tls_given and not location.startswith("grpc+tls://"):
            raise ValueError(
                f"{tls_given[0]} is for a TLS server, but {location!r} is not grpc+tls://"
            )
        self.location = location
        self._tls: dict[str, Any] = {}
        if tls_ca is not None:
            self._tls["tls_root_certs"] = _pem(tls_ca, "tls_ca")
        if tls_cert is not None and tls_key is not None:
            self._tls["cert_chain"] = _pem(tls_cert, "tls_cert")
            self._tls["private_key"] = _pem(tls_key, "tls_key")
        if override_hostname is not None:
            self._tls["override_hostname"] = override_hostname
        self._headers = _Headers()
        if token is not None:
            self._headers.authorization = f"Bearer {token}"
        self._client = self._connect(location)
        if username is not None and password is not None:
            try:
                _, value = self._client.authenticate_basic_token(username, password)
            except BaseException:
                self._client.close()
                raise
            self._headers.authorization = value.decode() if isinstance(value, bytes) else value

    def _connect(self, location: str) -> flight.FlightClient:
        """A Flight client for ``location`` with this client's TLS files and headers."""
        return flight.FlightClient(
            location, middleware=[_HeadersFactory(self._headers)], **self._tls
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; calls still open fail with a Flight error."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FlightServeClient({self.location!r})"

    # -- plugins -----------------------------------------------------------------------------

    def attach_plugin(
        self,
        name: str,
        fn: Callable[[pa.RecordBatch], pa.RecordBatch],
        input_schema: pa.Schema,
        output_schema: pa.Schema,
        *,
        max_in_flight: int = 4,
        stop: threading.Event | None = None,
    ) -> PluginStats:
        """Attach as plugin ``name`` and answer every batch with ``fn(batch)`` until the server
        ends the exchange or ``stop`` is set; blocks. See :func:`flight_serve_client.plugin.serve_plugin`
        (schemas/README.md, "Plugin protocol")."""
        return serve_plugin(
            self._client,
            name,
            fn,
            input_schema,
            output_schema,
            max_in_flight=max_in_flight,
            stop=stop,
        )

    # -- DoPut -------------------------------------------------------------------------------

    def put(
        self,
        stream: str,
        data: pa.Table | Iterable[pa.RecordBatch],
        *,
        batch_rows: int = 65536,
        on_progress: Callable[[int], None] | None = None,
        writer: str | None = None,
        end_input: bool = False,
    ) -> int:
        """Append ``data`` to ``stream`` (DoPut, ``path = [stream]``, or ``[stream, writer]``)
        and wait until it is durable.

        The stream is created with the first batch's schema if it does not exist. ``data`` is
        sent in batches of at most ``batch_rows`` rows (larger batches are sliced, zero-copy).
        The server answers each batch with a PutResult ``{"offset": int, "rows": int}`` once it
        is on disk; every PutResult is read, at most :data:`MAX_UNACKED_BATCHES` batches ahead
        of the writes.

        Args:
            stream: the stream name (``[A-Za-z0-9_.-]``).
            data: a table, or record batches that all share one schema.
            batch_rows: the largest batch sent, in rows (≥ 1).
            on_progress: called after each PutResult with the rows acknowledged (durable) so far.
            writer: this producer's name: the stream's watermark partition it writes to
                (``[A-Za-z0-9_.:@-]``, 1 to 200 characters). A producer that reconnects under
                the same name stays the same partition; without one (or ``""``, the name
                ``stream_info`` lists it under), the call writes as the stream's unnamed
                writer (one partition that every unnamed call shares).
            end_input: after the batches, end the writer's partition for good (an
                ``{"end_of_input": true}`` marker; see :meth:`end_input`).

        Returns:
            The offset of the last entry acknowledged (the last durable offset), or ``-1`` when
            ``data`` held no batch and no marker was asked for (nothing is sent).

        Raises:
            ValueError: ``batch_rows < 1``.
            pyarrow.ArrowInvalid: INVALID_ARGUMENT: the schema differs from the stream's (the
                message names the fields), a bad stream name, a batch over the server's size
                limit, or batches of differing schemas (raised locally by the writer).
            pyarrow.flight.FlightUnavailableError: the server is unreachable or overloaded.
            ProtocolError: a PutResult that is not ``{"offset", "rows"}`` JSON, or fewer
                PutResults than batches.
        """
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        batches = _rechunk(data, batch_rows)
        first = next(batches, None)
        if first is None:
            if end_input:
                return self.end_input(stream, writer=writer or "")
            return -1
        markers = [_END_OF_INPUT] if end_input else []
        return self._put(
            stream, writer, first.schema, chain((first,), batches), markers, on_progress
        )

    def advance_watermark(self, stream: str, watermark: datetime | int, *, writer: str) -> int:
        """Advance ``writer``'s watermark on ``stream`` without sending rows.

        Sends a metadata-only DoPut message ``{"watermark_ns": N}`` as ``writer`` ("no row
        with an event time before ``watermark`` will follow from this writer"). The server
        stores it as a marker in the stream (it gets an offset, like a batch) and pipelines
        reading the stream raise that partition's watermark to it (never lower it).

        Args:
            watermark: an instant (a naive datetime is UTC) or ns since the Unix epoch.
            writer: the writer's name; ``""`` is the stream's unnamed writer (the DoPuts
                without a name).

        Returns:
            The marker's offset, once it is durable.

        Raises:
            pyarrow.ArrowKeyError: NOT_FOUND: the stream does not exist.
            pyarrow.ArrowInvalid: INVALID_ARGUMENT: a bad stream or writer name.
        """
        ns = watermark if isinstance(watermark, int) else _datetime_ns(watermark)
        return self._put_markers(stream, writer, [{"watermark_ns": ns}])

    def end_input(self, stream: str, *, writer: str) -> int:
        """End ``writer``'s partition of ``stream`` for good (``{"end_of_input": true}``).

        A writer's DoPut finishing does not end its partition (the writer may come back); this
        does: pipelines reading the stream take the partition's watermark to +∞, and a
        pipeline run with a ``flight`` source ends once every writer it knows has ended.
        ``writer=""`` ends the stream's unnamed writer (that of ``put`` without a writer).

        Returns:
            The marker's offset, once it is durable.

        Raises:
            pyarrow.ArrowKeyError: NOT_FOUND: the stream does not exist.
        """
        return self._put_markers(stream, writer, [_END_OF_INPUT])

    def _put_markers(self, stream: str, writer: str, markers: list[dict[str, Any]]) -> int:
        result: Any = self._client.get_schema(flight.FlightDescriptor.for_path(stream))
        schema: pa.Schema = result.schema  # a SchemaResult (the stubs say Schema)
        return self._put(stream, writer, schema, iter(()), markers, None)

    def _put(
        self,
        stream: str,
        writer_name: str | None,
        schema: pa.Schema,
        batches: Iterator[pa.RecordBatch],
        markers: list[dict[str, Any]],
        on_progress: Callable[[int], None] | None,
    ) -> int:
        """DoPut ``batches`` then ``markers`` (metadata-only messages); wait for every
        PutResult; return the last offset."""
        # the unnamed writer ("" in stream_info) writes without a name: path = [stream]
        path = [stream, writer_name] if writer_name else [stream]
        writer, stream_reader = self._client.do_put(flight.FlightDescriptor.for_path(*path), schema)
        # pyarrow returns a FlightMetadataReader here; the stubs say FlightStreamReader.
        reader = cast(flight.FlightMetadataReader, stream_reader)
        written = 0
        acked = 0
        acked_rows = 0
        last_offset = -1

        def read_ack() -> None:
            nonlocal acked, acked_rows, last_offset
            buffer = reader.read()
            if buffer is None:
                writer.close()  # raises the server's status if the call failed
                raise ProtocolError(
                    f"DoPut {stream!r}: the server ended after {acked} PutResults for "
                    f"{written} batches"
                )
            message = decode_json(buffer, "PutResult")
            if "error" in message:  # the server could not store a batch: get its status
                with contextlib.suppress(pa.ArrowException):
                    writer.done_writing()
                writer.close()  # raises the server's status
                raise ProtocolError(f"DoPut {stream!r} failed: {message['error']}")
            last_offset = decode_int(message, "offset", "PutResult")
            acked_rows += decode_int(message, "rows", "PutResult")
            acked += 1
            if on_progress is not None:
                on_progress(acked_rows)

        try:
            for batch in batches:
                writer.write_batch(batch)
                written += 1
                while written - acked > MAX_UNACKED_BATCHES:
                    read_ack()
            for marker in markers:
                writer.write_metadata(pa.py_buffer(json.dumps(marker).encode()))
                written += 1
            writer.done_writing()
            while acked < written:
                read_ack()
        except BaseException:
            # The server's own status (e.g. INVALID_ARGUMENT) was already raised; close quietly.
            with contextlib.suppress(pa.ArrowException):
                writer.close()
            raise
        writer.close()
        return last_offset

    # -- queries -----------------------------------------------------------------------------

    def query(self, sql: str) -> pa.Table:
        """Run ``sql`` and return the whole result as one table.

        GetFlightInfo(``cmd = sql``) plans the query over the streams (each stream is a table
        named after it); every endpoint's ticket is then read with DoGet, in endpoint order.

        Returns:
            A table with the result schema (empty, with that schema, when there are no rows).

        Raises:
            pyarrow.ArrowInvalid: INVALID_ARGUMENT: the SQL does not parse or plan (the
                message is the parser's).
            pyarrow.ArrowKeyError: NOT_FOUND: a named table does not exist (flight-serve
                says ``table 'nope' does not exist (…)``).
            pyarrow.flight.FlightUnavailableError: the server is unreachable.
        """
        info = self._client.get_flight_info(_command(sql))
        tables = []
        for endpoint in info.endpoints:
            with self._endpoint_client(endpoint) as client:
                tables.append(client.do_get(endpoint.ticket).read_all())
        if not tables:
            return info.schema.empty_table()
        if len(tables) == 1:
            return tables[0]
        return pa.concat_tables(tables)

    def query_batches(self, sql: str) -> Iterator[pa.RecordBatch]:
        """Run ``sql`` and yield its result batch by batch (each at most 4 MiB), endpoint after
        endpoint; errors are those of :meth:`query`. Closing the iterator early cancels the call.
        """
        info = self._client.get_flight_info(_command(sql))
        for endpoint in info.endpoints:
            with self._endpoint_client(endpoint) as client:
                reader = client.do_get(endpoint.ticket)
                try:
                    for chunk in _chunks(reader):
                        if chunk.data is not None:
                            yield chunk.data
                finally:
                    with contextlib.suppress(pa.ArrowException):
                        reader.cancel()

    # -- streams -----------------------------------------------------------------------------

    def stream_info(self, name: str) -> dict[str, Any]:
        """Describe stream ``name`` (GetFlightInfo, ``path = [name]``).

        Returns:
            ``{"name": str, "schema": pyarrow.Schema, "total_records": int,
            "total_bytes": int, "first_offset": int, "next_offset": int, "incarnation": ...}``:
            the counts cover the retained rows; offsets are batch sequence numbers,
            ``next_offset`` the one the next batch will get. Other keys the server puts in the
            FlightInfo's app_metadata are passed through.

        Raises:
            pyarrow.ArrowKeyError: NOT_FOUND: no stream has this name.
            pyarrow.ArrowInvalid: INVALID_ARGUMENT: not a valid stream name.
        """
        info = self._client.get_flight_info(flight.FlightDescriptor.for_path(name))
        raw = info.app_metadata
        metadata = decode_json(raw.encode() if isinstance(raw, str) else raw, "stream info")
        return {
            "name": name,
            "schema": info.schema,
            "total_records": info.total_records,
            "total_bytes": info.total_bytes,
            **metadata,
        }

    def list_streams(self) -> list[str]:
        """Return the names of every stream (ListFlights), sorted.

        Only path descriptors of one element are streams; other flights are left out.
        """
        names = set()
        for info in self._client.list_flights():
            path = info.descriptor.path
            if (
                info.descriptor.descriptor_type == flight.DescriptorType.PATH
                and path
                and len(path) == 1
            ):
                element = path[0]
                names.add(element.decode() if isinstance(element, bytes) else str(element))
        return sorted(names)

    def drop(self, name: str) -> None:
        """Drop stream ``name`` and its stored batches (action ``stream.drop``).

        Tickets for the dropped stream (including open tails) become stale: INVALID_ARGUMENT.

        Raises:
            pyarrow.ArrowKeyError: NOT_FOUND: no stream has this name.
        """
        self._action("stream.drop", {"stream": name})

    # -- tail --------------------------------------------------------------------------------

    def tail(
        self, stream: str, offset: int = 0, *, reconnect: bool = True, follow: bool = False
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Read ``stream`` from ``offset``: yield ``(offset, batch)`` for every batch.

        ``follow=False`` (the default) reads what the stream holds now and returns: the end is
        the stream's ``next_offset`` when the call begins (batches appended afterwards are not
        read), like ``tail`` without ``-f``. ``follow=True`` yields the existing batches, then
        each new one as it is appended, for good: it returns only when the stream is dropped or
        re-created (also across a server restart), so stop it by closing the iterator (or
        breaking out of the loop)::

            for offset, batch in client.tail("events", 0):               # what is there now
                ...
            for offset, batch in client.tail("events", 0, follow=True):  # live, until break
                if done(batch):
                    break

        Markers (explicit watermarks, end of input) are left out: :meth:`tail_entries` yields
        them too, with the writer of every entry. The server splits a stored batch above 4 MiB
        into consecutive pieces that share its offset, so one offset may be yielded several
        times, each time with the next rows. Closing the iterator early cancels the call.
        Ctrl-C ends a follow in the main thread: ``KeyboardInterrupt`` is raised from the loop
        (and the call cancelled), every batch yielded before it was yielded once and the next
        one was not read, so a new tail from the offset after the last one yielded goes on
        exactly there. Reconnection and errors: see :meth:`tail_entries`.
        """
        for entry in self.tail_entries(stream, offset, reconnect=reconnect, follow=follow):
            if entry.batch is not None:
                yield entry.offset, entry.batch

    def tail_entries(
        self, stream: str, offset: int = 0, *, reconnect: bool = True, follow: bool = False
    ) -> Iterator[TailEntry]:
        """Read ``stream`` from ``offset``: yield a :class:`TailEntry` for every batch and
        marker, with its writer; with ``follow``, then each new one as it comes.

        Without ``follow`` the iterator ends once every entry below the stream's
        ``next_offset`` at the start of the call is yielded (at once when ``offset`` is at or
        past it), or when the server ends the tail first (the stream was dropped or re-created,
        or the server shut down).

        The ticket comes from action ``stream.tail`` ``{"stream", "offset"}``; each DoGet
        message carries app_metadata ``{"offset", "writer"}`` (a batch; a batch above 4 MiB
        comes as consecutive pieces that also carry ``"piece": i, "pieces": n``), or, on a message
        without rows, ``{"offset", "writer", "watermark_ns"}`` / ``{"offset", "writer",
        "end_of_input": true}`` (a marker).

        With ``reconnect``, a dropped connection (:class:`pyarrow.flight.FlightUnavailableError`)
        asks for a new tail ticket: after the last piece of a split batch, from the next
        offset; otherwise from the last offset seen, skipping the rows of that offset already
        yielded (safe whether or not the server numbers the pieces), so no entry is yielded
        twice or skipped; up to :data:`TAIL_RECONNECT_ATTEMPTS` attempts in a row, pausing
        with doubling delays (:data:`TAIL_BACKOFF_S`).

        With ``follow`` the tail runs for good, for consumers such as a sink process, and also
        outlives a server restart: when the server ends the tail (it shut down), the stream is
        looked up and, while it exists with the incarnation it had when the tail began, a new
        tail is asked for from the next entry not yielded (so nothing is yielded twice or
        skipped); the iterator ends once the stream is dropped or re-created. An unreachable
        server is retried for :data:`TAIL_FOLLOW_TIMEOUT_S` seconds without a message (instead
        of the attempt count). Called in the main thread, a follow reads each message on a
        helper thread while the caller's thread waits where Ctrl-C (any Python signal handler
        that raises) interrupts it; the exception is raised from the iterator and the call is
        cancelled.

        Raises:
            KeyboardInterrupt: Ctrl-C during a follow in the main thread.
            pyarrow.ArrowKeyError: NOT_FOUND: no stream has this name (when asking for a
                ticket, including on reconnection).
            pyarrow.ArrowInvalid: INVALID_ARGUMENT: a negative offset or a bad stream name.
            pyarrow.flight.FlightUnavailableError: the connection dropped and ``reconnect`` is
                off, or every reconnection attempt failed.
            ProtocolError: a message without a JSON ``{"offset": int}``.
        """
        if offset < 0:
            raise pa.ArrowInvalid(f"tail: offset must be >= 0, got {offset}")
        info = self.stream_info(stream)
        incarnation = info.get("incarnation")
        end: int | None = None
        if not follow:
            end = decode_int(info, "next_offset", "stream info")
            if offset >= end:
                return
        # a follow waits for the next entry for good: in the main thread, where Python runs its
        # signal handlers, the wait is one Ctrl-C interrupts (the read itself waits in C++)
        chunks = (
            _interruptible_chunks
            if follow and threading.current_thread() is threading.main_thread()
            else _chunks
        )
        position = offset  # the offset to ask from when (re)connecting
        delivered = 0  # rows of batch ``position`` already yielded
        failures = 0
        waiting_since: float | None = None  # follow: when the server stopped answering
        while True:
            reader: flight.FlightStreamReader | None = None
            skip = delivered
            try:
                ticket = flight.Ticket(
                    self._action("stream.tail", {"stream": stream, "offset": position})
                )
                reader = self._client.do_get(ticket)
                for chunk in chunks(reader):
                    batch = chunk.data
                    if batch is None:
                        continue
                    message = decode_json(chunk.app_metadata, "tail message")
                    entry_offset = decode_int(message, "offset", "tail message")
                    writer = message.get("writer")
                    writer = writer if isinstance(writer, str) else ""
                    failures, waiting_since = 0, None
                    if end is not None and entry_offset >= end:
                        return  # past the end the call began with
                    if "watermark_ns" in message or message.get("end_of_input") is True:
                        position, delivered, skip = entry_offset + 1, 0, 0
                        watermark = message.get("watermark_ns")
                        yield TailEntry(
                            entry_offset,
                            writer,
                            None,
                            watermark if isinstance(watermark, int) else None,
                            message.get("end_of_input") is True,
                        )
                        if end is not None and position >= end:
                            return
                        continue
                    if entry_offset == position:
                        if skip and skip >= batch.num_rows:
                            skip -= batch.num_rows  # yielded before the reconnection
                            continue
                        if skip:
                            batch = batch.slice(skip)
                            skip = 0
                        delivered += batch.num_rows
                    else:
                        position, delivered, skip = entry_offset, batch.num_rows, 0
                    piece, pieces = message.get("piece"), message.get("pieces")
                    if isinstance(piece, int) and isinstance(pieces, int) and piece + 1 >= pieces:
                        position, delivered = entry_offset + 1, 0  # its last piece: complete
                    yield TailEntry(entry_offset, writer, batch)
                    # the last entry below the end is whole: after its last piece, or sent
                    # whole (no "pieces"; a server that sends "next_offset" numbers pieces)
                    if (
                        end is not None
                        and entry_offset + 1 >= end
                        and (position >= end or (pieces is None and "next_offset" in message))
                    ):
                        return
                if not follow:
                    return
                # the server ended the tail (a shutdown): go on while the stream is the same
                try:
                    now = self.stream_info(stream).get("incarnation")
                except pa.ArrowKeyError:
                    return  # dropped
                if now != incarnation:
                    return  # re-created: the offsets name other entries
                waiting_since = None
                time.sleep(TAIL_BACKOFF_S[0])
            except flight.FlightUnavailableError:
                if follow:
                    waiting_since = waiting_since or time.monotonic()
                    if time.monotonic() - waiting_since > TAIL_FOLLOW_TIMEOUT_S:
                        raise
                elif not reconnect or failures >= TAIL_RECONNECT_ATTEMPTS:
                    raise
                time.sleep(min(TAIL_BACKOFF_S[0] * 2**failures, TAIL_BACKOFF_S[1]))
                failures += 1
            finally:
                if reader is not None:
                    with contextlib.suppress(pa.ArrowException):
                        reader.cancel()

    # -- DoExchange --------------------------------------------------------------------------

    def exchange(
        self,
        sql: str,
        batches: Iterable[pa.RecordBatch],
        *,
        schema: pa.Schema | None = None,
    ) -> Iterator[ExchangeEvent]:
        """Run windowed query ``sql`` over ``batches`` inline (DoExchange, ``cmd = sql``).

        The protocol (schemas/README.md): the client writes one input batch, then reads until
        that batch's acknowledgement ``{"ack": i}``, yielding for each message an
        :class:`ExchangeEvent`: ``result`` (window results the batch closed), ``late`` (rows the
        batch sent to the late side output), then ``ack``. After the last batch it finishes
        writing (the watermark becomes +∞) and reads the flush: more ``result`` (and ``late``)
        events, then ``done``. Results therefore arrive in event-time order of window close.

        Args:
            sql: a windowed query over the table ``input``, optionally preceded by
                ``CREATE SOURCE input (WATERMARK FOR t AS t - INTERVAL ...)``.
            batches: the input, all of one schema with an Arrow timestamp event-time column.
            schema: the input schema, needed only when ``batches`` may be empty.

        Raises:
            ValueError: ``batches`` is empty and no ``schema`` was given (raised before any call).
            pyarrow.ArrowInvalid: INVALID_ARGUMENT: the SQL is not a windowed query flight-serve
                can run (the message has line and column), or the event-time column is missing
                or not a timestamp.
            ProtocolError: the stream ended before an acknowledgement or ``done``, or carried
                an acknowledgement for another batch.

        Closing the iterator early cancels the call.
        """
        return self._exchange(sql, batches, schema, _ExchangeState())

    def exchange_table(
        self, sql: str, table: pa.Table, batch_rows: int = 65536
    ) -> tuple[pa.Table, pa.Table]:
        """Run :meth:`exchange` over ``table`` in batches of at most ``batch_rows`` rows and
        collect everything.

        Returns:
            ``(results, late_rows)``: the window results, in the order received, with the
            query's result schema; and the late side output with the input columns plus
            ``_late_reason``, ``_window_start`` and ``_window_end`` (when nothing was late, an
            empty table whose window columns take the type of the result's ``window_start``,
            or ``timestamp[ns, tz=UTC]``).

        Raises:
            Those of :meth:`exchange`; ValueError when ``batch_rows < 1``.
        """
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        state = _ExchangeState()
        results: list[pa.RecordBatch] = []
        late: list[pa.RecordBatch] = []
        events = self._exchange(
            sql, table.to_batches(max_chunksize=batch_rows), table.schema, state
        )
        for event in events:
            if event.kind == "result" and event.batch is not None:
                results.append(event.batch)
            elif event.kind == "late" and event.batch is not None:
                late.append(event.batch)
        if state.result_schema is None:  # pragma: no cover - "done" always follows the schema
            raise ProtocolError("exchange finished without a result schema")
        result_table = pa.Table.from_batches(results, schema=state.result_schema)
        if late:
            return result_table, pa.Table.from_batches(late)
        bound_type: pa.DataType = pa.timestamp("ns", tz="UTC")
        if "window_start" in state.result_schema.names:
            bound_type = state.result_schema.field("window_start").type
        late_schema = (
            table.schema.append(pa.field("_late_reason", pa.string()))
            .append(pa.field("_window_start", bound_type))
            .append(pa.field("_window_end", bound_type))
        )
        return result_table, late_schema.empty_table()

    # -- internals ---------------------------------------------------------------------------

    def _exchange(
        self,
        sql: str,
        batches: Iterable[pa.RecordBatch],
        schema: pa.Schema | None,
        state: _ExchangeState,
    ) -> Iterator[ExchangeEvent]:
        remaining = iter(batches)
        first = next(remaining, None)
        input_schema = first.schema if first is not None else schema
        if input_schema is None:
            raise ValueError("exchange needs at least one input batch or an explicit schema")
        return self._exchange_calls(sql, first, remaining, input_schema, state)

    def _exchange_calls(
        self,
        sql: str,
        first: pa.RecordBatch | None,
        remaining: Iterator[pa.RecordBatch],
        input_schema: pa.Schema,
        state: _ExchangeState,
    ) -> Iterator[ExchangeEvent]:
        writer, reader = self._client.do_exchange(_command(sql))
        finished = False
        try:
            writer.begin(input_schema)
            all_batches = remaining if first is None else chain((first,), remaining)
            for index, batch in enumerate(all_batches):
                writer.write_batch(batch)
                yield from _read_exchange(reader, state, index)
            writer.done_writing()
            yield from _read_exchange(reader, state, None)
            finished = True
        finally:
            if not finished:
                with contextlib.suppress(pa.ArrowException):
                    reader.cancel()
                with contextlib.suppress(pa.ArrowException):
                    writer.close()
        writer.close()

    def _action(self, action_type: str, body: Mapping[str, Any]) -> bytes:
        """Run one action with a JSON body; return the first result's body (b"" if none)."""
        payload = json.dumps(body).encode()
        results = list(self._client.do_action(flight.Action(action_type, payload)))
        if not results:
            return b""
        return results[0].body.to_pybytes()

    @contextlib.contextmanager
    def _endpoint_client(self, endpoint: flight.FlightEndpoint) -> Iterator[flight.FlightClient]:
        """This connection when the endpoint has no location, names this server, or asks to
        reuse the connection; otherwise a new connection to its first location."""
        uris = [_uri_bytes(location) for location in endpoint.locations]
        own = self.location.encode()
        if not uris or own in uris or any(uri.startswith(_REUSE_CONNECTION) for uri in uris):
            yield self._client
            return
        other = self._connect(uris[0].decode())
        try:
            yield other
        finally:
            other.close()


def _read_exchange(
    reader: flight.FlightStreamReader, state: _ExchangeState, index: int | None
) -> Iterator[ExchangeEvent]:
    """Read exchange messages up to the ack of input batch ``index`` (or ``done`` if None)."""
    awaited = "done" if index is None else f"the ack of input batch {index}"
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            raise ProtocolError(
                f"DoExchange: the server ended the stream before {awaited}"
            ) from None
        if state.result_schema is None:
            state.result_schema = reader.schema
        raw = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else b""
        if chunk.data is not None:
            metadata = decode_json(raw, "exchange result") if raw else {}
            yield ExchangeEvent("result", chunk.data, metadata, index)
            continue
        if is_late_rows(raw):
            yield ExchangeEvent("late", decode_late_rows(raw), {}, index)
            continue
        message = decode_json(raw, "exchange metadata")
        if index is not None and "ack" in message:
            if message["ack"] != index:
                raise ProtocolError(f"DoExchange: expected {awaited}, got {message!r}")
            yield ExchangeEvent("ack", None, message, index)
            return
        if index is None and message.get("done") is True:
            yield ExchangeEvent("done", None, message, None)
            return
        raise ProtocolError(f"DoExchange: expected {awaited}, got {message!r}")


def _rechunk(
    data: pa.Table | Iterable[pa.RecordBatch], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """Yield ``data`` as batches of at most ``batch_rows`` rows, skipping empty ones (zero-copy)."""
    source: Iterable[pa.RecordBatch] = (
        data.to_batches(max_chunksize=batch_rows) if isinstance(data, pa.Table) else data
    )
    for batch in source:
        for start in range(0, batch.num_rows, batch_rows):
            yield batch.slice(start, batch_rows) if batch.num_rows > batch_rows else batch


def _chunks(reader: flight.FlightStreamReader) -> Iterator[flight.FlightStreamChunk]:
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return


def _interruptible_chunks(reader: flight.FlightStreamReader) -> Iterator[flight.FlightStreamChunk]:
    """:func:`_chunks`, read on a helper thread while the caller waits in ``queue.Queue.get``,
    which a signal interrupts: Ctrl-C raises ``KeyboardInterrupt`` here. pyarrow's
    ``read_chunk`` waits in C++, where Python's signal handlers never run, so a follow reading
    on the main thread itself ignored Ctrl-C for good.

    The helper reads one chunk only when asked for the next, so nothing is read ahead (a chunk
    is never read and dropped, nor yielded twice); between chunks it waits on its own queue,
    and both sides block (no polling). When the caller stops (an exception, or the generator is
    closed) the helper is told to end; one that is in the middle of a read ends when the read
    does (the caller cancels the call), and it never holds the process open (a daemon thread).
    """
    asks: queue.Queue[bool] = queue.Queue()
    answers: queue.Queue[tuple[flight.FlightStreamChunk | None, BaseException | None]] = (
        queue.Queue()
    )

    def read() -> None:
        while asks.get():
            try:
                answers.put((reader.read_chunk(), None))
            except StopIteration:
                answers.put((None, None))
                return
            except BaseException as exc:  # given to the caller, raised there
                answers.put((None, exc))
                return

    threading.Thread(target=read, name="flight-serve-tail-read", daemon=True).start()
    try:
        while True:
            asks.put(True)
            chunk, error = answers.get()  # Ctrl-C interrupts this wait
            if error is not None:
                raise error
            if chunk is None:
                return
            yield chunk
    finally:
        asks.put(False)


def _command(sql: str) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(sql.encode("utf-8"))


def _uri_bytes(location: flight.Location | str | bytes) -> bytes:
    uri = location.uri if isinstance(location, flight.Location) else location
    return uri if isinstance(uri, bytes) else uri.encode()


_END_OF_INPUT: dict[str, Any] = {"end_of_input": True}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _datetime_ns(value: datetime) -> int:
    """Nanoseconds since the Unix epoch (a naive datetime is UTC), exact.

    >>> _datetime_ns(datetime(1970, 1, 1, 0, 0, 1, 5))
    1000005000
    """
    delta: timedelta = (value if value.tzinfo else value.replace(tzinfo=UTC)) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


@dataclass(slots=True)
class _Headers:
    """The headers every call of one client sends (shared with its middleware)."""

    authorization: str | None = None


class _HeadersMiddleware(flight.ClientMiddleware):
    def __init__(self, headers: _Headers) -> None:
        super().__init__()
        self._headers = headers

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        if self._headers.authorization is None:
            return {}
        return {"authorization": [self._headers.authorization]}


class _HeadersFactory(flight.ClientMiddlewareFactory):
    """Adds ``authorization`` to every call once the client has a token (none during the
    handshake that gets it)."""

    def __init__(self, headers: _Headers) -> None:
        super().__init__()
        self._headers = headers

    def start_call(self, info: flight.CallInfo) -> flight.ClientMiddleware | None:
        return _HeadersMiddleware(self._headers)


def _pem(value: str | PathLike[str] | bytes, name: str) -> bytes:
    """PEM bytes from a path or from the bytes themselves.

    Raises:
        ValueError: a path that cannot be read (the message names the argument and the path).
    """
    if isinstance(value, bytes):
        return value
    path = fspath(value)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {path!r}: {exc.strerror}") from None
