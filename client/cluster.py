"""Cluster administration (cluster.proto, service Cluster): membership changes, leadership
transfer, snapshots, and each member's own status.

Plain calls through the client's :class:`Caller`, as ``jobs.py``'s are; the :class:`Client`
methods of the same names are their public face. A membership answer teaches the transport
every member's client address (``Caller.learn_members``), so a member added since the client
started becomes an endpoint. ``member_status`` and ``status`` ask one named member each, with
no redirect: they report that member's own view.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rallypoint.proto.v1 import cluster_pb2

from . import arguments
from .caller import Caller
from .errors import RallypointError
from .values import EndpointStatus, Header, Member, MemberStatus, SnapshotInfo


async def member_add(
    caller: Caller,
    peer_address: str,
    client_address: str,
    *,
    member_id: int,
    name: str,
    as_learner: bool,
    timeout_s: float | None,
) -> tuple[Member, list[Member]]:
    arguments.count(member_id, "member_id", least=0)
    response = await caller.read(
        lambda s: s.cluster.MemberAdd,
        cluster_pb2.MemberAddRequest(
            id=member_id,
            name=name,
            peer_address=peer_address,
            client_address=client_address,
            as_learner=as_learner,
        ),
        timeout_s,
    )
    return Member.from_proto(response.member), caller.learn_members(response.members)


async def member_remove(caller: Caller, member_id: int, timeout_s: float | None) -> list[Member]:
    arguments.count(member_id, "member_id")
    response = await caller.read(
        lambda s: s.cluster.MemberRemove, cluster_pb2.MemberRemoveRequest(id=member_id), timeout_s
    )
    return caller.learn_members(response.members)


async def member_promote(caller: Caller, member_id: int, timeout_s: float | None) -> list[Member]:
    arguments.count(member_id, "member_id")
    response = await caller.read(
        lambda s: s.cluster.MemberPromote, cluster_pb2.MemberPromoteRequest(id=member_id), timeout_s
    )
    return caller.learn_members(response.members)


async def transfer_leader(caller: Caller, target_id: int, timeout_s: float | None) -> Header:
    arguments.count(target_id, "target_id", least=0)
    response = await caller.read(
        lambda s: s.cluster.TransferLeader,
        cluster_pb2.TransferLeaderRequest(target_id=target_id),
        timeout_s,
    )
    return Header.from_proto(response.header)


async def snapshot(caller: Caller, endpoint: str | None, timeout_s: float | None) -> SnapshotInfo:
    address = endpoint if endpoint is not None else caller.transport.pick()
    response = await caller.ask(
        address, lambda s: s.cluster.Snapshot, cluster_pb2.SnapshotRequest(), timeout_s
    )
    return SnapshotInfo(
        address, response.header.member_id, response.index, response.term, response.size_bytes
    )


async def member_status(caller: Caller, endpoint: str, timeout_s: float | None) -> MemberStatus:
    response = await caller.ask(
        endpoint, lambda s: s.cluster.Status, cluster_pb2.StatusRequest(), timeout_s
    )
    return MemberStatus.from_proto(response)


async def status(
    caller: Caller, endpoints: Sequence[str], timeout_s: float | None
) -> list[EndpointStatus]:
    async def one(endpoint: str) -> EndpointStatus:
        try:
            found = await member_status(caller, endpoint, timeout_s)
        except RallypointError as error:
            failure = error.failure.value if error.failure is not None else ""
            return EndpointStatus(endpoint, None, str(error), failure)
        return EndpointStatus(endpoint, found, None)

    return list(await asyncio.gather(*(one(endpoint) for endpoint in endpoints)))
