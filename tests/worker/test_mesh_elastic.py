"""A 2-D DeviceMesh job (dp x tp, tp = 2) in the elastic loop, end to end: real coordinator
members and worker processes of the mesh example (rallypoint.worker.mesh_train: FSDP2 over
"dp", DTensor tensor parallel over "tp", gloo on CPU), each pair of workers one simulated
host (a failure domain), the job's unit two ranks.

Claims:
- dp shrink: at dp=2 x tp=2, one process SIGKILLed: its unit's survivor leaves the world
  with it, the other unit re-forms at dp=1 with tp intact (ranks 0 and 1 on one host), its
  state restored resharded from the peers' memory (the lost unit's shards from their copies
  on the other host), the same on both ranks, at the newest registered snapshot's step, and
  training goes on;
- spare host: the same job with a third host waiting; one process SIGKILLed: the next round
  takes the spare host's unit in place of the broken one, dp stays 2, every unit lives on
  one host, and training goes on at world 4 with the state restored from memory;
- host loss: then both processes of the spare host SIGKILLed at once: exactly one round
  ends, and host-a's unit re-forms at dp=1, restored from memory;
- in every round, the collectives of a step on the mesh's "dp" and "tp" groups are bounded
  as the default group's are (the hang verdict): a tensor-parallel collective cannot be
  given up on gloo, and a rank left in one by its partner (whose own collective failed on
  the lost peer) would otherwise wait out the whole collective timeout;
- a rank that leaves a round closes its "tp" group at once (its partner, if waiting in a
  tensor-parallel collective on it, then fails at once instead of at the step bound).

Both need the job's shape (unit_size, domains): on a rendezvous without units the first
re-forms at an odd world size, which no 2-D mesh fits, and the second pairs a survivor with a
spare of another host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import ProcessCluster, running_cluster
from tests.worker.test_elastic import CHANGE_S, START_S, Job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MESH_WORKER = Path(__file__).with_name("mesh_worker.py")
HOSTS = {"a0": "host-a", "a1": "host-a", "b0": "host-b", "b1": "host-b"}
SPARES = {"c0": "host-c", "c1": "host-c"}


class MeshJob(Job):
    script = MESH_WORKER

    def mesh_at(self, names: list[str], world_size: int, after_t: float) -> list[dict[str, Any]]:
        """Each named worker's first ``mesh_formed`` at ``world_size`` after ``after_t``."""
        formed = []
        for name in names:
            events = [
                e
                for e in self.workers[name].select("mesh_formed", after_t)
                if e["world_size"] == world_size
            ]
            if events:
                formed.append(events[0])
        return formed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    # One member: these tests are about the workers, and a 2-core machine runs them.
    with running_cluster(tmp_path_factory.mktemp("mesh-cluster"), size=1) as running:
        yield running


def start_mesh_job(cluster: ProcessCluster, tmp_path: Path, job_id: str) -> MeshJob:
    """dp=2 x tp=2 on hosts a and b, training with a snapshot registered at world 4."""
    job = MeshJob(
        cluster,
        tmp_path,
        job_id,
        "--tp=2",
        "--min-nodes=2",
        "--max-nodes=4",
        "--snapshot-every=1",
        "--checkpoint-every=0",
        "--step-sleep-s=0.02",
    )
    for name, host in HOSTS.items():
        job.spawn(name, f"--host={host}")
    names = list(HOSTS)
    four_t = job.wait(lambda: job.training_at(names, 4, 0.0), START_S, "dp=2 x tp=2 training")
    job.wait(
        lambda: sum(len(w.select("snapshot_committed", four_t)) for w in job.workers.values()) >= 2,
        CHANGE_S,
        "2 snapshots registered at world 4",
    )
    return job


def assert_units_on_hosts(formed: list[dict[str, Any]], tp: int) -> None:
    """Every rank's unit is ranks [tp*k, tp*k + tp), and a unit's ranks share a host."""
    hosts_of_unit: dict[int, set[str]] = {}
    for event in formed:
        assert event["tp"] == tp, event
        unit = event["rank"] // tp
        assert event["unit"] == unit and event["unit_ranks"] == [
            unit * tp + i for i in range(tp)
        ], event
        hosts_of_unit.setdefault(unit, set()).add(event["host"])
    assert all(len(hosts) == 1 for hosts in hosts_of_unit.values()), hosts_of_unit


def assert_steps_bounded(job: MeshJob, names: list[str], after_t: float) -> None:
    """Each named worker's rounds since ``after_t`` bounded the mesh's groups as the default
    group (``step_bounds``: the timeouts a step left them with)."""
    for name in names:
        bounds = job.wait(
            lambda name=name: job.workers[name].select("step_bounds", after_t),  # type: ignore[misc]
            CHANGE_S,
            f"{name}'s step bounds",
        )
        for bound in bounds:
            assert bound["dp_s"] == bound["tp_s"] == bound["world_s"], bound


def registered_before(job: MeshJob, t: float) -> int:
    return max(
        e["step"]
        for w in job.workers.values()
        for e in w.select("snapshot_committed")
        if e["t"] <= t
    )


def test_a_killed_rank_shrinks_dp_and_keeps_tp(cluster: ProcessCluster, tmp_path: Path) -> None:
    job = start_mesh_job(cluster, tmp_path, "mesh-shrink")
    try:
        killed_t = time.time()
        job.workers["b1"].kill()
        registered = registered_before(job, killed_t)
        survivors = ["a0", "a1"]
        back_t = job.wait(
            lambda: job.training_at(survivors, 2, killed_t), CHANGE_S, "dp=1 x tp=2 training"
        )
        print(f"SIGKILL b1 -> dp=1 x tp=2 training: {back_t - killed_t:.3f} s")
        formed = job.mesh_at(survivors, 2, killed_t)
        assert [(e["dp"], e["tp"]) for e in formed] == [(1, 2), (1, 2)], formed
        assert sorted(e["rank"] for e in formed) == [0, 1]
        assert_units_on_hosts(formed, 2)
        states = [job.workers[n].select("formed_state", killed_t)[0] for n in survivors]
        assert {s["source"] for s in states} == {"memory"}, states
        assert len({s["digest"] for s in states}) == 1, states
        assert registered <= states[0]["step"], (states, registered)
        # The broken unit's survivor waits: it is in no world of its own.
        assert not [e for e in job.workers["b0"].select("mesh_formed", killed_t)], "b0 formed"
        job.wait(
            lambda: len(job.workers["a0"].select("step", back_t)) >= 5,
            CHANGE_S,
            "5 steps at dp=1",
        )
        assert_steps_bounded(job, survivors, 0.0)
        left = [e for n in survivors for e in job.workers[n].select("left_round", killed_t)]
        assert left and not any(e["tp_alive"] for e in left), left
        assert job.workers["b0"].proc.poll() is None, job.workers["b0"].stderr_tail()
    finally:
        job.stop_all()


def test_a_spare_host_keeps_dp_and_a_lost_host_ends_one_round(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    job = start_mesh_job(cluster, tmp_path, "mesh-spare")
    try:
        for name, host in SPARES.items():
            job.spawn(name, f"--host={host}")
        job.wait(
            lambda: all(job.workers[n].select("joined") for n in SPARES),
            START_S,
            "the spare host's workers joined",
        )
        killed_t = time.time()
        job.workers["b1"].kill()
        registered = registered_before(job, killed_t)
        world = ["a0", "a1", "c0", "c1"]
        back_t = job.wait(
            lambda: job.training_at(world, 4, killed_t), CHANGE_S, "dp=2 x tp=2 with the spare"
        )
        print(f"SIGKILL b1 -> the spare host in, dp=2 x tp=2 training: {back_t - killed_t:.3f} s")
        formed = job.mesh_at(world, 4, killed_t)
        assert {(e["dp"], e["tp"]) for e in formed} == {(2, 2)}, formed
        assert sorted(e["rank"] for e in formed) == [0, 1, 2, 3]
        assert_units_on_hosts(formed, 2)
        states = [job.workers[n].select("formed_state", killed_t)[0] for n in world]
        assert {s["source"] for s in states} == {"memory"}, states
        assert len({s["digest"] for s in states}) == 1, states
        assert registered <= states[0]["step"], (states, registered)
        job.wait(
            lambda: len(job.workers["c0"].select("step", back_t)) >= 5,
            CHANGE_S,
            "5 steps with the spare host",
        )
        assert_steps_bounded(job, world, killed_t)

        # Then the spare host is lost, both processes at once: one round ends, and host-a's
        # unit goes on at dp=1 (b0 still waits: alone it is no unit).
        job.wait(
            lambda: (
                sum(len(job.workers[n].select("snapshot_committed", back_t)) for n in world) >= 2
            ),
            CHANGE_S,
            "2 snapshots registered with the spare host",
        )
        killed_t = time.time()
        for name in SPARES:
            job.workers[name].kill()
        survivors = ["a0", "a1"]
        back_t = job.wait(
            lambda: job.training_at(survivors, 2, killed_t), CHANGE_S, "dp=1 x tp=2 training"
        )
        print(f"SIGKILL host-c -> dp=1 x tp=2 training: {back_t - killed_t:.3f} s")
        formed = job.mesh_at(survivors, 2, killed_t)
        assert [(e["dp"], e["tp"]) for e in formed] == [(1, 2), (1, 2)], formed
        assert_units_on_hosts(formed, 2)
        ended = {
            e["round"] for n in survivors for e in job.workers[n].select("round_ended", killed_t)
        }
        assert len(ended) == 1, f"the host loss ended rounds {sorted(ended)}"
        states = [job.workers[n].select("formed_state", killed_t)[0] for n in survivors]
        assert {s["source"] for s in states} == {"memory"}, states
        assert len({s["digest"] for s in states}) == 1, states
    finally:
        job.stop_all()
