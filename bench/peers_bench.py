"""Beside the live peer: one data-parallel workload under plain DDP, torchft 0.2.0 and
rallypoint, trial by trial on the same machine: the steady step, the survivors' stall when a
process is SIGKILLed, a replacement's path to its first step in sync, and whether every rank
holds the same bits afterwards.

    .venv/bin/python -m bench.peers_bench [--trials 3] [--out bench/results/peers.json]
    .venv/bin/python -m bench.peers_bench --quick --out /tmp/peers.json   # one short trial each

The workload (bench/peers_worker.py): a 1.3 M-parameter MLP, 4 data-parallel processes, gloo,
one thread each, AdamW; at least 3 must keep training. Systems, in an order that rotates from
trial to trial, one after another (never two at once), the machine's load read before and
after each:

- ``plain``: torch.distributed's DistributedDataParallel over a static world of 4 (nothing
  survives a kill, so only its steady step is measured).
- ``torchft_default`` and ``torchft_hb1s``: torchft 0.2.0, each process a replica group of
  one with its Manager, torchft's DDP and optimizer wrappers, ProcessGroupGloo, a lighthouse
  (``torchft_lighthouse --min_replicas 3``) per trial at its default heartbeat timeout (5 s)
  or at 1 s. The gloo and Manager timeouts are those of torchft's own example (train_ddp.py:
  5 s and 30 s; its defaults of 60 s would hold a survivor a minute). torchft's stock DDP
  wrapper dies in ``backward()`` when a peer is killed mid all-reduce (an assertion on the
  failed work's future); bench/peers_worker.py wraps its comm hook minimally, and the JSON
  says so (``torchft_ddp_wrapper``).
- ``rallypoint``: ``elastic_training`` (min 3, max 4 workers) against a 3-member cluster
  started once for the run.
- ``rallypoint_warm``: the same, but the process that is killed runs under the warm
  launcher (``python -m rallypoint.worker.warm --restarts=1``, its restart delay the
  ``--rejoin-after-s``, started with the trial), and the replacement is the launcher's
  restart: a fork that finds
  torch, torch._dynamo and rallypoint's worker imported (bench/peers_warm.py). Its
  ``rejoin_first_step_s`` runs from the fork; ``diagnostic_ratios.rejoin_warm_vs_torchft``
  sets it beside torchft's cold replacement. The target ``ratios.rejoin_vs_torchft`` is the
  cold ``rallypoint``'s.
- ``cold_floor``: no system. One process started as a replacement is, which imports torch and
  torch.distributed, makes the model and AdamW and takes one step alone, then leaves: the
  least any system's cold replacement can take to its first step. ``rejoin_first_step_s``
  and ``rejoin_phases_s`` only; ``rejoin_above_cold_floor_s`` is each system's replacement
  less it, and ``diagnostic_ratios.cold_floor_vs_torchft`` (and ``..._into_training``)
  says how much of the target's 0.8 it leaves to coordination.

A kill trial: start 4 processes, wait until all 4 train together, let them run
``--steady-s`` (the steady step: each process's median time between steps, the median over
processes), SIGKILL one, start a replacement ``--rejoin-after-s`` later, wait for its first
step, let the 4 run ``--after-s``, then ask every process to stop at one step a little
ahead and print a checksum of its parameters and optimizer state there. From just before
the replacement starts until it has made its model and optimizer it has a CPU to itself
(the highest, from its first instruction) and every other process the bench started the
rest: the survivors, the coordinator's members or torchft's lighthouse (they stand for other
hosts) and the bench itself (``--replacement-cpu``; bench/replacement_cpu.py says why: on 2
cores, whether a system's survivors are training or still stalled would otherwise decide how
fast its replacement imports torch); then all share every CPU again. Each trial records the
placement (``replacement_placement``: what was moved off, anything of the bench's still
allowed on the CPU, the replacement's CPU time and its run-queue wait until then, which is
what processes the bench did not start took from it).

Figures (medians with ranges over trials; per-survivor figures pooled over survivors and
trials): ``kill_stall_s`` (for each survivor, the gap between its last step before the kill
and its first after, less the steady step), ``rejoin_first_step_s`` (the replacement's
process start to its first step) and its parts (start -> imported -> joined -> first step),
``rejoin_phases_s`` (the same path cut into the phases bench/peers_worker.py prints, for
both elastic systems in the same run: each the time since the one before),
``rejoin_after_torch_s`` (the path less the interpreter's start and ``import torch``, the
code every system's replacement runs the same; its ratio is in ``diagnostic_ratios``, not a
target), ``rejoin_into_training_s`` (``rejoin_first_step_s`` of the trials whose every
survivor had trained again when the replacement started; its ratio is a diagnostic too),
``survivors_training_at_spawn`` (survivors training again when the replacement
started: on 2 cores they compete with its imports, survivors still stalled leave it the CPU),
``rejoin_stall_s`` (the survivors' longest gap while the replacement joins, less the steady
step; only when they had resumed before it started), ``steps_rolled_back`` and
``bit_identical``. Ports: 24700-24799 only (the cluster 24700-24705; lighthouse, torchft's
stores and Managers, plain DDP's store from 24706 up, in turn); ``--first-port P`` moves the
block to P..P+99 (two runs side by side on one machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.cluster import RallypointCluster
from bench.common import (
    machine_info,
    package_versions,
    print_targets,
    scratch_root,
    verdicts,
    write_results,
)
from bench.peers_summary import (
    COLD_FLOOR,
    MIN_WORKERS,
    REJOIN_PHASES,
    SYSTEMS,
    diagnostic_ratios,
    plot,
    ratios,
    spread,
    summarize,
)
from bench.peers_warm import WARM_SYSTEM, WarmChild, crash, launcher_command, warm_restart
from bench.replacement_cpu import ReplacementCpu
from rallypoint.worker.process_tree import run_reaped
from tests.integration.harness import port_is_free

REPOSITORY = Path(__file__).resolve().parents[1]
WORKERS = 4
FIRST_PORT, PORT_BLOCK = 24700, 100
CLUSTER_PORTS = 6  # 3 members x (peer, client)
# torchft's lighthouse heartbeat timeout per setting (None: its default, 5000 ms).
TORCHFT_HEARTBEAT_MS = {"torchft_default": None, "torchft_hb1s": 1000}
TARGETS = {
    "ratios[overhead_vs_plain]": ("<=", 1.02),
    "ratios[kill_stall_vs_torchft]": ("<=", 0.1),
    "ratios[rejoin_vs_torchft]": ("<=", 0.8),
}
TORCHFT_DDP_WRAPPER = (
    "torchft 0.2.0's DistributedDataParallel comm hook asserts that a failed all-reduce's "
    "future exists, so a survivor of a peer killed mid all-reduce dies in backward(); the "
    "bench's subclass (bench/peers_worker.py, surviving_ddp) returns the bucket unchanged "
    "when the manager's all-reduce failed: the manager has recorded the error and "
    "should_commit refuses the step on every replica"
)
Event = dict[str, Any]
# The phases up to the end of `import torch`: the same code in every system's replacement.
COMMON_PHASES = ("interpreter", "torch")


class Ports:
    """Hands out blocks of consecutive free ports from the run's block (24706-24799 by
    default: after the cluster's) in turn, so a port a trial just closed (TIME_WAIT, a
    lingering listener) is not asked for again at once."""

    def __init__(self, first_port: int = FIRST_PORT) -> None:
        self.first = first_port + CLUSTER_PORTS
        self.last = first_port + PORT_BLOCK - 1
        self.cursor = self.first

    def take(self, count: int) -> list[int]:
        for _ in range(self.last - self.first + 1):
            if self.cursor + count - 1 > self.last:
                self.cursor = self.first
            block = list(range(self.cursor, self.cursor + count))
            self.cursor += count
            if all(port_is_free(port) for port in block):
                return block
        raise RuntimeError(f"no {count} consecutive free ports in {self.first}-{self.last}")


class Worker:
    """One process of bench/peers_worker.py and the JSON events it prints."""

    def __init__(
        self, index: int, system: str, args: Sequence[str], logs: Path, launcher: Sequence[str]
    ) -> None:
        self.index = index
        self.name = f"w{index}"
        self.events: list[Event] = []
        self.lock = threading.Lock()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        if launcher:  # the warm launcher runs the worker as a script, as a training job runs
            command = [*launcher, "bench/peers_worker.py", f"--system={system}"]
        else:
            command = [sys.executable, "-m", "bench.peers_worker", f"--system={system}"]
        self.started_t = time.time()
        with open(logs / f"{self.name}.err", "w") as stderr:
            self.proc = subprocess.Popen(
                [*command, f"--index={index}", *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                cwd=REPOSITORY,
                start_new_session=True,
            )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append(event)

    def of(self, kind: str) -> list[Event]:
        with self.lock:
            return [e for e in self.events if e["event"] == kind]

    def first(self, kind: str) -> Event | None:
        found = self.of(kind)
        return found[0] if found else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def wait_for(what: str, ready: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {timeout_s:g} s")


def load_now() -> dict[str, Any]:
    one, five, fifteen = os.getloadavg()
    return {"t": time.time(), "load_1m": one, "load_5m": five, "load_15m": fifteen}


def step_times(worker: Worker, after_t: float, before_t: float) -> list[float]:
    return [e["t"] for e in worker.of("step") if after_t < e["t"] <= before_t]


def median_interval(times: Sequence[float]) -> float | None:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) if gaps else None


class Trial:
    """One system's trial: its workers, their stop file, and the system's own servers."""

    def __init__(self, system: str, number: int, root: Path, ports: Ports, endpoints: str):
        self.system = system
        self.dir = root / f"{system}-{number}"
        self.dir.mkdir(parents=True)
        self.stop_file = self.dir / "stop"
        self.workers: list[Worker] = []
        self.lighthouse: subprocess.Popen[bytes] | None = None
        self.common = [f"--stop-file={self.stop_file}", f"--world={WORKERS}"]
        self.common.append(f"--min-world={MIN_WORKERS}")
        self.ports = ports
        if system == "plain":
            self.common.append(f"--master-port={ports.take(1)[0]}")
        elif system in ("rallypoint", WARM_SYSTEM):
            job = f"peers-{number}-{os.getpid()}-{int(time.time())}"
            self.common += [f"--endpoints={endpoints}", f"--job={job}"]
            self.common.append(f"--checkpoint-dir={self.dir / 'checkpoints'}")
        elif system != COLD_FLOOR:
            self.start_lighthouse(TORCHFT_HEARTBEAT_MS[system])

    def start_lighthouse(self, heartbeat_ms: int | None) -> None:
        self.lighthouse_port = self.ports.take(1)[0]
        command = [
            str(Path(sys.executable).parent / "torchft_lighthouse"),
            f"--min_replicas={MIN_WORKERS}",
            f"--bind=127.0.0.1:{self.lighthouse_port}",
        ]
        if heartbeat_ms is not None:
            command.append(f"--heartbeat_timeout_ms={heartbeat_ms}")
        with open(self.dir / "lighthouse.log", "wb") as log:
            self.lighthouse = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def spawn(self, index: int, launcher: Sequence[str] = ()) -> Worker:
        extra = list(self.common)
        if self.system.startswith("torchft"):
            store, manager = self.ports.take(2)
            extra += [
                f"--store-port={store}",
                f"--manager-port={manager}",
                f"--lighthouse-port={self.lighthouse_port}",
            ]
        system = "torchft" if "torchft" in self.system else self.system.removesuffix("_warm")
        worker = Worker(index, system, extra, self.dir, launcher)
        self.workers.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.kill()
            worker.reader.join(timeout=5.0)
            with open(self.dir / f"{worker.name}.jsonl", "w") as events:
                events.writelines(json.dumps(e) + "\n" for e in worker.events)
        if self.lighthouse is not None:
            self.lighthouse.kill()
            self.lighthouse.wait()

    def check_alive(self, workers: Sequence[Worker]) -> None:
        for worker in workers:
            if worker.proc.poll() is not None and worker.first("checksum") is None:
                tail = (self.dir / f"{worker.name}.err").read_text(errors="replace")[-400:]
                raise RuntimeError(f"{worker.name} exited ({worker.proc.returncode}): {tail}")

    def training_together(self, workers: Sequence[Worker]) -> float | None:
        """When every one of ``workers`` has counted a step at world size 4, else None."""
        self.check_alive(workers)
        firsts = []
        for worker in workers:
            full = [e["t"] for e in worker.of("step") if e["world_size"] == WORKERS]
            if not full:
                return None
            firsts.append(full[0])
        return max(firsts)

    def stop_and_checksum(self, workers: Sequence[Worker], ahead: int, timeout_s: float) -> Event:
        """Ask every process to stop ``ahead`` steps past the furthest, and compare the
        checksums they print there."""
        furthest = max(e["step"] for w in workers for e in w.of("step"))
        stop_step = furthest + ahead
        scratch = self.stop_file.with_suffix(".tmp")
        scratch.write_text(str(stop_step))
        scratch.rename(self.stop_file)  # whole or absent: never a half-written number

        def all_summed() -> bool:
            self.check_alive(workers)
            return all(w.first("checksum") is not None for w in workers)

        wait_for("a checksum from every process", all_summed, timeout_s)
        sums = {w.name: w.first("checksum") for w in workers}
        return {
            "stop_step": stop_step,
            "checksum_steps": sorted({e["step"] for e in sums.values() if e}),
            "bit_identical": len({e["checksum"] for e in sums.values() if e}) == 1
            and all(e is not None and e["step"] == stop_step for e in sums.values()),
        }


def steady_figures(workers: Sequence[Worker], since_t: float, until_t: float) -> Event:
    per_worker = {w.name: median_interval(step_times(w, since_t, until_t)) for w in workers}
    measured = [v for v in per_worker.values() if v is not None]
    return {
        "steady_step_s": statistics.median(measured) if measured else None,
        "steady_step_s_by_worker": per_worker,
        "steady_steps": sum(len(step_times(w, since_t, until_t)) for w in workers),
    }


def plain_trial(trial: Trial, args: argparse.Namespace) -> Event:
    workers = [trial.spawn(index) for index in range(WORKERS)]
    together = wait_for(
        "4 processes training", lambda: trial.training_together(workers), args.timeout_s
    )
    time.sleep(args.warm_s + args.steady_s)
    measured_until = time.time()
    figures = steady_figures(workers, together + args.warm_s, measured_until)
    return {**figures, **trial.stop_and_checksum(workers, args.stop_ahead, args.timeout_s)}


def kill_trial(trial: Trial, args: argparse.Namespace) -> Event:
    # rallypoint_warm: the process killed is a warm launcher's child (bench/peers_warm.py).
    warm = launcher_command(args.rejoin_after_s) if trial.system == WARM_SYSTEM else []
    workers = [trial.spawn(i, warm if i == WORKERS - 1 else ()) for i in range(WORKERS)]
    together = wait_for(
        "4 processes training", lambda: trial.training_together(workers), args.timeout_s
    )
    time.sleep(args.warm_s + args.steady_s)
    victim, survivors = workers[-1], workers[:-1]
    killed_t = time.time()
    crashed = crash(victim, args.timeout_s) if warm else None  # the launcher's child
    if crashed is None:
        victim.kill()
    figures: Event = steady_figures(workers, together + args.warm_s, killed_t)
    steady = figures["steady_step_s"]
    own_cpu = ReplacementCpu(args.replacement_cpu)
    replacement: Worker | WarmChild
    if crashed is not None:  # the launcher forks the replacement --rejoin-after-s later
        replacement = warm_restart(
            victim, crashed, killed_t, args.rejoin_after_s, own_cpu, args.timeout_s
        )
    else:
        time.sleep(args.rejoin_after_s)
        replacement = spawn_alone(trial, own_cpu, WORKERS)
    live = [*survivors, replacement]
    first = first_step_alone(
        "the replacement's first step",
        replacement,
        own_cpu,
        lambda: trial.check_alive(live),
        args.timeout_s,
    )
    wait_for(
        "every survivor's first step after the kill",
        lambda: all(step_times(w, killed_t, float("inf")) for w in survivors),
        args.timeout_s,
    )
    time.sleep(args.after_s)
    figures.update(trial.stop_and_checksum(live, args.stop_ahead, args.timeout_s))

    spawned_t = replacement.started_t
    stalls, first_gaps, resumed_t, rolled_back = [], [], [], []
    resets: list[Event] = []
    for worker in survivors:
        before = step_times(worker, 0.0, killed_t)
        after = step_times(worker, killed_t, float("inf"))
        first_gaps.append(after[0] - before[-1] - steady)
        # The step in flight at the kill can still complete on a survivor (torchft: its
        # all-reduce had finished, and a replica group of one commits alone), so the first
        # gap after the kill may be an ordinary step and the stall the next one. The stall
        # is the longest gap from the last step before the kill to the first step after
        # the replacement started (a stall still going on then is measured whole).
        window = [before[-1], *(t for t in after if t <= spawned_t)]
        window += [t for t in after if t > spawned_t][:1]
        gap, resumed = max((b - a, b) for a, b in itertools.pairwise(window))
        stalls.append(gap - steady)
        resumed_t.append(resumed)
        steps = [e["step"] for e in worker.of("step") if e["t"] >= before[-1]]
        rolled_back.append(sum(max(0, a - b + 1) for a, b in itertools.pairwise(steps)))
        resets += [
            {"name": worker.name, "from_step": a, "to_step": b}
            for a, b in itertools.pairwise(steps)
            if b <= a
        ]
    imported, joined = replacement.first("imported"), replacement.first("joined")
    phases = rejoin_phases(replacement, first["t"])
    figures.update(
        {
            "killed_t": killed_t,
            "kill_stall_s": stalls,
            # The literal figure: first step after the kill - last before - steady step.
            "kill_first_gap_s": first_gaps,
            "first_world_after_kill": sorted(
                {
                    next(e["world_size"] for e in w.of("step") if e["t"] > killed_t)
                    for w in survivors
                }
            ),
            "rejoin_first_step_s": first["t"] - spawned_t,
            "rejoin_parts_s": {
                "start_to_imported": imported["t"] - spawned_t if imported else None,
                "imported_to_joined": joined["t"] - imported["t"] if joined and imported else None,
                "joined_to_first_step": first["t"] - joined["t"] if joined else None,
            },
            "replacement_cpu": own_cpu.cpu,
            "replacement_placement": own_cpu.placement(),
            # The CPUs were shared again this long after the replacement started.
            "replacement_cpu_released_after_s": (
                own_cpu.released_t - spawned_t if own_cpu.released_t is not None else None
            ),
            "rejoin_phases_s": phases,
            # Everything after `import torch` (the one phase whose code is the same in both).
            "rejoin_after_torch_s": sum(v for k, v in phases.items() if k not in COMMON_PHASES),
            # Survivors that were training again (a step since the kill) when the replacement
            # started: on 2 cores they compete with its imports; survivors still stalled by
            # the kill leave it the machine.
            "survivors_training_at_spawn": sum(
                bool(step_times(w, killed_t, spawned_t)) for w in survivors
            ),
            "rejoin_first_step": first["step"],
            # In sync: the survivors counted the same step number after it started (with
            # the world's step counter, however that was restored).
            "rejoin_in_sync": any(
                e["step"] == first["step"] and e["t"] > spawned_t
                for w in survivors
                for e in w.of("step")
            ),
            "steps_rolled_back": max(rolled_back),
            "step_counter_went_back": resets,
            # rallypoint says where each round's state came from (keep, broadcast, fresh...).
            "restore_sources": sorted(
                {e["source"] for w in live for e in w.of("round_formed") if e["t"] > killed_t}
            ),
        }
    )
    # The survivors' stall while the replacement joins: only meaningful once they trained
    # again after the kill before it started (else the kill's stall and the join's overlap).
    if max(resumed_t) < spawned_t:
        window_end = first["t"] + 0.5
        gaps = []
        for worker in survivors:
            times = [t for t in step_times(worker, 0.0, window_end) if t >= spawned_t]
            last_before = max(step_times(worker, 0.0, spawned_t))
            times = [last_before, *times]
            gaps.append(max(b - a for a, b in itertools.pairwise(times)) - steady)
        figures["rejoin_stall_s"] = statistics.median(gaps)
    else:
        figures["rejoin_stall_s"] = None
        figures["rejoin_stall_reason"] = (
            "the survivors had not trained again after the kill when the replacement started"
        )
    return figures


def spawn_alone(trial: Trial, own_cpu: ReplacementCpu, index: int) -> Worker:
    """Start process ``index`` as a replacement starts: everything this process started (the
    survivors, the cluster's members or the lighthouse: other hosts) and this process itself
    off the replacement's CPU, the new process on it from its first instruction."""
    own_cpu.before_start([os.getpid()])
    with own_cpu.starting():
        worker = trial.spawn(index)
    own_cpu.started(worker.proc.pid)
    return worker


def first_step_alone(
    what: str,
    process: Worker | WarmChild,
    own_cpu: ReplacementCpu,
    check: Callable[[], None],
    timeout_s: float,
) -> Event:
    """``process``'s first step (``check`` raises if the trial cannot go on); every process
    shares every CPU again once it has made its model, or when this returns."""

    def stepped() -> Event | None:
        check()
        if any(e["phase"] == "model" for e in process.of("phase")):
            own_cpu.release()
        return process.first("step")

    try:
        return wait_for(what, stepped, timeout_s)  # type: ignore[no-any-return]
    finally:
        own_cpu.release()


def cold_floor_trial(trial: Trial, args: argparse.Namespace) -> Event:
    """One cold process with no system (bench/peers_worker.py ``run_cold_floor``), started as
    a kill trial's replacement is: alone on the replacement's CPU until it has made its model
    (the cluster's members, when running, and the bench kept off it). Its start to its step
    alone is the least any system's cold replacement can take to its first step. No other
    process trains meanwhile, as the survivors do beside a replacement, so it reads, if
    anything, below the floor a replacement meets."""
    own_cpu = ReplacementCpu(args.replacement_cpu)
    process = spawn_alone(trial, own_cpu, 0)

    def check() -> None:
        if process.proc.poll() is not None:
            process.reader.join(timeout=5.0)  # it leaves after its step: read all it printed
            trial.check_alive([process])

    first = first_step_alone("the cold process's step", process, own_cpu, check, args.timeout_s)
    return {
        "steady_step_s": None,
        "bit_identical": None,
        "rejoin_first_step_s": first["t"] - process.started_t,
        "rejoin_phases_s": rejoin_phases(process, first["t"]),
        "replacement_cpu": own_cpu.cpu,
        "replacement_placement": own_cpu.placement(),
    }


def rejoin_phases(replacement: Worker | WarmChild, first_step_t: float) -> dict[str, float]:
    """Each phase of the replacement's way in, as the time since the phase before it ended
    (the first: since the bench started the process); phases it did not print are left out."""
    ended = {e["phase"]: e["t"] for e in replacement.of("phase")}
    ended["first_step"] = first_step_t
    phases, previous = {}, replacement.started_t
    for name in REJOIN_PHASES:
        if name in ended:
            phases[name] = ended[name] - previous
            previous = ended[name]
    return phases


def run_trial(
    system: str, number: int, root: Path, ports: Ports, endpoints: str, args: argparse.Namespace
) -> Event:
    load_before = load_now()
    trial = Trial(system, number, root, ports, endpoints)
    try:
        if system == "plain":
            figures = plain_trial(trial, args)
        elif system == COLD_FLOOR:
            figures = cold_floor_trial(trial, args)
        else:
            figures = kill_trial(trial, args)
        figures["ok"] = True
    except (TimeoutError, RuntimeError) as error:
        figures = {"ok": False, "error": str(error)[:600]}
    finally:
        trial.stop_all()
    return {
        "system": system,
        "trial": number,
        **figures,
        "load_before": load_before,
        "load_after": load_now(),
        "cpu_count": os.cpu_count(),
    }


# ------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> list[Event]:
    trials: list[Event] = []
    ports = Ports(args.first_port)
    with scratch_root("peers-bench-", args.data_dir) as root:
        cluster = None
        endpoints = ""
        if {"rallypoint", WARM_SYSTEM} & set(args.systems):
            cluster = RallypointCluster(root / "cluster", base_port=args.first_port)
        try:
            if cluster is not None:
                cluster.start()
                import asyncio

                asyncio.run(cluster.wait_ready())
                endpoints = ",".join(cluster.addresses.values())
            for number in range(args.trials):
                # Rotate the order, so no system always runs first after another's teardown.
                order = (
                    args.systems[number % len(args.systems) :]
                    + args.systems[: number % len(args.systems)]
                )
                for system in order:
                    result = run_trial(system, number, root, ports, endpoints, args)
                    trials.append(result)
                    shown = {
                        k: result.get(k)
                        for k in (
                            "ok",
                            "error",
                            "steady_step_s",
                            "kill_stall_s",
                            "rejoin_first_step_s",
                            "rejoin_after_torch_s",
                            "rejoin_stall_s",
                            "steps_rolled_back",
                            "bit_identical",
                        )
                        if k in result
                    }
                    load = result["load_before"]["load_1m"]
                    print(f"{system:<16} trial {number}: load {load:.2f} {shown}", flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
    return trials


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/peers.json")
    parser.add_argument("--trials", type=int, default=3, help="per system")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--steady-s", type=float, default=5.0, help="steady window per trial")
    parser.add_argument("--warm-s", type=float, default=1.0, help="after all 4 train, before it")
    parser.add_argument("--rejoin-after-s", type=float, default=2.0)
    parser.add_argument(
        "--replacement-cpu",
        type=int,
        default=None,
        help="the CPU the replacement starts on alone, the survivors on the others, until it "
        "has made its model (ReplacementCpu; default: this process's highest CPU, none with "
        "one CPU); -1: every process shares every CPU",
    )
    parser.add_argument("--after-s", type=float, default=2.0, help="training after the rejoin")
    parser.add_argument("--stop-ahead", type=int, default=20, help="steps before the checksum")
    parser.add_argument("--timeout-s", type=float, default=90.0, help="per phase of a trial")
    parser.add_argument("--data-dir", help="keep the trials' logs here (default: removed)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--first-port",
        type=int,
        default=FIRST_PORT,
        help=f"the run's {PORT_BLOCK} ports start here (the cluster's 6 first)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="checks it runs: one short trial per system (0.5 s warm-up, 1.5 s steady, the "
        "replacement 1 s after the kill, 0.5 s after its first step); figures not comparable",
    )
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    cpus = os.sched_getaffinity(0)
    if args.replacement_cpu is None:
        args.replacement_cpu = max(cpus) if len(cpus) > 1 else None
    elif args.replacement_cpu < 0:
        args.replacement_cpu = None
    elif args.replacement_cpu not in cpus:
        parser.error(f"--replacement-cpu {args.replacement_cpu}: not one of this process's CPUs")
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {unknown}: choose from {', '.join(SYSTEMS)}")
    if not 1024 <= args.first_port <= 65536 - PORT_BLOCK:
        parser.error(f"--first-port {args.first_port}: not in 1024-{65536 - PORT_BLOCK}")
    if args.quick:
        args.trials, args.steady_s, args.warm_s = 1, 1.5, 0.5
        args.rejoin_after_s, args.after_s = 1.0, 0.5
    started = time.perf_counter()
    trials = run(args)
    top = summarize(trials)
    top["ratios"] = ratios(top)
    top["diagnostic_ratios"] = diagnostic_ratios(top)
    checked = verdicts(top, TARGETS)
    for check in checked.values():
        check["met"] = check["verdict"] == "PASS"
    loads = [t["load_before"]["load_1m"] for t in trials] + [
        t["load_after"]["load_1m"] for t in trials
    ]
    document = {
        "benchmark": "peers",
        **top,
        "targets": checked,
        "quick": args.quick,
        "machine": {**machine_info(), "load_1m_during": spread(loads)},
        "versions": package_versions(["torch", "torchft", "rallypoint", "grpcio"]),
        "parameters": {
            "workers": WORKERS,
            "min_workers": MIN_WORKERS,
            "model": "MLP 512-1024-512-512 (1,312,768 parameters), AdamW, batch 32 per process",
            "backend": "gloo, one torch thread per process",
            "fault": "SIGKILL of one of 4 processes after the steady window; a replacement "
            f"started {args.rejoin_after_s:g} s later"
            + (
                f", alone on CPU {args.replacement_cpu} from its start until it has made its "
                "model and optimizer; every other process the bench started (the survivors, "
                "the coordinator's members or torchft's lighthouse, the bench itself) on the "
                "other CPUs meanwhile"
                if args.replacement_cpu is not None
                else ", every process sharing every CPU"
            ),
            "torchft": "0.2.0; each process a replica group of one; lighthouse --min_replicas "
            f"{MIN_WORKERS}, heartbeat timeout 5 s (default) or 1 s; ProcessGroupGloo timeout "
            "5 s and Manager timeout 30 s (torchft's train_ddp.py); PGTransport for healing",
            "torchft_ddp_wrapper": TORCHFT_DDP_WRAPPER,
            "rallypoint": "elastic_training, min_nodes 3, max_nodes 4, defaults otherwise; a "
            "3-member cluster (rallypoint cluster up) on loopback",
            "plain": "torch DistributedDataParallel, static world of 4, TCPStore",
            "cold_floor": "no system: one process imports torch and torch.distributed, makes "
            "the model and AdamW and takes one step alone, started and placed as a replacement",
            "rallypoint_warm": "as rallypoint; the killed process a child of the warm launcher "
            "(python -m rallypoint.worker.warm --restarts=1, preloading torch, torch._dynamo, "
            "rallypoint.worker.elastic), the replacement its fork, timed from the fork",
            **{k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
        },
        "trials": trials,
        "wall_time_s": time.perf_counter() - started,
    }
    print_targets(checked, 32, 8)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out, document, None if args.no_plot else lambda path: plot(top, path))
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
