"""The liveness port: what the heartbeat services need of this member's failure detection.

The servicers that terminate heartbeat streams (``coordinator/service/heartbeats.py``) talk
to detection only through :class:`LivenessPort`; the member's ``RendezvousSupervisor``
(``coordinator/leader/supervisor.py``) implements it, and servicer tests use a double. There
is one detector API for both kinds of stream: a stream opens a *group* per job for the
participants it carries (a ``HeartbeatBatch`` stream one for all of them, the older
per-participant ``Heartbeat`` stream one per participant), beats it once per request, and
closes it when the stream ends (``local.MemberDetection``).

Every method is called on the event loop, with ``now_ms`` from ``time.monotonic()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .local import StreamClock
from .progress import ProgressReport
from .report import Key

__all__ = ["LivenessPort"]


class LivenessPort(Protocol):
    def open_group(self, job: str, now_ms: int, *, readings: bool = False) -> int:
        """A stream starts carrying participants of ``job``: the id of their group detector
        (one for all of them: they beat in the same requests). ``readings``: the leader is
        sent this group's phi and heartbeat age (a per-participant stream's group, so the
        leader's GetJob shows them as before; a batch stream's are not, as its size may be
        100,000)."""
        ...

    def group_update(self, group: int, members: set[Key], now_ms: int) -> None:
        """The group's participants are now ``members`` (participants of its job): new ones
        are carried from now; one no longer named goes on alone, its silence counting."""
        ...

    def group_beat(self, group: int, now_ms: int) -> None:
        """One request of the group's stream: a heartbeat for each of its participants."""
        ...

    def rounds_named(self, job: str, named: Sequence[tuple[int, int]]) -> None:
        """Carried participants of ``job`` named these rounds in a heartbeat ((participant,
        round): the round each believes current); called when they change. One naming a
        round opened by a failure's verdict was sent after that failure."""
        ...

    def group_release(self, group: int, job: str, participant_id: int) -> None:
        """The group's stream lets the participant go without evidence."""
        ...

    def close_group(self, group: int, now_ms: int, *, closed: bool) -> None:
        """The group's stream ended: abnormally (``closed``: evidence for each of its
        participants) or with nothing to say of them."""
        ...

    def report_progress(
        self, job: str, participant_id: int, progress: ProgressReport, now_ms: int
    ) -> None:
        """Training progress a carried participant reported (the leader judges it; a member
        forwards it)."""
        ...

    def collective_failed(
        self, job: str, round_number: int, peers: Sequence[int], report: str, now_ms: int
    ) -> list[int]:
        """A member of the job's current round ``round_number`` says a collective of it
        failed (checked by the caller); ``peers``: the round's other members. Those whose
        heartbeat stream closed on this member are confirmed failed at once
        (``local.MemberDetection.collective_failed``); which ones."""
        ...

    def request_lag(self, clock: StreamClock, now_ms: int, sent_ms: int) -> None:
        """A request stamped ``sent_ms`` by its sender arrived on the stream whose arrival
        delays ``clock`` keeps (this member's intake lag)."""
        ...

    def serves_heartbeats(self) -> bool:
        """Whether this member can pass on what its heartbeat streams tell it (it leads, or
        a leader took its reports lately); a stream on a member that cannot ends, so its
        workers move."""
        ...

    def phi(self, job: str, participant_id: int) -> float | None:
        """This member's current suspicion of a participant whose heartbeats it receives
        (on the leader, also the reading of the member that serves it one by one; inf once
        a closed stream is confirmed); None for one it does not know of."""
        ...

    def heartbeat_age_ms(self, job: str, participant_id: int) -> int | None:
        """Milliseconds since the participant's last heartbeat (or since it was first
        carried); None for one it does not know of."""
        ...

    def progress_of(self, job: str, participant_id: int) -> tuple[int, float, float] | None:
        """The leader's view of a participant's progress: (last step, ms per step outside
        collectives, ratio to the job's median); None on a follower or when not reported."""
        ...
