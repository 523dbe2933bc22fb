"""The ``rallypoint`` command.

``serve`` runs one member; ``cluster up`` runs a local development cluster in the
foreground; the operator commands (status, kv, lease, member, ...) are clients of a running
cluster (``cli.client``). This module is the program's top: it is the one place where the
daemon side and the client library meet.
"""

from __future__ import annotations

# First: gRPC reads its log level when first imported (see grpc_quiet.py).
from .. import grpc_quiet  # noqa: F401

# isort: split
import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import grpc

from rallypoint.proto.v1 import cluster_pb2, cluster_pb2_grpc

from ..daemon import Settings, SettingsError, configure_logging, run
from ..peer_auth import new_secret
from .args import Parser, add_version, integer

DEFAULT_BASE_PORT = 2379
_SERVE_HELP = {
    "member_id": "this member's id (a positive integer, unique in the cluster)",
    "data_dir": "directory for the write-ahead log and snapshots",
    "peer_address": "host:port other members reach this one at (Raft traffic)",
    "client_address": "host:port clients reach this member at (the public API)",
    "initial_cluster": "the members at creation: ID=PEER@CLIENT,... (e.g. "
    "1=127.0.0.1:2380@127.0.0.1:2379,2=...); a member with empty storage creates the cluster "
    "only once every other one answers that none exists (leave out a member that will never "
    "start, and add it later)",
    "join": "join an existing cluster (after `rallypoint member add`) instead of creating one",
    "force_new_cluster": "disaster recovery, once: make this surviving member of a cluster "
    "that lost its majority for good the only member of a new cluster holding its data "
    "(give a new --cluster-token; the old storage is kept in the data dir; what may have "
    "been lost is logged), then add members with `rallypoint member add`; "
    "docs/operations.md, 'Losing a majority'",
    "cluster_token": "the cluster's name, shared by its members; with the peer secret it makes "
    "the cluster id, and traffic from another cluster is refused",
    "peer_secret_file": "a file holding the secret every member shares (required: the peer port "
    "authenticates every request with it; make one with `rallypoint secret > FILE`)",
    "peer_secret": "the peer secret itself (prefer peer_secret_file: this shows in the process's "
    "command line or environment)",
    "peer_transport": "how the peer port speaks: stream, the stream peer protocol "
    "(docs/peer-protocol.md), the only choice (grpc is gone: docs/operations.md, "
    "'Upgrading')",
    "tick_ms": "Raft tick length in milliseconds",
    "election_ticks": "ticks without a leader before an election (randomized up to 2x)",
    "heartbeat_ticks": "ticks between leader heartbeats",
    "lease_reads": "the leader answers linearizable reads under a lease, without a heartbeat "
    "round (the same on every member; turn off with lease_reads = false in --config or "
    "RALLYPOINT_LEASE_READS=0)",
    "snapshot_entries": "applied entries between snapshots (one is also made once the entries "
    "applied since the last hold 64 MiB)",
    "metrics_address": "host:port to serve Prometheus /metrics on (off when empty)",
    "health_address": "host:port serving only the standard gRPC health service, without TLS "
    "or tokens, for probes that cannot present a client certificate (Kubernetes' grpc probe); "
    "off when empty. The client port answers health checks too",
    "wal_segment_size": "bytes preallocated for each write-ahead log segment: a number, or "
    "with KiB, MiB or GiB (e.g. 8MiB); 1MiB..1GiB. The data dir needs this much free to start",
    "auth_token": "require 'authorization: Bearer TOKEN' on client calls (an admin token)",
    "tokens_file": "TOML file of client tokens (SHA-256) and their roles: admin, read, "
    "job:<id>; reloaded on SIGHUP (docs/security.md, 'Client tokens and roles')",
    "tls_cert_file": "PEM certificate for mutual TLS on both ports (certificate, key and CA "
    "are re-read on SIGHUP; new connections use them)",
    "tls_key_file": "PEM private key for mutual TLS",
    "tls_ca_file": "PEM CA bundle that signs members' and clients' certificates",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "log_format": "text, or json for one JSON object per line",
}


def _add_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run one coordinator member",
        description="Run one coordinator member. Settings come from defaults, then --config "
        "(TOML, keys as below with underscores), then RALLYPOINT_<SETTING> environment "
        "variables (e.g. RALLYPOINT_DATA_DIR), then flags. One process per data dir (it is "
        "locked: DATA_DIR/rallypoint.lock holds the pid). SIGTERM stops the member "
        "gracefully; SIGHUP re-reads the tokens file and both ports' TLS files. A "
        "setting that cannot be used is refused with one line and exit code 2.",
    )
    parser.add_argument("--config", help="a TOML file of settings")
    defaults = Settings()
    for name in Settings.field_names():
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        help_text = f"{_SERVE_HELP.get(name, name)} (default: {default!r})"
        if isinstance(default, bool):
            parser.add_argument(flag, dest=name, action="store_const", const=True, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=type(default), help=help_text)
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    settings = Settings()
    try:
        if args.config:
            settings.merge_toml(args.config)
        settings.merge_environment(dict(os.environ))
        flags = {
            name: getattr(args, name)
            for name in Settings.field_names()
            if getattr(args, name, None) is not None
        }
        settings.merge(flags, "command line")
        settings.node_config()
        settings.client_tokens()
        configure_logging(settings.log_level, settings.log_format)
    except SettingsError as exc:
        print(f"rallypoint serve: {exc}", file=sys.stderr)
        return 2
    # run() then checks the TLS files, the data dir (locked), free space and the ports, and
    # refuses in one line the same way.
    return run(settings)


def _add_cluster(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cluster", help="local development clusters")
    sub = parser.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser(
        "up",
        help="run a local cluster in the foreground until Ctrl-C",
        description="Start N members on 127.0.0.1 in the foreground. Member i (from 1) "
        "serves clients on BASE_PORT + 2(i-1) and peers on the port after it, so the "
        "default 3-member cluster's endpoints are 127.0.0.1:2379,2381,2383. Ctrl-C or "
        "SIGTERM stops every member.",
    )
    up.add_argument(
        "--nodes",
        type=integer(least=1, most=9),
        default=3,
        help="number of members (1-9, default 3)",
    )
    up.add_argument(
        "--data-dir",
        help="parent directory of the members' data (default: a temporary directory, "
        "deleted on exit)",
    )
    up.add_argument(
        "--base-port",
        type=integer(least=1, most=65535 - 18),
        default=DEFAULT_BASE_PORT,
        help=f"member 1's client port (default {DEFAULT_BASE_PORT})",
    )
    up.add_argument(
        "--tick-ms", type=integer(least=1), default=100, help="Raft tick length (default 100)"
    )
    up.add_argument(
        "--log-level",
        default="INFO",
        help="members' log level (default INFO: one line per election, leader change and "
        "broken peer stream; DEBUG adds every Raft message)",
    )
    up.set_defaults(handler=_cluster_up)


def local_cluster_addresses(nodes: int, base_port: int) -> dict[int, tuple[str, str]]:
    """member id -> (peer address, client address) of a local development cluster."""
    return {
        i: (f"127.0.0.1:{base_port + 2 * (i - 1) + 1}", f"127.0.0.1:{base_port + 2 * (i - 1)}")
        for i in range(1, nodes + 1)
    }


def _cluster_up(args: argparse.Namespace) -> int:
    if not 1 <= args.nodes <= 9:
        print("rallypoint cluster up: --nodes must be between 1 and 9", file=sys.stderr)
        return 2
    temporary = args.data_dir is None
    parent = tempfile.mkdtemp(prefix="rallypoint-") if temporary else args.data_dir
    addresses = local_cluster_addresses(args.nodes, args.base_port)
    initial = ",".join(f"{i}={peer}@{client}" for i, (peer, client) in addresses.items())
    os.makedirs(parent, exist_ok=True)
    secret_path = os.path.join(parent, "peer-secret")
    if not os.path.exists(secret_path):  # a kept --data-dir keeps its cluster's secret
        write_secret_file(secret_path)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for member_id, (peer, client) in addresses.items():
            command = [
                sys.executable,
                "-m",
                "rallypoint.coordinator",
                "serve",
                f"--member-id={member_id}",
                f"--data-dir={os.path.join(parent, f'member-{member_id}')}",
                f"--peer-address={peer}",
                f"--client-address={client}",
                f"--initial-cluster={initial}",
                f"--peer-secret-file={secret_path}",
                f"--tick-ms={args.tick_ms}",
                f"--log-level={args.log_level}",
            ]
            procs.append(subprocess.Popen(command))
        endpoints = ",".join(client for _, client in addresses.values())
        leader = _wait_for_leader([c for _, c in addresses.values()], timeout_s=30.0)
        print(f"rallypoint: {args.nodes} members up, leader is member {leader}", flush=True)
        print(f"rallypoint: endpoints {endpoints}", flush=True)
        print(f"rallypoint: data in {parent}; Ctrl-C stops the cluster", flush=True)
        stop = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Members whose exit was reported: each is said once, not at every poll.
        reported: set[int] = set()
        while not stop:
            for member_id, proc in zip(addresses, procs, strict=True):
                if proc.poll() is not None and not stop and member_id not in reported:
                    reported.add(member_id)
                    print(
                        f"rallypoint: member {member_id} {_exit_words(proc.returncode)}", flush=True
                    )
            time.sleep(0.2)
            procs_alive = [p for p in procs if p.poll() is None]
            if not procs_alive:
                print("rallypoint: every member exited", file=sys.stderr)
                return 1
        return 0
    except TimeoutError as exc:
        print(f"rallypoint cluster up: {exc}", file=sys.stderr)
        return 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if temporary:
            shutil.rmtree(parent, ignore_errors=True)


def _exit_words(returncode: int) -> str:
    """How a member process ended, in words: "exited (1)", "was killed (SIGKILL)"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed ({name}); the others go on without it"
    return f"exited ({returncode}); the others go on without it"


def _wait_for_leader(client_addresses: Sequence[str], timeout_s: float) -> int:
    async def probe() -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for address in client_addresses:
                async with grpc.aio.insecure_channel(address) as channel:
                    stub = cluster_pb2_grpc.ClusterStub(channel)
                    try:
                        status = await stub.Status(cluster_pb2.StatusRequest(), timeout=1.0)
                    except grpc.aio.AioRpcError:
                        continue
                    if status.leader_id:
                        return int(status.leader_id)
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no leader elected within {timeout_s:.0f}s")

    return asyncio.run(probe())


def _add_secret(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "secret",
        help="print a new random peer secret",
        description="Print a new random peer secret (256 bits, as hex). Every member of a "
        "cluster must be started with the same one: `rallypoint secret > peer-secret`, keep "
        "the file private (chmod 600), copy it to each member, and start each with "
        "--peer-secret-file=peer-secret.",
    )
    parser.set_defaults(handler=_secret)


def _secret(args: argparse.Namespace) -> int:
    print(new_secret())
    return 0


def write_secret_file(path: str) -> None:
    """A new secret in ``path``, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_secret() + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="rallypoint",
        description="rallypoint: a replicated coordination service for elastic training. "
        "Run members with `serve` (or a local cluster with `cluster up`); the other commands "
        "talk to a running cluster.",
    )
    add_version(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(subparsers)
    _add_cluster(subparsers)
    _add_secret(subparsers)
    try:
        from .client import register
    except ImportError:  # the client commands are optional in a daemon-only install
        pass
    else:
        register(subparsers)
        from .backup import register as register_backup
        from .dashboard import register as register_dashboard
        from .domains import register as register_domains
        from .jobs import register as register_jobs

        register_jobs(subparsers)
        register_domains(subparsers)
        register_dashboard(subparsers)
        register_backup(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
