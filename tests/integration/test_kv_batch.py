"""KV/Batch on a real 3-member cluster: a follower's batched linearizable reads see every
write acknowledged before they were sent, batched writes from many callers apply once each,
and a client pointed at a follower reaches the leader for its writes."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rallypoint.client import Client
from rallypoint.proto.v1 import common_pb2, kv_pb2, kv_pb2_grpc, session_pb2, session_pb2_grpc
from tests.integration.harness import MemberProcess, ProcessCluster, running_cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path, 3) as c:
        yield c


async def test_batched_reads_at_a_follower_see_every_acknowledged_write(
    cluster: ProcessCluster,
) -> None:
    leader = cluster.leader()
    follower = next(m for m in cluster.members.values() if m.member_id != leader)
    async with (
        Client(cluster.endpoints, timeout_s=20.0, kv_batching="always") as writer,
        Client(
            [follower.client_address],
            timeout_s=20.0,
            kv_batching="always",
            open_session_on_connect=False,
        ) as reader,
    ):
        for round_number in range(1, 31):
            # Many writers at once: their puts share messages of the writer's stream.
            puts = await asyncio.gather(
                *(writer.put(f"reg/{i}", str(round_number)) for i in range(8))
            )
            assert all(p.kv.value == str(round_number).encode() for p in puts)
            # Sent after every put above was acknowledged: each read must see its round.
            reads = await asyncio.gather(*(reader.get(f"reg/{i}") for i in range(8)))
            assert [r.value if r else None for r in reads] == [str(round_number).encode()] * 8
        versions = await asyncio.gather(*(writer.get(f"reg/{i}") for i in range(8)))
        # 30 writes per key, each applied once, however they were batched and retried.
        assert [v.version if v else 0 for v in versions] == [30] * 8
        # The reader's stream went to the follower, which answered its reads itself.
        stream = reader._caller._kv_stream
        assert stream is not None and set(stream.streams) == {follower.client_address}


def wal_writes(member: MemberProcess) -> float:
    """How many batches of Raft state the member has written and fsynced."""
    with urllib.request.urlopen(f"http://{member.metrics_address}/metrics", timeout=5) as page:
        text = page.read().decode()
    (count,) = re.findall(r"^rallypoint_wal_write_seconds_count (\S+)$", text, re.MULTILINE)
    return float(count)


async def test_a_message_s_writes_share_one_log_write_on_an_idle_leader(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, metrics=True) as cluster:
        leader = cluster.members[cluster.leader()]
        async with grpc.aio.insecure_channel(leader.client_address) as channel:
            opened = await session_pb2_grpc.SessionStub(channel).Open(
                session_pb2.SessionOpenRequest(ttl_ms=60_000)
            )
            call: Any = kv_pb2_grpc.KVStub(channel).Batch(None)
            operations = [
                kv_pb2.BatchOperation(
                    id=sequence,
                    put=kv_pb2.PutRequest(
                        header=common_pb2.RequestHeader(
                            session_id=opened.session_id, sequence=sequence
                        ),
                        key=b"k%d" % sequence,
                        value=b"v",
                    ),
                )
                for sequence in range(1, 51)
            ]
            before = wal_writes(leader)
            await call.write(kv_pb2.BatchRequest(operations=operations))
            answered = 0
            while answered < len(operations):
                response = await call.read()
                assert all(r.WhichOneof("result") == "put" for r in response.results)
                answered += len(response.results)
            # 50 writes, one append (a heartbeat's or a term's write may slip in beside it).
            assert wal_writes(leader) - before <= 3
