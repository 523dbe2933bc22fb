"""A rolling upgrade with real processes of two releases, under the fault-injection suite's
workloads and checks; then a member taken back to the previous release and forward again.

Theory of operation. Three members of the previous release (``previous.PINNED_COMMIT``,
built from this repository, on the stream peer transport) form a cluster in network
namespaces (tests/jepsen) while the register, set, lease and watch workloads run. The
schedule, in this order:

1. each member in turn is replaced by this checkout's build (the ``upgrade`` fault: a
   graceful stop, the same data directory, this build; caught up before the next), so that
   members of both builds replicate one log over the peer port between steps;
2. once every member runs this build, every member must report this build's record version
   as its own and as the cluster's;
3. ``Put.keep_lease`` (record version 2) is used and must work.

The run is checked as a fault-injection run is (linearizability of the registers, the set,
the leases' fencing, watch order, no member exiting on its own), and a window without a
successful write longer than ``STALL_S`` while a majority was up is a stall. Then the
reverse: a member of this build is stopped and its data directory started with the previous
release, which must catch up with every key the cluster holds when both builds are at one
record version, and must refuse to start (it is older than the cluster version) when this
build's is higher; then it is started with this build again and must have them all.

The pinned release is the first that speaks the stream peer protocol; the ones before it
speak gRPC on the peer port and cannot share a cluster with this build (docs/operations.md,
"Upgrading", says what moving such a cluster costs).

The last line is ``upgrade: N steps, V violations, S stalls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rallypoint.client import Client, RallypointError
from rallypoint.coordinator.version import RECORD_VERSION
from tests.jepsen import availability, checkers, netns
from tests.jepsen.cluster import NamespaceCluster, process_environment
from tests.jepsen.history import NEMESIS_PROCESS, EventType, HistoryWriter, pair, read_history
from tests.jepsen.nemesis import Faults
from tests.jepsen.runner import ELECTION_TICKS, TICK_MS, RunSpec, _drive, check

from . import previous

# A window without a successful write longer than this, while a majority was up, is a stall.
STALL_S = 3.0
WORKLOADS = ("register", "set", "lease", "watch")


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
        what, _ = await asyncio.to_thread(faults.upgrade)
        history.record(NEMESIS_PROCESS, EventType.START, "upgrade", "", what)
        history.record(NEMESIS_PROCESS, EventType.STOP, "upgrade", "", "upgraded")
        note(what)
        outcome.step(what)
        await asyncio.sleep(quiet_s)
    await _cluster_version_raised(outcome, cluster, note)
    await _feature_used(outcome, cluster, note)
    await asyncio.sleep(max(0.0, stop_at_s - time.monotonic()))


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
    """A member of this build taken back to the previous release, then forward again: each
    time it must catch up with every key the cluster holds."""
    victim = max(cluster.active)

    async def write_and_check() -> None:
        async with Client(cluster.endpoints, timeout_s=10.0) as client:
            for which, builds in (("the previous release", build), ("this build", None)):
                await asyncio.to_thread(cluster.stop, victim)
                if builds is None:
                    cluster.builds.pop(victim, None)
                else:
                    cluster.builds[victim] = builds
                written = await client.put("upgrade/while-restarted", which)
                await asyncio.to_thread(cluster.start, victim)
                if builds is not None and previous.PINNED_RECORD_VERSION < RECORD_VERSION:
                    # Older than the cluster version: a downgrade below it is refused.
                    if not await asyncio.to_thread(cluster.refused_to_start, victim):
                        outcome.violation(
                            f"member {victim} ran on {which} below the cluster version"
                        )
                        return
                    outcome.step(f"member {victim} on {which}: refused to start (cluster version)")
                    continue
                if not await _caught_up(outcome, client, cluster, victim, written, which):
                    return

    asyncio.run(write_and_check())


async def _caught_up(  # type: ignore[no-untyped-def]
    outcome: Outcome, client: Client, cluster: NamespaceCluster, victim: int, written, which: str
) -> bool:
    """Whether ``victim`` (just started on ``which``) caught up with every key."""
    # The workloads have stopped: nothing writes after this but this check.
    expected = [kv async for kv in client.range_pages("")]
    endpoint = cluster.members[victim].client_address
    deadline = time.monotonic() + 30.0
    while True:
        # Unavailable while it starts (a namespace's member answers after a while).
        with contextlib.suppress(RallypointError):
            status = await client.member_status(endpoint, timeout_s=2.0)
            if status.applied_index >= written.header.revision:
                break
        if time.monotonic() > deadline or not cluster.members[victim].running:
            outcome.violation(f"member {victim} on {which} did not catch up: see its log")
            return False
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
    if missing:
        keys = [kv.key for kv in missing]
        outcome.violation(f"member {victim} on {which} lacks {len(keys)} keys: {keys[:5]}")
        return False
    outcome.log.append(f"member {victim} on {which}: all {len(expected)} keys there")
    outcome.step(f"member {victim} restarted on {which}: all {len(expected)} keys there")
    return True


def run_upgrade(
    directory: Path,
    time_s: float,
    seed: int = 38,
    lane: int = 38,
    workloads: tuple[str, ...] = WORKLOADS,
) -> Outcome:
    """One rolling upgrade, then a member back and forth; the outcome (``last_line`` says
    it)."""
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
