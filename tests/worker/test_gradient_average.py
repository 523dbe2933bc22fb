"""``ElasticRound.all_reduce_gradients``: one flat all-reduce, averaged gradients installed as
views of the reduced buffer (no second copy of every gradient per step), the vote read off.

The method is run on a stand-in for the round that provides what it uses (the all-reduce
multiplies by the world size, as a sum over identical ranks would), so the test needs no
process group.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rallypoint.worker.elastic import ElasticRound


def stand_in(world_size: int, vote: int = 0) -> SimpleNamespace:
    def all_reduce(tensor: torch.Tensor) -> bool:
        tensor *= world_size  # every rank sent the same gradients and votes
        return True

    return SimpleNamespace(
        world_size=world_size,
        all_reduce=all_reduce,
        _stop_flag=lambda: vote,
        _step_reduced=None,
        _stop_agreed=False,
    )


def model_with_grads() -> torch.nn.Module:
    torch.manual_seed(56)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model(torch.randn(5, 8)).sum().backward()
    return model


def test_averaged_gradients_are_views_of_one_reduced_buffer_not_copies() -> None:
    model = model_with_grads()
    expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    round_ = stand_in(world_size=4)

    assert ElasticRound.all_reduce_gradients(round_, model) is True  # type: ignore[arg-type]

    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    # The average of four identical ranks is the rank's own gradient, bit for bit.
    for got, want in zip(grads, expected, strict=True):
        assert got is not None and torch.equal(got, want)
        assert got.shape == want.shape and got.is_contiguous()
    storages = {g.untyped_storage().data_ptr() for g in grads if g is not None}
    assert len(storages) == 1, "each gradient was copied out of the reduced buffer"
    assert round_._step_reduced is True and round_._stop_agreed is False


def test_a_gradient_changed_in_place_changes_only_its_own_slice() -> None:
    model = model_with_grads()
    ElasticRound.all_reduce_gradients(stand_in(world_size=2), model)  # type: ignore[arg-type]
    first, second = (p.grad for p in list(model.parameters())[:2])
    assert first is not None and second is not None
    before = second.clone()
    first.mul_(0.0)  # clipping or scaling in place, as clip_grad_norm_ does
    assert torch.equal(second, before)
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_the_vote_is_read_off_the_buffer() -> None:
    model = model_with_grads()
    round_ = stand_in(world_size=3, vote=1)
    assert ElasticRound.all_reduce_gradients(round_, model) is True  # type: ignore[arg-type]
    assert round_._stop_agreed is True
    total = sum(p.numel() for p in model.parameters())
    assert sum(p.grad.numel() for p in model.parameters()) == total  # type: ignore[union-attr]
