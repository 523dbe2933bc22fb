"""Real coordinator processes on loopback, for integration and fault-injection tests.

A :class:`ProcessCluster` starts ``python -m rallypoint.coordinator serve`` members with
their own data directories and free ports, and can stop, kill -9, pause (SIGSTOP), resume
and restart each one. It asks members for their status over the public API (generated stubs,
no client library), so it can also check the client library itself. Every wait is a poll of
a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from rallypoint.proto.v1 import cluster_pb2, cluster_pb2_grpc
from rallypoint.worker.process_tree import descendants, set_child_subreaper

T = TypeVar("T")


def listen_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1, distinct, below the system's ephemeral range: for
    a server a process starts later (a second world's TCPStore), after connections of its
    own may have taken ephemeral ports. ``free_ports`` hands out ephemeral ports, and a
    gloo connection made in between can take one (EADDRINUSE when the server starts)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    chosen: list[int] = []
    candidates = list(range(max(1024, low - 12000), low))
    random.Random().shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"found no {count} free loopback ports below {low}")


def free_ports(count: int, avoid: set[int] | None = None) -> list[int]:
    """Ports free right now on 127.0.0.1, distinct (bound together) and none of ``avoid``
    (ports handed out earlier and maybe not bound yet: the system may offer one again)."""
    sockets = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            port = int(s.getsockname()[1])
            if avoid is None or port not in avoid:
                ports.append(port)
            if len(sockets) > count + 1000:
                raise RuntimeError(f"found no {count} free loopback ports outside {avoid}")
    finally:
        for s in sockets:
            s.close()
    return ports


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(count: int, attempts: int = 200) -> int:
    """The first of ``count`` consecutive loopback ports that are free now.

    Another process may take one before the caller binds it; callers that start servers on
    these ports should fail clearly (they do: the server will not come up) rather than retry
    blindly.
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count < 65536 and all(port_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"found no {count} consecutive free loopback ports")


SERVE_COMMAND = [sys.executable, "-m", "rallypoint.coordinator", "serve"]


def refused_to_start(command: list[str], timeout_s: float = 20.0) -> str:
    """Run a command (``SERVE_COMMAND`` and flags, say) that must refuse to start: exit code 2
    within seconds, exactly one line on stderr and no traceback. Returns the line."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def kill_processes_mentioning(text: str) -> list[int]:
    """SIGKILL every process whose command line contains ``text`` (e.g. a test's own output
    directory). torchrun starts its workers in sessions of their own, so killing an agent's
    process group leaves them running; this finds them wherever they were reparented."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        if text in command_line(int(entry)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
    return killed


_WAITED = re.compile(r"waiting for the coordinator: no member answered for (\d+) s")


def logged_coordinator_wait_s(log_text: str) -> int:
    """The longest "waiting for the coordinator: no member answered for N s" in a worker's or
    agent's log (0: none), as ``rallypoint.worker.patience`` writes it."""
    return max((int(found) for found in _WAITED.findall(log_text)), default=0)


def command_line(pid: int) -> str:
    """A process's command line ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def sigint_at_its_default() -> None:
    """A ``preexec_fn`` for a program a test will send SIGINT: the program starts with
    Ctrl-C's default disposition, as one started at a terminal does. A shell that runs the
    tests as a background job (``... &`` without job control) starts them with SIGINT
    ignored; every child inherits that, and Python leaves an ignored SIGINT ignored, so the
    test would wait on a program that never hears its Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# How long no_process_outlives lets a process that outlived its parent finish ending.
LEFTOVER_GRACE_S = 3.0


@contextlib.contextmanager
def no_process_outlives(what: str) -> Iterator[None]:
    """Fail unless every process started in the block (by what runs there, its children,
    theirs...) has ended by the block's end. Meanwhile this process is a child subreaper, so
    an orphan anywhere below it stays its descendant (a torchrun worker whose agent died, a
    member whose ``cluster up`` was killed): the leftovers are the descendants that were not
    there before. They are killed, and the failure names them."""
    before = set(descendants())
    set_child_subreaper(True)
    try:
        yield
    finally:
        # A moment's grace: a helper whose parent just exited (multiprocessing's resource
        # tracker reads end-of-file on its pipe, then exits) is ending, not left running.
        # Zombies do not count (descendants() skips them).
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while time.monotonic() < deadline and set(descendants()) - before:
            time.sleep(0.05)
        leftover = [pid for pid in descendants() if pid not in before]
        lines = [f"{pid}: {command_line(pid)}" for pid in leftover]
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not set(descendants()) & set(leftover), 10, "leftovers killed")
        set_child_subreaper(False)
        # Adopted orphans that died are this process's zombies now: collect them.
        for pid in leftover:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    assert not leftover, f"{what} left processes running:\n" + "\n".join(lines)


def write_tokens_file(path: Path, roles: dict[str, str]) -> Path:
    """A tokens file (docs/security.md, "Client tokens and roles") giving each token (key) its
    role (value), named after the role: ``rallypoint serve --tokens-file PATH``."""
    path.write_text(
        "".join(
            f'[[token]]\nname = "{role}"\nrole = "{role}"\n'
            f'sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n\n'
            for token, role in roles.items()
        )
    )
    return path


def wait_until(
    condition: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something truthy; raise naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class MemberProcess:
    member_id: int
    peer_address: str
    client_address: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    extra_args: list[str] = field(default_factory=list)
    # The harness stopped or killed it (or saw it refuse to start, as expected): an exit
    # that is not one of these is the member's own doing.
    stopped: bool = False
    # An exit code the harness expects from this start (a member started on a log it damaged
    # refuses to run, with 2): such an exit is not the member's own doing either, even seen
    # before the harness has looked.
    expected_exit_code: int | None = None
    # Where it serves Prometheus /metrics ("": not served).
    metrics_address: str = ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ProcessCluster:
    def __init__(
        self,
        root: Path,
        size: int = 3,
        *,
        tick_ms: int = 50,
        election_ticks: int = 10,
        snapshot_entries: int = 10_000,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        token: str | None = None,
        auth_token: str | None = None,
        metrics: bool = False,
    ) -> None:
        """``token``: the bearer token the harness's own status calls carry (members started
        with ``--tokens-file`` in ``extra_args`` require one). ``auth_token``: members are
        started with ``--auth-token`` set to it, and the harness's calls carry it.
        ``metrics``: each member serves /metrics on a port of its own
        (``MemberProcess.metrics_address``)."""
        self.root = root
        self.metrics = metrics
        # With a token, members require it from clients, and the harness's own calls send it.
        self.auth_token = auth_token
        self.tick_ms = tick_ms
        self.election_ticks = election_ticks
        self.snapshot_entries = snapshot_entries
        self.extra_args = list(extra_args or [])
        self.env = dict(os.environ, **(env or {}))
        # Every member holds the cluster's peer secret.
        root.mkdir(parents=True, exist_ok=True)
        self.secret_path = root / "peer-secret"
        if not self.secret_path.exists():
            self.secret_path.write_text(os.urandom(32).hex() + "\n")
            self.secret_path.chmod(0o600)
        bearer = token or auth_token
        self.metadata = (("authorization", f"Bearer {bearer}"),) if bearer else ()
        self.members: dict[int, MemberProcess] = {}
        for member_id in range(1, size + 1):
            self._describe(member_id)

    def _describe(self, member_id: int) -> MemberProcess:
        # Distinct from every other member's: a port handed out but not yet bound may be
        # offered again (two members then fight over it and one cannot start).
        taken = {
            int(address.rpartition(":")[2])
            for other in self.members.values()
            for address in (other.peer_address, other.client_address, other.metrics_address)
            if address
        }
        peer, client, metrics = free_ports(3, avoid=taken)
        member = MemberProcess(
            member_id,
            f"127.0.0.1:{peer}",
            f"127.0.0.1:{client}",
            self.root / f"member-{member_id}",
            self.root / f"member-{member_id}.log",
            metrics_address=f"127.0.0.1:{metrics}" if self.metrics else "",
        )
        self.members[member_id] = member
        return member

    @property
    def endpoints(self) -> list[str]:
        return [m.client_address for m in self.members.values()]

    def initial_cluster(self, ids: list[int] | None = None) -> str:
        chosen = ids or sorted(self.members)
        return ",".join(
            f"{i}={self.members[i].peer_address}@{self.members[i].client_address}" for i in chosen
        )

    def _command(self, member: MemberProcess, initial: str, join: bool) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "rallypoint.coordinator",
            "serve",
            f"--member-id={member.member_id}",
            f"--data-dir={member.data_dir}",
            f"--peer-address={member.peer_address}",
            f"--client-address={member.client_address}",
            f"--initial-cluster={initial}",
            f"--peer-secret-file={self.secret_path}",
            f"--tick-ms={self.tick_ms}",
            f"--election-ticks={self.election_ticks}",
            f"--snapshot-entries={self.snapshot_entries}",
            # RALLYPOINT_MEMBER_LOG_LEVEL=DEBUG: the Raft core's and the transport's lines
            # too, in every test's (and jepsen run's) member logs.
            f"--log-level={os.environ.get('RALLYPOINT_MEMBER_LOG_LEVEL', 'INFO')}",
            *([f"--auth-token={self.auth_token}"] if self.auth_token else []),
            *([f"--metrics-address={member.metrics_address}"] if member.metrics_address else []),
            *self.extra_args,
            *member.extra_args,
        ]
        if join:
            command.append("--join")
        return command

    def start(self, member_id: int, *, join: bool = False, initial: str | None = None) -> None:
        member = self.members[member_id]
        assert not member.running, f"member {member_id} is already running"
        log = open(member.log_path, "ab")  # noqa: SIM115 (the child keeps it open)
        member.proc = subprocess.Popen(
            self._command(member, initial or self.initial_cluster(), join),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        log.close()
        member.paused = False
        member.stopped = False

    def start_all(self) -> None:
        for member_id in self.members:
            self.start(member_id)

    def add_member_process(self) -> MemberProcess:
        """Describe a new member (not started) with fresh ports and the next id: one above
        every id described so far, removed members included, as the cluster numbers them."""
        return self._describe(max(self.members) + 1)

    def kill(self, member_id: int) -> None:
        """kill -9."""
        member = self.members[member_id]
        member.stopped = True
        if member.proc is not None:
            if member.paused:
                member.proc.send_signal(signal.SIGCONT)
            member.proc.kill()
            member.proc.wait()
        member.paused = False

    def stop(self, member_id: int, timeout_s: float = 15.0) -> int:
        """SIGTERM (graceful: a leader transfers leadership first); returns the exit code."""
        member = self.members[member_id]
        assert member.proc is not None
        member.stopped = True
        if member.paused:
            self.resume(member_id)
        member.proc.terminate()
        try:
            return member.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            member.proc.kill()
            member.proc.wait()
            raise

    def pause(self, member_id: int) -> None:
        member = self.members[member_id]
        assert member.proc is not None
        member.proc.send_signal(signal.SIGSTOP)
        member.paused = True

    def resume(self, member_id: int) -> None:
        member = self.members[member_id]
        assert member.proc is not None
        member.proc.send_signal(signal.SIGCONT)
        member.paused = False

    def restart(self, member_id: int) -> None:
        self.kill(member_id)
        self.start(member_id)

    def exited_on_their_own(self) -> dict[int, int]:
        """Members whose process ended without the harness stopping it: id -> exit code."""
        # A copy: a membership fault adds members from another thread meanwhile.
        return {
            member_id: member.proc.returncode
            for member_id, member in list(self.members.items())
            if member.proc is not None
            and not member.stopped
            and member.proc.poll() is not None
            and member.proc.returncode != member.expected_exit_code
        }

    def shutdown(self) -> None:
        for member in self.members.values():
            member.stopped = True
            if member.running:
                assert member.proc is not None
                if member.paused:
                    member.proc.send_signal(signal.SIGCONT)
                member.proc.kill()
                member.proc.wait()

    def status(self, member_id: int, timeout_s: float = 1.0) -> cluster_pb2.StatusResponse | None:
        member = self.members[member_id]
        if not member.running or member.paused:
            return None
        with grpc.insecure_channel(member.client_address) as channel:
            try:
                response: cluster_pb2.StatusResponse = cluster_pb2_grpc.ClusterStub(channel).Status(
                    cluster_pb2.StatusRequest(), timeout=timeout_s, metadata=self.metadata
                )
                return response
            except grpc.RpcError:
                return None

    def leader(self, timeout_s: float = 20.0, among: list[int] | None = None) -> int:
        """The member that every live (listed) member agrees leads."""

        def agreed() -> int | None:
            ids = among or [i for i, m in self.members.items() if m.running and not m.paused]
            statuses = [self.status(i) for i in ids]
            if not statuses or any(s is None for s in statuses):
                return None
            leaders = {s.leader_id for s in statuses if s is not None}
            if len(leaders) == 1:
                (leader,) = leaders
                if leader and leader in ids:
                    return int(leader)
            return None

        return wait_until(agreed, timeout_s, "a leader all live members agree on")

    def wipe(self, member_id: int) -> None:
        """Delete a stopped member's data directory, as a lost disk would."""
        member = self.members[member_id]
        assert not member.running, "wipe a stopped member only"
        shutil.rmtree(member.data_dir, ignore_errors=True)

    def log_text(self, member_id: int) -> str:
        with contextlib.suppress(OSError):
            return self.members[member_id].log_path.read_text(errors="replace")
        return ""


@contextlib.contextmanager
def running_cluster(root: Path, size: int = 3, **kwargs: object) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster(root, size, **kwargs)
    cluster.start_all()
    try:
        cluster.leader()
        yield cluster
    except BaseException:
        for member_id in cluster.members:
            tail = cluster.log_text(member_id)[-3000:]
            if tail:
                print(f"--- member {member_id} log (tail) ---\n{tail}", file=sys.stderr)
        raise
    finally:
        cluster.shutdown()


@contextlib.contextmanager
def running_cluster_with_tokens(
    root: Path, roles: dict[str, str], size: int = 3, **kwargs: object
) -> Iterator[ProcessCluster]:
    """:func:`running_cluster` whose members require tokens: ``roles`` (token -> role, one
    of them admin, which the harness's own calls use) in ``root/tokens.toml``."""
    root.mkdir(parents=True, exist_ok=True)
    path = write_tokens_file(root / "tokens.toml", roles)
    admin = next(token for token, role in roles.items() if role == "admin")
    with running_cluster(
        root, size, extra_args=[f"--tokens-file={path}"], token=admin, **kwargs
    ) as cluster:
        yield cluster


def assert_left_nothing(scratch: Path, what: str) -> None:
    """Fails naming what ``what`` left in ``scratch``, the ``TMPDIR`` it was run with."""
    left = sorted(str(path.relative_to(scratch)) for path in scratch.iterdir())
    assert not left, f"{what} left {len(left)} entries in its temp folder: {left[:10]}"
