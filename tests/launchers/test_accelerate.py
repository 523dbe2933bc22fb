"""Hugging Face Accelerate: ``accelerate launch --multi_gpu --num_machines 2 --rdzv_backend
rallypoint --max_restarts 3`` with a plain loop wrapped by ``Accelerator`` (CPU, gloo), one
``accelerate launch`` per simulated node. accelerate has no ``--rdzv_endpoint``: it hands
torchrun ``f"{--main_process_ip}:{--main_process_port}"``, so the members go in those two
(launchers.accelerate_address), and torchrun's options it has no flag for (``--rdzv-id``,
``--local-addr``) come from torchrun's PET_* variables. Machine rank 0 refuses a
``--main_process_port`` that something answers on localhost, so the members serve clients on
127.0.0.2 here, as on another host (docs/launchers/accelerate.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster

from .harness import real_job, record
from .launchers import Target, accelerate_address, check_recovered, run_kill_trial


def test_the_members_reach_torchrun_through_accelerates_ip_and_port() -> None:
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    endpoints = ["coord1:2379", "coord2:2379", "coord3:2379"]
    ip, port = accelerate_address(Target("rallypoint", endpoints))
    args = launch_command_parser().parse_args(
        [
            "--multi_gpu",
            "--num_machines=2",
            "--num_processes=4",
            "--machine_rank=1",  # rank 0 also probes localhost for the port
            f"--main_process_ip={ip}",
            f"--main_process_port={port}",
            "--rdzv_backend=rallypoint",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            "train.py",
        ]
    )
    prepare_multi_gpu_env(args)
    assert args.rdzv_endpoint == ",".join(endpoints)
    assert args.rdzv_backend == "rallypoint"


@pytest.mark.launchers
@pytest.mark.timeout(900)
@real_job
def test_accelerate_launch_recovers_a_killed_worker(
    remote_cluster: ProcessCluster, tmp_path: Path
) -> None:
    target = Target("rallypoint", remote_cluster.endpoints)
    outcome = run_kill_trial("accelerate", target, "accelerate", tmp_path)
    record("accelerate", "rallypoint", outcome.recovery)
    check_recovered(outcome, nodes=2)
