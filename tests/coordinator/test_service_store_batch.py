"""RoundStore/Batch over a real gRPC server on the fake member: per-operation answers and
errors (those of the unary calls), one read barrier per message, fencing, a retried write
applied once, authorization per operation, and the client's RoundStore using the stream (and
falling back to unary MultiGet on a member that answers UNIMPLEMENTED)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rallypoint.client import Client as RallypointClient
from rallypoint.coordinator.service.roundstore import RoundStoreServicer
from rallypoint.coordinator.service.store_batch import _StoreBatchServer
from rallypoint.coordinator.service.tokens import ClientTokens
from rallypoint.proto.v1 import rendezvous_pb2 as pb
from rallypoint.proto.v1 import rendezvous_pb2_grpc, session_pb2, session_pb2_grpc
from tests.integration.harness import write_tokens_file

from .fake_node import (
    FakeNode,
    Headers,
    job_config,
    join_round,
    open_session,
    served_at,
    serving,
)
from .test_service_roundstore import LIMITS, groups

Code = grpc.StatusCode
_UNARY = {"set": "Set", "add": "Add", "compare_set": "CompareSet", "delete": "Delete"}


class Stream:
    """One RoundStore/Batch call; ``ask`` sends one message and collects all its answers."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...] = ()):
        self.call: Any = rendezvous_pb2_grpc.RoundStoreStub(channel).Batch(None, metadata=metadata)

    async def send(self, *operations: pb.StoreBatchOperation) -> None:
        await self.call.write(pb.StoreBatchRequest(operations=operations))

    async def collect(self, count: int) -> dict[int, pb.StoreBatchResult]:
        answers: dict[int, pb.StoreBatchResult] = {}
        while len(answers) < count:
            response = await self.call.read()
            assert response is not grpc.aio.EOF  # type: ignore[attr-defined]
            for result in response.results:
                answers[result.id] = result
        return answers

    async def ask(self, *operations: pb.StoreBatchOperation) -> dict[int, pb.StoreBatchResult]:
        await self.send(*operations)
        return await self.collect(len(operations))


def multi_get(
    op_id: int, scope: pb.StoreScope, *keys: list[bytes], timeout_ms: int = 0, partial: bool = True
) -> pb.StoreBatchOperation:
    request = pb.StoreMultiGetRequest(
        scope=scope, groups=groups(*keys), timeout_ms=timeout_ms, partial=partial
    )
    return pb.StoreBatchOperation(id=op_id, multi_get=request)


def values(result: pb.StoreBatchResult) -> list[list[bytes] | None]:
    assert result.WhichOneof("result") == "multi_get", result
    return [list(g.values) if g.complete else None for g in result.multi_get.groups]


class Round:
    def __init__(self, node: FakeNode, headers: Headers, members: tuple[int, int]) -> None:
        self.node, self.headers, self.members = node, headers, members

    def scope(self, member: int = 0) -> pb.StoreScope:
        return pb.StoreScope(job="j", round=1, participant_id=self.members[member])

    def set(self, op_id: int, key: bytes, value: bytes, member: int = 0) -> Any:
        request = pb.StoreSetRequest(
            header=self.headers(), scope=self.scope(member), key=key, value=value
        )
        return pb.StoreBatchOperation(id=op_id, set=request)

    def add(self, op_id: int, key: bytes, delta: int, header: Any = None) -> Any:
        request = pb.StoreAddRequest(
            header=header or self.headers(), scope=self.scope(), key=key, delta=delta
        )
        return pb.StoreBatchOperation(id=op_id, add=request)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Round, grpc.aio.Channel]]:
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        headers = await open_session(node)
        a, b = await join_round(channel, headers, "j", 2)
        yield Round(node, headers, (a.participant_id, b.participant_id)), channel


async def test_each_operation_has_its_answer_or_its_unary_error_and_reads_share_a_barrier(
    served: tuple[Round, grpc.aio.Channel],
) -> None:
    r, channel = served
    stream = Stream(channel)
    written = await stream.ask(r.set(1, b"a", b"1"), r.set(2, b"n", b"x"), r.add(3, b"c", 5))
    assert [written[i].WhichOneof("result") for i in (1, 2, 3)] == ["set", "set", "add"]
    assert written[3].add.value == 5
    barriers = r.node.read_barriers
    delete = pb.StoreDeleteRequest(header=r.headers(), scope=r.scope(), key=b"zz")
    answers = await stream.ask(
        multi_get(10, r.scope(1), [b"a"], [b"a", b"missing"]),
        multi_get(11, r.scope(), [b"c", b"a"]),
        pb.StoreBatchOperation(id=12, multi_get=pb.StoreMultiGetRequest(scope=r.scope())),
        r.add(13, b"n", 1),
        pb.StoreBatchOperation(id=14, delete=delete),
        pb.StoreBatchOperation(id=15),
        multi_get(0, r.scope(), [b"a"]),
    )
    assert values(answers[10]) == [[b"1"], None]
    assert values(answers[11]) == [[b"5", b"1"]]
    assert r.node.read_barriers == barriers + 1  # one barrier for the message's reads
    invalid = answers[12].error
    assert (invalid.code, invalid.message) == (
        Code.INVALID_ARGUMENT.value[0],
        "groups: must name at least one group of keys",
    )
    not_integer = answers[13].error
    assert (not_integer.code, not_integer.reason) == (
        Code.FAILED_PRECONDITION.value[0],
        "NOT_AN_INTEGER",
    )
    assert answers[14].delete.existed is False
    assert answers[15].error.code == Code.INVALID_ARGUMENT.value[0]
    assert "\n" not in answers[15].error.message
    assert answers[0].error.message == "operations.id: must not be 0 (it matches the answer)"


async def test_a_waiting_read_does_not_hold_the_others_and_fencing_is_per_operation(
    served: tuple[Round, grpc.aio.Channel],
) -> None:
    r, channel = served
    stream = Stream(channel)
    await stream.send(
        multi_get(1, r.scope(), [b"later"], timeout_ms=30_000, partial=False),
        multi_get(2, r.scope(), [b"none"]),
    )
    first = await stream.collect(1)
    assert values(first[2]) == [None]
    await Stream(channel).ask(r.set(3, b"later", b"v", member=1))
    assert values((await stream.collect(1))[1]) == [[b"v"]]
    # A scope that is not a member of the active round is refused per operation.
    outsider = pb.StoreScope(job="j", round=2, participant_id=r.members[0])
    stale_set = pb.StoreSetRequest(header=r.headers(), scope=outsider, key=b"k", value=b"v")
    answers = await stream.ask(
        multi_get(4, outsider, [b"later"]),
        pb.StoreBatchOperation(id=5, set=stale_set),
        multi_get(6, r.scope(), [b"later"]),
    )
    for i in (4, 5):
        assert answers[i].error.code == Code.FAILED_PRECONDITION.value[0]
        assert answers[i].error.reason == "STALE_ROUND"
    assert values(answers[6]) == [[b"v"]]


async def test_a_write_is_answered_while_a_read_of_its_message_still_waits(
    served: tuple[Round, grpc.aio.Channel],
) -> None:
    """A message holding a blocked multi_get and a write answers the write when it is applied:
    the caller may set the read's missing key only after that answer (torch's store does:
    one thread waits in multi_get while another sets the keys one by one)."""
    r, channel = served
    stream = Stream(channel)
    await stream.send(
        multi_get(1, r.scope(), [b"x", b"y"], timeout_ms=30_000, partial=False),
        r.set(2, b"x", b"X"),
    )
    written = await asyncio.wait_for(stream.collect(1), timeout=10)
    assert list(written) == [2] and written[2].WhichOneof("result") == "set"
    await Stream(channel).ask(r.set(3, b"y", b"Y"))
    assert values((await stream.collect(1))[1]) == [[b"X", b"Y"]]


async def test_a_retried_write_applies_once(served: tuple[Round, grpc.aio.Channel]) -> None:
    r, channel = served
    header = r.headers()
    first = await Stream(channel).ask(r.add(1, b"count", 5, header))
    again = await Stream(channel).ask(r.add(2, b"count", 5, header))
    assert first[1].add.value == again[2].add.value == 5
    answers = await Stream(channel).ask(multi_get(3, r.scope(), [b"count"]))
    assert values(answers[3]) == [[b"5"]]


TOKENS = {"read-token": "read", "job-token": "job:j", "other-token": "job:other"}


async def test_each_operation_is_authorized_as_its_unary_call(tmp_path: Path) -> None:
    node = FakeNode(LIMITS)
    tokens = ClientTokens(path=str(write_tokens_file(tmp_path / "tokens.toml", TOKENS)))
    job = (("authorization", "Bearer job-token"),)
    other = (("authorization", "Bearer other-token"),)
    reader = (("authorization", "Bearer read-token"),)
    async with serving(node, tokens=tokens) as channel:
        opened = await session_pb2_grpc.SessionStub(channel).Open(
            session_pb2.SessionOpenRequest(ttl_ms=60_000), metadata=job
        )
        headers = Headers(opened.session_id)
        joined = await rendezvous_pb2_grpc.RendezvousStub(channel).Join(
            pb.JoinRequest(header=headers(), job="j", name="w0", config=job_config(1, 1)),
            metadata=job,
        )
        scope = pb.StoreScope(job="j", round=1, participant_id=joined.participant_id)
        # The job's own token may use the stream for its job's store, writes included.
        own = pb.StoreSetRequest(header=headers(), scope=scope, key=b"own", value=b"1")
        answers = await Stream(channel, job).ask(
            pb.StoreBatchOperation(id=9, set=own), multi_get(8, scope, [b"k"])
        )
        assert answers[9].WhichOneof("result") == "set"
        assert values(answers[8]) == [None]
        answers = await Stream(channel, other).ask(multi_get(1, scope, [b"k"]))
        assert answers[1].error.code == Code.PERMISSION_DENIED.value[0]
        assert "job 'j'" in answers[1].error.message
        write = pb.StoreSetRequest(header=headers(), scope=scope, key=b"k", value=b"v")
        # The read role may open the stream and read, not write.
        answers = await Stream(channel, reader).ask(
            pb.StoreBatchOperation(id=2, set=write), multi_get(3, scope, [b"k"])
        )
        assert answers[2].error.code == Code.PERMISSION_DENIED.value[0]
        assert values(answers[3]) == [None]
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await Stream(channel).ask(multi_get(4, scope, [b"k"]))
        assert anonymous.value.code() is Code.UNAUTHENTICATED


@contextlib.asynccontextmanager
async def round_at(node: FakeNode) -> AsyncIterator[tuple[str, int]]:
    """A member serving ``node`` with a round of one member in job "j": its address and the
    member's participant id."""
    async with served_at(node) as address, serving(node) as channel:
        (joined,) = await join_round(channel, await open_session(node), "j", 1)
        yield address, joined.participant_id


async def test_the_client_s_reads_and_writes_use_the_stream_and_fall_back_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = FakeNode(LIMITS)
    unary_calls: list[str] = []

    def counting(name: str) -> None:
        unary = getattr(RoundStoreServicer, name)

        async def counted(self: RoundStoreServicer, request: Any, context: Any) -> Any:
            unary_calls.append(name)
            return await unary(self, request, context)

        monkeypatch.setattr(RoundStoreServicer, name, counted)

    for name in ("MultiGet", "Set", "Add", "CompareSet", "Delete"):
        counting(name)
    # The stream's writes run the unary methods' code too: counted apart.
    stream_writes: list[str] = []
    stream_write = _StoreBatchServer.write

    async def counted_write(self: Any, operation_id: int, kind: str, request: Any) -> Any:
        stream_writes.append(kind)
        return await stream_write(self, operation_id, kind, request)

    monkeypatch.setattr(_StoreBatchServer, "write", counted_write)
    writes = ["set", "add", "add", "compare_set", "compare_set", "delete", "delete"]

    async def use(store: Any, value: bytes) -> None:
        await store.set("k", value)
        got = await asyncio.gather(
            store.read_groups([["k"], ["x"]]), store.multi_get(["k"], timeout_s=1.0)
        )
        assert got == [[[value], None], [value]]
        assert await store.add("n", 2) == 2
        assert await store.add("n", 3) == 5
        swapped = await store.compare_set("c", b"", b"first")
        assert (swapped.swapped, swapped.value) == (True, b"first")
        refused = await store.compare_set("c", b"other", b"second")
        assert (refused.swapped, refused.value) == (False, b"first")
        assert await store.delete("c") is True
        assert await store.delete("c") is False

    async with (
        round_at(node) as (address, participant_id),
        RallypointClient([address], timeout_s=5.0) as client,
    ):
        await use(client.round_store("j", 1, participant_id), b"v")
        # Every read and write on the stream: no MultiGet call, the write methods run only
        # for the stream's operations.
        assert stream_writes == writes
        assert unary_calls == [_UNARY[kind] for kind in writes]
        stream_writes.clear()
        unary_calls.clear()
        streams: Any = client._caller.store_streams
        assert streams is not None and set(streams.streams) == {address}

    async def unimplemented(self: RoundStoreServicer, requests: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield  # pragma: no cover

    monkeypatch.setattr(RoundStoreServicer, "Batch", unimplemented)
    async with (
        round_at(FakeNode(LIMITS)) as (address, participant_id),
        RallypointClient([address], timeout_s=5.0) as client,
    ):
        await use(client.round_store("j", 1, participant_id), b"w")
        streams = client._caller.store_streams
        assert streams is not None and streams.unsupported == {address}
        assert stream_writes == []
        assert sorted(set(unary_calls)) == ["Add", "CompareSet", "Delete", "MultiGet", "Set"]
