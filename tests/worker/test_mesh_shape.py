"""The mesh example's shape, without processes: a round's world size gives dp x tp and its
units (ranks [tp*k, tp*k + tp)), a world no mesh fits is refused in one line, and the
sampler gives both ranks of a unit the same batch while the units' batches tile the step."""

from __future__ import annotations

import pytest

from rallypoint.worker.mesh_train import (
    MeshSampler,
    MeshShapeError,
    mesh_shape,
    shape_settings,
)


def test_a_world_gives_dp_and_units_of_tp_ranks() -> None:
    shape = mesh_shape(8, 2)
    assert (shape.dp, shape.tp, shape.world_size) == (4, 2, 8)
    assert [shape.unit(rank) for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert shape.unit_ranks(2) == (4, 5)


@pytest.mark.parametrize("world_size", [1, 3, 5])
def test_a_world_no_mesh_fits_is_refused_in_one_line(world_size: int) -> None:
    with pytest.raises(MeshShapeError) as refused:
        mesh_shape(world_size, 2)
    message = str(refused.value)
    assert "\n" not in message
    assert f"a world of {world_size} ranks is not a multiple of tp=2" in message
    assert "unit_size=2" in message


def test_the_shape_is_declared_as_units_inside_hosts() -> None:
    assert shape_settings(2, "host-a") == {
        "host": "host-a",
        "unit_size": 2,
        "units_within_domains": True,
    }


def test_a_unit_s_ranks_train_on_the_same_batch_and_units_tile_the_step() -> None:
    samplers = []
    for rank in range(6):
        sampler = MeshSampler(2, num_samples=96, batch_size=4, rank=0, world_size=2)
        sampler.set_world(rank, 6)
        samplers.append(sampler)
    batches = [next(iter(sampler)) for sampler in samplers]
    for unit in range(3):
        assert batches[2 * unit] == batches[2 * unit + 1]
    step = [index for unit in range(3) for index in batches[2 * unit]]
    assert step == samplers[0].permutation()[:12]
    assert samplers[0].next_step_size() == 12  # dp=3 batches of 4
    with pytest.raises(MeshShapeError):
        samplers[0].set_world(0, 5)
