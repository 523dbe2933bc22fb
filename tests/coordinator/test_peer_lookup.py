"""A member with messages for a peer it has no address for asks the others (peer_lookup.py).

Real listeners on loopback (the stream peer protocol), with the test transport's hosts: member
1 sends to member 2 knowing only member 3's address; member 3's member table says where 2 is.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from rallypoint.coordinator import peer_lookup
from rallypoint.coordinator.member_table import (
    ConfChangeContext,
    MemberAddress,
    MemberTable,
    MemberTableError,
)
from rallypoint.coordinator.node.membership import Membership
from rallypoint.coordinator.peer_auth import MEMBERS_ANSWER_TAG, MEMBERS_TAG, PeerKey
from rallypoint.coordinator.peer_lookup import (
    AddressLookup,
    answer_members,
    ask,
    decode_members,
    encode_members,
    members_answer_fields,
    members_request_fields,
)
from rallypoint.coordinator.peerwire.conn import PeerError, dial
from rallypoint.coordinator.peerwire.frames import (
    ERROR,
    KIND_MEMBERS,
    MEMBERS,
    MEMBERS_ANSWER,
    decode_error,
    encode_record,
)
from rallypoint.coordinator.peerwire.transport import StreamTransport
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    NodeId,
)

from .test_transport import (
    CLUSTER_ID,
    Host,
    Peer,
    delivered_numbers,
    free_port,
    heartbeat,
    wait_for,
)

KEY = Host.peer_key


def table(**members: str) -> MemberTable:
    """``table(m2="127.0.0.1:1")``: member 2's peer address (client addresses made up)."""
    return MemberTable({int(k[1:]): MemberAddress(v, f"{v}-client") for k, v in members.items()})


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[tuple[Host, Peer, Peer, StreamTransport]]:
    """Member 1 (sending, knows member 3 only), member 2 and member 3 listening."""
    hosts = {i: Host(i, tmp_path / str(i)) for i in (1, 2, 3)}
    for i in (2, 3):
        (tmp_path / str(i)).mkdir()
    peers = {i: Peer(hosts[i], free_port()) for i in (2, 3)}
    for peer in peers.values():
        await peer.start()
    hosts[1].addresses[3] = peers[3].address
    hosts[3].table = table(m1="127.0.0.1:9", m2=peers[2].address, m3=peers[3].address)
    transport = StreamTransport(hosts[1], random.Random(5))
    try:
        yield hosts[1], peers[2], peers[3], transport
    finally:
        await transport.stop()
        for peer in peers.values():
            await peer.stop()


async def test_a_sender_without_an_address_learns_it_from_another_member_and_delivers(
    three: tuple[Host, Peer, Peer, StreamTransport],
) -> None:
    host, two, _three, transport = three
    transport.send([heartbeat(1)])
    # The first message had nowhere to go (dropped and reported); the address is asked for.
    await wait_for(lambda: 2 in host.addresses, 5.0, "member 2's address to be learned")
    assert host.addresses[2] == two.address
    assert host.unreachable >= 1
    # What Raft sends next reaches member 2.
    n = 2
    while n not in delivered_numbers(two.host):
        transport.send([heartbeat(n)])
        await asyncio.sleep(0.05)
        assert n < 100, "nothing reached member 2 at the learned address"
    assert transport.lookup.lookups == 1


async def test_nobody_knowing_the_member_is_logged_and_asked_again_later(
    three: tuple[Host, Peer, Peer, StreamTransport], caplog: pytest.LogCaptureFixture
) -> None:
    host, _two, three_peer, transport = three
    three_peer.host.table = table(m1="127.0.0.1:9")  # member 3 does not know member 2 either
    transport.send([heartbeat(1)])
    await wait_for(lambda: "none of the members it asked knows one" in caplog.text, 5, "the log")
    assert 2 not in host.addresses
    # Messages keep coming; no second lookup within RETRY_S.
    for n in range(2, 6):
        transport.send([heartbeat(n)])
        await asyncio.sleep(0.02)
    assert transport.lookup.lookups == 1


async def test_a_member_answers_only_an_authenticated_question(
    three: tuple[Host, Peer, Peer, StreamTransport],
) -> None:
    _host, _two, three_peer, _transport = three
    request = peer_pb2.MembersRequest(
        cluster_id=CLUSTER_ID, from_id=1, to_id=3, nonce=b"n" * 16, mac=b"x" * 32
    )
    conn, _ = await dial(three_peer.address, KIND_MEMBERS, None, session=False)
    try:
        conn.write(MEMBERS, encode_record(request))
        frame_type, body = await conn.read(5.0)
    finally:
        conn.close()
    assert frame_type == ERROR
    assert decode_error(body)[0] == "UNAUTHENTICATED"
    # Signed, but for another cluster: refused, naming both.
    other = peer_pb2.MembersRequest(cluster_id=CLUSTER_ID + 1, from_id=1, to_id=3, nonce=b"n" * 16)
    other.mac = KEY.sign(MEMBERS_TAG, members_request_fields(other))
    conn, _ = await dial(three_peer.address, KIND_MEMBERS, None, session=False)
    try:
        conn.write(MEMBERS, encode_record(other))
        with pytest.raises(PeerError, match="reached cluster"):
            await conn.read_expecting(MEMBERS_ANSWER, None)
    finally:
        conn.close()


class FakeMembers:
    """A members call answering from fixed (applied, table) per address, optionally altered."""

    def __init__(self, answers: dict[str, tuple[int, int, MemberTable]]) -> None:
        # address -> (answering member id, applied index, table)
        self.answers = answers
        self.tamper = False
        self.asked: list[str] = []

    async def __call__(
        self, address: str, request: peer_pb2.MembersRequest, timeout_s: float
    ) -> peer_pb2.MembersAnswer | None:
        self.asked.append(address)
        if address not in self.answers:
            return None
        member_id, applied, members = self.answers[address]
        answer = answer_members(KEY, request, member_id, applied, members)
        if self.tamper:
            answer.members = encode_members(table(m2="10.6.6.6:1"))
        return answer


async def test_an_answer_that_does_not_verify_or_parse_is_dropped() -> None:
    call = FakeMembers({"a:1": (3, 5, table(m2="127.0.0.1:2"))})
    assert await ask(3, "a:1", 1, CLUSTER_ID, KEY, call) is not None
    # Another member's answer for this address, or an altered table, or another key.
    assert await ask(4, "a:1", 1, CLUSTER_ID, KEY, call) is None
    call.tamper = True
    assert await ask(3, "a:1", 1, CLUSTER_ID, KEY, call) is None
    call.tamper = False
    assert await ask(3, "a:1", 1, CLUSTER_ID, PeerKey(b"another-cluster-secret"), call) is None
    # Signed, but not a table.

    async def garbage(
        address: str, request: peer_pb2.MembersRequest, timeout_s: float
    ) -> peer_pb2.MembersAnswer:
        answer = peer_pb2.MembersAnswer(member_id=3, applied_index=1, members=b"\xc1")
        answer.mac = KEY.sign(MEMBERS_ANSWER_TAG, members_answer_fields(answer, request))
        return answer

    assert await ask(3, "a:1", 1, CLUSTER_ID, KEY, garbage) is None


def test_a_table_that_is_not_one_is_refused_saying_why() -> None:
    assert decode_members(encode_members(table(m2="h:1"))).get(2) == MemberAddress(
        "h:1", "h:1-client"
    )
    for bad, why in (
        (b"\xc1", "not msgpack"),
        (msgpack.packb({"a": 1}), "not an array"),
        (msgpack.packb([[2, "h:1"]]), "malformed"),
        (msgpack.packb([[0, "h:1", "c:1"]]), "must be positive"),
        (msgpack.packb([[2, "", "c:1"]]), "without a peer address"),
        (msgpack.packb([[i, "h:1", "c:1"] for i in range(1, 1100)]), "at most 1024"),
    ):
        with pytest.raises(MemberTableError, match=why):
            decode_members(bad)


async def test_the_most_recent_table_wins_and_lookups_are_spaced() -> None:
    call = FakeMembers(
        {
            "three:1": (3, 40, table(m2="old:2")),
            "four:1": (4, 90, table(m2="new:2")),
        }
    )
    learned: dict[int, str] = {}
    now = [100.0]
    lookup = AddressLookup(
        1,
        CLUSTER_ID,
        KEY,
        call,
        lambda: {1: "me:1", 3: "three:1", 4: "four:1", 5: "gone:1"},
        learned.__setitem__,
        clock=lambda: now[0],
    )
    lookup.want(2)
    lookup.want(2)  # one lookup at a time
    await asyncio.sleep(0)
    await wait_for(lambda: 2 in learned, 2.0, "the lookup")
    assert learned == {2: "new:2"}
    assert sorted(call.asked) == ["four:1", "gone:1", "three:1"]  # never itself
    assert lookup.lookups == 1
    lookup.want(2)
    assert lookup.lookups == 1  # within RETRY_S of the last
    now[0] += peer_lookup.RETRY_S
    lookup.want(2)
    assert lookup.lookups == 2
    await lookup.stop()


class _Host:
    member_id = 1

    def wake(self) -> None:
        pass


def test_a_learned_address_gives_way_to_the_table_and_is_forgotten_on_removal() -> None:
    membership = Membership(
        _Host(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        {1: MemberAddress("one:1", "one:2")},
        join_existing=True,
    )
    assert membership.peer_address(2) is None
    membership.learn(2, "two:1")
    membership.learn(3, "three:1")
    membership.learn(1, "elsewhere:1")  # the table has member 1: not taken
    assert membership.peer_address(1) == "one:1"
    assert membership.peer_addresses() == {1: "one:1", 2: "two:1", 3: "three:1"}
    # Member 2's addition is applied: the table's address wins, the hint goes.
    context = ConfChangeContext("two:9", "two:10").encode()
    membership.apply(
        ConfChange(
            (ConfChangeSingle(ConfChangeType.ADD_LEARNER_NODE, NodeId(2)),), context=context
        ),
        ConfState(voters=(NodeId(1),), learners=(NodeId(2),)),
    )
    assert membership.peer_address(2) == "two:9"
    assert 2 not in membership.learned
    # Member 3 is removed: its hint goes with it.
    membership.apply(
        ConfChange((ConfChangeSingle(ConfChangeType.REMOVE_NODE, NodeId(3)),)),
        ConfState(voters=(NodeId(1),), learners=(NodeId(2),)),
    )
    assert membership.peer_address(3) is None
    assert membership.learned == {}
