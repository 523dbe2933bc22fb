"""A running member: the asyncio driver around the pure Raft core.

Theory of operation. One task, the Ready loop, owns the hand-off between the pure core
(``RawNode``) and the world, in the order the Ready contract demands (etcd-io/raft's
``rawnode.go``; Raft thesis 10.2):

1. persist the Ready's hard state, entries and snapshot: one WAL write and one fsync, run on
   a dedicated disk thread so the event loop keeps serving; while it runs, new proposals and
   messages keep entering the core, and the next Ready carries all of them to disk with one
   fsync (group commit);
2. send the messages (only now: they may vouch for what was just persisted);
3. install a received snapshot into the state machine; resolve ReadIndex requests;
4. apply the committed entries: state-machine commands, or configuration changes (which
   also update the member address book);
5. ``advance``; then snapshot and compact when the policy says so.

Everything else (ticks, messages from peers, proposals from the servicers) only calls into
the core and wakes the loop. Requests wait on futures keyed by a proposal id that travels
inside the entry (``_wrap``), so the member that proposed an entry answers its caller when
the entry is applied. The state machine never reads a clock: the proposing member stamps
each command with its wall-clock time (``Envelope.leader_time_ms``).

Soft state that is not replicated lives here: the leader's lease deadlines (``Lessor``,
restarted with a full TTL on every leader change, as etcd does), ReadIndex batching, and
the futures of callers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import grpc.aio

from rallypoint.raft import (
    Config,
    RawNode,
    Ready,
    SnapshotStatus,
    SoftState,
    StateType,
)
from rallypoint.raft import ProposalDroppedError as RaftProposalDroppedError
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.errors import StepLocalMsgError, StepPeerNotFoundError
from rallypoint.raft.log_storage import CompactedError, UnavailableError
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest, SnapshotPolicy
from rallypoint.raft.types import (
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
    ReadState,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from . import identity as identity_file
from .identity import Identity
from .leader.lessor import Lessor
from .leader.progress import ProgressReport
from .leader.supervisor import RendezvousSupervisor
from .members import (
    ConfChangeContext,
    MemberAddress,
    MemberTable,
    decode_app_snapshot,
    encode_app_snapshot,
)
from .metrics import NodeMetrics
from .node_api import (
    PROMOTE_READY_PERCENT,
    CompactedWatchError,
    Header,
    LearnerNotReadyError,
    Member,
    MemberNotFoundError,
    NodeError,
    NodeStartError,
    NodeStatus,
    NoLeaderError,
    NotLeaderError,
    PeerProgress,
    ProposalDroppedError,
    ProposalTimeoutError,
)
from .peer_auth import PeerKey, cluster_id_for
from .peer_hello import ask_peers
from .peer_service import add_peer_service, remove_partial_snapshots
from .preflight import SERVER_OPTIONS
from .role_log import ROLE_NAMES, RoleLog
from .state.commands import Command, Envelope, LeaseExpire, decode_envelope, encode_envelope
from .state.errors import Compacted
from .state.machine import Limits, StateMachine
from .state.results import LeaseEndResult, LeaseGrantResult, Result
from .state.values import Event
from .transport import GRPC_OPTIONS, Transport

# Test-only: breaks linearizability/fencing on purpose for the fault-injection suite's negative
# controls (tests/jepsen). With RALLYPOINT_UNSAFE_STALE_READS=1 in a member's environment when it
# starts, read_barrier returns at once, so "linearizable" reads are served from local state and
# may be stale. Never set it outside that suite.
UNSAFE_STALE_READS = os.environ.get("RALLYPOINT_UNSAFE_STALE_READS") == "1"

log = logging.getLogger("rallypoint.node")

# Entry data written by this driver: a version byte, the proposing member, the proposal id,
# then the encoded Envelope. Empty data is the leader's no-op.
_ENTRY_HEADER = struct.Struct(">BQQ")
_ENTRY_VERSION = 1
# Vote requests and answers: what a peer that abstains must not have counted.
_VOTE_TRAFFIC = frozenset(
    {
        MessageType.MsgVote,
        MessageType.MsgVoteResp,
        MessageType.MsgPreVote,
        MessageType.MsgPreVoteResp,
    }
)


def _wrap(proposer_id: int, proposal_id: int, payload: bytes) -> bytes:
    return _ENTRY_HEADER.pack(_ENTRY_VERSION, proposer_id, proposal_id) + payload


def _unwrap(data: bytes) -> tuple[int, int, bytes]:
    if len(data) < _ENTRY_HEADER.size:
        raise AssertionError(f"committed entry too short for its header: {len(data)} bytes")
    version, proposer_id, proposal_id = _ENTRY_HEADER.unpack_from(data)
    if version != _ENTRY_VERSION:
        raise AssertionError(f"committed entry has unknown version {version}")
    return proposer_id, proposal_id, data[_ENTRY_HEADER.size :]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class PeerTls(Protocol):
    """Credentials for mutual TLS on the peer port (see ``daemon.TlsFiles``)."""

    def server_credentials(self) -> grpc.ServerCredentials: ...

    def channel_credentials(self) -> grpc.ChannelCredentials: ...


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """How to run one member. Durations in ticks are multiples of ``tick_ms``."""

    member_id: int
    data_dir: str
    peer_address: str  # host:port this member's peers reach it at (and it listens on)
    client_address: str  # host:port clients reach it at
    # The cluster's members when it was created (bootstrap) or, for a member joining an
    # existing cluster, the address book to reach the others until a snapshot arrives.
    initial_members: dict[int, MemberAddress] = field(default_factory=dict)
    join_existing: bool = False
    # The secret every member holds (peer_auth.py); at least 16 bytes. Required: the peer
    # port authenticates every request with it.
    peer_secret: bytes = b""
    # The cluster's name: with the secret it makes the cluster id (peer_auth.cluster_id_for).
    cluster_name: str = "rallypoint"
    tick_ms: int = 100
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    snapshot_entries: int = 10_000
    # Entries kept behind a snapshot so a briefly lagging follower catches up from the log.
    snapshot_catchup_entries: int = 5_000
    # The largest snapshot this member accepts from a peer.
    max_snapshot_bytes: int = 8 * 1024**3
    limits: Limits = field(default_factory=Limits)
    wal_segment_size_bytes: int = 64 * 1024 * 1024
    pre_vote: bool = True
    check_quorum: bool = True
    # After becoming leader, no worker is declared failed for this long: heartbeats need a
    # moment to find the new leader.
    detector_grace_ms: int = 2000

    @property
    def cluster_id(self) -> int:
        return cluster_id_for(self.peer_secret, self.cluster_name)

    def validate(self) -> None:
        if len(self.peer_secret) < 16:
            raise ValueError(
                "a peer secret of at least 16 bytes is required (make one with "
                "`rallypoint secret > FILE` and give every member --peer-secret-file=FILE)"
            )
        if self.member_id <= 0:
            raise ValueError(f"member id must be a positive integer, got {self.member_id}")
        if self.tick_ms <= 0 or self.heartbeat_ticks <= 0:
            raise ValueError("tick_ms and heartbeat_ticks must be positive")
        if self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("election_ticks must be greater than heartbeat_ticks")
        if (
            not self.join_existing
            and self.initial_members
            and self.member_id not in self.initial_members
        ):
            raise ValueError(
                f"member {self.member_id} is not in the initial cluster "
                f"{sorted(self.initial_members)}"
            )


@dataclass
class _ReadBatch:
    context: bytes
    futures: list[asyncio.Future[None]]
    issued_at_s: float


class Node:
    """A member of a rallypoint cluster; implements ``node_api.ServerNode``."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        peer_tls: PeerTls | None = None,
    ) -> None:
        config.validate()
        self._peer_tls = peer_tls
        self.config = config
        self._peer_key = PeerKey(config.peer_secret)
        self._cluster_id = config.cluster_id
        # Settled in start(); see identity.py.
        self._identity: Identity | None = None
        # The incarnation each peer last sent with (in memory: for the log line when a peer
        # comes back with a new data directory).
        self._peer_incarnations: dict[int, int] = {}
        self._on_fatal = on_fatal or _exit_on_fatal
        self._rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        self._storage: DiskStorage | None = None
        self._raw: RawNode | None = None
        self._sm = StateMachine(config.limits)
        self._members = MemberTable(dict(config.initial_members))
        self._conf_state = ConfState()
        self._lessor = Lessor(lambda: int(time.monotonic() * 1000))
        self.metrics = NodeMetrics(config.member_id)
        self._soft_state = SoftState(NONE, StateType.FOLLOWER)
        self._role_log = RoleLog(config.member_id, time.monotonic, log, pre_vote=config.pre_vote)
        # The member this leader is handing leadership to, if it started a transfer.
        self._transfer_target = NONE
        self._term = Term(0)
        self._commit_index = Index(0)
        # The only thread that touches the WAL and snapshot files (DiskStorage's disk half).
        self._disk = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rp-disk")
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._proposal_ids = itertools.count(1)
        # Callers waiting for their entry to apply. Invariant: keys are proposal ids that
        # this member proposed and has not yet applied or given up on.
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._read_queue: list[asyncio.Future[None]] = []
        self._read_inflight: _ReadBatch | None = None
        # ReadIndex answers waiting for the applied index to reach theirs.
        self._reads_waiting_apply: list[tuple[int, list[asyncio.Future[None]]]] = []
        self._read_contexts = itertools.count(1)
        self._applied_signal = asyncio.Event()
        self._leader_signal = asyncio.Event()
        self._snapshot_requests: list[asyncio.Future[int]] = []
        channel_factory = None
        if peer_tls is not None:
            credentials = peer_tls.channel_credentials()
            channel_factory = lambda address: grpc.aio.secure_channel(  # noqa: E731
                address, credentials, options=GRPC_OPTIONS
            )
        self._transport = Transport(self, self._rng, channel_factory)
        self.supervisor = RendezvousSupervisor(
            self._sm,
            lambda command: self.propose(command, timeout_s=5.0),
            wall_clock_ms,
            grace_ms=config.detector_grace_ms,
            metrics=self.metrics,
        )
        self._peer_server: grpc.aio.Server | None = None
        self._stopping = False
        self.removed = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open storage (refusing to start on corruption or on another member's data
        directory), settle this member's identity, restore, and begin serving peers."""
        loop = asyncio.get_running_loop()
        config = self.config
        os.makedirs(config.data_dir, exist_ok=True)
        found = await loop.run_in_executor(self._disk, identity_file.load, config.data_dir)
        if found is not None:
            identity_file.check(found, self.cluster_id, config.member_id, config.data_dir)
        storage = await loop.run_in_executor(
            self._disk,
            lambda: DiskStorage.open(
                os.path.join(config.data_dir, "raft"),
                segment_size_bytes=config.wal_segment_size_bytes,
                policy=SnapshotPolicy(entries_per_snapshot=self._snapshot_interval()),
            ),
        )
        self._storage = storage
        incoming = self.incoming_snapshot_dir()
        removed = await loop.run_in_executor(self._disk, remove_partial_snapshots, incoming)
        if removed:
            log.info(
                "member %d removed %d unfinished snapshot transfers", config.member_id, removed
            )
        # Serve the peer port first: members asking Hello need an answer while this one
        # may itself be asking them (every member of a new cluster starts at once).
        await self._start_peer_server()
        if self._is_fresh(storage):
            identity = await self._begin_from_empty_storage(storage, found)
        elif found is None:
            # A data directory from before identities were recorded: it is trusted as is.
            identity = Identity.new(self.cluster_id, config.member_id, abstaining=False)
        else:
            identity = found
        identity = identity.started()
        await loop.run_in_executor(self._disk, identity_file.save, config.data_dir, identity)
        self._identity = identity
        # Unique across restarts: a committed entry of an earlier life never resolves a
        # waiter of this one (both key on the id).
        self._proposal_ids = itertools.count(((identity.boots % (1 << 23)) << 40) + 1)
        snapshot = storage.snapshot()
        if not snapshot.is_empty():
            self._install_snapshot(snapshot)
        hard_state, _ = storage.initial_state()
        self._term = hard_state.term
        self._commit_index = hard_state.commit
        self._raw = RawNode(
            Config(
                id=NodeId(config.member_id),
                storage=_LeaderSnapshots(storage, self._snapshot_for_follower),
                rng=self._rng,
                election_tick=config.election_ticks,
                heartbeat_tick=config.heartbeat_ticks,
                applied=Index(snapshot.metadata.index),
                check_quorum=config.check_quorum,
                pre_vote=config.pre_vote,
                max_inflight_msgs=256,
                max_uncommitted_entries_size=1 << 30,
                # Committed entries handed out per Ready, so applied per event-loop turn: a
                # member replaying or catching up on thousands of small entries still ticks
                # and answers between chunks (one 1 MiB Ready of small entries took seconds).
                max_committed_size_per_ready=64 * 1024,
                abstain=identity.abstaining,
                logger=logging.getLogger(f"rallypoint.raft.{config.member_id}"),
            )
        )
        loops = (self._ready_loop(), self._tick_loop(), self._lease_loop(), self.supervisor.run())
        for coro in loops:
            self._tasks.append(loop.create_task(self._guard(coro)))
        self._wakeup.set()
        log.info(
            "member %d started: peers at %s, data in %s, applied %d, term %d, incarnation %016x%s",
            config.member_id,
            config.peer_address,
            config.data_dir,
            self._sm.applied_index,
            self._term,
            identity.incarnation,
            " (not voting until caught up)" if identity.abstaining else "",
        )

    async def _start_peer_server(self) -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        add_peer_service(server, self)
        if self._peer_tls is not None:
            server.add_secure_port(self.config.peer_address, self._peer_tls.server_credentials())
        else:
            server.add_insecure_port(self.config.peer_address)
        await server.start()
        self._peer_server = server

    async def _begin_from_empty_storage(
        self, storage: DiskStorage, found: Identity | None
    ) -> Identity:
        """A new incarnation for a member whose storage holds nothing of a cluster yet: it
        creates the cluster with the other initial members, or (the cluster exists) it lost
        its data or is joining, and abstains until caught up. See peer_hello.py."""
        config = self.config
        boots = 0 if found is None else found.boots
        if config.join_existing:
            log.info(
                "member %d joins an existing cluster: it does not vote until it has caught up",
                config.member_id,
            )
            return Identity.new(self.cluster_id, config.member_id, abstaining=True, boots=boots)
        if not config.initial_members:
            raise NodeStartError(
                f"{config.data_dir} holds no cluster state: give the initial members to "
                "create a cluster, or join an existing one"
            )
        peers = {
            i: a.peer_address for i, a in config.initial_members.items() if i != config.member_id
        }
        outcome = await ask_peers(
            config.member_id, self.cluster_id, self._peer_key, peers, self._transport.channel
        )
        if outcome.established and not outcome.knows_me:
            raise NodeStartError(
                f"member {config.member_id} is not in the configuration of the running "
                f"cluster (member {outcome.answered_by} says so): add it with `rallypoint "
                f"member add {config.peer_address} {config.client_address} --learner`, then "
                "start it with --join"
            )
        if outcome.established:
            log.warning(
                "member %d: its storage is empty but the cluster exists (member %d says so): "
                "it lost its data and rejoins as a new incarnation, without voting until it "
                "has caught up",
                config.member_id,
                outcome.answered_by,
            )
        identity = Identity.new(
            self.cluster_id, config.member_id, abstaining=outcome.established, boots=boots
        )
        if self._is_blank(storage):
            await self._bootstrap(storage)
        return identity

    def _snapshot_interval(self) -> int:
        """Entries between this member's snapshots: the configured count, stretched by up to
        30% depending on the member id, so members do not all pause to snapshot at once."""
        entries = self.config.snapshot_entries
        return entries + entries * ((self.config.member_id - 1) % 4) // 10

    @staticmethod
    def _is_fresh(storage: DiskStorage) -> bool:
        """Nothing beyond the cluster's creation: no election, no entry after index 1."""
        return (
            storage.last_index() <= 1
            and storage.snapshot().metadata.index <= 1
            and storage.hard_state.term <= 1
        )

    @staticmethod
    def _is_blank(storage: DiskStorage) -> bool:
        return (
            storage.last_index() == 0
            and storage.snapshot().is_empty()
            and storage.hard_state.is_empty()
        )

    async def _bootstrap(self, storage: DiskStorage) -> None:
        """Create the cluster: every initial member writes the same snapshot at index 1,
        holding the configuration and the address book, so all start from one state."""
        voters = tuple(sorted(NodeId(i) for i in self.config.initial_members))
        sm = StateMachine(self.config.limits)
        data = encode_app_snapshot(MemberTable(dict(self.config.initial_members)), sm.snapshot())
        snapshot = Snapshot(data, SnapshotMetadata(ConfState(voters=voters), Index(1), Term(1)))
        request = PersistRequest(HardState(Term(1), NONE, Index(1)), (), snapshot)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._disk, storage.write_batch, [request])
        storage.apply_batch([request])
        log.info("member %d created a cluster of %s", self.config.member_id, list(voters))

    async def stop(self, *, transfer_leadership: bool = True) -> None:
        """Stop serving; a leader first hands leadership to the most up-to-date voter."""
        if self._stopping:
            return
        if transfer_leadership and self._raw is not None and self.is_leader():
            with contextlib.suppress(NodeError, asyncio.TimeoutError):
                await self.transfer_leader(0, timeout_s=3.0)
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._transport.stop()
        if self._peer_server is not None:
            await self._peer_server.stop(grace=0.5)
        self._fail_waiters(NodeError("this member is shutting down"))
        if self._storage is not None:
            storage = self._storage
            await asyncio.get_running_loop().run_in_executor(self._disk, storage.close)
        self._disk.shutdown(wait=True)
        log.info("member %d stopped", self.config.member_id)

    def _spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background, referenced until it finishes (the event loop keeps
        only weak references to tasks)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _guard(self, coro: Any) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a broken invariant: never continue
            log.critical("member %d: fatal error: %r", self.config.member_id, exc, exc_info=exc)
            self._on_fatal(exc)
            raise

    # ---------------------------------------------------------------- the Ready loop

    @property
    def raw(self) -> RawNode:
        assert self._raw is not None, "the member is not started"
        return self._raw

    async def _ready_loop(self) -> None:
        raw = self.raw
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while raw.has_ready():
                await self._handle_ready(raw.ready())
                # Let ticks and peers' messages in between Readies: a member applying a long
                # backlog (catching up after a restart) must still notice a dead leader on
                # time, not after the backlog (its election timer counts ticks).
                await asyncio.sleep(0)
            if self._snapshot_requests:
                await self._snapshot(force=True)

    async def _handle_ready(self, rd: Ready) -> None:
        storage = self._storage
        assert storage is not None
        raw = self.raw
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state)
        if not rd.hard_state.is_empty():
            if rd.hard_state.term != self._term:
                self._term = rd.hard_state.term
                self.metrics.term.set(self._term)
            self._commit_index = rd.hard_state.commit
        # The Ready contract (raft/rawnode.py): messages that vouch for nothing unpersisted
        # go now (a leader replicates while it writes, thesis 10.2.1; a follower answers
        # heartbeats while a long catch-up is written), votes and acks once persisted.
        self._transport.send(rd.messages)
        if rd.entries or not rd.hard_state.is_empty() or not rd.snapshot.is_empty():
            request = PersistRequest(rd.hard_state, rd.entries, rd.snapshot, rd.must_sync)
            started = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(
                self._disk, storage.write_batch, [request]
            )
            self.metrics.fsync_seconds.observe(time.monotonic() - started)
            storage.apply_batch([request])
        self._transport.send(rd.messages_after_persist)
        if not rd.snapshot.is_empty():
            self._install_snapshot(rd.snapshot)
        for read_state in rd.read_states:
            self._on_read_state(read_state)
        for entry in rd.committed_entries:
            self._apply(entry)
        raw.advance(rd)
        if raw.abstaining and (rd.committed_entries or not rd.hard_state.is_empty()):
            await self._maybe_stop_abstaining()
        if rd.committed_entries or not rd.snapshot.is_empty():
            self._after_apply()
            if storage.should_snapshot(Index(self._sm.applied_index)):
                await self._snapshot(force=False)

    async def _maybe_stop_abstaining(self) -> None:
        """A member that lost its data votes again once its log holds, at the commit index,
        an entry of the current term from the leader it follows: that leader's own entry is
        committed, so every entry committed before it is in this log too (the Leader
        Completeness property, thesis 3.6.3). The flag is cleared on disk first."""
        storage = self._storage
        assert storage is not None and self._identity is not None
        commit = self._commit_index
        if self._soft_state.lead == NONE or commit == 0:
            return
        try:
            committed_term = storage.term(commit)
        except (CompactedError, UnavailableError):
            return
        if committed_term != self._term:
            return
        identity = dataclasses.replace(self._identity, abstaining=False)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._disk, identity_file.save, self.config.data_dir, identity)
        self._identity = identity
        self.raw.set_abstain(False)
        log.warning(
            "member %d has caught up (commit %d of term %d from leader %d): it votes again",
            self.member_id,
            commit,
            self._term,
            self._soft_state.lead,
        )

    def _on_soft_state(self, soft: SoftState) -> None:
        old = self._soft_state
        self._soft_state = soft
        self._role_log.observe(soft, self.raw.basic_status().hard_state.term, self._transfer_target)
        if soft.raft_state is not StateType.LEADER:
            self._transfer_target = NONE
        if soft.lead != old.lead:
            self.metrics.leader_changes.inc()
            # An entry proposed through the old leader may or may not commit: tell callers
            # now rather than at their deadline. A retry with the same (session, sequence)
            # is answered from the session cache if it did apply.
            self._fail_waiters(self._not_leader_error(soft.lead))
            self._requeue_reads()
            self._leader_signal.set()
            self._leader_signal = asyncio.Event()
        was_leader = old.raft_state is StateType.LEADER
        is_leader = soft.raft_state is StateType.LEADER
        if is_leader and not was_leader:
            self._lessor.promote()
            self.supervisor.promote()
        elif was_leader and not is_leader:
            self._lessor.demote()
            self.supervisor.demote()
        self.metrics.is_leader.set(1 if is_leader else 0)

    def _apply(self, entry: Entry) -> None:
        if entry.type is EntryType.CONF_CHANGE:
            self._apply_conf_change(entry)
            return
        if not entry.data:
            self._sm.apply(entry.index, b"")
            return
        proposer_id, proposal_id, payload = _unwrap(entry.data)
        result = self._sm.apply(entry.index, payload)
        if isinstance(result, LeaseGrantResult):
            self._lessor.grant(result.lease_id, result.ttl_ms)
        elif isinstance(result, LeaseEndResult):
            self._lessor.forget(result.lease_id)
        if proposer_id == self.config.member_id:
            self._resolve(proposal_id, result)

    def _apply_conf_change(self, entry: Entry) -> None:
        cc = decode_conf_change(entry.data)
        self._conf_state = self.raw.apply_conf_change(cc)
        context = ConfChangeContext.decode(cc.context)
        for change in cc.changes:
            self._members.note_id(change.node_id)
            if change.type is ConfChangeType.REMOVE_NODE:
                self._members.remove(change.node_id)
                self._spawn(self._transport.remove_peer(change.node_id))
                if change.node_id == self.config.member_id:
                    self.removed = True
                    log.warning("member %d was removed from the cluster", change.node_id)
            elif context.peer_address:
                self._members.set(
                    change.node_id, MemberAddress(context.peer_address, context.client_address)
                )
        if context.proposer_id == self.config.member_id:
            self._resolve(context.proposal_id, self._conf_state)

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        members, state = decode_app_snapshot(snapshot.data)
        self._sm.restore(state)
        # The snapshot's state is as of its index even if no entry at it touched the state.
        self._sm.applied_index = max(self._sm.applied_index, snapshot.metadata.index)
        members.note_id(self._members.highest_id)  # a snapshot never lowers it
        self._members = members
        for member_id, address in self.config.initial_members.items():
            if self._members.get(member_id) is None and self.config.join_existing:
                self._members.set(member_id, address)
        self._conf_state = snapshot.metadata.conf_state
        self._lessor.sync(self._sm.lease_list())

    def _after_apply(self) -> None:
        applied = self._sm.applied_index
        self.metrics.applied_index.set(applied)
        self.metrics.commit_index.set(self._commit_index)
        self.metrics.sessions.set(len(self._sm.sessions.in_order()))
        self.metrics.leases.set(len(self._sm.leases.in_order()))
        still_waiting = []
        for index, futures in self._reads_waiting_apply:
            if index <= applied:
                for future in futures:
                    if not future.done():
                        future.set_result(None)
            else:
                still_waiting.append((index, futures))
        self._reads_waiting_apply = still_waiting
        self._applied_signal.set()
        self._applied_signal = asyncio.Event()

    async def _snapshot(self, *, force: bool) -> None:
        storage = self._storage
        assert storage is not None
        applied = Index(self._sm.applied_index)
        requests, self._snapshot_requests = self._snapshot_requests, []
        current = storage.snapshot().metadata.index
        if applied > current:
            loop = asyncio.get_running_loop()
            # Encoding a large state takes a while: do it on the disk thread so the event loop
            # keeps serving. Nothing changes the state meanwhile: only this loop applies.
            state = await loop.run_in_executor(self._disk, self._sm.snapshot)
            data = encode_app_snapshot(self._members, state)
            snapshot = storage.prepare_snapshot(applied, self._conf_state, data)
            await loop.run_in_executor(self._disk, storage.write_snapshot, snapshot)
            storage.memory.create_snapshot(applied, self._conf_state, data)
            compact_to = Index(max(0, applied - self.config.snapshot_catchup_entries))
            if compact_to > storage.memory.first_index():
                storage.memory.compact(compact_to)
                await loop.run_in_executor(self._disk, storage.release_log, compact_to)
            log.info("member %d: snapshot at %d", self.config.member_id, applied)
            current = applied
        for future in requests:
            if not future.done():
                future.set_result(int(current))

    def _snapshot_for_follower(self) -> Snapshot:
        """The snapshot Raft sends a follower that needs compacted entries.

        The newest stored snapshot may predate the configuration that added the follower
        (the cluster's first snapshot never names a member added later), and a follower
        ignores a snapshot whose configuration leaves it out. Then an up-to-date one is
        made in memory at the applied index: it is sent, not stored.
        """
        storage = self._storage
        assert storage is not None
        stored = storage.snapshot()
        if stored.metadata.conf_state == self._conf_state:
            return stored
        applied = Index(self._sm.applied_index)
        data = encode_app_snapshot(self._members, self._sm.snapshot())
        metadata = SnapshotMetadata(self._conf_state, applied, storage.term(applied))
        return Snapshot(data, metadata)

    # ---------------------------------------------------------------- timers

    async def _tick_loop(self) -> None:
        interval_s = self.config.tick_ms / 1000
        election_s = interval_s * self.config.election_ticks
        while True:
            await asyncio.sleep(interval_s)
            self.raw.tick()
            self._role_log.check_leaderless()
            batch = self._read_inflight
            if batch is not None and time.monotonic() - batch.issued_at_s > election_s:
                self._requeue_reads()  # the ReadIndex request was lost: ask again
            self._wakeup.set()

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(min(0.1, self.config.tick_ms / 1000))
            for lease_id in self._lessor.expired():
                self._spawn(self._expire_lease(lease_id))

    async def _expire_lease(self, lease_id: int) -> None:
        with contextlib.suppress(NodeError):
            await self.propose(LeaseExpire(lease_id), timeout_s=5.0)

    # ---------------------------------------------------------------- PeerHost

    @property
    def member_id(self) -> int:
        return self.config.member_id

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def peer_key(self) -> PeerKey:
        return self._peer_key

    @property
    def incarnation(self) -> int:
        return 0 if self._identity is None else self._identity.incarnation

    @property
    def abstaining(self) -> bool:
        return self._raw is None or self._raw.abstaining

    @property
    def accepts_traffic(self) -> bool:
        """False until the Raft node runs (while this member asks Hello, say)."""
        return self._raw is not None and not self._stopping

    @property
    def peer_names_required(self) -> bool:
        """With TLS on the peer port, a peer's certificate must name it (peer_auth.py)."""
        return self._peer_tls is not None

    def hello_answer(self, from_id: int) -> tuple[bool, bool, int, int]:
        """(established, knows the asker, term, last index) for peer_hello.py."""
        storage = self._storage
        if storage is None:
            return False, False, 0, 0
        established = not self._is_fresh(storage)
        conf = self._conf_state
        in_conf = from_id in set(conf.voters) | set(conf.learners) | set(conf.voters_outgoing)
        knows = in_conf or self._members.get(from_id) is not None
        return established, knows, int(storage.hard_state.term), int(storage.last_index())

    def deliver(
        self, messages: list[Message], incarnation: int = 0, abstaining: bool = False
    ) -> None:
        """Step authenticated messages from one peer into Raft. The votes of a peer that
        says it abstains (it lost its data and has not caught up) are dropped here too, in
        case its Raft node sent them anyway. A message the core refuses as expected (from a
        peer it does not know, a local type, or a proposal forwarded to this member after it
        stopped leading, which the proposer's timeout covers) is dropped; anything else it
        raises is a broken invariant and stops the member."""
        raw = self.raw
        if messages and incarnation:
            self._note_incarnation(int(messages[0].from_), incarnation)
        for message in messages:
            if abstaining and message.type in _VOTE_TRAFFIC:
                log.debug(
                    "member %d: dropped %s from abstaining member %d",
                    self.member_id,
                    message.type.name,
                    message.from_,
                )
                continue
            try:
                raw.step(message)
            except (StepPeerNotFoundError, StepLocalMsgError, RaftProposalDroppedError) as exc:
                log.debug("member %d dropped %s: %s", self.member_id, message.type.name, exc)
            except BaseException as exc:
                log.critical(
                    "member %d: fatal error stepping %s from member %d: %r",
                    self.member_id,
                    message.type.name,
                    message.from_,
                    exc,
                    exc_info=exc,
                )
                self._on_fatal(exc)
                raise
        self._wakeup.set()

    def _note_incarnation(self, peer_id: int, incarnation: int) -> None:
        previous = self._peer_incarnations.get(peer_id)
        self._peer_incarnations[peer_id] = incarnation
        if previous is not None and previous != incarnation:
            log.warning(
                "member %d: member %d came back with a new data directory (incarnation %016x, "
                "was %016x)",
                self.member_id,
                peer_id,
                incarnation,
                previous,
            )

    def peer_address(self, member_id: int) -> str | None:
        address = self._members.get(member_id)
        return None if address is None else address.peer_address

    def report_unreachable(self, member_id: int) -> None:
        self.raw.report_unreachable(NodeId(member_id))
        self._wakeup.set()

    def report_snapshot(self, member_id: int, ok: bool) -> None:
        status = SnapshotStatus.FINISH if ok else SnapshotStatus.FAILURE
        self.raw.report_snapshot(NodeId(member_id), status)
        self._wakeup.set()

    def incoming_snapshot_dir(self) -> str:
        return os.path.join(self.config.data_dir, "incoming")

    def validate_entries(self, entries: tuple[Entry, ...]) -> None:
        """Raise ValueError unless every entry a peer sent would apply: a normal entry is
        the leader's no-op or a wrapped command this version decodes, a configuration
        change decodes with its context. (Applying a committed entry that does not decode
        stops every member that reaches it, so it must never be persisted.)"""
        for entry in entries:
            if entry.type is EntryType.CONF_CHANGE:
                ConfChangeContext.decode(decode_conf_change(entry.data).context)
            elif entry.data:
                if len(entry.data) < _ENTRY_HEADER.size:
                    raise ValueError(f"entry {entry.index} is too short for its header")
                version = entry.data[0]
                if version != _ENTRY_VERSION:
                    raise ValueError(f"entry {entry.index} has unknown version {version}")
                decode_envelope(entry.data[_ENTRY_HEADER.size :])

    @property
    def max_snapshot_bytes(self) -> int:
        return self.config.max_snapshot_bytes

    def verify_snapshot(self, snapshot: Snapshot) -> None:
        """Raise ValueError unless a received snapshot decodes and names a sane
        configuration (run off the event loop: decoding a large state takes a while)."""
        conf = snapshot.metadata.conf_state
        if snapshot.metadata.index < 1 or snapshot.metadata.term < 1:
            raise ValueError("a snapshot's index and term start at 1")
        if not conf.voters:
            raise ValueError("its configuration has no voter")
        members, state = decode_app_snapshot(snapshot.data)
        StateMachine(self.config.limits).restore(state)  # raises StateCodecError if malformed
        missing = [v for v in conf.voters if members.get(v) is None]
        if missing:
            raise ValueError(f"its member table lacks the addresses of voters {missing}")

    # ---------------------------------------------------------------- ServerNode

    @property
    def state(self) -> StateMachine:
        return self._sm

    def is_leader(self) -> bool:
        return self._soft_state.raft_state is StateType.LEADER

    @property
    def leader_id(self) -> int:
        return int(self._soft_state.lead)

    def header(self) -> Header:
        return Header(
            revision=self._sm.revision,
            raft_term=int(self._term),
            leader_id=self.leader_id,
            member_id=self.member_id,
        )

    def _not_leader_error(self, lead: int) -> NotLeaderError:
        if lead == NONE:
            return NoLeaderError()
        address = self._members.get(lead)
        return NotLeaderError(lead, None if address is None else address.client_address)

    def _require_leader(self) -> None:
        if not self.is_leader():
            raise self._not_leader_error(self.leader_id)

    async def propose(
        self,
        command: Command,
        *,
        session_id: int = 0,
        sequence: int = 0,
        first_unacked: int = 0,
        timeout_s: float = 5.0,
    ) -> Result:
        if self.leader_id == NONE:
            raise NoLeaderError()
        envelope = Envelope(session_id, sequence, first_unacked, wall_clock_ms(), command)
        proposal_id = next(self._proposal_ids)
        data = _wrap(self.member_id, proposal_id, encode_envelope(envelope))
        started = time.monotonic()
        result: Result = await self._propose_and_wait(
            proposal_id, lambda: self.raw.propose(data), timeout_s
        )
        self.metrics.proposal_seconds.observe(time.monotonic() - started)
        return result

    async def _propose_and_wait(
        self, proposal_id: int, submit: Callable[[], None], timeout_s: float
    ) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[proposal_id] = future
        try:
            try:
                submit()
            except RaftProposalDroppedError as exc:
                raise ProposalDroppedError(f"proposal dropped: {exc}") from None
            self._wakeup.set()
            try:
                return await asyncio.wait_for(future, timeout_s)
            except TimeoutError:
                raise ProposalTimeoutError(
                    f"not applied within {timeout_s:.1f}s (it may still apply)"
                ) from None
        finally:
            self._waiters.pop(proposal_id, None)

    def _resolve(self, proposal_id: int, value: Any) -> None:
        future = self._waiters.pop(proposal_id, None)
        if future is not None and not future.done():
            future.set_result(value)

    def _fail_waiters(self, error: Exception) -> None:
        waiters, self._waiters = self._waiters, {}
        for future in waiters.values():
            if not future.done():
                future.set_exception(error)
        reads = self._read_queue
        self._read_queue = []
        if isinstance(error, NotLeaderError) and error.leader_id != NONE:
            self._read_queue = reads  # reads are re-asked of the new leader
            return
        for future in reads:
            if not future.done():
                future.set_exception(error)

    async def read_barrier(self, timeout_s: float = 5.0) -> None:
        if UNSAFE_STALE_READS:
            return
        if self.leader_id == NONE:
            raise NoLeaderError()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._read_queue.append(future)
        self._issue_read()
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise ProposalTimeoutError(
                f"linearizable read not confirmed within {timeout_s:.1f}s"
            ) from None

    def _issue_read(self) -> None:
        """Ask for one ReadIndex covering every read queued since the last one was asked:
        each read waits for a confirmation that started after it did."""
        if self._read_inflight is not None or not self._read_queue:
            return
        context = next(self._read_contexts).to_bytes(8, "big")
        self._read_inflight = _ReadBatch(context, self._read_queue, time.monotonic())
        self._read_queue = []
        self.raw.read_index(context)
        self._wakeup.set()

    def _requeue_reads(self) -> None:
        batch, self._read_inflight = self._read_inflight, None
        if batch is not None:
            self._read_queue = batch.futures + self._read_queue
        if self.leader_id != NONE:
            self._issue_read()

    def _on_read_state(self, read_state: ReadState) -> None:
        batch = self._read_inflight
        if batch is None or read_state.request_ctx != batch.context:
            return
        self._read_inflight = None
        if read_state.index <= self._sm.applied_index:
            for future in batch.futures:
                if not future.done():
                    future.set_result(None)
        else:
            self._reads_waiting_apply.append((read_state.index, batch.futures))
        self._issue_read()

    async def watch(
        self, start_revision: int, key: bytes, prefix: bool
    ) -> AsyncIterator[list[Event]]:
        next_revision = start_revision if start_revision > 0 else self._sm.applied_index + 1
        while True:
            signal = self._applied_signal
            found = self._sm.events_since(next_revision, key, prefix)
            if isinstance(found, Compacted):
                raise CompactedWatchError(next_revision, found.first_available_revision)
            batch: list[Event] = []
            for event in found:
                if batch and event.revision != batch[-1].revision:
                    yield batch
                    batch = []
                batch.append(event)
            if batch:
                yield batch
                next_revision = batch[-1].revision + 1
                continue
            if self._stopping:
                return
            await signal.wait()

    def lease_keep_alive(self, lease_id: int) -> int | None:
        self._require_leader()
        return self._lessor.keep_alive(lease_id)

    def lease_remaining_ms(self, lease_id: int) -> int | None:
        self._require_leader()
        return self._lessor.remaining_ms(lease_id)

    def heartbeat(
        self, job: str, participant_id: int, progress: ProgressReport | None = None
    ) -> bool:
        self._require_leader()
        return self.supervisor.heartbeat(job, participant_id, progress)

    def progress_of(self, job: str, participant_id: int) -> tuple[int, float, float] | None:
        return self.supervisor.progress_of(job, participant_id) if self.is_leader() else None

    def heartbeat_stream_closed(self, job: str, participant_id: int) -> None:
        if self.is_leader():
            self.supervisor.stream_closed(job, participant_id)

    def phi(self, job: str, participant_id: int) -> float | None:
        return self.supervisor.phi(job, participant_id) if self.is_leader() else None

    def leader_clock_ms(self) -> int:
        return wall_clock_ms()

    async def wait_for_apply(self, timeout_s: float) -> bool:
        signal = self._applied_signal
        try:
            await asyncio.wait_for(signal.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def status(self) -> NodeStatus:
        raw_status = self.raw.status()
        learners = set(self._conf_state.learners) | set(self._conf_state.learners_next)
        members = tuple(
            Member(member_id, address.peer_address, address.client_address, member_id in learners)
            for member_id, address in self._members.items()
        )
        progress = tuple(
            PeerProgress(
                member_id=int(peer_id),
                match_index=int(pr.match),
                next_index=int(pr.next),
                state=pr.state.name.lower(),
                recent_active=bool(pr.recent_active),
            )
            for peer_id, pr in sorted(raw_status.progress.items())
        )
        storage = self._storage
        assert storage is not None
        return NodeStatus(
            member_id=self.member_id,
            cluster_id=self.cluster_id,
            term=int(raw_status.hard_state.term),
            leader_id=int(raw_status.soft_state.lead),
            role=ROLE_NAMES[raw_status.soft_state.raft_state],
            commit_index=int(raw_status.hard_state.commit),
            applied_index=int(raw_status.applied),
            snapshot_index=int(storage.snapshot().metadata.index),
            members=members,
            progress=progress,
            abstaining=self.raw.abstaining,
        )

    # ---------------------------------------------------------------- membership

    async def _propose_conf_change(
        self, changes: tuple[ConfChangeSingle, ...], context: ConfChangeContext, timeout_s: float
    ) -> ConfState:
        self._require_leader()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # Raft takes one change at a time. The previous one may be committed and even
        # answered but not yet marked applied (that happens when its Ready is advanced), or
        # a new leader's no-op may not be applied yet: wait for that rather than refuse a
        # caller who made two changes in a row.
        while self.raw.basic_status().conf_change_pending():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ProposalDroppedError("another membership change is still in progress")
            await self.wait_for_apply(min(remaining, 0.05))
            self._require_leader()
        cc = ConfChange(changes, context=context.encode())
        state: ConfState = await self._propose_and_wait(
            context.proposal_id,
            lambda: self.raw.propose_conf_change(cc),
            max(0.0, deadline - loop.time()),
        )
        return state

    def _member(self, member_id: int) -> Member:
        address = self._members.get(member_id)
        if address is None:
            raise MemberNotFoundError(member_id)
        learners = set(self._conf_state.learners) | set(self._conf_state.learners_next)
        return Member(
            member_id, address.peer_address, address.client_address, member_id in learners
        )

    async def member_add(
        self, peer_address: str, client_address: str, as_learner: bool, timeout_s: float = 10.0
    ) -> Member:
        self._require_leader()
        for member_id, address in self._members.items():
            if address.peer_address == peer_address:
                # A retried add (its answer was lost): the member is already there.
                if address.client_address != client_address:
                    raise ProposalDroppedError(
                        f"member {member_id} already uses peer address {peer_address}"
                    )
                return self._member(member_id)
        known = set(self._members.ids()) | set(self._conf_state.voters)
        known |= set(self._conf_state.learners)
        # Never an id used before, even one since removed (see members.py).
        new_id = max(max(known, default=0) + 1, self._members.next_id())
        kind = ConfChangeType.ADD_LEARNER_NODE if as_learner else ConfChangeType.ADD_NODE
        context = ConfChangeContext(
            peer_address, client_address, self.member_id, next(self._proposal_ids)
        )
        await self._propose_conf_change(
            (ConfChangeSingle(kind, NodeId(new_id)),), context, timeout_s
        )
        return self._member(new_id)

    async def member_remove(self, member_id: int, timeout_s: float = 10.0) -> None:
        self._member(member_id)
        context = ConfChangeContext(
            proposer_id=self.member_id, proposal_id=next(self._proposal_ids)
        )
        await self._propose_conf_change(
            (ConfChangeSingle(ConfChangeType.REMOVE_NODE, NodeId(member_id)),), context, timeout_s
        )

    async def member_promote(self, member_id: int, timeout_s: float = 10.0) -> Member:
        """Learner to voter, on the leader, once the learner's log has caught up (a lagging
        new voter would weaken the quorum until it did)."""
        self._require_leader()
        member = self._member(member_id)
        if not member.is_learner:
            raise ProposalDroppedError(f"member {member_id} is already a voter")
        progress = self.raw.status().progress
        leader_last = int(progress[NodeId(self.member_id)].match)
        learner = progress.get(NodeId(member_id))
        match = int(learner.match) if learner is not None else 0
        if match * 100 < leader_last * PROMOTE_READY_PERCENT:
            raise LearnerNotReadyError(member_id, match, leader_last)
        context = ConfChangeContext(
            proposer_id=self.member_id, proposal_id=next(self._proposal_ids)
        )
        await self._propose_conf_change(
            (ConfChangeSingle(ConfChangeType.ADD_NODE, NodeId(member_id)),), context, timeout_s
        )
        return self._member(member_id)

    async def transfer_leader(self, target_id: int, timeout_s: float = 10.0) -> int:
        self._require_leader()
        if target_id == 0:
            progress = self.raw.status().progress
            candidates = [
                (int(pr.match), int(peer))
                for peer, pr in progress.items()
                if peer != self.member_id and peer in self._conf_state.voters
            ]
            if not candidates:
                raise ProposalDroppedError("no other voter to hand leadership to")
            target_id = max(candidates)[1]
        elif target_id not in self._conf_state.voters:
            raise MemberNotFoundError(target_id)
        if target_id == self.member_id:
            return target_id
        self._transfer_target = NodeId(target_id)
        self.raw.transfer_leader(NodeId(target_id))
        self._wakeup.set()
        deadline = time.monotonic() + timeout_s
        while self.leader_id != target_id:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProposalTimeoutError(
                    f"leadership did not move to member {target_id} within {timeout_s:.1f}s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._leader_signal.wait(), remaining)
        return target_id

    async def snapshot_now(self) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._snapshot_requests.append(future)
        self._wakeup.set()
        return await future

    async def wait_for_leader(self, timeout_s: float) -> int:
        """Wait until some leader is known; return its id (for tools and tests)."""
        deadline = time.monotonic() + timeout_s
        while self.leader_id == NONE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoLeaderError()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._leader_signal.wait(), remaining)
        return self.leader_id


class _LeaderSnapshots:
    """The Storage Raft reads: DiskStorage, except that the snapshot it hands a follower
    comes from ``make_snapshot`` (see ``Node._snapshot_for_follower``)."""

    def __init__(self, storage: DiskStorage, make_snapshot: Callable[[], Snapshot]) -> None:
        self._storage = storage
        self._make_snapshot = make_snapshot

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._storage.initial_state()

    def entries(self, lo: Index, hi: Index, max_size: int | None = None) -> list[Entry]:
        return self._storage.entries(lo, hi, max_size)

    def term(self, index: Index) -> Term:
        return self._storage.term(index)

    def first_index(self) -> Index:
        return self._storage.first_index()

    def last_index(self) -> Index:
        return self._storage.last_index()

    def snapshot(self) -> Snapshot:
        return self._make_snapshot()


def _exit_on_fatal(exc: BaseException) -> None:
    logging.shutdown()
    os._exit(70)
