"""The launcher tests' frame: a coordinator cluster, a job of two simulated nodes started
through a launcher's own command, a worker SIGKILLed, the recovery measured.

A *node* is one top-level process a launcher starts on a host (a torchrun agent, an
``accelerate launch``, ``torchx run``, an sbatch script under the fake ``srun``), with its
output in ``OUT/<name>.log``. Nodes are told apart by name (``--local-addr``/``PET_LOCAL_ADDR``),
which the backend takes as the node's name and failure domain. The workers' events are
train_common.py's.

Recovery is measured as ``make bench-torchrun`` measures it (bench/torchrun_bench.py): from the
SIGKILL until every worker of the new round has done its first step ("kill to all ranks
training"); the same trial runs over ``c10d`` (tests/launchers/measure.py) where the launcher
can use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rallypoint.client import SyncClient
from tests.integration.harness import ProcessCluster, kill_processes_mentioning

# The real jobs (a minute or more each) run under `make test-launchers`, not `make test`.
real_job = pytest.mark.skipif(
    os.environ.get("RALLYPOINT_LAUNCHERS") != "1", reason="make test-launchers runs it"
)

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
REPOSITORY = HERE.parents[1]
WORLD_SIZE = 4  # 2 nodes x 2 processes
NODE_NAMES = ("node-a", "node-b")
Event = dict[str, Any]


@contextlib.contextmanager
def coordinator(root: Path, host: str = "127.0.0.1") -> Iterator[ProcessCluster]:
    """A 3-member cluster whose members serve clients on ``host`` (their peers stay on
    127.0.0.1). ``127.0.0.2`` stands for "the coordinator runs on other hosts than the
    training nodes": a launcher that probes ``localhost`` for its rendezvous port (accelerate
    does, on machine rank 0) does not find the members there."""
    cluster = ProcessCluster(root)
    for member in cluster.members.values():
        member.client_address = f"{host}:{member.client_address.rpartition(':')[2]}"
    cluster.start_all()
    try:
        # A minute: five engineers' jobs may share this machine's two cores while it elects.
        cluster.leader(timeout_s=60.0)
        yield cluster
    finally:
        cluster.shutdown()


@dataclass(frozen=True)
class Node:
    name: str
    command: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


@dataclass(frozen=True)
class Recovery:
    """One kill and what followed, measured from the kill."""

    running_s: float  # until every new worker's first step (the figure compared)
    restarted_s: float  # until every new worker reported it started
    world_sizes: list[int]
    resumed_from: list[int]  # the step each new worker resumed from
    round_changes: int | None  # rallypoint only
    victim: int  # the killed worker's pid


class LauncherJob:
    """The nodes of one job and the events their workers write to ``out``."""

    def __init__(self, nodes: Sequence[Node], out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.nodes = list(nodes)
        self.logs = [out / f"{node.name}.log" for node in nodes]
        self.procs: list[subprocess.Popen[bytes]] = []
        for node, log_path in zip(self.nodes, self.logs, strict=True):
            with open(log_path, "wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        list(node.command),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env={**os.environ, "PYTHONUNBUFFERED": "1", **node.env},
                        cwd=node.cwd,
                    )
                )

    def events(self, kind: str | None = None) -> list[Event]:
        found: list[Event] = []
        for path in self.out.glob("events-*.jsonl"):
            for line in path.read_text().splitlines():
                # A line being written may be cut short: it is complete on the next read.
                if line.endswith("}"):
                    found.append(json.loads(line))
        return sorted((e for e in found if kind in (None, e["event"])), key=lambda e: e["t"])

    def log_text(self, index: int) -> str:
        return self.logs[index].read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(self.log_text(i) for i in range(len(self.nodes)))

    def check_running(self) -> None:
        for index, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise AssertionError(
                    f"{self.nodes[index].name} exited {proc.returncode} early:\n"
                    f"{self.log_text(index)[-4000:]}"
                )

    def wait(self, what: str, ready: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_running()
            value = ready()
            if value:
                return value
            if time.monotonic() >= deadline:
                tails = "\n".join(
                    f"--- {n.name} ---\n{self.log_text(i)[-3000:]}"
                    for i, n in enumerate(self.nodes)
                )
                raise TimeoutError(f"no {what} within {timeout_s:g} s; logs:\n{tails}")
            time.sleep(0.02)

    def warm(self, steps: int, timeout_s: float) -> list[Event]:
        """The ``started`` events of the first WORLD_SIZE workers, once each is past ``steps``."""

        def warmed_up() -> list[Event] | None:
            started = self.events("started")
            stepped = {e["pid"] for e in self.events("step") if e["step"] >= steps}
            full = len(started) == WORLD_SIZE and {e["pid"] for e in started} <= stepped
            return started if full else None

        found: list[Event] = self.wait(
            f"{WORLD_SIZE} workers past step {steps}", warmed_up, timeout_s
        )
        return found

    def kill_and_recover(
        self, first: list[Event], timeout_s: float, round_of: Callable[[], int] | None = None
    ) -> Recovery:
        """SIGKILL the highest-ranked worker (of the second node, as the benchmark does) and
        wait until WORLD_SIZE new workers have each done a step."""
        victim = max(first, key=lambda e: e["rank"])
        before = round_of() if round_of else None
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        old = {e["pid"] for e in first}

        def new_round_running() -> tuple[list[Event], list[Event]] | None:
            started = [e for e in self.events("started") if e["pid"] not in old]
            if len(started) < WORLD_SIZE:
                return None
            pids = {e["pid"] for e in started}
            first_steps: dict[int, Event] = {}
            for e in self.events("step"):
                if e["pid"] in pids and e["pid"] not in first_steps:
                    first_steps[e["pid"]] = e
            full = len(first_steps) == WORLD_SIZE
            return (started, list(first_steps.values())) if full else None

        started, first_steps = self.wait(
            f"{WORLD_SIZE} new workers stepping after the kill", new_round_running, timeout_s
        )
        after = round_of() if round_of else None
        return Recovery(
            running_s=max(e["t"] for e in first_steps) - killed_at,
            restarted_s=max(e["t"] for e in started) - killed_at,
            world_sizes=sorted({e["world_size"] for e in started}),
            resumed_from=sorted(e["resumed_from"] for e in started),
            round_changes=None if before is None or after is None else after - before,
            victim=victim["pid"],
        )

    def finish(self, timeout_s: float) -> list[int]:
        """Every node's exit code, once each has exited."""
        deadline = time.monotonic() + timeout_s
        codes = []
        for index, proc in enumerate(self.procs):
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{self.nodes[index].name} still running after {timeout_s:g} s:\n"
                    f"{self.log_text(index)[-4000:]}"
                ) from None
        return codes

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # torchrun starts its workers in sessions of their own: find them by the output folder.
        kill_processes_mentioning(str(self.out))


def round_counter(endpoints: Sequence[str], job: str) -> Callable[[], int]:
    def current() -> int:
        with SyncClient(list(endpoints)) as client:
            return int(client.get_job(job).round.round)

    return current


def check_trained(job: LauncherJob) -> tuple[float, float]:
    """(first loss, final loss): the mean over ranks of the first step's loss, and of the
    final one every worker of the last round reports in ``done``."""
    steps = job.events("step")
    first_step = min(e["step"] for e in steps)
    first = statistics.mean(e["loss"] for e in steps if e["step"] == first_step)
    done = job.events("done")
    assert len(done) == WORLD_SIZE, f"{len(done)} workers finished, not {WORLD_SIZE}"
    final = statistics.mean(e["loss"] for e in done)
    return first, final


def torchrun_command(*args: str) -> list[str]:
    """``torchrun`` as this interpreter's module (the venv's ``torchrun`` script)."""
    return [sys.executable, "-m", "torch.distributed.run", *args]


def record(name: str, backend: str, recovery: Recovery) -> None:
    """Append one trial's figures to $RALLYPOINT_LAUNCHER_FIGURES (a JSON-lines file), if set."""
    path = os.environ.get("RALLYPOINT_LAUNCHER_FIGURES")
    if not path:
        return
    with open(path, "a") as out:
        print(json.dumps({"launcher": name, "backend": backend, **recovery.__dict__}), file=out)
