"""One heartbeat stream per process and job, shared by every participant a client joined.

Theory of operation. :func:`shared_heartbeats` gives each (client, job) one
:class:`ProcessHeartbeats`: one :class:`~.heartbeats.HeartbeatBatcher` (one HeartbeatBatch
stream to one member, the member spreading, failover and hand-off it has) that carries every
:class:`~.rendezvous.Participant` of that client in that job. A training process (an
``ElasticRun``, a torchrun agent for its whole node, a load process simulating a host) thus
costs the cluster one stream and one request per heartbeat interval, not one stream and one
round watch per participant. The stream's first member is picked from the client's session
id, so the processes of a job spread over the members.

- Round changes. The member pushes each carried participant its :class:`Assignment` (round,
  state, rank) when its round moves. An assignment ahead of the participant's view does not
  carry the member list, so the participants behind are brought up to date by a
  linearizable GetJob: one for all the participants of this process that are behind (a
  round change reaches every one of them at once), repeated with backoff until every view
  has caught up with its assignment. So each participant still sees every round it is in,
  with its members, at the cost of one read per process per round change.
- ``gone``. An assignment that says the participant is no longer in the job is checked the
  same way: the fresh view without it marks it lost with the usual reason. If no view can be
  read, it is marked lost on the member's word alone.
- Leaving. :meth:`detach` with ``evidence=False`` releases a participant (it left: its
  silence is not evidence); with ``evidence=True`` it is dropped unannounced (closed without
  leaving: its silence counts, as a dead process's would). The stream closes with its last
  participant, and the next join of the client opens a new one.
- The batcher stopping on its own (the job is gone, an unexpected refusal) ends every
  participant it carried (:meth:`Carried.heartbeat_stopped`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Protocol

from .caller import Caller
from .errors import RallypointError
from .heartbeats import Assignment, HeartbeatBatcher, ProgressSource, reconnect_backoff
from .jobs import get_job
from .rendezvous_errors import JobNotFoundError
from .rendezvous_values import RoundInfo

log = logging.getLogger("rallypoint.client.heartbeats")

__all__ = ["Carried", "ProcessHeartbeats", "shared_heartbeats"]


class Carried(Protocol):
    """What :class:`ProcessHeartbeats` needs of a participant (rendezvous.Participant)."""

    @property
    def participant_id(self) -> int: ...

    def assigned(self, assignment: Assignment) -> None:
        """The member pushed ``assignment`` to this participant."""

    def behind(self) -> bool:
        """Whether its view is behind its latest assignment (a read should follow)."""

    def observe(self, info: RoundInfo) -> bool:
        """Take a fresh view of the job's round."""

    def heartbeat_stopped(self, reason: str) -> None:
        """No heartbeat is sent for it any more, for ``reason``: unless it already left or
        was lost, it is lost now."""


# Per client (its Caller), per job: the one shared stream. Weak: a client dropped without
# close takes its streams' registry with it.
_SHARED: weakref.WeakKeyDictionary[Caller, dict[str, ProcessHeartbeats]] = (
    weakref.WeakKeyDictionary()
)


def shared_heartbeats(caller: Caller, job: str, heartbeat_interval_s: float) -> ProcessHeartbeats:
    """The client's heartbeat stream for ``job``, started (a new one when it has none). The
    interval is the job's: every participant of one job shares it, so the first one's is
    used."""
    streams = _SHARED.setdefault(caller, {})
    shared = streams.get(job)
    if shared is None or shared.closing or shared.batcher.stopped.is_set():
        shared = streams[job] = ProcessHeartbeats(caller, job, heartbeat_interval_s)
    return shared


class ProcessHeartbeats:
    """The participants of one client in one job on one HeartbeatBatch stream; see the
    module docstring. Use it from the client's loop."""

    def __init__(self, caller: Caller, job: str, heartbeat_interval_s: float) -> None:
        self.caller = caller
        self.job = job
        self.batcher = HeartbeatBatcher(
            caller,
            job,
            heartbeat_interval_s=heartbeat_interval_s,
            # Spreads the processes of a job over the members (session ids differ).
            first_endpoint=caller.session_id,
            on_assignment=self._assigned,
        )
        # Invariant: exactly the participants the batcher carries (and not gone).
        self._carried: dict[int, Carried] = {}
        # The read in flight; it reads again until no view is behind (a read that began
        # before an assignment arrived may miss it: its participant is then still behind).
        self._refresh: asyncio.Task[None] | None = None
        # Participants the member called gone, to be told once a view was read (or not).
        self._gone: list[Carried] = []
        self._stop_watch: asyncio.Task[None] | None = None
        self._closed: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"ProcessHeartbeats(job={self.job!r}, carried={sorted(self._carried)})"

    @property
    def closing(self) -> bool:
        """No participant is left: the stream is (being) closed and takes no new one."""
        return self._closed is not None

    @property
    def address(self) -> str:
        """The member the stream goes to now ("" between streams)."""
        return self.batcher.address

    def carry(self, participant: Carried, round_number: int, progress: ProgressSource) -> None:
        """Heartbeat ``participant`` from the next request on, naming ``round_number`` until
        an assignment says otherwise, with the progress ``progress()`` returns."""
        if self.closing:
            raise RuntimeError(f"{self!r} is closed: take a new one from shared_heartbeats")
        pid = participant.participant_id
        self._carried[pid] = participant
        self.batcher.add(pid, round_number)
        self.batcher.follow_progress(pid, progress)
        if self._stop_watch is None:
            self.batcher.start()
            self._stop_watch = asyncio.create_task(
                self._watch_stopped(), name=f"heartbeat stop watch {self.job}"
            )

    def detach(self, participant_id: int, *, evidence: bool) -> asyncio.Task[None] | None:
        """Stop carrying ``participant_id``: released (``evidence`` False: it left) or dropped
        (True: its silence counts). The task closing the stream when it was the last one
        (await it to be sure the stream is gone), else None."""
        if self._carried.pop(participant_id, None) is None:
            return self._closed
        if evidence:
            self.batcher.drop(participant_id)
        else:
            self.batcher.release(participant_id)
        if self._carried:
            return None
        return self._close()

    def _close(self) -> asyncio.Task[None]:
        if self._closed is None:
            streams = _SHARED.get(self.caller)
            if streams is not None and streams.get(self.job) is self:
                del streams[self.job]
            self._closed = asyncio.ensure_future(self._close_all())
        return self._closed

    async def _close_all(self) -> None:
        tasks = [t for t in (self._refresh, self._stop_watch) if t is not None]
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        try:
            await self.batcher.close()
        finally:
            await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    # -------------------------------------------------------------- assignments

    def _assigned(self, assignment: Assignment) -> None:
        carried = self._carried.get(assignment.participant_id)
        if carried is None:
            return
        if assignment.gone:
            # The batcher carries it no more; the participant learns why from a fresh view.
            self._carried.pop(assignment.participant_id, None)
        carried.assigned(assignment)
        if assignment.gone or carried.behind():
            self._refresh_soon(carried if assignment.gone else None)

    def _refresh_soon(self, gone: Carried | None) -> None:
        if gone is not None:
            self._gone.append(gone)
        if self._refresh is not None and not self._refresh.done():
            return
        self._refresh = asyncio.create_task(self._read_views(), name=f"round read {self.job}")

    async def _read_views(self) -> None:
        """Read the job until no carried participant is behind its assignment (and every
        gone one was told)."""
        transport = self.caller.transport
        backoff = reconnect_backoff(self.batcher.heartbeat_interval_s, transport.backoff)
        attempt = 0
        while True:
            try:
                status = await get_job(self.caller, self.job)
            except JobNotFoundError as error:
                for carried in [*self._carried.values(), *self._take_gone()]:
                    carried.heartbeat_stopped(f"its job is gone ({error})")
                self._close_if_empty()
                return
            except RallypointError as error:
                log.debug("reading job %s after a round change failed: %s", self.job, error)
                for carried in self._take_gone():
                    carried.heartbeat_stopped(
                        f"the member its heartbeat goes to says it is gone (no view: {error})"
                    )
                await asyncio.sleep(backoff.delay_s(attempt, transport.rng))
                attempt += 1
                continue
            for carried in [*self._carried.values(), *self._gone]:
                carried.observe(status.round)
            for carried in self._take_gone():
                # A linearizable view cannot still list it; should one, the member's word
                # stands: the batcher no longer carries it.
                carried.heartbeat_stopped(
                    f"the member its heartbeat goes to says it is gone (round {status.round.round})"
                )
            if not self._gone and not any(c.behind() for c in self._carried.values()):
                self._close_if_empty()
                return
            # Still behind: the read began before the change it was for was applied where
            # it was served. Read again, not at once.
            await asyncio.sleep(backoff.delay_s(attempt, transport.rng))
            attempt += 1

    def _close_if_empty(self) -> None:
        """Close the stream once the member's ``gone`` took its last participant (one that
        leaves or is closed closes it through ``detach``)."""
        if not self._carried:
            self._close()

    def _take_gone(self) -> list[Carried]:
        gone, self._gone = self._gone, []
        return gone

    async def _watch_stopped(self) -> None:
        await self.batcher.stopped.wait()
        failure = self.batcher.failure
        if failure is None:
            return  # closed by us
        for carried in list(self._carried.values()):
            carried.heartbeat_stopped(f"its heartbeat stream was refused: {failure}")
