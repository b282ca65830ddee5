from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Ticket(_message.Message):
    __slots__ = ("version", "query", "stream_range", "tail")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    STREAM_RANGE_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    version: int
    query: QueryTicket
    stream_range: StreamRangeTicket
    tail: TailTicket
    def __init__(self, version: _Optional[int] = ..., query: _Optional[_Union[QueryTicket, _Mapping]] = ..., stream_range: _Optional[_Union[StreamRangeTicket, _Mapping]] = ..., tail: _Optional[_Union[TailTicket, _Mapping]] = ...) -> None: ...

class StreamPin(_message.Message):
    __slots__ = ("stream", "incarnation", "stop_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STOP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    incarnation: str
    stop_offset: int
    def __init__(self, stream: _Optional[str] = ..., incarnation: _Optional[str] = ..., stop_offset: _Optional[int] = ...) -> None: ...

class QueryTicket(_message.Message):
    __slots__ = ("sql", "streams")
    SQL_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    sql: str
    streams: _containers.RepeatedCompositeFieldContainer[StreamPin]
    def __init__(self, sql: _Optional[str] = ..., streams: _Optional[_Iterable[_Union[StreamPin, _Mapping]]] = ...) -> None: ...

class StreamRangeTicket(_message.Message):
    __slots__ = ("stream", "incarnation", "start_offset", "stop_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STOP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    incarnation: str
    start_offset: int
    stop_offset: int
    def __init__(self, stream: _Optional[str] = ..., incarnation: _Optional[str] = ..., start_offset: _Optional[int] = ..., stop_offset: _Optional[int] = ...) -> None: ...

class TailTicket(_message.Message):
    __slots__ = ("stream", "incarnation", "start_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    incarnation: str
    start_offset: int
    def __init__(self, stream: _Optional[str] = ..., incarnation: _Optional[str] = ..., start_offset: _Optional[int] = ...) -> None: ...
