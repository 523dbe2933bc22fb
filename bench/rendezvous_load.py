"""The load processes of the rendezvous benchmark (bench/rendezvous_bench.py drives them).

Each process speaks JSON lines: commands, one per line, on stdin; events on stdout, each with
the wall-clock time ``t`` it was emitted (every process of the benchmark runs on one machine,
so wall-clock times from different processes compare). Roles:

``participants``
    One simulated host: many workers on one event loop and one :class:`Client` (one
    session), a :class:`Participant` each from ``client.join``, all heartbeated on the
    client's one HeartbeatBatch stream, exactly as the shipped client runs a process's
    participants. Commands: ``join`` (every participant joins at once; ``joined`` reports the
    time each join was acknowledged, ``active`` the time each participant first saw its round
    ACTIVE), ``report`` (participants lost so far, event-loop lag), ``close``.
``worker``
    One participant in its own process, heartbeating every 100 ms: what the benchmark kills
    or stops. Emits ``ready``, joins on ``join``, then emits ``joined`` and one ``round``
    event per new (round, state) it learns.
``heartbeaters``
    Leader capacity: participants without a round watch, each with its own session (kept
    alive every third of its TTL, as the client does) and its own heartbeat stream, written
    with the generated stubs so this process is not what limits the count. The answer
    latency is measured on every answer the leader owes: the first heartbeat of a stream,
    every tenth after it, and one probe in ten, at a random phase per participant (it names
    round 0, which the leader answers at once), so that a window of a few seconds holds
    samples even when every participant started at the same moment. Commands: ``add JOB
    COUNT``, ``report`` (latencies and losses since the last report), ``close``.
``torchrun``
    torch's ``DynamicRendezvousHandler`` over ``C10dRendezvousBackend``, one agent per thread,
    each with its own TCPStore client to the store the driver hosts. Commands: ``go`` (every
    agent calls ``next_rendezvous()`` at once), ``close``.

Every role runs an event-loop lag probe: a load process that falls behind sends late
heartbeats, and the benchmark must tell that apart from the leader falling behind.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import random
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio
import uvloop

from bench.common import latency_summary_ms
from rallypoint.client import Client, JobConfig, Participant, RallypointError, RoundState
from rallypoint.proto.v1 import (
    common_pb2,
    rendezvous_pb2,
    rendezvous_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

T = TypeVar("T")
# A load process's role: what it runs, given its arguments and its loop-lag probe.
Role = Callable[[argparse.Namespace, "LoopLag"], Awaitable[None]]

# How many calls of one kind a process keeps in flight (session opens, joins, closes).
CONCURRENCY = 128
CLIENT_TIMEOUT_S = 120.0
# Participants' sessions outlive a stall of the load process comfortably.
SESSION_TTL_S = 60.0
LAG_PROBE_INTERVAL_S = 0.02
# The leader answers the first heartbeat of a stream and every tenth one after it
# (coordinator/service/rendezvous.py, HEARTBEAT_ANSWER_EVERY).
ANSWERED_EVERY = 10


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


async def command_lines() -> AsyncIterator[str]:
    """The driver's commands, one per stdin line, until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        if line.strip():
            yield line.strip()


async def bounded_gather(calls: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the calls with at most ``limit`` in flight; results in the calls' order."""
    slots = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with slots:
            return await call()

    return await asyncio.gather(*(one(call) for call in calls))


class LoopLag:
    """How late the event loop wakes a sleeper: the load process's own delay, which the
    detector on the leader cannot tell from a slow worker."""

    def __init__(self) -> None:
        # Lateness of each wake-up since the last take(), in seconds.
        self.samples_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._probe(), name="loop lag probe")

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_PROBE_INTERVAL_S
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            self.samples_s.append(max(0.0, loop.time() - due))

    def take(self) -> dict[str, float]:
        """p50/p99/max lag in ms since the previous take()."""
        samples, self.samples_s = self.samples_s, []
        summary = latency_summary_ms(samples)
        return {key: summary[key] for key in ("p50_ms", "p99_ms", "max_ms")}


# --- participants: many simulated workers, full client library ---------------------------------


@dataclass(slots=True)
class Simulated:
    participant: Participant | None = None
    joined_at: float = 0.0
    # Wall-clock time this participant first saw its first round ACTIVE (0: not yet).
    active_seen_at: float = 0.0


async def run_participants(args: argparse.Namespace, lag: LoopLag) -> None:
    config = JobConfig(**json.loads(args.config))
    names = [f"{args.name_prefix}{args.first + i}" for i in range(args.count)]
    client = Client(args.endpoints, timeout_s=CLIENT_TIMEOUT_S, session_ttl_s=SESSION_TTL_S)
    await client.connect()
    workers = [Simulated() for _ in names]
    emit("ready", count=len(workers))

    def watch(worker: Simulated, participant: Participant) -> None:
        def on_round(info: Any) -> None:
            if worker.active_seen_at == 0.0 and info.state is RoundState.ACTIVE:
                worker.active_seen_at = time.time()

        participant.on_round_change(on_round)
        # The join that completes the round is answered with the ACTIVE round itself.
        on_round(participant.round)

    def settled() -> bool:
        """Every worker saw its round ACTIVE or was removed (then it never will)."""
        return all(
            w.active_seen_at or (w.participant is not None and w.participant.lost.is_set())
            for w in workers
        )

    async def join(worker: Simulated, name: str) -> None:
        participant = await client.join(args.job, name, config=config)
        worker.joined_at = time.time()
        worker.participant = participant
        # No await since join returned: no round change can have been delivered unseen.
        watch(worker, participant)

    async for line in command_lines():
        if line == "join":
            started = time.time()
            await bounded_gather(
                [functools.partial(join, w, n) for w, n in zip(workers, names, strict=True)],
                len(workers),
            )
            emit(
                "joined", started=started, acks=[w.joined_at for w in workers], loop_lag=lag.take()
            )
            # The times come from the callbacks: how often this polls does not change them.
            deadline = time.monotonic() + args.active_timeout_s
            while not settled() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            emit(
                "active",
                seen=[w.active_seen_at or None for w in workers],
                ranks=[w.participant.rank if w.participant else None for w in workers],
                closed_ms=[w.participant.round.closed_ms if w.participant else 0 for w in workers],
                lost=sum(1 for w in workers if w.participant and w.participant.lost.is_set()),
                loop_lag=lag.take(),
            )
        elif line == "report":
            lost = [
                w.participant.lost_reason
                for w in workers
                if w.participant and w.participant.lost.is_set()
            ]
            emit("report", lost=len(lost), lost_reasons=lost[:5], loop_lag=lag.take())
        elif line == "close":
            break
    await client.close()
    emit("closed")


# --- worker: one real process, the target of SIGKILL and SIGSTOP ----------------------------------


async def run_worker(args: argparse.Namespace, lag: LoopLag) -> None:
    config = JobConfig(**json.loads(args.config)) if args.config else None
    commands = command_lines()
    async with Client(args.endpoints, timeout_s=CLIENT_TIMEOUT_S) as client:
        # Join only when told: the driver starts every worker first, so no worker's first
        # heartbeats compete with the others' start-up for the CPU.
        emit("ready")
        if await anext(commands, "close") != "join":
            return
        participant = await client.join(args.job, args.name_prefix, config=config)
        emit("joined", participant_id=participant.participant_id, round=participant.round.round)

        def on_round(info: Any) -> None:
            emit("round", round=info.round, state=info.state.value, members=len(info.members))

        participant.on_round_change(on_round)
        on_round(participant.round)
        async for line in commands:
            if line == "report":
                emit("report", lost=int(participant.lost.is_set()), loop_lag=lag.take())
            elif line == "close":
                break
    emit("closed")


# --- heartbeaters: leader capacity, generated stubs ---------------------------------------------


@dataclass(slots=True)
class HeartbeatStats:
    """What the heartbeaters saw since the last report."""

    latencies_s: list[float] = field(default_factory=list)
    heartbeats: int = 0
    # Streams the leader ended with NOT_FOUND: the participant was declared failed.
    lost: int = 0
    errors: int = 0
    first_error: str | None = None

    def error(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what[:300]


class RawSession:
    """A session opened and kept alive with the generated stub (one per participant)."""

    def __init__(self, stub: session_pb2_grpc.SessionStub, session_id: int) -> None:
        self.stub = stub
        self.session_id = session_id
        # The last sequence used; each write is answered before the next is sent.
        self.sequence = 0

    def header(self) -> common_pb2.RequestHeader:
        self.sequence += 1
        return common_pb2.RequestHeader(
            session_id=self.session_id, sequence=self.sequence, first_unacked=self.sequence
        )

    async def keep_alive_forever(self, stats: HeartbeatStats) -> None:
        while True:
            await asyncio.sleep(SESSION_TTL_S / 3)
            try:
                await self.stub.KeepAlive(
                    session_pb2.SessionKeepAliveRequest(
                        session_id=self.session_id, first_unacked=self.sequence + 1
                    ),
                    timeout=SESSION_TTL_S / 3,
                )
            except grpc.aio.AioRpcError as error:
                stats.error(f"session keep-alive: {error.code().name} {error.details()}")


class Heartbeater:
    """One participant: its session, its Join, its heartbeat stream on a fixed schedule."""

    def __init__(self, channel: grpc.aio.Channel, job: str, name: str, interval_s: float) -> None:
        self.rendezvous = rendezvous_pb2_grpc.RendezvousStub(channel)
        self.sessions = session_pb2_grpc.SessionStub(channel)
        self.job = job
        self.name = name
        self.interval_s = interval_s
        self.tasks: list[asyncio.Task[None]] = []

    async def join(self, stats: HeartbeatStats) -> None:
        opened = await self.sessions.Open(
            session_pb2.SessionOpenRequest(ttl_ms=int(SESSION_TTL_S * 1000)),
            timeout=CLIENT_TIMEOUT_S,
        )
        session = RawSession(self.sessions, opened.session_id)
        joined = await self.rendezvous.Join(
            rendezvous_pb2.JoinRequest(header=session.header(), job=self.job, name=self.name),
            timeout=CLIENT_TIMEOUT_S,
        )
        self.tasks = [
            asyncio.create_task(session.keep_alive_forever(stats)),
            asyncio.create_task(self._beat(joined.participant_id, joined.round.round, stats)),
        ]

    async def _beat(self, participant_id: int, round_number: int, stats: HeartbeatStats) -> None:
        call = self.rendezvous.Heartbeat(None)
        # Send times of the heartbeats the leader owes an answer to, oldest first.
        owed: list[float] = []

        async def send() -> None:
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            count = 0
            # Heartbeats numbered `phase` modulo ANSWERED_EVERY are probes.
            phase = random.randrange(ANSWERED_EVERY)
            while True:
                count += 1
                probe = count % ANSWERED_EVERY == phase
                if probe or count == 1 or count % ANSWERED_EVERY == 0:
                    owed.append(time.perf_counter())
                request = rendezvous_pb2.HeartbeatRequest(
                    job=self.job, participant_id=participant_id, round=0 if probe else round_number
                )
                await call.write(request)
                stats.heartbeats += 1
                # A fixed schedule, as the client keeps: drift would read as lateness.
                next_at = max(next_at + self.interval_s, loop.time())
                await asyncio.sleep(next_at - loop.time())

        sender = asyncio.create_task(send())
        try:
            async for response in call:
                round_number = response.current_round
                if owed:
                    stats.latencies_s.append(time.perf_counter() - owed.pop(0))
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.NOT_FOUND:
                stats.lost += 1
            else:
                stats.error(f"heartbeat: {error.code().name} {error.details()}")
        finally:
            sender.cancel()
            call.cancel()

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()


async def run_heartbeaters(args: argparse.Namespace, lag: LoopLag) -> None:
    # A few channels with distinct arguments, so they do not share one connection.
    channels = [
        grpc.aio.insecure_channel(args.endpoints.split(",")[0], options=[("rallypoint.bench", i)])
        for i in range(args.channels)
    ]
    stats = HeartbeatStats()
    beaters: list[Heartbeater] = []
    # Names handed out so far (a failed join's name is not reused).
    issued = 0
    emit("ready")
    async for line in command_lines():
        words = line.split()
        if words[0] == "add":
            job, count = words[1], int(words[2])
            added = [
                Heartbeater(
                    channels[(issued + i) % len(channels)],
                    job,
                    f"{args.name_prefix}{args.first + issued + i}",
                    args.interval_s,
                )
                for i in range(count)
            ]
            issued += count
            started = time.perf_counter()

            async def join_one(beater: Heartbeater) -> str | None:
                try:
                    await beater.join(stats)
                except grpc.aio.AioRpcError as error:
                    return f"{error.code().name}: {error.details()}"[:300]
                return None

            failures = await bounded_gather(
                [functools.partial(join_one, b) for b in added], CONCURRENCY
            )
            beaters.extend(b for b, failure in zip(added, failures, strict=True) if not failure)
            failed = [failure for failure in failures if failure]
            emit(
                "added",
                job=job,
                count=count,
                total=len(beaters),
                join_s=time.perf_counter() - started,
                failed=len(failed),
                first_failure=failed[0] if failed else None,
            )
        elif words[0] == "report":
            taken, stats.latencies_s = stats.latencies_s, []
            emit(
                "report",
                participants=len(beaters),
                heartbeats=stats.heartbeats,
                answers=len(taken),
                latency=latency_summary_ms(taken),
                lost=stats.lost,
                errors=stats.errors,
                first_error=stats.first_error,
                loop_lag=lag.take(),
            )
            stats.heartbeats = stats.lost = stats.errors = 0
            stats.first_error = None
        elif words[0] == "close":
            break
    for beater in beaters:
        beater.stop()
    for channel in channels:
        await channel.close(grace=None)
    emit("closed")


# --- torchrun: DynamicRendezvousHandler over the c10d backend, one agent per thread ----------


@dataclass(slots=True)
class Agent:
    handler: Any
    started_at: float = 0.0
    returned_at: float = 0.0
    rank: int | None = None
    error: str | None = None


def make_agent(args: argparse.Namespace) -> Agent:
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    # What torchrun's c10d backend does for an agent that does not host the store.
    store = TCPStore(
        "127.0.0.1",
        args.store_port,
        is_master=False,
        timeout=timedelta(seconds=args.active_timeout_s),
        wait_for_workers=False,
    )
    backend = C10dRendezvousBackend(store, args.job)
    handler = DynamicRendezvousHandler.from_backend(
        run_id=args.job,
        store=store,
        backend=backend,
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=timedelta(seconds=args.active_timeout_s)),
    )
    return Agent(handler)


def run_agent(agent: Agent, go: threading.Event) -> None:
    go.wait()
    agent.started_at = time.time()
    try:
        info = agent.handler.next_rendezvous()
    except Exception as error:  # reported to the driver, which records it
        agent.error = f"{type(error).__name__}: {error}"[:300]
    else:
        agent.rank = int(info.rank)
    agent.returned_at = time.time()


async def run_torchrun(args: argparse.Namespace, lag: LoopLag) -> None:
    agents = await asyncio.to_thread(lambda: [make_agent(args) for _ in range(args.count)])
    go = threading.Event()
    threads = [
        threading.Thread(target=run_agent, args=(agent, go), daemon=True) for agent in agents
    ]
    for thread in threads:
        thread.start()
    emit("ready", count=len(agents))
    async for line in command_lines():
        if line == "go":
            go.set()
            for thread in threads:
                await asyncio.to_thread(thread.join)
            emit(
                "done",
                starts=[a.started_at for a in agents],
                returns=[a.returned_at for a in agents],
                ranks=[a.rank for a in agents],
                errors=[a.error for a in agents if a.error],
                loop_lag=lag.take(),
            )
        elif line == "close":
            break
    # The agents' keep-alive threads are daemons: the process simply exits.
    emit("closed")


ROLES: dict[str, Role] = {
    "participants": run_participants,
    "worker": run_worker,
    "heartbeaters": run_heartbeaters,
    "torchrun": run_torchrun,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--endpoints", default="", help="comma-separated client addresses")
    parser.add_argument("--job", required=True)
    parser.add_argument("--name-prefix", default="w", help="participant names: PREFIX<index>")
    parser.add_argument("--first", type=int, default=0, help="index of the first name")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--config", help="JobConfig fields as JSON (participants, worker)")
    parser.add_argument("--active-timeout-s", type=float, default=120.0)
    parser.add_argument("--interval-s", type=float, default=1.0, help="heartbeaters")
    parser.add_argument("--channels", type=int, default=4, help="heartbeaters")
    parser.add_argument("--store-port", type=int, default=0, help="torchrun")
    parser.add_argument("--min-nodes", type=int, default=1, help="torchrun")
    parser.add_argument("--max-nodes", type=int, default=1, help="torchrun")
    return parser


async def run_role(roles: dict[str, Role], args: argparse.Namespace) -> None:
    lag = LoopLag()
    lag.start()
    await roles[args.role](args, lag)


def run_load_process(
    parser: argparse.ArgumentParser, roles: dict[str, Role], argv: Sequence[str] | None
) -> int:
    """A load process's main: parse, run the role on uvloop, say a client failure as an
    event (this module's and bench/scale_load.py's)."""
    args = parser.parse_args(argv)
    # Participants that the benchmark removes on purpose would log one warning each.
    logging.basicConfig(level=logging.ERROR)
    try:
        uvloop.run(run_role(roles, args))
    except RallypointError as error:
        emit("failed", error=f"{type(error).__name__}: {error}"[:500])
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_load_process(build_parser(), ROLES, argv)


if __name__ == "__main__":
    sys.exit(main())
