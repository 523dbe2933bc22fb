"""No rollback in the elastic loop when the state is replicated across units (issue 37), end
to end: real coordinator members and worker processes of the mesh example with
``--replicate-dp`` (rallypoint.worker.mesh_train: tensor parallel over "tp" inside a unit of
two ranks on one simulated host, replicated over "dp"; gloo on CPU), no memory snapshots and
no disk checkpoint.

Claim: at dp=3 x tp=2, one process SIGKILLed: its unit leaves, the two other units re-form
at dp=2 and restore from their own replicas (source ``replicas``) at the step the survivors
had trained to (none rolled back: the highest step any survivor counted), every rank of the
new world holding the same bits as its counterpart in the other replica (its pieces of the
model and optimizer state), and training goes on from there. Before this, the world restarted
from step 0 (nothing saved: ``fresh``), or from the last memory snapshot or disk checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster, running_cluster
from tests.worker.test_elastic import CHANGE_S, START_S
from tests.worker.test_mesh_elastic import MeshJob

REPLICA_WORKER = Path(__file__).with_name("replica_worker.py")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOSTS = {
    "a0": "host-a",
    "a1": "host-a",
    "b0": "host-b",
    "b1": "host-b",
    "c0": "host-c",
    "c1": "host-c",
}


class ReplicaJob(MeshJob):
    script = REPLICA_WORKER


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("replica-cluster"), size=1) as running:
        yield running


def test_a_killed_rank_costs_no_rollback_when_units_hold_replicas(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    job = ReplicaJob(
        cluster,
        tmp_path,
        "replica-shrink",
        "--tp=2",
        "--replicate-dp",
        "--min-nodes=2",
        "--max-nodes=6",
        "--snapshot-every=0",
        "--checkpoint-every=0",
        "--step-sleep-s=0.02",
    )
    try:
        for name, host in HOSTS.items():
            job.spawn(name, f"--host={host}")
        names = list(HOSTS)
        six_t = job.wait(lambda: job.training_at(names, 6, 0.0), START_S, "dp=3 x tp=2 training")
        job.wait(
            lambda: all(len(job.workers[n].select("step", six_t)) >= 3 for n in names),
            CHANGE_S,
            "3 steps at dp=3",
        )
        killed_t = time.time()
        job.workers["b1"].kill()
        survivors = ["a0", "a1", "c0", "c1"]
        back_t = job.wait(
            lambda: job.training_at(survivors, 4, killed_t), CHANGE_S, "dp=2 x tp=2 training"
        )
        formed = [job.workers[n].select("formed_state", killed_t)[0] for n in survivors]
        assert {e["source"] for e in formed} == {"replicas"}, formed
        # The step the survivors had trained to at world 6: none of it rolled back.
        trained = max(
            e["step"]
            for n in survivors
            for e in job.workers[n].select("step")
            if e["world_size"] == 6 and e["t"] < back_t
        )
        assert {e["step"] for e in formed} == {trained}, (formed, trained)
        # Both replicas (units a and c) hold the same bits at each tensor-parallel position,
        # optimizer state included.
        for position in (0, 1):
            digests = {e["digest"] for e in formed if e["position"] == position}
            assert len(digests) == 1, formed
        meshes = [job.workers[n].select("mesh_formed", killed_t)[0] for n in survivors]
        assert {(e["dp"], e["tp"]) for e in meshes} == {(2, 2)}, meshes
        job.wait(
            lambda: all(len(job.workers[n].select("step", back_t)) >= 3 for n in survivors),
            CHANGE_S,
            "3 steps at dp=2",
        )
        first = [
            next(e for e in job.workers[n].select("step", killed_t) if e["world_size"] == 4)
            for n in survivors
        ]
        assert {e["step"] for e in first} == {trained + 1}, (first, trained)
    finally:
        job.stop_all()
