"""The ``flight`` source and sink against a real in-process server: DoPut writers as watermark
partitions, watermark and end-of-input markers, idle writers, and the late side output as a
server stream.

Notation: times are integer seconds since the epoch (``timestamp[s]``); a row is (t, v); ``W`` is
the pipeline's watermark; every ``put`` is one batch, so it is one stream entry.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.flight as flight
import pytest
from flight_serve.flight.service import FlightServeService
from flight_serve.pipelines.graph import WindowNode as _WindowNode
from flight_serve.pipelines.pipeline import parse_pipeline
from flight_serve.pipelines.runtime import PipelineRuntime
from flight_serve_client import FlightServeClient

pytestmark = pytest.mark.integration

S = 1_000_000_000  # ns per second
SCHEMA = pa.schema([("t", pa.timestamp("s")), ("v", pa.int64())])
WAIT_S = 15.0  # every bounded wait


def _rows(*rows: tuple[int, int]) -> pa.Table:
    return pa.table(
        {"t": pa.array([t for t, _ in rows], pa.timestamp("s")), "v": [v for _, v in rows]},
        schema=SCHEMA,
    )


def _location(service: Any) -> str:
    location = service.location
    if isinstance(location, flight.Location):
        uri = location.uri
        return uri.decode() if isinstance(uri, bytes) else str(uri)
    return str(location)


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def _pipeline(server: str, idle_timeout: str | None = None, late: bool = False) -> str:
    idle = f", idle_timeout = '{idle_timeout}'" if idle_timeout else ""
    text = f"""
    CREATE SOURCE events (t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
    WITH (connector = 'flight', server = '{server}', stream = 'events'{idle});
    CREATE SINK results WITH (connector = 'flight', server = '{server}', stream = 'results');
    INSERT INTO results
    SELECT window_start, window_end, count(*) AS n, sum(v) AS total
    FROM TUMBLE(events, t, INTERVAL '10' SECOND) GROUP BY window_start, window_end;
    """
    if late:
        text += f"""
        CREATE SINK late WITH (connector = 'flight', server = '{server}', stream = 'late');
        INSERT INTO late SELECT * FROM LATE(events);
        """
    return text


class Run:
    """A pipeline run on a thread (the embedded runtime, writing its sinks)."""

    def __init__(self, sql: str) -> None:
        self.runtime = PipelineRuntime(parse_pipeline(sql))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for _ in self.runtime.run(write=True):
                pass
        except BaseException as exc:
            self.error = exc

    @property
    def window(self) -> _WindowNode:
        node = self.runtime.nodes[0]
        assert isinstance(node, _WindowNode)
        return node

    def rows_in(self) -> int:
        """Rows the windowed query has taken (counted as a batch starts)."""
        return self.window.op.metrics.rows_in

    def watermark_s(self) -> float:
        return self.window.op.watermark_ns / S

    def join(self) -> None:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the run did not end"
        if self.error is not None:
            raise self.error


def _windows(client: FlightServeClient, stream: str = "results") -> list[tuple[int, int, int, int]]:
    """(window_start s, window_end s, n, total) of every row in ``stream``, in stream order."""
    if stream not in client.list_streams():
        return []
    out = []
    for entry in _entries(client, stream):
        if entry.batch is not None:
            for row in entry.batch.to_pylist():
                start, end = row["window_start"], row["window_end"]
                out.append((int(start.timestamp()), int(end.timestamp()), row["n"], row["total"]))
    return out


def _entries(client: FlightServeClient, stream: str) -> list[Any]:
    """Every entry of ``stream`` now (the tail up to the stream's next offset)."""
    end = client.stream_info(stream)["next_offset"]
    out: list[Any] = []
    if end == 0:
        return out
    tail = client.tail_entries(stream)
    try:
        for entry in tail:
            out.append(entry)
            if entry.offset + 1 >= end:
                break
    finally:
        tail.close()
    return out


@pytest.fixture
def server(
    server: FlightServeService,
) -> Iterator[tuple[str, FlightServeClient]]:
    """The shared ``server``'s location and a flight-serve client connected to it."""
    location = _location(server)
    with FlightServeClient(location) as client:
        yield location, client


def test_the_unnamed_writer_is_ended_and_advanced_as_writer_empty(
    server: tuple[str, FlightServeClient],
) -> None:
    """``put`` without a writer writes as the unnamed writer, which ``stream_info`` lists as
    ``""``; ``end_input``/``advance_watermark`` with ``writer=""`` reach it (they used to send
    ``path = [stream, ""]``, refused: ``invalid writer name ''``, so the client could not end
    the README's unnamed ``put`` at all), and so does ``put(…, end_input=True)`` with no rows
    (it used to send nothing and return -1)."""
    _, client = server
    assert client.put("quiet", _rows((1, 1))) == 0
    assert client.advance_watermark("quiet", 5 * S, writer="") == 1
    assert client.end_input("quiet", writer="") == 2
    assert client.stream_info("quiet")["writers"] == {
        "": {"first_offset": 0, "last_offset": 2, "watermark_ns": 5 * S, "ended_at": 2}
    }
    assert client.put("quiet2", _rows((1, 1))) == 0
    assert client.put("quiet2", _rows(), end_input=True) == 1
    assert client.stream_info("quiet2")["writers"][""]["ended_at"] == 1


def test_store_records_writers_and_markers(server: tuple[str, FlightServeClient]) -> None:
    _, client = server
    assert client.put("events", _rows((1, 1)), writer="sensor-7") == 0
    assert client.put("events", _rows((2, 2))) == 1  # unnamed: the stream's unnamed writer
    assert client.advance_watermark("events", 5 * S, writer="sensor-7") == 2
    assert client.end_input("events", writer="sensor-7") == 3
    entries = _entries(client, "events")
    assert [(e.offset, e.writer, e.is_marker, e.watermark_ns, e.end_of_input) for e in entries][
        ::2
    ] == [(0, "sensor-7", False, None, False), (2, "sensor-7", True, 5 * S, False)]
    assert entries[1].writer == ""
    assert (entries[3].writer, entries[3].end_of_input) == ("sensor-7", True)
    info = client.stream_info("events")
    assert info["total_records"] == 2  # markers are not rows
    assert info["writers"]["sensor-7"] == {
        "first_offset": 0,
        "last_offset": 3,
        "watermark_ns": 5 * S,
        "ended_at": 3,
    }
    assert info["writers"][""] == {
        "first_offset": 1,
        "last_offset": 1,
        "watermark_ns": None,
        "ended_at": None,
    }
    assert client.query("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 2}]


def test_a_lagging_writer_holds_windows_until_its_watermark_marker(
    server: tuple[str, FlightServeClient],
) -> None:
    """TUMBLE 10 s, count and sum(v), B = 0; writers ``fast`` and ``slow`` both exist before the
    run starts, so both hold W back from the start::

        offset  writer  entry              W after
        0       fast    (1,1) (4,2)        -inf   (slow has sent nothing yet)
        1       slow    (3,16)             3      = min(4, 3)
        2       fast    (12,4)             3      = min(12, 3)
        3       fast    (25,8)             3      = min(25, 3): nothing has fired
        4       slow    watermark 21       21     = min(25, 21): [0,10) n 3 total 19, [10,20) n 1 total 4
        5       fast    end_of_input       21     (slow's)
        6       slow    end_of_input       +inf   [20,30) n 1 total 8; every writer ended: the run ends
    """
    location, client = server
    client.put("events", _rows((1, 1), (4, 2)), writer="fast")
    client.put("events", _rows((3, 16)), writer="slow")
    run = Run(_pipeline(location))
    client.put("events", _rows((12, 4)), writer="fast")
    client.put("events", _rows((25, 8)), writer="fast")
    _wait(lambda: run.rows_in() == 5 and run.watermark_s() == 3, "the run to read 5 rows")
    time.sleep(0.1)
    assert run.watermark_s() == 3
    assert _windows(client) == []

    client.advance_watermark("events", 21 * S, writer="slow")
    _wait(lambda: len(_windows(client)) == 2, "[0,10) and [10,20)")
    assert run.watermark_s() == 21
    assert _windows(client) == [(0, 10, 3, 19), (10, 20, 1, 4)]

    client.end_input("events", writer="fast")
    time.sleep(0.2)
    assert run.thread.is_alive()  # slow has not ended
    client.end_input("events", writer="slow")
    run.join()
    assert _windows(client) == [(0, 10, 3, 19), (10, 20, 1, 4), (20, 30, 1, 8)]
    last = _entries(client, "results")[-1]
    assert (last.writer, last.end_of_input) == ("results", True)  # the sink ended its writer


def test_an_idle_writer_stops_holding_windows_and_its_old_rows_go_late(
    server: tuple[str, FlightServeClient],
) -> None:
    """idle_timeout 300 ms, TUMBLE 10 s, B = 0; the late side output is the server stream
    ``late``::

        entry                     processing time       W
        fast (1,1), slow (3,2)    read at the start     1 = min(1, 3)
        (0.6 s: no entry)         both idle             1 (all idle: W holds)
        fast (12,4)               fast active again     12: slow is idle → [0,10) n 2 total 3
        fast (25,8)                                     25 → [10,20) n 1 total 4
        slow (8,16) (14,32) (27,64) slow returns        25 = min(25, 27), never back:
                                                        8 late for [0,10), 14 late for [10,20)
        fast end, slow end                              +inf → [20,30) n 2 total 72
    """
    location, client = server
    client.put("events", _rows((1, 1)), writer="fast")
    client.put("events", _rows((3, 2)), writer="slow")
    run = Run(_pipeline(location, idle_timeout="300ms", late=True))
    _wait(lambda: run.watermark_s() == 1, "the run to read the first 2 rows (W = 1)")
    time.sleep(0.6)
    assert _windows(client) == []

    client.put("events", _rows((12, 4)), writer="fast")
    _wait(lambda: len(_windows(client)) == 1, "[0,10) to fire while slow is idle")
    client.put("events", _rows((25, 8)), writer="fast")
    _wait(lambda: len(_windows(client)) == 2, "[10,20)")
    assert _windows(client) == [(0, 10, 2, 3), (10, 20, 1, 4)]

    client.put("events", _rows((8, 16), (14, 32), (27, 64)), writer="slow")
    _wait(lambda: run.rows_in() == 7, "slow's rows")
    assert run.watermark_s() == 25
    client.end_input("events", writer="fast")
    client.end_input("events", writer="slow")
    run.join()
    assert _windows(client) == [(0, 10, 2, 3), (10, 20, 1, 4), (20, 30, 2, 72)]

    late = [e.batch for e in _entries(client, "late") if e.batch is not None]
    assert pa.Table.from_batches(late).to_pylist() == [
        {
            "t": _ts(8),
            "v": 16,
            "_late_reason": "late",
            "_window_start": _ts(0),
            "_window_end": _ts(10),
        },
        {
            "t": _ts(14),
            "v": 32,
            "_late_reason": "late",
            "_window_start": _ts(10),
            "_window_end": _ts(20),
        },
    ]


def test_a_silent_writer_is_idle_at_its_last_row_plus_idle_timeout(
    server: tuple[str, FlightServeClient],
) -> None:
    """idle_timeout 2 s (the periodic tick is 0.5 s), TUMBLE 10 s, B = 0, real time::

        a (1,1), b (12,2)     read at the start      W = min(1, 12) = 1
        +1 s: b (13,4)        b active               W = 1
        a's row + 2 s         a idle, b not          W = 13: [0,10) fires

    ``a`` must be idle 2 s after the run took its row, within 50 ms (not up to a tick later)."""
    location, client = server
    client.put("events", _rows((1, 1)), writer="a")
    client.put("events", _rows((12, 2)), writer="b")
    run = Run(_pipeline(location, idle_timeout="2s"))
    deadline = time.monotonic() + WAIT_S
    while run.watermark_s() != 1:  # tight: W is 1 the instant the run took both rows
        assert time.monotonic() < deadline, "the run did not read the first rows"
        time.sleep(0.001)
    taken = time.monotonic()
    time.sleep(1.0)
    client.put("events", _rows((13, 4)), writer="b")
    while run.watermark_s() != 13:
        assert time.monotonic() < deadline, "a never went idle"
        time.sleep(0.001)
    idle_after = time.monotonic() - taken
    assert 2.0 - 0.05 <= idle_after <= 2.0 + 0.05, f"a went idle {idle_after:.3f} s after its row"
    _wait(lambda: len(_windows(client)) == 1, "[0,10) to reach the results stream")
    assert _windows(client) == [(0, 10, 1, 1)]
    client.end_input("events", writer="a")
    client.end_input("events", writer="b")
    run.join()
    assert _windows(client) == [(0, 10, 1, 1), (10, 20, 2, 6)]


def test_idle_watermark_advance_fires_a_quiet_window_by_the_wall_clock(
    server: tuple[str, FlightServeClient],
) -> None:
    """TUMBLE 1 s, B = 0, idle_timeout 200 ms, idle_watermark_advance 1 s, real time: one row at
    the current second s, then silence. [s, s+1) fires once the wall clock reaches s + 2 (W =
    now - 1 s), with no further row and no end of input; not before."""
    location, client = server
    text = f"""
    CREATE SOURCE events (t TIMESTAMP(0), v BIGINT, WATERMARK FOR t AS t)
    WITH (connector = 'flight', server = '{location}', stream = 'events',
          idle_timeout = '200ms', idle_watermark_advance = '1s');
    CREATE SINK results WITH (connector = 'flight', server = '{location}', stream = 'results');
    INSERT INTO results
    SELECT window_start, window_end, count(*) AS n, sum(v) AS total
    FROM TUMBLE(events, t, INTERVAL '1' SECOND) GROUP BY window_start, window_end;
    """
    second = int(time.time())
    client.put("events", _rows((second, 5)), writer="a")
    run = Run(text)
    _wait(lambda: len(_windows(client)) == 1, "[s, s+1) to fire by the wall clock", 10.0)
    fired_at = time.time()
    assert _windows(client) == [(second, second + 1, 1, 5)]
    assert second + 2 <= fired_at < second + 2 + 1.0, f"fired at s + {fired_at - second:.3f}"
    assert run.thread.is_alive()  # no end of input
    client.end_input("events", writer="a")
    run.join()
    assert _windows(client) == [(second, second + 1, 1, 5)]


def _ts(second: int) -> Any:
    return pa.scalar(second, pa.timestamp("s")).as_py()


def test_a_writer_appearing_after_the_start_becomes_a_partition(
    server: tuple[str, FlightServeClient],
) -> None:
    """``late`` first writes after the run started: from then on it holds W back::

    a (1,1)            W = 1   (a is the only writer known)
    b (5,2)            b is new: W = min(1, 5) = 1
    a (15,4)           W = min(15, 5) = 5
    b watermark 30     W = 15 → [0,10) n 2 total 3
    a end, b end       +inf → [10,20) n 1 total 4
    """
    location, client = server
    client.put("events", _rows((1, 1)), writer="a")
    run = Run(_pipeline(location))
    _wait(lambda: run.rows_in() == 1, "a's row")
    client.put("events", _rows((5, 2)), writer="b")
    client.put("events", _rows((15, 4)), writer="a")
    _wait(lambda: run.watermark_s() == 5, "W = 5")
    time.sleep(0.1)
    assert run.watermark_s() == 5
    assert _windows(client) == []
    client.advance_watermark("events", 30 * S, writer="b")
    _wait(lambda: len(_windows(client)) == 1, "[0,10)")
    client.end_input("events", writer="a")
    client.end_input("events", writer="b")
    run.join()
    assert _windows(client) == [(0, 10, 2, 3), (10, 20, 1, 4)]


def test_stop_at_end_reads_the_stream_as_it_is(server: tuple[str, FlightServeClient]) -> None:
    """Writers that never end: ``stop_at_end = 'true'`` reads offsets 0..2 and ends both."""
    location, client = server
    client.put("events", _rows((1, 1)), writer="a")
    client.put("events", _rows((12, 2)), writer="b")
    client.put("events", _rows((3, 4)), writer="a")
    sql = _pipeline(location).replace(
        "stream = 'events'", "stream = 'events', stop_at_end = 'true'"
    )
    run = Run(sql)
    run.join()
    assert _windows(client) == [(0, 10, 2, 5), (10, 20, 1, 2)]


def test_errors_name_the_server_and_stream(server: tuple[str, FlightServeClient]) -> None:
    from flight_serve.errors import PipelineSQLError

    location, _ = server
    sql = f"""
    CREATE SOURCE events WITH (connector = 'flight', server = '{location}', stream = 'nope');
    CREATE SINK out WITH (connector = 'stdout');
    INSERT INTO out SELECT * FROM events;
    """
    with pytest.raises(PipelineSQLError, match=r"stream 'nope'.*does not exist yet; declare"):
        PipelineRuntime(parse_pipeline(sql))


CASE = Path(__file__).parent / "flight_pipeline"
CLI = Path(sys.executable).parent / "flight-serve"


def _csv(table: pa.Table) -> str:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue().decode()


def _stream_table(client: FlightServeClient, stream: str, writer: str) -> pa.Table:
    """The rows of ``stream`` in stream order, checking that ``writer`` wrote them all and ended."""
    entries = _entries(client, stream)
    assert {e.writer for e in entries} == {writer}
    assert entries[-1].end_of_input
    return pa.Table.from_batches([e.batch for e in entries if e.batch is not None])


def test_golden_pipeline_through_flight_serve_run(server: tuple[str, FlightServeClient]) -> None:
    """``flight_pipeline/``: input.csv is written entry by entry (a row, a watermark marker or an
    end of input, under its writer), then ``flight-serve run`` (a subprocess) reads the stream,
    writes the results and the late side output into server streams, and exits when both
    writers have ended. Read back, they equal ``expected/`` byte for byte (the timeline is in
    pipeline.sql)."""
    location, client = server
    schema = pa.schema([("k", pa.string()), ("t", pa.timestamp("s"))])
    for row in pacsv.read_csv(CASE / "input.csv").to_pylist():
        writer, marker = row["writer"], row["marker"]
        if marker == "watermark":
            client.advance_watermark("events", row["t"] * S, writer=writer)
        elif marker == "end":
            client.end_input("events", writer=writer)
        else:
            batch = pa.table({"k": [row["k"]], "t": pa.array([row["t"]], pa.timestamp("s"))})
            client.put("events", batch.cast(schema), writer=writer)
    sql = (CASE / "pipeline.sql").read_text().replace("{server}", location)
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = Path(tmp) / "pipeline.sql"
        pipeline.write_text(sql)
        done = subprocess.run(
            [str(CLI), "run", str(pipeline)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert "sink results: 4 rows" in done.stderr
    assert "sink late_rows: 1 rows" in done.stderr
    results = _stream_table(client, "results", "results")
    assert _csv(results) == (CASE / "expected" / "results.csv").read_text()
    late = _stream_table(client, "late", "late-of-events")
    assert _csv(late) == (CASE / "expected" / "late.csv").read_text()


def test_bad_writer_names_and_marker_messages_are_invalid_argument(
    server: tuple[str, FlightServeClient],
) -> None:
    location, client = server
    client.put("events", _rows((1, 1)), writer="a")
    with pytest.raises(pa.ArrowInvalid, match="invalid writer name"):
        client.put("events", _rows((2, 2)), writer="no spaces")

    def both_kinds_in_one_message() -> None:
        with flight.connect(location) as raw:
            writer, reader = raw.do_put(flight.FlightDescriptor.for_path("events", "a"), SCHEMA)
            writer.write_metadata(pa.py_buffer(b'{"watermark_ns": 1, "end_of_input": true}'))
            writer.done_writing()
            reader.read()
            writer.close()

    with pytest.raises(pa.ArrowInvalid, match=r"metadata-only DoPut message must be JSON"):
        both_kinds_in_one_message()
    assert client.stream_info("events")["next_offset"] == 1  # nothing was stored


def test_ctrl_c_stops_a_run_whose_writers_never_end(server: tuple[str, FlightServeClient]) -> None:
    """``flight-serve run`` with a writer that never ends runs until SIGINT: exit 130, open
    windows not flushed (their input did not end)."""
    location, client = server
    client.put("events", _rows((1, 1)), writer="forever")
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = Path(tmp) / "pipeline.sql"
        pipeline.write_text(_pipeline(location))
        proc = subprocess.Popen(
            [str(CLI), "run", str(pipeline)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait(lambda: "results" in client.list_streams(), "the run to open its sink", 60)
            time.sleep(0.3)
            assert proc.poll() is None  # still running: "forever" has not ended
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert _windows(client) == []  # [0,10) never closed


@pytest.mark.parametrize("checkpointed", [False, True])
def test_sigterm_stops_a_run_whose_writers_never_end_like_ctrl_c(
    server: tuple[str, FlightServeClient], checkpointed: bool
) -> None:
    """SIGTERM (a service manager's stop) ends ``flight-serve run`` cleanly: exit 143 (128 + 15)
    and a one-line message on stderr; a checkpointed run first takes a checkpoint, and the next
    run resumes from it. (SIGTERM used to kill the process with no message: exit -15.)

    Timeline: writer "forever" puts t=1 (v 1) -> the run reads it ([0,10) open) -> SIGTERM ->
    [checkpointed] checkpoint 1 holds the open window -> "forever" puts t=2 (v 2) and ends ->
    the resumed run reads from the checkpoint's offset: [0,10) n 2 total 3, written once."""
    location, client = server
    client.put("events", _rows((1, 1)), writer="forever")
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = Path(tmp) / "pipeline.sql"
        pipeline.write_text(_pipeline(location))
        flags = ["--checkpoint-interval", "1h"] if checkpointed else []
        command = [str(CLI), "run", str(pipeline), "--output-dir", tmp, *flags]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait(lambda: "results" in client.list_streams(), "the run to open its sink", 60)
            time.sleep(0.3)
            assert proc.poll() is None  # still running: "forever" has not ended
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 143, stderr
        if not checkpointed:
            assert stderr.splitlines() == [f"flight-serve: {pipeline}: terminated (SIGTERM)"]
            assert _windows(client) == []  # [0,10) never closed
            return
        assert stderr.splitlines() == [
            f"flight-serve: {pipeline}: terminated (SIGTERM) after checkpoint 1; "
            "the next run resumes from it"
        ]
        assert _windows(client) == []
        client.put("events", _rows((2, 2)), writer="forever")
        client.end_input("events", writer="forever")
        resumed = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stderr.splitlines()[0] == (
            f"flight-serve: {pipeline}: resuming from checkpoint 1 "
            f"({Path(tmp) / 'checkpoints' / 'pipeline'})"
        )
    assert _windows(client) == [(0, 10, 2, 3)]
