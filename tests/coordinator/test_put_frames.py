"""The peer messages a put costs in a running cluster: the leader's append and each follower's
ack, then the commit notice, which followers take without answering (``raft.py``,
``COMMIT_NOTICE_CONTEXT``): six messages a put between three members, not eight."""

from __future__ import annotations

from typing import Any

from rallypoint.coordinator.state.commands import Put
from rallypoint.raft.types import Message, MessageType

from .test_node import Cluster, settled, wait_applied
from .test_node import cluster as cluster  # the fixture


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
