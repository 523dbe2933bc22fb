"""The failover benchmark runs end to end in its smoke mode against a real 3-member rallypoint
cluster (no etcd needed: smoke mode measures rallypoint only unless told otherwise), two trials
of each scenario, and writes the JSON shape and the plot `make bench-failover` promises. Speed
is not checked here: the figures only have to be present and sensible. Every member it started
is gone when it exits."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]
SCENARIOS = {"leader_kill", "restart_then_kill", "leader_pause"}
RATIO_NAMES = {"leader_kill_p50", "leader_kill_p99", "restart_then_kill_max", "leader_pause_p50"}


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_smoke_run_writes_results_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    data_dir = tmp_path / "members"
    with no_process_outlives("the failover benchmark"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.failover_bench",
                "--smoke",
                f"--data-dir={data_dir}",
                f"--out={out}",
            ],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=220,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0

    assert document["benchmark"] == "failover"
    assert document["machine"]["cpu_count"] >= 1
    assert {"python", "grpcio", "rallypoint"} <= set(document["versions"])
    assert "127.0.0.1" in document["where"]
    assert document["errors"] == [] and document["aborted"] is None
    assert document["parameters"]["rallypoint_timing"]["tick_ms"] == 100
    assert document["parameters"]["rallypoint_timing"]["election_ticks"] == 10

    assert list(document["results"]) == ["rallypoint"]
    per_scenario = document["results"]["rallypoint"]
    assert set(per_scenario) == SCENARIOS
    for name, summary in per_scenario.items():
        trials = summary["trials"]
        assert len(trials) == 2, name
        # No fault is repaired in under a tenth of the election timeout (1 s), and the smoke
        # mode's trials all recover well within the 30 s bound.
        assert all(0.1 < seconds < 30 for seconds in trials), (name, trials)
        assert summary["unrecovered"] == 0, name
        assert summary["p50_s"] <= summary["p99_s"] <= summary["max_s"] == max(trials), name
        for trial in summary["details"]:
            assert trial["recovered"] and trial["answered_by"] in (1, 2, 3), trial
            assert trial["leader_elected_after_s"] is not None, trial
            assert 0 < trial["leader_elected_after_s"] <= trial["seconds"], trial
        assert math.isfinite(summary["election_p50_s"]), name

    assert set(document["ratios"]) == RATIO_NAMES
    assert all(value is None for value in document["ratios"].values())
    check = document["targets"]["rallypoint_restart_then_kill_max_s"]
    assert check["verdict"] in ("PASS", "MISS")
    assert "rallypoint_restart_then_kill_max_s" in done.stdout
