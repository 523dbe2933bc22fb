"""A local 3-member etcd cluster on loopback for the benchmarks' comparisons.

Each member is an ``etcd`` process (Debian's etcd-server) with its own data directory under
one parent, client and peer URLs on free 127.0.0.1 ports, and its log in ``member-N.log``
beside its data. ``wait_ready`` polls Maintenance.Status until every member answers and they
agree on a leader; ``stop`` sends SIGTERM, then SIGKILL to a member still running after a
grace period.

Members can also be failed one at a time (the failover benchmark): ``kill`` (SIGKILL),
``pause``/``resume`` (SIGSTOP/SIGCONT) and ``start_member`` again on the same data, which
etcd rejoins with its old identity (the ``--initial-*`` flags are ignored once a data
directory holds a WAL). Their log is appended to, so it covers every incarnation.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc

from bench.etcd.api import load
from tests.integration.harness import free_port_block

CLUSTER_TOKEN = "rallypoint-bench"


class EtcdCluster:
    """Members 1..n, member i on client port base + 2(i-1) and peer port the one after."""

    def __init__(
        self, data_dir: Path, members: int = 3, binary: str = "etcd", log_level: str = "warn"
    ) -> None:
        if shutil.which(binary) is None:
            raise FileNotFoundError(
                f"{binary!r} is not installed (apt-get install etcd-server etcd-client)"
            )
        self.data_dir = data_dir
        self.binary = binary
        self.log_level = log_level
        base = free_port_block(2 * members)
        self.client_addresses = [f"127.0.0.1:{base + 2 * i}" for i in range(members)]
        self.peer_urls = [f"http://127.0.0.1:{base + 2 * i + 1}" for i in range(members)]
        # Invariant: one entry per member (index = member number - 1), None until started.
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * members
        self._paused: set[int] = set()

    @property
    def name(self) -> str:
        return "etcd"

    def _command(self, index: int) -> list[str]:
        initial = ",".join(f"m{i + 1}={url}" for i, url in enumerate(self.peer_urls))
        client, peer = self.client_addresses[index], self.peer_urls[index]
        return [
            self.binary,
            f"--name=m{index + 1}",
            f"--data-dir={self.data_dir / f'member-{index + 1}'}",
            f"--listen-client-urls=http://{client}",
            f"--advertise-client-urls=http://{client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={CLUSTER_TOKEN}",
            "--logger=zap",
            "--log-outputs=stderr",
            f"--log-level={self.log_level}",
        ]

    def start(self) -> None:
        for index in range(len(self._procs)):
            self.start_member(index)

    def start_member(self, index: int) -> None:
        """Start member ``index`` (from 0), on its data directory if it has one."""
        proc = self._procs[index]
        if proc is not None and proc.poll() is None:
            raise RuntimeError(f"etcd member {index + 1} is already running")
        (self.data_dir / f"member-{index + 1}").mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / f"member-{index + 1}.log", "ab") as log:
            self._procs[index] = subprocess.Popen(
                self._command(index), stdout=log, stderr=subprocess.STDOUT
            )
        self._paused.discard(index)

    def kill(self, index: int) -> None:
        """SIGKILL member ``index`` (a paused one too) and reap it."""
        proc = self._procs[index]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self._paused.discard(index)

    def pause(self, index: int) -> None:
        proc = self._procs[index]
        assert proc is not None and proc.poll() is None, f"etcd member {index + 1} is not running"
        proc.send_signal(signal.SIGSTOP)
        self._paused.add(index)

    def resume(self, index: int) -> None:
        proc = self._procs[index]
        assert proc is not None, f"etcd member {index + 1} was never started"
        proc.send_signal(signal.SIGCONT)
        self._paused.discard(index)

    def running(self, index: int) -> bool:
        proc = self._procs[index]
        return proc is not None and proc.poll() is None

    def server_pids(self) -> list[int]:
        return [proc.pid for proc in self._procs if proc is not None and proc.poll() is None]

    async def member_status(self, index: int, timeout_s: float = 1.0) -> Any | None:
        """Member ``index``'s Maintenance.Status answer, or None when it gives none in time."""
        api = load()
        async with grpc.aio.insecure_channel(self.client_addresses[index]) as channel:
            stub = api.rpc_grpc.MaintenanceStub(channel)
            with contextlib.suppress(grpc.aio.AioRpcError):
                return await stub.Status(api.rpc.StatusRequest(), timeout=timeout_s)
        return None

    async def _statuses(self) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for index, address in enumerate(self.client_addresses):
            status = await self.member_status(index)
            if status is not None:
                answers[address] = status
        return answers

    async def leader_address(self) -> str:
        """The client address of the member every member names as leader."""
        statuses = await self._statuses()
        for address, status in statuses.items():
            if status.leader and status.header.member_id == status.leader:
                return address
        raise RuntimeError(f"etcd has no leader (answers from {sorted(statuses)})")

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"etcd member exited ({proc.returncode}); logs in {self.data_dir}"
                    )
            statuses = await self._statuses()
            leaders = {s.leader for s in statuses.values()}
            if (
                len(statuses) == len(self.client_addresses)
                and len(leaders) == 1
                and 0 not in leaders
            ):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"etcd not ready within {timeout_s:.0f}s; logs in {self.data_dir}")

    def stop(self) -> None:
        for index, proc in enumerate(self._procs):
            if proc is not None and proc.poll() is None:
                if index in self._paused:
                    proc.send_signal(signal.SIGCONT)  # SIGTERM waits while it is stopped
                proc.terminate()
        for proc in self._procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = [None] * len(self._procs)
        self._paused.clear()
