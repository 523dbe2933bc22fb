"""Typed errors of the rendezvous, round-store and checkpoint services.

``errors.map_rpc_error`` turns every failed RPC into the client's error hierarchy by status
code (and by reason for the key-value and lease reasons). The reasons rendezvous.proto adds
(STALE_ROUND, STALE_TOKEN, JOB_NOT_FOUND, ...) are refined here, once, into subclasses of
the class the status code already gave, so ``except FailedPreconditionError`` still catches a
stale round. Every call of the rendezvous, round-store and checkpoint clients goes through
:func:`refined`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import TypeVar

from .errors import (
    FailedPreconditionError,
    InternalError,
    NotFoundError,
    RallypointError,
    ResourceExhaustedError,
)

T = TypeVar("T")


class JobNotFoundError(NotFoundError):
    """The job does not exist (and the join carried no config to create it)."""


class ParticipantNotFoundError(NotFoundError):
    """The participant is not in the job (it left, was evicted or declared failed)."""


class CheckpointNotFoundError(NotFoundError):
    pass


class JobClosedError(FailedPreconditionError):
    """The job is closed: no round will follow until it is configured again."""


class ConfigConflictError(FailedPreconditionError):
    """The config differs from the job's in a way the job cannot take now."""


class StaleRoundError(FailedPreconditionError):
    """The round named is not the job's current ACTIVE round, or the participant is not one
    of its members: the world this request was made for is gone."""


class StaleTokenError(FailedPreconditionError):
    """The checkpoint operation's fencing token is not the current round's."""


class CheckpointIncompleteError(FailedPreconditionError):
    """A commit before every rank reported its shard (the message lists the missing ranks)."""


class HeldOutError(FailedPreconditionError):
    """A join by the name of a rank the straggler policy evicted, within the job's straggler
    hold (JobConfig.straggler_hold_windows): it may join again after ``retry_after_s``."""

    @property
    def retry_after_s(self) -> float | None:
        """How long the hold had left when the join was refused (None if the message does
        not say: a server that words it otherwise)."""
        match = _JOIN_AGAIN_IN.search(self.server_message)
        return float(match.group(1)) if match else None


# The server's HeldOut message says "join again in <seconds> s" (coordinator/state/errors.py).
_JOIN_AGAIN_IN = re.compile(r"join again in ([0-9]+(?:\.[0-9]+)?) s")


class NameTakenError(RallypointError):
    """Another session's participant has this name in the job (ALREADY_EXISTS)."""


class LimitExceededError(ResourceExhaustedError):
    """Too many jobs, waiting participants, store keys or bytes, or pending checkpoints."""


class ParticipantLostError(RallypointError):
    """Raised client-side: the coordinator no longer counts this participant in its job
    (declared failed, evicted, its session ended, or the job closed)."""


# reason -> (the class the status code maps to, the refined class).
_REFINED: dict[str, tuple[type[RallypointError], type[RallypointError]]] = {
    "JOB_NOT_FOUND": (NotFoundError, JobNotFoundError),
    "PARTICIPANT_NOT_FOUND": (NotFoundError, ParticipantNotFoundError),
    "CHECKPOINT_NOT_FOUND": (NotFoundError, CheckpointNotFoundError),
    "JOB_CLOSED": (FailedPreconditionError, JobClosedError),
    "CONFIG_CONFLICT": (FailedPreconditionError, ConfigConflictError),
    "STALE_ROUND": (FailedPreconditionError, StaleRoundError),
    "STALE_TOKEN": (FailedPreconditionError, StaleTokenError),
    "CHECKPOINT_INCOMPLETE": (FailedPreconditionError, CheckpointIncompleteError),
    "HELD_OUT": (FailedPreconditionError, HeldOutError),
    # ALREADY_EXISTS has no class of its own in errors.py: it arrives as InternalError.
    "NAME_TAKEN": (InternalError, NameTakenError),
    "LIMIT_EXCEEDED": (ResourceExhaustedError, LimitExceededError),
}


def refine(error: RallypointError) -> RallypointError:
    """The typed error for a rendezvous reason; ``error`` itself for anything else."""
    entry = _REFINED.get(error.reason)
    if entry is None or type(error) is not entry[0]:
        return error
    message = error.server_message
    if entry[0] is InternalError:
        # Drop the "(status ...)" InternalError appends: the class now says what happened.
        message = message.rsplit(" (status ", 1)[0]
    typed = entry[1](message, reason=error.reason, leader_hint=error.leader_hint)
    typed.carry_from(error)
    return typed


async def refined(call: Awaitable[T]) -> T:
    """Await ``call``, raising its failure as the typed error."""
    try:
        return await call
    except RallypointError as error:
        typed = refine(error)
        if typed is error:
            raise
        raise typed from None
