"""Rendezvous benchmark: round close at 64/256/1024 workers against torchrun's own rendezvous,
failure detection (SIGKILL, SIGSTOP), false positives, and how many workers one leader keeps.

One 3-member cluster (``rallypoint cluster up``) on loopback serves every phase; this process
drives load processes (bench/rendezvous_load.py) and reads their JSON-line events, which carry
wall-clock times (one machine, so times from different processes compare).

- Rounds: N simulated workers join a job with min = max = N at once, with the client as
  shipped: one load process per simulated host of ``--participants-per-process`` (32: 1,024
  workers are 32 processes), one client (session) per process, ``client.join`` per worker,
  and the process's one HeartbeatBatch stream carrying them all. The figure is the time
  every worker has seen the round ACTIVE minus the time the last join was acknowledged.
  Also a min < max job with last_call, where the close waits for the last call.
- torchrun: ``DynamicRendezvousHandler`` over ``C10dRendezvousBackend`` with a TCPStore hosted
  here, N agents (threads in the same number of load processes) calling ``next_rendezvous()``
  at once; the figure is from the last agent's call to every agent's return. Sizes beyond one
  that did not finish in time are skipped, and the JSON says why.
- Detection (this phase and the next are in bench/rendezvous_detection.py): real worker
  processes heartbeating every 100 ms form one job; each trial kills (SIGKILL) or stops
  (SIGSTOP) one and times the first survivor's notice of the round change. The job is
  reconfigured to the survivors between trials.
- False positives: N simulated workers at 100 ms heartbeats for a fixed time; every
  participant the leader declares failed is one. Unexpected failures during the other phases
  count too.
- Leader capacity: heartbeating participants at 1 Hz added in steps; a step is sustained when
  nobody is declared failed, no call fails, and the p99 heartbeat answer latency stays under
  a bound. The ramp stops at the first step that is not.

    python -m bench.rendezvous_bench --out bench/results/rendezvous.json
    python -m bench.rendezvous_bench --smoke --out /tmp/rendezvous.json    # ~30 s
"""

from __future__ import annotations

import os

# Load processes are started while gRPC's threads run. gRPC's fork handlers exist for children
# that go on using gRPC after fork(); ours exec at once, and the handlers would only log that
# they were skipped. Read when grpc is first imported, hence before every other import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.cluster import RallypointCluster
from bench.common import (
    CpuSample,
    cpu_share,
    fmt_s,
    machine_info,
    median,
    package_versions,
    print_targets,
    run_in_data_dir,
    sizes_arg,
    verdicts,
    write_results,
)
from bench.load_process import Bench, LoadProcess, LoadProcessError, run_phases, split, stop_all
from bench.rendezvous_detection import bench_detection, bench_false_positives
from rallypoint.client import Client, JobConfig, RallypointError
from rallypoint.worker.process_tree import run_reaped

ROUND_HEARTBEAT_MS = 1000


# --- rounds --------------------------------------------------------------------------------------


async def round_trial(bench: Bench, size: int, config: JobConfig, job: str) -> dict[str, Any]:
    """N workers join at once; when did every one of them see the round ACTIVE?"""
    timeout_s = bench.args.phase_timeout_s
    processes = await bench.participants(job, size, config, "w")
    try:
        leader = await bench.leader_pid()
        before = CpuSample.take([leader] if leader else [], time.perf_counter())
        for process in processes:
            process.send("join")
        joined = await asyncio.gather(*(p.expect("joined", timeout_s) for p in processes))
        active = await asyncio.gather(*(p.expect("active", timeout_s) for p in processes))
        after = CpuSample.take([leader] if leader else [], time.perf_counter())
        unexpected = await bench.failed_in_history(job)
    finally:
        with contextlib.suppress(RallypointError):
            await bench.admin.close_job(job)
        await stop_all(processes)
    acks = [t for event in joined for t in event["acks"]]
    seen = [t for event in active for t in event["seen"]]
    ranks = sorted(r for event in active for r in event["ranks"] if r is not None)
    closed_ms = max((ms for event in active for ms in event["closed_ms"]), default=0)
    started = min(event["started"] for event in joined)
    last_ack = max(acks)
    seen_all = [t for t in seen if t is not None]
    complete = len(seen_all) == size
    lost = sum(event["lost"] for event in active)
    load_lag_max_ms = max((event["loop_lag"]["max_ms"] or 0.0) for event in [*joined, *active])
    # A live worker declared failed is a false positive whether or not it ended a round.
    failed = max(unexpected, lost)
    bench.unexpected_failures["rounds"] = bench.unexpected_failures.get("rounds", 0) + failed
    return {
        "job": job,
        "size": size,
        "complete": complete,
        "workers_saw_active": len(seen_all),
        "ranks_are_a_permutation": ranks == list(range(size)),
        "join_spread_s": last_ack - started,
        "all_saw_active_after_last_join_s": (max(seen_all) - last_ack) if complete else None,
        "first_saw_active_after_last_join_s": min(seen_all) - last_ack if seen_all else None,
        "median_saw_active_after_last_join_s": median([t - last_ack for t in seen_all]),
        # The leader's clock at the close (it is in the last join's apply for min = max).
        "leader_closed_after_last_join_s": closed_ms / 1000 - last_ack if closed_ms else None,
        "leader_cpu": cpu_share(before, after),
        "member_failed_rounds": unexpected,
        "participants_lost": lost,
        "load_loop_lag_max_ms": load_lag_max_ms,
        "reason": None
        if complete
        else f"{lost} of {size} participants were declared failed before the round closed "
        f"(load processes' event loops ran up to {load_lag_max_ms:.0f} ms late)",
    }


def failed_trial(size: int, reason: str) -> dict[str, Any]:
    return {
        "size": size,
        "complete": False,
        "all_saw_active_after_last_join_s": None,
        "first_saw_active_after_last_join_s": None,
        "join_spread_s": None,
        "reason": reason[:1000],
    }


def round_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    figures = [t["all_saw_active_after_last_join_s"] for t in trials]
    complete = [f for f in figures if f is not None]
    return {
        # Infinite when no trial completed: the round never closed for every worker.
        "close_after_last_join_s": median(complete) if complete else math.inf,
        "first_seen_after_last_join_s": median(
            [f for t in trials if (f := t["first_saw_active_after_last_join_s"]) is not None]
        ),
        "join_spread_s": median([f for t in trials if (f := t["join_spread_s"]) is not None]),
        "incomplete_trials": sum(1 for f in figures if f is None),
        "reason": next((t["reason"] for t in trials if t["reason"]), None),
        "trials": trials,
    }


async def bench_rounds(bench: Bench) -> dict[str, Any]:
    args = bench.args
    out: dict[str, Any] = {"sizes": {}, "last_call": {}}
    for size in args.sizes:
        config = JobConfig(min_nodes=size, max_nodes=size, heartbeat_interval_ms=ROUND_HEARTBEAT_MS)
        trials = []
        for trial in range(1, args.round_trials + 1):
            try:
                result = await round_trial(bench, size, config, f"round-{size}-t{trial}")
            except (TimeoutError, LoadProcessError) as error:
                result = failed_trial(size, f"{type(error).__name__}: {error}")
            trials.append(result)
            print(
                f"rounds  N={size:<5} trial {trial}: all saw ACTIVE "
                f"{fmt_s(result['all_saw_active_after_last_join_s'])} after the last join "
                f"(first {fmt_s(result['first_saw_active_after_last_join_s'])}, joins spread "
                f"{fmt_s(result['join_spread_s'])})",
                flush=True,
            )
            if not result["complete"]:
                print(f"rounds  N={size:<5} incomplete: {result['reason']}", flush=True)
                break  # the next trials of this size would spend the same timeout
        out["sizes"][str(size)] = round_summary(trials)
    size = args.last_call_size
    config = JobConfig(
        min_nodes=size,
        max_nodes=2 * size,
        last_call_ms=args.last_call_ms,
        heartbeat_interval_ms=ROUND_HEARTBEAT_MS,
    )
    trials = [
        await round_trial(bench, size, config, f"lastcall-{size}-t{trial}")
        for trial in range(1, args.round_trials + 1)
    ]
    summary = round_summary(trials)
    summary["last_call_ms"] = args.last_call_ms
    summary["min_nodes"], summary["max_nodes"] = size, 2 * size
    summary["beyond_last_call_s"] = summary["close_after_last_join_s"] - args.last_call_ms / 1000
    print(
        f"rounds  N={size:<5} min<max, last call {args.last_call_ms} ms: all saw ACTIVE "
        f"{fmt_s(summary['close_after_last_join_s'])} after the last join",
        flush=True,
    )
    out["last_call"] = summary
    return out


# --- torchrun ------------------------------------------------------------------------------------


async def torchrun_trial(bench: Bench, size: int, run_id: str) -> dict[str, Any]:
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    timeout_s = bench.args.torchrun_timeout_s
    # torchrun's c10d backend hosts the store in one agent; here the bench process hosts it.
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    processes: list[LoadProcess] = []
    try:
        arguments = [f"--store-port={store.port}", f"--min-nodes={size}", f"--max-nodes={size}"]
        processes = await bench.spread("torchrun", run_id, size, arguments, timeout_s)
        for process in processes:
            process.send("go")
        try:
            done = await asyncio.gather(*(p.expect("done", timeout_s + 10) for p in processes))
        except TimeoutError:
            return {"size": size, "complete": False, "reason": f"not done within {timeout_s} s"}
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.proc.kill()
        await stop_all(processes)
        del store
    starts = [t for event in done for t in event["starts"]]
    returns = [t for event in done for t in event["returns"]]
    errors = [e for event in done for e in event["errors"]]
    ranks = sorted(r for event in done for r in event["ranks"] if r is not None)
    return {
        "size": size,
        "complete": not errors,
        "round_s": max(returns) - max(starts),
        "from_first_start_s": max(returns) - min(starts),
        "ranks_are_a_permutation": ranks == list(range(size)),
        "errors": errors[:5],
        "reason": errors[0] if errors else None,
    }


async def bench_torchrun(bench: Bench) -> dict[str, Any]:
    out: dict[str, Any] = {}
    skip_reason: str | None = None
    for size in bench.args.torchrun_sizes:
        if skip_reason is not None:
            out[str(size)] = {"skipped": skip_reason}
            continue
        trials = []
        for trial in range(1, bench.args.torchrun_trials + 1):
            result = await torchrun_trial(bench, size, f"torchrun-{size}-t{trial}")
            trials.append(result)
            print(
                f"torchrun N={size:<5} trial {trial}: "
                + (
                    f"round {fmt_s(result['round_s'])} after the last agent's start"
                    if result["complete"]
                    else f"incomplete: {result['reason']}"
                ),
                flush=True,
            )
            if not result["complete"]:
                skip_reason = f"N={size} did not complete: {result['reason']}"
                break
        complete = [t["round_s"] for t in trials if t["complete"]]
        out[str(size)] = {"round_s": median(complete), "trials": trials}
    return out


# --- leader capacity -----------------------------------------------------------------------------


async def capacity_step(
    bench: Bench, processes: list[LoadProcess], current: int, target: int, jobs: list[str]
) -> dict[str, Any]:
    """Add participants from ``current`` up to ``target`` (in new jobs of capacity_job_size,
    appended to ``jobs``), let them settle, then measure over a window."""
    args = bench.args
    config = JobConfig(
        min_nodes=args.capacity_job_size,
        max_nodes=args.capacity_job_size,
        heartbeat_interval_ms=1000,
    )
    started = time.perf_counter()
    failed_joins = 0
    first_failure = None
    while current < target:
        job = f"capacity-{len(jobs)}"
        await bench.admin.configure(job, config)
        jobs.append(job)
        counts = split(args.capacity_job_size, len(processes))
        added = await asyncio.gather(
            *(
                p.request(f"add {job} {count}", "added", args.phase_timeout_s)
                for p, count in zip(processes, counts, strict=True)
            )
        )
        failed_joins += sum(a["failed"] for a in added)
        first_failure = first_failure or next(
            (a["first_failure"] for a in added if a["failed"]), None
        )
        current = sum(a["total"] for a in added)
    ramp_s = time.perf_counter() - started
    await asyncio.sleep(args.capacity_settle_s)
    await asyncio.gather(*(p.request("report", "report", 60) for p in processes))
    leader = await bench.leader_pid()
    before = CpuSample.take([leader] if leader else [], time.perf_counter())
    load_before = CpuSample.take([p.pid for p in processes], time.perf_counter())
    await asyncio.sleep(args.capacity_window_s)
    after = CpuSample.take([leader] if leader else [], time.perf_counter())
    load_after = CpuSample.take([p.pid for p in processes], time.perf_counter())
    reports = await asyncio.gather(*(p.request("report", "report", 60) for p in processes))
    p99 = max(r["latency"]["p99_ms"] or math.nan for r in reports)
    lost = sum(r["lost"] for r in reports)
    errors = sum(r["errors"] for r in reports)
    load_lag_p99 = max(r["loop_lag"]["p99_ms"] or 0.0 for r in reports)
    heartbeats_per_s = sum(r["heartbeats"] for r in reports) / args.capacity_window_s
    sustained = (
        lost == 0
        and errors == 0
        and failed_joins == 0
        and not math.isnan(p99)
        and p99 <= args.capacity_latency_bound_ms
    )
    return {
        "participants": current,
        "jobs": len(jobs),
        "ramp_s": ramp_s,
        "failed_joins": failed_joins,
        "first_failure": first_failure,
        "heartbeats_per_s": heartbeats_per_s,
        "answer_p50_ms": max(r["latency"]["p50_ms"] or math.nan for r in reports),
        "answer_p99_ms": p99,
        "answer_max_ms": max(r["latency"]["max_ms"] or math.nan for r in reports),
        "lost": lost,
        "errors": errors,
        "first_error": next((r["first_error"] for r in reports if r["first_error"]), None),
        "leader_cpu": cpu_share(before, after),
        "load_cpu": cpu_share(load_before, load_after),
        "load_loop_lag_p99_ms": load_lag_p99,
        # A load process whose loop runs late sends late heartbeats: then the step says more
        # about the load generator than about the leader.
        "load_generator_saturated": load_lag_p99 > args.capacity_latency_bound_ms / 2,
        "sustained": sustained,
    }


async def bench_capacity(bench: Bench) -> dict[str, Any]:
    args = bench.args
    processes = [
        await LoadProcess.start(
            f"heartbeaters{i}",
            "heartbeaters",
            [
                f"--endpoints={await bench.cluster.leader_address()}",
                "--job=capacity",
                f"--name-prefix=hb{i}-",
                "--interval-s=1.0",
            ],
            bench.log_dir,
        )
        for i in range(args.load_processes)
    ]
    steps: list[dict[str, Any]] = []
    jobs: list[str] = []
    stopped_because = "every step sustained"
    total = 0
    started = time.perf_counter()
    try:
        await asyncio.gather(*(p.expect("ready", args.phase_timeout_s) for p in processes))
        for target in args.capacity_steps:
            if time.perf_counter() - started > args.capacity_budget_s:
                stopped_because = f"time budget of {args.capacity_budget_s:g} s spent"
                break
            step = await capacity_step(bench, processes, total, target, jobs)
            total = step["participants"]
            steps.append(step)
            print(
                f"capacity {step['participants']:>6} workers at 1 Hz: "
                f"{step['heartbeats_per_s']:.0f} heartbeats/s, answer p99 "
                f"{step['answer_p99_ms']:.1f} ms, lost {step['lost']}, errors {step['errors']}, "
                f"leader {step['leader_cpu']['cores']:.2f} cores, load lag p99 "
                f"{step['load_loop_lag_p99_ms']:.0f} ms -> "
                f"{'sustained' if step['sustained'] else 'NOT sustained'}",
                flush=True,
            )
            if not step["sustained"]:
                stopped_because = f"step {target} not sustained"
                break
    finally:
        for job in jobs:
            with contextlib.suppress(RallypointError):
                await bench.admin.close_job(job)
        await stop_all(processes)
    sustained = [s["participants"] for s in steps if s["sustained"]]
    return {
        "heartbeat_interval_ms": 1000,
        "job_size": args.capacity_job_size,
        "latency_bound_ms": args.capacity_latency_bound_ms,
        "window_s": args.capacity_window_s,
        "max_sustained_workers": max(sustained, default=0),
        "stopped_because": stopped_because,
        "steps": steps,
    }


# --- the run: phases, figures, targets, output ---------------------------------------------------

# name -> (direction, target); the figure's value comes from figures().
TARGETS: dict[str, tuple[str, float]] = {
    "round_close_after_last_join_s[1024]": ("<=", 1.0),
    "detect_sigkill_s": ("<=", 0.5),
    "detect_sigstop_s": ("<=", 1.5),
    "false_positives": ("<=", 0),
    "leader_capacity_workers_1hz": (">=", 10_000),
}


def figures(results: dict[str, Any], false_positives: int) -> dict[str, Any]:
    rounds = results["rounds"]["sizes"]
    torchrun = results["torchrun"]
    return {
        "round_close_after_last_join_s": {
            size: r["close_after_last_join_s"] for size, r in rounds.items()
        },
        "round_close_last_call_s": results["rounds"]["last_call"]["close_after_last_join_s"],
        "detect_sigkill_s": results["detection"]["sigkill_s"],
        "detect_sigstop_s": results["detection"]["sigstop_s"],
        "false_positives": false_positives,
        "torchrun_round_s": {size: r["round_s"] for size, r in torchrun.items() if "round_s" in r},
        "leader_capacity_workers_1hz": results["capacity"]["max_sustained_workers"],
    }


def print_report(top: dict[str, Any], checked: dict[str, dict[str, Any]]) -> None:
    print("\nround close after the last join (every worker saw ACTIVE), medians:")
    for size, value in top["round_close_after_last_join_s"].items():
        theirs = top["torchrun_round_s"].get(size)
        print(f"  N={size:<6} rallypoint {fmt_s(value):>10}   torchrun {fmt_s(theirs):>10}")
    print_targets(checked, 38, 10)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rounds_axis, detect_axis, capacity_axis) = plt.subplots(1, 3, figsize=(16, 4.5))
    ours = results["rounds"]["sizes"]
    sizes = [int(s) for s in ours]
    rounds_axis.plot(
        sizes, [ours[str(s)]["close_after_last_join_s"] for s in sizes], "o-", label="rallypoint"
    )
    theirs = {int(s): r["round_s"] for s, r in results["torchrun"].items() if "round_s" in r}
    if theirs:
        rounds_axis.plot(list(theirs), list(theirs.values()), "s--", label="torchrun (c10d)")
    rounds_axis.set_xscale("log", base=2)
    rounds_axis.set_yscale("log")
    rounds_axis.set_xlabel("workers")
    rounds_axis.set_ylabel("s after the last join until every worker knows")
    rounds_axis.set_title("round close vs size")
    rounds_axis.legend()
    rounds_axis.grid(alpha=0.3)
    trials = results["detection"]["trials"]
    for name in ("SIGKILL", "SIGSTOP"):
        values = [t["first_survivor_s"] * 1000 for t in trials if t["signal"] == name]
        detect_axis.hist(values, bins=10, alpha=0.6, label=name)
    detect_axis.set_xlabel("ms from the signal to a survivor's notice")
    detect_axis.set_title("failure detection, heartbeats every 100 ms")
    detect_axis.legend()
    steps = results["capacity"]["steps"]
    counts = [s["participants"] for s in steps]
    capacity_axis.plot(counts, [s["answer_p99_ms"] for s in steps], "o-", label="answer p99 (ms)")
    capacity_axis.set_xlabel("workers heartbeating at 1 Hz")
    capacity_axis.set_ylabel("heartbeat answer p99 (ms)")
    capacity_axis.set_title("one leader's capacity")
    cores_axis = capacity_axis.twinx()
    cores_axis.plot(counts, [s["leader_cpu"]["cores"] for s in steps], "s--", color="tab:red")
    cores_axis.set_ylabel("leader CPU (cores)", color="tab:red")
    capacity_axis.grid(alpha=0.3)
    figure.suptitle("rendezvous: rallypoint (3 members, loopback) and torchrun's c10d rendezvous")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/rendezvous.json")
    parser.add_argument("--sizes", type=sizes_arg, default=[64, 256, 1024])
    parser.add_argument("--round-trials", type=int, default=3)
    parser.add_argument("--last-call-size", type=int, default=256)
    parser.add_argument("--last-call-ms", type=int, default=500)
    parser.add_argument("--torchrun-sizes", type=sizes_arg, default=[64, 256, 1024])
    parser.add_argument("--torchrun-trials", type=int, default=1)
    parser.add_argument(
        "--torchrun-timeout-s", type=float, default=90.0, help="per round; larger sizes skipped"
    )
    parser.add_argument(
        "--load-processes", type=int, default=2, help="torchrun agents' and capacity processes"
    )
    parser.add_argument(
        "--participants-per-process",
        type=int,
        default=32,
        help="participants of one simulated host (one load process, one client)",
    )
    parser.add_argument("--kill-trials", type=int, default=7)
    parser.add_argument("--stop-trials", type=int, default=7)
    parser.add_argument("--detection-settle-s", type=float, default=1.0)
    parser.add_argument("--fp-participants", type=int, default=256)
    parser.add_argument("--fp-duration-s", type=float, default=60.0)
    parser.add_argument(
        "--capacity-steps", type=sizes_arg, default=[1000, 2000, 5000, 10_000, 15_000, 20_000]
    )
    parser.add_argument("--capacity-job-size", type=int, default=250)
    parser.add_argument("--capacity-window-s", type=float, default=15.0)
    parser.add_argument("--capacity-settle-s", type=float, default=5.0)
    parser.add_argument("--capacity-latency-bound-ms", type=float, default=250.0)
    parser.add_argument("--capacity-budget-s", type=float, default=240.0)
    parser.add_argument("--phase-timeout-s", type=float, default=120.0)
    parser.add_argument("--phases", default="rounds,torchrun,detection,false_positives,capacity")
    parser.add_argument("--data-dir", help="members' data and load logs (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="small and short: checks it runs")
    parser.add_argument("--no-plot", action="store_true")
    return parser


def apply_smoke(args: argparse.Namespace) -> None:
    args.sizes = args.torchrun_sizes = [16]
    args.round_trials = args.torchrun_trials = 1
    args.last_call_size, args.last_call_ms = 16, 200
    args.kill_trials = args.stop_trials = 1
    args.detection_settle_s = 0.5
    args.fp_participants, args.fp_duration_s = 16, 3.0
    args.capacity_steps, args.capacity_job_size = [200], 100
    args.capacity_window_s, args.capacity_settle_s = 2.0, 1.0
    args.torchrun_timeout_s, args.phase_timeout_s = 30.0, 60.0


PHASES: dict[str, Callable[[Bench], Any]] = {
    "rounds": bench_rounds,
    "torchrun": bench_torchrun,
    "detection": bench_detection,
    "false_positives": bench_false_positives,
    "capacity": bench_capacity,
}

EMPTY_RESULTS: dict[str, Any] = {
    "rounds": {"sizes": {}, "last_call": {"close_after_last_join_s": None}},
    "torchrun": {},
    "detection": {"sigkill_s": None, "sigstop_s": None, "trials": []},
    "false_positives": {"false_positives": None},
    "capacity": {"max_sustained_workers": None, "steps": []},
}


async def run(args: argparse.Namespace, data_dir: Path) -> tuple[dict[str, Any], dict[str, int]]:
    log_dir = data_dir / "load"
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = RallypointCluster(data_dir / "cluster")
    results: dict[str, Any] = {**EMPTY_RESULTS, "phase_wall_s": {}}
    try:
        cluster.start()
        await cluster.wait_ready()
        async with Client(",".join(cluster.addresses.values()), timeout_s=60) as admin:
            bench = Bench(args, cluster, admin, log_dir)
            await run_phases(bench, args.phases, PHASES, EMPTY_RESULTS, results)
            return results, bench.unexpected_failures
    finally:
        cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        apply_smoke(args)
    started = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results, unexpected = run_in_data_dir(
        args.data_dir, "rendezvous-bench-", lambda data_dir: run(args, data_dir)
    )
    top = figures(results, sum(unexpected.values()))
    checked = verdicts(top, TARGETS)
    document = {
        "benchmark": "rendezvous",
        **top,
        "machine": machine_info(),
        "versions": package_versions(["rallypoint", "grpcio", "protobuf", "uvloop", "torch"]),
        "parameters": {
            key: value for key, value in vars(args).items() if key not in ("out", "data_dir")
        },
        "false_positives_by_phase": unexpected,
        "targets": checked,
        "results": results,
        "wall_time_s": time.perf_counter() - started,
    }
    print_report(top, checked)
    write_results(out, document, None if args.no_plot else lambda path: plot(results, path))
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
