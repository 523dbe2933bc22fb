"""A local 3-member etcd cluster on loopback for the benchmarks' comparisons.

Each member is an ``etcd`` process (Debian's etcd-server) with its own data directory under
one parent, client and peer URLs on free 127.0.0.1 ports, and its log in ``member-N.log``
beside its data. ``wait_ready`` polls Maintenance.Status until every member answers and they
agree on a leader; ``stop`` sends SIGTERM, then SIGKILL to a member still running after a
grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import IO

import grpc

from bench.common import free_port_block
from bench.etcd.api import load

CLUSTER_TOKEN = "rallypoint-bench"


class EtcdCluster:
    """Members 1..n, member i on client port base + 2(i-1) and peer port the one after."""

    def __init__(self, data_dir: Path, members: int = 3, binary: str = "etcd") -> None:
        if shutil.which(binary) is None:
            raise FileNotFoundError(
                f"{binary!r} is not installed (apt-get install etcd-server etcd-client)"
            )
        self.data_dir = data_dir
        self.binary = binary
        base = free_port_block(2 * members)
        self.client_addresses = [f"127.0.0.1:{base + 2 * i}" for i in range(members)]
        self.peer_urls = [f"http://127.0.0.1:{base + 2 * i + 1}" for i in range(members)]
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def name(self) -> str:
        return "etcd"

    def start(self) -> None:
        initial = ",".join(f"m{i + 1}={url}" for i, url in enumerate(self.peer_urls))
        for i, (client, peer) in enumerate(zip(self.client_addresses, self.peer_urls, strict=True)):
            member_dir = self.data_dir / f"member-{i + 1}"
            member_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.data_dir / f"member-{i + 1}.log", "wb")  # noqa: SIM115 (closed in stop)
            self._logs.append(log)
            command = [
                self.binary,
                f"--name=m{i + 1}",
                f"--data-dir={member_dir}",
                f"--listen-client-urls=http://{client}",
                f"--advertise-client-urls=http://{client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={initial}",
                "--initial-cluster-state=new",
                f"--initial-cluster-token={CLUSTER_TOKEN}",
                "--logger=zap",
                "--log-outputs=stderr",
                "--log-level=warn",
            ]
            self._procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))

    def server_pids(self) -> list[int]:
        return [proc.pid for proc in self._procs if proc.poll() is None]

    async def _statuses(self) -> dict[str, object]:
        api = load()
        answers: dict[str, object] = {}
        for address in self.client_addresses:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = api.rpc_grpc.MaintenanceStub(channel)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    answers[address] = await stub.Status(api.rpc.StatusRequest(), timeout=1.0)
        return answers

    async def leader_address(self) -> str:
        """The client address of the member every member names as leader."""
        statuses = await self._statuses()
        for address, status in statuses.items():
            if status.leader and status.header.member_id == status.leader:  # type: ignore[attr-defined]
                return address
        raise RuntimeError(f"etcd has no leader (answers from {sorted(statuses)})")

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"etcd member exited ({proc.returncode}); logs in {self.data_dir}"
                    )
            statuses = await self._statuses()
            leaders = {s.leader for s in statuses.values()}  # type: ignore[attr-defined]
            if (
                len(statuses) == len(self.client_addresses)
                and len(leaders) == 1
                and 0 not in leaders
            ):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"etcd not ready within {timeout_s:.0f}s; logs in {self.data_dir}")

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        self._procs.clear()
        self._logs.clear()
