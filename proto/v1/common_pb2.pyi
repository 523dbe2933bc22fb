from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    NOT_LEADER: _ClassVar[ErrorReason]
    NO_LEADER: _ClassVar[ErrorReason]
    SESSION_EXPIRED: _ClassVar[ErrorReason]
    SEQUENCE_DISCARDED: _ClassVar[ErrorReason]
    TOO_MANY_OUTSTANDING: _ClassVar[ErrorReason]
    STALE_FENCE: _ClassVar[ErrorReason]
    LEASE_NOT_FOUND: _ClassVar[ErrorReason]
    KEY_TOO_LARGE: _ClassVar[ErrorReason]
    VALUE_TOO_LARGE: _ClassVar[ErrorReason]
    NOT_AN_INTEGER: _ClassVar[ErrorReason]
    ADD_OVERFLOW: _ClassVar[ErrorReason]
    COMPACTED: _ClassVar[ErrorReason]
    MEMBER_NOT_FOUND: _ClassVar[ErrorReason]
    CLUSTER_MISMATCH: _ClassVar[ErrorReason]
    INVALID_REQUEST: _ClassVar[ErrorReason]
    JOB_NOT_FOUND: _ClassVar[ErrorReason]
    JOB_CLOSED: _ClassVar[ErrorReason]
    CONFIG_CONFLICT: _ClassVar[ErrorReason]
    NAME_TAKEN: _ClassVar[ErrorReason]
    PARTICIPANT_NOT_FOUND: _ClassVar[ErrorReason]
    STALE_ROUND: _ClassVar[ErrorReason]
    STALE_TOKEN: _ClassVar[ErrorReason]
    CHECKPOINT_NOT_FOUND: _ClassVar[ErrorReason]
    CHECKPOINT_INCOMPLETE: _ClassVar[ErrorReason]
    LIMIT_EXCEEDED: _ClassVar[ErrorReason]
    CLUSTER_VERSION: _ClassVar[ErrorReason]
    HELD_OUT: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
NOT_LEADER: ErrorReason
NO_LEADER: ErrorReason
SESSION_EXPIRED: ErrorReason
SEQUENCE_DISCARDED: ErrorReason
TOO_MANY_OUTSTANDING: ErrorReason
STALE_FENCE: ErrorReason
LEASE_NOT_FOUND: ErrorReason
KEY_TOO_LARGE: ErrorReason
VALUE_TOO_LARGE: ErrorReason
NOT_AN_INTEGER: ErrorReason
ADD_OVERFLOW: ErrorReason
COMPACTED: ErrorReason
MEMBER_NOT_FOUND: ErrorReason
CLUSTER_MISMATCH: ErrorReason
INVALID_REQUEST: ErrorReason
JOB_NOT_FOUND: ErrorReason
JOB_CLOSED: ErrorReason
CONFIG_CONFLICT: ErrorReason
NAME_TAKEN: ErrorReason
PARTICIPANT_NOT_FOUND: ErrorReason
STALE_ROUND: ErrorReason
STALE_TOKEN: ErrorReason
CHECKPOINT_NOT_FOUND: ErrorReason
CHECKPOINT_INCOMPLETE: ErrorReason
LIMIT_EXCEEDED: ErrorReason
CLUSTER_VERSION: ErrorReason
HELD_OUT: ErrorReason

class RequestHeader(_message.Message):
    __slots__ = ("session_id", "sequence", "first_unacked")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_UNACKED_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    sequence: int
    first_unacked: int
    def __init__(self, session_id: _Optional[int] = ..., sequence: _Optional[int] = ..., first_unacked: _Optional[int] = ...) -> None: ...

class Fence(_message.Message):
    __slots__ = ("lease_id", "token")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    token: int
    def __init__(self, lease_id: _Optional[int] = ..., token: _Optional[int] = ...) -> None: ...

class ResponseHeader(_message.Message):
    __slots__ = ("revision", "raft_term", "leader_id", "member_id")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    revision: int
    raft_term: int
    leader_id: int
    member_id: int
    def __init__(self, revision: _Optional[int] = ..., raft_term: _Optional[int] = ..., leader_id: _Optional[int] = ..., member_id: _Optional[int] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value", "create_revision", "mod_revision", "version", "lease_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., create_revision: _Optional[int] = ..., mod_revision: _Optional[int] = ..., version: _Optional[int] = ..., lease_id: _Optional[int] = ...) -> None: ...
