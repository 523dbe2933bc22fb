"""Quorum arithmetic for majority and joint configurations."""

from .joint import JointConfig
from .majority import INFINITE_INDEX, AckedIndexer, MajorityConfig, VoteResult

__all__ = ["INFINITE_INDEX", "AckedIndexer", "JointConfig", "MajorityConfig", "VoteResult"]
