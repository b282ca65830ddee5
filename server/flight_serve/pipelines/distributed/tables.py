"""An Iceberg table as a split source of a distributed run: the data files of each snapshot.

Embedded (:class:`~flight_serve.connectors.iceberg.IcebergSource`) the table is **one watermark
partition**; its snapshots are read in commit order, each snapshot's appended rows as pyiceberg
reads them: its data files (``FileScanTask`` s, in the scan's plan order) one after another,
each file's batches at most ``batch_rows`` rows, so no batch holds rows of two files; with
``stop_at`` the partition ends after the stop snapshot. The checkpoint offset is the last
snapshot consumed (a poll reads whole snapshots, so a barrier falls between snapshots).

Distributed, the driver plans the snapshots to read (:func:`table_plans`, from its own source:
the same snapshots, skips and checks as embedded) and their data files (the **splits**), and
deals the files round-robin to the source workers (:class:`TableSplit`). A worker reads each of
its files (the same pyiceberg path, for that one task: the embedded batches of that file) and
sends every window instance one record per batch, numbered ``(file, batch)``, and one that says
the file ended; worker 0 sends the partition's end after the last file. A window instance
consumes the files in the plan's order, each to its end (a reorder, as the row-group parts of
one Parquet file): the embedded sequence of batches, with the embedded watermark. A table's
*position* is the number of snapshots consumed (and 1 more for its end), so a cut falls
between snapshots, as embedded, and is recorded as the embedded offset (the last snapshot).

Bounded reads only: a source without ``stop_at`` (monitoring new snapshots) is refused by name;
so is a windowed query over an Iceberg source that another windowed query reads (the second
exchange numbers its records by position, and a table's position counts snapshots, not the
steps it would number).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flight_serve.errors import PipelineSQLError

if TYPE_CHECKING:
    from flight_serve.connectors.base import Source
    from flight_serve.pipelines.runtime import PipelineRuntime

__all__ = [
    "TableCut",
    "TablePlan",
    "TableSplit",
    "fed_tables",
    "read_file",
    "table_plans",
]


@dataclass(frozen=True)
class TablePlan:
    """What a run reads of one Iceberg source (picklable; the driver's source decides it).

    Attributes:
        partition: the source's one partition (``iceberg <table>``).
        snapshots: per snapshot to consume, in commit order: ``(snapshot id, how many of the
            plan's files are its)`` (0: a snapshot the source skips, or one without rows).
        files: every file to read, in order: ``(snapshot index, pickled FileScanTask,
            full)`` (``full``: the table read at that snapshot in full, the first of an
            expired history under ``earliest``).
        ends: the partition ends after the last snapshot (``stop_at``).
        batch_rows: the largest batch (the driver's source's: a checkpointed run's default
            is larger).
        rows: rows read before (the checkpoint's).
        snapshots_read: snapshots read before (the checkpoint's).
        done: the source had ended (a run resumed from its finished checkpoint).
    """

    partition: str
    snapshots: tuple[tuple[int, int], ...]
    files: tuple[tuple[int, bytes, bool], ...]
    ends: bool
    batch_rows: int
    rows: int = 0
    snapshots_read: int = 0
    done: bool = False

    @property
    def steps(self) -> int:
        """The positions a run of this plan goes through: one per snapshot, one for the end."""
        return len(self.snapshots) + int(self.ends)


@dataclass(frozen=True)
class TableSplit:
    """What a source worker reads of an Iceberg source (picklable): the plan's files ``i``
    with ``i % channels == channel`` (the plan is the attempt's: a restored attempt plans from
    its checkpoint); channel 0 also sends the partition's end.

    Attributes:
        channel: this worker's number among the source's readers.
        channels: the source's readers.
    """

    channel: int
    channels: int


@dataclass(frozen=True)
class TableCut:
    """Where a cut leaves one Iceberg source (picklable).

    Attributes:
        snapshots: snapshots of the attempt's plan consumed (its position; +1 once the
            partition's end was).
        rows: rows read before the cut (the plan's ``rows`` included).
        done: the partition's end was consumed.
    """

    snapshots: int
    rows: int
    done: bool = False

    @property
    def position(self) -> int:
        """Snapshots consumed, and 1 more for the end."""
        return self.snapshots + int(self.done)

    @property
    def finished(self) -> bool:
        return self.done


def fed_tables(runtime: PipelineRuntime) -> list[str]:
    """The Iceberg sources some query reads, in the plan's order."""
    from flight_serve.connectors.iceberg import IcebergSource

    return [
        name
        for name, source in runtime.flight_sources.items()
        if isinstance(source, IcebergSource) and runtime.streams[name].consumers
    ]


def table_plans(runtime: PipelineRuntime, *, done: bool = False) -> dict[str, TablePlan]:
    """What every fed Iceberg source of the driver's ``runtime`` reads (its sources were built
    as the embedded run builds them: a checkpointed run's from the checkpoint's snapshot).

    Raises:
        PipelineSQLError: a source without ``stop_at``.
        NonAppendSnapshotError, SnapshotExpiredError, SnapshotNotInHistoryError,
            ConnectorError: as the embedded source's first poll.
    """
    from flight_serve.connectors.iceberg import IcebergSource

    out: dict[str, TablePlan] = {}
    for name in fed_tables(runtime):
        source = runtime.flight_sources[name]
        assert isinstance(source, IcebergSource)
        if not source.stop_at_end:
            raise PipelineSQLError(
                f"SOURCE {name}: an Iceberg source without stop_at: the distributed runtime "
                "reads a bounded range of snapshots so far (stop_at = 'latest' or a snapshot "
                "id; docs/scaling.md)"
            )
        snapshots: list[tuple[int, int]] = []
        files: list[tuple[int, bytes, bool]] = []
        pending = [] if done else source.pending()
        for index, (snapshot, full) in enumerate(pending):
            tasks = []
            if full or source.wanted(snapshot):
                tasks = list(source.scan_of(snapshot, full).plan_files())
            snapshots.append((snapshot.snapshot_id, len(tasks)))
            files += [(index, pickle.dumps(task), full) for task in tasks]
        out[name] = TablePlan(
            source.partition,
            tuple(snapshots),
            tuple(files),
            True,
            source.batch_rows,
            source.rows,
            source.snapshots_read,
            done,
        )
    return out


def read_file(source: Source, plan: TablePlan, index: int) -> Iterator[pa.RecordBatch]:
    """The batches of the plan's file ``index``, as the embedded source hands them out.

    Raises:
        ConnectorError, CatalogError: the file cannot be read (named).
    """
    from flight_serve.connectors.iceberg import IcebergSource

    assert isinstance(source, IcebergSource), "an Iceberg source"
    source.batch_rows = plan.batch_rows
    snapshot_index, pickled, full = plan.files[index]
    task: Any = pickle.loads(pickled)
    return source.read_task(plan.snapshots[snapshot_index][0], task, full)
