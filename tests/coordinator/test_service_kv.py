"""The KV service over a real gRPC server: success paths, validation, failure mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from rallypoint.client import Client as RallypointClient
from rallypoint.coordinator.state import Limits
from rallypoint.coordinator.state.commands import Put
from rallypoint.proto.v1 import (
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

from .fake_node import MEMBER_ID, TERM, FakeNode, fails, served_at, serving

Code = grpc.StatusCode


@dataclass
class Client:
    node: FakeNode
    channel: grpc.aio.Channel
    session_id: int = 0
    sequence: int = 0
    kv: kv_pb2_grpc.KVStub = field(init=False)
    lease: lease_pb2_grpc.LeaseStub = field(init=False)

    def __post_init__(self) -> None:
        self.kv = kv_pb2_grpc.KVStub(self.channel)
        self.lease = lease_pb2_grpc.LeaseStub(self.channel)

    def header(self) -> common_pb2.RequestHeader:
        self.sequence += 1
        return common_pb2.RequestHeader(session_id=self.session_id, sequence=self.sequence)

    async def put(self, key: bytes, value: bytes, **fields: object) -> kv_pb2.PutResponse:
        request = kv_pb2.PutRequest(header=self.header(), key=key, value=value, **fields)
        return await self.kv.Put(request)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    node = FakeNode(Limits(max_key_bytes=16, max_value_bytes=32))
    async with serving(node) as channel:
        opened = await session_pb2_grpc.SessionStub(channel).Open(
            session_pb2.SessionOpenRequest(ttl_ms=60_000)
        )
        yield Client(node, channel, opened.session_id)


async def test_put_then_get_returns_the_stored_key_with_a_header(client: Client) -> None:
    put = await client.put(b"a", b"1")
    assert put.kv.key == b"a" and put.kv.value == b"1" and put.kv.version == 1
    assert put.header.revision == put.kv.mod_revision == put.kv.create_revision
    assert (put.header.raft_term, put.header.leader_id, put.header.member_id) == (
        TERM,
        MEMBER_ID,
        MEMBER_ID,
    )
    assert not put.HasField("prev_kv")
    again = await client.put(b"a", b"2", prev_kv=True)
    assert again.prev_kv.value == b"1" and again.kv.version == 2

    got = await client.kv.Get(kv_pb2.GetRequest(key=b"a"))
    assert got.kv == again.kv
    assert got.header.revision == again.kv.mod_revision
    missing = await client.kv.Get(kv_pb2.GetRequest(key=b"zz"))
    assert not missing.HasField("kv")


async def test_writes_carry_the_session_header_and_a_deadline_bounded_timeout(
    client: Client,
) -> None:
    request = kv_pb2.PutRequest(
        header=common_pb2.RequestHeader(session_id=client.session_id, sequence=7, first_unacked=5),
        key=b"k",
    )
    await client.kv.Put(request, timeout=3.0)
    command, session_id, sequence, first_unacked, timeout_s = client.node.proposals[-1]
    assert command == Put(b"k", b"")
    assert (session_id, sequence, first_unacked) == (client.session_id, 7, 5)
    assert 0 < timeout_s < 4.0  # from the 3 s deadline (grpc rounds it), not the cap
    client.sequence = 7
    await client.kv.Put(kv_pb2.PutRequest(header=client.header(), key=b"k"))
    assert client.node.proposals[-1][4] == 10.0  # no client deadline: the cap


async def test_linearizable_reads_take_a_read_barrier_and_serializable_ones_do_not(
    client: Client,
) -> None:
    await client.kv.Get(kv_pb2.GetRequest(key=b"a"))
    await client.kv.Range(kv_pb2.RangeRequest(prefix=b"a"))
    assert client.node.read_barriers == 2
    await client.kv.Get(kv_pb2.GetRequest(key=b"a", serializable=True))
    await client.kv.Range(kv_pb2.RangeRequest(prefix=b"a", serializable=True))
    assert client.node.read_barriers == 2


async def test_range_pages_through_a_prefix_in_key_order(client: Client) -> None:
    for key in (b"p/c", b"p/a", b"q/x", b"p/b"):
        await client.put(key, b"v-" + key)
    first = await client.kv.Range(kv_pb2.RangeRequest(prefix=b"p/", limit=2))
    assert [kv.key for kv in first.kvs] == [b"p/a", b"p/b"] and first.more
    rest = await client.kv.Range(
        kv_pb2.RangeRequest(prefix=b"p/", limit=2, start_after=b"p/b", keys_only=True)
    )
    assert [(kv.key, kv.value) for kv in rest.kvs] == [(b"p/c", b"")] and not rest.more
    everything = await client.kv.Range(kv_pb2.RangeRequest())
    assert len(everything.kvs) == 4


async def test_range_answers_are_capped_by_the_member_and_say_there_is_more() -> None:
    """More keys than one answer may hold: every answer stops at the cap on keys or bytes
    (whatever `limit` asks, 0 included), `more` is set, and start_after continues."""
    node = FakeNode(Limits(max_answer_keys=5, max_answer_bytes=100))
    async with serving(node) as channel:
        opened = await session_pb2_grpc.SessionStub(channel).Open(
            session_pb2.SessionOpenRequest(ttl_ms=60_000)
        )
        client = Client(node, channel, opened.session_id)
        for i in range(12):
            await client.put(b"k/%02d" % i, b"v" * 10)  # 14 bytes of key and value each
        range_ = client.kv.Range
        for limit in (0, 6, 1000):
            capped = await range_(kv_pb2.RangeRequest(prefix=b"k/", limit=limit))
            assert [kv.key for kv in capped.kvs] == [b"k/%02d" % i for i in range(5)]
            assert capped.more
        small = await range_(kv_pb2.RangeRequest(prefix=b"k/", limit=3))
        assert len(small.kvs) == 3 and small.more
        last = await range_(kv_pb2.RangeRequest(prefix=b"k/", start_after=b"k/09"))
        assert [kv.key for kv in last.kvs] == [b"k/10", b"k/11"] and not last.more

        await client.put(b"big/1", b"x" * 60)
        await client.put(b"big/2", b"x" * 60)
        # 66 bytes each: two would pass the 100-byte cap. One key is always answered.
        by_bytes = await range_(kv_pb2.RangeRequest(prefix=b"big/"))
        assert [kv.key for kv in by_bytes.kvs] == [b"big/1"] and by_bytes.more
        # Without values, only the keys count.
        keys_only = await range_(kv_pb2.RangeRequest(prefix=b"big/", keys_only=True))
        assert [kv.key for kv in keys_only.kvs] == [b"big/1", b"big/2"]
        assert not keys_only.more


async def test_the_client_pages_through_more_keys_than_the_cap() -> None:
    node = FakeNode(Limits(max_answer_keys=4))
    async with served_at(node) as address, RallypointClient([address]) as client:
        for i in range(10):
            await client.put(b"p/%d" % i, b"v")
        first = await client.range("p/")
        assert len(first.kvs) == 4 and first.more
        keys = [kv.key async for kv in client.range_pages("p/", page_size=1000)]
        assert keys == [b"p/%d" % i for i in range(10)]


async def test_delete_a_key_and_a_prefix(client: Client) -> None:
    for key in (b"d/1", b"d/2", b"e"):
        await client.put(key, b"x")
    one = await client.kv.Delete(
        kv_pb2.DeleteRequest(header=client.header(), key=b"e", prev_kv=True)
    )
    assert one.deleted == 1 and [kv.key for kv in one.prev_kvs] == [b"e"]
    many = await client.kv.Delete(
        kv_pb2.DeleteRequest(header=client.header(), key=b"d/", prefix=True)
    )
    assert many.deleted == 2 and not many.prev_kvs
    nothing = await client.kv.Delete(kv_pb2.DeleteRequest(header=client.header(), key=b"e"))
    assert nothing.deleted == 0


async def test_compare_and_set_each_comparison(client: Client) -> None:
    cas = client.kv.CompareAndSet
    created = await cas(
        kv_pb2.CompareAndSetRequest(
            header=client.header(), key=b"c", must_not_exist=True, value=b"1"
        )
    )
    assert created.succeeded and created.kv.value == b"1"
    lost = await cas(
        kv_pb2.CompareAndSetRequest(
            header=client.header(), key=b"c", must_not_exist=True, value=b"2"
        )
    )
    assert not lost.succeeded and lost.kv.value == b"1"
    by_value = await cas(
        kv_pb2.CompareAndSetRequest(header=client.header(), key=b"c", value_equals=b"1", value=b"2")
    )
    assert by_value.succeeded and by_value.kv.value == b"2"
    by_revision = await cas(
        kv_pb2.CompareAndSetRequest(
            header=client.header(),
            key=b"c",
            mod_revision_equals=by_value.kv.mod_revision,
            value=b"3",
        )
    )
    assert by_revision.succeeded and by_revision.kv.version == 3
    absent = await cas(
        kv_pb2.CompareAndSetRequest(header=client.header(), key=b"nope", value_equals=b"")
    )
    assert not absent.succeeded and not absent.HasField("kv")


async def test_add_counts_from_zero(client: Client) -> None:
    first = await client.kv.Add(kv_pb2.AddRequest(header=client.header(), key=b"n", delta=5))
    second = await client.kv.Add(kv_pb2.AddRequest(header=client.header(), key=b"n", delta=-7))
    assert (first.value, second.value) == (5, -2) and second.kv.value == b"-2"


async def test_a_retried_sequence_is_answered_from_the_session_cache(client: Client) -> None:
    header = client.header()
    first = await client.kv.Add(kv_pb2.AddRequest(header=header, key=b"n", delta=1))
    retry = await client.kv.Add(kv_pb2.AddRequest(header=header, key=b"n", delta=1))
    assert first.value == retry.value == 1


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"key": b"k"}, "header"),
        ({"header": {"sequence": 1}, "key": b"k"}, "header.session_id"),
        ({"header": {"session_id": 1}, "key": b"k"}, "header.sequence"),
        (
            {"header": {"session_id": 1, "sequence": 2, "first_unacked": 3}, "key": b"k"},
            "header.first_unacked",
        ),
        ({"header": {"session_id": 1, "sequence": 1}}, "key"),
        ({"header": {"session_id": 1, "sequence": 1}, "key": b"k", "lease_id": -1}, "lease_id"),
        (
            {"header": {"session_id": 1, "sequence": 1}, "key": b"k", "fence": {"token": 4}},
            "fence.lease_id",
        ),
        (
            {"header": {"session_id": 1, "sequence": 1}, "key": b"k", "fence": {"lease_id": 4}},
            "fence.token",
        ),
    ],
)
async def test_put_validation_names_the_field(
    client: Client, request_fields: dict[str, object], field: str
) -> None:
    failure = await fails(client.kv.Put(kv_pb2.PutRequest(**request_fields)))  # type: ignore[arg-type]
    assert failure.code == Code.INVALID_ARGUMENT
    assert failure.details.startswith(f"{field}: ")
    assert failure.reason == "INVALID_REQUEST"
    assert len(client.node.proposals) == 1  # only the fixture's Session.Open


async def test_validation_of_the_other_kv_requests(client: Client) -> None:
    cases = [
        (client.kv.Get(kv_pb2.GetRequest()), "key: must not be empty"),
        (client.kv.Range(kv_pb2.RangeRequest(limit=-1)), "limit: must be >= 0, got -1"),
        (
            client.kv.Delete(kv_pb2.DeleteRequest(header=client.header())),
            "key: must not be empty (set prefix to delete every key)",
        ),
        (
            client.kv.CompareAndSet(
                kv_pb2.CompareAndSetRequest(header=client.header(), key=b"k", value=b"v")
            ),
            "compare: exactly one comparison is required",
        ),
        (
            client.kv.CompareAndSet(
                kv_pb2.CompareAndSetRequest(header=client.header(), key=b"k", must_not_exist=False)
            ),
            "must_not_exist: must be true when set",
        ),
        (
            client.kv.CompareAndSet(
                kv_pb2.CompareAndSetRequest(
                    header=client.header(), key=b"k", mod_revision_equals=-2
                )
            ),
            "mod_revision_equals: must be >= 0, got -2",
        ),
        (client.kv.Add(kv_pb2.AddRequest(key=b"k", delta=1)), "header: required"),
    ]
    for call, message in cases:
        failure = await fails(call)
        assert (failure.code, failure.reason) == (Code.INVALID_ARGUMENT, "INVALID_REQUEST")
        assert failure.details.startswith(message), failure.details
    assert len(client.node.proposals) == 1


async def test_size_limits_are_refused_before_proposing(client: Client) -> None:
    too_long_key = await fails(client.put(b"k" * 17, b""))
    assert (too_long_key.code, too_long_key.reason) == (Code.RESOURCE_EXHAUSTED, "KEY_TOO_LARGE")
    assert too_long_key.details == "key of 17 bytes exceeds the limit of 16 bytes"
    too_long_value = await fails(client.put(b"k", b"v" * 33))
    assert (too_long_value.code, too_long_value.reason) == (
        Code.RESOURCE_EXHAUSTED,
        "VALUE_TOO_LARGE",
    )
    long_get = await fails(client.kv.Get(kv_pb2.GetRequest(key=b"g" * 17)))
    assert long_get.reason == "KEY_TOO_LARGE"
    assert len(client.node.proposals) == 1


async def test_state_machine_failures_map_to_their_status(client: Client) -> None:
    await client.put(b"text", b"abc")
    not_integer = await fails(client.kv.Add(kv_pb2.AddRequest(header=client.header(), key=b"text")))
    assert (not_integer.code, not_integer.reason) == (Code.FAILED_PRECONDITION, "NOT_AN_INTEGER")

    await client.kv.Add(kv_pb2.AddRequest(header=client.header(), key=b"big", delta=2**63 - 1))
    overflow = await fails(
        client.kv.Add(kv_pb2.AddRequest(header=client.header(), key=b"big", delta=1))
    )
    assert (overflow.code, overflow.reason) == (Code.OUT_OF_RANGE, "ADD_OVERFLOW")

    no_lease = await fails(client.put(b"k", b"v", lease_id=999))
    assert (no_lease.code, no_lease.reason) == (Code.NOT_FOUND, "LEASE_NOT_FOUND")
    assert no_lease.details == "lease 999 does not exist (revoked, expired or never granted)"

    stale = await fails(client.put(b"k", b"v", fence=common_pb2.Fence(lease_id=5, token=5)))
    assert (stale.code, stale.reason) == (Code.FAILED_PRECONDITION, "STALE_FENCE")

    gone = common_pb2.RequestHeader(session_id=424242, sequence=1)
    expired = await fails(client.kv.Put(kv_pb2.PutRequest(header=gone, key=b"k")))
    assert (expired.code, expired.reason) == (Code.NOT_FOUND, "SESSION_EXPIRED")

    acknowledged = common_pb2.RequestHeader(
        session_id=client.session_id,
        sequence=client.sequence + 1,
        first_unacked=client.sequence + 1,
    )
    await client.kv.Put(kv_pb2.PutRequest(header=acknowledged, key=b"k"))
    discarded = common_pb2.RequestHeader(session_id=client.session_id, sequence=1)
    old = await fails(client.kv.Put(kv_pb2.PutRequest(header=discarded, key=b"k")))
    assert (old.code, old.reason) == (Code.FAILED_PRECONDITION, "SEQUENCE_DISCARDED")


async def test_fenced_writes_pass_with_the_current_token(client: Client) -> None:
    grant = await client.lease.Grant(
        lease_pb2.LeaseGrantRequest(header=client.header(), ttl_ms=5000)
    )
    fence = common_pb2.Fence(lease_id=grant.lease_id, token=grant.fencing_token)
    put = await client.put(b"f", b"v", lease_id=grant.lease_id, fence=fence)
    assert put.kv.lease_id == grant.lease_id


async def test_a_sequence_reused_for_another_kind_of_request_is_refused(client: Client) -> None:
    """The session's cache answers a sequence it has seen with what it answered then; for
    another kind of request that answer cannot be returned (the servicer raised
    AssertionError: INTERNAL, found by the fuzzer). It is refused as the client's mistake."""
    header = client.header()
    await client.kv.Put(kv_pb2.PutRequest(header=header, key=b"a", value=b"1"))
    reused = await fails(client.kv.Delete(kv_pb2.DeleteRequest(header=header, key=b"a")))
    assert reused.code == Code.FAILED_PRECONDITION, reused
    assert f"sequence {header.sequence} already answered another request" in reused.details
    got = await client.kv.Get(kv_pb2.GetRequest(key=b"a"))
    assert got.kv.value == b"1"  # nothing was deleted
