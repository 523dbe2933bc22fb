"""Rendezvous series from the applied log (``round_metrics.py``): what a look counts between
two batches, the participant gauges, the job-label cap, and series dropped with their job."""

from __future__ import annotations

from rallypoint.coordinator.metrics import OTHER_JOBS, NodeMetrics
from rallypoint.coordinator.round_metrics import RoundObserver, mark_of, round_changes
from rallypoint.coordinator.state.commands import CloseJob, Drain, Join, Leave, PruneJobs
from rallypoint.coordinator.state.jobs import JobConfig
from rallypoint.coordinator.state.results import JoinResult

from .job_replica import JobReplica

# Two make a round, at once (no last call); up to four.
CONFIG = JobConfig(min_nodes=2, max_nodes=4, last_call_ms=0)


def sample(metrics: NodeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_changes_between_two_looks_whatever_entries_they_took() -> None:
    replica = JobReplica()
    pids = replica.workers(3, CONFIG)
    job = replica.job()
    # Seen for the first time: round 1 opened and, two joins in, closed (the third waits
    # for no one: a JOINING round takes joiners until it closes, then they wait).
    changes = round_changes(None, job)
    assert changes.opened == 1 and len(changes.close_seconds) == 1 and changes.ended == ()
    before = mark_of(job)
    assert round_changes(before, job).opened == 0  # nothing since
    # A member fails: round 1 ends, round 2 opens with the survivors and closes at once.
    replica.time_ms += 1_500
    replica.fail(pids[0])
    changes = round_changes(before, replica.job())
    assert changes.opened == 1
    assert changes.ended == ("member_failed",)
    assert changes.close_seconds == (0.0,)  # re-formed in the same apply
    # Two changes in one batch: a leave ends round 2 (round 3 opens, one member: JOINING),
    # then the job closes. Looked at once, both ends count.
    before = mark_of(replica.job())
    session = replica.open()
    replica.do(session, Leave("j", pids[1]))
    replica.do(session, CloseJob("j"))
    changes = round_changes(before, replica.job())
    assert changes.ended == ("member_left", "job_closed")
    assert changes.opened == 1 and changes.close_seconds == ()


def test_the_observer_counts_from_its_first_look_and_keeps_the_gauges() -> None:
    replica = JobReplica()
    metrics = NodeMetrics(1)
    observer = RoundObserver(metrics)
    pids = replica.workers(2, CONFIG)
    observer.observe(replica.sm.rendezvous)  # the first look: taken as it is
    assert sample(metrics, "rallypoint_rounds_opened_total", job="j") == 0
    assert sample(metrics, "rallypoint_participants", job="j", state="active") == 2
    late = replica.join(replica.open(), "late", CONFIG).participant_id
    observer.observe(replica.sm.rendezvous)
    assert sample(metrics, "rallypoint_participants", job="j", state="waiting") == 1
    replica.time_ms += 250
    replica.fail(pids[0])
    observer.observe(replica.sm.rendezvous)
    observer.observe(replica.sm.rendezvous)  # nothing new: nothing counted twice
    assert sample(metrics, "rallypoint_rounds_opened_total", job="j") == 1
    assert sample(metrics, "rallypoint_rounds_closed_total", job="j") == 1
    assert sample(metrics, "rallypoint_rounds_ended_total", job="j", cause="member_failed") == 1
    assert sample(metrics, "rallypoint_round_close_seconds_count") == 1
    # The survivor and the waiter form round 2.
    assert sample(metrics, "rallypoint_participants", job="j", state="active") == 2
    assert sample(metrics, "rallypoint_participants", job="j", state="waiting") == 0
    assert late in replica.job().round.member_ids


def test_jobs_past_the_cap_share_one_label_and_a_dropped_job_takes_its_series() -> None:
    replica = JobReplica()
    metrics = NodeMetrics(1, max_job_labels=1)
    observer = RoundObserver(metrics)
    observer.observe(replica.sm.rendezvous)
    for job, count in (("a", 2), ("b", 2), ("c", 3)):
        for n in range(count):
            replica.join(replica.open(), f"{job}{n}", CONFIG, job)
    observer.observe(replica.sm.rendezvous)
    assert dict(metrics.job_labels) == {"a": "a", "b": OTHER_JOBS, "c": OTHER_JOBS}
    # b and c closed their rounds with two each; c's third waits.
    assert sample(metrics, "rallypoint_participants", job=OTHER_JOBS, state="active") == 4
    assert sample(metrics, "rallypoint_participants", job=OTHER_JOBS, state="waiting") == 1
    assert sample(metrics, "rallypoint_rounds_closed_total", job=OTHER_JOBS) == 2
    # Job a closes and is pruned: its series go, and its label is free for the next job.
    session = replica.open()
    replica.do(session, CloseJob("a"))
    observer.observe(replica.sm.rendezvous)
    assert sample(metrics, "rallypoint_rounds_ended_total", job="a", cause="job_closed") == 1
    metrics.step_ratio_max.labels(metrics.job_label("a")).set(1.5)  # as the leader would
    replica.do(session, PruneJobs(older_than_ms=0, keep=0, jobs=("a",)))
    observer.observe(replica.sm.rendezvous)
    assert "a" not in replica.sm.rendezvous.jobs
    names = {
        (sample.name, sample.labels.get("job"))
        for family in metrics.registry.collect()
        for sample in family.samples
    }
    assert not [name for name, job in names if job == "a"]
    for n in range(2):
        replica.join(replica.open(), f"d{n}", CONFIG, "d")
    observer.observe(replica.sm.rendezvous)
    assert metrics.job_labels["d"] == "d"
    assert sample(metrics, "rallypoint_participants", job="d", state="active") == 2


def test_spares_leave_out_drained_domains_and_the_drained_count_follows_drains() -> None:
    """A drain that ends no round (its domain's only participant waits) moves no job's
    revision, yet changes the job's spares and the drained count."""
    replica = JobReplica()
    metrics = NodeMetrics(1)
    observer = RoundObserver(metrics)
    pair = JobConfig(min_nodes=2, max_nodes=2, last_call_ms=0)
    for name, domain in (("a0", "host-a"), ("b0", "host-b"), ("c0", "host-c")):
        assert isinstance(
            replica.do(replica.open(), Join("j", name, b"", pair, domain=domain)), JoinResult
        )
    observer.observe(replica.sm.rendezvous)
    assert sample(metrics, "rallypoint_spares", job="j") == 1  # c0 waits
    assert sample(metrics, "rallypoint_drained_domains") == 0
    operator = replica.open()
    replica.do(operator, Drain("host-c", drain=True, reason="ECC errors"))
    observer.observe(replica.sm.rendezvous)
    assert sample(metrics, "rallypoint_spares", job="j") == 0
    assert sample(metrics, "rallypoint_participants", job="j", state="waiting") == 1
    assert sample(metrics, "rallypoint_drained_domains") == 1
    replica.do(operator, Drain("host-c", drain=False))
    observer.observe(replica.sm.rendezvous)
    assert sample(metrics, "rallypoint_spares", job="j") == 1
    assert sample(metrics, "rallypoint_drained_domains") == 0
