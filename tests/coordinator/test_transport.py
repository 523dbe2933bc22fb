"""The peer transport on loopback: no message is lost without Raft being told.

One sender (member 1) and a real listener for member 2 on a real port that the tests stop,
restart and move (the stream peer protocol, coordinator/peerwire/). The rule under test is
the transport's contract with Raft: every message handed to ``send`` is delivered, or
``report_unreachable`` (``report_snapshot`` for snapshots) is called after it was handed
over.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rallypoint.coordinator.member_table import MemberTable
from rallypoint.coordinator.peer_auth import PeerKey
from rallypoint.coordinator.peerwire.server import PeerListener
from rallypoint.coordinator.peerwire.transport import StreamSender
from rallypoint.coordinator.transport import OUTBOX_LIMIT
from rallypoint.raft.types import (
    ConfState,
    Entry,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

CLUSTER_ID = 0x72616C6C79


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Host:
    """A PeerHost that records what the transport tells it."""

    def __init__(self, member_id: int, tmp: Path) -> None:
        self._member_id = member_id
        self.addresses: dict[int, str] = {}
        self.delivered: list[Message] = []
        self.unreachable = 0
        self.snapshot_reports: list[bool] = []
        self.refusals: list[tuple[str, str]] = []
        self.reports: list[bytes] = []
        self._tmp = tmp
        # What this member answers a members question with (peer_lookup.py).
        self.applied_index = 1
        self.table = MemberTable()

    @property
    def member_id(self) -> int:
        return self._member_id

    @property
    def cluster_id(self) -> int:
        return CLUSTER_ID

    peer_key = PeerKey(b"transport-test-secret")
    incarnation = 7
    abstaining = False
    accepts_traffic = True
    stopping = False
    peer_names_required = False
    max_snapshot_bytes = 1 << 20

    def deliver(self, messages: list[Message], incarnation: int, abstaining: bool) -> None:
        self.delivered.extend(messages)

    def hello_answer(self, from_id: int, probe: bool = False) -> tuple[bool, bool, int, int]:
        return False, True, 1, 1

    def verify_snapshot(self, snapshot: Snapshot) -> None:
        pass

    def validate_entries(self, entries: tuple[Entry, ...]) -> None:
        pass

    def peer_address(self, member_id: int) -> str | None:
        return self.addresses.get(member_id)

    def peer_addresses(self) -> dict[int, str]:
        return dict(self.addresses)

    def learn_peer_address(self, member_id: int, address: str) -> None:
        self.addresses.setdefault(member_id, address)

    def members_answer(self) -> tuple[int, MemberTable]:
        return self.applied_index, self.table

    def report_unreachable(self, member_id: int) -> None:
        self.unreachable += 1

    def report_snapshot(self, member_id: int, ok: bool) -> None:
        self.snapshot_reports.append(ok)

    def incoming_snapshot_dir(self) -> str:
        return str(self._tmp)

    def liveness_report(self, from_id: int, payload: bytes) -> bool:
        self.reports.append(payload)
        return True

    def note_peer_refusal(self, reason: str, from_id: int, detail: str) -> None:
        self.refusals.append((reason, detail))


class Peer:
    """Member 2's listener, which can be stopped and started again on its port."""

    def __init__(self, host: Host, port: int) -> None:
        self.host = host
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.listener: PeerListener | None = None

    async def start(self) -> None:
        self.listener = PeerListener(self.host)
        await self.listener.start(self.address)

    async def stop(self) -> None:
        if self.listener is not None:
            await self.listener.stop(grace=None)
            self.listener = None


def heartbeat(n: int) -> Message:
    # The commit field tells the messages apart.
    return Message(
        type=MessageType.MsgHeartbeat, to=NodeId(2), from_=NodeId(1), term=Term(1), commit=Index(n)
    )


def snapshot_message() -> Message:
    metadata = SnapshotMetadata(ConfState(voters=(NodeId(1),)), Index(5), Term(1))
    return Message(
        type=MessageType.MsgSnap,
        to=NodeId(2),
        from_=NodeId(1),
        term=Term(1),
        snapshot=Snapshot(b"", metadata),
    )


def delivered_numbers(host: Host) -> set[int]:
    return {int(m.commit) for m in host.delivered if m.type is MessageType.MsgHeartbeat}


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Host, Host, Peer, StreamSender]]:
    sender_host = Host(1, tmp_path / "1")
    receiver_host = Host(2, tmp_path / "2")
    (tmp_path / "2").mkdir()
    peer = Peer(receiver_host, free_port())
    sender_host.addresses[2] = peer.address
    sender = StreamSender(sender_host, 2, None, random.Random(7))
    sender.start()
    try:
        yield sender_host, receiver_host, peer, sender
    finally:
        await sender.stop()
        await peer.stop()


async def send_and_account(sender: StreamSender, host: Host, receiver: Host, n: int) -> bool:
    """Send heartbeat ``n``; wait until it is delivered (True) or Raft is told that
    something may be lost (False). Neither within seconds is a silent loss."""
    reports_before = host.unreachable
    sender.send(heartbeat(n))
    await wait_for(
        lambda: n in delivered_numbers(receiver) or host.unreachable > reports_before,
        5.0,
        f"heartbeat {n} to arrive or be reported lost",
    )
    return n in delivered_numbers(receiver)


async def test_streams_that_failed_while_the_peer_was_down_lose_nothing_later(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, sender = pair
    # The peer is down: every attempt fails (and is reported).
    for n in range(1, 30):
        sender.send(heartbeat(n))
        await asyncio.sleep(0.05)
    assert host.unreachable >= 1
    await asyncio.sleep(1.0)  # the old transport kept reopening streams in the background
    await peer.start()
    outcomes = [await send_and_account(sender, host, receiver, n) for n in range(100, 140)]
    # Once connected, it stays connected: the last messages all arrived.
    assert all(outcomes[-20:]), outcomes


async def test_a_stream_that_breaks_is_reported_and_reopened(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, sender = pair
    await peer.start()
    assert all([await send_and_account(sender, host, receiver, n) for n in range(1, 6)])
    await peer.stop()
    reports_before = host.unreachable
    for n in range(10, 15):
        await send_and_account(sender, host, receiver, n)
    assert host.unreachable > reports_before
    await peer.start()
    outcomes = [await send_and_account(sender, host, receiver, n) for n in range(20, 50)]
    assert all(outcomes[-10:]), outcomes
    assert sender.streams_broken >= 1


async def test_a_full_outbox_drops_the_oldest_and_says_so(tmp_path: Path) -> None:
    host = Host(1, tmp_path)
    sender = StreamSender(host, 2, None, random.Random(1))  # not started
    for n in range(OUTBOX_LIMIT + 3):
        sender.send(heartbeat(n))
    assert sender.dropped == 3
    assert host.unreachable == 3


async def test_messages_for_a_peer_without_an_address_are_reported(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, _peer, sender = pair
    del host.addresses[2]
    assert not await send_and_account(sender, host, receiver, 1)


async def test_the_sender_follows_a_peer_to_its_new_address_even_mid_snapshot(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, sender = pair
    await peer.start()
    assert await send_and_account(sender, host, receiver, 1)
    moved = Peer(receiver, free_port())
    await moved.start()
    try:
        host.addresses[2] = moved.address
        # A snapshot transfer starts first, to the new address, beside the live connection.
        sender.send(snapshot_message())
        await wait_for(lambda: bool(host.snapshot_reports), 5.0, "the snapshot's outcome")
        await peer.stop()
        outcomes = [await send_and_account(sender, host, receiver, n) for n in range(10, 30)]
        assert all(outcomes[-10:]), outcomes
    finally:
        await moved.stop()


async def test_snapshot_outcomes_are_reported_both_ways(
    pair: tuple[Host, Host, Peer, StreamSender],
) -> None:
    host, receiver, peer, sender = pair
    snapshot = snapshot_message()
    sender.send(snapshot)  # the peer is down
    await wait_for(lambda: len(host.snapshot_reports) == 1, 15.0, "the failed snapshot's report")
    assert host.snapshot_reports == [False]
    await peer.start()
    sender.send(snapshot)
    await wait_for(lambda: len(host.snapshot_reports) == 2, 10.0, "the snapshot's report")
    assert host.snapshot_reports == [False, True]
    assert any(m.type is MessageType.MsgSnap for m in receiver.delivered)
