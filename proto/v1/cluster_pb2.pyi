from rallypoint.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RaftRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FOLLOWER: _ClassVar[RaftRole]
    CANDIDATE: _ClassVar[RaftRole]
    LEADER: _ClassVar[RaftRole]
    PRE_CANDIDATE: _ClassVar[RaftRole]
    LEARNER: _ClassVar[RaftRole]

class ProgressState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE: _ClassVar[ProgressState]
    REPLICATE: _ClassVar[ProgressState]
    SNAPSHOT: _ClassVar[ProgressState]
FOLLOWER: RaftRole
CANDIDATE: RaftRole
LEADER: RaftRole
PRE_CANDIDATE: RaftRole
LEARNER: RaftRole
PROBE: ProgressState
REPLICATE: ProgressState
SNAPSHOT: ProgressState

class Member(_message.Message):
    __slots__ = ("id", "name", "peer_address", "client_address", "is_learner")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    peer_address: str
    client_address: str
    is_learner: bool
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., peer_address: _Optional[str] = ..., client_address: _Optional[str] = ..., is_learner: _Optional[bool] = ...) -> None: ...

class MemberListRequest(_message.Message):
    __slots__ = ("serializable",)
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    serializable: bool
    def __init__(self, serializable: _Optional[bool] = ...) -> None: ...

class MemberListResponse(_message.Message):
    __slots__ = ("header", "members")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class MemberAddRequest(_message.Message):
    __slots__ = ("id", "name", "peer_address", "client_address", "as_learner")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    peer_address: str
    client_address: str
    as_learner: bool
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., peer_address: _Optional[str] = ..., client_address: _Optional[str] = ..., as_learner: _Optional[bool] = ...) -> None: ...

class MemberAddResponse(_message.Message):
    __slots__ = ("header", "member", "members")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    member: Member
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., member: _Optional[_Union[Member, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class MemberRemoveRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class MemberRemoveResponse(_message.Message):
    __slots__ = ("header", "members")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class MemberPromoteRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class MemberPromoteResponse(_message.Message):
    __slots__ = ("header", "members")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class TransferLeaderRequest(_message.Message):
    __slots__ = ("target_id",)
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    def __init__(self, target_id: _Optional[int] = ...) -> None: ...

class TransferLeaderResponse(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("header", "index", "term", "size_bytes")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    index: int
    term: int
    size_bytes: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., index: _Optional[int] = ..., term: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class PeerProgress(_message.Message):
    __slots__ = ("id", "match_index", "next_index", "state", "is_learner", "recent_active", "pending_snapshot")
    ID_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    IS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    RECENT_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PENDING_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    id: int
    match_index: int
    next_index: int
    state: ProgressState
    is_learner: bool
    recent_active: bool
    pending_snapshot: int
    def __init__(self, id: _Optional[int] = ..., match_index: _Optional[int] = ..., next_index: _Optional[int] = ..., state: _Optional[_Union[ProgressState, str]] = ..., is_learner: _Optional[bool] = ..., recent_active: _Optional[bool] = ..., pending_snapshot: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("header", "member_id", "leader_id", "term", "role", "commit_index", "applied_index", "snapshot_index", "progress", "version", "catching_up", "record_version", "cluster_version")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CATCHING_UP_FIELD_NUMBER: _ClassVar[int]
    RECORD_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    member_id: int
    leader_id: int
    term: int
    role: RaftRole
    commit_index: int
    applied_index: int
    snapshot_index: int
    progress: _containers.RepeatedCompositeFieldContainer[PeerProgress]
    version: str
    catching_up: bool
    record_version: int
    cluster_version: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., member_id: _Optional[int] = ..., leader_id: _Optional[int] = ..., term: _Optional[int] = ..., role: _Optional[_Union[RaftRole, str]] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., progress: _Optional[_Iterable[_Union[PeerProgress, _Mapping]]] = ..., version: _Optional[str] = ..., catching_up: _Optional[bool] = ..., record_version: _Optional[int] = ..., cluster_version: _Optional[int] = ...) -> None: ...
