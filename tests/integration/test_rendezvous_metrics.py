"""The rendezvous series on every member's ``--metrics-address``, scraped over HTTP from a
real three-member cluster while real workers (``worker_proc.py``) form a round, use its
store, begin a checkpoint, and one of them is SIGKILLed.

Claims: before any job, no series of it exist; once its round is ACTIVE every member counts
the round opened and closed and shows three participants active; the leader counts
heartbeats and samples phi; the workers' store and checkpoint calls are counted by
operation and outcome; after the kill every member counts the round ended with cause
``member_failed`` and the next one opened and closed with two participants, and the leader
timed one detection; and every series the Grafana dashboard uses is on the members' pages.
"""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rallypoint.client import JobConfig

from ..coordinator.test_metrics_dashboard import exported_names, load, used_names
from .harness import ProcessCluster, running_cluster, wait_until
from .test_rendezvous import CONFIG, WorkerProcess, admin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

JOB = "metered"
# (sample name, its labels as sorted (name, value) pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def page(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return text


def scrape(address: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page(address))
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when the member does not export it."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_all(cluster: ProcessCluster) -> dict[int, Samples]:
    return {i: scrape(m.metrics_address) for i, m in sorted(cluster.members.items())}


def total(scraped: dict[int, Samples], name: str, **labels: str) -> float:
    """Summed over members (the leader's series, and the calls each member served)."""
    return sum(value(samples, name, **labels) for samples in scraped.values())


def on_every_member(
    cluster: ProcessCluster, holds: Callable[[Samples], bool], what: str
) -> dict[int, Samples]:
    """Scrape until ``holds`` is true of every member's series (followers apply a moment
    after the leader); the last scrape."""

    def scraped() -> dict[int, Samples] | None:
        found = scrape_all(cluster)
        return found if all(holds(samples) for samples in found.values()) else None

    return wait_until(scraped, 30, what, interval_s=0.2)


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    root = tmp_path_factory.mktemp("metrics")
    with running_cluster(root, 3, tick_ms=50, metrics=True) as running:
        yield running


def test_a_round_change_shows_in_every_members_rendezvous_series(
    cluster: ProcessCluster,
) -> None:
    before = scrape_all(cluster)
    for samples in before.values():
        assert not [key for key in samples if ("job", JOB) in key[1]]
        assert value(samples, "rallypoint_heartbeats_received_total") == 0

    workers = [WorkerProcess(cluster.endpoints, JOB, f"w{i}", CONFIG) for i in range(3)]
    try:
        first = [w.active_round() for w in workers]
        number = first[0]["round"]
        # Two make a round from now on, so the kill re-forms one at once.
        admin(cluster, lambda c: c.configure(JOB, JobConfig(**{**asdict(CONFIG), "min_nodes": 2})))
        for worker in workers:
            worker.wait_for("store_agreed", lambda e: e["round"] == number)
        by_rank = {w.active_round()["rank"]: w for w in workers}
        begun = by_rank[0].command("ckpt_begin 100")
        assert begun["ok"], begun

        formed = on_every_member(
            cluster,
            lambda s: (
                value(s, "rallypoint_participants", job=JOB, state="active") == 3
                and value(s, "rallypoint_rounds_closed_total", job=JOB) >= 1
            ),
            "every member to show the first round closed with three participants",
        )
        for samples in formed.values():
            assert value(samples, "rallypoint_rounds_opened_total", job=JOB) >= 1
            assert value(samples, "rallypoint_participants", job=JOB, state="waiting") == 0
            assert value(samples, "rallypoint_round_close_seconds_count") >= 1
        # Leader-only and per-member series, summed over members.
        assert total(formed, "rallypoint_heartbeats_received_total") > 0
        assert total(formed, "rallypoint_store_operations_total", op="set", outcome="ok") >= 3
        assert total(formed, "rallypoint_store_operations_total", op="wait", outcome="ok") >= 3
        ckpt = "rallypoint_checkpoint_operations_total"
        assert total(formed, ckpt, op="begin", outcome="ok") == 1
        wait_until(
            lambda: total(scrape_all(cluster), "rallypoint_phi_count") > 0,
            10,
            "the leader to sample phi",
        )
        detection = {
            cause: total(formed, "rallypoint_detection_seconds_count", cause=cause)
            for cause in ("phi", "stream_closed")
        }
        assert sum(detection.values()) == 0

        by_rank[2].signal(signal.SIGKILL)
        survivors = [by_rank[0], by_rank[1]]
        told = [w.wait_for("round", lambda e: e["round"] > number) for w in survivors]
        survivors[0].active_round(told[0]["round"])

        after = on_every_member(
            cluster,
            lambda s: (
                value(s, "rallypoint_rounds_ended_total", job=JOB, cause="member_failed") == 1
                and value(s, "rallypoint_participants", job=JOB, state="active") == 2
            ),
            "every member to count the round ended and show two participants",
        )
        for member_id, samples in after.items():
            opened = value(samples, "rallypoint_rounds_opened_total", job=JOB)
            closed = value(samples, "rallypoint_rounds_closed_total", job=JOB)
            assert opened == value(formed[member_id], "rallypoint_rounds_opened_total", job=JOB) + 1
            assert closed == value(formed[member_id], "rallypoint_rounds_closed_total", job=JOB) + 1
            assert (
                value(samples, "rallypoint_round_close_seconds_count")
                == value(formed[member_id], "rallypoint_round_close_seconds_count") + 1
            )
        timed = sum(
            total(after, "rallypoint_detection_seconds_count", cause=cause)
            for cause in ("phi", "stream_closed")
        )
        assert timed == 1
        seconds = sum(
            total(after, "rallypoint_detection_seconds_sum", cause=cause)
            for cause in ("phi", "stream_closed")
        )
        # From the victim's last heartbeat to the verdict: well under the phi window's worth
        # (a loaded machine may stretch it, so the bound is loose).
        assert 0 < seconds < 30
        print(f"\nSIGKILL: detected {seconds:.3f} s after the last heartbeat")
        for member in cluster.members.values():
            families = text_string_to_metric_families(page(member.metrics_address))
            missing = used_names(load()) - set(exported_names(families))
            assert not missing, f"member {member.member_id} lacks {sorted(missing)}"
    finally:
        for worker in workers:
            worker.stop()
