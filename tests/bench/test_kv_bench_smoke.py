"""The KV benchmark runs end to end against a real rallypoint cluster (no etcd needed) and
writes the JSON shape `make bench-kv` promises: machine, versions, per-workload medians with
their trials, the four ratios and the members' CPU per put over etcd's (null when etcd
was not measured)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import no_process_outlives

REPOSITORY = Path(__file__).resolve().parents[2]
RATIO_NAMES = {"put_64_throughput", "put_64_p99", "put_1_p50", "get_1_p50"}
WORKLOADS = {"put_1", "put_8", "get_1", "get_8", "keepalive_1"}


def smoke_run(tmp_path: Path, *arguments: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``kv_bench --smoke`` with ``arguments``: the finished process and its JSON."""
    out = tmp_path / "kv.json"
    command = [sys.executable, "-m", "bench.kv_bench", "--smoke", "--no-plot", f"--out={out}"]
    with no_process_outlives("the KV benchmark"):
        done = subprocess.run(
            [*command, *arguments],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=80,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_smoke_run_writes_results(tmp_path: Path) -> None:
    done, document = smoke_run(tmp_path, "--many-clients=8")

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
    # The members' CPU per acknowledged put: measured for rallypoint, its ratio to etcd's
    # unmeasured (etcd did not run), and the target judged like the other ratios.
    assert document["server_cpu_per_put_us"]["rallypoint"] > 0
    assert "server_cpu_per_put_ratio" in document
    assert document["server_cpu_per_put_ratio"] is None
    assert document["targets"]["server_cpu_per_put_ratio"] == {
        "direction": "<=",
        "target": 2.0,
        "verdict": "not measured",
    }
    for name in ("put_1", "put_8"):
        assert per_workload[name]["server_cpu_per_request_us"] > 0, name
    assert "server_cpu_per_put_ratio" in done.stdout
    assert document["server_cpu_per_request_ratio_by_workload"] == dict.fromkeys(WORKLOADS)


def test_the_per_workload_cpu_ratio_shows_put_1_apart_from_the_put_weighted_one() -> None:
    repository = str(Path(__file__).resolve().parents[2])
    if repository not in sys.path:
        sys.path.insert(0, repository)
    from bench.kv_bench import cpu_per_put, cpu_per_request_ratios

    def workload(cpu_s: float, requests: int) -> dict[str, object]:
        trial = {"requests": requests, "cpu": {"servers": {"cpu_s": cpu_s}}}
        return {"server_cpu_per_request_us": cpu_s / requests * 1e6, "trials": [trial]}

    results = {
        "rallypoint": {"put_1": workload(4.0, 1_000), "put_64": workload(15.0, 100_000)},
        "etcd": {"put_1": workload(1.0, 1_000), "put_64": workload(10.0, 100_000)},
    }
    by_workload = cpu_per_request_ratios(results)
    assert by_workload["put_1"] == pytest.approx(4.0)
    assert by_workload["put_64"] == pytest.approx(1.5)
    # The put-weighted figure is dominated by put_64's puts.
    assert cpu_per_put(results)[1] == pytest.approx(19.0 / 11.0)
    assert cpu_per_request_ratios({"rallypoint": results["rallypoint"]}) == {
        "put_1": None,
        "put_64": None,
    }


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_one_member_run_of_chosen_workloads_judges_no_target(tmp_path: Path) -> None:
    """``--members 1 --workloads put_1``: one member, that workload only, the size recorded,
    and no PASS or MISS (the targets are for 3 members)."""
    done, document = smoke_run(tmp_path, "--members=1", "--workloads=put_1")
    assert document["parameters"]["members"] == 1
    assert set(document["results"]["rallypoint"]) == {"put_1"}
    assert document["results"]["rallypoint"]["put_1"]["errors"] == 0
    verdicts = {target["verdict"] for target in document["targets"].values()}
    assert verdicts == {"(targets are for 3 members)"}
    assert "PASS" not in done.stdout and "MISS" not in done.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--members=0"], "--members must be between 1 and 9, not 0"),
        (["--workloads=put_1,put_2"], "--workloads: unknown workload put_2; choose from"),
        (["--systems=zookeeper"], "--systems takes rallypoint and/or etcd"),
        (["--many-clients=0"], "--many-clients must be at least 1"),
    ],
)
def test_bad_arguments_get_one_line_errors(arguments: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.kv_bench", *arguments],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]
