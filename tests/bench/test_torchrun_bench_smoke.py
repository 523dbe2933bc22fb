"""The torchrun benchmark runs end to end for one rallypoint trial (a 3-member cluster, two
torchrun agents, one worker SIGKILLed) and writes the JSON shape `make bench-torchrun`
promises. Speed is not checked: the figures only have to be present and sensible."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import assert_left_nothing, no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_one_rallypoint_trial_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "torchrun.json"
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    with no_process_outlives("the torchrun benchmark"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.torchrun_bench",
                "--backends=rallypoint",
                "--trials=1",
                "--kill-after-steps=3",
                f"--out={out}",
            ],
            cwd=REPOSITORY,
            env={**os.environ, "TMPDIR": str(scratch)},
            check=True,
            timeout=220,
        )
    assert_left_nothing(scratch, "the benchmark")
    report = json.loads(out.read_text())
    assert {"machine", "versions", "parameters", "backends"} <= set(report)
    summary = report["backends"]["rallypoint"]
    assert summary["worker_kill_recovered"] == "1 of 1", summary
    assert report["worker_kill_recovered"] == {"rallypoint": "1 of 1"}
    (trial,) = summary["trials"]
    assert trial["world_size"] == 4
    assert trial["round_changes"] == 1, trial
    assert 0 < trial["restarted_s"] <= trial["running_s"] == summary["running_s"]
    assert math.isfinite(summary["running_s"])
