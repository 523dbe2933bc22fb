"""The shipped workers heartbeat on one HeartbeatBatch stream per process: ``ElasticRun``
workers (``elastic_worker.py``) and torchrun agents, against a real three-member cluster whose
members count the streams they accept (``rallypoint_streams_opened_total`` by method).

Claims: three elastic workers training together opened three ``heartbeat_batch`` streams in
all and no per-participant ``heartbeat`` stream or ``watch_job``, and the leader hears each
one's progress over them; two torchrun agents (two workers each) that finish their job opened
one ``heartbeat_batch`` stream per agent (its node's participant) and nothing per participant.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.client import SyncClient
from tests.integration.harness import ProcessCluster, running_cluster
from tests.integration.test_rendezvous_metrics import scrape, value
from tests.worker.test_elastic import START_S, Job
from tests.worker.test_torchrun import TorchrunJob

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STREAMS = "rallypoint_streams_opened_total"
METHODS = ("heartbeat_batch", "heartbeat", "watch_job")
NAMES = ["w0", "w1", "w2"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    root = tmp_path_factory.mktemp("worker-streams")
    with running_cluster(root, 3, tick_ms=50, metrics=True) as running:
        yield running


def opened(cluster: ProcessCluster) -> dict[str, float]:
    """Streams of each method the members accepted so far, summed over members."""
    pages = [scrape(member.metrics_address) for member in cluster.members.values()]
    return {
        method: sum(value(page, STREAMS, method=method) for page in pages) for method in METHODS
    }


def test_elastic_workers_heartbeat_on_one_batch_stream_each(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    before = opened(cluster)
    job = Job(cluster, tmp_path, "elastic-streams", "--min-nodes=3", "--max-nodes=3",
              "--step-sleep-s=0.05", "--checkpoint-every=0")  # fmt: skip
    try:
        for name in NAMES:
            job.spawn(name)
        job.wait(lambda: job.training_at(NAMES, 3, 0.0), START_S, "three workers training")

        def stepping() -> bool:
            with SyncClient(cluster.endpoints) as client:
                members = client.get_job(job.job).round.members
            return len(members) == 3 and all(m.step > 0 for m in members)

        job.wait(stepping, 30, "the leader to hear every worker's steps")
        after = opened(cluster)
    finally:
        job.stop_all()
    grown = {method: after[method] - before[method] for method in METHODS}
    assert grown == {"heartbeat_batch": 3, "heartbeat": 0, "watch_job": 0}, grown


def test_a_torchrun_agent_carries_its_node_on_one_batch_stream(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    before = opened(cluster)
    job = TorchrunJob(cluster.endpoints, "torchrun-streams", tmp_path, steps=20)
    try:
        job.finish()
    finally:
        job.kill_all()
    assert len(job.events("done")) == 4
    after = opened(cluster)
    grown = {method: after[method] - before[method] for method in METHODS}
    assert grown == {"heartbeat_batch": 2, "heartbeat": 0, "watch_job": 0}, grown
