"""Pre-admission health checks (worker/elastic/health.py).

Claims:
- ``slow_ranks`` blames a rank only when both of its ring links are over factor x the median
  link (and over it by the floor): a healthy neighbour of a slow rank, which shares one slow
  link with it, is not blamed; with fewer than three ranks nobody is;
- the built-in ``CollectiveProbe`` over real gloo (4 processes) names the one rank that
  delivers late and only it; with no slow rank it names nobody;
- a worker whose health check fails drains its own host before its round trains (a job
  token is enough); the others form again without it and train on, and it never trains;
- a bad probe setting or a health_check that is not callable is refused in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rallypoint.client import SyncClient
from rallypoint.worker.elastic import CollectiveProbe, ElasticConfig
from rallypoint.worker.elastic.health import slow_ranks
from tests.integration.harness import running_cluster_with_tokens
from tests.worker.test_elastic import CHANGE_S, START_S, Job

SCRIPT = Path(__file__).with_name("probe_ranks.py")


def test_slow_ranks_blames_the_rank_both_of_whose_links_are_slow() -> None:
    # link[r] is the link from r-1 to r: rank 2 is on links 2 and 3.
    assert slow_ranks([0.01, 0.01, 0.5, 0.5, 0.01], 4.0, 0.05) == [2]
    # One slow link alone (a healthy pair's noise) blames nobody.
    assert slow_ranks([0.01, 0.01, 0.5, 0.01, 0.01], 4.0, 0.05) == []
    # Over the factor but under the floor: timer noise on a quiet machine.
    assert slow_ranks([0.001, 0.001, 0.01, 0.01, 0.001], 4.0, 0.05) == []
    # The ring wraps: rank 0's links are link 0 (from the last rank) and link 1.
    assert slow_ranks([0.5, 0.5, 0.01, 0.01], 4.0, 0.05) == [0]
    assert slow_ranks([0.01, 0.5], 4.0, 0.05) == []


def _probe(tmp_path: Path, world_size: int, slow_rank: int, delay_s: float) -> list[Any]:
    ranks = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(r), str(world_size), str(tmp_path), str(slow_rank),
             str(delay_s)],
            env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"},
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world_size)
    ]  # fmt: skip
    for proc in ranks:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.mark.timeout(300)
def test_the_probe_names_the_rank_that_delivers_late_and_nobody_else(tmp_path: Path) -> None:
    said = _probe(tmp_path, 4, slow_rank=1, delay_s=0.1)
    # Every link alike: nobody is named.
    assert [r["alike"]["verdict"] for r in said] == [None] * 4, said
    verdicts = [r["slow"]["verdict"] for r in said]
    assert verdicts[1] is not None and "rank 1's links" in verdicts[1], said
    assert [v for r, v in enumerate(verdicts) if r != 1] == [None, None, None], said
    # Every rank measured the same links (one all-reduce).
    assert all(r["slow"]["links"] == said[0]["slow"]["links"] for r in said)


def test_bad_settings_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="factor must be > 1"):
        CollectiveProbe(factor=0.5)
    with pytest.raises(ValueError, match="exchanges and size_bytes"):
        CollectiveProbe(exchanges=0)
    with pytest.raises(TypeError, match=r"health_check=\.\.\.\): must be a callable"):
        ElasticConfig(
            "127.0.0.1:1", job="j", name="n", checkpoint_dir="/tmp", min_nodes=1, max_nodes=1,
            health_check="probe",  # type: ignore[arg-type]
        )  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_failing_health_check_drains_its_own_host(tmp_path: Path) -> None:
    """A worker whose health check fails drains its host (with its job's token only) before
    the round trains; the others form again without it and train; it trains in no round."""
    tokens = {"admin-secret": "admin", "health-secret": "job:health"}
    with running_cluster_with_tokens(tmp_path / "cluster", tokens, size=1) as cluster:
        job = Job(
            cluster,
            tmp_path,
            "health",
            "--min-nodes=2",
            "--max-nodes=3",
            "--checkpoint-every=0",
            "--max-steps=2000",
        )
        client = SyncClient(cluster.endpoints, token="admin-secret")
        env = {"RALLYPOINT_TOKEN": "health-secret"}
        try:
            # Every rank runs the check (one program): a rank without one would not join the
            # vote on its outcome, and would wait in its restore for the collective timeout.
            job.spawn("h0", "--host=host-0", "--health-check=pass", env=env)
            job.spawn("h1", "--host=host-1", "--health-check=pass", env=env)
            sick = job.spawn("h2", "--host=host-2", "--health-check=fail", env=env)
            job.wait(lambda: sick.select("health_drained"), START_S, "the sick worker's drain")
            drained_t = sick.select("health_drained")[0]["t"]
            job.wait(
                lambda: job.training_at(["h0", "h1"], 2, drained_t), CHANGE_S, "h0, h1 at world 2"
            )
            (drained,) = client.drained()
            assert drained.domain == "host-2" and "on purpose" in drained.reason, drained
            assert not sick.select("step"), "the sick worker trained"
        finally:
            client.close()
            job.stop_all()
