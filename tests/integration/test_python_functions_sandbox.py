"""Python user functions in their bubblewrap sandbox (issue 15): real workers, real bwrap.

Every function here runs in worker processes started by
:func:`flight_serve.functions.python.python_function`; results are checked against
pyarrow.compute or written-out values, and each escape attempt against the host afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from textwrap import dedent
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.errors import FunctionCallError, FunctionDefinitionError, FunctionWorkerError
from flight_serve.functions import worker as proto
from flight_serve.functions.base import FunctionSpec, ScalarFunction, TableFunction
from flight_serve.functions.python import (
    PythonScalarFunction,
    PythonTableFunction,
    SandboxConfig,
    bwrap_path,
    python_function,
)
from flight_serve.functions.registry import create_function
from flight_serve.pipelines.pipeline import parse_pipeline

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap (bwrap; Debian: bubblewrap)"),
]

FLOAT64 = pa.float64()
#: a pipeline whose function takes WITH (...) limits; {with} is the clause, {body} the code
LIMITED = (
    "CREATE SOURCE s (x DOUBLE) WITH (connector = 'file', path = 'in.csv');\n"
    "CREATE FUNCTION f(x DOUBLE) RETURNS DOUBLE LANGUAGE python WITH ({with}) AS $$\n"
    "{body}"
    "$$;\n"
    "CREATE SINK out WITH (connector = 'stdout');\n"
    "INSERT INTO out SELECT f(x) AS y FROM s;\n"
)
DELAY_CLASS = """
import pyarrow.compute as pc
def delay_class(dep_delay):
    return pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
"""


def scalar(
    code: str,
    arg_types: tuple[pa.DataType, ...] = (FLOAT64,),
    returns: pa.DataType = FLOAT64,
    *,
    name: str = "f",
    line: int = 0,
    config: SandboxConfig | None = None,
    **options: str,
) -> PythonScalarFunction:
    spec = FunctionSpec(
        name=name,
        language="python",
        kind="scalar",
        arg_names=tuple(f"x{i}" for i in range(len(arg_types))),
        arg_types=arg_types,
        returns=returns,
        code=dedent(code).encode(),
        options=options,
        line=line,
    )
    function = python_function(spec, config)
    assert isinstance(function, PythonScalarFunction)
    return function


@pytest.fixture
def close_after() -> Any:
    opened: list[Any] = []
    yield opened.append
    for function in opened:
        function.close()


def test_delay_class_on_the_flights_equals_pyarrow_compute(close_after: Any) -> None:
    from flight_serve.demo.nycflights13 import load_flights

    dep_delay = load_flights()["dep_delay"].combine_chunks()
    f = scalar(DELAY_CLASS, returns=pa.string(), name="delay_class")
    close_after(f)
    assert isinstance(f, ScalarFunction)
    assert f.sandboxed
    assert f.seccomp
    step = 65_536
    out = pa.concat_arrays(
        [f.call([dep_delay.slice(i, step)]) for i in range(0, len(dep_delay), step)]
    )
    expected = pc.if_else(pc.greater(dep_delay, 15), "late", "on time")
    assert out.equals(expected)
    assert len(out) == 336_776
    assert out.null_count == 8_255  # the flights without a departure delay
    assert pc.sum(pc.equal(out, "late")).as_py() == 70_774
    assert (f.calls, f.retries) == (6, 0)


def test_nulls_pass_through_a_vectorized_function(close_after: Any) -> None:
    f = scalar(DELAY_CLASS, returns=pa.string(), name="delay_class")
    close_after(f)
    out = f.call([pa.array([None, 16.0, 15.0, None, -3.0])])
    assert out.to_pylist() == [None, "late", "on time", None, "on time"]


def test_row_at_a_time_is_an_opt_in(close_after: Any) -> None:
    code = """
    def combine(a, b):
        if a is None or b is None:
            return None
        return int(a) * 10 + int(b)
    """
    f = scalar(code, (pa.int64(), pa.int64()), pa.int64(), name="combine", vectorized="false")
    close_after(f)
    out = f.call([pa.array([1, 2, None, 4]), pa.array([5, None, 7, 8])])
    assert out.type == pa.int64()
    assert out.to_pylist() == [15, None, None, 48]
    # vectorized (the default), the same handler gets arrays: `a is None` is False, int() of an
    # Array is a TypeError reported with the user's line
    g = scalar(code, (pa.int64(), pa.int64()), pa.int64(), name="combine")
    close_after(g)
    with pytest.raises(
        FunctionCallError, match=r"combine failed .* line 5 of the function's code: TypeError"
    ):
        g.call([pa.array([1]), pa.array([2])])


def test_a_table_function_yields_two_batches_per_input(close_after: Any) -> None:
    schema = pa.schema([("origin", pa.string()), ("miles", pa.float64())])
    code = """
    import pyarrow as pa
    import pyarrow.compute as pc
    def enrich(batch):
        yield batch.select(["origin", "distance"]).rename_columns(["origin", "miles"])
        yield pa.record_batch(
            [pc.utf8_upper(batch["origin"]), pc.multiply(batch["distance"], 2.0)],
            names=["origin", "miles"],
        )
    """
    spec = FunctionSpec(
        name="enrich",
        language="python",
        kind="table",
        arg_names=(),
        arg_types=(),
        returns=schema,
        code=dedent(code).encode(),
    )
    f = python_function(spec)
    close_after(f)
    assert isinstance(f, PythonTableFunction)
    assert isinstance(f, TableFunction)
    batch = pa.record_batch(
        [pa.array(["jfk", "lga"]), pa.array([1.5, 10.0])], names=["origin", "distance"]
    )
    out = list(f.call_table(batch))
    assert [b.schema for b in out] == [schema, schema]
    assert [b.to_pydict() for b in out] == [
        {"origin": ["jfk", "lga"], "miles": [1.5, 10.0]},
        {"origin": ["JFK", "LGA"], "miles": [3.0, 20.0]},
    ]


def test_wrong_type_or_length_fails_the_batch_naming_expected_and_got(close_after: Any) -> None:
    f = scalar(
        """
        import pyarrow.compute as pc
        def f(x):
            if pc.max(x).as_py() > 100:
                return x.slice(1)
            return pc.cast(x, "int32")
        """
    )
    close_after(f)
    with pytest.raises(FunctionCallError, match=r"^function f returned int32, expected double$"):
        f.call([pa.array([1.0, 2.0])])
    with pytest.raises(
        FunctionCallError, match=r"^function f returned 2 rows, expected 3 \(the batch's length\)$"
    ):
        f.call([pa.array([1.0, 200.0, 3.0])])
    h = scalar("def f(x):\n    return [1.0] * len(x)\n")
    close_after(h)
    with pytest.raises(
        FunctionCallError, match=r"^function f returned a list, expected an Arrow array of double$"
    ):
        h.call([pa.array([1.0])])


def test_definition_errors_are_refused_before_anything_runs() -> None:
    body = "import math\ndef f(x):\n    return x +\n"
    with pytest.raises(
        FunctionDefinitionError,
        match=r"^function f: syntax error at line 12 of the pipeline file \(line 3 of the function's code\): invalid syntax$",
    ):
        scalar(body, line=10)
    with pytest.raises(
        FunctionDefinitionError, match=r"^function f: its code defines no handler named 'f'$"
    ):
        scalar("def g(x):\n    return x\n")
    with pytest.raises(
        FunctionDefinitionError, match=r"^function f: handler 'f' is a int, not callable$"
    ):
        scalar("f = 3\n")
    with pytest.raises(FunctionDefinitionError, match=r"handler 'f' cannot take 1 argument"):
        scalar("def f():\n    return 1\n")
    with pytest.raises(
        FunctionDefinitionError,
        match=r"^function f failed while loading its code at line 3 of the pipeline file \(line 2 of the function's code\): ModuleNotFoundError: No module named 'no_such_module'$",
    ):
        scalar("import math\nimport no_such_module\ndef f(x):\n    return x\n", line=2)


def test_an_exception_names_the_pipeline_line(close_after: Any) -> None:
    f = scalar("def f(x):\n    if x[0].as_py() < 0:\n        return 1 / 0\n    return x\n", line=20)
    close_after(f)
    with pytest.raises(
        FunctionCallError,
        match=r"^function f failed while running at line 22 of the pipeline file \(line 3 of the function's code\): ZeroDivisionError: division by zero$",
    ):
        f.call([pa.array([-1.0])])
    assert f.call([pa.array([1.0])]).to_pylist() == [1.0]  # the same worker keeps serving
    assert f.restarts == 0


def test_an_infinite_loop_runs_into_the_deadline(close_after: Any) -> None:
    config = SandboxConfig(deadline=timedelta(seconds=1), pool_size=1)
    f = scalar(
        """
        def f(x):
            if x[0].as_py() < 0:
                while True:
                    pass
            return x
        """,
        config=config,
    )
    close_after(f)
    before = f.worker_pids()
    with pytest.raises(
        FunctionCallError, match=r"^function f ran past its deadline of 1 s on a batch of 1 rows"
    ):
        f.call([pa.array([-1.0])])
    assert f.call([pa.array([2.0, 3.0])]).to_pylist() == [2.0, 3.0]  # a new worker
    assert f.worker_pids() != before
    assert f.restarts == 1


def test_a_memory_bomb_hits_the_limit_and_the_worker_is_replaced(close_after: Any) -> None:
    config = SandboxConfig(memory_limit_bytes=256 << 20, pool_size=1)
    f = scalar(
        """
        def f(x):
            if x[0].as_py() < 0:
                hoard = bytearray(1 << 30)
                return hoard
            return x
        """,
        config=config,
    )
    close_after(f)
    before = f.worker_pids()
    with pytest.raises(
        FunctionCallError,
        match=r"^function f failed while running at line 4 of the function's code: MemoryError .*memory limit 256 MiB = 268435456 bytes; its worker was replaced",
    ):
        f.call([pa.array([-1.0])])
    assert f.call([pa.array([5.0])]).to_pylist() == [5.0]
    assert f.worker_pids() != before
    assert f.restarts == 1


ESCAPES = """
import os, socket, subprocess
def f(what):
    what = what[0].as_py()
    if what == "uid":
        return pa_array(os.getuid())
    if what == "socket":
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))
    if what == "shadow":
        open("/etc/shadow").read()
    if what == "shell":
        subprocess.run(["sh", "-c", "id"], check=True)
    if what == "write":
        open(OUTSIDE, "w").write("escaped")
    if what == "tmp":
        open(INSIDE_TMP, "w").write("inside")
        return pa_array(len(open(INSIDE_TMP).read()))
    if what == "thread":  # threads are allowed (clone with CLONE_THREAD; clone3 -> clone)
        import threading
        box = []
        worker = threading.Thread(target=lambda: box.append(7))
        worker.start()
        worker.join()
        return pa_array(box[0])
    return pa_array(-1)
import pyarrow as pa
def pa_array(v):
    return pa.array([v], pa.int64())
"""


def test_the_sandbox_denies_sockets_shadow_shells_and_writes(close_after: Any) -> None:
    outside = Path(__file__).resolve().parent / f"escape-{uuid.uuid4().hex}"
    inside_tmp = f"/tmp/inside-{uuid.uuid4().hex}"
    code = f"OUTSIDE = {str(outside)!r}\nINSIDE_TMP = {inside_tmp!r}\n" + ESCAPES
    f = scalar(code, (pa.string(),), pa.int64())
    close_after(f)

    def call(what: str) -> int:
        return f.call([pa.array([what])]).to_pylist()[0]  # type: ignore[no-any-return]

    assert call("uid") == 65534
    with pytest.raises(
        FunctionCallError,
        match=r"at line 10 .*: PermissionError: \[Errno 1\] Operation not permitted$",
    ):
        call("socket")
    with pytest.raises(
        FunctionCallError,
        match=r"at line 12 .*: PermissionError: \[Errno 13\] Permission denied: '/etc/shadow'$",
    ):
        call("shadow")
    with pytest.raises(
        FunctionCallError,
        match=r"at line 14 .*: PermissionError: \[Errno 1\] Operation not permitted",
    ):
        call("shell")
    with pytest.raises(
        FunctionCallError, match=r"at line 16 .*: OSError: \[Errno 30\] Read-only file system"
    ):
        call("write")
    assert not outside.exists()
    assert call("tmp") == 6  # its own /tmp works, and is not the host's
    assert not Path(inside_tmp).exists()
    assert call("thread") == 7
    assert f.restarts == 0  # denied calls are ordinary errors: the worker keeps serving
    assert call("uid") == 65534


def test_a_worker_killed_mid_batch_is_retried_on_a_new_worker(close_after: Any) -> None:
    f = scalar(
        """
        import time
        import pyarrow.compute as pc
        def f(x):
            time.sleep(1.0)
            return pc.multiply(x, 2.0)
        """,
        config=SandboxConfig(pool_size=2, min_workers=1),
    )
    close_after(f)
    [pids] = f.worker_pids()
    python_pid = pids[-1]
    values = pa.array([float(i) for i in range(10_000)])
    result: list[pa.Array[Any]] = []
    caller = threading.Thread(target=lambda: result.append(f.call([values])))
    caller.start()
    deadline = time.monotonic() + 5
    while f.worker_pids() and time.monotonic() < deadline:  # until the call holds the worker
        time.sleep(0.01)
    time.sleep(0.3)
    os.kill(python_pid, signal.SIGKILL)
    caller.join(timeout=30)
    assert result, "the call did not return"
    assert result[0].equals(pc.multiply(values, 2.0))
    assert (f.retries, f.restarts, f.calls) == (1, 1, 1)
    assert all(python_pid not in p for p in f.worker_pids())


def test_without_bwrap_python_functions_are_refused_unless_allowed(close_after: Any) -> None:
    missing = SandboxConfig(bwrap="/nonexistent/bwrap")
    with pytest.raises(FunctionDefinitionError, match=r"bwrap is not installed"):
        scalar(DELAY_CLASS, returns=pa.string(), name="delay_class", config=missing)
    f = scalar(
        DELAY_CLASS,
        returns=pa.string(),
        name="delay_class",
        config=SandboxConfig(bwrap="/nonexistent/bwrap", unsandboxed=True),
    )
    close_after(f)
    assert not f.sandboxed
    assert f.call([pa.array([20.0, 1.0])]).to_pylist() == ["late", "on time"]
    g = scalar(
        DELAY_CLASS, returns=pa.string(), name="delay_class", config=SandboxConfig(in_process=True)
    )
    assert not g.sandboxed
    assert g.call([pa.array([None, 99.0])]).to_pylist() == [None, "late"]


def test_a_function_that_kills_its_worker_fails_after_one_retry(close_after: Any) -> None:
    f = scalar(
        """
        import os, signal
        def f(x):
            if x[0].as_py() < 0:
                os.kill(os.getpid(), signal.SIGKILL)
            return x
        """
    )
    close_after(f)
    with pytest.raises(
        FunctionCallError,
        match=r"^function f: its worker died on the same batch twice \(last: killed by signal SIGKILL\)",
    ):
        f.call([pa.array([-1.0])])
    assert (f.retries, f.restarts) == (1, 2)
    assert f.call([pa.array([4.0])]).to_pylist() == [4.0]


def test_concurrent_calls_use_the_pool(close_after: Any) -> None:
    f = scalar(
        """
        import time
        import pyarrow.compute as pc
        def f(x):
            time.sleep(0.3)
            return pc.add(x, 1.0)
        """,
        config=SandboxConfig(pool_size=2, min_workers=1),
    )
    close_after(f)
    results: dict[int, list[float]] = {}

    def run(i: int) -> None:
        results[i] = f.call([pa.array([float(i), float(i * 10)])]).to_pylist()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == {i: [i + 1.0, i * 10 + 1.0] for i in range(4)}
    assert len(f.worker_pids()) == 2  # grew to pool_size, no further


def test_a_table_function_is_always_vectorized() -> None:
    spec = FunctionSpec(
        name="t",
        language="python",
        kind="table",
        arg_names=(),
        arg_types=(),
        returns=pa.schema([("x", pa.int64())]),
        code=b"def t(batch):\n    return batch\n",
        options={"vectorized": "false"},
    )
    with pytest.raises(
        FunctionDefinitionError, match=r"^function t: vectorized = 'false' is for scalar"
    ):
        python_function(spec)


def test_hidden_paths_look_empty_in_the_sandbox(close_after: Any) -> None:
    secret_dir = Path(__file__).resolve().parent / f"hidden-{uuid.uuid4().hex}"
    secret_dir.mkdir()
    try:
        (secret_dir / "token").write_text("s3cret")
        code = f"""
        import os
        def f(x):
            return pa.array([len(os.listdir({str(secret_dir)!r}))], pa.int64())
        import pyarrow as pa
        """
        seen = scalar(code, (pa.float64(),), pa.int64())
        close_after(seen)
        assert seen.call([pa.array([0.0])]).to_pylist() == [1]  # readable without the option
        hidden = scalar(
            code,
            (pa.float64(),),
            pa.int64(),
            config=SandboxConfig(hidden_paths=(str(secret_dir),)),
        )
        close_after(hidden)
        assert hidden.call([pa.array([0.0])]).to_pylist() == [0]
    finally:
        (secret_dir / "token").unlink()
        secret_dir.rmdir()


def test_a_worker_started_by_a_thread_outlives_the_thread(close_after: Any) -> None:
    # bwrap --die-with-parent is PR_SET_PDEATHSIG: it fires when the starting *thread* ends
    f = scalar("def f(x):\n    return x\n", config=SandboxConfig(pool_size=1, min_workers=0))
    close_after(f)
    starter = threading.Thread(target=lambda: f.call([pa.array([1.0])]))
    starter.start()
    starter.join(timeout=30)
    time.sleep(0.3)
    assert f.call([pa.array([2.0])]).to_pylist() == [2.0]
    assert (f.calls, f.retries, f.restarts) == (2, 0, 0)


def test_a_worker_writing_a_bogus_frame_cannot_harm_the_server(close_after: Any) -> None:
    # the code finds the protocol's pipe (fd 4: the worker's copy of its stdout) and announces
    # an answer of 2**60 bytes; the server refuses to read it instead of allocating it
    f = scalar(
        """
        import os, struct
        def f(x):
            if x[0].as_py() < 0:
                os.write(4, struct.pack("!BQ", 4, 1 << 60))
            return x
        """
    )
    close_after(f)
    with pytest.raises(
        FunctionCallError,
        match=r"^function f: its worker announced an answer of 1152921504606846976 bytes, more than its memory limit of 1073741824 bytes",
    ):
        f.call([pa.array([-1.0])])
    assert f.call([pa.array([3.0])]).to_pylist() == [3.0]
    assert f.restarts == 1


def test_a_result_with_hostile_offsets_or_bad_utf8_is_refused(close_after: Any) -> None:
    # the code builds string arrays Arrow's IPC reader would take as they are: offsets far past
    # the data buffer (reading them would read this process's memory) and a value that splits a
    # UTF-8 character; the server validates every buffer, refuses the result, replaces the worker
    f = scalar(
        """
        import pyarrow as pa, struct
        def f(x):
            if x[0].as_py() < 0:
                offsets = [0, 1 << 30, 3] if x[0].as_py() == -1 else [0, 1, 2]
                return pa.Array.from_buffers(pa.string(), 2, [
                    None, pa.py_buffer(struct.pack("<3i", *offsets)), pa.py_buffer("aé".encode())
                ])
            return pa.array(["ok"] * len(x))
        """,
        returns=pa.string(),
    )
    close_after(f)
    with pytest.raises(
        FunctionWorkerError, match=r"^function f: unreadable result: .*out of bounds"
    ):
        f.call([pa.array([-1.0, 0.0])])
    with pytest.raises(FunctionWorkerError, match=r"^function f: unreadable result: .*UTF8"):
        f.call([pa.array([-2.0, 0.0])])
    assert f.call([pa.array([3.0, 4.0])]).to_pylist() == ["ok", "ok"]
    assert f.restarts == 2


def test_a_package_under_tmp_is_importable_in_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, close_after: Any
) -> None:
    # the sandbox's /tmp is private: a checkout (or CI clone) under /tmp, its venv and the
    # PYTHONPATH entries there are bound back read-only (here through 0755 directories, as a
    # clone's are); the rest of the host's /tmp stays unseen
    top = Path(tempfile.mkdtemp(prefix="flight-serve-checkout-", dir="/tmp"))
    try:
        top.chmod(0o755)
        package = top / "deep" / "pkg"
        package.mkdir(parents=True, mode=0o755)
        (package / "tmp_helper_mod.py").write_text("def triple(x):\n    return x * 3\n")
        (top / "elsewhere.txt").write_text("not for the sandbox")
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])
        )
        code = f"""
        import os
        import pyarrow as pa
        import pyarrow.compute as pc
        import tmp_helper_mod
        def f(x):
            assert not os.path.exists({str(top / "elsewhere.txt")!r})
            return pc.multiply(x, tmp_helper_mod.triple(1.0))
        """
        f = scalar(code, (pa.float64(),), pa.float64())
        close_after(f)
        assert f.call([pa.array([1.0, None, 2.5])]).to_pylist() == [3.0, None, 7.5]
    finally:
        shutil.rmtree(top)


# --- WITH (memory_limit, deadline, workers) -----------------------------------------------------


def limited(clause: str, body: str) -> PythonScalarFunction:
    """``f`` of :data:`LIMITED` with ``WITH ({clause})``, built by the registry (sandboxed)."""
    spec = parse_pipeline(LIMITED.format(**{"with": clause, "body": body})).user_functions["f"]
    function = create_function(spec, python_runner="python")
    assert isinstance(function, PythonScalarFunction)
    return function


def test_a_memory_bomb_under_a_128_mib_memory_limit_names_the_limit(close_after: Any) -> None:
    body = (
        "def f(x):\n    if x[0].as_py() < 0:\n        return bytearray(200 << 20)\n    return x\n"
    )
    f = limited("memory_limit = '128MiB', workers = 1", body)
    close_after(f)
    assert f._config.memory_limit_bytes == 128 << 20
    with pytest.raises(FunctionCallError) as caught:
        f.call([pa.array([-1.0])])
    assert str(caught.value) == (
        "function f failed while running at line 5 of the pipeline file (line 4 of the "
        "function's code): MemoryError (memory limit 128 MiB = 134217728 bytes "
        "(WITH memory_limit = '128MiB'); its worker was replaced)"
    )
    assert f.call([pa.array([5.0])]).to_pylist() == [5.0]  # a new worker, same limit
    assert f.restarts == 1
    # the same bomb fits under the default limit (1 GiB): the limit is what stopped it
    g = limited(
        "workers = 1",
        body.replace("return bytearray(200 << 20)", "b = bytearray(200 << 20); return x"),
    )
    close_after(g)
    assert g.call([pa.array([-1.0])]).to_pylist() == [-1.0]


def test_a_loop_under_a_half_second_deadline_names_the_deadline(close_after: Any) -> None:
    body = "def f(x):\n    while x[0].as_py() < 0:\n        pass\n    return x\n"
    f = limited("deadline = '0.5s', workers = 1", body)
    close_after(f)
    assert f._config.deadline == timedelta(seconds=0.5)
    started = time.monotonic()
    with pytest.raises(FunctionCallError) as caught:
        f.call([pa.array([-1.0])])
    waited = time.monotonic() - started
    assert str(caught.value) == (
        "function f ran past its deadline of 0.5 s (WITH deadline = '0.5s') on a batch of 1 "
        "rows; its worker was killed"
    )
    assert 0.5 <= waited < 5.0  # not the default 30 s
    assert f.call([pa.array([2.0])]).to_pylist() == [2.0]


def test_workers_sets_the_pool_size_and_no_options_keep_the_defaults(close_after: Any) -> None:
    body = "def f(x):\n    return x\n"
    f = limited("workers = 3", body)
    close_after(f)
    assert (f._config.pool_size, f._config.min_workers) == (3, 1)
    default = limited("vectorized = true", body)
    close_after(default)
    assert default._config == SandboxConfig()
    assert (default._config.memory_limit_bytes, default._config.deadline) == (
        1 << 30,
        timedelta(seconds=30),
    )
    assert default._config.pool_size == 2


# --- the shared-memory transport ----------------------------------------------------------------

#: what a function sees of its shared regions: each memfd's name, and whether ftruncate
#: (growing or shrinking it under the server) is refused
REGIONS = """
import os
import pyarrow as pa
def f(x):
    seen = []
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:flight-serve-"):
            size = os.fstat(fd).st_size
            try:
                os.ftruncate(fd, size // 2)
                refused = "no"
            except PermissionError:
                refused = "EPERM"
            seen.append(f"{target.split()[0]} {size} {refused}")
    return pa.array([";".join(seen)] * len(x))
"""


def test_batches_cross_through_sealed_shared_memory(close_after: Any) -> None:
    f = scalar(REGIONS, returns=pa.string(), config=SandboxConfig(pool_size=1))
    close_after(f)
    assert f.call([pa.array([1.0])]).to_pylist() == [
        "/memfd:flight-serve-f-request 67108864 EPERM;/memfd:flight-serve-f-response 67108864 EPERM"
    ]
    (worker,) = f._idle
    assert worker.shm_ready


def test_big_batches_and_shared_memory_off_use_the_pipes(close_after: Any) -> None:
    values = pa.array([float(i) for i in range(100_000)])  # 800 kB: larger than a 64 KiB region
    small = scalar(
        "def f(x):\n    return x\n", config=SandboxConfig(pool_size=1, shared_memory_bytes=64 << 10)
    )
    close_after(small)
    sent: list[int] = []
    (worker,) = small._idle
    exchange = worker.exchange

    def spy(kind: int, payload: Any, timeout_s: float, max_bytes: int) -> Any:
        sent.append(kind)
        answer = exchange(kind, payload, timeout_s, max_bytes)
        sent.append(answer[0])
        return answer

    worker.exchange = spy  # type: ignore[method-assign]
    assert small.call([values]).equals(values)
    assert small.call([values.slice(0, 10)]).equals(values.slice(0, 10))
    assert sent == [proto.CALL, proto.RESULT, proto.CALL_SHM, proto.RESULT_SHM]
    off = scalar("def f(x):\n    return x\n", config=SandboxConfig(shared_memory=False))
    close_after(off)
    assert off._idle[0].shared is None
    assert off.call([values]).equals(values)


def test_arguments_are_views_of_the_region_valid_during_the_call(close_after: Any) -> None:
    """The worker reads each batch in place (zero-copy): an argument kept across calls without
    a copy shows the bytes of the newest batch laid out the same; a copy keeps its values."""
    keep = """
import pyarrow as pa
kept = []
def f(x):
    kept.append((x, pa.concat_arrays([x])))  # the view, and a copy
    view, copy = kept[0]
    return pa.array([str(view.to_pylist()), str(copy.to_pylist())])
"""
    f = scalar(keep, returns=pa.string(), config=SandboxConfig(pool_size=1))
    close_after(f)
    assert f.call([pa.array([1.0, 2.0])]).to_pylist() == ["[1.0, 2.0]", "[1.0, 2.0]"]
    assert f.call([pa.array([3.0, 4.0])]).to_pylist() == ["[3.0, 4.0]", "[1.0, 2.0]"]


def test_a_call_runs_on_the_callers_cpu_and_puts_its_affinity_back(close_after: Any) -> None:
    """``same_cpu`` (the default): the worker's processes (bwrap's and the Python worker) are
    bound to the CPU the calling thread is on, again when the caller moved; the caller's own
    affinity is what it was once the call returns, also when the call fails."""
    cpus = sorted(os.sched_getaffinity(0))
    f = scalar(
        "def f(x):\n    if x[0].as_py() < 0:\n        raise ValueError('no')\n    return x\n",
        config=SandboxConfig(pool_size=1),
    )
    close_after(f)
    (worker,) = f._idle
    everywhere = set(cpus)
    assert all(os.sched_getaffinity(pid) == everywhere for pid in worker.pids())
    try:
        for cpu in cpus[:2]:
            os.sched_setaffinity(0, {cpu})  # this thread now runs on `cpu` only
            assert f.call([pa.array([1.0])]).to_pylist() == [1.0]
            assert os.sched_getaffinity(0) == {cpu}
            assert [os.sched_getaffinity(pid) for pid in worker.pids()] == [{cpu}] * len(
                worker.pids()
            )
        os.sched_setaffinity(0, everywhere)
        with pytest.raises(FunctionCallError, match="no"):
            f.call([pa.array([-1.0])])
        assert os.sched_getaffinity(0) == everywhere
        assert f.call([pa.array([2.0])]).to_pylist() == [2.0]
        assert os.sched_getaffinity(0) == everywhere
    finally:
        os.sched_setaffinity(0, everywhere)


def test_same_cpu_off_leaves_the_worker_to_the_scheduler(close_after: Any) -> None:
    everywhere = os.sched_getaffinity(0)
    f = scalar("def f(x):\n    return x\n", config=SandboxConfig(pool_size=1, same_cpu=False))
    close_after(f)
    assert f.call([pa.array([1.0])]).to_pylist() == [1.0]
    (worker,) = f._idle
    assert all(os.sched_getaffinity(pid) == everywhere for pid in worker.pids())


def test_string_offsets_out_of_order_are_refused(close_after: Any) -> None:
    # offsets inside the data buffer but decreasing (a value that ends before it starts): the
    # worker's own IPC writer takes them; reading the value would go outside its bytes
    f = scalar(
        """
        import pyarrow as pa, struct
        def f(x):
            offsets = [0, 3, 1] if x[0].as_py() < 0 else [0, 1, 3]
            return pa.Array.from_buffers(pa.string(), 2, [
                None, pa.py_buffer(struct.pack("<3i", *offsets)), pa.py_buffer(b"abc")
            ])
        """,
        returns=pa.string(),
    )
    close_after(f)
    with pytest.raises(
        FunctionWorkerError,
        match=r"^function f: unreadable result: string offsets out of order: value 1 ends at "
        r"1, before it starts \(3\)",
    ):
        f.call([pa.array([-1.0, 0.0])])
    assert f.call([pa.array([3.0, 4.0])]).to_pylist() == ["a", "bc"]
    assert f.restarts == 1
