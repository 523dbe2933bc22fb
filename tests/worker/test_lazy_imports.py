"""What a worker imports before it joins is on a replacement's way into training
(bench/rejoin_phases.py): the elastic loop leaves out what only some jobs use, and imports it
when first used.

- zfec codes erasure-coded snapshots (``snapshot_erasure``); a job without them never loads it.
- A replacement's imports up to its Join (bench/peers_worker.py's: ``elastic_training``,
  ``TrainState``, ``ElasticSampler``, and the client it joins with) load nothing of the
  coordinator's side (the daemon, Raft, uvloop), no plotting and no torchrun or demo code,
  and nothing of the restore path (disk checkpoints, memory snapshots' code,
  torch.distributed.checkpoint under them): entering the run loads that on a thread while it
  joins, so the first formation finds it loaded.
- Nor FSDP, DTensor or torch._dynamo (with sympy under them, about half a second): the loop
  reaches FSDP2's modules and DTensors only through a model that holds them, and a model
  holds them only once its maker imported them. (torch.optim's optimizers import
  torch._dynamo, and FSDP under it, when made: a job pays that for its optimizer, not for
  rallypoint.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

LOADED = """
import sys
import rallypoint.worker.elastic
import rallypoint.worker.demo_train
print(" ".join(sorted(name for name in ("zfec",) if name in sys.modules)))
"""

CODES = """
import sys
from rallypoint.worker.snapshots.erasure import decode_blobs, encode_parity
[parity] = encode_parity([b"abc", b"de"], 1, [0])
assert decode_blobs({0: b"abc", 2: parity}, [3, 2], 1) == [b"abc", b"de"]
print("zfec" in sys.modules)
"""


JOIN_PATH = """
import sys
from rallypoint.worker import ElasticSampler, TrainState, elastic_training
from rallypoint.client import aio, session
unwanted = ("rallypoint.coordinator", "rallypoint.raft", "uvloop", "zfec", "matplotlib",
            "rallypoint.worker.torchrun", "rallypoint.worker.torchrun_store",
            "rallypoint.worker.tcpstore", "rallypoint.worker.demo",
            "rallypoint.worker.demo_train", "rallypoint.worker.mesh_train",
            "torch.distributed.checkpoint", "rallypoint.worker.checkpoint",
            "rallypoint.worker.state_io", "rallypoint.worker.replica_restore",
            "rallypoint.worker.snapshots.lifecycle", "rallypoint.worker.snapshots.restore",
            "rallypoint.worker.snapshots.server", "rallypoint.worker.snapshots.storage",
            "torch.distributed.fsdp", "torch.distributed.tensor", "torch._dynamo", "sympy")
print(" ".join(sorted(
    name for name in sys.modules
    if any(name == u or name.startswith(u + ".") for u in unwanted)
)))
"""

# Entering a run whose coordinator never answers: the join gives up after connect_timeout_s,
# by which time the restore path was loaded beside it (the run's thread is waited for, as the
# interpreter would at exit).
ENTERED = """
import socket, sys, threading
import torch
from rallypoint.worker import CoordinatorUnreachableError, TrainState, elastic_training
listener = socket.socket()
listener.bind(("127.0.0.1", 0))  # bound, never listening: every connect is refused
port = listener.getsockname()[1]
model = torch.nn.Linear(2, 2)
state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
before = "torch.distributed.checkpoint" in sys.modules
try:
    with elastic_training(f"127.0.0.1:{port}", job="lazy", name="w0", min_nodes=1,
                          max_nodes=1, checkpoint_dir="/tmp/unused", state=state,
                          connect_timeout_s=1.0):
        pass
except CoordinatorUnreachableError:
    pass
for thread in threading.enumerate():
    if thread.name == "rallypoint-warm":
        thread.join(timeout=240)
print(before, "torch.distributed.checkpoint" in sys.modules,
      "rallypoint.worker.checkpoint" in sys.modules)
"""


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_the_elastic_loop_imports_no_erasure_coder() -> None:
    assert _python(LOADED) == ""


def test_erasure_coding_loads_zfec_when_first_used() -> None:
    assert _python(CODES) == "True"


def test_a_replacements_join_path_loads_no_server_plotting_or_launcher_code() -> None:
    assert _python(JOIN_PATH) == ""


def test_entering_a_run_loads_the_restore_path_while_it_joins() -> None:
    assert _python(ENTERED) == "False True True"
