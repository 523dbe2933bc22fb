from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class LivenessReport(_message.Message):
    __slots__ = ("cluster_id", "from_id", "to_id", "payload", "mac", "challenge", "counter")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    from_id: int
    to_id: int
    payload: bytes
    mac: bytes
    challenge: bytes
    counter: int
    def __init__(self, cluster_id: _Optional[int] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ..., payload: _Optional[bytes] = ..., mac: _Optional[bytes] = ..., challenge: _Optional[bytes] = ..., counter: _Optional[int] = ...) -> None: ...

class LivenessAck(_message.Message):
    __slots__ = ("taken",)
    TAKEN_FIELD_NUMBER: _ClassVar[int]
    taken: bool
    def __init__(self, taken: _Optional[bool] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("cluster_id", "from_id", "to_id", "messages", "incarnation", "abstaining", "mac", "challenge", "counter")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ABSTAINING_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    from_id: int
    to_id: int
    messages: _containers.RepeatedScalarFieldContainer[bytes]
    incarnation: int
    abstaining: bool
    mac: bytes
    challenge: bytes
    counter: int
    def __init__(self, cluster_id: _Optional[int] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ..., messages: _Optional[_Iterable[bytes]] = ..., incarnation: _Optional[int] = ..., abstaining: _Optional[bool] = ..., mac: _Optional[bytes] = ..., challenge: _Optional[bytes] = ..., counter: _Optional[int] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("cluster_id", "from_id", "to_id", "snapshot_index", "snapshot_term", "offset", "data", "total_size", "crc32c", "message", "incarnation", "mac", "challenge", "counter")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TERM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    from_id: int
    to_id: int
    snapshot_index: int
    snapshot_term: int
    offset: int
    data: bytes
    total_size: int
    crc32c: int
    message: bytes
    incarnation: int
    mac: bytes
    challenge: bytes
    counter: int
    def __init__(self, cluster_id: _Optional[int] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., snapshot_term: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_size: _Optional[int] = ..., crc32c: _Optional[int] = ..., message: _Optional[bytes] = ..., incarnation: _Optional[int] = ..., mac: _Optional[bytes] = ..., challenge: _Optional[bytes] = ..., counter: _Optional[int] = ...) -> None: ...

class SnapshotAck(_message.Message):
    __slots__ = ("snapshot_index", "next_offset", "complete")
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    snapshot_index: int
    next_offset: int
    complete: bool
    def __init__(self, snapshot_index: _Optional[int] = ..., next_offset: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("cluster_id", "from_id", "to_id", "incarnation", "nonce", "mac", "record_version", "version_mac", "version_probe")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    RECORD_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_MAC_FIELD_NUMBER: _ClassVar[int]
    VERSION_PROBE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    from_id: int
    to_id: int
    incarnation: int
    nonce: bytes
    mac: bytes
    record_version: int
    version_mac: bytes
    version_probe: bool
    def __init__(self, cluster_id: _Optional[int] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ..., incarnation: _Optional[int] = ..., nonce: _Optional[bytes] = ..., mac: _Optional[bytes] = ..., record_version: _Optional[int] = ..., version_mac: _Optional[bytes] = ..., version_probe: _Optional[bool] = ...) -> None: ...

class HelloAnswer(_message.Message):
    __slots__ = ("member_id", "incarnation", "established", "knows_sender", "term", "last_index", "mac", "record_version", "version_mac")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ESTABLISHED_FIELD_NUMBER: _ClassVar[int]
    KNOWS_SENDER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    RECORD_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_MAC_FIELD_NUMBER: _ClassVar[int]
    member_id: int
    incarnation: int
    established: bool
    knows_sender: bool
    term: int
    last_index: int
    mac: bytes
    record_version: int
    version_mac: bytes
    def __init__(self, member_id: _Optional[int] = ..., incarnation: _Optional[int] = ..., established: _Optional[bool] = ..., knows_sender: _Optional[bool] = ..., term: _Optional[int] = ..., last_index: _Optional[int] = ..., mac: _Optional[bytes] = ..., record_version: _Optional[int] = ..., version_mac: _Optional[bytes] = ...) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ("cluster_id", "from_id", "to_id", "nonce", "mac")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    from_id: int
    to_id: int
    nonce: bytes
    mac: bytes
    def __init__(self, cluster_id: _Optional[int] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ..., nonce: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...

class MembersAnswer(_message.Message):
    __slots__ = ("member_id", "applied_index", "members", "mac")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    member_id: int
    applied_index: int
    members: bytes
    mac: bytes
    def __init__(self, member_id: _Optional[int] = ..., applied_index: _Optional[int] = ..., members: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...
