"""One test per claim of the Raft paper (Ongaro and Ousterhout, 2014), sections 5.1 to 5.4.

Modelled on etcd-io/raft's raft_paper_test.go. Each test names the claim it checks; a single
node is driven directly (its Ready handled like the application would) unless the claim is
about a cluster, in which case the test network is used.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from rallypoint.raft import (
    NONE,
    Entry,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    RawNode,
    StateType,
    Term,
)

from .network import Network, Peer, new_config, new_peer, new_storage

MT = MessageType


def entry(term: int, index: int, data: bytes = b"") -> Entry:
    return Entry(Term(term), Index(index), data=data)


def msg(t: MessageType, from_: int, to: int, term: int = 0, **fields: object) -> Message:
    return Message(type=t, from_=NodeId(from_), to=NodeId(to), term=Term(term), **fields)  # type: ignore[arg-type]


def peer_with_log(
    node_id: int,
    voters: range | tuple[int, ...],
    entries: list[Entry] = [],  # noqa: B006 - never mutated
    hard_state: HardState | None = None,
    **config: object,
) -> Peer:
    """A peer whose storage already holds ``entries`` and ``hard_state`` (a restart)."""
    storage = new_storage(voters)
    storage.append(entries)
    if hard_state is not None:
        storage.set_hard_state(hard_state)
    return Peer(RawNode(new_config(node_id, storage, **config)), storage)  # type: ignore[arg-type]


def accept_and_reply(m: Message) -> Message:
    """The follower's acceptance of MsgApp ``m``."""
    assert m.type is MT.MsgApp
    return Message(
        type=MT.MsgAppResp,
        from_=m.to,
        to=m.from_,
        term=m.term,
        index=Index(m.index + len(m.entries)),
    )


def become_leader(peer: Peer) -> None:
    peer.raft.become_candidate()
    peer.raft.become_leader()


def commit_noop_entry(peer: Peer) -> None:
    """Replicate and commit the new leader's empty entry, acked by every follower."""
    assert peer.raft.state is StateType.LEADER
    peer.raft.bcast_append()
    for m in peer.handle_ready():
        assert m.type is MT.MsgApp and len(m.entries) == 1 and not m.entries[0].data
        peer.step(accept_and_reply(m))
    peer.handle_ready()  # the commit-index refreshes to followers are not needed


def sorted_msgs(msgs: list[Message]) -> list[Message]:
    return sorted(msgs, key=lambda m: (m.to, m.type))


# -- 5.1 Raft basics ------------------------------------------------------------------------


@pytest.mark.parametrize("state", [StateType.FOLLOWER, StateType.CANDIDATE, StateType.LEADER])
def test_5_1_server_adopts_larger_term_and_reverts_to_follower(state: StateType) -> None:
    """If a server's term is smaller than another's it updates it; a candidate or leader
    that discovers its term is out of date reverts to follower."""
    peer = new_peer(1, [1, 2, 3])
    if state is StateType.FOLLOWER:
        peer.raft.become_follower(Term(1), NodeId(2))
    elif state is StateType.CANDIDATE:
        peer.raft.become_candidate()
    else:
        become_leader(peer)
    peer.step(msg(MT.MsgApp, 2, 1, term=2))
    assert peer.raft.term == 2
    assert peer.raft.state is StateType.FOLLOWER


def test_5_1_server_rejects_requests_with_stale_term() -> None:
    """A server that receives a request with a stale term number rejects (ignores) it."""
    peer = new_peer(1, [1, 2, 3])
    peer.raft.load_state(HardState(term=Term(2)))
    called: list[Message] = []
    peer.raft.step_role = called.append
    peer.step(msg(MT.MsgApp, 2, 1, term=1))
    assert called == []
    assert peer.raft.term == 2


# -- 5.2 Leader election --------------------------------------------------------------------


def test_5_2_servers_start_as_followers() -> None:
    peer = new_peer(1, [1, 2, 3])
    assert peer.raft.state is StateType.FOLLOWER


def test_5_2_leader_sends_heartbeats_to_maintain_authority() -> None:
    """A leader sends periodic heartbeats (AppendEntries with no entries) to all followers."""
    peer = new_peer(1, [1, 2, 3], heartbeat_tick=1)
    become_leader(peer)
    for i in range(10):
        peer.raft.append_entry([entry(0, 0, f"e{i}".encode())])
    peer.handle_ready()
    peer.node.tick()
    heartbeats = sorted_msgs(peer.handle_ready())
    assert heartbeats == [
        msg(MT.MsgHeartbeat, 1, 2, term=1, commit=Index(0)),
        msg(MT.MsgHeartbeat, 1, 3, term=1, commit=Index(0)),
    ]


@pytest.mark.parametrize("state", [StateType.FOLLOWER, StateType.CANDIDATE])
def test_5_2_election_timeout_starts_election(state: StateType) -> None:
    """A follower that hears nothing for an election timeout starts an election; a candidate
    that neither wins nor loses starts a new one: it increments its term, votes for itself
    and sends RequestVote to every other server."""
    election_tick = 10
    peer = new_peer(1, [1, 2, 3], election_tick=election_tick)
    if state is StateType.FOLLOWER:
        peer.raft.become_follower(Term(1), NodeId(2))
    else:
        peer.raft.become_candidate()
    for _ in range(1, 2 * election_tick):
        peer.node.tick()
    msgs = sorted_msgs(peer.handle_ready())
    assert peer.raft.term == 2
    assert peer.raft.state is StateType.CANDIDATE
    assert peer.raft.vote == 1
    assert peer.raft.trk.votes[NodeId(1)] is True
    assert msgs == [
        msg(MT.MsgVote, 1, 2, term=2, index=Index(0), log_term=Term(0)),
        msg(MT.MsgVote, 1, 3, term=2, index=Index(0), log_term=Term(0)),
    ]


@pytest.mark.parametrize(
    ("size", "votes", "expected"),
    [
        # Wins with votes from a majority of the servers.
        (1, {}, StateType.LEADER),
        (3, {2: True, 3: True}, StateType.LEADER),
        (3, {2: True}, StateType.LEADER),
        (5, {2: True, 3: True, 4: True, 5: True}, StateType.LEADER),
        (5, {2: True, 3: True, 4: True}, StateType.LEADER),
        (5, {2: True, 3: True}, StateType.LEADER),
        # Returns to follower when a majority denies its vote.
        (3, {2: False, 3: False}, StateType.FOLLOWER),
        (5, {2: False, 3: False, 4: False, 5: False}, StateType.FOLLOWER),
        (5, {2: True, 3: False, 4: False, 5: False}, StateType.FOLLOWER),
        # Stays candidate without a majority either way.
        (3, {}, StateType.CANDIDATE),
        (5, {2: True}, StateType.CANDIDATE),
        (5, {2: False, 3: False}, StateType.CANDIDATE),
        (5, {}, StateType.CANDIDATE),
    ],
)
def test_5_2_candidate_wins_with_majority_of_votes_in_one_round(
    size: int, votes: dict[int, bool], expected: StateType
) -> None:
    """A candidate wins an election if it receives votes from a majority of the full cluster
    in the same term; a majority of denials makes it a follower again."""
    peer = new_peer(1, range(1, size + 1))
    peer.step(msg(MT.MsgHup, 1, 1))
    peer.handle_ready()
    for voter, granted in votes.items():
        peer.step(msg(MT.MsgVoteResp, voter, 1, term=peer.raft.term, reject=not granted))
    assert peer.raft.state is expected
    assert peer.raft.term == 1


@pytest.mark.parametrize(
    ("vote", "candidate", "rejected"),
    [(0, 2, False), (0, 3, False), (2, 2, False), (3, 3, False), (2, 3, True), (3, 2, True)],
)
def test_5_2_server_votes_at_most_once_per_term_first_come_first_served(
    vote: int, candidate: int, rejected: bool
) -> None:
    """Each server votes for at most one candidate in a given term, first-come-first-served."""
    peer = new_peer(1, [1, 2, 3])
    peer.raft.load_state(HardState(term=Term(1), vote=NodeId(vote)))
    peer.step(msg(MT.MsgVote, candidate, 1, term=1))
    assert peer.handle_ready() == [msg(MT.MsgVoteResp, 1, candidate, term=1, reject=rejected)]


@pytest.mark.parametrize("term", [1, 2])
def test_5_2_candidate_recognizes_leader_of_same_or_newer_term(term: int) -> None:
    """A candidate that receives AppendEntries from a leader whose term is at least its own
    recognizes the leader and returns to follower."""
    peer = new_peer(1, [1, 2, 3])
    peer.step(msg(MT.MsgHup, 1, 1))
    assert peer.raft.state is StateType.CANDIDATE
    peer.step(msg(MT.MsgApp, 2, 1, term=term))
    assert peer.raft.soft_state().raft_state is StateType.FOLLOWER
    assert peer.raft.term == term
    assert peer.raft.lead == 2


@pytest.mark.parametrize("state", [StateType.FOLLOWER, StateType.CANDIDATE])
def test_5_2_election_timeouts_are_randomized(state: StateType) -> None:
    """Election timeouts are chosen randomly from a fixed interval ([et, 2et) here)."""
    election_tick = 10
    peer = new_peer(1, [1, 2, 3], election_tick=election_tick)
    seen: set[int] = set()
    for _ in range(50 * election_tick):
        if state is StateType.FOLLOWER:
            peer.raft.become_follower(Term(peer.raft.term + 1), NodeId(2))
        else:
            peer.raft.become_candidate()
        peer.handle_ready()
        ticks = 0
        while not peer.handle_ready():
            peer.node.tick()
            ticks += 1
        seen.add(ticks)
    assert seen == set(range(election_tick, 2 * election_tick))


@pytest.mark.parametrize("state", [StateType.FOLLOWER, StateType.CANDIDATE])
def test_5_2_randomized_timeouts_make_split_votes_rare(state: StateType) -> None:
    """Randomized timeouts spread out the servers, so that in most cases only one times out."""
    election_tick, rounds = 10, 300
    voters = range(1, 6)
    peers = [new_peer(i, voters, election_tick=election_tick) for i in voters]
    conflicts = 0
    for _ in range(rounds):
        for peer in peers:
            if state is StateType.FOLLOWER:
                peer.raft.become_follower(Term(peer.raft.term + 1), NONE)
            else:
                peer.raft.become_candidate()
            peer.handle_ready()
        timed_out = 0
        while timed_out == 0:
            for peer in peers:
                peer.node.tick()
                if peer.handle_ready():
                    timed_out += 1
        if timed_out > 1:
            conflicts += 1
    assert conflicts / rounds <= 0.3


def test_5_2_split_vote_is_resolved_by_a_new_election() -> None:
    """When a vote splits, each candidate times out and starts a new election; randomized
    timeouts make one of them win the next term."""
    nt = Network([new_peer(1, [1, 2, 3]), new_peer(2, [1, 2, 3]), None])
    nt.ignore(MT.MsgVote)
    nt.campaign(1)
    nt.campaign(2)
    nt.recover()
    assert nt.raft(1).state is StateType.CANDIDATE
    assert nt.raft(2).state is StateType.CANDIDATE
    assert nt.raft(1).term == nt.raft(2).term == 1
    for _ in range(2 * 10):
        nt.tick(1)
        nt.tick(2)
        if StateType.LEADER in (nt.raft(1).state, nt.raft(2).state):
            break
    states = sorted([nt.raft(1).state.name, nt.raft(2).state.name])
    assert states == ["FOLLOWER", "LEADER"]
    assert nt.raft(1).term == nt.raft(2).term == 2


# -- 5.3 Log replication ----------------------------------------------------------------------


def test_5_3_leader_appends_command_and_replicates_it_in_parallel() -> None:
    """The leader appends the command to its log as a new entry, then issues AppendEntries
    RPCs in parallel to each of the other servers to replicate it."""
    peer = new_peer(1, [1, 2, 3])
    become_leader(peer)
    commit_noop_entry(peer)
    last = peer.raft.raft_log.last_index()
    peer.step(msg(MT.MsgProp, 1, 1, entries=(entry(0, 0, b"some data"),)))
    assert peer.raft.raft_log.last_index() == last + 1
    assert peer.raft.raft_log.committed == last
    appended = (entry(1, last + 1, b"some data"),)
    assert sorted_msgs(peer.handle_ready()) == [
        msg(
            MT.MsgApp,
            1,
            to,
            term=1,
            index=last,
            log_term=Term(1),
            entries=appended,
            commit=last,
        )
        for to in (2, 3)
    ]
    assert peer.storage.last_index() == last + 1  # persisted before the messages are sent


def test_5_3_leader_commits_entry_once_replicated_and_tells_followers() -> None:
    """An entry is committed once the leader has replicated it on a majority; the leader
    applies it and includes the new commit index in later AppendEntries."""
    peer = new_peer(1, [1, 2, 3])
    become_leader(peer)
    commit_noop_entry(peer)
    last = peer.raft.raft_log.last_index()
    peer.step(msg(MT.MsgProp, 1, 1, entries=(entry(0, 0, b"some data"),)))
    for m in peer.handle_ready():
        peer.step(accept_and_reply(m))
    assert peer.raft.raft_log.committed == last + 1
    msgs = sorted_msgs(peer.handle_ready())
    assert peer.applied[-1] == entry(1, last + 1, b"some data")
    assert [(m.to, m.type, m.commit) for m in msgs] == [
        (2, MT.MsgApp, last + 1),
        (3, MT.MsgApp, last + 1),
    ]


@pytest.mark.parametrize(
    ("size", "acceptors", "committed"),
    [
        (1, (), True),
        (3, (), False),
        (3, (2,), True),
        (3, (2, 3), True),
        (5, (), False),
        (5, (2,), False),
        (5, (2, 3), True),
        (5, (2, 3, 4), True),
        (5, (2, 3, 4, 5), True),
    ],
)
def test_5_3_entry_commits_after_majority_acknowledges(
    size: int, acceptors: tuple[int, ...], committed: bool
) -> None:
    """A log entry is committed once the leader that created it has replicated it on a
    majority of the servers."""
    peer = new_peer(1, range(1, size + 1))
    become_leader(peer)
    commit_noop_entry(peer)
    last = peer.raft.raft_log.last_index()
    peer.step(msg(MT.MsgProp, 1, 1, entries=(entry(0, 0, b"some data"),)))
    for m in peer.handle_ready():
        if m.to in acceptors:
            peer.step(accept_and_reply(m))
    assert (peer.raft.raft_log.committed > last) is committed


@pytest.mark.parametrize(
    "previous",
    [
        [],
        [entry(2, 1)],
        [entry(1, 1), entry(2, 2)],
        [entry(1, 1)],
    ],
)
def test_5_3_committing_an_entry_commits_all_preceding_entries(previous: list[Entry]) -> None:
    """Committing an entry also commits all preceding entries, including those created by
    previous leaders."""
    peer = peer_with_log(1, (1, 2, 3), previous, HardState(term=Term(2)))
    become_leader(peer)
    peer.step(msg(MT.MsgProp, 1, 1, entries=(entry(0, 0, b"some data"),)))
    for m in peer.handle_ready():
        peer.step(accept_and_reply(m))
    peer.handle_ready()
    count = len(previous)
    assert peer.applied == [*previous, entry(3, count + 1), entry(3, count + 2, b"some data")]


@pytest.mark.parametrize(
    ("entries", "commit"),
    [
        ([entry(1, 1, b"some data")], 1),
        ([entry(1, 1, b"some data"), entry(1, 2, b"some data2")], 2),
        ([entry(1, 1, b"some data2"), entry(1, 2, b"some data")], 2),
        ([entry(1, 1, b"some data"), entry(1, 2, b"some data2")], 1),
    ],
)
def test_5_3_follower_applies_entries_the_leader_reports_committed(
    entries: list[Entry], commit: int
) -> None:
    """Once a follower learns that a log entry is committed, it applies the entry to its
    local state machine (in log order)."""
    peer = new_peer(1, [1, 2, 3])
    peer.raft.become_follower(Term(1), NodeId(2))
    peer.step(msg(MT.MsgApp, 2, 1, term=1, entries=tuple(entries), commit=Index(commit)))
    assert peer.raft.raft_log.committed == commit
    peer.handle_ready()
    assert peer.applied == entries[:commit]


@pytest.mark.parametrize(
    ("log_term", "index", "want_index", "rejected", "hint", "hint_term"),
    [
        (0, 0, 1, False, 0, 0),  # matches the committed prefix
        (1, 1, 1, False, 0, 0),
        (2, 2, 2, False, 0, 0),  # matches an uncommitted entry
        (1, 2, 2, True, 1, 1),  # our entry 2 has another term
        (3, 3, 3, True, 2, 2),  # we have no entry 3
    ],
)
def test_5_3_follower_refuses_entries_without_matching_predecessor(
    log_term: int, index: int, want_index: int, rejected: bool, hint: int, hint_term: int
) -> None:
    """AppendEntries consistency check: if the follower does not find an entry with the same
    index and term as the one preceding the new entries, it refuses them."""
    peer = peer_with_log(
        1, (1, 2, 3), [entry(1, 1), entry(2, 2)], HardState(term=Term(0), commit=Index(1))
    )
    peer.raft.become_follower(Term(2), NodeId(2))
    peer.step(msg(MT.MsgApp, 2, 1, term=2, log_term=Term(log_term), index=Index(index)))
    assert peer.handle_ready() == [
        msg(
            MT.MsgAppResp,
            1,
            2,
            term=2,
            index=Index(want_index),
            reject=rejected,
            reject_hint=Index(hint),
            log_term=Term(hint_term),
        )
    ]


@pytest.mark.parametrize(
    ("index", "log_term", "appended", "expected"),
    [
        (2, 2, [entry(3, 3)], [entry(1, 1), entry(2, 2), entry(3, 3)]),
        (1, 1, [entry(3, 2), entry(4, 3)], [entry(1, 1), entry(3, 2), entry(4, 3)]),
        (0, 0, [entry(1, 1)], [entry(1, 1), entry(2, 2)]),
        (0, 0, [entry(3, 1)], [entry(3, 1)]),
    ],
)
def test_5_3_follower_deletes_conflicting_entries_and_appends_new_ones(
    index: int, log_term: int, appended: list[Entry], expected: list[Entry]
) -> None:
    """If an existing entry conflicts with a new one (same index, different term), the
    follower deletes it and all that follow, then appends the new entries."""
    peer = peer_with_log(1, (1, 2, 3), [entry(1, 1), entry(2, 2)])
    peer.raft.become_follower(Term(2), NodeId(2))
    peer.step(
        msg(
            MT.MsgApp,
            2,
            1,
            term=2,
            log_term=Term(log_term),
            index=Index(index),
            entries=tuple(appended),
        )
    )
    assert peer.raft.raft_log.all_entries() == expected
    peer.handle_ready()
    assert peer.storage.entries(Index(1), Index(peer.storage.last_index() + 1)) == expected


_FIGURE_7_LEADER = [
    entry(1, 1),
    entry(1, 2),
    entry(1, 3),
    entry(4, 4),
    entry(4, 5),
    entry(5, 6),
    entry(5, 7),
    entry(6, 8),
    entry(6, 9),
    entry(6, 10),
]


def _log(terms: list[int]) -> list[Entry]:
    return [entry(term, i) for i, term in enumerate(terms, start=1)]


@pytest.mark.parametrize(
    "follower_log",
    [
        _log([1, 1, 1, 4, 4, 5, 5, 6, 6]),  # (a) missing entries
        _log([1, 1, 1, 4]),  # (b)
        _log([1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6]),  # (c) extra uncommitted entries
        _log([1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7]),  # (d)
        _log([1, 1, 1, 4, 4, 4, 4]),  # (e) both
        _log([1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3]),  # (f)
    ],
    ids=list("abcdef"),
)
def test_5_3_leader_brings_any_follower_log_into_consistency(follower_log: list[Entry]) -> None:
    """Figure 7: whatever the follower's log (missing or extraneous entries), the leader
    forces it to duplicate its own through AppendEntries."""
    term = 8
    leader = peer_with_log(
        1, (1, 2, 3), _FIGURE_7_LEADER, HardState(term=Term(term), commit=Index(10))
    )
    follower = peer_with_log(2, (1, 2, 3), follower_log, HardState(term=Term(term - 1)))
    # Node 3 is silent but votes (the follower's log may be more up to date than ours).
    nt = Network([leader, follower, None])
    nt.campaign(1)
    nt.send(msg(MT.MsgVoteResp, 3, 1, term=term + 1))
    nt.propose(1, b"")
    assert leader.raft.state is StateType.LEADER
    assert follower.raft.raft_log.all_entries() == leader.raft.raft_log.all_entries()


def test_5_3_log_matching_property_holds_under_faults() -> None:
    """Log Matching: if two logs contain an entry with the same index and term, the logs are
    identical in all entries up through that index (checked after a faulty run)."""
    for seed in range(3):
        nt = _run_faulty_cluster(seed)
        logs = [nt.raft(i).raft_log.all_entries() for i in range(1, 6)]
        for a in logs:
            for b in logs:
                common = min(len(a), len(b))
                for position in range(common):
                    if a[position].term == b[position].term:
                        assert a[: position + 1] == b[: position + 1]


# -- 5.4 Safety -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "term"),
    [([entry(1, 1)], 2), ([entry(1, 1), entry(2, 2)], 3)],
)
def test_5_4_1_vote_request_carries_last_log_index_and_term(
    entries: list[Entry], term: int
) -> None:
    """RequestVote includes the candidate's last log index and term, so voters can check
    that the candidate is at least as up to date."""
    peer = new_peer(1, [1, 2, 3])
    peer.step(msg(MT.MsgApp, 2, 1, term=term - 1, entries=tuple(entries)))
    peer.handle_ready()
    for _ in range(1, 2 * 10):
        peer.raft.tick_election()
    last = entries[-1]
    assert sorted_msgs(peer.handle_ready()) == [
        msg(MT.MsgVote, 1, to, term=term, index=last.index, log_term=last.term) for to in (2, 3)
    ]


@pytest.mark.parametrize(
    ("entries", "log_term", "index", "rejected"),
    [
        # Same last term: the longer log is more up to date.
        ([entry(1, 1)], 1, 1, False),
        ([entry(1, 1)], 1, 2, False),
        ([entry(1, 1), entry(1, 2)], 1, 1, True),
        # The candidate's last term is higher.
        ([entry(1, 1)], 2, 1, False),
        ([entry(1, 1)], 2, 2, False),
        ([entry(1, 1), entry(1, 2)], 2, 1, False),
        # The voter's last term is higher.
        ([entry(2, 1)], 1, 1, True),
        ([entry(2, 1)], 1, 2, True),
        ([entry(2, 1), entry(1, 2)], 1, 1, True),
    ],
)
def test_5_4_1_voter_denies_candidate_with_less_up_to_date_log(
    entries: list[Entry], log_term: int, index: int, rejected: bool
) -> None:
    """Election restriction: a voter denies its vote if its own log is more up to date than
    the candidate's (compare last terms, then lengths)."""
    peer = peer_with_log(1, (1, 2), entries)
    peer.step(msg(MT.MsgVote, 2, 1, term=3, log_term=Term(log_term), index=Index(index)))
    [reply] = peer.handle_ready()
    assert reply.type is MT.MsgVoteResp
    assert reply.reject is rejected


@pytest.mark.parametrize(("acked_index", "commit"), [(1, 0), (2, 0), (3, 3)])
def test_5_4_2_leader_only_commits_current_term_entries_by_counting(
    acked_index: int, commit: int
) -> None:
    """A leader never commits entries from previous terms by counting replicas; only entries
    of its current term are committed that way."""
    peer = peer_with_log(1, (1, 2), [entry(1, 1), entry(2, 2)], HardState(term=Term(2)))
    become_leader(peer)  # term 3
    peer.handle_ready()
    peer.step(msg(MT.MsgProp, 1, 1, entries=(entry(0, 0),)))
    peer.step(msg(MT.MsgAppResp, 2, 1, term=peer.raft.term, index=Index(acked_index)))
    peer.handle_ready()
    assert peer.raft.raft_log.committed == commit


def test_5_4_2_figure_8_old_term_entry_on_majority_is_not_committed() -> None:
    """Figure 8: an entry of an older term stored on a majority may still be overwritten by
    a future leader, so the leader must not count it as committed."""
    voters = range(1, 6)
    # One entry per MsgApp, so that an old entry can reach a follower alone.
    peers = [new_peer(i, voters, max_size_per_msg=0) for i in voters]
    nt = Network(peers)
    nt.campaign(1)
    assert nt.raft(1).state is StateType.LEADER
    # (a) S1 leads and replicates entry 2 (its term) to S2 only.
    for other in (3, 4, 5):
        nt.cut(1, other)
    nt.propose(1, b"old")
    old_term = nt.raft(1).term
    assert [e.term for e in nt.raft(2).raft_log.all_entries()] == [old_term, old_term]
    assert nt.raft(1).raft_log.committed == 1
    # (b) S1 crashes; S5 wins with S3 and S4 and appends its own entry 2, then crashes too.
    nt.recover()
    nt.isolate(1)
    nt.cut(5, 2)
    nt.ignore(MT.MsgApp)
    nt.campaign(5)
    assert nt.raft(5).state is StateType.LEADER
    nt.recover()
    nt.isolate(5)
    # (c) S1 is back and leads a later term; entry 2 (old term) reaches S2-S4 while its
    # current-term entries are held back: the old entry is on a majority yet must stay
    # uncommitted.
    held_back: list[Entry] = []

    def hold_back_current_term(m: Message) -> Message | None:
        if m.type is not MT.MsgApp or m.from_ != 1:
            return m
        current = nt.raft(1).term
        held_back.extend(e for e in m.entries if e.term == current)
        return dataclasses.replace(m, entries=tuple(e for e in m.entries if e.term != current))

    nt.msg_hook = hold_back_current_term
    _elect(nt, 1)
    for other in (2, 3, 4):
        assert nt.raft(other).raft_log.zero_term_on_out_of_bounds(Index(2)) == old_term
    assert held_back
    assert nt.raft(1).raft_log.committed == 1
    # (d) S1 crashes again; S5 can win and overwrite entry 2 everywhere, as Figure 8 warns.
    nt.msg_hook = None
    nt.recover()
    nt.isolate(1)
    _elect(nt, 5)
    for other in (2, 3, 4, 5):
        assert nt.raft(other).raft_log.committed >= 2
        assert nt.raft(other).raft_log.term(Index(2)) != old_term
        assert b"old" not in nt.peer(other).applied_data()


def _elect(nt: Network, node_id: int) -> None:
    """Make ``node_id`` (a deposed leader, unaware of it) campaign until it leads."""
    for _ in range(5):
        raft = nt.raft(node_id)
        if raft.state is StateType.LEADER:
            raft.become_follower(raft.term, NONE)
        nt.campaign(node_id)
        if raft.state is StateType.LEADER:
            return
    raise AssertionError(f"{node_id} could not be elected")


def test_5_4_leader_append_only() -> None:
    """Leader Append-Only: a leader never overwrites or deletes entries in its log; it only
    appends (even when a deposed leader sends it conflicting entries)."""
    nt = Network.of_size(3)
    nt.campaign(2)
    nt.campaign(1)
    leader = nt.raft(1)
    assert leader.state is StateType.LEADER and leader.term == 2
    nt.propose(1, b"a")
    before = leader.raft_log.all_entries()
    # The deposed leader of term 1 tries to overwrite entry 2.
    nt.send(
        msg(
            MT.MsgApp,
            2,
            1,
            term=1,
            log_term=Term(1),
            index=Index(1),
            entries=(entry(1, 2, b"stale"),),
        )
    )
    assert leader.raft_log.all_entries() == before
    for data in (b"b", b"c"):
        nt.propose(1, data)
        now = leader.raft_log.all_entries()
        assert now[: len(before)] == before
        assert len(now) == len(before) + 1
        before = now
    assert leader.state is StateType.LEADER


def test_5_4_leader_completeness() -> None:
    """Leader Completeness: an entry committed in a term is present in the logs of the
    leaders of all higher terms; a server missing it cannot be elected."""
    nt = Network.of_size(5)
    nt.campaign(1)
    nt.cut(1, 4)
    nt.cut(1, 5)
    nt.propose(1, b"committed")
    assert nt.raft(1).raft_log.committed == 2
    committed = nt.raft(1).raft_log.all_entries()
    nt.recover()
    # Nodes 4 and 5 lack the committed entry: neither can win, whatever the others do.
    nt.isolate(1)
    nt.campaign(4)
    assert nt.raft(4).state is not StateType.LEADER
    nt.campaign(5)
    assert nt.raft(5).state is not StateType.LEADER
    # A node holding it wins, and its log contains every committed entry.
    nt.campaign(2)
    assert nt.raft(2).state is StateType.LEADER
    assert nt.raft(2).raft_log.all_entries()[: len(committed)] == committed


def test_5_4_3_state_machine_safety() -> None:
    """State Machine Safety: if a server has applied a log entry at a given index, no other
    server ever applies a different entry for that index (checked after faulty runs)."""
    for seed in range(3):
        nt = _run_faulty_cluster(seed)
        applied = [nt.peer(i).applied for i in range(1, 6)]
        longest = max(applied, key=len)
        for log in applied:
            assert log == longest[: len(log)]
        assert len(longest) > 10  # the run made progress


def _run_faulty_cluster(seed: int) -> Network:
    """Five nodes under random partitions and message loss, with proposals and ticks."""
    rng = random.Random(seed)
    voters = range(1, 6)
    nt = Network([new_peer(i, voters, seed=seed * 100 + i) for i in voters], seed=seed)
    for step in range(400):
        if step % 40 == 0:
            nt.recover()
            if rng.random() < 0.7:
                minority = rng.sample(list(voters), rng.choice([1, 2]))
                for node in minority:
                    nt.isolate(node)
            for a in voters:
                for b in voters:
                    if a != b and rng.random() < 0.1:
                        nt.drop(a, b, 0.3)
        node = rng.choice(list(voters))
        nt.tick(node)
        if rng.random() < 0.3:
            nt.propose(rng.choice(list(voters)), f"{seed}-{step}".encode())
    nt.recover()
    for _ in range(60):
        for node in voters:
            nt.tick(node)
    return nt
