"""The leader's view of who hears whom: which member carries each participant.

Theory of operation. Members report the participants they start and stop carrying, and
whom they suspect (``report.py``). From those reports the leader keeps, per participant, the
member that carries it (the latest to attach it), and per member when it last reported.

Verdicts (``Verdict``: propose ``MemberFailed`` with this cause):

- A member's suspicion stands unless the participant is carried by another member now: it
  moved (its stream broke and it reconnected elsewhere, which a client does at once), so the
  old member's silence says nothing. Members report attaches within ``ATTACH_REPORT_MS``,
  well inside the two heartbeat intervals a closed stream waits for a new one.
- Backstop: a participant of a job that no member carries is declared failed when that has
  lasted past its deadline: ``startup_ms`` after it was first seen (joined and never
  heartbeated; ``phi.DetectorSettings.startup_ms`` plus a report period), or ``orphan_ms``
  after it lost its carrier (the member released it, or went silent: no report for
  ``MEMBER_SILENT_MS``, a member that died) without another member attaching it.
- A verdict is proposed again every ``RETRY_MS`` until the participant is gone from the state
  (a proposal can be lost to a leader change).

After a leader change the new leader knows nothing: every member sends it a full report, and
nothing is declared by the backstop for ``grace_ms`` (members' own detectors carry on).

Cost: O(1) per attach, detach and suspicion; the participants of the state are walked at most
every ``SYNC_EVERY_MS`` (to learn new and departed ones), and deadlines sit in a heap.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ..state.view import JobView, StateView
from .phi import DetectorSettings
from .report import Key, LivenessReport, Suspicion

log = logging.getLogger("rallypoint.coverage")

MEMBER_SILENT_MS = 3000
ATTACH_REPORT_MS = 50
ORPHAN_FLOOR_MS = 2000
ORPHAN_INTERVALS = 5
SYNC_EVERY_MS = 200
RETRY_MS = 1000
# How many verdicts of one report are logged one by one (the rest are counted).
LOG_VERDICTS = 8


@dataclass(frozen=True, slots=True)
class Verdict:
    job: str
    participant_id: int
    cause: str
    # "phi", "stream_closed" (a member's) or "unheard" (the backstop's).
    kind: str


def orphan_ms(settings: DetectorSettings) -> int:
    """How long a participant that lost its carrier has to reach another member."""
    return max(ORPHAN_FLOOR_MS, ORPHAN_INTERVALS * settings.heartbeat_interval_ms)


class Coverage:
    """Leader-only soft state; rebuilt from the members' reports after a leader change."""

    def __init__(self, member_id: int, *, report_every_ms: int = 250) -> None:
        self.member_id = member_id
        self.report_every_ms = report_every_ms
        self.carrier: dict[Key, int] = {}
        self._by_member: dict[int, set[Key]] = {}
        self._last_report_ms: dict[int, int] = {}
        # Participants nobody carries -> the deadline for being carried; heap of
        # (deadline, key) entries, stale when the key's deadline differs.
        self._unheard: dict[Key, int] = {}
        self._heap: list[tuple[int, Key]] = []
        # Verdicts proposed and not yet applied -> (verdict, when last proposed).
        self._pending: dict[Key, tuple[Verdict, int]] = {}
        self.grace_until_ms = 0
        self._synced_ms = -SYNC_EVERY_MS
        self._synced_revision = -1
        # Why a participant lost its carrier, for the backstop's cause.
        self._lost_because: dict[Key, str] = {}
        # Suspicions set aside in the report being taken (logged a few, then counted).
        self._set_aside = 0

    # ------------------------------------------------------------ leadership

    def reset(self, now_ms: int, grace_ms: int) -> None:
        """This member became leader: forget everything, believe no backstop verdict for
        ``grace_ms`` (members send full reports meanwhile)."""
        self.carrier.clear()
        self._by_member.clear()
        self._last_report_ms.clear()
        self._unheard.clear()
        self._heap.clear()
        self._pending.clear()
        self._lost_because.clear()
        self.grace_until_ms = now_ms + grace_ms
        self._synced_revision = -1
        self._synced_ms = -SYNC_EVERY_MS

    # ------------------------------------------------------------ reports

    def take(
        self, member: int, report: LivenessReport, state: StateView, now_ms: int
    ) -> list[Verdict]:
        """Apply ``member``'s report; the verdicts its suspicions earn."""
        self._last_report_ms[member] = now_ms
        carried = self._by_member.setdefault(member, set())
        jobs = state.rendezvous.jobs
        if report.full:
            keep = set(report.attach)
            for key in [k for k in carried if k not in keep]:
                self._lose(key, member, state, now_ms, "its member stopped carrying it")
        for key in report.attach:
            job = jobs.get(key[0])
            if job is None or key[1] not in job.participants:
                continue
            old = self.carrier.get(key)
            if old is not None and old != member:
                self._by_member.get(old, set()).discard(key)
            self.carrier[key] = member
            carried.add(key)
            self._unheard.pop(key, None)
            self._lost_because.pop(key, None)
        for key in report.detach:
            self._lose(key, member, state, now_ms, "released by its stream, not carried since")
        verdicts = []
        self._set_aside = 0
        for suspicion in report.suspicions:
            verdict = self._judge(member, suspicion, state, now_ms)
            if verdict is not None:
                verdicts.append(verdict)
        if self._set_aside > LOG_VERDICTS:
            log.info(
                "and %d more of member %d's suspicions set aside: other members carry them",
                self._set_aside - LOG_VERDICTS,
                member,
            )
        return verdicts

    def member_reported(self, member: int, now_ms: int) -> None:
        self._last_report_ms[member] = now_ms

    def _lose(self, key: Key, member: int, state: StateView, now_ms: int, why: str) -> None:
        """``member`` no longer carries ``key``: unless another does, its deadline starts."""
        self._by_member.get(member, set()).discard(key)
        if self.carrier.get(key) != member:
            return
        del self.carrier[key]
        job = state.rendezvous.jobs.get(key[0])
        if job is None or key[1] not in job.participants:
            return
        settings = DetectorSettings.of_job(job.config)
        self._lost_because[key] = why
        self._set_deadline(key, now_ms + orphan_ms(settings))

    def _set_deadline(self, key: Key, deadline_ms: int) -> None:
        self._unheard[key] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, key))

    def _judge(
        self, member: int, suspicion: Suspicion, state: StateView, now_ms: int
    ) -> Verdict | None:
        key = suspicion.key
        job = state.rendezvous.jobs.get(key[0])
        if job is None or key[1] not in job.participants:
            return None
        carrier = self.carrier.get(key)
        if carrier is not None and carrier != member:
            self._set_aside += 1
            if self._set_aside > LOG_VERDICTS:
                return None
            log.info(
                "job %s: participant %d: member %d's suspicion (%s) set aside: member %d "
                "carries it now",
                key[0],
                key[1],
                member,
                suspicion.cause,
                carrier,
            )
            return None
        if carrier == member and suspicion.kind == "stream_closed":
            # The member no longer carries it; nobody does.
            del self.carrier[key]
            self._by_member.get(member, set()).discard(key)
        verdict = Verdict(key[0], key[1], suspicion.cause, suspicion.kind)
        self._pending[key] = (verdict, now_ms)
        return verdict

    # ------------------------------------------------------------ the pass

    def step(self, state: StateView, now_ms: int) -> list[Verdict]:
        """Verdicts due now: the backstop's, and proposals to make again."""
        self._sync(state, now_ms)
        for member, last in list(self._last_report_ms.items()):
            if member == self.member_id or now_ms - last < MEMBER_SILENT_MS:
                continue
            del self._last_report_ms[member]
            keys = self._by_member.pop(member, set())
            if keys:
                log.warning(
                    "member %d sent no liveness report for %.1f s: the %d participants it "
                    "carried must reach another member",
                    member,
                    (now_ms - last) / 1000,
                    len(keys),
                )
            for key in keys:
                self._lose(key, member, state, now_ms, f"member {member} went silent")
        verdicts: list[Verdict] = []
        if now_ms >= self.grace_until_ms:
            heap = self._heap
            jobs = state.rendezvous.jobs
            while heap and heap[0][0] <= now_ms:
                deadline, key = heapq.heappop(heap)
                if self._unheard.get(key) != deadline or key in self._pending:
                    continue
                job = jobs.get(key[0])
                if job is None or key[1] not in job.participants:
                    self._unheard.pop(key, None)
                    continue
                why = self._lost_because.get(key, "it never heartbeated after joining")
                cause = f"no member hears its heartbeats: {why}"
                verdict = Verdict(key[0], key[1], cause, "unheard")
                self._pending[key] = (verdict, now_ms)
                verdicts.append(verdict)
        for key, (verdict, last) in list(self._pending.items()):
            if now_ms - last >= RETRY_MS:
                self._pending[key] = (verdict, now_ms)
                verdicts.append(verdict)
        return verdicts

    def _sync(self, state: StateView, now_ms: int) -> None:
        """Learn new participants (deadline to be carried) and drop departed ones."""
        rendezvous = state.rendezvous
        if rendezvous.revision == self._synced_revision:
            return
        if now_ms - self._synced_ms < SYNC_EVERY_MS:
            return
        self._synced_ms = now_ms
        self._synced_revision = rendezvous.revision
        jobs = rendezvous.jobs
        for key in [k for k in self.carrier if not _present(jobs, k)]:
            member = self.carrier.pop(key)
            self._by_member.get(member, set()).discard(key)
        for key in [k for k in self._unheard if not _present(jobs, k)]:
            del self._unheard[key]
            self._lost_because.pop(key, None)
        for key in [k for k in self._pending if not _present(jobs, k)]:
            del self._pending[key]
        start = max(now_ms, self.grace_until_ms)
        for job_id, job in jobs.items():
            if not job.participants:
                continue
            settings = DetectorSettings.of_job(job.config)
            deadline = start + settings.startup_ms + 2 * self.report_every_ms
            carrier, unheard = self.carrier, self._unheard
            for pid in job.participants:
                key = (job_id, pid)
                if key not in carrier and key not in unheard:
                    self._set_deadline(key, deadline)


def _present(jobs: Mapping[str, JobView], key: Key) -> bool:
    job = jobs.get(key[0])
    return job is not None and key[1] in job.participants
