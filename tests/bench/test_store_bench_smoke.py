"""The store benchmark runs end to end in its smoke mode (16 simulated ranks against torch's
TCPStore server and through the TCPStore bridge to a 3-member cluster, both patterns, and a
real 2-process ``init_process_group("gloo")`` through each) and writes the fields
`make bench-store` promises, with the right types. The replayed patterns must make exactly
the wire requests torch makes (gloo: a SET then WAIT, WAIT, GET per rank, per rank). Speed is
not checked: the sizes the targets name are not run, so every target reads MISS."""

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
RANKS = 16


def run_bench(arguments: list[str]) -> str:
    """Run the benchmark to its end (nothing of it may outlive it); its stdout."""
    with no_process_outlives("the store benchmark"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.store_bench", *arguments],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=140,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def positive(value: Any) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_smoke_run_writes_the_fields_other_checks_read(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    stdout = run_bench(["--smoke", f"--out={out}"])
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert document["benchmark"] == "store" and document["smoke"] is True
    assert document["machine"]["cpu_count"] >= 1
    assert {"python", "torch", "grpcio", "rallypoint"} <= set(document["versions"])
    assert {"members", "tcpstore", "ranks", "bridges"} <= set(document["placement"])

    # The sizes the figures are keyed by are not run in smoke mode: null, never made up.
    assert document["nccl_1024_s"] is None
    assert document["ratios"] == {"gloo_256": None, "gloo_1024": None, "nccl_1024": None}
    assert set(document["targets"]) == {"nccl_1024_s", "gloo_256", "gloo_1024"}
    for check in document["targets"].values():
        assert check["verdict"] == "MISS" and check["direction"] == "<="

    results = document["results"]
    assert set(results) == {"tcpstore", "rallypoint"}
    for store, by_pattern in results.items():
        for pattern in ("gloo", "nccl"):
            entry = by_pattern[pattern][str(RANKS)]
            assert entry["finished"] is True, (store, pattern, entry)
            assert positive(entry["seconds"]) and positive(entry["ops_s"]), entry
            (trial,) = entry["trials"]
            assert trial["ranks_done"] == RANKS and trial["errors"] == 0
        # gloo: per rank one SET, then WAIT (gloo's), WAIT and GET (torch's get) per rank.
        assert by_pattern["gloo"][str(RANKS)]["trials"][0]["ops"] == RANKS * (3 * RANKS + 1)
        # nccl: 1 SET, 15 x (WAIT, GET), 16 x (ADD, ADD, WAIT), 1 to 16 last-worker SETs.
        nccl_ops = by_pattern["nccl"][str(RANKS)]["trials"][0]["ops"]
        base = 1 + 2 * (RANKS - 1) + 3 * RANKS
        assert base + 1 <= nccl_ops <= base + RANKS
        init = by_pattern["init_gloo"]["2"]
        assert init["finished"] is True and positive(init["seconds"]), init
        assert all(t["all_reduce_ok"] for t in init["trials"])
        assert init["how"]

    last = stdout.strip().splitlines()[-1]
    assert last.startswith("store: ")
    for name in ("nccl_1024_s", "gloo_256", "gloo_1024"):
        assert name in last
    assert last.count("MISS") == 3


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_a_trial_over_its_limit_is_stopped_and_recorded_with_its_progress(tmp_path: Path) -> None:
    """gloo at 512 ranks is 787,000 requests, more than any store here answers in a second
    (torch's TCPStore took seconds for 256): with a 1 s limit the trial is stopped, written as
    not finished with what it did, the larger size skipped, and the run ends on its own."""
    out = tmp_path / "store.json"
    run_bench(
        [
            "--stores=rallypoint",
            "--sizes=512,1024",
            "--patterns=gloo",
            "--trials=1",
            "--trial-limit-s=1",
            "--init-procs=0",
            "--no-plot",
            f"--out={out}",
        ]
    )
    gloo = json.loads(out.read_text())["results"]["rallypoint"]["gloo"]
    stopped = gloo["512"]
    assert stopped["finished"] is False and stopped["seconds"] is None
    assert 0 < stopped["ops_done"] < 512 * (3 * 512 + 1)
    assert stopped["seconds_lower_bound"] >= 1.0
    (trial,) = stopped["trials"]
    assert trial["ranks_done"] < 512
    assert gloo["1024"]["finished"] is False and "did not finish" in gloo["1024"]["skipped"]
