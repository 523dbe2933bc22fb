"""What a worker imports before it joins is on a replacement's way into training
(bench/rejoin_phases.py): the elastic loop leaves out what only some jobs use, and imports it
when first used.

- zfec codes erasure-coded snapshots (``snapshot_erasure``); a job without them never loads it.
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
