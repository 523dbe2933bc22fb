"""The fuzzer's own parts, and a bounded run of it against a real cluster.

The parts: every service the server registers, and every connection kind of the peer port, is
found in the descriptors or the fuzzer's list of exchanges; a seed gives
the same requests every time; the generator makes what its docstring promises (requests
that parse, requests that do not, strings that are not UTF-8); the insider's oracle finds
nothing wrong with well-formed Raft messages (so the fuzzer never sends a well-formed lie),
and whatever it calls malformed the product's codec and checks refuse; the judges call an
UNKNOWN, an outsider let in or malformed content taken a failure; the questions' judge (Hello,
Members) agrees with the product's gate on every question drawn, and calls an answer the asker
could not use, or a question answered or refused against its ends, a failure.

The bounded run (``FUZZ_TIME_S``: 12 s of fuzzing, plus the cluster's start and the
checks, about 30 s in all) must end with no failure and every RPC of both services tried
in every mode. ``RALLYPOINT_FUZZ_SEED`` picks the seed (default fixed, so a failure
reproduces; ``python -m tests.fuzz --seed N`` runs the same).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rallypoint.coordinator.member_table import ConfChangeContext, MemberAddress, MemberTable
from rallypoint.coordinator.peer_auth import PeerKey, cluster_id_for
from rallypoint.coordinator.peer_gate import PeerGate, PeerRefused
from rallypoint.coordinator.peerwire import frames
from rallypoint.coordinator.service import SERVICE_NAMES
from rallypoint.coordinator.state.commands import Envelope, Put, encode_envelope
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.proto.v1 import kv_pb2, rendezvous_pb2
from rallypoint.raft.codec import CodecError, decode_message, encode_conf_change, encode_message
from rallypoint.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    Entry,
    EntryType,
    Index,
    Message,
    MessageType,
    NodeId,
    Term,
)
from tests.coordinator.test_transport import Host
from tests.integration.peer_client import EXCHANGES

from .peer import PeerCluster, PeerTarget
from .public import PublicTarget
from .raft_messages import (
    ENTRY_HEADER,
    ENTRY_VERSION,
    PeerView,
    RaftRecipe,
    entry_problem,
    materialise,
    message_problem,
    raft_recipes,
)
from .rpcs import Answer, Rpc, peer_rpcs, public_rpcs
from .runner import MODES, TOKEN, run, run_batch
from .wire import Pool, message_bytes, request_bytes

VIEW = PeerView(receiver=2, sender=1, others=(3,), term=5, last_index=40)
FUZZ_TIME_S = 12.0
DEFAULT_SEED = 20261201


def _draw(strategy: st.SearchStrategy[Any], seed: int, examples: int) -> list[Any]:
    drawn: list[Any] = []
    run_batch(strategy, seed, examples, drawn.append)
    return drawn


def test_every_service_the_server_registers_is_fuzzed() -> None:
    assert {rpc.service for rpc in public_rpcs()} == set(SERVICE_NAMES)
    assert {rpc.name for rpc in peer_rpcs()} == {
        "rallypoint.peer.v1.Raft/Send",
        "rallypoint.peer.v1.Raft/InstallSnapshot",
        "rallypoint.peer.v1.Raft/Hello",
        "rallypoint.peer.v1.Raft/Members",
        "rallypoint.peer.v1.Raft/Liveness",
    }
    # Every connection kind a member listens for, a kind added later included.
    assert {EXCHANGES[rpc.path][0] for rpc in peer_rpcs()} == frames.KINDS


def test_a_seed_gives_the_same_requests() -> None:
    descriptor = rendezvous_pb2.JoinRequest.DESCRIPTOR
    first = _draw(request_bytes(descriptor, Pool()), 7, 40)
    assert first == _draw(request_bytes(descriptor, Pool()), 7, 40)
    assert first != _draw(request_bytes(descriptor, Pool()), 8, 40)


def test_generated_requests_parse_or_not_as_promised() -> None:
    """Most requests parse; some do not (mutated, or not UTF-8); plausible ones parse."""
    outcomes = {"parsed": 0, "corrupt": 0, "not utf-8": 0}
    for payload in _draw(request_bytes(rendezvous_pb2.JoinRequest.DESCRIPTOR, Pool()), 3, 300):
        try:
            rendezvous_pb2.JoinRequest.FromString(payload)
            outcomes["parsed"] += 1
        except DecodeError as error:
            outcomes["not utf-8" if "UTF-8" in str(error) else "corrupt"] += 1
    assert outcomes["parsed"] > 150 and outcomes["not utf-8"] > 0 and outcomes["corrupt"] > 0
    plausible = message_bytes(kv_pb2.PutRequest.DESCRIPTOR, Pool(), plausible=True)
    for payload in _draw(plausible, 3, 100):
        kv_pb2.PutRequest.FromString(payload)


def _wrapped_put() -> bytes:
    envelope = Envelope(
        session_id=3, sequence=1, first_unacked=0, leader_time_ms=9, command=Put(b"k", b"v")
    )
    return ENTRY_HEADER.pack(ENTRY_VERSION, 1, 7) + encode_envelope(envelope)


def _learner_added() -> bytes:
    change = ConfChange(
        (ConfChangeSingle(ConfChangeType.ADD_LEARNER_NODE, NodeId(4)),),
        context=ConfChangeContext("127.0.0.1:1", "127.0.0.1:2", 1, 2).encode(),
    )
    return encode_conf_change(change)


@pytest.mark.parametrize(
    "message",
    [
        Message(type=MessageType.MsgHeartbeat, term=Term(5), commit=Index(40)),
        Message(type=MessageType.MsgTimeoutNow, term=Term(5)),
        Message(type=MessageType.MsgVote, term=Term(6), log_term=Term(5), index=Index(41)),
        Message(
            type=MessageType.MsgApp,
            term=Term(5),
            index=Index(40),
            log_term=Term(5),
            entries=(Entry(Term(5), Index(41)),),
        ),
        Message(
            type=MessageType.MsgApp,
            term=Term(5),
            index=Index(40),
            log_term=Term(5),
            entries=(Entry(Term(5), Index(41), EntryType.NORMAL, _wrapped_put()),),
        ),
        Message(
            type=MessageType.MsgProp,
            entries=(Entry(Term(0), Index(0), EntryType.CONF_CHANGE, _learner_added()),),
        ),
        # A ReadIndex request's entry is only its context: any bytes are well-formed.
        Message(type=MessageType.MsgReadIndex, entries=(Entry(Term(0), Index(0), data=b"\xc1"),)),
    ],
    ids=["heartbeat", "timeout-now", "vote", "append", "append-command", "proposal", "read"],
)
def test_the_insider_never_sends_a_well_formed_message(message: Message) -> None:
    """Raft does not defend against a member that lies in well-formed messages, and the
    fuzzer does not send them: its oracle must find nothing wrong with these."""
    addressed = Message(
        **{f: getattr(message, f) for f in message.__slots__ if f not in ("to", "from_")},
        to=NodeId(VIEW.receiver),
        from_=NodeId(VIEW.sender),
    )
    assert message_problem(encode_message(addressed), VIEW.sender, VIEW.receiver) is None


@settings(
    database=None,
    max_examples=400,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(raft_recipes())
def test_what_the_oracle_calls_malformed_the_receiver_refuses(recipe: RaftRecipe) -> None:
    """The same checks as the peer service's, in the same order: the codec, the ends, no
    MsgSnap in a batch, entries that apply. The run checks this end to end; this checks
    the oracle against the codec quickly, on many more messages."""
    raw = materialise(recipe, VIEW)
    if message_problem(raw, VIEW.sender, VIEW.receiver) is None:
        return  # not sent
    try:
        m = decode_message(raw)
    except CodecError:
        return
    refused = (
        m.type is MessageType.MsgSnap
        or (m.from_, m.to) != (VIEW.sender, VIEW.receiver)
        or (
            m.type in (MessageType.MsgApp, MessageType.MsgProp)
            and any(entry_problem(e.type, e.data) for e in m.entries)
        )
    )
    assert refused, (recipe, m)


class _NoChannels:
    def __call__(self) -> list[grpc.Channel]:
        return []


def _rpc(name: str, rpcs: list[Rpc]) -> Rpc:
    return next(rpc for rpc in rpcs if rpc.name == name)


def test_the_judges_call_failures_failures() -> None:
    put = _rpc("rallypoint.v1.KV/Put", public_rpcs())
    client = PublicTarget(put, True, Pool(), TOKEN, _NoChannels(), frozenset({1}))
    outsider = PublicTarget(put, False, Pool(), TOKEN, _NoChannels(), frozenset({1}))
    code = grpc.StatusCode
    assert client._judge(Answer(code.INVALID_ARGUMENT), ()) is None
    assert client._judge(Answer(code.UNAVAILABLE, reason="NO_LEADER"), ()) is None
    assert client._judge(Answer(code.UNKNOWN, "boom"), ()) is not None
    assert client._judge(Answer(code.INTERNAL, "boom"), ()) is not None
    assert client._judge(Answer(code.UNAVAILABLE, "failed to connect"), ()) is not None
    assert client._judge(Answer(code.OK, responses=[b"\xff"]), ()) is not None
    assert outsider._judge(Answer(code.UNAUTHENTICATED), ()) is None
    assert outsider._judge(Answer(code.INVALID_ARGUMENT), ()) is not None
    assert outsider._judge(Answer(code.UNAUTHENTICATED, responses=[b""]), ()) is not None

    peers = PeerCluster([], [], [], b"s" * 32, lambda i: VIEW)
    send = _rpc("rallypoint.peer.v1.Raft/Send", peer_rpcs())
    insider = PeerTarget(send, True, peers)
    assert insider._judge(Answer(code.INVALID_ARGUMENT), "bad", False) is None
    assert insider._judge(Answer(code.OK), "bad", False) is not None
    assert insider._judge(Answer(code.UNAUTHENTICATED), "bad", False) is not None
    assert insider._judge(Answer(code.UNAUTHENTICATED), "bad", True) is None
    assert PeerTarget(send, False, peers)._judge(Answer(code.OK), "lie", False) is not None


SECRET = b"s" * 32
QUESTION_EXAMPLES = 150


class _Member(Host):
    """Member ``VIEW.receiver`` of the fuzzed cluster, as the product's gate sees it."""

    peer_key = PeerKey(SECRET)

    @property
    def cluster_id(self) -> int:
        return cluster_id_for(SECRET, "rallypoint")


def _ask_the_gate(gate: PeerGate, method: str, payload: bytes) -> Answer:
    """How the listener ends a question of ``payload`` (coordinator/peerwire/server.py): the
    gate's answer, or its refusal; a record that does not parse is unauthenticated."""
    code = grpc.StatusCode
    try:
        if method == "Hello":
            hello = gate.hello(frames.decode_record(peer_pb2.HelloRequest, payload), set())
            return Answer(code.OK, responses=[frames.encode_record(hello)])
        members = gate.members(frames.decode_record(peer_pb2.MembersRequest, payload), set())
        return Answer(code.OK, responses=[frames.encode_record(members)])
    except frames.FrameError:
        return Answer(code.UNAUTHENTICATED, "unauthenticated")
    except PeerRefused as refusal:
        return Answer(refusal.code, refusal.message)


def _forged(method: str, body: bytes, field: str) -> bytes:
    """A question's answer with its MAC, or the id of the member answering, altered."""
    answer: peer_pb2.HelloAnswer | peer_pb2.MembersAnswer
    if method == "Hello":
        answer = frames.decode_record(peer_pb2.HelloAnswer, body)
    else:
        answer = frames.decode_record(peer_pb2.MembersAnswer, body)
    if field == "mac":
        answer.mac = bytes([answer.mac[0] ^ 1]) + answer.mac[1:]
    else:
        answer.member_id += 1
    return frames.encode_record(answer)


@pytest.mark.parametrize("insider", [True, False], ids=["insider", "outsider"])
@pytest.mark.parametrize("method", ["Hello", "Members"])
def test_the_question_judge_agrees_with_the_gate(
    method: str, insider: bool, tmp_path: Path
) -> None:
    """Every question the fuzzer draws, asked of the product's gate in process: the judge
    finds nothing wrong with how the gate ends it. And the judge's claims can fail: an
    insider's answer the asker could not use, or an outcome against the question's ends, is
    a failure."""
    code = grpc.StatusCode
    member = _Member(VIEW.receiver, tmp_path)
    member.table = MemberTable({VIEW.receiver: MemberAddress("127.0.0.1:1", "127.0.0.1:2")})
    gate = PeerGate(member)
    rpc = _rpc(f"rallypoint.peer.v1.Raft/{method}", peer_rpcs())
    cluster = PeerCluster(["127.0.0.1:1"], [VIEW.receiver], [tmp_path], SECRET, lambda i: VIEW)
    target = PeerTarget(rpc, insider, cluster)
    build = target._hello_request if method == "Hello" else target._members_request
    # The first question ended with each status: how it ended, what it was, what was sent.
    first: dict[grpc.StatusCode, tuple[Answer, str, list[bytes]]] = {}
    outcomes = Counter[grpc.StatusCode]()
    for example in _draw(target.strategy(), 11, QUESTION_EXAMPLES):
        built = build(example, 0, VIEW)
        assert built is not None
        sent, _, expected, _, _ = built
        ended = _ask_the_gate(gate, method, sent[0])
        assert target._judge(ended, expected, False, sent) is None, (example, ended)
        outcomes[ended.code] += 1
        first.setdefault(ended.code, (ended, expected, sent))
    if not insider:
        assert set(outcomes) == {code.UNAUTHENTICATED}, outcomes
        assert target._judge(Answer(code.OK), "a question", False, [b""]) is not None
        return
    assert set(outcomes) == {code.OK, code.FAILED_PRECONDITION}, outcomes
    answered, right_ends, asked = first[code.OK]
    refused, wrong_ends, asked_wrongly = first[code.FAILED_PRECONDITION]
    assert target._judge(answered, wrong_ends, False, asked_wrongly) is not None
    assert target._judge(refused, right_ends, False, asked) is not None
    assert target._judge(Answer(code.OK), right_ends, False, asked) is not None
    assert target._judge(Answer(code.INVALID_ARGUMENT), right_ends, False, asked) is not None
    for field in ("mac", "member_id"):
        forged = Answer(code.OK, responses=[_forged(method, answered.responses[0], field)])
        assert target._judge(forged, right_ends, False, asked) is not None, field


@pytest.mark.integration
def test_a_bounded_run_finds_nothing_and_tries_every_rpc(tmp_path: Path) -> None:
    seed = int(os.environ.get("RALLYPOINT_FUZZ_SEED", DEFAULT_SEED))
    lines: list[str] = []
    report = run(FUZZ_TIME_S, seed, lines.append, keep=tmp_path / "cluster")
    expected = {(mode, rpc.name) for rpc in public_rpcs() for mode in ("outsider", "client")}
    expected |= {(mode, rpc.name) for rpc in peer_rpcs() for mode in ("outsider", "insider")}
    assert set(report.figures) == expected
    assert {mode for mode, _ in report.figures} == set(MODES)
    assert report.untried() == [], f"seed {seed}: never tried {report.untried()}"
    findings = "\n".join(str(f) for f in report.findings[:20])
    assert not report.findings, f"seed {seed}: {len(report.findings)} failures\n{findings}"
    assert len(report.checks) == 3, report.checks  # agreed, restarted, agreed again
    assert report.messages > 500
