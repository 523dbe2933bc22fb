"""A rolling upgrade with real processes of two releases, under the fault-injection suite's
workloads and checks; then the same in reverse, which must stop at the gate.

Theory of operation. Three members of the previous release (``previous.PINNED_COMMIT``,
built from this repository) form a cluster in network namespaces (tests/jepsen) while the
register, set, lease and watch workloads run. The schedule, in this order:

1. each member in turn is replaced by this checkout's build (the ``upgrade`` fault: a
   graceful stop, the same data directory, this build; caught up before the next);
2. before the last one, with a leader of this build, a feature newer than the baseline
   (``Put.keep_lease``, record version 2) must be refused with ``ClusterVersionError``: a
   member of the previous release could not read it;
3. once every member runs this build, the leader raises the cluster version by itself; every
   member must report it;
4. the new feature is then used and must work (a put that keeps its key's lease).

The run is checked as a fault-injection run is (linearizability of the registers, the set,
the leases' fencing, watch order, no member exiting on its own), and a window without a
successful write longer than ``STALL_S`` while a majority was up is a stall. Then the
reverse: a member of this build (the cluster version raised) is stopped and its data
directory started with the previous release, which must refuse to start, saying why; the
cluster keeps writing meanwhile, and the member restarted with this build has every write.

The last line is ``upgrade: N steps, V violations, S stalls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rallypoint.client import Client, ClusterVersionError, RallypointError
from rallypoint.coordinator.version import RECORD_VERSION
from tests.integration.harness import wait_until
from tests.jepsen import availability, checkers, netns
from tests.jepsen.cluster import NamespaceCluster, process_environment
from tests.jepsen.history import NEMESIS_PROCESS, EventType, HistoryWriter, pair, read_history
from tests.jepsen.nemesis import Faults
from tests.jepsen.runner import ELECTION_TICKS, TICK_MS, RunSpec, _drive, check

from . import previous

# A window without a successful write longer than this, while a majority was up, is a stall.
STALL_S = 3.0
WORKLOADS = ("register", "set", "lease", "watch")
# What the old build says when it opens a data directory of cluster version 2: its
# snapshot is in format 8, which it does not read (machine.py of the pinned commit).
OLD_BUILD_REFUSAL = "snapshot format 8 is newer than the formats this build reads"


@dataclass
class Outcome:
    steps: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    stalls: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def step(self, what: str) -> None:
        self.steps.append(what)
        self.log.append(f"step {len(self.steps)}: {what}")

    def violation(self, what: str) -> None:
        self.violations.append(what)
        self.log.append(f"VIOLATION: {what}")

    def last_line(self) -> str:
        return (
            f"upgrade: {len(self.steps)} steps, {len(self.violations)} violations, "
            f"{len(self.stalls)} stalls"
        )


def _leader_endpoint(cluster: NamespaceCluster) -> tuple[int, str]:
    leader = cluster.leader(timeout_s=20.0)
    return leader, cluster.members[leader].client_address


async def _upgrade_schedule(
    outcome: Outcome,
    faults: Faults,
    history: HistoryWriter,
    stop_at_s: float,
    origin_s: float,
    log: list[str],
) -> None:
    cluster = faults.cluster
    quiet_s = 1.5

    def note(what: str) -> None:
        log.append(f"{time.monotonic() - origin_s:8.3f} {what}")

    await asyncio.sleep(quiet_s)  # the workloads against the previous release alone
    while True:
        older = [m for m in sorted(cluster.active) if m in cluster.builds]
        if not older:
            break
        if len(older) == 1:
            await _feature_refused(outcome, cluster, older[0], note)
        what, _ = await asyncio.to_thread(faults.upgrade)
        history.record(NEMESIS_PROCESS, EventType.START, "upgrade", "", what)
        history.record(NEMESIS_PROCESS, EventType.STOP, "upgrade", "", "upgraded")
        note(what)
        outcome.step(what)
        await asyncio.sleep(quiet_s)
    await _cluster_version_raised(outcome, cluster, note)
    await _feature_used(outcome, cluster, note)
    await asyncio.sleep(max(0.0, stop_at_s - time.monotonic()))


async def _feature_refused(outcome: Outcome, cluster: NamespaceCluster, older: int, note) -> None:  # type: ignore[no-untyped-def]
    """With one member left on the previous release and a leader of this build, the newer
    feature is refused at the proposal point, naming the version it needs."""
    leader, endpoint = await asyncio.to_thread(_leader_endpoint, cluster)
    if leader == older:
        async with Client(cluster.endpoints, timeout_s=10.0) as admin:
            target = min(m for m in cluster.active if m != older)
            await admin.transfer_leader(target)
        leader, endpoint = await asyncio.to_thread(_leader_endpoint, cluster)
    async with Client([endpoint], timeout_s=10.0) as client:
        try:
            await client.put("upgrade/feature", "too early", keep_lease=True)
        except ClusterVersionError as error:
            if "needs cluster version 2" not in str(error):
                outcome.violation(f"the refusal does not name the version it needs: {error}")
            note(f"refused below the cluster version: {error}")
            outcome.step(f"a feature of version 2 refused while member {older} is older")
            return
    outcome.violation(f"Put.keep_lease was accepted while member {older} runs the previous release")


async def _cluster_version_raised(outcome: Outcome, cluster: NamespaceCluster, note) -> None:  # type: ignore[no-untyped-def]
    async with Client(cluster.endpoints, timeout_s=10.0) as client:
        deadline = time.monotonic() + 20.0
        while True:
            statuses = await client.status()
            versions = {
                s.status.member_id: (s.status.record_version, s.status.cluster_version)
                for s in statuses
                if s.status is not None
            }
            if len(versions) == len(cluster.active) and all(
                v == (RECORD_VERSION, RECORD_VERSION) for v in versions.values()
            ):
                note(f"cluster version {RECORD_VERSION} on every member: {versions}")
                outcome.step(f"cluster version raised to {RECORD_VERSION} on every member")
                return
            if time.monotonic() > deadline:
                outcome.violation(f"the cluster version was not raised in 20 s: {versions}")
                return
            await asyncio.sleep(0.2)


async def _feature_used(outcome: Outcome, cluster: NamespaceCluster, note) -> None:  # type: ignore[no-untyped-def]
    async with Client(cluster.endpoints, timeout_s=10.0) as client:
        lease = await client.grant_lease(30.0)
        await client.put("upgrade/feature", "v1", lease=lease)
        result = await client.put("upgrade/feature", "v2", keep_lease=True)
        await lease.revoke()
        if result.kv.lease_id != lease.lease_id:
            outcome.violation(f"keep_lease lost the lease: {result.kv}")
            return
        gone = await client.get("upgrade/feature")
        if gone is not None:
            outcome.violation("the kept lease's revocation left the key")
            return
    note("Put.keep_lease used after the upgrade")
    outcome.step("the new feature used: a put kept its key's lease")


def _reverse(outcome: Outcome, cluster: NamespaceCluster, build: previous.Build) -> None:
    """A member of this build, its data directory opened by the previous release: refused."""
    victim = max(cluster.active)
    cluster.stop(victim)
    cluster.builds[victim] = build
    cluster.start(victim)
    member = cluster.members[victim]
    wait_until(lambda: not member.running, 30.0, f"member {victim} (previous release) to exit")
    member.stopped = True  # expected
    text = cluster.log_text(victim)
    if OLD_BUILD_REFUSAL not in text:
        outcome.violation(f"member {victim} of the previous release did not refuse: see its log")
    else:
        line = next(x for x in text.splitlines()[::-1] if OLD_BUILD_REFUSAL in x)
        outcome.log.append(f"member {victim} (previous release) refused: {line.strip()}")
        outcome.step("the previous release refused a data directory of cluster version 2")

    async def write_and_check() -> None:
        async with Client(cluster.endpoints, timeout_s=10.0) as client:
            written = await client.put("upgrade/while-refused", "x")
            # The workloads have stopped: nothing writes after this but this check.
            expected = [kv async for kv in client.range_pages("")]
            del cluster.builds[victim]
            await asyncio.to_thread(cluster.start, victim)
            endpoint = cluster.members[victim].client_address
            deadline = time.monotonic() + 30.0
            while True:
                # Unavailable while it starts (a namespace's member answers after a while).
                with contextlib.suppress(RallypointError):
                    status = await client.member_status(endpoint, timeout_s=2.0)
                    if status.applied_index >= written.header.revision:
                        break
                if time.monotonic() > deadline:
                    outcome.violation(f"member {victim} did not catch up after the refusal")
                    return
                await asyncio.sleep(0.2)
            async with Client([endpoint], timeout_s=10.0) as local:
                have = {kv.key: kv.value async for kv in local.range_pages("", serializable=True)}
            missing = [kv for kv in expected if have.get(kv.key) != kv.value]
            # A key bound to a lease goes when the lease expires (a lease workload's client
            # stopped while holding its lock): missing here only if the cluster still has it.
            for kv in [kv for kv in missing if kv.lease_id]:
                now = await client.get(kv.key)
                if now is None or have.get(kv.key) == now.value:
                    missing.remove(kv)
            missing = [kv.key for kv in missing]
        if missing:
            outcome.violation(f"member {victim} lacks {len(missing)} keys: {missing[:5]}")
            return
        outcome.step(f"member {victim} restarted with this build: all {len(expected)} keys there")

    asyncio.run(write_and_check())


def run_upgrade(
    directory: Path,
    time_s: float,
    seed: int = 38,
    lane: int = 38,
    workloads: tuple[str, ...] = WORKLOADS,
) -> Outcome:
    """One rolling upgrade and its reverse; the outcome (``last_line`` says it)."""
    # Absolute: the previous release's members import it from here, from their own cwd.
    directory = directory.resolve()
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    outcome = Outcome()
    build = previous.extract(previous.PINNED_COMMIT, directory)
    netns.set_lane(lane)
    network = netns.Network()
    history = HistoryWriter(directory / "history.jsonl")
    cluster: NamespaceCluster | None = None
    crashes: dict[int, int] = {}
    spec = RunSpec("upgrade", "upgrade", 3, time_s, seed, workloads, previous=build.name)
    try:
        network.setup()
        (directory / "data").mkdir()
        cluster = NamespaceCluster(
            directory / "data",
            network,
            3,
            env=process_environment(None),
            tick_ms=TICK_MS,
            election_ticks=ELECTION_TICKS,
            snapshot_entries=2000,
        )
        cluster.builds = dict.fromkeys(cluster.members, build)
        cluster.start_all()
        # Members of either build start in seconds; on a loaded machine (CI beside other
        # jobs) a Python process with grpc takes far longer to import: wait here, not in the
        # run's budget.
        cluster.leader(timeout_s=120.0)

        async def schedule(*args):  # type: ignore[no-untyped-def]
            await _upgrade_schedule(outcome, *args)

        crashes = asyncio.run(_drive(spec, cluster, history, outcome.log, schedule))
        history.close()
        events = read_history(directory / "history.jsonl")
        ops = list(pair(events))
        results = check(ops, workloads)
        results.append(checkers.check_members(crashes))
        for result in results:
            outcome.log.append(f"{result.checker}: {result.outcome.value}: {result.summary}")
            if result.outcome is not checkers.Outcome.VALID:
                outcome.violation(f"{result.checker}: {result.outcome.value}: {result.summary}")
        verdict, windows = availability.check_availability(events, STALL_S, slow_s=0.5)
        outcome.log.append(f"availability: {verdict.summary}")
        outcome.stalls = [
            f"{w.duration_s:.1f} s without a write ({w.majority_s:.1f} s with a majority up)"
            for w in windows
            if w.majority_s > STALL_S
        ]
        if verdict.outcome is checkers.Outcome.UNKNOWN:
            outcome.violation(f"availability: {verdict.summary}")
        outcome.log.append(f"{len(ops)} operations")
        _reverse(outcome, cluster, build)
    finally:
        with contextlib.suppress(Exception):
            history.close()
        if cluster is not None:
            cluster.on_change = None
            cluster.shutdown()
        network.teardown()
        netns.set_lane(0)
        report = [*outcome.log, outcome.last_line()]
        (directory / "upgrade.log").write_text("\n".join(report) + "\n")
    return outcome
