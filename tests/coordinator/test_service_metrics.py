"""Round-store and checkpoint-registry calls are counted by the one wrapper every call goes
through (``service/server.py``), by operation and outcome, over a real gRPC server; so are
the operations of a RoundStore/Batch stream, as the unary calls they stand for."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from rallypoint.coordinator.metrics import NodeMetrics
from rallypoint.coordinator.service import add_services
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc

from .fake_node import FakeNode, fails, join_round, open_session


def _count(metrics: NodeMetrics, name: str, op: str, outcome: str) -> float:
    labels = {"op": op, "outcome": outcome}
    return metrics.registry.get_sample_value(f"{name}_total", labels) or 0.0


@contextlib.asynccontextmanager
async def metered() -> AsyncIterator[tuple[FakeNode, NodeMetrics, grpc.aio.Channel]]:
    """A real gRPC server over a fake member that keeps metrics, and a channel to it."""
    node = FakeNode()
    metrics = NodeMetrics(1)
    server = grpc.aio.server()
    add_services(server, node, metrics=metrics)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield node, metrics, channel
    finally:
        await channel.close(None)
        await server.stop(grace=None)


async def test_store_and_checkpoint_calls_are_counted_by_operation_and_outcome() -> None:
    async with metered() as (node, metrics, channel):
        headers = await open_session(node)
        joined = await join_round(channel, headers, "j", 2)
        info, pid = joined[-1].round, joined[0].participant_id
        store = rendezvous_pb2_grpc.RoundStoreStub(channel)
        scope = pb.StoreScope(job="j", round=info.round, participant_id=pid)
        await store.CompareSet(
            pb.StoreCompareSetRequest(header=headers(), scope=scope, key=b"k", desired=b"v")
        )
        await store.Get(pb.StoreGetRequest(scope=scope, key=b"k"))
        stale = pb.StoreScope(job="j", round=info.round + 1, participant_id=pid)
        await fails(store.Set(pb.StoreSetRequest(header=headers(), scope=stale, key=b"k")))
        registry = rendezvous_pb2_grpc.CheckpointRegistryStub(channel)
        fence = pb.CheckpointFence(job="j", round=info.round, fencing_token=info.fencing_token)
        await registry.Begin(pb.CheckpointBeginRequest(header=headers(), fence=fence, world_size=2))
        wrong = pb.CheckpointFence(job="j", round=info.round, fencing_token=1)
        await fails(
            registry.Begin(pb.CheckpointBeginRequest(header=headers(), fence=wrong, world_size=2))
        )
        await registry.Latest(pb.CheckpointLatestRequest(job="j"))
    store_ops = "rallypoint_store_operations"
    assert _count(metrics, store_ops, "compare_set", "ok") == 1
    assert _count(metrics, store_ops, "get", "ok") == 1
    assert _count(metrics, store_ops, "set", "stale_round") == 1
    assert _count(metrics, store_ops, "set", "ok") == 0
    checkpoints = "rallypoint_checkpoint_operations"
    assert _count(metrics, checkpoints, "begin", "ok") == 1
    assert _count(metrics, checkpoints, "begin", "stale_token") == 1
    assert _count(metrics, checkpoints, "latest", "ok") == 1
    # Other services are not counted here.
    assert _count(metrics, checkpoints, "join", "ok") == 0


async def test_round_store_batch_operations_are_counted_as_their_unary_calls() -> None:
    """A RoundStore/Batch stream's operations count as the unary calls they stand for (the
    client sends its round-store reads and writes there)."""
    async with metered() as (node, metrics, channel):
        headers = await open_session(node)
        joined = await join_round(channel, headers, "j", 2)
        info, pid = joined[-1].round, joined[0].participant_id
        scope = pb.StoreScope(job="j", round=info.round, participant_id=pid)
        stale = pb.StoreScope(job="j", round=info.round + 1, participant_id=pid)
        group = pb.StoreKeyGroup(keys=[b"k"])
        call: Any = rendezvous_pb2_grpc.RoundStoreStub(channel).Batch(None)
        operations = [
            pb.StoreBatchOperation(
                id=1, set=pb.StoreSetRequest(header=headers(), scope=scope, key=b"k", value=b"v")
            ),
            pb.StoreBatchOperation(
                id=2, add=pb.StoreAddRequest(header=headers(), scope=scope, key=b"n", delta=2)
            ),
            pb.StoreBatchOperation(
                id=3, set=pb.StoreSetRequest(header=headers(), scope=stale, key=b"k", value=b"v")
            ),
        ]
        await call.write(pb.StoreBatchRequest(operations=operations))
        answered: set[int] = set()
        while len(answered) < len(operations):
            answered |= {result.id for result in (await call.read()).results}
        read = pb.StoreMultiGetRequest(scope=scope, groups=[group], partial=True)
        await call.write(
            pb.StoreBatchRequest(operations=[pb.StoreBatchOperation(id=4, multi_get=read)])
        )
        (result,) = (await call.read()).results
        assert list(result.multi_get.groups[0].values) == [b"v"]
        await call.done_writing()
    store_ops = "rallypoint_store_operations"
    assert _count(metrics, store_ops, "set", "ok") == 1
    assert _count(metrics, store_ops, "add", "ok") == 1
    assert _count(metrics, store_ops, "set", "stale_round") == 1
    assert _count(metrics, store_ops, "multi_get", "ok") == 1
