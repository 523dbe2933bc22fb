"""Rendezvous benchmark: round close at 64/256/1024 workers against torchrun's own rendezvous,
failure detection (SIGKILL, SIGSTOP), false positives, and how many workers one leader keeps.

One 3-member cluster (``rallypoint cluster up``) on loopback serves every phase; this process
drives load processes (bench/rendezvous_load.py) and reads their JSON-line events, which carry
wall-clock times (one machine, so times from different processes compare).

- Rounds: N simulated workers (full client library: a session, a heartbeat stream and a round
  watch each) spread over a few load processes join a job with min = max = N at once. The
  figure is the time every worker has seen the round ACTIVE minus the time the last join was
  acknowledged. Also a min < max job with last_call, where the close waits for the last call.
- torchrun: ``DynamicRendezvousHandler`` over ``C10dRendezvousBackend`` with a TCPStore hosted
  here, N agents (threads in the same number of load processes) calling ``next_rendezvous()``
  at once; the figure is from the last agent's call to every agent's return. Sizes beyond one
  that did not finish in time are skipped, and the JSON says why.
- Detection: real worker processes heartbeating every 100 ms form one job; each trial kills
  (SIGKILL) or stops (SIGSTOP) one and times the first survivor's notice of the round change.
  The job is reconfigured to the survivors between trials.
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
import functools
import json
import math
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import uvloop

from bench.common import (
    CpuSample,
    cpu_share,
    machine_info,
    package_versions,
    write_results,
)
from bench.kv_bench import RallypointCluster
from rallypoint.client import Client, EndReason, JobConfig, RallypointError
from rallypoint.worker.process_tree import run_reaped

T = TypeVar("T")

REPOSITORY = Path(__file__).resolve().parents[1]
# Events carry lists of one number per simulated worker.
EVENT_LINE_LIMIT_BYTES = 64 * 1024 * 1024
ROUND_HEARTBEAT_MS = 1000
DETECTION_HEARTBEAT_MS = 100


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


# --- load processes ------------------------------------------------------------------------------


class LoadProcessError(RuntimeError):
    pass


@dataclass
class LoadProcess:
    """A bench/rendezvous_load.py process: commands on stdin, events from stdout."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    # Set, and replaced, whenever an event arrives or the process exits.
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    @staticmethod
    async def start(
        name: str,
        role: str,
        arguments: list[str],
        log_dir: Path,
        module: str = "bench.rendezvous_load",
    ) -> LoadProcess:
        """``module`` (bench/rendezvous_load.py unless given) run as ``role``."""
        log_path = log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                role,
                *arguments,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                cwd=REPOSITORY,
                limit=EVENT_LINE_LIMIT_BYTES,
            )
        process = LoadProcess(name, proc, log_path)
        process.reader = asyncio.create_task(process._read())
        return process

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.events.append(json.loads(line))
            self._wake()
        await self.proc.wait()
        self._wake()

    def _wake(self) -> None:
        self.arrived.set()
        self.arrived = asyncio.Event()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        if self.proc.stdin is not None and self.proc.returncode is None:
            self.proc.stdin.write(line.encode() + b"\n")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-1500:]
        return ""

    async def expect(self, event: str, timeout_s: float, since: int = 0) -> dict[str, Any]:
        """The first ``event`` at or after index ``since`` of the events, waiting for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for item in self.events[since:]:
                if item["event"] == event:
                    return item
                if item["event"] == "failed":
                    raise LoadProcessError(f"{self.name} failed: {item['error']}")
            if self.proc.returncode is not None:
                raise LoadProcessError(
                    f"{self.name} exited ({self.proc.returncode}) before {event!r}; "
                    f"log tail:\n{self.log_tail()}"
                )
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise TimeoutError(f"{self.name}: no {event!r} within {timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining_s)

    async def request(self, command: str, event: str, timeout_s: float) -> dict[str, Any]:
        since = len(self.events)
        self.send(command)
        return await self.expect(event, timeout_s, since)

    async def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.returncode is None:
            self.send("close")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout_s)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        if self.reader is not None:
            await self.reader


async def stop_all(processes: Sequence[LoadProcess], timeout_s: float = 60.0) -> None:
    await asyncio.gather(*(p.stop(timeout_s) for p in processes))


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal counts, none empty."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def config_json(config: JobConfig) -> str:
    return json.dumps(
        {name: getattr(config, name) for name in JobConfig.__dataclass_fields__},
    )


# --- the bench context: cluster, admin client, leader CPU --------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    cluster: RallypointCluster
    admin: Client
    log_dir: Path
    # Participants declared failed that were alive, per phase.
    unexpected_failures: dict[str, int] = field(default_factory=dict)

    @property
    def endpoints(self) -> str:
        return ",".join(self.cluster.addresses.values())

    async def leader_pid(self) -> int | None:
        """The process id of the member that leads now (for its CPU)."""
        address = await self.cluster.leader_address()
        for pid in self.cluster.server_pids():
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if f"--client-address={address}".encode() in command:
                    return pid
        return None

    async def spread(
        self, role: str, job: str, total: int, arguments: list[str], active_timeout_s: float
    ) -> list[LoadProcess]:
        """``total`` simulated workers of ``role`` spread over the load processes, each of
        which has reported ready."""
        processes = []
        first = 0
        try:
            for index, count in enumerate(split(total, self.args.load_processes)):
                own = [f"--first={first}", f"--count={count}"]
                processes.append(
                    await LoadProcess.start(
                        f"{job}-load{index}",
                        role,
                        [
                            f"--job={job}",
                            *own,
                            f"--active-timeout-s={active_timeout_s}",
                            *arguments,
                        ],
                        self.log_dir,
                    )
                )
                first += count
            await asyncio.gather(*(p.expect("ready", self.args.phase_timeout_s) for p in processes))
        except BaseException:
            await stop_all(processes)
            raise
        return processes

    async def participants(
        self, job: str, total: int, config: JobConfig, label: str
    ) -> list[LoadProcess]:
        arguments = [
            f"--endpoints={self.endpoints}",
            f"--name-prefix={label}-",
            f"--config={config_json(config)}",
        ]
        # Half the phase's timeout: the process reports what it saw before the driver gives up.
        return await self.spread(
            "participants", job, total, arguments, self.args.phase_timeout_s / 2
        )

    async def failed_in_history(self, job: str, expected: frozenset[int] = frozenset()) -> int:
        """Rounds of ``job`` that ended because a participant not in ``expected`` failed."""
        status = await self.admin.get_job(job)
        return sum(
            1
            for record in status.history
            if record.end_reason is EndReason.MEMBER_FAILED and record.ended_by not in expected
        )


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


def fmt_s(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f} s"


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


# --- failure detection ---------------------------------------------------------------------------


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


async def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll a condition of the events already read; the times compared are the events'."""
    deadline = time.monotonic() + timeout_s
    while (value := condition()) is None or value is False:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


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
    workers = [
        await LoadProcess.start(
            f"worker{i}",
            "worker",
            [
                f"--endpoints={bench.endpoints}",
                f"--job={job}",
                f"--name-prefix=worker{i}",
                f"--config={config_json(config)}",
            ],
            bench.log_dir,
        )
        for i in range(size)
    ]
    trials: list[dict[str, Any]] = []
    victims: set[int] = set()
    try:
        await asyncio.gather(*(w.expect("ready", args.phase_timeout_s) for w in workers))
        for worker in workers:
            worker.send("join")
        joined = await asyncio.gather(*(w.expect("joined", args.phase_timeout_s) for w in workers))
        participant_ids = {
            w.name: e["participant_id"] for w, e in zip(workers, joined, strict=True)
        }
        alive = list(workers)
        for trial, kind in enumerate(kinds, start=1):
            round_number = await wait_until(
                functools.partial(common_active_round, alive),
                args.phase_timeout_s,
                "every worker in one ACTIVE round",
            )
            # Let the detectors learn the heartbeats' rhythm before the fault.
            await asyncio.sleep(args.detection_settle_s)
            victim = alive.pop()
            victims.add(participant_ids[victim.name])
            signalled_at = time.time()
            os.kill(victim.pid, kind)
            noticed = await wait_until(
                functools.partial(notice_times, alive, round_number),
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
            if kind is signal.SIGSTOP:
                victim.proc.kill()  # a stopped process dies of SIGKILL too
            # The next round holds the survivors: lowering min closes it at once.
            await bench.admin.configure(
                job,
                JobConfig(
                    min_nodes=len(alive),
                    max_nodes=size,
                    heartbeat_interval_ms=DETECTION_HEARTBEAT_MS,
                ),
            )
        unexpected = await bench.failed_in_history(job, frozenset(victims))
        reports = await asyncio.gather(*(w.request("report", "report", 30) for w in alive))
    finally:
        with contextlib.suppress(RallypointError):
            await bench.admin.close_job(job)
        await stop_all(workers)
    bench.unexpected_failures["detection"] = unexpected
    by_kind = {
        name: [t["first_survivor_s"] for t in trials if t["signal"] == name]
        for name in ("SIGKILL", "SIGSTOP")
    }
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


def target_value(top: dict[str, Any], name: str) -> float | None:
    if name.endswith("]"):
        base, size = name[:-1].split("[")
        value = top[base].get(size)
    else:
        value = top[name]
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def verdicts(top: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (direction, target) in TARGETS.items():
        value = target_value(top, name)
        if value is None:
            verdict = "not measured"
        else:
            met = value >= target if direction == ">=" else value <= target
            verdict = "PASS" if met else "MISS"
        out[name] = {"value": value, "direction": direction, "target": target, "verdict": verdict}
    return out


def print_report(top: dict[str, Any], checked: dict[str, dict[str, Any]]) -> None:
    print("\nround close after the last join (every worker saw ACTIVE), medians:")
    for size, value in top["round_close_after_last_join_s"].items():
        theirs = top["torchrun_round_s"].get(size)
        print(f"  N={size:<6} rallypoint {fmt_s(value):>10}   torchrun {fmt_s(theirs):>10}")
    print("\ntargets:")
    for name, check in checked.items():
        value = check["value"]
        shown = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        print(
            f"  {name:<38}{shown:>10}  target {check['direction']} {check['target']:<8g}"
            f"{check['verdict']}"
        )


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


def sizes_arg(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


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
    parser.add_argument("--load-processes", type=int, default=2)
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
            for phase in args.phases.split(","):
                started = time.perf_counter()
                try:
                    results[phase] = await PHASES[phase](bench)
                except (TimeoutError, LoadProcessError, RallypointError) as error:
                    # The other phases still run; this one reports why it has no figures.
                    print(f"{phase}: failed: {error}", flush=True)
                    results[phase] = {**EMPTY_RESULTS[phase], "error": str(error)[:2000]}
                results["phase_wall_s"][phase] = time.perf_counter() - started
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
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="rendezvous-bench-") if temporary else args.data_dir)
    try:
        results, unexpected = uvloop.run(run(args, data_dir))
    finally:
        if temporary:
            shutil.rmtree(data_dir, ignore_errors=True)
    top = figures(results, sum(unexpected.values()))
    checked = verdicts(top)
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
