"""Recovery: SIGKILL of one of 4 workers until the survivors train again, rallypoint's
in-process re-formation against torchrun (c10d) restarting its workers; restore against a
raw DCP load.

    .venv/bin/python -m bench.recovery_bench [--trials 3] [--out bench/results/recovery.json]
    .venv/bin/python -m bench.recovery_bench --smoke --out /tmp/recovery.json   # ~2 min

rallypoint: a 3-member cluster; each trial starts 4 workers of ``rallypoint.worker.
demo_train`` (an MLP, gloo, a checkpoint every 20 steps), waits until all 4 have trained
together, SIGKILLs one and measures until each of the 3 survivors has counted a step at
world size 3 (``recovery_s``: detection, abandoning the collective, re-forming the group,
restoring).

torchrun: two agents of two workers each (``tests/worker/torchrun_script.py``, gloo
all-reduces), ``--rdzv-backend=c10d``; the worker of global rank 1 is SIGKILLed and the time
is measured until every worker of the restarted group has done its first all-reduce.
*Tuned*: ``last_call_timeout=1`` s, ``--monitor-interval=0.1`` and the rendezvous store not
shared with the workers (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: every restart gets a fresh
store); *default*: torch's defaults. A configuration that never recovers is reported as null
with the reason. All three run in the same invocation, alternating trial by trial.

Shaped jobs (bench/shaped_recovery.py): a dp=4 x tp=2 mesh job losing a process, then a host;
with a spare host, losing a host, then draining one (``--shaped-only`` runs only these and
updates their fields in ``--out``).

Restore: one process saves a ~``--restore-mb`` MB model and AdamW state with the
Checkpointer, then alternately restores it with ``restore_checkpoint`` (what the elastic loop
does: metadata, state dicts for this world, DCP load, install, sampler) and with a raw
``dcp.load`` into ready state dicts; ``restore_vs_dcp`` is raw time / our time (1.0: as
fast).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.cluster import RallypointCluster
from bench.common import (
    TorchrunAgents,
    follow_events,
    json_safe,
    machine_info,
    package_versions,
    scratch_root,
)
from bench.shaped_recovery import SHAPED_FIELDS, shaped_figures, shrink_trial, spare_trial
from rallypoint.worker.process_tree import run_reaped
from tests.integration.harness import free_port_block

REPOSITORY = Path(__file__).resolve().parents[1]
TORCHRUN_SCRIPT = REPOSITORY / "tests" / "worker" / "torchrun_script.py"
# A worker of the demo's program that can block inside a step (tests/worker/hang_worker.py).
HANG_WORKER = REPOSITORY / "tests" / "worker" / "hang_worker.py"
# The hang trials' step: 0.25 s of work a step (hang bounds are stated for 0.1-0.5 s steps).
HANG_STEP_S = 0.25
WORKERS = 4
Event = dict[str, Any]


class ElasticTrial:
    """Four elastic workers of one job, and the events they print. ``program`` is the
    worker's command after the interpreter (the demo's training program by default);
    ``extra`` adds arguments per worker name."""

    def __init__(
        self,
        endpoints: str,
        job: str,
        root: Path,
        program: Sequence[str] = ("-m", "rallypoint.worker.demo_train"),
        step_sleep_s: float = 0.01,
        extra: dict[str, list[str]] | None = None,
    ) -> None:
        self.events: list[Event] = []
        self.lock = threading.Lock()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        for index in range(WORKERS):
            name = f"w{index}"
            with open(root / f"{job}-{name}.err", "w") as stderr:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        *program,
                        f"--endpoints={endpoints}",
                        f"--job={job}",
                        f"--name={name}",
                        f"--checkpoint-dir={root / job}",
                        "--checkpoint-every=20",
                        f"--step-sleep-s={step_sleep_s}",
                        *(extra or {}).get(name, []),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            self.procs[name] = proc
            follow_events(proc, self.events, self.lock)

    def training_at(self, names: Sequence[str], world_size: int, after_t: float) -> float | None:
        with self.lock:
            steps = [e for e in self.events if e["event"] == "step" and e["t"] > after_t]
        firsts = []
        for name in names:
            mine = [e["t"] for e in steps if e["name"] == name and e["world_size"] == world_size]
            if not mine:
                return None
            firsts.append(float(mine[0]))
        return max(firsts)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(what: str, ready: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"no {what} within {timeout_s:g} s")


def kill_and_recover(
    trial: ElasticTrial, victims: Sequence[str], timeout_s: float
) -> tuple[Event, list[Event], list[Event]]:
    """Once the 4 workers trained together (TimeoutError if they never did), SIGKILL
    ``victims`` at once and wait for the survivors to train again: the trial's figures,
    the events up to the kill and the ``round_formed`` events after it."""
    names = list(trial.procs)
    wait_for("4 workers training", lambda: trial.training_at(names, WORKERS, 0.0), timeout_s)
    time.sleep(1.0)  # a few checkpoints' worth of training at world 4
    killed_at = time.time()
    for victim in victims:
        os.killpg(trial.procs[victim].pid, signal.SIGKILL)
    with trial.lock:
        before = [e for e in trial.events if e["t"] <= killed_at]
    survivors = [name for name in names if name not in victims]
    try:
        back = wait_for(
            f"survivors training at world {len(survivors)}",
            lambda: trial.training_at(survivors, len(survivors), killed_at),
            timeout_s,
        )
    except TimeoutError as error:
        return {"recovered": False, "error": str(error)}, before, []
    with trial.lock:
        formed = [e for e in trial.events if e["event"] == "round_formed" and e["t"] > killed_at]
    figures = {
        "recovered": True,
        "recovery_s": back - killed_at,
        "restore_sources": sorted({e["source"] for e in formed}),
    }
    return figures, before, formed


def elastic_trial(endpoints: str, job: str, root: Path, timeout_s: float) -> Event:
    trial = ElasticTrial(endpoints, job, root)
    try:
        figures, _, _ = kill_and_recover(trial, [list(trial.procs)[-1]], timeout_s)
        return figures
    finally:
        trial.stop()


def memory_trial(
    endpoints: str, job: str, root: Path, timeout_s: float, victims: Sequence[str]
) -> Event:
    """Four FSDP2 workers on two simulated hosts (w0, w1 on host-a; w2, w3 on host-b), a
    memory snapshot every step and a disk checkpoint every 20; ``victims`` are SIGKILLed at
    once and the survivors must train again, restored from the peers' memory."""
    hosts = {"w0": "host-a", "w1": "host-a", "w2": "host-b", "w3": "host-b"}
    extra = {
        name: ["--fsdp", "--snapshot-every=1", f"--host={host}"] for name, host in hosts.items()
    }
    trial = ElasticTrial(endpoints, job, root, extra=extra)
    try:
        try:
            figures, before, formed = kill_and_recover(trial, victims, timeout_s)
        except TimeoutError as error:
            return {"recovered": False, "error": f"start: {error}"}
        if not figures["recovered"]:
            return figures
        trained = max(e["step"] for e in before if e["event"] == "step")
        disk = [e["step"] for e in before if e["event"] == "checkpoint_committed"]
        return {
            **figures,
            "reasons": sorted({e["reason"] for e in formed}),
            "steps_lost": trained - min(e["step"] for e in formed),
            "disk_steps_lost": trained - max(disk, default=0),
            "restore_s": max(e["restore_s"] for e in formed),
        }
    finally:
        trial.stop()


def memory_figures(
    root: Path,
    size_mb: float,
    repeats: int,
    timeout_s: float,
    world: int = 3,
    erasure: str = "",
) -> dict[str, Any]:
    """bench/memory_ranks.py's ``world`` ranks: restore from peers' memory against raw DCP,
    the snapshot's blocked time and the memory it holds (snapshots kept as 2 copies, or
    erasure-coded: ``erasure`` "K+M")."""
    workdir = root / f"memory-figures-{world}{'-' + erasure if erasure else ''}"
    workdir.mkdir()
    first = free_port_block(3)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "FIRST_PORT": str(first),
        "SECOND_PORT": str(first + 1),
        "THIRD_PORT": str(first + 2),
        "MEMORY_WORLD": str(world),
        "MEMORY_ERASURE": erasure,
        # Replicated snapshots are kept in host memory (files), then restored from there by
        # new processes: a job-wide crash (bench/memory_ranks.py).
        "MEMORY_HOST_DIR": "" if erasure else str(workdir / "shm"),
    }
    for phase in ("take", "restart") if not erasure else ("take",):
        ranks = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.memory_ranks",
                    str(rank),
                    str(workdir),
                    str(size_mb),
                    str(repeats),
                ],
                env={**env, "MEMORY_PHASE": phase},
                stderr=open(workdir / f"rank{rank}-{phase}.err", "w"),  # noqa: SIM115
                cwd=REPOSITORY,
            )
            for rank in range(world)
        ]
        try:
            for rank in ranks:
                if rank.wait(timeout=timeout_s) != 0:
                    raise RuntimeError(f"a memory rank failed: see {workdir}")
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
                    rank.wait()
    figures: dict[str, Any] = json.loads((workdir / "memory-figures.json").read_text())
    if not erasure:
        figures["host_memory"] = json.loads((workdir / "host-memory-figures.json").read_text())
    return figures


class TorchrunTrial(TorchrunAgents):
    """Two torchrun agents (2 workers each) of one job; the events the workers write."""

    def __init__(self, tuned: bool, job: str, out: Path) -> None:
        endpoint = f"127.0.0.1:{free_port_block(1)}"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=2",
            "--max-restarts=3",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={job}",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        if tuned:
            command += ["--monitor-interval=0.1", "--rdzv-conf=last_call_timeout=1"]
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        command += [str(TORCHRUN_SCRIPT), f"--out={out}", "--steps=1000000"]
        super().__init__(command, out, env=env)

    def check_agents(self) -> None:
        exited = self.exited()
        if exited is not None:
            agent, log = exited
            errors = [
                line.strip()
                for line in log.read_text(errors="replace").splitlines()
                if "Error" in line and "registry.py" not in line
            ]
            last = errors[-1][:300] if errors else "no error line"
            raise RuntimeError(f"an agent exited ({agent.returncode}): {last} ({log})")

    def stop(self) -> None:
        self.kill_agents()


def torchrun_trial(tuned: bool, job: str, out: Path, timeout_s: float) -> Event:
    trial = TorchrunTrial(tuned, job, out)
    try:

        def warmed_up() -> list[Event] | None:
            trial.check_agents()
            started = trial.events("started")
            stepped = {e["pid"] for e in trial.events("step") if e["step"] >= 3}
            return started if len(started) == WORKERS and len(stepped) == WORKERS else None

        first = wait_for("4 workers past step 3", warmed_up, timeout_s)
        victim = next(e for e in first if e["rank"] == 1)
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        old = {e["pid"] for e in first}

        def restarted_and_stepping() -> float | None:
            trial.check_agents()
            pids = {e["pid"] for e in trial.events("started") if e["pid"] not in old}
            if len(pids) < WORKERS:
                return None
            firsts: dict[int, float] = {}
            for e in trial.events("step"):
                if e["pid"] in pids and e["pid"] not in firsts:
                    firsts[e["pid"]] = e["t"]
            return max(firsts.values()) if len(firsts) == WORKERS else None

        try:
            back = wait_for("4 restarted workers stepping", restarted_and_stepping, timeout_s)
        except (RuntimeError, TimeoutError) as error:
            return {"recovered": False, "error": str(error)}
        return {"recovered": True, "recovery_s": back - killed_at}
    finally:
        trial.stop()


def hang_trial(endpoints: str, job: str, root: Path, timeout_s: float) -> Event:
    """One of 4 workers blocks forever inside its step (process and heartbeat alive):
    ``hang_detect_s`` from its last completed step to the round's end (the coordinator's
    verdict), ``hang_recovery_s`` from there to every survivor training at world 3."""
    victim = f"w{WORKERS - 1}"
    trial = ElasticTrial(
        endpoints,
        job,
        root,
        program=(str(HANG_WORKER),),
        step_sleep_s=HANG_STEP_S,
        extra={victim: ["--block-at-step=60"]},
    )
    names = list(trial.procs)
    try:
        wait_for("4 workers training", lambda: trial.training_at(names, WORKERS, 0.0), timeout_s)

        def blocked() -> Event | None:
            with trial.lock:
                found = [e for e in trial.events if e["event"] == "blocked"]
            return found[0] if found else None

        blocked_event = wait_for("the victim to block", blocked, timeout_s)
        with trial.lock:
            last_step = max(
                e["t"] for e in trial.events if e["event"] == "step" and e["name"] == victim
            )
        survivors = names[:-1]
        try:
            back = wait_for(
                "survivors training at world 3",
                lambda: trial.training_at(survivors, WORKERS - 1, blocked_event["t"]),
                timeout_s,
            )
        except TimeoutError as error:
            return {"recovered": False, "error": str(error)}
        with trial.lock:
            ended = min(
                e["t"]
                for e in trial.events
                if e["event"] == "round_ended" and e["t"] > blocked_event["t"]
            )
        step_times = sorted(
            b["t"] - a["t"]
            for a, b in zip(
                [e for e in trial.events if e["event"] == "step" and e["name"] == "w0"],
                [e for e in trial.events if e["event"] == "step" and e["name"] == "w0"][1:],
                strict=False,
            )
            if b["t"] < last_step
        )
        median_step_s = step_times[len(step_times) // 2] if step_times else None
        return {
            "recovered": True,
            "hang_detect_s": ended - last_step,
            "hang_recovery_s": back - ended,
            "median_step_s": median_step_s,
        }
    finally:
        trial.stop()


def median_or_reason(trials: Sequence[Event]) -> dict[str, Any]:
    recovered = [t["recovery_s"] for t in trials if t["recovered"]]
    summary: dict[str, Any] = {
        "recovered": f"{len(recovered)}/{len(trials)}",
        "median_s": statistics.median(recovered) if recovered else None,
        "trials": list(trials),
    }
    if not trials:
        summary["reason"] = "not run (--smoke)"
    elif not recovered:
        summary["reason"] = "; ".join(sorted({t["error"] for t in trials}))
    return summary


# ------------------------------------------------------------------ restore


def restore_figures(root: Path, size_mb: float, repeats: int) -> dict[str, Any]:
    """Our restore against a raw DCP load of the same checkpoint, alternating."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from rallypoint.worker import Checkpointer, ElasticSampler, restore_checkpoint

    width = 1024
    layers = max(1, int(size_mb * 1024 * 1024 / 4 / (width * width)))

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))

    store = dist.FileStore(str(root / "restore-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(60))
    try:
        source = model()
        optimizer = torch.optim.AdamW(source.parameters())
        source(torch.randn(2, width)).sum().backward()
        optimizer.step()
        sampler = ElasticSampler(1000, batch_size=10, rank=0, world_size=1)
        saved = Checkpointer(root / "restore").save_async(1, source, optimizer, sampler=sampler)
        path = saved.wait().path
        ours_s, raw_s, bytes_read = [], [], 0
        for _ in range(repeats):
            target = model()
            target_optimizer = torch.optim.AdamW(target.parameters())
            started = time.perf_counter()
            result = restore_checkpoint(path, target, target_optimizer, sampler=sampler)
            ours_s.append(time.perf_counter() - started)
            bytes_read = result.bytes_moved

            target = model()
            target_optimizer = torch.optim.AdamW(target.parameters())
            started = time.perf_counter()
            model_state, optimizer_state = get_state_dict(target, target_optimizer)
            state = {"model": model_state, "optimizer": optimizer_state, "progress": b""}
            dcp.load(state, checkpoint_id=str(path))
            raw_s.append(time.perf_counter() - started)
    finally:
        dist.destroy_process_group()
    ours, raw = statistics.median(ours_s), statistics.median(raw_s)
    return {
        "checkpoint_bytes": bytes_read,
        "ours_median_s": ours,
        "raw_dcp_median_s": raw,
        "ours_bytes_per_s": bytes_read / ours,
        "raw_dcp_bytes_per_s": bytes_read / raw,
        "restore_vs_dcp": raw / ours,
        "repeats": repeats,
    }


# ------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> dict[str, Any]:
    with scratch_root("recovery-bench-", args.data_dir) as root:
        return run_in(args, root)


def run_in(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    cluster = RallypointCluster(root / "cluster")
    trials: dict[str, list[Event]] = {
        "rallypoint": [],
        "torchrun_tuned": [],
        "torchrun_default": [],
    }
    hangs: list[Event] = []
    memory_trials: list[Event] = []
    host_trials: list[Event] = []
    shaped: list[Event] = []
    try:
        cluster.start()
        asyncio.run(cluster.wait_ready())
        endpoints = ",".join(cluster.addresses.values())
        for trial in range(0 if args.skip_shaped else args.trials):
            for name, shaped_trial in (("shrink", shrink_trial), ("spare", spare_trial)):
                figures = shaped_trial(endpoints, f"{name}-{trial}", root, args.timeout_s)
                shaped.append(figures)
                print(f"shaped ({name}) trial {trial}: {figures}", flush=True)
        for trial in range(0 if args.shaped_only else args.trials):
            figures = memory_trial(endpoints, f"memory-{trial}", root, args.timeout_s, ["w3"])
            memory_trials.append(figures)
            print(f"memory (w3)      trial {trial}: {figures}", flush=True)
            if trial == 0:
                figures = memory_trial(
                    endpoints, f"host-{trial}", root, args.timeout_s, ["w2", "w3"]
                )
                host_trials.append(figures)
                print(f"memory (host-b)  trial {trial}: {figures}", flush=True)
        for trial in range(0 if args.memory_only or args.shaped_only else args.trials):
            figures = elastic_trial(endpoints, f"bench-{trial}", root, args.timeout_s)
            trials["rallypoint"].append(figures)
            print(f"rallypoint       trial {trial}: {figures}", flush=True)
            for tuned in (True, False)[: 1 if args.smoke else 2]:
                key = "torchrun_tuned" if tuned else "torchrun_default"
                out = root / f"{key}-{trial}"
                figures = torchrun_trial(tuned, f"{key}-{trial}", out, args.timeout_s)
                trials[key].append(figures)
                print(f"{key:<16} trial {trial}: {figures}", flush=True)
        skip_hangs = args.smoke or args.memory_only or args.shaped_only
        for trial in range(0 if skip_hangs else args.trials):
            figures = hang_trial(endpoints, f"hang-{trial}", root, args.timeout_s)
            hangs.append(figures)
            print(f"hang             trial {trial}: {figures}", flush=True)
    finally:
        cluster.stop()
    if args.shaped_only:
        return _with_shaped(_previous_report(Path(args.out)), shaped)
    restore = restore_figures(root, args.restore_mb, args.restore_repeats)
    print(f"restore: {restore}", flush=True)
    memory = memory_figures(root, args.restore_mb, args.restore_repeats, args.timeout_s * 3)
    print(f"memory: {memory}", flush=True)
    coded = memory_figures(root, args.restore_mb, 1, args.timeout_s * 3, world=4, erasure="4+2")
    print(f"memory, erasure-coded 4+2: {coded}", flush=True)
    memory_summary = median_or_reason(memory_trials)
    recovered_memory = [t for t in memory_trials if t["recovered"]]
    summaries = {key: median_or_reason(values) for key, values in trials.items()}
    report: dict[str, Any] = {
        "benchmark": "elastic recovery and restore",
        "machine": machine_info(),
        "versions": package_versions(["torch", "rallypoint", "grpcio"]),
        "parameters": {
            "workers": WORKERS,
            "trials": args.trials,
            "fault": "SIGKILL of one of 4 workers",
            "measured": "kill -> every survivor (rallypoint) or restarted worker (torchrun) "
            "trained a step",
            "torchrun_tuned": "c10d, last_call_timeout=1, monitor-interval 0.1, "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            "torchrun_default": "c10d, torch's defaults",
            "restore_mb": args.restore_mb,
            "memory": "FSDP2 demo model, 4 workers on 2 simulated hosts, a memory snapshot "
            "every step (2 copies, across hosts) and a disk checkpoint every 20: SIGKILL of w3 "
            "(memory_recovery_s: kill -> 3 survivors trained a step; memory_steps_lost: last "
            "step trained before the kill - restored step; disk_steps_lost: the same for the "
            "last disk checkpoint), and once of w2 and w3 (host-b); memory figures: "
            "bench/memory_ranks.py, 3 ranks on 3 hosts, an FSDP2 model of restore_mb MB "
            "(memory_overhead_ec: 4 ranks on 4 hosts, erasure-coded 4+2); the 3 ranks keep "
            "their snapshots in host memory (files) and exit as a crash would, and 3 new "
            "processes take the files up and restore from them (host_memory_restore_bytes_per_s"
            ": the state over the first restore, taking the files up included)",
            "smoke": args.smoke,
            "hang": "one of 4 workers blocks forever inside its step at step 60 (its process "
            f"and heartbeat alive), {HANG_STEP_S} s of work a step: hang_detect_s is from its "
            "last completed step to the coordinator ending the round, hang_recovery_s from "
            "then to the 3 others training; default hang settings (2.5 x median, 1.5 s)",
        },
        "recovery_s": summaries["rallypoint"]["median_s"],
        "torchrun_tuned_s": summaries["torchrun_tuned"]["median_s"],
        "torchrun_default_s": summaries["torchrun_default"]["median_s"],
        "restore_vs_dcp": restore["restore_vs_dcp"],
        "hang_detect_s": _median([t["hang_detect_s"] for t in hangs if t["recovered"]]),
        "hang_recovery_s": _median([t["hang_recovery_s"] for t in hangs if t["recovered"]]),
        "memory_recovery_s": memory_summary["median_s"],
        "memory_steps_lost": _median([t["steps_lost"] for t in recovered_memory]),
        "disk_steps_lost": _median([t["disk_steps_lost"] for t in recovered_memory]),
        "memory_restore_vs_dcp": memory["memory_restore_vs_dcp"],
        "host_memory_restore_bytes_per_s": memory["host_memory"]["host_memory_restore_bytes_per_s"],
        "snapshot_blocked_s_per_gb": memory["snapshot_blocked_s_per_gb"],
        "memory_overhead": memory["memory_overhead"],
        "memory_overhead_ec": coded["memory_overhead"],
        "host_lost": [
            {k: t.get(k) for k in ("recovered", "restore_sources", "recovery_s", "error")}
            for t in host_trials
        ],
        "details": {
            **summaries,
            "restore": restore,
            "hang": hangs,
            "memory": {
                **memory_summary,
                "figures": memory,
                "figures_ec": coded,
                "host_lost": host_trials,
            },
        },
    }
    report = _with_shaped(report, [] if args.skip_shaped else shaped)
    for key in ("torchrun_tuned", "torchrun_default"):
        if summaries[key]["median_s"] is None:
            report[f"{key}_reason"] = summaries[key]["reason"]
    if report["recovery_s"] and report["torchrun_tuned_s"]:
        report["speedup_vs_tuned_torchrun"] = report["torchrun_tuned_s"] / report["recovery_s"]
    return report


def _previous_report(path: Path) -> dict[str, Any]:
    """The report at ``path`` (a ``--shaped-only`` run updates its shaped-job fields)."""
    if not path.exists():
        raise SystemExit(f"--shaped-only updates an existing report: {path} does not exist")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def _with_shaped(report: dict[str, Any], shaped: Sequence[Event]) -> dict[str, Any]:
    """``report`` with the shaped-job fields (bench/shaped_recovery.py) and their trials."""
    if not shaped:
        return report
    report.update(shaped_figures(shaped))
    report["parameters"]["shaped"] = (
        "rallypoint.worker.mesh_train, dp=4 x tp=2 (unit_size 2) on hosts of 4 processes, a "
        "memory snapshot every step: SIGKILL of one process (shaped_recovery_s: until the 6 "
        "survivors trained at dp=3), then of a whole host (host_loss_rounds); with a spare "
        "host waiting, SIGKILL of a host (spare_recovery_s: until 8 trained again), then a "
        "drain of a host while training (drain_steps_lost); bench/shaped_recovery.py"
    )
    report["details"]["shaped"] = {"machine": machine_info(), "trials": list(shaped)}
    return report


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    labels, values = [], []
    for label, key in (
        ("rallypoint", "recovery_s"),
        ("rallypoint FSDP2\nfrom memory", "memory_recovery_s"),
        ("torchrun tuned", "torchrun_tuned_s"),
        ("torchrun default", "torchrun_default_s"),
    ):
        labels.append(label if report[key] is not None else f"{label}\n(never recovered)")
        values.append(report[key] or 0.0)
    left.bar(labels, values, color=["tab:green", "tab:olive", "tab:orange", "tab:red"])
    left.set_ylabel("seconds, SIGKILL -> training (median)")
    left.set_title("recovery from a worker's SIGKILL (4 workers)")
    restore = report["details"]["restore"]
    memory = report["details"]["memory"]["figures"]
    right.bar(
        [
            "rallypoint restore\n(disk)",
            "raw DCP load",
            "from peers'\nmemory",
            "raw DCP load\n(same state)",
        ],
        [
            restore["ours_bytes_per_s"] / 1e6,
            restore["raw_dcp_bytes_per_s"] / 1e6,
            memory["memory_restore_bytes_per_s"] / 1e6,
            memory["raw_dcp_bytes_per_s"] / 1e6,
        ],
        color=["tab:green", "tab:blue", "tab:olive", "tab:blue"],
    )
    right.set_ylabel("MB/s")
    right.set_title(
        f"restore throughput (disk {report['restore_vs_dcp']:.2f}x, "
        f"memory {report['memory_restore_vs_dcp']:.2f}x raw DCP)"
    )
    figure.tight_layout()
    figure.savefig(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/recovery.json")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--data-dir",
        help="keep the cluster's data, the trials' logs and checkpoints here (default: a "
        "temp folder, removed at the end)",
    )
    parser.add_argument("--timeout-s", type=float, default=90.0, help="per phase of a trial")
    parser.add_argument("--restore-mb", type=float, default=64.0)
    parser.add_argument("--restore-repeats", type=int, default=5)
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the in-memory snapshot trials and figures (no torchrun, no hang trials)",
    )
    parser.add_argument(
        "--shaped-only",
        action="store_true",
        help=f"only the shaped-job trials; updates {', '.join(SHAPED_FIELDS)} in --out",
    )
    parser.add_argument("--skip-shaped", action="store_true", help="no shaped-job trials")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="checks it runs: one rallypoint and one tuned torchrun trial, no hang trials, "
        "a 1 MB restore; figures not comparable",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.restore_mb, args.restore_repeats = 1, 1.0, 1
        args.skip_shaped = args.skip_shaped or not args.shaped_only
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    if not args.shaped_only:
        plot(report, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in report.items() if k != "details"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
