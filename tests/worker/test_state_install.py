"""``state_io.install``: a model state that DCP loaded in place (into the tensors
``state_io.targets`` handed it: the model's own) is not loaded into the model again; one
made of other tensors (a broadcast's, a test's) is. Either way the model ends up holding the
loaded values, and the optimizer's state and hyperparameters and the progress are installed.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch

from rallypoint.worker.sampler import ElasticSampler
from rallypoint.worker.state_io import MODEL_KEY, PROGRESS_KEY, install, pack_progress, targets


def _made() -> tuple[torch.nn.Module, torch.optim.Optimizer, ElasticSampler]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    sampler = ElasticSampler(num_samples=16, batch_size=2, rank=0, world_size=1)
    return model, optimizer, sampler


def _loaded(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What a restore hands ``install``: the targets, their values loaded, a new lr."""
    state = targets(model, optimizer, None)
    state[PROGRESS_KEY] = pack_progress(7, None, {"extra": 1})
    state["optimizer"]["param_groups"][0]["lr"] = 0.5
    return state


def test_a_model_state_loaded_in_place_is_not_loaded_again() -> None:
    model, optimizer, _ = _made()
    state = _loaded(model, optimizer)
    with torch.no_grad():
        for tensor in state[MODEL_KEY].values():
            tensor.fill_(3.0)  # as DCP reads into them
    with mock.patch.object(model, "load_state_dict", wraps=model.load_state_dict) as loads:
        step, extra = install(model, optimizer, state, None)
    assert loads.call_count == 0
    assert (step, extra) == (7, {"extra": 1})
    assert all(bool((p == 3.0).all()) for p in model.parameters())
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_a_model_state_of_other_tensors_is_loaded() -> None:
    model, optimizer, _ = _made()
    state = _loaded(model, optimizer)
    state[MODEL_KEY] = {key: torch.full_like(t, 2.0) for key, t in state[MODEL_KEY].items()}
    with mock.patch.object(model, "load_state_dict", wraps=model.load_state_dict) as loads:
        install(model, optimizer, state, None)
    assert loads.call_count == 1
    assert all(bool((p == 2.0).all()) for p in model.parameters())
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_a_model_state_with_one_other_tensor_is_loaded_whole() -> None:
    model, optimizer, _ = _made()
    state = _loaded(model, optimizer)
    first = next(iter(state[MODEL_KEY]))
    state[MODEL_KEY][first] = torch.full_like(state[MODEL_KEY][first], 5.0)
    with mock.patch.object(model, "load_state_dict", wraps=model.load_state_dict) as loads:
        install(model, optimizer, state, None)
    assert loads.call_count == 1
    assert bool((model.state_dict()[first] == 5.0).all())
