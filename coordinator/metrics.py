"""Prometheus metrics of one member, in a registry of its own (several members may share a
process in tests, and each serves its own ``/metrics``).

Theory of operation. Three kinds of series, by who can know them:

- Raft and the replicated state (term, indexes, sessions, leases) and the rendezvous counts
  drawn from the applied log (``round_metrics.py``: participants, rounds opened, closed and
  ended, round close time): every member exports them, and members that applied the same
  log agree. Counters start at zero when a member starts and count what it applies from
  then on (entries it replays past its snapshot included): query them with ``rate`` or
  ``increase``, and take the ``max`` across members.
- The leader's soft state (heartbeats received, detection latency, phi, false-suspicion
  guards, hang and straggler verdicts): only the leader feeds them. A follower's series stay
  where they were when it last led (zero if it never did) and a new leader's start from its
  own, so dashboards ``sum`` them over members.
- Requests a member served (round-store and checkpoint operations, by outcome): each member
  counts its own; ``sum`` over members.

Cardinality. No label ever holds a participant id. The ``job`` label holds job ids, at most
``max_job_labels`` of them at once (first come, first labelled; a job's series go when the
member drops the job): further jobs share ``job="(other)"`` (``OTHER_JOBS``, which no job id
can be). Every other label takes its values from a small fixed set (round states, end
reasons, detection causes, guards, operations, error reasons).

Cost on the heartbeat path: one unlabelled counter increment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .state.jobs import EndReason

_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
# From a round opening to its close: immediate (a full round) to minutes (a last call, or
# waiting for min_nodes).
_ROUND_CLOSE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# From a worker's last sign of life to the leader's verdict: sub-second (a closed stream,
# phi on a fast heartbeat) to minutes (a hang judged on a slow step time).
_DETECTION_BUCKETS_S = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0)
# phi: below 1 is a heartbeat on time; 8 is the usual threshold.
_PHI_BUCKETS = (0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0)

# The job label of every job past the first max_job_labels (not a valid job id).
OTHER_JOBS = "(other)"
# How many jobs get a job label of their own (see the module docstring).
MAX_JOB_LABELS = 100
# The state label of rallypoint_participants, and the cause label of rounds_ended.
PARTICIPANT_STATES = ("joining", "active", "waiting")
END_CAUSES = {reason: reason.name.lower() for reason in EndReason}


class NodeMetrics:
    def __init__(self, member_id: int, max_job_labels: int = MAX_JOB_LABELS) -> None:
        self.registry = CollectorRegistry()
        self.member_id = member_id
        self.max_job_labels = max_job_labels
        # Job id -> its job label (its own id, or OTHER_JOBS past the cap).
        # Invariant: _own_job_labels counts the values that are not OTHER_JOBS.
        self._job_labels: dict[str, str] = {}
        self._own_job_labels = 0

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=self.registry)

        self.term = gauge("rallypoint_raft_term", "The current Raft term.")
        self.is_leader = gauge("rallypoint_is_leader", "1 if this member leads, else 0.")
        self.commit_index = gauge("rallypoint_commit_index", "The highest committed index.")
        self.applied_index = gauge("rallypoint_applied_index", "The highest applied index.")
        self.sessions = gauge("rallypoint_sessions", "Open client sessions.")
        self.leases = gauge("rallypoint_leases", "Live leases.")
        self.leader_changes = Counter(
            "rallypoint_leader_changes",
            "Times this member saw the leader change.",
            registry=self.registry,
        )
        self.proposal_seconds = Histogram(
            "rallypoint_proposal_seconds",
            "From proposing a command to its being applied on this member.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.fsync_seconds = Histogram(
            "rallypoint_wal_write_seconds",
            "Writing and fsyncing one batch of Raft state.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )

        self.peer_entries_received = Counter(
            "rallypoint_peer_entries_received",
            "Log entries peers sent this member (the leader's appends, proposals forwarded to "
            'it), by whether its log already held them exactly (held="true": sent again, '
            "e.g. a probe resent before its answer came; a steady share means replication "
            "is wasting the network).",
            ["held"],
            registry=self.registry,
        )

        self.peer_refusals = Counter(
            "rallypoint_peer_refusals",
            "Authenticated peer traffic this member refused, by reason: replay (a message "
            "bound to another connection, or repeating a counter already seen on its own), "
            "old_format (a member running an older peer protocol), term_out_of_range (a "
            "Raft message whose term no election can reach: a bug or corrupted state at the "
            "sender).",
            ["reason"],
            registry=self.registry,
        )

        self.progress_verdicts = Counter(
            "rallypoint_progress_verdicts",
            "Workers this member, as leader, declared hung or evicted as stragglers.",
            ["cause"],
            registry=self.registry,
        )
        self.step_ratio_max = Gauge(
            "rallypoint_step_ratio_max",
            "Per job, the highest ratio of a worker's time per step outside collectives to "
            "the job's median (leader only; 1 is typical, a straggler is well above).",
            ["job"],
            registry=self.registry,
        )

        # ---- rendezvous, from the applied log (every member; round_metrics.py)
        self.participants = Gauge(
            "rallypoint_participants",
            "Participants per job and state: members of a JOINING round (joining), of an "
            "ACTIVE round (active), or on the wait list (waiting).",
            ["job", "state"],
            registry=self.registry,
        )
        self.spares = Gauge(
            "rallypoint_spares",
            "Per job, waiting participants a round could admit (not in a drained failure "
            "domain): the spares a loss is filled from.",
            ["job"],
            registry=self.registry,
        )
        self.drained_domains = gauge(
            "rallypoint_drained_domains",
            "Failure domains drained (rallypoint drain): their participants join no round.",
        )
        self.rounds_opened = Counter(
            "rallypoint_rounds_opened",
            "Rounds opened (JOINING), per job, as this member applied them.",
            ["job"],
            registry=self.registry,
        )
        self.rounds_closed = Counter(
            "rallypoint_rounds_closed",
            "Rounds closed (membership and ranks fixed, ACTIVE), per job.",
            ["job"],
            registry=self.registry,
        )
        self.rounds_ended = Counter(
            "rallypoint_rounds_ended",
            "Rounds ended, per job and cause (member_failed, member_left, member_evicted, "
            "scale_up, job_closed, straggler, drained).",
            ["job", "cause"],
            registry=self.registry,
        )
        self.round_close_seconds = Histogram(
            "rallypoint_round_close_seconds",
            "From a round opening to its close, on the leader-stamped time of the log (after "
            "a failure: the time the survivors took to re-form).",
            buckets=_ROUND_CLOSE_BUCKETS_S,
            registry=self.registry,
        )

        # ---- failure detection (every member's streams; liveness/, leader/supervisor.py)
        self.heartbeats_received = Counter(
            "rallypoint_heartbeats_received",
            "Worker heartbeats received on the heartbeat streams this member serves.",
            registry=self.registry,
        )
        self.detection_seconds = Histogram(
            "rallypoint_detection_seconds",
            "From a worker's last sign of life to this member suspecting it, by cause: "
            "phi (suspicion crossed the threshold), stream_closed (its heartbeat stream "
            "ended and no new one came): the member serving its stream; hang (from its last "
            "completed step): the leader.",
            ["cause"],
            buckets=_DETECTION_BUCKETS_S,
            registry=self.registry,
        )
        self.phi = Histogram(
            "rallypoint_phi",
            "Phi-accrual suspicion, sampled by each member from the detectors it runs (one "
            "per per-participant stream, one per batch stream): up to 64 a second, in turn; "
            "a confirmed closed stream, infinite, is left out.",
            buckets=_PHI_BUCKETS,
            registry=self.registry,
        )
        self.suspicion_guards = Counter(
            "rallypoint_suspicion_guards",
            "Times a false-suspicion guard held suspicion back: loop_stall (this member's "
            "event loop ran late), intake_lag (requests reach this member late), "
            "leader_grace (a new leader's view of who hears whom starts over), "
            "mass_suspicion (phi against most of what this member carries at once, held "
            "until it persists), stream_reopened (a closed heartbeat stream came back in "
            "time).",
            ["guard"],
            registry=self.registry,
        )

        # ---- requests this member served (service/server.py)
        self.store_operations = Counter(
            "rallypoint_store_operations",
            "Round-store requests this member answered, by operation and outcome (ok, or "
            "the error reason: stale_round, not_leader, deadline_exceeded, ...).",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.streams_opened = Counter(
            "rallypoint_streams_opened",
            "Streaming calls this member accepted, by method (heartbeat_batch, heartbeat, "
            "watch_job, watch, ...): how many streams its clients keep open, e.g. one "
            "heartbeat_batch per training process and job.",
            ["method"],
            registry=self.registry,
        )
        self.checkpoint_operations = Counter(
            "rallypoint_checkpoint_operations",
            "Checkpoint-registry requests this member answered, by operation and outcome "
            "(ok, or the error reason: stale_round, stale_token, not_leader, ...).",
            ["op", "outcome"],
            registry=self.registry,
        )

    # ---------------------------------------------------------------- job labels

    def job_label(self, job_id: str) -> str:
        """The ``job`` label of ``job_id``'s series: its id while fewer than
        ``max_job_labels`` jobs have one, else OTHER_JOBS (kept until ``forget_job``)."""
        label = self._job_labels.get(job_id)
        if label is None:
            own = self._own_job_labels < self.max_job_labels
            label = job_id if own else OTHER_JOBS
            self._own_job_labels += own
            self._job_labels[job_id] = label
        return label

    @property
    def job_labels(self) -> Mapping[str, str]:
        return self._job_labels

    def forget_job(self, job_id: str) -> None:
        """The job is gone: drop its series (if it had a label of its own) and free its
        label for another job."""
        label = self._job_labels.pop(job_id, None)
        if label is None or label == OTHER_JOBS:
            return
        self._own_job_labels -= 1
        series: list[tuple[Counter | Gauge, tuple[str, ...]]] = [
            (self.rounds_opened, (label,)),
            (self.rounds_closed, (label,)),
            (self.step_ratio_max, (label,)),
            (self.spares, (label,)),
        ]
        series += [(self.rounds_ended, (label, cause)) for cause in END_CAUSES.values()]
        series += [(self.participants, (label, state)) for state in PARTICIPANT_STATES]
        for metric, labels in series:
            with contextlib.suppress(KeyError):  # never created
                metric.remove(*labels)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP on ``address:port`` (a daemon thread)."""
        start_http_server(port, addr=address, registry=self.registry)
