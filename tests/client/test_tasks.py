"""Stopping tasks: a cancellation meant to stop a loop is never lost.

The lease keeper is the loop whose lost cancellation was seen: ``Client.close()`` cancelled
it in the turn of the loop in which a keep-alive answer arrived, ``asyncio.wait_for``
returned the answer instead of raising, the keeper kept its leases alive for good and
``close()`` waited for it forever (an integration test hung for 80 minutes).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rallypoint.client import Lease
from rallypoint.client.lease import LeaseKeeper
from rallypoint.client.tasks import cancel_and_wait
from rallypoint.proto.v1 import lease_pb2

from .test_lease import eventually


class _KeepAliveCall:
    """A KeepAlive stream whose answers the test hands over; ``on_read`` runs as a read
    returns its answer."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[lease_pb2.LeaseKeepAliveResponse] = asyncio.Queue()
        self.written: list[int] = []
        self.cancelled = False
        self.on_read: Any = None

    async def write(self, request: lease_pb2.LeaseKeepAliveRequest) -> None:
        self.written.append(request.lease_id)

    async def read(self) -> lease_pb2.LeaseKeepAliveResponse:
        answer = await self.answers.get()
        if self.on_read is not None:
            self.on_read()
        return answer

    def cancel(self) -> None:
        self.cancelled = True


class _Retrier:
    def answered(self) -> None:
        pass

    async def after_failure(self, address: str, error: Exception) -> None:
        await asyncio.sleep(0.01)


class _Transport:
    metadata = ()

    def __init__(self, call: _KeepAliveCall) -> None:
        self._call = call

    def pick(self) -> str:
        return "member-1"

    def stubs(self, address: str) -> Any:
        call = self._call

        class _Lease:
            @staticmethod
            def KeepAlive(request: object, metadata: object) -> _KeepAliveCall:
                return call

        class _Stubs:
            lease = _Lease

        return _Stubs

    def note_success(self, address: str) -> None:
        pass


class _Caller:
    def __init__(self, call: _KeepAliveCall) -> None:
        self.transport = _Transport(call)

    def retrier(self) -> _Retrier:
        return _Retrier()


async def _nothing(lease: Lease) -> None:
    pass


async def test_a_lease_keeper_closed_as_an_answer_arrives_stops() -> None:
    call = _KeepAliveCall()
    keeper = LeaseKeeper(_Caller(call))  # type: ignore[arg-type]
    lease = Lease(7, 1, 30.0, _nothing)
    keeper.add(lease, asyncio.get_running_loop().time())
    await eventually(lambda: call.written == [7], "the first keep-alive")
    # close() starts in the turn of the loop in which the keeper's read gets its answer.
    closing: list[asyncio.Task[None]] = []
    call.on_read = lambda: closing.append(asyncio.ensure_future(keeper.close()))
    call.answers.put_nowait(lease_pb2.LeaseKeepAliveResponse(lease_id=7, ttl_ms=30_000))
    await eventually(lambda: closing, "close() to start")
    done, _ = await asyncio.wait(closing, timeout=5)
    assert done, "close() never returned: the keeper lost the cancellation that stops it"
    assert call.cancelled
    assert not lease.alive and lease.lost_reason == "the client was closed"


async def test_cancel_and_wait_keeps_the_callers_own_cancellation() -> None:
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await release.wait()  # a clean-up that takes a while

    async def stopper(child: asyncio.Task[None]) -> str:
        await cancel_and_wait(child)
        return "went on after being cancelled"

    child = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    outer = asyncio.create_task(stopper(child))
    await asyncio.sleep(0.01)
    outer.cancel()  # while it waits for the child's clean-up
    await asyncio.sleep(0.01)
    assert not outer.done(), "it returned before the child it stops had ended"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert child.cancelled()


async def test_cancel_and_wait_swallows_only_the_stopped_tasks_cancellation() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def fails_on_stop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("clean-up failed")

    first, second = asyncio.create_task(forever()), asyncio.create_task(fails_on_stop())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="clean-up failed"):
        await cancel_and_wait(first, None, second)
    assert first.cancelled() and second.done()
    await cancel_and_wait(first, None)  # already ended: nothing to raise
