"""Shaped jobs in the recovery benchmark: a dp x tp mesh job (rallypoint.worker.mesh_train,
tp = 2, unit_size = 2) on simulated hosts of 4 processes, each host a failure domain.

Two jobs, one after the other, each trial (bench/recovery_bench.py runs them):

- *shrink*: 8 workers, dp=4 x tp=2 on host-a (w0-w3) and host-b (w4-w7). One process is
  SIGKILLed: ``shaped_recovery_s`` is from the kill until the 6 survivors (all but the victim
  and its unit's other rank, which waits) trained a step at world 6 (dp=3, tp=2). Then the
  4 processes of host-a are SIGKILLed at once: ``host_loss_rounds`` is how many rounds the
  coordinator ended by a failure from the kill until a second after the survivors trained
  again (the target: 1; ``host_loss_rounds_seen``: how many of them the survivors saw end).
- *spare*: 12 workers, dp=4 x tp=2 on host-a and host-b, host-c's 4 waiting as spares. The
  4 processes of host-b are SIGKILLed at once: ``spare_recovery_s`` is from the kill until
  the 8 workers of host-a and host-c trained a step at world 8 (dp kept at 4). Then host-a
  is drained (``rallypoint drain``, through the client's ``drain``) while it trains:
  ``drain_steps_lost`` is the last step any worker counted before the drain's round ended,
  minus the step the next round restored (the target: 0, nothing trained is lost).

Domain names are cluster-wide (a drain applies to every job), so each trial's hosts are
named after its job. Every worker takes an in-memory snapshot every step (2 copies, on
another host) and no disk checkpoint: a restore reads the peers' memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import follow_events
from rallypoint.client import EndReason, SyncClient

Event = dict[str, Any]
TP = 2
HOST_SIZE = 4


class MeshTrial:
    """Workers of one mesh job (``hosts``: host -> worker names) and the events they print;
    ``start`` launches some of them (the spares later)."""

    def __init__(self, endpoints: str, job: str, root: Path, *, max_nodes: int) -> None:
        self.endpoints, self.job, self.root, self.max_nodes = endpoints, job, root, max_nodes
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.hosts: dict[str, str] = {}

    def start(self, host: str, names: Sequence[str]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        for name in names:
            self.hosts[name] = host
            with open(self.root / f"{self.job}-{name}.err", "w") as stderr:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "rallypoint.worker.mesh_train",
                        f"--endpoints={self.endpoints}",
                        f"--job={self.job}",
                        f"--name={name}",
                        f"--host={host}",
                        f"--tp={TP}",
                        f"--checkpoint-dir={self.root / self.job}",
                        "--checkpoint-every=0",
                        "--snapshot-every=1",
                        f"--min-nodes={TP}",
                        f"--max-nodes={self.max_nodes}",
                        "--step-sleep-s=0.01",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            self.procs[name] = proc
            follow_events(proc, self.events, self.lock)

    def select(self, kind: str, after_t: float = 0.0, until_t: float = float("inf")) -> list[Event]:
        with self.lock:
            return [e for e in self.events if e["event"] == kind and after_t < e["t"] <= until_t]

    def training_at(self, names: Sequence[str], world_size: int, after_t: float) -> float | None:
        """When every named worker had counted a step at ``world_size`` after ``after_t``."""
        steps = self.select("step", after_t)
        firsts = []
        for name in names:
            mine = [e["t"] for e in steps if e["name"] == name and e["world_size"] == world_size]
            if not mine:
                return None
            firsts.append(float(mine[0]))
        return max(firsts)

    def unit_mates(self, name: str, before_t: float) -> list[str]:
        """The workers of ``name``'s unit in the last mesh it formed before ``before_t``."""
        formed = self.select("mesh_formed", until_t=before_t)
        mine = [e for e in formed if e["name"] == name][-1]
        return [
            e["name"]
            for e in formed
            if e["round"] == mine["round"] and e["unit"] == mine["unit"] and e["name"] != name
        ]

    def kill(self, names: Sequence[str]) -> float:
        killed_at = time.time()
        for name in names:
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        return killed_at

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(what: str, ready: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"no {what} within {timeout_s:g} s")


def _names(first: int) -> list[str]:
    return [f"w{i}" for i in range(first, first + HOST_SIZE)]


def _rounds_ended(trial: MeshTrial, names: Sequence[str], after_t: float, until_t: float) -> int:
    """Distinct rounds the named workers saw end in ``(after_t, until_t]``."""
    return len(
        {e["round"] for e in trial.select("round_ended", after_t, until_t) if e["name"] in names}
    )


def _ends(trial: MeshTrial, names: Sequence[str], after_t: float, until_t: float) -> list[str]:
    """Each round the named workers saw end in ``(after_t, until_t]``, with the first
    reason given for it: what a fault cost in round changes, for the report."""
    first: dict[int, str] = {}
    for event in trial.select("round_ended", after_t, until_t):
        if event["name"] in names:
            first.setdefault(event["round"], f"{event['name']}: {event['reason'][:120]}")
    return [f"round {number}: {reason}" for number, reason in sorted(first.items())]


def _coordinator_rounds(endpoints: str, job: str) -> tuple[list[Any], Any]:
    """The job's ended rounds (history) and its current round, as the coordinator has them."""
    with SyncClient(endpoints.split(",")) as client:
        status = client.get_job(job)
    return list(status.history), status.round


def _failed_rounds(endpoints: str, job: str, after_t: float, until_t: float) -> list[int]:
    """Rounds the coordinator ended by a failure in ``(after_t, until_t]``: what a fault
    cost in round changes, whether or not a worker saw the round (one that ends while the
    workers are forming it is seen by some, or none)."""
    history, _ = _coordinator_rounds(endpoints, job)
    return [
        r.round
        for r in history
        if r.end_reason is EndReason.MEMBER_FAILED and after_t < r.ended_ms / 1000 <= until_t
    ]


def _phases(
    trial: MeshTrial, names: Sequence[str], world_size: int, killed_at: float, back: float
) -> Event:
    """Where a recovery's time went, each from the kill: the coordinator ended the round
    (``ended_s``: detection), closed the next (``closed_s``: after the hold), the named
    workers formed it (``formed_s``: groups and restore; ``init_s`` and ``restore_s`` the
    slowest rank's) and trained a step in it (``trained_s``)."""
    steps = [
        e for e in trial.select("step", killed_at, back)
        if e["name"] in names and e["world_size"] == world_size
    ]  # fmt: skip
    # The round they trained in again (a step of the old round at the same world size may
    # have been counted after the kill, before the loss was noticed).
    number = max(e["round"] for e in steps)
    history, current = _coordinator_rounds(trial.endpoints, trial.job)
    ended = [r for r in history if r.ended_ms / 1000 > killed_at]
    closed_ms = next(
        (r.closed_ms for r in history if r.round == number),
        current.closed_ms if current.round == number else 0,
    )
    formed = [
        e for e in trial.select("round_formed", killed_at)
        if e["name"] in names and e["round"] == number
    ]  # fmt: skip
    # A rank's first step done in the round (before its snapshot and its "step" line).
    stepped = [
        e for e in trial.select("trained", killed_at)
        if e["name"] in names and e["round"] == number
    ]  # fmt: skip
    return {
        "ended_s": ended[0].ended_ms / 1000 - killed_at if ended else None,
        "closed_s": closed_ms / 1000 - killed_at if closed_ms else None,
        "formed_s": max(e["t"] for e in formed) - killed_at if formed else None,
        "noticed_s": max(e["t"] - e["formed_s"] for e in formed) - killed_at if formed else None,
        "init_s": max(e["init_s"] for e in formed) if formed else None,
        "between_s": max(e["formed_s"] - e["init_s"] - e["restore_s"] for e in formed)
        if formed
        else None,
        "restore_s": max(e["restore_s"] for e in formed) if formed else None,
        "stepped_s": max(e["t"] for e in stepped) - killed_at if stepped else None,
        "trained_s": back - killed_at,
    }


def shrink_trial(endpoints: str, job: str, root: Path, timeout_s: float) -> Event:
    """dp=4 x tp=2 loses one process, then a whole host (module docstring)."""
    trial = MeshTrial(endpoints, job, root, max_nodes=2 * HOST_SIZE)
    host_a, host_b = f"{job}-host-a", f"{job}-host-b"
    trial.start(host_a, _names(0))
    trial.start(host_b, _names(HOST_SIZE))
    everyone = list(trial.procs)
    figures: Event = {}
    try:
        wait_for("dp=4 x tp=2 training", lambda: trial.training_at(everyone, 8, 0.0), timeout_s)
        time.sleep(1.0)  # a few snapshots' worth of training at world 8
        victim = "w5"
        partner = trial.unit_mates(victim, time.time())
        killed_at = trial.kill([victim])
        survivors = [n for n in everyone if n != victim and n not in partner]
        back = wait_for(
            "6 survivors training at dp=3",
            lambda: trial.training_at(survivors, 6, killed_at),
            timeout_s,
        )
        formed = [e for e in trial.select("mesh_formed", killed_at) if e["world_size"] == 6]
        figures.update(
            shaped_recovery_s=back - killed_at,
            shaped_phases=_phases(trial, survivors, 6, killed_at, back),
            shaped_ends=_ends(trial, survivors, killed_at, back),
            shaped_sources=sorted({e["source"] for e in formed}),
            shaped_mesh=sorted({(e["dp"], e["tp"]) for e in formed}),
        )
        time.sleep(1.0)
        # The whole of host-a at once: the survivors are host-b's (and the waiting one).
        lost = [n for n in _names(0) if n in survivors]
        left = [n for n in survivors if n not in lost]
        killed_at = trial.kill(lost)
        world = len(left)
        back = wait_for(
            f"host-b's {world} training",
            lambda: trial.training_at(left, world, killed_at),
            timeout_s,
        )
        # Counted by the coordinator (a round that ends while its workers form it may be
        # seen by none of them), and as the workers saw them; a verdict on a host-mate
        # lands within the hold and the confirmation window (well under a second).
        time.sleep(1.0)
        failed = _failed_rounds(endpoints, job, killed_at, time.time())
        figures.update(
            host_loss_rounds=len(failed),
            host_loss_failed_rounds=failed,
            host_loss_rounds_seen=_rounds_ended(trial, left, killed_at, back),
            host_loss_ends=_ends(trial, left, killed_at, back),
            host_loss_recovery_s=back - killed_at,
            host_loss_world=world,
        )
        return {"recovered": True, **figures}
    except TimeoutError as error:
        return {"recovered": False, "error": str(error), **figures}
    finally:
        trial.stop()


def spare_trial(endpoints: str, job: str, root: Path, timeout_s: float) -> Event:
    """dp=4 x tp=2 and a spare host: a host lost, then another drained (module docstring)."""
    trial = MeshTrial(endpoints, job, root, max_nodes=2 * HOST_SIZE)
    host_a, host_b, host_c = (f"{job}-host-{x}" for x in "abc")
    trial.start(host_a, _names(0))
    trial.start(host_b, _names(HOST_SIZE))
    active = list(trial.procs)
    figures: Event = {}
    try:
        wait_for("dp=4 x tp=2 training", lambda: trial.training_at(active, 8, 0.0), timeout_s)
        spares = _names(2 * HOST_SIZE)
        trial.start(host_c, spares)
        wait_for(
            "the spare host joined",
            lambda: len({e["name"] for e in trial.select("joined") if e["name"] in spares}) == 4,
            timeout_s,
        )
        time.sleep(1.0)
        killed_at = trial.kill(_names(HOST_SIZE))
        world = [*_names(0), *spares]
        back = wait_for(
            "host-a and the spare host training at dp=4",
            lambda: trial.training_at(world, 8, killed_at),
            timeout_s,
        )
        formed = [e for e in trial.select("mesh_formed", killed_at) if e["world_size"] == 8]
        figures.update(
            spare_recovery_s=back - killed_at,
            spare_phases=_phases(trial, world, 8, killed_at, back),
            spare_rounds=len(_failed_rounds(endpoints, job, killed_at, back)),
            spare_rounds_seen=_rounds_ended(trial, world, killed_at, back),
            spare_ends=_ends(trial, world, killed_at, back),
            spare_sources=sorted({e["source"] for e in formed}),
        )
        time.sleep(1.0)
        with SyncClient(trial.endpoints.split(",")) as client:
            drained_at = time.time()
            client.drain(host_a, reason="bench: drain while training")
            try:
                back = wait_for(
                    "the spare host training alone",
                    lambda: trial.training_at(spares, 4, drained_at),
                    timeout_s,
                )
            finally:
                client.undrain(host_a)
        drained_round = min(
            e["round"] for e in trial.select("round_ended", drained_at) if e["name"] in world
        )
        trained = max(e["step"] for e in trial.select("step") if e["round"] == drained_round)
        restored = min(
            e["step"] for e in trial.select("mesh_formed", drained_at) if e["world_size"] == 4
        )
        figures.update(
            drain_steps_lost=trained - restored,
            drain_ends=_ends(trial, world, drained_at, back),
            drain_recovery_s=back - drained_at,
        )
        return {"recovered": True, **figures}
    except TimeoutError as error:
        return {"recovered": False, "error": str(error), **figures}
    finally:
        trial.stop()


# The report's fields: each the median over the trials that measured it (None: none did).
SHAPED_FIELDS = ("shaped_recovery_s", "host_loss_rounds", "spare_recovery_s", "drain_steps_lost")


def shaped_figures(trials: Sequence[Event]) -> dict[str, Any]:
    """The report's shaped-job fields from ``trials`` (shrink and spare trials' figures)."""
    report: dict[str, Any] = {}
    for field in SHAPED_FIELDS:
        values = sorted(t[field] for t in trials if t.get(field) is not None)
        report[field] = values[len(values) // 2] if values else None
    return report
