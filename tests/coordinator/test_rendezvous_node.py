"""Rendezvous end to end in one process: three real members, each serving the public API on
its own grpc.aio server, and three workers driving it through the generated stubs.

The workers join a job of exactly three; all agree on round 1 and its ranks; they use the
round's store across members and begin a checkpoint. One worker's heartbeat stream is then
cancelled, as a dying process's would be: the leader's detector declares it failed, every
watcher is told round 1 ended, and once the job accepts two members round 2 closes with
the survivors keeping their ranks. The old round's store and checkpoint fences are refused;
the new round's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import cast

import grpc
import pytest

from rallypoint.coordinator.node.config import NodeConfig
from rallypoint.coordinator.node.driver import Node
from rallypoint.coordinator.service import add_services
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc, session_pb2, session_pb2_grpc

from .fake_node import Headers, fails, job_config, until
from .test_node import Cluster

log = logging.getLogger(__name__)
JOB = "train"
HEARTBEAT_INTERVAL_MS = 50
# Three members, servers and workers share one event loop on a small shared machine: a
# generous acceptable pause keeps a stalled loop from looking like a dead worker, while a
# closed stream is still confirmed after two heartbeat intervals.
CONFIG = {"heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS, "acceptable_pause_ms": 1000}


class ServingCluster(Cluster):
    """The members of ``test_node.Cluster``, each also serving the public API."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, 3)
        self.servers: dict[int, grpc.aio.Server] = {}

    def config(self, member_id: int) -> NodeConfig:
        return dataclasses.replace(super().config(member_id), detector_grace_ms=200)

    async def start(self, member_id: int) -> Node:
        node = await super().start(member_id)
        server = grpc.aio.server()
        add_services(server, node)
        server.add_insecure_port(self.members[member_id].client_address)
        await server.start()
        self.servers[member_id] = server
        return node

    async def stop(self, member_id: int, transfer: bool = False) -> None:
        await self.servers.pop(member_id).stop(grace=None)
        await super().stop(member_id, transfer)

    def leader_known(self) -> bool:
        return any(node.is_leader() for node in self.nodes.values())


class Worker:
    """A training process as the coordinator sees it: a session, a participant, a heartbeat
    stream to the leader (following its hints), and a watch of the job on its home member."""

    def __init__(self, cluster: ServingCluster, name: str, home: int) -> None:
        self.cluster = cluster
        self.name = name
        self.home = home
        self.channels: dict[str, grpc.aio.Channel] = {}
        channel = self.channel(cluster.members[home].client_address)
        self.rendezvous = rendezvous_pb2_grpc.RendezvousStub(channel)
        self.store = rendezvous_pb2_grpc.RoundStoreStub(channel)
        self.checkpoints = rendezvous_pb2_grpc.CheckpointRegistryStub(channel)
        self.sessions = session_pb2_grpc.SessionStub(channel)
        self.headers = Headers(0)
        self.participant_id = 0
        self.round = 0
        # Every RoundInfo the watch delivered, in order.
        self.seen: list[pb.RoundInfo] = []
        self.tasks: list[asyncio.Task[None]] = []

    def leader_store(self) -> rendezvous_pb2_grpc.RoundStoreStub:
        """The round store on the leader's channel: writes are the leader's alone (cache
        leases, coordinator/service/store_cache.py); reads are served by any member."""
        (leader,) = [i for i, node in self.cluster.nodes.items() if node.is_leader()]
        return rendezvous_pb2_grpc.RoundStoreStub(
            self.channel(self.cluster.members[leader].client_address)
        )

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.aio.insecure_channel(address)
        return self.channels[address]

    async def join(self, config: pb.JobConfig) -> pb.JoinResponse:
        opened = await self.sessions.Open(session_pb2.SessionOpenRequest(ttl_ms=60_000))
        self.headers = Headers(opened.session_id)
        joined = await self.rendezvous.Join(
            pb.JoinRequest(header=self.headers(), job=JOB, name=self.name, config=config)
        )
        self.participant_id, self.round = joined.participant_id, joined.round.round
        self.heartbeat_task = asyncio.create_task(self._heartbeat_forever())
        self.tasks += [self.heartbeat_task, asyncio.create_task(self._watch_forever())]
        return joined

    async def _beats(self) -> AsyncIterator[pb.HeartbeatRequest]:
        while True:
            yield pb.HeartbeatRequest(job=JOB, participant_id=self.participant_id, round=self.round)
            await asyncio.sleep(HEARTBEAT_INTERVAL_MS / 1000)  # the heartbeat's own pace

    async def _heartbeat_forever(self) -> None:
        address: str | None = None
        while True:
            if address is None:
                leader = await self.cluster.leader()
                address = self.cluster.members[leader.member_id].client_address
            stub = rendezvous_pb2_grpc.RendezvousStub(self.channel(address))
            call = stub.Heartbeat(self._beats())
            try:
                async for response in call:
                    self.round = response.current_round
            except grpc.aio.AioRpcError as error:
                # Not the leader (any more): follow the hint, or look for the leader.
                metadata = dict(cast(Iterable[tuple[str, str]], error.trailing_metadata() or ()))
                address = metadata.get("rallypoint-leader")
            finally:
                call.cancel()

    async def _watch_forever(self) -> None:
        while True:
            try:
                async for response in self.rendezvous.WatchJob(pb.WatchJobRequest(job=JOB)):
                    self.seen.append(response.round)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await until(self.cluster.leader_known, timeout_s=10)

    def latest(self) -> pb.RoundInfo | None:
        return self.seen[-1] if self.seen else None

    def sees(self, round_number: int, state: int) -> bool:
        latest = self.latest()
        return latest is not None and (latest.round, latest.state) == (round_number, state)

    def rank_in(self, info: pb.RoundInfo) -> int:
        (rank,) = [m.rank for m in info.members if m.participant_id == self.participant_id]
        return rank

    def scope(self, round_number: int) -> pb.StoreScope:
        return pb.StoreScope(job=JOB, round=round_number, participant_id=self.participant_id)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for channel in self.channels.values():
            await channel.close(None)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ServingCluster]:
    c = ServingCluster(tmp_path)
    await c.start_all()
    yield c
    for member_id in list(c.nodes):
        await c.stop(member_id)
    assert not c.fatal


@pytest.fixture
async def workers(cluster: ServingCluster) -> AsyncIterator[list[Worker]]:
    await cluster.leader()
    started = [Worker(cluster, f"w{i}", home=i + 1) for i in range(3)]
    yield started
    for worker in started:
        await worker.close()


def _placement(info: pb.RoundInfo) -> list[tuple[int, int]]:
    return [(m.participant_id, m.rank) for m in info.members]


async def test_three_workers_form_a_round_survive_a_failure_and_keep_their_ranks(
    cluster: ServingCluster, workers: list[Worker]
) -> None:
    config = job_config(3, 3, **CONFIG)
    for worker in workers:
        await worker.join(config)
    await until(lambda: all(w.sees(1, pb.ROUND_STATE_ACTIVE) for w in workers), timeout_s=10)
    round_1 = [w.latest() for w in workers]
    assert all(info is not None for info in round_1)
    infos = [info for info in round_1 if info is not None]
    # Every member's watch tells the same round, membership, ranks and token.
    assert len({(i.fencing_token, tuple(_placement(i))) for i in infos}) == 1
    assert sorted(rank for _, rank in _placement(infos[0])) == [0, 1, 2]
    token_1 = infos[0].fencing_token
    w0, w1, w2 = sorted(workers, key=lambda w: w.rank_in(infos[0]))

    # The round's store, written at the leader and read through different members; a write
    # at another member is refused with the leader's address.
    pending_get = asyncio.ensure_future(
        w2.store.Get(pb.StoreGetRequest(scope=w2.scope(1), key=b"master", timeout_ms=10_000))
    )
    followers = [w for w in (w0, w1, w2) if not cluster.nodes[w.home].is_leader()]
    redirected = await fails(
        followers[0].store.Set(
            pb.StoreSetRequest(
                header=followers[0].headers(), scope=followers[0].scope(1), key=b"k", value=b"v"
            )
        )
    )
    assert (redirected.code, redirected.reason) == (grpc.StatusCode.UNAVAILABLE, "NOT_LEADER")
    await w0.leader_store().Set(
        pb.StoreSetRequest(header=w0.headers(), scope=w0.scope(1), key=b"master", value=b"w0:29500")
    )
    assert (await pending_get).value == b"w0:29500"
    got = await w1.store.Get(pb.StoreGetRequest(scope=w1.scope(1), key=b"master"))
    assert got.value == b"w0:29500"
    counts = [
        (await w.leader_store().Add(
            pb.StoreAddRequest(header=w.headers(), scope=w.scope(1), key=b"arrived", delta=1)
        )).value
        for w in (w0, w1, w2)
    ]  # fmt: skip
    assert counts == [1, 2, 3]
    claims = [
        await w.leader_store().CompareSet(
            pb.StoreCompareSetRequest(
                header=w.headers(), scope=w.scope(1), key=b"leader", desired=w.name.encode()
            )
        )
        for w in (w1, w0)
    ]
    assert [c.swapped for c in claims] == [True, False]
    assert claims[1].value == w1.name.encode()
    fence_1 = pb.CheckpointFence(job=JOB, round=1, fencing_token=token_1)
    begun_1 = await w0.checkpoints.Begin(
        pb.CheckpointBeginRequest(header=w0.headers(), fence=fence_1, step=10, world_size=3)
    )

    # w2 (rank 2) dies: its heartbeat stream is cancelled with its process.
    stopped_at = time.monotonic()
    w2.heartbeat_task.cancel()
    survivors = (w0, w1)
    await until(lambda: all(w.sees(2, pb.ROUND_STATE_JOINING) for w in survivors), timeout_s=10)
    log.info("round change seen by every survivor %.3f s after the stream closed",
             time.monotonic() - stopped_at)  # fmt: skip
    joining = w0.latest()
    assert joining is not None and joining.reason.startswith("2 of min 3 joined")
    assert [m.participant_id for m in joining.members] == sorted(
        w.participant_id for w in survivors
    )
    job = await w1.rendezvous.GetJob(pb.GetJobRequest(job=JOB))
    (ended,) = job.history
    assert (ended.round, ended.end_reason, ended.ended_by) == (
        1,
        pb.ROUND_END_REASON_MEMBER_FAILED,
        w2.participant_id,
    )

    # The job now accepts two: round 2 closes with the survivors in their old ranks.
    await w0.rendezvous.Configure(
        pb.ConfigureRequest(header=w0.headers(), job=JOB, config=job_config(2, 3, **CONFIG))
    )
    await until(lambda: all(w.sees(2, pb.ROUND_STATE_ACTIVE) for w in survivors), timeout_s=10)
    round_2 = w1.latest()
    assert round_2 is not None and round_2.world_size == 2
    assert [w.rank_in(round_2) for w in survivors] == [0, 1]
    assert round_2.fencing_token > token_1

    # The old round's store and checkpoint fences are refused; the dead worker is no member.
    stale_write = await fails(
        w0.leader_store().Set(pb.StoreSetRequest(header=w0.headers(), scope=w0.scope(1), key=b"k"))
    )
    zombie_write = await fails(
        w2.leader_store().Set(pb.StoreSetRequest(header=w2.headers(), scope=w2.scope(2), key=b"k"))
    )
    for refused in (stale_write, zombie_write):
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "STALE_ROUND",
        )
    await w1.leader_store().Set(
        pb.StoreSetRequest(header=w1.headers(), scope=w1.scope(2), key=b"k", value=b"v")
    )
    old_commit = await fails(
        w0.checkpoints.Commit(
            pb.CheckpointCommitRequest(
                header=w0.headers(), fence=fence_1, checkpoint_id=begun_1.checkpoint_id
            )
        )
    )
    assert old_commit.reason == "STALE_ROUND"

    fence_2 = pb.CheckpointFence(job=JOB, round=2, fencing_token=round_2.fencing_token)
    begun = await w0.checkpoints.Begin(
        pb.CheckpointBeginRequest(header=w0.headers(), fence=fence_2, step=20, world_size=2)
    )
    for worker in survivors:
        await worker.checkpoints.ShardDone(
            pb.CheckpointShardDoneRequest(
                header=worker.headers(),
                fence=fence_2,
                checkpoint_id=begun.checkpoint_id,
                rank=worker.rank_in(round_2),
            )
        )
    old_token = pb.CheckpointFence(job=JOB, round=2, fencing_token=token_1)
    stale_token = await fails(
        w1.checkpoints.Commit(
            pb.CheckpointCommitRequest(
                header=w1.headers(), fence=old_token, checkpoint_id=begun.checkpoint_id
            )
        )
    )
    assert stale_token.reason == "STALE_TOKEN"
    committed = await w1.checkpoints.Commit(
        pb.CheckpointCommitRequest(
            header=w1.headers(), fence=fence_2, checkpoint_id=begun.checkpoint_id
        )
    )
    for worker in workers:
        latest = await worker.checkpoints.Latest(pb.CheckpointLatestRequest(job=JOB))
        assert latest.checkpoint == committed.checkpoint
