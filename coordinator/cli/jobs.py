"""The rendezvous commands of ``rallypoint``: ``jobs``, ``jobs prune``, ``rounds JOB``, ``evict
JOB NODE`` and ``close-job JOB`` (the failure-domain commands are ``cli.domains``).

A job's state is its lifecycle once it ended (finished, failed, closed), else its round's
(joining, active). ``rounds JOB`` adds each recovery's phases from the round history: the
failure detected (the round's end), the world re-formed (the next round closed) and, when
the workers report progress, training again (the next round's first step) with where its
state came from (the restore source the workers reported: keep, broadcast, replicas, memory,
disk, fresh), and who is held out of the job: a rank the straggler policy evicted may not join
again until its hold has passed (``JobConfig.straggler_hold_windows``; the coordinator refuses
its joins with HELD_OUT until then).

They share ``cli.client``'s plumbing: ``--endpoints`` (default ``$RALLYPOINT_ENDPOINTS``, else
the local development cluster), ``--timeout``, ``--token``, TLS files and ``--json``; human
output is rich tables; failures are one line on stderr and exit code 1. Phi is the leader's
reading (GetJob asks the leader when a follower answered).

Times. The coordinator keeps times as the leader's Unix epoch milliseconds; ``--json`` gives
them as they are (every such key ends in ``_ms``; durations end in ``_s`` or ``_ms`` and say
so), human output as local clock times and how long ago ("10:02:03 (12 s ago)"), reasons
included.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime
from typing import Any

from rich.table import Table

from rallypoint.client import (
    Client,
    EndReason,
    JobState,
    JobStatus,
    RoundInfo,
    RoundMember,
    RoundRecord,
)

from .args import integer, seconds
from .client import CommandError, Output, SubParsers, _common, _leaf, _run, text


def _member_document(member: RoundMember) -> dict[str, Any]:
    return {
        "participant_id": member.participant_id,
        "name": member.name,
        "rank": member.rank,
        "phi": member.phi,
        "step": member.step,
        "step_ms": member.step_ms,
        "step_ratio": member.step_ratio,
        "heartbeat_age_ms": member.heartbeat_age_ms,
        "metadata": text(member.metadata),
        "domain": member.domain,
    }


def _round_document(info: RoundInfo) -> dict[str, Any]:
    return {
        "job": info.job,
        "round": info.round,
        # The job's state (its lifecycle once it ended), as the human table says it; the
        # round's own is round_state.
        "state": _state(info),
        "round_state": info.state.value,
        "world_size": info.world_size,
        "fencing_token": info.fencing_token,
        "store_namespace": info.store_namespace,
        "reason": info.reason,
        "members": [_member_document(m) for m in info.members],
        "waiting": [_member_document(m) for m in info.waiting],
        "opened_ms": info.opened_ms,
        "closed_ms": info.closed_ms,
        "job_closed": info.job_closed,
        "job_revision": info.job_revision,
        "job_state": info.job_state.value,
        "job_ended_ms": info.job_ended_ms,
        "job_end_detail": info.job_end_detail,
        "trained_ms": info.trained_ms,
        "restore": info.restore,
        "spares": info.spares,
    }


def _record_document(record: RoundRecord) -> dict[str, Any]:
    return {
        "round": record.round,
        "members": [
            {"participant_id": m.participant_id, "name": m.name, "rank": m.rank}
            for m in record.members
        ],
        "fencing_token": record.fencing_token,
        "opened_ms": record.opened_ms,
        "closed_ms": record.closed_ms,
        "ended_ms": record.ended_ms,
        "end_reason": record.end_reason.value if record.end_reason else None,
        "ended_by": record.ended_by,
        "detail": record.detail,
        "trained_ms": record.trained_ms,
        "restore": record.restore,
    }


def _state(info: RoundInfo) -> str:
    """The job's lifecycle state once it ended, else its round's."""
    if info.job_closed:
        return "closed"
    state: str = (info.job_state if info.job_state is not JobState.OPEN else info.state).value
    return state


_LEADER_TIME = re.compile(r"leader time (\d+) ms")


def duration(seconds: float) -> str:
    """A duration for people: "0.4 s", "12 s", "4 min 3 s", "2 h 5 min"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def local_time(epoch_ms: int, now_s: float | None = None) -> str:
    """A leader's epoch milliseconds as this machine's local clock time, and how long ago:
    "10:02:03 (12 s ago)" (with the date when it is not today)."""
    now = time.time() if now_s is None else now_s
    when = datetime.fromtimestamp(epoch_ms / 1000)
    today = datetime.fromtimestamp(now).date()
    stamp = when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S")
    ago_s = now - epoch_ms / 1000
    return f"{stamp} ({duration(ago_s)} ago)" if ago_s >= 0 else f"{stamp} (in {duration(-ago_s)})"


def human_times(text: str, now_s: float | None = None) -> str:
    """``text`` (a reason, a detail) with each "leader time N ms" as a local time."""
    return _LEADER_TIME.sub(lambda m: local_time(int(m.group(1)), now_s), text)


def _after_s(start_ms: int, ms: int) -> float | None:
    return round((ms - start_ms) / 1000, 3) if ms else None


def recoveries(status: JobStatus) -> list[dict[str, Any]]:
    """Each round change the workers came back from: the round that ended (detected), the
    next round's close (re-formed) and first step (training again), leader times in ms (None:
    not yet, or not known) and seconds after the detection, and where the next round's state
    came from (``restore``: keep, broadcast, replicas, memory, disk, fresh; None: not
    reported). A round whose successor never formed is left out once the job ended (the
    workers finished, the job was closed)."""
    history, current = status.history, status.round
    names = {m.participant_id: m.name for record in history for m in record.members}
    rows: list[dict[str, Any]] = []
    for position, record in enumerate(history):
        if record.end_reason is EndReason.JOB_CLOSED:
            continue
        later = history[position + 1] if position + 1 < len(history) else None
        closed_ms = later.closed_ms if later is not None else current.closed_ms
        trained_ms = later.trained_ms if later is not None else current.trained_ms
        restore = later.restore if later is not None else current.restore
        if not closed_ms and (later is not None or current.job_state is not JobState.OPEN):
            continue
        detected_ms = record.ended_ms
        rows.append(
            {
                "round": record.round,
                "end_reason": record.end_reason.value if record.end_reason else None,
                "ended_by": names.get(record.ended_by, str(record.ended_by))
                if record.ended_by
                else "",
                "detail": record.detail,
                "detected_ms": detected_ms,
                "reformed_ms": closed_ms or None,
                "training_ms": trained_ms or None,
                "reformed_after_s": _after_s(detected_ms, closed_ms),
                "training_after_s": _after_s(detected_ms, trained_ms),
                "restore": restore or None,
            }
        )
    return rows


def held_out(status: JobStatus, now_ms: int) -> list[dict[str, Any]]:
    """The names the straggler hold keeps out of the job at ``now_ms`` (the leader's epoch
    ms), newest eviction first: each with the round its eviction ended and ``until_ms``. Read
    from the history as the coordinator reads it (coordinator/state/joins.py, ``_held_out``):
    a name's newest straggler eviction, held ``straggler_hold_windows`` windows from its
    round's end. A cluster below version 5 holds no one; this does not ask."""
    config = status.config
    hold_ms = config.straggler_hold_windows * config.straggler_window_ms
    names = {m.participant_id: m.name for record in status.history for m in record.members}
    held: dict[str, dict[str, Any]] = {}
    for record in reversed(status.history):
        until_ms = record.ended_ms + hold_ms
        if record.end_reason is not EndReason.STRAGGLER or now_ms >= until_ms:
            continue
        name = names.get(record.ended_by)
        if name is not None and name not in held:
            held[name] = {"name": name, "round": record.round, "until_ms": until_ms}
    return list(held.values())


def jobs_document(jobs: list[RoundInfo]) -> dict[str, Any]:
    """``rallypoint jobs --json`` (the dashboard's /api/jobs too)."""
    return {"jobs": [_round_document(info) for info in jobs]}


def job_document(status: JobStatus) -> dict[str, Any]:
    """``rallypoint rounds JOB --json`` (the dashboard's /api/jobs/JOB too)."""
    latest = status.latest_checkpoint
    memory = status.latest_memory_snapshot
    config = status.config
    return {
        "round": _round_document(status.round),
        "shape": {
            "unit_size": config.unit_size,
            "domain_size": config.domain_size,
            "units_within_domains": config.units_within_domains,
        },
        "history": [_record_document(r) for r in status.history],
        "recoveries": recoveries(status),
        "held_out": held_out(status, int(time.time() * 1000)),
        "latest_checkpoint": None
        if latest is None
        else {
            "checkpoint_id": latest.checkpoint_id,
            "step": latest.step,
            "round": latest.round,
            "world_size": latest.world_size,
            "uri": latest.uri,
        },
        "latest_memory_snapshot": None
        if memory is None
        else {
            "snapshot_id": memory.snapshot_id,
            "step": memory.step,
            "round": memory.round,
            "world_size": memory.world_size,
            "committed_ms": memory.committed_ms,
        },
    }


# ---------------------------------------------------------------------------- jobs


async def _jobs(args: argparse.Namespace, client: Client, out: Output) -> int:
    jobs = await client.list_jobs()
    if out.as_json:
        out.json(jobs_document(jobs))
        return 0
    table = Table(title="jobs")
    for column in ("job", "round", "state", "world size", "members", "waiting", "reason"):
        table.add_column(column)
    for info in jobs:
        table.add_row(
            info.job,
            str(info.round),
            _state(info),
            str(info.world_size),
            ", ".join(m.name for m in info.members),
            str(len(info.waiting)),
            human_times(info.reason),
        )
    out.table(table)
    return 0


async def _jobs_prune(args: argparse.Namespace, client: Client, out: Output) -> int:
    pruned = await client.prune_jobs(older_than_s=args.older_than, keep=args.keep, jobs=args.job)
    if out.as_json:
        out.json({"pruned": pruned})
    elif pruned:
        out.line(
            f"pruned {len(pruned)} ended job{'s' if len(pruned) != 1 else ''}: " + ", ".join(pruned)
        )
    else:
        out.line("no ended job to prune")
    return 0


# ---------------------------------------------------------------------------- rounds


def _members_table(title: str, members: tuple[RoundMember, ...], with_phi: bool) -> Table:
    table = Table(title=title)
    # phi and progress come from the leader: columns of each member's live readings.
    live = ["phi", "heartbeat age", "step", "ms/step", "vs median"] if with_phi else []
    for column in ["rank", "participant", "name", "domain", *live]:
        table.add_column(column)
    for m in members:
        row = ["" if m.rank < 0 else str(m.rank), str(m.participant_id), m.name, m.domain]
        readings = [
            f"{m.phi:.2f}",
            f"{m.heartbeat_age_ms} ms" if m.heartbeat_age_ms else "",
            str(m.step) if m.step else "",
            f"{m.step_ms:.0f}" if m.step_ms else "",
            f"{m.step_ratio:.2f}x" if m.step_ratio else "",
        ]
        table.add_row(*row, *(readings if with_phi else []))
    return table


def _history_table(history: tuple[RoundRecord, ...]) -> Table:
    names = {m.participant_id: m.name for record in history for m in record.members}
    table = Table(title="history (most recent last)")
    for column in ("round", "members (rank: name)", "token", "ended because", "by", "detail"):
        table.add_column(column)
    for record in history:
        table.add_row(
            str(record.round),
            ", ".join(
                f"{m.rank}: {m.name}" if m.rank >= 0 else m.name
                for m in sorted(record.members, key=lambda m: m.rank)
            ),
            str(record.fencing_token),
            record.end_reason.value if record.end_reason else "",
            names.get(record.ended_by, str(record.ended_by)) if record.ended_by else "",
            record.detail,
        )
    return table


def _recoveries_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="recoveries (local times; + seconds after the detection)")
    for column in (
        "round",
        "ended because",
        "by",
        "detected at",
        "re-formed",
        "training again",
        "restore",
    ):
        table.add_column(column)

    def phase(ms: int | None, after_s: float | None) -> str:
        return f"+{after_s:.2f} s" if ms is not None and after_s is not None else "not yet"

    for row in rows:
        training = phase(row["training_ms"], row["training_after_s"])
        if row["training_ms"] is None and row["reformed_ms"] is not None:
            training = "not reported"
        table.add_row(
            str(row["round"]),
            row["end_reason"] or "",
            row["ended_by"],
            local_time(row["detected_ms"]),
            phase(row["reformed_ms"], row["reformed_after_s"]),
            training,
            row["restore"] or ("not reported" if row["reformed_ms"] is not None else "not yet"),
        )
    return table


def _shape_line(status: JobStatus) -> str:
    """The job's shape and spares: "unit size 2 (units within domains, 4 per domain); 3
    spares waiting"."""
    config, info = status.config, status.round
    notes = []
    if config.units_within_domains:
        notes.append("units within domains")
    if config.domain_size:
        notes.append(f"{config.domain_size} per domain")
    shape = f"unit size {config.unit_size}" + (f" ({', '.join(notes)})" if notes else "")
    held = len(info.waiting) - info.spares
    drained = f", {held} more in drained domains" if held > 0 else ""
    return f"{shape}; {info.spares} spare{'s' if info.spares != 1 else ''} waiting{drained}"


async def _rounds(args: argparse.Namespace, client: Client, out: Output) -> int:
    status: JobStatus = await client.get_job(args.job)
    info = status.round
    if out.as_json:
        out.json(job_document(status))
        return 0
    out.line(
        f"job {info.job}: round {info.round} {_state(info)}, world size {info.world_size}, "
        f"fencing token {info.fencing_token}"
    )
    if info.job_state is not JobState.OPEN and not info.job_closed:
        out.line(f"job {info.job_state.value} at {local_time(info.job_ended_ms)}")
    out.line(f"reason: {human_times(info.reason)}")
    out.line(_shape_line(status))
    out.table(_members_table(f"round {info.round} members", info.members, with_phi=True))
    if info.waiting:
        out.table(_members_table("waiting for the next round", info.waiting, with_phi=True))
    if status.history:
        out.table(_history_table(status.history))
    rows = recoveries(status)
    if rows:
        out.table(_recoveries_table(rows))
    for entry in held_out(status, int(time.time() * 1000)):
        out.line(
            f"held out: {entry['name']} (evicted as a straggler, round {entry['round']}) may "
            f"join again from {local_time(entry['until_ms'])}"
        )
    if status.latest_checkpoint is not None:
        latest = status.latest_checkpoint
        out.line(
            f"latest checkpoint: step {latest.step} (round {latest.round}, world size "
            f"{latest.world_size}) {latest.uri}"
        )
    if status.latest_memory_snapshot is not None:
        memory = status.latest_memory_snapshot
        out.line(
            f"latest memory snapshot: step {memory.step} (round {memory.round}, world size "
            f"{memory.world_size}, id {memory.snapshot_id})"
        )
    return 0


# ---------------------------------------------------------------------------- evict, close


def _participant_id(info: RoundInfo, node: str) -> int:
    """NODE is a participant id or a name, among the members and the waiting."""
    everyone = info.members + info.waiting
    by_name = [m.participant_id for m in everyone if m.name == node]
    if by_name:
        return by_name[0]
    if node.isdigit() and any(m.participant_id == int(node) for m in everyone):
        return int(node)
    known = ", ".join(f"{m.participant_id} ({m.name})" for m in everyone) or "none"
    raise CommandError(f"job {info.job}: no participant {node!r} (participants: {known})")


async def _evict(args: argparse.Namespace, client: Client, out: Output) -> int:
    info = (await client.get_job(args.job)).round
    participant_id = _participant_id(info, args.node)
    ended = await client.evict(args.job, participant_id)
    if out.as_json:
        out.json({"job": args.job, "participant_id": participant_id, "ended_round": ended})
    else:
        outcome = f"; round {ended} ended" if ended else ""
        out.line(f"evicted participant {participant_id} from job {args.job}{outcome}")
    return 0


async def _close_job(args: argparse.Namespace, client: Client, out: Output) -> int:
    ended = await client.close_job(args.job)
    if out.as_json:
        out.json({"job": args.job, "ended_round": ended})
    elif ended:
        out.line(f"job {args.job} closed; round {ended} ended")
    else:
        out.line(f"job {args.job} was already closed")
    return 0


# ---------------------------------------------------------------------------- registration


def register(subparsers: SubParsers) -> None:
    """Add the rendezvous commands to the ``rallypoint`` parser."""
    common = _common()
    jobs = _leaf(
        subparsers,
        "jobs",
        "every job: state (joining, active; finished, failed, closed), current round, world "
        "size, members, why it is not closing (--json: times as *_ms, the leader's Unix epoch "
        "milliseconds)",
        _jobs,
        common,
    )
    jobs_commands = jobs.add_subparsers(dest="jobs_command", metavar="COMMAND")
    prune = jobs_commands.add_parser(
        "prune",
        help="remove ended jobs (finished, failed, closed) and their history",
        description="Remove ended jobs (finished, failed, closed) and their history; open "
        "jobs are never removed. Members also drop ended jobs by themselves, oldest first, "
        "beyond a count and after an age (docs/operations.md, 'Job lifecycle'). Admin only.",
        parents=[_common(nested=True)],
    )
    prune.add_argument("job", nargs="*", help="only these jobs (default: every ended job)")
    prune.add_argument(
        "--older-than",
        type=seconds(allow_zero=True),
        default=0.0,
        help="only jobs that ended at least this many seconds ago (default 0)",
    )
    prune.add_argument(
        "--keep",
        type=integer(),
        default=0,
        help="keep this many of the most recently ended jobs (default 0)",
    )
    prune.set_defaults(handler=_run(_jobs_prune))
    rounds = _leaf(
        subparsers,
        "rounds",
        "a job's current round (members with ranks, domains and phi; reason; unit size and "
        "spares; wait list) and its history",
        _rounds,
        common,
    )
    rounds.add_argument("job")
    evict = _leaf(
        subparsers, "evict", "remove a participant; its ACTIVE round ends", _evict, common
    )
    evict.add_argument("job")
    evict.add_argument("node", help="participant id or name")
    close = _leaf(
        subparsers,
        "close-job",
        "end a job's round and remove every participant (configure reopens it)",
        _close_job,
        common,
    )
    close.add_argument("job")
