"""When a member that lost its data votes again (bootstrap.has_caught_up), driven as the
Ready loop drives it: a RawNode that abstains over the member's DiskStorage, each Ready
persisted, then the rule asked with the leader's commit read with that Ready.

The member rejoined with the cluster's creation (index 1); leader 2 of term 2 holds a long
log, committed up to 40 while the member's old life acknowledged it. Appends reach the
member in batches, and its commit index is clipped to the last entry of each: after the
first batch it holds an entry of term 2 at its commit index 6, which the old rule took as
caught up ("member 3 has caught up (commit 6 of term 2 from leader 2)" in a real member's
log), so its vote could elect a member lacking entries 7..40. Nor is a member caught up with
a leader that committed nothing while it listened: it may be one deposed before the loss.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

from rallypoint.coordinator.node.bootstrap import has_caught_up
from rallypoint.raft import Config, RawNode, StateType
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest
from rallypoint.raft.types import (
    NONE,
    ConfState,
    Entry,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)
from tests.raft.network import Network, new_peer

LEADER = NodeId(2)
TERM = Term(2)
LEADER_COMMIT = Index(40)


class RejoinedMember:
    """Member 3 after it lost its data: the creation on a new disk, abstaining."""

    def __init__(self, data_dir: Path) -> None:
        self.storage = DiskStorage.open(str(data_dir))
        voters = ConfState(voters=(NodeId(1), NodeId(2), NodeId(3)))
        creation = Snapshot(b"creation", SnapshotMetadata(voters, Index(1), Term(1)))
        self._persist(PersistRequest(HardState(Term(1), NONE, Index(1)), (), creation))
        config = Config(
            id=NodeId(3),
            storage=self.storage,
            rng=random.Random(3),
            election_tick=10,
            heartbeat_tick=1,
            applied=Index(1),
            abstain=True,
        )
        self.raw = RawNode(config)
        self.commit = Index(1)
        self.caught_up = False
        self.sent: list[Message] = []

    def _persist(self, request: PersistRequest) -> None:
        self.storage.write_batch([request])
        self.storage.apply_batch([request])

    def receive(self, m: Message) -> None:
        """Step ``m``, then handle the Ready as the driver does and ask the rule."""
        self.raw.step(m)
        while self.raw.has_ready():
            rd = self.raw.ready()
            reported = self.raw.basic_status()  # with the Ready, as the driver reads it
            if not rd.hard_state.is_empty():
                self.commit = rd.hard_state.commit
            self._persist(PersistRequest(rd.hard_state, rd.entries, rd.snapshot))
            self.sent.extend((*rd.messages, *rd.messages_after_persist))
            self.raw.advance(rd)
            status = self.raw.basic_status()
            term, lead = status.hard_state.term, status.soft_state.lead
            first = reported.lead_commit_first
            if has_caught_up(self.storage, self.commit, term, lead, reported.lead_commit, first):
                self.caught_up = True

    def close(self) -> None:
        self.storage.close()


def append(prev: int, prev_term: int, first: int, last: int, commit: int) -> Message:
    """Leader 2's MsgApp of entries first..last (term 2) after (prev, prev_term)."""
    entries = tuple(Entry(TERM, Index(i), data=b"e%d" % i) for i in range(first, last + 1))
    return Message(
        type=MessageType.MsgApp,
        to=NodeId(3),
        from_=LEADER,
        term=TERM,
        index=Index(prev),
        log_term=Term(prev_term),
        entries=entries,
        commit=Index(commit),
    )


def heartbeat(commit: int) -> Message:
    return Message(
        type=MessageType.MsgHeartbeat, to=NodeId(3), from_=LEADER, term=TERM, commit=Index(commit)
    )


def test_the_first_batch_of_a_long_log_is_not_caught_up(tmp_path: Path) -> None:
    member = RejoinedMember(tmp_path)
    try:
        member.receive(append(1, 1, 2, 6, int(LEADER_COMMIT)))
        assert member.commit == 6  # clipped to the entries received
        assert member.storage.term(Index(6)) == TERM
        assert not member.caught_up
        member.receive(append(6, 2, 7, 39, int(LEADER_COMMIT)))
        assert not member.caught_up  # commit 39, one short of the leader's
        member.receive(append(39, 2, 40, 42, 41))  # the leader committed 41 meanwhile
        assert member.commit == 41
        assert member.caught_up
    finally:
        member.close()


def test_caught_up_once_the_leader_commits_while_the_member_listens(tmp_path: Path) -> None:
    # Every entry arrived with the leader's commit as of then (30), but a leader deposed
    # before the member lost its data (which it follows as readily: it forgot the newer
    # term) reports a commit index too. Only a commit made while the member abstains, hence
    # without its acknowledgements, shows the leader's term is current. The append that
    # carried the leader's next commit may be lost: a heartbeat brings the commit, up to
    # what the appends proved equal.
    member = RejoinedMember(tmp_path)
    try:
        member.receive(append(1, 1, 2, 45, 30))
        assert member.commit == 30
        assert not member.caught_up
        member.receive(heartbeat(30))
        member.receive(append(45, 2, 46, 46, 30))
        assert not member.caught_up  # the leader committed nothing since
        member.receive(append(46, 2, 47, 47, 44))
        assert member.commit == 44
        assert member.caught_up
        member.receive(heartbeat(46))
        assert member.commit == 46
    finally:
        member.close()


def test_no_append_from_the_leader_no_vote(tmp_path: Path) -> None:
    # Heartbeats alone report no commit of the leader's (theirs is clipped to what the
    # leader recorded of the member): the member waits for an append, and asks for one.
    member = RejoinedMember(tmp_path)
    try:
        member.receive(heartbeat(1))
        assert not member.caught_up
        member.receive(heartbeat(40))
        assert member.commit == 1
        assert not member.caught_up
        asked = [m for m in member.sent if m.type is MessageType.MsgHeartbeatResp and m.reject]
        assert asked, member.sent
    finally:
        member.close()


# -- the whole story, three members over the raft test network --------------------------------


def test_a_lagging_member_cannot_win_with_the_vote_of_one_that_saw_the_first_batch() -> None:
    """Leader 1 and member 3 committed entries 2..20 of term 1 while member 2 lagged; 3
    lost its disk and rejoined; 2 and 3 each received entries up to 6 (one entry per
    append), then leader 1 crashed. 2's log is as long as 3's: with 3's vote it would win
    and the committed entries 7..20 would be lost. 3 must still abstain."""
    nt = Network.of_size(3, max_size_per_msg=1)
    nt.campaign(1)
    nt.isolate(2)
    for i in range(19):
        nt.propose(1, b"acknowledged %d" % i)
    leader_commit = nt.raft(1).raft_log.committed
    assert leader_commit == 20
    nt.peers[NodeId(3)] = new_peer(3, range(1, 4), abstain=True, max_size_per_msg=1)
    nt.raft(3).become_follower(Term(1), NONE)
    for node_id in (1, 2):
        nt.peer(node_id).node.report_abstaining(NodeId(3), True)

    def beyond_6_lost(m: Message) -> Message | None:
        if m.type is MessageType.MsgApp and m.entries and m.entries[-1].index > 6:
            return None
        return m

    nt.recover()
    nt.msg_hook = beyond_6_lost
    nt.peer(1).node.report_lost_data(NodeId(3))
    nt.tick(1)  # heartbeats: 2 answers and is probed too
    member = nt.peer(3)
    status = member.node.basic_status()
    assert status.hard_state.commit == 6
    assert member.storage.term(Index(6)) == status.hard_state.term == nt.raft(1).term
    assert nt.raft(2).raft_log.last_index() == 6
    assert status.lead_commit == leader_commit
    storage = cast(DiskStorage, member.storage)  # has_caught_up reads only term()
    caught_up = has_caught_up(
        storage,
        status.hard_state.commit,
        status.hard_state.term,
        status.soft_state.lead,
        status.lead_commit,
        status.lead_commit_first,
    )
    if caught_up:
        member.node.set_abstain(False)  # as the driver does
    # Leader 1 crashes; 2 campaigns, 3 still abstains: nobody wins.
    nt.msg_hook = None
    nt.isolate(1)
    for node_id in (2, 3):
        nt.raft(node_id).become_follower(nt.raft(node_id).term, NONE)
    nt.campaign(2)
    assert nt.raft(2).state is not StateType.LEADER, "2 won, lacking committed entries 7..20"
    assert not caught_up
