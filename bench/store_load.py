"""The load processes of the store benchmark (bench/store_bench.py drives them).

Theory of operation. A process plays many simulated ranks on one event loop, each replaying
one of the bootstrap access patterns of torch's process groups (see bench/store_bench.py for
the patterns and where they come from) without torch, over the real protocols:

- ``--store=tcpstore``: every rank has its own TCP connection to torch's C++ TCPStore server
  and speaks the TCPStore wire protocol as torch's C++ client does (:class:`TCPStoreClient`;
  the format is documented in rallypoint/worker/tcpstore/protocol.py). A c10d ``get`` is a
  WAIT then a GET on the wire, as in torch's ``TCPStore::get``.
- ``--store=rallypoint``: the same ranks and the same wire protocol, against the bridge of
  their node (rallypoint/worker/tcpstore/): one bridge per ``--per-node`` ranks,
  made here with its own coordinator client and serving the round store as the node's
  participant; all on this process's event loop (``--bridge-loop shared``: a
  ``StoreBridge``), or each a ``TCPStoreBridge`` with its own thread and loop as in a
  torchrun agent (``thread``).
- ``--store=coordinator_store``: every rank is a participant of its own and calls the
  client's :class:`~rallypoint.client.RoundStore` (what ``CoordinatorStore`` wraps) with its
  own session (one ``Caller`` per rank over the process's one transport): one call per c10d
  call (a ``get`` is one server-held read).

Commands on stdin, JSON-line events on stdout (bench/rendezvous_load.py's ``emit``); roles:

``ranks``
    Connects (or makes the bridges), then emits ``ready``. ``run PATTERN PREFIX``: every rank
    of the process replays PATTERN under key prefix PREFIX at once; emits ``done`` with the
    first operation's start, the last rank's end, the operations (wire requests or calls)
    made and how many ranks finished. ``stop``: cancels a run (``done`` says it did not
    finish, with its progress). ``close``.
``bridges``
    Only the bridges (``ready`` lists their ports), for real torch workers; ``close``.
``tcpstore-server``
    torch's TCPStore server (libuv) on a free port; ``ready`` carries it; ``close``.
``init-gloo``
    One real torch worker: imports torch, sets the environment torchrun would
    (MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE; TORCHELASTIC_USE_AGENT_STORE with
    ``--agent-store``) and emits ``imported``; ``go T``: at wall-clock T,
    ``init_process_group("gloo", init_method="env://")`` and one all-reduce, then emits
    ``initialized`` with its times; ``close``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from bench.rendezvous_load import LoopLag, command_lines, emit, run_load_process
from rallypoint.client import Backoff, Client, RoundStore
from rallypoint.client.caller import Caller
from rallypoint.client.transport import Transport
from rallypoint.worker.tcpstore import (
    VALIDATION_MAGIC,
    Query,
    StoreBridge,
    TCPStoreBridge,
    WaitResponse,
)

CLIENT_TIMEOUT_S = 300.0
SESSION_TTL_S = 60.0
# Connections opened at once when a process sets its ranks up.
CONNECT_CONCURRENCY = 64

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


# --- the patterns --------------------------------------------------------------------------------


def gloo_value_bytes(world: int) -> int:
    """The size of the value each rank sets in gloo's full-mesh connect at world ``world``
    (measured with torch 2.13: 170, 178, 186, 218 bytes at 2, 3, 4, 8 ranks)."""
    return 154 + 8 * world


NCCL_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


class Store(Protocol):
    """What a simulated rank calls: c10d's store calls, counting the operations they make."""

    ops: int

    async def set(self, key: str, value: bytes) -> None: ...

    async def get(self, key: str) -> bytes: ...

    async def wait(self, key: str) -> None: ...

    async def add(self, key: str, delta: int) -> int: ...


async def gloo(store: Store, rank: int, world: int, prefix: str) -> None:
    """gloo's ``connectFullMesh``: set this rank's addresses, then wait for and get every
    rank's key (its own included), in rank order. Keys as c10d names them under the
    default group's prefix (``0//cpu//0/<rank>``)."""
    await store.set(f"{prefix}0//cpu//0/{rank}", bytes(gloo_value_bytes(world)))
    for peer in range(world):
        key = f"{prefix}0//cpu//0/{peer}"
        await store.wait(key)
        await store.get(key)


async def nccl(store: Store, rank: int, world: int, prefix: str) -> None:
    """c10d's NCCL bootstrap (``broadcastUniqueNCCLID``): rank 0 sets the unique id, every
    other rank gets it; then ``_store_based_barrier``: add 1, read the count with add 0, the
    rank that sees the whole world sets the last-worker key, everyone waits for it."""
    id_key = f"{prefix}0"
    if rank == 0:
        await store.set(id_key, bytes(NCCL_ID_BYTES))
    else:
        await store.get(id_key)
    barrier = f"{prefix}store_based_barrier_key:1"
    await store.add(barrier, 1)
    if await store.add(barrier, 0) == world:
        await store.set(f"{barrier}:last_worker", b"1")
    await store.wait(f"{barrier}:last_worker")


PATTERNS: dict[str, Callable[[Store, int, int, str], Awaitable[None]]] = {
    "gloo": gloo,
    "nccl": nccl,
}


# --- the TCPStore wire protocol ------------------------------------------------------------------


def _data(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


def _key(key: str) -> bytes:
    """A key as torch's client sends it: its TCPStore prefixes every key with "/"."""
    return _data(b"/" + key.encode())


class _Answers(asyncio.Protocol):
    """The answers of one TCPStore connection: the one pending request's answer is parsed
    straight from the received bytes (no stream reader: the load generator's own cost per
    request is what bounds the anchor's figure on a small machine)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        # The pending answer's shape (a struct, or None for a length-prefixed value) and the
        # future it completes; None between requests.
        self.form: struct.Struct | None = None
        self.waiter: asyncio.Future[Any] | None = None
        self.closed: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = exc or ConnectionError("the store closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.closed)

    def expect(self, form: struct.Struct | None) -> asyncio.Future[Any]:
        self.form = form
        self.waiter = asyncio.get_running_loop().create_future()
        if self.closed is not None:
            self.waiter.set_exception(self.closed)
        else:
            self._complete()
        return self.waiter

    def _complete(self) -> None:
        waiter, buffer = self.waiter, self.buffer
        if waiter is None or waiter.done():
            return
        form = self.form
        if form is not None:
            if len(buffer) < form.size:
                return
            value = form.unpack_from(buffer)[0]
            del buffer[: form.size]
        else:
            if len(buffer) < _U64.size:
                return
            size = _U64.unpack_from(buffer)[0]
            if len(buffer) < _U64.size + size:
                return
            value = bytes(buffer[_U64.size : _U64.size + size])
            del buffer[: _U64.size + size]
        self.waiter = None
        waiter.set_result(value)


class TCPStoreClient:
    """One rank's TCPStore connection, speaking as torch's C++ client does: one request at a
    time, ``get`` as WAIT then GET. ``ops`` counts the requests sent."""

    def __init__(self, transport: asyncio.Transport, answers: _Answers) -> None:
        self.transport = transport
        self.answers = answers
        self.ops = 0

    @staticmethod
    async def connect(host: str, port: int) -> TCPStoreClient:
        loop = asyncio.get_running_loop()
        transport, answers = await loop.create_connection(_Answers, host, port)
        client = TCPStoreClient(transport, answers)
        # torch's client validates, then pings (the server echoes the nonce).
        transport.write(_U8.pack(Query.VALIDATE) + _U32.pack(VALIDATION_MAGIC))
        transport.write(_U8.pack(Query.PING) + _U32.pack(4242))
        nonce = await answers.expect(_U32)
        if nonce != 4242:
            raise ConnectionError(f"PING answered {nonce}, not 4242")
        return client

    def _send(self, request: bytes) -> None:
        if self.answers.closed is not None:
            raise self.answers.closed
        self.ops += 1
        self.transport.write(request)

    async def set(self, key: str, value: bytes) -> None:
        self._send(_U8.pack(Query.SET) + _key(key) + _data(value))

    async def get(self, key: str) -> bytes:
        await self.wait(key)
        self._send(_U8.pack(Query.GET) + _key(key))
        value: bytes = await self.answers.expect(None)
        return value

    async def wait(self, key: str) -> None:
        self._send(_U8.pack(Query.WAIT) + _U64.pack(1) + _key(key))
        answer = await self.answers.expect(_U8)
        if answer != WaitResponse.STOP_WAITING:
            raise ConnectionError(f"WAIT answered {answer}")

    async def add(self, key: str, delta: int) -> int:
        self._send(_U8.pack(Query.ADD) + _key(key) + _I64.pack(delta))
        return int(await self.answers.expect(_I64))

    async def close(self) -> None:
        self.transport.close()


class RoundStoreRank:
    """One rank of the in-process API: c10d's calls as ``CoordinatorStore`` makes them on
    the round store (one call each; ``get`` and ``wait`` are held by the server)."""

    def __init__(self, store: RoundStore, caller: Caller) -> None:
        self.store = store
        self.caller = caller
        self.ops = 0

    async def set(self, key: str, value: bytes) -> None:
        self.ops += 1
        await self.store.set(key, value)

    async def get(self, key: str) -> bytes:
        self.ops += 1
        return await self.store.get(key, timeout_s=CLIENT_TIMEOUT_S)

    async def wait(self, key: str) -> None:
        self.ops += 1
        await self.store.wait([key], timeout_s=CLIENT_TIMEOUT_S)

    async def add(self, key: str, delta: int) -> int:
        self.ops += 1
        return await self.store.add(key, delta)

    async def close(self) -> None:
        await self.caller.close()


# --- the ranks role ------------------------------------------------------------------------------


@dataclass
class Run:
    """One replay of a pattern by every rank of the process."""

    started: list[float] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)
    ops_before: int = 0
    errors: list[str] = field(default_factory=list)


def rank_numbers(args: argparse.Namespace) -> list[int]:
    """The ranks this process plays: every rank of its nodes."""
    first = args.first_node * args.per_node
    return list(range(first, min(args.world, first + args.nodes * args.per_node)))


def ids_arg(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


class _Bridge(Protocol):
    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


class _LoopBridge:
    """A bridge on the load process's own event loop, with its own client (``--bridge-loop
    shared``)."""

    def __init__(self, client: Client, bridge: StoreBridge) -> None:
        self.client = client
        self.bridge = bridge

    @property
    def host(self) -> str:
        return self.bridge.host

    @property
    def port(self) -> int:
        return self.bridge.port

    async def close(self) -> None:
        await self.bridge.stop_serving()
        await self.client.close()


async def make_bridges(args: argparse.Namespace) -> list[TCPStoreBridge | _LoopBridge]:
    """One bridge per node, serving the round store as the node's participant: each on a
    thread and event loop of its own as in a torchrun agent (``--bridge-loop thread``), or
    all on this process's loop (``shared``)."""
    bridges: list[TCPStoreBridge | _LoopBridge] = []
    participants = ids_arg(args.participants)
    endpoints = args.endpoints.split(",")
    for node in range(args.nodes):
        if args.bridge_loop == "shared":
            client = Client(endpoints, timeout_s=CLIENT_TIMEOUT_S, open_session_on_connect=False)
            await client.connect()
            shared = _LoopBridge(client, StoreBridge(client))
            bridges.append(shared)
            await shared.bridge.serve_round(args.job, args.round, participants[node])
            continue
        bridge = await asyncio.to_thread(TCPStoreBridge, endpoints, timeout_s=CLIENT_TIMEOUT_S)
        bridges.append(bridge)
        await asyncio.to_thread(bridge.serve_round, args.job, args.round, participants[node])
    return bridges


async def close_bridges(bridges: Sequence[TCPStoreBridge | _LoopBridge]) -> None:
    for bridge in bridges:
        if isinstance(bridge, _LoopBridge):
            await bridge.close()
        else:
            await asyncio.to_thread(bridge.close)


async def connect_ranks(
    args: argparse.Namespace, ranks: Sequence[int], bridges: Sequence[_Bridge]
) -> tuple[list[Store], Transport | None]:
    """A store handle per rank, connected."""
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
    if args.store == "coordinator_store":
        transport = Transport(args.endpoints.split(","), backoff=Backoff(base_s=0.05, cap_s=2.0))
        participants = ids_arg(args.participants)
        stores: list[Store] = []
        for rank in ranks:
            caller = Caller(
                transport,
                timeout_s=CLIENT_TIMEOUT_S,
                session_ttl_s=SESSION_TTL_S,
                max_inflight_writes=256,
            )
            store = RoundStore(caller, args.job, args.round, participants[rank - ranks[0]])
            stores.append(RoundStoreRank(store, caller))
        return stores, transport

    async def connect(rank: int) -> Store:
        async with slots:
            if args.store == "tcpstore":
                host, _, port = args.address.rpartition(":")
                return await TCPStoreClient.connect(host, int(port))
            bridge = bridges[rank // args.per_node - args.first_node]
            return await TCPStoreClient.connect(bridge.host, bridge.port)

    return list(await asyncio.gather(*(connect(rank) for rank in ranks))), None


async def replay(
    stores: Sequence[Store], ranks: Sequence[int], args: argparse.Namespace, command: str, run: Run
) -> None:
    _, pattern_name, prefix = command.split()
    pattern = PATTERNS[pattern_name]

    async def one(store: Store, rank: int) -> None:
        run.started.append(time.time())
        try:
            await pattern(store, rank, args.world, prefix)
        except Exception as error:  # reported, not raised: the run goes on
            run.errors.append(f"rank {rank}: {type(error).__name__}: {error}"[:300])
            return
        run.ended.append(time.time())

    await asyncio.gather(*(one(store, rank) for store, rank in zip(stores, ranks, strict=True)))


def run_report(stores: Sequence[Store], ranks: Sequence[int], run: Run, finished: bool) -> None:
    emit(
        "done",
        finished=finished and len(run.ended) == len(ranks) and not run.errors,
        ranks=len(ranks),
        ranks_done=len(run.ended),
        first_op=min(run.started, default=None),
        last_done=max(run.ended, default=None),
        ops=sum(store.ops for store in stores) - run.ops_before,
        errors=len(run.errors),
        first_error=run.errors[0] if run.errors else None,
    )


async def warm_up(stores: Sequence[Store], ranks: Sequence[int]) -> None:
    """Every rank sets a key of its own and reads it back before any trial, on every store:
    the trials then time the round's traffic, not what a long-lived agent does once (a
    bridge's first calls open its gRPC channels and its session), as the TCPStore ranks'
    connections are made before the timing too."""
    pairs = list(zip(stores, ranks, strict=True))
    await asyncio.gather(*(store.set(f"warm-up/{rank}", b"1") for store, rank in pairs))
    await asyncio.gather(*(store.get(f"warm-up/{rank}") for store, rank in pairs))


async def run_ranks(args: argparse.Namespace, lag: LoopLag) -> None:
    ranks = rank_numbers(args)
    began = time.perf_counter()
    bridges = await make_bridges(args) if args.store == "rallypoint" else []
    stores, transport = await connect_ranks(args, ranks, bridges)
    await warm_up(stores, ranks)
    emit(
        "ready",
        ranks=len(ranks),
        bridges=[b.port for b in bridges],
        setup_s=time.perf_counter() - began,
    )
    current: tuple[asyncio.Task[None], Run] | None = None
    try:
        async for command in command_lines():
            if command.startswith("run "):
                run = Run(ops_before=sum(store.ops for store in stores))
                task = asyncio.create_task(replay(stores, ranks, args, command, run))
                task.add_done_callback(
                    lambda done, run=run: (
                        None if done.cancelled() else run_report(stores, ranks, run, True)
                    )
                )
                current = (task, run)
            elif command == "stop" and current is not None:
                task, run = current
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    run_report(stores, ranks, run, False)
                current = None
            elif command == "close":
                break
    finally:
        if current is not None:
            current[0].cancel()
        for store in stores:
            with contextlib.suppress(Exception):
                await store.close()  # type: ignore[attr-defined]
        if transport is not None:
            await transport.close()
        await close_bridges(bridges)


async def run_bridges(args: argparse.Namespace, lag: LoopLag) -> None:
    bridges = await make_bridges(args)
    emit("ready", bridges=[b.port for b in bridges])
    try:
        async for command in command_lines():
            if command == "close":
                break
    finally:
        await close_bridges(bridges)


async def run_tcpstore_server(args: argparse.Namespace, lag: LoopLag) -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        use_libuv=True,
        timeout=timedelta(seconds=CLIENT_TIMEOUT_S),
    )
    emit("ready", port=server.port, libuv=bool(server.libuvBackend))
    async for command in command_lines():
        if command == "close":
            break
    del server


async def run_init_gloo(args: argparse.Namespace, lag: LoopLag) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(args.master_port),
        RANK=str(args.rank),
        LOCAL_RANK=str(args.rank % args.per_node),
        WORLD_SIZE=str(args.world),
        TORCHELASTIC_RESTART_COUNT="0",
    )
    if args.agent_store:
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    emit("imported")
    start_at = None
    async for command in command_lines():
        if command.startswith("go "):
            start_at = float(command.split()[1])
            break
    if start_at is None:
        return
    await asyncio.sleep(max(0.0, start_at - time.time()))
    started = time.time()
    dist.init_process_group("gloo", init_method="env://")
    initialized = time.time()
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    emit(
        "initialized",
        rank=dist.get_rank(),
        started=started,
        initialized=initialized,
        all_reduce_done=time.time(),
        sum=float(tensor.item()),
    )
    dist.destroy_process_group()
    async for command in command_lines():
        if command == "close":
            break


ROLES = {
    "ranks": run_ranks,
    "bridges": run_bridges,
    "tcpstore-server": run_tcpstore_server,
    "init-gloo": run_init_gloo,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--store", choices=["tcpstore", "rallypoint", "coordinator_store"])
    parser.add_argument("--world", type=int, default=1, help="ranks in the whole job")
    parser.add_argument("--per-node", type=int, default=8, help="ranks per node (bridge)")
    parser.add_argument("--first-node", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=1, help="nodes this process plays")
    parser.add_argument("--address", default="", help="tcpstore: HOST:PORT")
    parser.add_argument(
        "--bridge-loop",
        choices=("thread", "shared"),
        default="shared",
        help="rallypoint: each bridge on its own thread and loop (as in an agent), or all "
        "of the process's bridges on its one loop",
    )
    parser.add_argument("--endpoints", default="", help="coordinator client addresses")
    parser.add_argument("--job", default="")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument(
        "--participants",
        default="",
        help="participant ids: one per node (rallypoint, bridges) or per rank "
        "(coordinator_store) of this process",
    )
    parser.add_argument("--rank", type=int, default=0, help="init-gloo")
    parser.add_argument("--master-port", type=int, default=0, help="init-gloo")
    parser.add_argument(
        "--agent-store", action="store_true", help="init-gloo: TORCHELASTIC_USE_AGENT_STORE"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_load_process(build_parser(), ROLES, argv)


if __name__ == "__main__":
    sys.exit(main())
