"""The KV benchmark runs end to end against a real rallypoint cluster (no etcd needed) and
writes the JSON shape `make bench-kv` promises: machine, versions, per-workload medians with
their trials, and the four ratios (null when etcd was not measured)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]
RATIO_NAMES = {"put_64_throughput", "put_64_p99", "put_1_p50", "get_1_p50"}
WORKLOADS = {"put_1", "put_8", "get_1", "get_8", "keepalive_1"}


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_smoke_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    with no_process_outlives("the KV benchmark"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.kv_bench",
                "--smoke",
                "--many-clients=8",
                "--no-plot",
                f"--out={out}",
            ],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=80,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())

    assert document["benchmark"] == "kv"
    assert document["machine"]["cpu_count"] >= 1
    assert document["machine"]["kernel"]
    assert {"python", "grpcio", "rallypoint"} <= set(document["versions"])
    assert set(document["ratios"]) == RATIO_NAMES
    assert all(value is None for value in document["ratios"].values())
    assert list(document["results"]) == ["rallypoint"]
    per_workload = document["results"]["rallypoint"]
    assert set(per_workload) == WORKLOADS
    for name, summary in per_workload.items():
        assert summary["errors"] == 0, (name, summary["trials"])
        assert summary["throughput_ops_s"] > 0, name
        assert 0 < summary["p50_ms"] <= summary["p99_ms"], name
        assert len(summary["trials"]) == 1
        assert summary["trials"][0]["cpu"]["servers"]["cpu_s"] > 0, name
    assert "put_64_throughput" in done.stdout
