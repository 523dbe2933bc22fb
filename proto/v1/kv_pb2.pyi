from rallypoint.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchRequest(_message.Message):
    __slots__ = ("operations",)
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[BatchOperation]
    def __init__(self, operations: _Optional[_Iterable[_Union[BatchOperation, _Mapping]]] = ...) -> None: ...

class BatchOperation(_message.Message):
    __slots__ = ("id", "timeout_ms", "put", "get", "delete", "compare_and_set")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    COMPARE_AND_SET_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    put: PutRequest
    get: GetRequest
    delete: DeleteRequest
    compare_and_set: CompareAndSetRequest
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., put: _Optional[_Union[PutRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., compare_and_set: _Optional[_Union[CompareAndSetRequest, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("id", "put", "get", "delete", "error", "compare_and_set")
    ID_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COMPARE_AND_SET_FIELD_NUMBER: _ClassVar[int]
    id: int
    put: PutResponse
    get: GetResponse
    delete: DeleteResponse
    error: BatchError
    compare_and_set: CompareAndSetResponse
    def __init__(self, id: _Optional[int] = ..., put: _Optional[_Union[PutResponse, _Mapping]] = ..., get: _Optional[_Union[GetResponse, _Mapping]] = ..., delete: _Optional[_Union[DeleteResponse, _Mapping]] = ..., error: _Optional[_Union[BatchError, _Mapping]] = ..., compare_and_set: _Optional[_Union[CompareAndSetResponse, _Mapping]] = ...) -> None: ...

class BatchError(_message.Message):
    __slots__ = ("code", "message", "reason", "leader")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    leader: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., leader: _Optional[str] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("header", "key", "value", "lease_id", "fence", "prev_kv", "keep_lease")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    KEEP_LEASE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    key: bytes
    value: bytes
    lease_id: int
    fence: _common_pb2.Fence
    prev_kv: bool
    keep_lease: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., lease_id: _Optional[int] = ..., fence: _Optional[_Union[_common_pb2.Fence, _Mapping]] = ..., prev_kv: _Optional[bool] = ..., keep_lease: _Optional[bool] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("header", "kv", "prev_kv")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    kv: _common_pb2.KeyValue
    prev_kv: _common_pb2.KeyValue
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ..., prev_kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key", "serializable")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    serializable: bool
    def __init__(self, key: _Optional[bytes] = ..., serializable: _Optional[bool] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("header", "kv")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    kv: _common_pb2.KeyValue
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ...) -> None: ...

class RangeRequest(_message.Message):
    __slots__ = ("prefix", "limit", "start_after", "serializable", "keys_only")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_ONLY_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    limit: int
    start_after: bytes
    serializable: bool
    keys_only: bool
    def __init__(self, prefix: _Optional[bytes] = ..., limit: _Optional[int] = ..., start_after: _Optional[bytes] = ..., serializable: _Optional[bool] = ..., keys_only: _Optional[bool] = ...) -> None: ...

class RangeResponse(_message.Message):
    __slots__ = ("header", "kvs", "more")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KVS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    kvs: _containers.RepeatedCompositeFieldContainer[_common_pb2.KeyValue]
    more: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., kvs: _Optional[_Iterable[_Union[_common_pb2.KeyValue, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("header", "key", "prefix", "fence", "prev_kv")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    PREV_KV_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    key: bytes
    prefix: bool
    fence: _common_pb2.Fence
    prev_kv: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., prefix: _Optional[bool] = ..., fence: _Optional[_Union[_common_pb2.Fence, _Mapping]] = ..., prev_kv: _Optional[bool] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("header", "deleted", "prev_kvs")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    PREV_KVS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    deleted: int
    prev_kvs: _containers.RepeatedCompositeFieldContainer[_common_pb2.KeyValue]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., deleted: _Optional[int] = ..., prev_kvs: _Optional[_Iterable[_Union[_common_pb2.KeyValue, _Mapping]]] = ...) -> None: ...

class CompareAndSetRequest(_message.Message):
    __slots__ = ("header", "key", "value_equals", "mod_revision_equals", "must_not_exist", "value", "lease_id", "fence")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_EQUALS_FIELD_NUMBER: _ClassVar[int]
    MOD_REVISION_EQUALS_FIELD_NUMBER: _ClassVar[int]
    MUST_NOT_EXIST_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    key: bytes
    value_equals: bytes
    mod_revision_equals: int
    must_not_exist: bool
    value: bytes
    lease_id: int
    fence: _common_pb2.Fence
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., value_equals: _Optional[bytes] = ..., mod_revision_equals: _Optional[int] = ..., must_not_exist: _Optional[bool] = ..., value: _Optional[bytes] = ..., lease_id: _Optional[int] = ..., fence: _Optional[_Union[_common_pb2.Fence, _Mapping]] = ...) -> None: ...

class CompareAndSetResponse(_message.Message):
    __slots__ = ("header", "succeeded", "kv")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    succeeded: bool
    kv: _common_pb2.KeyValue
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., succeeded: _Optional[bool] = ..., kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("header", "key", "delta", "lease_id", "fence")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    key: bytes
    delta: int
    lease_id: int
    fence: _common_pb2.Fence
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., key: _Optional[bytes] = ..., delta: _Optional[int] = ..., lease_id: _Optional[int] = ..., fence: _Optional[_Union[_common_pb2.Fence, _Mapping]] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("header", "value", "kv")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    value: int
    kv: _common_pb2.KeyValue
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., value: _Optional[int] = ..., kv: _Optional[_Union[_common_pb2.KeyValue, _Mapping]] = ...) -> None: ...
