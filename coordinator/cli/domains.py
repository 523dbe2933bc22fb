"""The failure-domain commands of ``rallypoint``: ``drain DOMAIN [--reason TEXT]``, ``undrain
DOMAIN`` and ``drained``.

A domain is what participants declare when they join (``Client.join(..., domain=...)``; the
elastic loop and the torchrun agent use the host name): the processes that fail together.
Draining one ends, in every job, the ACTIVE round that has a member there (reason
``drained``), and the job re-forms without the domain's participants, who wait until it is
undrained; the workers take that change at a step boundary, so no step is lost. The drain is
replicated (it survives a leader change and a restart), so ``drained`` lists it from any
member. They share ``cli.client``'s plumbing (``--endpoints``, ``--token``, ``--json``, one
line on stderr and exit code 1 on failure).
"""

from __future__ import annotations

import argparse

from rich.table import Table

from rallypoint.client import Client

from .client import Output, SubParsers, _common, _leaf
from .jobs import human_times, local_time


async def _drain(args: argparse.Namespace, client: Client, out: Output) -> int:
    result = await client.drain(args.domain, reason=args.reason)
    if out.as_json:
        out.json(
            {
                "domain": result.domain,
                "changed": result.changed,
                "ended": [{"job": job, "round": number} for job, number in result.ended],
            }
        )
        return 0
    if not result.changed:
        out.line(f"domain {args.domain} was already drained")
        return 0
    ended = ", ".join(f"{job} round {number}" for job, number in result.ended)
    out.line(
        f"drained domain {args.domain}; "
        + (f"ended {ended}" if ended else "no active round had a member there")
    )
    return 0


async def _undrain(args: argparse.Namespace, client: Client, out: Output) -> int:
    changed = await client.undrain(args.domain)
    if out.as_json:
        out.json({"domain": args.domain, "changed": changed})
    elif changed:
        out.line(f"undrained domain {args.domain}: its participants may join rounds again")
    else:
        out.line(f"domain {args.domain} was not drained")
    return 0


async def _drained(args: argparse.Namespace, client: Client, out: Output) -> int:
    domains = await client.drained()
    if out.as_json:
        out.json(
            {
                "drained": [
                    {"domain": d.domain, "reason": d.reason, "since_ms": d.since_ms}
                    for d in domains
                ]
            }
        )
        return 0
    if not domains:
        out.line("no domain is drained")
        return 0
    table = Table(title="drained domains")
    for column in ("domain", "since", "reason"):
        table.add_column(column)
    for d in domains:
        table.add_row(d.domain, local_time(d.since_ms), human_times(d.reason))
    out.table(table)
    return 0


def register(subparsers: SubParsers) -> None:
    """Add the failure-domain commands to the ``rallypoint`` parser."""
    common = _common()
    drain = _leaf(
        subparsers,
        "drain",
        "drain a failure domain (a host) in every job: a round with a member there ends at "
        "a step boundary and re-forms without the domain's participants, who wait until "
        "`undrain` (admin; a job's token may drain only a domain its own workers are in)",
        _drain,
        common,
    )
    drain.add_argument("domain", help="the domain, as the workers declared it (their host)")
    drain.add_argument(
        "--reason",
        default="",
        help="why, in words (at most 1024 characters); shown by `drained` and in the "
        "history of the rounds it ends",
    )
    undrain = _leaf(
        subparsers,
        "undrain",
        "admit a drained domain's participants to rounds again (admin)",
        _undrain,
        common,
    )
    undrain.add_argument("domain")
    _leaf(
        subparsers,
        "drained",
        "the drained failure domains, since when and why",
        _drained,
        common,
    )
