"""The mesh example's model build (``mesh_train.mesh_builder``), run at every formation.

The build makes no collective: each rank shards the weights it made itself, and every rank
makes the same ones (``make_model`` seeds them), so a re-formation does not wait on a scatter
of values that its restore overwrites, and a fresh job's ranks still start from one model.
The first test counts collectives on torch's fake process group (one process, rank 0 of a
2 x 2 mesh); the second builds a fresh 2 x 2 world on gloo (four processes meeting through a
FileStore: no coordinator, no port) and compares every rank's full weights with the seeded
model's.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from rallypoint.worker import mesh_train
from rallypoint.worker.torch_compat import forget_previous_world

# One rank of a fresh 2 x 2 world: build as a formation does, then every parameter's full
# tensor (gathered from the ranks' shards) must be the seeded model's, on every rank.
FRESH_RANK = """
import sys
from datetime import timedelta
import torch
import torch.distributed as dist
from rallypoint.worker import mesh_train

rank, world, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group(
    "gloo", store=dist.FileStore(path, world), rank=rank, world_size=world,
    timeout=timedelta(seconds=60),
)
model, _ = mesh_train.mesh_builder(2, 60.0)()
reference = dict(mesh_train.make_model().named_parameters())
names = []
for name, parameter in model.named_parameters():
    full = parameter.full_tensor()
    assert torch.equal(full, reference[name].detach()), (rank, name)
    names.append(name)
assert sorted(names) == sorted(reference), (names, sorted(reference))
dist.destroy_process_group()
print("ok", rank)
"""


@pytest.fixture
def fake_world() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        # The fake backend keeps no timeouts; the build bounds its mesh groups' collectives.
        with mock.patch.object(dist.ProcessGroup, "set_timeout", lambda self, timeout: None):
            yield
    finally:
        dist.destroy_process_group()
        forget_previous_world()


@pytest.mark.usefixtures("fake_world")
def test_a_formation_s_model_build_makes_no_collective() -> None:
    forget_previous_world()  # as every formation does before the build
    with CommDebugMode() as comms:
        model, _ = mesh_train.mesh_builder(2, 10.0)()
    # Scattering the tensor-parallel weights from the tp group's rank 0 was three scatters
    # and a broadcast (the row-wise layer's replicated bias) per formation.
    assert comms.get_total_counts() == 0, dict(comms.get_comm_counts())
    assert len(list(model.parameters())) == 6


def test_a_fresh_job_s_ranks_start_from_the_same_seeded_weights(tmp_path: Path) -> None:
    world = 4
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", FRESH_RANK, str(rank), str(world), str(store)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outcomes = [rank.communicate(timeout=180) for rank in ranks]
    for rank, (process, (out, err)) in enumerate(zip(ranks, outcomes, strict=True)):
        assert process.returncode == 0, f"rank {rank}:\n{err[-3000:]}"
        assert out.split() == ["ok", str(rank)], out
