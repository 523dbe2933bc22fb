from rallypoint.proto.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotSaveRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotSaveResponse(_message.Message):
    __slots__ = ("header", "chunk", "index", "total_bytes")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    chunk: bytes
    index: int
    total_bytes: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., index: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...
