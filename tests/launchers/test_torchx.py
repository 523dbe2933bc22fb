"""TorchX: ``torchx run --scheduler=local_cwd dist.ddp -j 2x2 --rdzv_backend rallypoint
--rdzv_port PORT``. The local scheduler starts both replicas (nodes) on this host; dist.ddp
points torchrun at ``$TORCHX_RANK0_HOST:rdzv_port`` (localhost here) and passes no
--max-restarts, so the run sets ``PET_MAX_RESTARTS`` through ``--env`` (torchrun reads its
options' defaults from PET_* variables). torchx accepts any backend name: it only formats it
into the command (docs/launchers/torchx.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster

from .harness import real_job, record
from .launchers import Target, check_recovered, run_kill_trial


def test_dist_ddp_hands_torchrun_the_backend_and_the_port() -> None:
    from torchx.components.dist import ddp

    app = ddp(script="train.py", j="2x2", rdzv_backend="rallypoint", rdzv_port=2379)
    (role,) = app.roles
    command = role.args[1]
    assert "--rdzv_backend rallypoint" in command
    assert "--rdzv_endpoint $${${rank0_env}:=localhost}:2379" in command  # rank 0's host
    assert "--max_restarts" not in command  # hence PET_MAX_RESTARTS
    assert role.num_replicas == 2


@pytest.mark.launchers
@pytest.mark.timeout(900)
@real_job
def test_torchx_dist_ddp_recovers_a_killed_worker(cluster: ProcessCluster, tmp_path: Path) -> None:
    # dist.ddp dials localhost:PORT: one member's address (the client finds the leader).
    target = Target("rallypoint", cluster.endpoints[:1])
    outcome = run_kill_trial("torchx", target, "torchx", tmp_path)
    record("torchx", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=1)
    # torchx's own report of the app: it succeeded.
    assert "SUCCEEDED" in outcome.job.all_logs()


def test_the_component_points_torchrun_at_the_members() -> None:
    import importlib.util

    from .launchers import TORCHX_COMPONENT

    spec = importlib.util.spec_from_file_location("rallypoint_ddp", TORCHX_COMPONENT)
    assert spec is not None and spec.loader is not None
    component = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(component)
    for j, nodes in (("2x2", "2"), ("1:4x8", "1:4"), ("1x2", "1")):
        app = component.ddp(script="train.py", endpoints="c1:2379,c2:2379,c3:2379", j=j)
        (role,) = app.roles
        command = role.args[1]
        assert "--rdzv_backend rallypoint --rdzv_endpoint c1:2379,c2:2379,c3:2379" in command
        assert "--max_restarts 3" in command
        assert f"--nnodes {nodes} " in command
    with pytest.raises(ValueError, match="host:port"):
        component.ddp(script="train.py", endpoints="c1")


@pytest.mark.launchers
@pytest.mark.timeout(900)
@real_job
def test_torchx_component_recovers_a_killed_worker(cluster: ProcessCluster, tmp_path: Path) -> None:
    target = Target("rallypoint", cluster.endpoints)
    outcome = run_kill_trial("torchx-component", target, "torchx", tmp_path)
    record("torchx-component", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=1)
    assert "SUCCEEDED" in outcome.job.all_logs()
