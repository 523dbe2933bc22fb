"""The KV batch stream's attempt deadlines: one timer for all of a stream's operations, not
one per operation (an ``asyncio.timeout`` scope per operation cost the client as much CPU as
the rest of a batched put's way through it), with the same endings as before: an operation
unanswered at its deadline fails DEADLINE_EXCEEDED and ends its stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rallypoint.client.errors import DeadlineExceededError, UnavailableError
from rallypoint.client.kv_stream import KVStream
from rallypoint.proto.v1 import kv_pb2

from .test_kv_stream import HeldCall, HeldTransport

ADDRESS = "10.0.0.1:2379"


async def _put(streams: KVStream, key: str, timeout_s: float) -> Any:
    return await streams.attempt(ADDRESS, "put", kv_pb2.PutRequest(key=key.encode()), timeout_s)


async def test_concurrent_operations_share_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 callers on one stream arm one timer between them (each armed its own before)."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    call = HeldCall()
    streams = KVStream(HeldTransport(call))  # type: ignore[arg-type]
    callers = [asyncio.create_task(_put(streams, f"k{i}", 30.0)) for i in range(64)]
    for _ in range(3):
        await asyncio.sleep(0)
    while call.written:
        call.answer(call.written.pop(0))
        for _ in range(3):
            await asyncio.sleep(0)
    answers = await asyncio.gather(*callers)
    assert len(answers) == 64
    assert len(armed) <= 2, f"{len(armed)} timers armed for 64 operations"
    await streams.close()


async def test_an_unanswered_operation_fails_at_its_deadline_and_ends_its_stream() -> None:
    """The member never answers: the operation with the earlier deadline fails
    DEADLINE_EXCEEDED at it, its stream is ended (the other operation on it fails UNAVAILABLE,
    to be retried) and the next operation opens a new stream."""
    call = HeldCall()
    streams = KVStream(HeldTransport(call))  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    started = loop.time()
    later = asyncio.create_task(_put(streams, "later", 30.0))
    await asyncio.sleep(0)
    first_stream = streams.streams[ADDRESS]
    with pytest.raises(DeadlineExceededError):
        await _put(streams, "soon", 0.05)
    assert 0.04 <= loop.time() - started < 5.0
    with pytest.raises(UnavailableError):
        await later
    assert first_stream.broken
    answered = asyncio.create_task(_put(streams, "next", 30.0))
    for _ in range(3):
        await asyncio.sleep(0)
    assert streams.streams[ADDRESS] is not first_stream
    call.answer(call.written[-1])
    assert (await answered).WhichOneof("result") == "put"
    await streams.close()


async def test_operations_answered_in_time_do_not_fail_later() -> None:
    """An answered operation's deadline passing changes nothing, and a stream closed with
    deadlines pending leaves no timer to fire on it."""
    call = HeldCall()
    streams = KVStream(HeldTransport(call))  # type: ignore[arg-type]
    task = asyncio.create_task(_put(streams, "quick", 0.05))
    for _ in range(3):
        await asyncio.sleep(0)
    call.answer(call.written[0])
    assert (await task).WhichOneof("result") == "put"
    stream = streams.streams[ADDRESS]
    await asyncio.sleep(0.1)
    assert not stream.broken
    await streams.close()
    assert len(stream._deadlines) == 0
