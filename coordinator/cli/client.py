"""The operator commands of ``rallypoint``: clients of a running cluster.

``register`` adds the command groups to the program's parser (``cli.py``): ``status``, ``kv``,
``lease``, ``member`` and ``transfer-leader`` (``snapshot`` is ``backup.py``). Every command takes
``--endpoints`` (default ``$RALLYPOINT_ENDPOINTS``, else the local development cluster),
``--timeout``, ``--token`` (default ``$RALLYPOINT_TOKEN``), TLS files, and ``--json``. Human
output is rich tables; ``--json`` prints one JSON document (``kv watch``: one per line).
Failures print one line, ``error: ...``, to stderr and exit 1 (``--debug`` adds a second line
with the transport's own words); an argument out of range is refused before anything is
sent, in one line, with exit code 2. Keys and values are shown as UTF-8, with undecodable
bytes escaped (``\\xff``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from rich.console import Console
from rich.table import Table

from rallypoint.client import (
    TOKEN_ENV,
    Client,
    EndpointStatus,
    KeyValue,
    LeaseNotFoundError,
    Member,
    RallypointError,
    Role,
    TlsConfig,
    WatchEvent,
)
from rallypoint.client.transport import parse_endpoints
from rallypoint.proto.v1.defaults import MAX_LEASE_TTL_MS

from ..version import BASELINE_RECORD_VERSION
from .args import Parser, add_version, integer, seconds

DEFAULT_ENDPOINTS = "127.0.0.1:2379,127.0.0.1:2381,127.0.0.1:2383"
ENDPOINTS_ENV = "RALLYPOINT_ENDPOINTS"

# A string: argparse._SubParsersAction is generic only to type checkers.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class CommandError(Exception):
    """An expected failure of a command (not found, unhealthy): one line on stderr, exit 1."""


@dataclass(frozen=True, slots=True)
class Output:
    as_json: bool

    def json(self, document: object) -> None:
        print(json.dumps(document, indent=2, sort_keys=False))

    def json_line(self, document: object) -> None:
        print(json.dumps(document), flush=True)

    def table(self, table: Table) -> None:
        # Piped output is not cut to rich's default 80 columns.
        width = None if sys.stdout.isatty() else 200
        Console(soft_wrap=True, width=width).print(table)

    def line(self, text: str) -> None:
        print(text, flush=True)


def text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def kv_document(kv: KeyValue) -> dict[str, object]:
    return {
        "key": text(kv.key),
        "value": text(kv.value),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease_id": kv.lease_id,
    }


def member_document(member: Member) -> dict[str, object]:
    return {
        "id": member.member_id,
        "name": member.name,
        "peer_address": member.peer_address,
        "client_address": member.client_address,
        "is_learner": member.is_learner,
    }


def members_table(members: Sequence[Member]) -> Table:
    table = Table(title="members")
    for column in ("id", "name", "peer address", "client address", "learner"):
        table.add_column(column)
    for m in members:
        table.add_row(
            str(m.member_id),
            m.name,
            m.peer_address,
            m.client_address,
            "yes" if m.is_learner else "",
        )
    return table


def kvs_table(kvs: Sequence[KeyValue]) -> Table:
    table = Table()
    for column in ("key", "value", "create rev", "mod rev", "version", "lease"):
        table.add_column(column)
    for kv in kvs:
        table.add_row(
            text(kv.key),
            text(kv.value),
            str(kv.create_revision),
            str(kv.mod_revision),
            str(kv.version),
            str(kv.lease_id or ""),
        )
    return table


# ---------------------------------------------------------------------------- plumbing

Body = Callable[[argparse.Namespace, Client, Output], Awaitable[int]]


def _run(body: Body) -> Callable[[argparse.Namespace], int]:
    """A command handler: build the client, run ``body``, turn failures into one line."""

    def handler(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(_with_client(args, body))
        except KeyboardInterrupt:
            return 0
        except BrokenPipeError:
            return reader_went_away()
        except (RallypointError, CommandError, ValueError, OSError) as error:
            kind = "" if isinstance(error, CommandError) else f"{type(error).__name__}: "
            print(f"error: {kind}{' '.join(str(error).split())}", file=sys.stderr)
            if getattr(args, "debug", False) and isinstance(error, RallypointError):
                _print_debug(error)
            return 1

    return handler


def reader_went_away() -> int:
    """Standard output's reader closed the pipe (``status --json | head``): stop quietly, as
    a Unix tool killed by SIGPIPE does, with its exit status. Standard output now goes to
    /dev/null, so the interpreter's last flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _print_debug(error: RallypointError) -> None:
    """The transport's own words for a failure, for whoever debugs it (``--debug``)."""
    if error.grpc_code or error.grpc_detail:
        detail = " ".join(error.grpc_detail.split())
        where = f" from {error.endpoint}" if error.endpoint else ""
        print(f"debug: gRPC status {error.grpc_code}{where}: {detail}", file=sys.stderr)


def endpoints_argument(text: str) -> str:
    """``--endpoints``: host:port,... each with a port (gRPC would dial 443 without one)."""
    try:
        return ",".join(parse_endpoints(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def make_client(args: argparse.Namespace) -> Client:
    """The client of a command, from the options every client command takes (``_common``)."""
    tls = None
    if args.tls_ca_file or args.tls_cert_file or args.tls_key_file:
        tls = TlsConfig.from_files(args.tls_ca_file, args.tls_cert_file, args.tls_key_file)
    return Client(
        args.endpoints,
        timeout_s=args.timeout,
        attempt_timeout_s=min(args.timeout, 5.0),
        token=args.token,
        tls=tls,
        # A command that only reads leaves no session behind; writes open one on demand.
        open_session_on_connect=False,
        token_hint=f"--token or ${TOKEN_ENV}",
    )


async def _with_client(args: argparse.Namespace, body: Body) -> int:
    async with make_client(args) as client:
        return await body(args, client, Output(args.json))


def _common(*, nested: bool = False) -> argparse.ArgumentParser:
    """The options every client command takes. ``nested``: for a command under another that
    takes them too (``jobs prune``): no defaults of its own, so an option given before the
    subcommand is not overwritten by a default after it."""
    common = argparse.ArgumentParser(add_help=False)

    def default(value: object) -> object:
        return argparse.SUPPRESS if nested else value

    common.add_argument(
        "--endpoints",
        type=endpoints_argument,
        default=default(os.environ.get(ENDPOINTS_ENV) or DEFAULT_ENDPOINTS),
        help=f"comma-separated host:port list (default: ${ENDPOINTS_ENV} or {DEFAULT_ENDPOINTS})",
    )
    common.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON instead of tables"
    )
    common.add_argument(
        "--timeout",
        type=seconds(least_s=0.001),
        default=default(10.0),
        help="seconds per request, retries included (default 10)",
    )
    common.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="after a failure, also print the transport's own words for it",
    )
    common.add_argument(
        "--token",
        default=default(os.environ.get(TOKEN_ENV)),
        help=f"bearer token (default: ${TOKEN_ENV})",
    )
    common.add_argument(
        "--tls-ca-file",
        default=default(None),
        help="PEM CA bundle to verify members (enables TLS)",
    )
    common.add_argument(
        "--tls-cert-file", default=default(None), help="PEM client certificate (mutual TLS)"
    )
    common.add_argument(
        "--tls-key-file", default=default(None), help="PEM client private key (mutual TLS)"
    )
    return common


def _leaf(
    group: SubParsers, name: str, help_text: str, body: Body, common: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, parents=[common]
    )
    parser.set_defaults(handler=_run(body))
    return parser


def _group(subparsers: SubParsers, name: str, help_text: str) -> SubParsers:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    group: SubParsers = parser.add_subparsers(
        dest=f"{name}_command", required=True, metavar="COMMAND"
    )
    return group


# ---------------------------------------------------------------------------- status


def _health(endpoint: EndpointStatus) -> str:
    if endpoint.status is None:
        # No failure words: a member answered, refusing the call (a token, a role).
        return "refused" if endpoint.error and not endpoint.failure else "unreachable"
    if endpoint.status.catching_up:
        return "catching up (lost its data; not voting)"
    return "ok" if endpoint.healthy else "no leader"


def status_document(
    statuses: Sequence[EndpointStatus], members: Sequence[Member]
) -> list[dict[str, Any]]:
    """One row per member (and per endpoint that matches no member): ``status --json``'s
    ``members`` (the dashboard's /api/cluster too)."""
    by_id = {s.status.member_id: s for s in statuses if s.status is not None}
    by_address = {s.endpoint: s for s in statuses}
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for member in members:
        endpoint = by_id.get(member.member_id) or by_address.get(member.client_address)
        rows.append(_status_row(endpoint, member))
        if endpoint is not None:
            seen.add(endpoint.endpoint)
    for endpoint in statuses:
        if endpoint.endpoint not in seen:
            rows.append(_status_row(endpoint, None))
    return rows


def _status_row(endpoint: EndpointStatus | None, member: Member | None) -> dict[str, Any]:
    status = endpoint.status if endpoint is not None else None
    return {
        "id": member.member_id if member else (status.member_id if status else None),
        "name": member.name if member else "",
        "client_address": member.client_address
        if member
        else (endpoint.endpoint if endpoint else ""),
        "peer_address": member.peer_address if member else "",
        "endpoint": endpoint.endpoint if endpoint else None,
        "is_learner": member.is_learner if member else None,
        "role": status.role.value if status else None,
        "is_leader": bool(status and status.role is Role.LEADER),
        "leader_id": status.leader_id if status else None,
        "term": status.term if status else None,
        "commit_index": status.commit_index if status else None,
        "applied_index": status.applied_index if status else None,
        # A release before record versions answers 0: it runs the baseline.
        "record_version": (status.record_version or BASELINE_RECORD_VERSION) if status else None,
        "health": _health(endpoint) if endpoint else "not among the endpoints",
        "error": endpoint.error if endpoint else None,
    }


async def _status(args: argparse.Namespace, client: Client, out: Output) -> int:
    statuses = await client.status()
    members: list[Member] = []
    if any(s.status is not None for s in statuses):
        try:
            members = await client.member_list(serializable=True)
        except RallypointError as error:
            print(f"warning: no member list: {error}", file=sys.stderr)
    rows = status_document(statuses, members)
    version = cluster_version(statuses)
    if out.as_json:
        out.json({"members": rows, "cluster_version": version})
    else:
        out.table(_status_table(rows, statuses, version))
    unhealthy = [s for s in statuses if not s.healthy]
    refused = [s for s in statuses if _health(s) == "refused"]
    if refused and len(refused) == len(statuses):
        # Members answered, and refused: their words say what to check (a token).
        more = f" (and {len(refused) - 1} more endpoints alike)" if len(refused) > 1 else ""
        raise CommandError(f"{refused[0].error}{more}")
    if len(unhealthy) == len(statuses) and all(s.status is None for s in statuses):
        # Nothing answered: the table lists each endpoint; one line says what to check.
        each = "; ".join(f"{s.endpoint}: {s.failure or s.error}" for s in statuses)
        raise CommandError(
            f"no endpoint answered ({each}): is the cluster running, and are these its "
            "members' client ports? (--endpoints, or $RALLYPOINT_ENDPOINTS)"
        )
    if unhealthy:
        raise CommandError(
            f"{len(unhealthy)} of {len(statuses)} endpoints unhealthy: "
            + "; ".join(f"{s.endpoint}: {s.error or _health(s)}" for s in unhealthy)
        )
    return 0


def cluster_version(statuses: Sequence[EndpointStatus]) -> int | None:
    """The cluster version as the members that answered applied it: the highest (a member
    that has not applied the latest raise yet reports the one before; it never goes down);
    None when nobody answered."""
    answered = [s.status for s in statuses if s.status is not None]
    if not answered:
        return None
    return max(s.cluster_version or BASELINE_RECORD_VERSION for s in answered)


def _status_table(
    rows: Sequence[dict[str, Any]], statuses: Sequence[EndpointStatus], version: int | None
) -> Table:
    failures = {s.endpoint: s.failure for s in statuses if s.failure}
    title = "cluster status" if version is None else f"cluster status (cluster version {version})"
    table = Table(title=title)
    for column in (
        "id",
        "name",
        "client address",
        "peer address",
        "role",
        "leader",
        "term",
        "commit",
        "applied",
        "version",
        "health",
    ):
        table.add_column(column)
    for row in rows:
        health = row["health"]
        failure = failures.get(row["endpoint"] or "")
        if failure:
            health = f"{health}: {failure}"
        table.add_row(
            *(
                "" if row[key] is None else str(row[key])
                for key in ("id", "name", "client_address", "peer_address", "role")
            ),
            "*" if row["is_leader"] else "",
            *("" if row[key] is None else str(row[key]) for key in ("term", "commit_index")),
            "" if row["applied_index"] is None else str(row["applied_index"]),
            "" if row["record_version"] is None else str(row["record_version"]),
            health,
        )
    return table


# ---------------------------------------------------------------------------- kv


async def _kv_get(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.prefix:
        kvs = [
            kv
            async for kv in client.range_pages(
                args.key, serializable=args.serializable, keys_only=args.keys_only
            )
        ]
        if args.limit:
            kvs = kvs[: args.limit]
    else:
        kv = await client.get(args.key, serializable=args.serializable)
        if kv is None:
            raise CommandError(f"key {args.key!r} not found")
        kvs = [kv]
    if out.as_json:
        out.json({"kvs": [kv_document(kv) for kv in kvs]})
    else:
        out.table(kvs_table(kvs))
    return 0


async def _kv_put(args: argparse.Namespace, client: Client, out: Output) -> int:
    result = await client.put(
        args.key, args.value, lease=args.lease, prev_kv=args.prev_kv, keep_lease=args.keep_lease
    )
    if out.as_json:
        out.json(
            {
                "revision": result.header.revision,
                "kv": kv_document(result.kv),
                "prev_kv": kv_document(result.prev_kv) if result.prev_kv else None,
            }
        )
    else:
        out.line(f"OK (revision {result.header.revision})")
    return 0


async def _kv_del(args: argparse.Namespace, client: Client, out: Output) -> int:
    result = await client.delete(args.key, prefix=args.prefix)
    if out.as_json:
        out.json({"revision": result.header.revision, "deleted": result.deleted})
    else:
        out.line(f"deleted {result.deleted} key{'s' if result.deleted != 1 else ''}")
    return 0


def _event_document(event: WatchEvent) -> dict[str, object]:
    return {"type": event.type.value, "revision": event.revision, "kv": kv_document(event.kv)}


async def _kv_watch(args: argparse.Namespace, client: Client, out: Output) -> int:
    seen = 0
    async with client.watch(args.key, prefix=args.prefix, start_revision=args.rev) as watcher:
        if not out.as_json:
            print(f"watching from revision {watcher.next_revision}", file=sys.stderr, flush=True)
        async for event in watcher:
            if out.as_json:
                out.json_line(_event_document(event))
            else:
                out.line(
                    f"{event.type.value.upper():6} rev {event.revision:<8} {text(event.kv.key)}"
                    + (f" = {text(event.kv.value)}" if event.type.value == "put" else "")
                )
            seen += 1
            if args.count and seen >= args.count:
                break
    return 0


# ---------------------------------------------------------------------------- lease


async def _lease_grant(args: argparse.Namespace, client: Client, out: Output) -> int:
    lease = await client.grant_lease(args.ttl, keep_alive=False)
    document = {
        "lease_id": lease.lease_id,
        "fencing_token": lease.fencing_token,
        "ttl_s": lease.ttl_s,
    }
    if out.as_json:
        out.json(document)
    else:
        out.line(
            f"lease {lease.lease_id} granted, TTL {lease.ttl_s:g} s, fencing token "
            f"{lease.fencing_token} (keep it alive with `rallypoint lease keep-alive "
            f"{lease.lease_id}`)"
        )
    return 0


async def _lease_keep_alive(args: argparse.Namespace, client: Client, out: Output) -> int:
    while True:
        try:
            ttl_s = await client.keep_alive_once(args.lease_id)
        except LeaseNotFoundError as error:
            raise CommandError(str(error)) from None
        if out.as_json:
            out.json_line({"lease_id": args.lease_id, "ttl_s": ttl_s})
        else:
            out.line(f"lease {args.lease_id} kept alive, TTL {ttl_s:g} s")
        if args.once:
            return 0
        await asyncio.sleep(max(ttl_s / 3, 0.05))


async def _lease_revoke(args: argparse.Namespace, client: Client, out: Output) -> int:
    deleted = await client.revoke_lease(args.lease_id)
    if out.as_json:
        out.json({"lease_id": args.lease_id, "deleted_keys": [text(k) for k in deleted]})
    else:
        out.line(f"lease {args.lease_id} revoked; {len(deleted)} keys deleted")
    return 0


async def _lease_list(args: argparse.Namespace, client: Client, out: Output) -> int:
    leases = await client.lease_list()
    if out.as_json:
        out.json(
            {
                "leases": [
                    {
                        "lease_id": x.lease_id,
                        "fencing_token": x.fencing_token,
                        "ttl_s": x.granted_ttl_s,
                    }
                    for x in leases
                ]
            }
        )
    else:
        table = Table(title="leases")
        for column in ("id", "fencing token", "granted TTL (s)"):
            table.add_column(column)
        for x in leases:
            table.add_row(str(x.lease_id), str(x.fencing_token), f"{x.granted_ttl_s:g}")
        out.table(table)
    return 0


# ---------------------------------------------------------------------------- members


def _show_members(
    out: Output, members: Sequence[Member], message: str | None = None, **extra: object
) -> None:
    """The membership after a change (``message`` says what changed, for humans)."""
    if message is not None and not out.as_json:
        out.line(message)
    if out.as_json:
        out.json({**extra, "members": [member_document(m) for m in members]})
    else:
        out.table(members_table(members))


async def _member_list(args: argparse.Namespace, client: Client, out: Output) -> int:
    _show_members(out, await client.member_list())
    return 0


async def _member_add(args: argparse.Namespace, client: Client, out: Output) -> int:
    added, members = await client.member_add(
        args.peer_address,
        args.client_address,
        member_id=args.id,
        name=args.name,
        as_learner=args.learner,
    )
    kind = "learner" if added.is_learner else "voter"
    message = f"added member {added.member_id} as a {kind}"
    _show_members(out, members, message, added=member_document(added))
    return 0


async def _member_remove(args: argparse.Namespace, client: Client, out: Output) -> int:
    members = await client.member_remove(args.member_id)
    _show_members(out, members, f"removed member {args.member_id}")
    return 0


async def _member_promote(args: argparse.Namespace, client: Client, out: Output) -> int:
    members = await client.member_promote(args.member_id)
    _show_members(out, members, f"promoted member {args.member_id} to voter")
    return 0


async def _transfer_leader(args: argparse.Namespace, client: Client, out: Output) -> int:
    statuses = [s.status for s in await client.status() if s.status is not None]
    leader_id = next((s.leader_id for s in statuses if s.leader_id), 0)
    # Without a member id, target 0: the leader picks the voter whose log matches its own
    # furthest (it knows every follower's progress; cluster.proto, TransferLeader).
    header = await client.transfer_leader(args.member_id or 0)
    target = header.leader_id
    if out.as_json:
        out.json({"previous_leader_id": leader_id, "leader_id": target, "term": header.raft_term})
    else:
        out.line(f"leadership transferred from member {leader_id} to member {target}")
    return 0


# ---------------------------------------------------------------------------- registration


def register(subparsers: SubParsers) -> None:
    """Add the client command groups to the ``rallypoint`` parser. Each leaf sets
    ``handler(args) -> exit code``."""
    common = _common()

    _leaf(
        subparsers,
        "status",
        "every endpoint's view: members, leader, term, progress, health",
        _status,
        common,
    )

    kv = _group(subparsers, "kv", "read, write, delete and watch keys")
    get = _leaf(kv, "get", "read a key (or every key under a prefix)", _kv_get, common)
    get.add_argument("key")
    get.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    get.add_argument(
        "--limit", type=integer(), default=0, help="at most this many keys (--prefix; 0: all)"
    )
    get.add_argument("--keys-only", action="store_true", help="omit values (--prefix)")
    get.add_argument("--serializable", action="store_true", help="answer from any member")
    put = _leaf(kv, "put", "write a key", _kv_put, common)
    put.add_argument("key")
    put.add_argument("value")
    put.add_argument("--lease", type=integer(), default=0, help="attach the key to this lease id")
    put.add_argument("--prev-kv", action="store_true", help="also print the previous value")
    put.add_argument(
        "--keep-lease",
        action="store_true",
        help="keep the key's current lease (needs cluster version 2: see 'rallypoint status')",
    )
    delete = _leaf(kv, "del", "delete a key (or every key under a prefix)", _kv_del, common)
    delete.add_argument("key")
    delete.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    watch = _leaf(kv, "watch", "print changes as they happen (Ctrl-C ends)", _kv_watch, common)
    watch.add_argument("key")
    watch.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    watch.add_argument("--rev", type=integer(), default=0, help="start at this revision (0: now)")
    watch.add_argument(
        "--count", type=integer(), default=0, help="stop after this many events (0: never)"
    )

    lease = _group(subparsers, "lease", "grant, keep alive, revoke and list leases")
    grant = _leaf(lease, "grant", "grant a lease", _lease_grant, common)
    grant.add_argument(
        "ttl",
        type=seconds(least_s=0.001, most_s=MAX_LEASE_TTL_MS / 1000),
        help="time to live in seconds (at least 0.001, at most 604800: 7 days)",
    )
    keep = _leaf(lease, "keep-alive", "keep a lease alive until Ctrl-C", _lease_keep_alive, common)
    keep.add_argument("lease_id", type=integer(least=1))
    keep.add_argument("--once", action="store_true", help="one keep-alive, then exit")
    revoke = _leaf(lease, "revoke", "revoke a lease and delete its keys", _lease_revoke, common)
    revoke.add_argument("lease_id", type=integer(least=1))
    _leaf(lease, "list", "every live lease", _lease_list, common)

    member = _group(subparsers, "member", "list and change the cluster's membership")
    _leaf(member, "list", "the members", _member_list, common)
    add = _leaf(
        member, "add", "add a member (then start it with `serve --join`)", _member_add, common
    )
    add.add_argument("peer_address", help="host:port of the new member's peer service")
    add.add_argument("client_address", help="host:port of the new member's public API")
    add.add_argument(
        "--id", type=integer(), default=0, help="member id (default: the cluster picks)"
    )
    add.add_argument("--name", default="", help="a name for humans")
    add.add_argument(
        "--learner",
        action="store_true",
        help="add as a non-voting learner (promote it once caught up)",
    )
    remove = _leaf(member, "remove", "remove a member", _member_remove, common)
    remove.add_argument("member_id", type=integer(least=1))
    promote = _leaf(member, "promote", "make a caught-up learner a voter", _member_promote, common)
    promote.add_argument("member_id", type=integer(least=1))

    transfer = _leaf(
        subparsers,
        "transfer-leader",
        "hand leadership to a voter (default: the leader picks the most up-to-date one)",
        _transfer_leader,
        common,
    )
    transfer.add_argument(
        "member_id",
        type=integer(),
        nargs="?",
        help="the new leader's member id; omitted (or 0), the leader hands over to the voter "
        "whose log matches its own furthest, as it does itself before stopping on SIGTERM",
    )


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="rallypoint", description="rallypoint client commands"
    )
    add_version(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The client commands alone (``rallypoint``'s own main adds ``serve``, ``cluster`` and
    the rest)."""
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
