"""The Watch service: one response per revision, in order, no gaps; compaction; cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from rallypoint.client import Client
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.commands import Delete, Envelope, Put, SessionOpen
from rallypoint.coordinator.state.commands import encode_envelope as encode
from rallypoint.proto.v1 import watch_pb2, watch_pb2_grpc
from tests.client.test_watch import take

from .fake_node import FakeNode, rpc_failure, served_at, serving, until

Code = grpc.StatusCode


class Writer:
    """Writes straight into the fake member's state machine, one entry per call, at the
    member's clock (as its servicers' proposals are, so neither expires the other's session)."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.sequence = 0

    async def open(self) -> None:
        await self.node.apply(encode(Envelope(0, 0, 0, self.node.clock_ms, SessionOpen(60_000))))
        self.session_id = self.node.index

    async def put(self, key: bytes, value: bytes = b"v") -> int:
        return await self._write(Put(key, value))

    async def delete_prefix(self, prefix: bytes) -> int:
        return await self._write(Delete(prefix, prefix=True))

    async def _write(self, command: Put | Delete) -> int:
        self.sequence += 1
        # Each write acknowledges the answers before it, so a long run of writes never
        # reaches the session's bound on cached answers.
        envelope = Envelope(
            self.session_id, self.sequence, self.sequence, self.node.clock_ms, command
        )
        await self.node.apply(encode(envelope))
        return self.node.index


@pytest.fixture
async def node() -> FakeNode:
    return FakeNode(Limits(max_history_events=5))


@pytest.fixture
async def stub(node: FakeNode) -> AsyncIterator[watch_pb2_grpc.WatchStub]:
    async with serving(node) as channel:
        yield watch_pb2_grpc.WatchStub(channel)


@pytest.fixture
async def writer(node: FakeNode) -> Writer:
    writer = Writer(node)
    await writer.open()
    return writer


async def test_the_fake_member_delivers_a_change_applied_while_a_batch_waits(
    node: FakeNode, writer: Writer
) -> None:
    """The fake's watch (every test here stands on it) reads on from what it had read, not
    from what is applied when its consumer comes back: a write in between is delivered."""
    first = await writer.put(b"w/a", b"1")
    batches = node.watch(first, b"w/", True)
    assert [e.revision for e in await anext(batches)] == [first]
    second = await writer.put(b"w/b", b"2")
    assert [e.revision for e in await asyncio.wait_for(anext(batches), 5.0)] == [second]
    await batches.aclose()


async def test_history_then_live_changes_arrive_in_revision_order(
    node: FakeNode, stub: watch_pb2_grpc.WatchStub, writer: Writer
) -> None:
    first = await writer.put(b"w/a", b"1")
    await writer.put(b"other")
    call = stub.Watch(watch_pb2.WatchRequest(key=b"w/", prefix=True, start_revision=first))
    responses = aiter(call)
    old = await anext(responses)
    assert [(e.type, e.kv.key, e.kv.value) for e in old.events] == [(watch_pb2.PUT, b"w/a", b"1")]

    second = await writer.put(b"w/b", b"2")
    await writer.put(b"w/a", b"3")
    deleted = await writer.delete_prefix(b"w/")
    seen = [await anext(responses) for _ in range(3)]
    revisions = [[e.kv.mod_revision for e in response.events] for response in seen]
    assert revisions == [[second], [second + 1], [deleted, deleted]]
    delete_batch = seen[2].events
    assert [(e.type, e.kv.key, e.kv.value) for e in delete_batch] == [
        (watch_pb2.DELETE, b"w/a", b""),
        (watch_pb2.DELETE, b"w/b", b""),
    ]
    assert delete_batch[0].prev_revision == second + 1 and not delete_batch[0].HasField("prev_kv")
    assert seen[2].header.revision == deleted
    call.cancel()


async def test_a_single_key_watch_from_now_with_previous_values(
    node: FakeNode, stub: watch_pb2_grpc.WatchStub, writer: Writer
) -> None:
    await writer.put(b"k", b"before")
    call = stub.Watch(watch_pb2.WatchRequest(key=b"k", prev_kv=True))
    await until(lambda: node.open_watches == 1)
    await writer.put(b"k2")
    changed = await writer.put(b"k", b"after")
    response = await anext(aiter(call))
    (event,) = response.events
    assert event.kv.mod_revision == changed and event.prev_kv.value == b"before"
    call.cancel()


async def test_a_compacted_start_sends_the_oldest_revision_then_out_of_range(
    stub: watch_pb2_grpc.WatchStub, writer: Writer
) -> None:
    first = await writer.put(b"c")
    for _ in range(5):
        await writer.put(b"c")
    call = stub.Watch(watch_pb2.WatchRequest(key=b"c", start_revision=first))
    responses, error = await _drain(call)
    assert len(responses) == 1 and not responses[0].events
    assert responses[0].compact_revision > first
    failure = rpc_failure(error)
    assert (failure.code, failure.reason) == (Code.OUT_OF_RANGE, "COMPACTED")
    assert f"revision {first} was compacted" in failure.details


async def test_cancelling_the_call_releases_the_members_watch(
    node: FakeNode, stub: watch_pb2_grpc.WatchStub, writer: Writer
) -> None:
    calls = [stub.Watch(watch_pb2.WatchRequest(key=b"x")) for _ in range(2)]
    await until(lambda: node.open_watches == 2)
    await writer.put(b"x")
    assert len((await anext(aiter(calls[0]))).events) == 1
    for call in calls:
        call.cancel()
    await until(lambda: node.open_watches == 0)
    with pytest.raises(asyncio.CancelledError):
        await anext(aiter(calls[1]))


async def test_progress_responses_when_idle(
    node: FakeNode, stub: watch_pb2_grpc.WatchStub, writer: Writer
) -> None:
    call = stub.Watch(watch_pb2.WatchRequest(key=b"p", progress_interval_ms=20))
    responses = aiter(call)
    idle = await anext(responses)
    assert not idle.events and idle.header.revision == node.state.revision
    changed = await writer.put(b"p")
    while not (response := await anext(responses)).events:
        pass
    assert [e.kv.mod_revision for e in response.events] == [changed]
    call.cancel()
    await until(lambda: node.open_watches == 0)


async def test_a_prefix_delete_of_50k_keys_reaches_caught_up_watchers_in_several_messages() -> None:
    """The revision is larger than the history bound (10,000 events) and than one answer:
    caught-up watchers (raw, and the client library's) get all of it, split into fragments,
    then the next change, and never COMPACTED (the fault: "oldest" one past the head)."""
    node = FakeNode()  # the default limits
    writer = Writer(node)
    await writer.open()
    for i in range(50_000):
        await writer.put(b"big/%05d" % i)
    start = node.index + 1
    async with served_at(node) as address, Client([address], timeout_s=30.0) as client:
        stub = watch_pb2_grpc.WatchStub(client_channel := grpc.aio.insecure_channel(address))
        call = stub.Watch(watch_pb2.WatchRequest(key=b"big/", prefix=True, start_revision=start))
        watcher = client.watch("big/", prefix=True, start_revision=start)
        await watcher.start()
        await until(lambda: node.open_watches == 2)
        # Applied back to back, as one batch of committed entries would be.
        deleted = await writer.delete_prefix(b"big/")
        after = await writer.put(b"big/after")

        responses = []
        async with asyncio.timeout(60):
            async for response in call:
                assert not response.compact_revision
                responses.append(response)
                if response.events[-1].kv.mod_revision == after:
                    break
        call.cancel()
        await client_channel.close(None)
        parts = [r for r in responses if r.events[0].kv.mod_revision == deleted]
        assert len(parts) >= 5
        assert [r.fragment for r in parts] == [True] * (len(parts) - 1) + [False]
        keys = [e.kv.key for r in parts for e in r.events]
        assert keys == [b"big/%05d" % i for i in range(50_000)]

        seen = await take(watcher, 50_001, within_s=60.0)
        await watcher.aclose()
    assert [e.kv.key for e in seen[:50_000]] == keys
    assert {e.revision for e in seen[:50_000]} == {deleted}
    assert seen[-1].revision == after


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({}, "key: must not be empty unless prefix is set"),
        ({"key": b"k", "start_revision": -1}, "start_revision: must be >= 0, got -1"),
        ({"key": b"k", "progress_interval_ms": -5}, "progress_interval_ms: must be >= 0, got -5"),
    ],
)
async def test_watch_validation(
    stub: watch_pb2_grpc.WatchStub, request_fields: dict[str, object], message: str
) -> None:
    call = stub.Watch(watch_pb2.WatchRequest(**request_fields))  # type: ignore[arg-type]
    responses, error = await _drain(call)
    failure = rpc_failure(error)
    assert not responses
    assert (failure.code, failure.details, failure.reason) == (
        Code.INVALID_ARGUMENT,
        message,
        "INVALID_REQUEST",
    )


async def _drain(
    call: grpc.aio.UnaryStreamCall[watch_pb2.WatchRequest, watch_pb2.WatchResponse],
) -> tuple[list[watch_pb2.WatchResponse], grpc.aio.AioRpcError]:
    """Every response of a call that must end with an error, and the error."""
    responses = []
    try:
        async for response in call:
            responses.append(response)
    except grpc.aio.AioRpcError as error:
        return responses, error
    raise AssertionError("the watch ended without an error")
