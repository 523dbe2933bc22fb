"""Each command is decoded at most once per member: a follower applies the envelope it
decoded to validate the leader's append (test_node.py), and the proposing member applies the
envelope it encoded (``proposals.Waiters.envelope``), so the leader does not decode its own
commands again at apply."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint.coordinator.node.proposals import Waiters
from rallypoint.coordinator.state.commands import Envelope, Put, encode_envelope

from .test_node import Cluster, count_decodes_at_apply, open_session, wait_applied
from .test_node import cluster as cluster  # the fixture


async def test_the_proposer_applies_the_envelope_it_encoded(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N puts through the leader decode (almost) nothing at apply anywhere in the cluster
    (N on the leader before), and every member ends with the same state."""
    leader = await cluster.leader()
    session = await open_session(leader)
    nodes = list(cluster.nodes.values())
    await wait_applied(nodes, leader.state.applied_index)
    decodes = count_decodes_at_apply(monkeypatch)
    puts = 30
    for seq in range(1, puts + 1):
        await leader.propose(Put(b"k%03d" % seq, b"v%d" % seq), session_id=session, sequence=seq)
    await wait_applied(nodes, leader.state.applied_index)
    assert decodes() < puts // 3, f"{decodes()} decodes at apply for {puts} puts"
    assert leader.state.get(b"k030") is not None
    assert all(n.state.snapshot() == leader.state.snapshot() for n in nodes)


async def test_a_waiters_envelope_is_given_only_for_the_very_data_it_proposed() -> None:
    waiters = Waiters()
    envelope = Envelope(1, 1, 0, 5, Put(b"k", b"v"))
    data = b"\x01" + encode_envelope(envelope)
    copy = bytes(bytearray(data))  # equal bytes, another object: a peer's copy, a replay
    started = asyncio.Event()

    def submit() -> None:
        started.set()

    waiting = asyncio.ensure_future(waiters.register(7, submit, 5.0, lambda: None, data, envelope))
    await started.wait()
    assert waiters.envelope(7, data) is envelope
    assert copy == data and waiters.envelope(7, copy) is None
    assert waiters.envelope(8, data) is None
    assert waiters.trigger(7, "applied", data)
    assert await waiting == "applied"
    assert waiters.envelope(7, data) is None  # forgotten once answered
