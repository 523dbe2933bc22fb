"""A state machine fed one entry at a time, with helpers for rendezvous tests."""

from __future__ import annotations

from rallypoint.coordinator.state.commands import CloseRound, Join, MemberFailed
from rallypoint.coordinator.state.jobs import JobConfig
from rallypoint.coordinator.state.rendezvous import Job
from rallypoint.coordinator.state.results import JoinResult, Result

from .test_state_machine import Replica

CONFIG = JobConfig(min_nodes=2, max_nodes=4, last_call_ms=1_000)


class JobReplica(Replica):
    """The state-machine tests' replica, with rendezvous helpers."""

    def join(
        self, session_id: int, name: str, config: JobConfig | None = CONFIG, job: str = "j"
    ) -> JoinResult:
        result = self.do(session_id, Join(job, name, name.encode(), config))
        assert isinstance(result, JoinResult), result
        return result

    def workers(self, count: int, config: JobConfig = CONFIG, job: str = "j") -> list[int]:
        """``count`` workers joined in order, each with its own session: their ids."""
        return [self.join(self.open(), f"w{n}", config, job).participant_id for n in range(count)]

    def fail(self, pid: int, job: str = "j", cause: str = "phi 9.1") -> Result:
        return self.apply(MemberFailed(job, pid, self.job(job).round.number, cause))

    def close_round(self, job: str = "j") -> Result:
        return self.apply(CloseRound(job, self.job(job).round.number))

    def job(self, job: str = "j") -> Job:
        return self.sm.rendezvous.jobs[job]

    def ranks(self, job: str = "j") -> dict[int, int]:
        return {seat.participant_id: seat.rank for seat in self.job(job).round.members}
