"""to_flight_error, checked on the wire: each error class reaches a client as the right gRPC code
and the right pyarrow exception class (the table in flight_serve.flight.status)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve.errors import (
    AlreadyExistsError,
    OverloadError,
    QueryError,
    StorageError,
    StreamNotFoundError,
)
from flight_serve.flight.status import to_flight_error

pytestmark = pytest.mark.integration

ERRORS: dict[str, BaseException] = {
    "query": QueryError("bad SQL"),
    "missing": StreamNotFoundError("stream 'x' does not exist"),
    "exists": AlreadyExistsError("pipeline 'p' exists"),
    "overload": OverloadError("too many concurrent streams"),
    "storage": StorageError("disk full"),
    "bug": ZeroDivisionError("division by zero"),
    "arrow": pa.ArrowInvalid("bad IPC"),
    "cancelled": flight.FlightCancelledError("client went away"),
}


class Raiser(flight.FlightServerBase):
    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[bytes]:
        raise to_flight_error(ERRORS[action.type], rpc="DoAction") from None


# Private: a plain Flight server that raises each error class, not flight-serve.
@pytest.fixture(scope="module")
def location() -> Iterator[str]:
    with Raiser("grpc://127.0.0.1:0") as server:
        yield f"127.0.0.1:{server.port}"


@pytest.mark.parametrize(
    ("kind", "code", "client_class", "message"),
    [
        ("query", grpc.StatusCode.INVALID_ARGUMENT, pa.ArrowInvalid, "bad SQL"),
        ("missing", grpc.StatusCode.NOT_FOUND, pa.ArrowKeyError, "stream 'x' does not exist"),
        ("exists", grpc.StatusCode.INVALID_ARGUMENT, pa.ArrowInvalid, "pipeline 'p' exists"),
        (
            "overload",
            grpc.StatusCode.UNAVAILABLE,
            flight.FlightUnavailableError,
            r"too many concurrent streams \(retryable",
        ),
        (
            "storage",
            grpc.StatusCode.INTERNAL,
            flight.FlightInternalError,
            r"internal error \w{12} \(StorageError\): disk full",
        ),
        (
            "bug",
            grpc.StatusCode.INTERNAL,
            flight.FlightInternalError,
            r"internal error \w{12} \(ZeroDivisionError\): division by zero",
        ),
        ("arrow", grpc.StatusCode.INVALID_ARGUMENT, pa.ArrowInvalid, "bad IPC"),
        ("cancelled", grpc.StatusCode.CANCELLED, flight.FlightCancelledError, "client went away"),
    ],
)
def test_error_class_to_status_code(
    location: str, kind: str, code: grpc.StatusCode, client_class: type, message: str
) -> None:
    with grpc.insecure_channel(location) as channel:
        call = channel.unary_stream("/arrow.flight.protocol.FlightService/DoAction")
        request = bytes([0x0A, len(kind)]) + kind.encode()  # Action{type=kind}
        with pytest.raises(grpc.RpcError) as raw:
            list(call(request, timeout=10))
        assert raw.value.code() == code

    # The message the client sees starts with flight-serve's own text.
    with (
        flight.connect(f"grpc://{location}") as client,
        pytest.raises(client_class, match="^" + message),
    ):
        list(client.do_action(flight.Action(kind, b"")))


def test_overload_carries_a_retry_hint() -> None:
    error = to_flight_error(OverloadError("busy"))
    assert isinstance(error, flight.FlightUnavailableError)
    assert error.extra_info == b'{"retryable": true}'
