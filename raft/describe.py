"""One-line, human-readable forms of the Raft vocabulary, in etcd-io/raft's ``Describe*`` style.

The scenario tests (``tests/raft/testdata/*.txt``) print every ``Ready`` and every message
delivered with these functions, so their output is part of those files' expected text: change
a form here and the files must be regenerated. The forms match etcd's where etcd has one, so a
trace from either implementation reads the same::

    1->2 MsgApp Term:1 Log:1/10 Commit:10 Entries:[1/11 EntryNormal "prop_1"]
    1/12 EntryConfChange v2 l3 r4
    Term:2 Vote:1 Commit:11

Data bytes are shown quoted as Go's ``%q`` would (printable ASCII verbatim, other bytes
escaped) so that binary data never breaks a line.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from .codec import CodecError, decode_conf_change
from .raft import SoftState
from .rawnode import Ready
from .types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    NodeId,
    ReadState,
    Snapshot,
)

_ENTRY_TYPE_NAMES = {
    EntryType.NORMAL: "EntryNormal",
    EntryType.CONF_CHANGE: "EntryConfChange",
}

_CONF_CHANGE_LETTERS = {
    ConfChangeType.ADD_NODE: "v",
    ConfChangeType.REMOVE_NODE: "r",
    ConfChangeType.ADD_LEARNER_NODE: "l",
}


def quote_bytes(data: bytes) -> str:
    """``data`` in double quotes, printable ASCII kept, everything else escaped (Go's %q)."""
    out = ['"']
    for byte in data:
        char = chr(byte)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    out.append('"')
    return "".join(out)


def state_name(state: enum.Enum) -> str:
    """etcd's spelling of a role or progress state: ``PRE_CANDIDATE`` -> ``StatePreCandidate``."""
    return "State" + "".join(part.capitalize() for part in state.name.split("_"))


def describe_conf_change(cc: ConfChange) -> str:
    """The changes as etcd's ``ConfChangesToString``: ``v2 l3 r4`` (empty: leave joint)."""
    return " ".join(f"{_CONF_CHANGE_LETTERS[c.type]}{c.node_id}" for c in cc.changes)


def describe_entry(entry: Entry) -> str:
    """``term/index type data``; a conf change entry shows its changes (``v2 l3 r4``)."""
    if entry.type is EntryType.CONF_CHANGE:
        try:
            formatted = describe_conf_change(decode_conf_change(entry.data))
        except CodecError:
            # A malformed entry must still be describable: it is what a test would print
            # while investigating how it got there.
            formatted = "<undecodable> " + quote_bytes(entry.data)
    else:
        formatted = quote_bytes(entry.data)
    suffix = " " + formatted if formatted else ""
    return f"{entry.term}/{entry.index} {_ENTRY_TYPE_NAMES[entry.type]}{suffix}"


def describe_entries(entries: Iterable[Entry]) -> str:
    """One line per entry, each ending in a newline (etcd's ``DescribeEntries``)."""
    return "".join(describe_entry(e) + "\n" for e in entries)


def describe_hard_state(hs: HardState) -> str:
    """``Term:2 Vote:1 Commit:11``; the vote is left out when it is NONE."""
    vote = f" Vote:{hs.vote}" if hs.vote != NONE else ""
    return f"Term:{hs.term}{vote} Commit:{hs.commit}"


def _ids(ids: tuple[NodeId, ...]) -> str:
    return "[" + " ".join(str(i) for i in ids) + "]"


def describe_conf_state(cs: ConfState) -> str:
    """All four member lists and the auto-leave flag, as etcd prints them."""
    return (
        f"Voters:{_ids(cs.voters)} VotersOutgoing:{_ids(cs.voters_outgoing)} "
        f"Learners:{_ids(cs.learners)} LearnersNext:{_ids(cs.learners_next)} "
        f"AutoLeave:{str(cs.auto_leave).lower()}"
    )


def describe_snapshot(snap: Snapshot) -> str:
    meta = snap.metadata
    return f"Index:{meta.index} Term:{meta.term} ConfState:{describe_conf_state(meta.conf_state)}"


def describe_soft_state(ss: SoftState) -> str:
    return f"Lead:{ss.lead} State:{state_name(ss.raft_state)}"


def describe_read_state(rs: ReadState) -> str:
    return f"Index:{rs.index} RequestCtx:{quote_bytes(rs.request_ctx)}"


def describe_message(m: Message) -> str:
    """``from->to type Term:t Log:logterm/index`` and whichever optional fields are set."""
    parts = [f"{m.from_}->{m.to} {m.type.name} Term:{m.term} Log:{m.log_term}/{m.index}"]
    if m.reject:
        parts.append(f"Rejected (Hint: {m.reject_hint})")
    if m.commit != 0:
        parts.append(f"Commit:{m.commit}")
    if m.entries:
        parts.append("Entries:[" + ", ".join(describe_entry(e) for e in m.entries) + "]")
    if m.context:
        parts.append(f"Context:{quote_bytes(m.context)}")
    if m.snapshot is not None and not m.snapshot.is_empty():
        parts.append(f"Snapshot: {describe_snapshot(m.snapshot)}")
    return " ".join(parts)


def describe_ready(rd: Ready) -> str:
    """A multi-line description of everything a Ready asks of the application.

    ``<empty Ready>`` when it asks for nothing; otherwise a ``Ready MustSync=...:`` header
    followed by one section per non-empty part, in the order the application handles them.
    Every line ends in a newline.
    """
    lines: list[str] = []
    if rd.soft_state is not None:
        lines.append(describe_soft_state(rd.soft_state))
    if not rd.hard_state.is_empty():
        lines.append("HardState " + describe_hard_state(rd.hard_state))
    if rd.read_states:
        lines.append("ReadStates:")
        lines.extend(describe_read_state(rs) for rs in rd.read_states)
    if rd.entries:
        lines.append("Entries:")
        lines.extend(describe_entry(e) for e in rd.entries)
    if not rd.snapshot.is_empty():
        lines.append("Snapshot " + describe_snapshot(rd.snapshot))
    if rd.committed_entries:
        lines.append("CommittedEntries:")
        lines.extend(describe_entry(e) for e in rd.committed_entries)
    # One list, as etcd-io/raft's scenario files print it: those to send now, then those
    # to send once persisted.
    messages = (*rd.messages, *rd.messages_after_persist)
    if messages:
        lines.append("Messages:")
        lines.extend(describe_message(m) for m in messages)
    if not lines:
        return "<empty Ready>\n"
    header = f"Ready MustSync={str(rd.must_sync).lower()}:"
    return "".join(line + "\n" for line in [header, *lines])
