"""Fuzzing the public API (the client port): without the token, and with it.

Without the token (or with a wrong one, in any of the ways a client gets it wrong), every
call must end UNAUTHENTICATED before anything is decoded or answered: a streaming call gets
no message first.

With the token, a call may end with any status a client can act on: OK, or a client error
(INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE,
RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED) or UNAVAILABLE from a member that answered
it (an election, no leader: the member says why in ``rallypoint-error-reason``). UNKNOWN
and INTERNAL are bugs (an exception the servicers did not expect), as is UNAVAILABLE from a
member that did not answer at all, and an OK whose response does not parse.

The fuzzer keeps the cluster's membership, so that the checks afterwards mean something:
a MemberAdd is sent as a learner (a learner never counts toward a quorum), and a
MemberRemove or MemberPromote that names one of the cluster's own members is pointed at an
id no member has. Everything else goes as drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from hypothesis import strategies as st

from .rpcs import Answer, Rpc, invoke
from .wire import VARINT, Pool, request_bytes, tag, varint

Code = grpc.StatusCode

CLIENT_ERRORS = frozenset(
    {
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.ALREADY_EXISTS,
        Code.FAILED_PRECONDITION,
        Code.OUT_OF_RANGE,
        Code.RESOURCE_EXHAUSTED,
        Code.ABORTED,
        Code.DEADLINE_EXCEEDED,
    }
)
UNARY_TIMEOUT_S = 3.0
STREAM_WINDOW_S = 0.3


def wrong_credentials(token: str) -> list[tuple[tuple[str, str], ...]]:
    """Every way the fuzzer presents a missing or wrong token."""
    return [
        (),
        (("authorization", "Bearer wrong"),),
        # (The scheme's case does not matter, RFC 6750: "bearer <token>" is a right one.)
        (("authorization", f"bearer{token}"),),
        (("authorization", token),),
        (("authorization", f"Bearer {token}x"),),
        (("authorization", f"Bearer {token[:-1]}"),),
        (("authorization", f"Basic {token}"),),
        (("authorization", "Bearer"),),
        (("x-authorization", f"Bearer {token}"),),
        # Only the first authorization entry counts.
        (("authorization", "Bearer wrong"), ("authorization", f"Bearer {token}")),
    ]


@dataclass(frozen=True, slots=True)
class PublicExample:
    member: int  # index into the members, wrapped
    payloads: tuple[bytes, ...]
    credential: int  # index into wrong_credentials (unauthenticated mode only)


@dataclass
class Verdict:
    """One call's outcome for the figures, and what was wrong with it (None: nothing)."""

    outcome: str
    failure: str | None = None
    request: str = ""
    sent: bool = True


def _membership_guard(rpc: Rpc, protected: frozenset[int]) -> Callable[[bytes], bytes]:
    """Keep the cluster's membership whatever the request says (see the module docstring).
    Fields are appended: for a scalar field the last occurrence wins."""
    fields = rpc.request.fields_by_name
    if rpc.name == "rallypoint.v1.Cluster/MemberAdd":
        as_learner = tag(fields["as_learner"].number, VARINT) + varint(1)
        return lambda payload: payload + as_learner
    if rpc.name in ("rallypoint.v1.Cluster/MemberRemove", "rallypoint.v1.Cluster/MemberPromote"):
        cls = message_factory.GetMessageClass(rpc.request)
        number = fields["id"].number

        def elsewhere(payload: bytes) -> bytes:
            try:
                member_id = getattr(cls.FromString(payload), "id", 0)
            except DecodeError:
                return payload
            if member_id in protected:
                return payload + tag(number, VARINT) + varint(member_id + 1_000_000)
            return payload

        return elsewhere
    return lambda payload: payload


class PublicTarget:
    """One RPC of the public API in one mode ("outsider": no or a wrong token; "client":
    the token)."""

    def __init__(
        self,
        rpc: Rpc,
        authenticated: bool,
        pool: Pool,
        token: str,
        channels: Callable[[], list[grpc.Channel]],
        protected_members: frozenset[int],
    ) -> None:
        self.rpc = rpc
        self.mode = "client" if authenticated else "outsider"
        self.weight = 1
        self.authenticated = authenticated
        self._pool = pool
        self._channels = channels
        self._good = (("authorization", f"Bearer {token}"),)
        self._wrong = wrong_credentials(token)
        self._guard = _membership_guard(rpc, protected_members)

    @property
    def name(self) -> str:
        return self.rpc.name

    def strategy(self) -> st.SearchStrategy[PublicExample]:
        one = request_bytes(self.rpc.request, self._pool)
        payloads = (
            st.lists(one, min_size=1, max_size=3).map(tuple)
            if self.rpc.client_streaming
            else one.map(lambda payload: (payload,))
        )
        return st.builds(
            PublicExample,
            member=st.integers(0, 2),
            payloads=payloads,
            credential=st.integers(0, len(self._wrong) - 1),
        )

    def run(self, example: PublicExample) -> Verdict:
        channels = self._channels()
        channel = channels[example.member % len(channels)]
        payloads = [self._guard(p) for p in example.payloads]
        metadata = self._good if self.authenticated else self._wrong[example.credential]
        answer = invoke(channel, self.rpc, payloads, metadata, UNARY_TIMEOUT_S, STREAM_WINDOW_S)
        verdict = Verdict(answer.code.name)
        problem = self._judge(answer, metadata)
        if problem is not None:
            verdict.failure = problem
            verdict.request = " | ".join(self.rpc.request_text(p) for p in payloads)
        elif self.authenticated and answer.code is Code.OK:
            for response in answer.responses:
                self._pool.harvest(self.rpc.response.FromString(response))
        return verdict

    def _judge(self, answer: Answer, metadata: tuple[tuple[str, str], ...]) -> str | None:
        said = f"{answer.code.name} {answer.details!r}"[:300]
        if not self.authenticated:
            if answer.code is not Code.UNAUTHENTICATED:
                return f"without the token ({metadata or 'no metadata'}): {said}"
            if answer.responses:
                return f"without the token, {len(answer.responses)} responses came first"
            return None
        if answer.code is Code.OK:
            for response in answer.responses:
                try:
                    self.rpc.response.FromString(response)
                except DecodeError:
                    return f"OK with a response that does not parse: {response[:100]!r}"
            return None
        if answer.code in CLIENT_ERRORS:
            return None
        if answer.code is Code.UNAVAILABLE and answer.reason:
            return None  # the member answered: no leader, not the leader, timed out inside
        return said
