"""rallypoint's Raft consensus core: a pure state machine modelled on etcd-io/raft.

The application drives a :class:`RawNode` (ticks, messages, proposals) and handles the
:class:`Ready` batches it produces; see :mod:`rallypoint.raft.rawnode` for the contract.
"""

from .errors import (
    ConfChangeError,
    ConfigError,
    ProposalDroppedError,
    RaftError,
    StepLocalMsgError,
    StepPeerNotFoundError,
)
from .log import Logger, RaftLog
from .log_storage import (
    CompactedError,
    MemoryStorage,
    SnapOutOfDateError,
    SnapshotTemporarilyUnavailableError,
    Storage,
    StorageError,
    UnavailableError,
)
from .raft import CampaignType, Config, Raft, SoftState, StateType
from .rawnode import BasicStatus, RawNode, Ready, SnapshotStatus, Status
from .read_only import ReadOnlyOption
from .tracker import Progress, ProgressState
from .types import (
    EMPTY_HARD_STATE,
    EMPTY_SNAPSHOT,
    NONE,
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    ReadState,
    Snapshot,
    SnapshotMetadata,
    Term,
)

__all__ = [
    "EMPTY_HARD_STATE",
    "EMPTY_SNAPSHOT",
    "NONE",
    "BasicStatus",
    "CampaignType",
    "CompactedError",
    "ConfChange",
    "ConfChangeError",
    "ConfChangeSingle",
    "ConfChangeTransition",
    "ConfChangeType",
    "ConfState",
    "Config",
    "ConfigError",
    "Entry",
    "EntryType",
    "HardState",
    "Index",
    "Logger",
    "MemoryStorage",
    "Message",
    "MessageType",
    "NodeId",
    "Progress",
    "ProgressState",
    "ProposalDroppedError",
    "Raft",
    "RaftError",
    "RaftLog",
    "RawNode",
    "ReadOnlyOption",
    "ReadState",
    "Ready",
    "SnapOutOfDateError",
    "Snapshot",
    "SnapshotMetadata",
    "SnapshotStatus",
    "SnapshotTemporarilyUnavailableError",
    "SoftState",
    "StateType",
    "Status",
    "StepLocalMsgError",
    "StepPeerNotFoundError",
    "Storage",
    "StorageError",
    "Term",
    "UnavailableError",
]
