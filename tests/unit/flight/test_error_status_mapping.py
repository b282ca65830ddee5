"""Every error class of flight_serve.errors maps to the Flight status its domain names.

The table below is written by hand from the module docstring of flight_serve.flight.status; a
new error class fails ``test_every_error_class_is_in_the_table`` until it is added here.
"""

from __future__ import annotations

import inspect

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_serve import errors
from flight_serve.flight.status import InvalidArgument, NotFound, Unimplemented, to_flight_error

#: domain -> (exception class the client-side error is an instance of, retryable)
BY_DOMAIN: dict[str, tuple[type[BaseException], bool]] = {
    "input": (pa.ArrowInvalid, False),
    "already_exists": (pa.ArrowInvalid, False),
    "not_found": (pa.ArrowKeyError, False),
    "unsupported": (NotImplementedError, False),
    "overload": (flight.FlightUnavailableError, True),
    "external": (flight.FlightUnavailableError, True),
    "internal": (flight.FlightInternalError, False),
}

#: the classes whose ``retryable`` is not their domain's (by hand, like DOMAIN_OF)
NOT_RETRYABLE = {"ExternalRefusalError"}

#: every class, by name -> its domain (by hand: a reclassification is a deliberate edit here)
DOMAIN_OF: dict[str, str] = {
    "FlightServeError": "internal",
    "InvalidInputError": "input",
    "SchemaMismatchError": "input",
    "QueryError": "input",
    "PipelineSQLError": "input",
    "TicketError": "input",
    "EventTimeError": "input",
    "StreamNameError": "input",
    "ConnectorError": "input",
    "ConnectorOptionError": "input",
    "ActionError": "input",
    "FunctionDefinitionError": "input",
    "FunctionCallError": "input",
    "IncompatibleUpdateError": "input",
    "NotFoundError": "not_found",
    "StreamNotFoundError": "not_found",
    "AlreadyExistsError": "already_exists",
    "UnsupportedError": "unsupported",
    "OverloadError": "overload",
    "ExternalError": "external",
    "ExternalRefusalError": "external",
    "RemoteFlightError": "external",
    "CatalogError": "external",
    "GraphStoreError": "external",
    "PluginProcessError": "external",
    "DiskFullError": "external",
    "FunctionWorkerError": "external",
    "BatchTooLargeError": "input",
    "CheckpointError": "internal",
    "StorageError": "internal",
}


def _error_classes() -> list[type[errors.FlightServeError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.FlightServeError) and cls.__module__ == errors.__name__
    ]


def test_every_error_class_is_in_the_table() -> None:
    assert sorted(c.__name__ for c in _error_classes()) == sorted(DOMAIN_OF)


def _instance(cls: type[errors.FlightServeError]) -> errors.FlightServeError:
    if cls is errors.ConnectorOptionError:
        return cls("path", "is required", line=3, col=9)
    return cls("it went wrong")


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_each_error_class_maps_to_its_domains_status(cls: type[errors.FlightServeError]) -> None:
    exc = _instance(cls)
    assert exc.domain == DOMAIN_OF[cls.__name__]
    client_class, retryable = BY_DOMAIN[exc.domain]
    retryable = retryable and cls.__name__ not in NOT_RETRYABLE
    assert exc.retryable is retryable
    mapped = to_flight_error(exc, rpc="DoGet")
    assert isinstance(mapped, client_class)
    if exc.domain in ("input", "already_exists"):
        assert type(mapped) is InvalidArgument
    elif exc.domain == "not_found":
        assert type(mapped) is NotFound
    elif exc.domain == "unsupported":
        assert type(mapped) is Unimplemented
    elif exc.domain in ("overload", "external") and not retryable:
        # refused by the outside system: the same request fails the same way (no retry hint)
        assert isinstance(mapped, flight.FlightUnavailableError)
        assert mapped.extra_info == b'{"retryable": false}'
        assert str(mapped).startswith("it went wrong")
        assert "retryable" not in str(mapped)
    elif exc.domain in ("overload", "external"):
        assert isinstance(mapped, flight.FlightUnavailableError)
        assert mapped.extra_info == b'{"retryable": true}'
        assert str(mapped).startswith("it went wrong (retryable: try again after a short delay)")
    else:
        assert str(mapped).startswith("internal error ")


def test_every_domain_has_a_status() -> None:
    assert set(errors.Domain.__args__) == set(BY_DOMAIN)  # type: ignore[attr-defined]


def test_a_connector_option_error_names_the_option_and_its_position() -> None:
    exc = errors.ConnectorOptionError("rows_per_second", "must be a positive integer", 4, 12)
    assert str(exc) == "option 'rows_per_second': must be a positive integer (line 4, column 12)"
    assert (exc.option, exc.line, exc.col) == ("rows_per_second", 4, 12)


EXTERNAL = ("RemoteFlightError", "CatalogError", "GraphStoreError", "PluginProcessError",
            "DiskFullError")  # fmt: skip


@pytest.mark.parametrize("name", EXTERNAL)
def test_each_outside_failure_is_an_external_error_in_the_table(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.ExternalError)
    assert not issubclass(cls, errors.InvalidInputError)
    assert DOMAIN_OF[name] == "external"
    assert (cls.domain, cls.retryable) == ("external", True)


def test_within_keeps_the_class_and_the_cause() -> None:
    cause = OSError(111, "Connection refused")
    try:
        raise errors.RemoteFlightError("server down") from cause
    except errors.RemoteFlightError as exc:
        wrapped = exc.within("SOURCE s")
    assert type(wrapped) is errors.RemoteFlightError
    assert str(wrapped) == "SOURCE s: server down"
    assert wrapped.__cause__ is cause


@pytest.mark.parametrize(
    ("errno_", "cls"),
    [(28, errors.DiskFullError), (122, errors.DiskFullError), (5, errors.StorageError)],
)
def test_a_full_disk_is_external_and_an_io_error_is_internal(
    errno_: int, cls: type[errors.FlightServeError]
) -> None:
    import errno as errno_module

    if errno_ == 122 and getattr(errno_module, "EDQUOT", None) != 122:
        pytest.skip("EDQUOT is not 122 on this platform")
    assert type(errors.write_error("cannot append", OSError(errno_, "x"))) is cls
