"""The rejoin breakdown runs end to end in its smoke mode (a 3-member cluster, 3 elastic
workers, one SIGKILLed, a replacement) and writes every phase of the replacement's way in,
in order, the phases adding up to its start-to-first-step total, leaving no process running.
Speed is not checked."""

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
def test_smoke_run_writes_each_phase_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "rejoin.json"
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    with no_process_outlives("the rejoin breakdown"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.rejoin_phases", "--smoke", f"--out={out}"],
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
    assert report["phases"] == [
        "spawn",
        "torch",
        "imports",
        "model",
        "connect",
        "session",
        "join",
        "round",
        "formation",
        "restore",
        "first_step",
    ]
    [trial] = report["trials"]
    # The replacement was given a survivor's state, not a fresh one.
    assert trial["restore_source"] == "broadcast", trial
    phases = trial["phases"]
    for phase in report["phases"]:
        assert math.isfinite(phases[phase]) and phases[phase] >= 0, (phase, phases)
    total = sum(phases[phase] for phase in report["phases"])
    assert total == pytest.approx(phases["start_to_first_step_s"], abs=1e-6)
    joined = sum(phases[p] for p in report["phases"][: report["phases"].index("join") + 1])
    assert joined == pytest.approx(phases["start_to_joined_s"], abs=1e-6)
    [figures] = report["by_python"].values()
    assert figures["start_to_first_step_s"]["median"] == phases["start_to_first_step_s"]
    assert len(figures["load_1m"]) == 1
    # The floor (plain torch, same model and step) is timed alike.
    [floor] = report["floor_trials"]
    assert sum(floor[p] for p in ("spawn", "torch", "model", "first_step")) == pytest.approx(
        floor["start_to_first_step_s"], abs=1e-6
    )
    assert report["floor"]["start_to_first_step_s"]["median"] == floor["start_to_first_step_s"]
