"""Store benchmark: process-group bootstrap through the round store at 64/256/1024 ranks,
against torch's own TCPStore server in the same run.

Theory of operation. Every round change of a job re-forms its process group, and that
bootstrap is store traffic. Simulated ranks (bench/store_load.py, no torch) replay the access
patterns torch 2.13 makes, over the real protocols, against three stores:

- ``tcpstore`` (the anchor): torch's C++ TCPStore server (libuv backend) in a process of its
  own; each rank has its own connection and speaks the TCPStore wire protocol.
- ``rallypoint`` (the torchrun path): the same ranks and wire protocol against the agent's
  TCPStore bridge (rallypoint/worker/tcpstore/), one bridge per simulated node of
  ``--per-node`` ranks, each serving the round store of an ACTIVE round as its node's
  participant, forwarding to a 3-member cluster. Bridges run in the load process of their
  ranks, each with its own coordinator client (its own channels, session and batch streams,
  as in an agent), all of a process's bridges on its one event loop (``--bridge-loop
  shared``, the default). On a real cluster every agent's bridge is alone in its process on
  its own host; here 128 of them share 2 cores. ``--bridge-loop thread`` runs each on its own
  thread and event loop as the agent's ``TCPStoreBridge`` does, which adds what real agents
  do not have: 32 busy threads contending for one interpreter lock per process (measured:
  nccl at 1,024 about twice as slow, 1.1-1.3 s against 0.4-0.6 s).
- ``coordinator_store`` (the in-process API): every rank a participant of its own calling the
  client's ``RoundStore``, which ``CoordinatorStore`` wraps (one call per c10d call, ``get``
  and ``wait`` held by the server), one session per rank over one transport per process.
  Measured at ``--coordinator-sizes`` (one session per rank gets heavy at 1,024 here).

The patterns (recorded from torch 2.13, world 2-8: a ``torch.distributed.Store`` subclass
wrapping a TCPStore client and logging every call, passed as ``init_process_group(store=)``,
and a proxy decoding the wire requests between torch's C++ client and the server):

``gloo`` (``init_process_group("gloo")``: gloo's ``connectFullMesh``)
    Each rank sets one key, its own rank (c10d key ``0//cpu//0/<rank>`` under the group's
    prefix), whose value holds its addresses for every pair plus a per-peer sequence number:
    154 + 8 x N bytes (170, 178, 186, 218 at N = 2, 3, 4, 8; 666 at 64, 2,202 at 256, 8,346
    at 1,024). Then, in rank order 0..N-1 (its own key included), ``wait([key])`` and
    ``get(key)``. torch's C++ client turns ``get`` into WAIT + GET, so per rank the wire sees
    SET, then N x (WAIT, WAIT, GET): 3N + 1 requests and N^2 x (154 + 8N) bytes read in all
    (8.7 GB at 1,024). Before it, the client's constructor sends VALIDATE, PING and
    ``add("init/", 1)``, not replayed (connecting is outside the timed part). gloo's own
    ``barrier()`` afterwards uses no store.
``nccl`` (c10d's NCCL bootstrap; NCCL is not usable here, so from ProcessGroupNCCL's code)
    ``broadcastUniqueNCCLID``: rank 0 sets the 128-byte unique id under a counter key, every
    other rank ``get``s it (wire: WAIT + GET); then the store-based barrier
    (distributed_c10d.py ``_store_based_barrier``, on with TORCH_DIST_INIT_BARRIER=1):
    ``add(key, 1)``, ``add(key, 0)``, the rank that reads N sets ``key:last_worker``, every
    rank waits for it. About 5N requests. (Beyond 128 ranks with NCCL >= 2.23 torch uses
    ``allgatherUniqueNCCLIDs``: one root per 128 ranks sets an id, every rank multi-gets
    them all: the same order of requests; not replayed separately.)

A trial sends ``run`` to every load process at once; its seconds are from the first operation
any rank started to the last rank done, its ops/s the requests (TCPStore protocol) or calls
(RoundStore) made over them. Each pattern uses a fresh key prefix in one round's store per
(store, N). A trial still running after ``--trial-limit-s`` is stopped and written as not
finished with its progress (``ops`` done, ``ranks_done``, ``seconds_lower_bound``); the larger
sizes of that store and pattern are then skipped. Either counts as MISS.

``init_gloo``: a real ``init_process_group("gloo", init_method="env://")`` of
``--init-procs`` torch processes (16) plus one all-reduce: through torch's TCPStore as plain
torchrun without the agent store would (rank 0 hosts the server at MASTER_ADDR:MASTER_PORT),
and through rallypoint as the torchrun handler sets it up: TORCHELASTIC_USE_AGENT_STORE=True
and MASTER_PORT the bridge of the worker's node (``--per-node`` workers a node), the bridges
in a load process serving the round store as their node's participant. Seconds from the
common start instant to the last rank's return from ``init_process_group``.

Top level: ``nccl_1024_s`` (rallypoint), ``ratios`` (rallypoint seconds / tcpstore seconds
for ``gloo_256``, ``gloo_1024``, ``nccl_1024``), ``targets`` with PASS/MISS. With
``--profile-s``, py-spy records (``--gil``: only the thread running Python) the first load
process (its bridges) and every member during the first ``--profile-pattern`` (gloo) trial
of ``--profile-store`` (rallypoint) at ``--profile-size`` (the largest), and the JSON gets
their top functions.

    python -m bench.store_bench --out bench/results/store.json
    python -m bench.store_bench --smoke --out /tmp/store.json       # about a minute
"""

from __future__ import annotations

import os

# Load processes are started while gRPC's threads run; they exec at once (see rendezvous_bench).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import asyncio
import contextlib
import math
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cluster import RallypointCluster
from bench.common import (
    CpuSample,
    cpu_share,
    machine_info,
    package_versions,
    run_in_data_dir,
    sizes_arg,
    write_results,
)
from bench.load_process import LoadProcess, LoadProcessError, config_json, split, stop_all
from bench.profiling import PROFILE_RATE, find_py_spy, record
from bench.store_load import gloo_value_bytes
from rallypoint.client import Client, JobConfig, RallypointError, RoundState
from rallypoint.worker.process_tree import run_reaped

LOAD_MODULE = "bench.store_load"
STORES = ("tcpstore", "rallypoint", "coordinator_store")
PATTERNS = ("nccl", "gloo")
# name -> (direction, target); each target the stricter of those ever set for it (nccl_1024_s:
# 0.5 s from issue 18, 0.3 s from issue 39; bench/README.md says which).
TARGETS = {
    "nccl_1024_s": ("<=", 0.3),
    "gloo_256": ("<=", 1.5),
    "gloo_1024": ("<=", 2.0),
}
RATIO_KEYS = {
    "gloo_256": ("gloo", "256"),
    "gloo_1024": ("gloo", "1024"),
    "nccl_1024": ("nccl", "1024"),
}
# How long a load process gets to close (its bridges) before it is killed.
LOAD_STOP_S = 15.0


@dataclass
class StoreBench:
    args: argparse.Namespace
    log_dir: Path
    cluster: RallypointCluster | None = None
    admin: Client | None = None
    hosts: LoadProcess | None = None
    tcpstore: LoadProcess | None = None
    tcpstore_port: int = 0
    jobs: int = 0
    profile: dict[str, Any] = field(default_factory=dict)
    # "<store>/<N>" -> seconds the slowest load process took to make its bridges and connect
    # its ranks (not in the figures: torch connects before the bootstrap starts).
    setup_s: dict[str, float] = field(default_factory=dict)

    @property
    def endpoints(self) -> str:
        assert self.cluster is not None
        return ",".join(self.cluster.addresses.values())

    async def start(self, stores: Sequence[str]) -> None:
        args = self.args
        if "tcpstore" in stores:
            self.tcpstore = await LoadProcess.start(
                "tcpstore-server", "tcpstore-server", [], self.log_dir, module=LOAD_MODULE
            )
            ready = await self.tcpstore.expect("ready", args.phase_timeout_s)
            self.tcpstore_port = int(ready["port"])
        if any(store != "tcpstore" for store in stores):
            self.cluster = RallypointCluster(self.log_dir.parent / "cluster")
            self.cluster.start()
            await self.cluster.wait_ready()
            self.admin = Client(self.endpoints, timeout_s=60)
            await self.admin.connect()
            self.hosts = await LoadProcess.start(
                "hosts",
                "hosts",
                [
                    f"--endpoints={self.endpoints}",
                    "--name-prefix=p",
                    "--per-host=256",
                    "--interval-s=1.0",
                ],
                self.log_dir,
                module="bench.scale_load",
            )
            await self.hosts.expect("ready", args.phase_timeout_s)

    async def active_job(self, participants: int) -> tuple[str, int, list[int]]:
        """A new job of ``participants`` (joined and heartbeated by the hosts process) with
        an ACTIVE round: its name, round and participant ids by rank."""
        assert self.hosts is not None and self.admin is not None
        self.jobs += 1
        job = f"store{self.jobs}"
        # A slow load process must not read as a failed node while the machine is saturated.
        config = JobConfig(
            min_nodes=participants,
            max_nodes=participants,
            heartbeat_interval_ms=1000,
            acceptable_pause_ms=30_000,
        )
        timeout_s = self.args.phase_timeout_s
        joined = await self.hosts.request(
            f"join {job} {participants} {config_json(config)}", "joined", timeout_s
        )
        if joined["failed"]:
            raise LoadProcessError(f"joining {job} failed: {joined['first_failure']}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = await self.admin.get_job(job)
            info = status.round
            if info.state is RoundState.ACTIVE and len(info.members) == participants:
                by_rank = sorted(info.members, key=lambda m: m.rank)
                return job, info.round, [m.participant_id for m in by_rank]
            await asyncio.sleep(0.2)
        raise TimeoutError(f"job {job}: no ACTIVE round of {participants} in {timeout_s:.0f} s")

    async def close_job(self, job: str) -> None:
        if self.admin is not None:
            with contextlib.suppress(RallypointError):
                await self.admin.close_job(job)

    def server_pids(self, store: str) -> list[int]:
        """The store's server processes: TCPStore's, or the members."""
        if store == "tcpstore":
            return [self.tcpstore.pid] if self.tcpstore is not None else []
        return self.cluster.server_pids() if self.cluster is not None else []

    async def leader_pid(self) -> int | None:
        assert self.cluster is not None
        return await self.cluster.leader_pid()

    async def close(self) -> None:
        processes = [p for p in (self.hosts, self.tcpstore) if p is not None]
        await stop_all(processes, timeout_s=LOAD_STOP_S)
        if self.admin is not None:
            await self.admin.close()
        if self.cluster is not None:
            self.cluster.stop()


# --- simulated ranks ---------------------------------------------------------------------------


async def start_ranks(bench: StoreBench, store: str, size: int) -> tuple[list[LoadProcess], str]:
    """The load processes playing ``size`` ranks against ``store``, ready; the job (if any)."""
    args = bench.args
    per_node = args.per_node
    nodes = math.ceil(size / per_node)
    job, round_number, ids = "", 0, []
    if store == "rallypoint":
        job, round_number, ids = await bench.active_job(nodes)
    elif store == "coordinator_store":
        job, round_number, ids = await bench.active_job(size)
    processes: list[LoadProcess] = []
    first_node = 0
    try:
        for index, count in enumerate(split(nodes, args.load_processes)):
            first_rank = first_node * per_node
            ranks = min(size, (first_node + count) * per_node) - first_rank
            own_ids = (
                ids[first_node : first_node + count]
                if store == "rallypoint"
                else ids[first_rank : first_rank + ranks]
            )
            processes.append(
                await LoadProcess.start(
                    f"{store}-{size}-load{index}",
                    "ranks",
                    [
                        f"--store={store}",
                        f"--world={size}",
                        f"--per-node={per_node}",
                        f"--bridge-loop={args.bridge_loop}",
                        f"--first-node={first_node}",
                        f"--nodes={count}",
                        f"--address=127.0.0.1:{bench.tcpstore_port}",
                        f"--endpoints={bench.endpoints if bench.cluster else ''}",
                        f"--job={job}",
                        f"--round={round_number}",
                        f"--participants={','.join(map(str, own_ids))}",
                    ],
                    bench.log_dir,
                    module=LOAD_MODULE,
                )
            )
            first_node += count
        ready = await asyncio.gather(*(p.expect("ready", args.phase_timeout_s) for p in processes))
    except BaseException:
        await stop_all(processes, timeout_s=LOAD_STOP_S)
        raise
    bench.setup_s[f"{store}/{size}"] = max(event["setup_s"] for event in ready)
    return processes, job


async def trial(
    bench: StoreBench, store: str, processes: Sequence[LoadProcess], pattern: str, prefix: str
) -> dict[str, Any]:
    """Every process replays ``pattern`` at once; the trial's figures."""
    limit_s = bench.args.trial_limit_s
    since = [len(p.events) for p in processes]
    load_pids = [p.pid for p in processes]
    server_pids = bench.server_pids(store)
    load_before = CpuSample.take(load_pids, time.perf_counter())
    server_before = CpuSample.take(server_pids, time.perf_counter())
    for process in processes:
        process.send(f"run {pattern} {prefix}")
    began = time.time()
    try:
        done = await asyncio.wait_for(
            asyncio.gather(
                *(p.expect("done", limit_s, s) for p, s in zip(processes, since, strict=True))
            ),
            limit_s,
        )
    except TimeoutError:
        for process in processes:
            process.send("stop")
        done = await asyncio.gather(
            *(p.expect("done", 60, s) for p, s in zip(processes, since, strict=True))
        )
    load_cpu = cpu_share(load_before, CpuSample.take(load_pids, time.perf_counter()))
    server_cpu = cpu_share(server_before, CpuSample.take(server_pids, time.perf_counter()))
    finished = all(d["finished"] for d in done)
    first = min((d["first_op"] for d in done if d["first_op"] is not None), default=began)
    ops = sum(d["ops"] for d in done)
    entry: dict[str, Any] = {
        "finished": finished,
        "ranks_done": sum(d["ranks_done"] for d in done),
        "ops": ops,
        "errors": sum(d["errors"] for d in done),
        "first_error": next((d["first_error"] for d in done if d["first_error"]), None),
        # Cores busy over the trial: the load processes (ranks, and for rallypoint their
        # bridges) and the store's servers (TCPStore's process, or the 3 members).
        "load_cores": load_cpu["cores"],
        "server_cores": server_cpu["cores"],
        "load_average_1m": os.getloadavg()[0],
    }
    if finished:
        seconds = max(d["last_done"] for d in done) - first
        entry.update(seconds=seconds, ops_s=ops / seconds if seconds > 0 else None)
    else:
        lower = time.time() - first
        entry.update(seconds=None, ops_s=ops / lower, seconds_lower_bound=lower)
    return entry


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    finished = [t for t in trials if t["finished"]]
    complete = bool(trials) and len(finished) == len(trials)
    out: dict[str, Any] = {
        "finished": complete,
        "seconds": statistics.median(t["seconds"] for t in finished) if complete else None,
        "ops_s": statistics.median(t["ops_s"] for t in finished) if complete else None,
        "trials": trials,
    }
    if not complete:
        unfinished = next(t for t in trials if not t["finished"])
        out["ops_done"] = unfinished["ops"]
        out["seconds_lower_bound"] = unfinished.get("seconds_lower_bound")
    return out


async def profiled(
    bench: StoreBench, store: str, processes: Sequence[LoadProcess], pattern: str, prefix: str
) -> dict[str, Any]:
    """A trial with py-spy recording the first load process (its bridges) and every member,
    sampling only the thread holding the GIL (``--gil``): Python's busy time, not its waits."""
    py_spy = find_py_spy()
    if py_spy is None:
        bench.profile["error"] = "py-spy not found"
        return await trial(bench, store, processes, pattern, prefix)
    leader = await bench.leader_pid()
    targets = {"load_process": processes[0].pid}
    for pid in bench.server_pids(store):
        targets["leader" if pid == leader else f"follower_{pid}"] = pid
    out_dir = Path(bench.args.profile_dir or bench.log_dir)
    seconds = int(bench.args.profile_s)
    async with record(py_spy, targets, out_dir, seconds) as profiles:
        result = await trial(bench, store, processes, pattern, prefix)
    bench.profile.update(profiles)
    bench.profile["recorded"] = {
        "store": store,
        "pattern": pattern,
        "seconds": seconds,
        "rate_hz": PROFILE_RATE,
        "how": "py-spy record --gil --nonblocking from the trial's start; shares of samples",
    }
    return result


async def bench_store(bench: StoreBench, store: str, results: dict[str, Any]) -> None:
    args = bench.args
    sizes = args.sizes if store != "coordinator_store" else args.coordinator_sizes
    out = results.setdefault(store, {pattern: {} for pattern in args.patterns})
    stopped: dict[str, int] = {}
    for size in sizes:
        patterns = [p for p in args.patterns if p not in stopped]
        for pattern in args.patterns:
            if pattern in stopped:
                out[pattern][str(size)] = {
                    "finished": False,
                    "skipped": f"{pattern} at {stopped[pattern]} ranks did not finish within "
                    f"{args.trial_limit_s:g} s",
                }
        if not patterns:
            continue
        print(f"{store} {size}: starting {args.load_processes} load processes", flush=True)
        try:
            processes, job = await start_ranks(bench, store, size)
        except (TimeoutError, LoadProcessError, RallypointError) as error:
            for pattern in patterns:
                out[pattern][str(size)] = {"finished": False, "error": str(error)[:2000]}
            continue
        try:
            for pattern in patterns:
                trials = []
                for index in range(args.trials):
                    prefix = f"t{index}/{pattern}/"
                    profile = (
                        args.profile_s > 0
                        and store == args.profile_store
                        and pattern == args.profile_pattern
                        and size == (args.profile_size or max(sizes))
                        and index == 0
                    )
                    run = profiled if profile else trial
                    entry = await run(bench, store, processes, pattern, prefix)
                    trials.append(entry)
                    shown = entry["seconds"] or entry["seconds_lower_bound"]
                    print(
                        f"  {store} {pattern} {size} trial {index}: "
                        f"{'' if entry['finished'] else 'NOT FINISHED >= '}{shown:.3f} s, "
                        f"{entry['ops_s'] or 0:,.0f} ops/s",
                        flush=True,
                    )
                    if not entry["finished"]:
                        stopped[pattern] = size
                        break
                out[pattern][str(size)] = summary(trials)
                if pattern in stopped and pattern != patterns[-1]:
                    # A stopped rank may have left a request unanswered on its connection:
                    # the next pattern gets fresh processes (and a fresh round).
                    await stop_all(processes, timeout_s=LOAD_STOP_S)
                    if job:
                        await bench.close_job(job)
                    processes, job = [], ""
                    processes, job = await start_ranks(bench, store, size)
        except (TimeoutError, LoadProcessError, RallypointError) as error:
            for pattern in patterns:
                out[pattern].setdefault(str(size), {"finished": False, "error": str(error)[:2000]})
        finally:
            await stop_all(processes, timeout_s=LOAD_STOP_S)
            if job:
                await bench.close_job(job)


# --- real torch workers ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def init_gloo_once(
    bench: StoreBench, ports: Sequence[int], agent_store: bool
) -> dict[str, Any]:
    """``init_process_group("gloo")`` of ``--init-procs`` torch processes; rank r uses
    ``ports[r // per_node]`` (one port for all: plain TCPStore in rank 0). The workers start,
    import torch and say so; then all are told one start instant."""
    args = bench.args
    world = args.init_procs
    label = "agent" if agent_store else "plain"
    workers: list[LoadProcess] = []
    try:
        for rank in range(world):
            workers.append(
                await LoadProcess.start(
                    f"init-gloo-{label}-{rank}",
                    "init-gloo",
                    [
                        f"--master-port={ports[min(rank // args.per_node, len(ports) - 1)]}",
                        f"--rank={rank}",
                        f"--world={world}",
                        f"--per-node={args.per_node}",
                        *(["--agent-store"] if agent_store else []),
                    ],
                    bench.log_dir,
                    module=LOAD_MODULE,
                )
            )
        await asyncio.gather(*(w.expect("imported", args.phase_timeout_s) for w in workers))
        start_at = time.time() + 0.2
        for worker in workers:
            worker.send(f"go {start_at}")
        events = await asyncio.gather(
            *(w.expect("initialized", args.trial_limit_s) for w in workers)
        )
    except (TimeoutError, LoadProcessError) as error:
        return {"finished": False, "error": str(error)[:2000]}
    finally:
        await stop_all(workers, timeout_s=10)
    return {
        "finished": True,
        "seconds": max(e["initialized"] for e in events) - start_at,
        "late_start_s": max(e["started"] for e in events) - start_at,
        "all_reduce_ok": all(e["sum"] == world for e in events),
    }


async def bench_init_gloo(
    bench: StoreBench, stores: Sequence[str], results: dict[str, Any]
) -> None:
    args = bench.args
    world = args.init_procs
    for store in stores:
        trials = []
        if store == "tcpstore":
            for _ in range(args.trials):
                trials.append(await init_gloo_once(bench, [free_port()], agent_store=False))
            how = "plain env://: rank 0 hosts torch's TCPStore (libuv) at MASTER_ADDR:MASTER_PORT"
        else:
            nodes = math.ceil(world / args.per_node)
            for index in range(args.trials):
                # A fresh round per trial, as each round change gives the workers one.
                job, round_number, ids = await bench.active_job(nodes)
                bridges = await LoadProcess.start(
                    f"init-bridges-{index}",
                    "bridges",
                    [
                        f"--endpoints={bench.endpoints}",
                        f"--nodes={nodes}",
                        f"--bridge-loop={args.bridge_loop}",
                        f"--job={job}",
                        f"--round={round_number}",
                        f"--participants={','.join(map(str, ids))}",
                    ],
                    bench.log_dir,
                    module=LOAD_MODULE,
                )
                try:
                    ready = await bridges.expect("ready", args.phase_timeout_s)
                    trials.append(await init_gloo_once(bench, ready["bridges"], agent_store=True))
                finally:
                    await bridges.stop()
                    await bench.close_job(job)
            how = (
                "TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT = the TCPStoreBridge of the "
                f"worker's node ({args.per_node} workers a node), bridges in a load process"
            )
        for entry in trials:
            print(f"  {store} init_gloo {world}: {entry.get('seconds')}", flush=True)
        finished = bool(trials) and all(t["finished"] for t in trials)
        result = {
            "finished": finished,
            "seconds": statistics.median(t["seconds"] for t in trials) if finished else None,
            "how": how,
            "trials": trials,
        }
        results.setdefault(store, {})["init_gloo"] = {str(world): result}


# --- report ------------------------------------------------------------------------------------


def seconds_of(results: dict[str, Any], store: str, pattern: str, size: str) -> float | None:
    entry = results.get(store, {}).get(pattern, {}).get(size) or {}
    return entry.get("seconds") if entry.get("finished") else None


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, (pattern, size) in RATIO_KEYS.items():
        ours = seconds_of(results, "rallypoint", pattern, size)
        anchor = seconds_of(results, "tcpstore", pattern, size)
        out[name] = ours / anchor if ours is not None and anchor else None
    return out


def verdicts(top: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (direction, target) in TARGETS.items():
        value = top["nccl_1024_s"] if name == "nccl_1024_s" else top["ratios"][name]
        # Not measured or not finished counts as a miss: the target is not shown met.
        verdict = "PASS" if value is not None and value <= target else "MISS"
        out[name] = {"value": value, "direction": direction, "target": target, "verdict": verdict}
    return out


def last_line(checked: dict[str, dict[str, Any]]) -> str:
    parts = []
    for name, check in checked.items():
        value = check["value"]
        shown = "-" if value is None else f"{value:.3f}" + ("s" if name.endswith("_s") else "x")
        parts.append(f"{name} {shown} (<= {check['target']:g}) {check['verdict']}")
    return "store: " + "; ".join(parts)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    patterns = [p for p in PATTERNS if any(p in r for r in results.values())]
    figure, axes = plt.subplots(1, max(1, len(patterns)), figsize=(6 * max(1, len(patterns)), 4.5))
    axes_list = list(axes) if len(patterns) > 1 else [axes]
    for axis, pattern in zip(axes_list, patterns, strict=False):
        for store, by_pattern in results.items():
            entries = by_pattern.get(pattern, {})
            done = sorted((int(n), e["seconds"]) for n, e in entries.items() if e.get("finished"))
            if done:
                axis.plot([n for n, _ in done], [s for _, s in done], "o-", label=store)
            cut = sorted(
                (int(n), e["seconds_lower_bound"])
                for n, e in entries.items()
                if e.get("seconds_lower_bound") is not None
            )
            if cut:
                axis.plot(
                    [n for n, _ in cut],
                    [s for _, s in cut],
                    "x",
                    ms=10,
                    label=f"{store} (stopped: lower bound)",
                )
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("ranks")
        axis.set_ylabel("s, first operation to last rank done")
        axis.set_title(f"{pattern} bootstrap pattern")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("process-group bootstrap: round store vs torch TCPStore, loopback")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def placement(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "members": "3 member processes (rallypoint cluster up), loopback",
        "tcpstore": "torch's C++ TCPStore server (libuv backend) in a process of its own",
        "ranks": f"simulated in {args.load_processes} load processes (bench/store_load.py, "
        "uvloop); one TCP connection per rank (tcpstore, rallypoint) or one session per rank "
        "over the process's transport (coordinator_store)",
        "bridges": f"rallypoint: one TCPStoreBridge per node of {args.per_node} ranks, in the "
        "load process of its ranks, with its own coordinator client; "
        + (
            "each on its own thread and event loop, as in an agent"
            if args.bridge_loop == "thread"
            else "all of a process's bridges on its one event loop (--bridge-loop shared)"
        ),
        "participants": "a bench/scale_load.py hosts process joins them (JoinBatch) and "
        "heartbeats them at 1 Hz: one per node (rallypoint) or per rank (coordinator_store)",
        "init_gloo": "real torch processes, one per rank; rallypoint's bridges in a load process "
        f"(--bridge-loop {args.bridge_loop})",
        "shared": "members, load processes, TCPStore and workers share every core; nothing pinned",
        "machine_load_average_1m_at_end": os.getloadavg()[0],
    }


# --- main --------------------------------------------------------------------------------------


def names_arg(choices: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        names = [name for name in text.split(",") if name]
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="bench/results/store.json")
    parser.add_argument("--sizes", type=sizes_arg, default=[64, 256, 1024], help="ranks")
    parser.add_argument(
        "--coordinator-sizes",
        type=sizes_arg,
        default=[64, 256],
        help="ranks for coordinator_store (one session per rank)",
    )
    parser.add_argument("--stores", type=names_arg(STORES), default=list(STORES))
    parser.add_argument("--patterns", type=names_arg(PATTERNS), default=list(PATTERNS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--per-node", type=int, default=8, help="ranks per node (bridge)")
    parser.add_argument(
        "--bridge-loop",
        choices=("thread", "shared"),
        default="shared",
        help="each bridge on a thread and event loop of its own, as in a torchrun agent, or "
        "all of a load process's bridges on its one loop",
    )
    parser.add_argument("--load-processes", type=int, default=4)
    parser.add_argument(
        "--trial-limit-s",
        type=float,
        default=300.0,
        help="a trial still running after this is stopped, written as not finished (MISS)",
    )
    parser.add_argument("--init-procs", type=int, default=16, help="real gloo workers; 0: skip")
    parser.add_argument(
        "--phase-timeout-s",
        type=float,
        default=300.0,
        help="bound on setting up (torch's libuv TCPStore took ~100 s to accept 1,024 clients)",
    )
    parser.add_argument(
        "--profile-s",
        type=float,
        default=0.0,
        help="py-spy the first trial of --profile-pattern, --profile-store, --profile-size",
    )
    parser.add_argument(
        "--profile-pattern", choices=PATTERNS, default="gloo", help="the pattern profiled"
    )
    parser.add_argument(
        "--profile-store", choices=STORES, default="rallypoint", help="the store profiled"
    )
    parser.add_argument(
        "--profile-size", type=int, default=0, help="the size profiled (default: the largest)"
    )
    parser.add_argument("--profile-dir", help="where py-spy's raw profiles go (default: logs)")
    parser.add_argument("--data-dir", help="members' data and load logs (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="tiny and short: checks it runs")
    parser.add_argument("--no-plot", action="store_true")
    return parser


def apply_smoke(args: argparse.Namespace) -> None:
    args.sizes = [16]
    args.coordinator_sizes = []
    args.stores = ["tcpstore", "rallypoint"]
    args.trials = 1
    args.per_node = 4
    args.load_processes = 2
    args.trial_limit_s = 30.0
    args.init_procs = 2
    args.phase_timeout_s = 60.0


async def run(args: argparse.Namespace, data_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    log_dir = data_dir / "load"
    log_dir.mkdir(parents=True, exist_ok=True)
    bench = StoreBench(args, log_dir)
    results: dict[str, Any] = {}
    try:
        await bench.start(args.stores)
        for store in args.stores:
            await bench_store(bench, store, results)
        if args.init_procs > 0:
            await bench_init_gloo(
                bench, [s for s in args.stores if s != "coordinator_store"], results
            )
        return results, {"profile": bench.profile, "setup_s": bench.setup_s}
    finally:
        await bench.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        apply_smoke(args)
    started = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results, extra = run_in_data_dir(
        args.data_dir, "store-bench-", lambda data_dir: run(args, data_dir)
    )
    top = {
        "nccl_1024_s": seconds_of(results, "rallypoint", "nccl", "1024"),
        "ratios": ratios(results),
    }
    checked = verdicts(top)
    document = {
        "benchmark": "store",
        **top,
        "smoke": args.smoke,
        "machine": machine_info(),
        "placement": placement(args),
        "versions": package_versions(["rallypoint", "torch", "grpcio", "protobuf", "uvloop"]),
        "parameters": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "profile_dir")},
            "gloo_value_bytes": {str(n): gloo_value_bytes(n) for n in args.sizes},
        },
        "targets": checked,
        "results": results,
        "setup_s": extra["setup_s"],
        "profile": extra["profile"],
        "wall_time_s": time.perf_counter() - started,
    }
    write_results(out, document, None if args.no_plot else lambda path: plot(results, path))
    print(last_line(checked))
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
