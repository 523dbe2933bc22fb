"""Learning a member's peer address from the other members, when a message for it has none.

Theory of operation. A member knows where its peers are from ``--initial-cluster`` and from
the membership changes it applied (member_table.py). That is not always enough. A member that
joins with only some of the members in ``--initial-cluster`` (after losing a majority, the
documented way names the survivor alone) can be reached first by a leader added after those:
its answers then have nowhere to go, and it cannot apply that leader's addition without
answering (a leader probes a new follower and sends it nothing more until it answers), so it
never catches up. The same holds for a member that was down while the member now leading was
added. etcd's joiner fetches the member list from the peers it is given before it starts;
here the sender asks whenever it has messages for a member it has no address for, which
covers every such case, at any time in a member's life.

The asker (:class:`AddressLookup`) asks every member whose address it knows, over the peer
port (a connection of kind ``MEMBERS``, docs/peer-protocol.md). Each answers with its member
table and its applied index, under a MAC over the asker's random nonce (peer_auth.py), so a
forged or replayed answer is dropped; of the answers that name the member, the one with the
highest applied index wins. An address learned this way is a hint (``Membership.learned``):
it is only dialled, and that connection is authenticated as any other; the member table's own
entry wins as soon as there is one, and a removal forgets the hint. Lookups are bounded: one
at a time per missing member, at most one per ``RETRY_S``, each asking every known member once
within ``ANSWER_TIMEOUT_S``. A member of an earlier release refuses the connection's kind, and
the asker goes without its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

import msgpack

from rallypoint.proto.peer.v1 import peer_pb2

from .member_table import MemberAddress, MemberTable, MemberTableError
from .peer_auth import MEMBERS_ANSWER_TAG, MEMBERS_TAG, PeerKey

log = logging.getLogger("rallypoint.node")

ANSWER_TIMEOUT_S = 1.0
# The least time between two lookups of one member.
RETRY_S = 1.0
# A lookup that found nothing is logged at most this often per member.
REPORT_EVERY_S = 10.0
# The most entries an answer's table may hold (a cluster has a handful of members).
MAX_MEMBERS = 1024

# How a member asks another for its member table over its peer transport: (address,
# request, timeout) -> the answer as it came (verified here), or None when none came.
MembersCall = Callable[
    [str, peer_pb2.MembersRequest, float], Awaitable[peer_pb2.MembersAnswer | None]
]


def members_request_fields(request: peer_pb2.MembersRequest) -> list[int | bytes]:
    return [request.cluster_id, request.from_id, request.to_id, request.nonce]


def members_answer_fields(
    answer: peer_pb2.MembersAnswer, request: peer_pb2.MembersRequest
) -> list[int | bytes]:
    return [request.nonce, request.from_id, answer.member_id, answer.applied_index, answer.members]


def encode_members(table: MemberTable) -> bytes:
    packed: bytes = msgpack.packb(table.to_obj(), use_bin_type=True)
    return packed


def decode_members(data: bytes) -> MemberTable:
    """The table an answer carries; MemberTableError, saying why, for anything else."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise MemberTableError(f"a member table that is not msgpack: {exc}") from None
    if isinstance(obj, list) and len(obj) > MAX_MEMBERS:
        raise MemberTableError(f"a member table of {len(obj)} entries (at most {MAX_MEMBERS})")
    table = MemberTable.from_obj(obj)
    for member_id, address in table.items():
        if member_id <= 0 or not address.peer_address:
            raise MemberTableError(f"member {member_id} without a peer address")
    return table


def answer_members(
    key: PeerKey,
    request: peer_pb2.MembersRequest,
    member_id: int,
    applied_index: int,
    table: MemberTable,
) -> peer_pb2.MembersAnswer:
    """This member's answer to an authenticated members question."""
    answer = peer_pb2.MembersAnswer(
        member_id=member_id, applied_index=applied_index, members=encode_members(table)
    )
    answer.mac = key.sign(MEMBERS_ANSWER_TAG, members_answer_fields(answer, request))
    return answer


async def ask(
    peer_id: int,
    address: str,
    me: int,
    cluster_id: int,
    key: PeerKey,
    call: MembersCall,
    timeout_s: float = ANSWER_TIMEOUT_S,
) -> tuple[int, MemberTable] | None:
    """Ask one member for its member table: (its applied index, the table), or None when it
    does not answer or its answer does not verify or parse."""
    request = peer_pb2.MembersRequest(
        cluster_id=cluster_id, from_id=me, to_id=peer_id, nonce=os.urandom(16)
    )
    request.mac = key.sign(MEMBERS_TAG, members_request_fields(request))
    answer = await call(address, request, timeout_s)
    if answer is None:
        return None
    if answer.member_id != peer_id or not key.verify(
        MEMBERS_ANSWER_TAG, members_answer_fields(answer, request), answer.mac
    ):
        log.warning(
            "member %d: member %d at %s gave an unauthenticated member table", me, peer_id, address
        )
        return None
    try:
        table = decode_members(answer.members)
    except MemberTableError as exc:
        log.warning(
            "member %d: member %d at %s sent a bad member table: %s", me, peer_id, address, exc
        )
        return None
    return answer.applied_index, table


class AddressLookup:
    """Finds the peer address of members this one has messages for but no address (see the
    module docstring). ``known`` gives every member whose address this member knows (id ->
    peer address); ``learn`` takes an address found for a member."""

    def __init__(
        self,
        me: int,
        cluster_id: int,
        key: PeerKey,
        call: MembersCall,
        known: Callable[[], dict[int, str]],
        learn: Callable[[int, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._me = me
        self._cluster_id = cluster_id
        self._key = key
        self._call = call
        self._known = known
        self._learn = learn
        self._clock = clock
        self._tasks: dict[int, asyncio.Task[None]] = {}
        # Per member: when a lookup of it last started, and when one that found nothing was
        # last logged.
        self._started: dict[int, float] = {}
        self._reported: dict[int, float] = {}
        self.lookups = 0  # lookups started (counted for tests)

    def want(self, member_id: int) -> None:
        """There are messages for ``member_id`` and no address for it: look it up, unless a
        lookup of it is under way or one started less than ``RETRY_S`` ago."""
        if member_id in self._tasks:
            return
        now = self._clock()
        started = self._started.get(member_id)
        if started is not None and now - started < RETRY_S:
            return
        self._started[member_id] = now
        self.lookups += 1
        task = asyncio.get_running_loop().create_task(self._look_up(member_id))
        self._tasks[member_id] = task
        task.add_done_callback(lambda _task: self._tasks.pop(member_id, None))

    async def _look_up(self, member_id: int) -> None:
        asked = {
            peer_id: address
            for peer_id, address in self._known().items()
            if peer_id not in (self._me, member_id)
        }
        answers = await asyncio.gather(
            *(
                ask(peer_id, address, self._me, self._cluster_id, self._key, self._call)
                for peer_id, address in asked.items()
            )
        )
        best: tuple[int, int, MemberAddress] | None = None
        for peer_id, answered in zip(asked, answers, strict=True):
            if answered is None:
                continue
            applied, table = answered
            address = table.get(member_id)
            if address is not None and (best is None or applied > best[0]):
                best = (applied, peer_id, address)
        if best is None:
            now = self._clock()
            reported = self._reported.get(member_id)
            if reported is None or now - reported >= REPORT_EVERY_S:
                self._reported[member_id] = now
                log.warning(
                    "member %d has messages for member %d but no address for it, and none of "
                    "the members it asked knows one (asked: %s; answered: %d)",
                    self._me,
                    member_id,
                    sorted(asked) or "none known",
                    sum(a is not None for a in answers),
                )
            return
        self._reported.pop(member_id, None)
        _, told_by, address = best
        log.info(
            "member %d: member %d is at %s (member %d says so; this member has not applied "
            "its addition)",
            self._me,
            member_id,
            address.peer_address,
            told_by,
        )
        self._learn(member_id, address.peer_address)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
