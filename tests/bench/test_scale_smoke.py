"""The scale benchmark runs end to end in its smoke mode (a round of 1,024 participants and its
round change, detection with 1,000 background participants and one SIGKILL and one SIGSTOP
worker, one capacity step of 2,000 at 1 Hz) and writes the fields other checks read from
`bench/results/scale.json`, with the right types. Speed is not checked here: the figures
only have to be present and sensible."""

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
SIZES = ["1024", "10000", "100000"]


def positive(value: Any) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_smoke_run_writes_the_fields_other_checks_read(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    with no_process_outlives("the scale benchmark"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.scale_bench", "--smoke", f"--out={out}"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert document["benchmark"] == "scale" and document["smoke"] is True

    # The top-level figures, typed as other checks read them.
    assert isinstance(document["participants_1hz"], int)
    assert document["participants_1hz"] in (0, 2000)
    for name in ("round_close_s", "round_change_bytes_per_participant"):
        assert list(document[name]) == SIZES, name
        # Smoke mode measures the smallest size; the others are null, never made up.
        assert positive(document[name]["1024"]), (name, document[name])
        assert document[name]["10000"] is None and document[name]["100000"] is None
    assert positive(document["detect_sigkill_s"])
    assert positive(document["detect_silent_s"])
    assert isinstance(document["false_positives"], int) and document["false_positives"] >= 0
    assert positive(document["cores_per_10k"])

    results = document["results"]
    trial = results["rounds"]["1024"]
    assert trial["complete"] and trial["ranks_are_a_permutation"]
    change = trial["change"]
    assert change["complete"] and change["assignments"] >= 1023
    assert change["response_bytes"] >= change["assignment_bytes"] > 0
    signals = sorted(t["signal"] for t in results["detection"]["trials"])
    assert signals == ["SIGKILL", "SIGSTOP"]
    step = results["capacity"]["steps"][0]
    assert step["participants"] == 2000 and step["requests_per_s"] > 0
    assert "load_send_lag_p99_ms" in step

    assert document["torchrun"]["ran"] is False and "256" in document["torchrun"]["reason"]
    assert document["placement"]["cores"] >= 1
    for check in document["targets"].values():
        assert check["verdict"] in ("PASS", "MISS", "not measured")
    assert "round_close_s[1024]" in done.stdout
