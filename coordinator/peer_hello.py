"""Before creating a cluster from empty storage: ask the other members whether it exists.

Theory of operation. Empty storage is ambiguous: a member of a new cluster starts with it,
and so does a member whose data directory was wiped or lost. Raft cannot tell them apart,
and treating the second like the first loses acknowledged writes (its forgotten votes and
log let a lagging member win an election, or let it create the cluster again). So a member
that would create the cluster from empty storage first asks every other initial member
(``Hello`` on the peer port, answered even by members that are themselves still asking),
and ``bootstrap_rule.decide`` turns the answers into a decision:

- any answer "established" (the member holds an election or entries beyond the cluster's
  creation) means the cluster exists: this member lost its data and rejoins *abstaining*
  (no votes, no campaign) until it has caught up; or, if that member does not know it, it
  refuses to start and says how to add it;
- "fresh" answers from every other initial member mean the cluster is being created now.
  This member's own empty storage is no evidence (it may be the one that lost its data),
  and neither is a majority: see ``bootstrap_rule`` for why it takes every member.

Until one of the two, the member waits and says so every few seconds, naming the members it
waits for. Answers are authenticated over a random nonce, so a stale or forged answer cannot
talk a member into creating a second cluster.

The hello is also where members tell each other their record version (``version.py``): both
the request and the answer carry it with a MAC of its own over the nonce
(:func:`advertise`, :func:`advertised_version`), apart from the message's MAC so that a
release that knows nothing of versions still verifies the rest. A message without one comes
from the baseline. The leader asks every member this way (``leader/versions.py``) to decide
the cluster version; a transport that replaces gRPC carries the same two fields.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable

from rallypoint.proto.peer.v1 import peer_pb2

from .bootstrap_rule import Answer, Decision, Verdict, decide
from .peer_auth import HELLO_ANSWER_TAG, HELLO_TAG, HELLO_VERSION_TAG, PeerKey
from .version import BASELINE_RECORD_VERSION, RECORD_VERSION

log = logging.getLogger("rallypoint.node")

ANSWER_TIMEOUT_S = 1.0
RETRY_S = 0.3
REPORT_EVERY_S = 5.0

# How a member asks another Hello over its peer transport: (address, request, timeout) ->
# the answer as it came (verified here), or None when none came.
HelloCall = Callable[[str, peer_pb2.HelloRequest, float], Awaitable[peer_pb2.HelloAnswer | None]]


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


def advertise(key: PeerKey, nonce: bytes, member_id: int, probe: bool = False) -> tuple[int, bytes]:
    """This member's record version and its MAC, for a hello (request or answer) of
    ``member_id`` (the sender) bound to ``nonce``: the one place the version goes on the
    wire. ``probe``: a request that only asks for the version (leader/versions.py)."""
    fields: list[int | bytes] = [nonce, member_id, RECORD_VERSION, int(probe)]
    return RECORD_VERSION, key.sign(HELLO_VERSION_TAG, fields)


def advertised_version(
    key: PeerKey,
    nonce: bytes,
    member_id: int,
    record_version: int,
    version_mac: bytes,
    probe: bool = False,
) -> int | None:
    """The record version a hello of ``member_id`` advertises: the baseline when it carries
    none (an older release), None when its MAC does not verify (a forged or altered one)."""
    if not record_version and not version_mac:
        return BASELINE_RECORD_VERSION
    fields: list[int | bytes] = [nonce, member_id, record_version, int(probe)]
    if not key.verify(HELLO_VERSION_TAG, fields, version_mac):
        return None
    return record_version


async def ask(
    peer_id: int,
    address: str,
    me: int,
    cluster_id: int,
    key: PeerKey,
    call: HelloCall,
    timeout_s: float = 1.0,
    *,
    probe: bool = False,
) -> tuple[peer_pb2.HelloAnswer, int] | None:
    """Ask one member Hello: its authenticated answer and the record version it advertises;
    None when it does not answer or its answer does not verify. ``probe``: only the version
    is wanted (a member of this release then does not take the asker for one that lost its
    data; one of the baseline does, and says so in its log)."""
    request = peer_pb2.HelloRequest(
        cluster_id=cluster_id, from_id=me, to_id=peer_id, nonce=os.urandom(16)
    )
    request.mac = key.sign(HELLO_TAG, hello_request_fields(request))
    request.version_probe = probe
    request.record_version, request.version_mac = advertise(key, request.nonce, me, probe)
    answer = await call(address, request, timeout_s)
    if answer is None:
        log.debug("member %d: no answer from member %d at %s", me, peer_id, address)
        return None
    version = advertised_version(
        key, request.nonce, answer.member_id, answer.record_version, answer.version_mac
    )
    if (
        answer.member_id != peer_id
        or version is None
        or not key.verify(HELLO_ANSWER_TAG, hello_answer_fields(answer, request), answer.mac)
    ):
        log.warning(
            "member %d: member %d at %s gave an unauthenticated answer", me, peer_id, address
        )
        return None
    return answer, version


async def _ask(
    peer_id: int,
    address: str,
    me: int,
    cluster_id: int,
    key: PeerKey,
    call: HelloCall,
) -> peer_pb2.HelloAnswer | None:
    answered = await ask(peer_id, address, me, cluster_id, key, call, ANSWER_TIMEOUT_S)
    return None if answered is None else answered[0]


async def ask_peers(
    me: int,
    cluster_id: int,
    key: PeerKey,
    peers: dict[int, str],
    call: HelloCall,
) -> Verdict:
    """Ask ``peers`` (the other initial members: id -> peer address) until
    ``bootstrap_rule.decide`` creates or rejoins (never returns WAIT)."""
    initial = frozenset({me, *peers})
    answers: dict[int, Answer] = {}
    started = time.monotonic()
    reported = started
    while True:
        # A fresh answer stays good: a member that was fresh then and is established now
        # is creating the cluster alongside this one (bootstrap_rule, "at different times").
        pending = {i: a for i, a in peers.items() if i not in answers}
        replies = await asyncio.gather(
            *(_ask(i, a, me, cluster_id, key, call) for i, a in pending.items())
        )
        for peer_id, reply in zip(pending, replies, strict=True):
            if reply is not None:
                answers[peer_id] = Answer(peer_id, reply.established, reply.knows_sender)
        verdict = decide(me, initial, answers)
        if verdict.decision is not Decision.WAIT:
            return verdict
        now = time.monotonic()
        if now - reported >= REPORT_EVERY_S:
            reported = now
            log.warning(
                "member %d: its storage is empty and it cannot prove that no cluster exists: "
                "waiting for member(s) %s to answer (%.0f s so far; fresh: %s). Creating a "
                "cluster takes every initial member's answer, since this member may have lost "
                "its data; a member that will never start must be left out of "
                "--initial-cluster and added later",
                me,
                ", ".join(str(i) for i in verdict.missing),
                now - started,
                sorted(answers) or "none",
            )
        await asyncio.sleep(RETRY_S)
