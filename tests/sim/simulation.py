"""The discrete-event loop that runs one seed: a whole Raft cluster under faults.

Theory of operation. Time is an integer (1000 units per tick). A heap holds the pending
events, ordered by (time, sequence number), so the run is a pure function of the seed:

- tick: a node's logical clock fires (each node at its own phase, with a little jitter);
- ready: the next step of a node's Ready handling (see :mod:`tests.sim.node`);
- deliver: a message arrives (the network decided its delay, or lost it, at send time);
- fault start / end: a partition is cut or healed, a node crashes or restarts, or crashes
  and loses its disk (a wipe);
- ask: a node with an empty disk asks the initial members it can reach whether the cluster
  exists, and ``bootstrap_rule.decide`` (the coordinator's own rule) creates, rejoins
  (abstaining until caught up) or waits a tick and asks again. A node answers "established"
  when its durable state holds an election or an entry beyond the creation; a node that is
  down, or cut off in either direction, does not answer;
- client: a proposal, a ReadIndex, a conf change, a leadership transfer, a forced campaign,
  or an application snapshot with log compaction;
- heal: the end of the fault phase: every fault is undone, crashed nodes restart, removed
  nodes shut down, the network stops losing messages;
- probe: after a quiet period, a new proposal goes to the leader, retried until it is applied
  on every voter of the latest configuration; the run ends there, or with a liveness
  violation when the bound passes.

After every event the nodes it touched report their state to the :class:`Checker`; any
broken invariant raises :class:`Violation` out of :meth:`Simulation.run`.
"""

from __future__ import annotations

import contextlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rallypoint.coordinator.bootstrap_rule import Answer, Decision, decide
from rallypoint.raft import (
    BasicStatus,
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfState,
    Message,
    MessageType,
    NodeId,
    ProposalDroppedError,
    RawNode,
    Snapshot,
    SnapshotStatus,
    StateType,
    StepPeerNotFoundError,
)
from rallypoint.raft.describe import describe_message
from tests.raft.internals import raft_core_for_tests

from .checker import Checker, Violation
from .network import Link, Network, chain, isolate, one_way, split
from .node import SimNode, Stage, bootstrap_snapshot
from .schedule import TICK, Fault, FaultKind, OpKind, Profile, SimParams, stream

#: A hard cap on events per run: a run that exceeds it is a simulator bug, not a Raft one.
MAX_EVENTS = 400_000

Handler = Callable[[Any], None]


@dataclass(slots=True)
class RunStats:
    events: int = 0
    elections: int = 0
    crashes: int = 0
    proposals: int = 0
    conf_changes: int = 0
    snapshots: int = 0
    messages: int = 0
    dropped: int = 0
    reads_checked: int = 0
    snapshots_sent: int = 0  # MsgSnap messages
    transfers: int = 0  # MsgTimeoutNow messages (a leadership transfer's last step)
    configs: int = 0  # distinct configurations applied (joint ones included)
    joint_configs: int = 0
    committed: int = 0
    end_time: int = 0
    wipes: int = 0  # disks lost (WIPE faults that struck)
    creations: int = 0  # empty nodes the bootstrap rule let create the cluster
    rejoins: int = 0  # empty nodes that rejoined, abstaining until caught up


@dataclass(slots=True)
class Options:
    """What the runner may vary between replays of one seed (the shrinker's knobs)."""

    disabled_faults: frozenset[int] = frozenset()
    disabled_ops: frozenset[OpKind] = frozenset()
    trace: bool = False
    trace_sink: list[str] | None = field(default=None)


class Simulation:
    """One seed's cluster and event loop (see the module docstring)."""

    def __init__(self, params: SimParams, options: Options | None = None) -> None:
        self.params = params
        self.options = options or Options()
        seed = params.seed
        self.checker = Checker()
        self.network = Network(stream(seed, "net"), params.network)
        self._sched_rng = stream(seed, "sched")  # tick jitter and Ready step delays
        self._client_rng = stream(seed, "client")
        self._kill_rng = stream(seed, "kill")
        # Pending events by (time, seq); seq is unique and increasing, so ties keep their
        # scheduling order and handlers are never compared.
        self._heap: list[tuple[int, int, Handler, object]] = []
        self._seq = 0
        self.now = 0  # time of the event being handled; never decreases
        self.stats = RunStats()
        self.trace: list[str] = (
            self.options.trace_sink if self.options.trace_sink is not None else []
        )
        self._tracing = self.options.trace
        self._touched: list[SimNode] = []  # nodes the current event touched
        initial = tuple(NodeId(i) for i in range(1, params.cluster_size + 1))
        snap = bootstrap_snapshot(initial)
        self._initial = frozenset(int(i) for i in initial)
        self._creation = snap
        self.nodes: dict[NodeId, SimNode] = {}  # every server ever created, by id; never shrinks
        for node_id in initial:
            self._add_node(node_id, snap)
        self.checker.observe_conf(1, snap.metadata.conf_state)
        self._spares = [
            NodeId(i)
            for i in range(params.cluster_size + 1, params.cluster_size + params.spare_ids + 1)
        ]
        self._crashed_by: dict[int, NodeId] = {}  # fault number -> the node it crashed
        # (receiver, sender) -> the sender's data directory the receiver last heard from.
        self._disks_seen: dict[tuple[NodeId, NodeId], int] = {}
        self._counter = 0  # makes proposal values and read contexts unique within the run
        self._phase_faults = True  # False from healing on: no faults or operations after that
        self._probe_index = 0  # index at which the liveness proposal was first applied
        self._probe_values: set[bytes] = set()
        self._done = False  # the liveness proposal reached every voter: the run is over
        for fault in params.faults:
            if fault.number not in self.options.disabled_faults:
                self._at(fault.start, self._on_fault_start, fault)
                self._at(fault.end, self._on_fault_end, fault)
        self._at(self._client_gap(), self._on_client, None)
        self._at(params.fault_ticks * TICK, self._on_heal, None)
        if params.late_member:
            # Down before its first tick: its disk holds the creation and nothing else.
            late = self.nodes[NodeId(params.late_member)]
            late.crash()
            self._at(params.late_until, self._on_revive, (late, late.incarnation))

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> RunStats:
        """Run to the end of the liveness check; raises Violation on any broken invariant."""
        self._log(self.params.describe())
        heap = self._heap
        while heap and not self._done:
            time, _, handler, arg = heapq.heappop(heap)
            self.now = time
            self.stats.events += 1
            if self.stats.events > MAX_EVENTS:
                raise RuntimeError(f"seed {self.params.seed}: more than {MAX_EVENTS} events")
            self._touched.clear()
            handler(arg)
            for node in self._touched:
                led, committed = node.leader_term, node.seen_commit
                node.observe(self.checker)
                if node.leader_term and self._phase_faults:
                    if node.leader_term != led:
                        self._maybe_kill(node, self.params.kill_on_election_prob, TICK // 4)
                    elif node.seen_commit > committed:
                        self._maybe_kill(node, self.params.kill_on_commit_prob, TICK // 5)
                if node.just_caught_up:
                    node.just_caught_up = False
                    if self._phase_faults and node.alive:
                        self._kill_leader_of(node)
                self._maybe_schedule_ready(node)
            if not self._phase_faults and self._probe_index:
                self._check_probe_done()
        if not self._done:
            raise RuntimeError("the event queue ran dry before the liveness check finished")
        return self.final_stats()

    def final_stats(self) -> RunStats:
        """The run's figures so far (complete once run() returned or raised)."""
        self.stats.end_time = self.now
        self.stats.messages = self.network.sent
        self.stats.dropped = self.network.dropped
        self.stats.reads_checked = self.checker.reads_checked
        self.stats.committed = self.checker.commit_max
        self.stats.elections = len(self.checker.leaders)
        self.stats.configs = len(self.checker.configs)
        self.stats.joint_configs = sum(
            1 for c in self.checker.configs.values() if c.voters_outgoing
        )
        return self.stats

    def _at(self, time: int, handler: Handler, arg: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, handler, arg))

    def _log(self, text: str) -> None:
        if self._tracing:
            self.trace.append(f"{self.now / TICK:9.3f}  {text}")

    def _touch(self, node: SimNode) -> None:
        self._touched.append(node)

    # -- nodes ---------------------------------------------------------------------------

    def _add_node(self, node_id: NodeId, initial: Snapshot | None) -> SimNode:
        node = SimNode(
            node_id,
            self.params.options,
            f"{self.params.seed}/node{node_id}",
            initial,
            self._log if self._tracing else None,
        )
        self.nodes[node_id] = node
        self._schedule_ticks(node, self._sched_rng.randrange(TICK))
        self._touch(node)
        return node

    def _schedule_ticks(self, node: SimNode, delay: int) -> None:
        self._at(self.now + delay, self._on_tick, (node, node.incarnation))

    def _on_tick(self, arg: tuple[SimNode, int]) -> None:
        node, incarnation = arg
        if node.incarnation != incarnation or not node.alive:
            return
        node.rawnode().tick()
        self._touch(node)
        jitter = self._sched_rng.randint(-TICK // 20, TICK // 20)
        self._schedule_ticks(node, TICK + jitter)

    def _maybe_schedule_ready(self, node: SimNode) -> None:
        raw = node.raw
        if raw is None or node.ready_scheduled or node.stage is not Stage.IDLE:
            return
        if raw.has_ready():
            node.ready_scheduled = True
            self._at(
                self.now + self._sched_rng.randint(1, 60),
                self._on_ready,
                (node, node.incarnation),
            )

    def _on_ready(self, arg: tuple[SimNode, int]) -> None:
        node, incarnation = arg
        if node.incarnation != incarnation or not node.alive:
            return
        before = node.stage
        messages = node.step_ready(self.checker)
        if self._tracing:
            self._log(f"node {node.id} ready {before.name} -> {node.stage.name}")
        for m in messages:
            self._send(m)
        if node.stage is Stage.APPLIED and self._probe_values and not self._probe_index:
            assert node.ready is not None
            for entry in node.ready.committed_entries:
                if entry.data in self._probe_values:
                    self._probe_index = entry.index
                    break
        self._touch(node)
        if node.stage is Stage.IDLE:
            node.ready_scheduled = False
        else:
            self._at(self.now + self._sched_rng.randint(1, 80), self._on_ready, (node, incarnation))

    # -- network -------------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        if m.type is MessageType.MsgSnap:
            self.stats.snapshots_sent += 1
        elif m.type is MessageType.MsgTimeoutNow:
            self.stats.transfers += 1
        delays = self.network.plan(m.from_, m.to)
        if self._tracing:
            fate = "lost" if not delays else "+".join(str(d) for d in delays)
            self._log(f"send {describe_message(m)} [{fate}]")
        if not delays:
            self._lost(m, cut=(m.from_, m.to) in self.network.blocked)
        # Stamped as the coordinator's peer batches are: the sender's data directory and
        # whether it abstains, as of sending (a message of a life before a wipe may arrive
        # after the new life's first one).
        sender = self.nodes[m.from_]
        for delay in delays:
            self._at(self.now + delay, self._on_deliver, (m, sender.disks, sender.abstaining))

    def _lost(self, m: Message, cut: bool) -> None:
        sender = self.nodes.get(m.from_)
        if sender is None or sender.raw is None:
            return
        if m.type is MessageType.MsgSnap:
            sender.raw.report_snapshot(m.to, SnapshotStatus.FAILURE)
            self._touch(sender)
        elif cut and self._sched_rng.random() < 0.3:
            sender.raw.report_unreachable(m.to)
            self._touch(sender)

    def _on_deliver(self, arg: tuple[Message, int, bool]) -> None:
        m, disks, abstaining = arg
        node = self.nodes.get(m.to)
        link: Link = (m.from_, m.to)
        if node is None or node.raw is None or link in self.network.blocked:
            self._log(f"lost {describe_message(m)}")
            self._lost(m, cut=True)
            return
        self._log(f"deliver {describe_message(m)}")
        # As the coordinator does (PeerFace.deliver), with every message: an abstaining
        # peer's acknowledgements count toward no quorum; and a message from another data
        # directory than the last one heard from (PeerFace._note_incarnation) that abstains
        # tells a leader its record of the peer is void. A late message of the life before
        # is "another" too, so the next one of the new life resets the record again, after
        # the late acknowledgement raised it (the simulator's wipe seed 3728).
        node.raw.report_abstaining(m.from_, abstaining)
        seen = self._disks_seen.get((m.to, m.from_), 0)
        self._disks_seen[(m.to, m.from_)] = disks
        if abstaining and seen != disks:
            node.raw.report_lost_data(m.from_)
        with contextlib.suppress(StepPeerNotFoundError, ProposalDroppedError):
            node.raw.step(m)
        self._touch(node)
        if m.type is MessageType.MsgSnap:
            sender = self.nodes.get(m.from_)
            if sender is not None and sender.raw is not None:
                sender.raw.report_snapshot(m.to, SnapshotStatus.FINISH)
                self._touch(sender)

    # -- faults --------------------------------------------------------------------------

    def live_ids(self) -> list[NodeId]:
        return [i for i, n in self.nodes.items() if n.alive]

    def leader(self) -> SimNode | None:
        """The live leader with the highest term, if any."""
        best: SimNode | None = None
        for node in self.nodes.values():
            raw = node.raw
            if (
                raw is not None
                and raw.basic_status().soft_state.raft_state is StateType.LEADER
                and (
                    best is None
                    or raw.basic_status().hard_state.term
                    > best.rawnode().basic_status().hard_state.term
                )
            ):
                best = node
        return best

    def _on_fault_start(self, fault: Fault) -> None:
        if not self._phase_faults:
            return
        rng = random.Random(fault.seed)
        ids = sorted(i for i, n in self.nodes.items() if not n.stopped)
        leader = self.leader()
        target = leader.id if leader is not None else rng.choice(ids)
        kind = fault.kind
        links: set[Link] | None = None
        if kind in (FaultKind.CRASH, FaultKind.CRASH_LEADER):
            victim = target if kind is FaultKind.CRASH_LEADER else rng.choice(ids)
            node = self.nodes[victim]
            if node.alive:
                node.crash()
                self.stats.crashes += 1
                self._crashed_by[fault.number] = victim
                self._log(f"fault {fault.describe()}: crash node {victim} (stage lost)")
            return
        if kind is FaultKind.WIPE:
            self._wipe(fault, rng)
            return
        if kind is FaultKind.ISOLATE_ONE:
            links = isolate(rng.choice(ids), ids)
        elif kind is FaultKind.ISOLATE_LEADER:
            links = isolate(target, ids)
        elif kind is FaultKind.SPLIT:
            order = list(ids)
            rng.shuffle(order)
            minority = len(order) // 2
            links = split([order[:minority], order[minority:]])
        elif kind is FaultKind.BRIDGE:
            order = list(ids)
            rng.shuffle(order)
            rest = order[1:]
            links = split([rest[: len(rest) // 2], rest[len(rest) // 2 :]])
        elif kind is FaultKind.CHAIN:
            order = list(ids)
            rng.shuffle(order)
            links = chain(order, ring=rng.random() < 0.5)
        else:  # ONE_WAY: a node (often the leader) that hears but is not heard, or the reverse
            node_id = target if rng.random() < 0.5 else rng.choice(ids)
            others = [i for i in ids if i != node_id]
            if rng.random() < 0.5:
                links = one_way([node_id], others)
            else:
                links = one_way(others, [node_id])
        self.network.cut(fault.number, links)
        self._log(f"fault {fault.describe()}: cut {sorted(links)}")

    def _on_fault_end(self, fault: Fault) -> None:
        if not self._phase_faults:
            return
        victim = self._crashed_by.pop(fault.number, None)
        if victim is not None:
            self._restart(self.nodes[victim])
        else:
            self.network.heal(fault.number)
            self._log(f"heal {fault.describe()}")

    def _wipe(self, fault: Fault, rng: random.Random) -> None:
        """Crash a node and lose its disk, unless that would leave more lost disks than
        Raft tolerates: one node at a time may be empty or abstaining (no data of its own
        yet), so a majority of intact disks always remains. Half the time another node
        crashes with it and comes back later (the issue's "kill 1 and 3, wipe 3"), and half
        the time a member still down since the creation starts together with the wiped one
        ("start 3 and 2")."""
        ids = sorted(i for i, n in self.nodes.items() if n.alive)
        recovering = [n.id for n in self.nodes.values() if n.empty or n.abstaining]
        if not ids or recovering:
            self._log(f"fault {fault.describe()}: no wipe (recovering: {recovering})")
            return
        victim = self.nodes[rng.choice(ids)]
        victim.crash()
        victim.wipe()
        self.stats.crashes += 1
        self.stats.wipes += 1
        self._crashed_by[fault.number] = victim.id
        self._log(f"fault {fault.describe()}: crash node {victim.id} and wipe its disk")
        others = [i for i in ids if i != victim.id]
        if others and rng.random() < 0.5:
            holder = self.nodes[rng.choice(others)]
            holder.crash()
            self.stats.crashes += 1
            back = fault.end + rng.randint(TICK, 10 * TICK)
            self._at(back, self._on_revive, (holder, holder.incarnation))
            self._log(
                f"fault {fault.describe()}: crash node {holder.id} too, until {back / TICK:.2f}"
            )
        late = self.nodes.get(NodeId(self.params.late_member))
        if late is not None and not late.alive and rng.random() < 0.5:
            # Just before or just after the wiped node's restart at the fault's end.
            when = fault.end + rng.choice((-1, 1))
            self._at(when, self._on_revive, (late, late.incarnation))

    def _on_ask(self, arg: tuple[SimNode, int]) -> None:
        """A node with an empty disk asks the initial members (see the module docstring)."""
        node, incarnation = arg
        if node.incarnation != incarnation or not node.empty or node.stopped:
            return
        blocked = self.network.blocked
        answers = {}
        for peer_id in sorted(self._initial - {int(node.id)}):
            peer = self.nodes[NodeId(peer_id)]
            reachable = (node.id, peer.id) not in blocked and (peer.id, node.id) not in blocked
            if reachable and (peer.alive or peer.empty) and not peer.stopped:
                established = not peer.holds_nothing_beyond_creation()
                answers[peer_id] = Answer(peer_id, established, peer.knows(node.id))
        verdict = decide(int(node.id), self._initial, answers)
        if verdict.decision is Decision.CREATE or verdict.decision is Decision.REJOIN:
            rejoin = verdict.decision is Decision.REJOIN
            self._log(
                f"node {node.id} (empty disk) {verdict.decision.value}"
                + (f" (node {verdict.answered_by} is established): abstains" if rejoin else "")
            )
            node.install_creation(self._creation, abstaining=rejoin)
            if rejoin:
                self.stats.rejoins += 1
            else:
                self.stats.creations += 1
            self._schedule_ticks(node, self._sched_rng.randrange(TICK))
            self._touch(node)
            return
        # WAIT, or REFUSED (the operator would add the member and start it again).
        self._at(self.now + TICK, self._on_ask, (node, node.incarnation))

    def _maybe_kill(self, node: SimNode, probability: float, max_delay: int) -> None:
        """The reactive KILL_LEADER fault: crash ``node`` (a leader) within ``max_delay``."""
        if (
            probability
            and OpKind.KILL_LEADER not in self.options.disabled_ops
            and self._kill_rng.random() < probability
        ):
            delay = self._kill_rng.randint(0, max_delay)
            self._at(self.now + delay, self._on_kill, (node, node.incarnation))

    def _kill_leader_of(self, node: SimNode) -> None:
        """Wipe profile: ``node`` just voted again (caught up), so the leader it caught up
        with may crash now and the next leader needs its vote; if it stopped abstaining
        before holding everything committed, that leader may lack entries committed with
        its lost acknowledgements (the leader completeness check catches it)."""
        lead = node.rawnode().basic_status().soft_state.lead
        leader = self.nodes.get(lead)
        if leader is not None and leader.alive:
            self._maybe_kill(leader, self.params.kill_on_caught_up_prob, TICK // 5)

    def _on_kill(self, arg: tuple[SimNode, int]) -> None:
        node, incarnation = arg
        if not self._phase_faults or node.incarnation != incarnation or not node.alive:
            return
        node.crash()
        self.stats.crashes += 1
        self._log(f"kill leader {node.id}")
        restart_in = self._kill_rng.randint(TICK, 6 * TICK)
        self._at(self.now + restart_in, self._on_revive, (node, node.incarnation))

    def _on_revive(self, arg: tuple[SimNode, int]) -> None:
        node, incarnation = arg
        if self._phase_faults and node.incarnation == incarnation:
            self._restart(node)

    def _restart(self, node: SimNode) -> None:
        if node.alive or node.stopped:
            return
        if node.empty:
            node.incarnation += 1  # one asking loop at a time
            self._log(f"restart node {node.id} with an empty disk: asking the initial members")
            self._on_ask((node, node.incarnation))
            return
        node.start()
        self._log(f"restart node {node.id} from durable storage")
        self._schedule_ticks(node, self._sched_rng.randrange(TICK))
        self._touch(node)

    # -- client and operator actions -----------------------------------------------------

    def _client_gap(self) -> int:
        lo, hi = self.params.op_gap
        return self.now + self._client_rng.randint(lo, hi)

    def _on_client(self, _: object) -> None:
        if not self._phase_faults:
            return
        self._at(self._client_gap(), self._on_client, None)
        weights = {
            k: w
            for k, w in self.params.op_weights.items()
            if w and k not in self.options.disabled_ops
        }
        if not weights:
            return
        rng = self._client_rng
        kind = rng.choices(list(weights), list(weights.values()))[0]
        live = [n for n in self.nodes.values() if n.alive]
        if not live:
            return
        leader = self.leader()
        self._counter += 1
        if kind is OpKind.PROPOSE:
            node = leader if leader is not None and rng.random() < 0.6 else rng.choice(live)
            self._propose(node, b"v%d" % self._counter)
        elif kind is OpKind.READ:
            node = rng.choice(live)
            ctx = b"r%d" % self._counter
            self.checker.read_issued(node.id, ctx)
            node.rawnode().read_index(ctx)
            self._log(
                f"node {node.id} read_index {ctx!r} (known committed {self.checker.commit_max})"
            )
            self._touch(node)
        elif kind is OpKind.SNAPSHOT:
            node = rng.choice(live)
            if node.compact(keep_entries=rng.randint(0, 5)):
                self.stats.snapshots += 1
                self._log(f"node {node.id} snapshot at {node.app_applied} and compact")
        elif leader is None:
            return
        elif kind is OpKind.CONF_CHANGE:
            self._propose_conf_change(leader, rng)
        elif kind is OpKind.TRANSFER:
            voters = self._voters(leader)
            target = rng.choice(voters)
            if target != leader.id:
                leader.rawnode().transfer_leader(target)
                self._log(f"node {leader.id} transfer_leader -> {target}")
                self._touch(leader)
        else:  # CAMPAIGN: a follower forced to start an election (leader churn)
            followers = [n for n in live if n.id != leader.id and n.id in self._voters(leader)]
            if followers:
                node = rng.choice(followers)
                node.rawnode().campaign()
                self._log(f"node {node.id} campaign")
                self._touch(node)

    def _submit(self, node: SimNode, what: str, action: Callable[[RawNode], None]) -> bool:
        """Hand a proposal to ``node``; False (and logged) if the core dropped it."""
        try:
            action(node.rawnode())
        except ProposalDroppedError as exc:
            self._log(f"node {node.id} {what} dropped: {exc}")
            return False
        finally:
            self._touch(node)
        self._log(f"node {node.id} {what}")
        return True

    def _propose(self, node: SimNode, data: bytes) -> None:
        if self._submit(node, f"propose {data!r}", lambda raw: raw.propose(data)):
            self.stats.proposals += 1

    @staticmethod
    def _conf(node: SimNode) -> ConfState:
        return raft_core_for_tests(node.rawnode()).trk.conf_state()

    def _voters(self, node: SimNode) -> list[NodeId]:
        cs = self._conf(node)
        return sorted(set(cs.voters) | set(cs.voters_outgoing))

    def _propose_conf_change(self, leader: SimNode, rng: random.Random) -> None:
        cs = self._conf(leader)
        if cs.voters_outgoing:
            if not cs.auto_leave:
                self._submit_conf_change(leader, ConfChange())
            return
        voters, learners = list(cs.voters), list(cs.learners)
        options: list[tuple[ConfChangeSingle, ...]] = []
        add = ConfChangeType.ADD_NODE
        learner = ConfChangeType.ADD_LEARNER_NODE
        remove = ConfChangeType.REMOVE_NODE
        spare = self._spare()
        if spare is not None:
            options.append((ConfChangeSingle(learner, spare),))
        for lid in learners:
            if len(voters) < self.params.max_voters:
                options.append((ConfChangeSingle(add, lid),))
            options.append((ConfChangeSingle(remove, lid),))
            for vid in voters:  # replace a voter by the learner, through joint consensus
                options.append((ConfChangeSingle(add, lid), ConfChangeSingle(remove, vid)))
        if len(voters) > 3:
            for vid in voters:
                options.append((ConfChangeSingle(remove, vid),))
                options.append((ConfChangeSingle(learner, vid),))  # demotion
        if spare is not None and len(voters) > 3:
            for vid in voters:
                options.append((ConfChangeSingle(learner, spare), ConfChangeSingle(learner, vid)))
        if not options:
            return
        changes = rng.choice(options)
        transition = rng.choice(list(ConfChangeTransition))
        for single in changes:
            if single.node_id not in self.nodes:
                self._add_node(single.node_id, None)
        self._submit_conf_change(leader, ConfChange(changes, transition))

    def _spare(self) -> NodeId | None:
        """An id never seen in a configuration: ids of removed nodes are never reused (a
        proposal that was dropped or replaced does not use its id up)."""
        for node_id in self._spares:
            if node_id not in self.checker.ever_members:
                return node_id
        return None

    def _submit_conf_change(self, leader: SimNode, cc: ConfChange) -> None:
        text = " ".join(f"{c.type.name}({c.node_id})" for c in cc.changes) or "leave-joint"
        what = f"propose_conf_change {text} {cc.transition.name}"
        if self._submit(leader, what, lambda raw: raw.propose_conf_change(cc)):
            self.stats.conf_changes += 1

    # -- healing and liveness ------------------------------------------------------------

    def _on_heal(self, _: object) -> None:
        self._phase_faults = False
        self.network.heal_all()
        self._crashed_by.clear()
        conf = self.checker.latest_conf
        members = set() if conf is None else set(conf.voters) | set(conf.voters_outgoing)
        members |= set() if conf is None else set(conf.learners) | set(conf.learners_next)
        self._log(f"heal all faults; members {sorted(members)}")
        # Down nodes come back in an order of the seed's choosing (processes start in any
        # order): a node with an empty disk asks whoever is up at that moment.
        order = list(self.nodes.values())
        if self.params.profile is Profile.WIPE:  # (other profiles keep their old runs)
            self._sched_rng.shuffle(order)
        for node in order:
            if node.id not in members:
                if node.alive:
                    node.crash()
                node.stopped = True
                self._log(f"node {node.id} shut down (not a member)")
            elif not node.alive:
                self._restart(node)
        p = self.params
        self._at(self.now + p.quiet_ticks * TICK, self._on_probe, None)
        self._at(self.now + p.liveness_ticks * TICK, self._on_deadline, None)

    def _on_probe(self, _: object) -> None:
        if self._done or self._probe_index:
            return
        period = self.params.options.election_tick * TICK // 2
        self._at(self.now + period, self._on_probe, None)
        leader = self.leader()
        if leader is None:
            return
        cs = self._conf(leader)
        if cs.voters_outgoing and not cs.auto_leave:
            self._submit_conf_change(leader, ConfChange())
        self._counter += 1
        value = b"probe%d" % self._counter
        self._probe_values.add(value)
        self._propose(leader, value)

    def _check_probe_done(self) -> None:
        conf = self.checker.latest_conf
        assert conf is not None
        voters = set(conf.voters) | set(conf.voters_outgoing)
        if all(self.nodes[v].app_applied >= self._probe_index for v in sorted(voters)):
            self._log(
                f"liveness: proposal at {self._probe_index} applied on voters {sorted(voters)}"
            )
            self._done = True

    def _on_deadline(self, _: object) -> None:
        if self._done:
            return
        states = "; ".join(
            f"node {n.id}: "
            + ("down" if n.raw is None else _describe(n.raw.basic_status()))
            + ("" if n.raw is None else f" applied {n.app_applied}")
            for n in self.nodes.values()
        )
        raise Violation(
            "liveness",
            f"{self.params.liveness_ticks} ticks after healing every fault, no new proposal "
            f"was applied on every voter of the latest configuration ({states})",
        )


def _describe(status: BasicStatus) -> str:
    return (
        f"term {status.hard_state.term} {status.soft_state.raft_state.name} "
        f"lead {status.soft_state.lead} commit {status.hard_state.commit}"
    )
