"""The members of one system under test, behind one small interface for the failover
benchmark: start, kill -9, pause, resume and restart member i, and ask it for its view (the
leader it follows, its term, commit and applied indexes).

rallypoint members are ``python -m rallypoint.coordinator serve`` processes started by the
integration tests' ProcessCluster (tests/integration/harness.py) with rallypoint's default
timing; etcd members by bench/etcd/cluster.py with etcd's defaults. Members are numbered from
0 here (the JSON and the logs number them from 1). Views are read over grpc.aio, so the load
generator's loop keeps running while a status call waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from bench.etcd.api import load as load_etcd_api
from bench.etcd.cluster import EtcdCluster
from rallypoint.proto.v1 import cluster_pb2, cluster_pb2_grpc
from tests.integration.harness import ProcessCluster

SYSTEMS = ("rallypoint", "etcd")
# A member's line when it becomes leader: "member 3 became leader at term 4 ..." from the
# role log, or the Raft core's own "3 became leader at term 4" where that is shown at INFO.
_RALLYPOINT_LEADER = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: (?:member )?\d+ "
    r"became leader at term",
    re.MULTILINE,
)
# rallypoint's defaults (coordinator/daemon.py Settings), passed explicitly because the
# harness defaults to the faster timing of the test suite.
RALLYPOINT_TICK_MS = 100
RALLYPOINT_ELECTION_TICKS = 10
RALLYPOINT_SNAPSHOT_ENTRIES = 100_000
# Fast reconnect to a member that restarted (gRPC's default backoff grows to 120 s), no gRPC
# retries: the options rallypoint's client library gives its channels, used for both systems.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
]


@dataclass(frozen=True, slots=True)
class MemberView:
    """What one member says: the member it follows (an index into the endpoints, None when
    it knows none), its term, and its commit and applied indexes."""

    leader: int | None
    term: int
    commit_index: int
    applied_index: int


class Members(Protocol):
    """Members 0..n-1 of one system; ``endpoints[i]`` is member i's client address."""

    @property
    def name(self) -> str: ...

    @property
    def endpoints(self) -> list[str]: ...

    def start_all(self) -> None: ...

    def start(self, member: int) -> None: ...

    def kill(self, member: int) -> None: ...

    def pause(self, member: int) -> None: ...

    def resume(self, member: int) -> None: ...

    def running(self, member: int) -> bool: ...

    async def view(self, member: int) -> MemberView | None: ...

    def server_pids(self) -> list[int]: ...

    def log_paths(self) -> list[Path]: ...

    def leader_elected_at(self) -> list[float]:
        """Wall-clock times (s since the epoch) at which a member logged that it became
        leader, from every member's log, in order."""
        ...

    def stop(self) -> None: ...

    async def close_channels(self) -> None: ...


class RallypointMembers:
    """The harness's ProcessCluster with rallypoint's default timing; members 1..n are
    indexes 0..n-1 here."""

    def __init__(self, data_dir: Path, size: int = 3) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.cluster = ProcessCluster(
            data_dir,
            size,
            tick_ms=RALLYPOINT_TICK_MS,
            election_ticks=RALLYPOINT_ELECTION_TICKS,
            snapshot_entries=RALLYPOINT_SNAPSHOT_ENTRIES,
        )
        self.ids = sorted(self.cluster.members)
        self._channels: dict[int, grpc.aio.Channel] = {}

    @property
    def name(self) -> str:
        return "rallypoint"

    @property
    def endpoints(self) -> list[str]:
        return [self.cluster.members[i].client_address for i in self.ids]

    def start_all(self) -> None:
        self.cluster.start_all()

    def start(self, member: int) -> None:
        self.cluster.start(self.ids[member])

    def kill(self, member: int) -> None:
        self.cluster.kill(self.ids[member])

    def pause(self, member: int) -> None:
        self.cluster.pause(self.ids[member])

    def resume(self, member: int) -> None:
        self.cluster.resume(self.ids[member])

    def running(self, member: int) -> bool:
        return self.cluster.members[self.ids[member]].running

    async def view(self, member: int) -> MemberView | None:
        channel = self._channels.get(member)
        if channel is None:
            channel = grpc.aio.insecure_channel(self.endpoints[member], options=CHANNEL_OPTIONS)
            self._channels[member] = channel
        try:
            status = await cluster_pb2_grpc.ClusterStub(channel).Status(
                cluster_pb2.StatusRequest(), timeout=1.0
            )
        except grpc.aio.AioRpcError:
            return None
        leader = self.ids.index(status.leader_id) if status.leader_id in self.ids else None
        return MemberView(leader, status.term, status.commit_index, status.applied_index)

    def server_pids(self) -> list[int]:
        return [
            m.proc.pid for m in self.cluster.members.values() if m.proc is not None and m.running
        ]

    def log_paths(self) -> list[Path]:
        return [self.cluster.members[i].log_path for i in self.ids]

    def leader_elected_at(self) -> list[float]:
        # Text logs stamped "2026-12-01 17:30:45,230" in local time.
        times = []
        for path in self.log_paths():
            for match in _RALLYPOINT_LEADER.finditer(path.read_text(errors="replace")):
                stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                times.append(stamp.timestamp())
        return sorted(times)

    def stop(self) -> None:
        self.cluster.shutdown()

    async def close_channels(self) -> None:
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()


class EtcdMembers:
    """bench/etcd/cluster.py's EtcdCluster at etcd's default timing and log level (info)."""

    def __init__(self, data_dir: Path, size: int = 3) -> None:
        self.cluster = EtcdCluster(data_dir, size, log_level="info")
        # etcd names members by 64-bit ids; each member's own answer tells us its id.
        self._index_by_id: dict[int, int] = {}
        self._channels: dict[int, grpc.aio.Channel] = {}

    @property
    def name(self) -> str:
        return "etcd"

    @property
    def endpoints(self) -> list[str]:
        return list(self.cluster.client_addresses)

    def start_all(self) -> None:
        self.cluster.start()

    def start(self, member: int) -> None:
        self.cluster.start_member(member)

    def kill(self, member: int) -> None:
        self.cluster.kill(member)

    def pause(self, member: int) -> None:
        self.cluster.pause(member)

    def resume(self, member: int) -> None:
        self.cluster.resume(member)

    def running(self, member: int) -> bool:
        return self.cluster.running(member)

    async def view(self, member: int) -> MemberView | None:
        api = load_etcd_api()
        channel = self._channels.get(member)
        if channel is None:
            channel = grpc.aio.insecure_channel(self.endpoints[member], options=CHANNEL_OPTIONS)
            self._channels[member] = channel
        try:
            status = await api.rpc_grpc.MaintenanceStub(channel).Status(
                api.rpc.StatusRequest(), timeout=1.0
            )
        except grpc.aio.AioRpcError:
            return None
        self._index_by_id[status.header.member_id] = member
        leader = self._index_by_id.get(status.leader) if status.leader else None
        # etcd's raftIndex is the member's committed index.
        return MemberView(leader, status.raftTerm, status.raftIndex, status.raftAppliedIndex)

    def server_pids(self) -> list[int]:
        return self.cluster.server_pids()

    def log_paths(self) -> list[Path]:
        return [self.cluster.data_dir / f"member-{i + 1}.log" for i in range(len(self.endpoints))]

    def leader_elected_at(self) -> list[float]:
        # zap's JSON lines: {"level":"info","ts":"2026-12-01T17:29:30.434Z",...,
        # "msg":"2dc277578a28c0c9 became leader at term 2"}, ts in UTC
        times = []
        for path in self.log_paths():
            for line in path.read_text(errors="replace").splitlines():
                if "became leader at term" not in line:
                    continue
                with contextlib.suppress(ValueError, KeyError):
                    entry = json.loads(line)
                    if entry["msg"].split(" ", 1)[1].startswith("became leader at term"):
                        stamp = datetime.datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))
                        times.append(stamp.timestamp())
        return sorted(times)

    def stop(self) -> None:
        self.cluster.stop()

    async def close_channels(self) -> None:
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()


async def agreed_leader(members: Members, among: Sequence[int]) -> int | None:
    """The member every listed member names as leader, when they agree on one of them."""
    views = [await members.view(i) for i in among]
    leaders = {v.leader if v is not None else None for v in views}
    if len(leaders) != 1:
        return None
    (leader,) = leaders
    return leader if leader in among else None


async def caught_up(members: Members, member: int, leader: int) -> bool:
    """``member`` follows ``leader`` and has applied what the leader had committed when asked
    just before (writes go on, so the leader's own figure moves)."""
    leader_view = await members.view(leader)
    view = await members.view(member)
    return (
        leader_view is not None
        and view is not None
        and view.leader == leader
        and view.applied_index >= leader_view.commit_index
    )


async def wait_for(
    condition: Callable[[], Awaitable[Any]], timeout_s: float, what: str, interval_s: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await condition()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def settle(members: Members, timeout_s: float) -> int:
    """Wait until every member is up, they agree on a leader and every follower has caught
    up; return the leader."""
    everyone = list(range(len(members.endpoints)))
    for member in everyone:
        if not members.running(member):
            raise RuntimeError(f"{members.name} member {member + 1} is not running")

    async def settled() -> int | None:
        leader = await agreed_leader(members, everyone)
        if leader is None:
            return None
        for member in everyone:
            if member != leader and not await caught_up(members, member, leader):
                return None
        return leader

    leader: int = await wait_for(settled, timeout_s, f"{members.name} to settle")
    return leader


def make_members(name: str, data_dir: Path) -> Members:
    """The members of system ``name`` (not started), their data under data_dir/name."""
    if name == "rallypoint":
        return RallypointMembers(data_dir / "rallypoint")
    if name == "etcd":
        return EtcdMembers(data_dir / "etcd")
    raise ValueError(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
