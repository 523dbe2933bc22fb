"""Properties of the elastic sampler: across any sequence of world sizes an epoch's samples are
consumed exactly once, every rank takes the same number of steps, and the order is the same in
every process."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from rallypoint.worker import ElasticSampler, epoch_permutation, rank_slice

# A world segment: (world size, global steps trained before the world changes again).
segments = st.lists(
    st.tuples(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=8)),
    min_size=1,
    max_size=6,
)


def epochs(test: Callable[[int, int, list[tuple[int, int]]], None]) -> Callable[[], None]:
    """Runs ``test`` over random dataset sizes, batch sizes and world-size sequences."""
    cases = given(
        num_samples=st.integers(min_value=0, max_value=150),
        batch_size=st.integers(min_value=1, max_value=7),
        world_sizes=segments,
    )
    wrapped: Callable[[], None] = settings(max_examples=200, deadline=None)(cases(test))
    return wrapped


def make(
    num_samples: int, batch_size: int, rank: int, world_size: int, **kw: bool
) -> ElasticSampler:
    return ElasticSampler(
        num_samples, batch_size=batch_size, rank=rank, world_size=world_size, seed=7, **kw
    )


def run_epoch(
    num_samples: int, batch_size: int, world_sizes: list[tuple[int, int]], drop_last: bool
) -> tuple[list[int], ElasticSampler]:
    """Train one epoch through the given world segments, each rank a fresh process restored
    from the last checkpoint; the last world runs to the end of the epoch. Returns every
    sample trained on, in training order, and the final checkpointed sampler."""
    checkpoint = make(num_samples, batch_size, 0, 1, drop_last=drop_last).state_dict()
    consumed: list[int] = []
    final_world = world_sizes[-1][0]
    for index, (world_size, steps) in enumerate([*world_sizes, (final_world, -1)]):
        ranks = []
        for rank in range(world_size):
            sampler = make(num_samples, batch_size, rank, world_size, drop_last=drop_last)
            sampler.load_state_dict(checkpoint)
            ranks.append(sampler)
        batches = [list(sampler) for sampler in ranks]
        # Collectives need every rank to take the same number of steps.
        assert {len(b) for b in batches} == {len(ranks[0])}
        taken = len(batches[0]) if steps < 0 else min(steps, len(batches[0]))
        for step in range(taken):
            for rank_batches in batches:
                consumed.extend(rank_batches[step])
            for sampler in ranks:
                sampler.advance()
        # Every rank checkpoints the same position; any one of them restores the next world.
        assert len({json.dumps(s.state_dict()) for s in ranks}) == 1
        checkpoint = ranks[index % world_size].state_dict()
    final = make(num_samples, batch_size, 0, final_world, drop_last=drop_last)
    final.load_state_dict(checkpoint)
    return consumed, final


@epochs
def test_an_epoch_consumes_the_permutation_exactly_once(
    num_samples: int, batch_size: int, world_sizes: list[tuple[int, int]]
) -> None:
    consumed, final = run_epoch(num_samples, batch_size, world_sizes, drop_last=False)
    assert consumed == epoch_permutation(num_samples, seed=7, epoch=0)
    assert final.position == num_samples and final.epoch_done()


@epochs
def test_drop_last_consumes_a_prefix_once_in_full_batches(
    num_samples: int, batch_size: int, world_sizes: list[tuple[int, int]]
) -> None:
    consumed, final = run_epoch(num_samples, batch_size, world_sizes, drop_last=True)
    assert consumed == epoch_permutation(num_samples, seed=7, epoch=0)[: len(consumed)]
    # Only less than one full step of the last world is left over.
    assert num_samples - len(consumed) < final.world_size * batch_size
    assert final.position == len(consumed) and final.epoch_done()


def test_four_three_four_mid_epoch() -> None:
    consumed, _ = run_epoch(100, 4, [(4, 2), (3, 3), (4, 1)], drop_last=False)
    assert consumed == epoch_permutation(100, seed=7, epoch=0)


@given(step_size=st.integers(min_value=0, max_value=100), world_size=st.integers(1, 9))
def test_tail_split_is_even_and_contiguous(step_size: int, world_size: int) -> None:
    slices = [rank_slice(step_size, rank, world_size) for rank in range(world_size)]
    assert slices[0][0] == 0 and slices[-1][1] == step_size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    sizes = [end - begin for begin, end in slices]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_tail_with_fewer_samples_than_ranks_gives_empty_batches() -> None:
    batches = [list(make(10, 4, rank, 4)) for rank in range(4)]
    # 10 samples, 4 ranks of 4: one step of... 10 < 16, so a single tail step of 3,3,2,2.
    assert [len(b) for b in batches] == [1, 1, 1, 1]
    assert [len(b[0]) for b in batches] == [3, 3, 2, 2]
    tiny = [list(make(2, 4, rank, 4)) for rank in range(4)]
    assert [b[0] for b in tiny][2:] == [[], []]


def test_iteration_does_not_move_the_position_and_advance_does() -> None:
    sampler = make(20, 3, 1, 2)
    first = list(sampler)
    assert list(sampler) == first and sampler.position == 0
    assert sampler.advance() == 6
    assert list(sampler) == first[1:]
    assert sampler.advance(3) == 20
    with pytest.raises(RuntimeError, match="past the end"):
        sampler.advance()


def test_set_epoch_keeps_a_resumed_position_and_resets_on_a_new_epoch() -> None:
    sampler = make(50, 5, 0, 2)
    sampler.set_epoch(3)
    sampler.advance(2)
    resumed = make(50, 5, 0, 3)
    resumed.load_state_dict(sampler.state_dict())
    resumed.set_epoch(3)
    assert (resumed.epoch, resumed.position) == (3, 20)
    resumed.set_epoch(4)
    assert (resumed.epoch, resumed.position) == (4, 0)
    assert resumed.permutation() == epoch_permutation(50, seed=7, epoch=4)
    assert resumed.permutation() != epoch_permutation(50, seed=7, epoch=3)


def test_state_for_another_dataset_is_refused() -> None:
    state = make(50, 5, 0, 2).state_dict()
    with pytest.raises(ValueError, match="num_samples"):
        make(51, 5, 0, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="rank 3"):
        make(50, 5, 3, 3)


def test_works_as_a_dataloader_batch_sampler() -> None:
    dataset = list(range(100, 130))
    sampler = make(30, 4, 1, 3)
    loader = DataLoader(dataset, batch_sampler=sampler)
    batches = [batch.tolist() for batch in loader]
    assert len(batches) == len(sampler) == 3
    order = sampler.permutation()
    assert batches[0] == [100 + i for i in order[4:8]]
    # The tail step has 6 samples: two per rank.
    assert batches[2] == [100 + i for i in order[24 + 2 : 24 + 4]]


def test_permutation_is_the_same_in_another_process() -> None:
    code = (
        "import json; from rallypoint.worker import epoch_permutation; "
        "print(json.dumps(epoch_permutation(1000, seed=11, epoch=5)))"
    )
    other = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(other.stdout) == epoch_permutation(1000, seed=11, epoch=5)
