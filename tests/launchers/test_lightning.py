"""PyTorch Lightning under ``torchrun --rdzv-backend=rallypoint``: a ``LightningModule`` with
``Trainer(strategy="ddp")`` and the same model with Fabric, each a 2-node x 2-process job
(two torchrun agents, ``--local-addr`` node-a and node-b). A SIGKILLed worker costs one new
round at full size; Lightning resumes from its last checkpoint, the loss ends below where it
started and both agents exit 0. Lightning takes torchrun's environment as it is
(TorchElasticEnvironment): nothing Lightning-specific is needed on our side.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster

from .harness import real_job, record
from .launchers import Target, check_recovered, run_kill_trial

pytestmark = [pytest.mark.launchers, pytest.mark.timeout(900), real_job]


def test_trainer_ddp_recovers_a_killed_worker(cluster: ProcessCluster, tmp_path: Path) -> None:
    outcome = run_kill_trial(
        "lightning-trainer", Target("rallypoint", cluster.endpoints), "lightning-trainer", tmp_path
    )
    record("lightning-trainer", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=2)


def test_fabric_ddp_recovers_a_killed_worker(cluster: ProcessCluster, tmp_path: Path) -> None:
    outcome = run_kill_trial(
        "lightning-fabric", Target("rallypoint", cluster.endpoints), "lightning-fabric", tmp_path
    )
    record("lightning-fabric", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=2)
