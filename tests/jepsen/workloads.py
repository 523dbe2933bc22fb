"""Workloads: real client-library users, each on its own connection, recording every
invocation and completion into the run's history.

Each workload has its own key prefix, so all of them run together on one cluster (one run
exercises every workload under one nemesis). A client whose operation ended with an unknown
outcome takes a new process number for its next one, as Jepsen does: the old operation may
still be in flight, and a process has one operation at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rallypoint.client import (
    Client,
    DeadlineExceededError,
    InternalError,
    JobConfig,
    OutcomeUnknownError,
    RallypointError,
    RoundState,
    UnavailableError,
)

from .history import EventType, HistoryWriter

# Outcomes the client cannot know: a timeout, an unavailable cluster, a retried write whose
# session ended, and a server failure the API does not describe (INTERNAL): the member did not
# decide the request, so it may still apply. (A release before the cluster version answered
# requests waiting on a member that was shutting down with INTERNAL, and they then committed
# through the next leader: ``make upgrade-test`` runs such members.)
UNKNOWN_ERRORS = (DeadlineExceededError, UnavailableError, OutcomeUnknownError, InternalError)

# Per call: long enough to ride out a leader election, short enough that a partition makes
# operations time out (unknown outcomes are what the checkers must handle).
OPERATION_TIMEOUT_S = 3.0


@dataclass
class Context:
    endpoints: list[str]
    history: HistoryWriter
    rng: random.Random
    # Loop time when the clients stop issuing new operations.
    stop_at_s: float
    # The clients' Client(kv_batching=...): "always" sends gets, puts and compare-and-sets
    # over KV/Batch.
    kv_batching: str = "off"

    def client(self, endpoints: list[str] | None = None, session: bool = True) -> Client:
        return Client(
            endpoints or self.endpoints,
            timeout_s=OPERATION_TIMEOUT_S,
            attempt_timeout_s=1.0,
            session_ttl_s=10.0,
            open_session_on_connect=session,
            rng=random.Random(self.rng.random()),
            kv_batching=self.kv_batching,
        )

    def running(self) -> bool:
        return time.monotonic() < self.stop_at_s


class Process:
    """One logical client: a process number that changes after an unknown outcome."""

    _numbers = iter(range(1, 1_000_000))

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.number = next(self._numbers)

    async def call(
        self, f: str, key: str, value: Any, action: Callable[[], Awaitable[Any]]
    ) -> tuple[str, Any]:
        """Record the invocation, run ``action``, record its completion: ("ok", result),
        ("fail", error) or ("info", error)."""
        history = self.ctx.history
        history.record(self.number, EventType.INVOKE, f, key, value)
        try:
            result = await action()
        except UNKNOWN_ERRORS as error:
            history.record(self.number, EventType.INFO, f, key, type(error).__name__)
            self.number = next(self._numbers)
            return "info", error
        except RallypointError as error:
            history.record(self.number, EventType.FAIL, f, key, type(error).__name__)
            return "fail", error
        history.record(self.number, EventType.OK, f, key, result)
        return "ok", result


def _int(value: bytes | None) -> int | None:
    return None if value is None else int(value)


# ---------------------------------------------------------------------- register


async def register_client(ctx: Context, keys: int, home: str, writer: Client | None = None) -> None:
    """Reads, writes and compare-and-sets of small integers on ``keys`` independent keys.
    Reads go to the ``home`` member (a client of its own, with no session, so no write
    redirects it to the leader): a follower's read must be as linearizable as the leader's.
    ``writer``: a client shared with other register clients for writes (their concurrent
    puts then share its batch stream); else one of its own."""
    async with contextlib.AsyncExitStack() as stack:
        client = writer if writer is not None else await connect(ctx, stack)
        reader = await connect(ctx, stack, [home], session=False)
        if client is None or reader is None:
            return
        process = Process(ctx)
        while ctx.running():
            key = f"reg/{ctx.rng.randrange(keys)}"
            roll = ctx.rng.random()
            if roll < 0.5:

                async def read(key: str = key) -> int | None:
                    kv = await reader.get(key)
                    return _int(kv.value if kv is not None else None)

                await process.call("read", key, None, read)
            elif roll < 0.75:
                value = ctx.rng.randrange(5)

                async def write(key: str = key, value: int = value) -> None:
                    await client.put(key, str(value))

                await process.call("write", key, value, write)
            else:
                old, new = ctx.rng.randrange(5), ctx.rng.randrange(5)

                async def cas(key: str = key, old: int = old, new: int = new) -> bool:
                    result = await client.compare_and_set(key, str(new), value_equals=str(old))
                    return result.succeeded

                await process.call("cas", key, [old, new], cas)


async def connect(
    ctx: Context,
    stack: contextlib.AsyncExitStack,
    endpoints: list[str] | None = None,
    session: bool = True,
) -> Client | None:
    """A connected client, or None when the cluster never answered before the end."""
    while ctx.running():
        client = ctx.client(endpoints, session)
        try:
            return await stack.enter_async_context(client)
        except RallypointError:
            await asyncio.sleep(0.2)
    return None


# ---------------------------------------------------------------------- set


async def set_client(ctx: Context, worker: int) -> None:
    """Adds unique elements (one key each) under set/."""
    async with contextlib.AsyncExitStack() as stack:
        client = await connect(ctx, stack)
        if client is None:
            return
        process = Process(ctx)
        sequence = 0
        while ctx.running():
            element = worker * 1_000_000 + sequence
            sequence += 1

            async def add(element: int = element) -> None:
                await client.put(f"set/{element}", "1")

            await process.call("add", "set", element, add)


async def set_final_read(ctx: Context, deadline_s: float, endpoints: list[str]) -> None:
    """The final read, from the members in the configuration now (members may have been
    replaced during the run), retried until ``deadline_s``."""
    client = ctx.client(endpoints, session=False)
    async with client:
        process = Process(ctx)
        while time.monotonic() < deadline_s:

            async def read() -> list[int]:
                return sorted(
                    [int(kv.key.split(b"/")[1]) async for kv in client.range_pages("set/")]
                )

            status, _ = await process.call("read", "set", None, read)
            if status == "ok":
                return
            await asyncio.sleep(0.5)


# ---------------------------------------------------------------------- lease


async def lease_client(ctx: Context, lease_ttl_s: float) -> None:
    """Compete for a lock held by a lease; the holder writes to ``fenced/store`` with its
    fencing token. After letting go (or losing the lease) a holder sometimes writes once more
    with its old token, late, as a paused holder waking up would: the store must refuse it."""
    async with contextlib.AsyncExitStack() as stack:
        client = await connect(ctx, stack)
        if client is None:
            return
        process = Process(ctx)
        me = process.number
        # The grant puts the lease here (a call's result is what gets recorded).
        leases: dict[int, Any] = {}
        while ctx.running():

            async def grant() -> dict[str, int]:
                lease = await client.grant_lease(lease_ttl_s)
                leases[lease.lease_id] = lease
                return {"lease_id": lease.lease_id, "token": lease.fencing_token}

            leases.clear()
            status, granted = await process.call("grant", "lease", None, grant)
            if status != "ok":
                await asyncio.sleep(0.1)
                continue
            lease = leases[granted["lease_id"]]
            try:
                acquired = await client.compare_and_set(
                    "fenced/lock", str(me), must_not_exist=True, lease=lease
                )
            except RallypointError:
                acquired = None
            if acquired is not None and acquired.succeeded:
                for _ in range(ctx.rng.randint(2, 6)):
                    if not lease.alive or not ctx.running():
                        break
                    await _fenced_write(process, client, lease.fence, granted["token"])
            with contextlib.suppress(RallypointError):
                await lease.revoke()
            if acquired is not None and acquired.succeeded and ctx.running():
                # The late write of a holder that lost its lock, once a newer holder wrote
                # (as a holder paused past its lease would): the store must refuse it.
                await _newer_token_written(ctx, granted["token"], patience_s=3.0)
                await _fenced_write(process, client, lease.fence, granted["token"])
            await asyncio.sleep(ctx.rng.uniform(0.0, 0.1))


async def _newer_token_written(ctx: Context, token: int, patience_s: float) -> None:
    """Wait (bounded) until the history shows a fenced write accepted under a larger token."""
    deadline_s = time.monotonic() + patience_s
    while time.monotonic() < deadline_s and ctx.running():
        if ctx.history.highest_fenced_token > token:
            return
        await asyncio.sleep(0.05)


async def _fenced_write(process: Process, client: Client, fence: Any, token: int) -> None:
    async def write() -> dict[str, int]:
        result = await client.put("fenced/store", str(token), fence=fence)
        process.ctx.history.highest_fenced_token = max(
            process.ctx.history.highest_fenced_token, token
        )
        return {"revision": result.kv.mod_revision}

    await process.call("write", "fenced/store", {"token": token}, write)


# ---------------------------------------------------------------------- watch


async def watch_writer(ctx: Context) -> None:
    async with contextlib.AsyncExitStack() as stack:
        client = await connect(ctx, stack)
        if client is None:
            return
        process = Process(ctx)
        sequence = 0
        while ctx.running():
            sequence += 1
            key = f"watch/{sequence % 7}"

            async def put(key: str = key, value: int = sequence) -> dict[str, int]:
                result = await client.put(key, str(value))
                return {"revision": result.kv.mod_revision}

            await process.call("put", key, sequence, put)


async def watch_reader(ctx: Context, start_revision: int, finished: Callable[[int], bool]) -> None:
    """Deliver every event under watch/ from ``start_revision`` until ``finished(last
    delivered revision)``; each delivery is recorded as an (instant) operation of this
    watcher's process."""
    async with ctx.client() as client:
        process = Process(ctx)
        watcher = client.watch("watch/", prefix=True, start_revision=start_revision)
        iterator = watcher.__aiter__()
        last_revision = 0
        try:
            while not finished(last_revision):
                try:
                    event = await asyncio.wait_for(iterator.__anext__(), 0.5)
                except TimeoutError:
                    continue
                except RallypointError as error:
                    ctx.history.record(
                        process.number, EventType.INVOKE, "watch-error", "watch", None
                    )
                    ctx.history.record(
                        process.number, EventType.FAIL, "watch-error", "watch", str(error)
                    )
                    return
                last_revision = event.revision
                delivered = [event.revision, event.kv.key.decode(), event.kv.value.decode()]
                ctx.history.record(process.number, EventType.INVOKE, "event", "watch", None)
                ctx.history.record(process.number, EventType.OK, "event", "watch", delivered)
        finally:
            await watcher.aclose()


# ---------------------------------------------------------------------- rendezvous

JOB_CONFIG = JobConfig(min_nodes=2, max_nodes=4, last_call_ms=300, scale_up=True)


async def rendezvous_participant(ctx: Context, name: str) -> None:
    """Join the job, record every active round seen (its number, members and ranks), leave
    after a while and join again, until the end."""
    async with contextlib.AsyncExitStack() as stack:
        client = await connect(ctx, stack)
        if client is None:
            return
        process = Process(ctx)
        joined: list[Any] = []
        while ctx.running():
            joined.clear()

            async def join() -> int:
                participant = await client.join("jepsen", name, config=JOB_CONFIG)
                joined.append(participant)
                return int(participant.participant_id)

            status, _ = await process.call("join", "jepsen", name, join)
            if status != "ok":
                await asyncio.sleep(0.2)
                continue
            participant = joined[0]
            stay_until = time.monotonic() + ctx.rng.uniform(2.0, 6.0)
            seen: set[int] = set()
            try:
                while (
                    time.monotonic() < stay_until
                    and ctx.running()
                    and not participant.lost.is_set()
                ):
                    info = participant.round
                    if info.state is RoundState.ACTIVE and info.round not in seen:
                        seen.add(info.round)
                        view = {
                            "round": info.round,
                            "members": {m.name: m.rank for m in info.members},
                        }
                        ctx.history.record(
                            process.number, EventType.INVOKE, "round", "jepsen", None
                        )
                        ctx.history.record(process.number, EventType.OK, "round", "jepsen", view)
                    await asyncio.sleep(0.05)
            finally:
                with contextlib.suppress(RallypointError):
                    await participant.leave()
                await participant.close()


# ---------------------------------------------------------------------- store (cache leases)

STORE_JOB = "jepsen-store"
STORE_JOB_CONFIG = JobConfig(min_nodes=1, max_nodes=1, last_call_ms=0)


@dataclass
class StoreRound:
    """The store workload's current (round, participant id), or None between rounds."""

    current: tuple[int, int] | None = None


async def store_owner(ctx: Context, held: StoreRound) -> None:
    """Keep a participant in the store job and publish its ACTIVE round: its store is the
    one the store clients use. A lost participant joins again (a new round, new keys)."""
    async with contextlib.AsyncExitStack() as stack:
        client = await connect(ctx, stack)
        if client is None:
            return
        while ctx.running():
            try:
                participant = await client.join(STORE_JOB, "owner", config=STORE_JOB_CONFIG)
            except RallypointError:
                await asyncio.sleep(0.2)
                continue
            try:
                while ctx.running() and not participant.lost.is_set():
                    info = participant.round
                    active = info.state is RoundState.ACTIVE and info.includes(
                        participant.participant_id
                    )
                    held.current = (info.round, int(participant.participant_id)) if active else None
                    await asyncio.sleep(0.05)
            finally:
                held.current = None
                with contextlib.suppress(RallypointError):
                    await participant.leave()
                await participant.close()


async def store_client(ctx: Context, held: StoreRound, keys: int = 3) -> None:
    """Writes (round-store sets of small integers, through a TCPStore bridge's ``Sets``,
    which asks for a lease on each value it writes) and reads through the bridge's coalescer
    (``worker/tcpstore/coalescing.Reads``: answered from the cache leases it holds, its sets'
    included) on the current round's keys, each key a register ``store/<round>/<k>``. The
    clients often set a key to the value it holds, as c10d's barrier does, so leases are
    granted while such sets are in flight. A read of a key never set reads None."""
    from rallypoint.worker.tcpstore.coalescing import Reads, Sets

    async with contextlib.AsyncExitStack() as stack:
        client = await connect(ctx, stack)
        if client is None:
            return
        process = Process(ctx)
        reads: Reads | None = None
        sets: Sets | None = None
        scope: tuple[int, int] | None = None
        try:
            while ctx.running():
                current = held.current
                if current is None:
                    await asyncio.sleep(0.05)
                    continue
                round_number, participant_id = current
                store = client.round_store(STORE_JOB, round_number, participant_id)
                if current != scope:
                    if reads is not None:
                        reads.close()
                    reads, scope = Reads(store, lambda: 1), current
                    sets = Sets(store, reads.cache)
                key = f"{ctx.rng.randrange(keys)}"
                name = f"store/{round_number}/{key}"
                if ctx.rng.random() < 0.6:

                    async def read(key: str = key, reads: Reads = reads) -> int | None:
                        values = await reads.read([key.encode()])
                        return None if values is None else int(values[0])

                    await process.call("read", name, None, read)
                else:
                    value = ctx.rng.randrange(5)

                    async def write(key: str = key, value: int = value, sets: Any = sets) -> None:
                        await sets.set(key.encode(), str(value).encode())

                    await process.call("write", name, value, write)
        finally:
            if reads is not None:
                reads.close()
