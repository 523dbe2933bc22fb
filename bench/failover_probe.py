"""The failover benchmark's probe: one writer, the same code for both systems.

The writer starts a put every ``interval_s`` on a fixed cadence, whether or not the puts
before it have ended (a put that hangs on a stopped member must not keep the probe from
noticing the new leader), each with its own ``attempt_timeout_s`` deadline, so at most
``attempt_timeout_s / interval_s`` puts are in flight. Puts go to the members in turn, one
grpc.aio channel per member, as etcd's own client (clientv3's round-robin balancer) spreads
unary calls over its endpoints. Both systems' followers forward a write to their leader
through Raft, so any live member serves a put as soon as the cluster has a leader again, and
the probe needs no leader discovery: the member that failed gets a third of the puts, which
fail (at once after a kill, after ``attempt_timeout_s`` while it is stopped) without delaying
the others. Every attempt is recorded with its start and end on the monotonic clock, so a
trial can ask for the first acknowledged put that started after its fault; the figure's
resolution is one cadence step per live member, about 40 ms.

A put is each system's own ``KV.Put``: rallypoint's with a session header (every attempt takes
the next sequence, and ``first_unacked`` is the lowest sequence still in flight, so the
session's answer cache stays small; the probe never retries a sequence: a new attempt is a new
put), etcd's from bench/etcd/api.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from bench.etcd.api import load as load_etcd_api
from bench.failover_members import CHANNEL_OPTIONS, wait_for
from rallypoint.proto.v1 import common_pb2, kv_pb2, kv_pb2_grpc, session_pb2, session_pb2_grpc

SESSION_TTL_MS = 120_000
VALUE = b"x" * 64


class PutFailed(Exception):
    """A put not acknowledged; ``code`` is the gRPC status code's name."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Putter(Protocol):
    """One put to one member, raising PutFailed when it is not acknowledged in time."""

    async def put(self, address: str, timeout_s: float) -> None: ...

    async def close(self) -> None: ...


class Channels:
    def __init__(self) -> None:
        self._by_address: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._by_address.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._by_address[address] = channel
        return channel

    async def close(self) -> None:
        for channel in self._by_address.values():
            await channel.close(grace=None)
        self._by_address.clear()


class RallypointPutter:
    """KV.Put with a session header, the session opened once for the whole run."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.channels = Channels()
        self.session_id = 0
        self.sequence = 0
        # Invariant: the sequences of the puts in flight; the lowest is first_unacked.
        self._in_flight: set[int] = set()

    async def open_session(self, address: str) -> None:
        opened = await session_pb2_grpc.SessionStub(self.channels.get(address)).Open(
            session_pb2.SessionOpenRequest(ttl_ms=SESSION_TTL_MS), timeout=10.0
        )
        self.session_id = opened.session_id

    async def put(self, address: str, timeout_s: float) -> None:
        self.sequence += 1
        sequence = self.sequence
        self._in_flight.add(sequence)
        header = common_pb2.RequestHeader(
            session_id=self.session_id, sequence=sequence, first_unacked=min(self._in_flight)
        )
        request = kv_pb2.PutRequest(header=header, key=self.key, value=VALUE)
        try:
            await kv_pb2_grpc.KVStub(self.channels.get(address)).Put(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise PutFailed(exc.code().name) from None
        finally:
            self._in_flight.discard(sequence)

    async def close(self) -> None:
        await self.channels.close()


class EtcdPutter:
    def __init__(self, key: bytes) -> None:
        self.api = load_etcd_api()
        self.key = key
        self.channels = Channels()

    async def put(self, address: str, timeout_s: float) -> None:
        stub = self.api.rpc_grpc.KVStub(self.channels.get(address))
        try:
            await stub.Put(self.api.rpc.PutRequest(key=self.key, value=VALUE), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise PutFailed(exc.code().name) from None

    async def close(self) -> None:
        await self.channels.close()


@dataclass(frozen=True, slots=True)
class Attempt:
    started_s: float
    ended_s: float
    address: str
    failure: str | None  # None when acknowledged, else the status code's name


@dataclass(slots=True)
class Writer:
    """See the module docstring. ``attempts`` is in the order the puts ended."""

    putter: Putter
    endpoints: list[str]
    interval_s: float
    attempt_timeout_s: float
    attempts: list[Attempt] = field(default_factory=list)
    _stopped: bool = False
    _acknowledged: asyncio.Event = field(default_factory=asyncio.Event)
    # Invariant: the puts started and not yet ended (each ends by its own deadline).
    _in_flight: set[asyncio.Task[None]] = field(default_factory=set)

    def stop(self) -> None:
        self._stopped = True

    async def run(self) -> None:
        """Start puts on the cadence until stopped, then wait for those in flight."""
        due_s = time.monotonic()
        turn = 0
        while not self._stopped:
            target = self.endpoints[turn % len(self.endpoints)]
            turn += 1
            task = asyncio.create_task(self._attempt(target, time.monotonic()))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            # A late wake-up (the loop was busy) starts the next put at once, not a burst.
            due_s = max(due_s + self.interval_s, time.monotonic())
            await asyncio.sleep(due_s - time.monotonic())
        await asyncio.gather(*self._in_flight)

    async def _attempt(self, target: str, started_s: float) -> None:
        try:
            await self.putter.put(target, self.attempt_timeout_s)
        except PutFailed as failed:
            self.attempts.append(Attempt(started_s, time.monotonic(), target, failed.code))
        else:
            self.attempts.append(Attempt(started_s, time.monotonic(), target, None))
            self._acknowledged.set()

    def first_acknowledged_after(self, fault_s: float) -> Attempt | None:
        for attempt in self.attempts:
            if attempt.failure is None and attempt.started_s >= fault_s:
                return attempt
        return None

    async def wait_acknowledged_after(self, fault_s: float, give_up_s: float) -> Attempt | None:
        """The first acknowledged put started at or after ``fault_s``; None if none has
        been by ``fault_s + give_up_s``."""
        deadline = fault_s + give_up_s
        while True:
            found = self.first_acknowledged_after(fault_s)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._acknowledged.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acknowledged.wait(), remaining)

    async def warm(self, timeout_s: float = 15.0) -> None:
        """Wait until the latest ended put to every member was acknowledged (after a restart
        the channel to that member has reconnected)."""
        since = time.monotonic()

        async def warmed() -> bool:
            latest: dict[str, Attempt] = {}
            for attempt in sorted(self.attempts, key=lambda a: a.started_s):
                if attempt.started_s >= since:
                    latest[attempt.address] = attempt
            return len(latest) == len(self.endpoints) and all(
                a.failure is None for a in latest.values()
            )

        await wait_for(warmed, timeout_s, "writes acknowledged by every member", 0.02)

    def failures_between(self, start_s: float, end_s: float) -> dict[str, int]:
        """Failed puts started in [start_s, end_s), by status code."""
        counts = Counter(
            a.failure
            for a in self.attempts
            if a.failure is not None and start_s <= a.started_s < end_s
        )
        return dict(counts)

    def timeline(self, start_s: float, end_s: float, origin_s: float) -> list[list[Any]]:
        """Puts started in [start_s, end_s], for reading a trial back: [start (s after
        origin_s), duration (s), member (from 1), outcome ("ok" or the status code)]."""
        return [
            [
                round(a.started_s - origin_s, 3),
                round(a.ended_s - a.started_s, 3),
                self.endpoints.index(a.address) + 1,
                a.failure or "ok",
            ]
            for a in sorted(self.attempts, key=lambda a: a.started_s)
            if start_s <= a.started_s <= end_s
        ]


@contextlib.asynccontextmanager
async def running_writer(
    putter: Putter, endpoints: list[str], interval_s: float, attempt_timeout_s: float
) -> AsyncIterator[Writer]:
    """A writer putting until exit, where it stops and its puts in flight end."""
    writer = Writer(putter, endpoints, interval_s, attempt_timeout_s)
    task = asyncio.create_task(writer.run())
    try:
        yield writer
    finally:
        writer.stop()
        await task
