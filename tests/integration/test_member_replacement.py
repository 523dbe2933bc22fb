"""A client outlives the members it was given: an operator replaces them one by one (as the
fault-injection suite's corrupt nemesis does: remove, add a learner, start it with --join,
promote), and the client, given only the original members' addresses, keeps writing after
the last of them is gone, because it learned the new members as they joined.

(corrupt-3n once failed its availability check this way: members 1 and 2 had been replaced
by 4 and 5, and when 3 was stopped for its damaged WAL every write failed for the rest of the
run, though 4 and 5 had a leader: no client knew their addresses.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.client import FailedPreconditionError, SyncClient

from .harness import ProcessCluster, running_cluster, wait_until

pytestmark = pytest.mark.integration


def replace(cluster: ProcessCluster, admin: SyncClient, old: int) -> str:
    """The operator's procedure (docs/operations.md, "Replacing a member"): the new
    member's client address."""
    admin.member_remove(old)
    cluster.kill(old)
    new = cluster.add_member_process()
    added, _ = admin.member_add(new.peer_address, new.client_address, as_learner=True)
    assert added.member_id == new.member_id
    cluster.start(new.member_id, join=True, initial=cluster.initial_cluster([3]))

    def promoted() -> bool:
        try:
            admin.member_promote(new.member_id)
        except FailedPreconditionError:  # not caught up yet
            return False
        return True

    wait_until(promoted, 30, f"member {new.member_id} promoted", interval_s=0.2)
    return new.client_address


def test_a_client_keeps_writing_after_every_member_it_was_given_is_replaced(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, 3, tick_ms=50) as cluster:
        given = list(cluster.endpoints)
        with (
            SyncClient(given, timeout_s=5) as client,
            SyncClient(given, timeout_s=20) as admin,
        ):
            # Member 3 leads and stays while 1 and 2 are replaced.
            admin.transfer_leader(3)
            client.put("k", "before")
            added = [replace(cluster, admin, old) for old in (1, 2)]

            def learned() -> bool:
                client.put("k", "while replacing")  # a client in use, as a worker's is
                return all(address in client.endpoints for address in added)

            wait_until(learned, 30, "the client to learn the new members", interval_s=0.2)
            # The last member it was given goes; the two new ones are a majority of three.
            cluster.kill(3)
            assert client.put("k", "after").kv.value == b"after"
