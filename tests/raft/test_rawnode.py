"""The RawNode Ready/advance contract: what each Ready holds, in which order, and when."""

from __future__ import annotations

import pytest

from rallypoint.raft import (
    EMPTY_HARD_STATE,
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
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
    ReadState,
    Ready,
    SnapshotStatus,
    SoftState,
    StateType,
    StepLocalMsgError,
    StepPeerNotFoundError,
    Term,
)
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.log_storage import entries_size

from .network import BootstrapStorage, new_config, new_storage

MT = MessageType


def new_node(voters: tuple[int, ...] = (1,), **config: object) -> tuple[RawNode, BootstrapStorage]:
    storage = new_storage(voters)
    return RawNode(new_config(1, storage, **config)), storage  # type: ignore[arg-type]


def persist(storage: BootstrapStorage, rd: Ready) -> None:
    if not rd.snapshot.is_empty():
        storage.apply_snapshot(rd.snapshot)
    storage.append(rd.entries)
    if rd.hard_state != EMPTY_HARD_STATE:
        storage.set_hard_state(rd.hard_state)


def cycle(node: RawNode, storage: BootstrapStorage) -> Ready:
    """Handle one Ready by the contract, applying conf changes."""
    rd = node.ready()
    persist(storage, rd)
    for entry in rd.committed_entries:
        if entry.type is EntryType.CONF_CHANGE:
            node.apply_conf_change(decode_conf_change(entry.data))
    node.advance(rd)
    return rd


def drain(node: RawNode, storage: BootstrapStorage) -> list[Ready]:
    readies = []
    while node.has_ready():
        readies.append(cycle(node, storage))
    return readies


def test_single_node_becomes_leader_and_commits_through_ready_cycles() -> None:
    node, storage = new_node()
    assert not node.has_ready()
    node.campaign()
    # 1: candidate; the vote must be persisted before it counts.
    rd = cycle(node, storage)
    assert rd.soft_state == SoftState(NodeId(0), StateType.CANDIDATE)
    assert rd.hard_state == HardState(Term(1), NodeId(1), Index(0))
    assert rd.must_sync and not rd.entries and not rd.messages
    # 2: leader, with its no-op to persist.
    rd = cycle(node, storage)
    assert rd.soft_state == SoftState(NodeId(1), StateType.LEADER)
    assert rd.entries == (Entry(Term(1), Index(1)),)
    assert rd.committed_entries == ()  # not persisted yet when the Ready was made
    # 3: the persisted no-op is acked by ourselves, committed and handed out.
    rd = cycle(node, storage)
    assert rd.hard_state == HardState(Term(1), NodeId(1), Index(1))
    assert rd.committed_entries == (Entry(Term(1), Index(1)),)
    assert not rd.must_sync  # only the commit index changed
    assert not node.has_ready()
    assert node.status().applied == 1

    node.propose(b"hello")
    rd = cycle(node, storage)
    assert rd.entries == (Entry(Term(1), Index(2), data=b"hello"),)
    assert rd.committed_entries == ()
    rd = cycle(node, storage)
    assert rd.committed_entries == (Entry(Term(1), Index(2), data=b"hello"),)
    assert not node.has_ready()


def test_messages_come_with_the_entries_they_depend_on() -> None:
    node, storage = new_node((1, 2, 3))
    node.campaign()
    rd = cycle(node, storage)
    assert sorted(m.to for m in rd.messages if m.type is MT.MsgVote) == [2, 3]
    node.step(Message(type=MT.MsgVoteResp, from_=NodeId(2), to=NodeId(1), term=Term(1)))
    rd = cycle(node, storage)
    assert rd.soft_state is not None and rd.soft_state.raft_state is StateType.LEADER
    apps = [m for m in rd.messages if m.type is MT.MsgApp]
    assert sorted(m.to for m in apps) == [2, 3]
    # The entries the MsgApps carry are in the same Ready, to persist before sending.
    assert rd.entries == apps[0].entries


def test_follower_acks_only_with_the_ready_that_persists_the_entries() -> None:
    node, storage = new_node((1, 2))
    node.step(
        Message(
            type=MT.MsgApp,
            from_=NodeId(2),
            to=NodeId(1),
            term=Term(1),
            entries=(Entry(Term(1), Index(1), data=b"x"),),
            commit=Index(1),
        )
    )
    rd = node.ready()
    assert rd.entries == (Entry(Term(1), Index(1), data=b"x"),)
    assert rd.messages == ()  # the ack waits for the entries to be persisted
    assert [(m.type, m.index) for m in rd.messages_after_persist] == [(MT.MsgAppResp, 1)]
    assert rd.committed_entries == ()  # committed, but not yet persisted locally
    persist(storage, rd)
    node.advance(rd)
    rd = node.ready()
    assert rd.committed_entries == (Entry(Term(1), Index(1), data=b"x"),)
    node.advance(rd)


def test_ready_and_advance_must_alternate() -> None:
    node, _storage = new_node()
    node.campaign()
    rd = node.ready()
    with pytest.raises(RuntimeError):
        node.ready()
    node.advance(rd)
    with pytest.raises(RuntimeError):
        node.advance(rd)


def test_step_refuses_local_messages_and_unknown_peers() -> None:
    node, _ = new_node((1, 2))
    with pytest.raises(StepLocalMsgError):
        node.step(Message(type=MT.MsgHup, from_=NodeId(1), to=NodeId(1)))
    with pytest.raises(StepPeerNotFoundError):
        node.step(Message(type=MT.MsgAppResp, from_=NodeId(9), to=NodeId(1), term=Term(1)))


def test_propose_without_leader_is_dropped() -> None:
    node, _ = new_node((1, 2))
    with pytest.raises(ProposalDroppedError, match="no leader"):
        node.propose(b"x")


def test_read_index_on_single_node_leader() -> None:
    node, storage = new_node()
    node.campaign()
    drain(node, storage)
    node.read_index(b"ctx")
    rd = cycle(node, storage)
    assert rd.read_states == (ReadState(Index(1), b"ctx"),)
    assert not node.has_ready()


def test_restart_hands_out_only_entries_after_applied() -> None:
    storage = new_storage((1,))
    storage.append([Entry(Term(1), Index(i), data=b"e%d" % i) for i in range(1, 5)])
    storage.set_hard_state(HardState(Term(1), NodeId(1), Index(3)))
    node = RawNode(new_config(1, storage, applied=Index(1)))
    rd = cycle(node, storage)
    assert [e.index for e in rd.committed_entries] == [2, 3]
    assert rd.hard_state == EMPTY_HARD_STATE  # nothing changed since the restart
    assert node.raft.term == 1 and node.raft.vote == 1


def test_committed_entries_are_bounded_per_ready() -> None:
    storage = new_storage((1,))
    entries = [Entry(Term(1), Index(i), data=b"x" * 100) for i in range(1, 11)]
    storage.append(entries)
    storage.set_hard_state(HardState(Term(1), NodeId(1), Index(10)))
    limit = 3 * entries_size(entries[:1])
    node = RawNode(new_config(1, storage, max_committed_size_per_ready=limit))
    batches = [[e.index for e in rd.committed_entries] for rd in drain(node, storage)]
    assert batches == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]


def test_conf_change_round_trip_and_pending_rule() -> None:
    node, storage = new_node()
    node.campaign()
    drain(node, storage)
    add_2 = ConfChange((ConfChangeSingle(ConfChangeType.ADD_NODE, NodeId(2)),))
    add_3 = ConfChange((ConfChangeSingle(ConfChangeType.ADD_NODE, NodeId(3)),))
    node.propose_conf_change(add_2)
    # A second change while the first is unapplied becomes an empty normal entry.
    node.propose_conf_change(add_3)
    rd = cycle(node, storage)
    assert [e.type for e in rd.entries] == [EntryType.CONF_CHANGE, EntryType.NORMAL]
    assert rd.entries[1].data == b""
    drain(node, storage)
    assert node.status().conf_state == ConfState(voters=(NodeId(1), NodeId(2)))


def test_status_reports_progress_copies_on_the_leader() -> None:
    node, storage = new_node()
    node.campaign()
    drain(node, storage)
    status = node.status()
    assert status.soft_state.raft_state is StateType.LEADER
    assert status.hard_state.commit == 1
    status.progress[NodeId(1)].match = Index(99)
    assert node.raft.trk.progress[NodeId(1)].match == 1


def test_report_unreachable_and_snapshot_status() -> None:
    node, storage = new_node((1, 2))
    node.campaign()
    cycle(node, storage)
    node.step(Message(type=MT.MsgVoteResp, from_=NodeId(2), to=NodeId(1), term=Term(1)))
    drain(node, storage)
    pr = node.raft.trk.progress[NodeId(2)]
    pr.become_replicate()
    node.report_unreachable(NodeId(2))
    assert pr.state is ProgressState.PROBE
    pr.become_snapshot(Index(5))
    node.report_snapshot(NodeId(2), SnapshotStatus.FAILURE)
    assert pr.state is ProgressState.PROBE
    assert pr.next == 1  # the failed snapshot is forgotten: probe from match + 1
    assert pr.is_paused()  # wait a heartbeat before retrying


def test_forget_leader() -> None:
    node, storage = new_node((1, 2))
    node.step(Message(type=MT.MsgHeartbeat, from_=NodeId(2), to=NodeId(1), term=Term(1)))
    assert node.raft.lead == 2
    assert cycle(node, storage).soft_state == SoftState(NodeId(2), StateType.FOLLOWER)
    node.forget_leader()
    assert node.raft.lead == 0
    rd = cycle(node, storage)
    assert rd.soft_state == SoftState(NodeId(0), StateType.FOLLOWER)
