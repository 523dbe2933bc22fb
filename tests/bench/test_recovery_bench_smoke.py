"""The recovery benchmark runs end to end in its smoke mode (a 3-member cluster, one trial of
4 elastic workers and one of tuned torchrun, a small restore) and writes the JSON shape `make
bench-recovery` promises, leaving no process running: not its members, its elastic workers,
its torchrun agents, nor their workers (which run in sessions of their own). Speed is not
checked."""

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
@pytest.mark.timeout(420)
def test_smoke_run_writes_results_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    with no_process_outlives("the recovery benchmark"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.recovery_bench", "--smoke", f"--out={out}"],
            cwd=REPOSITORY,
            env={**os.environ, "TMPDIR": str(scratch)},
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_left_nothing(scratch, "the benchmark")
    report = json.loads(out.read_text())
    assert report["parameters"]["smoke"] is True
    assert report["details"]["rallypoint"]["recovered"] == "1/1", report["details"]
    assert math.isfinite(report["recovery_s"]) and report["recovery_s"] > 0
    assert report["torchrun_default_s"] is None
    assert report["torchrun_default_reason"] == "not run (--smoke)"
    assert report["restore_vs_dcp"] > 0
    # In-memory snapshots: a killed FSDP2 worker and a whole host come back from memory.
    memory = report["details"]["memory"]
    assert memory["recovered"] == "1/1", memory
    assert memory["trials"][0]["restore_sources"] == ["memory"], memory
    assert report["memory_steps_lost"] is not None and report["memory_steps_lost"] >= 0
    assert [t["restore_sources"] for t in report["host_lost"]] == [["memory"]], report["host_lost"]
    for field in (
        "memory_restore_vs_dcp",
        "snapshot_blocked_s_per_gb",
        "memory_overhead",
        "memory_overhead_ec",
    ):
        assert math.isfinite(report[field]) and report[field] > 0, field
