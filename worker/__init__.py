"""Training-side integration: elastic data sampling and DCP checkpoints.

Depends on ``rallypoint.client`` and torch.
"""

from .sampler import ElasticSampler, GlobalStep, epoch_permutation, global_step_size, rank_slice

__all__ = [
    "ElasticSampler",
    "GlobalStep",
    "epoch_permutation",
    "global_step_size",
    "rank_slice",
]
