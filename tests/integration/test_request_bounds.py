"""No request holds a member's event loop long enough to cost the cluster its leader (issue 33,
items 4 and 5), on a real 3-member cluster.

Before: one KV/Batch message of 200,000 gets (3 MB, allowed to a read-only client) held the
leader's loop 1.6-2.0 s and it lost leadership; a prefix delete of 300,000 keys held every
member's loop 9 s (two leader changes), one of 200,000 keys 4.7-4.9 s (a leader change). The
claims are checked on leadership and the term, never on wall time: a leader whose loop stalls
past the election timeout is replaced, and the term moves.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rallypoint.client import Client
from rallypoint.proto.v1 import (
    common_pb2,
    defaults,
    kv_pb2,
    kv_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from tests.integration.harness import ProcessCluster, running_cluster, wait_until

pytestmark = pytest.mark.integration

# Room for a 3 MB request and the answers of a message of MAX_BATCH_OPERATIONS operations.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path, 3) as c:
        yield c


def leadership(cluster: ProcessCluster) -> set[tuple[int, int]]:
    """(leader id, term) as each member reports it."""
    found = set()
    for member_id in cluster.members:
        status = cluster.status(member_id, timeout_s=10.0)
        assert status is not None, f"member {member_id} did not answer Status"
        found.add((status.leader_id, status.term))
    return found


def get(op_id: int, key: bytes) -> kv_pb2.BatchOperation:
    return kv_pb2.BatchOperation(id=op_id, get=kv_pb2.GetRequest(key=key))


async def answer_count(call: Any, expected: int) -> int:
    answered = 0
    while answered < expected:
        response = await call.read()
        assert isinstance(response, kv_pb2.BatchResponse), response
        assert all(r.WhichOneof("result") == "get" for r in response.results)
        answered += len(response.results)
    return answered


async def test_a_batch_of_200_000_gets_is_refused_and_the_leader_keeps_its_term(
    cluster: ProcessCluster,
) -> None:
    before = leadership(cluster)
    assert len(before) == 1
    leader = cluster.members[cluster.leader()]
    async with grpc.aio.insecure_channel(leader.client_address, options=CHANNEL_OPTIONS) as ch:
        call: Any = kv_pb2_grpc.KVStub(ch).Batch(None)
        await call.write(
            kv_pb2.BatchRequest(operations=[get(i, b"k%09d" % i) for i in range(1, 200_001)])
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            f"operations: a batch message holds at most {defaults.MAX_BATCH_OPERATIONS} "
            "operations, got 200000: send more messages"
        )

        # The same 200,000 gets in messages at the cap, all on one stream at once: served,
        # a slice at a time, while the leader goes on leading.
        call = kv_pb2_grpc.KVStub(ch).Batch(None)
        size = defaults.MAX_BATCH_OPERATIONS
        for start in range(1, 200_001, size):
            operations = [get(i, b"k%09d" % i) for i in range(start, start + size)]
            await call.write(kv_pb2.BatchRequest(operations=operations))
        await call.done_writing()
        assert await answer_count(call, 200_000) == 200_000
    assert leadership(cluster) == before


async def put_keys(cluster: ProcessCluster, keys: list[bytes]) -> None:
    """Write ``keys`` through the client library (batched, retried across a leader change:
    writing them is the setup, not the claim)."""
    async with Client(cluster.endpoints, timeout_s=60.0, kv_batching="always") as client:
        for start in range(0, len(keys), 2048):
            await asyncio.gather(*(client.put(key, b"v") for key in keys[start : start + 2048]))


@pytest.mark.timeout(900)
async def test_deleting_100_000_keys_leaves_the_leader_in_place(cluster: ProcessCluster) -> None:
    leader = cluster.members[cluster.leader()]
    half = defaults.MAX_DELETE_KEYS
    keys = [b"p/a/%06d" % i for i in range(half)] + [b"p/b/%06d" % i for i in range(half)]
    async with grpc.aio.insecure_channel(leader.client_address, options=CHANNEL_OPTIONS) as ch:
        await put_keys(cluster, keys)
        before = leadership(cluster)
        assert len(before) == 1
        opened = await session_pb2_grpc.SessionStub(ch).Open(
            session_pb2.SessionOpenRequest(ttl_ms=60_000)
        )
        kv = kv_pb2_grpc.KVStub(ch)

        def delete(sequence: int, prefix: bytes) -> Any:
            return kv.Delete(
                kv_pb2.DeleteRequest(
                    header=common_pb2.RequestHeader(
                        session_id=opened.session_id, sequence=sequence
                    ),
                    key=prefix,
                    prefix=True,
                ),
                timeout=120,
            )

        # More than one delete may remove: refused, in one line naming the bound.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await delete(1, b"p/")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            f"prefix: b'p/' covers {2 * half} keys, more than the {half} one delete may "
            "remove: delete it by narrower prefixes"
        )
        # Two deletes at the bound: each applied on every member in one step of its loop.
        assert (await delete(2, b"p/a/")).deleted == half
        assert (await delete(3, b"p/b/")).deleted == half
        left = await kv.Range(kv_pb2.RangeRequest(prefix=b"p/"), timeout=60)
        assert list(left.kvs) == []
    assert leadership(cluster) == before


async def test_a_lagging_member_installs_the_leader_s_snapshot_decoded_off_its_loop(
    tmp_path: Path,
) -> None:
    """The snapshot a member receives is decoded once, to verify it, on a thread; installing
    it swaps that state in instead of decoding it again on the event loop (a state of
    1,000,000 keys takes seconds to decode, past the election timeout)."""
    with running_cluster(tmp_path, 3, snapshot_entries=200) as cluster:
        leader = cluster.leader()
        lagging = next(i for i in cluster.members if i != leader)
        cluster.kill(lagging)
        # Past the 5,000 entries a leader keeps behind its snapshot for lagging followers.
        keys = [b"s/%05d" % i for i in range(8_000)]
        await put_keys(cluster, keys)
        cluster.start(lagging)
        pattern = re.compile(
            rf"member {lagging}: installed the leader's snapshot at \d+ \((\d+) keys, decoded "
            r"off the event loop\)"
        )
        found = wait_until(
            lambda: pattern.search(cluster.log_text(lagging)), 60, "the snapshot's install"
        )
        assert int(found.group(1)) >= 1
        # It serves what it caught up on.
        async with Client([cluster.members[lagging].client_address]) as local:
            assert await local.get(keys[-1].decode()) is not None
