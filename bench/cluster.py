"""The clusters the benchmarks measure against: a local rallypoint cluster (``rallypoint
cluster up``) and the shape every system's cluster has (bench/etcd/cluster.py is etcd's)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import grpc

from bench.common import child_pids
from rallypoint.coordinator.cli.main import local_cluster_addresses
from rallypoint.proto.v1 import cluster_pb2, cluster_pb2_grpc
from tests.integration.harness import free_port_block


class Cluster(Protocol):
    @property
    def name(self) -> str: ...

    def start(self) -> None: ...

    async def wait_ready(self, timeout_s: float = 30.0) -> None: ...

    async def leader_address(self) -> str: ...

    def server_pids(self) -> list[int]: ...

    def stop(self) -> None: ...


class RallypointCluster:
    """``rallypoint cluster up --nodes N`` with its output in ``cluster.log`` under data_dir."""

    def __init__(self, data_dir: Path, members: int = 3, base_port: int | None = None) -> None:
        self.data_dir = data_dir
        self.members = members
        # A given base port (a range set aside for the run) or the first free block.
        self.base_port = free_port_block(2 * members) if base_port is None else base_port
        self.addresses = {
            member: client
            for member, (_, client) in local_cluster_addresses(members, self.base_port).items()
        }
        self.log_path = data_dir / "cluster.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return "rallypoint"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rallypoint.coordinator",
                    "cluster",
                    "up",
                    f"--nodes={self.members}",
                    f"--data-dir={self.data_dir}",
                    f"--base-port={self.base_port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise RuntimeError(f"rallypoint cluster exited; see {self.log_path}")
            if "members up" in self.log_path.read_text(errors="replace"):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(
            f"rallypoint cluster not up within {timeout_s:.0f}s; see {self.log_path}"
        )

    async def leader_address(self) -> str:
        for address in self.addresses.values():
            async with grpc.aio.insecure_channel(address) as channel:
                stub = cluster_pb2_grpc.ClusterStub(channel)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    status = await stub.Status(cluster_pb2.StatusRequest(), timeout=1.0)
                    if status.leader_id in self.addresses:
                        return self.addresses[status.leader_id]
        raise RuntimeError("rallypoint has no leader")

    def server_pids(self) -> list[int]:
        # The members are the children of `cluster up`, which itself only waits.
        return [] if self._proc is None else child_pids(self._proc.pid)

    async def leader_pid(self) -> int | None:
        """The process id of the member that leads now (for its CPU)."""
        address = await self.leader_address()
        for pid in self.server_pids():
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if f"--client-address={address}".encode() in command:
                    return pid
        return None

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
