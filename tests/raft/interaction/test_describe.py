"""The one-line forms printed by the scenario files (etcd-io/raft's Describe* style)."""

from __future__ import annotations

from rallypoint.raft import Ready, SoftState, StateType
from rallypoint.raft.codec import encode_conf_change
from rallypoint.raft.describe import (
    describe_conf_state,
    describe_entry,
    describe_hard_state,
    describe_message,
    describe_ready,
    quote_bytes,
    state_name,
)
from rallypoint.raft.types import (
    ConfChange,
    ConfChangeSingle,
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


def entry(term: int, index: int, data: bytes = b"") -> Entry:
    return Entry(Term(term), Index(index), EntryType.NORMAL, data)


def test_message_with_one_entry_matches_etcd() -> None:
    m = Message(
        MessageType.MsgApp,
        to=NodeId(2),
        from_=NodeId(1),
        term=Term(1),
        log_term=Term(1),
        index=Index(10),
        commit=Index(10),
        entries=(entry(1, 11, b"prop_1"),),
    )
    assert describe_message(m) == (
        '1->2 MsgApp Term:1 Log:1/10 Commit:10 Entries:[1/11 EntryNormal "prop_1"]'
    )


def test_rejection_context_and_snapshot_are_shown() -> None:
    snap = Snapshot(b"", SnapshotMetadata(ConfState(voters=(NodeId(1),)), Index(5), Term(2)))
    m = Message(
        MessageType.MsgAppResp,
        to=NodeId(1),
        from_=NodeId(3),
        term=Term(2),
        index=Index(7),
        reject=True,
        reject_hint=Index(4),
        context=b"ctx",
        snapshot=snap,
    )
    assert describe_message(m) == (
        '3->1 MsgAppResp Term:2 Log:0/7 Rejected (Hint: 4) Context:"ctx" Snapshot: Index:5 '
        "Term:2 ConfState:Voters:[1] VotersOutgoing:[] Learners:[] LearnersNext:[] "
        "AutoLeave:false"
    )


def test_conf_change_entry_lists_changes_like_etcd() -> None:
    cc = ConfChange(
        (
            ConfChangeSingle(ConfChangeType.ADD_NODE, NodeId(2)),
            ConfChangeSingle(ConfChangeType.ADD_LEARNER_NODE, NodeId(4)),
            ConfChangeSingle(ConfChangeType.REMOVE_NODE, NodeId(5)),
        )
    )
    e = Entry(Term(1), Index(12), EntryType.CONF_CHANGE, encode_conf_change(cc))
    assert describe_entry(e) == "1/12 EntryConfChange v2 l4 r5"
    leave = Entry(Term(1), Index(13), EntryType.CONF_CHANGE, encode_conf_change(ConfChange()))
    assert describe_entry(leave) == "1/13 EntryConfChange"


def test_binary_data_is_escaped_on_one_line() -> None:
    assert quote_bytes(b'a"b\\\n\x00\xff') == '"a\\"b\\\\\\n\\x00\\xff"'
    assert describe_entry(entry(3, 4)) == '3/4 EntryNormal ""'


def test_hard_and_conf_state() -> None:
    assert describe_hard_state(HardState(Term(2), NodeId(1), Index(11))) == (
        "Term:2 Vote:1 Commit:11"
    )
    assert describe_hard_state(HardState(Term(2), NodeId(0), Index(11))) == "Term:2 Commit:11"
    cs = ConfState(voters=(NodeId(1), NodeId(2)), voters_outgoing=(NodeId(3),), auto_leave=True)
    assert describe_conf_state(cs) == (
        "Voters:[1 2] VotersOutgoing:[3] Learners:[] LearnersNext:[] AutoLeave:true"
    )


def test_ready_sections_in_handling_order() -> None:
    rd = Ready(
        soft_state=SoftState(NodeId(1), StateType.PRE_CANDIDATE),
        hard_state=HardState(Term(1), NodeId(1), Index(10)),
        read_states=(ReadState(Index(11), b"r1"),),
        entries=(entry(1, 11),),
        committed_entries=(entry(1, 10, b"x"),),
        messages=(Message(MessageType.MsgHeartbeat, NodeId(2), NodeId(1), Term(1)),),
        must_sync=True,
    )
    assert describe_ready(rd) == (
        "Ready MustSync=true:\n"
        "Lead:1 State:StatePreCandidate\n"
        "HardState Term:1 Vote:1 Commit:10\n"
        "ReadStates:\n"
        'Index:11 RequestCtx:"r1"\n'
        "Entries:\n"
        '1/11 EntryNormal ""\n'
        "CommittedEntries:\n"
        '1/10 EntryNormal "x"\n'
        "Messages:\n"
        "1->2 MsgHeartbeat Term:1 Log:0/0\n"
    )
    assert describe_ready(Ready()) == "<empty Ready>\n"


def test_state_names_follow_etcd() -> None:
    assert state_name(StateType.PRE_CANDIDATE) == "StatePreCandidate"
    assert state_name(StateType.LEADER) == "StateLeader"
