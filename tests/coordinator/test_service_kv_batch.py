"""KV/Batch over a real gRPC server on a fake member: per-operation answers and errors, one
barrier per message, writes proposed together, retries answered once, authorization per
operation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rallypoint.client import (
    Backoff,
    DeadlineExceededError,
    InvalidArgumentError,
    InvalidValueError,
)
from rallypoint.client import Client as RallypointClient
from rallypoint.coordinator.node.api import NotLeaderError, ProposalTimeoutError
from rallypoint.coordinator.service.tokens import ClientTokens
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.commands import Put
from rallypoint.proto.v1 import common_pb2, kv_pb2, kv_pb2_grpc, session_pb2, session_pb2_grpc
from tests.integration.harness import write_tokens_file

from .fake_node import FakeNode, rpc_failure, served_at, serving

Code = grpc.StatusCode


class Stream:
    """One KV/Batch call; ``ask`` sends one message and collects the answers to all of it."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...] = ()):
        self.call: Any = kv_pb2_grpc.KVStub(channel).Batch(None, metadata=metadata)

    async def ask(self, *operations: kv_pb2.BatchOperation) -> dict[int, kv_pb2.BatchResult]:
        await self.call.write(kv_pb2.BatchRequest(operations=operations))
        answers: dict[int, kv_pb2.BatchResult] = {}
        while len(answers) < len(operations):
            response = await self.call.read()
            assert response is not grpc.aio.EOF  # type: ignore[attr-defined]
            for result in response.results:
                answers[result.id] = result
        return answers


def put(op_id: int, session: int, sequence: int, key: bytes, value: bytes = b"v") -> Any:
    header = common_pb2.RequestHeader(session_id=session, sequence=sequence)
    return kv_pb2.BatchOperation(
        id=op_id, put=kv_pb2.PutRequest(header=header, key=key, value=value)
    )


def get(op_id: int, key: bytes, serializable: bool = False) -> Any:
    return kv_pb2.BatchOperation(
        id=op_id, get=kv_pb2.GetRequest(key=key, serializable=serializable)
    )


async def open_session(channel: grpc.aio.Channel, metadata: Any = ()) -> int:
    opened = await session_pb2_grpc.SessionStub(channel).Open(
        session_pb2.SessionOpenRequest(ttl_ms=60_000), metadata=metadata
    )
    return int(opened.session_id)


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeNode, grpc.aio.Channel]]:
    node = FakeNode(Limits(max_key_bytes=16, max_value_bytes=32))
    async with serving(node) as channel:
        yield node, channel


async def test_each_operation_gets_its_own_answer_by_id(
    served: tuple[FakeNode, grpc.aio.Channel],
) -> None:
    node, channel = served
    session = await open_session(channel)
    stream = Stream(channel)
    first = await stream.ask(put(7, session, 1, b"a", b"1"), put(9, session, 2, b"b", b"2"))
    assert first[7].put.kv.value == b"1" and first[9].put.kv.value == b"2"
    delete = kv_pb2.BatchOperation(
        id=11,
        delete=kv_pb2.DeleteRequest(
            header=common_pb2.RequestHeader(session_id=session, sequence=3), key=b"b"
        ),
    )
    answers = await stream.ask(get(3, b"a"), get(4, b"zz"), get(5, b"a", True), delete)
    assert answers[3].get.kv.value == b"1"
    assert not answers[4].get.HasField("kv")
    assert answers[5].get.kv == answers[3].get.kv
    assert answers[11].delete.deleted == 1
    assert node.state.get(b"b") is None
    cas = [
        kv_pb2.BatchOperation(
            id=21,
            compare_and_set=kv_pb2.CompareAndSetRequest(
                header=common_pb2.RequestHeader(session_id=session, sequence=4),
                key=b"a",
                value_equals=b"1",
                value=b"2",
            ),
        ),
        kv_pb2.BatchOperation(
            id=22,
            compare_and_set=kv_pb2.CompareAndSetRequest(
                header=common_pb2.RequestHeader(session_id=session, sequence=5),
                key=b"a",
                must_not_exist=True,
                value=b"3",
            ),
        ),
    ]
    swapped = await stream.ask(*cas)
    assert swapped[21].compare_and_set.succeeded
    assert not swapped[22].compare_and_set.succeeded
    assert swapped[22].compare_and_set.kv.value == b"2"


async def test_a_message_s_reads_share_one_barrier_and_its_writes_go_in_together(
    served: tuple[FakeNode, grpc.aio.Channel],
) -> None:
    node, channel = served
    session = await open_session(channel)
    stream = Stream(channel)
    before = len(node.proposals)
    await stream.ask(*(put(i, session, i, b"k%d" % i) for i in range(1, 6)))
    sequences = [proposal[2] for proposal in node.proposals[before:]]
    assert sequences == [1, 2, 3, 4, 5]
    barriers = node.read_barriers
    await stream.ask(get(1, b"k1"), get(2, b"k2"), get(3, b"k3"), get(4, b"k4", True))
    assert node.read_barriers == barriers + 1
    await stream.ask(get(5, b"k5", True))
    assert node.read_barriers == barriers + 1


async def test_one_bad_operation_fails_alone_with_the_unary_call_s_error(
    served: tuple[FakeNode, grpc.aio.Channel],
) -> None:
    _, channel = served
    session = await open_session(channel)
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await kv_pb2_grpc.KVStub(channel).Put(
            kv_pb2.PutRequest(
                header=common_pb2.RequestHeader(session_id=session, sequence=1), key=b""
            )
        )
    expected = rpc_failure(unary.value)
    stream = Stream(channel)
    answers = await stream.ask(
        put(1, session, 2, b""),
        put(2, session, 3, b"ok"),
        put(3, session, 4, b"x" * 17),
        kv_pb2.BatchOperation(id=4),
        kv_pb2.BatchOperation(id=0, get=kv_pb2.GetRequest(key=b"ok")),
        put(5, 0, 0, b"no-session"),
    )
    error = answers[1].error
    assert (Code.INVALID_ARGUMENT.value[0], error.message, error.reason) == (
        expected.code.value[0],
        expected.details,
        expected.reason,
    )
    assert answers[2].put.kv.key == b"ok"
    assert answers[3].error.code == Code.RESOURCE_EXHAUSTED.value[0]
    assert answers[3].error.reason == "KEY_TOO_LARGE"
    assert answers[4].error.message == (
        "operations.operation: one of put, get, delete or compare_and_set is required"
    )
    assert answers[0].error.message == "operations.id: must not be 0 (it matches the answer)"
    assert answers[5].error.code == Code.INVALID_ARGUMENT.value[0]


async def test_a_retried_write_is_answered_from_the_session_not_applied_again(
    served: tuple[FakeNode, grpc.aio.Channel],
) -> None:
    node, channel = served
    session = await open_session(channel)
    first = await Stream(channel).ask(put(1, session, 1, b"once", b"1"))
    # The same operation again, on another stream (a retry after a lost answer).
    again = await Stream(channel).ask(put(2, session, 1, b"once", b"1"))
    assert again[2].put.kv == first[1].put.kv
    kv = node.state.get(b"once")
    assert kv is not None and kv.version == 1


async def test_not_leader_and_timeouts_answer_per_operation_with_the_hint(
    served: tuple[FakeNode, grpc.aio.Channel],
) -> None:
    node, channel = served
    session = await open_session(channel)
    node.fail_next = NotLeaderError(2, "10.0.0.2:2379")
    answers = await Stream(channel).ask(put(1, session, 1, b"a"))
    error = answers[1].error
    assert (error.code, error.reason, error.leader) == (
        Code.UNAVAILABLE.value[0],
        "NOT_LEADER",
        "10.0.0.2:2379",
    )
    node.fail_next = ProposalTimeoutError("not applied within 0.1s (it may still apply)")
    answers = await Stream(channel).ask(put(2, session, 2, b"b"), put(3, session, 3, b"c"))
    assert answers[2].error.code == Code.UNAVAILABLE.value[0]
    assert answers[2].error.message == "not applied within 0.1s (it may still apply)"
    assert answers[3].put.kv.key == b"c"
    # The shared barrier failed: every linearizable read of the message says so, alone.
    node.fail_next = NotLeaderError(2, "10.0.0.2:2379")
    answers = await Stream(channel).ask(get(4, b"c"), get(5, b"a"), get(6, b"c", True))
    assert [answers[i].error.reason for i in (4, 5)] == ["NOT_LEADER", "NOT_LEADER"]
    assert answers[6].get.kv.key == b"c"


async def test_a_message_that_does_not_parse_ends_the_stream(
    served: tuple[FakeNode, grpc.aio.Channel],
) -> None:
    _, channel = served
    raw = channel.stream_stream(
        "/rallypoint.v1.KV/Batch",
        request_serializer=lambda data: data,
        response_deserializer=lambda data: data,
    )
    call: Any = raw(None)
    await call.write(b"\xff\xff\xff")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() is Code.INVALID_ARGUMENT
    assert "does not parse" in (refused.value.details() or "")


TOKENS = {"admin-token": "admin", "read-token": "read", "job-token": "job:A"}


async def test_each_operation_is_authorized_as_its_unary_call(tmp_path: Path) -> None:
    node = FakeNode()
    tokens = ClientTokens(path=str(write_tokens_file(tmp_path / "tokens.toml", TOKENS)))
    admin = (("authorization", "Bearer admin-token"),)
    reader = (("authorization", "Bearer read-token"),)
    job = (("authorization", "Bearer job-token"),)
    async with serving(node, tokens=tokens) as channel:
        admin_session = await open_session(channel, admin)
        read_session = await open_session(channel, reader)
        await Stream(channel, admin).ask(put(1, admin_session, 1, b"k", b"v"))
        answers = await Stream(channel, reader).ask(
            get(1, b"k"), put(2, read_session, 1, b"k", b"w")
        )
        assert answers[1].get.kv.value == b"v"
        assert answers[2].error.code == Code.PERMISSION_DENIED.value[0]
        assert answers[2].error.message == (
            "permission denied: role 'read' may not write keys or leases (rallypoint.v1.KV/Put)"
        )
        # A role with no KV call at all may not open the stream.
        stream = Stream(channel, job)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(stream.ask(get(1, b"k")), 5.0)
        assert refused.value.code() is Code.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await Stream(channel).ask(get(1, b"k"))
        assert anonymous.value.code() is Code.UNAUTHENTICATED
    stored = node.state.get(b"k")
    assert stored is not None and stored.value == b"v"


# ------------------------------------------------------------------ the client's batching


class LosingNode(FakeNode):
    """Applies the first ``lose`` proposals and then loses their answers (the client sees a
    timeout inside the cluster and must retry with the same sequence); slow proposals with
    ``delay_s`` let concurrent callers pile up."""

    def __init__(self, lose: int = 0, delay_s: float = 0.0) -> None:
        super().__init__()
        self.lose = lose
        self.delay_s = delay_s

    async def propose(self, command: Any, **fields: Any) -> Any:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        result = await super().propose(command, **fields)
        if self.lose > 0:
            self.lose -= 1
            raise ProposalTimeoutError("not applied within 1.0s (it may still apply)")
        return result


def batched_client(address: str, **options: Any) -> RallypointClient:
    options.setdefault("kv_batching", "always")
    options.setdefault("backoff", Backoff(base_s=0.002, cap_s=0.02))
    return RallypointClient([address], timeout_s=5.0, **options)


async def test_a_write_whose_answer_was_lost_is_retried_on_the_stream_and_applied_once() -> None:
    node = LosingNode()
    async with served_at(node) as address, batched_client(address) as client:
        node.lose = 1
        put = await client.put("once", b"1")
        assert put.kv.version == 1
        kv = node.state.get(b"once")
        assert kv is not None and kv.version == 1
        attempts = [p for p in node.proposals if isinstance(p[0], Put)]
        assert len(attempts) == 2 and attempts[0][1:3] == attempts[1][1:3]


async def test_concurrent_callers_share_the_stream_each_with_its_own_answer() -> None:
    node = LosingNode(delay_s=0.02)
    async with served_at(node) as address, batched_client(address) as client:
        puts = await asyncio.gather(*(client.put(f"k{i}", str(i)) for i in range(40)))
        assert [p.kv.value for p in puts] == [str(i).encode() for i in range(40)]
        gets = await asyncio.gather(*(client.get(f"k{i}") for i in range(40)))
        assert [g.value if g else None for g in gets] == [str(i).encode() for i in range(40)]
        swaps = await asyncio.gather(
            *(client.compare_and_set(f"k{i}", b"new", value_equals=str(i)) for i in range(40))
        )
        assert all(swap.succeeded for swap in swaps)
        stream = client._caller._kv_stream
        assert stream is not None
        (only,) = stream.streams.values()
        assert only.messages_sent < 40
        with pytest.raises(InvalidArgumentError, match="key: must not be empty"):
            await client.put("", b"x")


async def test_concurrent_mode_sends_a_lone_call_unary() -> None:
    node = FakeNode()
    async with served_at(node) as address, batched_client(address, kv_batching="concurrent") as c:
        await c.put("alone", b"1")
        assert await c.get("alone") is not None
        stream = c._caller._kv_stream
        assert stream is not None and not stream.streams
        await asyncio.gather(*(c.put(f"k{i}", b"v") for i in range(5)))
        assert stream.streams


async def test_a_not_leader_answer_sends_the_operation_to_the_leader() -> None:
    follower, leader = FakeNode(), FakeNode()
    async with served_at(leader) as leader_address, served_at(follower) as follower_address:
        follower.leader_id, follower.leader_address = 2, leader_address
        async with batched_client(follower_address, open_session_on_connect=False) as client:
            assert await client.get("k") is None
            assert follower.read_barriers == 1 and leader.read_barriers == 1
            put = await client.put("k", b"v")
            assert put.header.member_id and leader.state.get(b"k") is not None
            assert follower.state.get(b"k") is None


def test_kv_batching_takes_only_its_modes() -> None:
    with pytest.raises(InvalidValueError, match="kv_batching must be one of off, concurrent"):
        RallypointClient(["127.0.0.1:1"], kv_batching="sometimes")


async def test_each_call_keeps_its_own_deadline_and_the_others_still_apply_once() -> None:
    node = LosingNode()
    async with served_at(node) as address, batched_client(address) as client:
        node.delay_s = 0.3
        hurried = asyncio.ensure_future(client.put("hurried", b"1", timeout_s=0.1))
        patient = [asyncio.ensure_future(client.put(f"p{i}", b"1")) for i in range(5)]
        with pytest.raises(DeadlineExceededError):
            await hurried
        # The hurried call's attempt ended its stream; the others were retried on a new one
        # under their own sequences, and each applied once.
        for done in await asyncio.gather(*patient):
            assert done.kv.version == 1
        node.delay_s = 0.0
        for i in range(5):
            kv = node.state.get(b"p%d" % i)
            assert kv is not None and kv.version == 1
