"""The Cluster service: membership and status from the member's Raft view.

Membership changes carry no session: they are idempotent by member id and addresses. The
checks against the current configuration here (promoting a voter, removing the last voter,
transferring leadership to a learner) refuse obvious mistakes with FAILED_PRECONDITION
before the member starts a configuration change; the member still decides, and refuses
changes that race with another one.
"""

from __future__ import annotations

from importlib import metadata

from rallypoint.proto.v1 import cluster_pb2, cluster_pb2_grpc

from ..node.api import Member, MemberNotFoundError, NodeStatus, ServerNode
from ..version import RECORD_VERSION
from . import validate
from .common import Context, header_pb, read_barrier, wait_s
from .errors import InvalidArgument, PreconditionFailed

_ROLES = {
    "leader": cluster_pb2.LEADER,
    "follower": cluster_pb2.FOLLOWER,
    "candidate": cluster_pb2.CANDIDATE,
    "pre-candidate": cluster_pb2.PRE_CANDIDATE,
}
_PROGRESS_STATES = {
    "probe": cluster_pb2.PROBE,
    "replicate": cluster_pb2.REPLICATE,
    "snapshot": cluster_pb2.SNAPSHOT,
}


def _version() -> str:
    try:
        return metadata.version("rallypoint")
    except metadata.PackageNotFoundError:
        return "unknown"


def member_pb(member: Member) -> cluster_pb2.Member:
    return cluster_pb2.Member(
        id=member.member_id,
        peer_address=member.peer_address,
        client_address=member.client_address,
        is_learner=member.is_learner,
    )


def _find(status: NodeStatus, member_id: int) -> Member:
    for member in status.members:
        if member.member_id == member_id:
            return member
    raise MemberNotFoundError(member_id)


class ClusterServicer(cluster_pb2_grpc.ClusterServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node
        self.version = _version()

    def _members(self) -> list[cluster_pb2.Member]:
        members = sorted(self.node.status().members, key=lambda member: member.member_id)
        return [member_pb(member) for member in members]

    async def MemberList(
        self, request: cluster_pb2.MemberListRequest, context: Context
    ) -> cluster_pb2.MemberListResponse:
        await read_barrier(self.node, context, request.serializable)
        return cluster_pb2.MemberListResponse(
            header=header_pb(self.node.header()), members=self._members()
        )

    async def MemberAdd(
        self, request: cluster_pb2.MemberAddRequest, context: Context
    ) -> cluster_pb2.MemberAddResponse:
        peer_address = validate.address(request.peer_address, "peer_address")
        client_address = validate.address(request.client_address, "client_address")
        if request.id:
            # The member chooses new ids; a non-zero id is only a retry of an earlier add.
            existing = next(
                (m for m in self.node.status().members if m.member_id == request.id), None
            )
            if existing is None:
                raise InvalidArgument(
                    "id", f"no member {request.id} exists; send 0 to let the cluster choose"
                )
            if (existing.peer_address, existing.client_address) != (peer_address, client_address):
                raise PreconditionFailed(
                    f"member {request.id} exists with other addresses "
                    f"({existing.peer_address}, {existing.client_address})"
                )
            added = existing
        else:
            added = await self.node.membership.add(
                peer_address, client_address, request.as_learner, timeout_s=wait_s(context)
            )
        return cluster_pb2.MemberAddResponse(
            header=header_pb(self.node.header()),
            member=member_pb(added),
            members=self._members(),
        )

    async def MemberRemove(
        self, request: cluster_pb2.MemberRemoveRequest, context: Context
    ) -> cluster_pb2.MemberRemoveResponse:
        member_id = validate.member_id(request.id)
        status = self.node.status()
        member = _find(status, member_id)
        voters = [m for m in status.members if not m.is_learner]
        if not member.is_learner and len(voters) == 1:
            raise PreconditionFailed(f"member {member_id} is the last voter; add another first")
        await self.node.membership.remove(member_id, timeout_s=wait_s(context))
        return cluster_pb2.MemberRemoveResponse(
            header=header_pb(self.node.header()), members=self._members()
        )

    async def MemberPromote(
        self, request: cluster_pb2.MemberPromoteRequest, context: Context
    ) -> cluster_pb2.MemberPromoteResponse:
        member_id = validate.member_id(request.id)
        if not _find(self.node.status(), member_id).is_learner:
            raise PreconditionFailed(f"member {member_id} is already a voter")
        await self.node.membership.promote(member_id, timeout_s=wait_s(context))
        return cluster_pb2.MemberPromoteResponse(
            header=header_pb(self.node.header()), members=self._members()
        )

    async def TransferLeader(
        self, request: cluster_pb2.TransferLeaderRequest, context: Context
    ) -> cluster_pb2.TransferLeaderResponse:
        # target_id 0 lets the member pick the most up-to-date voter.
        if request.target_id and _find(self.node.status(), request.target_id).is_learner:
            raise PreconditionFailed(
                f"member {request.target_id} is a learner and cannot lead; promote it first"
            )
        await self.node.membership.transfer_leader(request.target_id, timeout_s=wait_s(context))
        return cluster_pb2.TransferLeaderResponse(header=header_pb(self.node.header()))

    async def Snapshot(
        self, request: cluster_pb2.SnapshotRequest, context: Context
    ) -> cluster_pb2.SnapshotResponse:
        index = await self.node.snapshot_now()
        return cluster_pb2.SnapshotResponse(header=header_pb(self.node.header()), index=index)

    async def Status(
        self, request: cluster_pb2.StatusRequest, context: Context
    ) -> cluster_pb2.StatusResponse:
        status = self.node.status()
        learners = {m.member_id for m in status.members if m.is_learner}
        role = _ROLES[status.role]
        if status.member_id in learners:
            role = cluster_pb2.LEARNER
        return cluster_pb2.StatusResponse(
            header=header_pb(self.node.header()),
            member_id=status.member_id,
            leader_id=status.leader_id,
            term=status.term,
            role=role,
            commit_index=status.commit_index,
            applied_index=status.applied_index,
            snapshot_index=status.snapshot_index,
            progress=[
                cluster_pb2.PeerProgress(
                    id=peer.member_id,
                    match_index=peer.match_index,
                    next_index=peer.next_index,
                    state=_PROGRESS_STATES[peer.state],
                    is_learner=peer.member_id in learners,
                    recent_active=peer.recent_active,
                )
                for peer in sorted(status.progress, key=lambda peer: peer.member_id)
            ],
            version=self.version,
            catching_up=status.abstaining,
            record_version=RECORD_VERSION,
            cluster_version=status.cluster_version,
        )
