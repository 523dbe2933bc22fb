"""A replacement's way into training, phase by phase: 3 elastic workers train, one is
SIGKILLed, and a replacement started ``--delay-s`` later is timed from its process start to
its first step in sync with the survivors.

    .venv/bin/python -m bench.rejoin_phases [--trials 5] [--out bench/results/rejoin_phases.json]
    .venv/bin/python -m bench.rejoin_phases --smoke --out /tmp/rejoin.json       # ~1 min
    # before/after: alternate two installs trial by trial in one run
    .venv/bin/python -m bench.rejoin_phases --python OLD/.venv/bin/python --python .venv/bin/python

A 3-member cluster (``rallypoint cluster up``); the workers run ``bench/rejoin_worker.py``, the
demo's training program (``rallypoint.worker.demo_train``) printing the timestamps of its way
in. Each trial starts 3 workers of a new job (``min_nodes=2``, ``max_nodes=3``), waits until
they train together, SIGKILLs one, waits ``--delay-s`` and starts its replacement. The
replacement's phases, in seconds, each from the end of the one before:

- ``spawn``: the parent's ``Popen`` to the program's first line (the interpreter's start);
- ``torch``: ``import torch``, the floor of any torch program;
- ``imports``: the elastic package and the demo's program;
- ``model``: the model, optimizer and sampler made;
- ``connect``, ``session``, ``join``: the client connected, its session opened, the Join
  answered;
- ``round``: from the join to the ACTIVE round that includes the replacement (the round the
  survivors trained in ends for the scale-up; the next closes);
- ``formation``: the process group made (arrival in the round store, ``init_process_group``);
- ``restore``: the state restored (a broadcast from a survivor);
- ``first_step``: to the replacement's first step counted at world size 3.

The floor: after each round of trials, a plain torch process (no rallypoint, no process
group) makes the same model and optimizer and takes one step, timed alike (``floor``):
``import torch`` and the optimizer's first use (which imports ``torch._dynamo``) are most
of any replacement's way in.

``start_to_joined_s`` and ``start_to_first_step_s`` are the totals the peers comparison
uses. Every figure is a median over trials with its range; the machine's load is recorded
per trial. With ``--python`` given more than once, the trials alternate between the
interpreters (each with its own install of rallypoint), and the figures are per interpreter.
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
from pathlib import Path
from typing import Any

from bench.cluster import RallypointCluster
from bench.common import (
    follow_events,
    json_safe,
    machine_info,
    package_versions,
    scratch_root,
)

REPOSITORY = Path(__file__).resolve().parents[1]
WORKER = REPOSITORY / "bench" / "rejoin_worker.py"
WORKERS = 3
# The phases in order, each ending at the named mark of the replacement's output.
PHASES = (
    "spawn",
    "torch",
    "imports",
    "model",
    "connect",
    "session",
    "join",
    "round",
    "formation",
    "restore",
    "first_step",
)
Event = dict[str, Any]

# The floor: the same model, optimizer and first step in a plain torch process (no
# rallypoint, no process group), timed alike. Whatever a replacement takes beyond it is
# what joining costs.
FLOOR_PROGRAM = """
import json, time
started = time.time()
import torch
imported = time.time()
torch.set_num_threads(1)
torch.manual_seed(7)
model = torch.nn.Sequential(
    torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
    torch.nn.Linear(64, 1),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
made = time.time()
inputs, targets = torch.randn(32, 16), torch.randn(32, 1)
torch.nn.functional.mse_loss(model(inputs), targets).backward()
optimizer.step()
optimizer.zero_grad()
stepped = time.time()
print(json.dumps({"interpreter": started, "torch": imported, "model": made,
                  "first_step": stepped}))
"""
FLOOR_PHASES = ("spawn", "torch", "model", "first_step")


class Workers:
    """The workers of one job, by name, and every line they print."""

    def __init__(self, python: str, endpoints: str, job: str, root: Path) -> None:
        self.python, self.endpoints, self.job, self.root = python, endpoints, job, root
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.spawned_t: dict[str, float] = {}

    def start(self, name: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        with open(self.root / f"{self.job}-{name}.err", "w") as stderr:
            self.spawned_t[name] = time.time()
            proc = subprocess.Popen(
                [
                    self.python,
                    str(WORKER),
                    f"--endpoints={self.endpoints}",
                    f"--job={self.job}",
                    f"--name={name}",
                    f"--checkpoint-dir={self.root / self.job}",
                    "--min-nodes=2",
                    f"--max-nodes={WORKERS}",
                    "--checkpoint-every=1000000",
                    "--step-sleep-s=0.01",
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                cwd=REPOSITORY,
                start_new_session=True,
            )
        self.procs[name] = proc
        follow_events(proc, self.events, self.lock)

    def first(self, name: str, event: str, **match: Any) -> Event | None:
        with self.lock:
            for e in self.events:
                if (
                    e.get("name") == name
                    and e["event"] == event
                    and all(e.get(key) == value for key, value in match.items())
                ):
                    return e
        return None

    def training(self, names: Sequence[str], world_size: int, after_t: float) -> bool:
        with self.lock:
            seen = {
                e["name"]
                for e in self.events
                if e["event"] == "step" and e["world_size"] == world_size and e["t"] > after_t
            }
        return all(name in seen for name in names)

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

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


def phase_marks(workers: Workers, name: str) -> dict[str, float] | None:
    """When each phase of ``name``'s way in ended (None until its first step at world 3)."""
    first_step = workers.first(name, "step", world_size=WORKERS)
    formed = workers.first(name, "round_formed")
    if first_step is None or formed is None:
        return None
    marks = {"spawn": workers.spawned_t[name]}
    for phase in ("interpreter", "torch", "imports", "model", "connect", "session", "join"):
        event = workers.first(name, "phase", phase=phase)
        if event is None:
            return None
        marks[phase] = float(event["t"])
    # round_formed's t is the restore's end; formed_s and init_s count from the moment the
    # loop had the ACTIVE round (elastic/run.py, ``_form``).
    round_t = float(formed["t"]) - float(formed["formed_s"])
    marks["round"] = round_t
    marks["formation"] = round_t + float(formed["init_s"])
    marks["restore"] = float(formed["t"])
    marks["first_step"] = float(first_step["t"])
    return marks


def durations(marks: dict[str, float]) -> dict[str, float]:
    """Each phase's length, from the end of the one before (``spawn`` ends at the
    interpreter's first line)."""
    ends = {"spawn": marks["interpreter"], **{p: marks[p] for p in PHASES[1:]}}
    out: dict[str, float] = {}
    previous = marks["spawn"]
    for phase in PHASES:
        out[phase] = ends[phase] - previous
        previous = ends[phase]
    out["start_to_joined_s"] = marks["join"] - marks["spawn"]
    out["start_to_first_step_s"] = marks["first_step"] - marks["spawn"]
    return out


def trial(
    python: str, endpoints: str, job: str, root: Path, delay_s: float, timeout_s: float
) -> Event:
    workers = Workers(python, endpoints, job, root)
    names = [f"w{index}" for index in range(WORKERS)]
    try:
        for name in names:
            workers.start(name)
        wait_for("3 workers training", lambda: workers.training(names, WORKERS, 0.0), timeout_s)
        time.sleep(0.5)  # some training at world 3 before the kill
        load = os.getloadavg()[0]
        killed_t = time.time()
        workers.kill(names[-1])
        survivors = names[:-1]
        wait_for("survivors training", lambda: workers.training(survivors, 2, killed_t), timeout_s)
        time.sleep(max(0.0, killed_t + delay_s - time.time()))
        workers.start("r")
        marks = wait_for(
            "the replacement's first step", lambda: phase_marks(workers, "r"), timeout_s
        )
        formed = workers.first("r", "round_formed")
        assert formed is not None
        return {
            "python": python,
            "load_1m": load,
            "phases": durations(marks),
            # Where the replacement's state came from (broadcast: a survivor's).
            "restore_source": formed["source"],
        }
    finally:
        workers.stop()


def floor_trial(python: str) -> dict[str, float]:
    """The floor's phases (FLOOR_PROGRAM), each from the end of the one before."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    spawned_t = time.time()
    done = subprocess.run(
        [python, "-c", FLOOR_PROGRAM], capture_output=True, text=True, env=env, check=True
    )
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    ends = {"spawn": marks["interpreter"], **{p: marks[p] for p in FLOOR_PHASES[1:]}}
    out: dict[str, float] = {}
    previous = spawned_t
    for phase in FLOOR_PHASES:
        out[phase] = ends[phase] - previous
        previous = ends[phase]
    out["start_to_first_step_s"] = marks["first_step"] - spawned_t
    return out


def median_range(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(trials: Sequence[Event]) -> dict[str, Any]:
    keys = [*PHASES, "start_to_joined_s", "start_to_first_step_s"]
    figures: dict[str, Any] = {}
    for key in keys:
        figures[key] = median_range([t["phases"][key] for t in trials])
    figures["load_1m"] = [t["load_1m"] for t in trials]
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    pythons = args.python or [sys.executable]
    with scratch_root("rejoin-phases") as root:
        return run_in(args, pythons, root)


def run_in(args: argparse.Namespace, pythons: list[str], root: Path) -> dict[str, Any]:
    cluster = RallypointCluster(root / "cluster", base_port=args.base_port)
    cluster.start()
    trials: list[Event] = []
    floors: list[dict[str, float]] = []
    try:
        asyncio.run(cluster.wait_ready(timeout_s=60))
        endpoints = ",".join(cluster.addresses.values())
        for index in range(args.trials * len(pythons)):
            python = pythons[index % len(pythons)]
            result = trial(python, endpoints, f"rejoin{index}", root, args.delay_s, args.timeout_s)
            print(json.dumps(result), file=sys.stderr, flush=True)
            trials.append(result)
            if index % len(pythons) == len(pythons) - 1:
                floors.append(floor_trial(pythons[0]))
                print(json.dumps({"floor": floors[-1]}), file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    return {
        "bench": "rejoin_phases",
        "machine": machine_info(),
        "versions": package_versions(["torch", "grpcio"]),
        "delay_s": args.delay_s,
        "phases": list(PHASES),
        "by_python": {p: summarise([t for t in trials if t["python"] == p]) for p in pythons},
        "floor": {
            key: median_range([f[key] for f in floors])
            for key in [*FLOOR_PHASES, "start_to_first_step_s"]
        },
        "trials": trials,
        "floor_trials": floors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per interpreter")
    parser.add_argument("--delay-s", type=float, default=2.0, help="kill to replacement start")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--python", action="append", help="an interpreter to run the workers with (repeatable)"
    )
    parser.add_argument("--base-port", type=int, default=None, help="the cluster's first port")
    parser.add_argument("--smoke", action="store_true", help="one trial, a short delay")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "bench/results/rejoin_phases.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.delay_s = 1, 0.5
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    for python, figures in report["by_python"].items():
        print(python)
        for key in [*PHASES, "start_to_joined_s", "start_to_first_step_s"]:
            f = figures[key]
            print(f"  {key:24s} {f['median']:7.3f} s ({f['min']:.3f}-{f['max']:.3f})")
        print(f"  load (1 min) {figures['load_1m']}")
    print("floor (plain torch: same model, optimizer, first step)")
    for key, f in report["floor"].items():
        print(f"  {key:24s} {f['median']:7.3f} s ({f['min']:.3f}-{f['max']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
