"""Terms have an upper bound (raft/types.py MAX_TERM, derived from the codec's MAX_VALUE): a
message above it is refused, never adopted, so one bad message (a bug, a bit flip) cannot
leave a cluster with no term left to elect in (issue 33, item 2)."""

from __future__ import annotations

import contextlib

import pytest

from rallypoint.raft import (
    MAX_TERM,
    MAX_VALUE,
    Message,
    MessageType,
    NodeId,
    RaftError,
    StateType,
    Term,
    TermOutOfRangeError,
)
from rallypoint.raft.codec import CodecError, decode_message, encode_message

from .network import Network
from .test_raft import leaders

MT = MessageType


def heartbeat(from_: int, to: int, term: int) -> Message:
    return Message(type=MT.MsgHeartbeat, from_=NodeId(from_), to=NodeId(to), term=Term(term))


def through_the_codec(m: Message) -> Message | None:
    """``m`` as a peer receives it: encoded and decoded by the real codec; None (dropped,
    as the peer service refuses the batch) when it does not decode."""
    try:
        return decode_message(encode_message(m))
    except CodecError:
        return None


def elect_after_losing(nt: Network, leader: int, voters: list[int]) -> int:
    """Cut ``leader`` off and tick the others until one leads; its id (0 if none did)."""
    nt.isolate(leader)
    for _ in range(40):
        for node_id in voters:
            nt.tick(node_id)
        elected = [i for i in leaders(nt) if i != leader]
        if elected:
            return elected[0]
    return 0


def test_the_bound_leaves_room_below_the_codecs_range() -> None:
    # The next vote request from any term a node can reach still encodes and decodes.
    assert MAX_TERM < MAX_VALUE
    vote = Message(type=MT.MsgPreVote, from_=NodeId(1), to=NodeId(2), term=Term(MAX_TERM + 1))
    assert decode_message(encode_message(vote)) == vote


@pytest.mark.parametrize("term", [MAX_TERM + 1, MAX_VALUE - 1, MAX_VALUE])
def test_a_message_above_the_highest_term_is_refused_and_changes_nothing(term: int) -> None:
    nt = Network.of_size(3, pre_vote=True, check_quorum=True)
    nt.campaign(1)
    follower = nt.peer(2)
    before = (follower.raft.term, follower.raft.lead, follower.raft.vote, follower.raft.state)
    for kind in (MT.MsgHeartbeat, MT.MsgApp, MT.MsgVote, MT.MsgPreVote, MT.MsgAppResp):
        m = Message(type=kind, from_=NodeId(3), to=NodeId(2), term=Term(term))
        with pytest.raises(TermOutOfRangeError, match=f"term {term} is above"):
            follower.node.step(m)
    after = (follower.raft.term, follower.raft.lead, follower.raft.vote, follower.raft.state)
    assert after == before
    assert not follower.node.has_ready() or not follower.node.ready().messages


def test_the_highest_term_itself_is_adopted_and_a_leader_is_still_elected_from_it() -> None:
    nt = Network.of_size(3, pre_vote=True, check_quorum=True)
    nt.msg_hook = through_the_codec
    nt.campaign(1)
    nt.send(heartbeat(1, 2, MAX_TERM - 1), heartbeat(1, 3, MAX_TERM - 1))
    assert nt.raft(2).term == MAX_TERM - 1
    assert elect_after_losing(nt, 1, [2, 3]) != 0
    assert max(nt.raft(2).term, nt.raft(3).term) == MAX_TERM


def test_a_node_at_the_highest_term_does_not_campaign() -> None:
    # Only state written before terms were bounded can hold such a term: every peer would
    # refuse its vote requests, so it sends none.
    nt = Network.of_size(3, pre_vote=True)
    raft = nt.raft(1)
    raft.become_follower(MAX_TERM, NodeId(0))
    nt.campaign(1)
    assert raft.state is StateType.FOLLOWER
    assert raft.term == MAX_TERM
    assert not [m for m in nt.delivered if m.type in (MT.MsgPreVote, MT.MsgVote)]


def test_after_a_heartbeat_at_the_codecs_bound_the_cluster_still_elects() -> None:
    # Issue 33: one heartbeat at 2^62 - 1 (the largest term the codec accepts) made every
    # member adopt it; their pre-votes at 2^62 then did not decode anywhere, and no leader
    # was ever elected again. Every message here goes through the real codec.
    nt = Network.of_size(3, pre_vote=True, check_quorum=True)
    nt.msg_hook = through_the_codec
    nt.campaign(1)
    assert leaders(nt) == [1]
    for to in (2, 3):
        bad = through_the_codec(heartbeat(1, to, MAX_VALUE))
        assert bad is not None  # the codec accepts it: Raft is the one to refuse it
        with contextlib.suppress(RaftError):
            nt.peer(to).node.step(bad)
        nt.deliver(to)
    new_leader = elect_after_losing(nt, 1, [2, 3])
    assert new_leader in (2, 3), "no leader elected after the bad heartbeat"
    assert nt.raft(2).term < MAX_TERM and nt.raft(3).term < MAX_TERM
    nt.propose(new_leader, b"after")
    assert b"after" in nt.peer(2).applied_data()
