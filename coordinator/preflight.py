"""What ``rallypoint serve`` checks before it serves, so an operator's mistake ends in one
line and exit code 2 rather than in a traceback, a member that never elects, or lost data.

Theory of operation. A member starts in this order, and each step may refuse with a
:class:`SettingsError` whose message names the setting or path and says what to change:

1. Settings (no side effects): every ``host:port`` has a host and a port in 1..65535; this
   member's own addresses agree with its ``initial_cluster`` entry (a member that listens
   where its peers do not look stays a pre-candidate forever); no two listeners share a
   port; sizes parse (:func:`parse_size`); TLS files are readable PEM and the key is the
   certificate's (:func:`read_tls_files`, also what a SIGHUP reload checks).
2. The data dir: created if missing, then locked (:class:`DataDirLock`) *before anything in
   it is read or written*. The lock is ``flock`` on ``rallypoint.lock`` holding the holder's
   pid, kept for the life of the process (the kernel releases it when the process dies, even
   by SIGKILL, so there is no stale lock to clean up). Two processes on one data dir would
   each append to the same write-ahead log and answer for the same member: the second one
   refuses to start, naming the lock file and the holder. Creating the lock file is also the
   test that the data dir is writable.
3. Free space for the write-ahead log's preallocated segment (:func:`require_free_space`).
4. Listeners: every address is bound at once and released (:func:`probe_listeners`), so an
   address already in use is refused with its name before anything listens. Every gRPC
   server is built with :data:`SERVER_OPTIONS`, which turns SO_REUSEPORT off: with it on
   (gRPC's default) a second member with the same flags would share the ports and take half
   of the clients.

The checks in (4) can race with another process taking the port in between; the bind
itself then fails and :func:`bind_failure` words it the same way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import ssl
from types import TracebackType
from typing import Protocol

# gRPC's default 4 MiB cap is too small for a batch of large entries.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Every gRPC server a member runs (the client API, the health port).
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A ping every second, answered within a second, finds a connection a partition broke;
    # the clients' pings are accepted (else the server ends the connection after a few).
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 1_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
    # SO_REUSEPORT off: a port in use is an error, never shared with a second process.
    ("grpc.so_reuseport", 0),
]

LOCK_FILE_NAME = "rallypoint.lock"
# Where node/driver.py and DiskStorage keep the write-ahead log inside a data dir.
WAL_SUBDIR = os.path.join("raft", "wal")
# Room beyond the WAL segment for the first snapshot and the lock file.
_HEADROOM_BYTES = 1024 * 1024

MIB = 1024 * 1024
MIN_WAL_SEGMENT_BYTES = 1 * MIB
MAX_WAL_SEGMENT_BYTES = 1024 * MIB
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})
_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": MIB, "gib": 1024 * MIB}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it and says why."""


# ---------------------------------------------------------------------------- settings


def split_address(address: str, setting: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port), or a SettingsError naming ``setting``. An IPv6 host
    is written in brackets (``[::1]:2380``) and returned without them."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise SettingsError(f'{setting}: expected "host:port", got {address!r}')
    if not 1 <= int(port) <= 65535:
        raise SettingsError(f"{setting}: port must be in 1..65535, got {port} in {address!r}")
    if host.startswith("[") != host.endswith("]"):
        raise SettingsError(f"{setting}: unbalanced brackets around an IPv6 host in {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def is_wildcard(address: str) -> bool:
    """A listening address on every interface (0.0.0.0 or ::)."""
    return address.rpartition(":")[0] in _WILDCARD_HOSTS


def same_listener(first: str, second: str) -> bool:
    """Whether two valid addresses would listen on the same port of the same interface."""
    if first.rpartition(":")[2] != second.rpartition(":")[2]:
        return False
    return is_wildcard(first) or is_wildcard(second) or first.lower() == second.lower()


def require_own_entry(setting: str, own: str, entry: str, member_id: int) -> None:
    """This member's own address must be where the others reach it: equal to its
    ``initial_cluster`` entry, or that entry's port on a wildcard host (listen everywhere)."""
    same_port = own.rpartition(":")[2] == entry.rpartition(":")[2]
    if own == entry or (same_port and is_wildcard(own)):
        return
    raise SettingsError(
        f"{setting} {own} differs from member {member_id}'s entry in initial_cluster ({entry}): "
        "the other members would look for it there; make them equal"
    )


def parse_size(text: str, setting: str) -> int:
    """``"67108864"``, ``"64MiB"``, ``"512KiB"``, ``"1GiB"`` -> bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise SettingsError(
            f"{setting}: expected a size in bytes, optionally with KiB, MiB or GiB "
            f"(e.g. 8MiB), got {text!r}"
        )
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def format_size(size_bytes: int) -> str:
    if size_bytes % MIB == 0:
        return f"{size_bytes // MIB} MiB"
    if size_bytes >= MIB:
        return f"{size_bytes / MIB:.1f} MiB"
    return f"{size_bytes / 1024:.1f} KiB"


class TlsPaths(Protocol):
    """Where a member's PEM files are (``daemon.TlsFiles``)."""

    cert_file: str
    key_file: str
    ca_file: str


def read_tls_files(paths: TlsPaths) -> tuple[bytes, bytes, bytes]:
    """(certificate chain, private key, CA bundle), each read and checked: the files are
    readable PEM, the key is the certificate's, and the CA bundle parses. A SettingsError
    names the file at fault."""
    cert = _read(paths.cert_file, "tls_cert_file")
    key = _read(paths.key_file, "tls_key_file")
    ca = _read(paths.ca_file, "tls_ca_file")
    for data, setting, path, marker in (
        (cert, "tls_cert_file", paths.cert_file, b"-----BEGIN CERTIFICATE-----"),
        (key, "tls_key_file", paths.key_file, b"PRIVATE KEY-----"),
        (ca, "tls_ca_file", paths.ca_file, b"-----BEGIN CERTIFICATE-----"),
    ):
        if marker not in data:
            what = "private key" if setting == "tls_key_file" else "certificate"
            raise SettingsError(f"{setting} {path}: holds no PEM {what}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
    except ssl.SSLError as exc:
        raise SettingsError(f"tls_ca_file {paths.ca_file}: not a usable CA bundle: {exc}") from None
    try:
        # A password callback, so an encrypted key fails here instead of prompting.
        context.load_cert_chain(paths.cert_file, paths.key_file, password=lambda: b"")
    except ssl.SSLError as exc:
        raise SettingsError(
            f"tls_key_file {paths.key_file} and tls_cert_file {paths.cert_file} do not make "
            f"a usable pair (the key must be unencrypted and match the certificate): {exc}"
        ) from None
    return cert, key, ca


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SettingsError(f"{setting} {path}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------------------- the data dir


class DataDirLock:
    """An exclusive ``flock`` on ``<data dir>/rallypoint.lock``, which holds the holder's pid.
    Take it with :meth:`acquire` before touching anything else in the data dir; it is released
    when the process exits (or by :meth:`release`). The file itself is never deleted: a
    process could otherwise lock a file another has just unlinked, and two would run."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        # Invariant: holds the lock while >= 0.
        self._fd = fd

    @classmethod
    def acquire(cls, data_dir: str) -> DataDirLock:
        """Create ``data_dir`` if needed and lock it, or raise a SettingsError saying why not
        (cannot be created, not writable, or locked by another process, named by pid)."""
        try:
            os.makedirs(data_dir, exist_ok=True)
        except OSError as exc:
            raise SettingsError(f"data_dir {data_dir} cannot be created: {_reason(exc)}") from None
        path = os.path.join(data_dir, LOCK_FILE_NAME)
        try:
            # Not O_TRUNC: the pid in it belongs to the holder until this process holds it.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise SettingsError(
                f"data_dir {data_dir} is not writable: cannot create {path}: {_reason(exc)}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise SettingsError(f"cannot lock {path}: {_reason(exc)}") from None
            raise SettingsError(
                f"data_dir {data_dir} is in use: {path} is locked by process {holder}; "
                "one member process per data dir (stop that one first)"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise SettingsError(
                f"data_dir {data_dir}: cannot write {path}: {_reason(exc)}"
            ) from None
        return cls(path, fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "(pid not recorded yet)"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def wal_space_needed(data_dir: str, segment_size_bytes: int) -> int:
    """Bytes the write-ahead log allocates when it opens: the rest of its newest segment up
    to ``segment_size_bytes`` (a whole segment for a new member), plus room for the first
    snapshot."""
    wal_dir = os.path.join(data_dir, WAL_SUBDIR)
    try:
        segments = sorted(name for name in os.listdir(wal_dir) if name.endswith(".wal"))
    except FileNotFoundError:
        segments = []
    allocated = 0
    if segments:
        allocated = os.stat(os.path.join(wal_dir, segments[-1])).st_blocks * 512
    return max(0, segment_size_bytes - allocated) + _HEADROOM_BYTES


def require_free_space(data_dir: str, segment_size_bytes: int) -> None:
    """Refuse to start on a disk that cannot hold the write-ahead log's segment."""
    needed = wal_space_needed(data_dir, segment_size_bytes)
    stats = os.statvfs(data_dir)
    free = stats.f_bavail * stats.f_frsize
    if free < needed:
        raise SettingsError(
            f"data_dir {data_dir} has {format_size(free)} free but needs {format_size(needed)} "
            f"(a write-ahead log segment of {format_size(segment_size_bytes)}, preallocated, "
            f"and {format_size(_HEADROOM_BYTES)} more): free some space or start with a "
            f"smaller --wal-segment-size (at least {format_size(MIN_WAL_SEGMENT_BYTES)})"
        )


# ---------------------------------------------------------------------------- listeners


def probe_listeners(addresses: list[tuple[str, str]]) -> None:
    """Bind every ``(setting, "host:port")`` at once, then release them all; a SettingsError
    names the first that cannot be bound (in use, or no such local address)."""
    sockets: list[socket.socket] = []
    bound: dict[int, tuple[str, str]] = {}  # port -> (setting, address) probed before
    try:
        for setting, address in addresses:
            host, port = split_address(address, setting)
            try:
                family, kind, proto, _, sockaddr = socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )[0]
            except socket.gaierror as exc:
                raise SettingsError(
                    f"{setting} {address}: cannot resolve {host!r}: {exc.strerror}"
                ) from None
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            # As gRPC does: a port whose old connections linger in TIME_WAIT is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
                # Listening, as the member will: two of its own addresses that name one
                # port differently (localhost, 127.0.0.1) conflict only then.
                sock.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and port in bound:
                    other_setting, other = bound[port]
                    raise SettingsError(
                        f"{setting} {address} and {other_setting} {other} are the same port: "
                        "each listener needs its own"
                    ) from None
                raise bind_failure(setting, address, exc) from None
            bound[port] = (setting, address)
    finally:
        for sock in sockets:
            sock.close()


def bind_failure(setting: str, address: str, exc: BaseException) -> SettingsError:
    """The one-line error for a listener that could not bind ``address``."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        reason = "the address is already in use (another member, or another copy of this one?)"
    elif isinstance(exc, OSError):
        reason = _reason(exc)
    else:
        reason = "the address cannot be bound (in use, or not an address of this host)"
    return SettingsError(f"{setting} {address}: cannot listen: {reason}")
