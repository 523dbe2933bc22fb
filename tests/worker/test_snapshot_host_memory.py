"""Memory snapshots in host memory, end to end: two workers keep their snapshots in files in a
directory (``--snapshot-dir``, as a tmpfs would be), every worker is SIGKILLed at once (a
job-wide crash), and the workers started again with the same names on the same "hosts" take
the files up and restore the snapshot the coordinator registered last (source ``memory``, its
step, its exact state), not the older disk checkpoint; the run then finishes and leaves no
file behind. Workers started as a new run of the job (the old run ended) find the old run's
files and start fresh, removing them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rallypoint.client import LeaveOutcome, SyncClient
from tests.integration.harness import ProcessCluster
from tests.worker.test_elastic import CHANGE_S, START_S, Job, Worker, cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

__all__ = ["cluster"]

NAMES = ("a", "b")


def kill_every_worker(workers: list[Worker]) -> float:
    """SIGKILL every worker at once (then reap them); when."""
    killed_t = time.time()
    for worker in workers:
        worker.proc.kill()
    for worker in workers:
        worker.kill()
    return killed_t


def files_of(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != ".lock")


def pair(cluster: ProcessCluster, root: Path, name: str, *args: str) -> Job:
    """A job of two workers keeping their snapshots in ``root``/shm."""
    return Job(cluster, root, name, "--min-nodes=2", "--max-nodes=2", "--step-sleep-s=0.02",
               f"--snapshot-dir={root / 'shm'}", *args)  # fmt: skip


def wait_until_gone(job: Job, client: SyncClient) -> None:
    """The coordinator removed the killed workers (their names are free to join again)."""
    job.wait(lambda: not list(client.all_members(job.job)), CHANGE_S, "the killed workers removed")


def test_every_worker_killed_restores_from_host_memory(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    host_memory = tmp_path / "shm"
    job = pair(cluster, tmp_path, "host-memory", "--snapshot-every=3", "--checkpoint-every=10",
               "--digest-snapshots")  # fmt: skip
    with SyncClient(cluster.endpoints) as client:
        try:
            first = [job.spawn(name, f"--host=host-{name}") for name in NAMES]
            job.wait(lambda: job.training_at(list(NAMES), 2, 0.0), START_S, "2 workers training")
            job.wait(
                lambda: (
                    (checkpoint := client.latest_checkpoint(job.job)) is not None
                    and (snapshot := client.latest_memory_snapshot(job.job)) is not None
                    and snapshot.step > checkpoint.step
                ),
                CHANGE_S,
                "a memory snapshot registered past a disk checkpoint",
            )
            killed_t = kill_every_worker(first)
            registered = client.latest_memory_snapshot(job.job)
            checkpoint = client.latest_checkpoint(job.job)
            assert registered is not None and checkpoint is not None
            assert files_of(host_memory), "the killed workers left their snapshot files"
            snapshotted = {
                e["digest"]
                for w in first
                for e in w.select("snapshot_digest")
                if e["step"] == registered.step
            }
            assert len(snapshotted) == 1, snapshotted
            wait_until_gone(job, client)

            stop_at = registered.step + 6
            again = [
                job.spawn(name, f"--host=host-{name}", f"--max-steps={stop_at}") for name in NAMES
            ]
            for worker in again:
                assert worker.proc.wait(timeout=START_S) == 0, worker.stderr_tail()
            for worker in again:
                formed = worker.select("formed_state", killed_t)[0]
                print(f"{worker.name}: {formed['source']} at step {formed['step']}")
                assert formed["source"] == "memory", formed
                # The snapshot's step and state: not the disk checkpoint's, not fresh.
                assert formed["step"] == registered.step > checkpoint.step, formed
                assert {formed["digest"]} == snapshotted
                assert worker.select("final_state")[0]["step"] == stop_at
            # A run that ended leaves no snapshot file behind.
            assert files_of(host_memory) == []
        finally:
            job.stop_all()


def test_a_new_run_does_not_take_up_another_run_s_files(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    host_memory = tmp_path / "shm"
    job = pair(cluster, tmp_path, "host-memory-runs", "--snapshot-every=2", "--checkpoint-every=0")
    with SyncClient(cluster.endpoints) as client:
        try:
            first = [job.spawn(name, f"--host=host-{name}") for name in NAMES]
            job.wait(lambda: job.training_at(list(NAMES), 2, 0.0), START_S, "2 workers training")
            job.wait(
                lambda: client.latest_memory_snapshot(job.job) is not None,
                CHANGE_S,
                "a memory snapshot registered",
            )
            killed_t = kill_every_worker(first)
            left = files_of(host_memory)
            assert left
            wait_until_gone(job, client)
            # The job ends (its last participant leaves it failed): the next join starts a
            # new run, which does not see the old run's snapshots.
            last = client.join(job.job, "last")
            last.leave(timeout_s=5, outcome=LeaveOutcome.FAILED, detail="the run ends")
            again = [job.spawn(name, f"--host=host-{name}", "--max-steps=4") for name in NAMES]
            for worker in again:
                assert worker.proc.wait(timeout=START_S) == 0, worker.stderr_tail()
                formed = worker.select("formed_state", killed_t)[0]
                assert formed["source"] == "fresh" and formed["step"] == 0, formed
            assert not any(path.exists() for path in left)
        finally:
            job.stop_all()
