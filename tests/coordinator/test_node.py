"""Members in one process on loopback: election, replication, reads, failover, snapshots."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rallypoint.coordinator.member_table import MemberAddress, decode_app_snapshot
from rallypoint.coordinator.node import peer_face as node_peer_face
from rallypoint.coordinator.node import snapshots as node_snapshots
from rallypoint.coordinator.node.api import LearnerNotReadyError, NotLeaderError
from rallypoint.coordinator.node.config import NodeConfig
from rallypoint.coordinator.node.driver import Node
from rallypoint.coordinator.node.proposals import unwrap, wrap
from rallypoint.coordinator.state import machine
from rallypoint.coordinator.state.commands import (
    Add,
    Envelope,
    LeaseExpire,
    LeaseGrant,
    Put,
    SessionOpen,
    encode_envelope,
)
from rallypoint.coordinator.state.results import (
    AddResult,
    LeaseGrantResult,
    PutResult,
    SessionOpenResult,
)
from rallypoint.coordinator.version import RECORD_VERSION
from rallypoint.raft.codec import decode_message, encode_message
from rallypoint.raft.log_storage import UnavailableError
from rallypoint.raft.storage.disk_storage import PersistRequest
from rallypoint.raft.tracker import ProgressState
from rallypoint.raft.types import Entry, EntryType, Index, Message, MessageType, NodeId, Term


def free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Cluster:
    def __init__(self, tmp: Path, size: int, **overrides: int) -> None:
        ports = free_ports(2 * size)
        self.members = {
            i + 1: MemberAddress(f"127.0.0.1:{ports[2 * i]}", f"127.0.0.1:{ports[2 * i + 1]}")
            for i in range(size)
        }
        self.tmp = tmp
        self.overrides = overrides
        self.nodes: dict[int, Node] = {}
        self.fatal: list[BaseException] = []

    def config(self, member_id: int) -> NodeConfig:
        address = self.members[member_id]
        return NodeConfig(
            member_id=member_id,
            data_dir=str(self.tmp / f"m{member_id}"),
            peer_address=address.peer_address,
            client_address=address.client_address,
            initial_members=self.members,
            peer_secret=b"test-secret-0123456789",
            tick_ms=self.overrides.get("tick_ms", 20),
            election_ticks=10,
            snapshot_entries=self.overrides.get("snapshot_entries", 10_000),
            snapshot_catchup_entries=self.overrides.get("snapshot_catchup_entries", 5_000),
            snapshot_log_bytes=self.overrides.get("snapshot_log_bytes", 64 * 1024 * 1024),
        )

    async def start(self, member_id: int) -> Node:
        node = Node(self.config(member_id), on_fatal=self.fatal.append)
        await node.start()
        self.nodes[member_id] = node
        return node

    async def start_all(self, timeout_s: float = 30.0) -> None:
        """Start every member at once: a member creating the cluster waits for every other
        initial member to answer (peer_hello.py, bootstrap_rule.py). One whose start was
        slow (a loaded machine) may find the cluster already created and is then taken for
        a member that lost its data: it votes only once caught up. Return when every member
        votes, so a test that stops one still leaves a voting majority."""
        await asyncio.gather(*(self.start(member_id) for member_id in self.members))
        nodes = list(self.nodes.values())
        await wait_until(
            lambda: not any(n.status().abstaining for n in nodes),
            "every member voting",
            timeout_s,
        )

    async def stop(self, member_id: int, transfer: bool = False) -> None:
        node = self.nodes.pop(member_id)
        await node.stop(transfer_leadership=transfer)

    async def settle(self, timeout_s: float = 10.0) -> None:
        """Wait for the cluster version to reach this build's and each member's snapshot of
        that raise (coordinator/version.py): a new cluster raises it within a probe or two,
        and the snapshot compacts the log. Call on an idle cluster, before what a test
        counts of snapshots or of the log."""
        nodes = list(self.nodes.values())
        await wait_until(
            lambda: all(n.state.cluster_version == RECORD_VERSION for n in nodes),
            "the cluster version raised",
            timeout_s,
        )
        await wait_until(
            lambda: all(stored_cluster_version(n) == RECORD_VERSION for n in nodes),
            "the snapshot of the raise",
            timeout_s,
        )

    async def leader(self, timeout_s: float = 10.0) -> Node:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            leaders = [n for n in self.nodes.values() if n.is_leader()]
            if len(leaders) == 1 and all(
                n.leader_id == leaders[0].member_id for n in self.nodes.values()
            ):
                return leaders[0]
            await asyncio.sleep(0.02)
        raise AssertionError("no stable leader")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, 3)
    await c.start_all()
    yield c
    for member_id in list(c.nodes):
        await c.stop(member_id)
    assert not c.fatal


def stored_cluster_version(node: Node) -> int:
    """The cluster version in ``node``'s stored snapshot. (Not "a snapshot at the applied
    index": an entry applied after the raise's snapshot, a new leader's no-op say, would keep
    that from ever holding.)"""
    assert node.storage is not None
    _, state = decode_app_snapshot(node.storage.snapshot().data)
    restored = machine.StateMachine()
    restored.restore(state)
    return restored.cluster_version


async def open_session(node: Node) -> int:
    result = await node.propose(SessionOpen(ttl_ms=60_000))
    assert isinstance(result, SessionOpenResult)
    return result.session_id


async def settled(cluster: Cluster) -> tuple[Node, int, list[Node]]:
    """The leader, a session opened through it, and every node once all applied it."""
    leader = await cluster.leader()
    session = await open_session(leader)
    nodes = list(cluster.nodes.values())
    await wait_applied(nodes, leader.state.applied_index)
    return leader, session, nodes


async def wait_applied(nodes: list[Node], index: int, timeout_s: float = 10.0) -> None:
    async def one(node: Node) -> None:
        while node.state.applied_index < index:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(asyncio.gather(*(one(n) for n in nodes)), timeout_s)


async def put_in_turn(
    leader: Node, session: int, nodes: list[Node], prefix: bytes, puts: int
) -> None:
    """``puts`` puts through ``leader``, each proposed once the previous applied, then wait
    until every node applied them all (keys ``prefix`` + 001, 002, ...)."""
    for seq in range(1, puts + 1):
        await leader.propose(Put(prefix + b"%03d" % seq, b"v"), session_id=session, sequence=seq)
    await wait_applied(nodes, leader.state.applied_index)


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


async def test_elects_replicates_and_reads(cluster: Cluster) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    result = await leader.propose(Put(b"k", b"v"), session_id=session, sequence=1)
    assert isinstance(result, PutResult)
    await wait_applied(list(cluster.nodes.values()), result.kv.mod_revision)
    follower = next(n for n in cluster.nodes.values() if not n.is_leader())
    await follower.read_barrier()
    kv = follower.state.get(b"k")
    assert kv is not None and kv.value == b"v"
    # A proposal through a follower is forwarded by Raft and answered on the follower.
    result = await follower.propose(Add(b"n", 5), session_id=session, sequence=2)
    assert isinstance(result, AddResult) and result.value == 5
    # Retrying a sequence is answered from the session cache, not applied again.
    again = await follower.propose(Add(b"n", 5), session_id=session, sequence=2)
    assert again == result
    status = leader.status()
    assert status.role == "leader" and len(status.members) == 3
    assert {p.member_id for p in status.progress} == {1, 2, 3}


async def test_leader_failover_keeps_committed_state(cluster: Cluster) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    for seq in range(1, 21):
        await leader.propose(Put(b"key%d" % seq, b"x"), session_id=session, sequence=seq)
    old = leader.member_id
    await cluster.stop(old)
    new_leader = await cluster.leader()
    assert new_leader.member_id != old
    await new_leader.read_barrier()
    assert len(new_leader.state.range(b"key", 0)[0]) == 20
    lease = await new_leader.propose(LeaseGrant(ttl_ms=10_000), session_id=session, sequence=21)
    assert isinstance(lease, LeaseGrantResult)
    assert new_leader.lease_keep_alive(lease.lease_id) == 10_000
    follower = next(n for n in cluster.nodes.values() if not n.is_leader())
    with pytest.raises(NotLeaderError) as info:
        follower.lease_keep_alive(lease.lease_id)
    assert info.value.leader_address == cluster.members[new_leader.member_id].client_address
    # The stopped member comes back from its own disk and catches up.
    restarted = await cluster.start(old)
    await wait_applied([restarted], new_leader.state.applied_index)
    assert restarted.state.snapshot() == new_leader.state.snapshot()


async def test_graceful_stop_transfers_leadership(cluster: Cluster) -> None:
    leader = await cluster.leader()
    old = leader.member_id
    await cluster.stop(old, transfer=True)
    new_leader = await cluster.leader(timeout_s=2.0)
    assert new_leader.member_id != old


async def test_lagging_member_catches_up_by_snapshot(tmp_path: Path) -> None:
    c = Cluster(tmp_path, 3, snapshot_entries=50, snapshot_catchup_entries=10)
    await c.start_all()
    try:
        leader = await c.leader()
        lagging = next(i for i in c.nodes if i != leader.member_id)
        await c.stop(lagging)
        session = await open_session(leader)
        for seq in range(1, 201):
            await leader.propose(Put(b"k%03d" % seq, b"v"), session_id=session, sequence=seq)
        # Snapshots are made in the background: wait for the one past 100.
        await wait_until(lambda: leader.status().snapshot_index > 100, "no snapshot past 100")
        node = await c.start(lagging)
        await wait_applied([node], leader.state.applied_index)
        await node.read_barrier()
        assert node.state.snapshot() == leader.state.snapshot()
        assert node.status().snapshot_index > 0
    finally:
        for member_id in list(c.nodes):
            await c.stop(member_id)
    assert not c.fatal


async def test_a_snapshot_is_made_once_the_applied_entries_hold_enough_bytes(
    tmp_path: Path,
) -> None:
    """Large entries bring a snapshot long before the entry count: 40 puts of 1 KiB pass a
    16 KiB log budget with 100,000 entries between snapshots; small entries do not."""
    c = Cluster(tmp_path, 3, snapshot_entries=100_000, snapshot_log_bytes=16 * 1024)
    await c.start_all()
    try:
        leader = await c.leader()
        await c.settle()
        session = await open_session(leader)
        # Each member's last snapshot: of the cluster version's raise.
        first = {n.member_id: n.status().snapshot_index for n in c.nodes.values()}
        for seq in range(1, 41):
            await leader.propose(Put(b"small%03d" % seq, b"v"), session_id=session, sequence=seq)
        await asyncio.sleep(0.2)
        assert {n.member_id: n.status().snapshot_index for n in c.nodes.values()} == first
        for seq in range(41, 81):
            await leader.propose(
                Put(b"big%03d" % seq, bytes(1024)), session_id=session, sequence=seq
            )
        for node in c.nodes.values():
            await wait_until(lambda n=node: n.status().snapshot_index > 40, "no snapshot by bytes")
    finally:
        for member_id in list(c.nodes):
            await c.stop(member_id)
    assert not c.fatal


def count_decodes_at_apply(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """From now on, count the entries the state machine decodes at apply."""
    decodes = 0
    decode = machine.decode_envelope

    def counting(data: bytes) -> Envelope:
        nonlocal decodes
        decodes += 1
        return decode(data)

    monkeypatch.setattr(machine, "decode_envelope", counting)
    return lambda: decodes


async def test_a_follower_decodes_each_entry_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower applies the envelope it decoded to validate the leader's append, instead
    of decoding the entry again: applying N puts decodes N times in the whole cluster (the
    leader's applies), not 3N. The applied state is the same everywhere."""
    leader = await cluster.leader()
    session = await open_session(leader)
    await wait_applied(list(cluster.nodes.values()), leader.state.applied_index)
    decodes = count_decodes_at_apply(monkeypatch)
    puts = 30
    for seq in range(1, puts + 1):
        await leader.propose(Put(b"k%03d" % seq, b"v%d" % seq), session_id=session, sequence=seq)
    await wait_applied(list(cluster.nodes.values()), leader.state.applied_index)
    assert decodes() < 2 * puts, f"{decodes()} decodes at apply for {puts} puts"
    assert all(n.state.snapshot() == leader.state.snapshot() for n in cluster.nodes.values())


async def test_entries_a_follower_already_holds_are_not_checked_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader resends entries when messages to a follower may have been lost. The leading
    entries the follower's log holds exactly were checked when they first came: they are not
    decoded again, only counted. Anything else is checked as before: a copy of a held entry
    with other data, a new entry that would not apply."""
    leader = await cluster.leader()
    session = await open_session(leader)
    for seq in range(1, 6):
        await leader.propose(Put(b"k%d" % seq, b"v"), session_id=session, sequence=seq)
    await wait_applied(list(cluster.nodes.values()), leader.state.applied_index)
    follower = next(n for n in cluster.nodes.values() if not n.is_leader())
    storage = follower.storage
    assert storage is not None
    held = tuple(storage.entries(storage.first_index(), Index(storage.last_index() + 1)))
    assert len(held) >= 6
    checked: list[tuple[Entry, ...]] = []
    real = node_peer_face.validate_entries

    def recording(entries: tuple[Entry, ...]) -> Any:
        checked.append(entries)
        return real(entries)

    monkeypatch.setattr(node_peer_face, "validate_entries", recording)
    registry = follower.metrics.registry

    def received(held: str) -> float:
        name = "rallypoint_peer_entries_received_total"
        return registry.get_sample_value(name, {"held": held}) or 0.0

    before = received("true"), received("false")
    follower.peers.validate_entries(held)
    assert checked == []
    assert (received("true"), received("false")) == (before[0] + len(held), before[1])
    last = held[-1]
    new = Entry(last.term, Index(last.index + 1), EntryType.NORMAL, b"\x01not an envelope")
    with pytest.raises(ValueError):
        follower.peers.validate_entries((*held, new))
    assert checked == [(new,)]
    # The same index and term as a held entry, other data: checked from there on.
    forged = dataclasses.replace(held[-2], data=b"\x01not an envelope")
    checked.clear()
    with pytest.raises(ValueError):
        follower.peers.validate_entries((*held[:-2], forged, held[-1]))
    assert checked == [(forged, held[-1])]


async def test_a_removed_members_id_is_never_given_again(cluster: Cluster) -> None:
    leader = await cluster.leader()
    first = await leader.membership.add("127.0.0.1:1", "127.0.0.1:2", as_learner=True)
    assert first.member_id == 4
    await leader.membership.remove(4)
    # The highest id is gone from the configuration, yet a new member gets a fresh id: a
    # still-running process of the removed member 4 must never pass for the new one.
    second = await leader.membership.add("127.0.0.1:3", "127.0.0.1:4", as_learner=True)
    assert second.member_id == 5

    # Every member learned it by applying the changes, so any next leader agrees.
    async def learned(node: Node) -> None:
        while node.membership.table.next_id() != 6:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(asyncio.gather(*(learned(n) for n in cluster.nodes.values())), 10)


async def test_a_learner_that_has_not_caught_up_is_not_promoted(cluster: Cluster) -> None:
    leader = await cluster.leader()
    session = await open_session(leader)
    for seq in range(1, 21):
        await leader.propose(Put(b"k%d" % seq, b"v"), session_id=session, sequence=seq)
    # Nothing runs at this address: the learner's log stays empty.
    learner = await leader.membership.add("127.0.0.1:1", "127.0.0.1:2", as_learner=True)
    with pytest.raises(LearnerNotReadyError, match=r"not ready to be promoted.*needs 90%"):
        await leader.membership.promote(learner.member_id)
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    with pytest.raises(NotLeaderError):
        await follower.membership.promote(learner.member_id)
    status = leader.status()
    assert next(m for m in status.members if m.member_id == learner.member_id).is_learner


async def test_a_learner_the_leader_still_sees_abstaining_is_not_promoted(
    cluster: Cluster,
) -> None:
    """A learner that started without data abstains until caught up; the leader learns it
    stopped from its next message. Promoted before that, it is a voter whose acknowledgements
    count toward no quorum: a 2-voter cluster stalls its commits and its leader steps down at
    the next check-quorum (seen after a forced new cluster: the survivor, leading alone,
    promoted a member it still saw abstaining and stepped down 13 ms later)."""
    leader = await cluster.leader()
    learner = await leader.membership.add("127.0.0.1:1", "127.0.0.1:2", as_learner=True)
    learner_id = NodeId(learner.member_id)
    raft = leader.raw._raft
    # Its log as long as the leader's, as far as the leader knows, but it says it abstains.
    raft.trk.progress[learner_id].match = raft.raft_log.last_index()
    leader.raw.report_abstaining(learner_id, True)
    with pytest.raises(LearnerNotReadyError, match=r"not ready to be promoted: it started without"):
        await leader.membership.promote(learner.member_id)
    assert leader.membership.member(learner.member_id).is_learner
    # Its next message says it no longer abstains: promoted.
    leader.raw.report_abstaining(learner_id, False)
    raft.trk.progress[learner_id].match = raft.raft_log.last_index()
    promoted = await leader.membership.promote(learner.member_id)
    assert not promoted.is_learner


def proposal_ids_in_log(node: Node, proposer: int) -> list[int]:
    """The proposal ids of ``proposer``'s normal entries in ``node``'s log."""
    storage = node.storage
    assert storage is not None
    entries = storage.entries(storage.first_index(), Index(storage.last_index() + 1))
    found = [unwrap(e.data) for e in entries if e.type is EntryType.NORMAL and e.data]
    return [proposal_id for who, proposal_id, _ in found if who == proposer]


async def test_proposal_ids_are_unique_across_restarts(tmp_path: Path) -> None:
    """A waiter is keyed by its proposal id: an id of an earlier life, committed late, must
    never resolve a caller of this one (ids once restarted at 1 with every start)."""
    c = Cluster(tmp_path, 3)
    await c.start_all()
    try:
        await c.leader()
        await c.settle()  # its snapshot would compact the first life's entry away
        for _life in range(3):
            await c.leader()
            member = c.nodes[1]  # leader or not: a follower's proposal is forwarded
            session = await open_session(member)
            await member.propose(Put(b"k", b"v"), session_id=session, sequence=1)
            for member_id in list(c.nodes):
                await c.stop(member_id)
            await c.start_all()
        ids = proposal_ids_in_log(c.nodes[1], proposer=1)
        assert len(ids) == 6 and len(set(ids)) == 6, ids
    finally:
        for member_id in list(c.nodes):
            await c.stop(member_id)
    assert not c.fatal


async def test_an_invariant_broken_while_stepping_a_peer_message_stops_the_member(
    cluster: Cluster,
) -> None:
    """The core's own assertions are not a peer's fault to log at debug and move past."""
    leader = await cluster.leader()
    follower = next(n for n in cluster.nodes.values() if n is not leader)

    def broken(message: Message) -> None:
        raise AssertionError("an invariant of the core")

    original = follower.raw.step
    follower.raw.step = broken  # type: ignore[method-assign]
    heartbeat = Message(
        type=MessageType.MsgHeartbeat,
        to=NodeId(follower.member_id),
        from_=NodeId(leader.member_id),
        term=Term(follower.status().term),
    )
    try:
        with pytest.raises(AssertionError):
            follower.peers.deliver([heartbeat])
    finally:
        follower.raw.step = original  # type: ignore[method-assign]
    # (In a daemon, on_fatal ends the process; here the peers' traffic may hit it too.)
    assert cluster.fatal and all(str(e) == "an invariant of the core" for e in cluster.fatal)
    cluster.fatal.clear()


async def test_a_peer_message_at_a_term_no_election_reaches_is_refused_and_logged(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 33: one heartbeat at 2^62 - 1 (the codec's bound) used to be adopted by every
    member, whose pre-votes at 2^62 then did not decode: no leader ever again. It is refused
    now, with an error line and a count, and the cluster keeps its leader and its terms."""
    leader = await cluster.leader()
    term = leader.status().term
    followers = [n for n in cluster.nodes.values() if n is not leader]
    for follower in followers:
        heartbeat = Message(
            type=MessageType.MsgHeartbeat,
            to=NodeId(follower.member_id),
            from_=NodeId(leader.member_id),
            term=Term(2**62 - 1),
        )
        with caplog.at_level(logging.ERROR, logger="rallypoint.node"):
            follower.peers.deliver([decode_message(encode_message(heartbeat))] * 3)
    assert [n.status().term for n in cluster.nodes.values()] == [term] * len(cluster.nodes)
    for follower in followers:
        refused = follower.metrics.peer_refusals.labels("term_out_of_range")
        assert refused._value.get() == 3
    lines = [m for r in caplog.records if "is above the highest term" in (m := r.getMessage())]
    assert len(lines) == len(followers), lines  # once per peer and term, not per message
    assert f"from member {leader.member_id}" in lines[0]
    assert (await cluster.leader()) is leader
    await open_session(leader)
    assert not cluster.fatal


async def test_a_forwarded_proposal_without_a_leader_is_dropped_not_fatal(
    cluster: Cluster,
) -> None:
    """A follower forwards proposals to the member it believes leads; that member may have
    stepped down meanwhile (check-quorum, a transfer). Its core then drops the proposal
    (ProposalDroppedError, an expected outcome the proposer's timeout covers): found by the
    fuzzer, where it stopped the member (exit 70) as if an invariant had broken."""
    leader = await cluster.leader()
    others = [n for n in cluster.nodes.values() if n is not leader]
    survivor, gone = others
    await cluster.stop(leader.member_id)
    await cluster.stop(gone.member_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while survivor.leader_id != 0 or survivor.is_leader():
        assert loop.time() < deadline, "the survivor kept a leader"
        await asyncio.sleep(0.02)
    proposal = Message(
        type=MessageType.MsgProp,
        to=NodeId(survivor.member_id),
        from_=NodeId(gone.member_id),
        term=Term(0),
        entries=(Entry(Term(0), Index(0), EntryType.NORMAL, b""),),
    )
    survivor.peers.deliver([proposal])
    assert not cluster.fatal


async def test_a_proposal_forwarded_twice_reaches_the_leader(cluster: Cluster) -> None:
    """A follower that thought another follower led sends it a proposal; that one forwards
    it to the real leader, keeping the originator. The leader's peer port must take it (it
    once refused the batch: "a message's ends differ from its batch's")."""
    leader = await cluster.leader()
    first, second = (n for n in cluster.nodes.values() if n is not leader)
    envelope = Envelope(0, 0, 0, 0, LeaseExpire(424242))
    data = wrap(first.member_id, 99, encode_envelope(envelope))
    proposal = Message(
        type=MessageType.MsgProp,
        to=NodeId(second.member_id),
        from_=NodeId(first.member_id),
        entries=(Entry(Term(0), Index(0), EntryType.NORMAL, data),),
    )
    second.peers.deliver([proposal])
    storage = leader.storage
    assert storage is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10

    def in_log() -> bool:
        try:
            entries = storage.entries(storage.first_index(), Index(storage.last_index() + 1))
        except UnavailableError:
            return False  # nothing stored yet: a leader is known before its first write ends
        return any(e.data == data for e in entries)

    while not in_log():
        assert loop.time() < deadline, "the forwarded proposal never reached the leader's log"
        await asyncio.sleep(0.02)
    assert not cluster.fatal


async def test_applies_continue_while_a_snapshot_is_encoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot is encoded off the event loop while the member keeps applying, and it
    holds exactly the state at its index: nothing applied after the capture."""
    c = Cluster(tmp_path, 1)
    await c.start_all()
    encoding, release = threading.Event(), threading.Event()
    try:
        node = await c.leader()
        session = await open_session(node)
        for seq in range(1, 6):
            await node.propose(Put(b"k%d" % seq, b"v"), session_id=session, sequence=seq)
        index_at_request = node.state.applied_index
        state_at_request = node.state.snapshot()
        encode = node_snapshots.encode

        def held_encode(captured: node_snapshots.Capture) -> bytes:
            encoding.set()
            assert release.wait(30), "never released"
            return encode(captured)

        monkeypatch.setattr(node_snapshots, "encode", held_encode)
        snapshot = asyncio.ensure_future(node.snapshot_now())
        assert await asyncio.to_thread(encoding.wait, 10), "the snapshot never started encoding"
        # The encoder is held: the member still commits and applies.
        for seq in range(6, 9):
            result = await node.propose(
                Put(b"k%d" % seq, b"late"), session_id=session, sequence=seq
            )
            assert isinstance(result, PutResult)
        assert node.state.applied_index == index_at_request + 3
        assert not snapshot.done()
        release.set()
        assert await asyncio.wait_for(snapshot, 10) == index_at_request
        storage = node.storage
        assert storage is not None
        stored = storage.snapshot()
        assert stored.metadata.index == index_at_request
        _, state = decode_app_snapshot(stored.data)
        assert state == state_at_request
        assert node.state.get(b"k8") is not None
    finally:
        release.set()
        for member_id in list(c.nodes):
            await c.stop(member_id)
    assert not c.fatal


async def test_votes_and_acks_leave_only_after_what_they_vouch_for_is_persisted(
    cluster: Cluster,
) -> None:
    """The driver's half of the Ready contract: an append ack vouches for entries up to its
    index, a granted vote for the vote itself; neither is sent before the disk write that
    makes it true has returned."""
    # The cluster elected its first leader while starting, and that election's entry may have
    # been written before the recording starts and acknowledged after: wait until every
    # member holds the same log, with nothing to write, and count that log as durable.
    await cluster.leader()
    durable_last: dict[int, int] = {}

    for _ in range(50):
        lasts = {}
        for member_id, node in cluster.nodes.items():
            assert node.storage is not None
            lasts[member_id] = int(node.storage.last_index())
        if len(set(lasts.values())) == 1 and lasts == durable_last:
            break
        durable_last = lasts
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(f"the members' logs never settled: {durable_last}")
    events: list[tuple[str, int, object]] = []  # appended from the disk thread and the loop
    for node in cluster.nodes.values():
        storage = node.storage
        assert storage is not None
        write_batch = storage.write_batch

        def recorded_write(
            batch: list[PersistRequest], write: Any = write_batch, member: int = node.member_id
        ) -> None:
            write(batch)
            for request in batch:
                events.append(("persisted", member, request))

        storage.write_batch = recorded_write  # type: ignore[method-assign]
        send = node._transport.send

        def recorded_send(
            messages: tuple[Message, ...], send: Any = send, member: int = node.member_id
        ) -> None:
            for message in messages:
                events.append(("sent", member, message))
            send(messages)

        node._transport.send = recorded_send  # type: ignore[method-assign]

    leader = await cluster.leader()
    session = await open_session(leader)
    for seq in range(1, 6):
        await leader.propose(Put(b"k%d" % seq, b"v"), session_id=session, sequence=seq)
    target = next(i for i in cluster.nodes if i != leader.member_id)
    await leader.membership.transfer_leader(target)  # an election: votes
    leader = await cluster.leader()
    await leader.propose(Put(b"after", b"v"), session_id=session, sequence=6)

    durable_vote: dict[int, tuple[int, int]] = {}
    checked = {MessageType.MsgAppResp: 0, MessageType.MsgVoteResp: 0}
    for kind, member, item in list(events):
        if kind == "persisted":
            assert isinstance(item, PersistRequest)
            if item.entries:
                durable_last[member] = int(item.entries[-1].index)
            elif not item.snapshot.is_empty():
                durable_last[member] = int(item.snapshot.metadata.index)
            if not item.hard_state.is_empty():
                durable_vote[member] = (int(item.hard_state.term), int(item.hard_state.vote))
            continue
        assert isinstance(item, Message)
        if item.reject:
            continue
        if item.type is MessageType.MsgAppResp:
            checked[item.type] += 1
            assert item.index <= durable_last[member], (member, item)
        elif item.type is MessageType.MsgVoteResp:
            checked[item.type] += 1
            assert durable_vote.get(member) == (item.term, item.to), (member, item)
    assert all(checked.values()), checked


async def test_a_member_added_after_compaction_gets_a_snapshot_naming_it(
    tmp_path: Path,
) -> None:
    """The stored snapshots predate the new member's configuration, so the leader makes one
    with the current configuration (off the event loop) and sends it."""
    c = Cluster(tmp_path, 3, snapshot_entries=50, snapshot_catchup_entries=10)
    await c.start_all()
    try:
        leader = await c.leader()
        session = await open_session(leader)
        for seq in range(1, 151):
            await leader.propose(Put(b"k%03d" % seq, b"v"), session_id=session, sequence=seq)
        storage = leader.storage
        assert storage is not None
        await wait_until(lambda: storage.first_index() > 2, "the leader never compacted")
        peer_port, client_port = free_ports(2)
        added = await leader.membership.add(
            f"127.0.0.1:{peer_port}", f"127.0.0.1:{client_port}", as_learner=True
        )
        config = dataclasses.replace(
            c.config(1),
            member_id=added.member_id,
            data_dir=str(tmp_path / f"m{added.member_id}"),
            peer_address=added.peer_address,
            client_address=added.client_address,
            join_existing=True,
        )
        node = Node(config, on_fatal=c.fatal.append)
        await node.start()
        c.nodes[added.member_id] = node
        await wait_applied([node], leader.state.applied_index, timeout_s=20)
        assert node.status().snapshot_index > 1
        assert node.state.get(b"k150") is not None
        assert added.member_id in {m.member_id for m in node.status().members}
    finally:
        for member_id in list(c.nodes):
            await c.stop(member_id)
    assert not c.fatal


async def test_a_follower_slow_to_persist_is_not_sent_its_entries_again_and_again(
    tmp_path: Path,
) -> None:
    """A follower's acknowledgements of appended entries wait for its disk; its heartbeat
    answers do not. While a probing follower's acknowledgement is on its way, the leader
    hears its heartbeat answers (one a tick): it used to resend everything from the
    follower's match on each (~600 entries for these 40 puts). Now each entry goes about
    once, and the re-probes in between are empty (one per heartbeat answer)."""
    c = Cluster(tmp_path, 3)
    await c.start_all()
    try:
        leader = await c.leader()
        session = await open_session(leader)
        await wait_applied(list(c.nodes.values()), leader.state.applied_index)
        await asyncio.sleep(0.1)  # every acknowledgement so far has arrived
        follower = next(n for n in c.nodes.values() if not n.is_leader())
        loop = asyncio.get_running_loop()
        follower_send = follower._transport.send

        def acks_after_a_slow_disk(messages: list[Message]) -> None:
            acks = [m for m in messages if m.type is MessageType.MsgAppResp]
            follower_send([m for m in messages if m.type is not MessageType.MsgAppResp])
            if acks:
                loop.call_later(0.3, follower_send, acks)  # fifteen ticks; in order

        follower._transport.send = acks_after_a_slow_disk  # type: ignore[method-assign]
        appends: list[Message] = []
        # The empty appends sent while the leader still probes the follower (re-probes):
        # once its acknowledgement lands, every later put's commit notice is an empty append
        # too, and on a busy machine the 40 puts outlast the 0.3 s delay.
        probing_empty = 0
        leader_send = leader._transport.send

        def recording(messages: list[Message]) -> None:
            nonlocal probing_empty
            mine = [
                m for m in messages if m.type is MessageType.MsgApp and m.to == follower.member_id
            ]
            appends.extend(mine)
            progress = leader.raw.status().progress.get(NodeId(follower.member_id))
            if progress is not None and progress.state is ProgressState.PROBE:
                probing_empty += sum(1 for m in mine if not m.entries)
            leader_send(messages)

        leader._transport.send = recording  # type: ignore[method-assign]
        leader.peers.report_unreachable(follower.member_id)  # as after a broken stream: PROBE
        puts = 40
        for seq in range(1, puts + 1):
            await leader.propose(Put(b"k%d" % seq, b"v" * 64), session_id=session, sequence=seq)
        await wait_applied([follower], leader.state.applied_index, timeout_s=30.0)
        sent = sum(len(m.entries) for m in appends)
        assert puts <= sent <= 2 * puts
        # Empty MsgApps while probing: the re-probes, one per heartbeat answer, not one per
        # put.
        assert probing_empty < puts
        held = follower.metrics.registry.get_sample_value(
            "rallypoint_peer_entries_received_total", {"held": "true"}
        )
        assert (held or 0.0) <= puts
    finally:
        for member_id in list(c.nodes):
            await c.stop(member_id)
    assert not c.fatal
