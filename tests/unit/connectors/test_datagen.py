"""The ``datagen`` source (connectors/datagen.py): exact values, partitions, row counts, the rate
on a fake clock, snapshot/restore, and every option error.

Notation: partition ``p`` of ``N`` holds the global rows ``g = i·N + p`` (``i`` = the row's index
in its partition). A run is read to the end with :func:`_drain`; the fake clock only moves when
a test (or the source's ``sleep``) moves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from flight_serve.connectors.datagen import DatagenOptions, DatagenSource, generate_rows
from flight_serve.connectors.flight import SourceEvent
from flight_serve.errors import ConnectorError, ConnectorOptionError
from hypothesis import given, settings
from hypothesis import strategies as st

S = 1_000_000_000  # ns per second
MS = 1_000_000

MIXED = pa.schema(
    [
        ("id", pa.int64()),
        ("k", pa.int32()),
        ("v", pa.float64()),
        ("s", pa.string()),
        ("b", pa.bool_()),
        ("t", pa.timestamp("ms", "UTC")),
    ]
)
MIXED_OPTIONS = {
    "rows_per_second": "unlimited",
    "fields.id.kind": "sequence",
    "fields.k.min": "-5",
    "fields.k.max": "5",
    "fields.v.min": "10",
    "fields.v.max": "20",
    "fields.v.null_rate": "0.25",
    "fields.s.length": "6",
    "fields.t.start": "2026-01-01T00:00:00Z",
    "fields.t.interval": "1s",
    "fields.t.max_out_of_orderness": "400ms",
}


class FakeClock:
    """Seconds that move only when told to (or when the source sleeps)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _source(
    options: Mapping[str, str], schema: pa.Schema | None = MIXED, clock: FakeClock | None = None
) -> DatagenSource:
    clock = clock or FakeClock()
    return DatagenSource(
        DatagenOptions.from_options(options, schema), clock=clock, sleep=clock.sleep
    )


def _drain(source: DatagenSource, max_events: int = 64) -> list[SourceEvent]:
    events: list[SourceEvent] = []
    for _ in range(100_000):
        if source.done:
            return events
        events += source.poll(0.0, max_events)
    raise AssertionError("the source never ended")


def _tables(events: list[SourceEvent], schema: pa.Schema) -> dict[str, pa.Table]:
    """Each partition's batches, in order, as one table."""
    out: dict[str, list[pa.RecordBatch]] = {}
    for event in events:
        if event.kind == "batch":
            assert event.batch is not None
            out.setdefault(event.partition, []).append(event.batch)
    return {p: pa.Table.from_batches(b, schema=schema) for p, b in sorted(out.items())}


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return sink.getvalue().to_pybytes()


# --- exact values -----------------------------------------------------------------------------


def test_a_sequence_interleaves_the_partitions_and_each_ends_after_its_share() -> None:
    """start 10, step 3, 5 global rows over 2 partitions::

    g      0   1   2   3   4
    value  10  13  16  19  22
    p      p0  p1  p0  p1  p0      p0: 10 16 22 (3 rows), p1: 13 19 (2 rows)
    """
    schema = pa.schema([("id", pa.int64())])
    source = _source(
        {
            "rows_per_second": "unlimited",
            "number_of_rows": "5",
            "partitions": "2",
            "fields.id.kind": "sequence",
            "fields.id.start": "10",
            "fields.id.step": "3",
        },
        schema,
    )
    assert source.partitions == ("p0", "p1")
    assert source.initial_watermarks == {}
    source.open(None)
    events = _drain(source)
    shown = [
        (e.kind, e.partition, e.offset, e.batch.column(0).to_pylist() if e.batch else None)
        for e in events
    ]
    assert shown == [
        ("partition", "p0", -1, None),
        ("partition", "p1", -1, None),
        ("batch", "p0", 0, [10, 16, 22]),
        ("batch", "p1", 0, [13, 19]),
        ("end", "p0", 3, None),
        ("end", "p1", 2, None),
    ]
    assert source.done
    assert source.snapshot() == {"next_row": {"p0": 3, "p1": 2}}
    assert source.poll(0.0, 64) == []


def test_a_bounded_sequence_ends_the_source_at_its_end() -> None:
    """start 1, end 10, step 4: 1, 5, 9 and no more (Flink: a sequence's end bounds the source)."""
    schema = pa.schema([("id", pa.int16()), ("name", pa.string())])
    options = {
        "rows_per_second": "unlimited",
        "fields.id.kind": "sequence",
        "fields.id.start": "1",
        "fields.id.end": "10",
        "fields.id.step": "4",
        "fields.name.kind": "sequence",
        "fields.name.start": "100",
    }
    assert DatagenOptions.from_options(options, schema).global_rows == 3
    source = _source(options, schema)
    source.open(None)
    table = _tables(_drain(source), schema)["p0"]
    assert table.to_pydict() == {"id": [1, 5, 9], "name": ["100", "101", "102"]}


def test_number_of_rows_is_the_total_split_over_the_partitions() -> None:
    source = _source(
        {
            "rows_per_second": "unlimited",
            "number_of_rows": "1000",
            "partitions": "3",
            "batch_rows": "64",
            "fields.id.kind": "sequence",
        },
    )
    source.open(None)
    tables = _tables(_drain(source), MIXED)
    assert {p: t.num_rows for p, t in tables.items()} == {"p0": 334, "p1": 333, "p2": 333}
    ids = [tables[p].column("id").to_pylist() for p in ("p0", "p1", "p2")]
    assert ids[1][:3] == [1, 4, 7]
    seen = [i for part in ids for i in part]
    assert sorted(seen) == list(range(1000))  # disjoint, and together every global row once


def test_timestamps_are_start_plus_global_row_times_interval() -> None:
    """TIMESTAMP(3) from 2026-01-01T00:00:00Z every 250 ms over 2 partitions, no jitter:
    row i of p1 is g = 2i + 1, at start + (2i + 1) · 250 ms."""
    schema = pa.schema([("t", pa.timestamp("ms", "UTC"))])
    options = DatagenOptions.from_options(
        {"partitions": "2", "fields.t.start": "2026-01-01T00:00:00Z", "fields.t.interval": "250ms"},
        schema,
    )
    start_ms = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    got = generate_rows(options, 1, 0, 4).column(0).cast(pa.int64()).to_pylist()
    assert got == [start_ms + 250, start_ms + 750, start_ms + 1250, start_ms + 1750]


def test_the_default_interval_follows_the_rate() -> None:
    """rows_per_second 4 → one row every 250 ms of event time: event time advances as fast as
    processing time; without a limit, 1 ms."""
    schema = pa.schema([("t", pa.timestamp("us"))])
    assert DatagenOptions.from_options({"rows_per_second": "4"}, schema).columns[0].step == 250_000
    unlimited = DatagenOptions.from_options({"rows_per_second": "unlimited"}, schema)
    assert unlimited.columns[0].step == 1_000


def test_jitter_stays_within_max_out_of_orderness_so_no_row_is_late() -> None:
    """ts = start + g · 1 s - jitter, jitter in [0, 400 ms]: every row is at most 400 ms behind
    the largest timestamp its partition had before it (W = max - 400 ms never passes a row)."""
    options = DatagenOptions.from_options({**MIXED_OPTIONS, "partitions": "3"}, MIXED)
    start_ms = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    jitters = []
    for p in range(3):
        times = generate_rows(options, p, 0, 2000).column("t").cast(pa.int64()).to_pylist()
        latest = None
        for i, t in enumerate(times):
            base = start_ms + (3 * i + p) * 1000
            assert base - 400 <= t <= base
            jitters.append(base - t)
            if latest is not None:
                assert t >= latest - 400
            latest = t if latest is None else max(latest, t)
    assert min(jitters) == 0
    assert max(jitters) == 400
    assert len(set(jitters)) > 300  # spread over the range, not a constant


def test_random_values_stay_in_their_ranges() -> None:
    options = DatagenOptions.from_options(MIXED_OPTIONS, MIXED)
    batch = generate_rows(options, 0, 0, 20_000)
    k = batch.column("k").to_pylist()
    assert min(k) == -5
    assert max(k) == 5
    assert set(k) == set(range(-5, 6))
    v = [x for x in batch.column("v").to_pylist() if x is not None]
    assert all(10.0 <= x <= 20.0 for x in v)
    assert 0.23 < batch.column("v").null_count / 20_000 < 0.27  # null_rate 0.25
    s = batch.column("s").to_pylist()
    assert all(len(x) == 6 and x.isalnum() and x.isascii() for x in s)
    assert len(set(s)) == 20_000
    b = batch.column("b").to_pylist()
    assert 0.47 < sum(b) / 20_000 < 0.53


def test_a_seed_gives_the_same_random_columns_in_every_run_and_another_seed_other_ones() -> None:
    def run(seed: str) -> pa.Table:
        source = _source(
            {
                **MIXED_OPTIONS,
                "number_of_rows": "3000",
                "partitions": "2",
                "batch_rows": "500",
                "seed": seed,
            }
        )
        source.open(None)
        tables = _tables(_drain(source), MIXED)
        return pa.concat_tables([tables["p0"], tables["p1"]])

    first, again, other = run("42"), run("42"), run("43")
    assert _ipc(first) == _ipc(again)
    assert first.column("k") != other.column("k")
    assert first.column("s") != other.column("s")
    assert first.column("id") == other.column("id")  # sequences do not depend on the seed


def test_values_do_not_depend_on_batch_boundaries() -> None:
    options = DatagenOptions.from_options({**MIXED_OPTIONS, "partitions": "2"}, MIXED)
    whole = pa.Table.from_batches([generate_rows(options, 1, 0, 1000)])
    pieces = pa.Table.from_batches(
        [
            generate_rows(options, 1, a, b - a)
            for a, b in ((0, 1), (1, 333), (333, 334), (334, 1000))
        ]
    )
    assert _ipc(whole) == _ipc(pieces)


def test_a_column_seed_overrides_the_source_seed() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64())])
    options = DatagenOptions.from_options({"seed": "1", "fields.b.seed": "2"}, schema)
    other = DatagenOptions.from_options({"seed": "2"}, schema)
    assert options.columns[1].seed == 2
    assert generate_rows(options, 0, 0, 50).column("b") == generate_rows(other, 0, 0, 50).column(
        "b"
    )


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20), width=st.integers(1, 2**64)
)
def test_range_reduction_is_the_high_word_of_the_product(words: list[int], width: int) -> None:
    """``_below(u, w) = ⌊u · w / 2⁶⁴⌋`` exactly (the 128-bit product from 32-bit halves)."""
    import numpy as np
    from flight_serve.connectors.datagen import _below

    got = _below(np.array(words, dtype=np.uint64), width)
    assert [int(x) for x in got] == [(u * width) >> 64 for u in words]


# --- snapshot and restore ---------------------------------------------------------------------


def test_a_restored_run_hands_out_the_rows_a_straight_run_does() -> None:
    options = {**MIXED_OPTIONS, "number_of_rows": "5000", "partitions": "3", "batch_rows": "700"}
    straight = _source(options)
    straight.open(None)
    expected = _tables(_drain(straight), MIXED)

    first = _source(options)
    first.open(None)
    events = first.poll(0.0, 5) + first.poll(0.0, 2)
    state = first.snapshot()
    assert state == {"next_row": {"p0": 1400, "p1": 700, "p2": 700}}
    resumed = _source(options)
    resumed.open(state)
    after = _drain(resumed)
    assert [e.kind for e in after[:3]] == ["partition"] * 3
    assert (after[3].kind, after[3].partition, after[3].offset) == ("batch", "p0", 1400)
    got = _tables(events + after, MIXED)
    assert {p: _ipc(t) for p, t in got.items()} == {p: _ipc(t) for p, t in expected.items()}


def test_a_resume_state_of_other_partitions_is_refused() -> None:
    source = _source({"partitions": "2", "number_of_rows": "10"})
    with pytest.raises(ConnectorError) as e:
        source.open({"next_row": {"p0": 1}})
    assert str(e.value) == (
        "datagen source datagen: the checkpoint's partitions (p0) are not this source's (p0, p1): "
        "was 'partitions' changed?"
    )
    with pytest.raises(ConnectorError) as e:
        source.open({"next_row": {"p0": 1, "p1": 6}})
    assert str(e.value) == (
        "datagen source datagen: the checkpoint's next row of p1 (6) is not in [0, 5]"
    )


def test_poll_before_open_is_an_error() -> None:
    with pytest.raises(ConnectorError, match="poll before open"):
        _source({}).poll(0.0, 64)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 400),
    partitions=st.integers(1, 4),
    batch_rows=st.integers(1, 64),
    max_events=st.integers(1, 9),
    cut=st.integers(0, 40),
)
def test_splitting_a_run_at_any_snapshot_gives_the_same_rows(
    rows: int, partitions: int, batch_rows: int, max_events: int, cut: int
) -> None:
    """Law: polls before a snapshot + polls of a source restored from it = a straight run, per
    partition, byte for byte; and every partition ends once."""
    options = {
        **MIXED_OPTIONS,
        "number_of_rows": str(rows),
        "partitions": str(partitions),
        "batch_rows": str(batch_rows),
    }
    straight = _source(options)
    straight.open(None)
    expected = _tables(_drain(straight, max_events), MIXED)

    first = _source(options)
    first.open(None)
    before: list[SourceEvent] = []
    for _ in range(cut):
        before += first.poll(0.0, max_events)
    resumed = _source(options)
    resumed.open(first.snapshot())
    after = _drain(resumed, max_events)
    got = _tables([e for e in before if e.kind == "batch"] + after, MIXED)
    assert {p: _ipc(t) for p, t in got.items()} == {p: _ipc(t) for p, t in expected.items()}
    assert sum(t.num_rows for t in got.values()) == rows
    ends = [e.partition for e in after if e.kind == "end"]
    assert sorted(ends) == [f"p{p}" for p in range(partitions)]


# --- the rate ---------------------------------------------------------------------------------


def test_the_rate_hands_out_exactly_the_rows_due_by_the_clock() -> None:
    """rows_per_second 100 over 2 partitions: by t seconds, ⌊100 t⌋ global rows are due."""
    clock = FakeClock()
    schema = pa.schema([("id", pa.int64())])
    source = _source(
        {"rows_per_second": "100", "partitions": "2", "fields.id.kind": "sequence"}, schema, clock
    )
    source.open(None)
    assert [e.kind for e in source.poll(0.0, 64)] == ["partition", "partition"]
    assert source.poll(0.0, 64) == []  # t = 0: nothing due yet
    clock.now = 2.5
    events = source.poll(0.0, 64)
    assert [(e.partition, e.offset, e.batch.num_rows) for e in events if e.batch] == [
        ("p0", 0, 125),
        ("p1", 0, 125),
    ]
    assert not source.backlog
    clock.now = 2.51  # g = 250 is due: p0's row 125
    events = source.poll(0.0, 64)
    assert [(e.partition, e.offset, e.batch.column(0).to_pylist()) for e in events if e.batch] == [
        ("p0", 125, [250])
    ]
    # nothing due: the poll sleeps until g = 251 is due (t = 2.52), then hands it out
    events = source.poll(1.0, 64)
    assert clock.slept == [pytest.approx(0.01)]
    assert [(e.partition, e.offset, e.batch.column(0).to_pylist()) for e in events if e.batch] == [
        ("p1", 125, [251])
    ]
    # a short timeout: it sleeps that long and returns nothing
    events = source.poll(0.004, 64)
    assert events == []
    assert clock.slept[-1] == pytest.approx(0.004)
    assert source.snapshot() == {"next_row": {"p0": 126, "p1": 126}}


def test_a_batch_is_capped_at_batch_rows_and_max_events_leaves_a_backlog() -> None:
    clock = FakeClock()
    source = _source(
        {"rows_per_second": "1000", "batch_rows": "100", "partitions": "2"}, MIXED, clock
    )
    source.open(None)
    source.poll(0.0, 64)
    clock.now = 1.0  # 1000 rows due: 500 per partition, 5 batches each
    events = source.poll(0.0, 4)
    assert [(e.partition, e.offset, e.batch.num_rows) for e in events if e.batch] == [
        ("p0", 0, 100),
        ("p1", 0, 100),
        ("p0", 100, 100),
        ("p1", 100, 100),
    ]
    assert source.backlog  # 600 rows due are not handed out
    rest = source.poll(0.0, 64)
    assert sum(e.batch.num_rows for e in rest if e.batch) == 600
    assert not source.backlog


def test_a_restored_run_keeps_the_rate_from_where_it_stopped() -> None:
    """Restored at 250 rows handed out: one second after open, 100 more are due."""
    schema = pa.schema([("id", pa.int64())])
    options = {"rows_per_second": "100", "partitions": "2", "fields.id.kind": "sequence"}
    clock = FakeClock()
    source = _source(options, schema, clock)
    source.open({"next_row": {"p0": 125, "p1": 125}})
    clock.now = 1.0
    batches = [e for e in source.poll(0.0, 64) if e.batch]
    assert [(e.partition, e.offset, e.batch.num_rows) for e in batches] == [
        ("p0", 125, 50),
        ("p1", 125, 50),
    ]
    assert batches[0].batch.column(0).to_pylist()[:2] == [250, 252]


def test_an_unlimited_source_has_a_backlog_until_it_is_done() -> None:
    source = _source({"rows_per_second": "unlimited", "number_of_rows": "10"})
    source.open(None)
    assert source.backlog
    _drain(source)
    assert not source.backlog
    assert source.done


# --- options ----------------------------------------------------------------------------------


def test_options_without_a_column_list_take_types_from_fields_type() -> None:
    options = DatagenOptions.from_options(
        {
            "fields.k.type": "BIGINT",
            "fields.k.kind": "sequence",
            "fields.name.type": "VARCHAR",
            "fields.t.type": "TIMESTAMPTZ(3)",
            "fields.x.type": "double precision",
            "fields.f.type": "boolean",
        }
    )
    assert options.schema == pa.schema(
        [
            ("k", pa.int64()),
            ("name", pa.string()),
            ("t", pa.timestamp("ms", "UTC")),
            ("x", pa.float64()),
            ("f", pa.bool_()),
        ]
    )


def test_flink_and_risingwave_spellings_and_upper_case_columns() -> None:
    schema = pa.schema([("UserId", pa.int64())])
    options = DatagenOptions.from_options(
        {
            "connector": "datagen",
            "rows-per-second": "5",
            "number-of-rows": "7",
            "datagen.split.num": "3",
            "fields.userid.kind": "sequence",  # a SQL parser lower-cases the key
        },
        schema,
    )
    assert (options.rows_per_second, options.number_of_rows, options.partitions) == (5.0, 7, 3)
    assert options.columns[0].kind == "sequence"
    rw = DatagenOptions.from_options({"datagen.rows.per.second": "20"}, schema)
    assert rw.rows_per_second == 20.0


def test_defaults() -> None:
    options = DatagenOptions.from_options({}, MIXED)
    assert (options.rows_per_second, options.number_of_rows, options.partitions) == (
        10_000.0,
        None,
        1,
    )
    assert (options.batch_rows, options.seed) == (8192, 0)
    kinds = {c.name: c.kind for c in options.columns}
    assert kinds == {
        "id": "random",
        "k": "random",
        "v": "random",
        "s": "random",
        "b": "random",
        "t": "sequence",
    }
    k = options.columns[1]
    assert (k.minimum, k.maximum) == (-(2**31), 2**31 - 1)  # Flink: the type's range
    assert (options.columns[2].minimum, options.columns[2].maximum) == (0.0, 1.0)
    assert options.columns[3].length == 10  # RisingWave's default
    assert options.global_rows is None


_DECIMAL = pa.schema([*MIXED, ("d", pa.decimal128(10, 2))])

ERRORS: list[tuple[dict[str, str], pa.Schema | None, str, str]] = [
    (
        {"rows_per_secnd": "5"},
        MIXED,
        "rows_per_secnd",
        "unknown option of the datagen connector (did you mean rows_per_second?); its options: "
        "connector, rows_per_second, number_of_rows, partitions, batch_rows, seed, "
        "fields.<column>.<option>",
    ),
    (
        {"rows_per_second": "-5"},
        MIXED,
        "rows_per_second",
        "must be greater than 0 (or 'unlimited'), got -5",
    ),
    (
        {"rows_per_second": "0"},
        MIXED,
        "rows_per_second",
        "must be greater than 0 (or 'unlimited'), got 0",
    ),
    ({"rows_per_second": "fast"}, MIXED, "rows_per_second", "expected a number, got 'fast'"),
    ({"number_of_rows": "-1"}, MIXED, "number_of_rows", "must be at least 0, got -1"),
    ({"number_of_rows": "1.5"}, MIXED, "number_of_rows", "expected an integer, got '1.5'"),
    ({"partitions": "0"}, MIXED, "partitions", "must be at least 1, got 0"),
    ({"partitions": "5000"}, MIXED, "partitions", "must be at most 4096, got 5000"),
    ({"batch_rows": "0"}, MIXED, "batch_rows", "must be at least 1, got 0"),
    ({"seed": "-3"}, MIXED, "seed", "must be at least 0, got -3"),
    ({"connector": "kafka"}, MIXED, "connector", "expected 'datagen', got 'kafka'"),
    (
        {"rows_per_second": "5", "rows-per-second": "6"},
        MIXED,
        "rows-per-second",
        "given twice (also as rows_per_second)",
    ),
    (
        {"fields.nope.kind": "random"},
        MIXED,
        "fields.nope.kind",
        "no column nope; the columns: id, k, v, s, b, t",
    ),
    (
        {"fields.k.kind": "shuffle"},
        MIXED,
        "fields.k.kind",
        "expected 'sequence' or 'random', got 'shuffle'",
    ),
    (
        {"fields.k.colour": "red"},
        MIXED,
        "fields.k.colour",
        "unknown column option colour; column options: kind, type, start, end, step, interval, "
        "max_out_of_orderness, min, max, length, null_rate, seed",
    ),
    ({"fields.k": "1"}, MIXED, "fields.k", "write fields.<column>.<option>, such as fields.k.kind"),
    (
        {"fields.k.min": "10", "fields.k.max": "1"},
        MIXED,
        "fields.k.min",
        "min (10) is greater than max (1)",
    ),
    (
        {"fields.k.min": "-3000000000"},
        MIXED,
        "fields.k.min",
        "-3000000000 is outside the range of int32 (-2147483648 to 2147483647)",
    ),
    (
        {"fields.v.min": "2.5", "fields.v.max": "1"},
        MIXED,
        "fields.v.min",
        "min (2.5) is greater than max (1.0)",
    ),
    (
        {"fields.k.length": "4"},
        MIXED,
        "fields.k.length",
        "does not apply to a random integer column; its options: kind, max, min, null_rate, seed, type",
    ),
    ({"fields.s.length": "-1"}, MIXED, "fields.s.length", "must be at least 0, got -1"),
    (
        {"fields.s.kind": "sequence", "fields.s.start": str(2**63)},
        MIXED,
        "fields.s.start",
        "9223372036854775808 is outside the range of int64 "
        "(-9223372036854775808 to 9223372036854775807)",
    ),
    (
        {"fields.id.kind": "sequence", "fields.id.step": "0"},
        MIXED,
        "fields.id.step",
        "must not be 0",
    ),
    (
        {"fields.id.kind": "sequence", "fields.id.start": "10", "fields.id.end": "1"},
        MIXED,
        "fields.id.start",
        "start (10) is greater than end (1) with step 1",
    ),
    (
        {"fields.id.kind": "sequence", "fields.id.min": "1"},
        MIXED,
        "fields.id.min",
        "does not apply to a sequence integer column; its options: end, kind, null_rate, seed, "
        "start, step, type",
    ),
    ({"fields.b.kind": "sequence"}, MIXED, "fields.b.kind", "column b is boolean: only 'random'"),
    (
        {"fields.v.null_rate": "1.5"},
        MIXED,
        "fields.v.null_rate",
        "must be between 0 and 1, got 1.5",
    ),
    (  # the key as written: an alias, and a column in another case
        {"fields.V.null-rate": "2"},
        MIXED,
        "fields.V.null-rate",
        "must be between 0 and 1, got 2.0",
    ),
    (
        {"fields.t.interval": "soon"},
        MIXED,
        "fields.t.interval",
        "cannot read duration 'soon': write an integer and a unit, such as '30s'",
    ),
    ({"fields.t.interval": "0s"}, MIXED, "fields.t.interval", "must be longer than 0"),
    (
        {"fields.t.interval": "500us"},
        MIXED,
        "fields.t.interval",
        "500000 ns is finer than the column's unit (ms)",
    ),
    (
        {"fields.t.start": "yesterday"},
        MIXED,
        "fields.t.start",
        "cannot read instant 'yesterday': write ISO 8601, such as '2026-01-01T00:00:00Z'",
    ),
    (
        {"fields.t.start": "2026-01-02", "fields.t.end": "2026-01-01"},
        MIXED,
        "fields.t.start",
        "start (2026-01-02) is later than end (2026-01-01)",
    ),
    (
        {"fields.t.kind": "random", "fields.t.min": "2026-01-01"},
        MIXED,
        "fields.t.max",
        "a random timestamp needs min and max (ISO 8601 instants)",
    ),
    (
        {"fields.t.step": "1"},
        MIXED,
        "fields.t.step",
        "does not apply to a sequence timestamp column; its options: end, interval, kind, "
        "max_out_of_orderness, null_rate, seed, start, type",
    ),
    (
        {"fields.k.type": "INT"},
        MIXED,
        "fields.k.type",
        "the column list declares the type of k; drop this option",
    ),
    (
        {},
        _DECIMAL,
        "fields.d.kind",
        "column d has type decimal128(10, 2), which datagen cannot generate (it generates "
        "integers, floats, booleans, strings and timestamps)",
    ),
    (
        {"fields.x.type": "BIGINTEGER"},
        None,
        "fields.x.type",
        "unknown type 'BIGINTEGER'; datagen types: BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, REAL, "
        "DOUBLE, VARCHAR, TIMESTAMP(p), TIMESTAMPTZ(p)",
    ),
    (
        {"fields.x.kind": "random"},
        None,
        "fields.x.type",
        "column x needs a type (no columns are declared)",
    ),
    (
        {},
        None,
        "fields.<column>.type",
        "a datagen source needs columns: declare them, or give fields.<column>.type",
    ),
]


@pytest.mark.parametrize(("options", "schema", "option", "message"), ERRORS)
def test_every_bad_option_is_named_with_an_exact_message(
    options: dict[str, str], schema: pa.Schema | None, option: str, message: str
) -> None:
    with pytest.raises(ConnectorOptionError) as e:
        DatagenOptions.from_options(options, schema)
    assert e.value.option == option
    assert str(e.value) == f"option {option!r}: {message}"


def test_describe_says_how_each_column_is_made() -> None:
    options = DatagenOptions.from_options(
        {**MIXED_OPTIONS, "number_of_rows": "1000", "partitions": "2"}, MIXED
    )
    assert options.describe() == [
        "datagen: no rate limit, 1,000 rows; 2 partitions (p0, p1) interleaving global rows "
        "g = i*2 + p; seed 0",
        "  id int64: sequence start 0 step 1",
        "  k int32: random min -5 max 5",
        "  v double: random min 10.0 max 20.0 null_rate 0.25",
        "  s string: random length 6",
        "  b bool: random",
        "  t timestamp[ms, tz=UTC]: sequence start 2026-01-01T00:00:00+00:00 interval 1000 ms "
        "max_out_of_orderness 400 ms",
    ]
    random_t = DatagenOptions.from_options(
        {"fields.t.kind": "random", "fields.t.min": "2026-01-01", "fields.t.max": "2026-01-02"},
        pa.schema([("t", pa.timestamp("s"))]),
    )
    assert random_t.describe()[1] == (
        "  t timestamp[s]: random min 2026-01-01 00:00:00+00:00 max 2026-01-02 00:00:00+00:00"
    )


def test_durations_take_the_pipeline_forms() -> None:
    schema = pa.schema([("t", pa.timestamp("ns"))])
    for text, ns in (
        ("250ms", 250 * MS),
        ("2 seconds", 2 * S),
        ("INTERVAL '3' SECOND", 3 * S),
        ("7ns", 7),
    ):
        options = DatagenOptions.from_options({"fields.t.interval": text}, schema)
        assert options.columns[0].step == ns, text


def test_the_docs_example_parses_as_a_pipeline_and_as_datagen_options() -> None:
    """docs/pipelines.md's ``datagen`` example: parse_pipeline keeps its dotted keys whole and
    DatagenOptions reads them with the declared columns."""
    from pathlib import Path

    from flight_serve.pipelines.pipeline import parse_pipeline

    text = (Path(__file__).parents[3] / "docs" / "pipelines.md").read_text()
    start = text.index("CREATE SOURCE orders")
    sql = text[start : text.index("```", start)]
    plan = parse_pipeline(
        sql + "\nCREATE SINK o WITH (connector = 'stdout');\nINSERT INTO o SELECT * FROM orders;"
    )
    relation = plan.sources["orders"]
    options = DatagenOptions.from_options(
        {key: option.text for key, option in relation.connector.items()}, relation.columns
    )
    assert (options.partitions, options.rows_per_second, options.seed) == (4, 1000.0, 7)
    kinds = [(c.name, c.kind) for c in options.columns]
    assert kinds == [
        ("order_id", "sequence"),
        ("customer", "random"),
        ("amount", "random"),
        ("note", "random"),
        ("placed", "sequence"),
    ]
    placed = options.columns[4]
    assert (placed.step, placed.jitter) == (1, 2000)  # 1 ms (1 s / 1000 rows), 2 s, in ms
