"""One simulated server: a RawNode over durable MemoryStorage, with crashes that lose writes.

Theory of operation. A server handles each ``Ready`` in five steps, each a separate event of
the simulation so that a crash can fall between any two of them:

    WRITE   ready() is called; hard state, entries and snapshot go to a volatile buffer
    SYNC    the buffer is fsynced: written to the durable MemoryStorage (snapshot, entries,
            hard state, in that order)
    SEND    the Ready's messages go to the network (only now: they may depend on the writes)
    APPLY   the snapshot (if any) and the committed entries reach the state machine; conf
            changes are applied to the RawNode; ReadIndex results are checked
    ADVANCE advance(rd); the server is idle again

A crash drops the RawNode, the volatile buffer and the state machine; the durable
MemoryStorage survives, and a restart builds a new RawNode from it alone. The state machine
is a hash chain over the applied entries (what a real one would compute from them, compressed
to 8 bytes), so two servers that applied the same log have equal states. A snapshot's data is
that state at the snapshot's index.

A wipe (only of a server that is down) replaces the durable storage with an empty one, as a
lost disk would. The server then holds nothing until the simulation's bootstrap rule lets it
install the cluster's creation (``install_creation``): as a member of a new cluster, or as one
that lost its data and *abstains* (neither votes nor campaigns) until its durable log holds,
at its durable commit index, an entry of the term of a leader it follows, and that index
reaches the commit index the leader reported, after that rose while the node listened
(``caught_up``), as the coordinator does (``Node._maybe_stop_abstaining``). The abstaining
flag survives crashes (the coordinator keeps it in ``identity.json``).

The server mirrors its stored log twice (what was written, what was fsynced) as chain values
per index, which is how the checker decides log matching in O(1) per entry.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.raft import (
    NONE,
    CompactedError,
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Index,
    MemoryStorage,
    Message,
    MessageType,
    NodeId,
    RawNode,
    Ready,
    Snapshot,
    SnapshotMetadata,
    SnapshotTemporarilyUnavailableError,
    StateType,
    Term,
    UnavailableError,
)
from rallypoint.raft.codec import decode_conf_change
from tests.raft.internals import raft_core_for_tests

from .checker import (
    GENESIS_CHAIN,
    GENESIS_INDEX,
    GENESIS_TERM,
    Checker,
    Violation,
    chain_next,
)

_SNAPSHOT_MAGIC = b"SIMSNAP1"


def encode_state(index: int, chain: bytes) -> bytes:
    """A snapshot's data: the state machine (its chain value) at ``index``."""
    return _SNAPSHOT_MAGIC + index.to_bytes(8, "big") + chain


def decode_state(snapshot: Snapshot) -> bytes:
    """The chain value a snapshot carries; raises Violation if it is not one of ours."""
    data = snapshot.data
    if len(data) != 24 or not data.startswith(_SNAPSHOT_MAGIC):
        raise Violation("snapshot integrity", f"snapshot data {data[:32]!r} is not a state")
    index = int.from_bytes(data[8:16], "big")
    if index != snapshot.metadata.index:
        raise Violation(
            "snapshot integrity",
            f"snapshot at index {snapshot.metadata.index} holds the state at index {index}",
        )
    return data[16:]


def bootstrap_snapshot(voters: tuple[NodeId, ...]) -> Snapshot:
    """What every initial member starts from: the configuration at index 1, term 1."""
    meta = SnapshotMetadata(ConfState(voters=voters), Index(GENESIS_INDEX), Term(GENESIS_TERM))
    return Snapshot(encode_state(GENESIS_INDEX, GENESIS_CHAIN), meta)


def caught_up(
    commit: int, commit_term: int, term: int, lead_commit: int, lead_commit_first: int
) -> bool:
    """Whether a node that lost its data may vote again, as ``bootstrap.has_caught_up``
    decides for the coordinator: its durable commit index reaches the commit index its
    leader reported (unclipped), which rose above the first one it reported (so it was
    committed without this node, whose acknowledgements nobody counts while it abstains:
    the leader is not one deposed before the loss), and the entry there is of the current
    term (that leader's: everything committed before it is then in this log, by Leader
    Completeness). Its own commit alone would pass after the first entries of the term (it
    is clipped to the entries received), while entries it acknowledged in its lost life may
    lie beyond."""
    return lead_commit_first < lead_commit <= commit and commit_term == term


class LogMirror:
    """A stored log as chain values: a base (the snapshot) followed by entries.

    Invariant: ``terms[k]`` and ``chains[k]`` describe index ``base_index + 1 + k``, and
    ``chains[k]`` is the chain value of the whole log up to that index.
    """

    __slots__ = ("base_chain", "base_index", "base_term", "chains", "terms")

    def __init__(self, base_index: int, base_term: int, base_chain: bytes) -> None:
        self.base_index = base_index
        self.base_term = base_term
        self.base_chain = base_chain
        self.terms: list[int] = []
        self.chains: list[bytes] = []

    def copy(self) -> LogMirror:
        other = LogMirror(self.base_index, self.base_term, self.base_chain)
        other.terms = list(self.terms)
        other.chains = list(self.chains)
        return other

    def last_index(self) -> int:
        return self.base_index + len(self.terms)

    def chain_at(self, index: int) -> bytes | None:
        if index == self.base_index:
            return self.base_chain
        k = index - self.base_index - 1
        return self.chains[k] if 0 <= k < len(self.chains) else None

    def restore(
        self, snapshot: Snapshot, chain: bytes, node: NodeId, checker: Checker | None
    ) -> None:
        """Replace the log by ``snapshot`` (whose state summarises the log up to it)."""
        if checker is not None:
            meta = snapshot.metadata
            checker.observe_stored(node, meta.index, meta.term, chain)
        self.base_index = snapshot.metadata.index
        self.base_term = snapshot.metadata.term
        self.base_chain = chain
        self.terms = []
        self.chains = []

    def append(self, node: NodeId, entries: tuple[Entry, ...], checker: Checker) -> None:
        """Append (overwriting a conflicting suffix), as MemoryStorage.append does."""
        if not entries:
            return
        first = entries[0].index
        if first > self.last_index() + 1:
            raise Violation(
                "log continuity",
                f"node {node} was handed entries from {first} to store after its last index "
                f"{self.last_index()}",
            )
        skip = max(0, self.base_index + 1 - first)  # entries already in the snapshot
        keep = first + skip - self.base_index - 1
        del self.terms[keep:]
        del self.chains[keep:]
        previous = self.chains[-1] if self.chains else self.base_chain
        for entry in entries[skip:]:
            previous = chain_next(previous, entry)
            self.terms.append(entry.term)
            self.chains.append(previous)
            checker.observe_stored(node, entry.index, entry.term, previous)


class CoreLog:
    """The core's logger: its lines go into the trace when tracing, nowhere otherwise."""

    __slots__ = ("_emit", "_prefix")

    def __init__(self, emit: Callable[[str], None] | None, node_id: NodeId) -> None:
        self._emit = emit
        self._prefix = f"raft {node_id}: "

    def _line(self, msg: object, args: tuple[object, ...]) -> None:
        if self._emit is not None:
            self._emit(self._prefix + (str(msg) % args if args else str(msg)))

    def debug(self, msg: object, *args: object) -> None:
        self._line(msg, args)

    def info(self, msg: object, *args: object) -> None:
        self._line(msg, args)

    def warning(self, msg: object, *args: object) -> None:
        self._line(msg, args)

    def error(self, msg: object, *args: object) -> None:
        self._line(msg, args)


class SimStorage(MemoryStorage):
    """Durable storage whose ``snapshot()`` behaves like a sensible application's.

    A snapshot is only useful to a follower whose id is in its configuration (the core
    refuses one that is not, as etcd's does). A node added after the latest snapshot would
    wait for the next one forever, so when the configuration changed after the stored
    snapshot, a fresh one is taken at the state machine's applied index (not compacting).
    """

    def __init__(self, node: SimNode) -> None:
        super().__init__()
        self._node = node

    def snapshot(self) -> Snapshot:
        node = self._node
        if node.raw is not None and node.snapshot_rng.random() < node.options.snapshot_busy_prob:
            raise SnapshotTemporarilyUnavailableError("the state machine is busy")
        stored = super().snapshot()
        if node.raw is not None and node.conf_index > stored.metadata.index:
            return self.create_snapshot(
                Index(node.app_applied),
                node.conf_state,
                encode_state(node.app_applied, node.app_chain),
            )
        return stored

    def stored_snapshot(self) -> Snapshot:
        return super().snapshot()


class Stage(enum.Enum):
    """How far the current Ready has been handled (see the module docstring)."""

    IDLE = 0
    WRITTEN = 1
    SYNCED = 2
    SENT = 3
    APPLIED = 4


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """The RawNode configuration the simulation runs every server with."""

    election_tick: int
    heartbeat_tick: int
    pre_vote: bool
    check_quorum: bool
    max_size_per_msg: int
    max_inflight_msgs: int
    snapshot_busy_prob: float  # chance Storage.snapshot() says "temporarily unavailable"


class SimNode:
    """A server (see the module docstring). ``raw`` is None while the server is down."""

    def __init__(
        self,
        node_id: NodeId,
        options: NodeOptions,
        rng_seed: str,
        initial: Snapshot | None,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.id = node_id
        self.options = options
        self._rng_seed = rng_seed
        self._logger = CoreLog(emit, node_id)
        self.snapshot_rng = random.Random(f"{rng_seed}/snapshot")
        # Durable storage: survives crashes. Invariant: only SYNC and snapshots write it.
        self.storage = SimStorage(self)
        self.durable = LogMirror(0, 0, b"")
        if initial is not None:
            self.storage.apply_snapshot(initial)
            self.storage.set_hard_state(HardState(Term(GENESIS_TERM), NONE, Index(GENESIS_INDEX)))
            self.durable.restore(initial, decode_state(initial), node_id, None)
        # What was written (durable + volatile). Invariant: equals `durable` at IDLE and SYNCED+.
        self.written = self.durable.copy()
        self.raw: RawNode | None = None
        # Wiped and not yet past the bootstrap rule: nothing on disk, not even the creation.
        self.empty = False
        # Durable (survives crashes): lost its data and has not caught up; no votes.
        self.abstaining = False
        self.just_caught_up = False  # stopped abstaining in the last event (reactive fault)
        self.disks = 0  # disks lost so far: which data directory (incarnation) this is
        self.incarnation = 0  # bumped on every crash, so stale events for the old life are void
        self.stage = Stage.IDLE
        self.ready: Ready | None = None  # Invariant: not None iff stage is not IDLE
        self.ready_scheduled = False  # a Ready step event for this incarnation is queued
        # The leader's reported commit (BasicStatus.lead_commit) when the current Ready was made.
        self.ready_lead_commit = 0
        self.ready_lead_commit_first = 0
        self.stopped = False  # shut down for good (removed from the configuration)
        # The state machine. Invariant: app_chain is the chain value of the log up to
        # app_applied, as applied in order.
        self.app_applied = 0
        self.app_chain = b""
        self.conf_state = ConfState()
        self.conf_index = 0  # the index at which conf_state took effect
        # Observation state for the checks after each event.
        self.seen_commit = 0  # highest in-memory commit index already reported
        self.leader_term = 0  # the term this node was last seen leading (0: not leading)
        self.leader_last_index = 0
        self.leader_last_term = 0
        self.start()

    @property
    def alive(self) -> bool:
        return self.raw is not None

    def rawnode(self) -> RawNode:
        if self.raw is None:
            raise RuntimeError(f"node {self.id} is down")
        return self.raw

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """(Re)start from durable storage only."""
        assert not self.empty, f"node {self.id} has no creation on disk to start from"
        snap = self.storage.stored_snapshot()
        self.app_applied = snap.metadata.index
        self.conf_index = snap.metadata.index
        self.app_chain = decode_state(snap) if not snap.is_empty() else b""
        self.conf_state = snap.metadata.conf_state
        opts = self.options
        config = Config(
            id=self.id,
            storage=self.storage,
            rng=random.Random(f"{self._rng_seed}/{self.incarnation}"),
            election_tick=opts.election_tick,
            heartbeat_tick=opts.heartbeat_tick,
            applied=Index(snap.metadata.index),
            max_size_per_msg=opts.max_size_per_msg,
            max_inflight_msgs=opts.max_inflight_msgs,
            check_quorum=opts.check_quorum,
            pre_vote=opts.pre_vote,
            abstain=self.abstaining,
            logger=self._logger,
        )
        self.raw = RawNode(config)
        self.written = self.durable.copy()
        self.seen_commit = raft_core_for_tests(self.raw).raft_log.first_index() - 1
        self.leader_term = 0

    def crash(self) -> None:
        """Lose everything not fsynced: the RawNode, the buffer, the state machine."""
        self.raw = None
        self.incarnation += 1
        self.stage = Stage.IDLE
        self.ready = None
        self.ready_scheduled = False
        self.written = self.durable.copy()

    def wipe(self) -> None:
        """Lose the disk (the server must be down): nothing durable is left."""
        assert self.raw is None, "wipe a server that is down"
        self.storage = SimStorage(self)
        self.durable = LogMirror(0, 0, b"")
        self.written = self.durable.copy()
        self.empty = True
        self.abstaining = False
        self.disks += 1

    def holds_nothing_beyond_creation(self) -> bool:
        """The coordinator's ``is_fresh``: no election, no entry after the creation."""
        return (
            self.storage.hard_state.term <= GENESIS_TERM
            and self.durable.last_index() <= GENESIS_INDEX
        )

    def knows(self, node_id: NodeId) -> bool:
        cs = self.conf_state
        return node_id in (*cs.voters, *cs.voters_outgoing, *cs.learners, *cs.learners_next)

    def install_creation(self, creation: Snapshot, abstaining: bool) -> None:
        """Write the cluster's creation to an empty disk (both bootstrap-rule outcomes do:
        the coordinator's ``node/bootstrap.py``), then start."""
        assert self.empty
        self.storage.apply_snapshot(creation)
        self.storage.set_hard_state(HardState(Term(GENESIS_TERM), NONE, Index(GENESIS_INDEX)))
        self.durable.restore(creation, decode_state(creation), self.id, None)
        self.written = self.durable.copy()
        self.empty = False
        self.abstaining = abstaining
        self.start()

    def _maybe_stop_abstaining(self, raw: RawNode) -> None:
        """Vote again once caught up (``caught_up``, the coordinator's
        ``bootstrap.has_caught_up``): the durable commit index reaches the commit index the
        leader reported when this Ready was made, with an entry of the current term there."""
        hs = self.storage.hard_state
        if raw.basic_status().soft_state.lead == NONE or hs.commit <= GENESIS_INDEX:
            return
        k = hs.commit - self.durable.base_index - 1
        commit_term = self.durable.terms[k] if 0 <= k < len(self.durable.terms) else 0
        first = self.ready_lead_commit_first
        if caught_up(hs.commit, commit_term, hs.term, self.ready_lead_commit, first):
            self.abstaining = False
            self.just_caught_up = True
            raw.set_abstain(False)
            self._logger.info(
                "%d caught up at commit %d of term %d (leader's commit %d): votes again",
                self.id,
                hs.commit,
                hs.term,
                self.ready_lead_commit,
            )

    # -- Ready handling, one step per call -----------------------------------------------

    def step_ready(self, checker: Checker) -> tuple[Message, ...]:
        """Do the next step of Ready handling; returns the messages to send (SEND only)."""
        raw = self.rawnode()
        if self.stage is Stage.IDLE:
            fresh = raw.ready()
            self.ready = fresh
            # Read with the Ready, so it pairs with the commit index this Ready persists.
            status = raw.basic_status()
            self.ready_lead_commit = int(status.lead_commit)
            self.ready_lead_commit_first = int(status.lead_commit_first)
            if not fresh.snapshot.is_empty():
                self.written.restore(fresh.snapshot, decode_state(fresh.snapshot), self.id, checker)
            self.written.append(self.id, fresh.entries, checker)
            self.stage = Stage.WRITTEN
            # Sent at once, before anything is persisted: they must vouch for nothing that
            # is not already durable (checked as the others are).
            for m in fresh.messages:
                self._check_message_durable(m)
            return fresh.messages
        rd = self.ready
        assert rd is not None
        if self.stage is Stage.WRITTEN:
            self._sync(rd, checker)
            self.stage = Stage.SYNCED
            return ()
        if self.stage is Stage.SYNCED:
            for m in rd.messages_after_persist:
                self._check_message_durable(m)
            self.stage = Stage.SENT
            return rd.messages_after_persist
        if self.stage is Stage.SENT:
            self._apply(raw, rd, checker)
            self.stage = Stage.APPLIED
            return ()
        raw.advance(rd)
        self.ready = None
        self.stage = Stage.IDLE
        return ()

    def _sync(self, rd: Ready, checker: Checker) -> None:
        if not rd.snapshot.is_empty():
            self.storage.apply_snapshot(rd.snapshot)
            self.durable.restore(rd.snapshot, decode_state(rd.snapshot), self.id, checker)
        self.storage.append(rd.entries)
        self.durable.append(self.id, rd.entries, checker)
        if not rd.hard_state.is_empty():
            previous, hs = self.storage.hard_state, rd.hard_state
            if hs.term < previous.term:
                raise Violation(
                    "durable term monotonic",
                    f"node {self.id} persisted term {hs.term} after term {previous.term}",
                )
            if hs.term == previous.term and previous.vote not in (NONE, hs.vote):
                raise Violation(
                    "durable vote",
                    f"node {self.id} persisted a vote for {hs.vote} in term {hs.term} after "
                    f"persisting a vote for {previous.vote}",
                )
            if hs.commit < previous.commit:
                raise Violation(
                    "durable commit monotonic",
                    f"node {self.id} persisted commit {hs.commit} after commit {previous.commit}",
                )
            self.storage.set_hard_state(hs)
        if self.storage.hard_state.commit > self.durable.last_index():
            raise Violation(
                "durable commit in range",
                f"node {self.id} persisted commit {self.storage.hard_state.commit} beyond its "
                f"durable last index {self.durable.last_index()}",
            )

    def _check_message_durable(self, m: Message) -> None:
        """A message may only promise what is on disk (the Ready contract)."""
        hs = self.storage.hard_state
        if m.type is MessageType.MsgVoteResp and not m.reject:
            if hs.term < m.term or (hs.term == m.term and hs.vote != m.to):
                raise Violation(
                    "vote durable before granted",
                    f"node {self.id} granted its term-{m.term} vote to {m.to} with durable "
                    f"hard state term {hs.term} vote {hs.vote}",
                )
        elif (
            m.type is MessageType.MsgAppResp
            and not m.reject
            and hs.term == m.term
            and m.index > self.durable.last_index()
        ):
            # Only within the answer's term: an answer queued in term t for entries that a
            # leader of a later term then overwrote before they were written is stale but
            # harmless (the later leader's election majority cannot have acknowledged them),
            # and etcd-io/raft sends such answers too.
            raise Violation(
                "append durable before acknowledged",
                f"node {self.id} acknowledged index {m.index} to {m.to} with durable last "
                f"index {self.durable.last_index()}",
            )

    def _apply(self, raw: RawNode, rd: Ready, checker: Checker) -> None:
        if not rd.snapshot.is_empty():
            meta = rd.snapshot.metadata
            if meta.index < self.app_applied:
                raise Violation(
                    "state machine safety",
                    f"node {self.id} was handed a snapshot at {meta.index} to apply after "
                    f"applying up to {self.app_applied}",
                )
            self.app_applied = meta.index
            self.app_chain = decode_state(rd.snapshot)
            self.conf_state = meta.conf_state
            self.conf_index = meta.index
            checker.observe_applied(self.id, meta.index, meta.term, self.app_chain)
            checker.observe_conf(meta.index, meta.conf_state)
        for entry in rd.committed_entries:
            if entry.index != self.app_applied + 1:
                raise Violation(
                    "apply in order",
                    f"node {self.id} was handed entry {entry.index} to apply after applying "
                    f"up to {self.app_applied}",
                )
            chain = chain_next(self.app_chain, entry)
            if entry.type is EntryType.CONF_CHANGE:
                # The core may ask storage for a snapshot from inside apply_conf_change (a
                # leader probing a new member); the state machine must still be the one
                # before this entry then, with its configuration.
                conf_state = raw.apply_conf_change(decode_conf_change(entry.data))
                self.conf_state, self.conf_index = conf_state, entry.index
                checker.observe_conf(entry.index, conf_state)
            self.app_chain, self.app_applied = chain, entry.index
            checker.observe_applied(self.id, entry.index, entry.term, chain)
        for rs in rd.read_states:
            checker.read_answered(self.id, rs.request_ctx, rs.index)
        if raw.abstaining:
            self._maybe_stop_abstaining(raw)

    # -- application-driven snapshots ----------------------------------------------------

    def compact(self, keep_entries: int) -> bool:
        """Snapshot the state machine and compact the log behind it, as an application does
        between Readys. Returns whether anything was compacted."""
        if self.raw is None or self.stage is not Stage.IDLE:
            return False
        snap_index = self.storage.stored_snapshot().metadata.index
        if self.app_applied <= snap_index:
            return False
        self.storage.create_snapshot(
            Index(self.app_applied), self.conf_state, encode_state(self.app_applied, self.app_chain)
        )
        compact_to = max(snap_index + 1, self.app_applied - keep_entries)
        if compact_to > self.storage.first_index():
            self.storage.compact(Index(compact_to))
        return True

    # -- observations after each event ---------------------------------------------------

    def term_at(self, index: int) -> int | None:
        """The term the RawNode's log holds at ``index``: None if compacted, 0 if absent."""
        log = raft_core_for_tests(self.rawnode()).raft_log
        if index < log.first_index() - 1:
            return None
        try:
            return int(log.term(Index(index)))
        except CompactedError:
            return None
        except UnavailableError:
            return 0

    def observe(self, checker: Checker) -> None:
        """Report this node's in-memory state to the checker; runs after every event."""
        if self.raw is None:
            return
        r = raft_core_for_tests(self.raw)
        log = r.raft_log
        committed = log.committed
        if committed < self.seen_commit:
            raise Violation(
                "commit monotonic",
                f"node {self.id}'s commit index went from {self.seen_commit} to {committed}",
            )
        if committed > self.seen_commit:
            for index in range(max(self.seen_commit + 1, log.first_index() - 1), committed + 1):
                term = self.term_at(index)
                if term is None:
                    continue
                if term == 0:
                    raise Violation(
                        "commit in range",
                        f"node {self.id} has commit index {committed} but no entry {index}",
                    )
                checker.observe_committed(self.id, r.term, index, term)
            self.seen_commit = committed
        if r.state is not StateType.LEADER:
            self.leader_term = 0
            return
        last = log.last_index()
        if self.leader_term != r.term:
            checker.observe_leader(self.id, r.term, self.term_at)
            self.leader_term = r.term
        else:
            held = self.term_at(self.leader_last_index)
            if last < self.leader_last_index or held not in (None, self.leader_last_term):
                raise Violation(
                    "leader append-only",
                    f"node {self.id}, leader of term {r.term}, held entry "
                    f"{self.leader_last_index}/{self.leader_last_term} and now has last index "
                    f"{last} and term {held} there",
                )
        self.leader_last_index = last
        self.leader_last_term = self.term_at(last) or 0
