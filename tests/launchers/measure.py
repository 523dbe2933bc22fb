"""Kill-to-all-ranks-training through each launcher, over rallypoint and over torchrun's
``c10d``, measured as ``make bench-torchrun`` measures it (harness.LauncherJob.kill_and_recover:
the SIGKILL of one worker until every worker of the new round has done its first step).
Trials alternate launcher by launcher and backend by backend, so load hits all alike; the
1-minute load average is recorded beside each trial. A trial that does not recover (a node
exits, or no full round steps within --timeout-s) is a result, not an error.

    .venv/bin/python -m tests.launchers.measure [--trials 3] [--launchers a,b] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.integration.harness import free_port_block

from .harness import LauncherJob, check_trained, coordinator, round_counter
from .launchers import COORDINATOR_HOST, LAUNCHERS, Target, torchx_app_id

# The sbatch script is rallypoint's own; the rest run either backend.
C10D = ("lightning-trainer", "lightning-fabric", "accelerate", "torchx", "kubeflow")


def trial(
    launcher: str, target: Target, job_id: str, out: Path, timeout_s: float
) -> dict[str, Any]:
    job = LauncherJob(LAUNCHERS[launcher](target, job_id, out, 60), out)
    load = os.getloadavg()[0]
    try:
        first = job.warm(15, timeout_s)
        if launcher.startswith("torchx"):
            job_id = torchx_app_id(job)
        rounds = round_counter(target.endpoints, job_id) if target.backend == "rallypoint" else None
        try:
            recovery = job.kill_and_recover(first, timeout_s, rounds)
        except (AssertionError, TimeoutError) as error:
            return {"recovered": False, "error": str(error).splitlines()[0], "load": load}
        result: dict[str, Any] = {"recovered": recovery.world_sizes == [4], **recovery.__dict__}
        try:
            codes = job.finish(timeout_s)
            first_loss, final_loss = check_trained(job)
            result.update(exit_codes=codes, first_loss=first_loss, final_loss=final_loss)
        except (AssertionError, TimeoutError) as error:
            result["finish_error"] = str(error).splitlines()[0]
        result["load"] = load
        return result
    finally:
        job.kill_all()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--backends", default="rallypoint,c10d")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--out", default="launchers-recovery.json")
    args = parser.parse_args(argv)
    launchers = args.launchers.split(",")
    backends = args.backends.split(",")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {backend: [] for backend in backends} for name in launchers
    }
    with (
        tempfile.TemporaryDirectory(prefix="launchers-measure-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        root = Path(scratch)
        clusters = {
            host: stack.enter_context(coordinator(root / f"cluster-{host}", host))
            for host in {COORDINATOR_HOST.get(name, "127.0.0.1") for name in launchers}
        }
        for number in range(args.trials):
            for name in launchers:
                for backend in backends:
                    if backend == "c10d" and name not in C10D:
                        continue
                    if backend == "rallypoint":
                        members = clusters[COORDINATOR_HOST.get(name, "127.0.0.1")].endpoints
                        endpoints = members[:1] if name in ("torchx", "kubeflow") else members
                    else:
                        endpoints = [f"127.0.0.1:{free_port_block(1)}"]
                    job_id = f"{name}-{number}-{int(time.time())}"
                    out = root / f"{name}-{backend}-{number}"
                    figures = trial(name, Target(backend, endpoints), job_id, out, args.timeout_s)
                    results[name][backend].append(figures)
                    what = (
                        f"running {figures['running_s']:.2f} s after the kill"
                        if figures["recovered"]
                        else f"did not recover: {figures.get('error', figures.get('world_sizes'))}"
                    )
                    print(
                        f"{name:>18} {backend:>10} trial {number}: {what} "
                        f"(load {figures['load']:.1f})",
                        flush=True,
                    )
    summary = {
        name: {
            backend: {
                "recovered": f"{sum(t['recovered'] for t in trials)} of {len(trials)}",
                "running_s_median": statistics.median(
                    [t["running_s"] for t in trials if t["recovered"]] or [float("nan")]
                ),
                "load_median": statistics.median(t["load"] for t in trials) if trials else None,
            }
            for backend, trials in by_backend.items()
            if trials
        }
        for name, by_backend in results.items()
    }
    Path(args.out).write_text(json.dumps({"summary": summary, "trials": results}, indent=2) + "\n")
    for name, by_backend in summary.items():
        for backend, figures in by_backend.items():
            print(
                f"{name:>18} {backend:>10}: recovered {figures['recovered']}, median "
                f"{figures['running_s_median']:.2f} s, load {figures['load_median']:.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
