"""Effective training time ratio (ETTR: productive time / wall time) of one large job under a
given interruption mix: a seeded discrete-event simulation in pure Python, no IO.

Theory of operation. Interruptions arrive as independent Poisson processes, one per root cause,
over the job's wall time. Each arrival is resolved into what it does to the job (``Kind``: a
host lost, one process crashed, one rank hung, every process dead, a planned drain or a
planned stop) by the cause's ``Scope`` and a per-event mark. A ``System`` answers each kind with
a ``Response``: how long every GPU stalls, where the state comes back from (``Tier``: the last
memory snapshot, the last disk checkpoint, only the step in flight, or nothing lost), and for
how long a fraction of the job is missing while the rest trains (torchft's replica group
waiting for its replacement). The timeline walks the events in order: between them the job
trains at its steady rate (less the fractions its checkpoints, snapshots and per-step costs
take), an event throws away the training done since the durable point its tier names, the
stall follows, and a degraded window runs from the stall's end. An event that arrives while the
job is still stalled waits for that stall to end (recoveries are serialised). What is lost is
attributed to the event's cause and to the way it was lost (``LOSS_KINDS``), so productive time
plus every loss is the wall time, exactly.

Common random numbers: each cause draws from its own generator (seeded by the run seed and the
cause's name) at a fixed maximum rate and thins to the rate asked for, so a change to one input
moves only what that input touches, and a higher rate only adds arrivals (the lower rate's
arrivals are a subset). That is what keeps a sensitivity table's differences from being noise.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

DAY_S = 86_400.0
# Arrivals are drawn at this multiple of a cause's published count and thinned down: the rate
# multipliers the sensitivity table and the tests use (up to 4x) reuse the same draws.
MAX_RATE_MULTIPLIER = 4.0
LOSS_KINDS = ("stall", "recompute", "degraded", "checkpoint_write", "snapshot", "per_step")
STEADY_CAUSE = "steady state (no interruption)"


class Scope(enum.Enum):
    """What a root cause takes away, as this model reads the published category."""

    HOST = "host"  # the host leaves the job until repaired; a spare takes its place
    NETWORK = "network"  # hosts_per_network_fault hosts lose their link
    SOFTWARE = "software"  # one process crashes, or (job_wide_software_fraction) every process
    HANG = "hang"  # one rank stops making progress with its process alive
    PLANNED = "planned"  # a drain at a step boundary, or (the rest) a stop of the whole job


class Kind(enum.Enum):
    HOST_LOST = "host_lost"
    PROCESS_CRASH = "process_crash"
    HANG = "hang"
    JOB_WIDE = "job_wide"
    DRAIN = "drain"
    PLANNED_RESTART = "planned_restart"


class Tier(enum.Enum):
    """Where the job's state comes back from after an event, i.e. what training is redone."""

    MEMORY = "memory"  # the last memory snapshot: training since it is redone
    DISK = "disk"  # the last disk checkpoint
    IN_FLIGHT = "in_flight"  # only the step in flight is dropped
    NONE = "none"  # nothing redone (a drain at a step boundary)
    FRESH_DISK = "fresh_disk"  # a checkpoint written at the stop: nothing redone, phases reset


@dataclass(frozen=True, slots=True)
class Cause:
    """One row of the published root-cause table. Invariant: count >= 0."""

    name: str
    category: str
    count: int
    share_pct: float  # as printed in the source, for the record
    scope: Scope
    scope_basis: str  # why this scope: the source's words, or "assumption: ..."


@dataclass(frozen=True, slots=True)
class Event:
    t_s: float
    cause: str
    kind: Kind
    hosts: int  # hosts the event takes away (HOST_LOST), else 1


@dataclass(frozen=True, slots=True)
class Response:
    """A system's answer to one event. Invariant: every duration >= 0, 0 <= fraction <= 1."""

    stall_s: float
    tier: Tier
    degraded_s: float = 0.0
    degraded_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class System:
    """A recovery strategy: ``respond`` answers an event; the steady fractions are the parts of
    training time its checkpoints, snapshots and per-step costs take; ``disk_interval_s`` and
    ``snapshot_interval_s`` place its durable points (0: none of that tier)."""

    name: str
    respond: Callable[[Event], Response]
    disk_interval_s: float
    snapshot_interval_s: float
    step_s: float
    checkpoint_write_fraction: float
    snapshot_fraction: float
    per_step_fraction: float


@dataclass(slots=True)
class Outcome:
    """One simulated run of one system. Invariant: productive_s + sum(lost_by_kind) == wall_s."""

    wall_s: float
    productive_s: float = 0.0
    lost_by_kind: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_KINDS, 0.0))
    lost_by_cause: dict[str, float] = field(default_factory=dict)
    events: int = 0

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s

    def lose(self, kind: str, cause: str, seconds: float) -> None:
        self.lost_by_kind[kind] += seconds
        self.lost_by_cause[cause] = self.lost_by_cause.get(cause, 0.0) + seconds


def resolve(cause: Cause, mark: float, values: Mapping[str, float]) -> tuple[Kind, int]:
    """What one arrival of ``cause`` does, given its uniform ``mark`` in [0, 1)."""
    if cause.scope is Scope.HOST:
        return Kind.HOST_LOST, 1
    if cause.scope is Scope.NETWORK:
        return Kind.HOST_LOST, max(1, round(values["hosts_per_network_fault"]))
    if cause.scope is Scope.SOFTWARE:
        job_wide = mark < values["job_wide_software_fraction"]
        return (Kind.JOB_WIDE if job_wide else Kind.PROCESS_CRASH), 1
    if cause.scope is Scope.HANG:
        return Kind.HANG, 1
    drain = mark < values["planned_drainable_fraction"]
    return (Kind.DRAIN if drain else Kind.PLANNED_RESTART), 1


def count_key(cause: Cause) -> str:
    """The input that holds a cause's count over the published window."""
    return f"interruptions[{cause.name}]"


def generate_events(causes: Sequence[Cause], values: Mapping[str, float], seed: int) -> list[Event]:
    """Every interruption of one simulated run, in time order. A cause's rate is its count
    (``values[count_key(cause)]``) over the published window (``values["window_days"]``)
    times ``values["interruption_rate_multiplier"]``, over a run of ``values["days"]``."""
    wall_s = values["days"] * DAY_S
    window_s = values["window_days"] * DAY_S
    multiplier = values["interruption_rate_multiplier"]
    events: list[Event] = []
    for cause in causes:
        if cause.count == 0:
            continue
        rate_per_s = values[count_key(cause)] * multiplier / window_s
        ceiling = max(MAX_RATE_MULTIPLIER, multiplier) * cause.count / window_s
        if rate_per_s > ceiling:
            raise ValueError(
                f"{count_key(cause)} x interruption_rate_multiplier is more than "
                f"{MAX_RATE_MULTIPLIER:g}x the published count; raise MAX_RATE_MULTIPLIER"
            )
        # String seeds hash deterministically (random's version 2 seeding), whatever
        # PYTHONHASHSEED says.
        rng = random.Random(f"{seed}:{cause.name}")
        t = rng.expovariate(ceiling)
        while t < wall_s:
            keep, mark = rng.random(), rng.random()
            if keep < rate_per_s / ceiling:
                kind, hosts = resolve(cause, mark, values)
                events.append(Event(t, cause.name, kind, hosts))
            t += rng.expovariate(ceiling)
    events.sort(key=lambda event: event.t_s)
    return events


def simulate(system: System, events: Sequence[Event], wall_s: float) -> Outcome:
    """Walk ``events`` (time-ordered) over ``wall_s`` seconds of wall time."""
    outcome = Outcome(wall_s)
    overhead = system.checkpoint_write_fraction + system.snapshot_fraction
    overhead += system.per_step_fraction
    if not 0.0 <= overhead < 1.0:
        raise ValueError(f"{system.name}: steady overheads sum to {overhead:g}, not in [0, 1)")
    rate = 1.0 - overhead
    now = 0.0
    since_disk = 0.0  # training wall time since the last disk checkpoint
    since_snapshot = 0.0
    since_step = 0.0
    degraded: list[tuple[float, float, float, str]] = []  # start, end, fraction, cause

    def train(until: float) -> None:
        nonlocal now, since_disk, since_snapshot, since_step
        span = until - now
        if span <= 0.0:
            return
        outcome.productive_s += span * rate
        for kind, fraction in (
            ("checkpoint_write", system.checkpoint_write_fraction),
            ("snapshot", system.snapshot_fraction),
            ("per_step", system.per_step_fraction),
        ):
            if fraction:
                outcome.lose(kind, STEADY_CAUSE, span * fraction)
        for start, end, fraction, cause in degraded:
            overlap = min(end, until) - max(start, now)
            if overlap > 0.0:
                outcome.productive_s -= overlap * fraction * rate
                outcome.lose("degraded", cause, overlap * fraction * rate)
        since_disk = _advance(since_disk, span, system.disk_interval_s)
        since_snapshot = _advance(since_snapshot, span, system.snapshot_interval_s)
        since_step = _advance(since_step, span, system.step_s)
        now = until

    for event in events:
        if event.t_s >= wall_s:
            break
        train(event.t_s)
        outcome.events += 1
        response = system.respond(event)
        redo = {
            Tier.MEMORY: since_snapshot,
            Tier.DISK: since_disk,
            Tier.IN_FLIGHT: since_step,
            Tier.NONE: 0.0,
            Tier.FRESH_DISK: 0.0,
        }[response.tier]
        if redo:
            outcome.productive_s -= redo * rate
            outcome.lose("recompute", event.cause, redo * rate)
        if response.tier in (Tier.DISK, Tier.FRESH_DISK):
            since_disk = since_snapshot = since_step = 0.0
        elif response.tier is Tier.MEMORY:
            since_disk = max(0.0, since_disk - redo)
            since_snapshot = since_step = 0.0
        elif response.tier is Tier.IN_FLIGHT:
            since_step = 0.0
        # Serialised recoveries: an event during a stall starts its own when that one ends.
        start = max(now, event.t_s)
        end = min(wall_s, start + response.stall_s)
        if end > start:
            outcome.lose("stall", event.cause, end - start)
        now = max(now, end)
        if response.degraded_s > 0.0 and response.degraded_fraction > 0.0:
            degraded.append(
                (now, now + response.degraded_s, response.degraded_fraction, event.cause)
            )
        degraded = [window for window in degraded if window[1] > now]
    train(wall_s)
    return outcome


def _advance(phase: float, span: float, interval: float) -> float:
    """Training time since the last durable point of a tier taken every ``interval`` seconds
    of training (0: that tier is never taken, so everything since the start counts)."""
    return phase + span if interval <= 0.0 else math.fmod(phase + span, interval)


def young_interval_s(cost_s: float, mean_time_between_failures_s: float) -> float:
    """Young's first-order optimum checkpoint interval, sqrt(2 x cost x MTBF) (Young 1974)."""
    return math.sqrt(2.0 * cost_s * mean_time_between_failures_s)
