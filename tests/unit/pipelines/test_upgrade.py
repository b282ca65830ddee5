"""Which changes of a pipeline keep its checkpoint (``pipelines update``): the stateful
operators' description and its diff (:mod:`flight_serve.pipelines.upgrade`), and the resume
check of the checkpoint coordinator, which uses the same diff on the manifest's record."""

from __future__ import annotations

from pathlib import Path

import pytest
from flight_serve.errors import CheckpointError
from flight_serve.pipelines.checkpoint import CheckpointStore, Manifest, now_utc
from flight_serve.pipelines.coordinator import CheckpointCoordinator
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.run_options import RunOptions
from flight_serve.pipelines.upgrade import diff_stateful, operator_index_map, stateful_operators

FLIGHTS = (
    "CREATE SOURCE flights (origin VARCHAR, dest VARCHAR, dep_delay DOUBLE, "
    "sched_dep TIMESTAMP(3), WATERMARK FOR sched_dep AS sched_dep) "
    "WITH (connector = 'flight', stream = '{stream}');\n"
)
BASE = FLIGHTS + (
    "CREATE FUNCTION late(d DOUBLE) RETURNS BOOLEAN LANGUAGE python AS $$\n"
    "import pyarrow.compute as pc\n"
    "def late(d):\n"
    "    return pc.greater(d, {limit})\n"
    "$$;\n"
    "{extra}"
    "CREATE VIEW rows AS SELECT origin, dest, dep_delay, sched_dep FROM flights "
    "WHERE {where};\n"
    "CREATE VIEW w AS SELECT {keys}, window_start, window_end, {aggs} "
    "FROM {window} GROUP BY {keys}, window_start, window_end;\n"
    "CREATE SINK out WITH (connector = 'flight', stream = 'out'{sink});\n"
    "INSERT INTO out SELECT * FROM w;\n"
)
DEFAULTS = {
    "stream": "flights",
    "limit": "15",
    "extra": "",
    "where": "late(dep_delay)",
    "keys": "origin",
    "aggs": "count(*), sum(dep_delay)",
    "window": "TUMBLE(rows, sched_dep, INTERVAL '1' MINUTE)",
    "sink": "",
}


def describe(**changes: str) -> dict[str, object]:
    return stateful_operators(parse_pipeline(BASE.format(**{**DEFAULTS, **changes})))


def test_the_description_names_window_keys_aggregates_and_sources() -> None:
    assert describe() == {
        "windows": [
            {
                "index": 1,
                "name": "w",
                "window": "TUMBLE 1 min",
                "time_column": "sched_dep",
                "keys": ["origin"],
                "aggregates": ["count(*)", "sum(dep_delay)"],
                "emit": "final",
                "allowed_lateness": "0",
            }
        ],
        "sources": {"flights": {"connector": "flight", "stream": "flights"}},
    }


@pytest.mark.parametrize(
    "change",
    [
        {"where": "dep_delay > 30"},  # a per-row stage
        {"limit": "45"},  # a user function's code
        {"sink": ", writer = 'other'"},  # a sink option
        # a new per-row query before the window: the window's index moves from 1 to 2
        {
            "extra": "CREATE SINK copy WITH (connector = 'flight', stream = 'copy');\n"
            "INSERT INTO copy SELECT origin FROM flights;\n"
        },
    ],
)
def test_compatible_changes(change: dict[str, str]) -> None:
    old, new = describe(), describe(**change)
    assert diff_stateful(old, new) == []
    shift = 1 if "extra" in change else 0
    assert operator_index_map(old, new) == {1 + shift: 1}


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"aggs": "count(*)"},
            "window operator 'w' (TUMBLE 1 min by origin): aggregates differ: "
            "old [count(*), sum(dep_delay)] new [count(*)]",
        ),
        (
            {"window": "TUMBLE(rows, sched_dep, INTERVAL '5' MINUTE)"},
            "window operator 'w' (TUMBLE 1 min by origin): windows differ: "
            "old TUMBLE 1 min new TUMBLE 5 min",
        ),
        (
            {"window": "HOP(rows, sched_dep, INTERVAL '1' MINUTE, INTERVAL '2' MINUTE)"},
            "window operator 'w' (TUMBLE 1 min by origin): windows differ: "
            "old TUMBLE 1 min new HOP 2 min every 1 min",
        ),
        (
            {"keys": "origin, dest"},
            "window operator 'w' (TUMBLE 1 min by origin): keys differ: "
            "old [origin] new [origin, dest]",
        ),
        (
            {"aggs": "count(*) AS n, sum(dep_delay)"},
            "window operator 'w' (TUMBLE 1 min by origin): aggregates differ: "
            "old [count(*), sum(dep_delay)] new [count(*) AS n, sum(dep_delay)]",
        ),
        (
            {"stream": "flights2"},
            "source 'flights': reads something else: stream 'flights' -> 'flights2'",
        ),
    ],
)
def test_incompatible_changes_name_the_operator(change: dict[str, str], line: str) -> None:
    assert diff_stateful(describe(), describe(**change)) == [line]


def test_a_window_removed_or_added_is_incompatible() -> None:
    old = describe()
    gone = {"windows": [], "sources": old["sources"]}
    assert diff_stateful(old, gone) == [
        "window operator 'w' (TUMBLE 1 min by origin): not in the new pipeline (its state "
        "would be lost)"
    ]
    assert diff_stateful(gone, old) == [
        "window operator 'w' (TUMBLE 1 min by origin): new in this version (the checkpoint "
        "has no state for it)"
    ]


def _coordinator(root: Path, text: str, *, upgrade: bool) -> CheckpointCoordinator:
    return CheckpointCoordinator(
        CheckpointStore(str(root)),
        RunOptions(),
        "p",
        text,
        stateful=stateful_operators(parse_pipeline(text)),
        upgrade=upgrade,
    )


def test_the_resume_check_uses_the_manifests_record_and_the_same_diff(tmp_path: Path) -> None:
    old_text = BASE.format(**DEFAULTS)
    store = CheckpointStore(str(tmp_path))
    store.write(
        Manifest(
            pipeline="p",
            epoch=3,
            fingerprint=_coordinator(tmp_path / "x", old_text, upgrade=False).fingerprint,
            taken_at=now_utc(),
            operators={"1": {"file": "op-1.snapshot", "label": "view w"}},
            stateful=stateful_operators(parse_pipeline(old_text)),
        ),
        {"op-1.snapshot": b"state"},
    )
    # the same pipeline resumes either way
    assert _coordinator(tmp_path, old_text, upgrade=False).resumed_from == 3
    changed = BASE.format(**{**DEFAULTS, "where": "dep_delay > 30"})
    with pytest.raises(CheckpointError, match="the pipeline text changed since checkpoint 3"):
        _coordinator(tmp_path, changed, upgrade=False)
    coordinator = _coordinator(tmp_path, changed, upgrade=True)
    assert (coordinator.resumed_from, coordinator.upgraded) == (3, True)
    incompatible = BASE.format(**{**DEFAULTS, "aggs": "count(*)"})
    with pytest.raises(CheckpointError) as info:
        _coordinator(tmp_path, incompatible, upgrade=True)
    assert str(info.value).endswith(
        "its stateful operators differ: window operator 'w' (TUMBLE 1 min by origin): "
        "aggregates differ: old [count(*), sum(dep_delay)] new [count(*)]"
    )
    # a new per-row query first: the window (now query 2) reads query 1's state
    extra = (
        "CREATE SINK copy WITH (connector = 'flight', stream = 'copy');\n"
        "INSERT INTO copy SELECT origin FROM flights;\n"
    )
    moved = _coordinator(tmp_path, BASE.format(**{**DEFAULTS, "extra": extra}), upgrade=True)
    assert moved._operator_index == {2: 1}


def test_an_older_servers_checkpoint_without_a_record_is_not_upgraded(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    store.write(Manifest(pipeline="p", epoch=1, fingerprint="0" * 64, taken_at=now_utc()), {})
    with pytest.raises(CheckpointError, match="did not record its stateful operators"):
        _coordinator(tmp_path, BASE.format(**DEFAULTS), upgrade=True)
