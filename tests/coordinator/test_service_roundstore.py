"""The RoundStore service over a real gRPC server and the fake member: c10d semantics,
waits, fencing to the ACTIVE round's members (reads included), and every failure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from rallypoint.coordinator.service import roundstore
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.proto.v1 import common_pb2, rendezvous_pb2_grpc
from rallypoint.proto.v1 import rendezvous_pb2 as pb

from .fake_node import FakeNode, Headers, fails, join_round, open_session, serving, until

Code = grpc.StatusCode
LIMITS = Limits(
    rendezvous=RendezvousLimits(
        max_store_keys=4, max_store_key_bytes=8, max_store_value_bytes=24, max_waiting=4
    )
)


@dataclass
class Client:
    node: FakeNode
    channel: grpc.aio.Channel
    headers: Headers
    store: rendezvous_pb2_grpc.RoundStoreStub
    rendezvous: rendezvous_pb2_grpc.RendezvousStub
    # Participant ids of the round's two members (ranks 0 and 1).
    members: tuple[int, int]

    def scope(self, member: int = 0, round_number: int = 1) -> pb.StoreScope:
        return pb.StoreScope(job="j", round=round_number, participant_id=self.members[member])

    async def set(self, key: bytes, value: bytes, member: int = 0) -> pb.StoreSetResponse:
        request = pb.StoreSetRequest(
            header=self.headers(), scope=self.scope(member), key=key, value=value
        )
        return await self.store.Set(request)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        headers = await open_session(node)
        a, b = await join_round(channel, headers, "j", 2)
        yield Client(
            node,
            channel,
            headers,
            rendezvous_pb2_grpc.RoundStoreStub(channel),
            rendezvous_pb2_grpc.RendezvousStub(channel),
            (a.participant_id, b.participant_id),
        )


async def test_set_get_add_compare_set_delete_num_keys_check(client: Client) -> None:
    store, h = client.store, client.headers
    await client.set(b"addr", b"10.0.0.1")
    got = await store.Get(pb.StoreGetRequest(scope=client.scope(1), key=b"addr"))
    assert got.value == b"10.0.0.1"
    added = await store.Add(pb.StoreAddRequest(header=h(), scope=client.scope(), key=b"n", delta=5))
    again = await store.Add(
        pb.StoreAddRequest(header=h(), scope=client.scope(1), key=b"n", delta=-2)
    )
    assert (added.value, again.value) == (5, 3)

    def cas(expected: bytes, desired: bytes) -> pb.StoreCompareSetRequest:
        return pb.StoreCompareSetRequest(
            header=h(), scope=client.scope(), key=b"c", expected=expected, desired=desired
        )

    created = await store.CompareSet(cas(b"", b"first"))
    assert created.swapped and created.value == b"first"
    lost = await store.CompareSet(cas(b"other", b"second"))
    assert not lost.swapped and lost.value == b"first"
    swapped = await store.CompareSet(cas(b"first", b"second"))
    assert swapped.swapped and swapped.value == b"second"

    counted = await store.NumKeys(pb.StoreNumKeysRequest(scope=client.scope()))
    assert counted.num_keys == 3
    checked = await store.Check(pb.StoreCheckRequest(scope=client.scope(), keys=[b"n", b"c"]))
    assert checked.all_exist
    deleted = await store.Delete(pb.StoreDeleteRequest(header=h(), scope=client.scope(), key=b"c"))
    assert deleted.existed
    absent = await store.Delete(pb.StoreDeleteRequest(header=h(), scope=client.scope(), key=b"c"))
    assert not absent.existed
    missing = await store.CompareSet(cas(b"x", b"y"))
    assert not missing.swapped and not missing.HasField("value")
    partly = await store.Check(pb.StoreCheckRequest(scope=client.scope(), keys=[b"n", b"c"]))
    assert not partly.all_exist
    await store.Wait(pb.StoreWaitRequest(scope=client.scope(), keys=[b"n", b"addr"]))


async def test_reads_are_linearizable_and_a_follower_refuses_them(client: Client) -> None:
    barriers = client.node.read_barriers
    await client.store.NumKeys(pb.StoreNumKeysRequest(scope=client.scope()))
    await client.store.Check(pb.StoreCheckRequest(scope=client.scope(), keys=[b"k"]))
    assert client.node.read_barriers == barriers + 2
    client.node.not_leader(2, "10.0.0.2:2379")
    refused = await fails(client.store.Get(pb.StoreGetRequest(scope=client.scope(), key=b"k")))
    assert (refused.code, refused.reason, refused.leader) == (
        Code.UNAVAILABLE,
        "NOT_LEADER",
        "10.0.0.2:2379",
    )


async def test_get_and_wait_block_until_the_keys_appear(client: Client) -> None:
    get = asyncio.ensure_future(
        client.store.Get(pb.StoreGetRequest(scope=client.scope(1), key=b"k", timeout_ms=30_000))
    )
    wait = asyncio.ensure_future(
        client.store.Wait(
            pb.StoreWaitRequest(scope=client.scope(1), keys=[b"k", b"m"], timeout_ms=30_000)
        )
    )
    await until(lambda: client.node.apply_waits >= 2)
    await client.set(b"k", b"v")
    assert (await get).value == b"v"
    assert not wait.done()
    await client.set(b"m", b"")
    await wait


async def test_a_key_still_missing_at_the_timeout_is_deadline_exceeded(client: Client) -> None:
    for timeout_ms in (0, 20):
        got = await fails(
            client.store.Get(
                pb.StoreGetRequest(scope=client.scope(), key=b"k", timeout_ms=timeout_ms)
            )
        )
        assert got.code == Code.DEADLINE_EXCEEDED and "key b'k' is missing" in got.details
    await client.set(b"k", b"v")
    waited = await fails(
        client.store.Wait(
            pb.StoreWaitRequest(scope=client.scope(), keys=[b"k", b"x"], timeout_ms=20)
        )
    )
    assert waited.code == Code.DEADLINE_EXCEEDED


def groups(*keys: list[bytes]) -> list[pb.StoreKeyGroup]:
    return [pb.StoreKeyGroup(keys=group) for group in keys]


def answered(response: pb.StoreMultiGetResponse) -> list[list[bytes] | None]:
    return [list(group.values) if group.complete else None for group in response.groups]


async def test_multi_get_answers_every_group_all_or_nothing_behind_one_barrier(
    client: Client,
) -> None:
    await client.set(b"a", b"1")
    await client.set(b"b", b"")
    barriers = client.node.read_barriers
    got = await client.store.MultiGet(
        pb.StoreMultiGetRequest(scope=client.scope(1), groups=groups([b"a", b"b"], [b"b", b"a"]))
    )
    assert answered(got) == [[b"1", b""], [b"", b"1"]]
    assert client.node.read_barriers == barriers + 1
    # One missing key fails the call, unless partial: then only its group is incomplete.
    request = pb.StoreMultiGetRequest(scope=client.scope(), groups=groups([b"a", b"x"], [b"b"]))
    missing = await fails(client.store.MultiGet(request))
    assert missing.code == Code.DEADLINE_EXCEEDED and "still missing" in missing.details
    request.partial = True
    assert answered(await client.store.MultiGet(request)) == [None, [b""]]
    request.timeout_ms = 20
    assert answered(await client.store.MultiGet(request)) == [None, [b""]]
    # Overwritten and deleted keys read as they are now.
    await client.set(b"a", b"2")
    await client.store.Delete(
        pb.StoreDeleteRequest(header=client.headers(), scope=client.scope(), key=b"b")
    )
    request = pb.StoreMultiGetRequest(
        scope=client.scope(), groups=groups([b"a"], [b"b"]), partial=True
    )
    assert answered(await client.store.MultiGet(request)) == [[b"2"], None]


async def test_multi_get_waits_until_every_group_is_complete(client: Client) -> None:
    whole = asyncio.ensure_future(
        client.store.MultiGet(
            pb.StoreMultiGetRequest(
                scope=client.scope(1), groups=groups([b"k"], [b"m", b"k"]), timeout_ms=30_000
            )
        )
    )
    partial = asyncio.ensure_future(
        client.store.MultiGet(
            pb.StoreMultiGetRequest(
                scope=client.scope(1),
                groups=groups([b"k"], [b"m"]),
                timeout_ms=30_000,
                partial=True,
            )
        )
    )
    await until(lambda: client.node.apply_waits >= 2)
    await client.set(b"k", b"v")
    await until(lambda: client.node.apply_waits >= 4)
    assert not whole.done() and not partial.done()
    await client.set(b"m", b"w")
    assert answered(await whole) == [[b"v"], [b"w", b"v"]]
    assert answered(await partial) == [[b"v"], [b"w"]]


async def test_multi_get_limits_its_keys_and_its_answer(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = client.scope()
    too_many = [b"k"] * (roundstore.MAX_MULTI_GET_KEYS + 1)
    refused = await fails(
        client.store.MultiGet(pb.StoreMultiGetRequest(scope=scope, groups=groups(too_many)))
    )
    assert (refused.code, refused.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert "keys in one MultiGet" in refused.details
    long_key = await fails(
        client.store.MultiGet(pb.StoreMultiGetRequest(scope=scope, groups=groups([b"k" * 9])))
    )
    assert (long_key.code, long_key.reason) == (Code.RESOURCE_EXHAUSTED, "KEY_TOO_LARGE")
    await client.set(b"k", b"v" * 20)
    monkeypatch.setattr(roundstore, "MAX_MULTI_GET_ANSWER_BYTES", 50)
    request = pb.StoreMultiGetRequest(scope=scope, groups=groups([b"k", b"k"]))
    assert answered(await client.store.MultiGet(request)) == [[b"v" * 20] * 2]
    request.groups.add(keys=[b"k"])
    too_large = await fails(client.store.MultiGet(request))
    assert (too_large.code, too_large.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert "bytes of values in one MultiGet answer" in too_large.details


async def test_the_round_ending_during_a_wait_ends_it_with_stale_round(client: Client) -> None:
    get = asyncio.ensure_future(
        client.store.Get(pb.StoreGetRequest(scope=client.scope(), key=b"k", timeout_ms=30_000))
    )
    wait = asyncio.ensure_future(
        client.store.Wait(pb.StoreWaitRequest(scope=client.scope(), keys=[b"k"], timeout_ms=30_000))
    )
    many = asyncio.ensure_future(
        client.store.MultiGet(
            pb.StoreMultiGetRequest(scope=client.scope(), groups=groups([b"k"]), timeout_ms=30_000)
        )
    )
    partial = asyncio.ensure_future(
        client.store.MultiGet(
            pb.StoreMultiGetRequest(
                scope=client.scope(), groups=groups([b"k"]), timeout_ms=30_000, partial=True
            )
        )
    )
    await until(lambda: client.node.apply_waits >= 4)
    await client.rendezvous.Leave(
        pb.LeaveRequest(header=client.headers(), job="j", participant_id=client.members[1])
    )
    for call in (get, wait, many):
        failure = await fails(call)
        assert (failure.code, failure.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
        assert "round 1 has ended" in failure.details
    # A partial MultiGet answers at its deadline with the groups complete; the ended round's
    # store will never change, so its deadline is now (the key is missing).
    answer = await partial
    assert [group.complete for group in answer.groups] == [False]


async def test_an_ended_rounds_store_stays_readable_by_its_members_and_is_never_written(
    client: Client,
) -> None:
    """The rule that keeps ranks forming a round that ended symmetric (state/roundstore.py,
    "Ended, read-only"): keys written before the end are read, missing ones are refused at
    once, writes are refused, until the next round ends."""
    store, h = client.store, client.headers
    await client.set(b"addr0", b"10.0.0.1")
    await client.set(b"addr1", b"10.0.0.2", member=1)
    # Rank 1 leaves: round 1 ends (round 2 joins with rank 0 alone).
    await client.rendezvous.Leave(
        pb.LeaveRequest(header=h(), job="j", participant_id=client.members[1])
    )
    ended = client.scope(0)
    got = await store.Get(pb.StoreGetRequest(scope=ended, key=b"addr0", timeout_ms=30_000))
    assert got.value == b"10.0.0.1"
    await store.Wait(pb.StoreWaitRequest(scope=ended, keys=[b"addr0", b"addr1"]))
    assert (await store.NumKeys(pb.StoreNumKeysRequest(scope=ended))).num_keys == 2
    assert (await store.Check(pb.StoreCheckRequest(scope=ended, keys=[b"addr0"]))).all_exist
    many = await store.MultiGet(
        pb.StoreMultiGetRequest(scope=ended, groups=[pb.StoreKeyGroup(keys=[b"addr0"], cache=True)])
    )
    assert [(g.complete, list(g.values), g.cache_ms) for g in many.groups] == [
        (True, [b"10.0.0.1"], 0)  # no cache lease on an ended round's values
    ]
    missing = await fails(
        store.Get(pb.StoreGetRequest(scope=ended, key=b"addr2", timeout_ms=30_000))
    )
    assert (missing.code, missing.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    assert "read-only" in missing.details
    for write in (
        store.Set(pb.StoreSetRequest(header=h(), scope=ended, key=b"addr2", value=b"x")),
        store.Add(pb.StoreAddRequest(header=h(), scope=ended, key=b"n", delta=1)),
        store.Delete(pb.StoreDeleteRequest(header=h(), scope=ended, key=b"addr0")),
    ):
        refused = await fails(write)
        assert refused.reason == "STALE_ROUND" and "round 1 has ended" in refused.details
    # Not for a member that is no longer a participant (it left; or failed: a zombie).
    refused = await fails(store.Get(pb.StoreGetRequest(scope=client.scope(1), key=b"addr0")))
    assert refused.reason == "STALE_ROUND" and "read-only" not in refused.details


async def test_only_members_of_the_active_round_may_read_or_write(client: Client) -> None:
    waiter = await client.rendezvous.Join(
        pb.JoinRequest(header=client.headers(), job="j", name="late")
    )
    assert waiter.waiting
    outsider = pb.StoreScope(job="j", round=1, participant_id=waiter.participant_id)
    future = pb.StoreScope(job="j", round=2, participant_id=client.members[0])
    h = client.headers
    for scope in (outsider, future):
        calls = [
            client.store.Set(pb.StoreSetRequest(header=h(), scope=scope, key=b"k", value=b"v")),
            client.store.Get(pb.StoreGetRequest(scope=scope, key=b"k")),
            client.store.Wait(pb.StoreWaitRequest(scope=scope, keys=[b"k"])),
            client.store.NumKeys(pb.StoreNumKeysRequest(scope=scope)),
            client.store.Check(pb.StoreCheckRequest(scope=scope, keys=[b"k"])),
            client.store.MultiGet(
                pb.StoreMultiGetRequest(scope=scope, groups=groups([b"k"]), partial=True)
            ),
            client.store.Add(pb.StoreAddRequest(header=h(), scope=scope, key=b"k", delta=1)),
            client.store.Delete(pb.StoreDeleteRequest(header=h(), scope=scope, key=b"k")),
        ]
        for call in calls:
            failure = await fails(call)
            assert (failure.code, failure.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    # After the round ends, its own former members are refused too (a zombie's write).
    await client.set(b"k", b"v")
    await client.rendezvous.Leave(
        pb.LeaveRequest(header=h(), job="j", participant_id=client.members[1])
    )
    zombie = await fails(client.set(b"k", b"v2", member=1))
    assert (zombie.code, zombie.reason) == (Code.FAILED_PRECONDITION, "STALE_ROUND")
    stale = await fails(client.store.Get(pb.StoreGetRequest(scope=client.scope(1), key=b"k")))
    assert stale.reason == "STALE_ROUND"
    # (Rank 0, still a participant, may read what round 1's store holds: see
    # test_an_ended_rounds_store_stays_readable_by_its_members_and_is_never_written.)
    unknown = pb.StoreScope(job="nope", round=1, participant_id=1)
    missing = await fails(client.store.NumKeys(pb.StoreNumKeysRequest(scope=unknown)))
    assert (missing.code, missing.reason) == (Code.NOT_FOUND, "JOB_NOT_FOUND")


async def test_store_failures_have_their_documented_status(client: Client) -> None:
    h, scope = client.headers, client.scope()
    await client.set(b"text", b"abc")
    not_int = await fails(
        client.store.Add(pb.StoreAddRequest(header=h(), scope=scope, key=b"text", delta=1))
    )
    assert (not_int.code, not_int.reason) == (Code.FAILED_PRECONDITION, "NOT_AN_INTEGER")
    await client.set(b"big", str(2**63 - 1).encode())
    overflow = await fails(
        client.store.Add(pb.StoreAddRequest(header=h(), scope=scope, key=b"big", delta=1))
    )
    assert (overflow.code, overflow.reason) == (Code.OUT_OF_RANGE, "ADD_OVERFLOW")
    long_key = await fails(client.set(b"k" * 9, b"v"))
    assert (long_key.code, long_key.reason) == (Code.RESOURCE_EXHAUSTED, "KEY_TOO_LARGE")
    long_value = await fails(client.set(b"k", b"v" * 25))
    assert (long_value.code, long_value.reason) == (Code.RESOURCE_EXHAUSTED, "VALUE_TOO_LARGE")
    await client.set(b"k3", b"v")
    await client.set(b"k4", b"v")
    full = await fails(client.set(b"k5", b"v"))
    assert (full.code, full.reason) == (Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")


def _bad_requests() -> list[tuple[str, str, object]]:
    h = Headers(1)
    scope = pb.StoreScope(job="j", round=1, participant_id=2)
    return [
        ("Set", "header", pb.StoreSetRequest(scope=scope, key=b"k")),
        ("Set", "header.session_id", pb.StoreSetRequest(header=common_pb2.RequestHeader(sequence=1), scope=scope, key=b"k")),  # noqa: E501
        ("Set", "scope", pb.StoreSetRequest(header=h(), key=b"k")),
        ("Set", "scope.job", pb.StoreSetRequest(header=h(), scope=pb.StoreScope(job="/", round=1, participant_id=2), key=b"k")),  # noqa: E501
        ("Set", "scope.round", pb.StoreSetRequest(header=h(), scope=pb.StoreScope(job="j", participant_id=2), key=b"k")),  # noqa: E501
        ("Set", "scope.participant_id", pb.StoreSetRequest(header=h(), scope=pb.StoreScope(job="j", round=1), key=b"k")),  # noqa: E501
        ("Set", "key", pb.StoreSetRequest(header=h(), scope=scope)),
        ("Add", "key", pb.StoreAddRequest(header=h(), scope=scope, delta=1)),
        ("CompareSet", "key", pb.StoreCompareSetRequest(header=h(), scope=scope)),
        ("Delete", "key", pb.StoreDeleteRequest(header=h(), scope=scope)),
        ("Get", "key", pb.StoreGetRequest(scope=scope)),
        ("Get", "timeout_ms", pb.StoreGetRequest(scope=scope, key=b"k", timeout_ms=-1)),
        ("Wait", "keys[1]", pb.StoreWaitRequest(scope=scope, keys=[b"k", b""])),
        ("Wait", "timeout_ms", pb.StoreWaitRequest(scope=scope, keys=[b"k"], timeout_ms=-1)),
        ("Check", "keys[0]", pb.StoreCheckRequest(scope=scope, keys=[b""])),
        ("NumKeys", "scope", pb.StoreNumKeysRequest()),
        ("MultiGet", "scope", pb.StoreMultiGetRequest(groups=groups([b"k"]))),
        ("MultiGet", "groups", pb.StoreMultiGetRequest(scope=scope)),
        ("MultiGet", "groups[1].keys", pb.StoreMultiGetRequest(scope=scope, groups=groups([b"k"], []))),  # noqa: E501
        ("MultiGet", "groups[0].keys[1]", pb.StoreMultiGetRequest(scope=scope, groups=groups([b"k", b""]))),  # noqa: E501
        ("MultiGet", "timeout_ms", pb.StoreMultiGetRequest(scope=scope, groups=groups([b"k"]), timeout_ms=-1)),  # noqa: E501
    ]  # fmt: skip


@pytest.mark.parametrize(("method", "field", "request_"), _bad_requests())
async def test_malformed_requests_are_refused_naming_the_field(
    client: Client, method: str, field: str, request_: object
) -> None:
    proposals, barriers = len(client.node.proposals), client.node.read_barriers
    failure = await fails(getattr(client.store, method)(request_))
    assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert failure.details.startswith(f"{field}: "), failure.details
    assert (len(client.node.proposals), client.node.read_barriers) == (proposals, barriers)


class VirtualClock:
    """Virtual time for the service's cache leases: a write's wait for a lease advances it."""

    now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def lease_clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """The clock of the cache leases of every RoundStore service made in the test."""
    from rallypoint.coordinator.service.store_cache import StoreCacheLeases

    clock = VirtualClock()
    monkeypatch.setattr(
        roundstore,
        "StoreCacheLeases",
        lambda node: StoreCacheLeases(node, clock=clock, sleep=clock.sleep),
    )
    return clock


@dataclass
class LeaseScene:
    store: rendezvous_pb2_grpc.RoundStoreStub
    headers: Headers
    scope: pb.StoreScope


@contextlib.asynccontextmanager
async def store_of_a_round() -> AsyncIterator[LeaseScene]:
    """A served FakeNode with a round of two: its store, a session and a participant's scope."""
    node = FakeNode(LIMITS)
    async with serving(node) as channel:
        headers = await open_session(node)
        a, _ = await join_round(channel, headers, "j", 2)
        store = rendezvous_pb2_grpc.RoundStoreStub(channel)
        yield LeaseScene(
            store, headers, pb.StoreScope(job="j", round=1, participant_id=a.participant_id)
        )


async def test_a_write_waits_for_the_lease_on_its_key_unless_it_keeps_the_value(
    lease_clock: VirtualClock,
) -> None:
    """Cache leases through the service (coordinator/service/store_cache.py), on virtual
    time: a MultiGet group asking for a lease gets one; a set that changes a leased key is
    held until the lease ended, one that writes the value it holds (c10d's barrier's
    last-worker key) is not, and a key being written is not leased."""
    clock = lease_clock
    async with store_of_a_round() as scene:
        store, headers, scope = scene.store, scene.headers, scene.scope

        async def set_(value: bytes) -> float:
            before = clock.now
            await store.Set(
                pb.StoreSetRequest(header=headers(), scope=scope, key=b"k", value=value)
            )
            return clock.now - before

        async def leased_read() -> tuple[list[bytes], int]:
            request = pb.StoreMultiGetRequest(scope=scope)
            request.groups.add(keys=[b"k"], cache=True)
            (group,) = (await store.MultiGet(request)).groups
            return list(group.values), group.cache_ms

        await set_(b"v")
        assert await leased_read() == ([b"v"], 1000)
        assert await set_(b"v") == 0.0  # the same value: the lease stays right
        assert await set_(b"w") == pytest.approx(1.0)  # held until the lease ended
        assert await leased_read() == ([b"w"], 1000)
        plain = pb.StoreMultiGetRequest(scope=scope)
        plain.groups.add(keys=[b"k"])
        (group,) = (await store.MultiGet(plain)).groups
        assert (list(group.values), group.cache_ms) == ([b"w"], 0)  # not asked: none


async def test_a_set_asking_for_a_lease_is_leased_the_value_it_wrote(
    lease_clock: VirtualClock,
) -> None:
    """StoreSetRequest.cache: the writer gets a lease on the value it wrote, and the leader
    keeps it (a set that changes the key is held until it ended); a set that does not ask
    gets none."""
    clock = lease_clock
    async with store_of_a_round() as scene:
        store, headers, scope = scene.store, scene.headers, scene.scope

        async def set_(value: bytes, cache: bool) -> tuple[int, float]:
            before = clock.now
            response = await store.Set(
                pb.StoreSetRequest(
                    header=headers(), scope=scope, key=b"k", value=value, cache=cache
                )
            )
            return response.cache_ms, clock.now - before

        assert await set_(b"v", cache=False) == (0, 0.0)
        assert await set_(b"w", cache=True) == (1000, 0.0)
        assert await set_(b"w", cache=True) == (1000, 0.0)  # the same value: not held
        # Another value waits for the lease the last set was given.
        assert await set_(b"x", cache=False) == (0, pytest.approx(1.0))
