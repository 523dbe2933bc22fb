"""The sans-IO peer session (coordinator/peer_session.py): both ends without a transport."""

from __future__ import annotations

import dataclasses

import pytest

from rallypoint.coordinator.peer_auth import PeerKey
from rallypoint.coordinator.peer_session import (
    ChallengeError,
    InboundSession,
    OutboundSession,
    PeerReplayError,
    Stamp,
    is_previous_format,
)

KEY = PeerKey(b"peer-session-test-secret")
TAG = b"rallypoint/peer/test/v2"
PREVIOUS_TAG = b"rallypoint/peer/test/v1"
FIELDS: list[int | bytes] = [7, 1, 2, b"payload"]


def connected() -> tuple[OutboundSession, InboundSession]:
    receiver = InboundSession(KEY)
    return OutboundSession(KEY, receiver.challenge), receiver


def test_each_message_is_taken_once_in_order() -> None:
    sender, receiver = connected()
    stamps = [sender.stamp(TAG, FIELDS) for _ in range(3)]
    assert [s.counter for s in stamps] == [1, 2, 3]
    for stamp in stamps:
        assert receiver.authentic(TAG, FIELDS, stamp)
        receiver.accept(stamp)
    with pytest.raises(PeerReplayError, match=r"number 2 was already taken .*last 3"):
        receiver.accept(stamps[1])


def test_a_message_for_another_connection_is_authentic_but_refused() -> None:
    sender, _ = connected()
    stamp = sender.stamp(TAG, FIELDS)
    elsewhere = InboundSession(KEY)
    assert elsewhere.authentic(TAG, FIELDS, stamp)  # a member made it ...
    with pytest.raises(PeerReplayError, match="made for another connection"):
        elsewhere.accept(stamp)  # ... for another connection


def test_the_mac_covers_the_challenge_the_counter_and_the_fields() -> None:
    sender, receiver = connected()
    stamp = sender.stamp(TAG, FIELDS)
    assert not receiver.authentic(TAG, [*FIELDS[:-1], b"changed"], stamp)
    assert not receiver.authentic(TAG, FIELDS, dataclasses.replace(stamp, counter=9))
    other = InboundSession(KEY).challenge
    assert not receiver.authentic(TAG, FIELDS, dataclasses.replace(stamp, challenge=other))
    assert not InboundSession(PeerKey(b"another-secret-entirely")).authentic(TAG, FIELDS, stamp)


def test_numbers_may_skip_a_message_withheld() -> None:
    sender, receiver = connected()
    first, _withheld, third = (sender.stamp(TAG, FIELDS) for _ in range(3))
    receiver.accept(first)
    receiver.accept(third)
    with pytest.raises(PeerReplayError):
        receiver.accept(_withheld)  # late is refused: later numbers were taken


def test_a_challenge_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ChallengeError, match="3 bytes"):
        OutboundSession(KEY, b"abc")


def test_the_previous_format_is_recognised_only_with_its_own_mac() -> None:
    old = Stamp(b"", 0, KEY.sign(PREVIOUS_TAG, FIELDS))
    assert is_previous_format(KEY, PREVIOUS_TAG, FIELDS, old)
    forged = Stamp(b"", 0, PeerKey(b"another-secret-entirely").sign(PREVIOUS_TAG, FIELDS))
    assert not is_previous_format(KEY, PREVIOUS_TAG, FIELDS, forged)
