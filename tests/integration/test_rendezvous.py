"""Rendezvous with real processes: three coordinator daemons on loopback (tick 50 ms) and
worker processes (``worker_proc.py``) that join through the client library and report what
they see as JSON lines.

Claims: workers agree on one membership and rank assignment, and the round store works in
it; a late joiner waits and enters the next round; a SIGKILLed worker ends the round and
the survivors are told (the figure is printed), keep their ranks, and cannot commit a
checkpoint begun in the old round; a SIGSTOPped worker is caught by phi, and once resumed
finds itself lost and has its store write and checkpoint commit refused; the coordinator
leader killed during a rendezvous loses and duplicates no member; heartbeats survive a CPU
hog per core without a false suspicion (20 s here; 2 minutes with RALLYPOINT_SLOW=1).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from rallypoint.client import (
    Client,
    EndReason,
    JobConfig,
    RoundState,
    StaleRoundError,
    SyncClient,
)
from rallypoint.coordinator.cli.main import main as rallypoint_main

from .harness import ProcessCluster, running_cluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WORKER = Path(__file__).with_name("worker_proc.py")
Event = dict[str, Any]

# Heartbeats every 100 ms; phi may rise after a 500 ms stall (a loaded 2-core machine runs
# three daemons, the workers and the test), then crosses 8 about 0.9 s after the last beat.
CONFIG = JobConfig(
    min_nodes=3,
    max_nodes=3,
    heartbeat_interval_ms=100,
    acceptable_pause_ms=500,
    min_std_ms=50,
    phi_threshold=8.0,
)


class WorkerProcess:
    """One ``worker_proc.py`` process; its JSON lines are collected by a reader thread."""

    def __init__(self, endpoints: list[str], job: str, name: str, config: JobConfig | None):
        command = [
            sys.executable,
            str(WORKER),
            f"--endpoints={','.join(endpoints)}",
            f"--job={job}",
            f"--name={name}",
        ]
        if config is not None:
            command.append(f"--config={json.dumps(asdict(config))}")
        self.name = name
        self.events: list[Event] = []
        self.stderr: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def seen(self, event: str, predicate: Callable[[Event], bool] = lambda e: True) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e["event"] == event and predicate(e)]

    def wait_for(
        self,
        event: str,
        predicate: Callable[[Event], bool] = lambda e: True,
        timeout_s: float = 30.0,
    ) -> Event:
        def found() -> Event | None:
            if self.proc.poll() is not None and not self.seen(event, predicate):
                raise AssertionError(
                    f"worker {self.name} exited ({self.proc.returncode}) before {event}: "
                    + "".join(self.stderr[-20:])
                )
            matches = self.seen(event, predicate)
            return matches[0] if matches else None

        return wait_until(found, timeout_s, f"{self.name}: {event}")

    def active_round(self, round_number: int | None = None, timeout_s: float = 30.0) -> Event:
        """The worker's first ACTIVE round event (with ``round_number``, that round's)."""
        return self.wait_for(
            "round",
            lambda e: e["state"] == "active" and round_number in (None, e["round"]),
            timeout_s,
        )

    def command(self, line: str, timeout_s: float = 30.0) -> Event:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.wait_for("reply", lambda e: e["command"] == line, timeout_s)

    @property
    def participant_id(self) -> int:
        return int(self.wait_for("joined")["participant_id"])

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        for thread in self._threads:
            thread.join()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("rendezvous"), 3, tick_ms=50) as running:
        yield running


@pytest.fixture
def workers(cluster: ProcessCluster) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(job: str, name: str, config: JobConfig | None = None) -> WorkerProcess:
        worker = WorkerProcess(cluster.endpoints, job, name, config)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    for worker in started:
        if worker.stderr:
            print(f"--- worker {worker.name} stderr ---\n{''.join(worker.stderr[-30:])}")


def admin(cluster: ProcessCluster, body: Callable[[Client], Any]) -> Any:
    """Run ``body(client)`` with a fresh client of the cluster."""

    async def run() -> Any:
        async with Client(cluster.endpoints, timeout_s=20) as client:
            return await body(client)

    return asyncio.run(run())


def ranks(event: Event) -> dict[int, int]:
    """participant id -> rank in a round event."""
    return {pid: rank for pid, _name, rank in event["members"]}


def start_round(
    workers: Callable[..., WorkerProcess], job: str, count: int, config: JobConfig
) -> tuple[list[WorkerProcess], Event]:
    """``count`` workers join ``job`` (created with ``config``) and agree on round 1."""
    started = [workers(job, f"w{i}", config) for i in range(count)]
    rounds = [w.active_round() for w in started]
    first = rounds[0]
    for event in rounds:
        assert (event["round"], event["members"], event["token"]) == (
            first["round"],
            first["members"],
            first["token"],
        )
    return started, first


def first_change_after(worker: WorkerProcess, round_number: int) -> Event:
    """The worker's first round event past ``round_number`` (the old round ended)."""
    return worker.wait_for("round", lambda e: e["round"] > round_number)


# ---------------------------------------------------------------------------- agreement


def test_four_workers_agree_on_membership_ranks_and_store(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    config = JobConfig(**{**asdict(CONFIG), "min_nodes": 4, "max_nodes": 4})
    started, first = start_round(workers, "agree", 4, config)
    pids = sorted(w.participant_id for w in started)
    assert sorted(ranks(first)) == pids
    # Ranks are 0..3 in participant-id (join) order, and each worker knows its own.
    assert [ranks(first)[pid] for pid in pids] == [0, 1, 2, 3]
    for worker in started:
        assert worker.active_round()["rank"] == ranks(first)[worker.participant_id]
    names = {name for _pid, name, _rank in first["members"]}
    assert names == {"w0", "w1", "w2", "w3"}
    agreed = [w.wait_for("store_agreed", lambda e: e["round"] == first["round"]) for w in started]
    assert all(e["names"] == agreed[0]["names"] for e in agreed)
    by_rank = {rank: name for _pid, name, rank in first["members"]}
    assert agreed[0]["names"] == [by_rank[r] for r in range(4)]


def test_late_joiner_waits_and_enters_next_round(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    config = JobConfig(**{**asdict(CONFIG), "max_nodes": 4, "scale_up": True})
    started, first = start_round(workers, "late", 3, config)
    late = workers("late", "late", config)
    joined = late.wait_for("joined")
    # Round 1 was ACTIVE, so the late joiner waited; with scale_up its arrival ended the
    # round in the same command, and the Join answers with the next round.
    assert joined["round"] > first["round"]
    second = late.active_round()
    assert second["round"] > first["round"]
    assert second["rank"] == 3 and second["world_size"] == 4
    # The members of round 1 moved with it and kept their ranks.
    for worker in started:
        assert worker.active_round(second["round"])["members"] == second["members"]
        assert ranks(second)[worker.participant_id] == ranks(first)[worker.participant_id]
    history = admin(cluster, lambda c: c.get_job("late")).history
    assert history[-1].round == first["round"]
    assert history[-1].end_reason is EndReason.SCALE_UP
    assert late.participant_id not in {m.participant_id for m in history[-1].members}


# ---------------------------------------------------------------------------- worker faults


def test_sigkill_ends_the_round_survivors_told_and_keep_ranks(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    job = "sigkill"
    started, first = start_round(workers, job, 3, CONFIG)
    # From now on two workers make a round, at once.
    admin(cluster, lambda c: c.configure(job, JobConfig(**{**asdict(CONFIG), "min_nodes": 2})))
    by_rank = {w.active_round()["rank"]: w for w in started}
    victim, survivors = by_rank[2], [by_rank[0], by_rank[1]]
    # A checkpoint begun in round 1, every shard written, not committed yet.
    begun = by_rank[0].command("ckpt_begin 100")
    checkpoint_id = begun["checkpoint_id"]
    for worker in started:
        assert worker.command(f"ckpt_shard {checkpoint_id}")["ok"]

    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    told = [first_change_after(w, first["round"]) for w in survivors]
    delays_ms = [round((e["t"] - killed_at) * 1000) for e in told]
    print(f"\nSIGKILL -> survivors notified: {delays_ms} ms")

    second = [w.active_round(told[0]["round"]) for w in survivors]
    assert second[0]["members"] == second[1]["members"]
    assert ranks(second[0]) == {w.participant_id: r for r, w in enumerate(survivors)}
    status = admin(cluster, lambda c: c.get_job(job))
    ended = status.history[-1]
    assert (ended.round, ended.end_reason, ended.ended_by) == (
        first["round"],
        EndReason.MEMBER_FAILED,
        victim.participant_id,
    )
    # Round 1's checkpoint cannot be committed any more: its round is gone.
    stale = by_rank[0].command(f"ckpt_commit {checkpoint_id} {first['round']}")
    assert (stale["ok"], stale["error"]) == (False, "StaleRoundError")
    assert admin(cluster, lambda c: c.latest_checkpoint(job)) is None
    # The new round checkpoints normally.
    begun = survivors[0].command("ckpt_begin 200")
    for worker in survivors:
        assert worker.command(f"ckpt_shard {begun['checkpoint_id']}")["ok"]
    assert survivors[1].command(f"ckpt_commit {begun['checkpoint_id']}")["ok"]
    latest = admin(cluster, lambda c: c.latest_checkpoint(job))
    assert (latest.step, latest.round, latest.world_size) == (200, second[0]["round"], 2)


def test_sigstop_caught_by_phi_and_the_resumed_zombie_is_fenced(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    job = "sigstop"
    started, first = start_round(workers, job, 3, CONFIG)
    admin(cluster, lambda c: c.configure(job, JobConfig(**{**asdict(CONFIG), "min_nodes": 2})))
    by_rank = {w.active_round()["rank"]: w for w in started}
    zombie, survivors = by_rank[2], [by_rank[0], by_rank[1]]
    checkpoint_id = by_rank[0].command("ckpt_begin 100")["checkpoint_id"]
    for worker in started:
        assert worker.command(f"ckpt_shard {checkpoint_id}")["ok"]

    stopped_at = time.time()
    zombie.signal(signal.SIGSTOP)
    told = [first_change_after(w, first["round"]) for w in survivors]
    delays_ms = [round((e["t"] - stopped_at) * 1000) for e in told]
    print(f"\nSIGSTOP -> phi suspicion -> survivors notified: {delays_ms} ms")
    second = survivors[0].active_round(told[0]["round"])
    status = admin(cluster, lambda c: c.get_job(job))
    assert status.history[-1].end_reason is EndReason.MEMBER_FAILED
    assert status.history[-1].ended_by == zombie.participant_id

    resumed_at = time.time()
    zombie.signal(signal.SIGCONT)
    lost = zombie.wait_for("lost")
    print(f"SIGCONT -> the zombie knows it is lost: {round((lost['t'] - resumed_at) * 1000)} ms")
    zombie.wait_for("wait_refused")
    # Its writes to the world it left are refused.
    write = zombie.command(f"store_set owner zombie {first['round']}")
    assert (write["ok"], write["error"]) == (False, "StaleRoundError")
    commit = zombie.command(f"ckpt_commit {checkpoint_id} {first['round']}")
    assert (commit["ok"], commit["error"]) == (False, "StaleRoundError")
    # ... and nothing changed for the survivors: same round, same members, no checkpoint.
    after = admin(cluster, lambda c: c.get_job(job))
    assert (after.round.round, after.round.state) == (second["round"], RoundState.ACTIVE)
    assert sorted(m.participant_id for m in after.round.members) == sorted(
        w.participant_id for w in survivors
    )
    assert after.latest_checkpoint is None
    assert not any(w.seen("lost") for w in survivors)


# ---------------------------------------------------------------------------- coordinator faults


def test_leader_killed_during_rendezvous_loses_and_duplicates_nobody(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    job = "leaderkill"
    config = JobConfig(**{**asdict(CONFIG), "min_nodes": 4, "max_nodes": 4})
    early = [workers(job, f"w{i}", config) for i in range(2)]
    for worker in early:
        worker.wait_for("joined")
    leader = cluster.leader()
    cluster.kill(leader)
    try:
        late = [workers(job, f"w{i}", config) for i in range(2, 4)]
        rounds = [w.active_round(timeout_s=60) for w in early + late]
    finally:
        cluster.start(leader)
    first = rounds[0]
    assert all(e["members"] == first["members"] for e in rounds)
    pids = [pid for pid, _name, _rank in first["members"]]
    names = sorted(name for _pid, name, _rank in first["members"])
    assert len(set(pids)) == 4 and names == ["w0", "w1", "w2", "w3"]
    assert sorted(ranks(first).values()) == [0, 1, 2, 3]
    assert sorted(w.participant_id for w in early + late) == sorted(pids)
    for worker in early + late:
        worker.wait_for("store_agreed", lambda e: e["round"] == first["round"])
    cluster.leader()
    status = admin(cluster, lambda c: c.get_job(job))
    assert (status.round.round, status.round.state) == (first["round"], RoundState.ACTIVE)
    assert not any(w.seen("lost") for w in early + late)


# ---------------------------------------------------------------------------- threads


def test_sync_client_from_threads(cluster: ProcessCluster) -> None:
    """What torch's c10d store adapter does: the round store from several threads."""
    config = JobConfig(**{**asdict(CONFIG), "min_nodes": 1, "max_nodes": 1})
    with SyncClient(cluster.endpoints) as client:
        participant = client.join("threads", "solo", config=config)
        info = participant.wait_for_round(timeout_s=20)
        assert (info.world_size, participant.rank) == (1, 0)
        store = participant.store()

        def add_many() -> None:
            for _ in range(5):
                store.add("counter", 1)

        threads = [threading.Thread(target=add_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert store.get("counter") == b"20"
        assert store.compare_set("leader", b"", b"solo").swapped
        assert store.check(["counter", "leader"]) and store.num_keys() == 2
        registry = participant.checkpoints()
        checkpoint_id = registry.begin(7, uri="file:///tmp/ckpt-7")
        assert registry.shard_done(checkpoint_id, 0).reported == 1
        assert registry.commit(checkpoint_id).checkpoint.step == 7
        assert client.latest_checkpoint("threads").step == 7
        participant.leave()
        assert not participant.lost.is_set()
        # Leaving ended the round: its store refuses the departed participant.
        with pytest.raises(StaleRoundError):
            store.set("late", b"write")
        assert client.get_job("threads").history[-1].end_reason is EndReason.MEMBER_LEFT


# ---------------------------------------------------------------------------- operator commands


def test_operator_commands_jobs_rounds_evict_close(
    cluster: ProcessCluster,
    workers: Callable[..., WorkerProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = "operated"
    config = JobConfig(**{**asdict(CONFIG), "min_nodes": 2, "max_nodes": 2})
    started, first = start_round(workers, job, 2, config)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = rallypoint_main([*argv, "--endpoints", ",".join(cluster.endpoints)])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    def run_json(*argv: str) -> Any:
        code, out, err = run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    jobs = {j["job"]: j for j in run_json("jobs")["jobs"]}
    assert (jobs[job]["round"], jobs[job]["state"], jobs[job]["world_size"]) == (
        first["round"],
        "active",
        2,
    )
    code, out, _ = run("jobs")
    assert code == 0 and job in out
    rounds = run_json("rounds", job)
    members = rounds["round"]["members"]
    assert [(m["participant_id"], m["name"], m["rank"]) for m in members] == [
        tuple(m) for m in first["members"]
    ]
    assert all(isinstance(m["phi"], float) for m in members)
    code, out, _ = run("rounds", job)
    assert code == 0 and "reason:" in out and "phi" in out

    evicted = next(w for w in started if w.active_round()["rank"] == 1)
    result = run_json("evict", job, evicted.name)
    assert (result["participant_id"], result["ended_round"]) == (
        evicted.participant_id,
        first["round"],
    )
    evicted.wait_for("lost")
    history = run_json("rounds", job)["history"]
    assert (history[-1]["end_reason"], history[-1]["ended_by"]) == (
        "member_evicted",
        evicted.participant_id,
    )
    code, out, err = run("evict", job, "nobody")
    assert (code, out) == (1, "") and err.startswith("error: ") and err.count("\n") == 1

    assert run_json("close-job", job)["ended_round"] > 0
    for worker in started:
        worker.wait_for("lost")
    assert run_json("close-job", job)["ended_round"] == 0
    assert {j["job"]: j for j in run_json("jobs")["jobs"]}[job]["job_closed"]


# ---------------------------------------------------------------------------- load


def cpu_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def heartbeats_under_load(
    cluster: ProcessCluster,
    workers: Callable[..., WorkerProcess],
    job: str,
    duration_s: float,
) -> None:
    started, first = start_round(workers, job, 3, CONFIG)
    hogs = cpu_hogs(os.cpu_count() or 2)
    peak_phi = 0.0

    async def observe() -> float:
        peak = 0.0
        async with Client(cluster.endpoints, timeout_s=20) as client:
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                status = await client.get_job(job)
                assert (status.round.round, status.round.state) == (
                    first["round"],
                    RoundState.ACTIVE,
                ), f"the round changed under load: {status.history[-1:]}"
                peak = max([peak, *(m.phi for m in status.round.members)])
                await asyncio.sleep(0.5)  # the sampling period of the phi readings
        return peak

    try:
        peak_phi = asyncio.run(observe())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(
        f"\n{duration_s:g} s of 100 ms heartbeats with {len(hogs)} CPU hogs: no suspicion; "
        f"peak phi sampled {peak_phi:.2f} (threshold {CONFIG.phi_threshold})"
    )
    assert not any(w.seen("lost") for w in started)
    assert not admin(cluster, lambda c: c.get_job(job)).history


def test_no_false_suspicion_with_the_cpu_loaded(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    heartbeats_under_load(cluster, workers, "cpuload", 20.0)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RALLYPOINT_SLOW") != "1", reason="set RALLYPOINT_SLOW=1")
def test_no_false_suspicion_with_the_cpu_loaded_for_two_minutes(
    cluster: ProcessCluster, workers: Callable[..., WorkerProcess]
) -> None:
    heartbeats_under_load(cluster, workers, "cpuload-long", 120.0)
