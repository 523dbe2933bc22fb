"""The rendezvous commands of ``rallypoint``: ``jobs``, ``rounds JOB``, ``evict JOB NODE`` and
``close-job JOB``.

They share ``cli_client``'s plumbing: ``--endpoints`` (default ``$RALLYPOINT_ENDPOINTS``, else
the local development cluster), ``--timeout``, ``--token``, TLS files and ``--json``; human
output is rich tables; failures are one line on stderr and exit code 1. Phi is the leader's
reading (GetJob asks the leader when a follower answered).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from rallypoint.client import (
    Client,
    JobStatus,
    RoundInfo,
    RoundMember,
    RoundRecord,
)

from .cli_client import CommandError, Output, SubParsers, _common, _leaf, text


def _member_document(member: RoundMember) -> dict[str, Any]:
    return {
        "participant_id": member.participant_id,
        "name": member.name,
        "rank": member.rank,
        "phi": member.phi,
        "step": member.step,
        "step_ms": member.step_ms,
        "step_ratio": member.step_ratio,
        "metadata": text(member.metadata),
    }


def _round_document(info: RoundInfo) -> dict[str, Any]:
    return {
        "job": info.job,
        "round": info.round,
        "state": info.state.value,
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
    }


def _state(info: RoundInfo) -> str:
    return "closed" if info.job_closed else info.state.value


# ---------------------------------------------------------------------------- jobs


async def _jobs(args: argparse.Namespace, client: Client, out: Output) -> int:
    jobs = await client.list_jobs()
    if out.as_json:
        out.json({"jobs": [_round_document(info) for info in jobs]})
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
            info.reason,
        )
    out.table(table)
    return 0


# ---------------------------------------------------------------------------- rounds


def _members_table(title: str, members: tuple[RoundMember, ...], with_phi: bool) -> Table:
    table = Table(title=title)
    # phi and progress come from the leader: columns of each member's live readings.
    live = ["phi", "step", "ms/step", "vs median"] if with_phi else []
    for column in ["rank", "participant", "name", *live]:
        table.add_column(column)
    for m in members:
        row = ["" if m.rank < 0 else str(m.rank), str(m.participant_id), m.name]
        readings = [
            f"{m.phi:.2f}",
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


async def _rounds(args: argparse.Namespace, client: Client, out: Output) -> int:
    status: JobStatus = await client.get_job(args.job)
    info = status.round
    if out.as_json:
        latest = status.latest_checkpoint
        out.json(
            {
                "round": _round_document(info),
                "history": [_record_document(r) for r in status.history],
                "latest_checkpoint": None
                if latest is None
                else {
                    "checkpoint_id": latest.checkpoint_id,
                    "step": latest.step,
                    "round": latest.round,
                    "world_size": latest.world_size,
                    "uri": latest.uri,
                },
            }
        )
        return 0
    out.line(
        f"job {info.job}: round {info.round} {_state(info)}, world size {info.world_size}, "
        f"fencing token {info.fencing_token}"
    )
    out.line(f"reason: {info.reason}")
    out.table(_members_table(f"round {info.round} members", info.members, with_phi=True))
    if info.waiting:
        out.table(_members_table("waiting for the next round", info.waiting, with_phi=True))
    if status.history:
        out.table(_history_table(status.history))
    if status.latest_checkpoint is not None:
        latest = status.latest_checkpoint
        out.line(
            f"latest checkpoint: step {latest.step} (round {latest.round}, world size "
            f"{latest.world_size}) {latest.uri}"
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
    _leaf(
        subparsers,
        "jobs",
        "every job: current round, state, world size, members, why it is not closing",
        _jobs,
        common,
    )
    rounds = _leaf(
        subparsers,
        "rounds",
        "a job's current round (members, ranks, phi, reason, wait list) and its history",
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
