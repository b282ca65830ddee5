"""The ``falkordb`` sink inside pipelines: option checks at build time, and the epoch sink of
checkpointed runs (:class:`EpochGraphSink`).

Unchecked embedded runs write every batch as it arrives (:class:`~flight_serve.connectors.
falkordb.FalkorDBSink` without an epoch: at least once, idempotent upserts). Checkpointed runs
(``flight-serve run`` with checkpoints, server pipelines) follow the prepare / commit protocol of
:mod:`~flight_serve.pipelines.epoch_sinks`:

1. **write**: epoch ``e``'s batches are held in memory;
2. **prepare** (at the barrier): they are staged in the checkpoint itself
   (``sink-<name>.arrow``, Arrow IPC);
3. **commit** (after the manifest): they are written to the graph as one
   :meth:`~flight_serve.connectors.falkordb.FalkorDBSink.write` with ``epoch = e``: every
   ``UNWIND`` query carries the marker ``(:_FlightServeSink {pipeline, sink})`` and applies only
   if the marker is below ``(e, seq)``;
4. **recover** (restore from checkpoint ``r``): epoch ``r``'s staged rows are written again with
   ``epoch = r``: the queries that landed before the crash are skipped by the marker, the rest
   are applied. Then the marker is set to the end of ``r`` so the replayed epochs after ``r``
   are written (a fresh run sets it to 0).

Replay semantics: the graph ends as a straight run leaves it. Properties that are *set* converge
whatever is replayed; ``accumulate`` properties are added once per epoch, except after a resume
from a checkpoint older than the newest (``resume=N``): the graph cannot be rolled back, so the
epochs after ``N`` add again.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flight_serve.connectors.falkordb import (
    FALKORDB_OPTIONS,
    FalkorDBOptionError,
    FalkorDBSink,
    GraphMapping,
)
from flight_serve.pipelines.epoch_sinks import StagedEpochSink
from flight_serve.pipelines.pipeline import SinkDef

__all__ = ["EpochGraphSink", "graph_sink_options"]


def graph_sink_options(sink: SinkDef) -> dict[str, str]:
    """The ``WITH`` options of a ``falkordb`` sink as text, checked as far as they can be
    without the input schema.

    Raises:
        PipelineSQLError: an unknown option or a mapping that cannot work, pointing at the
            option (or the sink).
    """
    options = {key: option.text for key, option in sink.connector.items()}
    try:
        for key in options:
            if key not in FALKORDB_OPTIONS:
                raise FalkorDBOptionError(
                    key,
                    "unknown option of the falkordb connector of SINK "
                    f"{sink.name}; its options: {', '.join(FALKORDB_OPTIONS)}",
                )
        GraphMapping.from_options(options)
    except FalkorDBOptionError as exc:
        raise sink.connector.get(exc.option, sink.connector["connector"]).error(str(exc)) from exc
    return options


class EpochGraphSink(StagedEpochSink):
    """The ``falkordb`` sink of a checkpointed run (see the module docstring).

    Args:
        name: the sink's name; its staged rows are the checkpoint file ``sink-<name>.arrow``.
        sink: the connected graph writer (its ``pipeline`` names the run in the marker).
        restored_epoch: the checkpoint resumed from (``None``: a fresh run).
        rows: rows committed before (from the checkpoint).
    """

    def __init__(
        self, name: str, sink: FalkorDBSink, *, restored_epoch: int | None, rows: int = 0
    ) -> None:
        super().__init__(name, rows)
        self.sink = sink
        self.restored_epoch = restored_epoch
        if restored_epoch is None:
            sink.reset_marker(0)

    def recover(self, staged: list[pa.RecordBatch]) -> None:
        """Redo the commit of the checkpoint resumed from (its staged batches), then move the
        marker to its end."""
        assert self.restored_epoch is not None
        if staged:
            self.sink.write(pa.Table.from_batches(staged), epoch=self.restored_epoch)
        self.sink.reset_marker(self.restored_epoch)

    def apply(self, epoch: int, batches: list[pa.RecordBatch]) -> None:
        """Write the epoch's rows to the graph (the marker skips an epoch already there)."""
        self.sink.write(pa.Table.from_batches(batches), epoch=epoch)

    def mark(self) -> dict[str, Any]:
        return {"kind": "falkordb", "graph": self.sink.graph_name}

    def close(self) -> None:
        """Drop what was not committed (it is replayed) and close the connection."""
        super().close()
        self.sink.close()
