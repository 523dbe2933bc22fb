"""The client's KV batching against members that predate KV/Batch (the fake cluster answers
it UNIMPLEMENTED): every call falls back to the unary RPC, with the same results and
retries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rallypoint.client import Client

from .fake_server import FakeCluster


async def test_a_member_without_the_stream_is_served_by_unary_calls(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    client = await make_client(kv_batching="always").connect()
    puts = await asyncio.gather(*(client.put(f"k{i}", str(i)) for i in range(10)))
    assert [p.kv.value for p in puts] == [str(i).encode() for i in range(10)]
    got = await client.get("k3")
    assert got is not None and got.value == b"3"
    assert (await client.delete("k3")).deleted == 1
    stream: Any = client._caller._kv_stream
    assert stream.unsupported and stream.unsupported <= set(cluster.addresses)
    assert sum(m.calls["Put"] for m in cluster.members) == 10
    assert sum(m.calls["Delete"] for m in cluster.members) == 1


class EndingCall:
    """A batch stream call whose member ends it at once (as a member that went away)."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, request: Any) -> None:
        raise AssertionError("nothing is sent on a stream that ended")

    async def read(self) -> Any:
        import grpc

        return grpc.aio.EOF  # type: ignore[attr-defined]

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_stream_that_broke_leaves_no_task_behind() -> None:
    """A stream the member ended is replaced on next use; its sending task used to stay
    pending forever (asyncio's "Task was destroyed but it is pending!" at exit)."""
    from rallypoint.client.kv_stream import _Stream

    call = EndingCall()
    stream = _Stream("10.0.0.1:2379", call, None, 2, 8)  # type: ignore[arg-type]
    for _ in range(10):
        if stream.broken:
            break
        await asyncio.sleep(0)
    assert stream.broken
    await asyncio.sleep(0)
    assert all(task.done() for task in stream._tasks) and call.cancelled
