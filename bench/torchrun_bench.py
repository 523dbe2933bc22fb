"""torchrun recovery: kill-to-running time over rallypoint against torchrun's default c10d.

For each backend, each trial starts two torchrun agents on this host (``--nnodes=1:3
--nproc-per-node=2 --max-restarts=3 --monitor-interval=0.1``: an elastic job, so a node
that waits scales it up) running ``tests/worker/torchrun_script.py`` (gloo all-reduces every
50 ms), waits until every worker has done ``--kill-after-steps`` steps, SIGKILLs one worker of
the second agent, and measures from the kill until every worker of the new round has done
its first all-reduce. A trial recovered when four new workers (both agents', world size 4)
train again, every agent still up: ``worker_kill_recovered`` is "K of N" per backend. Both
backends run in the same invocation on the same machine, alternating trial by trial, so load
hits both alike; medians over the trials that recovered are reported. A trial that does not
recover (an agent exits, or no full new round runs within ``--timeout-s``) is a result, not
an error: torch 2.13's c10d backend keeps one TCPStore across restarts, so restarted gloo
workers can read the previous attempt's addresses and fail again. For rallypoint, each trial
also records how many round changes the kill cost (``round_changes``: one is the design).

    .venv/bin/python -m bench.torchrun_bench [--trials 10] [--out bench/results/torchrun.json]

rallypoint: a 3-member cluster (``rallypoint cluster up``), ``--rdzv-backend=rallypoint``
with the three endpoints. c10d: ``--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT`` (one
agent hosts the TCPStore), torch's defaults otherwise. Phases reported per trial:
``restarted_s`` (kill until the last new worker is past ``init_process_group``) and
``running_s`` (kill until the last new worker's first all-reduce: the figure compared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cluster import RallypointCluster
from bench.common import (
    TorchrunAgents,
    json_safe,
    machine_info,
    package_versions,
    scratch_root,
)
from rallypoint.client import SyncClient
from rallypoint.worker.process_tree import run_reaped
from tests.integration.harness import free_port_block

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "tests" / "worker" / "torchrun_script.py"
BACKENDS = ("rallypoint", "c10d")
NNODES = "1:3"
WORLD_SIZE = 4  # 2 agents x --nproc-per-node=2
Event = dict[str, Any]


class Trial(TorchrunAgents):
    """Two torchrun agents of one job; the events their workers write to ``out``."""

    def __init__(self, backend: str, endpoint: str, job: str, out: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={NNODES}",
            "--nproc-per-node=2",
            "--max-restarts=3",
            "--monitor-interval=0.1",
            f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={job}",
            str(SCRIPT),
            f"--out={out}",
            "--steps=1000000",
        ]
        super().__init__(command, out)

    def wait(self, what: str, ready: Any, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exited = self.exited()
            if exited is not None:
                agent, log = exited
                raise RuntimeError(f"an agent exited ({agent.returncode}); see {log}")
            value = ready()
            if value:
                return value
            time.sleep(0.02)
        raise TimeoutError(f"no {what} within {timeout_s:g} s; see {self.out}")

    def stop(self) -> None:
        self.kill_agents()


def round_number(endpoints: str | None, job: str) -> int | None:
    """The job's current round on the rallypoint cluster (None for c10d)."""
    if endpoints is None:
        return None
    with SyncClient(endpoints.split(",")) as client:
        return client.get_job(job).round.round


def run_trial(
    backend: str, endpoint: str, job: str, out: Path, timeout_s: float, kill_after_steps: int
) -> Event:
    trial = Trial(backend, endpoint, job, out)
    coordinator = endpoint if backend == "rallypoint" else None
    try:

        def warmed_up() -> list[Event] | None:
            started = trial.events("started")
            stepped = {e["pid"] for e in trial.events("step") if e["step"] >= kill_after_steps}
            full = len(started) == WORLD_SIZE and len(stepped) == WORLD_SIZE
            return started if full else None

        first = trial.wait(f"4 workers past step {kill_after_steps}", warmed_up, timeout_s)
        second_agent = trial.agents[1].pid
        victim = next(e for e in first if e["agent"] == second_agent)
        round_before = round_number(coordinator, job)
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        old = {e["pid"] for e in first}

        def new_round_running() -> tuple[list[Event], list[Event]] | None:
            started = [e for e in trial.events("started") if e["pid"] not in old]
            if len(started) < WORLD_SIZE:
                return None
            pids = {e["pid"] for e in started}
            first_steps: dict[int, Event] = {}
            for e in trial.events("step"):
                if e["pid"] in pids and e["pid"] not in first_steps:
                    first_steps[e["pid"]] = e
            full = len(first_steps) == WORLD_SIZE
            return (started, list(first_steps.values())) if full else None

        try:
            started, first_steps = trial.wait(
                "4 new workers stepping", new_round_running, timeout_s
            )
        except (RuntimeError, TimeoutError) as error:
            # The job did not recover (an agent gave up, or nothing ran in time): a result.
            return {"recovered": False, "error": str(error)}
        world_sizes = sorted({e["world_size"] for e in started})
        figures: Event = {
            # At full size: both agents' workers, world size 4, every agent still up.
            "recovered": world_sizes == [WORLD_SIZE]
            and {e["agent"] for e in started} == {a.pid for a in trial.agents},
            "restarted_s": max(e["t"] for e in started) - killed_at,
            "running_s": max(e["t"] for e in first_steps) - killed_at,
            "world_size": world_sizes[0] if len(world_sizes) == 1 else world_sizes,
        }
        round_after = round_number(coordinator, job)
        if round_before is not None and round_after is not None:
            figures["round_changes"] = round_after - round_before
        if not figures["recovered"]:
            figures["error"] = f"new workers at world size {world_sizes}; see {out}"
        return figures
    finally:
        trial.stop()


def summarize(trials: Sequence[Event]) -> dict[str, Any]:
    """Medians over the trials that recovered (None when none did)."""
    recovered = [t for t in trials if t["recovered"]]
    return {
        "worker_kill_recovered": f"{len(recovered)} of {len(trials)}",
        "running_s": statistics.median(t["running_s"] for t in recovered) if recovered else None,
        "restarted_s": (
            statistics.median(t["restarted_s"] for t in recovered) if recovered else None
        ),
        "trials": list(trials),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with scratch_root("torchrun-bench-", args.data_dir) as root:
        return run_in(args, root)


def run_in(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"unknown backends {sorted(unknown)}; choose from {BACKENDS}")
    cluster = RallypointCluster(root / "cluster")
    results: dict[str, list[Event]] = {backend: [] for backend in backends}
    try:
        if "rallypoint" in backends:
            cluster.start()
            asyncio.run(cluster.wait_ready())
        for trial in range(args.trials):
            for backend in backends:
                if backend == "rallypoint":
                    endpoint = ",".join(cluster.addresses.values())
                else:
                    endpoint = f"127.0.0.1:{free_port_block(1)}"
                out = root / f"{backend}-{trial}"
                figures = run_trial(
                    backend, endpoint, f"bench-{trial}", out, args.timeout_s, args.kill_after_steps
                )
                results[backend].append(figures)
                changes = figures.get("round_changes")
                rounds = "" if changes is None else f", {changes} round change(s)"
                if figures["recovered"]:
                    print(
                        f"{backend:>10} trial {trial}: running {figures['running_s']:.2f} s "
                        f"after the kill (workers restarted {figures['restarted_s']:.2f} s"
                        f"{rounds})",
                        flush=True,
                    )
                else:
                    print(
                        f"{backend:>10} trial {trial}: did not recover: {figures['error']}{rounds}",
                        flush=True,
                    )
    finally:
        cluster.stop()
    report: dict[str, Any] = {
        "benchmark": "torchrun kill-to-running",
        "machine": machine_info(),
        "versions": package_versions(["torch", "rallypoint", "grpcio"]),
        "parameters": {
            "nnodes": NNODES,
            "nproc_per_node": 2,
            "max_restarts": 3,
            "trials": args.trials,
            "step_s": 0.05,
            "fault": f"SIGKILL of one worker of the second agent after {args.kill_after_steps} "
            "steps",
            "recovered": "4 new workers (both agents', world size 4) training, every agent up",
            "measured": "kill -> every new worker's first all_reduce",
        },
        "backends": {backend: summarize(trials) for backend, trials in results.items()},
    }
    medians = report["backends"]
    report["worker_kill_recovered"] = {
        backend: summary["worker_kill_recovered"] for backend, summary in medians.items()
    }
    report["worker_kill_running_s_median"] = {
        backend: summary["running_s"] for backend, summary in medians.items()
    }
    if set(backends) == set(BACKENDS) and all(medians[b]["running_s"] for b in BACKENDS):
        report["running_ratio_rallypoint_over_c10d"] = (
            medians["rallypoint"]["running_s"] / medians["c10d"]["running_s"]
        )
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/torchrun.json")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--kill-after-steps",
        type=int,
        default=60,
        help="SIGKILL a worker once every worker has done this many steps (default 60)",
    )
    parser.add_argument(
        "--data-dir",
        help="keep the cluster's data, the trials' logs and checkpoints here (default: a "
        "temp folder, removed at the end)",
    )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per phase of a trial")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    for backend, summary in report["backends"].items():
        running_s = summary["running_s"]
        median = "n/a" if running_s is None else f"{running_s:.2f} s"
        print(
            f"{backend:>10}: recovered {summary['worker_kill_recovered']} at full size, "
            f"median kill-to-running {median}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
