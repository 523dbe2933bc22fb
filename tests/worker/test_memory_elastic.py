"""In-memory snapshots in the elastic loop, end to end: real coordinator members and four
worker processes on two simulated hosts training an FSDP2-sharded model, snapshotting every
step. A SIGKILLed worker's shards come back from its replica in the other host's memory (or,
erasure-coded 4+2, are decoded from the other blobs and the parity shares): the survivors
re-form at world 3 with the restore source ``memory``, at the step of the last snapshot the
coordinator registered before the kill (no disk checkpoint exists at all), and train on. A
rank 0 stopped just before registering a snapshot every rank protected, and resumed once the
others went on without it, has its registration refused: a zombie's snapshot never counts."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster
from tests.worker.test_elastic import CHANGE_S, START_S, Job, cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

__all__ = ["cluster"]


@pytest.mark.parametrize("redundancy", ["--snapshot-copies=2", "--snapshot-erasure=4+2"])
def test_a_killed_fsdp_worker_is_restored_from_peer_memory(
    cluster: ProcessCluster, tmp_path: Path, redundancy: str
) -> None:
    job = Job(
        cluster,
        tmp_path,
        "memory",
        "--min-nodes=3",
        "--max-nodes=4",
        "--fsdp",
        "--snapshot-every=1",
        redundancy,
        "--checkpoint-every=0",
        "--step-sleep-s=0.02",
    )
    hosts = {"a0": "host-a", "a1": "host-a", "b0": "host-b", "b1": "host-b"}
    try:
        for name, host in hosts.items():
            job.spawn(name, f"--host={host}")
        names = list(hosts)
        job.wait(lambda: job.training_at(names, 4, 0.0), START_S, "4 workers training")
        job.wait(
            lambda: (
                len([e for w in job.workers.values() for e in w.select("snapshot_committed")]) >= 5
            ),
            CHANGE_S,
            "5 snapshots registered at world 4",
        )
        victim = job.workers["b1"]
        killed_t = time.time()
        victim.kill()
        registered = max(
            e["step"]
            for w in job.workers.values()
            for e in w.select("snapshot_committed")
            if e["t"] <= killed_t
        )
        last_trained = max(
            e["step"] for w in job.workers.values() for e in w.select("step") if e["t"] <= killed_t
        )
        survivors = ["a0", "a1", "b0"]
        back_t = job.wait(
            lambda: job.training_at(survivors, 3, killed_t), CHANGE_S, "world 3 training"
        )
        print(f"SIGKILL -> 3 survivors training: {back_t - killed_t:.3f} s")
        for name in survivors:
            formed = next(
                e
                for e in job.workers[name].select("formed_state", killed_t)
                if e["world_size"] == 3
            )
            assert formed["source"] == "memory", formed
            # The newest registered snapshot (the one in flight at the kill may have been
            # registered just after it: never an older one).
            assert registered <= formed["step"] <= last_trained, (formed, registered)
            print(f"{name}: restored step {formed['step']}, last trained {last_trained}")
        digests = {job.workers[n].select("formed_state", killed_t)[0]["digest"] for n in survivors}
        assert len(digests) == 1, digests
        job.wait(
            lambda: len(job.workers["a0"].select("step", back_t)) >= 10,
            CHANGE_S,
            "10 steps at world 3",
        )
        # No disk checkpoint was ever written: everything came from memory.
        assert not job.checkpoint_dir.exists() or not any(job.checkpoint_dir.iterdir())
    finally:
        job.stop_all()


def test_a_zombie_s_snapshot_is_refused(cluster: ProcessCluster, tmp_path: Path) -> None:
    pause_file = tmp_path / "pause-before-registering"
    job = Job(
        cluster,
        tmp_path,
        "memory-zombie",
        "--min-nodes=3",
        "--max-nodes=4",
        "--fsdp",
        "--snapshot-every=1",
        "--checkpoint-every=0",
        "--step-sleep-s=0.02",
        f"--pause-snapshot-file={pause_file}",
    )
    hosts = {"a0": "host-a", "a1": "host-a", "b0": "host-b", "b1": "host-b"}
    try:
        for name, host in hosts.items():
            job.spawn(name, f"--host={host}")
        names = list(hosts)
        world_4_t = job.wait(lambda: job.training_at(names, 4, 0.0), START_S, "4 workers training")
        job.wait(
            lambda: (
                sum(len(w.select("snapshot_committed", world_4_t)) for w in job.workers.values())
                >= 3
            ),
            CHANGE_S,
            "3 snapshots registered at world 4",
        )
        pause_file.touch()
        zombie = job.wait(
            lambda: next((w for w in job.workers.values() if w.select("pausing")), None),
            CHANGE_S,
            "rank 0 pausing before it registers a snapshot",
        )
        (pausing,) = zombie.select("pausing")
        assert pausing["at"] == "snapshot"
        others = [n for n in names if n != zombie.name]
        back_t = job.wait(
            lambda: job.training_at(others, 3, pausing["t"]), CHANGE_S, "the others at world 3"
        )
        for name in others:
            formed = next(
                e
                for e in job.workers[name].select("formed_state", pausing["t"])
                if e["world_size"] == 3
            )
            assert formed["source"] == "memory", formed
            # The snapshot the zombie held back was protected but never registered.
            assert formed["step"] < pausing["step"], (formed, pausing)
        zombie.proc.send_signal(signal.SIGCONT)
        refused = job.wait(
            lambda: zombie.select("snapshot_refused", pausing["t"]),
            CHANGE_S,
            "the zombie's registration refused",
        )
        assert refused[0]["round"] == pausing["round"] and refused[0]["step"] == pausing["step"]
        print(f"zombie: {refused[0]['error']}")
        assert "StaleRound" in refused[0]["error"] or "StaleToken" in refused[0]["error"]
        committed = [
            (e["round"], e["step"])
            for w in job.workers.values()
            for e in w.select("snapshot_committed", pausing["t"])
        ]
        assert (pausing["round"], pausing["step"]) not in committed
        # The world goes on registering its own snapshots.
        job.wait(
            lambda: any(
                e["round"] > pausing["round"]
                for w in job.workers.values()
                for e in w.select("snapshot_committed", back_t)
            ),
            CHANGE_S,
            "a snapshot of the new world registered",
        )
    finally:
        job.stop_all()
