"""KV benchmark: rallypoint against etcd, the same grpc.aio load generator for both, one run.

Both systems run as 3 members on loopback (rallypoint via ``rallypoint cluster up``, etcd as
three ``etcd`` processes, see bench/etcd/), started side by side and left idle while the other
is measured. ``--members 1`` runs one member of each instead: the cost of a request without
replication, which bounds from below what the 3-member figures can reach (the targets are for
3 members and are not judged then). This process is the load generator only: it runs on
uvloop, apart from the servers, and records the CPU both sides use in every trial from /proc.

Workloads, each with N clients that send requests one after another to the leader. How the
clients of a trial reach it is the ``--connections`` parameter, the same for both systems:

    shared      (default) the N clients are N concurrent callers of one connection: for etcd
                one grpc.aio channel (HTTP/2 multiplexing, as clientv3 shares one connection),
                for rallypoint one library ``Client`` (one channel, one session, every call
                on its ``KV/Batch`` stream: ``kv_batching="always"``); every operation is
                still timed on its own
    per-client  each client owns a channel (and, for rallypoint, a session whose sequence it
                increments), speaking the unary RPCs

The keep-alive workload always uses a client of its own (one stream, one channel).

    put_1, put_64      distinct keys, 256-byte values
    get_1, get_64      linearizable reads of a key the client wrote beforehand
    keepalive_1        one lease keep-alive stream, the next request sent when the answer came

A trial opens its clients, runs for warm-up + duration seconds (also bounded by a request
count per client), and keeps only the requests started after the warm-up. Trials alternate
between the systems (trial 1 of every workload on both, then trial 2, ...) so drift in a
shared machine's load hits both alike; medians over trials are reported. Output: JSON with
the machine, versions, per-system medians and trials, and the ratios rallypoint / etcd; a
plot beside it (.png); the ratios against their targets on stdout.

    python -m bench.kv_bench --out bench/results/kv.json
    python -m bench.kv_bench --smoke --out /tmp/kv.json     # rallypoint only, a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from bench.cluster import Cluster, RallypointCluster
from bench.common import (
    CpuSample,
    command_version,
    cpu_share,
    latency_summary_ms,
    machine_info,
    median_of,
    package_versions,
    run_in_data_dir,
    write_results,
)
from bench.etcd.api import load as load_etcd_api
from bench.etcd.cluster import EtcdCluster
from rallypoint.client import Client, RallypointError
from rallypoint.proto.v1 import (
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from rallypoint.worker.process_tree import run_reaped

VALUE_BYTES = 256
RPC_TIMEOUT_S = 10.0
SESSION_TTL_MS = 120_000
LEASE_TTL_S = 60
# A client that keeps failing stops early instead of spinning; its errors are reported.
MAX_ERRORS_PER_CLIENT = 20

# The cluster size the targets below are set for.
TARGET_MEMBERS = 3
# name -> (workload, field compared, direction, target); ratio = rallypoint / etcd; each target
# the stricter of those ever set for it (bench/README.md says which).
RATIO_TARGETS: dict[str, tuple[str, str, str, float | None]] = {
    "put_64_throughput": ("put_64", "throughput_ops_s", ">=", 1.0),
    "put_64_p99": ("put_64", "p99_ms", "<=", 1.0),
    "put_1_p50": ("put_1", "p50_ms", "<=", 1.5),
    "get_1_p50": ("get_1", "p50_ms", "<=", 1.0),
}
# The members' CPU (every member of the cluster, user + system of each member process and its
# threads) per acknowledged put over all put trials, rallypoint over etcd: what a put costs the
# servers, apart from how the two systems trade latency for batching (issue 39's target).
CPU_PER_PUT_RATIO = "server_cpu_per_put_ratio"
CPU_PER_PUT_TARGET = ("<=", 2.0)


class Operation(enum.Enum):
    PUT = "put"
    GET = "get"
    KEEPALIVE = "keepalive"


@dataclass(frozen=True, slots=True)
class Workload:
    operation: Operation
    clients: int

    @property
    def name(self) -> str:
        return f"{self.operation.value}_{self.clients}"


# --- the systems' clients: the same four calls over each system's own API ---------------------


class KeepAliveStream(Protocol):
    async def once(self) -> None: ...

    def cancel(self) -> None: ...


class BenchClient(Protocol):
    async def put(self, key: bytes, value: bytes) -> None: ...

    async def get(self, key: bytes) -> None: ...

    async def keep_alive_stream(self) -> KeepAliveStream: ...

    async def close(self) -> None: ...


class StreamOnce:
    """One request written, one answer read, on a bidirectional keep-alive stream."""

    def __init__(self, call: Any, request: Any) -> None:
        self.call = call
        self.request = request

    async def once(self) -> None:
        await self.call.write(self.request)
        if await self.call.read() is grpc.aio.EOF:  # type: ignore[attr-defined]
            raise RuntimeError("keep-alive stream ended")

    def cancel(self) -> None:
        self.call.cancel()


class RallypointClient:
    """One channel and one session; every write carries the next sequence number."""

    def __init__(self, channel: grpc.aio.Channel, session_id: int) -> None:
        self.channel = channel
        self.session_id = session_id
        # The last sequence used; a request is answered before the next is sent, so the next
        # one is also the lowest this client still awaits (first_unacked), which lets the
        # server drop every cached answer before it.
        self.sequence = 0
        self.kv = kv_pb2_grpc.KVStub(channel)
        self.lease = lease_pb2_grpc.LeaseStub(channel)

    @staticmethod
    async def open(address: str) -> RallypointClient:
        channel = grpc.aio.insecure_channel(address)
        opened = await session_pb2_grpc.SessionStub(channel).Open(
            session_pb2.SessionOpenRequest(ttl_ms=SESSION_TTL_MS), timeout=RPC_TIMEOUT_S
        )
        return RallypointClient(channel, opened.session_id)

    def _next_header(self) -> common_pb2.RequestHeader:
        self.sequence += 1
        return common_pb2.RequestHeader(
            session_id=self.session_id, sequence=self.sequence, first_unacked=self.sequence
        )

    async def put(self, key: bytes, value: bytes) -> None:
        request = kv_pb2.PutRequest(header=self._next_header(), key=key, value=value)
        await self.kv.Put(request, timeout=RPC_TIMEOUT_S)

    async def get(self, key: bytes) -> None:
        await self.kv.Get(kv_pb2.GetRequest(key=key), timeout=RPC_TIMEOUT_S)

    async def keep_alive_stream(self) -> KeepAliveStream:
        granted = await self.lease.Grant(
            lease_pb2.LeaseGrantRequest(header=self._next_header(), ttl_ms=LEASE_TTL_S * 1000),
            timeout=RPC_TIMEOUT_S,
        )
        request = lease_pb2.LeaseKeepAliveRequest(lease_id=granted.lease_id)
        return StreamOnce(self.lease.KeepAlive(None), request)

    async def close(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await session_pb2_grpc.SessionStub(self.channel).Close(
                session_pb2.SessionCloseRequest(session_id=self.session_id), timeout=RPC_TIMEOUT_S
            )
        await self.channel.close(grace=None)


class EtcdClient:
    """One channel speaking etcd's v3 API (KV.Put, linearizable KV.Range, Lease)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.api = load_etcd_api()
        self.channel = channel
        self.kv = self.api.rpc_grpc.KVStub(channel)
        self.lease = self.api.rpc_grpc.LeaseStub(channel)

    @staticmethod
    async def open(address: str) -> EtcdClient:
        channel = grpc.aio.insecure_channel(address)
        await asyncio.wait_for(channel.channel_ready(), RPC_TIMEOUT_S)
        return EtcdClient(channel)

    async def put(self, key: bytes, value: bytes) -> None:
        await self.kv.Put(self.api.rpc.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT_S)

    async def get(self, key: bytes) -> None:
        await self.kv.Range(self.api.rpc.RangeRequest(key=key), timeout=RPC_TIMEOUT_S)

    async def keep_alive_stream(self) -> KeepAliveStream:
        granted = await self.lease.LeaseGrant(
            self.api.rpc.LeaseGrantRequest(TTL=LEASE_TTL_S), timeout=RPC_TIMEOUT_S
        )
        request = self.api.rpc.LeaseKeepAliveRequest(ID=granted.ID)
        return StreamOnce(self.lease.LeaseKeepAlive(None), request)

    async def close(self) -> None:
        await self.channel.close(grace=None)


# --- how a trial's clients reach the leader (the clusters: bench/cluster.py) -------------------


CLIENT_OPENERS: dict[str, Callable[[str], Awaitable[BenchClient]]] = {
    "rallypoint": RallypointClient.open,
    "etcd": EtcdClient.open,
}


class Connections(enum.Enum):
    """How the clients of one trial reach the leader (see the module docstring)."""

    SHARED = "shared"
    PER_CLIENT = "per-client"


class SharedRallypoint:
    """One concurrent caller of a library ``Client`` shared by every caller of the trial."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def put(self, key: bytes, value: bytes) -> None:
        await self.client.put(key, value)

    async def get(self, key: bytes) -> None:
        await self.client.get(key)

    async def keep_alive_stream(self) -> KeepAliveStream:
        raise AssertionError("keep-alive trials use a client of their own")

    async def close(self) -> None:
        """The shared client is closed once, by the trial."""


async def open_clients(
    system: str, address: str, count: int, connections: Connections
) -> tuple[list[BenchClient], Callable[[], Awaitable[None]]]:
    """``count`` clients of ``system`` at ``address`` and how to close them all."""
    if connections is Connections.PER_CLIENT:
        opener = CLIENT_OPENERS[system]
        clients: list[BenchClient] = list(
            await asyncio.gather(*(opener(address) for _ in range(count)))
        )

        async def close_each() -> None:
            await asyncio.gather(*(client.close() for client in clients))

        return clients, close_each
    if system == "etcd":
        channel = grpc.aio.insecure_channel(address)
        await asyncio.wait_for(channel.channel_ready(), RPC_TIMEOUT_S)
        etcd_clients: list[BenchClient] = [EtcdClient(channel) for _ in range(count)]

        async def close_channel() -> None:
            await channel.close(grace=None)

        return etcd_clients, close_channel
    shared = await Client(
        [address],
        timeout_s=RPC_TIMEOUT_S,
        session_ttl_s=SESSION_TTL_MS / 1000,
        kv_batching="always",  # a lone call too (bench/README "Lone calls on the stream")
    ).connect()
    return [SharedRallypoint(shared) for _ in range(count)], shared.close


# --- the load generator ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """Requests started in [start_s, end_s) (perf_counter seconds) are measured."""

    start_s: float
    end_s: float


@dataclass(slots=True)
class ClientRecord:
    latencies_s: list[float] = field(default_factory=list)
    # perf_counter time the last measured request completed; 0.0 until one has.
    last_end_s: float = 0.0
    errors: int = 0
    first_error: str | None = None


async def drive(
    request: Callable[[int], Awaitable[None]], window: Window, max_requests: int
) -> ClientRecord:
    """Send requests one after another until the window closes or the count is reached."""
    record = ClientRecord()
    number = 0
    while number < max_requests:
        started = time.perf_counter()
        if started >= window.end_s:
            break
        number += 1
        try:
            await request(number)
        except (grpc.aio.AioRpcError, RallypointError, RuntimeError) as exc:
            record.errors += 1
            record.first_error = record.first_error or f"{type(exc).__name__}: {exc}"[:300]
            if record.errors >= MAX_ERRORS_PER_CLIENT or isinstance(exc, RuntimeError):
                break
            continue
        ended = time.perf_counter()
        if started >= window.start_s:
            record.latencies_s.append(ended - started)
            record.last_end_s = ended
    return record


@dataclass(frozen=True, slots=True)
class TrialSettings:
    warmup_s: float
    duration_s: float
    max_requests_per_client: int
    connections: Connections = Connections.SHARED


async def prepare(
    client: BenchClient,
    operation: Operation,
    key: bytes,
    value: bytes,
    streams: list[KeepAliveStream],
) -> Callable[[int], Awaitable[None]]:
    """The request one client sends over and over (its argument numbers the request)."""
    if operation is Operation.PUT:

        async def put(number: int) -> None:
            await client.put(b"%s/%d" % (key, number), value)

        return put
    if operation is Operation.GET:
        await client.put(key, value)

        async def get(number: int) -> None:
            await client.get(key)

        return get
    stream = await client.keep_alive_stream()
    streams.append(stream)

    async def keep_alive(number: int) -> None:
        await stream.once()

    return keep_alive


async def run_trial(
    cluster: Cluster, workload: Workload, trial: int, settings: TrialSettings
) -> dict[str, Any]:
    address = await cluster.leader_address()
    connections = settings.connections
    if workload.operation is Operation.KEEPALIVE:
        connections = Connections.PER_CLIENT
    clients, close_clients = await open_clients(
        cluster.name, address, workload.clients, connections
    )
    value = os.urandom(VALUE_BYTES)
    prefix = f"kv-bench/{workload.name}/t{trial}".encode()
    requests: list[Callable[[int], Awaitable[None]]] = []
    streams: list[KeepAliveStream] = []
    try:
        for index, client in enumerate(clients):
            key = b"%s/c%d" % (prefix, index)
            requests.append(await prepare(client, workload.operation, key, value, streams))
        started = time.perf_counter()
        window = Window(
            started + settings.warmup_s, started + settings.warmup_s + settings.duration_s
        )
        pids = cluster.server_pids()

        async def sample_at_window_start() -> tuple[CpuSample, CpuSample]:
            await asyncio.sleep(max(0.0, window.start_s - time.perf_counter()))
            now = time.perf_counter()
            return CpuSample.take(pids, now), CpuSample.take([os.getpid()], now)

        sampler = asyncio.create_task(sample_at_window_start())
        records = await asyncio.gather(
            *(drive(r, window, settings.max_requests_per_client) for r in requests)
        )
        ended = time.perf_counter()
        servers_before, generator_before = await sampler
        servers_after = CpuSample.take(pids, ended)
        generator_after = CpuSample.take([os.getpid()], ended)
    finally:
        for stream in streams:
            stream.cancel()
        await close_clients()
    latencies = [lat for record in records for lat in record.latencies_s]
    # The servers' CPU from the end of the warm-up to the last answer, over the requests
    # measured in that window (those started after the warm-up, every one acknowledged).
    server_cpu = cpu_share(servers_before, servers_after)
    last_end = max((record.last_end_s for record in records), default=0.0)
    measured_s = last_end - window.start_s
    errors = sum(record.errors for record in records)
    return {
        "trial": trial,
        "requests": len(latencies),
        "measured_s": measured_s,
        "throughput_ops_s": len(latencies) / measured_s if measured_s > 0 else 0.0,
        **latency_summary_ms(latencies),
        "errors": errors,
        "first_error": next((r.first_error for r in records if r.first_error), None),
        "server_cpu_per_request_us": (
            server_cpu["cpu_s"] / len(latencies) * 1e6 if latencies else math.nan
        ),
        "cpu": {
            "servers": server_cpu,
            "load_generator": cpu_share(generator_before, generator_after),
        },
        "leader": address,
    }


# --- the run: clusters up, trials, medians, ratios, output ---------------------------------------


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "throughput_ops_s": median_of(trials, "throughput_ops_s"),
        "server_cpu_per_request_us": median_of(trials, "server_cpu_per_request_us"),
        "p50_ms": median_of(trials, "p50_ms"),
        "p99_ms": median_of(trials, "p99_ms"),
        "server_cores": median_of([t["cpu"]["servers"] for t in trials], "cores"),
        "load_generator_cores": median_of([t["cpu"]["load_generator"] for t in trials], "cores"),
        "errors": sum(t["errors"] for t in trials),
        "trials": trials,
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """rallypoint / etcd for each named figure; None when either side was not measured."""
    out: dict[str, float | None] = {}
    for name, (workload, figure, _, _) in RATIO_TARGETS.items():
        try:
            ours = results["rallypoint"][workload][figure]
            theirs = results["etcd"][workload][figure]
        except KeyError:
            out[name] = None
            continue
        ok = theirs and not math.isnan(theirs) and not math.isnan(ours)
        out[name] = ours / theirs if ok else None
    return out


def server_cpu_per_put_us(per_workload: dict[str, Any]) -> float | None:
    """The members' CPU per acknowledged put (microseconds) over every put trial of a system:
    all their CPU in the measured windows over all the puts acknowledged in them (so a
    workload weighs by its puts); None when no put was measured."""
    trials = [
        trial
        for name, summary in per_workload.items()
        if name.startswith(f"{Operation.PUT.value}_")
        for trial in summary["trials"]
    ]
    puts = sum(trial["requests"] for trial in trials)
    if not puts:
        return None
    return sum(trial["cpu"]["servers"]["cpu_s"] for trial in trials) / puts * 1e6


def cpu_per_put(results: dict[str, dict[str, Any]]) -> tuple[dict[str, float | None], float | None]:
    """Each system's members' CPU per put (us), and rallypoint's over etcd's (None when either
    is missing)."""
    per_system = {system: server_cpu_per_put_us(per) for system, per in results.items()}
    ours, theirs = per_system.get("rallypoint"), per_system.get("etcd")
    return per_system, (ours / theirs if ours is not None and theirs else None)


def cpu_per_request_ratios(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Per workload, rallypoint's members' CPU per request over etcd's (None if unmeasured)."""
    field, theirs = "server_cpu_per_request_us", results.get("etcd", {})
    per = {
        name: (s.get(field), theirs.get(name, {}).get(field))
        for name, s in results.get("rallypoint", {}).items()
    }
    return {name: a / b if a is not None and b else None for name, (a, b) in per.items()}


def verdict(value: float | None, direction: str, target: float | None) -> str:
    if target is None:
        return "(no target)"
    if value is None:
        return "not measured"
    met = value >= target if direction == ">=" else value <= target
    return "PASS" if met else "MISS"


def judged(value: float | None, direction: str, target: float | None, members: int) -> str:
    """The verdict on a ratio, or why none is given (the targets are for 3 members)."""
    if members != TARGET_MEMBERS:
        return f"(targets are for {TARGET_MEMBERS} members)"
    return verdict(value, direction, target)


def print_report(
    results: dict[str, dict[str, Any]],
    measured: dict[str, float | None],
    members: int,
    cpu_per_put_us: dict[str, float | None],
) -> None:
    print(
        f"\n{'system':<11}{'workload':<13}{'ops/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'srv cores':>11}{'gen cores':>11}{'errors':>8}"
    )
    for system, per_workload in results.items():
        for name, s in per_workload.items():
            print(
                f"{system:<11}{name:<13}{s['throughput_ops_s']:>10.0f}{s['p50_ms']:>9.2f}"
                f"{s['p99_ms']:>9.2f}{s['server_cores']:>11.2f}{s['load_generator_cores']:>11.2f}"
                f"{s['errors']:>8}"
            )
    print("\nratios (rallypoint / etcd):")
    for name, (_, _, direction, target) in RATIO_TARGETS.items():
        value = measured[name]
        shown = "-" if value is None else f"{value:.2f}"
        goal = f"target {direction} {target}" if target is not None else ""
        print(f"  {name:<25}{shown:>7}  {goal:<16}{judged(value, direction, target, members)}")
    direction, target = CPU_PER_PUT_TARGET
    value = measured[CPU_PER_PUT_RATIO]
    shown = "-" if value is None else f"{value:.2f}"
    print(
        f"  {CPU_PER_PUT_RATIO:<25}{shown:>7}  {f'target {direction} {target}':<16}"
        f"{judged(value, direction, target, members)}"
    )
    print(
        "  (server CPU per put: "
        + ", ".join(
            f"{system} {'-' if us is None else f'{us:.0f} us'}"
            for system, us in cpu_per_put_us.items()
        )
        + ")"
    )


def plot(results: dict[str, dict[str, Any]], members: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(results)
    workloads = list(dict.fromkeys(w for per in results.values() for w in per))
    panels = [
        ("throughput_ops_s", "throughput (ops/s)"),
        ("p50_ms", "p50 latency (ms)"),
        ("p99_ms", "p99 latency (ms)"),
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(15, 4.5))
    width = 0.8 / max(1, len(systems))
    for axis, (figure_name, title) in zip(axes, panels, strict=True):
        for offset, system in enumerate(systems):
            values = [results[system].get(w, {}).get(figure_name, math.nan) for w in workloads]
            positions = [
                i + (offset - (len(systems) - 1) / 2) * width for i in range(len(workloads))
            ]
            axis.bar(positions, values, width, label=system)
        axis.set_xticks(range(len(workloads)), workloads, rotation=20)
        axis.set_title(title)
        axis.grid(axis="y", alpha=0.3)
    axes[0].legend()
    figure.suptitle(
        f"KV: rallypoint vs etcd, {members} member{'s' if members != 1 else ''} on loopback "
        "(medians of trials)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/kv.json")
    parser.add_argument("--systems", default="rallypoint,etcd", help="comma-separated")
    parser.add_argument("--many-clients", type=int, default=64)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=0.5)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--max-requests-per-client", type=int, default=100_000)
    parser.add_argument(
        "--connections",
        choices=[c.value for c in Connections],
        default=Connections.SHARED.value,
        help="shared: a trial's clients share one connection (etcd: one channel; rallypoint: "
        "one library Client, its KV batching on); per-client: a channel each (default shared)",
    )
    parser.add_argument(
        "--members",
        type=int,
        default=3,
        help="members of each system, 1-9 (default 3; the targets are judged only for 3)",
    )
    parser.add_argument(
        "--workloads",
        default="",
        help="comma-separated subset of put_1, put_N, get_1, get_N, keepalive_1 (N is "
        "--many-clients; default all)",
    )
    parser.add_argument("--data-dir", help="parent of the members' data (default: a temp dir)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="rallypoint only, one short trial of each workload: checks the bench runs",
    )
    parser.add_argument("--no-plot", action="store_true")
    return parser


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, dict[str, Any]]:
    makers: dict[str, Callable[..., Cluster]] = {
        "rallypoint": RallypointCluster,
        "etcd": EtcdCluster,
    }
    clusters = [
        makers[name](data_dir / name, members=args.members)
        for name in args.systems.split(",")
        if name
    ]
    workloads = chosen_workloads(args.workloads, args.many_clients)
    settings = TrialSettings(
        args.warmup_s,
        args.duration_s,
        args.max_requests_per_client,
        Connections(args.connections),
    )
    trials: dict[str, dict[str, list[dict[str, Any]]]] = {c.name: {} for c in clusters}
    try:
        for cluster in clusters:
            cluster.start()
        for cluster in clusters:
            await cluster.wait_ready()
        for trial in range(1, args.trials + 1):
            for workload in workloads:
                for cluster in clusters:
                    result = await run_trial(cluster, workload, trial, settings)
                    trials[cluster.name].setdefault(workload.name, []).append(result)
                    print(
                        f"trial {trial} {cluster.name:<10} {workload.name:<12} "
                        f"{result['throughput_ops_s']:>8.0f} ops/s  p50 {result['p50_ms']:.2f} ms"
                        f"  p99 {result['p99_ms']:.2f} ms  errors {result['errors']}",
                        flush=True,
                    )
    finally:
        for cluster in clusters:
            cluster.stop()
    return {
        system: {name: summarize(t) for name, t in per_workload.items()}
        for system, per_workload in trials.items()
    }


def all_workloads(many_clients: int) -> list[Workload]:
    return [
        Workload(Operation.PUT, 1),
        Workload(Operation.PUT, many_clients),
        Workload(Operation.GET, 1),
        Workload(Operation.GET, many_clients),
        Workload(Operation.KEEPALIVE, 1),
    ]


def chosen_workloads(names: str, many_clients: int) -> list[Workload]:
    """The workloads ``--workloads`` names, in the usual order (all when it is empty);
    ValueError naming any that is not one of them."""
    known = all_workloads(many_clients)
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    if not wanted:
        return known
    unknown = sorted(set(wanted) - {w.name for w in known})
    if unknown:
        raise ValueError(
            f"unknown workload {', '.join(unknown)}; choose from {', '.join(w.name for w in known)}"
        )
    return [w for w in known if w.name in wanted]


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One-line errors for arguments the parser's types cannot check."""
    if not 1 <= args.members <= 9:
        parser.error(f"--members must be between 1 and 9, not {args.members}")
    if args.many_clients < 1:
        parser.error(f"--many-clients must be at least 1, not {args.many_clients}")
    systems = [name for name in args.systems.split(",") if name]
    unknown = sorted(set(systems) - {"rallypoint", "etcd"})
    if not systems or unknown:
        parser.error(f"--systems takes rallypoint and/or etcd, not {args.systems!r}")
    try:
        chosen_workloads(args.workloads, args.many_clients)
    except ValueError as exc:
        parser.error(f"--workloads: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.smoke:
        args.systems, args.trials, args.warmup_s, args.duration_s = "rallypoint", 1, 0.2, 0.6
    started = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = run_in_data_dir(args.data_dir, "kv-bench-", lambda data_dir: run(args, data_dir))
    measured = ratios(results)
    cpu_per_put_us, measured[CPU_PER_PUT_RATIO] = cpu_per_put(results)
    targets = {
        name: (direction, target) for name, (_, _, direction, target) in RATIO_TARGETS.items()
    }
    targets[CPU_PER_PUT_RATIO] = CPU_PER_PUT_TARGET
    versions = package_versions(["rallypoint", "grpcio", "protobuf", "uvloop"])
    if "etcd" in results:
        versions["etcd"] = command_version(["etcd", "--version"])
    document = {
        "benchmark": "kv",
        "machine": machine_info(),
        "versions": versions,
        "parameters": {
            "systems": list(results),
            "members": args.members,
            "value_bytes": VALUE_BYTES,
            "trials": args.trials,
            "warmup_s": args.warmup_s,
            "duration_s": args.duration_s,
            "max_requests_per_client": args.max_requests_per_client,
            "clients": (
                "N concurrent callers of one connection (etcd: one grpc.aio channel; "
                "rallypoint: one library Client, KV batching 'always'), requests sent one "
                "after another, to the leader"
                if args.connections == Connections.SHARED.value
                else "one grpc.aio channel each, requests sent one after another, to the leader"
            ),
            "connections": args.connections,
            "smoke": args.smoke,
        },
        "results": results,
        "ratios": {name: measured[name] for name in RATIO_TARGETS},
        # The members' CPU per acknowledged put over all put trials, each system (us), and
        # rallypoint's over etcd's.
        "server_cpu_per_put_us": cpu_per_put_us,
        CPU_PER_PUT_RATIO: measured[CPU_PER_PUT_RATIO],
        "server_cpu_per_request_ratio_by_workload": cpu_per_request_ratios(results),
        "targets": {
            name: {
                "direction": direction,
                "target": target,
                "verdict": judged(measured[name], direction, target, args.members),
            }
            for name, (direction, target) in targets.items()
        },
        "wall_time_s": time.perf_counter() - started,
    }
    print_report(results, measured, args.members, cpu_per_put_us)
    write_results(
        out, document, None if args.no_plot else lambda path: plot(results, args.members, path)
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
