"""The scale load generator (bench/scale_load.py): its bookkeeping (``JobLoad``), what the
benchmark's round-close, round-change-bytes and false-positive figures are computed from, and
its ``hosts`` role as a process against fake members serving JoinBatch and HeartbeatBatch."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rallypoint.client import Assignment, RoundState
from rallypoint.proto.v1 import rendezvous_pb2, rendezvous_pb2_grpc
from tests.client.fake_server import FakeCluster, FakeMember

REPOSITORY = Path(__file__).resolve().parents[2]
# bench/ is a folder of scripts run from the repository (python -m bench.scale_load), not an
# installed package: the test imports it the same way.
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from bench.scale_load import JobLoad  # noqa: E402


def active(participant_id: int, round_number: int, rank: int) -> Assignment:
    return Assignment(
        participant_id, round_number, RoundState.ACTIVE, rank, 3, 9, "j/1", False, False
    )


def test_a_participant_counts_once_it_is_pushed_an_active_round() -> None:
    load = JobLoad("j", participants=3)
    load.on_assignment(Assignment(1, 1, RoundState.JOINING, -1, 0, 0, "", False, False))
    assert not load.settled(1)
    for participant_id, rank in ((1, 2), (2, 0)):
        load.on_assignment(active(participant_id, 1, rank))
    assert not load.settled(1)
    load.on_assignment(Assignment(3, 0, None, -1, 0, 0, "", False, gone=True))
    assert load.settled(1)
    summary = load.summary(1)
    assert summary["seen"] == 2 and summary["gone"] == 1 and summary["ranks"] == [0, 2]
    assert summary["first_seen"] <= summary["last_seen"]
    # A later round is waited for anew; a repeat of an old one changes nothing.
    assert not load.settled(2)
    seen_at = load.seen_at[1]
    load.on_assignment(active(1, 1, 2))
    assert load.seen_at[1] == seen_at


def test_bytes_are_counted_per_answer_that_carries_assignments() -> None:
    load = JobLoad("j", participants=2)
    load.on_response(rendezvous_pb2.HeartbeatBatchResponse(seq=1), 0.01)
    assert load.pushed == {}
    carried = [
        rendezvous_pb2.Assignment(participant_id=p, round=4, state=2, rank=p, world_size=2)
        for p in (1, 2)
    ]
    response = rendezvous_pb2.HeartbeatBatchResponse(seq=2, assignments=carried)
    load.on_response(response, 0.01)
    count, assignment_bytes, response_bytes = load.pushed[4]
    assert count == 2
    assert assignment_bytes == sum(a.ByteSize() for a in carried)
    assert response_bytes == response.ByteSize() > assignment_bytes


# --- the hosts role end to end, against fake members ---------------------------------------------


class FakeRendezvous(rendezvous_pb2_grpc.RendezvousServicer):
    """JoinBatch and HeartbeatBatch over the fake cluster's sessions, shared by every member:
    one job whose round 1 closes when min_nodes have joined; each stream is pushed a
    participant's assignment once it is ACTIVE (and once more per later change: none here)."""

    def __init__(self, member: FakeMember, state: dict[str, Any]) -> None:
        self.member = member
        self.state = state

    async def JoinBatch(
        self, request: rendezvous_pb2.JoinBatchRequest, context: Any
    ) -> rendezvous_pb2.JoinBatchResponse:
        state = self.state

        async def apply() -> rendezvous_pb2.JoinBatchResponse:
            state.setdefault("min_nodes", request.config.min_nodes)
            first = len(state["ids"]) + 1
            ids = list(range(first, first + len(request.names)))
            state["ids"].extend(ids)
            return rendezvous_pb2.JoinBatchResponse(
                participant_ids=ids, waiting=[False] * len(ids), round=1, state=1
            )

        response: rendezvous_pb2.JoinBatchResponse = await self.member.store.apply_once(
            request.header, "JoinBatch", apply
        )
        return response

    async def HeartbeatBatch(
        self, request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatBatchRequest], context: Any
    ) -> AsyncIterator[rendezvous_pb2.HeartbeatBatchResponse]:
        self.state["streams"][self.member.address] += 1
        told: set[int] = set()
        async for request in request_iterator:
            active = len(self.state["ids"]) >= self.state.get("min_nodes", 1 << 30)
            world = len(self.state["ids"])
            pushed = []
            if active:
                for participant_id in request.participant_ids:
                    if participant_id not in told:
                        told.add(participant_id)
                        pushed.append(
                            rendezvous_pb2.Assignment(
                                participant_id=participant_id,
                                round=1,
                                state=rendezvous_pb2.ROUND_STATE_ACTIVE,
                                rank=participant_id - 1,
                                world_size=world,
                            )
                        )
            yield rendezvous_pb2.HeartbeatBatchResponse(seq=request.seq, assignments=pushed)


async def command(process: asyncio.subprocess.Process, line: str, event: str) -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(line.encode() + b"\n")
    async with asyncio.timeout(30):
        while True:
            item = json.loads(await process.stdout.readline())
            if item["event"] in (event, "failed"):
                assert item["event"] == event, item
                return dict(item)


async def test_the_hosts_role_joins_in_batches_and_spreads_its_streams() -> None:
    state: dict[str, Any] = {"ids": [], "streams": collections.Counter()}
    cluster = FakeCluster(3)
    for member in cluster.members:
        rendezvous_pb2_grpc.add_RendezvousServicer_to_server(
            FakeRendezvous(member, state), member.server
        )
    await cluster.start()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.scale_load",
        "hosts",
        f"--endpoints={','.join(cluster.addresses)}",
        "--per-host=500",
        "--interval-s=0.1",
        cwd=REPOSITORY,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 24,
    )
    try:
        assert process.stdout is not None
        assert json.loads(await process.stdout.readline())["event"] == "ready"
        config = json.dumps({"min_nodes": 1500, "max_nodes": 1500})
        joined = await command(process, f"join j 1500 {config}", "joined")
        assert joined["joined"] == 1500 and joined["failed"] == 0
        # Three hosts: three JoinBatch calls of 500, three sessions, three streams.
        assert len(joined["acks"]) == 3 and cluster.store.applies["JoinBatch"] == 3
        settled = await command(process, "await j 1 20", "settled")
        assert settled["complete"] and settled["seen"] == 1500
        assert settled["ranks"] == list(range(1500))
        count, assignment_bytes, response_bytes = settled["pushed"]["1"]
        assert count == 1500 and response_bytes > assignment_bytes > 0
        report = await command(process, "report", "report")
        assert report["streams"] == 3 and report["answers"] >= 3
        assert report["latency"]["p99_ms"] < 5000 and report["failovers"] == 0
        # One stream per member: the hosts start on the members in rotation.
        assert sorted(state["streams"].values()) == [1, 1, 1]
        await command(process, "close", "closed")
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await cluster.stop()
