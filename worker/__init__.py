"""Training-side integration: elastic data sampling and DCP checkpoints.

Depends on ``rallypoint.client`` and torch.

The names below load their module on first use. torchrun imports
``rallypoint.worker.torchrun`` (its rendezvous backend) while torch itself is still importing
``torch.distributed.checkpoint``; loading the checkpoint module eagerly from here would import
that half-initialised module and fail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import module_getattr

if TYPE_CHECKING:
    from .checkpoint import (
        Checkpointer,
        CheckpointError,
        CheckpointLayout,
        CheckpointMetadata,
        ParamLayout,
        PendingCheckpoint,
        Placement,
        RestoreResult,
        SavedCheckpoint,
        broadcast_state,
        checkpoint_path,
        delete_checkpoints,
        describe_layout,
        read_metadata,
        restore_checkpoint,
        restore_state,
        retired_beyond,
    )
    from .elastic import (
        ElasticConfig,
        ElasticRound,
        ElasticRun,
        Formation,
        JoinTimeoutError,
        TrainState,
        elastic_training,
    )
    from .errors import WorkerError
    from .patience import CoordinatorUnreachableError
    from .restore_choice import (
        PeerState,
        RestoreDecision,
        RestorePolicy,
        RestoreSource,
        choose_restore_source,
    )
    from .sampler import ElasticSampler, GlobalStep, epoch_permutation, global_step_size, rank_slice
    from .snapshots import (
        MemorySnapshots,
        PendingSnapshot,
        RegisteredSnapshot,
        SnapshotError,
        SnapshotId,
        SnapshotPlacement,
        SnapshotServer,
        SnapshotTaken,
        erasure_protectors,
        protectors,
    )
    from .store import (
        CoordinatorStore,
        CoordinatorStoreError,
        StaleStoreRoundError,
        StoreTimeoutError,
    )

# Exported name -> the submodule that defines it.
_EXPORTS: dict[str, str] = {
    "CheckpointError": "checkpoint",
    "CheckpointLayout": "checkpoint",
    "CheckpointMetadata": "checkpoint",
    "Checkpointer": "checkpoint",
    "CoordinatorStore": "store",
    "CoordinatorStoreError": "store",
    "CoordinatorUnreachableError": "patience",
    "ElasticConfig": "elastic",
    "ElasticRound": "elastic",
    "ElasticRun": "elastic",
    "ElasticSampler": "sampler",
    "Formation": "elastic",
    "GlobalStep": "sampler",
    "JoinTimeoutError": "elastic",
    "MemorySnapshots": "snapshots",
    "ParamLayout": "checkpoint",
    "PeerState": "restore_choice",
    "PendingCheckpoint": "checkpoint",
    "PendingSnapshot": "snapshots",
    "Placement": "checkpoint",
    "RegisteredSnapshot": "snapshots",
    "RestoreDecision": "restore_choice",
    "RestorePolicy": "restore_choice",
    "RestoreResult": "checkpoint",
    "RestoreSource": "restore_choice",
    "SavedCheckpoint": "checkpoint",
    "SnapshotError": "snapshots",
    "SnapshotId": "snapshots",
    "SnapshotPlacement": "snapshots",
    "SnapshotServer": "snapshots",
    "SnapshotTaken": "snapshots",
    "StaleStoreRoundError": "store",
    "StoreTimeoutError": "store",
    "TrainState": "elastic",
    "WorkerError": "errors",
    "broadcast_state": "checkpoint",
    "checkpoint_path": "checkpoint",
    "choose_restore_source": "restore_choice",
    "delete_checkpoints": "checkpoint",
    "describe_layout": "checkpoint",
    "elastic_training": "elastic",
    "epoch_permutation": "sampler",
    "erasure_protectors": "snapshots",
    "global_step_size": "sampler",
    "protectors": "snapshots",
    "rank_slice": "sampler",
    "read_metadata": "checkpoint",
    "restore_checkpoint": "checkpoint",
    "restore_state": "checkpoint",
    "retired_beyond": "checkpoint",
}


__getattr__ = module_getattr(__name__, _EXPORTS, globals())


__all__ = [
    "CheckpointError",
    "CheckpointLayout",
    "CheckpointMetadata",
    "Checkpointer",
    "CoordinatorStore",
    "CoordinatorStoreError",
    "CoordinatorUnreachableError",
    "ElasticConfig",
    "ElasticRound",
    "ElasticRun",
    "ElasticSampler",
    "Formation",
    "GlobalStep",
    "JoinTimeoutError",
    "MemorySnapshots",
    "ParamLayout",
    "PeerState",
    "PendingCheckpoint",
    "PendingSnapshot",
    "Placement",
    "RegisteredSnapshot",
    "RestoreDecision",
    "RestorePolicy",
    "RestoreResult",
    "RestoreSource",
    "SavedCheckpoint",
    "SnapshotError",
    "SnapshotId",
    "SnapshotPlacement",
    "SnapshotServer",
    "SnapshotTaken",
    "StaleStoreRoundError",
    "StoreTimeoutError",
    "TrainState",
    "WorkerError",
    "broadcast_state",
    "checkpoint_path",
    "choose_restore_source",
    "delete_checkpoints",
    "describe_layout",
    "elastic_training",
    "epoch_permutation",
    "erasure_protectors",
    "global_step_size",
    "protectors",
    "rank_slice",
    "read_metadata",
    "restore_checkpoint",
    "restore_state",
    "retired_beyond",
]
