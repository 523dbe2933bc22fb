"""What a worker imports before it joins is on a replacement's way into training
(bench/rejoin_phases.py): the elastic loop leaves out what only some jobs use, and imports it
when first used.

- zfec codes erasure-coded snapshots (``snapshot_erasure``); a job without them never loads it.
- A replacement's imports up to its Join (bench/peers_worker.py's: ``elastic_training``,
  ``TrainState``, ``ElasticSampler``, and the client it joins with) load nothing of the
  coordinator's side (the daemon, Raft, uvloop), no plotting and no torchrun or demo code.
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
            "rallypoint.worker.demo_train", "rallypoint.worker.mesh_train")
print(" ".join(sorted(
    name for name in sys.modules
    if any(name == u or name.startswith(u + ".") for u in unwanted)
)))
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
