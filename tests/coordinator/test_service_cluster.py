"""The Cluster service: membership changes and status from the member's Raft view."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from rallypoint.coordinator.node.api import Member
from rallypoint.proto.v1 import cluster_pb2, cluster_pb2_grpc

from .fake_node import MEMBER_ID, TERM, FakeNode, fails, serving

Code = grpc.StatusCode


@pytest.fixture
async def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
async def stub(node: FakeNode) -> AsyncIterator[cluster_pb2_grpc.ClusterStub]:
    async with serving(node) as channel:
        yield cluster_pb2_grpc.ClusterStub(channel)


def _ids(members: object) -> list[tuple[int, bool]]:
    return [(m.id, m.is_learner) for m in members]  # type: ignore[attr-defined]


async def test_add_promote_transfer_remove(
    node: FakeNode, stub: cluster_pb2_grpc.ClusterStub
) -> None:
    added = await stub.MemberAdd(
        cluster_pb2.MemberAddRequest(
            peer_address="10.0.0.2:2380", client_address="10.0.0.2:2379", as_learner=True
        )
    )
    assert (added.member.id, added.member.is_learner) == (2, True)
    assert added.member.peer_address == "10.0.0.2:2380"
    assert _ids(added.members) == [(1, False), (2, True)]

    retried = await stub.MemberAdd(
        cluster_pb2.MemberAddRequest(
            id=2, peer_address="10.0.0.2:2380", client_address="10.0.0.2:2379"
        )
    )
    assert retried.member == added.member and len(retried.members) == 2

    to_learner = await fails(stub.TransferLeader(cluster_pb2.TransferLeaderRequest(target_id=2)))
    assert to_learner.code == Code.FAILED_PRECONDITION

    promoted = await stub.MemberPromote(cluster_pb2.MemberPromoteRequest(id=2))
    assert _ids(promoted.members) == [(1, False), (2, False)]
    again = await fails(stub.MemberPromote(cluster_pb2.MemberPromoteRequest(id=2)))
    assert (again.code, again.details) == (Code.FAILED_PRECONDITION, "member 2 is already a voter")

    await stub.TransferLeader(cluster_pb2.TransferLeaderRequest(target_id=2))
    await stub.TransferLeader(cluster_pb2.TransferLeaderRequest())
    assert node.transfers == [2, 0]

    removed = await stub.MemberRemove(cluster_pb2.MemberRemoveRequest(id=2))
    assert _ids(removed.members) == [(1, False)]
    last = await fails(stub.MemberRemove(cluster_pb2.MemberRemoveRequest(id=1)))
    assert (last.code, last.details) == (
        Code.FAILED_PRECONDITION,
        "member 1 is the last voter; add another first",
    )


async def test_unknown_members_are_not_found(stub: cluster_pb2_grpc.ClusterStub) -> None:
    for call in (
        stub.MemberRemove(cluster_pb2.MemberRemoveRequest(id=9)),
        stub.MemberPromote(cluster_pb2.MemberPromoteRequest(id=9)),
        stub.TransferLeader(cluster_pb2.TransferLeaderRequest(target_id=9)),
    ):
        failure = await fails(call)
        assert (failure.code, failure.reason, failure.details) == (
            Code.NOT_FOUND,
            "MEMBER_NOT_FOUND",
            "member 9 is not in the cluster",
        )


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"client_address": "h:1"}, 'peer_address: must not be empty (expected "host:port")'),
        ({"peer_address": "h:1", "client_address": "h"}, "client_address: must be"),
        ({"peer_address": "h:0", "client_address": "h:1"}, "peer_address: must be"),
        ({"peer_address": ":80", "client_address": "h:1"}, "peer_address: must be"),
        ({"peer_address": "[::1:80", "client_address": "h:1"}, "peer_address: unbalanced"),
        ({"id": 7, "peer_address": "h:1", "client_address": "h:2"}, "id: no member 7 exists"),
    ],
)
async def test_member_add_validation(
    node: FakeNode,
    stub: cluster_pb2_grpc.ClusterStub,
    request_fields: dict[str, object],
    message: str,
) -> None:
    failure = await fails(stub.MemberAdd(cluster_pb2.MemberAddRequest(**request_fields)))  # type: ignore[arg-type]
    assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert failure.details.startswith(message), failure.details
    assert len(node.members) == 1


async def test_member_ids_must_not_be_zero(stub: cluster_pb2_grpc.ClusterStub) -> None:
    for call in (
        stub.MemberRemove(cluster_pb2.MemberRemoveRequest()),
        stub.MemberPromote(cluster_pb2.MemberPromoteRequest()),
    ):
        failure = await fails(call)
        assert (failure.code, failure.details) == (
            Code.INVALID_ARGUMENT,
            "id: must be a member id (non-zero)",
        )


async def test_an_existing_id_with_other_addresses_is_refused(
    node: FakeNode, stub: cluster_pb2_grpc.ClusterStub
) -> None:
    failure = await fails(
        stub.MemberAdd(cluster_pb2.MemberAddRequest(id=1, peer_address="h:1", client_address="h:2"))
    )
    assert failure.code == Code.FAILED_PRECONDITION
    assert failure.details.startswith("member 1 exists with other addresses")


async def test_member_list_status_and_snapshot(
    node: FakeNode, stub: cluster_pb2_grpc.ClusterStub
) -> None:
    node.members.append(Member(3, "10.0.0.3:2380", "10.0.0.3:2379", True))
    listed = await stub.MemberList(cluster_pb2.MemberListRequest())
    assert _ids(listed.members) == [(1, False), (3, True)]
    assert node.read_barriers == 1
    await stub.MemberList(cluster_pb2.MemberListRequest(serializable=True))
    assert node.read_barriers == 1

    status = await stub.Status(cluster_pb2.StatusRequest())
    assert (status.member_id, status.leader_id, status.term, status.role) == (
        MEMBER_ID,
        MEMBER_ID,
        TERM,
        cluster_pb2.LEADER,
    )
    assert [(p.id, p.state, p.is_learner) for p in status.progress] == [
        (1, cluster_pb2.REPLICATE, False),
        (3, cluster_pb2.REPLICATE, True),
    ]
    assert status.version

    snapshot = await stub.Snapshot(cluster_pb2.SnapshotRequest())
    assert snapshot.index == node.index
    assert (await stub.Status(cluster_pb2.StatusRequest())).snapshot_index == snapshot.index


async def test_status_on_a_follower_and_on_a_learner(
    node: FakeNode, stub: cluster_pb2_grpc.ClusterStub
) -> None:
    node.not_leader(2, "10.0.0.2:2379")
    follower = await stub.Status(cluster_pb2.StatusRequest())
    assert (follower.role, follower.leader_id, list(follower.progress)) == (
        cluster_pb2.FOLLOWER,
        2,
        [],
    )
    node.members[0] = Member(MEMBER_ID, "10.0.0.1:2380", "10.0.0.1:2379", True)
    learner = await stub.Status(cluster_pb2.StatusRequest())
    assert learner.role == cluster_pb2.LEARNER
