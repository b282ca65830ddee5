"""Moving a windowed query's state between instances by key group (the core of a rescale).

Every table of an :class:`~flight_serve.engine.operator.OperatorSnapshot` (pane state, row
buffer, closed sessions, key registry) holds the query's key columns, so a snapshot splits by key
group (:mod:`.keygroups`) without knowing the layout (SQL-merged or folded):

* :func:`split_snapshot`: one snapshot (an instance's, or the embedded operator's) into one per
  instance of ``parallelism``, each with the rows of the key groups that instance owns;
* :func:`merge_snapshots`: the snapshots of every instance, taken at the same cut, into one.

``rescale(snapshots, p)`` is ``split_snapshot(merge_snapshots(snapshots), p)``. What is not
per key is in ``meta``: the watermark tracker (the same on every instance: each gets every
batch's progress) must agree; the folded state's fire mark is the highest; the empty-window mark
too, refused when an instance behind it still owes empty windows; the metrics (informational)
are summed by a merge and kept on instance 0 by a split.

Not yet wired to checkpoints: the Ray runtime takes none (docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from flight_serve.engine.operator import OperatorSnapshot
from flight_serve.errors import CheckpointError
from flight_serve.pipelines.distributed.keygroups import instances_of, key_groups

__all__ = ["merge_snapshots", "rescale", "split_snapshot"]

_TABLES = ("panes", "buffer", "closed_sessions", "known_keys")
#: meta entries every instance of one cut must agree on (they are not per key)
_SHARED = ("version", "watermark")


def split_snapshot(
    snapshot: OperatorSnapshot,
    key_columns: Sequence[str],
    parallelism: int,
    max_parallelism: int,
) -> list[OperatorSnapshot]:
    """``snapshot`` as one snapshot per instance of ``parallelism``: instance ``i`` gets the
    rows of its key groups (:func:`~.keygroups.key_group_range`), the shared meta, and the
    metrics on instance 0 only.

    Raises:
        ValueError: parallelism outside ``1 … max_parallelism``.
        KeyError: a table of the snapshot lacks a key column (not this query's snapshot).
    """
    owners = {
        name: instances_of(
            key_groups(getattr(snapshot, name), key_columns, max_parallelism),
            parallelism,
            max_parallelism,
        )
        for name in _TABLES
    }
    out: list[OperatorSnapshot] = []
    for i in range(parallelism):
        tables: dict[str, pa.Table] = {}
        for name in _TABLES:
            table: pa.Table = getattr(snapshot, name)
            rows = np.flatnonzero(owners[name] == i)
            tables[name] = table.take(pa.array(rows, pa.int64()))
        meta = dict(snapshot.meta)
        if i:
            meta["metrics"] = {k: 0 for k in snapshot.meta.get("metrics", {})}
        out.append(replace(snapshot, meta=meta, **tables))
    return out


def merge_snapshots(snapshots: Sequence[OperatorSnapshot]) -> OperatorSnapshot:
    """The snapshots of every instance of one cut as one: the tables concatenated (their keys
    are disjoint), the shared meta (checked), the metrics summed.

    Raises:
        CheckpointError: no snapshot, or the instances disagree on what is not per key (they
            were not taken at the same cut).
    """
    if not snapshots:
        raise CheckpointError("no snapshot to merge")
    first = snapshots[0]
    for n, other in enumerate(snapshots[1:], start=1):
        for key in _SHARED:
            if other.meta.get(key) != first.meta.get(key):
                raise CheckpointError(
                    f"instance {n}'s snapshot differs from instance 0's in {key} "
                    f"({other.meta.get(key)!r} vs {first.meta.get(key)!r}): not the same cut"
                )
    meta = dict(first.meta)
    # the folded state's fire mark: windows ending at or before it are closed. Every instance
    # has the same watermark, so the highest mark holds for all (an instance moves its mark
    # only when it fires or accepts rows, and holds no pane of a window another closed)
    marks = [s.meta.get("fired_upto_ns") for s in snapshots]
    if any(m is not None for m in marks):
        meta["fired_upto_ns"] = max(int(m) for m in marks if m is not None)
    # the empty windows' mark: an instance behind the highest one still owes its keys' empty
    # windows up to it, which one mark cannot say
    done = [int(s.meta.get("empty_done_ns", 0)) for s in snapshots]
    for n, s in enumerate(snapshots):
        if done[n] < max(done) and s.known_keys.num_rows:
            raise CheckpointError(
                f"instance {n} has empty windows to emit up to {max(done)} ns that its "
                "snapshot cannot carry through a merge (empty_windows_key_ttl): rescale at a "
                "cut where every instance has fired"
            )
    meta["empty_done_ns"] = max(done)
    tables = {name: pa.concat_tables([getattr(s, name) for s in snapshots]) for name in _TABLES}
    metrics: dict[str, Any] = {}
    for s in snapshots:
        for key, value in s.meta.get("metrics", {}).items():
            metrics[key] = metrics.get(key, 0) + int(value)
    return replace(first, meta={**meta, "metrics": metrics}, **tables)


def rescale(
    snapshots: Sequence[OperatorSnapshot],
    key_columns: Sequence[str],
    parallelism: int,
    max_parallelism: int,
) -> list[OperatorSnapshot]:
    """The instances' snapshots of one cut redistributed over ``parallelism`` instances.

    Raises:
        CheckpointError, ValueError, KeyError: as :func:`merge_snapshots` and
            :func:`split_snapshot`.
    """
    return split_snapshot(merge_snapshots(snapshots), key_columns, parallelism, max_parallelism)
