"""Slurm: deploy/slurm/rallypoint-torchrun.sbatch under a small fake ``srun`` (fake_slurm/srun:
one local process per node of the allocation, with the variables srun sets per task).

- Fast: the script's command lines, with ``TORCHRUN`` a recorder, are one agent per node, each
  named after its node, and parse with torchrun's own parser and the backend's settings.
- Real (make test-launchers): the same script runs a 2-node x 2-process job against a cluster;
  a SIGKILLed worker costs one new round, training goes on from the last checkpoint, and the
  script (srun, both agents) exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster

from .harness import NODE_NAMES, real_job, record
from .launchers import SBATCH, Target, check_recovered, run_kill_trial, slurm_environment

RECORDER = """#!{python}
import json, os, sys
with open(os.path.join({out!r}, "argv-" + os.environ["SLURM_PROCID"] + ".json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "node": os.environ["SLURMD_NODENAME"]}}, f)
"""


def test_sbatch_starts_one_agent_per_node_with_the_members(tmp_path: Path) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.run import config_from_args, get_args_parser

    from rallypoint.worker.torchrun import BACKEND, RendezvousSettings

    recorder = tmp_path / "torchrun"
    recorder.write_text(RECORDER.format(python=sys.executable, out=str(tmp_path)))
    recorder.chmod(0o755)
    endpoints = ["coord1:2379", "coord2:2379", "coord3:2379"]
    env = {
        **slurm_environment(Target("rallypoint", endpoints), "slurm-4242"),
        "TORCHRUN": str(recorder),
        "RDZV_CONF": "token=secret,domain=rack1",
    }
    del env["RDZV_ID"]  # the default: slurm-$SLURM_JOB_ID
    done = subprocess.run(
        ["bash", str(SBATCH), "train.py", "--epochs", "2"],
        env={**env, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    calls = [json.loads((tmp_path / f"argv-{i}.json").read_text()) for i in range(2)]
    assert [c["node"] for c in calls] == list(NODE_NAMES)
    for call in calls:
        config, _, command_args = config_from_args(get_args_parser().parse_args(call["argv"]))
        assert command_args[-3:] == ["train.py", "--epochs", "2"]
        assert config.rdzv_backend == BACKEND
        assert config.rdzv_endpoint == ",".join(endpoints)
        assert config.run_id == "slurm-4242"
        assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 2)
        assert config.max_restarts == 3
        assert config.local_addr == call["node"]
        settings = RendezvousSettings.from_parameters(
            RendezvousParameters(
                backend=config.rdzv_backend,
                endpoint=config.rdzv_endpoint,
                run_id=config.run_id,
                min_nodes=config.min_nodes,
                max_nodes=config.max_nodes,
                local_addr=config.local_addr,
                **config.rdzv_configs,
            )
        )
        assert list(settings.endpoints) == endpoints
        assert settings.node_name == call["node"]
        assert settings.failure_domain == "rack1"
        assert settings.token == "secret"


def test_sbatch_refuses_to_run_without_the_members(tmp_path: Path) -> None:
    env = slurm_environment(Target("rallypoint", ["coord1:2379"]), "slurm-1")
    del env["RALLYPOINT_ENDPOINTS"]
    done = subprocess.run(
        ["bash", str(SBATCH), "train.py"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "RALLYPOINT_ENDPOINTS" in done.stderr.strip().splitlines()[-1]


@pytest.mark.launchers
@pytest.mark.timeout(600)
@real_job
def test_slurm_job_recovers_a_killed_worker(cluster: ProcessCluster, tmp_path: Path) -> None:
    outcome = run_kill_trial(
        "slurm", Target("rallypoint", cluster.endpoints), "slurm-1001", tmp_path
    )
    record("slurm", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=1)
