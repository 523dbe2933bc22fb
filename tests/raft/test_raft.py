"""Multi-node behaviour of the Raft core (etcd-io/raft raft_test.go, selected)."""

from __future__ import annotations

from rallypoint.raft import StateType

from .network import Network


def test_three_nodes_elect_a_leader_and_replicate() -> None:
    nt = Network.of_size(3)
    nt.campaign(1)
    assert nt.raft(1).state is StateType.LEADER
    assert nt.raft(2).state is StateType.FOLLOWER
    assert nt.raft(3).state is StateType.FOLLOWER
    nt.propose(1, b"somedata")
    for node_id in (1, 2, 3):
        raft = nt.raft(node_id)
        assert raft.raft_log.committed == 2
        assert nt.peer(node_id).applied_data() == [b"somedata"]
