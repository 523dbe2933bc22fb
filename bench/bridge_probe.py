"""Replay process-group bootstrap patterns through TCPStore bridges, for profiling the bridge.

A quick probe, not the benchmark (``make bench-store`` is): a 3-member cluster on loopback,
one participant and one :class:`TCPStoreBridge` per ``ranks_per_bridge`` simulated ranks (as
under torchrun, one bridge per node), and a child process playing N ranks on torch's
TCPStore wire protocol (raw sockets, one connection per rank, as torch's client does: a get
is a WAIT then a GET). The same ranks are then replayed against torch's C++ TCPStore server.

Patterns. ``gloo``: every rank sets its key, then gets every other rank's, in rank order
(gloo's full-mesh connect). ``nccl``: rank 0 sets one key, the others get it, then a
store-based barrier (an add each; the last arrival sets a key everybody waits for).

    PYTHONPATH=.pkgview .venv/bin/python bench/bridge_probe.py --ranks 256 --pattern gloo

prints one JSON line per (store, pattern): seconds from the ranks' start to the last rank's
end, of the second of two passes (the first warms the bridges' channels and sessions, as a
long-lived agent's are), and on stderr the CPU seconds the members and the bridges spent.
The bridges run in ``--bridge-procs`` processes (under torchrun each has its own agent
process; many bridge threads in one interpreter would queue for its GIL). ``--hold`` keeps
the cluster and bridges up until Enter (to attach py-spy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
VALIDATE, SET, GET, ADD, WAIT = 0, 1, 3, 4, 6
MAGIC = 0x3C85F7CE


def _data(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


class Rank:
    """One rank's TCPStore client on the wire protocol (one query at a time)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @staticmethod
    async def connect(port: int) -> Rank:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        return Rank(reader, writer)

    async def set(self, key: bytes, value: bytes) -> None:
        # torch's client does not wait for an answer to SET (there is none).
        self.writer.write(bytes([SET]) + _data(key) + _data(value))

    async def wait(self, keys: list[bytes]) -> None:
        self.writer.write(bytes([WAIT]) + _U64.pack(len(keys)) + b"".join(map(_data, keys)))
        await self.reader.readexactly(1)

    async def get(self, key: bytes) -> bytes:
        await self.wait([key])
        self.writer.write(bytes([GET]) + _data(key))
        (length,) = _U64.unpack(await self.reader.readexactly(8))
        return await self.reader.readexactly(length)

    async def add(self, key: bytes, delta: int) -> int:
        self.writer.write(bytes([ADD]) + _data(key) + _I64.pack(delta))
        (value,) = _I64.unpack(await self.reader.readexactly(8))
        return int(value)


async def gloo(rank: Rank, index: int, size: int, tag: bytes = b"") -> None:
    await rank.set(b"/rank_%d" % index + tag, b"address-of-%d" % index * 4)
    for other in range(size):
        if other != index:
            value = await rank.get(b"/rank_%d" % other + tag)
            assert value == b"address-of-%d" % other * 4, value


PHASES: dict[str, float] = {}


def _phase(name: str) -> None:
    PHASES[name] = max(PHASES.get(name, 0.0), time.perf_counter())


async def nccl(rank: Rank, index: int, size: int, tag: bytes = b"") -> None:
    if index == 0:
        await rank.set(b"/nccl_id" + tag, b"u" * 128)
    assert await rank.get(b"/nccl_id" + tag) == b"u" * 128
    _phase("got_id")
    if await rank.add(b"/barrier" + tag, 1) == size:
        await rank.set(b"/barrier_done" + tag, b"1")
    _phase("added")
    await rank.wait([b"/barrier_done" + tag])


async def play(ports: list[int], size: int, pattern: str) -> float:
    per_port = -(-size // len(ports))
    ranks = [await Rank.connect(ports[i // per_port]) for i in range(size)]
    body = gloo if pattern == "gloo" else nccl
    # A first pass warms the bridges (channels, sessions), as a long-lived agent's are.
    for tag in (b"-warm-up", b""):
        PHASES.clear()
        started = time.perf_counter()
        await asyncio.gather(*(body(rank, i, size, tag) for i, rank in enumerate(ranks)))
        elapsed = time.perf_counter() - started
        print(f"pass{tag.decode()}: {elapsed:.3f} s", file=sys.stderr)
    if PHASES:
        phases = {name: round(at - started, 3) for name, at in PHASES.items()}
        print(f"phases (s after start): {phases}", file=sys.stderr)
    for rank in ranks:
        rank.writer.close()
    return elapsed


def ranks_main(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    ports = [int(p) for p in args.ports.split(",")]
    print(json.dumps({"seconds": asyncio.run(play(ports, args.ranks, args.pattern))}))


def bridges_main(args: argparse.Namespace) -> None:
    from rallypoint.worker.tcpstore import PortRange, TCPStoreBridge

    endpoints = args.endpoints.split(",")
    port_range = PortRange(args.port_base, args.port_base + 19)
    ids = [int(i) for i in args.ids.split(",")]
    bridges = [TCPStoreBridge(endpoints, port_range=port_range) for _ in ids]
    ports = [
        bridge.serve_round(args.job, args.round, participant_id)
        for bridge, participant_id in zip(bridges, ids, strict=True)
    ]
    print(json.dumps(ports), flush=True)
    sys.stdin.read()
    for bridge in bridges:
        bridge.close()


def run_ranks(ports: list[int], size: int, pattern: str) -> float:
    command = [sys.executable, __file__, "--ranks-child", "--ranks", str(size)]
    command += ["--pattern", pattern, "--ports", ",".join(map(str, ports))]
    done = subprocess.run(
        command,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=3600,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--ranks-per-bridge", type=int, default=8)
    parser.add_argument("--pattern", choices=("gloo", "nccl", "both"), default="both")
    parser.add_argument("--port-base", type=int, default=22000)
    parser.add_argument("--no-tcpstore", action="store_true")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--ranks-child", action="store_true")
    parser.add_argument("--ports", default="")
    parser.add_argument("--bridge-procs", type=int, default=16)
    parser.add_argument("--bridge-child", action="store_true")
    parser.add_argument("--job", default="")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--endpoints", default="")
    parser.add_argument("--ids", default="")
    args = parser.parse_args()
    if args.ranks_child:
        ranks_main(args)
        return
    if args.bridge_child:
        bridges_main(args)
        return

    import torch.distributed as dist

    from bench.common import process_cpu_s
    from rallypoint.client import JobConfig, SyncClient
    from tests.integration import harness

    ports = iter(range(args.port_base, args.port_base + 100))
    harness.free_ports = lambda count: [next(ports) for _ in range(count)]
    patterns = ["gloo", "nccl"] if args.pattern == "both" else [args.pattern]
    bridges_n = -(-args.ranks // args.ranks_per_bridge)
    with tempfile.TemporaryDirectory() as root, harness.running_cluster(Path(root)) as cluster:
        print(
            f"cluster pids {[m.proc.pid for m in cluster.members.values() if m.proc]}, "
            f"leader {cluster.leader()}, probe pid {os.getpid()}",
            file=sys.stderr,
        )
        with SyncClient(cluster.endpoints) as client:
            # The probe's own load must not get its participants declared failed.
            config = JobConfig(
                min_nodes=bridges_n,
                max_nodes=bridges_n,
                phi_threshold=1e6,
                acceptable_pause_ms=600_000,
            )
            for pattern in patterns:
                job = f"probe-{pattern}"
                participants = [
                    client.join(job, f"node-{i}", config=config) for i in range(bridges_n)
                ]
                info = participants[0].wait_for_round(timeout_s=120)
                # Bridges in processes of their own (under torchrun each is in its own
                # agent): dozens of bridge threads in one interpreter would queue for its GIL.
                ids = [p.participant_id for p in participants]
                hosts = [
                    subprocess.Popen(
                        [
                            *(sys.executable, __file__, "--bridge-child", "--job", job),
                            *("--round", str(info.round)),
                            *("--endpoints", ",".join(cluster.endpoints)),
                            *("--ids", ",".join(map(str, ids[i :: args.bridge_procs]))),
                            *("--port-base", str(args.port_base + 100 + i * 20)),
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for i in range(min(args.bridge_procs, bridges_n))
                ]
                try:
                    bridge_ports = []
                    for host in hosts:
                        assert host.stdout is not None
                        bridge_ports += json.loads(host.stdout.readline())
                    print(f"bridge hosts {[host.pid for host in hosts]}", file=sys.stderr)
                    if args.hold:
                        input(f"bridges on {bridge_ports[:4]}...; Enter to run {pattern}")
                    member_pids = [m.proc.pid for m in cluster.members.values() if m.proc]
                    host_pids = [host.pid for host in hosts]
                    members_cpu = [process_cpu_s(pid) for pid in member_pids]
                    hosts_cpu = sum(process_cpu_s(pid) for pid in host_pids)
                    seconds = run_ranks(bridge_ports, args.ranks, pattern)
                    members_cpu = [
                        round(process_cpu_s(pid) - before, 2)
                        for pid, before in zip(member_pids, members_cpu, strict=True)
                    ]
                    hosts_cpu = sum(process_cpu_s(pid) for pid in host_pids) - hosts_cpu
                    print(f"cpu s: members {members_cpu}, bridges {hosts_cpu:.2f}", file=sys.stderr)
                    print(
                        json.dumps(
                            {
                                "store": "bridge",
                                "pattern": pattern,
                                "ranks": args.ranks,
                                "seconds": round(seconds, 3),
                            }
                        ),
                        flush=True,
                    )
                finally:
                    for host in hosts:
                        host.communicate("")
                    for participant in participants:
                        participant.leave()
                if args.no_tcpstore:
                    continue
                server = dist.TCPStore(
                    "127.0.0.1",
                    next(ports),
                    is_master=True,
                    wait_for_workers=False,
                    timeout=timedelta(seconds=600),
                )
                seconds = run_ranks([server.port], args.ranks, pattern)
                print(
                    json.dumps(
                        {
                            "store": "tcpstore",
                            "pattern": pattern,
                            "ranks": args.ranks,
                            "seconds": round(seconds, 3),
                        }
                    ),
                    flush=True,
                )
                del server


if __name__ == "__main__":
    main()
