"""Who enters a job: ``Configure`` creating or changing one, ``Join`` (and its
``replaces``), ``JoinBatch``; participant ids. Part of the deterministic state machine; the
rules are told in :mod:`.rendezvous`'s theory of operation ("Participant ids",
"Replacing", "Batches", "Runs", "Stragglers").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .commands import Configure, Join, JoinBatch
from .errors import (
    ConfigConflict,
    Failure,
    HeldOut,
    InvalidCommand,
    JobClosed,
    JobNotFound,
    LimitExceeded,
    NameTaken,
)
from .jobs import EndReason, JobConfig, Participant, RoundState, Seat
from .results import ConfigureResult, JoinBatchResult, JoinResult, Result
from .rounds import Job, RoundRules, joining_round
from .versions import STRAGGLER_HOLD_VERSION


class JoinRules(RoundRules):
    """Jobs created and configured, participants admitted (see :mod:`.rounds`, "Layers")."""

    def _new_job(self, index: int, now_ms: int, job_id: str, config: JobConfig) -> Failure | Job:
        if len(self.jobs) >= self.limits.max_jobs:
            ended = sorted((j.ended_ms, j.job_id) for j in self.jobs.values() if j.ended)
            if not ended:
                return LimitExceeded("jobs", self.limits.max_jobs)
            del self.jobs[ended[0][1]]
        job = Job(job_id, config, joining_round(1, [], (), now_ms), index)
        self.jobs[job_id] = job
        return job

    def _configure(self, index: int, now_ms: int, command: Configure) -> Result:
        problem = command.config.problem(self.limits)
        if problem:
            return InvalidCommand(f"job {command.job!r}: {problem}")
        job = self.jobs.get(command.job)
        if job is None:
            created = self._new_job(index, now_ms, command.job, command.config)
            if isinstance(created, Failure):
                return created
            self._touch(index, created)
            return ConfigureResult(command.job, True)
        if job.closed:
            job.config = command.config
            job.reopen()
            job.round = joining_round(job.round.number + 1, [], (), now_ms)
            self._touch(index, job)
            return ConfigureResult(command.job, True)
        if job.ended:
            # Finished or failed: a new run; its round (JOINING, empty) takes joins again.
            job.reopen()
            self._touch(index, job)
        conflict = _config_conflict(job, command.config)
        if conflict:
            return ConfigConflict(command.job, conflict)
        if command.config != job.config:
            job.config = command.config
            self._after_change(index, now_ms, job)
        return ConfigureResult(command.job, False)

    def _join_refusal(self, job_id: str, config: JobConfig | None) -> Failure | None:
        """Why a join (or batch) to ``job_id`` with ``config`` is refused before its names are
        looked at, or None; changes nothing (see :meth:`_join_job`)."""
        job = self.jobs.get(job_id)
        if job is None:
            if config is None:
                return JobNotFound(job_id)
            problem = config.problem(self.limits)
            if problem:
                return InvalidCommand(f"job {job_id!r}: {problem}")
            full = len(self.jobs) >= self.limits.max_jobs
            if full and not any(j.ended for j in self.jobs.values()):
                return LimitExceeded("jobs", self.limits.max_jobs)
            return None
        if job.closed:
            return JobClosed(job.job_id)
        if job.ended:
            if config is not None and config != job.config:
                problem = config.problem(self.limits)
                if problem:
                    return InvalidCommand(f"job {job_id!r}: {problem}")
            return None
        if config is not None and config != job.config:
            return ConfigConflict(job.job_id, config.differences(job.config))
        return None

    def _join_job(
        self, index: int, now_ms: int, job_id: str, config: JobConfig | None, resume: bool
    ) -> Job:
        """The job a join goes to, once :meth:`_join_refusal` said None: created with
        ``config`` if absent, or, finished or failed, started again (a new run takes the new
        run's config, and the old run's checkpoints only if ``resume``)."""
        job = self.jobs.get(job_id)
        if job is None:
            assert config is not None
            created = self._new_job(index, now_ms, job_id, config)
            if isinstance(created, Failure):
                raise AssertionError(f"job {job_id!r} not created after the check: {created}")
            return created
        if job.ended:
            if config is not None:
                job.config = config
            job.reopen()
            if not resume:
                job.checkpoints.forget()
        return job

    def _held_out(self, job: Job, name: str, now_ms: int) -> HeldOut | None:
        """The refusal of a new participant named ``name`` while the straggler policy holds
        that name out of ``job`` ("Stragglers"), or None. Read from the round history: the
        newest round a straggler verdict on ``name`` ended, and the job's hold from then."""
        if self.cluster_version < STRAGGLER_HOLD_VERSION:
            return None
        hold_ms = job.config.straggler_hold_windows * job.config.straggler_window_ms
        for record in reversed(job.history):
            if now_ms >= record.ended_ms + hold_ms:
                # The machine's time never goes back (the largest leader time applied), so
                # the history is in end order: every older hold is over too.
                return None
            if record.end_reason is not EndReason.STRAGGLER:
                continue
            if any(m.participant_id == record.ended_by and m.name == name for m in record.members):
                until_ms = record.ended_ms + hold_ms
                return HeldOut(job.job_id, name, record.number, until_ms, until_ms - now_ms)
        return None

    def _take_ids(self, index: int, count: int) -> int:
        """Hand out ``count`` consecutive participant ids for a join at ``index``: the first."""
        first = max(index, self.next_participant_id)
        last = first + count - 1
        self.next_participant_id = last + 1 if last > index else 0
        return first

    def _join(self, index: int, session_id: int, now_ms: int, command: Join) -> Result:
        if not 1 <= len(command.name) <= self.limits.max_name_chars:
            return InvalidCommand(f"name must be 1..{self.limits.max_name_chars} characters")
        if len(command.metadata) > self.limits.max_metadata_bytes:
            return LimitExceeded("participant metadata bytes", self.limits.max_metadata_bytes)
        if len(command.domain) > self.limits.max_domain_chars:
            limit = self.limits.max_domain_chars
            return InvalidCommand(f"a domain must be at most {limit} characters")
        refusal = self._join_refusal(command.job, command.config)
        if refusal is not None:
            return refusal
        if command.replaces < 0:
            return InvalidCommand(f"replaces must be a participant id or 0, not {command.replaces}")
        present = self.jobs.get(command.job)
        if present is not None and command.name not in present.names:
            # Before _join_job: a refused join must not start a new run of an ended job.
            held = self._held_out(present, command.name, now_ms)
            if held is not None:
                return held
        job = self._join_job(index, now_ms, command.job, command.config, command.resume)
        existing = job.names.get(command.name)
        if existing is not None:
            if job.participants[existing].session_id != session_id:
                return NameTaken(job.job_id, command.name, existing)
            return JoinResult(job.job_id, existing, job.round.number, existing in job.waiting)
        replaced = job.participants.get(command.replaces)
        if replaced is not None and replaced.session_id != session_id:
            return InvalidCommand(
                f"participant {command.replaces} of job {job.job_id!r} belongs to another "
                "session: a join replaces only a participant of its own session"
            )
        full = _domain_full(job, {command.domain: 1}, replaced)
        if full is not None:
            return full
        if replaced is not None:
            return self._replace(index, now_ms, job, replaced, command, session_id)
        if job.round.state is RoundState.ACTIVE and len(job.waiting) >= self.limits.max_waiting:
            return LimitExceeded("waiting participants per job", self.limits.max_waiting)
        # A shaped job's JOINING round holds every joiner (its close leaves the rest waiting),
        # bounded as the wait list is.
        if (
            job.round.state is RoundState.JOINING
            and len(job.round.members) >= job.config.max_nodes + self.limits.max_waiting
        ):
            return LimitExceeded("waiting participants per job", self.limits.max_waiting)
        pid = self._take_ids(index, 1)
        job.add(Participant(pid, command.name, command.metadata, session_id, command.domain))
        if job.round.state is RoundState.JOINING:
            members = (*job.round.members, Seat(pid, -1))
            job.round = replace(job.round, members=members)
        else:
            job.waiting.append(pid)
        self._after_change(index, now_ms, job)
        # The round may have closed or ended (scale-up) and its successor taken the joiner.
        return JoinResult(job.job_id, pid, job.round.number, pid in job.waiting)

    def _replace(
        self, index: int, now_ms: int, job: Job, old: Participant, command: Join, session_id: int
    ) -> Result:
        """Join ``command``'s participant in ``old``'s place, in one apply (see "Replacing")."""
        pid = self._take_ids(index, 1)
        r = job.round
        old_id = old.participant_id
        if old_id not in job.waiting and r.state is RoundState.ACTIVE:
            # Recorded while the old participant is still there to be named.
            detail = f"rejoined as participant {pid}"
            self._end_round(index, now_ms, job, EndReason.MEMBER_LEFT, old_id, detail)
        job.drop(old_id)
        job.add(Participant(pid, command.name, command.metadata, session_id, command.domain))
        if old_id in job.waiting:
            job.waiting[job.waiting.index(old_id)] = pid
            self._after_change(index, now_ms, job)
        elif r.state is RoundState.JOINING:
            seats = tuple(s for s in r.members if s.participant_id != old_id)
            # Ids grow in join order, so appending keeps the seats in id order.
            job.round = replace(r, members=(*seats, Seat(pid, -1)))
            self._after_change(index, now_ms, job)
        else:
            # The new participant takes the old one's place ahead of any waiter: the round
            # that opens is the one the old participant's departure alone would have opened,
            # with the same process back in it.
            job.waiting.insert(0, pid)
            survivors = tuple(s for s in r.members if s.participant_id != old_id)
            self._open_next(index, now_ms, job, survivors)
        return JoinResult(job.job_id, pid, job.round.number, pid in job.waiting)

    def _batch_problem(self, command: JoinBatch) -> Failure | None:
        """What is wrong with the batch's entries themselves, naming the first bad one."""
        limits = self.limits
        names, metadata = command.names, command.metadata
        if not 1 <= len(names) <= limits.max_batch_joins:
            return InvalidCommand(
                f"a batch joins 1..{limits.max_batch_joins} participants, got {len(names)}"
            )
        if metadata and len(metadata) != len(names):
            return InvalidCommand(
                f"metadata must be empty or one per name: {len(metadata)} for {len(names)} names"
            )
        domains = command.domains
        if domains and len(domains) != len(names):
            return InvalidCommand(
                f"domains must be empty or one per name: {len(domains)} for {len(names)} names"
            )
        for entry, domain in enumerate(domains):
            if len(domain) > limits.max_domain_chars:
                return InvalidCommand(
                    f"entry {entry}: a domain must be at most {limits.max_domain_chars} characters"
                )
        first: dict[str, int] = {}
        for entry, name in enumerate(names):
            if not 1 <= len(name) <= limits.max_name_chars:
                return InvalidCommand(
                    f"entry {entry}: name must be 1..{limits.max_name_chars} characters"
                )
            if first.setdefault(name, entry) != entry:
                return InvalidCommand(f"entry {entry}: name {name!r} repeats entry {first[name]}")
        for entry, data in enumerate(metadata):
            if len(data) > limits.max_metadata_bytes:
                what = f"participant metadata bytes (entry {entry})"
                return LimitExceeded(what, limits.max_metadata_bytes)
        if batch_bytes(names, metadata) > limits.max_batch_bytes:
            return LimitExceeded("bytes of names and metadata in one batch", limits.max_batch_bytes)
        return None

    def _join_batch(self, index: int, session_id: int, now_ms: int, command: JoinBatch) -> Result:
        """Join every entry, or none (see "Batches" above)."""
        refusal = self._batch_problem(command) or self._join_refusal(command.job, command.config)
        if refusal is not None:
            return refusal
        job = self.jobs.get(command.job)
        fresh = job is None or job.ended  # no participants; its round JOINING and empty
        new: list[int] = []  # entries that add a participant, in request order
        for entry, name in enumerate(command.names):
            existing = None if fresh or job is None else job.names.get(name)
            if existing is None:
                new.append(entry)
            elif job is not None and job.participants[existing].session_id != session_id:
                return NameTaken(job.job_id, name, existing)
        if job is not None:
            for entry in new:
                held = self._held_out(job, command.names[entry], now_ms)
                if held is not None:
                    return held
        if fresh or job is None:
            config = command.config or (job.config if job is not None else None)
            assert config is not None  # _join_refusal: a new job needs a config
            present, joining, waiting = 0, True, 0
        else:
            config, present = job.config, len(job.round.members)
            joining, waiting = job.round.state is RoundState.JOINING, len(job.waiting)
        # Who waits once the batch is in: a JOINING round (or a scale-up's next round) seats
        # joiners up to max_nodes; an ACTIVE round that does not scale up seats none.
        places = config.max_nodes - present if joining or config.scale_up else 0
        left_waiting = max(0, waiting + len(new) - places)
        if left_waiting > self.limits.max_waiting:
            return LimitExceeded("waiting participants per job", self.limits.max_waiting)
        if command.domains and not fresh and job is not None:
            adding: dict[str, int] = {}
            for entry in new:
                domain = command.domains[entry]
                adding[domain] = adding.get(domain, 0) + 1
            full = _domain_full(job, adding, None)
            if full is not None:
                return full
        if command.domains and config.domain_size:
            # A new run or a new job: its domains are empty, but the batch may overfill one.
            counts: dict[str, int] = {}
            for entry in new:
                domain = command.domains[entry]
                counts[domain] = counts.get(domain, 0) + 1
            crowded = sorted(d for d, n in counts.items() if d and n > config.domain_size)
            if crowded:
                return _crowded(command.job, crowded[0], config.domain_size)
        # Checked: from here on nothing refuses.
        job = self._join_job(index, now_ms, command.job, command.config, command.resume)
        if new:
            first = self._take_ids(index, len(new))
            pids = range(first, first + len(new))
            metadata, domains = command.metadata, command.domains
            for pid, entry in zip(pids, new, strict=True):
                name = command.names[entry]
                data = metadata[entry] if metadata else b""
                domain = domains[entry] if domains else ""
                job.add(Participant(pid, name, data, session_id, domain))
            r = job.round
            if r.state is RoundState.JOINING:
                # A shaped job's JOINING round takes every joiner (its close leaves the rest
                # waiting, shapes.py); a flat one's up to max_nodes.
                room = len(new) if job.shaped else job.config.max_nodes - len(r.members)
                seats = tuple(Seat(pid, -1) for pid in pids[:room])
                job.round = replace(r, members=r.members + seats)
                if len(new) > room:
                    self._after_change(index, now_ms, job)  # full: the round closes
                    assert job.round.state is RoundState.ACTIVE, job.round
                    job.waiting.extend(pids[room:])
            else:
                job.waiting.extend(pids)
            self._after_change(index, now_ms, job)
        in_waiting = set(job.waiting)
        ids = tuple(job.names[name] for name in command.names)
        return JoinBatchResult(
            job.job_id,
            ids,
            tuple(pid in in_waiting for pid in ids),
            job.round.number,
            job.round.state,
        )


def batch_bytes(names: Sequence[str], metadata: Sequence[bytes]) -> int:
    """What a JoinBatch's entries weigh against ``max_batch_bytes``: the UTF-8 bytes of its
    names and the bytes of its metadata."""
    return sum(len(name.encode()) for name in names) + sum(len(data) for data in metadata)


def _domain_full(job: Job, adding: dict[str, int], replaced: Participant | None) -> Failure | None:
    """The refusal of a join that would put more than the job's ``domain_size``
    participants in one domain (``adding``: joiners per domain; ``replaced``: a participant
    the join takes the place of), or None."""
    size = job.config.domain_size
    if not size:
        return None
    for domain in sorted(adding):
        if not domain:
            continue
        present = job.in_domain(domain)
        if replaced is not None and replaced.domain == domain:
            present -= 1
        if present + adding[domain] > size:
            return _crowded(job.job_id, domain, size)
    return None


def _crowded(job_id: str, domain: str, size: int) -> Failure:
    return LimitExceeded(f"participants in domain {domain!r} of job {job_id!r}", size)


def _config_conflict(job: Job, config: JobConfig) -> str | None:
    """Why ``config`` cannot replace the open job's now, or None: the round holds more
    members than its max_nodes (a shaped job's JOINING round may: its close seats at most
    max_nodes), an ACTIVE round's world is not a multiple of its unit_size, or a domain
    holds more participants than its domain_size."""
    r = job.round
    present = len(r.members)
    joining_shaped = r.state is RoundState.JOINING and job.shaped
    if config.max_nodes < present and not joining_shaped:
        return f"max_nodes {config.max_nodes} is below the round's {present} members"
    if r.state is RoundState.ACTIVE and present % config.unit_size:
        return f"unit_size {config.unit_size} does not divide the active round's {present} members"
    if config.domain_size:
        for domain, count in sorted(job.domain_counts.items()):
            if count > config.domain_size:
                return (
                    f"domain {domain!r} holds {count} participants, more than domain_size "
                    f"{config.domain_size}"
                )
    return None
