//! Example flight-serve WebAssembly functions (ABI v1, schemas/functions-wasm-abi.md), no crates:
//!
//!     CREATE FUNCTION great_circle(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE)
//!         RETURNS DOUBLE LANGUAGE wasm USING 'udfs/geo.wasm';
//!     CREATE FUNCTION gcd(a BIGINT, b BIGINT) RETURNS BIGINT LANGUAGE wasm USING 'udfs/geo.wasm';
//!     CREATE FUNCTION poly(x DOUBLE) RETURNS DOUBLE LANGUAGE wasm USING 'udfs/geo.wasm';
//!     CREATE FUNCTION idiv(a BIGINT, b BIGINT) RETURNS BIGINT LANGUAGE wasm USING 'udfs/geo.wasm';
//!     CREATE FUNCTION late_flights(dep_delay DOUBLE, arr_delay DOUBLE)
//!         RETURNS TABLE (dep_delay DOUBLE, arr_delay DOUBLE, gained DOUBLE)
//!         LANGUAGE wasm USING 'udfs/geo.wasm';
//!
//! Built by `make wasm-examples` with Debian's rustc:
//!
//!     /usr/bin/rustc --target wasm32-unknown-unknown --crate-type cdylib -C opt-level=3 \
//!         -C strip=debuginfo -o build/udfs/geo.wasm examples/udfs/geo.rs
//!
//! Each function is called once per batch: `n` rows, one pointer per argument to `n` values
//! (little-endian, fixed width) in this module's linear memory, `valid` (0 when every row is
//! valid, else the rows' validity bitmap, Arrow's LSB bit order) and `out`, where the function
//! writes `n` values. It returns 0 (another value fails the batch). Rows that are not valid have
//! zeroed inputs and their output is ignored, so a function may compute them or skip them.
//!
//! A table function (`late_flights`) gets `(n, in, out)`: `in` points to one (values, validity)
//! pair of pointers per input column (validity 0: no nulls); it allocates its output columns
//! with `alloc` and writes at `out` the number of rows `m` and one (values, validity) pair per
//! output column. The host copies them out and frees them with `dealloc`.

use std::alloc::{alloc as raw_alloc, dealloc as raw_dealloc, Layout};
use std::slice;

/// The ABI version this module speaks (schemas/functions-wasm-abi.md).
#[no_mangle]
pub extern "C" fn flight_serve_abi_version() -> i32 {
    1
}

/// `size` bytes aligned to `align`; 0 when the allocation fails (or traps: out of memory).
#[no_mangle]
pub unsafe extern "C" fn alloc(size: u32, align: u32) -> u32 {
    match Layout::from_size_align(size.max(1) as usize, align.max(1) as usize) {
        Ok(layout) => raw_alloc(layout) as u32,
        Err(_) => 0,
    }
}

/// Frees what `alloc(size, align)` returned.
#[no_mangle]
pub unsafe extern "C" fn dealloc(ptr: u32, size: u32, align: u32) {
    let layout = Layout::from_size_align_unchecked(size.max(1) as usize, align.max(1) as usize);
    raw_dealloc(ptr as *mut u8, layout)
}

unsafe fn input<'a, T>(ptr: u32, n: u32) -> &'a [T] {
    slice::from_raw_parts(ptr as *const T, n as usize)
}

unsafe fn output<'a, T>(ptr: u32, n: u32) -> &'a mut [T] {
    slice::from_raw_parts_mut(ptr as *mut T, n as usize)
}

/// Mean Earth radius in statute miles (IUGG: 6371.0088 km).
const EARTH_RADIUS_MILES: f64 = 3958.7613;

/// Great-circle (haversine) distance in miles between (lat1, lon1) and (lat2, lon2), degrees.
fn haversine_miles(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dlat = p2 - p1;
    let dlon = (lon2 - lon1).to_radians();
    let a = (dlat / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_MILES * a.sqrt().asin()
}

/// great_circle(lat1 DOUBLE, lon1 DOUBLE, lat2 DOUBLE, lon2 DOUBLE) -> DOUBLE (miles).
#[no_mangle]
pub unsafe extern "C" fn great_circle(
    n: u32, lat1: u32, lon1: u32, lat2: u32, lon2: u32, _valid: u32, out: u32,
) -> i32 {
    let (a, b, c, d) = (input::<f64>(lat1, n), input::<f64>(lon1, n), input::<f64>(lat2, n), input::<f64>(lon2, n));
    let out = output::<f64>(out, n);
    for i in 0..n as usize {
        out[i] = haversine_miles(a[i], b[i], c[i], d[i]);
    }
    0
}

/// gcd(a BIGINT, b BIGINT) -> BIGINT: the non-negative greatest common divisor (gcd(0, 0) = 0).
#[no_mangle]
pub unsafe extern "C" fn gcd(n: u32, a: u32, b: u32, _valid: u32, out: u32) -> i32 {
    let (a, b) = (input::<i64>(a, n), input::<i64>(b, n));
    let out = output::<i64>(out, n);
    for i in 0..n as usize {
        let (mut x, mut y) = (a[i].unsigned_abs(), b[i].unsigned_abs());
        while y != 0 {
            let t = x % y;
            x = y;
            y = t;
        }
        out[i] = x as i64;
    }
    0
}

/// poly(x DOUBLE) -> DOUBLE: the fused 3x² + 2x + 1 of benchmarks/functions_wasm.py.
#[no_mangle]
pub unsafe extern "C" fn poly(n: u32, x: u32, _valid: u32, out: u32) -> i32 {
    let x = input::<f64>(x, n);
    let out = output::<f64>(out, n);
    for i in 0..n as usize {
        out[i] = 3.0 * x[i] * x[i] + 2.0 * x[i] + 1.0;
    }
    0
}

/// idiv(a BIGINT, b BIGINT) -> BIGINT: a / b truncated; b = 0 on a valid row panics, which on
/// wasm32-unknown-unknown aborts (a trap): the batch fails with the function's name. Rows that
/// are not valid are skipped (their zeroed b would trap too).
#[no_mangle]
pub unsafe extern "C" fn idiv(n: u32, a: u32, b: u32, valid: u32, out: u32) -> i32 {
    let (a, b) = (input::<i64>(a, n), input::<i64>(b, n));
    let out = output::<i64>(out, n);
    let bits = if valid == 0 { None } else { Some(input::<u8>(valid, (n + 7) / 8)) };
    for i in 0..n as usize {
        if let Some(bits) = bits {
            if bits[i / 8] & (1 << (i % 8)) == 0 {
                continue;
            }
        }
        out[i] = a[i] / b[i];
    }
    0
}

fn is_valid(bitmap: u32, i: usize) -> bool {
    bitmap == 0 || unsafe { *((bitmap as usize + i / 8) as *const u8) } & (1 << (i % 8)) != 0
}

/// A column of `values` handed to the host: copied into memory from `alloc` (freed by the host).
unsafe fn hand_over(values: &[f64]) -> u32 {
    let ptr = alloc((values.len() * 8) as u32, 8);
    if ptr != 0 {
        output::<f64>(ptr, values.len() as u32).copy_from_slice(values);
    }
    ptr
}

/// late_flights(dep_delay DOUBLE, arr_delay DOUBLE)
///     -> TABLE (dep_delay DOUBLE, arr_delay DOUBLE, gained DOUBLE):
/// the flights that left more than 15 minutes late (both delays known), with the minutes they
/// made up in the air (dep_delay - arr_delay).
#[no_mangle]
pub unsafe extern "C" fn late_flights(n: u32, input_cols: u32, out: u32) -> i32 {
    let cols = input::<u32>(input_cols, 4); // (values, validity) of dep_delay, arr_delay
    let (dep, arr) = (input::<f64>(cols[0], n), input::<f64>(cols[2], n));
    let (mut d, mut a, mut g) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n as usize {
        if is_valid(cols[1], i) && is_valid(cols[3], i) && dep[i] > 15.0 {
            d.push(dep[i]);
            a.push(arr[i]);
            g.push(dep[i] - arr[i]);
        }
    }
    let ptrs = [hand_over(&d), hand_over(&a), hand_over(&g)];
    if ptrs.contains(&0) {
        return 1; // out of memory: the batch fails
    }
    let desc = output::<u32>(out, 7);
    desc[0] = d.len() as u32;
    for (j, p) in ptrs.iter().enumerate() {
        desc[1 + 2 * j] = *p; // values
        desc[2 + 2 * j] = 0; // validity: no nulls
    }
    0
}
