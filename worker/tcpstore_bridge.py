"""Serves torch's TCPStore wire protocol on a local port, backed by a coordinator round store.

Theory of operation. Under torchrun, a worker's ``init_process_group()`` (``env://``) opens a
``TCPStore`` client to ``MASTER_ADDR:MASTER_PORT``; with ``TORCHELASTIC_USE_AGENT_STORE=True``
it assumes the agent serves that address and never starts a server of its own. The rallypoint
torchrun handler sets that flag and hands each agent's workers the address of a
:class:`TCPStoreBridge` in that agent: every request the workers make is forwarded to the
round store of the agent's current round (rendezvous.proto, service RoundStore). So the
workers' store is replicated by the coordinator cluster, no worker connects to another
node's host, and a round's keys vanish with the round.

One listening port per round: :meth:`TCPStoreBridge.serve_round` opens a fresh port bound to
the new round's store and closes the previous one with its connections, so a worker of an
earlier round can never read or write the new round's keys (and the coordinator refuses its
old round anyway). The port is any free one, or, with a :class:`PortRange` (a firewall's
opening), a free one of the range in random order, the previous round's last; a range of one
port serves every round on it, one after the other. A request the coordinator refuses (the
round ended, a limit) closes the connection: the worker's store call fails at once instead of
waiting out its timeout.

The protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp; checked against the client of
the installed torch by tests/worker/test_torchrun.py): a one-byte query type, then arguments;
strings and byte strings are a little-endian u64 length and the bytes, counts are u64,
integers i64. VALIDATE carries a u32 magic number and has no answer; PING echoes its u32
nonce. WAIT answers STOP_WAITING once every key exists; the client sends CANCEL_WAIT when its
own timeout passes and expects WAIT_CANCELED (possibly after a STOP_WAITING that crossed it).
GET and MULTI_GET follow a WAIT on the same keys. The queue and key-listing queries are not
served (torch's process groups do not use them): they close the connection.

Reads are coalesced (:class:`_Reads`): a worker's get is a WAIT then a GET, and gloo's
full-mesh connect has every rank get every other rank's key, N^2 gets per round. Each
request used to be a coordinator call of its own, each paying gRPC's per-call cost and a
read barrier; now the WAITs (their first look), GETs, CHECKs and MULTI_GETs of all the
round's connections go to the coordinator together as one MultiGet, one call in flight at a
time. A read is only ever answered by a call that started after it arrived or by a cache
lease still running (below), never from values merely kept from an earlier call (c10d allows
overwriting and deleting keys), so a read that follows a completed write sees it. A WAIT
whose keys are missing blocks on a coordinator Wait shared by the connections waiting on the
same keys, then looks again. Concurrent ADDs to one key (a store-based barrier's) go as one
Add of their sum, each answered with its running sum (:class:`_Adds`). Reads go to the
client's preferred member (the leader once found) on one ``RoundStore/Batch`` stream: the
leader serves them under its lease without a round trip, which measured faster than
spreading them over followers (each of whose read barriers is a ReadIndex forwarded to the
leader). The leader leases the values it reads to the bridge for a second
(``coordinator/service/store_cache.py``): a read those leases cover is answered without a
call, and a read that misses a numbered key right after a read of the key numbered before it
prefetches the keys numbered after it, so gloo's N^2 gets cost a node a call per few dozen
keys. Each connection is an ``asyncio.Protocol``: queries are parsed as the socket delivers
them, and a leased read is answered there and then, with no task or await (see
:class:`_Connection`).

The bridge runs its own event loop thread and its own coordinator client, apart from the
agent's participant, so a burst of worker store traffic never delays the agent's
heartbeats.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import random
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rallypoint.client import (
    Client,
    DeadlineExceededError,
    InvalidArgumentError,
    RallypointError,
    ResourceExhaustedError,
    RoundStore,
    TlsConfig,
)
from rallypoint.client.tasks import cancel_and_wait

T = TypeVar("T")

log = logging.getLogger("rallypoint.worker.tcpstore_bridge")

VALIDATION_MAGIC = 0x3C85F7CE
# A WAIT is forwarded in slices of this length until its keys exist or it is cancelled.
WAIT_SLICE_S = 30.0
# How long a coalesced read waits for the other connections' reads before its call.
LINGER_S = 0.001
# A read missing a key that ends in a number (``<prefix><n>``: gloo's full mesh reads
# ``0//cpu//0/0``, ``.../1``, ... in order, every rank of a node in step), after a leased
# read of ``<prefix><n-1>``, also asks with leases for the keys that follow
# (``<prefix><n+1>``, ...): up to this many, fewer once the prefix's values are known to be
# large, so at most about PREFETCH_BYTES.
PREFETCH_KEYS = 32
PREFETCH_BYTES = 256 * 1024
# Leased values are swept of ended leases once this many are held (and at twice what was
# left after the last sweep).
_SWEEP_LEASED = 4096

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
# A connection stops reading its socket while this many bytes of queries wait behind one
# being answered.
_BUFFER_BYTES = 256 * 1024


class Query(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13


class CheckResponse(enum.IntEnum):
    READY = 0
    NOT_READY = 1


class WaitResponse(enum.IntEnum):
    STOP_WAITING = 0
    WAIT_CANCELED = 1


class ProtocolError(Exception):
    """The peer sent something this bridge does not serve."""


class _Short(Exception):
    """The buffer holds only part of a query: read more, then parse it again."""


class _Parser:
    """Reads one query's arguments from what the socket has delivered, with no await: a
    query is parsed whole or not at all (``_Short``), so its handler never waits mid-query."""

    def __init__(self, buffer: bytearray) -> None:
        self.buffer = buffer
        self.at = 0

    def value(self, form: struct.Struct) -> int:
        end = self.at + form.size
        if end > len(self.buffer):
            raise _Short
        (value,) = form.unpack_from(self.buffer, self.at)
        self.at = end
        return int(value)

    def data(self) -> bytes:
        length = self.value(_U64)
        end = self.at + length
        if end > len(self.buffer):
            raise _Short
        value = bytes(self.buffer[self.at : end])
        self.at = end
        return value

    def keys(self) -> list[bytes]:
        return [self.data() for _ in range(self.value(_U64))]

    def pairs(self) -> list[tuple[bytes, bytes]]:
        return [(self.data(), self.data()) for _ in range(self.value(_U64))]


# The reads :meth:`_Connection.answer_leased` may answer from leases (ADD of 0 only).
_LEASABLE = frozenset({Query.GET, Query.WAIT, Query.CHECK, Query.MULTI_GET, Query.ADD})


def _parse(buffer: bytearray) -> tuple[Query, tuple[Any, ...], int]:
    """The first query in ``buffer``: its type, arguments and length in bytes."""
    parser = _Parser(buffer)
    code = parser.value(_U8)
    try:
        query = Query(code)
    except ValueError:
        raise ProtocolError(f"query type {code} is not served") from None
    arguments: tuple[Any, ...]
    if query in (Query.VALIDATE, Query.PING):
        arguments = (parser.value(_U32),)
    elif query in (Query.GET, Query.DELETE_KEY):
        arguments = (parser.data(),)
    elif query in (Query.SET, Query.APPEND):
        arguments = (parser.data(), parser.data())
    elif query is Query.COMPARE_SET:
        arguments = (parser.data(), parser.data(), parser.data())
    elif query is Query.ADD:
        arguments = (parser.data(), parser.value(_I64))
    elif query in (Query.CHECK, Query.WAIT, Query.MULTI_GET):
        arguments = (parser.keys(),)
    elif query is Query.MULTI_SET:
        arguments = (parser.pairs(),)
    elif query in (Query.CANCEL_WAIT, Query.GETNUMKEYS):
        arguments = ()
    else:
        raise ProtocolError(f"query type {query.name} is not served")
    return query, arguments, parser.at


def _data(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


def _decimal(value: bytes) -> int | None:
    """``value`` as the coordinator's Add reads a counter (ASCII digits, an optional minus,
    within int64), or None."""
    digits = value[1:] if value.startswith(b"-") else value
    if not (digits and digits.isdigit() and digits.isascii()):
        return None
    number = int(value)
    return number if -(2**63) <= number < 2**63 else None


def _numbered(key: bytes) -> tuple[bytes, int] | None:
    """``key`` as ``<prefix><n>`` (a decimal number without leading zeros at its end), or
    None."""
    end = len(key)
    start = end
    while start > 0 and 0x30 <= key[start - 1] <= 0x39:
        start -= 1
    if start == end or (key[start] == 0x30 and end - start > 1) or end - start > 18:
        return None
    return key[:start], int(key[start:])


def _resolve(future: asyncio.Future[None]) -> None:
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


class _Reads:
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
        # Leased values: key -> (value, when its lease ends on time.monotonic()).
        self._leased: dict[bytes, tuple[bytes, float]] = {}
        self._sweep_at = _SWEEP_LEASED
        # How many keys to prefetch after a numbered key, by prefix (learnt from value sizes).
        self._prefetch: dict[bytes, int] = {}

    def read(
        self, keys: Sequence[bytes], *, lease: bool = True
    ) -> asyncio.Future[list[bytes] | None]:
        """The keys' values (None if one is missing) from a lease still running or the next
        call; ``lease``: ask that call for a lease on them."""
        future: asyncio.Future[list[bytes] | None] = asyncio.get_running_loop().create_future()
        if not keys:
            future.set_result([])  # torch's check([]) and wait([]): nothing to read
            return future
        held = self.leased(keys)
        if held is not None:
            future.set_result(held)
            return future
        self._pending.append((tuple(keys), lease, future))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush())
        elif self._full is not None and len(self._pending) >= self._open_connections():
            _resolve(self._full)
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
                self._keep(keys, values, started, lease_s)
                return values

    def _not_leased(self, reads: list[_Read]) -> list[_Read]:
        """Answer the reads a running lease covers; the others."""
        if not self._leased:
            return reads
        left = []
        for read in reads:
            held = self.leased(read[0])
            if held is None:
                left.append(read)
            elif not read[2].done():
                read[2].set_result(held)
        return left

    def leased(self, keys: Sequence[bytes]) -> list[bytes] | None:
        """The keys' values if a lease on each still runs, else None."""
        leased = self._leased
        if not leased:
            return None
        now = time.monotonic()
        values = []
        for key in keys:
            held = leased.get(key)
            if held is None or held[1] <= now:
                return None
            values.append(held[0])
        return values

    def _keep(
        self, keys: Sequence[bytes], values: Sequence[bytes], started: float, lease_s: float
    ) -> None:
        """Hold ``values`` for ``lease_s`` (0: no lease) from ``started``, before their call."""
        if lease_s <= 0:
            return
        ends = started + lease_s
        leased = self._leased
        for key, value in zip(keys, values, strict=True):
            leased[key] = (value, ends)
        if len(leased) >= self._sweep_at:
            now = time.monotonic()
            for key in [key for key, (_, until) in leased.items() if until <= now]:
                del leased[key]
            self._sweep_at = max(_SWEEP_LEASED, 2 * len(leased))

    def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
        for _, _, future in self._pending:
            future.cancel()
        self._pending = []
        for shared in self._waits.values():
            shared.task.cancel()
        self._waits = {}
        self._leased = {}

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            if len(self._pending) < self._open_connections():
                full = self._full = loop.create_future()
                timer = loop.call_later(LINGER_S, _resolve, full)
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
        following = self._following(groups, lease) if prefetch else {}
        for key in following:
            groups[(key,)] = len(lease)
            lease.append(True)
        started = time.monotonic()
        try:
            answer = await self.store.read_leased(list(groups), lease=lease)
        except (InvalidArgumentError, ResourceExhaustedError) as error:
            if following:
                # The prefetch was at fault (a key too long, values too large): without it.
                for prefix in set(following.values()):
                    self._prefetch[prefix] = 0
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
                self._keep(keys, values, started, lease_s)
        if prefetch:
            self._learn(groups, answer)
        for keys, _, future in batch:
            if not future.done():
                future.set_result(answer[groups[keys]][0])

    def _following(
        self, groups: dict[tuple[bytes, ...], int], lease: list[bool]
    ) -> dict[bytes, bytes]:
        """The keys to prefetch with these groups, each with its prefix: after each leased
        read of one numbered key ``<prefix><n>`` whose predecessor ``<prefix><n-1>`` this
        bridge read with a lease (keys read in sequence, as gloo's are), the keys
        ``<prefix><n+1>``, ... that no lease holds, up to the prefix's count."""
        following: dict[bytes, bytes] = {}
        for keys, at in groups.items():
            if len(keys) != 1 or not lease[at]:
                continue
            numbered = _numbered(keys[0])
            if numbered is None:
                continue
            prefix, number = numbered
            if prefix + b"%d" % (number - 1) not in self._leased:
                continue  # not read in sequence: no prefetch
            count = self._prefetch.get(prefix, PREFETCH_KEYS)
            for n in range(number + 1, number + 1 + count):
                key = prefix + b"%d" % n
                if (key,) not in groups and key not in following and self.leased((key,)) is None:
                    following[key] = prefix
        return following

    def _learn(
        self,
        groups: dict[tuple[bytes, ...], int],
        answer: Sequence[tuple[list[bytes] | None, float]],
    ) -> None:
        """Set how many keys to prefetch after each numbered key read: about
        ``PREFETCH_BYTES`` of values of the size its prefix's keys hold (none, for good,
        after a prefix whose prefetch the coordinator refused)."""
        sizes: dict[bytes, int] = {}
        for keys, at in groups.items():
            values = answer[at][0]
            if values is None or len(keys) != 1:
                continue
            numbered = _numbered(keys[0])
            if numbered is not None:
                prefix = numbered[0]
                sizes[prefix] = max(sizes.get(prefix, 0), len(values[0]))
        for prefix, size in sizes.items():
            if self._prefetch.get(prefix) != 0:
                self._prefetch[prefix] = max(1, min(PREFETCH_KEYS, PREFETCH_BYTES // max(1, size)))

    @staticmethod
    def _fail(
        batch: list[_Read],
        error: RallypointError,
    ) -> None:
        for _, _, future in batch:
            if not future.done():
                future.set_exception(error)


class _Adds:
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


class _Writes:
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


class _Connection(asyncio.Protocol):
    """One worker's TCPStore client, served against one round's store.

    An ``asyncio.Protocol``: the queries are parsed as the socket delivers them, in
    :meth:`data_received`, and a read that running leases answer (most of gloo's bootstrap)
    is answered there and then, with no task, future or await. The first query that needs
    the coordinator starts a task (``serving``) that answers it and then every query behind
    it, in order, until the buffer holds no whole query; while it runs, data received only
    joins the buffer (reading pauses past ``_BUFFER_BYTES``). So the answers go out in the
    order the queries came, as the worker's client expects.

    ``closed`` is resolved once the socket closed and the task serving it (if any) ended.
    """

    def __init__(self, store: RoundStore, reads: _Reads, adds: _Adds, writes: _Writes) -> None:
        self.store = store
        self.reads = reads
        self.adds = adds
        self.writes = writes
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.buffer = bytearray()
        # The task answering queries that need the coordinator (None when none is).
        self.serving: asyncio.Task[None] | None = None
        # The WAIT being served. Invariant: at most one (the client sends one query at a
        # time, and only CANCEL_WAIT may follow a WAIT before its answer).
        self.waiting: asyncio.Task[None] | None = None
        # Set while the transport's write buffer is full (the worker does not read).
        self._writable: asyncio.Future[None] | None = None
        self._lost = False
        self._reading_paused = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # --- the transport's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.serving is not None:
            if len(self.buffer) > _BUFFER_BYTES and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
            return
        try:
            while self._writable is None:
                parsed = self._next()
                if parsed is None:
                    return
                if not self.answer_leased(*parsed):
                    self.serving = asyncio.create_task(self._serve(parsed))
                    return
            # The worker does not read its answers: serve the rest once it does.
            self.serving = asyncio.create_task(self._serve(None))
        except ProtocolError as error:
            self._close(error)

    def eof_received(self) -> bool | None:
        if self.buffer and self.serving is None:
            log.warning("closing the store connection of %s: it ended within a query", self.peer)
        return None  # close the transport

    def connection_lost(self, error: Exception | None) -> None:
        self._lost = True
        if self.waiting is not None:
            self.waiting.cancel()
        if self._writable is not None:
            _resolve(self._writable)
        if self.serving is None:
            _resolve(self.closed)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None:
            _resolve(writable)

    # --- serving

    def _next(self) -> tuple[Query, tuple[Any, ...]] | None:
        """The next whole query, taken from the buffer, or None."""
        try:
            query, arguments, length = _parse(self.buffer)
        except _Short:
            if self._reading_paused:
                self._reading_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]
            return None
        del self.buffer[:length]
        return query, arguments

    async def _serve(self, parsed: tuple[Query, tuple[Any, ...]] | None) -> None:
        """Answer ``parsed`` and the queries behind it until the buffer holds no whole one."""
        try:
            while not self._lost:
                if parsed is not None and not self.answer_leased(*parsed):
                    await self.answer(*parsed)
                if self._writable is not None:
                    await self._writable
                parsed = self._next()
                if parsed is None:
                    return
        except (RallypointError, ProtocolError) as error:
            self._close(error)
        except BaseException:
            self.close()  # the worker must not wait for an answer that will not come
            raise
        finally:
            self.serving = None
            if self._lost:
                _resolve(self.closed)

    def _close(self, error: Exception) -> None:
        if isinstance(error, RallypointError):
            log.warning(
                "store %s refused a request of %s: %s", self.store.namespace, self.peer, error
            )
        else:
            log.warning("closing the store connection of %s: %s", self.peer, error)
        self.close()

    def write(self, data: bytes) -> None:
        """Send ``data`` to the worker (nothing once the connection is closing)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def get(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys' values from the next coalesced read; a missing key fails the request."""
        await self.writes.settled()
        values = await self.reads.read(keys)
        if values is None:
            missing = ", ".join(repr(key) for key in keys)
            raise DeadlineExceededError(f"{self.store.namespace}: a key of {missing} is missing")
        return values

    def answer_leased(self, query: Query, arguments: tuple[Any, ...]) -> bool:
        """Answer a read at once, with no task or future, if running leases hold every key
        it needs and no write of this bridge is in flight (a read waits for those: see
        ``_Writes``); False if it must be served by :meth:`answer`. Most of gloo's
        bootstrap requests end here."""
        if self.writes.busy() or query not in _LEASABLE:
            return False
        if query is Query.ADD and arguments[1] != 0:
            return False
        keys = (arguments[0],) if query is Query.GET or query is Query.ADD else arguments[0]
        held = self.reads.leased(keys) if keys else None
        if held is None:
            return False
        if query is Query.GET:
            self.write(_data(held[0]))
        elif query is Query.ADD:
            count = _decimal(held[0])
            if count is None:
                return False
            self.write(_I64.pack(count))
        elif query is Query.WAIT:
            if self.waiting is not None and not self.waiting.done():
                raise ProtocolError("a WAIT arrived while another was pending")
            self.write(_U8.pack(WaitResponse.STOP_WAITING))
        elif query is Query.CHECK:
            self.write(_U8.pack(CheckResponse.READY))
        else:
            self.write(b"".join(_data(value) for value in held))
        return True

    async def answer(self, query: Query, arguments: tuple[Any, ...]) -> None:
        store, write, writes = self.store, self.write, self.writes
        if query is Query.VALIDATE:
            (magic,) = arguments
            if magic != VALIDATION_MAGIC:
                raise ProtocolError(f"bad validation number {magic:#x}")
        elif query is Query.PING:
            write(_U32.pack(arguments[0]))
        elif query is Query.SET:
            await writes.run(store.set(*arguments))
        elif query is Query.COMPARE_SET:
            key, expected, desired = arguments
            result = await writes.run(store.compare_set(key, expected, desired))
            # torch's answer for an absent key with a non-empty expectation is the expectation.
            write(_data(expected if result.value is None else result.value))
        elif query is Query.GET:
            write(_data((await self.get(arguments))[0]))
        elif query is Query.ADD:
            key, delta = arguments
            value = await self.counter(key) if delta == 0 else None
            if value is None:
                value = await writes.run(self.adds.add(key, delta))
            write(_I64.pack(value))
        elif query is Query.CHECK:
            await writes.settled()
            ready = await self.reads.read(arguments[0]) is not None
            write(_U8.pack(CheckResponse.READY if ready else CheckResponse.NOT_READY))
        elif query is Query.WAIT:
            self.start_wait(arguments[0])
        elif query is Query.CANCEL_WAIT:
            await self.cancel_wait()
            write(_U8.pack(WaitResponse.WAIT_CANCELED))
        elif query is Query.GETNUMKEYS:
            await writes.settled()
            write(_I64.pack(await store.num_keys()))
        elif query is Query.DELETE_KEY:
            write(_I64.pack(1 if await writes.run(store.delete(*arguments)) else 0))
        elif query is Query.APPEND:
            await writes.run(self.append(*arguments))
        elif query is Query.MULTI_GET:
            (keys,) = arguments
            if keys:
                write(b"".join(_data(value) for value in await self.get(keys)))
        elif query is Query.MULTI_SET:
            await writes.run(store.multi_set(arguments[0]))

    async def counter(self, key: bytes) -> int | None:
        """An ADD of 0 answered by a read: the integer at ``key`` from the next coalesced read
        (c10d's store-based barrier reads its count so, every rank at once). Adding 0 to an
        integer that exists changes nothing, so the read's answer is the add's, at a point
        inside the request. None when the key is missing or holds no integer: then the add
        itself runs (creating the key, or failing as the coordinator says)."""
        await self.writes.settled()
        values = await self.reads.read([key], lease=False)
        return None if values is None else _decimal(values[0])

    def start_wait(self, keys: Sequence[bytes]) -> None:
        if self.waiting is not None and not self.waiting.done():
            raise ProtocolError("a WAIT arrived while another was pending")
        self.waiting = asyncio.create_task(self.wait_for(keys))

    async def wait_for(self, keys: Sequence[bytes]) -> None:
        """Answer STOP_WAITING once every key exists: by the next coalesced read (the usual
        case: a WAIT precedes every GET), else by the shared coordinator wait on them (or a
        read after it, for a connection that joined it late), until the WAIT is cancelled."""
        try:
            await self.writes.settled()
            found = await self.reads.read(keys)
            while found is None:
                found = await self.reads.wait(keys)
                if found is None:  # joined a wait already sent: look again
                    found = await self.reads.read(keys)
        except RallypointError as error:
            # The reader is blocked on the socket: closing it ends the worker's wait now.
            log.warning("store %s refused a wait: %s", self.store.namespace, error)
            self.close()
            return
        self.write(_U8.pack(WaitResponse.STOP_WAITING))

    async def cancel_wait(self) -> None:
        task, self.waiting = self.waiting, None
        if task is not None and not task.done():
            await cancel_and_wait(task)

    async def append(self, key: bytes, value: bytes) -> None:
        """Append by compare-and-set, retried until no other writer came in between."""
        current = b""
        while True:
            result = await self.store.compare_set(key, current, current + value)
            if result.swapped:
                return
            current = result.value or b""


@dataclass(frozen=True, slots=True)
class PortRange:
    """The TCP ports a listener may use, ``low`` to ``high`` inclusive."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high <= 65535:
            raise ValueError(f"port range {self.low}-{self.high}: need 1 <= LOW <= HIGH <= 65535")

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def __len__(self) -> int:
        return self.high - self.low + 1

    @staticmethod
    def parse(text: str, setting: str = "port range") -> PortRange:
        """``LOW-HIGH`` (or one ``PORT``); a ValueError naming ``setting`` otherwise."""
        low, sep, high = text.strip().partition("-")
        try:
            port_range = PortRange(int(low), int(high if sep else low))
        except ValueError:
            raise ValueError(
                f"{setting}={text!r}: expected LOW-HIGH, two ports from 1 to 65535 with "
                "LOW <= HIGH (for example 29500-29599)"
            ) from None
        return port_range

    def candidates(self, rng: random.Random, last: int = 0) -> list[int]:
        """Every port of the range in random order, ``last`` (if in it) at the end."""
        ports = [port for port in range(self.low, self.high + 1) if port != last]
        rng.shuffle(ports)
        if self.low <= last <= self.high:
            ports.append(last)
        return ports


class NoFreePortError(OSError):
    """Every port of the range was in use."""


class StoreBridge:
    """The bridge's serving part on the running event loop, over a ``client`` it does not
    own (connected or not: the session opens with the first store call). One round at a time,
    as :class:`TCPStoreBridge` (which runs one of these on a thread of its own); for a program
    already on asyncio, or many bridges on one loop (``bench.store_load``)."""

    def __init__(
        self,
        client: Client,
        *,
        host: str = "127.0.0.1",
        port_range: PortRange | None = None,
    ) -> None:
        self.host = host
        self.port_range = port_range
        self._rng = random.Random()
        self._client = client
        # The listener of the current round; None before the first round and after close.
        self._server: asyncio.Server | None = None
        # The coalesced reads of the current round's connections (None when _server is).
        self._reads: _Reads | None = None
        # The connections of the current round's listener.
        self._connections: set[_Connection] = set()
        self.round_number = 0
        self.port = 0

    async def serve_round(self, job: str, round_number: int, participant_id: int) -> int:
        """Stop serving the previous round and serve this one on a fresh port; the port."""
        await self.stop_serving()
        # Reads go to the client's preferred member (the leader, once found) on its
        # RoundStore/Batch stream: the leader answers them under its lease with no round trip,
        # where a follower forwards a ReadIndex to the leader for every barrier. Measured
        # (bench.store_bench, gloo at 256 ranks, 3 members): 18.5-20.5 s on the leader against
        # 33.7-38.1 s spread over the members by participant id.
        store = self._client.round_store(job, round_number, participant_id)
        reads = self._reads = _Reads(store, lambda: len(self._connections))
        adds = _Adds(store)
        writes = _Writes()

        def accept() -> _Connection:
            connection = _Connection(store, reads, adds, writes)
            self._connections.add(connection)
            connection.closed.add_done_callback(lambda _: self._connections.discard(connection))
            return connection

        self._server = await self._listen(accept)
        self.round_number = round_number
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("serving the store of %s to local workers on %s:%d", store, self.host, self.port)
        return self.port

    async def _listen(self, accept: Callable[[], _Connection]) -> asyncio.Server:
        """A listener on a free port: any, or one of ``port_range``."""
        loop = asyncio.get_running_loop()
        if self.port_range is None:
            return await loop.create_server(accept, self.host, 0)
        for port in self.port_range.candidates(self._rng, last=self.port):
            try:
                return await loop.create_server(accept, self.host, port)
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
        raise NoFreePortError(
            f"no free port for the workers' store on {self.host} in {self.port_range}: "
            f"all {len(self.port_range)} are in use"
        )

    async def stop_serving(self) -> None:
        """Close the listener and every connection; a connection's task answering a query
        (if any) ends on its own once its call returns, which cancelling it would not do
        cleanly (a write may be on its way through Raft)."""
        server, self._server = self._server, None
        reads, self._reads = self._reads, None
        if server is not None:
            server.close()
        for connection in self._connections:
            connection.close()
        if self._connections:
            await asyncio.wait([connection.closed for connection in self._connections])
        if server is not None:
            await server.wait_closed()
        if reads is not None:
            reads.close()


class TCPStoreBridge:
    """Serves the TCPStore protocol for one round at a time, from an event loop thread and
    a coordinator client of its own; see the module docstring."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        tls: TlsConfig | None = None,
        timeout_s: float = 10.0,
        port_range: PortRange | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rallypoint-tcpstore-bridge", daemon=True
        )
        self._thread.start()
        # The session opens with the first store call: making a bridge never waits for the
        # coordinator (the agent's own client waits for it, see patience.py).
        self._client = Client(
            list(endpoints),
            token=token,
            tls=tls,
            timeout_s=timeout_s,
            open_session_on_connect=False,
        )
        self._bridge = StoreBridge(self._client, host=host, port_range=port_range)
        self._closed = False
        self._run(self._client.connect())

    @property
    def host(self) -> str:
        return self._bridge.host

    @property
    def port(self) -> int:
        """The current round's port (0 before the first)."""
        return self._bridge.port

    @property
    def round_number(self) -> int:
        return self._bridge.round_number

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def serve_round(self, job: str, round_number: int, participant_id: int) -> int:
        """Stop serving the previous round and serve this one on a fresh port; the port."""
        if self._closed:
            raise RuntimeError("the bridge is closed")
        return self._run(self._bridge.serve_round(job, round_number, participant_id))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._bridge.stop_serving())
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
