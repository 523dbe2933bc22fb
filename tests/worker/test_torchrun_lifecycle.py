"""A torchrun job ends with the agents' exit status: finished when their workers succeeded,
failed (saying how) when an agent's workers failed past ``--max-restarts``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from rallypoint.client import JobState, LeaveOutcome, RoundInfo, SyncClient
from rallypoint.worker.torchrun import _agent_outcome
from tests.integration.harness import (
    ProcessCluster,
    kill_processes_mentioning,
    running_cluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SCRIPT = Path(__file__).with_name("torchrun_script.py")


def test_the_agents_exit_status_is_its_outcome(tmp_path: Path) -> None:
    assert _agent_outcome("node-a", None) == (
        LeaveOutcome.FINISHED,
        "torchrun agent node-a: the workers succeeded",
    )
    failure = ProcessFailure(local_rank=0, pid=123, exitcode=3, error_file=str(tmp_path / "e"))
    outcome, detail = _agent_outcome("node-a", ChildFailedError("train.py", {0: failure}))
    assert (outcome, detail) == (
        LeaveOutcome.FAILED,
        "torchrun agent node-a: 1 worker(s) failed (exit code 3)",
    )
    outcome, detail = _agent_outcome("node-b", TimeoutError("no round within 900 s\nmore"))
    assert (outcome, detail) == (
        LeaveOutcome.FAILED,
        "torchrun agent node-b: TimeoutError: no round within 900 s",
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("torchrun-lifecycle"), 1) as running:
        yield running


def torchrun(cluster: ProcessCluster, job: str, script: list[str], out: Path) -> int:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "--rdzv-backend=rallypoint",
        f"--rdzv-endpoint={','.join(cluster.endpoints)}",
        f"--rdzv-id={job}",
        "--rdzv-conf=last_call_timeout=0",
        *script,
    ]
    try:
        with open(out / f"{job}.log", "w") as log:
            done = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=120,
                env=dict(os.environ),
                start_new_session=True,
            )
        return done.returncode
    finally:
        kill_processes_mentioning(str(out))


def job_round(cluster: ProcessCluster, job: str) -> RoundInfo:
    with SyncClient(cluster.endpoints, timeout_s=20) as client:
        return client.get_job(job).round


def test_a_torchrun_job_whose_workers_succeed_is_finished(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    code = torchrun(cluster, "tr-done", [str(SCRIPT), f"--out={tmp_path}", "--steps=3"], tmp_path)
    assert code == 0, (tmp_path / "tr-done.log").read_text()[-3000:]
    info = job_round(cluster, "tr-done")
    assert info.job_state is JobState.FINISHED, info
    assert info.job_end_detail.endswith(": the workers succeeded")


def test_a_torchrun_job_whose_workers_fail_is_failed(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    code = torchrun(cluster, "tr-failed", [str(failing)], tmp_path)
    assert code != 0
    info = job_round(cluster, "tr-failed")
    assert info.job_state is JobState.FAILED, info
    assert info.job_end_detail.endswith("1 worker(s) failed (exit code 3)"), info
