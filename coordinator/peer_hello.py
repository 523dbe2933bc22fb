"""Before creating a cluster from empty storage: ask the other members whether it exists.

Theory of operation. Empty storage is ambiguous: a member of a new cluster starts with it,
and so does a member whose data directory was wiped or lost. Raft cannot tell them apart,
and treating the second like the first loses acknowledged writes (its forgotten votes and
log let a lagging member win an election). So a member that would create the cluster from
empty storage first asks the other initial members (``Hello`` on the peer port, answered
even by members that are themselves still asking):

- any answer "established" (the member holds an election or entries beyond the cluster's
  creation) means the cluster exists: this member lost its data and rejoins *abstaining*
  (no votes, no campaign) until it has caught up; or, if that member does not know it, it
  refuses to start and says how to add it;
- "fresh" answers from a majority of the initial members, this one included, mean the
  cluster is being created now: nobody can have committed anything without a majority.

Until one of the two, the member waits (and says so every few seconds): with the other
members down, it cannot know. Answers are authenticated over a random nonce, so a stale or
forged answer cannot talk a member into creating a second cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import grpc.aio

from rallypoint.proto.peer.v1 import peer_pb2, peer_pb2_grpc

from .peer_auth import HELLO_ANSWER_TAG, HELLO_TAG, PeerKey

log = logging.getLogger("rallypoint.node")

ANSWER_TIMEOUT_S = 1.0
RETRY_S = 0.3
REPORT_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class HelloOutcome:
    established: bool
    # With ``established``: whether the answering member has this one in its configuration.
    knows_me: bool
    answered_by: int


def hello_request_fields(request: peer_pb2.HelloRequest) -> list[int | bytes]:
    return [request.cluster_id, request.from_id, request.to_id, request.incarnation, request.nonce]


def hello_answer_fields(
    answer: peer_pb2.HelloAnswer, request: peer_pb2.HelloRequest
) -> list[int | bytes]:
    return [
        request.nonce,
        request.from_id,
        answer.member_id,
        answer.incarnation,
        int(answer.established),
        int(answer.knows_sender),
        answer.term,
        answer.last_index,
    ]


async def _ask(
    peer_id: int,
    address: str,
    me: int,
    cluster_id: int,
    key: PeerKey,
    channel_factory: Callable[[str], grpc.aio.Channel],
) -> peer_pb2.HelloAnswer | None:
    request = peer_pb2.HelloRequest(
        cluster_id=cluster_id, from_id=me, to_id=peer_id, nonce=os.urandom(16)
    )
    request.mac = key.sign(HELLO_TAG, hello_request_fields(request))
    channel = channel_factory(address)
    try:
        answer: peer_pb2.HelloAnswer = await peer_pb2_grpc.RaftStub(channel).Hello(
            request, timeout=ANSWER_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as exc:
        log.debug("member %d: no answer from member %d at %s: %s", me, peer_id, address, exc)
        return None
    finally:
        await channel.close(grace=None)
    if answer.member_id != peer_id or not key.verify(
        HELLO_ANSWER_TAG, hello_answer_fields(answer, request), answer.mac
    ):
        log.warning(
            "member %d: member %d at %s gave an unauthenticated answer", me, peer_id, address
        )
        return None
    return answer


async def ask_peers(
    me: int,
    cluster_id: int,
    key: PeerKey,
    peers: dict[int, str],
    channel_factory: Callable[[str], grpc.aio.Channel],
) -> HelloOutcome:
    """Ask ``peers`` (the other initial members: id -> peer address) until the module
    docstring's rule decides."""
    needed = (len(peers) + 1) // 2  # with me, a majority of the initial members
    fresh: set[int] = set()
    started = time.monotonic()
    reported = started
    while True:
        pending = {i: a for i, a in peers.items() if i not in fresh}
        answers = await asyncio.gather(
            *(_ask(i, a, me, cluster_id, key, channel_factory) for i, a in pending.items())
        )
        for peer_id, answer in zip(pending, answers, strict=True):
            if answer is None:
                continue
            if answer.established:
                return HelloOutcome(True, answer.knows_sender, peer_id)
            fresh.add(peer_id)
        if len(fresh) >= needed:
            return HelloOutcome(False, True, 0)
        now = time.monotonic()
        if now - reported >= REPORT_EVERY_S:
            reported = now
            log.warning(
                "member %d: waiting for a majority of the initial members to answer before "
                "creating the cluster (%.0f s so far; fresh: %s; no answer: %s)",
                me,
                now - started,
                sorted(fresh) or "none",
                sorted(set(pending) - fresh),
            )
        await asyncio.sleep(RETRY_S)
