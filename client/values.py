"""What the client returns: frozen values converted from the wire messages in one place."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rallypoint.proto.v1 import cluster_pb2, common_pb2, watch_pb2


@dataclass(frozen=True, slots=True)
class Fence:
    """A fencing token; pass it as ``fence=`` on a write to have it refused once the lease is
    gone or a newer holder wrote the key (StaleFenceError)."""

    lease_id: int
    token: int

    def to_proto(self) -> common_pb2.Fence:
        return common_pb2.Fence(lease_id=self.lease_id, token=self.token)


@dataclass(frozen=True, slots=True)
class Header:
    """The response header: the store revision when answered, and who answered."""

    revision: int
    raft_term: int
    leader_id: int
    member_id: int

    @staticmethod
    def from_proto(header: common_pb2.ResponseHeader) -> Header:
        return Header(header.revision, header.raft_term, header.leader_id, header.member_id)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    # Revision (raft index) that created the key; a delete and re-create starts over.
    create_revision: int
    # Revision of the last change. Invariant: create_revision <= mod_revision.
    mod_revision: int
    # Changes since creation, starting at 1.
    version: int
    # The lease the key is attached to; 0 for none.
    lease_id: int

    @staticmethod
    def from_proto(kv: common_pb2.KeyValue) -> KeyValue:
        return KeyValue(
            kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease_id
        )


def optional_kv(message: object, field: str) -> KeyValue | None:
    """The KeyValue in ``message.field``, or None when the field is absent."""
    if not message.HasField(field):  # type: ignore[attr-defined]
        return None
    kv: common_pb2.KeyValue = getattr(message, field)
    return KeyValue.from_proto(kv)


@dataclass(frozen=True, slots=True)
class PutResult:
    header: Header
    kv: KeyValue
    prev_kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class GetResult:
    header: Header
    kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class RangeResult:
    header: Header
    kvs: tuple[KeyValue, ...]
    # True when the limit cut the answer short; continue after kvs[-1].key.
    more: bool


@dataclass(frozen=True, slots=True)
class DeleteResult:
    header: Header
    deleted: int
    prev_kvs: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class CompareAndSetResult:
    header: Header
    succeeded: bool
    # On success the stored key; on failure the current one (None when absent).
    kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class AddResult:
    header: Header
    value: int
    kv: KeyValue | None


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    # For DELETE, the key with mod_revision = the delete's revision and an empty value.
    kv: KeyValue
    # The key's mod_revision before this event; 0 when it did not exist.
    prev_revision: int
    prev_kv: KeyValue | None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision

    @staticmethod
    def from_proto(event: watch_pb2.Event) -> WatchEvent:
        kind = EventType.DELETE if event.type == watch_pb2.DELETE else EventType.PUT
        return WatchEvent(
            kind, KeyValue.from_proto(event.kv), event.prev_revision, optional_kv(event, "prev_kv")
        )


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    lease_id: int
    fencing_token: int
    granted_ttl_s: float
    # None when not asked for (List); from the leader's clock otherwise.
    remaining_ttl_s: float | None = None
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Member:
    member_id: int
    name: str
    peer_address: str
    client_address: str
    is_learner: bool

    @staticmethod
    def from_proto(member: cluster_pb2.Member) -> Member:
        return Member(
            member.id, member.name, member.peer_address, member.client_address, member.is_learner
        )


def members_from_proto(members: object) -> tuple[Member, ...]:
    return tuple(Member.from_proto(m) for m in members)  # type: ignore[attr-defined]


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"
    PRE_CANDIDATE = "pre-candidate"
    LEARNER = "learner"


_ROLES = {
    cluster_pb2.FOLLOWER: Role.FOLLOWER,
    cluster_pb2.CANDIDATE: Role.CANDIDATE,
    cluster_pb2.LEADER: Role.LEADER,
    cluster_pb2.PRE_CANDIDATE: Role.PRE_CANDIDATE,
    cluster_pb2.LEARNER: Role.LEARNER,
}


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member's own view, as its Status RPC answered."""

    member_id: int
    leader_id: int
    term: int
    role: Role
    commit_index: int
    applied_index: int
    snapshot_index: int
    version: str
    # It lost its data and has not caught up with a leader yet: it does not vote.
    catching_up: bool = False
    # The highest record version its build writes and reads, and the cluster version it
    # applied (docs/operations.md, "Upgrading"); 0 from a release that does not say (the
    # baseline, 1).
    record_version: int = 0
    cluster_version: int = 0

    @staticmethod
    def from_proto(status: cluster_pb2.StatusResponse) -> MemberStatus:
        return MemberStatus(
            status.member_id,
            status.leader_id,
            status.term,
            _ROLES.get(status.role, Role.FOLLOWER),
            status.commit_index,
            status.applied_index,
            status.snapshot_index,
            status.version,
            status.catching_up,
            status.record_version,
            status.cluster_version,
        )


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """The answer of one endpoint to Status: either ``status`` or the ``error`` text, and
    then ``failure``: what went wrong in a few words when no member answered there
    ("connection refused"; "" when a member answered with a refusal)."""

    endpoint: str
    status: MemberStatus | None
    error: str | None
    failure: str = ""

    @property
    def healthy(self) -> bool:
        return self.status is not None and self.status.leader_id != 0


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    endpoint: str
    member_id: int
    index: int
    term: int
    size_bytes: int
