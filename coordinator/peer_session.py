"""Peer sessions: each message bound to its connection, so a recorded one cannot be replayed.

Theory of operation. The MAC (peer_auth.py) proves that a member made a message, not when:
a proxy on the peer network that recorded a batch (a forwarded proposal, an append) could
send it again, on the same connection or a new one, and it would verify. So every peer
connection is a *session*, one direction of traffic:

- the receiving end opens it with a fresh random *challenge* (``CHALLENGE_BYTES``), sent
  before it reads anything;
- the sending end numbers the messages it sends on that connection 1, 2, 3, ... (the
  *counter*); each message carries the challenge it was made for and its number, and its MAC
  covers both before its own fields (:class:`Stamp`);
- the receiving end takes a message only if its MAC verifies, it was made for this
  connection's challenge, and its number is above every number taken on the connection.

A message replayed on a new connection was made for another connection's challenge; one
replayed on its own connection repeats a number already taken: each is refused with
:class:`PeerReplayError` saying which. Both checks come after the MAC, so what is refused as
a replay was certainly a member's message (an outsider's is refused as unauthenticated and
told nothing). Numbers must rise but may skip: a connection delivers in order, and a message
a proxy withheld is no worse than one the network lost, which Raft tolerates.

Challenges are random and never reused, so nothing is remembered past a connection; and the
sending end makes no decision from the receiver's word (a forged challenge only makes its
messages refused, like a cut connection).

This module is sans-IO: the transport carries the challenge in the connection's opening
``OPEN`` frame (peerwire/, docs/peer-protocol.md), and stamps and checks each message here.

Format version 2 of the peer messages (tags ``.../v2`` in peer_auth.py) is this binding;
version 1 had none. A version-1 message carries no challenge; when its version-1 MAC verifies
it is a member running an older release, refused as such (:func:`is_previous_format`) rather
than as an outsider, so the log says what to do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from .peer_auth import PeerKey

CHALLENGE_BYTES = 16
# The peer message format this release speaks; see the module docstring.
FORMAT_VERSION = 2


class PeerReplayError(Exception):
    """A member's authentic message that was already delivered, or made for another
    connection: a replay. The message says which."""


class ChallengeError(ValueError):
    """A challenge that is not ``CHALLENGE_BYTES`` long (an older or broken receiver)."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """What binds one message to its connection."""

    challenge: bytes
    counter: int
    mac: bytes


def new_challenge() -> bytes:
    return os.urandom(CHALLENGE_BYTES)


def _mac_parts(
    stamp_challenge: bytes, counter: int, fields: Sequence[int | bytes]
) -> list[int | bytes]:
    return [stamp_challenge, counter, *fields]


class OutboundSession:
    """The sending end of one connection: stamps each message with the receiver's challenge
    and the next number.

    Invariant: ``counter`` is the number of the last message stamped (0 before the first)."""

    def __init__(self, key: PeerKey, challenge: bytes) -> None:
        if len(challenge) != CHALLENGE_BYTES:
            raise ChallengeError(
                f"a session challenge of {len(challenge)} bytes (expected {CHALLENGE_BYTES})"
            )
        self._key = key
        self.challenge = challenge
        self.counter = 0

    def stamp(self, tag: bytes, fields: Sequence[int | bytes]) -> Stamp:
        self.counter += 1
        mac = self._key.sign(tag, _mac_parts(self.challenge, self.counter, fields))
        return Stamp(self.challenge, self.counter, mac)


class InboundSession:
    """The receiving end of one connection: issues its challenge, then checks every message.

    Invariant: ``last_counter`` is the highest number taken on this connection (0 before the
    first message)."""

    def __init__(self, key: PeerKey, challenge: bytes | None = None) -> None:
        self._key = key
        self.challenge = new_challenge() if challenge is None else challenge
        self.last_counter = 0

    def authentic(self, tag: bytes, fields: Sequence[int | bytes], stamp: Stamp) -> bool:
        """Whether a member made this message (for whichever connection)."""
        return self._key.verify(tag, _mac_parts(stamp.challenge, stamp.counter, fields), stamp.mac)

    def accept(self, stamp: Stamp) -> None:
        """Take an authentic message's stamp, or raise PeerReplayError."""
        if stamp.challenge != self.challenge:
            raise PeerReplayError(
                "it was made for another connection (its challenge "
                f"{stamp.challenge.hex()[:12]}... is not this one's): a replay"
            )
        if stamp.counter <= self.last_counter:
            raise PeerReplayError(
                f"its number {stamp.counter} was already taken on this connection (last "
                f"{self.last_counter}): a replay"
            )
        self.last_counter = stamp.counter


def is_previous_format(
    key: PeerKey, previous_tag: bytes, fields: Sequence[int | bytes], stamp: Stamp
) -> bool:
    """Whether this is a member's message in format version 1 (no session binding)."""
    return not stamp.challenge and not stamp.counter and key.verify(previous_tag, fields, stamp.mac)
