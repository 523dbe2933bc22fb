"""Nemeses: the faults, and a schedule that mixes them.

Every fault is a pair (inflict, heal) run off the event loop (they block on subprocesses and
status polls) while the clients keep running. The schedule alternates a quiet interval with
one fault from the run's mix (each kind once, in a random order, before any repeats) held for
a few seconds, records a ``start`` and a ``stop``
event in the history for each (reports shade those windows), and heals everything at the end.

Timing against the cluster's settings (tick 50 ms, election after 10 ticks = 0.5 s, lease TTL
1.5 s in the lease workload): faults last 2-5 s, so pauses and partitions outlast both an
election timeout and a lease's TTL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

from rallypoint.client import Client, FailedPreconditionError, RallypointError
from tests.integration.harness import wait_until

from .cluster import NamespaceCluster
from .history import NEMESIS_PROCESS, EventType, HistoryWriter

Heal = Callable[[], str]
# `rallypoint serve`'s exit code when it refuses its data (a corrupt log among them).
REFUSED_EXIT_CODE = 2
# What a fault or its healing may fail with without ending the run (it is logged).
NEMESIS_ERRORS = (
    RallypointError,
    TimeoutError,
    concurrent.futures.TimeoutError,
    subprocess.CalledProcessError,
)


# The shapes successive ``Faults.wipe`` calls take, in order.
WIPE_SHAPES = ("follower", "follower-and-leader", "leader")


@dataclass
class Faults:
    cluster: NamespaceCluster
    rng: random.Random
    admin: Client
    loop: asyncio.AbstractEventLoop
    # Wipes inflicted so far (they cycle through WIPE_SHAPES).
    wipes: int = 0

    # ------------------------------------------------------------------ helpers

    def _members(self) -> list[int]:
        return sorted(self.cluster.active)

    def _leader(self) -> int | None:
        return self.cluster.leader_or_none(timeout_s=3.0)

    def _admin(self, coroutine: object) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ partitions

    def partition(self) -> tuple[str, Heal]:
        members = self._members()
        shapes = ["isolate-leader", "halves", "bridge"]
        if len(members) >= 5:
            shapes.append("ring")
        shape = self.rng.choice(shapes)
        blocked: set[tuple[int, int]] = set()
        if shape == "isolate-leader":
            leader = self._leader() or self.rng.choice(members)
            blocked = {(leader, m) for m in members if m != leader}
            what = f"isolate leader {leader}"
        elif shape == "halves":
            shuffled = self.rng.sample(members, len(members))
            minority = shuffled[: (len(members) - 1) // 2 or 1]
            majority = [m for m in members if m not in minority]
            blocked = {(a, b) for a in minority for b in majority}
            what = f"halves {sorted(minority)} | {sorted(majority)}"
        elif shape == "bridge":
            # Two halves that one member (the bridge) sees both of.
            shuffled = self.rng.sample(members, len(members))
            bridge, rest = shuffled[0], shuffled[1:]
            left, right = rest[: len(rest) // 2], rest[len(rest) // 2 :]
            blocked = {(a, b) for a in left for b in right}
            what = f"bridge {bridge} between {sorted(left)} and {sorted(right)}"
        else:
            # Majorities ring: each member sees its two neighbours on each side of a ring,
            # so every member sees a majority and no two see the same one.
            ring = self.rng.sample(members, len(members))
            position = {m: i for i, m in enumerate(ring)}
            n = len(ring)
            for a, b in combinations(members, 2):
                distance = min((position[a] - position[b]) % n, (position[b] - position[a]) % n)
                if distance > 1:
                    blocked.add((a, b))
            what = f"ring {ring}"
        self.cluster.network.block(blocked)
        return what, self._heal_network

    def _heal_network(self) -> str:
        self.cluster.network.heal()
        return "network healed"

    def slow_network(self) -> tuple[str, Heal]:
        members = self._members()
        chosen = self.rng.sample(members, self.rng.randint(1, len(members)))
        if self.rng.random() < 0.5:
            probability = self.rng.uniform(0.1, 0.4)
            self.cluster.network.lose(chosen, probability)
            return f"lose {probability:.0%} of peer packets at {sorted(chosen)}", self._heal_network
        delay_ms = self.rng.randint(50, 400)
        kind = self.cluster.network.delay(chosen, delay_ms, delay_ms // 4)
        return f"delay ({kind}) up to {delay_ms}ms at {sorted(chosen)}", self._heal_network

    # ------------------------------------------------------------------ processes

    def _victim(self) -> int:
        """The leader half the time, else a random running member."""
        members = [m for m in self._members() if self.cluster.members[m].running]
        if self.rng.random() < 0.5:
            leader = self._leader()
            if leader is not None and leader in members:
                return leader
        return self.rng.choice(members)

    def kill(self) -> tuple[str, Heal]:
        victim = self._victim()
        self.cluster.kill(victim)

        def restart() -> str:
            self.cluster.start(victim)
            return f"restarted {victim}"

        return f"kill -9 {victim}", restart

    def restart_then_kill(self) -> tuple[str, Heal]:
        """Kill -9 a member other than the leader, restart it after 1-3 s, then within a
        few seconds kill -9 the leader: the two members left (of three) must elect at once,
        which once failed for tens of seconds (the survivors' streams to the restarted
        member had lost their messages without a word)."""
        leader = self._leader()
        members = [m for m in self._members() if self.cluster.members[m].running]
        others = [m for m in members if m != leader]
        if leader is None or not others:
            raise AssertionError("no leader, or no other member running")
        restarted = self.rng.choice(others)
        self.cluster.kill(restarted)
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.cluster.start(restarted)  # returns once it answers
        time.sleep(self.rng.uniform(0.0, 2.0))
        leader = self._leader() or leader
        self.cluster.kill(leader)

        def restart() -> str:
            self.cluster.start(leader)
            return f"restarted {leader}"

        return f"restarted {restarted}, then kill -9 leader {leader}", restart

    def pause(self) -> tuple[str, Heal]:
        victim = self._victim()
        self.cluster.pause(victim)

        def resume() -> str:
            self.cluster.resume(victim)
            return f"resumed {victim}"

        return f"SIGSTOP {victim}", resume

    def clock(self) -> tuple[str, Heal]:
        victim = self._victim()
        offset_s = self.rng.choice([-1, 1]) * self.rng.uniform(1.0, 30.0)
        rate = self.rng.choice([0.5, 0.8, 1.5, 2.0])
        self.cluster.skew_clock(victim, offset_s, rate)

        def unskew() -> str:
            self.cluster.unskew_clock(victim)
            return f"clock of {victim} restored"

        return f"clock of {victim} {offset_s:+.1f}s x{rate}", unskew

    def corrupt(self) -> tuple[str, Heal]:
        victim = self._victim()
        self.cluster.kill(victim)
        damage = self.cluster.damage_wal(victim, self.rng)

        def restart() -> str:
            # Its refusal (exit 2) may come before refused_to_start looks: not a crash.
            member = self.cluster.members[victim]
            member.expected_exit_code = REFUSED_EXIT_CODE
            try:
                self.cluster.start(victim)
                refused = self.cluster.refused_to_start(victim)
            finally:
                member.expected_exit_code = None
            if not refused:
                return f"{victim} restarted with damaged WAL (recovered)"
            # Detected: the member refuses to run on a corrupt log. Replace it.
            replacement = self._replace(victim)
            return f"{victim} refused its corrupt WAL; replaced by {replacement}"

        return f"damage WAL of {victim}: {damage}", restart

    def wipe(self) -> tuple[str, Heal]:
        """A lost disk: kill -9 a member, delete its data directory and start it again at
        once, on empty storage. It must learn from the others that the cluster exists and
        rejoin without voting until it has caught up (coordinator/bootstrap_rule.py), never
        create a cluster of its own. Successive wipes of a run take these shapes in turn:

        - a follower, under a leader that stays up and still records what it held (the
          leader must send it everything again; its heartbeats once stopped it);
        - a follower killed together with the leader, which is restarted only on heal
          (issue 33's "kill 1 and 3, wipe 3, start 3"): it asks while a member holding the
          data is down;
        - the leader itself.

        Until it has caught up the wiped member does not count as up (it cannot vote)."""
        shape = WIPE_SHAPES[self.wipes % len(WIPE_SHAPES)]
        self.wipes += 1
        leader = self._leader()
        running = [m for m in self._members() if self.cluster.members[m].running]
        followers = [m for m in running if m != leader]
        if leader is None or not followers:
            raise AssertionError("no leader, or no follower running")
        victim = leader if shape == "leader" else self.rng.choice(followers)
        also = leader if shape == "follower-and-leader" else None
        self.cluster.kill(victim)
        if also is not None:
            self.cluster.kill(also)
        self.cluster.wipe(victim)
        self.cluster.recovering.add(victim)
        self.cluster.start(victim)  # returns once it answers (or after 20 s of waiting)

        def caught_up() -> bool:
            status = self.cluster.status(victim)
            return status is not None and not status.catching_up

        def restart() -> str:
            if also is not None:
                self.cluster.start(also)
            wait_until(caught_up, 30, f"wiped member {victim} to catch up")
            self.cluster.recovering.discard(victim)
            self.cluster.note_change()
            return f"{victim} rejoined and caught up" + (f"; restarted {also}" if also else "")

        killed = f"kill -9 {victim}" + (f" and leader {also}" if also is not None else "")
        return f"{shape}: {killed}, wipe {victim}'s data dir, start it empty", restart

    # ------------------------------------------------------------------ membership

    def _replace(self, old: int) -> int:
        self._admin(self.admin.member_remove(old, timeout_s=10))
        self.cluster.forget(old)
        return self._add()

    def _add(self) -> int:
        new = self.cluster.add_member_process()
        added, _ = self._admin(
            self.admin.member_add(new.peer_address, new.client_address, timeout_s=10)
        )  # type: ignore[misc]
        if added.member_id != new.member_id:
            raise AssertionError(
                f"the cluster numbered the new member {added.member_id}, not {new.member_id}"
            )
        self.cluster.active.add(new.member_id)
        self.cluster.learners.add(new.member_id)
        self.cluster.start(new.member_id, join=True)
        # Caught up = has applied what was committed when it was added. (Not "applied the
        # leader's commit index now": under a steady write load a healthy learner stays a
        # few entries behind a moving target, read a moment apart from its own.)
        target: list[int] = []  # the leader's commit index, once read

        def caught_up() -> bool:
            if not target:
                leader = self._leader()
                leader_status = self.cluster.status(leader) if leader else None
                if leader_status is not None:
                    target.append(leader_status.commit_index)
                return False
            status = self.cluster.status(new.member_id)
            return bool(status and status.applied_index >= target[0])

        wait_until(caught_up, 30, f"new member {new.member_id} to catch up")

        def promoted() -> bool:
            # The leader also checks (90% of its log); a learner just short of it is retried.
            try:
                self._admin(self.admin.member_promote(new.member_id, timeout_s=10))
            except FailedPreconditionError:
                return False
            return True

        wait_until(promoted, 30, f"the leader to accept member {new.member_id} as caught up")
        self.cluster.learners.discard(new.member_id)
        self.cluster.note_change()  # one more voter: the majority grows
        return new.member_id

    def membership(self) -> tuple[str, Heal]:
        """Grow by a new member (learner, caught up, promoted); on heal shrink back by
        removing a member other than the leader (the newest included: the cluster never
        gives a removed member's id again, and the harness numbers new members the same
        way, one above every id it ever made)."""
        added = self._add()

        def remove() -> str:
            leader = self._leader()
            candidates = [m for m in self._members() if m != leader]
            removed = self.rng.choice(candidates)
            self._admin(self.admin.member_remove(removed, timeout_s=10))
            self.cluster.forget(removed)
            return f"removed member {removed}"

        return f"added member {added}", remove

    # ------------------------------------------------------------------ upgrades

    def upgrade(self) -> tuple[str, Heal]:
        """Replace the lowest-numbered member still on another build (the previous release:
        tests/upgrade) by this checkout's build, as an operator upgrades one (README,
        "Upgrading"): a graceful stop (a leader hands leadership over first), then the same
        data directory started with this build, held until it has caught up. Nothing to heal:
        an upgrade stays; once every member runs this build the fault is not inflicted."""
        cluster = self.cluster
        older = [m for m in self._members() if m in cluster.builds and cluster.members[m].running]
        if not older:
            raise AssertionError("every running member runs this build already")
        member = older[0]
        build = cluster.builds.pop(member)
        cluster.stop(member)
        cluster.note_change()
        cluster.start(member)

        def caught_up() -> bool:
            leader = cluster.leader_or_none(timeout_s=2.0)
            if leader is None or not cluster.members[leader].running:
                return False
            ahead = cluster.status(leader)
            status = cluster.status(member)
            return (
                ahead is not None
                and status is not None
                and status.applied_index >= ahead.commit_index
            )

        wait_until(caught_up, 30.0, f"member {member} to catch up after its upgrade")
        return f"member {member}: {build.name} -> this build (caught up)", lambda: "upgraded"


MIXES: dict[str, list[str]] = {
    "none": [],
    "partition": ["partition"],
    "net-slow": ["slow_network"],
    "kill": ["kill", "restart_then_kill", "wipe"],
    "pause": ["pause"],
    "clock": ["clock"],
    "corrupt": ["corrupt", "wipe"],
    "wipe": ["wipe"],
    "membership": ["membership"],
    # A cluster started on the previous release (runner.RunSpec.previous), upgraded member
    # by member while members are killed and the network partitions.
    "upgrade": ["upgrade", "kill", "partition"],
    "mixed": [
        "partition",
        "slow_network",
        "kill",
        "restart_then_kill",
        "pause",
        "clock",
        "corrupt",
        "wipe",
        "membership",
    ],
}


async def run_schedule(
    faults: Faults,
    mix: str,
    history: HistoryWriter,
    stop_at_s: float,
    origin_s: float,
    fault_s: tuple[float, float] = (2.0, 5.0),
    quiet_s: tuple[float, float] = (1.0, 3.0),
    log: list[str] | None = None,
) -> list[str]:
    """Inflict faults from ``mix`` until ``stop_at_s``; a log of what was done (times in
    seconds from ``origin_s``), appended to ``log`` as it happens when one is given (so a
    run that fails part way still reports the faults before the failure)."""
    kinds = MIXES[mix]
    log = [] if log is None else log
    rng = faults.rng
    # Every kind of the mix once, in a random order, before any repeats: a short run
    # (a few faults) still inflicts each (``make jepsen``'s kill and corrupt runs, the wipe).
    round_left: list[str] = []
    while kinds and time.monotonic() + quiet_s[0] + fault_s[0] < stop_at_s:
        await asyncio.sleep(rng.uniform(*quiet_s))
        if not round_left:
            round_left = rng.sample(kinds, len(kinds))
        kind = round_left.pop()
        try:
            what, heal = await asyncio.to_thread(getattr(faults, kind))
        except (*NEMESIS_ERRORS, AssertionError) as error:
            why = f"{type(error).__name__}: {error}"
            log.append(f"{time.monotonic() - origin_s:8.3f} {kind}: not inflicted ({why})")
            continue
        history.record(NEMESIS_PROCESS, EventType.START, kind, "", what)
        log.append(f"{time.monotonic() - origin_s:8.3f} start {kind}: {what}")
        hold_s = min(rng.uniform(*fault_s), max(0.0, stop_at_s - time.monotonic()))
        await asyncio.sleep(hold_s)
        try:
            outcome = await asyncio.to_thread(heal)
        except (*NEMESIS_ERRORS, AssertionError) as error:
            outcome = f"heal failed: {type(error).__name__}: {error}"
        history.record(NEMESIS_PROCESS, EventType.STOP, kind, "", outcome)
        log.append(f"{time.monotonic() - origin_s:8.3f} stop {kind}: {outcome}")
    return log


def heal_all(faults: Faults) -> str:
    """Undo whatever is still in effect: network rules, pauses, kills, clock skew."""
    cluster = faults.cluster
    cluster.network.heal()
    for member_id in sorted(cluster.active):
        member = cluster.members[member_id]
        if member.paused:
            cluster.resume(member_id)
        if member_id in cluster.member_env:
            cluster.unskew_clock(member_id)
        if not member.running:
            cluster.start(member_id)
    return "all faults healed"
