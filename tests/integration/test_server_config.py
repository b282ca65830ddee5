"""One frozen ServerConfig runs a server: ``start_server(ServerConfig(...))`` honours every field
the ``flight-serve serve`` flags set (the files it names are read, the budget it sizes is made),
options override a config's fields, and contradicting fields are refused naming both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.flight as flight
import pytest
from flight_serve.errors import InvalidInputError
from flight_serve.flight.config import ServerConfig
from flight_serve.flight.server import start_server

pytestmark = pytest.mark.integration


def _bearer(token: str) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])


def test_start_server_reads_the_tokens_file_a_config_names(tmp_path: Path) -> None:
    """A config with ``tokens_file`` serves with those tokens, as ``--tokens-file`` does: an
    anonymous call is UNAUTHENTICATED and a read token lists the streams but cannot write."""
    tokens = tmp_path / "tokens"
    tokens.write_text("r3ad-token read reader\nadm1n-token read,write,admin ops\n")
    config = ServerConfig(tmp_path / "data", pipelines=False, tokens_file=tokens)
    with start_server(config) as service, flight.connect(service.location) as client:
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_flights())
        assert list(client.list_flights(options=_bearer("r3ad-token"))) == []
        drop = flight.Action("stream.drop", b'{"stream": "s"}')
        with pytest.raises(flight.FlightUnauthorizedError, match="'admin' role"):
            list(client.do_action(drop, options=_bearer("r3ad-token")))


def test_start_server_makes_the_memory_budget_a_config_sizes(tmp_path: Path) -> None:
    """``memory_budget_bytes`` and ``memory_wait_s`` become the service's MemoryBudget, as
    ``--memory-budget`` / ``--memory-wait`` do; keyword options override a config's fields."""
    config = ServerConfig(tmp_path / "data", memory_budget_bytes=64 << 20, memory_wait_s=0.25)
    with start_server(config, pipelines=False, statement_timeout_s=2.0) as service:
        budget = service.memory_budget
        assert budget is not None
        assert (budget.limit_bytes, budget.wait_s) == (64 << 20, 0.25)
        assert service.query_limits.statement_timeout_s == 2.0
        actions = {a.type for a in service.list_actions(None)}
        assert "pipeline.submit" not in actions  # pipelines=False took effect
        assert "stream.drop" in actions


def test_a_bad_tokens_file_fails_the_start_naming_its_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("t0ken reed\n")
    config = ServerConfig(tmp_path / "data", pipelines=False, tokens_file=tokens)
    with pytest.raises(InvalidInputError, match=r"tokens:1: unknown role\(s\) reed"):
        start_server(config).__enter__()


@pytest.mark.parametrize(
    ("given", "other", "values"),
    [
        ("users", "users_file", ({"u": "p"}, Path("users"))),
        ("tokens", "tokens_file", ({}, Path("tokens"))),
        ("memory_budget_bytes", "memory_budget", (1 << 20, None)),
    ],
)
def test_contradicting_fields_are_refused_naming_both(
    tmp_path: Path, given: str, other: str, values: tuple[object, object]
) -> None:
    if other == "memory_budget":
        from flight_serve.flight.ops.limits import MemoryBudget

        values = (values[0], MemoryBudget(1 << 20))
    first = "memory_budget" if other == "memory_budget" else given
    second = "memory_budget_bytes" if other == "memory_budget" else other
    with pytest.raises(ValueError, match=f"give {first} or {second}, not both"):
        ServerConfig(tmp_path, **{given: values[0], other: values[1]})  # type: ignore[arg-type]


def test_a_config_is_frozen(tmp_path: Path) -> None:
    config = ServerConfig(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]
    assert dataclasses.replace(config, port=8815).port == 8815
    assert (config.host, config.port, config.fsync, config.pipelines) == (
        "127.0.0.1",
        0,
        "batch",
        True,
    )
