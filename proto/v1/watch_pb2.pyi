from rallypoint.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT: _ClassVar[EventType]
    DELETE: _ClassVar[EventType]
PUT: EventType
DELETE: EventType

class WatchRequest(_message.Message):
    __slots__ = ("key", "prefix", "start_revision", "prev_kv", "progress_interval_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    prefix: bool
    start_revision: int
    prev_kv: bool
    progress_interval_ms: int
    def __init__(self, key: _Optional[bytes] = ..., prefix: _Optional[bool] = ..., start_revision: _Optional[int] = ..., prev_kv: _Optional[bool] = ..., progress_interval_ms: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("type", "kv", "prev_revision", "prev_kv")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    PREV_REVISION_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    type: EventType
    kv: _common_pb2.KeyValue
    prev_revision: int
    prev_kv: _common_pb2.KeyValue
    def __init__(self, type: _Optional[_Union[EventType, str]] = ..., kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ..., prev_revision: _Optional[int] = ..., prev_kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("header", "events", "compact_revision", "fragment")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    COMPACT_REVISION_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    events: _containers.RepeatedCompositeFieldContainer[Event]
    compact_revision: int
    fragment: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., compact_revision: _Optional[int] = ..., fragment: _Optional[bool] = ...) -> None: ...
