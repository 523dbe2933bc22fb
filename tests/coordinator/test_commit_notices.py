"""A stream of writes costs each follower one append and one acknowledgement per write: the
leader's commit notice (an entry-less MsgApp) waits for the next append, which carries the
commit index (coordinator/transport.py, module docstring), and every follower still applies
everything."""

from __future__ import annotations

import pytest

from rallypoint.coordinator.state.commands import Put
from rallypoint.coordinator.state.results import PutResult

from .test_node import Cluster, wait_applied
from .test_node import cluster as cluster  # the fixture
from .test_proposal_batching import writer_and_follower_appends

WRITES = 40


async def test_one_write_after_another_sends_each_follower_one_append_per_write(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, session, received = await writer_and_follower_appends(cluster, monkeypatch)
    last = 0
    for number in range(WRITES):
        result = await leader.propose(
            Put(b"k%d" % number, b"v"), session_id=session, sequence=number + 1
        )
        assert isinstance(result, PutResult)
        last = result.kv.mod_revision
    # Nothing is lost on the way: every member applies every write, the last one included
    # (its commit notice has no append after it, and goes alone).
    await wait_applied(list(cluster.nodes.values()), last)
    notices = [message for message in received if not message.entries]
    appends = [message for message in received if message.entries]
    assert len(appends) == WRITES, len(appends)
    # One entry-less MsgApp per write before (the commit notice after each commit); now
    # the next append carries the commit index, and only a notice with no append soon
    # after it (the last write's, or one the machine's load delayed) goes alone.
    # (Measured: 3-5 of them for 40 writes now, 43 before.)
    assert len(notices) <= WRITES // 2, (len(notices), len(appends))
    assert any(message.commit >= appends[0].entries[0].index for message in appends[1:])
