from rallypoint.proto.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionOpenRequest(_message.Message):
    __slots__ = ("ttl_ms",)
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    def __init__(self, ttl_ms: _Optional[int] = ...) -> None: ...

class SessionOpenResponse(_message.Message):
    __slots__ = ("header", "session_id", "ttl_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    session_id: int
    ttl_ms: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., session_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class SessionKeepAliveRequest(_message.Message):
    __slots__ = ("session_id", "first_unacked")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_UNACKED_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    first_unacked: int
    def __init__(self, session_id: _Optional[int] = ..., first_unacked: _Optional[int] = ...) -> None: ...

class SessionKeepAliveResponse(_message.Message):
    __slots__ = ("header", "ttl_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    ttl_ms: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class SessionCloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class SessionCloseResponse(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ...) -> None: ...
