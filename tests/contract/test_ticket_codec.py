"""The v1 ticket codec is a wire contract: pinned bytes keep decoding to the same fields."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flight_serve._proto.flight_serve.v1 import ticket_pb2
from flight_serve.errors import TicketError
from flight_serve.flight.tickets import (
    AnyTicket,
    QueryTicket,
    StreamPin,
    StreamRangeTicket,
    TailTicket,
    decode_ticket,
    encode_ticket,
)
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
INCARNATION = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"

# Bytes written by the v1 codec; they must decode to the same tickets forever.
PINNED = [
    (
        "0801125f0a2a53454c45435420782c20636f756e74282a292046524f4d20666c69676874732047524f5550"
        "204259207812310a07666c6967687473122431623465323862612d326661312d313164322d383833662d30"
        "30313664336363613432371807",
        QueryTicket(
            "SELECT x, count(*) FROM flights GROUP BY x", (StreamPin("flights", INCARNATION, 7),)
        ),
    ),
    (
        "08011a2d0a0173122431623465323862612d326661312d313164322d383833662d30303136643363636134"
        "323718022005",
        StreamRangeTicket("s", INCARNATION, 2, 5),
    ),
    (
        "0801222b0a0173122431623465323862612d326661312d313164322d383833662d30303136643363636134"
        "32371804",
        TailTicket("s", INCARNATION, 4),
    ),
]


@pytest.mark.parametrize(("hex_bytes", "expected"), PINNED)
def test_pinned_v1_bytes_decode_to_the_same_ticket(hex_bytes: str, expected: object) -> None:
    assert decode_ticket(bytes.fromhex(hex_bytes)) == expected


@pytest.mark.parametrize(("hex_bytes", "ticket"), PINNED)
def test_the_encoder_still_writes_the_pinned_bytes(
    hex_bytes: str, ticket: QueryTicket | StreamRangeTicket | TailTicket
) -> None:
    assert encode_ticket(ticket).hex() == hex_bytes


def test_a_query_ticket_may_pin_no_stream_and_several_streams() -> None:
    for pins in [(), (StreamPin("a", INCARNATION, 0), StreamPin("b.c", INCARNATION, 9))]:
        ticket = QueryTicket("SELECT 1", pins)
        assert decode_ticket(encode_ticket(ticket)) == ticket


def test_the_committed_generated_code_equals_a_fresh_generation(tmp_path: Path) -> None:
    protos = sorted((ROOT / "schemas").glob("flight_serve/v1/ticket.proto"))  # flightsql.proto: test_flightsql_schemas.py
    assert [p.name for p in protos] == ["ticket.proto"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'schemas'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            *map(str, protos),
        ],
        check=True,
    )
    committed = ROOT / "server" / "flight_serve" / "_proto"
    for name in ["ticket_pb2.py", "ticket_pb2.pyi"]:
        fresh = (tmp_path / "flight_serve" / "v1" / name).read_text()
        assert (committed / "flight_serve" / "v1" / name).read_text() == fresh, (
            f"{name} is stale: run `make proto` and commit the result"
        )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xff\xff", "malformed ticket: not a flight_serve.v1.Ticket"),
        (b"", "unknown ticket version 0"),
        (ticket_pb2.Ticket(version=1).SerializeToString(), "names no query, stream range or tail"),
        (
            ticket_pb2.Ticket(
                version=2, tail=ticket_pb2.TailTicket(stream="s", incarnation=INCARNATION)
            ).SerializeToString(),
            "unknown ticket version 2",
        ),
        (
            ticket_pb2.Ticket(
                version=1, tail=ticket_pb2.TailTicket(stream="../x", incarnation=INCARNATION)
            ).SerializeToString(),
            "invalid stream name '../x'",
        ),
        (
            ticket_pb2.Ticket(
                version=1, tail=ticket_pb2.TailTicket(stream="s", incarnation="nope")
            ).SerializeToString(),
            "incarnation 'nope' is not a UUID",
        ),
        (
            ticket_pb2.Ticket(
                version=1,
                stream_range=ticket_pb2.StreamRangeTicket(
                    stream="s", incarnation=INCARNATION, start_offset=5, stop_offset=2
                ),
            ).SerializeToString(),
            "stop_offset 2 < start_offset 5",
        ),
        (
            ticket_pb2.Ticket(version=1, query=ticket_pb2.QueryTicket(sql=" ")).SerializeToString(),
            "empty SQL",
        ),
        (
            ticket_pb2.Ticket(
                version=1, tail=ticket_pb2.TailTicket(stream="s", incarnation=INCARNATION)
            ).SerializeToString()[:-3],
            "malformed ticket",
        ),
    ],
)
def test_bad_tickets_raise_ticket_error(data: bytes, message: str) -> None:
    with pytest.raises(TicketError, match=message.replace("(", r"\(").replace(".", r"\.")):
        decode_ticket(data)


@given(st.binary(max_size=200))
def test_random_bytes_raise_ticket_error(data: bytes) -> None:
    with pytest.raises(TicketError):
        decode_ticket(data)


@given(
    st.sampled_from(["a", "flights", "x.y-z_1"]),
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_every_valid_ticket_round_trips(stream: str, a: int, b: int) -> None:
    tickets: list[AnyTicket] = [
        StreamRangeTicket(stream, INCARNATION, min(a, b), max(a, b)),
        TailTicket(stream, INCARNATION, a),
        QueryTicket(f'SELECT * FROM "{stream}"', (StreamPin(stream, INCARNATION, b),)),
    ]
    for ticket in tickets:
        assert decode_ticket(encode_ticket(ticket)) == ticket
