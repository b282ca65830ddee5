"""DoPut's write path for a stream: read, stage, write and group-commit batches on four threads,
and acknowledge each with a PutResult once it is durable (:class:`PutPipeline`).

The PutResult app_metadata is UTF-8 JSON: ``{"offset": <int>, "rows": <int>}`` for a batch,
``{"offset", "rows": 0, "watermark_ns"}`` or ``{"offset", "rows": 0, "end_of_input": true}`` for
a marker (:mod:`flight_serve.flight.markers`), and a last ``{"error": <message>}`` when a
pipeline thread fails (schemas/README.md, "Streams").
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flight_serve.flight.markers import Marker
from flight_serve.flight.ops.limits import MemoryBudget, Reservation
from flight_serve.store import PendingAppend, StreamStore

__all__ = ["PutPipeline", "encode_put_error", "encode_put_result"]


def _marker_ack(offset: int, marker: Marker) -> dict[str, Any]:
    if marker.end_of_input:
        return {"offset": offset, "rows": 0, "end_of_input": True}
    return {"offset": offset, "rows": 0, "watermark_ns": marker.watermark_ns}


def encode_put_result(offset: int, rows: int, marker: Marker | None = None) -> bytes:
    """The app_metadata of the PutResult for a durable entry (schemas/README.md, "Streams"):
    UTF-8 JSON ``{"offset": int, "rows": int}`` for a batch of ``rows`` rows; for a marker
    ``{"offset": int, "rows": 0, "watermark_ns": int}`` or ``{..., "end_of_input": true}``.

    >>> encode_put_result(3, 10)
    b'{"offset": 3, "rows": 10}'
    """
    result = {"offset": offset, "rows": rows} if marker is None else _marker_ack(offset, marker)
    return json.dumps(result).encode()


def encode_put_error(message: str) -> bytes:
    """The app_metadata of the last PutResult of a DoPut whose batch could not be stored:
    ``{"error": <message>}`` (the call then ends with the error's status).

    >>> encode_put_error("disk full")
    b'{"error": "disk full"}'
    """
    return json.dumps({"error": message}).encode()


#: Batches DoPut's reading thread may queue ahead of the one writing them to the store.
_PUT_QUEUE_BATCHES = 4


class PutPipeline:
    """DoPut's pipeline: the handler thread only reads batches; a writing thread stages each in
    the store (:meth:`StreamStore.write`: encode, checksum, reserve the offset), a flushing
    thread puts the staged frames in the segment file (:meth:`StreamStore.flush`: no sync),
    and an acknowledging thread commits them in order (:meth:`StreamStore.commit`: one
    fdatasync for every frame in the file) and sends each PutResult only after the commit that
    covers its batch.

    So reading the next batch overlaps encoding this one, which overlaps the disk writing the
    previous ones, which overlaps the sync of the ones before (the disk never waits for a sync
    to end before it gets the next frame: syncing between writes on one thread halved its
    speed here). The reading thread cannot send PutResults itself: it blocks reading the next
    batch while a client may wait for PutResults before it writes more.

    After a failure no further batch is written; the batches written before it are still
    committed (and acknowledged while the client can still be sent PutResults), and
    :meth:`check` / :meth:`finish` raise the first error. Every staged batch is committed
    before :meth:`finish` returns even when a PutResult could not be sent (the client is gone):
    its offset is reserved, so the next commit of the stream by any writer would make it
    durable and visible anyway, and it must be there before the call ends (a producer that lost
    the call reads back what landed once no call of its writer is in progress:
    ``stream.writer_wait``). A failure of the writing or acknowledging thread is also told to
    the client at once, by a last PutResult ``{"error": <message>}``: the handler thread may be
    blocked reading the next batch while the client waits for PutResults before it writes
    more, so the call can only end (with the error's status) once the client writes again or
    finishes writing.
    """

    def __init__(
        self,
        store: StreamStore,
        name: str,
        writer: flight.FlightMetadataWriter,
        writer_name: str = "",
        budget: MemoryBudget | None = None,
    ) -> None:
        self._budget = budget  # each queued batch holds its nbytes until committed
        self._store = store
        self._name = name
        self._writer = writer
        self._writer_name = writer_name
        self._batches: queue.Queue[tuple[pa.RecordBatch | Marker, Reservation | None] | None] = (
            queue.Queue(_PUT_QUEUE_BATCHES)
        )
        self._staged: queue.SimpleQueue[
            tuple[PendingAppend, Marker | None, Reservation | None] | None
        ] = queue.SimpleQueue()
        self._pending: queue.SimpleQueue[
            tuple[PendingAppend, Marker | None, Reservation | None] | None
        ] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._write, name="flight-serve-doput-write"),
            threading.Thread(target=self._flush, name="flight-serve-doput-flush"),
            threading.Thread(target=self._acknowledge, name="flight-serve-doput-ack"),
        ]
        for thread in self._threads:
            thread.start()
        self._finished = False

    def put(self, batch: pa.RecordBatch | Marker) -> None:
        """Queue ``batch`` (or a marker) for writing (blocks while the writing thread is
        behind, and under a memory budget while it has no room: OverloadError after its
        wait)."""
        self.check()
        held = None
        if self._budget is not None and isinstance(batch, pa.RecordBatch):
            held = self._budget.reserve(batch.nbytes, "doput", "this DoPut batch")
        self._batches.put((batch, held))

    def check(self) -> None:
        """Raise the first error of the pipeline's threads, if any."""
        if self._error is not None:
            raise self._error

    def finish(self) -> None:
        """Wait until every batch queued so far is written and acknowledged (or skipped after a
        failure); raise the first error, if any."""
        if not self._finished:
            self._finished = True
            self._batches.put(None)
            for thread in self._threads:
                thread.join()
        self.check()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _report(self, exc: BaseException) -> None:
        """Send the PutResult ``{"error": <message>}`` (nothing if sending fails too)."""
        with contextlib.suppress(Exception):
            self._writer.write(pa.py_buffer(encode_put_error(str(exc))))

    def _write(self) -> None:
        last: PendingAppend | None = None  # the call's batches land as a prefix of what it sent
        try:
            while (item := self._batches.get()) is not None:
                batch, held = item
                if self._error is not None and held is not None:
                    held.release()
                if self._error is None:  # after a failure, only drain the queue
                    try:
                        if isinstance(batch, Marker):
                            last = self._store.write_marker(
                                self._name,
                                self._writer_name,
                                watermark_ns=batch.watermark_ns,
                                end_of_input=batch.end_of_input,
                                after=last,
                            )
                            self._staged.put((last, batch, held))
                        else:
                            last = self._store.write(
                                self._name, batch, writer=self._writer_name, after=last
                            )
                            self._staged.put((last, None, held))
                    except BaseException as exc:
                        if held is not None:
                            held.release()
                        self._fail(exc)
                        self._staged.put(None)  # the acknowledging thread reports it now
        finally:
            self._staged.put(None)

    def _flush(self) -> None:
        """Put each staged frame in the file as soon as it is staged (no sync): the commit of
        the acknowledging thread then only syncs, while the next frames are written."""
        try:
            while (item := self._staged.get()) is not None:
                if self._error is None:
                    try:
                        self._store.flush(item[0])
                    except BaseException as exc:
                        # The batches not yet durable are discarded: their commits raise, and
                        # the acknowledging thread reports this first error.
                        self._fail(exc)
                self._pending.put(item)
        finally:
            self._pending.put(None)

    def _acknowledge(self) -> None:
        failed = False  # no PutResult after a failed commit or send
        while (item := self._pending.get()) is not None:
            pending, marker, held = item
            try:
                # Committed even after a failure: a staged frame's offset is reserved, and the
                # stream's next commit by any writer would publish it after this call ended.
                offset = self._store.commit(pending)
            except BaseException as exc:
                if not failed:
                    failed = True
                    self._fail(exc)
                    self._report(self._error or exc)  # the first error (the flush's, if any)
                continue
            finally:
                if held is not None:
                    held.release()  # durable on disk (or failed): no longer held in memory
            if failed:
                continue
            try:
                self._writer.write(pa.py_buffer(encode_put_result(offset, pending.rows, marker)))
            except BaseException as exc:
                failed = True
                self._fail(exc)
                self._report(exc)
        if not failed and self._error is not None:
            self._report(self._error)  # the writing thread failed
