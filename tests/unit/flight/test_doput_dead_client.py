"""DoPut's write pipeline when its client is gone: every staged batch is committed before the call ends.

The server's DoPut stages each batch in the store (its offset reserved) on one thread and
commits and acknowledges them in order on another. When a PutResult cannot be sent (the client
died), the batches staged after it must still be committed before the call ends: a reserved
offset is published by the stream's next commit by *any* writer, so a staged batch left behind
would appear after the call ended, after a producer that lost the call had read back what
landed (``stream.writer_wait``) and sent that batch again.

Seen in tests/integration/test_flight_chain.py: server A died while B held ids 71..80 acked and
ids 81..90 staged; the PutResult of 71..80 failed, 81..90 stayed staged, A's resumed sink read
back offsets 0..7, sent 81..90 again, and B's next commit published both copies (offsets 8, 9).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from flight_serve.flight.doput import PutPipeline as _PutPipeline
from flight_serve.store import StreamStore
from flight_serve.store.streams import PendingAppend

SCHEMA = pa.schema([("id", pa.int64())])


def _batch(first: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(first, first + 10), pa.int64())})


class _StagingStore(StreamStore):
    """The real store; ``staged`` is set once ``want`` batches are staged (offsets reserved)."""

    def __init__(self, data_dir: Path, want: int) -> None:
        super().__init__(data_dir)
        self.want = want
        self.count = 0
        self.staged = threading.Event()

    def write(
        self,
        name: str,
        batch: pa.RecordBatch,
        *,
        writer: str = "",
        after: PendingAppend | None = None,
    ) -> PendingAppend:
        written = super().write(name, batch, writer=writer, after=after)
        self.count += 1
        if self.count == self.want:
            self.staged.set()
        return written


class _GoneClient:
    """The PutResult side of a call whose client died once the batches were staged: the first
    PutResult fails the way pyarrow fails it (``Unknown error writing metadata``)."""

    def __init__(self, store: _StagingStore) -> None:
        self.store = store

    def write(self, buffer: Any) -> None:
        assert self.store.staged.wait(10), "the writing thread did not stage the batches"
        raise OSError("Unknown error writing metadata.")


def test_batches_staged_when_the_client_died_are_durable_before_the_call_ends(
    tmp_path: Path,
) -> None:
    # timeline (one DoPut as writer "from-a", then another writer):
    #   stage b0 (offset 0), b1 (1), b2 (2) ─ commit b0 ─ PutResult for b0 fails (client gone)
    #   ─ the call ends ─ the stream must end at 3 now, not at 1 with 1 and 2 published later
    store = _StagingStore(tmp_path, want=3)
    try:
        store.create("relay", SCHEMA)
        client = _GoneClient(store)
        pipeline = _PutPipeline(store, "relay", client, "from-a")  # type: ignore[arg-type]
        for first in (1, 11, 21):
            pipeline.put(_batch(first))
        with pytest.raises(OSError, match="Unknown error writing metadata"):
            pipeline.finish()
        assert store.info("relay").next_offset == 3  # all three durable and visible
        assert store.append("relay", _batch(31), writer="other") == 3
        ids = [i for _, b in store.read("relay") for i in b.column("id").to_pylist()]
        assert ids == list(range(1, 41))
    finally:
        store.close()
