"""Prometheus metrics of one member, in a registry of its own (several members may share a
process in tests, and each serves its own ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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


class NodeMetrics:
    def __init__(self, member_id: int) -> None:
        self.registry = CollectorRegistry()
        self.member_id = member_id

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

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP on ``address:port`` (a daemon thread)."""
        start_http_server(port, addr=address, registry=self.registry)
