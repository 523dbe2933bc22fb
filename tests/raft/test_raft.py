"""Multi-node behaviour of the Raft core beyond the paper's basics (etcd raft_test.go style):
pre-vote, check-quorum, ReadIndex, leadership transfer, joint consensus, learners,
snapshots, fast backtracking and flow control."""

from __future__ import annotations

import dataclasses
import random

import pytest

from rallypoint.raft import (
    NONE,
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfigError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    ProgressState,
    ProposalDroppedError,
    RawNode,
    ReadOnlyOption,
    Snapshot,
    SnapshotTemporarilyUnavailableError,
    StateType,
    Term,
)
from rallypoint.raft.log_storage import entries_size
from rallypoint.raft.raft import COMMIT_NOTICE_CONTEXT

from .network import BootstrapStorage, Network, Peer, new_config, new_peer, new_storage

MT = MessageType
ADD = ConfChangeType.ADD_NODE
REMOVE = ConfChangeType.REMOVE_NODE
LEARNER = ConfChangeType.ADD_LEARNER_NODE


def change(
    *changes: tuple[ConfChangeType, int],
    transition: ConfChangeTransition = ConfChangeTransition.AUTO,
) -> ConfChange:
    return ConfChange(
        tuple(ConfChangeSingle(t, NodeId(i)) for t, i in changes), transition=transition
    )


def conf_state(peer: Peer) -> ConfState:
    return peer.raft.trk.conf_state()


def voters(*values: int) -> ConfState:
    return ConfState(voters=tuple(NodeId(v) for v in values))


def leaders(nt: Network) -> list[int]:
    return [
        node_id
        for node_id, peer in nt.peers.items()
        if peer is not None and peer.raft.state is StateType.LEADER
    ]


def test_three_nodes_elect_a_leader_and_replicate() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    assert leaders(nt) == [1]
    nt.propose(1, b"somedata")
    for node_id in (1, 2, 3):
        assert nt.raft(node_id).raft_log.committed == 2
        assert nt.peer(node_id).applied_data() == [b"somedata"]


def test_follower_forwards_proposals_to_the_leader() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(2, b"forwarded")
    assert all(nt.peer(i).applied_data() == [b"forwarded"] for i in (1, 2, 3))


def test_proposal_forwarding_can_be_disabled() -> None:
    nt = Network.of_size(3, disable_proposal_forwarding=True)
    nt.campaign(1)
    with pytest.raises(ProposalDroppedError, match="forwarding"):
        nt.peer(2).node.propose(b"x")


def test_election_happens_by_ticks_alone() -> None:
    nt = Network.of_size(5, pre_vote=True, check_quorum=True)
    for _ in range(30):
        nt.tick_all()
        if leaders(nt):
            break
    assert len(leaders(nt)) == 1


# -- pre-vote and check-quorum -----------------------------------------------------------------


def test_pre_vote_keeps_a_partitioned_node_from_disrupting_the_leader() -> None:
    nt = Network.of_size(3, pre_vote=True)
    nt.campaign(1)
    nt.isolate(3)
    nt.tick(3, 50)  # many election timeouts, but only pre-votes: the term never moves
    assert nt.raft(3).term == 1
    assert nt.raft(3).state is StateType.PRE_CANDIDATE
    nt.recover()
    nt.tick(1)  # a heartbeat brings it back
    assert nt.raft(3).state is StateType.FOLLOWER
    assert leaders(nt) == [1]
    assert nt.raft(1).term == 1


def test_without_pre_vote_a_rejoining_node_disrupts_the_leader() -> None:
    nt = Network.of_size(3, pre_vote=False)
    nt.campaign(1)
    nt.isolate(3)
    nt.tick(3, 50)
    assert nt.raft(3).term > 1
    nt.recover()
    nt.tick(3, 50)
    assert nt.raft(1).term > 1  # the leader of term 1 was deposed


def test_a_higher_term_member_whose_votes_go_nowhere_still_catches_up() -> None:
    # Without pre-vote or check-quorum a member at a higher term relies on its votes to
    # raise the others' terms. One that missed a configuration change sends them to the
    # wrong (removed) peers: here its vote requests are simply lost. It must still tell the
    # lower-term leader its term when that leader's appends and heartbeats reach it, or the
    # leader never learns of it and it never catches up (the simulator's seed 71958).
    nt = Network.of_size(3, pre_vote=False, check_quorum=False)
    nt.campaign(1)
    nt.isolate(3)
    nt.tick(3, 50)
    stranded_term = nt.raft(3).term
    assert stranded_term > 1
    nt.recover()

    def votes_from_3_lost(m: Message) -> Message | None:
        return None if m.from_ == 3 and m.type is MT.MsgVote else m

    nt.msg_hook = votes_from_3_lost
    nt.propose(1, b"after")  # an append at term 1 reaches node 3 and is answered
    assert nt.raft(1).term >= stranded_term  # the leader learned the higher term
    nt.tick_all(100)
    assert len(leaders(nt)) == 1
    leader = leaders(nt)[0]
    assert leader != 3  # its log is behind: it cannot win
    nt.propose(leader, b"caught up")
    assert nt.raft(3).term == nt.raft(leader).term
    log = nt.raft(leader).raft_log
    assert nt.raft(3).raft_log.committed == log.committed
    assert nt.peer(3).applied_data()[-2:] == [b"after", b"caught up"]


def test_an_abstaining_node_neither_votes_nor_campaigns() -> None:
    # Node 3 stands for a member that lost its data and rejoined: until it has caught up it
    # must not help the lagging node 2 win (2 lacks an entry 3 acknowledged before the loss).
    nt = Network.of_size(3, pre_vote=True)
    nt.campaign(1)
    nt.isolate(2)
    nt.propose(1, b"acknowledged by 1 and 3")
    nt.recover()
    nt.isolate(1)
    nt.raft(3).abstain = True
    nt.raft(2).become_follower(nt.raft(2).term, NONE)
    nt.raft(3).become_follower(nt.raft(3).term, NONE)
    nt.campaign(2)
    assert nt.raft(2).state is not StateType.LEADER  # 3's vote was withheld
    nt.tick(3, 50)  # election timeouts come and go: no campaign
    assert nt.raft(3).state is StateType.FOLLOWER
    nt.raft(3).abstain = False
    nt.campaign(3)  # it may campaign again (2 votes for it: 3's log is ahead)
    assert nt.raft(3).state is StateType.LEADER


def wipe_and_rejoin(nt: Network, node_id: int) -> None:
    """Replace ``node_id`` by an empty node that abstains: a member that lost its disk."""
    nt.peers[NodeId(node_id)] = new_peer(node_id, range(1, len(nt.peers) + 1), abstain=True)


def test_an_abstaining_node_takes_no_commit_index_from_heartbeats() -> None:
    # The leader still records what node 3 held before it lost its disk: a heartbeat's
    # commit (bounded by that record) points past 3's log. It once stopped the node with
    # "to_commit is out of range"; an abstaining node now waits for an append instead.
    nt = Network.of_size(3)
    nt.campaign(1)
    for i in range(5):
        nt.propose(1, b"entry %d" % i)
    wipe_and_rejoin(nt, 3)
    nt.ignore(MT.MsgApp)  # heartbeats only
    nt.tick(1, 3)
    assert nt.raft(3).raft_log.committed == 0
    assert nt.raft(3).lead == 1


def rejoined_and_caught_up(nt: Network) -> None:
    """Node 3 lost its disk, rejoined abstaining and received every entry of leader 1."""
    nt.campaign(1)
    for i in range(3):
        nt.propose(1, b"entry %d" % i)
    wipe_and_rejoin(nt, 3)
    nt.peer(1).node.report_lost_data(NodeId(3))
    nt.deliver(1)
    assert nt.raft(3).raft_log.committed == nt.raft(1).raft_log.committed


def only_appends_with_entries_reach_3(m: Message) -> Message | None:
    return None if m.type is MT.MsgApp and m.to == 3 and not m.entries else m


def test_an_abstaining_node_takes_a_heartbeat_commit_up_to_what_appends_proved() -> None:
    # The simulator's wipe seed 1014: the rejoined node received the last entries in an
    # append whose commit was older, and the append that carried the new commit was lost.
    # The leader records the node as caught up and sends it only heartbeats. The node
    # ignored their commit, so in a quiet cluster it never applied the last entry.
    nt = Network.of_size(3)
    rejoined_and_caught_up(nt)
    nt.msg_hook = only_appends_with_entries_reach_3
    nt.propose(1, b"last")
    leader_commit = nt.raft(1).raft_log.committed
    assert nt.raft(3).raft_log.committed < leader_commit
    nt.tick(1)  # one heartbeat
    assert nt.raft(3).raft_log.committed == leader_commit
    assert nt.peer(3).applied_data()[-1] == b"last"


def test_an_abstaining_node_that_restarted_asks_for_an_append_to_take_the_commit() -> None:
    # Restarted, the abstaining node has proved nothing in this life, so a heartbeat's
    # commit stays out of reach; its answer says so and the leader sends an append, or in
    # a quiet cluster the node would wait for the next proposal to apply what is committed.
    nt = Network.of_size(3)
    rejoined_and_caught_up(nt)
    nt.msg_hook = only_appends_with_entries_reach_3
    nt.propose(1, b"last")
    nt.msg_hook = None
    storage = nt.peer(3).storage
    nt.peers[NodeId(3)] = Peer(RawNode(new_config(3, storage, abstain=True)), storage)
    nt.raft(3).become_follower(nt.raft(1).term, NONE)
    leader_commit = nt.raft(1).raft_log.committed
    assert nt.raft(3).raft_log.committed < leader_commit
    nt.tick(1)  # one heartbeat: answered "lagging", then an append
    assert nt.raft(3).raft_log.committed >= leader_commit
    assert nt.raft(3).raft_log.committed == nt.raft(1).raft_log.committed
    assert nt.peer(3).applied_data()[-1] == b"last"


def test_a_node_records_the_commit_its_leader_reported_unclipped() -> None:
    # A node's commit index is clipped to the entries it received; the leader's own commit,
    # as reported in its appends, is what a node that lost its data must reach before it
    # votes again (RawNode.set_abstain).
    nt = Network.of_size(3, max_size_per_msg=1)
    nt.campaign(1)
    for i in range(4):
        nt.propose(1, b"entry %d" % i)
    leader_commit = nt.raft(1).raft_log.committed
    assert leader_commit == 5
    wipe_and_rejoin(nt, 3)

    probed: list[Message] = []

    def entries_beyond_3_lost(m: Message) -> Message | None:
        if m.type is not MT.MsgApp or m.to != 3:
            return m
        if not probed:  # the probe at the leader's last entry, rejected
            probed.append(m)
            return m
        return None if m.entries and m.entries[-1].index > 3 else m

    nt.msg_hook = entries_beyond_3_lost
    nt.peer(1).node.report_lost_data(NodeId(3))
    nt.deliver(1)
    status = nt.peer(3).node.basic_status()
    assert status.hard_state.commit == 3  # clipped to the entries received
    assert status.lead_commit == leader_commit  # as the leader sent it
    nt.raft(3).become_follower(Term(nt.raft(3).term + 1), NONE)  # a new term forgets it
    assert nt.peer(3).node.basic_status().lead_commit == 0


def test_an_abstaining_peers_acknowledgements_count_toward_no_quorum() -> None:
    # Node 3 lost its data and forgot the terms it knew: it follows (and acknowledges) a
    # leader that a majority, with its lost vote, may already have deposed. The simulator's
    # wipe seed 1845: the deposed leader 1 answered a read with its old commit index, its
    # heartbeat round confirmed by 3 alone. Its appends would commit as readily.
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"before")
    wipe_and_rejoin(nt, 3)
    for node_id in (1, 2):
        nt.peer(node_id).node.report_abstaining(NodeId(3), True)
    nt.peer(1).node.report_lost_data(NodeId(3))
    nt.deliver(1)
    nt.isolate(2)  # deposed, as far as 1 can tell
    commit = nt.raft(1).raft_log.committed
    nt.propose(1, b"acknowledged by 3 only")
    assert nt.raft(3).raft_log.last_index() == nt.raft(1).raft_log.last_index()
    assert nt.raft(1).raft_log.committed == commit  # 3's acknowledgement not counted
    nt.peer(1).node.read_index(b"read")
    nt.deliver(1)
    nt.tick(1)
    assert not nt.peer(1).read_states  # 3's heartbeat acknowledgement not counted either
    nt.recover()
    nt.peer(1).node.report_abstaining(NodeId(3), False)  # caught up: counted again
    nt.deliver(1)
    assert nt.raft(1).raft_log.committed == nt.raft(1).raft_log.last_index()
    assert nt.peer(3).applied_data()[-1] == b"acknowledged by 3 only"


def test_an_abstaining_node_in_a_quiet_cluster_asks_for_a_commit() -> None:
    # It holds everything its leader reported committed, but saw no commit made while it
    # abstained (RawNode.set_abstain): it proposes an empty entry, whose commit it sees.
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"before")
    wipe_and_rejoin(nt, 3)
    for node_id in (1, 2):
        nt.peer(node_id).node.report_abstaining(NodeId(3), True)
    nt.peer(1).node.report_lost_data(NodeId(3))
    first_commit = nt.raft(1).raft_log.committed
    nt.deliver(1)
    status = nt.peer(3).node.basic_status()
    assert status.lead_commit_first == first_commit
    assert status.lead_commit == first_commit + 1  # the empty entry it asked for
    assert status.hard_state.commit == status.lead_commit
    last = nt.peer(1).applied[-1]
    assert last.data == b"" and last.term == nt.raft(1).term
    nt.tick(1, 5)
    assert nt.raft(1).raft_log.last_index() == first_commit + 1  # asked once


def test_a_node_that_stops_abstaining_records_a_vote_for_its_leader() -> None:
    # It may have voted in this term before it lost its data. Restarted with no vote (and no
    # leader), it would grant another candidate of the same term a second one.
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"before")
    wipe_and_rejoin(nt, 3)
    nt.peer(1).node.report_lost_data(NodeId(3))
    nt.deliver(1)
    term = nt.raft(1).term
    assert nt.raft(3).term == term and nt.raft(3).vote == NONE
    nt.peer(3).node.set_abstain(False)
    nt.deliver(3)  # the Ready persists the vote
    storage = nt.peer(3).storage
    assert storage.hard_state.vote == 1
    nt.peers[NodeId(3)] = Peer(RawNode(new_config(3, storage)), storage)  # restarted
    nt.send(
        Message(
            type=MT.MsgVote,
            from_=NodeId(2),
            to=NodeId(3),
            term=term,
            index=nt.raft(1).raft_log.last_index(),
            log_term=term,
        )
    )
    answers = [m for m in nt.delivered if m.type is MT.MsgVoteResp and m.from_ == 3]
    assert answers and answers[-1].reject


def test_check_quorum_does_not_count_an_abstaining_peer() -> None:
    nt = Network.of_size(3, check_quorum=True)
    nt.campaign(1)
    nt.peer(1).node.report_abstaining(NodeId(3), True)
    nt.isolate(2)
    nt.tick(1, 2 * nt.raft(1).election_timeout)  # 3 answers every heartbeat
    assert nt.raft(1).state is StateType.FOLLOWER


def test_a_leader_told_a_peer_lost_its_data_sends_it_everything_again() -> None:
    # Without the report the leader's record (match 6) makes 3's rejections of appends at
    # index 6 look stale, and the two exchange the same append and rejection forever (the
    # simulator's wipe profile shows it as a liveness failure: see tests/sim/test_sim.py).
    nt = Network.of_size(3)
    nt.campaign(1)
    for i in range(5):
        nt.propose(1, b"entry %d" % i)
    wipe_and_rejoin(nt, 3)
    nt.peer(1).node.report_lost_data(NodeId(3))
    assert nt.raft(1).trk.progress[NodeId(3)].match == 0
    nt.send(*nt.peer(1).handle_ready())
    nt.propose(1, b"after")
    leader_log, rejoined = nt.raft(1).raft_log, nt.raft(3).raft_log
    assert rejoined.last_index() == leader_log.last_index()
    assert rejoined.committed == leader_log.committed
    assert nt.peer(3).applied_data() == nt.peer(1).applied_data()
    assert nt.peer(3).applied_data()[-1] == b"after"


def test_only_a_leader_acts_on_a_lost_data_report() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    before = repr(nt.raft(2).trk.progress[NodeId(3)])
    nt.peer(2).node.report_lost_data(NodeId(3))
    assert repr(nt.raft(2).trk.progress[NodeId(3)]) == before
    assert not nt.peer(2).handle_ready()


def test_pre_vote_rejected_by_up_to_date_majority() -> None:
    nt = Network.of_size(3, pre_vote=True)
    nt.campaign(1)
    nt.isolate(3)
    nt.propose(1, b"x")
    nt.recover()
    # Node 3's log is behind: its pre-vote is refused and its term is left alone.
    nt.raft(1).become_follower(nt.raft(1).term, NONE)
    nt.raft(2).become_follower(nt.raft(2).term, NONE)
    nt.campaign(3)
    assert nt.raft(3).state is StateType.FOLLOWER
    assert nt.raft(3).term == 1


def test_check_quorum_leader_steps_down_without_quorum_contact() -> None:
    nt = Network.of_size(3, check_quorum=True)
    nt.campaign(1)
    nt.tick(1, 25)  # heartbeats answered: stays leader
    assert nt.raft(1).state is StateType.LEADER
    nt.isolate(1)
    nt.tick(1, 2 * 10)
    assert nt.raft(1).state is StateType.FOLLOWER
    assert nt.raft(1).lead == 0


def test_leader_stickiness_ignores_vote_requests_during_lease() -> None:
    nt = Network.of_size(3, check_quorum=True)
    nt.campaign(1)
    nt.campaign(3)  # an impatient node: both others heard from the leader recently
    assert nt.raft(3).state is StateType.CANDIDATE
    assert nt.raft(1).state is StateType.LEADER
    assert nt.raft(1).term == 1
    assert nt.raft(2).term == 1 and nt.raft(2).vote == 1


def test_transfer_campaign_overrides_the_lease() -> None:
    nt = Network.of_size(3, check_quorum=True)
    nt.campaign(1)
    nt.send(Message(type=MT.MsgTransferLeader, from_=NodeId(3), to=NodeId(1)))
    assert leaders(nt) == [3]
    assert nt.raft(3).term == 2


# -- ReadIndex --------------------------------------------------------------------------------


def test_read_index_safe_confirms_leadership_with_a_heartbeat_round() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"x")
    leader = nt.peer(1)
    delivered = len(nt.delivered)
    leader.node.read_index(b"read-1")
    nt.deliver(1)
    assert [rs.request_ctx for rs in leader.read_states] == [b"read-1"]
    assert leader.read_states[0].index == leader.raft.raft_log.committed == 2
    heartbeats = [m for m in nt.delivered[delivered:] if m.type is MT.MsgHeartbeat]
    assert {m.context for m in heartbeats} == {b"read-1"}


def test_read_index_safe_waits_for_a_quorum() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.isolate(1)
    nt.peer(1).node.read_index(b"r")
    nt.deliver(1)
    assert nt.peer(1).read_states == []
    nt.recover()
    nt.tick(1)  # the next heartbeat carries the pending context
    assert [rs.request_ctx for rs in nt.peer(1).read_states] == [b"r"]


def test_read_index_from_a_follower_is_answered_through_the_leader() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.peer(2).node.read_index(b"follower-read")
    nt.deliver(2)
    [state] = nt.peer(2).read_states
    assert state.request_ctx == b"follower-read"
    assert state.index == nt.raft(1).raft_log.committed


def test_read_index_waits_for_the_new_leader_to_commit_in_its_term() -> None:
    nt = Network.of_size(3)
    nt.ignore(MT.MsgApp)
    nt.campaign(1)
    assert nt.raft(1).raft_log.committed == 0
    nt.peer(1).node.read_index(b"early")
    nt.deliver(1)
    assert nt.peer(1).read_states == []
    assert len(nt.raft(1).pending_read_index_messages) == 1
    nt.recover()
    nt.tick(1)  # heartbeat responses trigger the append; the no-op commits; the read goes
    assert [rs.request_ctx for rs in nt.peer(1).read_states] == [b"early"]
    assert nt.peer(1).read_states[0].index == 1


def test_read_index_lease_based_answers_without_a_heartbeat_round() -> None:
    nt = Network.of_size(3, check_quorum=True, read_only_option=ReadOnlyOption.LEASE_BASED)
    nt.campaign(1)
    nt.isolate(1)  # no round trip is needed within the lease
    nt.peer(1).node.read_index(b"lease")
    nt.deliver(1)
    assert [rs.request_ctx for rs in nt.peer(1).read_states] == [b"lease"]


def test_lease_based_reads_require_check_quorum() -> None:
    storage = new_storage((1,))
    with pytest.raises(ConfigError, match="check_quorum"):
        RawNode(
            new_config(1, storage, check_quorum=False, read_only_option=ReadOnlyOption.LEASE_BASED)
        )


@pytest.mark.parametrize(
    "overrides",
    [
        {"heartbeat_tick": 0},
        {"election_tick": 1, "heartbeat_tick": 1},
        {"max_inflight_msgs": 0},
        {"max_inflight_bytes": 10, "max_size_per_msg": 100},
    ],
)
def test_invalid_configs_are_refused(overrides: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        RawNode(new_config(1, new_storage((1,)), **overrides))


# -- leadership transfer ---------------------------------------------------------------------


def test_transfer_to_up_to_date_follower() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.send(Message(type=MT.MsgTransferLeader, from_=NodeId(2), to=NodeId(1)))
    assert leaders(nt) == [2]
    assert nt.raft(1).lead == 2


def test_transfer_request_to_a_follower_is_forwarded_to_the_leader() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.peer(3).node.transfer_leader(NodeId(3))
    nt.deliver(3)
    assert leaders(nt) == [3]


def test_transfer_catches_up_a_lagging_transferee_first() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.isolate(3)
    nt.propose(1, b"x")
    nt.recover()
    assert nt.raft(3).raft_log.last_index() < nt.raft(1).raft_log.last_index()
    nt.peer(1).node.transfer_leader(NodeId(3))
    nt.deliver(1)
    assert leaders(nt) == [3]
    assert nt.peer(3).applied_data() == [b"x"]


def test_transfer_drops_proposals_and_aborts_after_an_election_timeout() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.isolate(3)
    nt.peer(1).node.transfer_leader(NodeId(3))
    nt.deliver(1)
    assert nt.raft(1).lead_transferee == 3
    with pytest.raises(ProposalDroppedError, match="transfer"):
        nt.peer(1).node.propose(b"dropped")
    nt.tick(1, 10)
    assert nt.raft(1).lead_transferee == NONE
    assert nt.raft(1).state is StateType.LEADER
    nt.propose(1, b"accepted")
    assert nt.peer(2).applied_data() == [b"accepted"]


def test_a_learner_cannot_be_transferee() -> None:
    peers = [new_peer(i, (1, 2, 3), learners=(4,)) for i in (1, 2, 3, 4)]
    nt = Network(peers)
    nt.campaign(1)
    nt.send(Message(type=MT.MsgTransferLeader, from_=NodeId(4), to=NodeId(1)))
    assert nt.raft(1).lead_transferee == NONE
    assert leaders(nt) == [1]


# -- membership changes ------------------------------------------------------------------------


def new_cluster_with_spares(members: int, spares: tuple[int, ...], **config: object) -> Network:
    """``members`` voters plus spare nodes that know the initial configuration but are not in
    it (they replay the log, configuration changes included, once added)."""
    member_ids = range(1, members + 1)
    peers = [new_peer(i, member_ids, **config) for i in (*member_ids, *spares)]  # type: ignore[arg-type]
    return Network(peers)


def test_joint_consensus_enter_and_auto_leave() -> None:
    nt = new_cluster_with_spares(3, (4, 5))
    nt.campaign(1)
    nt.propose_conf_change(1, change((ADD, 4), (REMOVE, 3), (ADD, 5)))
    # The joint configuration was entered, then left automatically by the leader.
    cc_entries = [e for e in nt.peer(1).applied if e.type is EntryType.CONF_CHANGE]
    assert len(cc_entries) == 2
    for node_id in (1, 2, 4, 5):
        assert conf_state(nt.peer(node_id)) == voters(1, 2, 4, 5)
    nt.propose(1, b"after")
    for node_id in (1, 2, 4, 5):
        assert nt.peer(node_id).applied_data() == [b"after"]


def test_joint_consensus_explicit_leave() -> None:
    nt = new_cluster_with_spares(3, (4,))
    nt.campaign(1)
    nt.propose_conf_change(1, change((ADD, 4), transition=ConfChangeTransition.JOINT_EXPLICIT))
    joint = ConfState(
        voters=(NodeId(1), NodeId(2), NodeId(3), NodeId(4)),
        voters_outgoing=(NodeId(1), NodeId(2), NodeId(3)),
    )
    assert conf_state(nt.peer(1)) == joint
    assert conf_state(nt.peer(4)) == joint
    # While joint, a change other than leaving is refused (becomes an empty entry).
    nt.propose_conf_change(1, change((ADD, 5)))
    assert conf_state(nt.peer(1)) == joint
    nt.propose_conf_change(1, ConfChange())
    assert conf_state(nt.peer(1)) == voters(1, 2, 3, 4)


def test_joint_quorum_needs_both_majorities() -> None:
    nt = new_cluster_with_spares(3, (4, 5, 6))
    nt.campaign(1)
    nt.propose_conf_change(
        1,
        change((ADD, 4), (ADD, 5), (ADD, 6), transition=ConfChangeTransition.JOINT_EXPLICIT),
    )
    # Incoming (1..6) has a majority without 2 and 3 (1, 4, 5, 6) but outgoing (1, 2, 3)
    # does not: nothing commits.
    nt.isolate(2)
    nt.isolate(3)
    committed = nt.raft(1).raft_log.committed
    nt.propose(1, b"needs-outgoing-majority")
    assert nt.raft(1).raft_log.committed == committed
    nt.recover()
    nt.tick(1)
    assert b"needs-outgoing-majority" in nt.peer(1).applied_data()


def test_conf_change_refused_while_another_is_pending() -> None:
    nt = new_cluster_with_spares(3, (4, 5))
    nt.campaign(1)
    nt.ignore(MT.MsgApp)  # keep the first change from committing
    nt.propose_conf_change(1, change((ADD, 4)))
    assert nt.raft(1).pending_conf_index > nt.raft(1).raft_log.applied
    nt.propose_conf_change(1, change((ADD, 5)))
    last = nt.raft(1).raft_log.all_entries()[-1]
    assert last.type is EntryType.NORMAL and last.data == b""
    nt.recover()
    nt.tick(1)
    assert conf_state(nt.peer(1)) == voters(1, 2, 3, 4)


def test_fresh_leader_conf_change_waits_for_its_no_op() -> None:
    nt = new_cluster_with_spares(3, (4,))
    nt.ignore(MT.MsgApp)
    nt.campaign(1)
    assert nt.raft(1).raft_log.committed == 0  # the no-op is not committed
    nt.propose_conf_change(1, change((ADD, 4)))
    assert nt.raft(1).raft_log.all_entries()[-1].type is EntryType.NORMAL  # refused
    nt.recover()
    nt.tick(1)
    nt.propose_conf_change(1, change((ADD, 4)))
    assert conf_state(nt.peer(1)) == voters(1, 2, 3, 4)


def test_new_leader_conf_change_waits_until_its_log_is_applied() -> None:
    # The new leader holds entries it has not applied; one may be a conf change.
    storage = new_storage((1, 2, 3))
    storage.append([Entry(Term(1), Index(1)), Entry(Term(1), Index(2), data=b"x")])
    storage.set_hard_state(HardState(term=Term(1)))
    leader = Peer(RawNode(new_config(1, storage)), storage)
    nt = Network([leader, new_peer(2, (1, 2, 3)), new_peer(3, (1, 2, 3))])
    nt.ignore(MT.MsgApp)
    nt.campaign(1)
    assert leader.raft.state is StateType.LEADER
    assert leader.raft.pending_conf_index == 3  # the no-op
    nt.propose_conf_change(1, change((LEARNER, 4)))
    assert leader.raft.raft_log.all_entries()[-1].type is EntryType.NORMAL  # refused
    nt.recover()
    nt.tick(1)
    assert leader.raft.raft_log.applied >= 3  # the no-op and everything before it
    nt.propose_conf_change(1, change((LEARNER, 4)))
    assert ConfState(voters=(NodeId(1), NodeId(2), NodeId(3)), learners=(NodeId(4),)) == (
        conf_state(leader)
    )


def test_leader_steps_down_when_removed() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose_conf_change(1, change((REMOVE, 1)))
    assert nt.raft(1).state is StateType.FOLLOWER
    assert conf_state(nt.peer(2)) == voters(2, 3)
    with pytest.raises(ProposalDroppedError):
        nt.peer(1).node.propose(b"x")  # no leader known, and not a member anyway
    nt.campaign(2)
    assert leaders(nt) == [2]


# -- learners -----------------------------------------------------------------------------------


def test_learner_receives_the_log_but_never_campaigns() -> None:
    peers = [new_peer(i, (1, 2, 3), learners=(4,)) for i in (1, 2, 3, 4)]
    nt = Network(peers)
    nt.campaign(1)
    nt.propose(1, b"x")
    assert nt.peer(4).applied_data() == [b"x"]
    nt.isolate(1)
    sent_before = len(nt.delivered)
    nt.tick(4, 50)
    assert nt.raft(4).state is StateType.FOLLOWER
    assert not any(m.from_ == 4 for m in nt.delivered[sent_before:])


def test_learner_is_not_asked_to_vote_and_its_vote_does_not_count() -> None:
    peers: list[Peer | None] = [new_peer(1, (1, 2), learners=(3,)), None]
    peers.append(new_peer(3, (1, 2), learners=(3,)))
    nt = Network(peers)
    nt.campaign(1)
    assert not [m for m in nt.delivered if m.type is MT.MsgVote and m.to == 3]
    nt.send(Message(type=MT.MsgVoteResp, from_=NodeId(3), to=NodeId(1), term=Term(1)))
    assert nt.raft(1).state is StateType.CANDIDATE  # only voters count


def test_learner_promotion() -> None:
    peers = [new_peer(i, (1, 2, 3), learners=(4,)) for i in (1, 2, 3, 4)]
    nt = Network(peers)
    nt.campaign(1)
    nt.propose_conf_change(1, change((ADD, 4)))
    assert conf_state(nt.peer(4)) == voters(1, 2, 3, 4)
    assert not nt.raft(4).is_learner
    nt.campaign(4)
    assert leaders(nt) == [4]


# -- snapshots --------------------------------------------------------------------------------


def compact_leader(nt: Network, node_id: int = 1) -> Snapshot:
    peer = nt.peer(node_id)
    applied = peer.raft.raft_log.applied
    snap = peer.storage.create_snapshot(applied, conf_state(peer), b"state@%d" % applied)
    peer.storage.compact(applied)
    return snap


def test_snapshot_catches_up_a_follower_behind_compaction() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.isolate(3)
    for i in range(5):
        nt.propose(1, b"e%d" % i)
    snap = compact_leader(nt)
    nt.propose(1, b"after-snapshot")
    nt.recover()
    nt.tick(1)  # heartbeat -> response -> the follower needs compacted entries
    sent = [m for m in nt.delivered if m.type is MT.MsgSnap]
    assert len(sent) == 1 and sent[0].to == 3
    follower = nt.peer(3)
    assert any(rd.snapshot == snap for rd in follower.readies)
    assert follower.storage.snapshot() == snap
    assert follower.raft.raft_log.last_index() == nt.raft(1).raft_log.last_index()
    assert follower.applied_data()[-1:] == [b"after-snapshot"]
    assert nt.raft(1).trk.progress[NodeId(3)].state is ProgressState.REPLICATE


class FlakySnapshotStorage(BootstrapStorage):
    """Storage whose snapshot is temporarily unavailable until ``ready`` is set."""

    def __init__(self, cs: ConfState) -> None:
        super().__init__(cs)
        self.ready = False

    def snapshot(self) -> Snapshot:
        if not self.ready:
            raise SnapshotTemporarilyUnavailableError()
        return super().snapshot()


def test_snapshot_temporarily_unavailable_is_retried_later() -> None:
    storage = FlakySnapshotStorage(voters(1, 2, 3))
    leader = Peer(RawNode(new_config(1, storage)), storage)
    nt = Network([leader, new_peer(2, (1, 2, 3)), new_peer(3, (1, 2, 3))])
    nt.campaign(1)
    nt.isolate(3)
    nt.propose(1, b"x")
    storage.ready = True
    compact_leader(nt)
    storage.ready = False
    nt.recover()
    nt.tick(1)
    assert not [m for m in nt.delivered if m.type is MT.MsgSnap]
    storage.ready = True
    nt.tick(1)
    assert [m.to for m in nt.delivered if m.type is MT.MsgSnap] == [3]
    assert nt.peer(3).applied_data() == [] and nt.raft(3).raft_log.committed >= 2


# -- replication: backtracking and flow control ---------------------------------------------


def peer_with_terms(node_id: int, terms: list[int], term: int) -> Peer:
    storage = new_storage((1, 2, 3))
    storage.append([Entry(Term(t), Index(i)) for i, t in enumerate(terms, start=1)])
    storage.set_hard_state(HardState(term=Term(term), commit=Index(1)))
    return Peer(RawNode(new_config(node_id, storage)), storage)


@pytest.mark.parametrize(
    ("leader_terms", "follower_terms"),
    [
        # The follower has a long divergent tail of higher terms than the leader's entries.
        ([1] + [3] * 50, [1] + [2] * 50 + [5] * 50),
        # The follower has a long divergent tail of lower terms.
        ([1] + [2] * 10 + [5] * 40, [1] + [3] * 80),
    ],
)
def test_fast_backtracking_needs_few_rejections(
    leader_terms: list[int], follower_terms: list[int]
) -> None:
    top = max(leader_terms + follower_terms)
    leader = peer_with_terms(1, leader_terms, top)
    follower = peer_with_terms(2, follower_terms, top)
    third = peer_with_terms(3, leader_terms, top)
    nt = Network([leader, follower, third])
    nt.send(Message(type=MT.MsgHup, from_=NodeId(1), to=NodeId(1)))
    if leader.raft.state is not StateType.LEADER:  # the follower's log may win the vote
        nt.send(Message(type=MT.MsgVoteResp, from_=NodeId(3), to=NodeId(1), term=Term(top + 1)))
    assert leader.raft.state is StateType.LEADER
    rejections = [m for m in nt.delivered if m.type is MT.MsgAppResp and m.reject and m.from_ == 2]
    # Naive probing would need one rejection per divergent entry (tens here).
    assert 1 <= len(rejections) <= 2
    assert follower.raft.raft_log.all_entries() == leader.raft.raft_log.all_entries()


def test_inflight_limit_caps_pipelined_messages() -> None:
    nt = Network.of_size(3, max_inflight_msgs=3)
    nt.campaign(1)
    nt.propose(1, b"warmup")  # node 2 is now in REPLICATE state
    sent_to_2: list[Message] = []

    def swallow_to_2(m: Message) -> Message | None:
        if m.to == 2:
            sent_to_2.append(m)
            return None
        return m

    nt.msg_hook = swallow_to_2
    for i in range(10):
        nt.propose(1, b"p%d" % i)
    appends = [m for m in sent_to_2 if m.type is MT.MsgApp and m.entries]
    assert len(appends) == 3
    pr = nt.raft(1).trk.progress[NodeId(2)]
    assert pr.state is ProgressState.REPLICATE and pr.inflights.full() and pr.is_paused()
    # Everything still commits through node 3.
    assert nt.peer(3).applied_data()[-1] == b"p9"


def test_inflight_byte_limit() -> None:
    nt = Network.of_size(3, max_inflight_bytes=250, max_size_per_msg=100)
    nt.campaign(1)
    nt.propose(1, b"warmup")
    nt.msg_hook = lambda m: None if m.to == 2 else m
    for _i in range(10):
        nt.propose(1, b"x" * 100)
    pr = nt.raft(1).trk.progress[NodeId(2)]
    assert pr.inflights.count() == 3 and pr.inflights.bytes == 300
    assert pr.is_paused()


def test_batching_respects_max_size_per_msg() -> None:
    payload = b"y" * 100
    one = entries_size([Entry(Term(1), Index(1), data=payload)])
    nt = Network.of_size(3, max_size_per_msg=2 * one)
    nt.campaign(1)
    nt.isolate(3)
    for _ in range(6):
        nt.propose(1, payload)
    nt.recover()
    start = len(nt.delivered)
    nt.tick(1)
    appends = [m for m in nt.delivered[start:] if m.type is MT.MsgApp and m.to == 3 and m.entries]
    assert [len(m.entries) for m in appends] == [2, 2, 2]
    assert nt.peer(3).applied_data() == [payload] * 6


def test_max_uncommitted_entries_size_drops_proposals() -> None:
    nt = Network.of_size(3, max_uncommitted_entries_size=250)
    nt.campaign(1)
    nt.isolate(1)
    node = nt.peer(1).node
    node.propose(b"a" * 100)
    node.propose(b"b" * 100)
    with pytest.raises(ProposalDroppedError, match="uncommitted"):
        node.propose(b"c" * 100)
    nt.recover()
    nt.deliver(1)
    nt.tick(1)  # the backlog commits and frees the quota
    assert nt.raft(1).uncommitted_size == 0
    node.propose(b"c" * 100)


def test_unreachable_follower_falls_back_to_probing() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"x")
    pr = nt.raft(1).trk.progress[NodeId(2)]
    states = [pr.state]
    nt.peer(1).node.report_unreachable(NodeId(2))
    states.append(pr.state)
    assert states == [ProgressState.REPLICATE, ProgressState.PROBE]


def probing_follower(nt: Network, follower: int) -> None:
    """Elect node 1 and put ``follower`` in PROBE, as after a lost stream."""
    nt.campaign(1)
    nt.propose(1, b"warmup")
    nt.peer(1).node.report_unreachable(NodeId(follower))
    assert nt.raft(1).trk.progress[NodeId(follower)].state is ProgressState.PROBE


def entries_sent(msgs: list[Message], to: int) -> list[int]:
    return [len(m.entries) for m in msgs if m.type is MT.MsgApp and m.to == to]


def test_a_probe_is_not_resent_with_its_entries_on_every_heartbeat_answer() -> None:
    # A follower slow to persist (its acks held back) keeps answering heartbeats, and every
    # ReadIndex sends one: each answer used to resend everything from the follower's match.
    nt = Network.of_size(3)
    probing_follower(nt, 2)
    held: list[Message] = []
    sent: list[Message] = []

    def hold_acks_of_2(m: Message) -> Message | None:
        if m.type is MT.MsgAppResp and m.from_ == 2:
            held.append(m)
            return None
        if m.to == 2:
            sent.append(m)
        return m

    nt.msg_hook = hold_acks_of_2
    for i in range(20):
        nt.propose(1, b"p%d" % i)
    for i in range(5):
        nt.tick(1)  # a heartbeat round
        nt.peer(1).node.read_index(b"read%d" % i)  # and a ReadIndex's heartbeat round
        nt.deliver(1)
    counts = entries_sent(sent, 2)
    # One probe with entries; the heartbeat answers after it got empty probes.
    assert counts[0] == 1 and len(counts) >= 10 and counts[1:] == [0] * (len(counts) - 1)
    assert nt.peer(1).read_states and nt.peer(3).applied_data()[-1] == b"p19"
    # The acks arrive: the follower goes to REPLICATE and gets the rest once.
    nt.msg_hook = None
    sent_before = len(nt.delivered)
    nt.send(*held)
    after = entries_sent(nt.delivered[sent_before:], 2)
    assert sum(after) == 19  # p1..p19: p0 came with the probe
    assert nt.raft(1).trk.progress[NodeId(2)].state is ProgressState.REPLICATE
    assert nt.peer(2).applied_data()[-1] == b"p19"


def test_a_lost_probe_is_recovered_by_an_empty_one() -> None:
    nt = Network.of_size(3)
    probing_follower(nt, 2)
    lost: list[Message] = []

    def lose_appends_to_2(m: Message) -> Message | None:
        if m.type is MT.MsgApp and m.to == 2 and m.entries:
            lost.append(m)
            return None
        return m

    nt.msg_hook = lose_appends_to_2
    nt.propose(1, b"lost")
    assert len(lost) == 1
    nt.msg_hook = None
    nt.propose(1, b"paused")  # the probe is unanswered: nothing is sent to 2
    assert nt.peer(2).applied_data() == [b"warmup"]
    nt.tick(1)  # heartbeat answer -> empty probe -> accepted -> REPLICATE -> the entries
    assert nt.raft(1).trk.progress[NodeId(2)].state is ProgressState.REPLICATE
    assert nt.peer(2).applied_data() == [b"warmup", b"lost", b"paused"]


def test_after_an_unreachable_report_the_next_probe_carries_entries() -> None:
    # The transport reports a peer unreachable when messages to it may have been lost: the
    # probe with entries may be among them, so the next one carries them again.
    nt = Network.of_size(3)
    probing_follower(nt, 2)
    nt.isolate(2)
    nt.propose(1, b"during")
    pr = nt.raft(1).trk.progress[NodeId(2)]
    assert pr.probe_sent_entries
    nt.peer(1).node.report_unreachable(NodeId(2))
    assert not pr.probe_sent_entries
    nt.recover()
    start = len(nt.delivered)
    nt.tick(1)
    assert entries_sent(nt.delivered[start:], 2)[0] == 1
    assert nt.peer(2).applied_data() == [b"warmup", b"during"]


def test_heartbeat_commit_never_exceeds_follower_match() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.isolate(3)
    nt.propose(1, b"x")
    nt.recover()
    start = len(nt.delivered)
    nt.ignore(MT.MsgHeartbeatResp)
    nt.tick(1)
    [hb] = [m for m in nt.delivered[start:] if m.type is MT.MsgHeartbeat and m.to == 3]
    assert hb.commit == nt.raft(1).trk.progress[NodeId(3)].match < nt.raft(1).raft_log.committed


def test_a_follower_answers_appends_with_entries_but_not_commit_notices() -> None:
    # A commit notice (an entry-less MsgApp to a follower known to hold all it is sent) moves
    # only the follower's commit index: its ack would tell the leader nothing, so none is sent.
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"warmup")
    start = len(nt.delivered)
    for i in range(5):
        nt.propose(1, b"p%d" % i)
    msgs = nt.delivered[start:]
    appends = [m for m in msgs if m.type is MT.MsgApp]
    notices = [m for m in appends if not m.entries]
    acks = [m for m in msgs if m.type is MT.MsgAppResp and m.to == 1]
    assert len(appends) == 20 and len(notices) == 10
    assert all(m.context == COMMIT_NOTICE_CONTEXT for m in notices)
    assert all(not m.context for m in appends if m.entries)
    # One ack per append with entries, none per notice (there used to be 20).
    assert len(acks) == 10 and all(not m.reject for m in acks)
    leader = nt.raft(1)
    for follower in (2, 3):
        pr = leader.trk.progress[NodeId(follower)]
        assert pr.state is ProgressState.REPLICATE and pr.match == leader.raft_log.last_index()
        assert nt.raft(follower).raft_log.committed == leader.raft_log.committed
        assert nt.peer(follower).applied_data()[-1] == b"p4"


def test_empty_probes_are_not_commit_notices() -> None:
    # The leader marks only what it sends because the commit advanced, to a follower in
    # REPLICATE: an empty probe's answer is what moves the follower back to REPLICATE.
    nt = Network.of_size(3)
    probing_follower(nt, 2)
    held: list[Message] = []

    def hold_acks_of_2(m: Message) -> Message | None:
        if m.type is MT.MsgAppResp and m.from_ == 2:
            held.append(m)
            return None
        return m

    nt.msg_hook = hold_acks_of_2
    nt.propose(1, b"p")  # the probe with entries, its ack held; commits through 3
    start = len(nt.delivered)
    nt.tick(1)  # a heartbeat answer: an empty re-probe
    probes = [m for m in nt.delivered[start:] if m.type is MT.MsgApp and m.to == 2]
    assert probes and all(not m.entries and not m.context for m in probes)
    assert [m for m in held if not m.reject and m.index == probes[0].index]
    nt.msg_hook = None
    nt.send(*held)
    assert nt.raft(1).trk.progress[NodeId(2)].state is ProgressState.REPLICATE
    nt.propose(1, b"q")
    assert nt.peer(2).applied_data()[-2:] == [b"p", b"q"]


def test_a_rejected_commit_notice_is_answered() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"x")
    last = nt.raft(1).raft_log.last_index()
    notice = Message(
        type=MT.MsgApp,
        from_=NodeId(1),
        to=NodeId(2),
        term=nt.raft(1).term,
        index=Index(last + 5),  # beyond the follower's log
        log_term=nt.raft(1).term,
        commit=last,
        context=COMMIT_NOTICE_CONTEXT,
    )
    nt.peer(2).step(notice)
    [answer] = nt.peer(2).handle_ready()
    assert answer.type is MT.MsgAppResp and answer.reject and answer.index == last + 5


def test_commit_notices_mix_with_members_of_the_previous_release() -> None:
    # A leader of the previous release sends notices with no context: they are answered.
    # A follower of the previous release answers a notice: the leader takes the ack as any
    # stale one (nothing changes, nothing more is sent). Both are played here by stripping
    # the context off the notices to node 3.
    nt = Network.of_size(3)
    nt.campaign(1)

    def as_the_previous_release(m: Message) -> Message | None:
        if m.type is MT.MsgApp and m.to == 3 and m.context:
            return dataclasses.replace(m, context=b"")
        return m

    nt.msg_hook = as_the_previous_release
    start = len(nt.delivered)
    for i in range(3):
        nt.propose(1, b"p%d" % i)
    msgs = nt.delivered[start:]
    acks = {
        follower: [m for m in msgs if m.type is MT.MsgAppResp and m.from_ == follower]
        for follower in (2, 3)
    }
    assert len(acks[2]) == 3 and len(acks[3]) == 6
    # Each extra ack caused nothing: besides the proposals, the appends (3 a follower), the
    # notices (3 a follower) and those acks only.
    kinds = [m.type for m in msgs]
    assert kinds.count(MT.MsgProp) == 3 and kinds.count(MT.MsgApp) == 12
    assert len(kinds) == 3 + 12 + 9
    leader = nt.raft(1)
    for follower in (2, 3):
        assert leader.trk.progress[NodeId(follower)].match == leader.raft_log.last_index()
        assert nt.peer(follower).applied_data() == [b"p0", b"p1", b"p2"]


def test_state_machine_safety_under_random_faults_and_membership_churn() -> None:
    """A short seeded run mixing faults, leader changes and conf changes."""
    for seed in range(2):
        rng = random.Random(seed)
        nt = new_cluster_with_spares(3, (4,), pre_vote=True, check_quorum=True, seed=seed)
        nt.campaign(1)
        for step in range(300):
            if step % 50 == 0:
                nt.recover()
                victim = rng.choice([1, 2, 3])
                if rng.random() < 0.5:
                    nt.isolate(victim)
            if step == 100:
                for node_id in leaders(nt):
                    nt.propose_conf_change(node_id, change((ADD, 4)))
            nt.tick(rng.choice([1, 2, 3, 4]))
            if rng.random() < 0.3:
                nt.propose(rng.choice([1, 2, 3]), b"s%d-%d" % (seed, step))
        nt.recover()
        nt.tick_all(30)
        applied = [nt.peer(i).applied for i in (1, 2, 3, 4)]
        longest = max(applied, key=len)
        assert len(longest) > 10  # the run made progress
        for log in applied:
            assert log == longest[: len(log)]
        terms = {nt.raft(i).term for i in leaders(nt)}
        assert len(leaders(nt)) <= 1 or len(terms) == len(leaders(nt))


def test_storage_is_untouched_by_the_core() -> None:
    """The core only reads storage; everything durable goes through Ready."""
    nt = Network.of_size(3)
    nt.campaign(1)
    nt.propose(1, b"x")
    for node_id in (1, 2, 3):
        peer = nt.peer(node_id)
        stored = peer.storage.entries(Index(1), Index(peer.storage.last_index() + 1))
        assert stored == peer.raft.raft_log.all_entries()
        assert peer.storage.hard_state == peer.raft.hard_state()
