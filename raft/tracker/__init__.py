"""Progress tracking: configuration, per-follower replication state and flow control."""

from .inflights import Inflights
from .progress import Progress, ProgressState
from .tracker import ProgressMap, ProgressTracker, TrackerConfig

__all__ = [
    "Inflights",
    "Progress",
    "ProgressMap",
    "ProgressState",
    "ProgressTracker",
    "TrackerConfig",
]
