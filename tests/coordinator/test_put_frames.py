"""The peer messages a put costs in a running cluster: the leader's append and each follower's
ack, then the commit notice, which followers take without answering (``raft.py``,
``COMMIT_NOTICE_CONTEXT``): six messages a put between three members, not eight. The notice
waits for the next message to its follower and travels in the same frame
(``peerwire/notice_hold.py``), except to a follower that waits on its apply to answer a
request it forwarded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.coordinator.node.driver import Node
from rallypoint.coordinator.peerwire import transport as transport_module
from rallypoint.coordinator.peerwire.notice_hold import is_commit_notice
from rallypoint.coordinator.state.commands import Put
from rallypoint.raft.types import Message, MessageType

from .test_node import Cluster, open_session, settled, wait_applied
from .test_node import cluster as cluster  # the fixture

# Long enough that nothing but the next message to a follower lets a held notice go in
# these tests: what they count then does not depend on the machine's speed.
LONG_HOLD_S = 60.0


async def test_followers_answer_a_puts_append_but_not_its_commit_notice(
    cluster: Cluster,
) -> None:
    leader, session, nodes = await settled(cluster)
    sent: dict[int, list[Message]] = {node.member_id: [] for node in nodes}
    for node in nodes:
        send = node._transport.send

        def recorded(
            messages: tuple[Message, ...], send: Any = send, member: int = node.member_id
        ) -> None:
            sent[member].extend(messages)
            send(messages)

        node._transport.send = recorded  # type: ignore[method-assign]
    puts = 20
    for seq in range(1, puts + 1):
        await leader.propose(Put(b"k%03d" % seq, b"v"), session_id=session, sequence=seq)
    await wait_applied(nodes, leader.state.applied_index)
    notices = [m for m in sent[leader.member_id] if m.type is MessageType.MsgApp and not m.entries]
    # Each put is answered once committed, before the next is proposed: its commit reaches
    # the followers in an entry-less append of its own.
    assert len(notices) >= puts, notices
    for node in nodes:
        if node is leader:
            continue
        acks = [m for m in sent[node.member_id] if m.type is MessageType.MsgAppResp]
        # One ack per put's append (a few more if a heartbeat answer found the follower
        # probing on a loaded machine); answering each notice too made it 2 per put.
        assert puts <= len(acks) < 3 * puts // 2, (node.member_id, len(acks))
    assert all(n.state.get(b"k020") is not None for n in nodes)


def record_batches(node: Node) -> list[list[Message]]:
    """Every batch of messages ``node`` receives from its peers, as delivered."""
    batches: list[list[Message]] = []
    deliver = node.peers.deliver

    def recorded(messages: list[Message], incarnation: int = 0, abstaining: bool = False) -> None:
        batches.append(list(messages))
        deliver(messages, incarnation, abstaining)

    node.peers.deliver = recorded  # type: ignore[method-assign]
    return batches


async def test_a_commit_notice_travels_with_the_next_puts_append_not_alone(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 puts one after another: each commit notice reached its follower in the frame of
    the next put's append (or of a heartbeat), never in a frame of its own; before, each
    was a frame of its own, two frames from the leader to each follower a put."""
    leader = await cluster.leader()
    session = await open_session(leader)
    nodes = list(cluster.nodes.values())
    await wait_applied(nodes, leader.state.applied_index)
    monkeypatch.setattr(transport_module, "COMMIT_NOTICE_HOLD_S", LONG_HOLD_S)
    followers = [node for node in nodes if node is not leader]
    received = {node.member_id: record_batches(node) for node in followers}
    puts = 20
    for seq in range(1, puts + 1):
        await leader.propose(Put(b"k%03d" % seq, b"v"), session_id=session, sequence=seq)
    # The last put's notice waits for the next heartbeat (every tick).
    await wait_applied(nodes, leader.state.applied_index)
    for node in followers:
        batches = received[node.member_id]
        alone = [b for b in batches if all(is_commit_notice(m) for m in b)]
        assert not alone, (node.member_id, alone)
        carried = [m for b in batches for m in b if is_commit_notice(m)]
        assert len(carried) >= puts, (node.member_id, len(carried))
    assert all(n.state.get(b"k020") is not None for n in nodes)


@pytest.fixture
async def slow_ticks(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A cluster whose followers wait 0.5-1 s for a leader before campaigning, so that a
    test may hold back a follower's heartbeats for a moment."""
    c = Cluster(tmp_path, 3, tick_ms=50)
    await c.start_all()
    yield c
    for member_id in list(c.nodes):
        await c.stop(member_id)
    assert not c.fatal


def without_heartbeats_to(leader: Node, member_id: int) -> None:
    """The leader's heartbeats to ``member_id`` are lost: nothing but what a write or read
    sends it can take a held notice there."""
    send = leader._transport.send

    def filtered(messages: tuple[Message, ...] | list[Message]) -> None:
        send(
            [m for m in messages if not (m.type is MessageType.MsgHeartbeat and m.to == member_id)]
        )

    leader._transport.send = filtered  # type: ignore[method-assign]


async def test_a_write_forwarded_through_a_follower_waits_for_no_held_notice(
    slow_ticks: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower answers a write it forwarded once it has applied it: the notice that
    commits it goes at once, not with the next message (here, with the heartbeats lost,
    there would be none within the puts' timeout)."""
    await slow_ticks.settle()  # nothing else in flight when the heartbeats stop
    leader = await slow_ticks.leader()
    follower = next(n for n in slow_ticks.nodes.values() if n is not leader)
    session = await open_session(follower)
    monkeypatch.setattr(transport_module, "COMMIT_NOTICE_HOLD_S", LONG_HOLD_S)
    without_heartbeats_to(leader, follower.member_id)
    for seq in range(1, 11):
        await follower.propose(
            Put(b"f%03d" % seq, b"v"), session_id=session, sequence=seq, timeout_s=5.0
        )
    assert follower.state.get(b"f010") is not None


async def test_a_read_through_a_follower_takes_the_held_notice_along(
    slow_ticks: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put on the leader leaves its notice to a follower held; a linearizable read on that
    follower gets the leader's answer, which carries the notice, and sees the put."""
    await slow_ticks.settle()  # nothing else in flight when the heartbeats stop
    leader = await slow_ticks.leader()
    follower = next(n for n in slow_ticks.nodes.values() if n is not leader)
    session = await open_session(leader)
    await wait_applied([follower], leader.state.applied_index)
    monkeypatch.setattr(transport_module, "COMMIT_NOTICE_HOLD_S", LONG_HOLD_S)
    without_heartbeats_to(leader, follower.member_id)
    await leader.propose(Put(b"r", b"v"), session_id=session, sequence=1)
    await follower.read_barrier(timeout_s=5.0)
    assert follower.state.get(b"r") is not None
