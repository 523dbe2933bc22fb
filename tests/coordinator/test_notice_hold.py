"""Holding a commit notice for the next message to its peer (coordinator/peerwire/
notice_hold.py): what is held, what takes it along, what is never held, and that a held
notice reaches its peer at the deadline with nothing else to carry it."""

from __future__ import annotations

import dataclasses

import pytest

from rallypoint.coordinator.peerwire import transport as transport_module
from rallypoint.coordinator.peerwire.notice_hold import (
    COMMIT_NOTICE_HOLD_MAX_ENTRIES,
    COMMIT_NOTICE_HOLD_MISSES,
    COMMIT_NOTICE_HOLD_RETRY,
    NoticeHold,
    is_commit_notice,
)
from rallypoint.coordinator.peerwire.transport import StreamSender
from rallypoint.raft.raft import COMMIT_NOTICE_CONTEXT
from rallypoint.raft.types import Entry, Index, Message, MessageType, NodeId, Term
from tests.coordinator.test_transport import Host, Peer, heartbeat, send_and_account, wait_for
from tests.coordinator.test_transport import pair as pair  # the fixture


def notice(index: int, commit: int, term: int = 2) -> Message:
    return Message(
        type=MessageType.MsgApp,
        to=NodeId(2),
        from_=NodeId(1),
        term=Term(term),
        log_term=Term(term),
        index=Index(index),
        commit=Index(commit),
        context=COMMIT_NOTICE_CONTEXT,
    )


def append(index: int, commit: int, count: int = 1) -> Message:
    entries = tuple(Entry(Term(2), Index(index + 1 + i), data=b"e%d" % i) for i in range(count))
    return Message(
        type=MessageType.MsgApp,
        to=NodeId(2),
        from_=NodeId(1),
        term=Term(2),
        log_term=Term(2),
        index=Index(index),
        entries=entries,
        commit=Index(commit),
    )


def test_a_notice_is_held_and_the_next_append_takes_it_along_in_order() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    now, began = hold.offer(notice(10, 10))
    assert (now, began) == ([], True)
    now, began = hold.offer(append(10, 10))
    assert now == [notice(10, 10), append(10, 10)] and not began
    assert hold.held is None and hold.merged == 1 and hold.told == 10


def test_only_commit_notices_are_held() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    probe = dataclasses.replace(notice(10, 10), context=b"")  # an empty probe, answered
    for m in (probe, append(10, 10), heartbeat(3)):
        assert not is_commit_notice(m)
        assert hold.offer(m) == ([m], False)
    assert hold.notices_held == 0


def test_a_later_notice_at_the_same_position_replaces_the_held_one() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    hold.offer(notice(10, 9))
    now, began = hold.offer(notice(10, 10))
    # It tells the follower all the first did (min(commit, index) at the same index) and
    # keeps the first one's deadline.
    assert now == [] and not began and hold.held == notice(10, 10)
    assert hold.release() == notice(10, 10) and hold.released == 1


def test_a_notice_at_another_position_lets_the_held_one_go_first() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    hold.offer(notice(10, 10))
    now, began = hold.offer(notice(12, 12))
    assert now == [notice(10, 10)] and began and hold.held == notice(12, 12)
    now, began = hold.offer(notice(12, 12, term=3))
    assert now == [notice(12, 12)] and began


def test_no_hold_while_the_peer_waits_for_a_request_it_forwarded() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    hold.offer(append(10, 10))
    hold.await_commit(11)  # the peer forwarded the proposal the leader appended at 11
    # Entry 11 on its way, commit still 10.
    assert hold.offer(append(10, 10)) == ([append(10, 10)], False)
    # The notice that commits 11 goes at once; once sent, notices are held again.
    assert hold.offer(notice(11, 11)) == ([notice(11, 11)], False)
    assert hold.offer(notice(11, 12)) == ([], True)


def test_a_notice_that_does_not_yet_reach_what_the_peer_waits_for_goes_at_once_too() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    hold.await_commit(20)
    assert hold.offer(notice(15, 15)) == ([notice(15, 15)], False)
    assert hold.told == 15 and hold.notices_held == 0


def test_a_read_index_answer_takes_the_held_notice_along_and_is_waited_for() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    hold.offer(notice(10, 10))
    answer = Message(
        type=MessageType.MsgReadIndexResp, to=NodeId(2), from_=NodeId(1), index=Index(11)
    )
    assert hold.offer(answer) == ([notice(10, 10), answer], False)
    # The follower waits to apply 11 for that read: the notice that tells it goes at once.
    assert hold.offer(notice(11, 11)) == ([notice(11, 11)], False)


def test_a_notice_that_commits_a_batch_of_entries_goes_at_once() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    hold.offer(append(10, 10))
    batch = 10 + COMMIT_NOTICE_HOLD_MAX_ENTRIES + 1
    assert hold.offer(notice(batch, batch)) == ([notice(batch, batch)], False)
    small = batch + COMMIT_NOTICE_HOLD_MAX_ENTRIES
    assert hold.offer(notice(small, small)) == ([], True)


def test_holding_stops_while_held_notices_go_alone_and_is_tried_again() -> None:
    hold = NoticeHold()
    hold.told = 9
    index = 9
    for _ in range(COMMIT_NOTICE_HOLD_MISSES):
        index += 1
        assert hold.offer(notice(index, index)) == ([], True)
        assert hold.release() == notice(index, index)
    for _ in range(COMMIT_NOTICE_HOLD_RETRY - 1):
        index += 1
        assert hold.offer(notice(index, index)) == ([notice(index, index)], False)
    index += 1
    assert hold.offer(notice(index, index)) == ([], True)  # the retry
    # Carried by the next append: holding resumes.
    assert hold.offer(append(index, index)) == ([notice(index, index), append(index, index)], False)
    assert hold.offer(notice(index + 1, index + 1)) == ([], True)


def test_release_without_a_held_notice_is_nothing() -> None:
    hold = NoticeHold()
    hold.told = 9  # the peer was told commit 9
    assert hold.release() is None
    hold.offer(notice(10, 10))
    hold.offer(heartbeat(10))
    assert hold.release() is None and hold.released == 0


async def test_a_held_notice_reaches_its_peer_at_the_deadline_with_nothing_else_sent(
    pair: tuple[Host, Host, Peer, StreamSender], monkeypatch: pytest.MonkeyPatch
) -> None:
    host, receiver, peer, sender = pair
    await peer.start()
    assert await send_and_account(sender, host, receiver, 9)  # connected, told commit 9
    monkeypatch.setattr(transport_module, "COMMIT_NOTICE_HOLD_S", 0.05)
    sender.send(notice(10, 10))
    assert sender.hold.held is not None
    await wait_for(
        lambda: any(m.type is MessageType.MsgApp for m in receiver.delivered),
        5.0,
        "the held notice",
    )
    assert [m for m in receiver.delivered if m.type is MessageType.MsgApp] == [notice(10, 10)]
    assert sender.hold.released == 1 and sender.hold.held is None
