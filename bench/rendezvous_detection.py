"""The rendezvous benchmark's failure-detection phases, detection (SIGKILL and SIGSTOP of
real workers) and false positives (simulated workers that must all stay members): see
bench/rendezvous_bench.py, which runs them and reports their figures."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import signal
import time
from collections.abc import Sequence
from typing import Any

from bench.common import CpuSample, cpu_share, fmt_s, median
from bench.load_process import (
    Bench,
    LoadProcess,
    by_signal,
    inject_fault,
    join_workers,
    reform_without,
    start_workers,
    stop_all,
    wait_until,
)
from rallypoint.client import JobConfig, RallypointError

DETECTION_HEARTBEAT_MS = 100


def latest_round(process: LoadProcess) -> tuple[int, str] | None:
    rounds = [e for e in process.events if e["event"] == "round"]
    return (rounds[-1]["round"], rounds[-1]["state"]) if rounds else None


def first_round_after(process: LoadProcess, round_number: int) -> float | None:
    """When the worker first learnt of a round after ``round_number`` (None: not yet)."""
    return next(
        (e["t"] for e in process.events if e["event"] == "round" and e["round"] > round_number),
        None,
    )


def common_active_round(workers: Sequence[LoadProcess]) -> int | None:
    """The round every worker last saw, if it is one round and ACTIVE for all of them."""
    views = {latest_round(w) for w in workers}
    view = views.pop() if len(views) == 1 else None
    return view[0] if view is not None and view[1] == "active" else None


def notice_times(workers: Sequence[LoadProcess], round_number: int) -> list[float] | None:
    """When each worker learnt of a round after ``round_number``; None until all have."""
    times = [first_round_after(w, round_number) for w in workers]
    return [t for t in times if t is not None] if None not in times else None


async def bench_detection(bench: Bench) -> dict[str, Any]:
    """Real worker processes; each trial kills or stops one and times the survivors' notice."""
    args = bench.args
    # Alternating, so a drift in the machine's load hits both kinds alike.
    kinds: list[signal.Signals] = []
    for index in range(max(args.kill_trials, args.stop_trials)):
        kinds += [signal.SIGKILL] if index < args.kill_trials else []
        kinds += [signal.SIGSTOP] if index < args.stop_trials else []
    size = len(kinds) + 2
    job = "detection"
    config = JobConfig(min_nodes=size, max_nodes=size, heartbeat_interval_ms=DETECTION_HEARTBEAT_MS)
    workers = await start_workers(size, job, bench.endpoints, config, bench.log_dir)
    trials: list[dict[str, Any]] = []
    victims: set[int] = set()
    try:
        participant_ids = await join_workers(workers, args.phase_timeout_s)
        alive = list(workers)
        ready = functools.partial(common_active_round, alive)
        waits_for = "every worker in one ACTIVE round"
        settle_s, timeout_s = args.detection_settle_s, args.phase_timeout_s
        for trial, kind in enumerate(kinds, start=1):
            fault = await inject_fault(alive, kind, ready, waits_for, settle_s, timeout_s)
            victim, signalled_at = fault.victim, fault.signalled_at
            victims.add(participant_ids[victim.name])
            noticed = await wait_until(
                functools.partial(notice_times, alive, fault.round_number),
                args.phase_timeout_s,
                f"the survivors to notice {kind.name} of {victim.name}",
            )
            trials.append(
                {
                    "trial": trial,
                    "signal": kind.name,
                    "victim": victim.name,
                    "first_survivor_s": min(noticed) - signalled_at,
                    "last_survivor_s": max(noticed) - signalled_at,
                }
            )
            print(
                f"detect  {kind.name:<7} trial {trial}: first survivor noticed after "
                f"{fmt_s(min(noticed) - signalled_at)}, last {fmt_s(max(noticed) - signalled_at)}",
                flush=True,
            )
            survivors = JobConfig(
                min_nodes=len(alive), max_nodes=size, heartbeat_interval_ms=DETECTION_HEARTBEAT_MS
            )
            await reform_without(bench.admin, job, fault, kind, survivors)
        unexpected = await bench.failed_in_history(job, frozenset(victims))
        reports = await asyncio.gather(*(w.request("report", "report", 30) for w in alive))
    finally:
        with contextlib.suppress(RallypointError):
            await bench.admin.close_job(job)
        await stop_all(workers)
    bench.unexpected_failures["detection"] = unexpected
    by_kind = by_signal(trials, "first_survivor_s")
    return {
        "workers": size,
        "heartbeat_interval_ms": DETECTION_HEARTBEAT_MS,
        "sigkill_s": median(by_kind["SIGKILL"]),
        "sigstop_s": median(by_kind["SIGSTOP"]),
        "sigkill_max_s": max(by_kind["SIGKILL"], default=math.nan),
        "sigstop_max_s": max(by_kind["SIGSTOP"], default=math.nan),
        "unexpected_member_failed_rounds": unexpected,
        "worker_loop_lag_max_ms": max(r["loop_lag"]["max_ms"] or 0.0 for r in reports),
        "trials": trials,
    }


# --- false positives -----------------------------------------------------------------------------


async def bench_false_positives(bench: Bench) -> dict[str, Any]:
    """N simulated workers heartbeating every 100 ms for a fixed time: nobody may be failed."""
    args = bench.args
    size = args.fp_participants
    job = "false-positives"
    config = JobConfig(min_nodes=size, max_nodes=size, heartbeat_interval_ms=DETECTION_HEARTBEAT_MS)
    processes = await bench.participants(job, size, config, "fp")
    try:
        for process in processes:
            process.send("join")
        await asyncio.gather(*(p.expect("active", args.phase_timeout_s) for p in processes))
        # Reset the load processes' lag statistics: the window starts now.
        await asyncio.gather(*(p.request("report", "report", 30) for p in processes))
        leader = await bench.leader_pid()
        before = CpuSample.take([leader] if leader else [], time.perf_counter())
        await asyncio.sleep(args.fp_duration_s)
        after = CpuSample.take([leader] if leader else [], time.perf_counter())
        reports = await asyncio.gather(*(p.request("report", "report", 30) for p in processes))
        status = await bench.admin.get_job(job)
        failed_rounds = await bench.failed_in_history(job)
    finally:
        with contextlib.suppress(RallypointError):
            await bench.admin.close_job(job)
        await stop_all(processes)
    lost = sum(r["lost"] for r in reports)
    # Each participant declared failed is one false positive; a failure the load process did
    # not notice still ended a round.
    false_positives = max(lost, failed_rounds)
    bench.unexpected_failures["false_positive_run"] = false_positives
    print(
        f"false positives: {false_positives} among {size} workers at "
        f"{DETECTION_HEARTBEAT_MS} ms heartbeats over {args.fp_duration_s:g} s",
        flush=True,
    )
    return {
        "participants": size,
        "heartbeat_interval_ms": DETECTION_HEARTBEAT_MS,
        "duration_s": args.fp_duration_s,
        "false_positives": false_positives,
        "participants_lost": lost,
        "member_failed_rounds": failed_rounds,
        "final_round": status.round.round,
        "lost_reasons": [reason for r in reports for reason in r["lost_reasons"]][:5],
        "load_loop_lag_max_ms": max(r["loop_lag"]["max_ms"] or 0.0 for r in reports),
        "load_loop_lag_p99_ms": max(r["loop_lag"]["p99_ms"] or 0.0 for r in reports),
        "leader_cpu": cpu_share(before, after),
    }
