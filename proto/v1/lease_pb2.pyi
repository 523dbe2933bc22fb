from rallypoint.proto.v1 import common_pb2 as _common_pb2
from rallypoint.proto.v1 import kv_pb2 as _kv_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseGrantRequest(_message.Message):
    __slots__ = ("header", "ttl_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    ttl_ms: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class LeaseGrantResponse(_message.Message):
    __slots__ = ("header", "lease_id", "fencing_token", "ttl_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    lease_id: int
    fencing_token: int
    ttl_ms: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., lease_id: _Optional[int] = ..., fencing_token: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class LeaseKeepAliveRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class LeaseKeepAliveResponse(_message.Message):
    __slots__ = ("header", "lease_id", "ttl_ms", "error")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    lease_id: int
    ttl_ms: int
    error: _kv_pb2.BatchError
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., lease_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., error: _Optional[_Union[_kv_pb2.BatchError, _Mapping]] = ...) -> None: ...

class LeaseRevokeRequest(_message.Message):
    __slots__ = ("header", "lease_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    lease_id: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., lease_id: _Optional[int] = ...) -> None: ...

class LeaseRevokeResponse(_message.Message):
    __slots__ = ("header", "deleted_keys")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DELETED_KEYS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    deleted_keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., deleted_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LeaseListRequest(_message.Message):
    __slots__ = ("serializable",)
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    serializable: bool
    def __init__(self, serializable: _Optional[bool] = ...) -> None: ...

class LeaseStatus(_message.Message):
    __slots__ = ("lease_id", "fencing_token", "granted_ttl_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GRANTED_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    fencing_token: int
    granted_ttl_ms: int
    def __init__(self, lease_id: _Optional[int] = ..., fencing_token: _Optional[int] = ..., granted_ttl_ms: _Optional[int] = ...) -> None: ...

class LeaseListResponse(_message.Message):
    __slots__ = ("header", "leases")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    leases: _containers.RepeatedCompositeFieldContainer[LeaseStatus]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[LeaseStatus, _Mapping]]] = ...) -> None: ...

class LeaseTimeToLiveRequest(_message.Message):
    __slots__ = ("lease_id", "keys")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    keys: bool
    def __init__(self, lease_id: _Optional[int] = ..., keys: _Optional[bool] = ...) -> None: ...

class LeaseTimeToLiveResponse(_message.Message):
    __slots__ = ("header", "lease_id", "fencing_token", "granted_ttl_ms", "remaining_ttl_ms", "keys")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GRANTED_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    lease_id: int
    fencing_token: int
    granted_ttl_ms: int
    remaining_ttl_ms: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., lease_id: _Optional[int] = ..., fencing_token: _Optional[int] = ..., granted_ttl_ms: _Optional[int] = ..., remaining_ttl_ms: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...
