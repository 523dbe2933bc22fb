"""Elastic training end to end: real coordinator members and real worker processes (gloo, CPU).

Claims:
- two workers form a group through the coordinator, train, checkpoint every N steps with a
  fenced commit, keep only the last K checkpoints, finish with identical replicas, and the
  loss falls; once they leave the run, no process group they made is alive;
- a worker whose only credential is its job's token (``job:<id>``, from
  ``RALLYPOINT_TOKEN``) trains and commits checkpoints against members that require tokens;
  an explicit token of another job wins over the environment and is refused;
- four workers train; one is SIGKILLed: the other three re-form at world 3 in the same
  processes and go on, their restored state equal bit for bit to the last committed
  checkpoint (``restore="checkpoint"``), the loss still falling; a new worker joins: world 4,
  the world-3 checkpoint resharded to 4 ranks; the coordinator's leader is killed -9 mid-
  training: training goes on; a worker SIGSTOPped just before committing and resumed after
  the others re-formed cannot commit nor write to its old round's store; across all of it
  the sampler's global steps tile the data: no sample repeated or skipped (4 -> 3 -> 4).

The times from a fault to all survivors training again are printed, not asserted.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.worker import read_metadata, restore_checkpoint
from rallypoint.worker.demo_train import BATCH_SIZE, make_state, state_digest
from tests.integration.harness import (
    ProcessCluster,
    logged_coordinator_wait_s,
    running_cluster,
    running_cluster_with_tokens,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKER = Path(__file__).with_name("elastic_worker.py")
# Worker processes start slowly on a loaded 2-core machine (torch's import alone takes
# seconds); every wait below is a condition with a generous deadline.
START_S = 120
CHANGE_S = 60

Event = dict[str, Any]


class Worker:
    """A worker process and the JSON events it printed."""

    def __init__(
        self, name: str, command: list[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.events: list[Event] = []
        self._lock = threading.Lock()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
        self.stderr_path = log_dir / f"{name}.err"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(event)

    def select(self, kind: str, after_t: float = 0.0) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind and e["t"] > after_t]

    def last_step(self) -> Event | None:
        steps = self.select("step")
        return steps[-1] if steps else None

    def stopped(self) -> bool:
        """The process is stopped by a signal (state T in /proc)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-8000:]


class Job:
    # The worker program each spawn runs.
    script = WORKER

    def __init__(self, cluster: ProcessCluster, root: Path, job: str, *args: str) -> None:
        self.cluster = cluster
        self.root = root
        self.job = job
        self.checkpoint_dir = root / "checkpoints"
        self.args = list(args)
        self.workers: dict[str, Worker] = {}

    def command(self, name: str, *extra: str) -> list[str]:
        """The command line that starts the worker ``name``."""
        return [
            sys.executable,
            str(self.script),
            f"--endpoints={','.join(self.cluster.endpoints)}",
            f"--job={self.job}",
            f"--name={name}",
            f"--checkpoint-dir={self.checkpoint_dir}",
            *self.args,
            *extra,
        ]

    def spawn(self, name: str, *extra: str, env: dict[str, str] | None = None) -> Worker:
        worker = self.workers[name] = Worker(name, self.command(name, *extra), self.root, env)
        return worker

    def wait(self, condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
        try:
            return wait_until(condition, timeout_s, what, interval_s=0.02)
        except TimeoutError:
            # Every live worker prints its threads' stacks (faulthandler, on SIGUSR1).
            for worker in self.workers.values():
                if worker.proc.poll() is None and not worker.stopped():
                    worker.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            for worker in self.workers.values():
                print(f"--- {worker.name} stderr ---\n{worker.stderr_tail()}", file=sys.stderr)
                events = [e for e in worker.events if e["event"] != "step"]
                print(f"--- {worker.name} events ---\n{events[-30:]}", file=sys.stderr)
            raise

    def training_at(
        self, names: list[str], world_size: int, after_t: float, after_round: int = 0
    ) -> float | None:
        """When every named worker had counted a step at ``world_size`` after ``after_t`` (in
        a round after ``after_round``): the latest of their first such steps; None until all
        have."""
        firsts = []
        for name in names:
            steps = [
                e
                for e in self.workers[name].select("step", after_t)
                if e["world_size"] == world_size and e["round"] > after_round
            ]
            if not steps:
                return None
            firsts.append(steps[0]["t"])
        return max(firsts)

    def stop_all(self) -> None:
        for worker in self.workers.values():
            worker.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("elastic-cluster")) as running:
        yield running


def checkpoint_digest(path: Path) -> str:
    """The digest of a checkpoint's state, loaded in this process (no process group)."""
    state = make_state()
    assert state.sampler is not None
    with warnings.catch_warnings():
        # DCP warns that it loads in a single process: that is the point here.
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        restore_checkpoint(path, state.model, state.optimizer, sampler=state.sampler)
    return state_digest(state.model, state.optimizer)


def committed_path(job: Job, step: int) -> Path:
    (path,) = [p for p in job.checkpoint_dir.glob(f"step-{step:06d}-round-*") if p.is_dir()]
    return path


def test_two_workers_train_commit_and_retain(cluster: ProcessCluster, tmp_path: Path) -> None:
    job = Job(
        cluster,
        tmp_path,
        "pair",
        "--min-nodes=2",
        "--max-nodes=2",
        "--max-steps=60",
        "--checkpoint-every=10",
        "--keep-checkpoints=2",
    )
    try:
        workers = [job.spawn("a"), job.spawn("b")]
        for worker in workers:
            assert worker.proc.wait(timeout=START_S) == 0, worker.stderr_tail()
    finally:
        job.stop_all()
    finals = [w.select("final_state")[0] for w in workers]
    assert {f["step"] for f in finals} == {60}
    # Identical replicas at the end.
    assert finals[0]["digest"] == finals[1]["digest"]
    committed = [e for w in workers for e in w.select("checkpoint_committed")]
    assert sorted(e["step"] for e in committed) == [10, 20, 30, 40, 50, 60]
    # Retention: only the last two committed checkpoints are left on disk.
    left = sorted(p.name for p in job.checkpoint_dir.iterdir())
    assert [name.split("-round-")[0] for name in left] == ["step-000050", "step-000060"]
    assert checkpoint_digest(committed_path(job, 60)) == finals[0]["digest"]
    losses = [e["loss"] for e in workers[0].select("step")]
    assert sum(losses[-10:]) < sum(losses[:10])
    # Leaving the run destroyed every group it made (the world's, the checkpoints'): none
    # is left for the interpreter's exit to tear down while peers close theirs.
    for worker in workers:
        (groups,) = worker.select("groups_alive")
        assert groups["made"] >= 2 and groups["alive"] == 0 and groups["held"] == 0, groups


def final_lineage(workers: list[Worker]) -> dict[int, Event]:
    """Step number -> the training of it that the final state descends from. A round trains
    the steps after the step it was formed at; going back from the last round, each round
    contributes its steps up to where the next one started, so a step trained in a round
    that was then rolled back (to a checkpoint) is left out."""
    formed_at: dict[int, int] = {}
    by_round: dict[int, dict[int, Event]] = {}
    for worker in workers:
        for event in worker.select("round_formed"):
            assert formed_at.setdefault(event["round"], event["step"]) == event["step"], event
        for event in worker.select("step"):
            steps = by_round.setdefault(event["round"], {})
            seen = steps.setdefault(event["step"], event)
            # Every rank of a round agrees on the global step.
            assert (seen["epoch"], seen["start"], seen["end"]) == (
                event["epoch"],
                event["start"],
                event["end"],
            ), (seen, event)
    lineage: dict[int, Event] = {}
    limit: float = float("inf")
    for round_number in sorted(by_round, reverse=True):
        start = formed_at[round_number]
        for step, event in by_round[round_number].items():
            if start < step <= limit:
                lineage[step] = event
        limit = min(limit, start)
    return lineage


def assert_sampler_tiles(workers: list[Worker]) -> int:
    """The final lineage's global steps are consecutive runs of the epoch's permutation:
    each starts where the previous ended and is world_size * batch_size long (drop_last), so
    no sample is repeated or skipped whatever the world sizes."""
    lineage = final_lineage(workers)
    steps = sorted(lineage)
    assert steps == list(range(1, len(steps) + 1)), "a step number is missing"
    for previous, step in itertools.pairwise(steps):
        before, event = lineage[previous], lineage[step]
        assert event["end"] - event["start"] == event["world_size"] * BATCH_SIZE, event
        if event["epoch"] == before["epoch"]:
            assert event["start"] == before["end"], (before, event)
        else:
            assert (event["epoch"], event["start"]) == (before["epoch"] + 1, 0), (before, event)
    # 4 -> 3 -> 4 along the lineage (the start may pass through smaller worlds as the
    # workers arrive one by one).
    worlds = [lineage[step]["world_size"] for step in steps]
    changes = [size for size, _ in itertools.groupby(worlds)]
    assert any(changes[i : i + 3] == [4, 3, 4] for i in range(len(changes))), changes
    return len(steps)


def test_kill_join_leader_kill_and_zombie(cluster: ProcessCluster, tmp_path: Path) -> None:
    pause_file = tmp_path / "pause-before-commit"
    job = Job(
        cluster,
        tmp_path,
        "four",
        "--min-nodes=2",
        "--max-nodes=4",
        "--checkpoint-every=10",
        "--keep-checkpoints=1000",
        "--restore=checkpoint",
        "--step-sleep-s=0.01",
        f"--pause-file={pause_file}",
    )
    names = ["w0", "w1", "w2", "w3"]
    try:
        for name in names:
            job.spawn(name)
        four_t = job.wait(lambda: job.training_at(names, 4, 0.0), START_S, "4 workers training")
        # Let a world-4 round commit a checkpoint first.
        job.wait(
            lambda: any(
                e["world_size"] == 4
                for w in job.workers.values()
                for e in w.select("formed_state", 0.0)
                if any(c["round"] == e["round"] for c in w.select("checkpoint_committed", four_t))
            ),
            CHANGE_S,
            "a checkpoint committed at world 4",
        )

        # SIGKILL one: the others go on at world 3, restored from the last commit.
        victim = job.workers["w3"]
        killed_t = time.time()
        victim.kill()
        survivors = ["w0", "w1", "w2"]
        back_t = job.wait(
            lambda: job.training_at(survivors, 3, killed_t), CHANGE_S, "world 3 training"
        )
        print(f"SIGKILL -> 3 survivors training: {back_t - killed_t:.3f} s")
        for name in survivors:
            (formed,) = [
                e
                for e in job.workers[name].select("formed_state", killed_t)
                if e["world_size"] == 3
            ][:1]
            assert formed["source"] == "disk", formed
            assert formed["digest"] == checkpoint_digest(Path(formed["checkpoint"]))
        # The loss keeps falling at world 3.
        job.wait(
            lambda: len([e for e in job.workers["w0"].select("step", back_t)]) >= 40,
            CHANGE_S,
            "40 steps at world 3",
        )

        # A new worker joins: world 4, the world-3 checkpoint resharded to 4 ranks.
        joined_t = time.time()
        job.spawn("w4")
        members = [*survivors, "w4"]
        job.wait(lambda: job.training_at(members, 4, joined_t), START_S, "world 4 again")
        newcomer = next(e for e in job.workers["w4"].select("formed_state") if e["world_size"] == 4)
        assert newcomer["source"] == "disk", newcomer
        resharded_from = Path(newcomer["checkpoint"])
        assert read_metadata(resharded_from).world_size == 3
        assert newcomer["digest"] == checkpoint_digest(resharded_from)

        # Kill -9 the coordinator's leader mid-training: training goes on.
        leader = cluster.leader()
        leader_killed_t = time.time()
        cluster.kill(leader)
        job.wait(
            lambda: all(
                len(job.workers[name].select("step", leader_killed_t)) >= 20 for name in members
            ),
            CHANGE_S,
            "20 steps after the leader was killed",
        )

        # A worker stopped just before committing, resumed after the others re-formed,
        # cannot commit nor write to its old round's store.
        pause_file.touch()
        zombie = job.wait(
            lambda: next((job.workers[n] for n in members if job.workers[n].stopped()), None),
            CHANGE_S,
            "rank 0 to stop before committing",
        )
        # Its last line may still be on its way through the reader thread.
        (pausing,) = job.wait(
            lambda: zombie.select("pausing"), CHANGE_S, "the stopped worker's pausing event"
        )
        others = [n for n in members if n != zombie.name]
        job.wait(
            lambda: job.training_at(others, 3, pausing["t"], pausing["round"]),
            CHANGE_S,
            "the others re-formed without the stopped worker",
        )
        zombie.proc.send_signal(signal.SIGCONT)
        refused = job.wait(
            lambda: zombie.select("checkpoint_refused", pausing["t"]),
            CHANGE_S,
            "the zombie's commit refused",
        )
        assert refused[0]["step"] == pausing["step"], refused
        assert "StaleRound" in refused[0]["error"] or "StaleToken" in refused[0]["error"]
        (store_write,) = zombie.select("zombie_store")
        print(f"zombie: {store_write['outcome']}; commit: {refused[0]['error']}")
        assert store_write["outcome"].startswith("refused"), json.dumps(
            [e for e in zombie.events if e["event"] not in ("step", "checkpoint_saved")][-12:]
        )
        committed_steps = {
            e["step"] for w in job.workers.values() for e in w.select("checkpoint_committed")
        }
        zombie_round = pausing["round"]
        assert not [
            e
            for w in job.workers.values()
            for e in w.select("checkpoint_committed")
            if e["round"] == zombie_round and e["step"] == pausing["step"]
        ], committed_steps
        # The zombie rejoins as a newcomer and the world is 4 again.
        rejoined_t = time.time()
        job.wait(lambda: job.training_at(members, 4, rejoined_t), START_S, "world 4 after rejoin")
    finally:
        job.stop_all()

    all_workers = list(job.workers.values())
    steps = assert_sampler_tiles(all_workers)
    losses = [e["loss"] for e in job.workers["w0"].select("step")]
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20, (losses[:20], losses[-20:])
    print(f"{steps} global steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def test_a_job_token_is_all_a_worker_needs(tmp_path: Path) -> None:
    tokens = {"admin-secret": "admin", "solo-secret": "job:solo", "other-secret": "job:other"}
    with running_cluster_with_tokens(tmp_path / "cluster", tokens, size=1) as cluster:
        job = Job(
            cluster,
            tmp_path,
            "solo",
            "--min-nodes=1",
            "--max-nodes=1",
            "--max-steps=20",
            "--checkpoint-every=10",
        )
        try:
            env = {"RALLYPOINT_TOKEN": "solo-secret"}
            worker = job.spawn("w0", env=env)
            intruder = job.spawn("w1", "--token=other-secret", env=env)
            assert worker.proc.wait(timeout=START_S) == 0, worker.stderr_tail()
            committed = worker.select("checkpoint_committed")
            assert [event["step"] for event in committed] == [10, 20], worker.events[-10:]
            assert intruder.proc.wait(timeout=START_S) != 0
            assert (
                "PermissionDeniedError: permission denied: role 'job:other' may not take part "
                "in job 'solo'" in intruder.stderr_tail()
            ), intruder.stderr_tail()
        finally:
            job.stop_all()


def test_workers_started_before_the_coordinator_wait_for_it(tmp_path: Path) -> None:
    """The coordinator down for 10 s at launch, over three times a client's deadline (3 s
    here, the client's ``timeout_s``; joining used to give up after one): the workers wait
    (saying so in their logs, every 10 s) and the job trains once the members are up."""
    cluster = ProcessCluster(tmp_path / "cluster")
    job = Job(cluster, tmp_path, "late", "--min-nodes=2", "--max-nodes=2", "--max-steps=20",
              "--client-timeout-s=3")  # fmt: skip
    try:
        workers = [job.spawn("a"), job.spawn("b")]
        for worker in workers:
            job.wait(
                lambda w=worker: (
                    w.proc.poll() is None and logged_coordinator_wait_s(w.stderr_tail()) >= 10
                ),
                START_S,
                f"{worker.name} waiting 10 s for the coordinator",
            )
        cluster.start_all()
        started_at = time.time()
        cluster.leader()
        leader_at = time.time()
        for worker in workers:
            assert worker.proc.wait(timeout=START_S) == 0, worker.stderr_tail()
    finally:
        job.stop_all()
        cluster.shutdown()
    assert {w.select("final_state")[0]["step"] for w in workers} == {20}
    for worker in workers:
        assert "Traceback" not in worker.stderr_tail(), worker.stderr_tail()
    training = job.training_at(["a", "b"], 2, started_at)
    assert training is not None
    print(
        f"\ncoordinator started -> leader {leader_at - started_at:.2f} s -> both workers "
        f"training {training - leader_at:.2f} s later"
    )


def test_a_worker_that_never_reaches_the_coordinator_ends_with_one_line(tmp_path: Path) -> None:
    nobody = ProcessCluster(tmp_path / "never-started", size=1)
    job = Job(nobody, tmp_path, "alone", "--connect-timeout-s=3")
    try:
        worker = job.spawn("w0")
        assert worker.proc.wait(timeout=START_S) == 1
    finally:
        job.stop_all()
    stderr = worker.stderr_tail()
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("rallypoint: w0 of job 'alone': gave up joining after 3 s: "), stderr
    assert f"no member answered at {nobody.endpoints[0]}; check that the members" in last
