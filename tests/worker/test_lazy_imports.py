"""What a worker imports before it joins is on a replacement's way into training
(bench/rejoin_phases.py): the elastic loop leaves out what only some jobs use, and imports it
when first used.

- zfec codes erasure-coded snapshots (``snapshot_erasure``); a job without them never loads it.
- A replacement's imports up to its Join (bench/peers_worker.py's: ``elastic_training``,
  ``TrainState``, ``ElasticSampler``, and the client it joins with) load nothing of the
  coordinator's side (the daemon, Raft, uvloop), no plotting and no torchrun or demo code,
  and nothing of the restore path (disk checkpoints, memory snapshots' code,
  torch.distributed.checkpoint under them): entering the run loads that on a thread once its
  Join is answered (not during the Join: the importing thread would hold the GIL the
  client's thread needs), so the first formation finds it loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import running_cluster

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
            "rallypoint.worker.snapshots.server", "rallypoint.worker.snapshots.storage")
print(" ".join(sorted(
    name for name in sys.modules
    if any(name == u or name.startswith(u + ".") for u in unwanted)
)))
"""

# Entering a run against a one-member cluster: at the Join (the client's call, wrapped) the
# restore path is not loaded and no thread imports it; once the run is entered it is (the
# run's thread is waited for, as the interpreter would at exit).
ENTERED = """
import sys, threading
import torch
from rallypoint.client import aio
from rallypoint.worker import TrainState, elastic_training
seen = []
join = aio.Client.join
async def noted(*args, **kwargs):
    seen.append(("rallypoint.worker.checkpoint" in sys.modules,
                 any(t.name == "rallypoint-warm" for t in threading.enumerate())))
    return await join(*args, **kwargs)
aio.Client.join = noted
model = torch.nn.Linear(2, 2)
state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
with elastic_training(sys.argv[1], job="lazy", name="w0", min_nodes=1, max_nodes=1,
                      checkpoint_dir="/tmp/unused", state=state):
    pass
for thread in threading.enumerate():
    if thread.name == "rallypoint-warm":
        thread.join(timeout=240)
(at_join,) = seen
print(*at_join, "torch.distributed.checkpoint" in sys.modules,
      "rallypoint.worker.checkpoint" in sys.modules)
"""


def _python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
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


@pytest.mark.integration
def test_entering_a_run_loads_the_restore_path_after_the_join_not_during_it(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path / "cluster", size=1) as cluster:
        assert _python(ENTERED, ",".join(cluster.endpoints)) == "False False True True"
