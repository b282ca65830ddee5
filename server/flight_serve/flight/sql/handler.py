"""Arrow Flight SQL on top of the Flight service: what ADBC, JDBC and ODBC drivers speak.

A Flight SQL request is a ``google.protobuf.Any`` whose type URL names a message of
``schemas/arrow/flight/protocol/sql/FlightSql.proto`` (package ``arrow.flight.protocol.sql``). It
travels in a CMD descriptor (GetFlightInfo, GetSchema, DoPut), a ticket (DoGet) or an action body
(DoAction). :func:`unpack_command` recognises one; anything else is left to the plain Flight
surface of :mod:`flight_serve.flight.service` (plain SQL text in a CMD descriptor is never a
Flight SQL Any: an Any starts with byte ``0x0A`` followed by a type URL in this package).

Supported (see ``schemas/README.md``, "Flight SQL"):

========================================  =======================================================
GetFlightInfo / GetSchema                 CommandStatementQuery, CommandPreparedStatementQuery,
                                          CommandGetSqlInfo, CommandGetCatalogs,
                                          CommandGetDbSchemas, CommandGetTables,
                                          CommandGetTableTypes, CommandGetXdbcTypeInfo,
                                          CommandGetPrimaryKeys, CommandGetExportedKeys,
                                          CommandGetImportedKeys, CommandGetCrossReference
DoGet                                     TicketStatementQuery (from the statement commands), or
                                          the metadata command itself (its FlightInfo's ticket)
DoPut                                     CommandStatementUpdate, CommandPreparedStatementUpdate,
                                          CommandPreparedStatementQuery (binds parameters; the
                                          PutResult carries DoPutPreparedStatementResult with the
                                          new handle), CommandStatementIngest
DoAction                                  CreatePreparedStatement, ClosePreparedStatement
========================================  =======================================================

Transactions, savepoints and Substrait plans are UNIMPLEMENTED (and GetSqlInfo says so); a
``transaction_id`` in a request is refused. A client cancels a running query by cancelling its
DoGet call, or with the ``CancelFlightInfo`` / ``CancelQuery`` actions (served by
:mod:`flight_serve.flight.cancel`): the query stops at the next batch.

Handles are self-contained protobuf messages (``schemas/flight_serve/v1/flightsql.proto``): a
prepared statement handle holds the SQL and the bound parameters, a statement handle holds the
planned query ticket (or, for a data-changing statement sent as a query, its row count). No
server state, so ClosePreparedStatement has nothing to free and handles survive restarts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata as importlib_metadata
from typing import Any, Final

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from flight_serve._arrow import ipc_bytes, read_ipc_table
from flight_serve._proto.arrow.flight.protocol.sql import FlightSql_pb2 as sql_pb2
from flight_serve._proto.flight_serve.v1 import flightsql_pb2
from flight_serve.errors import InvalidInputError, TicketError, UnsupportedError
from flight_serve.flight.ops.roles import require_role
from flight_serve.flight.sql import metadata as md
from flight_serve.flight.sql.catalog import iceberg_namespaces, iceberg_tables
from flight_serve.flight.sql.engine import UPDATE_COUNT_SCHEMA, IngestMode, SqlEngine
from flight_serve.flight.sql.statement import Statement
from flight_serve.flight.status import to_flight_error
from flight_serve.flight.tickets import QueryTicket, decode_ticket, encode_ticket
from flight_serve.store import StreamStore

__all__ = [
    "FLIGHT_SQL_ACTIONS",
    "TYPE_URL_PREFIX",
    "FlightSqlHandler",
    "flightsql_command",
    "pack",
    "unpack_command",
]

log = logging.getLogger("flight_serve.flight")

#: Type URL prefix of every Flight SQL message.
TYPE_URL_PREFIX: Final = "type.googleapis.com/arrow.flight.protocol.sql."

#: The version of flight-serve's own handle messages.
HANDLE_VERSION: Final = 1

_MAX_TABLE_NAME_LENGTH: Final = 200  # flight_serve.store.validate_stream_name

_MESSAGES: Final[dict[str, type[Message]]] = {
    name: getattr(sql_pb2, name)
    for name in (
        "CommandGetSqlInfo",
        "CommandGetXdbcTypeInfo",
        "CommandGetCatalogs",
        "CommandGetDbSchemas",
        "CommandGetTables",
        "CommandGetTableTypes",
        "CommandGetPrimaryKeys",
        "CommandGetExportedKeys",
        "CommandGetImportedKeys",
        "CommandGetCrossReference",
        "CommandStatementQuery",
        "CommandStatementSubstraitPlan",
        "CommandPreparedStatementQuery",
        "CommandStatementUpdate",
        "CommandPreparedStatementUpdate",
        "CommandStatementIngest",
        "TicketStatementQuery",
        "ActionCreatePreparedStatementRequest",
        "ActionCreatePreparedSubstraitPlanRequest",
        "ActionClosePreparedStatementRequest",
        "ActionBeginTransactionRequest",
        "ActionBeginSavepointRequest",
        "ActionEndTransactionRequest",
        "ActionEndSavepointRequest",
        "ActionCancelQueryRequest",
    )
}

_NO_TRANSACTIONS: Final = (
    "Flight SQL: unsupported: transactions are not supported (every statement commits on its own)."
)
_NO_SESSIONS: Final = "Flight sessions: unsupported: flight-serve keeps no session state."

#: Flight SQL action types and their ListActions descriptions.
FLIGHT_SQL_ACTIONS: Final = {
    "CreatePreparedStatement": (
        "Flight SQL: prepare a statement. Body: Any(ActionCreatePreparedStatementRequest). "
        "Result: Any(ActionCreatePreparedStatementResult)."
    ),
    "ClosePreparedStatement": (
        "Flight SQL: close a prepared statement (handles hold no server state). "
        "Body: Any(ActionClosePreparedStatementRequest)."
    ),
    "CreatePreparedSubstraitPlan": "Flight SQL: unsupported: Substrait plans are not supported.",
    "BeginTransaction": _NO_TRANSACTIONS,
    "EndTransaction": _NO_TRANSACTIONS,
    "BeginSavepoint": _NO_TRANSACTIONS,
    "EndSavepoint": _NO_TRANSACTIONS,
    "CloseSession": _NO_SESSIONS,
    "GetSessionOptions": _NO_SESSIONS,
    "SetSessionOptions": _NO_SESSIONS,
}

_INGEST = sql_pb2.CommandStatementIngest.TableDefinitionOptions
_IF_NOT_EXIST: Final = {
    _INGEST.TABLE_NOT_EXIST_OPTION_CREATE: "create",
    _INGEST.TABLE_NOT_EXIST_OPTION_FAIL: "fail",
}
_IF_EXISTS: Final = {
    _INGEST.TABLE_EXISTS_OPTION_FAIL: "fail",
    _INGEST.TABLE_EXISTS_OPTION_APPEND: "append",
    _INGEST.TABLE_EXISTS_OPTION_REPLACE: "replace",
}


def pack(message: Message) -> bytes:
    """Serialize ``message`` wrapped in a ``google.protobuf.Any`` (how Flight SQL sends it)."""
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    data: bytes = wrapper.SerializeToString()
    return data


def unpack_command(data: bytes | None) -> Message | None:
    """Return the Flight SQL message packed in ``data`` (a CMD descriptor's command, a ticket or
    an action body), or ``None`` when ``data`` is not a Flight SQL ``Any``.

    Raises:
        UnsupportedError: a Flight SQL message flight-serve does not know.
        InvalidInputError: a known message whose bytes do not decode.

    >>> unpack_command(b"SELECT 1") is None
    True
    >>> type(unpack_command(pack(sql_pb2.CommandGetCatalogs()))).__name__
    'CommandGetCatalogs'
    """
    if not data or data[0] != 0x0A:  # field 1 (type_url), length-delimited
        return None
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        return None
    if not wrapper.type_url.startswith(TYPE_URL_PREFIX):
        return None
    name = wrapper.type_url[len(TYPE_URL_PREFIX) :]
    message_class = _MESSAGES.get(name)
    if message_class is None:
        raise UnsupportedError(f"Flight SQL {name} is not supported by flight-serve")
    message = message_class()
    try:
        message.ParseFromString(wrapper.value)
    except DecodeError:
        raise InvalidInputError(f"malformed Flight SQL {name}") from None
    return message


def flightsql_command(descriptor: flight.FlightDescriptor) -> Message | None:
    """The Flight SQL message in a CMD descriptor, or ``None`` (a path descriptor, or plain SQL
    text); see :func:`unpack_command` for the errors."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        return None
    return unpack_command(descriptor.command)


def _read_ipc_stream(data: bytes) -> pa.Table | None:
    if not data:
        return None
    try:
        return read_ipc_table(data)
    except pa.ArrowInvalid as exc:
        raise TicketError(f"malformed parameters in a Flight SQL handle: {exc}") from None


def _no_transaction(request: Any) -> None:
    if request.HasField("transaction_id"):
        raise UnsupportedError("transactions are not supported: every statement commits on its own")


def _server_version() -> str:
    try:
        return importlib_metadata.version("flight-serve")
    except importlib_metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        return "unknown"


def _read_parameters(reader: flight.MetadataRecordBatchReader) -> pa.Table | None:
    """The parameter rows a DoPut uploaded, or ``None`` when it sent no schema or no rows."""
    try:
        table = reader.read_all()
    except pa.ArrowInvalid:
        return None  # the client closed without sending a schema
    return table if table.num_rows else None


class FlightSqlHandler:
    """Serves the Flight SQL commands and actions over a stream store.

    The Flight service calls it for requests that :func:`unpack_command` recognises; it raises
    flight-serve errors, which the service maps to Flight statuses (a lazily produced DoGet
    stream maps its own). :meth:`register_actions` adds the Flight SQL actions to the service.

    Args:
        store: the streams; each is a table (see :mod:`flight_serve.flight.sql.metadata`).
    """

    def __init__(self, store: StreamStore) -> None:
        self.store = store
        self.engine = SqlEngine(store)
        self._sql_info = md.sql_info_values(
            _server_version(), max_table_name_length=_MAX_TABLE_NAME_LENGTH
        )
        self._lock = threading.Lock()
        self._active_streams = 0

    @property
    def active_streams(self) -> int:
        """Statement results being streamed right now (DoGet calls that have not ended)."""
        with self._lock:
            return self._active_streams

    def register_actions(
        self,
        register: Callable[
            [str, str, Callable[[flight.ServerCallContext, bytes], Iterable[bytes]]], None
        ],
    ) -> None:
        """Register the Flight SQL actions with ``register(type, description, handler)``."""
        for action_type, description in FLIGHT_SQL_ACTIONS.items():
            register(action_type, description, self._action_handler(action_type))

    # --- GetFlightInfo / GetSchema -----------------------------------------------------------

    def get_flight_info(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        command: Message,
    ) -> flight.FlightInfo:
        """Plan ``command`` and return its FlightInfo: the result schema and one endpoint whose
        ticket DoGet accepts. A data-changing statement sent as a query runs here."""
        if isinstance(
            command, sql_pb2.CommandStatementQuery | sql_pb2.CommandPreparedStatementQuery
        ):
            schema, handle, records = self._plan_statement(context, command)
            ticket = pack(sql_pb2.TicketStatementQuery(statement_handle=handle))
            endpoint = flight.FlightEndpoint(ticket, [])
            return flight.FlightInfo(schema, descriptor, [endpoint], records, -1)
        schema = self._metadata_schema(command)
        endpoint = flight.FlightEndpoint(descriptor.command or b"", [])
        return flight.FlightInfo(schema, descriptor, [endpoint], -1, -1)

    def get_schema(self, context: flight.ServerCallContext, command: Message) -> pa.Schema:
        """The schema GetFlightInfo would announce, without running anything."""
        if isinstance(command, sql_pb2.CommandStatementQuery):
            _no_transaction(command)
            return self._statement_schema(command.query, None)
        if isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            prepared = self._decode_prepared(command.prepared_statement_handle)
            return self._statement_schema(prepared.sql, _read_ipc_stream(prepared.parameters))
        return self._metadata_schema(command)

    def _statement_schema(self, sql: str, params: pa.Table | None) -> pa.Schema:
        statement = Statement.parse(sql)
        info = self.engine.prepare(statement)
        if info.kind != "query":
            return UPDATE_COUNT_SCHEMA
        schema, _ = self.engine.plan_query(statement, params)
        return schema

    def _plan_statement(
        self, context: flight.ServerCallContext, command: Message
    ) -> tuple[pa.Schema, bytes, int]:
        if isinstance(command, sql_pb2.CommandStatementQuery):
            _no_transaction(command)
            sql, params_bytes = command.query, b""
        else:
            prepared = self._decode_prepared(command.prepared_statement_handle)
            sql, params_bytes = prepared.sql, prepared.parameters
        params = _read_ipc_stream(params_bytes)
        statement = Statement.parse(sql)
        info = self.engine.prepare(statement)
        handle = flightsql_pb2.SqlStatementHandle(version=HANDLE_VERSION)
        if info.kind != "query":
            role = self.engine.required_role(statement)
            require_role(context, role, f"Flight SQL {info.kind.upper()} (sent as a query)")
            count = self.engine.execute_update(statement, params)
            handle.update_count.record_count = count
            return UPDATE_COUNT_SCHEMA, handle.SerializeToString(), 1
        schema, ticket = self.engine.plan_query(statement, params)
        handle.query.ticket = encode_ticket(ticket)
        handle.query.parameters = params_bytes
        return schema, handle.SerializeToString(), -1

    def _metadata_schema(self, command: Message) -> pa.Schema:
        if isinstance(command, sql_pb2.CommandGetSqlInfo):
            return md.SQL_INFO_SCHEMA
        if isinstance(command, sql_pb2.CommandGetCatalogs):
            return md.CATALOGS_SCHEMA
        if isinstance(command, sql_pb2.CommandGetDbSchemas):
            return md.DB_SCHEMAS_SCHEMA
        if isinstance(command, sql_pb2.CommandGetTables):
            return md.TABLES_WITH_SCHEMA_SCHEMA if command.include_schema else md.TABLES_SCHEMA
        if isinstance(command, sql_pb2.CommandGetTableTypes):
            return md.TABLE_TYPES_SCHEMA
        if isinstance(command, sql_pb2.CommandGetXdbcTypeInfo):
            return md.XDBC_TYPE_INFO_SCHEMA
        if isinstance(command, sql_pb2.CommandGetPrimaryKeys):
            return md.PRIMARY_KEYS_SCHEMA
        if isinstance(
            command,
            sql_pb2.CommandGetExportedKeys
            | sql_pb2.CommandGetImportedKeys
            | sql_pb2.CommandGetCrossReference,
        ):
            return md.CROSS_REFERENCE_SCHEMA
        raise self._unsupported(command, "GetFlightInfo")

    @staticmethod
    def _unsupported(command: Message, rpc: str) -> UnsupportedError:
        name = command.DESCRIPTOR.name
        if name == "CommandStatementSubstraitPlan":
            return UnsupportedError("Substrait plans are not supported; send SQL")
        return UnsupportedError(f"Flight SQL {name} is not supported in {rpc}")

    # --- DoGet -------------------------------------------------------------------------------

    def do_get(
        self, context: flight.ServerCallContext, command: Message
    ) -> flight.FlightDataStream:
        """Stream the result a ticket names (a statement or a metadata command)."""
        if isinstance(command, sql_pb2.TicketStatementQuery):
            schema, batches = self._statement_result(context, command.statement_handle)
            return flight.GeneratorStream(schema, self._counted(_guarded(batches)))
        table = self._metadata_table(command)
        return flight.RecordBatchStream(table)

    def _counted(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with self._lock:
            self._active_streams += 1
        try:
            yield from batches
        finally:
            with self._lock:
                self._active_streams -= 1

    def _statement_result(
        self, context: flight.ServerCallContext, data: bytes
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        handle = flightsql_pb2.SqlStatementHandle()
        try:
            handle.ParseFromString(data)
        except DecodeError:
            raise TicketError("malformed Flight SQL statement handle") from None
        if handle.version != HANDLE_VERSION:
            raise TicketError(f"unknown Flight SQL statement handle version {handle.version}")
        kind = handle.WhichOneof("kind")
        if kind == "update_count":
            row = pa.record_batch(
                [pa.array([handle.update_count.record_count], pa.int64())],
                schema=UPDATE_COUNT_SCHEMA,
            )
            return UPDATE_COUNT_SCHEMA, iter([row])
        if kind != "query":
            raise TicketError("a Flight SQL statement handle that names nothing")
        ticket = decode_ticket(handle.query.ticket)
        if not isinstance(ticket, QueryTicket):
            raise TicketError("a Flight SQL statement handle must hold a query ticket")
        params = _read_ipc_stream(handle.query.parameters)
        return self.engine.open_query(ticket, params, context.is_cancelled)

    def _metadata_table(self, command: Message) -> pa.Table:
        if isinstance(command, sql_pb2.CommandGetSqlInfo):
            return md.sql_info_table(self._sql_info, list(command.info))
        if isinstance(command, sql_pb2.CommandGetCatalogs):
            return md.catalogs_table()
        if isinstance(command, sql_pb2.CommandGetDbSchemas):
            return md.db_schemas_table(
                command.catalog if command.HasField("catalog") else None,
                command.db_schema_filter_pattern
                if command.HasField("db_schema_filter_pattern")
                else None,
                iceberg_namespaces(self.store.data_dir),  # the embedded Iceberg catalog's
            )
        if isinstance(command, sql_pb2.CommandGetTables):
            return md.tables_table(
                [md.TableEntry(i.name, i.schema) for i in self.store.list_streams()]
                + [
                    md.TableEntry(name, schema, namespace)
                    for namespace, name, schema in iceberg_tables(
                        self.store.data_dir, with_schemas=command.include_schema
                    )
                ],
                catalog=command.catalog if command.HasField("catalog") else None,
                schema_pattern=command.db_schema_filter_pattern
                if command.HasField("db_schema_filter_pattern")
                else None,
                table_pattern=command.table_name_filter_pattern
                if command.HasField("table_name_filter_pattern")
                else None,
                table_types=list(command.table_types),
                include_schema=command.include_schema,
            )
        if isinstance(command, sql_pb2.CommandGetTableTypes):
            return md.table_types_table()
        if isinstance(command, sql_pb2.CommandGetXdbcTypeInfo):
            return md.xdbc_type_info_table(
                command.data_type if command.HasField("data_type") else None
            )
        return md.empty_keys_table(self._metadata_schema(command))

    # --- DoPut -------------------------------------------------------------------------------

    def do_put(
        self,
        context: flight.ServerCallContext,
        command: Message,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """Run an update, bind parameters, or bulk-ingest; write one PutResult."""
        if isinstance(command, sql_pb2.CommandStatementUpdate):
            _no_transaction(command)
            statement = Statement.parse(command.query)
            self._require_update_role(context, statement)
            count = self.engine.execute_update(statement, None, context.is_cancelled)
            self._write_count(writer, count)
        elif isinstance(command, sql_pb2.CommandPreparedStatementUpdate):
            prepared = self._decode_prepared(command.prepared_statement_handle)
            statement = Statement.parse(prepared.sql)
            self._require_update_role(context, statement)
            params = _read_parameters(reader)
            if params is None:
                params = _read_ipc_stream(prepared.parameters)
            count = self.engine.execute_update(statement, params, context.is_cancelled)
            self._write_count(writer, count)
        elif isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            require_role(context, "read", "Flight SQL binding a prepared query's parameters")
            prepared = self._decode_prepared(command.prepared_statement_handle)
            params = _read_parameters(reader)
            if params is not None:  # refused when bound, not only when run (nothing parsed)
                Statement.parse(prepared.sql).check_parameters(params)
            prepared.parameters = (
                ipc_bytes(params.schema, params.to_batches()) if params is not None else b""
            )
            result = sql_pb2.DoPutPreparedStatementResult(
                prepared_statement_handle=prepared.SerializeToString()
            )
            writer.write(pa.py_buffer(result.SerializeToString()))
        elif isinstance(command, sql_pb2.CommandStatementIngest):
            count = self._ingest(context, command, reader)
            self._write_count(writer, count)
        else:
            raise self._unsupported(command, "DoPut")

    def _require_update_role(self, context: flight.ServerCallContext, statement: Statement) -> None:
        role = self.engine.required_role(statement)
        require_role(context, role, "a Flight SQL query" if role == "read" else "this statement")

    @staticmethod
    def _write_count(writer: flight.FlightMetadataWriter, count: int) -> None:
        result = sql_pb2.DoPutUpdateResult(record_count=count)
        writer.write(pa.py_buffer(result.SerializeToString()))

    def _ingest(
        self,
        context: flight.ServerCallContext,
        command: Any,
        reader: flight.MetadataRecordBatchReader,
    ) -> int:
        _no_transaction(command)
        if command.temporary:
            raise UnsupportedError("temporary tables are not supported")
        if command.HasField("catalog") and command.catalog not in ("", md.CATALOG):
            raise InvalidInputError(f"unknown catalog {command.catalog!r}; use {md.CATALOG!r}")
        if command.HasField("schema") and command.schema not in ("", md.DB_SCHEMA):
            raise InvalidInputError(f"unknown schema {command.schema!r}; use {md.DB_SCHEMA!r}")
        options = command.table_definition_options
        if_not_exist = _IF_NOT_EXIST.get(options.if_not_exist)
        if_exists = _IF_EXISTS.get(options.if_exists)
        if if_not_exist is None or if_exists is None:
            raise InvalidInputError(
                "CommandStatementIngest needs table_definition_options.if_not_exist and "
                ".if_exists (UNSPECIFIED is not allowed)"
            )
        mode: IngestMode = (if_not_exist, if_exists)  # type: ignore[assignment]
        replaces = if_exists == "replace" and self.store.exists(command.table)
        require_role(
            context,
            "admin" if replaces else "write",
            "bulk ingest replacing an existing table" if replaces else "bulk ingest",
        )
        batches = (chunk.data for chunk in reader if chunk.data is not None)
        return self.engine.ingest(command.table, reader.schema, batches, mode, context.is_cancelled)

    # --- actions -----------------------------------------------------------------------------

    def _action_handler(
        self, action_type: str
    ) -> Callable[[flight.ServerCallContext, bytes], Iterable[bytes]]:
        def handle(context: flight.ServerCallContext, body: bytes) -> Iterable[bytes]:
            request = unpack_command(body)
            if action_type == "CreatePreparedStatement":
                if not isinstance(request, sql_pb2.ActionCreatePreparedStatementRequest):
                    raise InvalidInputError(
                        "CreatePreparedStatement needs Any(ActionCreatePreparedStatementRequest)"
                    )
                return [self._create_prepared(request)]
            if action_type == "ClosePreparedStatement":
                if not isinstance(request, sql_pb2.ActionClosePreparedStatementRequest):
                    raise InvalidInputError(
                        "ClosePreparedStatement needs Any(ActionClosePreparedStatementRequest)"
                    )
                self._decode_prepared(request.prepared_statement_handle)
                return []
            raise UnsupportedError(f"{action_type}: {FLIGHT_SQL_ACTIONS[action_type]}")

        return handle

    def _create_prepared(self, request: Any) -> bytes:
        _no_transaction(request)
        info = self.engine.prepare(Statement.parse(request.query))
        handle = flightsql_pb2.SqlPreparedStatement(version=HANDLE_VERSION, sql=request.query)
        result = sql_pb2.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle.SerializeToString()
        )
        if info.dataset_schema is not None:
            result.dataset_schema = info.dataset_schema.serialize().to_pybytes()
        if info.parameter_schema is not None:
            result.parameter_schema = info.parameter_schema.serialize().to_pybytes()
        return pack(result)

    @staticmethod
    def _decode_prepared(data: bytes) -> Any:
        handle = flightsql_pb2.SqlPreparedStatement()
        try:
            handle.ParseFromString(data)
        except DecodeError:
            raise TicketError("malformed prepared statement handle") from None
        if handle.version != HANDLE_VERSION:
            raise TicketError(f"unknown prepared statement handle version {handle.version}")
        return handle


def _guarded(items: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Re-raise errors from a lazily produced DoGet stream as Flight statuses."""
    try:
        yield from items
    except Exception as exc:
        raise to_flight_error(exc, rpc="DoGet") from None
