"""An in-memory cluster for multi-node Raft tests (etcd-io/raft's ``network`` in raft_test.go).

Each peer is a ``RawNode`` over its own ``MemoryStorage``, driven by the full Ready contract:
after every input the peer persists the Ready (hard state, entries, snapshot), collects its
messages, applies committed entries (configuration changes included) and advances, until it
has nothing more to do. ``Network.send`` delivers messages breadth-first until the cluster is
quiet, dropping what the test's filters say to drop. Randomness (drop probabilities, election
timeouts) comes from seeded ``random.Random`` instances, so runs are reproducible.
"""

from __future__ import annotations

import contextlib
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rallypoint.raft import (
    EMPTY_HARD_STATE,
    ConfChange,
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    NodeId,
    ProposalDroppedError,
    Raft,
    RawNode,
    ReadState,
    Ready,
)
from rallypoint.raft.codec import decode_conf_change

from .internals import raft_core_for_tests


class BootstrapStorage(MemoryStorage):
    """A MemoryStorage whose initial (empty) snapshot carries the bootstrap configuration."""

    def __init__(self, conf_state: ConfState) -> None:
        super().__init__()
        self.bootstrap_conf_state = conf_state

    def initial_state(self) -> tuple[HardState, ConfState]:
        hard_state, conf_state = super().initial_state()
        if MemoryStorage.snapshot(self).is_empty():
            return hard_state, self.bootstrap_conf_state
        return hard_state, conf_state


def ids(*values: int) -> tuple[NodeId, ...]:
    return tuple(NodeId(v) for v in values)


def new_storage(voters: Iterable[int], learners: Iterable[int] = ()) -> BootstrapStorage:
    return BootstrapStorage(ConfState(voters=ids(*sorted(voters)), learners=ids(*sorted(learners))))


def new_config(
    node_id: int,
    storage: MemoryStorage,
    *,
    election_tick: int = 10,
    heartbeat_tick: int = 1,
    seed: int | None = None,
    **overrides: Any,
) -> Config:
    """A test config; check-quorum and pre-vote are off unless asked for (as in etcd's)."""
    options: dict[str, Any] = {"check_quorum": False, "pre_vote": False}
    options.update(overrides)
    return Config(
        id=NodeId(node_id),
        storage=storage,
        # A string seed is hashed deterministically, unlike tuples of objects.
        rng=random.Random(node_id if seed is None else f"{seed}-{node_id}"),
        election_tick=election_tick,
        heartbeat_tick=heartbeat_tick,
        **options,
    )


@dataclass
class Peer:
    """A RawNode with its storage, persisting and applying every Ready it produces."""

    node: RawNode
    storage: MemoryStorage
    # Every entry applied, in order (including empty no-ops and conf changes).
    applied: list[Entry] = field(default_factory=list)
    # Every Ready handled, in order (tests inspect them).
    readies: list[Ready] = field(default_factory=list)
    # Every ReadIndex result received, in order.
    read_states: list[ReadState] = field(default_factory=list)
    # Apply CONF_CHANGE entries automatically when they are applied.
    auto_apply_conf_changes: bool = True

    @property
    def raft(self) -> Raft:
        return raft_core_for_tests(self.node)

    @property
    def id(self) -> NodeId:
        return raft_core_for_tests(self.node).id

    def step(self, m: Message) -> None:
        """Step ``m`` into the state machine (local types allowed, as etcd's tests do)."""
        with contextlib.suppress(ProposalDroppedError):
            raft_core_for_tests(self.node).step(m)

    def handle_ready(self) -> list[Message]:
        """Persist, apply and advance until idle; the messages to send, in order."""
        out: list[Message] = []
        while self.node.has_ready():
            rd = self.node.ready()
            self.readies.append(rd)
            self.read_states.extend(rd.read_states)
            if not rd.snapshot.is_empty():
                self.storage.apply_snapshot(rd.snapshot)
            if rd.entries:
                self.storage.append(rd.entries)
            if rd.hard_state != EMPTY_HARD_STATE:
                self.storage.set_hard_state(rd.hard_state)
            out.extend((*rd.messages, *rd.messages_after_persist))
            for entry in rd.committed_entries:
                self.applied.append(entry)
                if entry.type is EntryType.CONF_CHANGE and self.auto_apply_conf_changes:
                    self.node.apply_conf_change(decode_conf_change(entry.data))
            self.node.advance(rd)
        return out

    def applied_data(self) -> list[bytes]:
        """The data of applied normal entries, skipping empty no-ops."""
        return [e.data for e in self.applied if e.type is EntryType.NORMAL and e.data]


def new_peer(
    node_id: int,
    voters: Iterable[int],
    learners: Iterable[int] = (),
    **config: Any,
) -> Peer:
    storage = new_storage(voters, learners)
    return Peer(RawNode(new_config(node_id, storage, **config)), storage)


class Network:
    """Peers connected by a lossy, filterable, in-order message bus.

    ``peers[i]`` is ``None`` for a black hole (a node that receives and answers nothing).
    """

    def __init__(
        self,
        peers: Iterable[Peer | None],
        *,
        seed: int = 0,
    ) -> None:
        self.peers: dict[NodeId, Peer | None] = {}
        for position, peer in enumerate(peers, start=1):
            node_id = NodeId(position) if peer is None else peer.id
            self.peers[node_id] = peer
        # (from, to) -> probability of dropping a message on that link.
        self.dropm: dict[tuple[NodeId, NodeId], float] = {}
        # Message types dropped everywhere.
        self.ignorem: set[MessageType] = set()
        # Applied last: returns the message to deliver (possibly altered) or None to drop it.
        self.msg_hook: Callable[[Message], Message | None] | None = None
        self.rng = random.Random(seed)
        # Every message delivered, in order (tests count them).
        self.delivered: list[Message] = []

    @classmethod
    def of_size(cls, size: int, **config: Any) -> Network:
        voters = range(1, size + 1)
        return cls([new_peer(i, voters, **config) for i in voters])

    def peer(self, node_id: int) -> Peer:
        peer = self.peers[NodeId(node_id)]
        if peer is None:
            raise KeyError(f"peer {node_id} is a black hole")
        return peer

    def raft(self, node_id: int) -> Raft:
        return self.peer(node_id).raft

    def send(self, *msgs: Message) -> None:
        """Deliver ``msgs`` and everything they cause, until no message is in flight."""
        queue = deque(msgs)
        while queue:
            m = queue.popleft()
            peer = self.peers.get(m.to)
            if peer is None:
                continue
            self.delivered.append(m)
            peer.step(m)
            queue.extend(self.filter(peer.handle_ready()))

    def tick_all(self, ticks: int = 1) -> None:
        """Tick every live peer, in id order, delivering messages after each tick."""
        for _ in range(ticks):
            for node_id, peer in sorted(self.peers.items()):
                if peer is not None:
                    self.tick(node_id)

    def deliver(self, node_id: int) -> None:
        """Send whatever ``node_id`` has pending (after a direct RawNode call)."""
        self.send(*self.filter(self.peer(node_id).handle_ready()))

    def tick(self, node_id: int, ticks: int = 1) -> None:
        """Tick one peer and deliver whatever it sends."""
        peer = self.peer(node_id)
        for _ in range(ticks):
            peer.node.tick()
            self.send(*self.filter(peer.handle_ready()))

    def campaign(self, node_id: int) -> None:
        self.send(Message(type=MessageType.MsgHup, from_=NodeId(node_id), to=NodeId(node_id)))

    def propose(self, node_id: int, data: bytes) -> None:
        node = NodeId(node_id)
        self.send(
            Message(
                type=MessageType.MsgProp,
                from_=node,
                to=node,
                entries=(Entry(term=0, index=0, data=data),),  # type: ignore[arg-type]
            )
        )

    def propose_conf_change(self, node_id: int, cc: ConfChange) -> None:
        peer = self.peer(node_id)
        with contextlib.suppress(ProposalDroppedError):
            peer.node.propose_conf_change(cc)
        self.deliver(node_id)

    def drop(self, from_: int, to: int, probability: float) -> None:
        self.dropm[(NodeId(from_), NodeId(to))] = probability

    def cut(self, one: int, other: int) -> None:
        self.drop(one, other, 2.0)  # always drop
        self.drop(other, one, 2.0)

    def isolate(self, node_id: int) -> None:
        for other in self.peers:
            if other != node_id:
                self.cut(node_id, other)

    def ignore(self, msg_type: MessageType) -> None:
        self.ignorem.add(msg_type)

    def recover(self) -> None:
        self.dropm.clear()
        self.ignorem.clear()

    def filter(self, msgs: Iterable[Message]) -> list[Message]:
        kept: list[Message] = []
        for m in msgs:
            if m.type in self.ignorem:
                continue
            if m.type is MessageType.MsgHup:
                raise AssertionError("unexpected MsgHup on the network")
            probability = self.dropm.get((m.from_, m.to), 0.0)
            if probability and self.rng.random() < probability:
                continue
            if self.msg_hook is not None:
                hooked = self.msg_hook(m)
                if hooked is None:
                    continue
                m = hooked
            kept.append(m)
        return kept
