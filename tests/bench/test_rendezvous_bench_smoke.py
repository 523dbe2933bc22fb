"""The rendezvous benchmark runs end to end in its smoke mode (16 simulated workers, torchrun's
rendezvous at 16 agents, one SIGKILL and one SIGSTOP trial, a short false-positive run and one
capacity step) and writes the JSON shape and the plot `make bench-rendezvous` promises. Speed
is not checked here: the figures only have to be present and sensible."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]
TOP_LEVEL = {
    "round_close_after_last_join_s",
    "round_close_last_call_s",
    "detect_sigkill_s",
    "detect_sigstop_s",
    "false_positives",
    "torchrun_round_s",
    "leader_capacity_workers_1hz",
}
TARGETS = {
    "round_close_after_last_join_s[1024]",
    "detect_sigkill_s",
    "detect_sigstop_s",
    "false_positives",
    "leader_capacity_workers_1hz",
}


def positive(value: Any) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_smoke_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "rendezvous.json"
    with no_process_outlives("the rendezvous benchmark"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.rendezvous_bench", "--smoke", f"--out={out}"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0

    assert document["benchmark"] == "rendezvous"
    assert set(document) >= TOP_LEVEL
    assert document["machine"]["cpu_count"] >= 1
    assert {"python", "grpcio", "rallypoint", "torch"} <= set(document["versions"])

    # One size in smoke mode; every worker saw the round, ranks 0..N-1 were handed out once.
    assert list(document["round_close_after_last_join_s"]) == ["16"]
    assert document["round_close_after_last_join_s"]["16"] is not None
    trial = document["results"]["rounds"]["sizes"]["16"]["trials"][0]
    assert trial["complete"] and trial["ranks_are_a_permutation"]
    assert trial["workers_saw_active"] == 16
    last_call = document["results"]["rounds"]["last_call"]
    assert last_call["min_nodes"] < last_call["max_nodes"]
    assert last_call["trials"][0]["complete"]

    assert list(document["torchrun_round_s"]) == ["16"]
    assert positive(document["torchrun_round_s"]["16"])
    assert document["results"]["torchrun"]["16"]["trials"][0]["ranks_are_a_permutation"]

    assert positive(document["detect_sigkill_s"])
    assert positive(document["detect_sigstop_s"])
    signals = [t["signal"] for t in document["results"]["detection"]["trials"]]
    assert sorted(signals) == ["SIGKILL", "SIGSTOP"]

    assert isinstance(document["false_positives"], int) and document["false_positives"] >= 0
    assert set(document["false_positives_by_phase"]) == {
        "rounds",
        "detection",
        "false_positive_run",
    }

    steps = document["results"]["capacity"]["steps"]
    assert len(steps) == 1 and steps[0]["participants"] == 200
    assert steps[0]["heartbeats_per_s"] > 0
    assert document["leader_capacity_workers_1hz"] in (0, 200)

    assert set(document["targets"]) == TARGETS
    assert document["targets"]["round_close_after_last_join_s[1024]"]["verdict"] == "not measured"
    for name in TARGETS - {"round_close_after_last_join_s[1024]"}:
        assert document["targets"][name]["verdict"] in ("PASS", "MISS"), name
    assert "detect_sigkill_s" in done.stdout
