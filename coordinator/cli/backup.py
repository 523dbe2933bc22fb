"""``rallypoint snapshot``: backups of the cluster's state, and log compaction.

- ``snapshot save FILE``: the leader streams its state at one applied index (after a
  linearizable read barrier) in chunks; the file is checked (``backup_file.parse``) before
  it is written, durably, under its name (temp file, fsync, rename). Admin role.
- ``snapshot status FILE``: checks a backup (format, header CRC, size, SHA-256, that the
  state decodes) and prints its index, size, jobs and keys; offline.
- ``snapshot restore FILE --data-dir ... --member-id ... --initial-cluster ...``: builds one
  member's data directory of a NEW cluster holding the backup's state (``node/recovery.py``);
  offline; run once per member of the new cluster, each with its own member id.
- ``snapshot compact``: have members write a snapshot now and compact their logs (the
  command ``snapshot save`` was before backups existed).

A bad input (a truncated or corrupt file, a non-empty data dir, a member id not in
``--initial-cluster``, a file that exists) is one line on stderr and exit code 1; nothing is
written.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.table import Table

from rallypoint.client import Client

from ..backup_file import BackupError, BackupSummary, parse, read, summarize
from ..daemon import RecoveryError, Settings, SettingsError, restore_data_dir
from .client import Output, SubParsers, _common, _leaf

__all__ = ["register"]


class _Refused(Exception):
    """A bad input of an offline command: one line, exit code 1."""


def _write_durably(path: str, data: bytes) -> None:
    """``data`` under ``path``, whole or not at all: temp file, fsync, rename, fsync dir."""
    temporary = f"{path}.part"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


async def _snapshot_save(args: argparse.Namespace, client: Client, out: Output) -> int:
    path: str = args.file
    if os.path.exists(path):
        raise ValueError(f"{path} exists: remove it or choose another file name")
    saved = await client.snapshot_save()
    # Checked before it is written: a file under the name is a usable backup.
    backup = parse(saved.data, f"the stream from {saved.endpoint}")
    _write_durably(path, saved.data)
    header = backup.header
    if out.as_json:
        out.json(
            {
                "file": path,
                "index": header.index,
                "term": header.term,
                "member_id": header.member_id,
                "size_bytes": len(saved.data),
                "sha256": header.sha256.hex(),
            }
        )
    else:
        out.line(
            f"saved the state at index {header.index} (term {header.term}) from member "
            f"{header.member_id} to {path}: {len(saved.data)} bytes, sha256 "
            f"{header.sha256.hex()}"
        )
    return 0


async def _snapshot_compact(args: argparse.Namespace, client: Client, out: Output) -> int:
    endpoints: list[str | None] = list(client.endpoints) if args.all else [args.endpoint]
    infos = [await client.snapshot(endpoint=endpoint) for endpoint in endpoints]
    if out.as_json:
        out.json(
            {
                "snapshots": [
                    {
                        "endpoint": i.endpoint,
                        "member_id": i.member_id,
                        "index": i.index,
                        "term": i.term,
                        "size_bytes": i.size_bytes,
                    }
                    for i in infos
                ]
            }
        )
    else:
        table = Table(title="snapshots")
        for column in ("endpoint", "member", "index", "term", "size (bytes)"):
            table.add_column(column)
        for i in infos:
            table.add_row(
                i.endpoint, str(i.member_id), str(i.index), str(i.term), str(i.size_bytes)
            )
        out.table(table)
    return 0


def summary_document(path: str, summary: BackupSummary) -> dict[str, Any]:
    return {
        "file": path,
        "index": summary.index,
        "term": summary.term,
        "revision": summary.revision,
        "cluster_id": f"{summary.cluster_id:016x}",
        "member_id": summary.member_id,
        "voters": list(summary.voters),
        "learners": list(summary.learners),
        "size_bytes": summary.size_bytes,
        "sha256": summary.sha256,
        "created_ms": summary.created_ms,
        "keys": summary.keys,
        "leases": summary.leases,
        "sessions": summary.sessions,
        "jobs": list(summary.jobs),
        "members": [
            {"id": i, "peer_address": peer, "client_address": client}
            for i, peer, client in summary.members
        ],
    }


def _offline(
    body: Callable[[argparse.Namespace, Output], int],
) -> Callable[[argparse.Namespace], int]:
    """A handler for a command that reads files only: a refusal is one line, exit 1."""

    def handler(args: argparse.Namespace) -> int:
        try:
            return body(args, Output(getattr(args, "json", False)))
        except (_Refused, BackupError, RecoveryError, SettingsError, OSError) as error:
            print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
            return 1

    return handler


def _snapshot_status(args: argparse.Namespace, out: Output) -> int:
    summary = summarize(read(args.file))
    if out.as_json:
        out.json(summary_document(args.file, summary))
        return 0
    created = datetime.datetime.fromtimestamp(summary.created_ms / 1000, datetime.UTC)
    out.line(f"{args.file}: a rallypoint backup, checked (sha256 {summary.sha256})")
    out.line(f"  index {summary.index} (term {summary.term}), revision {summary.revision}")
    out.line(f"  size {summary.size_bytes} bytes, saved {created:%Y-%m-%d %H:%M:%S} UTC")
    out.line(
        f"  from cluster {summary.cluster_id:016x}, member {summary.member_id}; voters "
        f"{list(summary.voters)}"
    )
    out.line(f"  {summary.keys} keys, {summary.leases} leases, {summary.sessions} sessions")
    out.line(f"  {len(summary.jobs)} jobs: {', '.join(summary.jobs) or '-'}")
    return 0


def _snapshot_restore(args: argparse.Namespace, out: Output) -> int:
    backup = read(args.file)
    settings = Settings(
        member_id=args.member_id,
        data_dir=args.data_dir,
        initial_cluster=args.initial_cluster,
        cluster_token=args.cluster_token,
        peer_secret_file=args.peer_secret_file or "",
        wal_segment_size=args.wal_segment_size,
    )
    members = settings.members()
    own = members.get(args.member_id)
    if own is None:
        raise _Refused(f"member {args.member_id} is not in --initial-cluster {sorted(members)}")
    settings.peer_address, settings.client_address = own.peer_address, own.client_address
    identity = restore_data_dir(settings, backup)
    config = settings.node_config()
    if out.as_json:
        out.json(
            {
                "data_dir": config.data_dir,
                "member_id": config.member_id,
                "cluster_id": f"{identity.cluster_id:016x}",
                "index": backup.header.index,
                "members": sorted(config.initial_members),
            }
        )
    else:
        out.line(
            f"restored the state at index {backup.header.index} into {config.data_dir}: "
            f"member {config.member_id} of new cluster {identity.cluster_id:016x} "
            f"(members {sorted(config.initial_members)}); start it with `rallypoint serve` "
            "and the same --member-id, --data-dir, --initial-cluster, --cluster-token and "
            "peer secret"
        )
    return 0


def register(subparsers: SubParsers) -> None:
    """Add ``snapshot save|status|restore|compact`` to the ``rallypoint`` parser."""
    common = _common()
    snapshot_parser = subparsers.add_parser(
        "snapshot",
        help="backups of the cluster's state (save, status, restore) and log compaction",
        description="Backups of the cluster's state: save one from the leader, check it, "
        "build a new cluster from it (docs/operations.md, 'Backups'); and log compaction.",
    )
    snapshot: SubParsers = snapshot_parser.add_subparsers(
        dest="snapshot_command", required=True, metavar="COMMAND"
    )
    save = _leaf(
        snapshot,
        "save",
        "save a consistent backup of the cluster's state (from the leader, at one index, with "
        "its checksum) to FILE (admin)",
        _snapshot_save,
        common,
    )
    save.add_argument("file", help="the backup file to write (must not exist)")

    status = snapshot.add_parser(
        "status",
        help="check a backup file and print its index, size, jobs and keys",
        description="Check a backup file (format, checksums, that its state decodes) and "
        "print its index, term, size, keys, leases, sessions and jobs. Reads the file only. "
        "Exit code 1, with one line, if it cannot be used.",
    )
    status.add_argument("file", help="the backup file (`rallypoint snapshot save FILE`)")
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    status.set_defaults(handler=_offline(_snapshot_status))

    restore_parser = snapshot.add_parser(
        "restore",
        help="build a member's data dir of a NEW cluster holding a backup's state",
        description="Build the data directory of one member of a NEW cluster holding the "
        "backup's state (its keys, leases, sessions, jobs and checkpoint records at the "
        "backup's index). Run it once per member of the new cluster, from the same file, "
        "each with its own --member-id and --data-dir and the same --initial-cluster; then "
        "start each with `rallypoint serve` and the same flags. The new cluster's id comes "
        "from the peer secret and --cluster-token and must differ from the backup's cluster "
        "(a new --cluster-token), so members of the old cluster cannot join it. Refused, "
        "with one line and exit code 1, for a damaged file, a data dir that is not empty, "
        "or a member id not in --initial-cluster.",
    )
    restore_parser.add_argument("file", help="the backup file (`rallypoint snapshot save FILE`)")
    restore_parser.add_argument(
        "--data-dir", required=True, help="the new member's data dir (absent or empty)"
    )
    restore_parser.add_argument(
        "--member-id", required=True, type=int, help="this member's id in --initial-cluster"
    )
    restore_parser.add_argument(
        "--initial-cluster",
        required=True,
        help="the new cluster's members: ID=PEER@CLIENT,... (as `serve --initial-cluster`)",
    )
    restore_parser.add_argument(
        "--cluster-token",
        default="rallypoint",
        help="the new cluster's name (with the peer secret it makes the cluster id; it must "
        "differ from the backup's cluster) (default: 'rallypoint')",
    )
    restore_parser.add_argument(
        "--peer-secret-file", help="the new cluster's peer secret (`rallypoint secret > FILE`)"
    )
    restore_parser.add_argument(
        "--wal-segment-size",
        default="64MiB",
        help="as `serve --wal-segment-size` (default: '64MiB')",
    )
    restore_parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    restore_parser.set_defaults(handler=_offline(_snapshot_restore))

    compact = _leaf(
        snapshot,
        "compact",
        "have members write a snapshot now and compact their log (admin)",
        _snapshot_compact,
        common,
    )
    where = compact.add_mutually_exclusive_group()
    where.add_argument("--endpoint", help="the member to snapshot (default: the first to answer)")
    where.add_argument("--all", action="store_true", help="every endpoint")
