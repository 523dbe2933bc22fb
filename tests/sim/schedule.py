"""What one seed runs: the cluster's parameters and the fault schedule, drawn from the seed.

Theory of operation. A seed is expanded into independent ``random.Random`` streams, one per
component (``"<seed>/params"``, ``"<seed>/faults"``, ``"<seed>/net"``, ...; string seeds are
hashed with SHA-512 by ``random``, so the streams are stable across processes and Python
hash seeds). The fault schedule is drawn in full before the run starts, each fault with its
own sub-seed for the choices it makes when it fires (which node, which split), so the
shrinker can disable one fault and replay the rest unchanged.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from .network import NetworkParams
from .node import NodeOptions

#: Simulation time units per tick.
TICK = 1000


class FaultKind(enum.Enum):
    ISOLATE_ONE = "isolate-one"
    ISOLATE_LEADER = "isolate-leader"
    SPLIT = "majority-minority"
    BRIDGE = "bridge"
    CHAIN = "chain"
    ONE_WAY = "one-way"
    CRASH = "crash"
    CRASH_LEADER = "crash-leader"
    WIPE = "wipe"
    """A node crashes and loses its disk; it restarts empty, through the bootstrap rule."""


class Profile(enum.Enum):
    """The fault mix of a seed."""

    MIXED = "mixed"
    """Every kind of fault, moderate rates."""
    CHURN = "churn"
    """Leaders crashed and isolated often, forced campaigns, one entry per MsgApp: the
    schedules that expose commit-rule mistakes (the Raft paper's Figure 8)."""
    WIPE = "wipe"
    """Lost disks: nodes crash and come back empty, asking the initial members whether the
    cluster exists (coordinator/bootstrap_rule.py), while one initial member stays down from
    the creation for a while (it holds the creation only: it never got past it), other nodes
    crash, and partitions cut who can answer. No membership changes: the rule asks the
    initial members only."""


_WEIGHTS: dict[Profile, dict[FaultKind, int]] = {
    Profile.MIXED: {
        FaultKind.ISOLATE_ONE: 3,
        FaultKind.ISOLATE_LEADER: 3,
        FaultKind.SPLIT: 3,
        FaultKind.BRIDGE: 2,
        FaultKind.CHAIN: 2,
        FaultKind.ONE_WAY: 2,
        FaultKind.CRASH: 3,
        FaultKind.CRASH_LEADER: 3,
    },
    Profile.CHURN: {
        FaultKind.ISOLATE_LEADER: 3,
        FaultKind.CRASH_LEADER: 2,
        FaultKind.SPLIT: 1,
    },
    Profile.WIPE: {
        FaultKind.WIPE: 4,
        FaultKind.CRASH: 3,
        FaultKind.CRASH_LEADER: 2,
        FaultKind.ISOLATE_ONE: 1,
        FaultKind.SPLIT: 1,
    },
}

#: Share of seeds that draw the wipe profile (from a stream of their own, so the other
#: seeds' parameters are what they were before the profile existed).
WIPE_SHARE = 0.125


class OpKind(enum.Enum):
    """Client and operator actions, by category (the shrinker disables whole categories)."""

    PROPOSE = "propose"
    READ = "read-index"
    CONF_CHANGE = "conf-change"
    TRANSFER = "transfer-leader"
    CAMPAIGN = "campaign"
    SNAPSHOT = "snapshot"
    KILL_LEADER = "kill-leader"
    """Reactive fault (churn profile): a leader crashes moments after it is elected or after
    its commit index advances, before the news reaches its followers (it restarts a few ticks
    later)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: applied at ``start``, undone at ``end`` (simulation time units)."""

    number: int
    kind: FaultKind
    start: int
    end: int
    seed: int  # the fault's own choices (which node, which groups) come from Random(seed)

    def describe(self) -> str:
        return f"#{self.number} {self.kind.value} at {self.start / TICK:.2f}-{self.end / TICK:.2f}"


@dataclass(frozen=True, slots=True)
class SimParams:
    """Everything a seed decides before the run."""

    seed: int
    profile: Profile
    cluster_size: int
    spare_ids: int  # ids beyond the initial members, for the nodes conf changes add
    max_voters: int
    options: NodeOptions
    network: NetworkParams
    fault_ticks: int  # faults and client operations run for this long
    quiet_ticks: int  # after healing, before the liveness proposal
    liveness_ticks: int  # the bound: from healing to the proposal applied on every voter
    op_weights: dict[OpKind, int]
    op_gap: tuple[int, int]  # time between client operations (units)
    kill_on_election_prob: float  # chance a new leader is killed (KILL_LEADER)
    kill_on_commit_prob: float  # chance a leader is killed as its commit index advances
    # Wipe profile: chance the leader is killed as a node that lost its data votes again.
    kill_on_caught_up_prob: float
    faults: tuple[Fault, ...]
    # Wipe profile: an initial member down from the creation until ``late_until`` (units);
    # 0: none.
    late_member: int = 0
    late_until: int = 0

    def describe(self) -> str:
        o, n = self.options, self.network
        return (
            f"seed {self.seed}: {self.profile.value}, {self.cluster_size} nodes, "
            f"pre_vote={o.pre_vote} check_quorum={o.check_quorum} "
            f"max_size_per_msg={o.max_size_per_msg} max_inflight={o.max_inflight_msgs}, "
            f"drop={n.drop_prob} dup={n.dup_prob} delay={n.delay_min}-{n.delay_max}, "
            f"{len(self.faults)} faults over {self.fault_ticks} ticks"
            + (
                f", node {self.late_member} down from the creation to {self.late_until / TICK:.2f}"
                if self.late_member
                else ""
            )
        )


def stream(seed: int, component: str) -> random.Random:
    """The random stream of one component of a seed's run."""
    return random.Random(f"{seed}/{component}")


def params_for_seed(seed: int, fault_ticks: int = 120, profile: Profile | None = None) -> SimParams:
    """The parameters of ``seed``; ``profile`` forces a fault mix (else drawn: 1/4 churn)."""
    rng = stream(seed, "params")
    drawn = Profile.CHURN if rng.random() < 0.25 else Profile.MIXED
    if drawn is Profile.MIXED and stream(seed, "wipe-profile").random() < WIPE_SHARE:
        drawn = Profile.WIPE
    profile = profile or drawn
    churn = profile is Profile.CHURN
    wipe = profile is Profile.WIPE
    cluster_size = 3 if churn else rng.choice((3, 5))
    if profile is Profile.WIPE and stream(seed, "wipe-size").random() < 0.75:
        cluster_size = 3  # where one lost disk and one late member are as many as Raft allows
    options = NodeOptions(
        election_tick=3 if churn else 10,
        heartbeat_tick=1,
        pre_vote=rng.random() < 0.7,
        check_quorum=rng.random() < 0.7,
        max_size_per_msg=1 if churn else rng.choice((1, 200, 1 << 20)),
        max_inflight_msgs=rng.choice((1, 4, 256)),
        snapshot_busy_prob=rng.choice((0.0, 0.0, 0.3)),
    )
    delay_max = rng.choice((150, 400, 1000))
    network = NetworkParams(
        drop_prob=rng.choice((0.0, 0.02, 0.1, 0.2)),
        dup_prob=rng.choice((0.0, 0.05)),
        delay_min=20,
        delay_max=delay_max,
        long_delay_prob=rng.choice((0.0, 0.02)),
        long_delay_max=4 * TICK,
    )
    op_weights = {
        OpKind.PROPOSE: 40,
        OpKind.READ: 10,
        OpKind.CONF_CHANGE: 0 if churn or wipe else 5,
        OpKind.TRANSFER: 3,
        OpKind.CAMPAIGN: 8 if churn else 2,
        OpKind.SNAPSHOT: 6,
    }
    kill_on_election_prob = 0.5 if churn else 0.0
    kill_on_commit_prob = 0.5 if churn else 0.0
    late = stream(seed, "late")
    late_member = late.randint(1, cluster_size) if wipe else 0
    # Past the fault phase (a third of the seeds): down until every fault heals.
    late_until = int(late.uniform(0.0, 1.5 * fault_ticks) * TICK) if wipe else 0
    return SimParams(
        seed=seed,
        profile=profile,
        cluster_size=cluster_size,
        spare_ids=3,
        max_voters=5,
        options=options,
        network=network,
        fault_ticks=fault_ticks,
        quiet_ticks=5,
        liveness_ticks=300,
        op_weights=op_weights,
        op_gap=(TICK // 10, TICK * 2 // 3),
        kill_on_election_prob=kill_on_election_prob,
        kill_on_commit_prob=kill_on_commit_prob,
        kill_on_caught_up_prob=0.5 if wipe else 0.0,
        faults=make_faults(stream(seed, "faults"), profile, fault_ticks),
        late_member=late_member,
        late_until=late_until,
    )


def make_faults(rng: random.Random, profile: Profile, fault_ticks: int) -> tuple[Fault, ...]:
    weights = _WEIGHTS[profile]
    kinds = list(weights)
    churn = profile is Profile.CHURN
    mean_gap_ticks = 6.0 if churn else 10.0
    max_duration_ticks = 10.0 if churn else 25.0
    faults: list[Fault] = []
    t = rng.uniform(1.0, 8.0)
    while t < fault_ticks:
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        duration = rng.uniform(2.0, max_duration_ticks)
        start = int(t * TICK)
        faults.append(
            Fault(len(faults), kind, start, start + int(duration * TICK), rng.getrandbits(32))
        )
        t += rng.expovariate(1.0 / mean_gap_ticks)
    return tuple(faults)
