"""One run: a fresh cluster in namespaces, every chosen workload's clients, one nemesis mix,
then the checks and the report. And the matrices of runs behind ``make jepsen`` and
``make jepsen-long``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import random
import shutil
import time
import traceback
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rallypoint.client import Client
from rallypoint.worker.process_tree import kill_descendants
from tests.upgrade import previous

from . import availability, checkers, netns, workloads
from .cluster import NamespaceCluster, process_environment
from .history import NEMESIS_PROCESS, EventType, HistoryWriter, Operation, pair, read_history
from .nemesis import Faults, heal_all, run_schedule
from .report import RunSummary, plot_run, write_run_report

ALL_WORKLOADS = ("register", "set", "lease", "watch", "rendezvous", "store")
LEASE_TTL_S = 1.5
# The members' timing: an election timeout of 0.5 s (randomised up to 1 s).
TICK_MS = 50
ELECTION_TICKS = 10
ELECTION_TIMEOUT_S = TICK_MS * ELECTION_TICKS / 1000
CHECK_BUDGET_S = 60.0


@dataclass(frozen=True)
class RunSpec:
    name: str
    nemesis: str
    nodes: int
    time_s: float
    seed: int
    workloads: tuple[str, ...] = ALL_WORKLOADS
    # A test-only switch in the members ("stale-reads", "stale-fence") for negative controls,
    # and the checker expected to catch it.
    unsafe: str | None = None
    expect_violation: str | None = None
    # How the workloads' clients send KV reads and writes (Client's kv_batching): "always" runs
    # them over the KV/Batch stream, the register's writers sharing one client so that
    # concurrent operations ride in one message.
    kv_batching: str = "off"
    # Start every member on this commit's build (the previous release, tests/upgrade); the
    # ``upgrade`` fault replaces them by this checkout's one at a time.
    previous: str | None = None


def _select(ops: Sequence[Operation], predicate: Callable[[Operation], bool]) -> list[Operation]:
    return [op for op in ops if predicate(op)]


def check(ops: Sequence[Operation], chosen: Sequence[str]) -> list[checkers.CheckResult]:
    results = []
    if "register" in chosen:
        register_ops = _select(ops, lambda op: op.key.startswith("reg/"))
        results.append(checkers.check_register(register_ops, CHECK_BUDGET_S))
    if "set" in chosen:
        results.append(checkers.check_set(_select(ops, lambda op: op.key == "set")))
    if "lease" in chosen:
        lease_ops = _select(ops, lambda op: op.key in ("lease", "fenced/store"))
        results.append(checkers.check_lease(lease_ops))
    if "watch" in chosen:
        watch_ops = _select(ops, lambda op: op.key == "watch" or op.key.startswith("watch/"))
        results.append(checkers.check_watch(watch_ops))
    if "rendezvous" in chosen:
        results.append(checkers.check_rendezvous(_select(ops, lambda op: op.key == "jepsen")))
    if "store" in chosen:
        store_ops = _select(ops, lambda op: op.key.startswith("store/"))
        results.append(checkers.check_register(store_ops, CHECK_BUDGET_S, name="store"))
    return results


# A nemesis schedule: (faults, history, stop at, origin, log); ``run_schedule`` over the
# run's mix unless a run brings its own (tests/upgrade's fixed order of upgrades).
Schedule = Callable[[Faults, HistoryWriter, float, float, list[str]], Coroutine[Any, Any, Any]]


async def _drive(
    spec: RunSpec,
    cluster: NamespaceCluster,
    history: HistoryWriter,
    log: list[str],
    schedule: Schedule | None = None,
) -> dict[int, int]:
    """Clients and nemesis for ``spec.time_s``, then heal and drain; the nemesis's doings
    are appended to ``log`` as they happen. Returns the members that exited on their own
    (id -> exit code)."""
    rng = random.Random(spec.seed)
    await asyncio.to_thread(cluster.leader, 30.0)
    loop = asyncio.get_running_loop()

    def record_health(health: availability.Health) -> None:
        # Called from the nemesis's threads: the history is written on the loop's thread.
        loop.call_soon_threadsafe(
            history.record,
            NEMESIS_PROCESS,
            EventType.HEALTH,
            "health",
            "",
            health.to_json(),
            health.time_s,
        )

    cluster.on_change = record_health
    cluster.note_change()
    crashes: dict[int, int] = {}
    watcher = asyncio.create_task(_watch_members(cluster, record_health, crashes, log, history))
    async with (
        Client(cluster.endpoints, timeout_s=10.0) as admin,
        contextlib.AsyncExitStack() as clients,
    ):
        watch_start = (await admin.range("watch/", limit=1, keys_only=True)).header.revision + 1
        stop_at = time.monotonic() + spec.time_s
        ctx = workloads.Context(
            cluster.endpoints,
            history,
            random.Random(rng.random()),
            stop_at,
            kv_batching=spec.kv_batching,
        )
        tasks: list[Coroutine[Any, Any, None]] = []
        if "register" in spec.workloads:
            endpoints = cluster.endpoints
            writer = None
            if spec.kv_batching != "off":
                writer = await workloads.connect(ctx, clients)
            tasks += [
                workloads.register_client(
                    ctx, keys=6, home=endpoints[i % len(endpoints)], writer=writer
                )
                for i in range(5)
            ]
        if "set" in spec.workloads:
            tasks += [workloads.set_client(ctx, worker) for worker in range(2)]
        if "lease" in spec.workloads:
            tasks += [workloads.lease_client(ctx, LEASE_TTL_S) for _ in range(4)]
        if "rendezvous" in spec.workloads:
            tasks += [workloads.rendezvous_participant(ctx, f"w{i}") for i in range(3)]
        if "store" in spec.workloads:
            held = workloads.StoreRound()
            tasks.append(workloads.store_owner(ctx, held))
            tasks += [workloads.store_client(ctx, held) for _ in range(3)]
        if "watch" in spec.workloads:
            tasks.append(workloads.watch_writer(ctx))
            drain_until = stop_at + 15.0

            def finished(last_revision: int) -> bool:
                if time.monotonic() > drain_until:
                    return True
                if ctx.running():
                    return False
                acknowledged = [
                    e.value["revision"]
                    for e in history.events
                    if e.f == "put" and e.type is EventType.OK
                ]
                return last_revision >= max(acknowledged, default=0)

            tasks += [workloads.watch_reader(ctx, watch_start, finished) for _ in range(3)]
        client_tasks = [asyncio.create_task(t) for t in tasks]
        faults = Faults(cluster, random.Random(rng.random()), admin, asyncio.get_running_loop())
        origin_s = history.events[0].time_s if history.events else time.monotonic()
        if schedule is None:
            await run_schedule(faults, spec.nemesis, history, stop_at, origin_s, log=log)
        else:
            await schedule(faults, history, stop_at, origin_s, log)
        healed = await asyncio.to_thread(heal_all, faults)
        log.append(f"{time.monotonic() - origin_s:8.3f} {healed}")
        await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        done, pending = await asyncio.wait(client_tasks, timeout=30.0)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                error = task.exception()
                log.append(f"client task failed: {type(error).__name__}: {error}")
        if "set" in spec.workloads:
            current = [cluster.members[m].client_address for m in sorted(cluster.active)]
            await workloads.set_final_read(ctx, time.monotonic() + 20.0, current)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    cluster.on_change = None
    await asyncio.sleep(0)  # let the last health records reach the history
    return crashes


async def _watch_members(
    cluster: NamespaceCluster,
    record: Callable[[availability.Health], None],
    crashes: dict[int, int],
    log: list[str],
    history: HistoryWriter,
) -> None:
    """Every half second: record the health when it changed without a fault saying so (a
    member that died by itself), and note each member that exited on its own."""
    origin_s = history.events[0].time_s if history.events else time.monotonic()
    last = cluster.health()
    while True:
        await asyncio.sleep(0.5)
        for member_id, code in cluster.exited_on_their_own().items():
            if member_id not in crashes:
                crashes[member_id] = code
                log.append(
                    f"{time.monotonic() - origin_s:8.3f} member {member_id} exited on its own "
                    f"(exit code {code}): see its log"
                )
        health = cluster.health()
        if (health.voters, health.up, health.blocked, health.degraded) != (
            last.voters,
            last.up,
            last.blocked,
            last.degraded,
        ):
            record(health)
        last = health


def blank_summary(spec: RunSpec) -> RunSummary:
    """A run's summary before anything ran: no operations, no verdicts."""
    return RunSummary(
        spec.name,
        "+".join(spec.workloads),
        spec.nemesis,
        spec.nodes,
        spec.time_s,
        0,
        expected_violation=spec.expect_violation,
    )


def run_one(spec: RunSpec, directory: Path) -> RunSummary:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    network = netns.Network()
    history = HistoryWriter(directory / "history.jsonl")
    summary = blank_summary(spec)
    log: list[str] = []
    crashes: dict[int, int] = {}
    cluster: NamespaceCluster | None = None
    try:
        network.setup()
        (directory / "data").mkdir()
        cluster = NamespaceCluster(
            directory / "data",
            network,
            spec.nodes,
            env=process_environment(spec.unsafe),
            tick_ms=TICK_MS,
            election_ticks=ELECTION_TICKS,
            snapshot_entries=2000,
        )
        if spec.previous is not None:
            build = previous.extract(spec.previous, directory)
            cluster.builds = dict.fromkeys(cluster.members, build)
        cluster.start_all()
        crashes = asyncio.run(_drive(spec, cluster, history, log))
    except Exception as error:  # reported as the run's error; the matrix goes on
        summary.error = f"{type(error).__name__}: {error}"
        log.append(traceback.format_exc())
    finally:
        history.close()
        if cluster is not None:
            cluster.on_change = None
            cluster.shutdown()
        network.teardown()
    events = read_history(directory / "history.jsonl")
    ops = list(pair(events))
    summary.operations = len(ops)
    summary.results = check(ops, spec.workloads)
    if spec.expect_violation is None:
        verdict, summary.windows = availability.check_availability(
            events, availability.bound_s(ELECTION_TIMEOUT_S), slow_s=ELECTION_TIMEOUT_S
        )
        summary.results.append(verdict)
    summary.results.append(checkers.check_members(crashes))
    plots = plot_run(events, ops, directory, summary.windows)
    summary.report_path = write_run_report(summary, events, log, plots, directory)
    # Keep the members' logs, drop their data directories (WAL segments are large).
    if cluster is not None:
        for member in cluster.members.values():
            shutil.rmtree(member.data_dir, ignore_errors=True)
    if spec.previous is not None:
        shutil.rmtree(previous.source_dir(spec.previous, directory), ignore_errors=True)
    return summary


SHORT_MIXES = (
    ("partition", 5),
    ("net-slow", 3),
    ("kill", 5),
    ("pause", 3),
    ("clock", 3),
    ("corrupt", 3),
    ("wipe", 3),
    ("membership", 3),
)
LONG_MIXES = (
    "partition",
    "net-slow",
    "kill",
    "pause",
    "clock",
    "corrupt",
    "wipe",
    "membership",
    "mixed",
    "upgrade",
)


def init_lane(lanes: Any) -> None:
    """Pool worker start-up: take a lane of its own (see :mod:`netns`) for all its runs."""
    netns.set_lane(lanes.get())
    logging.basicConfig(level=logging.ERROR)


def run_parallel(
    specs: Sequence[RunSpec], out: Path, lanes: int
) -> Iterator[tuple[int, RunSummary]]:
    """Run ``specs`` in ``lanes`` worker processes at once, each in its own network lane;
    yields (index in ``specs``, summary) as runs finish. Every lane is cleaned at the end."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    for lane in range(1, lanes + 1):
        queue.put(lane)
    pool = concurrent.futures.ProcessPoolExecutor(
        lanes, mp_context=context, initializer=init_lane, initargs=(queue,)
    )
    try:
        futures = {pool.submit(run_one, spec, out / spec.name): i for i, spec in enumerate(specs)}
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            try:
                yield index, future.result()
            except Exception as error:  # a worker died: that run did not complete
                summary = blank_summary(specs[index])
                summary.error = f"{type(error).__name__}: {error}"
                yield index, summary
        pool.shutdown()
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): the runs in flight are not waited for (a pool's
        # shutdown would wait for each to finish, up to a run's whole time). Its workers and
        # their members are killed, then the lanes cleaned below.
        kill_descendants()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        for lane in range(1, lanes + 1):
            netns.set_lane(lane)
            netns.cleanup()
        netns.set_lane(0)


def short_matrix(time_s: float, seed: int) -> list[RunSpec]:
    specs = [
        RunSpec(f"{mix}-{nodes}n", mix, nodes, time_s, seed + i)
        for i, (mix, nodes) in enumerate(SHORT_MIXES)
    ]
    batched = RunSpec(
        "partition-3n-kvbatch",
        "partition",
        3,
        time_s,
        seed + len(specs),
        ("register",),
        kv_batching="always",
    )
    return [*specs, batched, *negative_controls(time_s, seed)]


def negative_controls(time_s: float, seed: int) -> list[RunSpec]:
    return [
        RunSpec(
            "control-stale-reads",
            "partition",
            3,
            time_s,
            seed + 100,
            ("register",),
            unsafe="stale-reads",
            expect_violation="register",
        ),
        RunSpec(
            "control-stale-reads-kvbatch",
            "partition",
            3,
            time_s,
            seed + 102,
            ("register",),
            unsafe="stale-reads",
            expect_violation="register",
            kv_batching="always",
        ),
        RunSpec(
            "control-stale-store-cache",
            "partition",
            3,
            time_s,
            seed + 103,
            ("store",),
            unsafe="stale-store-cache",
            expect_violation="store",
        ),
        RunSpec(
            "control-stale-fence",
            "partition",
            3,
            time_s,
            seed + 101,
            ("lease",),
            unsafe="stale-fence",
            expect_violation="lease",
        ),
    ]


def long_matrix(runs: int, time_s: float, seed: int, mixes: Sequence[str]) -> list[RunSpec]:
    """``runs`` runs per mix, alternating 3 and 5 members; a run's seed depends only on its
    mix and number, so choosing fewer mixes replays the same runs."""
    unknown = sorted(set(mixes) - set(LONG_MIXES))
    if unknown:
        raise ValueError(f"unknown fault mixes {unknown}; choose from {', '.join(LONG_MIXES)}")
    return [
        RunSpec(
            f"{mix}-{i + 1:02d}",
            mix,
            3 if i % 2 == 0 else 5,
            time_s,
            seed + 1000 * LONG_MIXES.index(mix) + i,
            previous=previous.PINNED_COMMIT if mix == "upgrade" else None,
        )
        for mix in mixes
        for i in range(runs)
    ]
