"""The RawNode Ready/advance contract: what each Ready holds, in which order, and when."""

from __future__ import annotations

import pytest

from rallypoint.raft import (
    EMPTY_HARD_STATE,
    NONE,
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

from .internals import raft_core_for_tests
from .network import BootstrapStorage, Network, new_config, new_storage

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


def append_from_leader_2(commit: int) -> Message:
    """Leader 2's MsgApp of term 1 carrying entry 1 (b"x")."""
    return Message(
        type=MT.MsgApp,
        from_=NodeId(2),
        to=NodeId(1),
        term=Term(1),
        entries=(Entry(Term(1), Index(1), data=b"x"),),
        commit=Index(commit),
    )


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
    node.step(append_from_leader_2(commit=1))
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
    assert raft_core_for_tests(node).term == 1 and raft_core_for_tests(node).vote == 1


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
    assert raft_core_for_tests(node).trk.progress[NodeId(1)].match == 1


def test_report_unreachable_and_snapshot_status() -> None:
    node, storage = new_node((1, 2))
    node.campaign()
    cycle(node, storage)
    node.step(Message(type=MT.MsgVoteResp, from_=NodeId(2), to=NodeId(1), term=Term(1)))
    drain(node, storage)
    pr = raft_core_for_tests(node).trk.progress[NodeId(2)]
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
    assert raft_core_for_tests(node).lead == 2
    assert cycle(node, storage).soft_state == SoftState(NodeId(2), StateType.FOLLOWER)
    node.forget_leader()
    assert raft_core_for_tests(node).lead == 0
    rd = cycle(node, storage)
    assert rd.soft_state == SoftState(NodeId(0), StateType.FOLLOWER)


# -- the Ready contract, rule by rule (see raft/rawnode.py) ----------------------------------

# What may leave only once persisted (thesis 3.8): the core files these apart.
_AFTER_PERSIST = {MT.MsgAppResp, MT.MsgVoteResp, MT.MsgPreVoteResp}


def _busy_network(seed: int) -> Network:
    """Three peers through elections (one with pre-vote), proposals, drops and a partition:
    every kind of Ready the core makes."""
    nt = Network.of_size(3, pre_vote=True, seed=seed)
    nt.rng.seed(seed)
    nt.send(Message(type=MT.MsgHup, from_=NodeId(1), to=NodeId(1)))
    for round_number in range(30):
        proposer = NodeId(1 + round_number % 3)
        nt.send(
            Message(
                type=MT.MsgProp,
                from_=proposer,
                to=proposer,
                entries=(Entry(Term(0), Index(0), data=f"p{round_number}".encode()),),
            )
        )
        if round_number == 10:
            nt.dropm[(NodeId(1), NodeId(3))] = 0.5
            nt.dropm[(NodeId(3), NodeId(1))] = 0.5
        if round_number % 7 == 3:
            candidate = NodeId(1 + round_number % 3)
            nt.send(Message(type=MT.MsgHup, from_=candidate, to=candidate))
        for node_id in (1, 2, 3):
            nt.peer(node_id).node.tick()
        nt.send()
    return nt


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_core_splits_messages_from_those_sent_after_persisting(seed: int) -> None:
    nt = _busy_network(seed)
    seen: set[MessageType] = set()
    for peer in nt.peers.values():
        assert peer is not None
        for rd in peer.readies:
            for m in rd.messages:
                assert m.type not in _AFTER_PERSIST, f"{m.type.name} would leave unpersisted"
                seen.add(m.type)
            for m in rd.messages_after_persist:
                assert m.type in _AFTER_PERSIST, f"{m.type.name} held back needlessly"
                assert m.to != peer.id, "self-addressed answers are stepped in by advance()"
                seen.add(m.type)
    # The scenario exercised both lists.
    assert {MT.MsgApp, MT.MsgHeartbeat, MT.MsgAppResp, MT.MsgVoteResp} <= seen


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_must_sync_exactly_when_entries_term_or_vote_change(seed: int) -> None:
    nt = _busy_network(seed)
    syncs = skipped = 0
    for peer in nt.peers.values():
        assert peer is not None
        durable = HardState()
        for rd in peer.readies:
            hard_state_moved = not rd.hard_state.is_empty() and (
                (rd.hard_state.term, rd.hard_state.vote) != (durable.term, durable.vote)
            )
            assert rd.must_sync == (bool(rd.entries) or hard_state_moved), rd
            if not rd.hard_state.is_empty():
                durable = rd.hard_state
            if rd.must_sync:
                syncs += 1
            elif not rd.hard_state.is_empty():
                skipped += 1  # a commit index alone
    assert syncs and skipped


def test_a_ready_with_only_a_new_commit_index_needs_no_sync() -> None:
    node, storage = new_node((1, 2))
    node.step(append_from_leader_2(commit=0))
    assert cycle(node, storage).must_sync
    node.step(
        Message(type=MT.MsgHeartbeat, from_=NodeId(2), to=NodeId(1), term=Term(1), commit=Index(1))
    )
    rd = cycle(node, storage)
    assert rd.hard_state == HardState(Term(1), NONE, Index(1))
    assert rd.entries == () and not rd.must_sync
    assert [m.type for m in rd.messages] == [MT.MsgHeartbeatResp]


def test_basic_status_reports_what_the_driver_reads() -> None:
    node, storage = new_node((1, 2))
    node.campaign()
    node.step(Message(type=MT.MsgVoteResp, from_=NodeId(2), to=NodeId(1), term=Term(1)))
    drain(node, storage)
    node.step(Message(type=MT.MsgAppResp, from_=NodeId(2), to=NodeId(1), term=Term(1), index=1))
    drain(node, storage)
    status = node.basic_status()
    assert status.id == 1
    assert status.hard_state == HardState(Term(1), NodeId(1), Index(1))
    assert status.soft_state == SoftState(NodeId(1), StateType.LEADER)
    assert status.applied == 1 and not status.conf_change_pending()
    node.propose_conf_change(
        ConfChange((ConfChangeSingle(ConfChangeType.ADD_LEARNER_NODE, NodeId(3)),))
    )
    cycle(node, storage)
    assert node.basic_status().conf_change_pending()


def test_the_core_is_private_to_the_handle() -> None:
    node, _ = new_node()
    assert not hasattr(node, "raft")
