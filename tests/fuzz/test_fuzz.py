"""The fuzzer's own parts, and a bounded run of it against a real cluster.

The parts: every service the server registers is found in the descriptors; a seed gives
the same requests every time; the generator makes what its docstring promises (requests
that parse, requests that do not, strings that are not UTF-8); the insider's oracle finds
nothing wrong with well-formed Raft messages (so the fuzzer never sends a well-formed lie),
and whatever it calls malformed the product's codec and checks refuse; the judges call an
UNKNOWN, an outsider let in or malformed content taken a failure.

The bounded run (``FUZZ_TIME_S``: 12 s of fuzzing, plus the cluster's start and the
checks, about 30 s in all) must end with no failure and every RPC of both services tried
in every mode. ``RALLYPOINT_FUZZ_SEED`` picks the seed (default fixed, so a failure
reproduces; ``python -m tests.fuzz --seed N`` runs the same).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rallypoint.coordinator.member_table import ConfChangeContext
from rallypoint.coordinator.service import SERVICE_NAMES
from rallypoint.coordinator.state.commands import Envelope, Put, encode_envelope
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
        "rallypoint.peer.v1.Raft/Liveness",
    }


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
