"""Key groups (pipelines/distributed/keygroups.py): pinned hashes, exact assignments, and every
key group owned by exactly one instance for any parallelism."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from flight_serve.errors import PipelineSQLError
from flight_serve.pipelines.distributed.keygroups import (
    hash_keys,
    instance_of_key_group,
    instances_of,
    key_group_range,
    key_groups,
)
from hypothesis import given
from hypothesis import strategies as st

BATCH = pa.record_batch(
    {
        "origin": ["EWR", "JFK", "LGA", "EWR", None],
        "n": pa.array([1, 2, 3, 1, None], pa.int64()),
    }
)


def test_key_groups_are_pinned() -> None:
    """The exact key groups of a few keys: a change of the hash moves state between instances
    of existing jobs, so it must be deliberate."""
    assert key_groups(BATCH, ["origin"], 128).tolist() == [53, 127, 81, 53, 85]
    assert key_groups(BATCH, ["origin", "n"], 128).tolist() == [124, 48, 26, 124, 28]
    assert key_groups(BATCH, [], 128).tolist() == [0, 0, 0, 0, 0]


def test_the_hash_is_the_same_in_another_process_whatever_its_hash_seed() -> None:
    code = (
        "import pyarrow as pa;"
        "from flight_serve.pipelines.distributed.keygroups import hash_keys;"
        "print(hash_keys(pa.record_batch({'k': ['EWR', 'JFK', 'x' * 40]}), ['k']).tolist())"
    )
    here = hash_keys(pa.record_batch({"k": ["EWR", "JFK", "x" * 40]}), ["k"]).tolist()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == str(here)


def test_equal_keys_hash_alike_across_types_and_batches() -> None:
    ts = pa.array([dt.datetime(2013, 1, 1, 5), dt.datetime(2013, 1, 1, 6)], pa.timestamp("us"))
    a = pa.record_batch({"t": ts, "d": pa.array([dt.date(2013, 1, 1)] * 2), "f": [0.0, -0.0]})
    b = pa.record_batch({"t": ts.slice(1), "d": pa.array([dt.date(2013, 1, 1)]), "f": [-0.0]})
    assert hash_keys(a, ["t"])[1] == hash_keys(b, ["t"])[0]
    assert hash_keys(a, ["f"])[0] == hash_keys(a, ["f"])[1] == hash_keys(b, ["f"])[0]
    assert hash_keys(a, ["d"])[0] == hash_keys(b, ["d"])[0]
    # a dictionary-encoded and a plain string column, a sliced one: the same hash per value
    plain = pa.record_batch({"k": ["EWR", "JFK", "EWR"]})
    encoded = pa.record_batch({"k": pa.array(["EWR", "JFK", "EWR"]).dictionary_encode()})
    sliced = pa.record_batch({"k": pa.array(["x", "EWR", "JFK", "EWR"]).slice(1)})
    assert hash_keys(plain, ["k"]).tolist() == hash_keys(encoded, ["k"]).tolist()
    assert hash_keys(plain, ["k"]).tolist() == hash_keys(sliced, ["k"]).tolist()
    # the column order counts, and ("a", "") differs from ("", "a")
    two = pa.record_batch({"x": ["a", ""], "y": ["", "a"]})
    h = hash_keys(two, ["x", "y"])
    assert h[0] != h[1]


def test_a_key_type_the_exchange_cannot_hash_is_named() -> None:
    batch = pa.record_batch({"tags": pa.array([[1, 2]], pa.list_(pa.int64()))})
    with pytest.raises(PipelineSQLError, match=r"key column tags \(list<item: int64>\)"):
        hash_keys(batch, ["tags"])


def test_exact_instances_and_ranges() -> None:
    assert [instance_of_key_group(g, 3, 8) for g in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [key_group_range(i, 3, 8) for i in range(3)] == [range(0, 3), range(3, 6), range(6, 8)]
    assert [key_group_range(i, 2, 128) for i in range(2)] == [range(0, 64), range(64, 128)]
    assert [len(key_group_range(i, 3, 128)) for i in range(3)] == [43, 43, 42]
    assert instances_of(np.array([0, 42, 43, 85, 86, 127]), 3, 128).tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match=r"parallelism must be in 1 … max_parallelism \(128\)"):
        key_group_range(0, 129, 128)
    with pytest.raises(ValueError, match=r"key group must be in 0 … 127, got 128"):
        instance_of_key_group(128, 2, 128)


@given(
    max_parallelism=st.integers(1, 1024),
    data=st.data(),
)
def test_every_key_group_belongs_to_exactly_one_instance(
    max_parallelism: int, data: st.DataObject
) -> None:
    parallelism = data.draw(st.integers(1, max_parallelism))
    owners = [-1] * max_parallelism
    for i in range(parallelism):
        for g in key_group_range(i, parallelism, max_parallelism):
            assert owners[g] == -1, f"key group {g} in two ranges"
            owners[g] = i
    assert -1 not in owners
    groups = np.arange(max_parallelism)
    assert instances_of(groups, parallelism, max_parallelism).tolist() == owners
    assert [instance_of_key_group(g, parallelism, max_parallelism) for g in groups] == owners
    # ranges are contiguous and every instance owns at least one key group
    assert all(len(key_group_range(i, parallelism, max_parallelism)) for i in range(parallelism))
