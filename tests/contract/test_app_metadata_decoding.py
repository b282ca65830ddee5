"""The server's and the Python client's decoders of JSON app_metadata agree (the wire contract
of schemas/README.md): the client may not import the server, so each keeps its own; on every
message here both return the same object, or both refuse it with the same message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from flight_serve._wire import WireError, decode_json, info_metadata
from flight_serve_client._protocol import ProtocolError
from flight_serve_client._protocol import decode_json as client_decode

MESSAGES: list[bytes | None] = [
    b'{"offset": 3, "rows": 10}',
    b'{"offset": 0, "writer": "w-1", "piece": 0, "pieces": 2}',
    b'{"ack": 4, "watermark_ns": -9223372036854775808, "late_rows": 0}',
    b'{"done": true}',
    b"{}",
    '{"writer": "é"}'.encode(),
    b"[1, 2]",
    b"7",
    b"not json",
    b"",
    b"\xff\xfe",
    None,
]


def _outcome(
    decode: Callable[[bytes | None, str], dict[str, Any]], message: bytes | None
) -> tuple[str, object]:
    try:
        return "ok", decode(message, "PutResult")
    except (WireError, ProtocolError) as exc:
        return "refused", str(exc)


@pytest.mark.parametrize("message", MESSAGES)
def test_the_server_and_the_client_decode_app_metadata_alike(message: bytes | None) -> None:
    assert _outcome(decode_json, message) == _outcome(client_decode, message)


def test_a_buffer_decodes_as_its_bytes() -> None:
    raw = b'{"offset": 1}'
    assert (
        decode_json(pa.py_buffer(raw), "tail message")
        == client_decode(pa.py_buffer(raw), "tail message")
        == {"offset": 1}
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"next_offset": 7, "writers": {}}', {"next_offset": 7, "writers": {}}),
        ('{"next_offset": 7}', {"next_offset": 7}),
        (b"", {}),
        (None, {}),
        (b"[1]", {}),
        (b"\xff", {}),
        (b"garbage", {}),
    ],
)
def test_a_flight_info_metadata_that_is_no_object_reads_as_empty(
    raw: bytes | str | None, expected: dict[str, object]
) -> None:
    assert info_metadata(raw) == expected
