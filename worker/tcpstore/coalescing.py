"""The requests of one round's connections, coalesced into few coordinator calls.

Theory of operation. gloo's full-mesh connect has every rank get every other rank's key:
N^2 gets per round, each a WAIT then a GET. Each request used to be a coordinator call of
its own, each paying gRPC's per-call cost and a read barrier. Here the GETs, CHECKs and
MULTI_GETs of all the round's connections, and the WAITs of gloo's full mesh (numbered keys
read in sequence), go to the coordinator together as one MultiGet, one call in flight at a
time (:class:`Reads`). A read is only ever answered by a call that started after it arrived
or by a cache lease still running (``lease_cache.py``), never from values merely kept from an
earlier call (c10d allows overwriting and deleting keys), so a read that follows a completed
write sees it. Other WAITs (and those whose read found keys missing) block on a coordinator
wait shared by the connections waiting on the same keys, answered at once if they exist.
Concurrent ADDs to one key (a store-based barrier's) go as one Add of their sum, each
answered with its running sum (:class:`Adds`), and concurrent SETs of one key to one value as
one Set (:class:`Sets`), which is leased the value it wrote. Every read first waits for the
writes the bridge took before it (:class:`Writes`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rallypoint.client import (
    DeadlineExceededError,
    InvalidArgumentError,
    RallypointError,
    ResourceExhaustedError,
    RoundStore,
)

from .lease_cache import LeaseCache, Prefetch

T = TypeVar("T")

# A WAIT is forwarded in slices of this length until its keys exist or it is cancelled.
WAIT_SLICE_S = 30.0
# How long a coalesced read waits for the other connections' reads before its call.
LINGER_S = 0.001


def resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _cancel_unanswered(requests: Sequence[tuple[object, asyncio.Future[Any]]]) -> None:
    for _, future in requests:
        if not future.done():
            future.cancel()


# A coalesced read waiting for its call: its keys, whether to ask for a lease, its answer.
_Read = tuple[tuple[bytes, ...], bool, asyncio.Future[list[bytes] | None]]


@dataclass(eq=False, slots=True)
class _SharedWait:
    """One coordinator wait shared by the connections waiting on the same keys."""

    task: asyncio.Task[list[bytes]] = field(init=False)
    # How many connections await it.
    waiters: int = 0
    # Whether its call went out: a connection joining after that may not take its values.
    sent: bool = False


class Reads:
    """The reads of every connection of one round, coalesced into MultiGet calls, and
    answered from cache leases while they last.

    One call in flight at a time; the reads that arrive while it runs wait for the next one,
    which carries them all (identical groups once). So every read is answered from a call
    that started after the read arrived, or from a lease (below) running when it is
    answered: as linearizable as a Get of its own, at a fraction of the calls. A read is a
    group of keys, answered with all their values or None. Before a call, reads fewer than
    the open connections linger up to ``LINGER_S`` for the others (answered together, the
    connections tend to ask again together).

    Blocking waits on keys still missing are shared too: one coordinator wait per distinct
    group of keys (a MultiGet held until they all exist, on the batch stream), however many
    connections wait on it. Its values answer the connections that joined it before its call
    was sent (the member read them after they arrived); for one that joined later its end
    only says "look again": that caller then reads (coalesced) to see the keys exist now.

    Cache leases (``coordinator/service/store_cache.py``): the calls ask the leader for a lease
    on the values they read (not for the counters an ADD of 0 reads: a barrier's adds would
    wait for it), and while one lasts, counted from before its call was sent, a read of
    those keys is answered from it without a call: the leader changes none of them until
    it ended. gloo's full mesh reads every key once per rank of the node and each get
    three times; with leases a node's bridge calls once per key, and with prefetching
    (``PREFETCH_KEYS``: a call missing ``<prefix><n>`` right after a leased read of
    ``<prefix><n-1>`` also reads, with leases, the keys numbered after it that the bridge
    does not hold) once per few dozen keys. A prefetched value is a leased read like any
    other, answering only reads that arrive while its lease runs; a prefetch the
    coordinator refuses (too large, a key too long) is dropped and the call made again
    without it.

    Invariant: ``_pending`` is empty unless ``_flushing`` runs (or is about to).
    """

    def __init__(self, store: RoundStore, open_connections: Callable[[], int]) -> None:
        self.store = store
        self._open_connections = open_connections
        self._pending: list[_Read] = []
        self._flushing: asyncio.Task[None] | None = None
        # Set while a call lingers; resolved early once every open connection has a read.
        self._full: asyncio.Future[None] | None = None
        # The shared blocking waits, by group of keys.
        self._waits: dict[tuple[bytes, ...], _SharedWait] = {}
        # The values leased to this round's reads, and what to read ahead with leases.
        self.cache = LeaseCache()
        self._prefetch = Prefetch(self.cache)

    def read(
        self, keys: Sequence[bytes], *, lease: bool = True
    ) -> asyncio.Future[list[bytes] | None]:
        """The keys' values (None if one is missing) from a lease still running or the next
        call; ``lease``: ask that call for a lease on them."""
        future: asyncio.Future[list[bytes] | None] = asyncio.get_running_loop().create_future()
        if not keys:
            future.set_result([])  # torch's check([]) and wait([]): nothing to read
            return future
        held = self.cache.leased(keys)
        if held is not None:
            future.set_result(held)
            return future
        self._pending.append((tuple(keys), lease, future))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush())
        elif self._full is not None and len(self._pending) >= self._open_connections():
            resolve(self._full)
        return future

    async def wait(self, keys: Sequence[bytes]) -> list[bytes] | None:
        """Once the shared coordinator wait on ``keys`` ends: their values if this caller
        joined it before its call went out, else None ("look again"; see the class doc)."""
        group = tuple(keys)
        shared = self._waits.get(group)
        if shared is None or shared.task.done():
            shared = self._waits[group] = _SharedWait()
            shared.task = asyncio.create_task(self._wait(group, shared))
        trusted = not shared.sent
        shared.waiters += 1
        try:
            values = await asyncio.shield(shared.task)
        finally:
            shared.waiters -= 1
            if self._waits.get(group) is shared and shared.waiters == 0:
                del self._waits[group]
                shared.task.cancel()  # nobody waits on it any more
        return values if trusted else None

    async def _wait(self, keys: tuple[bytes, ...], shared: _SharedWait) -> list[bytes]:
        while True:
            shared.sent = True
            started = time.monotonic()
            try:
                ((values, lease_s),) = await self.store.read_leased([keys], wait_s=WAIT_SLICE_S)
            except DeadlineExceededError:
                continue  # the answer of an ended slice came late: the next slice
            if values is not None:
                self.cache.keep(keys, values, started, lease_s)
                return values

    def in_sequence(self, keys: Sequence[bytes]) -> bool:
        """Whether a read of ``keys`` would read ahead (``Prefetch``): one numbered key
        whose predecessor this bridge read with a lease, as gloo's full mesh reads."""
        return self._prefetch.in_sequence(keys)

    def _not_leased(self, reads: list[_Read]) -> list[_Read]:
        """Answer the reads a running lease covers; the others."""
        if not self.cache:
            return reads
        left = []
        for read in reads:
            held = self.cache.leased(read[0])
            if held is None:
                left.append(read)
            elif not read[2].done():
                read[2].set_result(held)
        return left

    def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
        for _, _, future in self._pending:
            future.cancel()
        self._pending = []
        for shared in self._waits.values():
            shared.task.cancel()
        self._waits = {}
        self.cache.clear()

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            if len(self._pending) < self._open_connections():
                full = self._full = loop.create_future()
                timer = loop.call_later(LINGER_S, resolve, full)
                try:
                    await full
                finally:
                    timer.cancel()
                    self._full = None
            # A lease that came with the previous call answers the reads that arrived
            # during it (the other ranks of the node reading the same key).
            batch, self._pending = self._not_leased(self._pending), []
            if not batch:
                continue
            try:
                await self._answer(batch)
            finally:
                # Only if the call itself was cancelled.
                _cancel_unanswered([(keys, future) for keys, _, future in batch])

    async def _answer(self, batch: list[_Read], prefetch: bool = True) -> None:
        groups: dict[tuple[bytes, ...], int] = {}
        lease: list[bool] = []
        for keys, wanted, _ in batch:
            at = groups.setdefault(keys, len(groups))
            if at == len(lease):
                lease.append(wanted)
            elif wanted:
                lease[at] = True
        following = self._prefetch.following(groups, lease) if prefetch else {}
        for key in following:
            groups[(key,)] = len(lease)
            lease.append(True)
        started = time.monotonic()
        try:
            answer = await self.store.read_leased(list(groups), lease=lease)
        except (InvalidArgumentError, ResourceExhaustedError) as error:
            if following:
                # The prefetch was at fault (a key too long, values too large): without it.
                self._prefetch.refused(set(following.values()))
                await self._answer(batch, prefetch=False)
                return
            if len(groups) == 1:
                self._fail(batch, error)
                return
            # A bad key or an answer too large for one call: half the batch in each call,
            # so only the reads at fault fail.
            half = len(batch) // 2
            await self._answer(batch[:half], prefetch=False)
            await self._answer(batch[half:], prefetch=False)
            return
        except RallypointError as error:
            self._fail(batch, error)
            return
        for keys, (values, lease_s) in zip(groups, answer, strict=True):
            if values is not None:
                self.cache.keep(keys, values, started, lease_s)
        if prefetch:
            self._prefetch.learn(groups, answer)
        for keys, _, future in batch:
            if not future.done():
                future.set_result(answer[groups[keys]][0])

    @staticmethod
    def _fail(
        batch: list[_Read],
        error: RallypointError,
    ) -> None:
        for _, _, future in batch:
            if not future.done():
                future.set_exception(error)


class Adds:
    """Concurrent ADDs to one key, combined into one coordinator Add (a barrier's N adds).

    One call per key in flight at a time; the adds that arrive meanwhile go together in the
    next, as one Add of their deltas' sum. The combined add is one atomic write, so giving
    its parts the running sums up to its total (in arrival order) answers each as if they
    had been applied one after another at that point, which lies inside every part's own
    call: linearizable, as combining counters are. If the combined call fails, each part
    is retried alone, so each gets its own answer or error (an overflow of the sum is not
    an error of the parts).
    """

    def __init__(self, store: RoundStore) -> None:
        self.store = store
        # The adds waiting for the next call, by key; a key is here while its flush runs.
        self._pending: dict[bytes, list[tuple[int, asyncio.Future[int]]]] = {}
        self._flushing: set[asyncio.Task[None]] = set()

    async def add(self, key: bytes, delta: int) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        parts = self._pending.get(key)
        if parts is None:
            self._pending[key] = [(delta, future)]
            task = asyncio.create_task(self._flush(key))
            self._flushing.add(task)  # referenced until done
            task.add_done_callback(self._flushing.discard)
        else:
            parts.append((delta, future))
        return await future

    async def _flush(self, key: bytes) -> None:
        try:
            while parts := self._pending.get(key):
                # Later adds wait for the next call: the entry stays while this one runs.
                self._pending[key] = []
                try:
                    await self._combine(key, parts)
                finally:
                    _cancel_unanswered(parts)  # only if the call itself was cancelled
        finally:
            _cancel_unanswered(self._pending.pop(key, []))

    async def _combine(self, key: bytes, parts: list[tuple[int, asyncio.Future[int]]]) -> None:
        if len(parts) > 1:
            try:
                total = await self.store.add(key, sum(delta for delta, _ in parts))
            except RallypointError:
                pass  # each part on its own below, for its own answer or error
            else:
                value = total - sum(delta for delta, _ in parts)
                for delta, future in parts:
                    value += delta
                    if not future.done():
                        future.set_result(value)
                return
        for delta, future in parts:
            try:
                value = await self.store.add(key, delta)
            except RallypointError as error:
                if not future.done():
                    future.set_exception(error)
            else:
                if not future.done():
                    future.set_result(value)


class Sets:
    """Concurrent SETs of one key to one value, combined into one coordinator Set (c10d's
    store-based barrier has every rank that reads the full count set the same last-worker
    key to the same value: on a node of 8 ranks, up to 8 writes through Raft).

    The identical sets that arrive before their call is sent (the rest of the loop turn that
    took the first) go as one call; one arriving later starts a call of its own, at once,
    beside any in flight (waiting for one would put a round trip on every rank's path). A
    call starts after each of its parts arrived and ends before any is answered, so its one
    write lies inside every part's own interval: each part is linearized at it, one right
    after the other (writing the same value twice in a row leaves what writing it once
    does). A part is never answered by a call sent before it arrived: another bridge may
    have written the key in between. A failed call fails each part with its error (the
    parts are the same request). Sets of a key to different values are not combined.

    With a ``cache`` (the round's :class:`LeaseCache`), each call asks the leader for a lease
    on the value it wrote (``RoundStore.set_leased``) and keeps what it grants, counted from
    before the call was sent: the barrier's ranks then wait for the key they just set, and
    the bridge answers those waits itself.
    """

    def __init__(self, store: RoundStore, cache: LeaseCache | None = None) -> None:
        self.store = store
        self._cache = cache
        # The sets whose call is not sent yet, by (key, value).
        self._pending: dict[tuple[bytes, bytes], list[asyncio.Future[None]]] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def set(self, key: bytes, value: bytes) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        write = (key, value)
        parts = self._pending.get(write)
        if parts is None:
            self._pending[write] = [future]
            task = asyncio.create_task(self._call(write))
            self._calls.add(task)  # referenced until done
            task.add_done_callback(self._calls.discard)
        else:
            parts.append(future)
        await future

    async def _call(self, write: tuple[bytes, bytes]) -> None:
        # The task's first step, a loop turn after the first part: the parts are taken now.
        parts = self._pending.pop(write)
        try:
            if self._cache is None:
                await self.store.set(*write)
            else:
                started = time.monotonic()
                lease_s = await self.store.set_leased(*write)
                self._cache.keep((write[0],), (write[1],), started, lease_s)
        except RallypointError as error:
            for future in parts:
                if not future.done():
                    future.set_exception(error)
        else:
            for future in parts:
                resolve(future)
        finally:
            _cancel_unanswered([(write, future) for future in parts])


class Writes:
    """The writes the bridge took and has not finished, on any of its connections.

    torch's SET, APPEND and MULTI_SET send no answer: the worker's call returns once the
    request is sent, and TCPStore's one server applies requests in the order they arrive, so
    a read sent after that (by this worker or by another it told, through a collective say)
    sees the write. The bridge serves its connections concurrently, and a coalesced read
    can overtake a write still on its way through Raft; so every read first waits for the
    writes taken before it arrived (not for later ones)."""

    def __init__(self) -> None:
        self._pending: set[asyncio.Future[None]] = set()

    async def run(self, write: Awaitable[T]) -> T:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.add(done)
        try:
            return await write
        finally:
            self._pending.discard(done)
            done.set_result(None)

    def busy(self) -> bool:
        """Whether a write taken is still unfinished."""
        return bool(self._pending)

    async def settled(self) -> None:
        """Once every write taken before this call has finished (failed ones included)."""
        if self._pending:
            await asyncio.wait(list(self._pending))
