"""The integration harness's ProcessCluster, with each member in its own network namespace.

:class:`NamespaceCluster` keeps everything ProcessCluster does (start, stop, kill -9, pause,
resume, restart, status, leader) and adds what the fault-injection suite needs: members at
their namespace's address, a per-member environment (libfaketime for clock skew, the unsafe
test switches for negative controls), membership changes with real processes, and damage to a
stopped member's write-ahead log.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.harness import MemberProcess, ProcessCluster, wait_until
from tests.upgrade.previous import Build

from . import netns
from .availability import Health

FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


class NamespaceCluster(ProcessCluster):
    def __init__(
        self,
        root: Path,
        network: netns.Network,
        size: int = 3,
        *,
        env: dict[str, str] | None = None,
        **kwargs: int,
    ) -> None:
        self.network = network
        # Extra environment of one member's next start (clock skew).
        self.member_env: dict[int, dict[str, str]] = {}
        # Members that start with another build (the previous release: tests/upgrade); the
        # others run this checkout's code.
        self.builds: dict[int, Build] = {}
        # The members of the cluster's configuration (described members may have left).
        self.active: set[int] = set(range(1, size + 1))
        # Active members added as learners and not yet promoted (they do not vote).
        self.learners: set[int] = set()
        # Members started on a wiped data dir that have not caught up yet: they do not vote
        # (coordinator/identity.py, "abstaining"), so they do not count as up.
        self.recovering: set[int] = set()
        # Members whose process was launched but has not answered yet (importing, opening
        # its log: seconds on a loaded machine): not up either, whoever asks meanwhile (the
        # run's health poller included).
        self.starting: set[int] = set()
        # Called with the cluster's health after every change a fault makes (processes
        # started, killed, paused or resumed; membership; the network): see ``health``.
        self.on_change: Callable[[Health], None] | None = None
        super().__init__(root, size, env=env, **kwargs)  # type: ignore[arg-type]
        network.on_change = self.note_change

    # ------------------------------------------------------------------ health

    def health(self) -> Health:
        """Voters, the members up (running, not paused, answering, voting), the network's
        faults."""
        voters = tuple(sorted(self.active - self.learners))
        up = tuple(
            m
            for m in sorted(self.active - self.recovering - self.starting)
            if self.members[m].running and not self.members[m].paused
        )
        return Health(
            time.monotonic(),
            voters,
            up,
            tuple(sorted(self.network.blocked)),
            tuple(sorted(self.network.degraded)),
        )

    def note_change(self) -> None:
        """Report the health now (the faults call this after a change made elsewhere,
        e.g. a learner promoted)."""
        if self.on_change is not None:
            self.on_change(self.health())

    def start(self, member_id: int, *, join: bool = False, initial: str | None = None) -> None:
        """Start a member; while a run records health, return once it answers (or exits):
        a member counts as up only then."""
        if self.on_change is None:
            super().start(member_id, join=join, initial=initial)
            return
        self.starting.add(member_id)
        try:
            super().start(member_id, join=join, initial=initial)
            member = self.members[member_id]
            with contextlib.suppress(TimeoutError):
                wait_until(
                    lambda: not member.running or self.status(member_id) is not None,
                    20.0,
                    f"member {member_id} to answer",
                )
        finally:
            self.starting.discard(member_id)
        self.note_change()

    def kill(self, member_id: int) -> None:
        super().kill(member_id)
        self.note_change()

    def pause(self, member_id: int) -> None:
        super().pause(member_id)
        self.note_change()

    def resume(self, member_id: int) -> None:
        super().resume(member_id)
        self.note_change()

    def _describe(self, member_id: int) -> MemberProcess:
        self.network.add_member(member_id)
        host = netns.address(member_id)
        member = MemberProcess(
            member_id,
            f"{host}:{netns.PEER_PORT}",
            f"{host}:{netns.CLIENT_PORT}",
            self.root / f"member-{member_id}",
            self.root / f"member-{member_id}.log",
        )
        self.members[member_id] = member
        return member

    def _command(self, member: MemberProcess, initial: str, join: bool) -> list[str]:
        # `ip netns exec` and `env` both exec, so the Popen pid is the member's own (signals
        # reach it directly).
        extra = [f"{k}={v}" for k, v in sorted(self.member_env.get(member.member_id, {}).items())]
        command = super()._command(member, initial, join)
        build = self.builds.get(member.member_id)
        if build is not None:
            # [python, -m, rallypoint.coordinator, serve, ...]: the same subcommand and flags.
            assert command[1:3] == ["-m", "rallypoint.coordinator"], command[:3]
            command = [*build.interpreter, *command[3:]]
            extra += [f"{k}={v}" for k, v in build.env]
        prefix = ["ip", "netns", "exec", netns.namespace(member.member_id), "env", *extra]
        return prefix + command

    def initial_cluster(self, ids: list[int] | None = None) -> str:
        return super().initial_cluster(ids or sorted(self.active))

    def live(self) -> list[int]:
        return [i for i in sorted(self.active) if self.members[i].running]

    def leader_or_none(self, timeout_s: float = 10.0) -> int | None:
        try:
            return self.leader(timeout_s=timeout_s, among=self.live())
        except TimeoutError:
            return None

    # ------------------------------------------------------------------ clock

    def skew_clock(self, member_id: int, offset_s: float, rate: float) -> None:
        """Restart a member under libfaketime: its clocks (monotonic too) offset and running
        at ``rate`` times real speed."""
        self.member_env[member_id] = {
            "LD_PRELOAD": FAKETIME_LIBRARY,
            "FAKETIME": f"{offset_s:+.1f}s x{rate:.2f}",
            "FAKETIME_DONT_RESET": "1",
        }
        self.kill(member_id)
        self.start(member_id)

    def unskew_clock(self, member_id: int) -> None:
        if self.member_env.pop(member_id, None) is not None:
            self.kill(member_id)
            self.start(member_id)

    # ------------------------------------------------------------------ storage

    def damage_wal(self, member_id: int, rng: random.Random) -> str:
        """On a stopped member: cut the last segment inside its final record (a torn write)
        or flip one bit among its last records. What was done, for the report.

        In place, a block at a time: the segment is preallocated (64 MiB), and reading it
        whole, stripping and rewriting it held the interpreter lock for seconds, which
        stopped every client of the run (they share this process), so the cluster was
        judged unavailable for time in which nobody asked it anything."""
        member = self.members[member_id]
        assert not member.running, "damage a stopped member only"
        segments = sorted(member.data_dir.glob("**/wal/*.wal"))
        if not segments:
            return "no WAL segment to damage"
        segment = segments[-1]
        fd = os.open(segment, os.O_RDWR)
        try:
            end = _written_end(fd)
            if end <= 64:
                return f"{segment.name}: too little data to damage"
            if rng.random() < 0.5:
                cut = end - rng.randint(1, min(48, end - 64))
                # Keep the file's length (preallocated): zero the tail instead of shortening.
                os.pwrite(fd, bytes(end - cut), cut)
                return f"{segment.name}: zeroed bytes {cut}..{end} (a torn final record)"
            offset = rng.randint(max(64, end - 4096), end - 1)
            bit = rng.randrange(8)
            (byte,) = os.pread(fd, 1, offset)
            os.pwrite(fd, bytes([byte ^ (1 << bit)]), offset)
            return f"{segment.name}: flipped bit {bit} of byte {offset} (of {end} written)"
        finally:
            os.close(fd)

    def refused_to_start(self, member_id: int, within_s: float = 8.0) -> bool:
        """True when the member exited by itself soon after starting (corruption detected)."""
        member = self.members[member_id]
        try:
            wait_until(lambda: not member.running or self.status(member_id), within_s, "x")
        except TimeoutError:
            return False
        if not member.running:
            member.stopped = True  # an expected exit: it found its log corrupt
        return not member.running

    # ------------------------------------------------------------------ membership

    def forget(self, member_id: int) -> None:
        """After removal from the configuration: stop its process and drop its namespace."""
        if self.members[member_id].running:
            self.kill(member_id)
        self.active.discard(member_id)
        self.learners.discard(member_id)
        self.recovering.discard(member_id)
        self.member_env.pop(member_id, None)
        self.network.forget(member_id)  # reports the change


def _written_end(fd: int, block_bytes: int = 1 << 20) -> int:
    """The offset just past a segment's last non-zero byte (the rest is preallocation),
    read backwards a block at a time."""
    position = os.fstat(fd).st_size
    while position > 0:
        start = max(0, position - block_bytes)
        written = len(os.pread(fd, position - start, start).rstrip(b"\0"))
        if written:
            return start + written
        position = start
    return 0


def process_environment(unsafe: str | None) -> dict[str, str]:
    """The members' environment: uvloop's default kept, the unsafe switch if asked for."""
    env = {"PYTHONUNBUFFERED": "1"}
    if unsafe == "stale-reads":
        env["RALLYPOINT_UNSAFE_STALE_READS"] = "1"
    elif unsafe == "stale-fence":
        env["RALLYPOINT_UNSAFE_ACCEPT_STALE_FENCE"] = "1"
    elif unsafe == "stale-store-cache":
        env["RALLYPOINT_UNSAFE_STORE_CACHE"] = "1"
    elif unsafe is not None:
        raise ValueError(f"unknown unsafe switch {unsafe!r}")
    # The peer transport under test (RALLYPOINT_PEER_TRANSPORT=stream make jepsen).
    transport = os.environ.get("RALLYPOINT_PEER_TRANSPORT")
    if transport:
        env["RALLYPOINT_PEER_TRANSPORT"] = transport
    return {**env, "PATH": os.environ.get("PATH", "")}
