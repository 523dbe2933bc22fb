"""Flow control and replication state of a follower: Inflights and Progress."""

from __future__ import annotations

import pytest

from rallypoint.raft import Index
from rallypoint.raft.tracker import Inflights, Progress, ProgressState


def new_progress(
    state: ProgressState = ProgressState.PROBE, match: int = 0, next_index: int = 1
) -> Progress:
    pr = Progress(match=Index(match), next=Index(next_index), inflights=Inflights(256))
    pr.state = state
    return pr


def test_inflights_count_limit_and_free() -> None:
    inflights = Inflights(3)
    for index in (1, 2, 3):
        assert not inflights.full()
        inflights.add(Index(index), 10)
    assert inflights.full()
    assert inflights.count() == 3
    with pytest.raises(RuntimeError):
        inflights.add(Index(4), 10)
    inflights.free_le(Index(2))
    assert inflights.indexes() == [3]
    assert inflights.bytes == 10
    assert not inflights.full()
    inflights.free_le(Index(10))
    assert inflights.count() == 0 and inflights.bytes == 0


def test_inflights_byte_limit() -> None:
    inflights = Inflights(100, max_bytes=25)
    inflights.add(Index(1), 10)
    assert not inflights.full()
    inflights.add(Index(2), 15)
    assert inflights.full()  # 25 bytes in flight
    inflights.free_le(Index(1))
    assert not inflights.full()


def test_inflights_indexes_must_increase() -> None:
    inflights = Inflights(10)
    inflights.add(Index(5), 1)
    with pytest.raises(RuntimeError):
        inflights.add(Index(5), 1)


def test_inflights_reset_and_clone_are_independent() -> None:
    inflights = Inflights(10)
    inflights.add(Index(1), 4)
    copy = inflights.clone()
    inflights.reset()
    assert inflights.count() == 0 and inflights.bytes == 0
    assert copy.indexes() == [1] and copy.bytes == 4


def test_become_probe_from_replicate_and_snapshot() -> None:
    pr = new_progress(ProgressState.REPLICATE, match=1, next_index=5)
    pr.become_probe()
    assert (pr.state, pr.match, pr.next) == (ProgressState.PROBE, 1, 2)
    pr = new_progress(ProgressState.PROBE, match=1, next_index=5)
    pr.become_snapshot(Index(10))
    pr.become_probe()
    # The snapshot may have been applied: probe after it.
    assert (pr.state, pr.next) == (ProgressState.PROBE, 11)
    assert pr.pending_snapshot == 0


def test_become_replicate_and_snapshot() -> None:
    pr = new_progress(ProgressState.PROBE, match=1, next_index=5)
    pr.become_replicate()
    assert (pr.state, pr.next) == (ProgressState.REPLICATE, 2)
    pr.become_snapshot(Index(10))
    assert (pr.state, pr.pending_snapshot, pr.next) == (ProgressState.SNAPSHOT, 10, 11)
    assert pr.is_paused()


def test_maybe_update() -> None:
    pr = new_progress(match=3, next_index=5)
    assert not pr.maybe_update(Index(2))  # stale ack
    assert (pr.match, pr.next) == (3, 5)
    assert not pr.maybe_update(Index(3))
    assert pr.maybe_update(Index(4))
    assert (pr.match, pr.next) == (4, 5)
    assert pr.maybe_update(Index(7))
    assert (pr.match, pr.next) == (7, 8)


@pytest.mark.parametrize(
    ("state", "match", "next_index", "rejected", "hint", "decreased", "want_next"),
    [
        # REPLICATE: a rejection at or below match is stale.
        (ProgressState.REPLICATE, 5, 10, 5, 5, False, 10),
        (ProgressState.REPLICATE, 5, 10, 4, 4, False, 10),
        # REPLICATE: otherwise restart right after match.
        (ProgressState.REPLICATE, 5, 10, 9, 9, True, 6),
        # PROBE: only a rejection of the latest probe (next - 1) counts.
        (ProgressState.PROBE, 0, 0, 0, 0, False, 0),
        (ProgressState.PROBE, 0, 10, 5, 5, False, 10),
        # PROBE: next becomes min(rejected, hint + 1), never below match + 1.
        (ProgressState.PROBE, 0, 10, 9, 9, True, 9),
        (ProgressState.PROBE, 0, 2, 1, 1, True, 1),
        (ProgressState.PROBE, 0, 1, 0, 0, True, 1),
        (ProgressState.PROBE, 0, 10, 9, 2, True, 3),
        (ProgressState.PROBE, 0, 10, 9, 0, True, 1),
    ],
)
def test_maybe_decr_to(
    state: ProgressState,
    match: int,
    next_index: int,
    rejected: int,
    hint: int,
    decreased: bool,
    want_next: int,
) -> None:
    pr = new_progress(state, match, next_index)
    assert pr.maybe_decr_to(Index(rejected), Index(hint)) is decreased
    assert pr.match == match
    assert pr.next == want_next


def test_probe_pauses_after_sending_entries_until_ack_or_heartbeat() -> None:
    pr = new_progress(ProgressState.PROBE)
    assert not pr.is_paused()
    pr.update_on_entries_send(0, 0)
    assert not pr.is_paused()  # an empty probe does not pause
    pr.update_on_entries_send(1, 10)
    assert pr.is_paused()
    assert pr.maybe_update(Index(1))
    assert not pr.is_paused()


def test_probe_carries_entries_once_per_position_until_answered() -> None:
    pr = new_progress(ProgressState.PROBE, 3, 6)
    assert not pr.probe_is_empty()
    pr.update_on_entries_send(2, 20)
    assert pr.probe_is_empty()  # a heartbeat answer unpauses it, but the re-probe is empty
    pr.msg_app_flow_paused = False
    pr.update_on_entries_send(0, 0)
    assert pr.probe_is_empty() and pr.is_paused()  # the next waits for a heartbeat answer
    assert pr.maybe_decr_to(Index(5), Index(4))  # rejected: a new position
    assert pr.next == 5 and not pr.probe_is_empty()
    pr.update_on_entries_send(1, 10)
    pr.become_replicate()  # accepted
    assert not pr.probe_is_empty()
    assert pr.copy().probe_sent_entries is False
    pr.become_probe()
    pr.update_on_entries_send(1, 10)
    assert pr.copy().probe_sent_entries is True


def test_replicate_pipelines_until_inflights_are_full() -> None:
    pr = Progress(match=Index(0), next=Index(1), inflights=Inflights(2))
    pr.become_replicate()
    pr.update_on_entries_send(3, 30)
    assert pr.next == 4 and not pr.is_paused()
    pr.update_on_entries_send(2, 20)
    assert pr.next == 6 and pr.is_paused()
    assert pr.inflights.indexes() == [3, 5]
    pr.maybe_update(Index(3))
    pr.inflights.free_le(Index(3))
    pr.msg_app_flow_paused = pr.inflights.full()
    assert not pr.is_paused()


def test_snapshot_state_rejects_entry_sends() -> None:
    pr = new_progress()
    pr.become_snapshot(Index(5))
    with pytest.raises(RuntimeError):
        pr.update_on_entries_send(1, 1)


def test_can_bump_commit() -> None:
    pr = new_progress(ProgressState.REPLICATE, match=5, next_index=8)
    pr.update_on_commit_send(Index(3))
    assert pr.can_bump_commit(Index(4))
    assert not pr.can_bump_commit(Index(3))
    pr.update_on_commit_send(Index(7))
    assert not pr.can_bump_commit(Index(9))  # the follower holds nothing beyond next - 1


def test_copy_is_deep_for_inflights() -> None:
    pr = new_progress(ProgressState.REPLICATE)
    pr.update_on_entries_send(1, 5)
    copy = pr.copy()
    pr.inflights.reset()
    assert copy.inflights.count() == 1
    assert copy.next == pr.next and copy.state is pr.state
