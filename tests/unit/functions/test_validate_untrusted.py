"""What the server checks of a worker's result before touching its values
(:func:`flight_serve.functions.python.validate_untrusted`): string offsets, in bounds and in
order, also for sliced and large strings, and UTF-8 beyond ASCII. The arrays' offsets are
written over after the array was built (``from_buffers`` checks them once), as the bytes of a
hostile worker's IPC stream arrive unchecked."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from flight_serve.functions.python import validate_untrusted

STRING = pa.string()


def strings(
    offsets: list[int], data: bytes, kind: pa.DataType = STRING, *, built: list[int] | None = None
) -> pa.Array:
    """A string array of ``data`` whose offsets buffer holds ``offsets``; it is built with the
    harmless offsets ``built`` (default: all 0), then ``offsets`` are written over them."""
    width = "q" if kind == pa.large_string() else "i"
    fmt = f"<{len(offsets)}{width}"
    raw = bytearray(struct.pack(fmt, *(built or [0] * len(offsets))))
    array = pa.Array.from_buffers(
        kind, len(offsets) - 1, [None, pa.py_buffer(raw), pa.py_buffer(data)]
    )
    raw[:] = struct.pack(fmt, *offsets)
    return array


def check(array: pa.Array) -> None:
    validate_untrusted(pa.record_batch([array], names=["result"]))


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_good_offsets_pass(kind: pa.DataType) -> None:
    check(strings([0, 1, 1, 4], b"abcd", kind))
    check(strings([0, 2, 6], "éa€".encode(), kind))  # é, then a€: characters whole
    check(strings([0], b"", kind))  # no values


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([0, 1 << 30, 3], r"out of bounds: 0\.\.1073741824 against a data buffer of 3 bytes"),
        # the first or last offset: Arrow's structural check (validate()) names it
        ([0, 1, 9], r"binary offsets \(9\) larger than values array \(size 3\)"),
        ([-2, 1, 3], r"Negative offsets in binary array"),
        ([0, 3, 1], r"out of order: value 1 ends at 1, before it starts \(3\)"),
    ],
)
@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_bad_offsets_are_refused(offsets: list[int], message: str, kind: pa.DataType) -> None:
    with pytest.raises(pa.ArrowInvalid, match=message):
        check(strings(offsets, b"abc", kind))


def test_a_slice_checks_its_own_offsets_only() -> None:
    # offsets [5, 0, 1, 3] with the first value cut off by the slice: [0, 1, 3] is good
    whole = strings([5, 0, 1, 3], b"abc", built=[0, 0, 1, 3])
    check(whole.slice(1))
    with pytest.raises(pa.ArrowInvalid, match="out of bounds"):
        check(whole)


def test_a_value_that_splits_a_character_is_refused() -> None:
    with pytest.raises(pa.ArrowInvalid, match="UTF8"):
        check(strings([0, 2, 3], "aé".encode()))  # 'a' + the first byte of 'é'
