"""Each launcher's own command for a 2-node x 2-process job of one training script, over
``rallypoint`` (every member's address) or ``c10d`` (an agent-hosted store at 127.0.0.1:PORT),
as docs/launchers/NAME.md shows it. The tests (test_*.py) and measure.py start them.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .harness import (
    NODE_NAMES,
    REPOSITORY,
    SCRIPTS,
    WORLD_SIZE,
    LauncherJob,
    Node,
    Recovery,
    check_trained,
    round_counter,
    torchrun_command,
)

BIN = Path(sys.executable).parent
KUBEFLOW_JOB = REPOSITORY / "deploy" / "kubeflow" / "pytorchjob-elastic.yaml"
SBATCH = REPOSITORY / "deploy" / "slurm" / "rallypoint-torchrun.sbatch"
TORCHX_COMPONENT = REPOSITORY / "deploy" / "torchx" / "rallypoint_ddp.py"
FAKE_SLURM = Path(__file__).resolve().parent / "fake_slurm"


@dataclass(frozen=True)
class Target:
    """Where a job rendezvouses: ``backend`` and the endpoints it is given."""

    backend: str  # "rallypoint" or "c10d"
    endpoints: Sequence[str]  # the members' client addresses, or c10d's one host:port

    @property
    def endpoint(self) -> str:
        return ",".join(self.endpoints)


def script_args(out: Path, steps: int) -> list[str]:
    return [f"--out={out}", f"--steps={steps}"]


def torchrun_nodes(script: Path, target: Target, job: str, out: Path, steps: int) -> list[Node]:
    """Two torchrun agents, each named after its node (``--local-addr``, rallypoint only: with
    c10d, rank 0's agent hands its ``--local-addr`` to every worker as MASTER_ADDR)."""
    nodes = []
    for name in NODE_NAMES:
        local = [f"--local-addr={name}"] if target.backend == "rallypoint" else []
        command = torchrun_command(
            "--nnodes=2",
            "--nproc-per-node=2",
            "--max-restarts=3",
            "--monitor-interval=0.1",
            f"--rdzv-backend={target.backend}",
            f"--rdzv-endpoint={target.endpoint}",
            f"--rdzv-id={job}",
            *local,
            str(script),
            *script_args(out, steps),
        )
        nodes.append(Node(name, command))
    return nodes


def lightning_trainer(target: Target, job: str, out: Path, steps: int) -> list[Node]:
    return torchrun_nodes(SCRIPTS / "lightning_trainer.py", target, job, out, steps)


def lightning_fabric(target: Target, job: str, out: Path, steps: int) -> list[Node]:
    return torchrun_nodes(SCRIPTS / "lightning_fabric.py", target, job, out, steps)


def accelerate_address(target: Target) -> tuple[str, str]:
    """``--main_process_ip`` and ``--main_process_port``: accelerate hands torchrun
    ``f"{ip}:{port}"`` as the rendezvous endpoint, so every member but the last port goes in
    the "ip" (docs/launchers/accelerate.md)."""
    head, _, port = target.endpoint.rpartition(":")
    return head, port


def accelerate(target: Target, job: str, out: Path, steps: int) -> list[Node]:
    ip, port = accelerate_address(target)
    nodes = []
    for rank, name in enumerate(NODE_NAMES):
        command = [
            str(BIN / "accelerate"),
            "launch",
            # accelerate's torchrun path; without GPUs the workers run on CPU with gloo.
            "--multi_gpu",
            "--num_machines=2",
            "--num_processes=4",
            f"--machine_rank={rank}",
            f"--main_process_ip={ip}",
            f"--main_process_port={port}",
            f"--rdzv_backend={target.backend}",
            "--max_restarts=3",
            "--monitor_interval=0.1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            str(SCRIPTS / "accelerate_loop.py"),
            *script_args(out, steps),
        ]
        # torchrun's own options that accelerate has no flag for come from PET_* variables.
        env = {"PET_RDZV_ID": job}
        if target.backend == "rallypoint":
            env["PET_LOCAL_ADDR"] = name
        nodes.append(Node(name, command, env))
    return nodes


def torchx(target: Target, job: str, out: Path, steps: int) -> list[Node]:
    """One ``torchx run`` of ``dist.ddp`` on the ``local_cwd`` scheduler, which starts both
    replicas (nodes) here. dist.ddp hands torchrun ``$TORCHX_RANK0_HOST:rdzv_port``
    (``localhost`` on local schedulers) and no --max-restarts: the members must answer on
    localhost, and torchrun's restarts come from PET_MAX_RESTARTS (docs/launchers/torchx.md)."""
    (endpoint,) = target.endpoints
    host, _, port = endpoint.rpartition(":")
    assert host in ("127.0.0.1", "localhost"), f"dist.ddp always dials localhost here, not {host}"
    command = [
        str(BIN / "torchx"),
        "run",
        "--scheduler=local_cwd",
        "dist.ddp",
        "-j",
        "2x2",
        "--rdzv_backend",
        target.backend,
        "--rdzv_port",
        port,
        "--env",
        "PET_MAX_RESTARTS=3,PET_MONITOR_INTERVAL=0.1",
        "--script",
        str(SCRIPTS / "plain_loop.py"),
        "--",
        *script_args(out, steps),
    ]
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # the replicas run `torchrun`
    return [Node("torchx", command, {"LOGLEVEL": "INFO", "PATH": path}, cwd=out)]


def torchx_component(target: Target, job: str, out: Path, steps: int) -> list[Node]:
    """``torchx run`` of deploy/torchx/rallypoint_ddp.py:ddp (dist.ddp with the members as
    the endpoint and --max_restarts set): what works on schedulers of several hosts too."""
    assert target.backend == "rallypoint", "the component is rallypoint's"
    command = [
        str(BIN / "torchx"),
        "run",
        "--scheduler=local_cwd",
        f"{TORCHX_COMPONENT}:ddp",
        "--endpoints",
        target.endpoint,
        "-j",
        "2x2",
        "--env",
        "PET_MONITOR_INTERVAL=0.1",
        "--script",
        str(SCRIPTS / "plain_loop.py"),
        "--",
        *script_args(out, steps),
    ]
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return [Node("torchx", command, {"LOGLEVEL": "INFO", "PATH": path}, cwd=out)]


def torchx_app_id(job: LauncherJob) -> str:
    """dist.ddp's rendezvous id is the app id torchx made up (``--rdzv_id ${app_id}``), which
    ``torchx run`` prints as ``local_cwd://SESSION/APP_ID``."""
    found = re.search(r"^local_cwd://[^/\s]+/(\S+)$", job.log_text(0), re.MULTILINE)
    assert found, job.log_text(0)[-2000:]
    return found.group(1)


def operator_environment(job: dict[str, Any]) -> dict[str, str]:
    """The variables the training operator (v1.9.0, pkg/controller.v1/pytorch/envvar.go and
    elastic.go) adds to a Worker container of an elastic PyTorchJob without a Master."""
    spec = job["spec"]
    policy = spec["elasticPolicy"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    env = {"PYTHONUNBUFFERED": "1"}
    if "nprocPerNode" in spec:
        env["PET_NPROC_PER_NODE"] = str(spec["nprocPerNode"])
    host = policy.get("rdzvHost", f"{job['metadata']['name']}-worker-0")
    env["PET_RDZV_ENDPOINT"] = f"{host}:{policy['rdzvPort']}"
    env["PET_RDZV_BACKEND"] = policy.get("rdzvBackend", "c10d")
    if "minReplicas" in policy or "maxReplicas" in policy:
        env["PET_NNODES"] = f"{policy.get('minReplicas')}:{policy.get('maxReplicas')}"
    else:
        env["PET_NNODES"] = str(worker["replicas"])
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if "rdzvId" in policy:
        env["PET_RDZV_ID"] = policy["rdzvId"]
    if policy.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    return env


def kubeflow_job(**policy_changes: Any) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(KUBEFLOW_JOB.read_text())
    job["spec"]["elasticPolicy"].update(policy_changes)
    return job


def kubeflow(target: Target, job_id: str, out: Path, steps: int) -> list[Node]:
    """The PyTorchJob's Worker containers as the operator starts them, one per simulated pod:
    the container's command (``train.py`` replaced by the test's script) with the operator's
    variables, the elasticPolicy pointed at this cluster (one address, as the Service is)
    with the job's id and no TLS settings (the test cluster has none)."""
    (endpoint,) = target.endpoints[:1]
    host, _, port = endpoint.rpartition(":")
    job = kubeflow_job(
        rdzvBackend=target.backend, rdzvHost=host, rdzvPort=int(port), rdzvId=job_id, rdzvConf=[]
    )
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    command = list(container["command"])
    assert command[0] == "torchrun" and command[-1] == "train.py", command
    command = [str(BIN / "torchrun"), *command[1:-1], str(SCRIPTS / "plain_loop.py")]
    env = operator_environment(job)
    nodes = []
    for name in NODE_NAMES:
        # Pods have host names of their own; here the agents are told theirs.
        local = {"PET_LOCAL_ADDR": name} if target.backend == "rallypoint" else {}
        nodes.append(Node(name, [*command, *script_args(out, steps)], {**env, **local}))
    return nodes


def slurm_environment(target: Target, job: str) -> dict[str, str]:
    """What sbatch sets in the batch script's environment, plus the script's settings."""
    return {
        "PATH": f"{FAKE_SLURM}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLURM_JOB_ID": job.rpartition("-")[2],
        "SLURM_JOB_NAME": "rallypoint-train",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": f"{NODE_NAMES[0]},{NODE_NAMES[1]}",
        "FAKE_SLURM_NODENAMES": ",".join(NODE_NAMES),
        "RALLYPOINT_ENDPOINTS": target.endpoint,
        "NPROC_PER_NODE": "2",
        "RDZV_ID": job,
        "RDZV_CONF": "",
    }


def slurm(target: Target, job: str, out: Path, steps: int) -> list[Node]:
    """The sbatch script run as sbatch runs it (bash, in the allocation's environment), its
    ``srun`` the fake one: two local tasks, one agent each."""
    assert target.backend == "rallypoint", "the sbatch script is rallypoint's"
    command = ["bash", str(SBATCH), str(SCRIPTS / "plain_loop.py"), *script_args(out, steps)]
    env = {**slurm_environment(target, job), "PET_MONITOR_INTERVAL": "0.1"}
    return [Node("sbatch", command, env)]


Builder = Callable[[Target, str, Path, int], list[Node]]
LAUNCHERS: dict[str, Builder] = {
    "lightning-trainer": lightning_trainer,
    "lightning-fabric": lightning_fabric,
    "accelerate": accelerate,
    "torchx": torchx,
    "torchx-component": torchx_component,
    "kubeflow": kubeflow,
    "slurm": slurm,
}
# Where each launcher's members must answer (harness.coordinator): accelerate probes localhost
# for its port on machine rank 0; dist.ddp dials localhost.
COORDINATOR_HOST = {"accelerate": "127.0.0.2"}


@dataclass(frozen=True)
class Outcome:
    job: LauncherJob
    recovery: Recovery
    exit_codes: list[int]
    first_loss: float
    final_loss: float


def run_kill_trial(
    launcher: str,
    target: Target,
    job_id: str,
    out: Path,
    *,
    steps: int = 60,
    kill_after_steps: int = 15,
    timeout_s: float = 240.0,
) -> Outcome:
    """Start the job, SIGKILL a worker once every worker is past ``kill_after_steps`` (a
    checkpoint exists by then), measure until every new worker steps, then let the job finish
    and read its exit codes and losses. The nodes are killed whatever happens."""
    job = LauncherJob(LAUNCHERS[launcher](target, job_id, out, steps), out)
    try:
        first = job.warm(kill_after_steps, timeout_s)
        if launcher.startswith("torchx"):
            job_id = torchx_app_id(job)
        rounds = round_counter(target.endpoints, job_id) if target.backend == "rallypoint" else None
        recovery = job.kill_and_recover(first, timeout_s, rounds)
        codes = job.finish(timeout_s)
        first_loss, final_loss = check_trained(job)
        return Outcome(job, recovery, codes, first_loss, final_loss)
    finally:
        job.kill_all()


def check_recovered(outcome: Outcome, nodes: int) -> None:
    """What every launcher's run must show: one new round at full size that went on from a
    checkpoint, the loss below where it started, every node exiting 0, and torchrun's agent
    naming the killed worker in the launcher's output."""
    recovery = outcome.recovery
    assert recovery.world_sizes == [WORLD_SIZE]
    assert recovery.round_changes in (None, 1), f"{recovery.round_changes} round changes"
    assert min(recovery.resumed_from) > 0, "the new round did not resume from a checkpoint"
    assert outcome.exit_codes == [0] * nodes, outcome.job.all_logs()[-4000:]
    assert outcome.final_loss < outcome.first_loss
    logs = outcome.job.all_logs()
    assert f"failed (exitcode: -9) local_rank: 1 (pid: {recovery.victim})" in logs, logs[-3000:]
