"""Fuzzing the peer port (Send, InstallSnapshot, Hello, Members, Liveness): outsiders and a
member gone wrong.

Requests travel as the members' own do, in frames of the stream peer protocol
(docs/peer-protocol.md): a connection of the request's kind, the member's challenge, then
the records (msgpack arrays of the ``rallypoint.peer.v1`` messages' fields). A refusal is the
member's ERROR frame, whose status code is judged here.

An *outsider* has no secret, or a wrong one, or alters a member's signed request in flight
(a flipped MAC bit, a field changed after signing), or sends bytes that are not a protobuf
message at all. Its content is anything: malformed messages, and also the well-formed ones
that once took the cluster over (a MsgTimeoutNow, a heartbeat far ahead, an append at the
current term, a vote request). Every request must be refused with UNAUTHENTICATED, and the
refusal must not name the cluster (its id is not for outsiders).

An *insider* signs with the cluster's secret (tests/integration/peer_client.py) and sends
malformed content only (raft_messages.py: Raft does not defend against a member that lies in
well-formed messages, so neither does this fuzzer): each must be refused (INVALID_ARGUMENT,
DATA_LOSS, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, PERMISSION_DENIED; UNAUTHENTICATED when
the fuzzer damaged the record's envelope itself, which the MAC no longer matches). A batch
taken (OK) is a failure. A snapshot transfer may end OK only unfinished (the receiver asks
for the next offset, or ends the connection, and installs nothing); a refused transfer must
leave no file behind.
Hello and Members are questions that change nothing (``QUESTIONS``): signed by an insider with
fuzzed fields, one to the right ends must end OK with one answer the asker can use (from the
member asked, signed over the asker's nonce; a members answer's table must read), one to the
wrong ends (cluster id, to_id) FAILED_PRECONDITION.
A liveness report from an insider is always malformed here (not msgpack, a format version
that is not 1, a field of the wrong type or range): INVALID_ARGUMENT, never taken.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import grpc
import msgpack
from hypothesis import strategies as st

from rallypoint.coordinator.member_table import MemberTableError
from rallypoint.coordinator.peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    HELLO_ANSWER_TAG,
    HELLO_TAG,
    LIVENESS_TAG,
    MEMBERS_ANSWER_TAG,
    MEMBERS_TAG,
    PeerKey,
    batch_fields,
    chunk_fields,
    liveness_fields,
)
from rallypoint.coordinator.peer_hello import (
    advertised_version,
    hello_answer_fields,
    hello_request_fields,
)
from rallypoint.coordinator.peer_lookup import (
    decode_members,
    members_answer_fields,
    members_request_fields,
)
from rallypoint.coordinator.peer_session import OutboundSession
from rallypoint.coordinator.peerwire import frames
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import encode_message
from rallypoint.raft.storage.snapshotter import snapshot_file_name
from rallypoint.raft.types import Entry, Index, Message, MessageType, NodeId, Term
from tests.integration.peer_client import PeerClient, stream_frames_in_session

from .public import Verdict
from .raft_messages import (
    PeerView,
    RaftRecipe,
    SnapshotRecipe,
    bad_file,
    garbage_snapshot,
    materialise,
    message_problem,
    raft_recipes,
    snapshot_file,
    snapshot_problem,
    snapshot_recipes,
)
from .rpcs import Answer, Rpc, shorten
from .wire import mutate, mutations, weighted

Code = grpc.StatusCode
INSIDER_REFUSALS = frozenset(
    {
        Code.INVALID_ARGUMENT,
        Code.DATA_LOSS,
        Code.RESOURCE_EXHAUSTED,
        Code.FAILED_PRECONDITION,
        Code.PERMISSION_DENIED,
    }
)
TIMEOUT_S = 5.0
# How long a member may take to remove the files of a transfer it refused.
CLEAN_UP_S = 2.0
WRONG_SECRET = b"a-secret-of-another-cluster-entirely"
# The exchanges that ask and change nothing: one request, one answer, no session.
QUESTIONS = frozenset({"Hello", "Members"})
# In what an insider's question is expected to be: sent to another cluster or member.
WRONG_ENDS = "to the wrong ends"

# How an outsider presents its request: no MAC, a random one, one made with another
# secret, a member's signed request with its MAC or a field altered in flight, or bytes
# (signed with another secret) damaged until they may not parse.
CREDENTIALS = ("unsigned", "random_mac", "wrong_secret", "flipped_mac", "changed_field", "garbage")
# What an outsider says (well-formed lies, then anything malformed).
LIES = ("timeout_now", "heartbeat_ahead", "append", "vote", "malformed")


# What a request builder makes: the serialized requests, a description, what is wrong with
# them, whether the envelope was damaged, and the snapshot file a transfer would write.
Built = tuple[list[bytes], str, str, bool, Path | None]


@dataclass(frozen=True, slots=True)
class SendExample:
    member: int
    messages: tuple[RaftRecipe, ...]
    batch_damage: str  # insider: "none", "cluster_id", "to_id", "envelope"
    credential: str  # outsider
    lie: str  # outsider
    incarnation: int
    abstaining: bool
    envelope: tuple[tuple[int, int, int, bytes], ...]


@dataclass(frozen=True, slots=True)
class SnapshotExample:
    member: int
    recipe: SnapshotRecipe
    credential: str
    damage_envelope: bool  # insider: damage the first chunk's protobuf bytes
    envelope: tuple[tuple[int, int, int, bytes], ...]


@dataclass(frozen=True, slots=True)
class HelloExample:
    member: int
    from_offset: int
    to_offset: int
    wrong_cluster: bool
    incarnation: int
    nonce: bytes
    credential: str
    envelope: tuple[tuple[int, int, int, bytes], ...]


@dataclass(frozen=True, slots=True)
class MembersExample:
    member: int
    from_offset: int
    to_offset: int
    wrong_cluster: bool
    nonce: bytes
    credential: str
    envelope: tuple[tuple[int, int, int, bytes], ...]


@dataclass(frozen=True, slots=True)
class LivenessExample:
    member: int
    payload: bytes  # a malformed report
    damage: str  # insider: "none", "cluster_id", "to_id", "envelope"
    credential: str
    envelope: tuple[tuple[int, int, int, bytes], ...]


def _bad_reports() -> st.SearchStrategy[bytes]:
    """Liveness report payloads no member may take (coordinator/liveness/report.py)."""
    junk = st.binary(max_size=48).map(lambda b: b"\xc1" + b)  # 0xc1: never msgpack
    wrong_version = st.sampled_from([0, 2, "1", None, -1]).map(
        lambda v: msgpack.packb({"v": v, "attach": {"j": [1]}})
    )
    bad_field = st.sampled_from(
        [
            {"v": 1, "attach": [1, 2]},
            {"v": 1, "attach": {"j": [0]}},
            {"v": 1, "detach": {"j": ["x"]}},
            {"v": 1, "suspect": [["j", 1, "guess", "", 0]]},
            {"v": 1, "suspect": "all"},
            {"v": 1, "progress": [["j", 1]]},
            {"v": 1, "lag": -5},
            {"v": 1, "readings": [["j", 1, 2]]},
            {"v": 1, "seq": -3},
        ]
    ).map(msgpack.packb)
    not_a_map = st.sampled_from([[1, 2], "report", 7]).map(msgpack.packb)
    return st.one_of(junk, wrong_version, bad_field, not_a_map)


@dataclass
class PeerCluster:
    """What the peer targets need to know of the cluster, refreshed before each batch."""

    peer_addresses: list[str]
    member_ids: list[int]
    data_dirs: list[Path]
    secret: bytes
    view: Callable[[int], PeerView]  # the view from member i's side (i: index in the lists)


def _ids_strategy() -> st.SearchStrategy[int]:
    return weighted([(3, st.sampled_from((0, 1, 7, 99))), (1, st.integers(0, 2**64 - 1))])


def _sign_with(key: PeerKey | None, tag: bytes, fields: list[int | bytes]) -> bytes:
    return key.sign(tag, fields) if key is not None else b""


class _Stamper:
    """Stamps a stream's requests as a member does (coordinator/peer_session.py), with the
    client's key: none (an outsider without a secret) leaves the MAC empty."""

    def __init__(self, key: PeerKey | None, challenge: bytes | None) -> None:
        self._session = (
            OutboundSession(key, challenge) if key is not None and challenge is not None else None
        )
        self._challenge = challenge or b""
        self._counter = 0

    def stamp(self, request: Any, tag: bytes, fields: Callable[[Any], list[int | bytes]]) -> None:
        if self._session is None:
            self._counter += 1
            request.challenge, request.counter, request.mac = self._challenge, self._counter, b""
            return
        stamp = self._session.stamp(tag, fields(request))
        request.challenge, request.counter, request.mac = stamp.challenge, stamp.counter, stamp.mac


class PeerTarget:
    """One RPC of the peer service, as an outsider or as an insider."""

    def __init__(self, rpc: Rpc, insider: bool, cluster: PeerCluster) -> None:
        self.rpc = rpc
        self.mode = "insider" if insider else "outsider"
        # A question changes nothing: it needs fewer tries.
        self.weight = 2 if rpc.method in QUESTIONS else 6
        self.insider = insider
        self._cluster = cluster

    @property
    def name(self) -> str:
        return self.rpc.name

    # ---------------------------------------------------------------- strategies

    def strategy(self) -> st.SearchStrategy[Any]:
        credential = st.sampled_from(CREDENTIALS)
        envelope = mutations().map(tuple)
        if self.rpc.method == "Send":
            return st.builds(
                SendExample,
                member=st.integers(0, 2),
                messages=st.lists(raft_recipes(), min_size=1, max_size=3).map(tuple),
                batch_damage=weighted(
                    [
                        (6, st.just("none")),
                        (1, st.just("cluster_id")),
                        (1, st.just("to_id")),
                        (1, st.just("envelope")),
                    ]
                ),
                credential=credential,
                lie=st.sampled_from(LIES),
                incarnation=_ids_strategy(),
                abstaining=st.booleans(),
                envelope=envelope,
            )
        if self.rpc.method == "InstallSnapshot":
            return st.builds(
                SnapshotExample,
                member=st.integers(0, 2),
                recipe=snapshot_recipes(),
                credential=credential,
                damage_envelope=weighted([(8, st.just(False)), (1, st.just(True))]),
                envelope=envelope,
            )
        if self.rpc.method in QUESTIONS:
            # A hello and a members question differ only in the hello's incarnation.
            question: dict[str, st.SearchStrategy[Any]] = {
                "member": st.integers(0, 2),
                "from_offset": st.integers(0, 5),
                "to_offset": weighted([(4, st.just(0)), (1, st.integers(1, 3))]),
                "wrong_cluster": weighted([(4, st.just(False)), (1, st.just(True))]),
                "nonce": st.binary(max_size=40),
                "credential": credential,
                "envelope": envelope,
            }
            if self.rpc.method == "Hello":
                return st.builds(HelloExample, incarnation=_ids_strategy(), **question)
            return st.builds(MembersExample, **question)
        if self.rpc.method == "Liveness":
            return st.builds(
                LivenessExample,
                member=st.integers(0, 2),
                payload=_bad_reports(),
                damage=weighted(
                    [
                        (6, st.just("none")),
                        (1, st.just("cluster_id")),
                        (1, st.just("to_id")),
                        (1, st.just("envelope")),
                    ]
                ),
                credential=credential,
                envelope=envelope,
            )
        raise AssertionError(f"no strategy for the peer RPC {self.rpc.name}: add one")

    # ---------------------------------------------------------------- running

    def _client(self, index: int, credential: str) -> PeerClient:
        cluster = self._cluster
        address = cluster.peer_addresses[index]
        if self.insider or credential in ("flipped_mac", "changed_field"):
            # (An outsider altering a member's request in flight: it was signed right.)
            return PeerClient(address, cluster.secret)
        if credential in ("wrong_secret", "garbage"):
            client = PeerClient(address, WRONG_SECRET)
        else:
            client = PeerClient(address, None)
        # Even knowing the cluster id must not help.
        client.cluster_id = PeerClient(address, cluster.secret).cluster_id
        return client

    def run(self, example: Any) -> Verdict:
        index = example.member % len(self._cluster.peer_addresses)
        view = self._cluster.view(index)
        builders: dict[type, Callable[[Any, int, PeerView, bytes | None], Built | None]] = {
            SendExample: self._send_request,
            SnapshotExample: self._snapshot_request,
            LivenessExample: self._liveness_request,
            HelloExample: lambda example, index, view, _challenge: self._hello_request(
                example, index, view
            ),
            MembersExample: lambda example, index, view, _challenge: self._members_request(
                example, index, view
            ),
        }
        before: set[str] = set()
        # A connection: its requests are stamped with the challenge the member opens it with
        # (a question's is not bound to one).
        made: list[Built | None] = []

        def build(challenge: bytes | None) -> list[bytes]:
            nonlocal before
            made.append(builders[type(example)](example, index, view, challenge))
            if made[0] is None:
                return []
            before = _files_of(made[0][4])
            return made[0][0]

        code, details, responses = stream_frames_in_session(
            self._cluster.peer_addresses[index], self.rpc.path, build, TIMEOUT_S
        )
        if not made or made[0] is None:
            return Verdict("skipped", sent=False)
        built = made[0]
        answer = Answer(code, details, responses=responses)
        sent, text, expected, envelope_damaged, snapshot_path = built
        verdict = Verdict(answer.code.name)
        problem = self._judge(answer, expected, envelope_damaged, sent)
        if problem is None and snapshot_path is not None and answer.code is not Code.OK:
            # The member answers before it has cleaned up: give it a moment.
            deadline = time.monotonic() + CLEAN_UP_S
            while (left := sorted(_files_of(snapshot_path) - before)) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.02)
            if left:
                problem = f"a refused transfer left {left} in {snapshot_path.parent}"
        if problem is not None:
            verdict.failure = problem
            verdict.request = shorten(text, 400)
        return verdict

    def _judge(
        self, answer: Answer, expected: str, envelope_damaged: bool, sent: Sequence[bytes] = ()
    ) -> str | None:
        """What is wrong with how the member ended the exchange of ``sent`` (None: nothing)."""
        said = f"{answer.code.name} {answer.details!r}"[:300]
        if not self.insider:
            if answer.code is not Code.UNAUTHENTICATED:
                return f"an outsider's request ({expected}) ended {said}"
            cluster_id = PeerClient("", self._cluster.secret).cluster_id
            if f"{cluster_id:x}" in answer.details or f"{cluster_id:016x}" in answer.details:
                return f"the refusal names the cluster id: {said}"
            return None
        if self.rpc.method in QUESTIONS:
            return self._judge_question(answer, expected, sent)
        if answer.code in INSIDER_REFUSALS:
            return None
        if answer.code is Code.UNAUTHENTICATED and envelope_damaged:
            return None
        if answer.code is Code.OK:
            if self.rpc.method == "InstallSnapshot":
                if not answer.responses:
                    # The member ended an unfinished transfer without a word: nothing installed.
                    return None
                ack = frames.decode_record(peer_pb2.SnapshotAck, answer.responses[0])
                if not ack.complete:
                    return None  # unfinished: nothing installed
                return f"a snapshot that cannot be installed was installed ({expected})"
            return f"malformed content was taken ({expected}): {said}"
        return f"malformed content ({expected}) ended {said}"

    def _judge_question(self, answer: Answer, expected: str, sent: Sequence[bytes]) -> str | None:
        """An insider's question (never damaged in its envelope): to the wrong ends it is
        refused with FAILED_PRECONDITION; to the right ones it ends OK with one answer the
        asker can use."""
        said = f"{answer.code.name} {answer.details!r}"[:300]
        if WRONG_ENDS in expected:
            if answer.code is Code.FAILED_PRECONDITION:
                return None
            return f"{expected} ended {said}"
        if answer.code is not Code.OK:
            return f"{expected} ended {said}"
        if len(sent) != 1 or len(answer.responses) != 1:
            return f"{expected}: {len(answer.responses)} answers to {len(sent)} requests, not one"
        problem = answer_problem(
            self.rpc.method, sent[0], answer.responses[0], PeerKey(self._cluster.secret)
        )
        return None if problem is None else f"{expected}: {problem}"

    # ---------------------------------------------------------------- Send

    def _lie(self, lie: str, view: PeerView) -> bytes:
        """A well-formed message an outsider must not get through."""
        term, last = Term(view.term), Index(view.last_index)
        ends = {"to": NodeId(view.receiver), "from_": NodeId(view.sender)}
        if lie == "timeout_now":
            message = Message(type=MessageType.MsgTimeoutNow, term=term, **ends)
        elif lie == "heartbeat_ahead":
            message = Message(type=MessageType.MsgHeartbeat, term=Term(term + 1000), **ends)
        elif lie == "append":
            message = Message(
                type=MessageType.MsgApp,
                term=term,
                log_term=term,
                index=last,
                entries=(Entry(term, Index(last + 1)),),
                commit=Index(last + 1),
                **ends,
            )
        else:
            message = Message(
                type=MessageType.MsgVote,
                term=Term(term + 1),
                log_term=term,
                index=Index(last + 100),
                **ends,
            )
        return encode_message(message)

    def _send_request(
        self, example: SendExample, index: int, view: PeerView, challenge: bytes | None
    ) -> Built | None:
        client = self._client(index, example.credential)
        damage = example.batch_damage if self.insider else "none"
        if self.insider or example.lie == "malformed":
            messages: list[bytes] = []
            reasons = []
            for recipe in example.messages:
                raw = materialise(recipe, view)
                problem = message_problem(raw, view.sender, view.receiver)
                if problem is not None:
                    messages.append(raw)
                    reasons.append(f"{recipe.damage}: {problem}")
            if not messages:
                return None  # nothing in it was certainly malformed: not sent
            expected = "; ".join(reasons)
        else:
            messages, expected = [self._lie(example.lie, view)], example.lie
        batch = client.batch(view.sender, view.receiver, messages, incarnation=example.incarnation)
        batch.abstaining = example.abstaining
        if damage == "cluster_id":
            batch.cluster_id ^= 1
            expected += " (to another cluster)"
        elif damage == "to_id":
            batch.to_id += 1
            expected += " (to another member)"
        self._sign_batch(_Stamper(client.key, challenge), batch, example.credential)
        payload = self._envelope(frames.encode_record(batch), example, damage)
        text = f"{expected} | {describe(peer_pb2.MessageBatch, payload)}"
        return [payload], text, expected, damage == "envelope", None

    def _sign_batch(self, stamper: _Stamper, batch: peer_pb2.MessageBatch, credential: str) -> None:
        stamper.stamp(batch, BATCH_TAG, batch_fields)
        if self.insider:
            return
        if credential == "random_mac":
            batch.mac = os.urandom(32)
        elif credential == "flipped_mac":
            batch.mac = bytes([batch.mac[0] ^ 1]) + batch.mac[1:]
        elif credential == "changed_field":
            batch.incarnation ^= 1

    def _envelope(self, payload: bytes, example: Any, damage: str) -> bytes:
        """The serialized request, damaged when the example says so."""
        if (self.insider and damage == "envelope") or (
            not self.insider and example.credential == "garbage"
        ):
            return mutate(payload, example.envelope)
        return payload

    # ---------------------------------------------------------------- InstallSnapshot

    def _snapshot_request(
        self, example: SnapshotExample, index: int, view: PeerView, challenge: bytes | None
    ) -> Built | None:
        recipe = example.recipe
        client = self._client(index, example.credential)
        stamper = _Stamper(client.key, challenge)
        meta, data = garbage_snapshot(recipe, view)
        flaw = recipe.flaw
        file_bytes = (
            bad_file(recipe, meta, data) if flaw == "bad_file" else snapshot_file(meta, data)
        )
        header_term = view.term
        snapshot_index, snapshot_term = meta[1], meta[2]
        header_obj: list[Any] = [
            int(MessageType.MsgSnap),
            view.receiver,
            view.sender,
            header_term,
            0,
            0,
            [],
            0,
            [b"", meta],
            False,
            0,
            b"",
        ]
        header: bytes | None = msgpack.packb(header_obj, use_bin_type=True)
        if flaw == "bad_header":
            variant = recipe.variant % 5
            if variant == 0:
                header = None
            elif variant == 1:
                header = recipe.noise or b"\xc1"
            elif variant == 2:
                header_obj[0] = int(MessageType.MsgHeartbeat)
            elif variant == 3:
                header_obj[2] = view.sender + 1
            else:
                header_obj[3] = 2**63
            if variant >= 2:
                header = msgpack.packb(header_obj, use_bin_type=True)
        # The content must be refused whatever the flaw: a snapshot that could be installed is
        # never sent (it would be a well-formed lie).
        problem = snapshot_problem(file_bytes, header_term)
        if problem is None and self.insider:
            return None
        total_size, crc = len(file_bytes), google_crc32c.value(file_bytes)
        if flaw == "over_limit":
            total_size = recipe.declared_size
        elif flaw == "wrong_crc":
            crc ^= 1 + recipe.variant % 255
        elif flaw == "past_end":
            total_size = max(0, len(file_bytes) - 1 - recipe.variant % 4)
        step = recipe.chunk_bytes or max(1, len(file_bytes))
        pieces = [file_bytes[at : at + step] for at in range(0, len(file_bytes), step)] or [b""]
        if flaw == "unfinished" and len(pieces) > 1:
            pieces = pieces[: 1 + recipe.variant % (len(pieces) - 1)]
        if flaw == "over_limit":
            pieces = pieces[:1]
        cluster_id, to_id = client.cluster_id, view.receiver
        if flaw == "wrong_ends" and self.insider:
            if recipe.variant % 2:
                cluster_id ^= 1
            else:
                to_id += 1
        chunks = []
        offset = 0
        for k, piece in enumerate(pieces):
            chunk = peer_pb2.SnapshotChunk(
                cluster_id=cluster_id,
                from_id=view.sender,
                to_id=to_id,
                snapshot_index=snapshot_index if isinstance(snapshot_index, int) else 0,
                snapshot_term=snapshot_term if isinstance(snapshot_term, int) else 0,
                offset=offset,
                data=piece,
                total_size=total_size,
                crc32c=crc,
                incarnation=0,
            )
            if k == 0 and header is not None:
                chunk.message = header
            offset += len(piece)
            self._sign_chunk(stamper, chunk, example.credential)
            chunks.append(frames.encode_record(chunk))
        envelope_damaged = self.insider and example.damage_envelope
        if envelope_damaged or (not self.insider and example.credential == "garbage"):
            chunks[0] = mutate(chunks[0], example.envelope)
        expected = f"{flaw}: {problem or 'outsider'}"
        text = f"{expected} | {len(chunks)} chunks | {describe(peer_pb2.SnapshotChunk, chunks[0])}"
        incoming = self._cluster.data_dirs[index] / "incoming"
        path = incoming / snapshot_file_name(chunks_term(chunks), chunks_index(chunks))
        return chunks, text, expected, envelope_damaged, path

    def _sign_chunk(
        self, stamper: _Stamper, chunk: peer_pb2.SnapshotChunk, credential: str
    ) -> None:
        stamper.stamp(chunk, CHUNK_TAG, chunk_fields)
        if self.insider:
            return
        if credential == "random_mac":
            chunk.mac = os.urandom(32)
        elif credential == "flipped_mac":
            chunk.mac = bytes([chunk.mac[0] ^ 0x80]) + chunk.mac[1:]
        elif credential == "changed_field":
            chunk.incarnation ^= 1

    # ---------------------------------------------------------------- Hello, Members

    def _question_expected(self, what: str, cluster_id: int, to_id: int, view: PeerView) -> str:
        """What an insider's question is: to the right ends, or to the wrong ones."""
        if self.insider and (cluster_id, to_id) != (
            PeerClient("", self._cluster.secret).cluster_id,
            view.receiver,
        ):
            return f"{what} {WRONG_ENDS}"
        return what

    def _hello_request(self, example: HelloExample, index: int, view: PeerView) -> Built | None:
        client = self._client(index, example.credential)
        request = peer_pb2.HelloRequest(
            cluster_id=client.cluster_id ^ int(example.wrong_cluster and self.insider),
            from_id=view.sender + example.from_offset,
            to_id=view.receiver + example.to_offset,
            incarnation=example.incarnation,
            nonce=example.nonce,
        )
        request.mac = _sign_with(client.key, HELLO_TAG, hello_request_fields(request))
        if not self.insider:
            _spoil_question(request, example.credential, "incarnation")
        payload = self._envelope(frames.encode_record(request), example, "none")
        expected = self._question_expected("a hello", request.cluster_id, request.to_id, view)
        text = f"{expected} | {describe(peer_pb2.HelloRequest, payload)}"
        return [payload], text, expected, False, None

    def _members_request(self, example: MembersExample, index: int, view: PeerView) -> Built | None:
        client = self._client(index, example.credential)
        request = peer_pb2.MembersRequest(
            cluster_id=client.cluster_id ^ int(example.wrong_cluster and self.insider),
            from_id=view.sender + example.from_offset,
            to_id=view.receiver + example.to_offset,
            nonce=example.nonce,
        )
        request.mac = _sign_with(client.key, MEMBERS_TAG, members_request_fields(request))
        if not self.insider:
            _spoil_question(request, example.credential, "from_id")
        payload = self._envelope(frames.encode_record(request), example, "none")
        expected = self._question_expected(
            "a members question", request.cluster_id, request.to_id, view
        )
        text = f"{expected} | {describe(peer_pb2.MembersRequest, payload)}"
        return [payload], text, expected, False, None

    # ---------------------------------------------------------------- Liveness

    def _liveness_request(
        self, example: LivenessExample, index: int, view: PeerView, challenge: bytes | None
    ) -> Built | None:
        client = self._client(index, example.credential)
        damage = example.damage if self.insider else "none"
        request = peer_pb2.LivenessReport(
            cluster_id=client.cluster_id,
            from_id=view.sender,
            to_id=view.receiver,
            payload=example.payload,
        )
        if damage == "cluster_id":
            request.cluster_id ^= 1
        elif damage == "to_id":
            request.to_id += 7
        _Stamper(client.key, challenge).stamp(request, LIVENESS_TAG, liveness_fields)
        if not self.insider:
            if example.credential == "random_mac":
                request.mac = os.urandom(32)
            elif example.credential == "flipped_mac":
                request.mac = bytes([request.mac[0] ^ 4]) + request.mac[1:]
            elif example.credential == "changed_field":
                request.payload += b"\x00"
        payload = self._envelope(frames.encode_record(request), example, damage)
        text = describe(peer_pb2.LivenessReport, payload)
        return [payload], text, f"liveness report ({damage})", damage == "envelope", None


def answer_problem(
    method: str, request_bytes: bytes, answer_bytes: bytes, key: PeerKey
) -> str | None:
    """Why the asker could not use this answer to its question (None: it could), checked as
    the asker checks it (peer_hello.ask, peer_lookup.ask)."""
    try:
        if method == "Hello":
            return _hello_answer_problem(
                frames.decode_record(peer_pb2.HelloRequest, request_bytes),
                frames.decode_record(peer_pb2.HelloAnswer, answer_bytes),
                key,
            )
        return _members_answer_problem(
            frames.decode_record(peer_pb2.MembersRequest, request_bytes),
            frames.decode_record(peer_pb2.MembersAnswer, answer_bytes),
            key,
        )
    except frames.FrameError as exc:
        return f"an answer that does not decode: {exc}"


def _hello_answer_problem(
    request: peer_pb2.HelloRequest, answer: peer_pb2.HelloAnswer, key: PeerKey
) -> str | None:
    if answer.member_id != request.to_id:
        return f"answered by member {answer.member_id}, not member {request.to_id} that was asked"
    if not key.verify(HELLO_ANSWER_TAG, hello_answer_fields(answer, request), answer.mac):
        return "an answer whose MAC does not verify with the cluster's secret"
    version = advertised_version(
        key, request.nonce, answer.member_id, answer.record_version, answer.version_mac
    )
    if version is None:
        return "an answer whose record version's MAC does not verify"
    return None


def _members_answer_problem(
    request: peer_pb2.MembersRequest, answer: peer_pb2.MembersAnswer, key: PeerKey
) -> str | None:
    if answer.member_id != request.to_id:
        return f"answered by member {answer.member_id}, not member {request.to_id} that was asked"
    if not key.verify(MEMBERS_ANSWER_TAG, members_answer_fields(answer, request), answer.mac):
        return "an answer whose MAC does not verify with the cluster's secret"
    try:
        decode_members(answer.members)
    except MemberTableError as exc:
        return f"an answer whose member table does not read: {exc}"
    return None


def _files_of(path: Path | None) -> set[str]:
    """The files of the snapshot transfer to ``path``: the snapshot and its partial files."""
    if path is None:
        return set()
    return {found.name for found in path.parent.glob(path.name + "*")}


def chunks_term(chunks: list[bytes]) -> int:
    try:
        return frames.decode_record(peer_pb2.SnapshotChunk, chunks[0]).snapshot_term
    except frames.FrameError:  # a damaged envelope: the member cannot have named a file after it
        return 0


def chunks_index(chunks: list[bytes]) -> int:
    try:
        return frames.decode_record(peer_pb2.SnapshotChunk, chunks[0]).snapshot_index
    except frames.FrameError:  # as above
        return 0


def describe(cls: type[Any], payload: bytes, limit: int = 300) -> str:
    """A request record as protobuf text when it decodes, else its bytes; shortened."""
    try:
        record = frames.decode_record(cls, payload)
    except frames.FrameError:
        return shorten(f"undecodable {payload[:limit]!r}", limit)
    return shorten(str(record).replace("\n", " ").strip() or "(empty)", limit)


def _spoil_question(
    request: peer_pb2.HelloRequest | peer_pb2.MembersRequest, credential: str, field: str
) -> None:
    """An outsider's question (a hello, a members question) as ``credential`` says: a random
    MAC, a flipped one, or a MAC left as it was over a field changed after signing."""
    if credential == "random_mac":
        request.mac = os.urandom(32)
    elif credential == "flipped_mac":
        request.mac = bytes([request.mac[0] ^ 4]) + request.mac[1:]
    elif credential == "changed_field":
        setattr(request, field, getattr(request, field) ^ 1)
