"""Values shared by commands, results, the store and the watch history."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .codec import record


@record(300)
@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key as stored. Invariants for a stored key: ``create_revision <= mod_revision``;
    ``version >= 1`` counts the changes since the key was (re)created; ``lease_id`` is 0 or a
    live lease. (A DELETE event's ``kv`` is not stored: it has version 0, see :class:`Event`.)"""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int = 0


@record(301)
@dataclass(frozen=True, slots=True)
class Fence:
    """A fencing token presented with a write: the lease it came from and the token."""

    lease_id: int
    token: int


class EventType(enum.IntEnum):
    PUT = 0
    DELETE = 1


@record(302)
@dataclass(frozen=True, slots=True)
class Event:
    """One change to one key. For DELETE, ``kv`` has the key, an empty value and
    ``mod_revision`` = the revision of the delete; ``prev`` is the key before the change."""

    type: EventType
    kv: KeyValue
    prev: KeyValue | None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision
