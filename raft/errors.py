"""The Raft core's error hierarchy (etcd-io/raft's ``ErrProposalDropped`` and friends).

Expected outcomes the application must handle are typed exceptions deriving from
:class:`RaftError`; a broken invariant inside the core raises ``AssertionError`` or
``RuntimeError`` instead and is never caught here.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base class of every expected outcome the core reports by raising."""


class ProposalDroppedError(RaftError):
    """A proposal was not appended: no leader, transfer in progress, size limit, not a member.

    The message says why. The proposer may retry (usually after learning the new leader).
    """


class StepLocalMsgError(RaftError):
    """A message type that only the node itself may produce arrived through ``step``."""


class StepPeerNotFoundError(RaftError):
    """A response arrived from a node that is not in the current configuration."""


class TermOutOfRangeError(RaftError):
    """A message whose term is above ``MAX_TERM``: adopting it would leave this node (and,
    through it, its cluster) with no term left to campaign in, so it is refused instead.
    Only a bug or a corrupted message carries such a term; the application logs it."""


class ConfigError(RaftError):
    """An invalid :class:`~rallypoint.raft.raft.Config`."""


class ConfChangeError(RaftError):
    """A configuration change that cannot be applied to the current configuration."""
