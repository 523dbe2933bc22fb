"""Running one member as a daemon: the member, its client API server, metrics and signals.

Settings come, in increasing precedence, from defaults, a TOML file (``--config``),
environment variables (``RALLYPOINT_<SETTING>``, e.g. ``RALLYPOINT_DATA_DIR``) and flags.
Before anything is served, the settings, the data dir (locked by this process for its
whole life), the free space and the listening addresses are checked (``preflight``); a
refusal is a :class:`SettingsError`, which ``rallypoint serve`` prints as one line before
exiting with code 2. SIGTERM and SIGINT stop the member gracefully: a leader first hands
leadership to the most up-to-date voter, so clients see no election timeout. SIGHUP reloads
what can change without a restart (:class:`Reloads`: the tokens file, the client port's and
the peer port's TLS certificate, key and CA), one log line per reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import os
import signal
import ssl
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import grpc
import grpc.aio

from rallypoint.raft.storage.fileutil import DataCorruptionError

from .backup_file import Backup
from .identity import Identity, IdentityError
from .member_table import MemberAddress
from .node.api import NodeStartError
from .node.config import NodeConfig
from .node.driver import Node
from .node.recovery import RecoveryError, force_new_cluster, restore
from .peer_auth import PeerSecretError, check_secret, read_secret_file
from .preflight import (
    MAX_WAL_SEGMENT_BYTES,
    MIN_WAL_SEGMENT_BYTES,
    SERVER_OPTIONS,
    DataDirLock,
    SettingsError,
    bind_failure,
    format_size,
    parse_size,
    probe_listeners,
    read_tls_files,
    require_free_space,
    require_own_entry,
    same_listener,
    split_address,
)
from .service.tokens import ClientTokens, TokensFileError
from .tls_reload import PeerTlsFiles, ReloadableServerCredentials

__all__ = [
    "RecoveryError",
    "Settings",
    "SettingsError",
    "TlsFiles",
    "parse_initial_cluster",
    "restore_data_dir",
    "run",
    "serve",
]

log = logging.getLogger("rallypoint.daemon")


def _load_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``load_cert_chain`` takes files only: the PEM goes through a private temporary one."""
    with tempfile.TemporaryDirectory() as folder:
        cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert_path, key_path)


@dataclass
class TlsFiles:
    """PEM files for mutual TLS: this member's certificate and key, and the CA that signs
    every member's and client's certificate (clients must present one)."""

    cert_file: str
    key_file: str
    ca_file: str

    def read(self) -> tuple[bytes, bytes, bytes]:
        out = []
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            try:
                with open(path, "rb") as f:
                    out.append(f.read())
            except OSError as exc:
                raise SettingsError(f"tls {name.removesuffix('_file')}: {exc}") from exc
        return out[0], out[1], out[2]

    def contexts(self, cert: bytes, key: bytes, ca: bytes) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """The peer port's TLS from the files' contents: (listening: this member's
        certificate, a client certificate signed by the CA required; dialling: the
        listener's certificate signed by the CA and naming the host dialled, this member's
        certificate presented)."""
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca.decode())
        server.verify_mode = ssl.CERT_REQUIRED
        _load_chain(server, cert, key)
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode())
        _load_chain(client, cert, key)
        return server, client

    def server_ssl_context(self) -> ssl.SSLContext:
        """The peer port's listening TLS as the files say now (see :meth:`contexts`)."""
        return self.contexts(*self.read())[0]

    def client_ssl_context(self) -> ssl.SSLContext:
        """The peer dialler's TLS as the files say now (see :meth:`contexts`)."""
        return self.contexts(*self.read())[1]

    def check(self) -> None:
        """Refuse files that are unreadable, not PEM, or a key that is not the
        certificate's, naming the file (before anything starts)."""
        read_tls_files(self)


@dataclass
class Settings:
    """Everything ``rallypoint serve`` accepts. Field names are the TOML keys; the
    environment variable of a field is RALLYPOINT_ + its name in capitals."""

    member_id: int = 1
    data_dir: str = "rallypoint-data"
    peer_address: str = "127.0.0.1:2380"
    client_address: str = "127.0.0.1:2379"
    # "1=peerhost:port@clienthost:port,2=..." (the members when the cluster was created).
    initial_cluster: str = ""
    join: bool = False
    # Make this surviving member of a cluster that lost its majority the only member of a
    # new cluster (a new --cluster-token) holding its data (node/recovery.py); once.
    force_new_cluster: bool = False
    cluster_token: str = "rallypoint"
    # The cluster's peer secret (peer_auth.py): a file holding it, or (less safe: it shows in
    # the process's environment or command line) the secret itself.
    peer_secret_file: str = ""
    peer_secret: str = ""
    # Accepted for configurations written for commit f771d74; "stream" is the only value.
    peer_transport: str = "stream"
    tick_ms: int = 100
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    # Linearizable reads answered by the leader under its lease (node/reads.py); every
    # member of a cluster must use the same setting (RALLYPOINT_LEASE_READS=0 turns it off).
    lease_reads: bool = True
    snapshot_entries: int = 100_000
    metrics_address: str = ""  # host:port for /metrics; empty disables
    # host:port serving only the gRPC health service, in plaintext and without tokens, for
    # probes that cannot present a client certificate (Kubernetes' grpc probe); empty
    # disables. The client port answers health checks too.
    health_address: str = ""
    # Bytes preallocated per write-ahead log segment: a number, or with KiB, MiB or GiB.
    wal_segment_size: str = "64MiB"
    auth_token: str = ""
    tokens_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    log_level: str = "INFO"
    log_format: str = "text"  # "text" or "json" (one JSON object per line)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "extra"]

    def merge(self, values: dict[str, Any], source: str) -> None:
        types = {f.name: f.type for f in fields(self)}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in types or name == "extra":
                raise SettingsError(f"{source}: unknown setting {key!r}")
            current = getattr(self, name)
            try:
                if isinstance(current, bool):
                    if isinstance(value, str):
                        lowered = value.strip().lower()
                        if lowered not in ("1", "0", "true", "false", "yes", "no"):
                            raise ValueError(value)
                        value = lowered in ("1", "true", "yes")
                    value = bool(value)
                elif isinstance(current, int):
                    value = int(value)
                else:
                    value = str(value)
            except (TypeError, ValueError):
                raise SettingsError(
                    f"{source}: setting {key!r} wants a {type(current).__name__}, got {value!r}"
                ) from None
            setattr(self, name, value)

    def merge_toml(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise SettingsError(f"config file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path}: {exc}") from exc
        self.merge(data, f"config file {path}")

    def merge_environment(self, environ: dict[str, str]) -> None:
        found = {}
        for name in self.field_names():
            value = environ.get("RALLYPOINT_" + name.upper())
            if value is not None:
                found[name] = value
        self.merge(found, "environment")

    def tls(self) -> TlsFiles | None:
        given = [self.tls_cert_file, self.tls_key_file, self.tls_ca_file]
        if not any(given):
            return None
        if not all(given):
            names = ("tls_cert_file", "tls_key_file", "tls_ca_file")
            missing = [name for name, value in zip(names, given, strict=True) if not value]
            raise SettingsError(
                "TLS needs all of tls_cert_file, tls_key_file and tls_ca_file "
                f"(missing: {', '.join(missing)})"
            )
        return TlsFiles(*given)

    def secret(self) -> bytes:
        """The peer secret, from ``peer_secret_file`` or ``peer_secret``."""
        if self.peer_secret_file and self.peer_secret:
            raise SettingsError("give the peer secret once: peer_secret_file or peer_secret")
        try:
            if self.peer_secret_file:
                return read_secret_file(self.peer_secret_file)
            if self.peer_secret:
                secret = self.peer_secret.encode()
                check_secret(secret, "peer_secret")
                return secret
        except PeerSecretError as exc:
            raise SettingsError(str(exc)) from None
        raise SettingsError(
            "no peer secret: every member must hold the cluster's secret. Make one with "
            "`rallypoint secret > peer-secret` (keep it private), copy it to every member, "
            "and start each with --peer-secret-file=peer-secret"
        )

    def client_tokens(self) -> ClientTokens | None:
        """The tokens clients must present (``auth_token`` as admin, ``tokens_file``); None
        when neither is set and clients need none."""
        if not (self.auth_token or self.tokens_file):
            return None
        try:
            return ClientTokens(admin_token=self.auth_token or None, path=self.tokens_file or None)
        except TokensFileError as exc:
            raise SettingsError(str(exc)) from None

    def members(self) -> dict[int, MemberAddress]:
        return parse_initial_cluster(self.initial_cluster)

    def listeners(self) -> list[tuple[str, str]]:
        """(setting, address) of every port this member listens on."""
        found = [("peer_address", self.peer_address), ("client_address", self.client_address)]
        if self.metrics_address:
            found.append(("metrics_address", self.metrics_address))
        if self.health_address:
            found.append(("health_address", self.health_address))
        return found

    def wal_segment_size_bytes(self) -> int:
        size = parse_size(self.wal_segment_size, "wal_segment_size")
        if not MIN_WAL_SEGMENT_BYTES <= size <= MAX_WAL_SEGMENT_BYTES:
            raise SettingsError(
                f"wal_segment_size must be between {format_size(MIN_WAL_SEGMENT_BYTES)} and "
                f"{format_size(MAX_WAL_SEGMENT_BYTES)}, got {self.wal_segment_size!r}"
            )
        return size

    def _check_addresses(self, members: dict[int, MemberAddress]) -> None:
        """Every listener a valid, distinct host:port; this member's own addresses those
        its initial_cluster entry gives the others."""
        listeners = self.listeners()
        for setting, address in listeners:
            split_address(address, setting)
        for (setting, address), (other_setting, other) in itertools.combinations(listeners, 2):
            if same_listener(address, other):
                raise SettingsError(
                    f"{setting} {address} and {other_setting} {other} must be different "
                    "ports: each serves its own protocol"
                )
        entry = members.get(self.member_id)
        if entry is not None:
            require_own_entry("peer_address", self.peer_address, entry.peer_address, self.member_id)
            require_own_entry(
                "client_address", self.client_address, entry.client_address, self.member_id
            )

    def node_config(self) -> NodeConfig:
        """The member's configuration, every setting checked (no side effects)."""
        members = self.members()
        self._check_addresses(members)
        if self.force_new_cluster:
            if self.join:
                raise SettingsError(
                    "--force-new-cluster makes a new cluster of this member alone; it cannot "
                    "--join another"
                )
            # The members of the lost cluster are not the new one's.
            members = {}
        if not members and not self.join:
            members = {self.member_id: MemberAddress(self.peer_address, self.client_address)}
        secret = self.secret()
        try:
            config = NodeConfig(
                member_id=self.member_id,
                data_dir=self.data_dir,
                peer_address=self.peer_address,
                client_address=self.client_address,
                initial_members=members,
                join_existing=self.join,
                peer_secret=secret,
                cluster_name=self.cluster_token,
                tick_ms=self.tick_ms,
                election_ticks=self.election_ticks,
                heartbeat_ticks=self.heartbeat_ticks,
                lease_reads=self.lease_reads,
                snapshot_entries=self.snapshot_entries,
                wal_segment_size_bytes=self.wal_segment_size_bytes(),
                peer_transport=self.peer_transport,
            )
            config.validate()
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        return config


def parse_initial_cluster(text: str) -> dict[int, MemberAddress]:
    """``"1=10.0.0.1:2380@10.0.0.1:2379,2=..."`` -> {1: MemberAddress(...), ...}."""
    members: dict[int, MemberAddress] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        ident, sep, addresses = part.partition("=")
        peer, at, client = addresses.partition("@")
        if not (sep and at and ident.strip().isdigit() and peer and client):
            raise SettingsError(
                f"initial cluster entry {part!r} is not ID=PEER_HOST:PORT@CLIENT_HOST:PORT"
            )
        member_id = int(ident)
        if member_id <= 0 or member_id in members:
            raise SettingsError(f"initial cluster: member id {member_id} is zero or repeated")
        address = MemberAddress(peer.strip(), client.strip())
        split_address(address.peer_address, f"initial_cluster member {member_id}'s peer address")
        split_address(
            address.client_address, f"initial_cluster member {member_id}'s client address"
        )
        _refuse_shared_address(members, member_id, address)
        members[member_id] = address
    return members


def _refuse_shared_address(
    members: dict[int, MemberAddress], member_id: int, address: MemberAddress
) -> None:
    """Two members cannot listen on one address: a message meant for one would reach the
    other (or neither could start), and a member's peer port cannot be another's client
    port. (A member's own two addresses are checked against each other as its listeners.)"""
    mine = (("peer", address.peer_address), ("client", address.client_address))
    for other_id, other in members.items():
        theirs = (("peer", other.peer_address), ("client", other.client_address))
        for (kind, own), (other_kind, other_address) in itertools.product(mine, theirs):
            if same_listener(own, other_address):
                raise SettingsError(
                    f"initial cluster: member {other_id}'s {other_kind} address {other_address} "
                    f"and member {member_id}'s {kind} address {own} are the same: each member "
                    "needs its own"
                )


class Reloads:
    """What SIGHUP reloads. Each hook re-reads its source and returns a summary for the log,
    or raises SettingsError and leaves what it had in use; either way one line is logged."""

    def __init__(self) -> None:
        self._hooks: list[tuple[str, Callable[[], str]]] = []

    def register(self, what: str, reload: Callable[[], str]) -> None:
        self._hooks.append((what, reload))

    def run(self) -> None:
        if not self._hooks:
            log.info("SIGHUP: nothing to reload")
        for what, reload in self._hooks:
            try:
                summary = reload()
            except SettingsError as exc:
                log.error("SIGHUP: %s not reloaded, the previous one stays in use: %s", what, exc)
            else:
                log.info("SIGHUP: %s reloaded: %s", what, summary)


def _reload_tokens(tokens: ClientTokens) -> Callable[[], str]:
    def reload() -> str:
        try:
            return tokens.reload()
        except TokensFileError as exc:
            raise SettingsError(str(exc)) from None

    return reload


async def serve(settings: Settings) -> int:
    """Run one member until SIGTERM/SIGINT; return the process exit code. The caller holds
    the data dir's lock (:func:`run`)."""
    from .service.server import add_health_service, add_services

    config = settings.node_config()
    loop = asyncio.get_running_loop()
    tls = settings.tls()
    tokens = settings.client_tokens()
    reloads = Reloads()
    if tokens is not None and tokens.path:
        reloads.register(f"tokens file {tokens.path}", _reload_tokens(tokens))
    client_credentials = peer_tls = None
    if tls is not None:
        client_credentials = ReloadableServerCredentials(tls)
        reloads.register("client TLS files", client_credentials.reload)
        peer_tls = PeerTlsFiles(tls)
        reloads.register("peer TLS files", peer_tls.reload)
    # Installed before the member starts, so a SIGHUP during start-up cannot kill it.
    loop.add_signal_handler(signal.SIGHUP, reloads.run)
    node = Node(config, peer_tls=peer_tls)
    await node.start()
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health_server = grpc.aio.server(options=SERVER_OPTIONS) if settings.health_address else None
    try:
        # The long-lived objects made at start-up need no more collection passes; and a
        # larger first generation makes collections rarer on the request path.
        gc.freeze()
        gc.set_threshold(50_000, 20, 20)
        add_services(server, node, tokens=tokens, metrics=node.metrics)
        try:
            if client_credentials is not None:
                server.add_secure_port(config.client_address, client_credentials.credentials)
            else:
                server.add_insecure_port(config.client_address)
        except RuntimeError as exc:
            raise bind_failure("client_address", config.client_address, exc) from None
        await server.start()
        if health_server is not None:
            # Started after the client port, so a probe that finds it finds clients served.
            add_health_service(health_server)
            try:
                health_server.add_insecure_port(settings.health_address)
            except RuntimeError as exc:
                raise bind_failure("health_address", settings.health_address, exc) from None
            await health_server.start()
        if settings.metrics_address:
            host, port = split_address(settings.metrics_address, "metrics_address")
            try:
                node.metrics.serve(port, host)
            except OSError as exc:
                raise bind_failure("metrics_address", settings.metrics_address, exc) from None
    except BaseException:
        if health_server is not None:
            await health_server.stop(grace=None)
        await server.stop(grace=None)
        await node.stop(transfer_leadership=False)
        raise
    log.info(
        "member %d serving clients at %s (peers at %s)",
        config.member_id,
        config.client_address,
        config.peer_address,
    )
    if tokens is not None:
        log.info("clients need a token: %s", tokens.table.summary())
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("member %d shutting down", config.member_id)
    if health_server is not None:
        # Probes see the member go at once, while it hands over leadership.
        await health_server.stop(grace=None)
    await node.stop(transfer_leadership=True)
    await server.stop(grace=1.0)
    return 0


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr at ``level``. At INFO, the default, a member says one line per role
    or leader change and per broken peer stream (``role_log``, ``transport``); the Raft
    core's line per vote and message is shown only at DEBUG."""
    if log_format not in ("text", "json"):
        raise SettingsError(f"log_format must be 'text' or 'json', got {log_format!r}")
    if level.upper() not in LOG_LEVELS:
        raise SettingsError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    handler = logging.StreamHandler()
    if log_format == "json":
        formatter: logging.Formatter = JsonLogFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    core_level = logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    logging.getLogger("rallypoint.raft").setLevel(core_level)


# How long a thread may hold the interpreter lock while another waits for it (see run).
SWITCH_INTERVAL_S = 0.0005


def run(settings: Settings) -> int:
    """Check, lock the data dir, and serve until stopped (``preflight`` gives the order);
    0 after a clean stop, 2 when the member cannot start (one line on stderr says why and
    what to do)."""
    configure_logging(settings.log_level, settings.log_format)
    try:
        config = settings.node_config()
        tls = settings.tls()
        if tls is not None:
            tls.check()
        with DataDirLock.acquire(config.data_dir):
            require_free_space(config.data_dir, config.wal_segment_size_bytes)
            probe_listeners(settings.listeners())
            if settings.force_new_cluster:
                force_new_cluster(
                    config.data_dir,
                    config.member_id,
                    MemberAddress(config.peer_address, config.client_address),
                    config.cluster_id,
                    config.limits,
                    segment_size_bytes=config.wal_segment_size_bytes,
                )
            # The event loop shares the interpreter lock with the snapshot encoder and the
            # disk thread: at Python's default (5 ms), a loop woken from its poll waited up
            # to 5 ms for a busy encoder to hand the lock back, at every wakeup, for as long
            # as a snapshot took (put_64 p99 60-90 ms once every 10,000 entries).
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            with contextlib.suppress(ImportError):
                import uvloop

                return int(uvloop.run(serve(settings)))
            return asyncio.run(serve(settings))
    except (
        SettingsError,
        IdentityError,
        NodeStartError,
        DataCorruptionError,
        RecoveryError,
    ) as exc:
        print(f"rallypoint serve: {exc}", file=sys.stderr)
        return 2


def restore_data_dir(settings: Settings, backup: Backup) -> Identity:
    """``rallypoint snapshot restore``: build ``settings``' data dir, a member of the new
    cluster its flags describe, holding ``backup``'s state (node/recovery.py). Raises
    SettingsError or RecoveryError, in one line, before anything is written."""
    config = settings.node_config()
    return restore(
        backup,
        config.data_dir,
        config.member_id,
        config.initial_members,
        config.cluster_id,
        segment_size_bytes=config.wal_segment_size_bytes,
    )


def default_environment() -> dict[str, str]:
    return dict(os.environ)
