"""Pre-admission health checks (worker/elastic/health.py).

Claims:
- ``slow_ranks`` blames a rank only when both of its ring links are over factor x the median
  link (and over it by the floor): a healthy neighbour of a slow rank, which shares one slow
  link with it, is not blamed; with fewer than three ranks nobody is;
- the built-in ``CollectiveProbe`` over real gloo (4 processes) names the one rank that
  delivers late and only it; with no slow rank it names nobody;
- a worker whose health check fails drains its own host before its round trains (a job
  token is enough); every rank of the round gives it up on the health vote (not on a
  collective's deadline), the others form again without it and train on, and it never
  trains; that holds when only the sick worker has a check, and a check on one healthy
  rank only lets the round form at once: a rank without a check votes "healthy";
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
from tests.integration.harness import ProcessCluster, running_cluster_with_tokens
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


TOKENS = {"admin-secret": "admin", "health-secret": "job:health"}
ENV = {"RALLYPOINT_TOKEN": "health-secret"}
# Why the ranks of a round give it up when a rank's check drained its domain (formation.py).
VOTE_ENDED = "a rank's pre-admission health check drained its domain"


def _job(cluster: ProcessCluster, tmp_path: Path, min_nodes: int) -> Job:
    """Job "health", of up to three workers, that trains on without checkpoints."""
    args = ("--max-nodes=3", "--checkpoint-every=0", "--max-steps=2000")
    return Job(cluster, tmp_path, "health", f"--min-nodes={min_nodes}", *args)


def _drains_and_reforms(tmp_path: Path, checks: dict[str, str | None]) -> None:
    """Workers h0 and h1 (healthy) and h2 (sick, its check fails), each with the health
    check ``checks`` names (None: none): h2 drains its own host before its round trains;
    every rank of that round gives it up on the vote (not on a collective's deadline, nor
    by the hang bound of the drain's planned change), h0 and h1 form again without it and
    train; h2 trains in no round."""
    with running_cluster_with_tokens(tmp_path / "cluster", TOKENS, size=1) as cluster:
        job = _job(cluster, tmp_path, min_nodes=2)
        client = SyncClient(cluster.endpoints, token="admin-secret")
        try:
            workers = {
                name: job.spawn(
                    name,
                    f"--host=host-{name[1:]}",
                    *([f"--health-check={check}"] if check is not None else []),
                    env=ENV,
                )
                for name, check in checks.items()
            }
            sick = workers["h2"]
            job.wait(lambda: sick.select("health_drained"), START_S, "the sick worker's drain")
            drained = sick.select("health_drained")[0]
            job.wait(
                lambda: job.training_at(["h0", "h1"], 2, drained["t"]),
                CHANGE_S,
                "h0, h1 at world 2",
            )
            (domain,) = client.drained()
            assert domain.domain == "host-2" and "on purpose" in domain.reason, domain
            assert not sick.select("step"), "the sick worker trained"
            # Every member of the drained round (the sick worker and one or both of the
            # others) ended it on the vote, and ended it once.
            ended = {
                name: [
                    e["reason"]
                    for e in worker.select("round_ended")
                    if e["round"] == drained["round"]
                ]
                for name, worker in workers.items()
            }
            assert len(ended["h2"]) == 1 and ended["h0"] + ended["h1"], ended
            assert all(
                len(reasons) <= 1 and all(r.startswith(VOTE_ENDED) for r in reasons)
                for reasons in ended.values()
            ), ended
        finally:
            client.close()
            job.stop_all()


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_failing_health_check_drains_its_own_host(tmp_path: Path) -> None:
    """Every rank with a check (one program for the job)."""
    _drains_and_reforms(tmp_path, {"h0": "pass", "h1": "pass", "h2": "fail"})


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_ranks_without_a_health_check_vote_healthy(tmp_path: Path) -> None:
    """Only the sick rank has a check: the others vote "healthy" in the same all-reduce
    (the formation's gate), so they give the round up with it rather than wait in their
    restore for the collective timeout."""
    _drains_and_reforms(tmp_path, {"h0": None, "h1": None, "h2": "fail"})


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_passing_check_on_one_rank_only_forms_the_round(tmp_path: Path) -> None:
    """Only one healthy rank has a check: the round forms at once, with no round given up
    before every rank trained in it."""
    with running_cluster_with_tokens(tmp_path / "cluster", TOKENS, size=1) as cluster:
        job = _job(cluster, tmp_path, min_nodes=3)
        try:
            job.spawn("h0", "--host=host-0", "--health-check=pass", env=ENV)
            job.spawn("h1", "--host=host-1", env=ENV)
            job.spawn("h2", "--host=host-2", env=ENV)
            trained_t = job.wait(
                lambda: job.training_at(["h0", "h1", "h2"], 3, 0.0), START_S, "world 3"
            )
            for worker in job.workers.values():
                assert not worker.select("round_ended"), (worker.name, worker.select("round_ended"))
                (formed,) = worker.select("round_formed")
                assert formed["t"] <= trained_t and formed["world_size"] == 3, formed
        finally:
            job.stop_all()
