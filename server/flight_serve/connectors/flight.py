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
    repeated), :data:`RECONNECT_ATTEMPTS` times in a row with doubling pauses. A stream that
    does not exist yet is waited for when the columns are declared.

Sink (:class:`FlightSink`)
    One DoPut (``path = [stream, writer]``) held open for the run: every batch is written and
    its PutResult (the batch is durable on the server) awaited before :meth:`FlightSink.write`
    returns. :meth:`FlightSink.end_input` ends the writer's partition (the run reached the end of
    its input). There is no retry and no exactly-once yet: a failed write fails the run, and a
    rerun appends its rows again.

Errors: :class:`~flight_serve.errors.ConnectorError` naming the server and stream.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import pyarrow as pa
import pyarrow.flight as paflight

from flight_serve.errors import ConnectorError

__all__ = [
    "DEFAULT_SERVER",
    "RECONNECT_ATTEMPTS",
    "FlightSink",
    "FlightSource",
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

SourceEventKind = Literal["batch", "partition", "watermark", "end", "backlog"]


@dataclass(frozen=True)
class SourceEvent:
    """One thing a :class:`FlightSource` read (see the module docstring).

    Attributes:
        kind: ``batch`` (rows of ``partition``), ``partition`` (a new writer), ``watermark``
            (``partition``'s explicit watermark, ``watermark_ns``), ``end`` (``partition`` ended)
            or ``backlog`` (whether the tail has unread entries, ``backlog``).
        partition: the writer.
        batch: the rows of a ``batch`` event, in the source's schema.
        offset: the stream offset of a ``batch``, ``watermark`` or ``end`` event.
    """

    kind: SourceEventKind
    partition: str = ""
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    backlog: bool = False
    offset: int = -1


@dataclass(frozen=True)
class WriterHistory:
    """What a stream's history says of one writer (GetFlightInfo ``writers``)."""

    name: str
    first_offset: int
    last_offset: int
    watermark_ns: int | None
    ended_at: int | None


@dataclass
class _Entry:
    """One complete entry read from the tail (pieces of a split batch joined)."""

    offset: int
    writer: str
    next_offset: int
    batch: pa.RecordBatch | None = None
    watermark_ns: int | None = None
    end_of_input: bool = False


def _location(server: str) -> str:
    return server if "://" in server else f"grpc+tcp://{server}"


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    # pyarrow appends gRPC details after the message: keep the first line
    return text.splitlines()[0] if text else type(exc).__name__


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


class FlightSource:
    """Tails a server stream as a pipeline source (see the module docstring).

    Args:
        server: the server's Flight URI (``grpc://host:port``; ``host:port`` alone means
            ``grpc+tcp://``).
        stream: the stream name.
        schema: the declared columns (read exactly these, cast to these types), or ``None`` to
            take the stream's schema (the stream must exist then).
        start_offset: the first offset read (≥ 0).
        stop_at_end: stop after the entries the stream holds now (see the module docstring).

    Raises:
        ConnectorError: the server cannot be reached, the stream does not exist and no columns
            are declared, or a declared column is missing from the stream.
    """

    def __init__(
        self,
        server: str,
        stream: str,
        *,
        schema: pa.Schema | None = None,
        start_offset: int = 0,
        stop_at_end: bool = False,
    ) -> None:
        if start_offset < 0:
            raise ConnectorError(f"flight connector: start_offset must be >= 0, got {start_offset}")
        self.server = server
        self.stream = stream
        self.start_offset = start_offset
        self.stop_at_end = stop_at_end
        self.what = f"flight connector (server {server}, stream {stream!r})"
        self._client = self._connect()
        info = self._info()
        if info is None and schema is None:
            raise ConnectorError(
                f"{self.what}: the stream does not exist yet; declare the source's columns to "
                "wait for it"
            )
        stream_schema: pa.Schema | None = info[0] if info is not None else None
        self.stream_schema = stream_schema
        self.schema: pa.Schema = schema if schema is not None else stream_schema  # type: ignore[assignment]
        if stream_schema is not None and schema is not None:
            missing = [n for n in schema.names if stream_schema.get_field_index(n) < 0]
            if missing:
                raise ConnectorError(
                    f"{self.what}: the stream has no column {', '.join(map(repr, missing))}; its "
                    f"columns: {', '.join(stream_schema.names)}"
                )
        metadata = info[1] if info is not None else {}
        #: the stream's end when the source was opened (``stop_at_end`` stops there)
        self.end_offset = _int_or_none(metadata.get("next_offset")) or 0
        self.history = _writers(metadata)
        #: writers that are partitions from the start (ended before ``start_offset``: left out)
        self.partitions: tuple[str, ...] = tuple(
            h.name
            for h in self.history.values()
            if (h.ended_at is None or h.ended_at >= start_offset)
            and (not stop_at_end or h.first_offset < self.end_offset)
        )
        #: explicit watermarks of writers whose every entry lies before ``start_offset``
        self.initial_watermarks: dict[str, int] = {
            h.name: h.watermark_ns
            for h in self.history.values()
            if h.name in self.partitions
            and h.watermark_ns is not None
            and h.last_offset < start_offset
        }
        self._known: set[str] = set(self.partitions)
        self._ended: set[str] = set()
        self._position = start_offset  # the next offset the pipeline has not polled
        self._server_end = self.end_offset  # the stream's next_offset as last reported
        self._backlog = self._server_end > start_offset
        self._done = stop_at_end and start_offset >= self.end_offset
        self._queue: queue.Queue[_Entry | BaseException] = queue.Queue(_QUEUE_ENTRIES)
        self._closing = threading.Event()
        self._reader: paflight.FlightStreamReader | None = None
        self._thread: threading.Thread | None = None

    # --- the server -------------------------------------------------------------------------

    def _connect(self) -> paflight.FlightClient:
        try:
            return paflight.FlightClient(_location(self.server))
        except (pa.ArrowException, OSError) as exc:
            raise ConnectorError(f"{self.what}: cannot connect: {_message(exc)}") from exc

    def _info(self) -> tuple[pa.Schema, dict[str, Any]] | None:
        """The stream's schema and FlightInfo metadata, or ``None`` if it does not exist."""
        try:
            info = self._client.get_flight_info(paflight.FlightDescriptor.for_path(self.stream))
        except pa.ArrowKeyError:
            return None
        except (pa.ArrowException, OSError) as exc:
            raise ConnectorError(f"{self.what}: {_message(exc)}") from exc
        raw = info.app_metadata
        try:
            metadata = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            metadata = {}
        return info.schema, metadata if isinstance(metadata, dict) else {}

    # --- the pipeline's side ----------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the source has nothing more to give (see the module docstring)."""
        return self._done

    @property
    def backlog(self) -> bool:
        """Whether the tail has unread entries (as far as the source knows)."""
        return self._backlog

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
                every reconnection attempt, a batch does not fit the declared columns).
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
            events.append(
                SourceEvent("batch", writer, self._conform(entry.batch), offset=entry.offset)
            )
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

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        schema = self.schema
        if batch.schema.equals(schema):
            return batch
        try:
            return pa.RecordBatch.from_arrays(
                [batch.column(f.name).cast(f.type) for f in schema], schema=schema
            )
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConnectorError(
                f"{self.what}: a batch does not fit the declared columns: {_message(exc)}"
            ) from exc

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
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with contextlib.suppress(pa.ArrowException, OSError):
            self._client.close()

    # --- the reading thread -----------------------------------------------------------------

    def _offer(self, item: _Entry | BaseException) -> None:
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
        incarnation: str | None = None
        try:
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
                    for entry in self._tail(position):
                        failures = 0
                        self._offer(entry)
                        position = entry.offset + 1
                    # the server ended the tail (shut down, or the stream was dropped): look again
                    if self._closing.wait(_WAIT_FOR_STREAM_S):
                        return
                except (paflight.FlightUnavailableError, ConnectorError) as exc:
                    if isinstance(exc, ConnectorError) and not isinstance(
                        exc.__cause__, paflight.FlightUnavailableError
                    ):
                        raise
                    if failures >= RECONNECT_ATTEMPTS:
                        raise ConnectorError(
                            f"{self.what}: the server is unreachable after {failures} "
                            f"reconnection attempts: {_message(exc)}"
                        ) from exc
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
                if isinstance(exc, ConnectorError)
                else ConnectorError(f"{self.what}: the tail failed: {_message(exc)}")
            )
            with contextlib.suppress(_Closed):
                self._offer(error)

    def _tail(self, position: int) -> Iterator[_Entry]:
        """The complete entries of one tail call from ``position``."""
        body = json.dumps({"stream": self.stream, "offset": position}).encode()
        results = list(self._client.do_action(paflight.Action("stream.tail", body)))
        ticket = paflight.Ticket(results[0].body.to_pybytes())
        reader = self._client.do_get(ticket)
        self._reader = reader
        if self._closing.is_set():
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
            self._reader = None
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

    def __init__(self, server: str, stream: str, schema: pa.Schema, writer: str) -> None:
        self.server = server
        self.stream = stream
        self.schema = schema
        self.writer_name = writer
        self.what = f"flight connector (server {server}, stream {stream!r}, writer {writer!r})"
        self.rows = 0
        self.last_offset = -1
        try:
            self._client = paflight.FlightClient(_location(server))
            descriptor = paflight.FlightDescriptor.for_path(stream, writer)
            writer_, reader = self._client.do_put(descriptor, schema)
        except (pa.ArrowException, OSError) as exc:
            raise ConnectorError(f"{self.what}: cannot open the DoPut: {_message(exc)}") from exc
        self._writer: paflight.FlightStreamWriter | None = writer_
        self._reader = cast(paflight.FlightMetadataReader, reader)

    def _ack(self) -> dict[str, Any]:
        buffer = self._reader.read()
        if buffer is None:
            raise ConnectorError(f"{self.what}: the server ended the DoPut without a PutResult")
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
            raise ConnectorError(f"{self.what}: {action} failed: {_message(exc)}") from exc

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
            raise ConnectorError(f"{self.what}: closing the DoPut failed: {_message(exc)}") from exc
        finally:
            with contextlib.suppress(pa.ArrowException, OSError):
                self._client.close()
