"""The TCPStore bridge's coalesced requests: many connections' reads share MultiGet calls,
each answered with its own values, none from a call that started before it arrived;
blocking waits are shared per group of keys; concurrent adds to one key are one combined
add. First against gated fake stores (exact batches), then torch's own TCPStore clients,
concurrently, through a bridge to a fake member over gRPC. (tests/worker/test_torchrun.py
checks the bridge against a real cluster.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any, cast

import pytest
import torch.distributed as dist

from rallypoint.client import (
    AddOverflowError,
    InvalidArgumentError,
    ResourceExhaustedError,
    RoundStore,
)
from rallypoint.client.rendezvous_errors import StaleRoundError
from rallypoint.worker.tcpstore import PREFETCH_BYTES, PREFETCH_KEYS, TCPStoreBridge
from rallypoint.worker.tcpstore.coalescing import Adds, Reads, Sets, Writes
from rallypoint.worker.tcpstore.protocol import Add, Check, Get, MultiGet, Query, Set, Wait
from rallypoint.worker.tcpstore.server import Connection
from tests.coordinator.fake_node import FakeNode, join_round, open_session, served_at, serving


class GatedStore:
    """A round store whose MultiGet answers from the state at the call's start (as the
    member does after its read barrier), once ``gate`` is open."""

    namespace = "j/1"

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.calls: list[list[tuple[bytes, ...]]] = []
        self.waits: list[tuple[bytes, ...]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failure: Exception | None = None
        self.wait_done = asyncio.Event()
        # The cache lease granted on every complete group that asks for one (0: none), and
        # what each call asked for.
        self.lease_s = 0.0
        self.leases_asked: list[list[bool]] = []

    async def read_leased(
        self,
        groups: Sequence[Sequence[bytes]],
        *,
        wait_s: float = 0.0,
        lease: Sequence[bool] | None = None,
    ) -> list[tuple[list[bytes] | None, float]]:
        wanted = [True] * len(groups) if lease is None else list(lease)
        self.leases_asked.append(wanted)
        answer = await self.read_groups(groups, wait_s=wait_s)
        return [
            (values, self.lease_s if values is not None and asked else 0.0)
            for values, asked in zip(answer, wanted, strict=True)
        ]

    async def read_groups(
        self, groups: Sequence[Sequence[bytes]], *, wait_s: float = 0.0
    ) -> list[list[bytes] | None]:
        if wait_s:
            return await self.wait(groups)
        self.calls.append([tuple(group) for group in groups])
        if any(b"" in group for group in groups):
            raise InvalidArgumentError("groups[0].keys[0]: must not be empty")
        snapshot = dict(self.data)
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return [
            [snapshot[key] for key in group] if all(key in snapshot for key in group) else None
            for group in groups
        ]

    async def wait(self, groups: Sequence[Sequence[bytes]]) -> list[list[bytes] | None]:
        """A held MultiGet of one group: its values once ``wait_done`` is set."""
        (keys,) = groups
        self.waits.append(tuple(keys))
        await self.wait_done.wait()
        return [[self.data[key] for key in keys]]


def reads_of(store: GatedStore, connections: int = 1) -> Reads:
    return Reads(cast(RoundStore, store), lambda: connections)


def leasing(data: dict[bytes, bytes], lease_s: float) -> tuple[GatedStore, Reads]:
    """A store holding ``data`` that grants ``lease_s`` leases, and one connection's reads."""
    store = GatedStore()
    store.data = dict(data)
    store.lease_s = lease_s
    return store, reads_of(store)


async def test_reads_arriving_during_a_call_share_the_next_each_with_its_own_answer() -> None:
    store = GatedStore()
    store.data = {b"a": b"1", b"b": b"2", b"c": b"3"}
    reads = reads_of(store)
    store.gate.clear()
    first = reads.read([b"a"])
    await asyncio.sleep(0)
    assert store.calls == [[(b"a",)]]
    # While the first call runs, four reads (two the same group) wait for the next one.
    later = [reads.read(keys) for keys in ([b"b"], [b"c", b"a"], [b"b"], [b"x"])]
    store.gate.set()
    assert await first == [b"1"]
    assert [await future for future in later] == [[b"2"], [b"3", b"1"], [b"2"], None]
    assert store.calls == [[(b"a",)], [(b"b",), (b"c", b"a"), (b"x",)]]


async def test_a_leased_value_answers_reads_without_a_call_until_its_lease_ends() -> None:
    store, reads = leasing({b"a": b"1", b"b": b"2"}, 1.0)
    assert await reads.read([b"a", b"b"]) == [b"1", b"2"]
    assert store.leases_asked == [[True]]
    # Leased: every read of those keys (any group of them) is answered at once, no call.
    for keys in ([b"a"], [b"b", b"a"], [b"a", b"b"]):
        future = reads.read(keys)
        assert future.done() and future.result() == [store.data[key] for key in keys]
    assert len(store.calls) == 1
    # A key not leased makes its group a call.
    store.data[b"c"] = b"3"
    assert await reads.read([b"a", b"c"]) == [b"1", b"3"]
    assert len(store.calls) == 2
    # Once the lease ended the reads call again (and see what changed meanwhile).
    await asyncio.sleep(1.05)
    store.data[b"a"] = b"new"
    assert await reads.read([b"a"]) == [b"new"]
    assert len(store.calls) == 3
    reads.close()
    assert reads.cache.leased([b"a"]) is None


async def test_reads_arriving_during_a_leased_call_are_answered_by_its_lease() -> None:
    store, reads = leasing({b"a": b"1", b"b": b"2"}, 5.0)
    store.gate.clear()
    first = reads.read([b"a"])
    await asyncio.sleep(0)
    # The node's other ranks read the same key while that call runs, and one another key.
    later = [reads.read([b"a"]) for _ in range(7)] + [reads.read([b"b"])]
    store.gate.set()
    assert await first == [b"1"]
    assert [await future for future in later] == [[b"1"]] * 7 + [[b"2"]]
    # The second call carried only the key no lease covered.
    assert store.calls == [[(b"a",)], [(b"b",)]]


async def test_a_lease_counts_from_before_its_call_and_a_counter_read_asks_for_none() -> None:
    store, reads = leasing({b"a": b"1", b"count": b"4"}, 0.2)
    store.gate.clear()
    held = reads.read([b"a"])
    await asyncio.sleep(0.25)  # the answer comes after its whole lease went by
    store.gate.set()
    assert await held == [b"1"]
    assert reads.cache.leased([b"a"]) is None  # ended before it arrived: nothing kept
    # An ADD of 0 (a barrier's count) asks no lease: its key's adds would wait for it.
    counted = reads.read([b"count"], lease=False)
    assert await counted == [b"4"]
    assert store.leases_asked[-1] == [False] and reads.cache.leased([b"count"]) is None
    # The same group asked by a get and a counter in one call: one group, leased.
    store.gate.clear()
    first = reads.read([b"x"])
    await asyncio.sleep(0)
    both = [reads.read([b"count"], lease=False), reads.read([b"count"])]
    store.gate.set()
    await first
    assert [await future for future in both] == [[b"4"], [b"4"]]
    assert store.leases_asked[-1] == [True]


async def test_a_read_of_a_numbered_key_prefetches_the_keys_after_it() -> None:
    """gloo's full mesh has every rank of a node read ``<prefix>0``, ``<prefix>1``, ... in
    order: a read missing a numbered key right after a leased read of its predecessor also
    asks, with leases, for the PREFETCH_KEYS keys numbered after it, so the node's next
    reads need no call while those leases run."""
    data = {b"p/%d" % n: b"v%d" % n for n in range(40)}
    store, reads = leasing(data, 5.0)
    assert await reads.read([b"p/0"]) == [b"v0"]
    assert store.calls == [[(b"p/0",)]]  # no predecessor read: no prefetch
    assert await reads.read([b"p/1"]) == [b"v1"]
    assert store.calls[1] == [(b"p/%d" % n,) for n in range(1, PREFETCH_KEYS + 2)]
    assert store.leases_asked[1] == [True] * (PREFETCH_KEYS + 1)
    for n in range(2, PREFETCH_KEYS + 2):
        future = reads.read([b"p/%d" % n])
        assert future.done() and future.result() == [b"v%d" % n]
    assert len(store.calls) == 2
    # The next miss prefetches what follows it; keys that do not exist are not kept.
    assert await reads.read([b"p/34"]) == [b"v34"]
    assert store.calls[2][0] == (b"p/34",) and len(store.calls[2]) == PREFETCH_KEYS + 1
    assert reads.cache.leased([b"p/39"]) == [b"v39"] and reads.cache.leased([b"p/40"]) is None
    # No prefetch after a key whose number has a leading zero, a group of several keys, a
    # read asking no lease (a counter), or a key read out of sequence.
    store.data.update({b"q/00": b"a", b"q/01": b"a", b"q/2": b"b", b"c0": b"7", b"c1": b"7"})
    await reads.read([b"q/00"])
    await reads.read([b"q/01"])
    await reads.read([b"q/2", b"p/0"])
    await reads.read([b"c0"])
    await reads.read([b"c1"], lease=False)
    await reads.read([b"p/60"])
    assert store.calls[3:] == [
        [(b"q/00",)],
        [(b"q/01",)],
        [(b"q/2", b"p/0")],
        [(b"c0",)],
        [(b"c1",)],
        [(b"p/60",)],
    ]
    reads.close()


async def test_the_prefetch_shrinks_for_large_values_and_is_dropped_when_refused() -> None:
    big = bytes(100 * 1024)
    store, reads = leasing({b"big%d" % n: big for n in range(10)}, 0.3)
    await reads.read([b"big0"])
    await reads.read([b"big1"])
    # PREFETCH_BYTES of values the size its prefix's keys hold: two keys after a miss.
    assert PREFETCH_BYTES // len(big) == 2
    assert store.calls[1] == [(b"big1",), (b"big2",), (b"big3",)]
    await asyncio.sleep(0.35)  # the leases ended (their keys stay known as read)
    await reads.read([b"big4"])
    assert store.calls[2] == [(b"big4",), (b"big5",), (b"big6",)]
    reads.close()
    # A call the coordinator refuses because of its prefetch goes again without it.
    store, reads = leasing({b"k%d" % n: b"v" for n in range(5)}, 5.0)
    answer = store.read_groups

    async def refusing(
        groups: Sequence[Sequence[bytes]], *, wait_s: float = 0.0
    ) -> list[list[bytes] | None]:
        if len(groups) > 1:
            store.calls.append([tuple(group) for group in groups])
            raise ResourceExhaustedError("bytes of values in one MultiGet answer: over 32 MiB")
        return await answer(groups, wait_s=wait_s)

    store.read_groups = refusing  # type: ignore[method-assign]
    assert await reads.read([b"k0"]) == [b"v"]
    assert await reads.read([b"k1"]) == [b"v"]
    assert len(store.calls[1]) == PREFETCH_KEYS + 1 and store.calls[2] == [(b"k1",)]
    assert await reads.read([b"k2"]) == [b"v"]  # that prefix prefetches no more
    assert await reads.read([b"k3"]) == [b"v"]
    assert store.calls[3:] == [[(b"k2",)], [(b"k3",)]]
    reads.close()


async def test_a_read_never_takes_the_answer_of_a_call_that_started_before_it() -> None:
    store = GatedStore()
    store.data = {b"k": b"old", b"gone": b"here"}
    reads = reads_of(store)
    store.gate.clear()
    before = reads.read([b"k", b"gone"])
    await asyncio.sleep(0)
    # A write completes (overwrite, delete) while that call is in flight: a read issued
    # now must see it, so it goes to the next call.
    store.data[b"k"] = b"new"
    del store.data[b"gone"]
    after, after_gone = reads.read([b"k"]), reads.read([b"gone"])
    store.gate.set()
    assert await before == [b"old", b"here"]
    assert (await after, await after_gone) == ([b"new"], None)
    assert len(store.calls) == 2


async def test_reads_linger_for_the_other_connections_then_go_together() -> None:
    store = GatedStore()
    store.data = {b"a": b"1", b"b": b"2"}
    reads = reads_of(store, connections=2)
    first = reads.read([b"a"])
    second = reads.read([b"b"])
    assert (await first, await second) == ([b"1"], [b"2"])
    assert store.calls == [[(b"a",), (b"b",)]]
    # With fewer reads than connections the call still goes, after LINGER_S.
    assert await reads.read([b"a"]) == [b"1"]


async def test_a_bad_group_fails_only_its_own_read_and_a_call_failure_fails_all() -> None:
    store = GatedStore()
    store.data = {b"a": b"1"}
    reads = reads_of(store)
    store.gate.clear()
    blocker = reads.read([b"a"])
    await asyncio.sleep(0)
    good, bad, other = reads.read([b"a"]), reads.read([b""]), reads.read([b"b"])
    store.gate.set()
    await blocker
    assert await good == [b"1"]
    with pytest.raises(InvalidArgumentError):
        await bad
    assert await other is None
    store.failure = StaleRoundError("round 1 has ended")
    failed = [reads.read([b"a"]), reads.read([b"b"])]
    for future in failed:
        with pytest.raises(StaleRoundError):
            await future


async def test_waits_on_the_same_missing_keys_share_one_coordinator_wait() -> None:
    """Connections waiting on the same missing keys share one held read, whose values answer
    those that joined before it was sent; one joining after must look again (the member may
    have read the keys before this connection asked)."""
    store = GatedStore()
    reads = reads_of(store)
    one = asyncio.ensure_future(reads.wait([b"k"]))
    two = asyncio.ensure_future(reads.wait([b"k"]))
    other = asyncio.ensure_future(reads.wait([b"m"]))
    await asyncio.sleep(0.01)
    late = asyncio.ensure_future(reads.wait([b"k"]))
    await asyncio.sleep(0.01)
    assert sorted(store.waits) == [(b"k",), (b"m",)]
    # One waiter cancelling (CANCEL_WAIT) leaves the shared wait to the others.
    one.cancel()
    await asyncio.sleep(0.01)
    assert not two.done()
    store.data = {b"k": b"K", b"m": b"M"}
    store.wait_done.set()
    assert await two == [b"K"]
    assert await other == [b"M"]
    assert await late is None
    assert sorted(store.waits) == [(b"k",), (b"m",)]
    assert store.calls == []  # no plain read
    reads.close()


class _Sink:
    """What a connection writes back to its worker."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str) -> None:
        return None


def connected(store: object, reads: Reads, adds: Adds, writes: Writes, sink: _Sink) -> Connection:
    """A connection of the bridge answering into ``sink``."""
    connection = Connection(cast(RoundStore, store), reads, adds, writes)
    connection.connection_made(cast(Any, sink))
    return connection


async def test_a_read_waits_for_the_writes_the_bridge_took_before_it() -> None:
    """torch's SET has no answer: the worker goes on once it is sent, and TCPStore applies
    requests in arrival order. A GET arriving on another connection while the SET is still
    on its way through Raft must see it (it used to overtake it and read the old value)."""
    store = GatedStore()
    store.data[b"k"] = b"old"
    set_gate = asyncio.Event()

    async def gated_set(key: bytes, value: bytes) -> None:
        await set_gate.wait()
        store.data[key] = value

    store.set = gated_set  # type: ignore[attr-defined]
    reads, adds, writes = reads_of(store, 2), Adds(cast(RoundStore, store)), Writes()

    def connection(sink: _Sink) -> Connection:
        return connected(store, reads, adds, writes, sink)

    reader = _Sink()
    setting = asyncio.create_task(connection(_Sink()).answer(Set(b"k", b"new")))
    await asyncio.sleep(0)  # the bridge took the SET
    getting = asyncio.create_task(connection(reader).answer(Get(b"k")))
    await asyncio.sleep(0.05)
    assert not getting.done() and not store.calls  # the read waits for the write
    set_gate.set()
    await asyncio.wait_for(asyncio.gather(setting, getting), 5)
    assert bytes(reader.data) == (3).to_bytes(8, "little") + b"new"


async def test_leased_reads_are_answered_at_once_unless_a_write_of_the_bridge_is_in_flight() -> (
    None
):
    store, reads = leasing({b"a": b"1", b"n": b"7"}, 30.0)
    writes = Writes()
    sink = _Sink()
    connection = connected(store, reads, Adds(cast(RoundStore, store)), writes, sink)
    assert not connection.answer_leased(Get(b"a"))  # nothing leased yet
    assert await reads.read([b"a", b"n"]) == [b"1", b"7"]
    calls = len(store.calls)

    def u64(number: int) -> bytes:
        return number.to_bytes(8, "little")

    for request, answer in (
        (Get(b"a"), u64(1) + b"1"),
        (Wait((b"a", b"n")), bytes([0])),  # STOP_WAITING
        (Check((b"n",)), bytes([0])),  # READY
        (MultiGet((b"n", b"a")), u64(1) + b"7" + u64(1) + b"1"),
        (Add(b"n", 0), u64(7)),
    ):
        sink.data.clear()
        assert connection.answer_leased(request), request
        assert bytes(sink.data) == answer, request
    assert len(store.calls) == calls  # no call made
    # Not from a lease: an ADD that adds, a key not leased, a write of the bridge in flight.
    assert not connection.answer_leased(Add(b"n", 1))
    assert not connection.answer_leased(Get(b"other"))
    gate = asyncio.Event()
    writing = asyncio.create_task(writes.run(gate.wait()))
    await asyncio.sleep(0)
    assert not connection.answer_leased(Get(b"a"))
    gate.set()
    await writing
    assert connection.answer_leased(Get(b"a"))


class CountingStore:
    """Adds on a dict of counters, each call gated, failing past ``limit`` as overflow."""

    def __init__(self, limit: int = 2**63 - 1) -> None:
        self.counters: dict[bytes, int] = {}
        self.calls: list[tuple[bytes, int]] = []
        self.gate = asyncio.Event()
        self.limit = limit

    async def add(self, key: bytes, delta: int) -> int:
        self.calls.append((key, delta))
        await self.gate.wait()
        value = self.counters.get(key, 0) + delta
        if value > self.limit:
            raise AddOverflowError("ADD_OVERFLOW")
        self.counters[key] = value
        return value


async def test_concurrent_adds_combine_into_one_call_with_running_sums() -> None:
    store = CountingStore()
    adds = Adds(cast(RoundStore, store))
    first = asyncio.ensure_future(adds.add(b"n", 1))
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(adds.add(b"n", delta)) for delta in (2, 3, 4)]
    other = asyncio.ensure_future(adds.add(b"m", 5))
    await asyncio.sleep(0)
    store.gate.set()
    assert await first == 1
    # One call of 2 + 3 + 4 = 9, answered in arrival order: 3, 6, 10.
    assert [await future for future in later] == [3, 6, 10]
    assert await other == 5
    assert store.calls == [(b"n", 1), (b"m", 5), (b"n", 9)]


async def test_a_combined_add_that_fails_is_retried_part_by_part() -> None:
    store = CountingStore(limit=10)
    store.counters[b"n"] = 5
    adds = Adds(cast(RoundStore, store))
    first = asyncio.ensure_future(adds.add(b"n", 0))
    await asyncio.sleep(0)
    parts = [asyncio.ensure_future(adds.add(b"n", delta)) for delta in (4, 3)]
    await asyncio.sleep(0)
    store.gate.set()
    assert await first == 5
    assert await parts[0] == 9
    with pytest.raises(AddOverflowError):
        await parts[1]
    assert store.calls == [(b"n", 0), (b"n", 7), (b"n", 4), (b"n", 3)]


class LeasingSetStore(GatedStore):
    """A gated store whose sets are applied to its data and, asked for one, leased for
    ``lease_s`` (0: none), as the leader answers ``StoreSetRequest.cache``."""

    def __init__(self) -> None:
        super().__init__()
        self.sets: list[tuple[bytes, bytes]] = []

    async def set_leased(self, key: bytes, value: bytes) -> float:
        self.sets.append((key, value))
        self.data[key] = value
        return self.lease_s


async def test_a_wait_for_a_missing_key_is_one_coordinator_wait_and_no_read() -> None:
    """NCCL's unique id, a barrier's last-worker key: a WAIT for keys no lease holds goes
    straight to the shared coordinator wait, answered at once if they exist; reading first
    was a second call whenever they did not yet (the usual case for a WAIT)."""
    store = LeasingSetStore()
    store.lease_s = 30.0
    reads = reads_of(store, 8)
    adds, writes = Adds(cast(RoundStore, store)), Writes()
    sinks = [_Sink() for _ in range(8)]
    connections = [connected(store, reads, adds, writes, sink) for sink in sinks]
    for connection in connections:
        await connection.answer(Wait((b"id",)))
    await asyncio.sleep(0.01)
    assert store.waits == [(b"id",)] and store.calls == []  # one wait for the node, no read
    store.data[b"id"] = b"unique"
    store.wait_done.set()
    for connection in connections:
        assert connection.waiting is not None
        await asyncio.wait_for(connection.waiting, 5)
    assert [bytes(sink.data) for sink in sinks] == [bytes([0])] * 8  # STOP_WAITING
    # The wait's lease answers the GETs that follow, and a WAIT for a key that exists is
    # one wait answered at once.
    assert connections[0].answer_leased(Get(b"id"))
    store.data[b"other"] = b"here"
    await connections[1].answer(Wait((b"other",)))
    assert connections[1].waiting is not None
    await asyncio.wait_for(connections[1].waiting, 5)
    assert store.waits == [(b"id",), (b"other",)] and store.calls == []
    reads.close()


async def test_a_wait_for_a_numbered_key_in_sequence_reads_ahead_instead() -> None:
    """gloo's full mesh WAITs for every rank's key in order: after a leased read of
    ``p/0``, a WAIT for ``p/1`` goes through a coalesced read that prefetches the keys after
    it, as before, not through a wait of its own."""
    store, reads = leasing({b"p/%d" % n: b"v" for n in range(4)}, 30.0)
    sink = _Sink()
    connection = connected(store, reads, Adds(cast(RoundStore, store)), Writes(), sink)
    assert await reads.read([b"p/0"]) == [b"v"]
    await connection.answer(Wait((b"p/1",)))
    assert connection.waiting is not None
    await asyncio.wait_for(connection.waiting, 5)
    assert bytes(sink.data) == bytes([0])
    assert store.waits == [] and store.calls[1][:3] == [(b"p/1",), (b"p/2",), (b"p/3",)]
    reads.close()


async def test_a_set_is_leased_the_value_it_wrote_and_answers_the_waits_for_it() -> None:
    """c10d's store-based barrier: the nodes that read the full count set the last-worker
    key, then every rank waits for it. The bridge's set asks for a lease on what it wrote,
    so those waits (and gets) are answered with no call; a store that grants none leaves
    them to the coordinator."""
    store = LeasingSetStore()
    store.lease_s = 30.0
    reads = reads_of(store, 8)
    adds, writes = Adds(cast(RoundStore, store)), Writes()
    sets = Sets(cast(RoundStore, store), reads.cache)
    sinks = [_Sink() for _ in range(8)]
    connections = [Connection(cast(RoundStore, store), reads, adds, writes, sets) for _ in range(8)]
    for connection, sink in zip(connections, sinks, strict=True):
        connection.connection_made(cast(Any, sink))
    await asyncio.gather(*(c.answer(Set(b"b:last_worker", b"1")) for c in connections))
    assert store.sets == [(b"b:last_worker", b"1")]
    for connection, sink in zip(connections, sinks, strict=True):
        assert connection.answer_leased(Wait((b"b:last_worker",)))
        assert connection.answer_leased(Get(b"b:last_worker"))
        assert bytes(sink.data) == bytes([0]) + (1).to_bytes(8, "little") + b"1"
    assert store.calls == [] and store.waits == []
    # No lease granted: the wait goes to the coordinator.
    store.lease_s = 0.0
    await connections[0].answer(Set(b"c:last_worker", b"1"))
    assert not connections[0].answer_leased(Wait((b"c:last_worker",)))
    reads.close()


class SettingStore:
    """Sets on a dict, each call gated, failing with ``failure`` when one is given."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.calls: list[tuple[bytes, bytes]] = []
        self.gate = asyncio.Event()
        self.failure: Exception | None = None

    async def set(self, key: bytes, value: bytes) -> None:
        self.calls.append((key, value))
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        self.data[key] = value


async def called(store: SettingStore, calls: int) -> None:
    """Once ``store`` has had ``calls`` calls (each waits at its gate)."""
    async with asyncio.timeout(5):
        while len(store.calls) < calls:
            await asyncio.sleep(0)


async def test_concurrent_sets_of_one_value_combine_and_none_takes_an_earlier_call() -> None:
    """c10d's store-based barrier: every rank of a node that reads the full count sets the
    same last-worker key to the same value. The sets taken before their call is sent are
    one coordinator write; a later one is a call of its own, sent at once beside the one in
    flight, never answered by it."""
    store = SettingStore()
    sets = Sets(cast(RoundStore, store))
    first = [asyncio.ensure_future(sets.set(b"k:last_worker", b"1")) for _ in range(3)]
    await called(store, 1)
    assert store.calls == [(b"k:last_worker", b"1")]  # the three arrived together: one call
    later = [asyncio.ensure_future(sets.set(b"k:last_worker", b"1")) for _ in range(5)]
    other = asyncio.ensure_future(sets.set(b"k:last_worker", b"2"))
    await called(store, 3)
    assert not any(future.done() for future in later)  # not answered by the call in flight
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(*first, *later, other), 5)
    assert store.calls == [
        (b"k:last_worker", b"1"),
        (b"k:last_worker", b"1"),  # the five that came during the first call, as one
        (b"k:last_worker", b"2"),  # another value: a write of its own
    ]


async def test_a_combined_set_that_fails_fails_every_part() -> None:
    store = SettingStore()
    store.failure = StaleRoundError("STALE_ROUND: the round ended")
    store.gate.set()
    sets = Sets(cast(RoundStore, store))
    parts = [asyncio.ensure_future(sets.set(b"k", b"v")) for _ in range(4)]
    outcomes = await asyncio.gather(*parts, return_exceptions=True)
    assert all(isinstance(outcome, StaleRoundError) for outcome in outcomes)
    assert store.calls == [(b"k", b"v")]


async def test_the_bridge_s_connections_share_their_sets() -> None:
    """Eight workers' SETs of one key and value, through the bridge's connections: two
    coordinator writes at most (one a call in flight), where each used to be its own."""
    store = SettingStore()
    reads = Reads(cast(RoundStore, store), lambda: 8)
    adds, writes, sets = Adds(cast(RoundStore, store)), Writes(), Sets(cast(RoundStore, store))
    connections = [Connection(cast(RoundStore, store), reads, adds, writes, sets) for _ in range(8)]
    setting = [asyncio.ensure_future(c.answer(Set(b"b:last_worker", b"1"))) for c in connections]
    await asyncio.sleep(0)
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(*setting), 5)
    assert store.data == {b"b:last_worker": b"1"}
    assert 1 <= len(store.calls) <= 2, store.calls


class ReadAddStore(GatedStore):
    """A gated store whose adds are counted and applied to its data as the coordinator
    does (decimal integers; anything else fails)."""

    def __init__(self) -> None:
        super().__init__()
        self.adds: list[tuple[bytes, int]] = []

    async def add(self, key: bytes, delta: int) -> int:
        self.adds.append((key, delta))
        current = self.data.get(key, b"0")
        if not current.lstrip(b"-").isdigit():
            raise InvalidArgumentError(f"{key!r} holds no integer")
        self.data[key] = str(int(current) + delta).encode()
        return int(self.data[key])


async def test_a_wait_the_leases_do_not_answer_starts_only_its_wait_task() -> None:
    """A WAIT arriving on the socket with nothing ahead of it starts its wait at once, with
    no serving task (only a CANCEL_WAIT may follow it); the CANCEL_WAIT is served after."""
    store = GatedStore()
    sink = _Sink()
    connection = connected(store, reads_of(store), Adds(cast(RoundStore, store)), Writes(), sink)
    key = b"id"
    connection.data_received(
        bytes([Query.WAIT]) + (1).to_bytes(8, "little") + len(key).to_bytes(8, "little") + key
    )
    assert connection.serving is None and connection.waiting is not None
    await asyncio.sleep(0.01)
    assert store.waits == [(b"id",)]
    connection.data_received(bytes([Query.CANCEL_WAIT]))
    for _ in range(100):
        if sink.data:
            break
        await asyncio.sleep(0.01)
    assert bytes(sink.data) == bytes([1])  # WAIT_CANCELED
    assert connection.waiting is None
    connection.connection_lost(None)


async def test_queries_are_answered_in_the_order_they_came_leased_or_not() -> None:
    """A connection answers leased reads as their bytes arrive, but never ahead of an earlier
    query still waiting for the coordinator; nor while the worker does not read its answers
    (the transport paused writing); a query split over two reads of the socket is answered
    once whole."""

    def data(value: bytes) -> bytes:
        return len(value).to_bytes(8, "little") + value

    def get(key: bytes) -> bytes:
        return bytes([Query.GET]) + data(key)

    store, reads = leasing({b"a": b"1", b"b": b"2"}, 30.0)
    assert await reads.read([b"b"]) == [b"2"]  # b is leased, a is not
    sink = _Sink()
    connection = connected(store, reads, Adds(cast(RoundStore, store)), Writes(), sink)
    store.gate.clear()
    connection.data_received(
        get(b"a") + get(b"b") + bytes([Query.PING]) + (7).to_bytes(4, "little")
    )
    await asyncio.sleep(0.02)
    assert not sink.data  # b's answer waits for a's call
    store.gate.set()
    for _ in range(100):
        if connection.serving is None:
            break
        await asyncio.sleep(0.01)
    assert bytes(sink.data) == data(b"1") + data(b"2") + (7).to_bytes(4, "little")
    sink.data.clear()
    connection.pause_writing()
    query = get(b"b")
    connection.data_received(query[:5])
    connection.data_received(query[5:])
    await asyncio.sleep(0.02)
    assert not sink.data
    connection.resume_writing()
    await asyncio.sleep(0.02)
    assert bytes(sink.data) == data(b"2")
    assert connection.serving is None and not connection.closed.done()
    connection.connection_lost(None)
    assert connection.closed.done()


async def test_an_add_of_zero_is_a_read_unless_the_key_holds_no_integer() -> None:
    """c10d's barrier reads its count with add(key, 0), every rank at once: the bridge
    answers it from a coalesced read, not a write through Raft, when the key holds an integer;
    a missing key is created by a real add (as TCPStore does) and a non-integer fails as the
    coordinator says."""
    store = ReadAddStore()
    store.data = {b"count": b"7", b"neg": b"-3", b"text": b"abc"}
    reads, adds, writes = reads_of(store, 1), Adds(cast(RoundStore, store)), Writes()

    async def add(key: bytes, delta: int) -> bytes:
        sink = _Sink()
        connection = connected(store, reads, adds, writes, sink)
        await connection.answer(Add(key, delta))
        return bytes(sink.data)

    def i64(value: int) -> bytes:
        return value.to_bytes(8, "little", signed=True)

    assert await add(b"count", 0) == i64(7)
    assert await add(b"neg", 0) == i64(-3)
    assert store.adds == [] and len(store.calls) == 2  # two reads, no write
    assert await add(b"count", 2) == i64(9)
    assert await add(b"count", 0) == i64(9)  # reads after the add see it
    assert await add(b"missing", 0) == i64(0)
    assert store.data[b"missing"] == b"0"  # created, as TCPStore's add creates it
    with pytest.raises(InvalidArgumentError):
        await add(b"text", 0)
    assert store.adds == [(b"count", 2), (b"missing", 0), (b"text", 0)]


# --------------------------------------------------------- torch's clients, end to end


@pytest.fixture
async def bridge_port() -> AsyncIterator[int]:
    node = FakeNode()
    async with served_at(node) as address, serving(node) as channel:
        headers = await open_session(node)
        (joined,) = await join_round(channel, headers, "j", 1)
        bridge = TCPStoreBridge([address])
        try:
            yield await asyncio.to_thread(bridge.serve_round, "j", 1, joined.participant_id)
        finally:
            await asyncio.to_thread(bridge.close)


def tcpstore(port: int, timeout_s: float = 20) -> Any:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))


async def test_concurrent_ranks_each_read_their_own_answers(bridge_port: int) -> None:
    size = 8
    errors: list[BaseException] = []
    counted: list[int] = []

    def rank(index: int) -> None:
        try:
            store = tcpstore(bridge_port)
            store.set(f"rank_{index}", f"address-{index}".encode())
            for other in range(size):
                assert store.get(f"rank_{other}") == f"address-{other}".encode()
            keys = [f"rank_{other}" for other in range(size)]
            assert store.multi_get(keys) == [f"address-{o}".encode() for o in range(size)]
            store.multi_set([f"m{index}_a", f"m{index}_b"], [b"a", b"b"])
            assert store.multi_get([f"m{index}_b", f"m{index}_a"]) == [b"b", b"a"]
            counted.append(store.add("barrier", 1))  # a barrier's adds, however combined
        except BaseException as error:  # reported by the test below
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(size)]
    await asyncio.to_thread(lambda: [t.start() for t in threads] and [t.join() for t in threads])
    assert errors == []
    assert sorted(counted) == list(range(1, size + 1))


async def test_reads_after_a_completed_write_see_it_overwrites_and_deletes_included(
    bridge_port: int,
) -> None:
    def run() -> None:
        writer, reader = tcpstore(bridge_port), tcpstore(bridge_port, timeout_s=1)
        for value in (b"v1", b"v2", b"v3"):
            writer.set("k", value)
            writer.check(["k"])  # answered after the set: the write has completed
            assert reader.get("k") == value
        assert writer.delete_key("k")
        assert not reader.check(["k"])
        with pytest.raises(dist.DistStoreError):
            reader.get("k")  # waits out its timeout: the key is gone

    await asyncio.to_thread(run)
