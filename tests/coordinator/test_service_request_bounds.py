"""What one request may ask of a member (issue 33, items 4-6), over a real gRPC server:
a batch message's size, a prefix delete's and a lease's key count, lease and session TTLs,
and a keep-alive of a lease that does not exist."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from rallypoint.coordinator.service import kv_batch, kv_ops
from rallypoint.proto.v1 import (
    common_pb2,
    defaults,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

from .fake_node import FakeNode, fails, rpc_failure, serving

Code = grpc.StatusCode


@pytest.fixture
async def channel() -> AsyncIterator[tuple[FakeNode, grpc.aio.Channel, int]]:
    node = FakeNode()
    async with serving(node) as channel:
        opened = await session_pb2_grpc.SessionStub(channel).Open(
            session_pb2.SessionOpenRequest(ttl_ms=60_000)
        )
        yield node, channel, opened.session_id


def header(session_id: int, sequence: int) -> common_pb2.RequestHeader:
    return common_pb2.RequestHeader(session_id=session_id, sequence=sequence)


async def test_a_batch_message_past_the_cap_ends_the_stream_naming_the_cap(
    channel: tuple[FakeNode, grpc.aio.Channel, int],
) -> None:
    _, conn, _ = channel
    call: Any = kv_pb2_grpc.KVStub(conn).Batch(None)
    too_many = defaults.MAX_BATCH_OPERATIONS + 1
    await call.write(
        kv_pb2.BatchRequest(
            operations=[
                kv_pb2.BatchOperation(id=i, get=kv_pb2.GetRequest(key=b"k", serializable=True))
                for i in range(1, too_many + 1)
            ]
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    failure = rpc_failure(refused.value)
    assert failure.code == Code.INVALID_ARGUMENT
    assert failure.details == (
        f"operations: a batch message holds at most {defaults.MAX_BATCH_OPERATIONS} "
        f"operations, got {too_many}: send more messages"
    )
    assert "\n" not in failure.details


async def test_a_message_at_the_cap_is_served_a_slice_at_a_time_with_the_loop_let_in(
    channel: tuple[FakeNode, grpc.aio.Channel, int],
) -> None:
    """While one message of MAX_BATCH_OPERATIONS reads is served, another task on the
    member's loop runs between slices, not only before and after the whole message."""
    _, conn, _ = channel
    loop_turns: list[int] = []
    served = {"count": 0}
    original = kv_batch.get_answer

    def counting_answer(key: bytes, n: FakeNode) -> Any:
        served["count"] += 1
        return original(key, n)

    async def ticker() -> None:
        while True:
            loop_turns.append(served["count"])
            await asyncio.sleep(0)

    call: Any = kv_pb2_grpc.KVStub(conn).Batch(None)
    count = defaults.MAX_BATCH_OPERATIONS
    operations = [
        kv_pb2.BatchOperation(id=i, get=kv_pb2.GetRequest(key=b"k%d" % i))
        for i in range(1, count + 1)
    ]
    # The fake node's server runs on this test's loop, so the ticker shares it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kv_batch, "get_answer", counting_answer)
        task = asyncio.create_task(ticker())
        try:
            await call.write(kv_pb2.BatchRequest(operations=operations))
            answered = 0
            while answered < count:
                answered += len((await call.read()).results)
        finally:
            task.cancel()
    # The ticker saw the member part-way through the message's answers many times.
    inside = {seen for seen in loop_turns if 0 < seen < count}
    assert len(inside) >= 5, sorted(inside)


async def test_a_prefix_delete_past_the_cap_is_refused_before_it_is_proposed(
    channel: tuple[FakeNode, grpc.aio.Channel, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, conn, session_id = channel
    monkeypatch.setattr(kv_ops, "MAX_DELETE_KEYS", 3)
    kv = kv_pb2_grpc.KVStub(conn)
    for sequence, key in enumerate([b"p/1", b"p/2", b"p/3", b"p/4", b"q/1"], start=1):
        await kv.Put(kv_pb2.PutRequest(header=header(session_id, sequence), key=key, value=b"v"))
    proposed = len(node.proposals)

    failure = await fails(
        kv.Delete(kv_pb2.DeleteRequest(header=header(session_id, 6), key=b"p/", prefix=True))
    )

    assert failure.code == Code.INVALID_ARGUMENT
    assert failure.details == (
        "prefix: b'p/' covers 4 keys, more than the 3 one delete may remove: "
        "delete it by narrower prefixes"
    )
    assert len(node.proposals) == proposed
    # A narrower prefix goes through.
    deleted = await kv.Delete(
        kv_pb2.DeleteRequest(header=header(session_id, 7), key=b"p/1", prefix=True)
    )
    assert deleted.deleted == 1


async def test_a_lease_holding_the_most_keys_takes_no_more(
    channel: tuple[FakeNode, grpc.aio.Channel, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, conn, session_id = channel
    monkeypatch.setattr(kv_ops, "MAX_LEASE_KEYS", 2)
    kv, lease = kv_pb2_grpc.KVStub(conn), lease_pb2_grpc.LeaseStub(conn)
    grant = await lease.Grant(
        lease_pb2.LeaseGrantRequest(header=header(session_id, 1), ttl_ms=60_000)
    )
    for sequence, key in [(2, b"a"), (3, b"b")]:
        await kv.Put(
            kv_pb2.PutRequest(
                header=header(session_id, sequence), key=key, value=b"v", lease_id=grant.lease_id
            )
        )
    failure = await fails(
        kv.Put(
            kv_pb2.PutRequest(
                header=header(session_id, 4), key=b"c", value=b"v", lease_id=grant.lease_id
            )
        )
    )
    assert failure.code == Code.INVALID_ARGUMENT
    assert failure.details == (
        f"lease_id: lease {grant.lease_id} holds 2 keys, the most one lease may hold: "
        "attach the key to another lease"
    )
    # A key without the lease is still written.
    await kv.Put(kv_pb2.PutRequest(header=header(session_id, 5), key=b"c", value=b"v"))


@pytest.mark.parametrize("ttl_ms", [defaults.MAX_LEASE_TTL_MS + 1, 2**63 - 1])
async def test_lease_and_session_ttls_past_the_limit_are_refused_naming_it(
    channel: tuple[FakeNode, grpc.aio.Channel, int], ttl_ms: int
) -> None:
    node, conn, session_id = channel
    proposed = len(node.proposals)
    lease = await fails(
        lease_pb2_grpc.LeaseStub(conn).Grant(
            lease_pb2.LeaseGrantRequest(header=header(session_id, 1), ttl_ms=ttl_ms)
        )
    )
    session = await fails(
        session_pb2_grpc.SessionStub(conn).Open(session_pb2.SessionOpenRequest(ttl_ms=ttl_ms))
    )
    assert (lease.code, session.code) == (Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT)
    assert lease.details == (
        f"ttl_ms: must be at most {defaults.MAX_LEASE_TTL_MS} (7 days, the longest lease "
        f"TTL), got {ttl_ms}"
    )
    assert session.details == (
        f"ttl_ms: must be at most {defaults.MAX_SESSION_TTL_MS} (7 days, the longest session "
        f"TTL), got {ttl_ms}"
    )
    assert len(node.proposals) == proposed
    # The limit itself is granted.
    granted = await lease_pb2_grpc.LeaseStub(conn).Grant(
        lease_pb2.LeaseGrantRequest(header=header(session_id, 2), ttl_ms=defaults.MAX_LEASE_TTL_MS)
    )
    assert granted.ttl_ms == defaults.MAX_LEASE_TTL_MS


async def test_a_keep_alive_of_a_lease_that_does_not_exist_answers_not_found(
    channel: tuple[FakeNode, grpc.aio.Channel, int],
) -> None:
    _, conn, session_id = channel
    stub = lease_pb2_grpc.LeaseStub(conn)
    grant = await stub.Grant(
        lease_pb2.LeaseGrantRequest(header=header(session_id, 1), ttl_ms=3_000)
    )
    call = stub.KeepAlive()
    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=98765))
    missing = await call.read()
    assert isinstance(missing, lease_pb2.LeaseKeepAliveResponse)
    assert missing.HasField("error")
    assert (missing.lease_id, missing.ttl_ms) == (98765, 0)
    assert (missing.error.code, missing.error.reason) == (
        Code.NOT_FOUND.value[0],
        "LEASE_NOT_FOUND",
    )
    assert "98765" in missing.error.message
    # The stream goes on for the caller's other leases, which answer without an error.
    await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=grant.lease_id))
    alive = await call.read()
    assert isinstance(alive, lease_pb2.LeaseKeepAliveResponse)
    assert (alive.ttl_ms, alive.HasField("error")) == (3_000, False)
    await call.done_writing()


async def test_a_prefix_delete_that_would_list_more_keys_than_an_answer_holds_is_refused(
    channel: tuple[FakeNode, grpc.aio.Channel, int],
) -> None:
    node, conn, session_id = channel
    kv = kv_pb2_grpc.KVStub(conn)
    most = node.state.limits.max_answer_keys
    for sequence in range(1, most + 2):
        node.state.kv.put(b"p/%06d" % sequence, b"v", sequence, 0)
    proposed = len(node.proposals)

    failure = await fails(
        kv.Delete(
            kv_pb2.DeleteRequest(header=header(session_id, 1), key=b"p/", prefix=True, prev_kv=True)
        )
    )

    assert failure.code == Code.INVALID_ARGUMENT
    assert failure.details == (
        f"prev_kv: b'p/' covers {most + 1} keys, more than the {most} an answer may list: "
        "read them with Range first, or delete without prev_kv"
    )
    assert len(node.proposals) == proposed
