"""The core's part of leader leases (``Config.leader_lease``; the clock half and the safety
argument are in coordinator/node/reads.py): when ``lease_read_index`` lets a leader serve a
read without a round trip, and the votes a member refuses so that no other leader can be
elected while a lease holds."""

from __future__ import annotations

import pytest

from rallypoint.raft import (
    NONE,
    ConfigError,
    Message,
    MessageType,
    NodeId,
    RawNode,
    StateType,
)

from .network import Network, new_config, new_storage

MT = MessageType


def lease_network(size: int = 3, **config: object) -> Network:
    return Network.of_size(size, check_quorum=True, pre_vote=True, leader_lease=True, **config)


def settled(nt: Network) -> Network:
    """Every member past its start-up stickiness (as if it had run an election timeout)."""
    for peer in nt.peers.values():
        assert peer is not None
        peer.raft.start_stickiness_ticks = 0
    return nt


def test_leader_lease_requires_check_quorum() -> None:
    with pytest.raises(ConfigError, match="check_quorum"):
        RawNode(new_config(1, new_storage((1,)), check_quorum=False, leader_lease=True))


def test_no_lease_without_the_option() -> None:
    nt = Network.of_size(3, check_quorum=True)
    nt.campaign(1)
    assert nt.raft(1).state is StateType.LEADER
    assert nt.peer(1).node.lease_read_index() is None


def test_a_leader_holds_a_lease_read_index_at_its_commit_index() -> None:
    nt = settled(lease_network())
    nt.campaign(1)
    nt.propose(1, b"x")
    assert nt.peer(1).node.lease_read_index() == (1, 2)
    assert nt.peer(2).node.lease_read_index() is None  # followers never


def test_no_lease_before_the_leader_commits_an_entry_of_its_term() -> None:
    nt = settled(lease_network())
    nt.ignore(MT.MsgApp)
    nt.campaign(1)
    assert nt.raft(1).state is StateType.LEADER
    assert nt.raft(1).raft_log.committed == 0
    assert nt.peer(1).node.lease_read_index() is None
    nt.recover()
    nt.tick(1)  # heartbeat answers trigger the append; the no-op commits
    assert nt.peer(1).node.lease_read_index() == (1, 1)


def test_no_lease_while_a_transfer_is_in_progress() -> None:
    nt = settled(lease_network())
    nt.campaign(1)
    nt.isolate(3)  # the transferee lags: the leader first catches it up
    nt.propose(1, b"x")
    nt.send(Message(type=MT.MsgTransferLeader, from_=NodeId(3), to=NodeId(1)))
    assert nt.raft(1).lead_transferee == 3
    assert nt.raft(1).state is StateType.LEADER
    assert nt.peer(1).node.lease_read_index() is None


def test_the_lease_ends_before_timeout_now_is_sent_for_the_rest_of_the_term() -> None:
    nt = settled(lease_network())
    nt.campaign(1)
    nt.ignore(MT.MsgTimeoutNow)  # the transferee never campaigns
    nt.send(Message(type=MT.MsgTransferLeader, from_=NodeId(3), to=NodeId(1)))
    sent = [m for m in nt.peer(1).readies[-1].messages if m.type is MT.MsgTimeoutNow]
    assert [m.to for m in sent] == [3]
    assert nt.peer(1).node.lease_read_index() is None
    nt.tick(1, 10)  # the transfer is abandoned after an election timeout ...
    assert nt.raft(1).lead_transferee == NONE
    assert nt.raft(1).state is StateType.LEADER
    # ... but the transferee may still campaign with the message it got: no lease this term.
    assert nt.peer(1).node.lease_read_index() is None


def test_followers_refuse_votes_and_pre_votes_within_the_election_timeout() -> None:
    nt = settled(lease_network())
    nt.campaign(1)
    nt.cut(1, 3)  # 3 no longer hears the leader; 2 does
    nt.tick(3, 30)  # 3 campaigns (pre-vote) over and over
    assert nt.raft(3).state is not StateType.LEADER
    assert nt.raft(2).term == 1 and nt.raft(2).lead == 1
    assert nt.raft(1).state is StateType.LEADER
    refused = [m for m in nt.delivered if m.type is MT.MsgPreVote and m.to == 2]
    assert refused  # 3 asked, and 2 ignored it within its election timeout


def test_a_restarted_member_refuses_votes_for_an_election_timeout() -> None:
    """A member may have acknowledged a leader just before it restarted: it may not vote at
    once, or it could help elect a second leader while the first one's lease holds."""
    nt = lease_network()
    pre_votes_answered = []
    for _ in range(9):
        nt.tick(2)
        nt.send(
            Message(type=MT.MsgPreVote, from_=NodeId(3), to=NodeId(2), term=1, index=0, log_term=0)
        )
        pre_votes_answered += [m for m in nt.delivered if m.type is MT.MsgPreVoteResp]
    assert pre_votes_answered == []
    nt.tick(2)  # an election timeout since it started
    nt.send(Message(type=MT.MsgPreVote, from_=NodeId(3), to=NodeId(2), term=1, index=0, log_term=0))
    [answer] = [m for m in nt.delivered if m.type is MT.MsgPreVoteResp]
    assert answer.to == 3 and not answer.reject


def test_without_leases_a_restarted_member_votes_at_once() -> None:
    nt = Network.of_size(3, check_quorum=True, pre_vote=True)
    nt.send(Message(type=MT.MsgPreVote, from_=NodeId(3), to=NodeId(2), term=1, index=0, log_term=0))
    [answer] = [m for m in nt.delivered if m.type is MT.MsgPreVoteResp]
    assert not answer.reject


def test_a_cluster_with_leases_still_elects_a_leader() -> None:
    nt = lease_network()
    nt.tick_all(40)
    assert len([p for p in nt.peers.values() if p and p.raft.state is StateType.LEADER]) == 1


def test_forget_leader_is_ignored_with_leases() -> None:
    nt = settled(lease_network())
    nt.campaign(1)
    nt.peer(2).node.forget_leader()
    assert nt.raft(2).lead == 1
