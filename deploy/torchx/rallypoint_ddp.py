"""A TorchX component: torchx's ``dist.ddp`` with its rendezvous on a rallypoint coordinator
cluster (docs/launchers/torchx.md).

``dist.ddp`` always points torchrun at ``$rank0_host:rdzv_port`` (the first replica's host,
where c10d's store would be) and passes no ``--max_restarts``. This component builds the same
AppDef through ``dist.ddp`` and changes only those two things in the replicas' command: the
endpoint becomes the members' addresses, and ``--max_restarts`` is set. Copy it next to your
code and name it by path:

    torchx run -s kubernetes rallypoint_ddp.py:ddp \\
        --endpoints coord1:2379,coord2:2379,coord3:2379 -j 2x8 --script train.py -- --epochs 10

Written against torchx 0.7.0; it refuses to build if dist.ddp's command ever changes shape.
"""

# No `from __future__ import annotations`: torchx decodes each argument by its annotation.
from typing import Dict, List, Optional  # noqa: UP035 (torchx reads these annotations)

import torchx
import torchx.specs as specs
from torchx.components import dist


def ddp(
    *script_args: str,
    endpoints: str,
    script: Optional[str] = None,  # noqa: UP045 (torchx's component linter wants Optional)
    m: Optional[str] = None,  # noqa: UP045
    image: str = torchx.IMAGE,
    name: str = "/",
    h: Optional[str] = None,  # noqa: UP045
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
    max_restarts: int = 3,
    mounts: Optional[List[str]] = None,  # noqa: UP006, UP045
    debug: bool = False,
    tee: int = 3,
) -> specs.AppDef:
    """Distributed data parallel (torchrun) with the rallypoint rendezvous backend.

    Args:
        script_args: arguments to the main module
        endpoints: the coordinator members' client addresses, comma-separated (host:port,...)
        script: script or binary to run within the image
        m: the python module path to run
        image: image (e.g. docker)
        name: job name override ({experimentname}/{runname}, {experimentname}/, /{runname})
        h: a registered named resource (if specified takes precedence over cpu, gpu, memMB)
        cpu: number of cpus per replica
        gpu: number of gpus per replica
        memMB: cpu memory in MB per replica
        j: [{min_nnodes}:]{nnodes}x{nproc_per_node}
        env: environment variables to be passed to the run (e.g. ENV1=v1,ENV2=v2)
        max_restarts: worker group restarts torchrun allows before it fails
        mounts: mounts to mount into the worker environment/container
        debug: whether to run with preset debug flags enabled
        tee: tees std stream(s) to console + file: 0 none, 1 stdout, 2 stderr, 3 both
    """
    # A port no one would choose, so the endpoint dist.ddp writes can be found exactly.
    marker_port = 1
    app = dist.ddp(
        *script_args,
        script=script,
        m=m,
        image=image,
        name=name,
        h=h,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        j=j,
        env=env,
        rdzv_port=marker_port,
        rdzv_backend="rallypoint",
        mounts=mounts,
        debug=debug,
        tee=tee,
    )
    (role,) = app.roles
    command = role.args[1]
    endpoint = f"--rdzv_endpoint $${{{specs.macros.rank0_env}:=localhost}}:{marker_port} "
    single = "--rdzv_endpoint localhost:0 "  # what dist.ddp writes for one node
    found = endpoint if endpoint in command else single
    if role.args[0] != "-c" or command.count(found) != 1 or " --rdzv_id " not in command:
        raise ValueError(
            f"torchx's dist.ddp wrote a command this component does not know: {command}"
        )
    if "," not in endpoints and ":" not in endpoints:
        raise ValueError(
            f"--endpoints: host:port of each member, comma-separated; got {endpoints!r}"
        )
    replacement = f"--rdzv_endpoint {endpoints} --max_restarts {max_restarts} "
    role.args[1] = command.replace(found, replacement)
    role.port_map = {}
    return app
