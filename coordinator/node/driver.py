"""A running member: the asyncio driver around the pure Raft core, and its lifecycle.

Theory of operation. One task, the Ready loop, owns the hand-off between the pure core
(``RawNode``) and the world, in the order the Ready contract demands (``raft/rawnode.py``,
etcd-io/raft's ``rawnode.go``; Raft thesis 10.2):

1. apply the committed entries already durable in this member's log (on a leader, all of
   them: its entries reach followers only in the Ready that writes them): a commit this
   Ready only announces needs no write of its own before the caller is answered (etcd's
   server applies while it saves, too); a follower that writes entries and that nobody
   waits on applies them at 6, after its ack (``upkeep.applied_first``);
2. send ``Ready.messages`` at once: they vouch for nothing unpersisted (a leader replicates
   while it writes, thesis 10.2.1; a follower answers heartbeats during a long catch-up);
   an open, idle peer connection takes them in the call, others wait for their peer
   sender's task, which runs before the disk thread starts;
3. persist the hard state, entries and snapshot: one WAL write, fsynced only when the Ready
   says ``must_sync``, on a dedicated disk thread so the event loop keeps serving (but a
   follower's small batch on the loop itself, ``disk.py``: the ack waits for it; a Ready
   that moves only the commit index writes nothing: the index is held in memory and goes
   to the WAL with the next entries, ``upkeep.disk_request``); while it runs, new
   proposals and messages keep entering the core; the next Ready takes them all to disk;
4. send ``Ready.messages_after_persist`` (votes and append acks: they vouch for what was
   just persisted, thesis 3.8);
5. install a received snapshot into the state machine; resolve ReadIndex requests;
6. apply the remaining committed entries (state-machine commands, configuration changes);
7. ``advance``; then start a snapshot in the background when the policy says so.

The core decides what each Ready holds and which messages wait for persistence; this loop
never sorts messages by type, and it reads the core only through ``basic_status()`` and
``status()``. Only this loop mutates the state machine (apply and snapshot install); the
servicers read it through ``StateView``.

Everything else (ticks, messages from peers, proposals from the servicers) only calls into
the core and wakes the loop. This module holds the lifecycle (start, stop), the Ready loop
and the apply path, the timers, and the face the servicers see (``api.ServerNode``); the
other parts of the member are modules of this package (see ``__init__``), and callers reach
them directly: ``Node.peers`` (``peer_face.PeerFace``) for the peer transport and service,
``Node.membership`` for configuration changes, ``Node.liveness`` (the supervisor, as
``liveness.port.LivenessPort``) for the heartbeat streams. The state machine never reads a
clock: the proposing member stamps each command with its wall-clock time
(``Envelope.leader_time_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from rallypoint.client.tasks import cancel_and_wait
from rallypoint.raft import (
    RawNode,
    Ready,
    SoftState,
    StateType,
)
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.storage.disk_storage import DiskStorage
from rallypoint.raft.types import (
    NONE,
    Entry,
    EntryType,
    Index,
    NodeId,
    Snapshot,
    Term,
)

from ..backup_file import BackupHeader
from ..identity import Identity
from ..leader.lessor import Lessor
from ..leader.supervisor import RendezvousSupervisor
from ..leader.versions import VersionProbe
from ..liveness.port import LivenessPort
from ..member_table import decode_app_snapshot
from ..metrics import NodeMetrics
from ..role_log import RoleLog
from ..round_metrics import RoundObserver
from ..state.commands import ClusterVersion, Command, Envelope, LeaseExpire, encode_envelope
from ..state.errors import Compacted
from ..state.machine import StateMachine
from ..state.results import LeaseEndResult, LeaseGrantResult, Result
from ..state.values import Event
from ..state.view import StateView
from ..state.watch import by_revision
from ..transport import PeerServer
from ..version import startup_refusal
from .api import (
    CompactedWatchError,
    Header,
    MemberStoppingError,
    NodeError,
    NodeStartError,
    NodeStatus,
    NoLeaderError,
    NotLeaderError,
    ProposalTimeoutError,
)
from .bootstrap import settle_identity, stop_abstaining
from .config import NodeConfig, PeerTls
from .disk import DiskThread, DiskWrites
from .membership import Membership
from .peer_face import PeerFace
from .proposals import (
    ProposalIds,
    Proposals,
    Waiters,
    unwrap,
    wrap,
)
from .reads import LinearizableReads
from .snapshots import Capture, LeaderSnapshots, Snapshots, capture
from .upkeep import (
    applied_first,
    check_encodable,
    disk_request,
    node_status,
    open_storage,
    raft_config,
    remove_unfinished_transfers,
    stop_if_too_old,
    take_backup,
    version_asker,
    version_members,
)

__all__ = ["UNSAFE_STALE_READS", "Node", "wall_clock_ms"]

# Test-only: breaks linearizability/fencing on purpose for the fault-injection suite's negative
# controls (tests/jepsen). With RALLYPOINT_UNSAFE_STALE_READS=1 in a member's environment when it
# starts, read_barrier returns at once, so "linearizable" reads are served from local state and
# may be stale. Never set it outside that suite.
UNSAFE_STALE_READS = os.environ.get("RALLYPOINT_UNSAFE_STALE_READS") == "1"

log = logging.getLogger("rallypoint.node")


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Node:
    """A member of a rallypoint cluster; implements ``api.ServerNode``."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        peer_tls: PeerTls | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.member_id = config.member_id
        self.cluster_id = config.cluster_id
        # Settled in start() (see identity.py); replaced only when the member stops
        # abstaining. Read by the peer face (its incarnation).
        self.identity: Identity | None = None
        self._on_fatal = on_fatal or _exit_on_fatal
        self._rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        # Opened in start(); its files are written on the disk thread or by DiskWrites.
        self.storage: DiskStorage | None = None
        self._snapshots: Snapshots | None = None
        self._raw: RawNode | None = None
        # Invariant: mutated only by the apply path (_apply, _install_snapshot).
        self._sm = StateMachine(config.limits)
        self._lessor = Lessor(lambda: int(time.monotonic() * 1000))
        self.metrics = NodeMetrics(config.member_id)
        # What the peer transport and the peer service see of this member.
        self.peers = PeerFace(self, config, peer_tls, self.metrics, self._on_fatal)
        self._round_metrics = RoundObserver(self.metrics)
        self._soft_state = SoftState(NONE, StateType.FOLLOWER)
        self._role_log = RoleLog(config.member_id, time.monotonic, log, pre_vote=config.pre_vote)
        self._term = Term(0)
        self._commit_index = Index(0)
        # The only thread that touches the WAL and snapshot files (DiskStorage's disk half)
        # while the loop serves; a follower's loop writes its small batches itself (disk.py).
        self._disk = DiskThread()
        self._writes = DiskWrites(self._disk)
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._proposal_ids = ProposalIds()
        self._waiters = Waiters()
        self.membership = Membership(
            self, self._proposal_ids, self._waiters, config.initial_members, config.join_existing
        )
        # (term, time.monotonic()) when this member last saw itself become leader.
        self._led_since: tuple[int, float] | None = None
        # Entries proposed since the Ready loop last ran: it submits them together.
        self._proposals = Proposals(self._waiters)
        self._reads = LinearizableReads(
            lambda: self.raw,
            self.wake,
            lease_reads=config.lease_reads,
            tick_ms=config.tick_ms,
            election_ticks=config.election_ticks,
        )
        self._applied_signal = asyncio.Event()
        self._leader_signal = asyncio.Event()
        self._transport = self.peers.transport(self._rng)
        self.supervisor = RendezvousSupervisor(
            self._sm,
            self._propose_quietly,
            wall_clock_ms,
            grace_ms=config.detector_grace_ms,
            metrics=self.metrics,
            member_id=config.member_id,
            leader_id=lambda: self.leader_id,
            send_report=self._transport.liveness,
        )
        self.versions = VersionProbe(
            config.member_id,
            version_asker(self.member_id, self.cluster_id, self.peers, self._transport),
            lambda: version_members(self.membership),
            lambda: self._sm.cluster_version,
            lambda version: self._propose_quietly(ClusterVersion(version)),
        )
        self._peer_server: PeerServer | None = None
        self._stopping = False
        self.removed = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open storage (refusing to start on corruption or on another member's data
        directory), settle this member's identity, restore, and begin serving peers."""
        loop = asyncio.get_running_loop()
        config = self.config
        os.makedirs(config.data_dir, exist_ok=True)
        found, storage = await open_storage(config, self._disk, self.cluster_id)
        self.storage = storage
        await remove_unfinished_transfers(
            config.member_id, self.peers.incoming_snapshot_dir(), self._disk
        )
        # Serve the peer port first: members asking Hello need an answer while this one
        # may itself be asking them (every member of a new cluster starts at once).
        self._peer_server = await self.peers.serve()
        identity = await settle_identity(
            config, self.peers.peer_key, self._transport.hello, storage, found, self._disk
        )
        self.identity = identity
        # Unique across restarts, and across a lost data directory (the incarnation): a
        # committed entry of an earlier life never resolves a waiter of this one (both key
        # on the id; proposals.py).
        self._proposal_ids.start_boot(identity.boots, identity.incarnation)
        snapshot = storage.snapshot()
        if not snapshot.is_empty():
            self._install_snapshot(snapshot)
        # A member older than the cluster version must not run: it would misread or refuse
        # what the others write, and a cluster version never goes down (version.py). The
        # entries after the snapshot are checked as they apply (``_check_cluster_version``).
        refusal = startup_refusal(self._sm.cluster_version)
        if refusal is not None:
            await self._peer_server.stop(grace=None)
            await loop.run_in_executor(self._disk, storage.close)
            raise NodeStartError(f"member {config.member_id}: {refusal}")
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
        leader_storage = LeaderSnapshots(
            storage, lambda: snapshots.for_follower(self.membership.conf_state)
        )
        self._raw = RawNode(
            raft_config(
                config, leader_storage, self._rng, snapshot.metadata.index, identity.abstaining
            )
        )
        loops = (
            self._ready_loop(),
            self._tick_loop(),
            self._lease_loop(),
            self.supervisor.run(),
            self.versions.run(),
        )
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

    async def stop(self, *, transfer_leadership: bool = True) -> None:
        """Stop serving; a leader first hands leadership to the most up-to-date voter."""
        if self._stopping:
            return
        if transfer_leadership and self._raw is not None and self.is_leader():
            try:
                await self.membership.transfer_leader(0, timeout_s=3.0, give_up_if_lost=True)
            except (NodeError, TimeoutError) as error:
                log.info("member %d: stopping without a hand-over: %s", self.member_id, error)
        self._stopping = True
        await cancel_and_wait(*self._tasks)
        if self._snapshots is not None:
            await self._snapshots.stop()
        await self._transport.stop()
        if self._peer_server is not None:
            await self._peer_server.stop(grace=0.5)
        self._fail_waiters(MemberStoppingError(self.config.member_id))
        if self.storage is not None:
            storage = self.storage
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
        storage = self.storage
        assert storage is not None and self._snapshots is not None
        raw = self.raw
        # The leader's reported commit as of this Ready (no await since ready()), so that it
        # pairs with the commit index this Ready persists (has_caught_up).
        status = raw.basic_status() if raw.abstaining else None
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state)
        if not rd.hard_state.is_empty():
            if rd.hard_state.term != self._term:
                self._term = rd.hard_state.term
                self.metrics.term.set(self._term)
            self._commit_index = rd.hard_state.commit
        # Committed entries already durable here apply first (as etcd's server does): their
        # callers' answers wait neither for this Ready's write nor behind the peer senders;
        # but an idle follower acknowledges its new entries first (``upkeep.applied_first``).
        committed = rd.committed_entries
        leading = self._soft_state.raft_state is StateType.LEADER
        early = applied_first(storage, rd, leading, bool(self._waiters) or self._reads.waiting)
        for entry in committed[:early]:
            self._apply(entry)
        committed = committed[early:]
        # The Ready contract (raft/rawnode.py): what vouches for nothing unpersisted goes
        # now (an idle peer connection takes it in this call); votes and acks once persisted.
        self._transport.send(rd.messages)
        request = disk_request(storage, rd, raw.abstaining)
        if request is not None:
            if rd.messages and (early or not self._transport.sent_all()):
                # Let the callers just answered respond (and the peer senders write what they
                # hold) before the disk thread starts: the followers' fsyncs decide the commit.
                await asyncio.sleep(0)
            took = await self._writes.write(storage, request, not leading)
            self.metrics.fsync_seconds.observe(took)
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
            assert status is not None
            await self._maybe_stop_abstaining(status.lead_commit, status.lead_commit_first)
        if rd.committed_entries or not rd.snapshot.is_empty():
            self._after_apply()
            self._snapshots.applied(sum(len(entry.data) for entry in rd.committed_entries))
            self._snapshots.maybe_start()

    async def _maybe_stop_abstaining(self, lead_commit: Index, lead_commit_first: Index) -> None:
        """A member that lost its data votes again once it has caught up with
        ``lead_commit``, the commit index its leader had reported when the Ready just
        persisted was made (``bootstrap.stop_abstaining``)."""
        assert self.storage is not None and self.identity is not None
        identity = await stop_abstaining(
            self.config,
            self._disk,
            self.storage,
            self.identity,
            (self._commit_index, self._term, self._soft_state.lead),
            (lead_commit, lead_commit_first),
        )
        if identity is not None:
            self.identity = identity
            self.raw.set_abstain(False)

    def _on_soft_state(self, soft: SoftState) -> None:
        old = self._soft_state
        self._soft_state = soft
        membership = self.membership
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
            for part in (self._lessor, self.supervisor, self.versions):
                part.promote()
        elif was_leader and not is_leader:
            for part in (self._lessor, self.supervisor, self.versions):
                part.demote()
        self.metrics.is_leader.set(1 if is_leader else 0)

    # ---------------------------------------------------------------- the apply path

    def _apply(self, entry: Entry) -> None:
        if entry.type is EntryType.CONF_CHANGE:
            self._apply_conf_change(entry)
            # Applied like any other entry (it changes no key): a linearizable read whose read
            # index is this entry's (a change with no write after it) must not wait for the
            # next write, nor a snapshot taken now be one entry behind its conf state.
            self._sm.apply(entry.index, b"")
            return
        if not entry.data:
            self._sm.apply(entry.index, b"")
            return
        proposer_id, proposal_id, payload = unwrap(entry.data)
        cluster_version = self._sm.cluster_version
        envelope = self.peers.decoded.take(entry) or self._waiters.envelope(proposal_id, entry.data)
        result = self._sm.apply(entry.index, payload, envelope)
        if self._sm.cluster_version != cluster_version:
            self._cluster_version_raised(cluster_version)
        if isinstance(result, LeaseGrantResult):
            self._lessor.grant(result.lease_id, result.ttl_ms)
        elif isinstance(result, LeaseEndResult):
            self._lessor.forget(result.lease_id)
        if proposer_id == self.config.member_id and not self._waiters.trigger(
            proposal_id, result, entry.data
        ):
            self._earlier_life(entry, proposal_id)

    def _cluster_version_raised(self, previous: int) -> None:
        """A ClusterVersion entry raised the cluster version: this build stops if it is older
        (``upkeep.stop_if_too_old``), and a snapshot stores the version at once, so an older
        build opening this data directory refuses it at its first read."""
        stop_if_too_old(self.member_id, self._sm.cluster_version, previous)
        if self._snapshots is not None:
            self._spawn_guarded(self._snapshots.snapshot_quietly())

    def _apply_conf_change(self, entry: Entry) -> None:
        cc = decode_conf_change(entry.data)
        conf_state = self.raw.apply_conf_change(cc)
        context, removed = self.membership.apply(cc, conf_state)
        self.versions.membership_changed()
        for member_id in removed:
            self._spawn(self._transport.remove_peer(NodeId(member_id)))
            if member_id == self.config.member_id:
                self.removed = True
                log.warning("member %d was removed from the cluster", member_id)
        if context.proposer_id == self.config.member_id and not self._waiters.trigger(
            context.proposal_id, conf_state, cc
        ):
            self._earlier_life(entry, context.proposal_id)

    def _earlier_life(self, entry: Entry, proposal_id: int) -> None:
        log.warning(
            "member %d: entry %d carries proposal id %x of an earlier life of this member, "
            "whose waiter proposed something else: it answers nobody",
            self.config.member_id,
            entry.index,
            proposal_id,
        )

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        members, state = decode_app_snapshot(snapshot.data)
        decoded = self.peers.take_verified(snapshot.data)
        if decoded is not None:
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
        self.membership.restore(members, snapshot.metadata.conf_state)
        self._lessor.sync(self._sm.lease_list())
        self.peers.decoded.clear()
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
        """The state to snapshot, taken between applies (see snapshots.py)."""
        membership = self.membership
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
            self._reads.renew_lease()
            self._wakeup.set()

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(min(0.1, self.config.tick_ms / 1000))
            for lease_id in self._lessor.expired():
                self._spawn(self._propose_quietly(LeaseExpire(lease_id)))

    async def _propose_quietly(self, command: Command) -> None:
        """Lease expiries and the supervisor's verdicts: one that fails as expected (no
        leader, dropped, timed out) is proposed again later if still due."""
        with contextlib.suppress(NodeError):
            await self.propose(command, timeout_s=5.0)

    # ---------------------------------------------------------------- for the parts

    @property
    def core(self) -> RawNode | None:
        """The Raft core, or None before start (``raw`` asserts it is started)."""
        return self._raw

    @property
    def stopping(self) -> bool:
        return self._stopping

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
        address = self.membership.table.get(lead)
        return NotLeaderError(lead, None if address is None else address.client_address)

    def require_leader(self) -> None:
        if not self.is_leader():
            raise self._not_leader_error(self.leader_id)

    async def propose(self, command: Command, **options: Any) -> Result:
        return await self.submit(command, **options)

    def submit(
        self,
        command: Command,
        *,
        session_id: int = 0,
        sequence: int = 0,
        first_unacked: int = 0,
        timeout_s: float = 5.0,
        term: int | None = None,
    ) -> asyncio.Future[Result]:
        if self.leader_id == NONE:
            raise NoLeaderError()
        check_encodable(command, self._sm.cluster_version)
        envelope = Envelope(session_id, sequence, first_unacked, wall_clock_ms(), command)
        proposal_id = self._proposal_ids.next()
        data = wrap(self.member_id, proposal_id, encode_envelope(envelope))
        queue = lambda: self._proposals.queue(proposal_id, data, term)  # noqa: E731
        observe = self.metrics.proposal_seconds.observe
        return self._waiters.register(
            proposal_id, queue, timeout_s, self.wake, data, envelope, observe
        )

    async def read_barrier(self, timeout_s: float = 5.0) -> None:
        if UNSAFE_STALE_READS:
            return
        if self.leader_id == NONE:
            raise NoLeaderError()
        future = self._reads.wait(self._sm.applied_index)
        if future.done():
            return  # a leased read of applied state: no turn of the loop to wait for
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            raise ProposalTimeoutError(
                f"linearizable read not confirmed within {timeout_s:.1f}s"
            ) from None

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
            for batch in by_revision(found):
                yield batch
            if batch:
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
        storage = self.storage
        assert storage is not None
        return node_status(
            self.member_id,
            self.cluster_id,
            self.raw,
            storage,
            self.membership.members(),
            self._sm.cluster_version,
        )

    # ---------------------------------------------------------------- membership

    async def wait_for_leader_change(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._leader_signal.wait()

    async def snapshot_now(self) -> int:
        assert self._snapshots is not None, "the member is not started"
        return await self._snapshots.snapshot_now()

    async def backup(self) -> tuple[BackupHeader, bytes]:
        """The state at the applied index, for a backup file (``upkeep.take_backup``)."""
        snapshots, storage = self._snapshots, self.storage
        assert snapshots is not None and storage is not None, "the member is not started"
        self.require_leader()
        return await take_backup(
            self.member_id,
            self.cluster_id,
            snapshots,
            storage,
            self._capture(),
            int(self._term),
            wall_clock_ms(),
        )

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
