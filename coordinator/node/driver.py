"""A running member: the asyncio driver around the pure Raft core, and its lifecycle.

Theory of operation. One task, the Ready loop, owns the hand-off between the pure core
(``RawNode``) and the world, in the order the Ready contract demands (``raft/rawnode.py``,
etcd-io/raft's ``rawnode.go``; Raft thesis 10.2):

1. apply the committed entries already durable in this member's log (on a leader, all of
   them: its entries reach followers only in the Ready that writes them): a commit this
   Ready only announces needs no write of its own before the caller is answered (etcd's
   server applies while it saves, too);
2. send ``Ready.messages`` at once: they vouch for nothing unpersisted (a leader replicates
   while it writes, thesis 10.2.1; a follower answers heartbeats during a long catch-up),
   and let the peer senders put them on the wire before the disk thread starts;
3. persist the hard state, entries and snapshot: one WAL write, fsynced only when the Ready
   says ``must_sync``, on a dedicated disk thread so the event loop keeps serving; while it
   runs, new proposals and messages keep entering the core, and the next Ready carries all
   of them to disk with one fsync (group commit);
4. send ``Ready.messages_after_persist`` (votes and append acks: they vouch for what was
   just persisted, thesis 3.8);
5. install a received snapshot into the state machine; resolve ReadIndex requests;
6. apply the remaining committed entries (those this Ready itself wrote): state-machine
   commands, or configuration changes;
7. ``advance``; then start a snapshot in the background when the policy says so.

The core decides what each Ready holds and which messages wait for persistence; this loop
never sorts messages by type, and it reads the core only through ``basic_status()`` and
``status()``. Only this loop mutates the state machine (apply and snapshot install); the
servicers read it through ``StateView``.

Everything else (ticks, messages from peers, proposals from the servicers) only calls into
the core and wakes the loop. The parts live in modules of their own, by seam (etcd's
``etcdserver/raft.go``, ``pkg/wait``, ``server.go``):

- ``node_config``: what a member runs with;
- ``node_bootstrap``: a member's first start (create the cluster, or abstain until caught up);
- ``node_proposals``: entry framing, proposal ids unique per boot, and the waiters that
  answer a caller when its entry applies;
- ``node_reads``: the ReadIndex batcher and the leader lease behind linearizable reads;
- ``node_membership``: the address book, the configuration, and membership changes;
- ``node_snapshots``: periodic snapshots and snapshots for followers, encoded off the loop;
- ``leader/``: the leader's clock-driven soft state (lease deadlines, failure detectors).

This module holds the lifecycle (start, stop), the Ready loop and the apply path,
the timers, and the two faces the rest of the daemon sees: ``PeerHost`` for the peer
service and ``node_api.ServerNode`` for the servicers. The state machine never reads a
clock: the proposing member stamps each command with its wall-clock time
(``Envelope.leader_time_ms``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import grpc.aio

from rallypoint.client.tasks import cancel_and_wait
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
from rallypoint.raft.errors import (
    StepLocalMsgError,
    StepPeerNotFoundError,
    TermOutOfRangeError,
)
from rallypoint.raft.log_storage import CompactedError, UnavailableError
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest, SnapshotPolicy
from rallypoint.raft.types import (
    NONE,
    Entry,
    EntryType,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    Term,
)

from .. import identity as identity_file
from ..identity import Identity
from ..leader.lessor import Lessor
from ..leader.supervisor import RendezvousSupervisor
from ..liveness.port import LivenessPort
from ..member_table import decode_app_snapshot
from ..metrics import NodeMetrics
from ..peer_auth import PeerKey
from ..peer_service import add_peer_service, remove_partial_snapshots
from ..preflight import SERVER_OPTIONS
from ..role_log import ROLE_NAMES, RoleLog
from ..round_metrics import RoundObserver
from ..state.commands import Command, Envelope, LeaseExpire, encode_envelope
from ..state.errors import Compacted
from ..state.machine import StateMachine
from ..state.results import LeaseEndResult, LeaseGrantResult, Result
from ..state.values import Event
from ..state.view import StateView
from ..transport import GRPC_OPTIONS, Transport
from .api import (
    CompactedWatchError,
    Header,
    Member,
    NodeError,
    NodeStatus,
    NoLeaderError,
    NotLeaderError,
    PeerProgress,
    ProposalTimeoutError,
)
from .bootstrap import begin_from_empty_storage, is_blank, is_fresh
from .config import NodeConfig, PeerTls
from .membership import Membership
from .proposals import (
    DecodedEntries,
    ProposalIds,
    Proposals,
    Waiters,
    unwrap,
    validate_entries,
    wrap,
)
from .reads import LeaderLease, ReadIndexBatcher, lease_clock_s, lease_duration_s
from .snapshots import Capture, LeaderSnapshots, Snapshots, capture

__all__ = ["UNSAFE_STALE_READS", "Node", "NodeConfig", "PeerTls", "wall_clock_ms"]

# Test-only: breaks linearizability/fencing on purpose for the fault-injection suite's negative
# controls (tests/jepsen). With RALLYPOINT_UNSAFE_STALE_READS=1 in a member's environment when it
# starts, read_barrier returns at once, so "linearizable" reads are served from local state and
# may be stale. Never set it outside that suite.
UNSAFE_STALE_READS = os.environ.get("RALLYPOINT_UNSAFE_STALE_READS") == "1"

log = logging.getLogger("rallypoint.node")

# Vote requests and answers: what a peer that abstains must not have counted.
_VOTE_TRAFFIC = frozenset(
    {
        MessageType.MsgVote,
        MessageType.MsgVoteResp,
        MessageType.MsgPreVote,
        MessageType.MsgPreVoteResp,
    }
)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


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
        # Per peer, the last term refused as out of range that was logged at error level (a
        # peer stuck at such a term repeats it at heartbeat rate: one line per new term).
        self._refused_terms: dict[int, int] = {}
        # Per reason of a refused peer message: when it was last logged, and how many were
        # refused since without a line (note_peer_refusal).
        self._refusals_logged: dict[str, tuple[float, int]] = {}
        self._on_fatal = on_fatal or _exit_on_fatal
        self._rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        self._storage: DiskStorage | None = None
        self._snapshots: Snapshots | None = None
        # Envelopes decoded when a leader's entries were validated, for their apply.
        self._decoded = DecodedEntries()
        self._raw: RawNode | None = None
        # Invariant: mutated only by the apply path (_apply, _install_snapshot).
        self._sm = StateMachine(config.limits)
        # The last snapshot a peer sent, decoded off the loop by verify_snapshot: its bytes
        # and the state they restore, for _install_snapshot to swap in.
        self._verified_snapshot: tuple[bytes, StateMachine | None] = (b"", None)
        self._membership = Membership(config.initial_members, config.join_existing)
        self._lessor = Lessor(lambda: int(time.monotonic() * 1000))
        self.metrics = NodeMetrics(config.member_id)
        # Bound once: every append a follower receives counts here (validate_entries).
        received = self.metrics.peer_entries_received
        self._entries_held = received.labels(held="true")
        self._entries_new = received.labels(held="false")
        self._round_metrics = RoundObserver(self.metrics)
        self._soft_state = SoftState(NONE, StateType.FOLLOWER)
        self._role_log = RoleLog(config.member_id, time.monotonic, log, pre_vote=config.pre_vote)
        self._term = Term(0)
        self._commit_index = Index(0)
        # The only thread that touches the WAL and snapshot files (DiskStorage's disk half).
        self._disk = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rp-disk")
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._proposal_ids = ProposalIds()
        self._waiters = Waiters()
        # Entries proposed since the Ready loop last ran: it submits them together.
        # (term, time.monotonic()) when this member last saw itself become leader.
        self._led_since: tuple[int, float] | None = None
        self._proposals = Proposals(self._waiters)
        lease_clock = lease_clock_s()
        self._lease = LeaderLease(
            lease_duration_s(config.tick_ms, config.election_ticks), lease_clock
        )
        self._reads = ReadIndexBatcher(
            lambda context: self.raw.read_index(context),
            self.wake,
            lease_clock,
            leader_term=self._leader_term,
            on_confirmed=self._lease.confirmed,
        )
        self._applied_signal = asyncio.Event()
        self._leader_signal = asyncio.Event()
        channel_factory = None
        if peer_tls is not None:
            credentials = peer_tls.channel_credentials()
            channel_factory = lambda address: grpc.aio.secure_channel(  # noqa: E731
                address, credentials, options=GRPC_OPTIONS
            )
        self._transport = Transport(self, self._rng, channel_factory)
        self.supervisor = RendezvousSupervisor(
            self._sm,
            self._propose_verdict,
            wall_clock_ms,
            grace_ms=config.detector_grace_ms,
            metrics=self.metrics,
            member_id=config.member_id,
            leader_id=lambda: self.leader_id,
            send_report=self._transport.liveness,
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
        # Storage that holds the creation (not blank) under an identity that votes is an
        # intact disk: this member got every initial member's "fresh" once and has neither
        # voted nor appended since, which Raft handles like any other state; asking again
        # would only make it wait for members that may be down (bootstrap_rule.py).
        intact_creation = found is not None and not found.abstaining and not is_blank(storage)
        if is_fresh(storage) and not intact_creation:
            identity = await begin_from_empty_storage(
                config, self._peer_key, self._transport.channel, storage, found, self._disk
            )
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
        self._proposal_ids.start_boot(identity.boots)
        snapshot = storage.snapshot()
        if not snapshot.is_empty():
            self._install_snapshot(snapshot)
        hard_state, _ = storage.initial_state()
        self._term = hard_state.term
        self._commit_index = hard_state.commit
        snapshots = Snapshots(
            config.member_id,
            storage,
            self._disk,
            config.snapshot_catchup_entries,
            lambda: self._sm.applied_index,
            self._capture,
            self._spawn_guarded,
            config.snapshot_log_bytes,
        )
        self._snapshots = snapshots
        self._raw = RawNode(
            Config(
                id=NodeId(config.member_id),
                storage=LeaderSnapshots(
                    storage, lambda: snapshots.for_follower(self._membership.conf_state)
                ),
                rng=self._rng,
                election_tick=config.election_ticks,
                heartbeat_tick=config.heartbeat_ticks,
                applied=Index(snapshot.metadata.index),
                check_quorum=config.check_quorum,
                pre_vote=config.pre_vote,
                leader_lease=config.lease_reads,
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

    def _snapshot_interval(self) -> int:
        """Entries between this member's snapshots: the configured count, stretched by up to
        30% depending on the member id, so members do not all pause to snapshot at once."""
        entries = self.config.snapshot_entries
        return entries + entries * ((self.config.member_id - 1) % 4) // 10

    async def stop(self, *, transfer_leadership: bool = True) -> None:
        """Stop serving; a leader first hands leadership to the most up-to-date voter."""
        if self._stopping:
            return
        if transfer_leadership and self._raw is not None and self.is_leader():
            with contextlib.suppress(NodeError, asyncio.TimeoutError):
                await self.transfer_leader(0, timeout_s=3.0)
        self._stopping = True
        await cancel_and_wait(*self._tasks)
        if self._snapshots is not None:
            await self._snapshots.stop()
        await self._transport.stop()
        if self._peer_server is not None:
            await self._peer_server.stop(grace=0.5)
        self._fail_waiters(NodeError("this member is shutting down"))
        if self._storage is not None:
            storage = self._storage
            await asyncio.get_running_loop().run_in_executor(self._disk, storage.close)
        self._disk.shutdown(wait=True)
        log.info("member %d stopped", self.config.member_id)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, referenced until it finishes (the event loop keeps
        only weak references to tasks)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _spawn_guarded(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Like ``_spawn``, for work whose failure is a broken invariant (snapshots)."""
        return self._spawn(self._guard(coro))

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

    def wake(self) -> None:
        """The core has work: let the Ready loop run."""
        self._wakeup.set()

    async def _ready_loop(self) -> None:
        raw = self.raw
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            self._submit_proposals()
            while raw.has_ready():
                await self._handle_ready(raw.ready())
                # Let ticks and peers' messages in between Readies: a member applying a long
                # backlog (catching up after a restart) must still notice a dead leader on
                # time, not after the backlog (its election timer counts ticks).
                await asyncio.sleep(0)
                self._submit_proposals()

    def _submit_proposals(self) -> None:
        """The entries callers proposed since the last Ready, to the core as one message."""
        if self._proposals:
            self._proposals.submit(self.raw.propose_many, self.raw.leader_term())

    async def _handle_ready(self, rd: Ready) -> None:
        storage = self._storage
        assert storage is not None and self._snapshots is not None
        raw = self.raw
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state)
        if not rd.hard_state.is_empty():
            if rd.hard_state.term != self._term:
                self._term = rd.hard_state.term
                self.metrics.term.set(self._term)
            self._commit_index = rd.hard_state.commit
        # Committed entries already durable here apply first, while this Ready's state is
        # written (as etcd's server does): their callers' answers wait neither for the write
        # of the commit index that announced them nor behind the peer senders.
        committed = rd.committed_entries
        early = self._durable_prefix(rd)
        for entry in committed[:early]:
            self._apply(entry)
        committed = committed[early:]
        # The Ready contract (raft/rawnode.py): the core put apart the messages that vouch
        # for nothing unpersisted, which go now, and the votes and acks, which go once
        # persisted.
        self._transport.send(rd.messages)
        if rd.entries or not rd.hard_state.is_empty() or not rd.snapshot.is_empty():
            if rd.messages:
                # Let the peer senders put the appends on the wire (and the callers just
                # answered respond) before the disk thread starts: the followers' fsyncs,
                # not ours, decide when an entry commits.
                await asyncio.sleep(0)
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
            self._reads.on_read_state(read_state, self._sm.applied_index)
        for entry in committed:
            self._apply(entry)
        raw.advance(rd)
        if raw.abstaining and (rd.committed_entries or not rd.hard_state.is_empty()):
            await self._maybe_stop_abstaining()
        if rd.committed_entries or not rd.snapshot.is_empty():
            self._after_apply()
            self._snapshots.applied(sum(len(entry.data) for entry in rd.committed_entries))
            self._snapshots.maybe_start()

    def _durable_prefix(self, rd: Ready) -> int:
        """How many of ``rd``'s committed entries are durable in this member's log before
        ``rd`` is written: those at or below the persisted last index that ``rd``'s own
        entries do not overwrite. None with a snapshot (it replaces the state first)."""
        storage = self._storage
        assert storage is not None
        if not rd.snapshot.is_empty() or not rd.committed_entries:
            return 0
        durable = int(storage.last_index())
        if rd.entries:
            durable = min(durable, int(rd.entries[0].index) - 1)
        count = 0
        for entry in rd.committed_entries:
            if entry.index > durable:
                break
            count += 1
        return count

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
        membership = self._membership
        term = self.raw.basic_status().hard_state.term
        self._role_log.observe(soft, term, membership.transfer_target)
        if soft.raft_state is not StateType.LEADER:
            membership.transfer_target = NONE
        if soft.lead != old.lead:
            self.metrics.leader_changes.inc()
            # An entry proposed through the old leader may or may not commit: tell callers
            # now rather than at their deadline. A retry with the same (session, sequence)
            # is answered from the session cache if it did apply.
            self._fail_waiters(self._not_leader_error(soft.lead))
            self._reads.requeue(leader_known=self.leader_id != NONE)
            self._leader_signal.set()
            self._leader_signal = asyncio.Event()
        was_leader = old.raft_state is StateType.LEADER
        is_leader = soft.raft_state is StateType.LEADER
        if is_leader and not was_leader:
            self._led_since = (int(term), time.monotonic())
            self._lessor.promote()
            self.supervisor.promote()
        elif was_leader and not is_leader:
            self._lessor.demote()
            self.supervisor.demote()
        self.metrics.is_leader.set(1 if is_leader else 0)

    # ---------------------------------------------------------------- the apply path

    def _apply(self, entry: Entry) -> None:
        if entry.type is EntryType.CONF_CHANGE:
            self._apply_conf_change(entry)
            return
        if not entry.data:
            self._sm.apply(entry.index, b"")
            return
        proposer_id, proposal_id, payload = unwrap(entry.data)
        result = self._sm.apply(entry.index, payload, self._decoded.take(entry))
        if isinstance(result, LeaseGrantResult):
            self._lessor.grant(result.lease_id, result.ttl_ms)
        elif isinstance(result, LeaseEndResult):
            self._lessor.forget(result.lease_id)
        if proposer_id == self.config.member_id:
            self._waiters.trigger(proposal_id, result)

    def _apply_conf_change(self, entry: Entry) -> None:
        cc = decode_conf_change(entry.data)
        conf_state = self.raw.apply_conf_change(cc)
        context, removed = self._membership.apply(cc, conf_state)
        for member_id in removed:
            self._spawn(self._transport.remove_peer(NodeId(member_id)))
            if member_id == self.config.member_id:
                self.removed = True
                log.warning("member %d was removed from the cluster", member_id)
        if context.proposer_id == self.config.member_id:
            self._waiters.trigger(context.proposal_id, conf_state)

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        members, state = decode_app_snapshot(snapshot.data)
        verified_data, decoded = self._verified_snapshot
        self._verified_snapshot = (b"", None)
        if decoded is not None and verified_data is snapshot.data:
            self._sm.adopt(decoded)
            log.info(
                "member %d: installed the leader's snapshot at %d (%d keys, decoded off the "
                "event loop)",
                self.config.member_id,
                snapshot.metadata.index,
                len(self._sm.kv),
            )
        else:
            self._sm.restore(state)
            if self._snapshots is not None:  # None while starting from the stored snapshot
                log.info(
                    "member %d: installed the leader's snapshot at %d (%d keys)",
                    self.config.member_id,
                    snapshot.metadata.index,
                    len(self._sm.kv),
                )
        # The snapshot's state is as of its index even if no entry at it touched the state.
        self._sm.applied_index = max(self._sm.applied_index, snapshot.metadata.index)
        self._membership.restore(members, snapshot.metadata.conf_state)
        self._lessor.sync(self._sm.lease_list())
        self._decoded.clear()
        if self._snapshots is not None:  # None while starting from the stored snapshot
            self._snapshots.installed()

    def _after_apply(self) -> None:
        applied = self._sm.applied_index
        self.metrics.applied_index.set(applied)
        self.metrics.commit_index.set(self._commit_index)
        self.metrics.sessions.set(len(self._sm.sessions.in_order()))
        self.metrics.leases.set(len(self._sm.leases.in_order()))
        self._round_metrics.observe(self._sm.rendezvous)
        self._reads.on_applied(applied)
        self._applied_signal.set()
        self._applied_signal = asyncio.Event()

    def _capture(self) -> Capture:
        """The state to snapshot, taken between applies (see node_snapshots)."""
        membership = self._membership
        return capture(self._sm, membership.table, membership.conf_state)

    def _fail_waiters(self, error: Exception) -> None:
        self._proposals.clear()
        self._waiters.fail_all(error)
        # Reads are re-asked of a new leader; without one (or when stopping) they fail.
        keep = isinstance(error, NotLeaderError) and error.leader_id != NONE
        self._reads.fail_queued(error, keep=keep)

    # ---------------------------------------------------------------- timers

    async def _tick_loop(self) -> None:
        interval_s = self.config.tick_ms / 1000
        election_s = interval_s * self.config.election_ticks
        while True:
            await asyncio.sleep(interval_s)
            self.raw.tick()
            self._role_log.check_leaderless()
            # A ReadIndex request unanswered for an election timeout was lost: ask again.
            self._reads.retry_if_lost(election_s, leader_known=self.leader_id != NONE)
            self._renew_lease()
            self._wakeup.set()

    def _leader_term(self) -> int:
        """The term this member's core leads in, or 0 (a ReadIndex request is issued under
        it: only a request issued while leading renews the lease)."""
        status = self.raw.basic_status()
        leading = status.soft_state.raft_state is StateType.LEADER
        return int(status.hard_state.term) if leading else 0

    def _renew_lease(self) -> None:
        """A leader whose lease is half gone asks a quorum again (node_reads.py)."""
        if not self.config.lease_reads:
            return
        found = self.raw.lease_read_index()
        if found is not None and self._lease.wants_renewal(int(found[0])):
            self._reads.renew()

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(min(0.1, self.config.tick_ms / 1000))
            for lease_id in self._lessor.expired():
                self._spawn(self._expire_lease(lease_id))

    async def _propose_verdict(self, command: Command) -> None:
        """The supervisor's proposals: one that fails as expected (no leader, dropped, timed
        out) is proposed again by a later pass if still due."""
        with contextlib.suppress(NodeError):
            await self.propose(command, timeout_s=5.0)

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
        """False until the Raft node runs (while this member asks Hello, say), and once it
        stops."""
        return self._raw is not None and not self._stopping

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def peer_names_required(self) -> bool:
        """With TLS on the peer port, a peer's certificate must name it (peer_auth.py)."""
        return self._peer_tls is not None

    def hello_answer(self, from_id: int) -> tuple[bool, bool, int, int]:
        """(established, knows the asker, term, last index) for peer_hello.py. Only a member
        with empty storage asks, so an established member says so in its own log: the asker
        lost its data (or never ran since the cluster was created)."""
        storage = self._storage
        if storage is None:
            return False, False, 0, 0
        established = not is_fresh(storage)
        knows = self._membership.knows(from_id)
        if established:
            log.warning(
                "member %d: member %d started with empty storage and asked whether the "
                "cluster exists: it lost its data (or never ran since the cluster was "
                "created); told it exists, so %s",
                self.member_id,
                from_id,
                "it rejoins without voting until it has caught up"
                if knows
                else "it refuses to start (it is not in the configuration)",
            )
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
            peer_id = int(messages[0].from_)
            if self._note_incarnation(peer_id, incarnation, abstaining) and abstaining:
                # What a leader recorded this peer holds is void (raft: peer_lost_data).
                raw.report_lost_data(NodeId(peer_id))
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
            except TermOutOfRangeError as exc:
                self._note_refused_term(message, exc)
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

    def _note_refused_term(self, message: Message, exc: TermOutOfRangeError) -> None:
        """A message Raft refused for its term (raft/types.py MAX_TERM): a bug or corrupted
        state at the sender. Counted, and logged as an error once per peer and term."""
        self.metrics.peer_refusals.labels("term_out_of_range").inc()
        peer = int(message.from_)
        if self._refused_terms.get(peer) == message.term:
            log.debug("member %d: %s", self.member_id, exc)
            return
        self._refused_terms[peer] = int(message.term)
        log.error(
            "member %d refused a message from member %d: %s; that member's state is "
            "corrupt or it has a bug (its messages at this term are dropped)",
            self.member_id,
            peer,
            exc,
        )

    def _note_incarnation(self, peer_id: int, incarnation: int, abstaining: bool) -> bool:
        """Whether ``incarnation`` is new to this run. Warns once per new incarnation of a
        peer: one this member saw change, or (this member restarted since) one that says it
        abstains, which only a member that started from empty storage into an existing
        cluster does."""
        previous = self._peer_incarnations.get(peer_id)
        self._peer_incarnations[peer_id] = incarnation
        if previous == incarnation:
            return False
        if previous is None and not abstaining:
            return True
        log.warning(
            "member %d: member %d came back with a new data directory (incarnation %016x, "
            "was %s)%s",
            self.member_id,
            peer_id,
            incarnation,
            "not seen by this run" if previous is None else f"{previous:016x}",
            ": it lost its data and does not vote until it has caught up" if abstaining else "",
        )
        return True

    def peer_address(self, member_id: int) -> str | None:
        address = self._membership.table.get(member_id)
        return None if address is None else address.peer_address

    def report_unreachable(self, member_id: int) -> None:
        self.raw.report_unreachable(NodeId(member_id))
        self._wakeup.set()

    def report_snapshot(self, member_id: int, ok: bool) -> None:
        status = SnapshotStatus.FINISH if ok else SnapshotStatus.FAILURE
        self.raw.report_snapshot(NodeId(member_id), status)
        self._wakeup.set()

    def note_peer_refusal(self, reason: str, from_id: int, detail: str) -> None:
        """Count refused traffic of a member and log it: a warning per reason at most once a
        second (a replaying proxy can open streams as fast as it likes), saying how many
        more were refused meanwhile."""
        self.metrics.peer_refusals.labels(reason).inc()
        now = time.monotonic()
        logged_at, suppressed = self._refusals_logged.get(reason, (-1.0, 0))
        if now - logged_at < 1.0 and logged_at >= 0:
            self._refusals_logged[reason] = (logged_at, suppressed + 1)
            log.debug("member %d: %s", self.member_id, detail)
            return
        self._refusals_logged[reason] = (now, 0)
        log.warning(
            "member %d: %s%s",
            self.member_id,
            detail,
            f" ({suppressed} more refused for this reason since the last line)"
            if suppressed
            else "",
        )

    def incoming_snapshot_dir(self) -> str:
        return os.path.join(self.config.data_dir, "incoming")

    def validate_entries(self, entries: tuple[Entry, ...]) -> None:
        """Raise ValueError unless every entry a peer sent would apply (see
        ``node_proposals.validate_entries``); keep what was decoded for their apply. The
        leading entries this member's log already holds exactly (index, term, type and data)
        were checked when they first came (or were proposed here) and are not decoded again
        (a leader resends entries when messages may have been lost); both kinds are counted
        in ``rallypoint_peer_entries_received``."""
        if self._raw is not None:
            held = self._raw.held_prefix(entries)
            if held:
                self._entries_held.inc(held)
                entries = entries[held:]
            if not entries:
                return
        self._entries_new.inc(len(entries))
        envelopes = validate_entries(entries)
        self._decoded.keep(entries, envelopes, self._sm.applied_index)

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
        decoded = StateMachine(self.config.limits)
        decoded.restore(state)  # raises StateCodecError if malformed
        missing = [v for v in conf.voters if members.get(v) is None]
        if missing:
            raise ValueError(f"its member table lacks the addresses of voters {missing}")
        # Kept for the install, which then swaps it in instead of decoding again on the event
        # loop (a state of 1,000,000 keys takes seconds to decode). One reference assignment,
        # so the loop sees the old or the new pair, never half of one.
        self._verified_snapshot = (snapshot.data, decoded)

    # ---------------------------------------------------------------- ServerNode

    @property
    def state(self) -> StateView:
        return self._sm

    def is_leader(self) -> bool:
        return self._soft_state.raft_state is StateType.LEADER

    def leader_term(self) -> int | None:
        term = self.raw.leader_term()
        return None if term is None else int(term)

    def leader_since(self, term: int) -> float | None:
        led = self._led_since
        return led[1] if led is not None and led[0] == term else None

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
        address = self._membership.table.get(lead)
        return NotLeaderError(lead, None if address is None else address.client_address)

    def require_leader(self) -> None:
        if not self.is_leader():
            raise self._not_leader_error(self.leader_id)

    def next_proposal_id(self) -> int:
        return self._proposal_ids.next()

    async def propose_and_wait(
        self, proposal_id: int, submit: Callable[[], None], timeout_s: float
    ) -> Any:
        return await self._waiters.propose_and_wait(proposal_id, submit, timeout_s, self.wake)

    async def propose(
        self,
        command: Command,
        *,
        session_id: int = 0,
        sequence: int = 0,
        first_unacked: int = 0,
        timeout_s: float = 5.0,
        term: int | None = None,
    ) -> Result:
        if self.leader_id == NONE:
            raise NoLeaderError()
        envelope = Envelope(session_id, sequence, first_unacked, wall_clock_ms(), command)
        proposal_id = self.next_proposal_id()
        data = wrap(self.member_id, proposal_id, encode_envelope(envelope))
        started = time.monotonic()
        result: Result = await self.propose_and_wait(
            proposal_id, lambda: self._proposals.queue(proposal_id, data, term), timeout_s
        )
        self.metrics.proposal_seconds.observe(time.monotonic() - started)
        return result

    async def read_barrier(self, timeout_s: float = 5.0) -> None:
        if UNSAFE_STALE_READS:
            return
        if self.leader_id == NONE:
            raise NoLeaderError()
        future = self._leased_read() or self._reads.enqueue()
        if future.done():
            return  # a leased read of applied state: no turn of the loop to wait for
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            raise ProposalTimeoutError(
                f"linearizable read not confirmed within {timeout_s:.1f}s"
            ) from None

    def _leased_read(self) -> asyncio.Future[None] | None:
        """The wait of a read served under this leader's lease (for the state applied up to
        its commit index), or None when it holds none (node_reads.py)."""
        if not self.config.lease_reads:
            return None
        found = self.raw.lease_read_index()
        if found is None or not self._lease.held(int(found[0])):
            return None
        return self._reads.wait_applied(int(found[1]), self._sm.applied_index)

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
        self.require_leader()
        return self._lessor.keep_alive(lease_id)

    def lease_remaining_ms(self, lease_id: int) -> int | None:
        self.require_leader()
        return self._lessor.remaining_ms(lease_id)

    @property
    def liveness(self) -> LivenessPort:
        return self.supervisor

    def leader_clock_ms(self) -> int:
        return wall_clock_ms()

    async def wait_for_apply(self, timeout_s: float) -> bool:
        signal = self._applied_signal
        try:
            async with asyncio.timeout(timeout_s):
                await signal.wait()
        except TimeoutError:
            return False
        return True

    def status(self) -> NodeStatus:
        raw_status = self.raw.status()
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
            members=self._membership.members(),
            progress=progress,
            abstaining=self.raw.abstaining,
        )

    # ---------------------------------------------------------------- membership

    async def member_add(
        self, peer_address: str, client_address: str, as_learner: bool, timeout_s: float = 10.0
    ) -> Member:
        return await self._membership.add(self, peer_address, client_address, as_learner, timeout_s)

    async def member_remove(self, member_id: int, timeout_s: float = 10.0) -> None:
        await self._membership.remove(self, member_id, timeout_s)

    async def member_promote(self, member_id: int, timeout_s: float = 10.0) -> Member:
        """Learner to voter, on the leader, once the learner's log has caught up."""
        return await self._membership.promote(self, member_id, timeout_s)

    async def transfer_leader(self, target_id: int, timeout_s: float = 10.0) -> int:
        return await self._membership.transfer_leader(self, target_id, timeout_s)

    async def wait_for_leader_change(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._leader_signal.wait()

    async def snapshot_now(self) -> int:
        assert self._snapshots is not None, "the member is not started"
        return await self._snapshots.snapshot_now()

    async def wait_for_leader(self, timeout_s: float) -> int:
        """Wait until some leader is known; return its id (for tools and tests)."""
        deadline = time.monotonic() + timeout_s
        while self.leader_id == NONE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoLeaderError()
            await self.wait_for_leader_change(remaining)
        return self.leader_id


def _exit_on_fatal(exc: BaseException) -> None:
    logging.shutdown()
    os._exit(70)
