"""One error root for flight-serve, grouped by area.

Every error raised on purpose by flight-serve derives from :class:`FlightServeError`. Each class
carries a ``domain`` (``"input"``, ``"not_found"``, ``"already_exists"``, ``"unsupported"``,
``"overload"``, ``"external"``, ``"internal"``) and a
``retryable`` hint. The Flight layer maps domains to Flight status codes in exactly one function
(``flight_serve.flight.status.to_flight_error``); nothing else decides a status code.

DataFusion raises generic exceptions; they are wrapped at the engine edge into
:class:`QueryError` (bad SQL, unknown column) so a user mistake is never reported as INTERNAL.
"""

from __future__ import annotations

import errno
from typing import ClassVar, Literal

Domain = Literal[
    "input", "not_found", "already_exists", "unsupported", "overload", "external", "internal"
]


class FlightServeError(Exception):
    """Root of every flight-serve error.

    Attributes:
        domain: which class of failure this is; decides the Flight status code.
        retryable: whether the same request may succeed if sent again unchanged.
    """

    domain: ClassVar[Domain] = "internal"
    retryable: ClassVar[bool] = False


# --- bad input (INVALID_ARGUMENT) -------------------------------------------------------------


class InvalidInputError(FlightServeError):
    """The request itself is wrong; sending it again unchanged fails again."""

    domain: ClassVar[Domain] = "input"


class SchemaMismatchError(InvalidInputError):
    """A batch's schema differs from the stream's schema.

    The message names each missing, unexpected or retyped field.
    """


class QueryError(InvalidInputError):
    """SQL that cannot be parsed or planned; the message is the parser's or planner's own."""


class PipelineSQLError(InvalidInputError):
    """Pipeline or windowed-query SQL that flight-serve cannot run.

    Attributes:
        line: 1-based line of the offending token, when known.
        col: 1-based column of the offending token, when known.
    """

    def __init__(self, message: str, line: int | None = None, col: int | None = None) -> None:
        where = f" (line {line}, column {col})" if line is not None and col is not None else ""
        super().__init__(f"{message}{where}")
        self.line = line
        self.col = col


class IncompatibleUpdateError(InvalidInputError):
    """``pipelines update`` with a text whose stateful operators (windows, keys, aggregates,
    sources) differ from the running version's: its checkpoint cannot resume the new one. The
    message has one line per operator that differs; the running version is unchanged."""


class TicketError(InvalidInputError):
    """A ticket that is malformed, of an unknown version, or stale (its stream was dropped)."""


class EventTimeError(InvalidInputError):
    """The event-time column is missing or is not an Arrow timestamp."""


class StreamNameError(InvalidInputError):
    """A stream name that is empty, too long, or holds characters outside ``[A-Za-z0-9_.-]``."""


class ConnectorError(InvalidInputError):
    """A connector option is invalid, or a connector's files cannot be found, read or written;
    the message names the option or the file."""


class ConnectorOptionError(ConnectorError):
    """One connector option (``WITH (key = value)``) is missing, unknown or has a bad value.

    Attributes:
        option: the option's key, as the user wrote it.
        reason: what is wrong with it (the message without the option and position).
        line: 1-based line of the option in the pipeline SQL, when known.
        col: 1-based column of the option in the pipeline SQL, when known.
    """

    def __init__(
        self, option: str, message: str, line: int | None = None, col: int | None = None
    ) -> None:
        where = f" (line {line}, column {col})" if line is not None and col is not None else ""
        super().__init__(f"option {option!r}: {message}{where}")
        self.option = option
        #: the message without the option and position
        self.reason = message
        self.line = line
        self.col = col


class FunctionDefinitionError(InvalidInputError):
    """A ``CREATE FUNCTION`` that cannot be registered: a syntax error in its Python body, a
    missing handler, a missing file, a WebAssembly module without the export or with another
    signature. Refused at submit, nothing registered; the message names the function and, when
    known, the pipeline file's line."""


class FunctionCallError(InvalidInputError):
    """A user function failed on a batch: it raised, trapped (WebAssembly), exceeded its deadline
    or memory limit, or returned the wrong type or length. The message names the function, and
    for a wrong result the expected and the returned type or length."""


class ActionError(InvalidInputError):
    """An unknown action type or a malformed action body."""


# --- missing (NOT_FOUND) ----------------------------------------------------------------------


class NotFoundError(FlightServeError):
    """A named thing (stream, table, pipeline) does not exist."""

    domain: ClassVar[Domain] = "not_found"


class StreamNotFoundError(NotFoundError):
    """No stream has this name."""


# --- conflicts (ALREADY_EXISTS) ---------------------------------------------------------------


class AlreadyExistsError(FlightServeError):
    """Creating something that already exists."""

    domain: ClassVar[Domain] = "already_exists"


# --- unsupported (UNIMPLEMENTED) ----------------------------------------------------------------


class UnsupportedError(FlightServeError):
    """A well-formed request for something flight-serve does not implement (a Flight SQL
    transaction, a Substrait plan); the message says what to do instead."""

    domain: ClassVar[Domain] = "unsupported"


# --- overload (UNAVAILABLE, retry later) ------------------------------------------------------


class OverloadError(FlightServeError):
    """A limit was reached; retry after a delay."""

    domain: ClassVar[Domain] = "overload"
    retryable: ClassVar[bool] = True


# --- something outside flight-serve failed (UNAVAILABLE) --------------------------------------


class ExternalError(FlightServeError):
    """Something outside flight-serve failed: a remote Flight server down or refusing, an
    Iceberg catalog or a FalkorDB server unreachable, a disk full, a peer's error. The request
    was fine; it may succeed later (``retryable``), so it maps to UNAVAILABLE. The message names
    the outside system and what it said.

    Connectors raise a subclass of their own (see ``connectors/``); the domain comes from
    Arroyo's ``ErrorDomain::External`` (ArroyoSystems/arroyo:crates/arroyo-rpc/src/errors.rs).
    """

    domain: ClassVar[Domain] = "external"
    retryable: ClassVar[bool] = True

    def within(self, prefix: str) -> ExternalError:
        """The same error (same class, same cause) with ``prefix: `` before its message, for a
        caller that names where it happened (``SOURCE s``) without turning it into bad input."""
        wrapped = type(self)(f"{prefix}: {self}")
        wrapped.__cause__ = self.__cause__ if self.__cause__ is not None else self
        return wrapped


class ExternalRefusalError(ExternalError):
    """An outside system answered but refused flight-serve itself: a missing or wrong
    credential (a Ray cluster's token), a client it does not accept. The same request fails
    the same way until the server's configuration changes, so it is not ``retryable``; it
    still maps to UNAVAILABLE (the request was fine), without the retry hint. The message says
    what to set."""

    retryable: ClassVar[bool] = False


class RemoteFlightError(ExternalError):
    """A remote Flight server (the ``flight`` connector's) is down, unreachable, timed out or
    failed a call with a server-side status; the message names the server and the stream."""


class CatalogError(ExternalError):
    """An Iceberg catalog cannot be reached, or a table operation (load, create, commit, a read
    of its files) failed in the catalog or its storage; the message names the catalog or
    table."""


class GraphStoreError(ExternalError):
    """The FalkorDB (redis) server cannot be reached or dropped the connection; a query it
    refused because of the query's own content stays a :class:`ConnectorError`."""


class PluginProcessError(ExternalError):
    """A plugin process died, could not be reached, or failed the exchange with an error of its
    own; the message names the plugin and its instance."""


class DiskFullError(ExternalError):
    """A write failed because the disk is full or its quota is spent (``ENOSPC``, ``EDQUOT``):
    nothing is wrong with the request, and it can succeed once space is freed."""


class FunctionWorkerError(ExternalError):
    """A user function's worker (a sandboxed Python process) died, timed out while starting or
    broke the exchange protocol; the batch may be retried on another worker. The message names
    the function and the worker."""


# --- input too large (INVALID_ARGUMENT) ---------------------------------------------------------


class BatchTooLargeError(InvalidInputError):
    """One batch exceeds the server's maximum batch size; the message names the limit in bytes."""


# --- storage and internal ---------------------------------------------------------------------


class CheckpointError(FlightServeError):
    """A checkpoint or snapshot that cannot be read, or does not fit the pipeline restoring it;
    the message says what differs and how to start fresh."""

    domain: ClassVar[Domain] = "internal"


class StorageError(FlightServeError):
    """The stream store could not read or write its files."""

    domain: ClassVar[Domain] = "internal"


#: the ``errno`` values that mean "no space left" (a full disk, a spent quota)
_NO_SPACE: frozenset[int] = frozenset(
    {errno.ENOSPC, *((errno.EDQUOT,) if hasattr(errno, "EDQUOT") else ())}
)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (an ``OSError``, or pyarrow's ``ArrowIOError`` which is one) says the
    disk is full or the quota spent (``ENOSPC``, ``EDQUOT``). ``EIO`` is not: the disk itself
    failed, and a write after a failed ``fsync`` cannot be trusted to succeed later."""
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def write_error(message: str, exc: OSError) -> StorageError | DiskFullError:
    """``message`` as a :class:`DiskFullError` when ``exc`` says the disk is full
    (:func:`is_disk_full`: retryable once space is freed, UNAVAILABLE), else as a
    :class:`StorageError` (``EIO`` and the rest: INTERNAL)."""
    return DiskFullError(message) if is_disk_full(exc) else StorageError(message)
