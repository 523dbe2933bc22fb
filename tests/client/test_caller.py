"""The client's core on its own, over real gRPC against the fake cluster: what the parts
(jobs, round stores, registries, participants) rely on when they call through it."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from rallypoint.client import InvalidValueError, UnavailableError
from rallypoint.client.caller import Caller
from rallypoint.client.transport import Transport
from rallypoint.proto.v1 import kv_pb2

from .conftest import FAST_BACKOFF
from .fake_server import FakeCluster


def make_caller(endpoints: list[str], **options: float) -> Caller:
    transport = Transport(endpoints, backoff=FAST_BACKOFF, rng=random.Random(11))
    return Caller(
        transport,
        timeout_s=options.get("timeout_s", 5.0),
        session_ttl_s=30.0,
        max_inflight_writes=4,
    )


@pytest.fixture
async def caller(cluster: FakeCluster) -> AsyncIterator[Caller]:
    made = make_caller(cluster.addresses)
    yield made
    await made.close()


async def test_a_write_opens_the_session_and_a_retry_applies_once(
    cluster: FakeCluster, caller: Caller
) -> None:
    assert caller.session_id == 0
    for member in cluster.members:
        member.switches.drop_reply_next = 1
    response = await caller.write(
        lambda s: s.kv.Add,
        lambda header: kv_pb2.AddRequest(header=header, key=b"n", delta=1),
        None,
    )
    # Four attempts (each member lost its reply once) of write 1 of the session the write
    # opened, applied once.
    assert response.value == 1
    assert sum(member.calls["Add"] for member in cluster.members) == 4
    assert cluster.store.applies["Add"] == 1
    assert caller.session_id != 0 and list(cluster.store.sessions[caller.session_id]) == [1]


async def test_a_read_follows_the_leader_and_ask_does_not(
    cluster: FakeCluster, caller: Caller
) -> None:
    follower, leader, _ = cluster.members
    follower.switches.not_leader = leader.address
    caller.transport.note_success(follower.address)
    got = await caller.read(lambda s: s.kv.Get, kv_pb2.GetRequest(key=b"k"), None)
    assert not got.HasField("kv")
    assert (follower.calls["Get"], leader.calls["Get"]) == (1, 1)
    with pytest.raises(UnavailableError) as raised:
        await caller.ask(follower.address, lambda s: s.kv.Get, kv_pb2.GetRequest(key=b"k"), 1.0)
    assert raised.value.leader_hint == leader.address
    assert (follower.calls["Get"], leader.calls["Get"]) == (2, 1)


async def test_deadlines_default_to_the_clients_timeout(cluster: FakeCluster) -> None:
    caller = make_caller(cluster.addresses, timeout_s=7.0)
    try:
        assert caller.deadline(None).timeout_s == 7.0
        assert caller.deadline(0.5).timeout_s == 0.5
        with pytest.raises(InvalidValueError, match="timeout_s"):
            caller.deadline(0)
    finally:
        await caller.close()


async def test_membership_answers_teach_the_transport(cluster: FakeCluster, caller: Caller) -> None:
    first = cluster.members[0].address
    only_one = make_caller([first])
    try:
        members = await only_one.member_list(serializable=True)
        assert [m.client_address for m in members] == cluster.addresses
        assert sorted(only_one.transport.endpoints) == sorted(cluster.addresses)
    finally:
        await only_one.close()


async def test_close_ends_the_session(cluster: FakeCluster) -> None:
    caller = make_caller(cluster.addresses)
    await caller.open_session()
    session_id = caller.session_id
    assert session_id in cluster.store.sessions
    await caller.close()
    assert session_id not in cluster.store.sessions
    with pytest.raises(UnavailableError, match="closed"):
        await caller.read(lambda s: s.kv.Get, kv_pb2.GetRequest(key=b"k"), 1.0)
