"""The liveness report a member sends the leader (peer RPC ``Liveness``), and its encoding.

Theory of operation. A report says, for the participants whose heartbeat streams the
sending member serves: which ones it started carrying (``attach``) and stopped carrying
without suspicion (``detach``: released, or their job no longer has them) since its last
report, or all it carries (``full``: its first report to a leader, or after a report was
lost); the latest training progress each reported; whom it suspects and why; and its own
health (intake lag, so an operator can see a member that is behind); and, while a job's
round is held for a failed member's host-mates, how recently each of its participants was
heard (``heard``) and the highest round its heartbeats named (``named``). Reports go a few
times a second, and at once when there is a suspicion.

Replays: the report names the sending process (``boot``, random per start) and numbers its
reports (``seq``); the leader takes only increasing numbers from one process, so a copy of
an old report replayed on the peer port (which the MAC alone allows) changes nothing.

Encoding: msgpack of a map with a format version ``v``; unknown keys are ignored (a newer
member may add some), a version this member cannot read, a wrong type or an oversized list is
refused with :class:`BadReport` (the peer service answers INVALID_ARGUMENT and keeps nothing).
Participants are grouped per job: ``{job: [participant ids]}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from .progress import ProgressReport

VERSION = 1
# A report larger than this many participants in all is refused (a full report of a member
# carrying every participant of a 1M-participant cluster still fits).
MAX_ENTRIES = 2_000_000
MAX_CAUSE_CHARS = 512
# Readings a report carries at most (the rest are not shown by the leader's GetJob).
MAX_READINGS = 4096
# phi as a reading: thousandths, an infinite phi (a confirmed closed stream) as this.
PHI_INFINITE_MILLI = 1 << 40
MAX_RESTORE_CHARS = 32

Key = tuple[str, int]


class BadReport(ValueError):
    """A report that cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class Suspicion:
    """A member suspects a participant whose stream it serves."""

    job: str
    participant_id: int
    # "phi" (silence on an open stream) or "stream_closed" (the stream ended, no new one).
    kind: str
    # In words, for the round's record.
    cause: str
    # How long the participant had been silent when suspected.
    silent_ms: int

    @property
    def key(self) -> Key:
        return (self.job, self.participant_id)


@dataclass(slots=True)
class LivenessReport:
    full: bool = False
    attach: list[Key] = field(default_factory=list)
    detach: list[Key] = field(default_factory=list)
    suspicions: list[Suspicion] = field(default_factory=list)
    progress: list[tuple[Key, ProgressReport]] = field(default_factory=list)
    # The member's intake lag (ms) when it sent the report.
    intake_lag_ms: int = 0
    # The sending process (random per process start) and the report's number in it: the
    # leader refuses a number it has already seen from that process (a replayed report).
    boot: int = 0
    seq: int = 0
    # Detector readings of the participants the member watches one by one (per-participant
    # streams; at most MAX_READINGS): (key, phi in thousandths, ms since its last heartbeat),
    # so the leader's GetJob shows every worker's phi, not only its own streams'.
    readings: list[tuple[Key, int, int]] = field(default_factory=list)
    # For the participants of jobs whose JOINING round is held for a failed member's domain
    # (rendezvous.py, "Failure domains") that this member carries on an open stream: ms
    # since their last heartbeat. The leader closes a held round only once every one of its
    # members is known alive after the failure, or removed (supervisor.py, ``_in_doubt``).
    heard: list[tuple[Key, int]] = field(default_factory=list)
    # For the same participants: the highest round their heartbeats named (the round each
    # believed current). A heartbeat naming a round opened by a failure's verdict was sent
    # after that failure: the leader takes it as word of life with no margin. Encoded only
    # when any, under a key a member that does not know it ignores.
    named: list[tuple[Key, int]] = field(default_factory=list)
    # The participants whose heartbeat stream closed on this member and that are neither
    # heard since nor confirmed failed yet (their confirmation window runs): all of them,
    # not what changed. The leader confirms them at once when a peer of theirs reported a
    # failed collective to it (supervisor.py, ``_corroborate``). Encoded only when any.
    closed: list[Key] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.full or self.attach or self.detach or self.suspicions or self.progress)


def _group(keys: list[Key]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for job, pid in keys:
        grouped.setdefault(job, []).append(pid)
    return grouped


def encode(report: LivenessReport) -> bytes:
    body: dict[str, Any] = {
        "v": VERSION,
        "full": report.full,
        "attach": _group(report.attach),
        "detach": _group(report.detach),
        "suspect": [
            [s.job, s.participant_id, s.kind, s.cause, s.silent_ms] for s in report.suspicions
        ],
        "progress": [
            [
                job,
                pid,
                p.round,
                p.step,
                p.step_age_ms,
                p.step_ms,
                p.collectives_entered,
                p.waiting_in,
                p.waiting_ms,
                p.restore,
            ]
            for (job, pid), p in report.progress
        ],
        "lag": report.intake_lag_ms,
        "readings": [[job, pid, phi, age] for (job, pid), phi, age in report.readings],
        "heard": [[job, pid, age] for (job, pid), age in report.heard],
        "boot": report.boot,
        "seq": report.seq,
    }
    if report.closed:
        body["closed"] = _group(report.closed)
    if report.named:
        body["named"] = [[job, pid, round_number] for (job, pid), round_number in report.named]
    return bytes(msgpack.packb(body, use_bin_type=True))


def _int(value: Any, what: str, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or value >= 1 << 64:
        raise BadReport(f"{what} must be an integer >= {lo}, got {value!r:.40}")
    return value


def _str(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise BadReport(f"{what} must be a string of at most {limit} characters")
    return value


def _keys(value: Any, what: str, budget: list[int]) -> list[Key]:
    if not isinstance(value, dict):
        raise BadReport(f"{what} must map job ids to participant ids")
    keys: list[Key] = []
    for job, pids in value.items():
        _str(job, f"{what} job id", 128)
        if not isinstance(pids, list):
            raise BadReport(f"{what}[{job}] must be a list of participant ids")
        budget[0] -= len(pids)
        if budget[0] < 0:
            raise BadReport(f"the report names more than {MAX_ENTRIES} participants")
        keys.extend((job, _int(pid, f"{what}[{job}] participant id", 1)) for pid in pids)
    return keys


def _readings(value: Any) -> list[tuple[Key, int, int]]:
    if not isinstance(value, list) or len(value) > MAX_READINGS:
        raise BadReport(f"readings must be a list of at most {MAX_READINGS}")
    out = []
    for entry in value:
        if not isinstance(entry, list) or len(entry) != 4:
            raise BadReport("a reading must be [job, participant, phi_milli, age_ms]")
        key = (_str(entry[0], "reading job id", 128), _int(entry[1], "reading participant", 1))
        out.append((key, _int(entry[2], "reading phi"), _int(entry[3], "reading age")))
    return out


def _heard(value: Any, budget: list[int], what: str, third: str) -> list[tuple[Key, int]]:
    """A ``heard`` or ``named`` list: [job, participant, ``third``] entries."""
    if not isinstance(value, list):
        raise BadReport(f"{what} must be a list")
    budget[0] -= len(value)
    if budget[0] < 0:
        raise BadReport(f"the report names more than {MAX_ENTRIES} participants")
    out = []
    for entry in value:
        if not isinstance(entry, list) or len(entry) != 3:
            raise BadReport(f"a {what} entry must be [job, participant, {third}]")
        key = (_str(entry[0], f"{what} job id", 128), _int(entry[1], f"{what} participant", 1))
        out.append((key, _int(entry[2], f"{what} {third}")))
    return out


def decode(payload: bytes) -> LivenessReport:
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise BadReport(f"the report is not msgpack: {exc}") from None
    if not isinstance(body, dict):
        raise BadReport("the report must be a map")
    version = body.get("v")
    if version != VERSION:
        raise BadReport(f"report format version {version!r} is not {VERSION}")
    budget = [MAX_ENTRIES]
    report = LivenessReport(
        full=bool(body.get("full", False)),
        attach=_keys(body.get("attach", {}), "attach", budget),
        detach=_keys(body.get("detach", {}), "detach", budget),
        intake_lag_ms=_int(body.get("lag", 0), "lag"),
        readings=_readings(body.get("readings", [])),
        boot=_int(body.get("boot", 0), "boot"),
        seq=_int(body.get("seq", 0), "seq"),
    )
    report.heard = _heard(body.get("heard", []), budget, "heard", "age_ms")
    report.named = _heard(body.get("named", []), budget, "named", "round")
    report.closed = _keys(body.get("closed", {}), "closed", budget)
    suspect = body.get("suspect", [])
    progress = body.get("progress", [])
    if not isinstance(suspect, list) or not isinstance(progress, list):
        raise BadReport("suspect and progress must be lists")
    budget[0] -= len(suspect) + len(progress)
    if budget[0] < 0:
        raise BadReport(f"the report names more than {MAX_ENTRIES} participants")
    for entry in suspect:
        if not isinstance(entry, list) or len(entry) < 5:
            raise BadReport("a suspicion must be [job, participant, kind, cause, silent_ms]")
        kind = entry[2]
        if kind not in ("phi", "stream_closed"):
            raise BadReport(f"unknown suspicion kind {kind!r:.40}")
        report.suspicions.append(
            Suspicion(
                _str(entry[0], "suspicion job id", 128),
                _int(entry[1], "suspicion participant id", 1),
                kind,
                _str(entry[3], "suspicion cause", MAX_CAUSE_CHARS),
                _int(entry[4], "suspicion silent_ms"),
            )
        )
    for entry in progress:
        if not isinstance(entry, list) or len(entry) < 10:
            raise BadReport("a progress entry has 10 fields")
        step_ms = entry[5]
        if not isinstance(step_ms, (int, float)) or isinstance(step_ms, bool):
            raise BadReport("progress step_ms must be a number")
        report.progress.append(
            (
                (_str(entry[0], "progress job id", 128), _int(entry[1], "progress participant", 1)),
                ProgressReport(
                    round=_int(entry[2], "progress round"),
                    step=_int(entry[3], "progress step"),
                    step_age_ms=_int(entry[4], "progress step_age_ms"),
                    step_ms=float(step_ms),
                    collectives_entered=_int(entry[6], "progress collectives_entered"),
                    waiting_in=_int(entry[7], "progress waiting_in"),
                    waiting_ms=_int(entry[8], "progress waiting_ms"),
                    restore=_str(entry[9], "progress restore", MAX_RESTORE_CHARS),
                ),
            )
        )
    return report
