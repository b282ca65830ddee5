from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SqlStatementHandle(_message.Message):
    __slots__ = ("version", "query", "update_count")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_COUNT_FIELD_NUMBER: _ClassVar[int]
    version: int
    query: SqlQuery
    update_count: SqlUpdateCount
    def __init__(self, version: _Optional[int] = ..., query: _Optional[_Union[SqlQuery, _Mapping]] = ..., update_count: _Optional[_Union[SqlUpdateCount, _Mapping]] = ...) -> None: ...

class SqlQuery(_message.Message):
    __slots__ = ("ticket", "parameters")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    ticket: bytes
    parameters: bytes
    def __init__(self, ticket: _Optional[bytes] = ..., parameters: _Optional[bytes] = ...) -> None: ...

class SqlUpdateCount(_message.Message):
    __slots__ = ("record_count",)
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    record_count: int
    def __init__(self, record_count: _Optional[int] = ...) -> None: ...

class SqlPreparedStatement(_message.Message):
    __slots__ = ("version", "sql", "parameters")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    version: int
    sql: str
    parameters: bytes
    def __init__(self, version: _Optional[int] = ..., sql: _Optional[str] = ..., parameters: _Optional[bytes] = ...) -> None: ...
