"""An in-memory member for servicer tests: a real StateMachine, no Raft.

Every proposal is applied at once at the next index, as if this member led a cluster of one,
so the servicers see real results and real failures. Switches make it behave like a member
that cannot serve: ``not_leader(leader_id, address)`` (a follower that knows the leader, or
with ``leader_id=0`` one that knows none), ``fail_next`` (the next proposal or read barrier
raises the given member error), ``raise_next`` (an unexpected exception). Compaction is real:
build it with small ``Limits`` and the watch history drops old revisions. The lessor's clock
is ``clock_ms``, set by hand; it is also the leader clock (``leader_clock_ms``).

Rendezvous: the fake is its own ``liveness`` (``liveness.port.LivenessPort``): ``cut_off``
makes it refuse to serve heartbeats; ``phis`` sets the suspicion reported for a (job,
participant), leader only; ``heartbeats``, ``carried``, ``released``, ``closed_streams`` and
``apply_waits`` record what the servicers did.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc

from rallypoint.coordinator.leader.lessor import Lessor
from rallypoint.coordinator.liveness.local import StreamClock
from rallypoint.coordinator.liveness.progress import ProgressReport
from rallypoint.coordinator.node.api import (
    CompactedWatchError,
    Header,
    Member,
    MemberNotFoundError,
    NodeError,
    NodeStatus,
    NoLeaderError,
    NotLeaderError,
    PeerProgress,
    ProposalDroppedError,
)
from rallypoint.coordinator.service import add_services
from rallypoint.coordinator.service.tokens import ClientTokens
from rallypoint.coordinator.state import Envelope, Limits, StateMachine, encode_envelope
from rallypoint.coordinator.state.commands import Command, SessionOpen
from rallypoint.coordinator.state.errors import Compacted
from rallypoint.coordinator.state.jobs import JobConfig
from rallypoint.coordinator.state.results import LeaseEndResult, LeaseGrantResult, Result
from rallypoint.coordinator.state.values import Event
from rallypoint.proto.v1 import common_pb2, rendezvous_pb2, rendezvous_pb2_grpc

MEMBER_ID = 1
CLUSTER_ID = 77
TERM = 3


class FakeNode:
    def __init__(self, limits: Limits | None = None) -> None:
        self._state = StateMachine(limits)
        self.clock_ms = 1_000_000
        self.lessor = Lessor(lambda: self.clock_ms)
        self.lessor.promote()
        self.index = 0
        self.leader_id = MEMBER_ID
        self.leader_address: str | None = None
        self.fail_next: NodeError | None = None
        self.raise_next: Exception | None = None
        self.members: list[Member] = [Member(MEMBER_ID, "10.0.0.1:2380", "10.0.0.1:2379", False)]
        self.snapshot_index = 0
        # What the servicers asked for, for the tests to check.
        self.proposals: list[tuple[Command, int, int, int, float]] = []
        self.read_barriers = 0
        self.transfers: list[int] = []
        # Open watch iterators; tests wait for this to return to 0 after a cancel.
        self.open_watches = 0
        self._applied = asyncio.Condition()
        # Set, and replaced by a fresh one, whenever an entry applies (wait_for_apply).
        self._applied_signal = asyncio.Event()
        # Rendezvous: the phi each (job, participant) reports on the leader; heartbeats fed,
        # streams reported closed, and calls to wait_for_apply (all in call order).
        self.phis: dict[tuple[str, int], float] = {}
        self.heartbeat_ages: dict[tuple[str, int], int] = {}
        self.progress_reports: list[tuple[str, int, ProgressReport]] = []
        self.progress_views: dict[tuple[str, int], tuple[int, float, float]] = {}
        self.heartbeats: list[tuple[str, int]] = []
        # (job, participant, round) per round a heartbeat named, as the servicer passed it.
        self.named: list[tuple[str, int, int]] = []
        self.closed_streams: list[tuple[str, int]] = []
        self.collective_reports: list[tuple[str, tuple[int, ...], str]] = []
        self.carried: list[tuple[str, int]] = []
        self.released: list[tuple[str, int]] = []
        self.lags: list[int] = []
        self.cut_off = False
        # Batch streams' groups: the participants each carries.
        self._groups: list[set[tuple[str, int]]] = []
        self.apply_waits = 0

    # ------------------------------------------------------------------ switches

    def not_leader(self, leader_id: int, leader_address: str | None) -> None:
        self.leader_id, self.leader_address = leader_id, leader_address

    def _check_serving(self) -> None:
        if self.raise_next is not None:
            error, self.raise_next = self.raise_next, None
            raise error
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure
        if self.leader_id == 0:
            raise NoLeaderError()
        if self.leader_id != MEMBER_ID:
            raise NotLeaderError(self.leader_id, self.leader_address)

    # ------------------------------------------------------------------ ServerNode

    @property
    def member_id(self) -> int:
        return MEMBER_ID

    @property
    def cluster_id(self) -> int:
        return CLUSTER_ID

    @property
    def state(self) -> StateMachine:
        return self._state

    def header(self) -> Header:
        return Header(self._state.revision, TERM, self.leader_id, MEMBER_ID)

    async def propose(
        self,
        command: Command,
        *,
        session_id: int = 0,
        sequence: int = 0,
        first_unacked: int = 0,
        timeout_s: float = 5.0,
        term: int | None = None,
    ) -> Result:
        if term is not None and term != self.leader_term():
            raise ProposalDroppedError(f"proposal dropped: term {term} is not led here")
        self.proposals.append((command, session_id, sequence, first_unacked, timeout_s))
        self._check_serving()
        envelope = Envelope(session_id, sequence, first_unacked, self.clock_ms, command)
        return await self.apply(encode_envelope(envelope))

    def submit(self, command: Command, **fields: Any) -> asyncio.Future[Result]:
        return asyncio.ensure_future(self.propose(command, **fields))

    def leader_term(self) -> int | None:
        return TERM if self.leader_id == MEMBER_ID else None

    def leader_since(self, term: int) -> float | None:
        return 0.0 if term == TERM else None  # led since long before any test

    def require_leader(self) -> None:
        if self.leader_id == 0:
            raise NoLeaderError()
        if self.leader_id != MEMBER_ID:
            raise NotLeaderError(self.leader_id, self.leader_address)

    async def apply(self, data: bytes) -> Result:
        """Apply an entry at the next index, keep the lessor in step, wake the watchers."""
        self.index += 1
        result = self._state.apply(self.index, data)
        if isinstance(result, LeaseGrantResult):
            self.lessor.grant(result.lease_id, result.ttl_ms)
        elif isinstance(result, LeaseEndResult):
            self.lessor.forget(result.lease_id)
        signal, self._applied_signal = self._applied_signal, asyncio.Event()
        signal.set()
        async with self._applied:
            self._applied.notify_all()
        return result

    async def read_barrier(self, timeout_s: float = 5.0) -> None:
        self.read_barriers += 1
        self._check_serving()

    async def watch(
        self, start_revision: int, key: bytes, prefix: bool
    ) -> AsyncIterator[list[Event]]:
        next_revision = start_revision or self._state.revision + 1
        self.open_watches += 1
        try:
            while True:
                async with self._applied:
                    await self._applied.wait_for(functools.partial(self._reached, next_revision))
                # What was applied when the events were read: writes applied while a batch
                # waits at the yield below are read on the next pass, not skipped.
                read_up_to = self._state.revision
                events = self._state.events_since(next_revision, key, prefix)
                if isinstance(events, Compacted):
                    raise CompactedWatchError(next_revision, events.first_available_revision)
                for revision in sorted({event.revision for event in events}):
                    yield [event for event in events if event.revision == revision]
                next_revision = read_up_to + 1
        finally:
            self.open_watches -= 1

    def _reached(self, revision: int) -> bool:
        return self._state.revision >= revision

    def lease_keep_alive(self, lease_id: int) -> int | None:
        self._check_serving()
        return self.lessor.keep_alive(lease_id)

    def lease_remaining_ms(self, lease_id: int) -> int | None:
        self._check_serving()
        return self.lessor.remaining_ms(lease_id)

    # ------------------------------------------------------------------ LivenessPort

    @property
    def liveness(self) -> FakeNode:
        return self

    def open_group(self, job: str, now_ms: int, *, readings: bool = False) -> int:
        self._groups.append(set())
        return len(self._groups) - 1

    def group_update(self, group: int, members: set[tuple[str, int]], now_ms: int) -> None:
        self.carried.extend(sorted(members - self._groups[group]))
        self._groups[group] = set(members)

    def group_beat(self, group: int, now_ms: int) -> None:
        if self.raise_next is not None:
            error, self.raise_next = self.raise_next, None
            raise error
        self.heartbeats.extend(sorted(self._groups[group]))

    def rounds_named(self, job: str, named: Sequence[tuple[int, int]]) -> None:
        self.named.extend((job, pid, round_number) for pid, round_number in named)

    def group_release(self, group: int, job: str, participant_id: int) -> None:
        self._groups[group].discard((job, participant_id))
        self.released.append((job, participant_id))

    def close_group(self, group: int, now_ms: int, *, closed: bool) -> None:
        members, self._groups[group] = self._groups[group], set()
        for job, pid in sorted(members):
            found = self._state.rendezvous.jobs.get(job)
            if closed and found is not None and pid in found.participants:
                self.closed_streams.append((job, pid))
            elif not closed:
                self.released.append((job, pid))

    def report_progress(
        self, job: str, participant_id: int, progress: ProgressReport, now_ms: int
    ) -> None:
        self.progress_reports.append((job, participant_id, progress))

    def collective_failed(
        self, job: str, round_number: int, peers: Sequence[int], report: str, now_ms: int
    ) -> list[int]:
        confirmed = [pid for pid in peers if (job, pid) in self.closed_streams]
        self.collective_reports.append((job, tuple(peers), report))
        return confirmed

    def serves_heartbeats(self) -> bool:
        return not self.cut_off

    def request_lag(self, clock: StreamClock, now_ms: int, sent_ms: int) -> None:
        self.lags.append(clock.lag_ms(now_ms, sent_ms))

    def phi(self, job: str, participant_id: int) -> float | None:
        if self.leader_id != MEMBER_ID:
            return None
        return self.phis.get((job, participant_id))

    def heartbeat_age_ms(self, job: str, participant_id: int) -> int | None:
        if self.leader_id != MEMBER_ID:
            return None
        return self.heartbeat_ages.get((job, participant_id))

    def progress_of(self, job: str, participant_id: int) -> tuple[int, float, float] | None:
        return self.progress_views.get((job, participant_id))

    def leader_clock_ms(self) -> int:
        return self.clock_ms

    async def wait_for_apply(self, timeout_s: float) -> bool:
        self.apply_waits += 1
        signal = self._applied_signal
        try:
            await asyncio.wait_for(signal.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def status(self) -> NodeStatus:
        progress = tuple(
            PeerProgress(m.member_id, self.index, self.index + 1, "replicate", True)
            for m in self.members
        )
        return NodeStatus(
            member_id=MEMBER_ID,
            cluster_id=CLUSTER_ID,
            term=TERM,
            leader_id=self.leader_id,
            role="leader" if self.leader_id == MEMBER_ID else "follower",
            commit_index=self.index,
            applied_index=self.index,
            snapshot_index=self.snapshot_index,
            members=tuple(self.members),
            progress=progress if self.leader_id == MEMBER_ID else (),
        )

    def _member(self, member_id: int) -> Member:
        for member in self.members:
            if member.member_id == member_id:
                return member
        raise MemberNotFoundError(member_id)

    @property
    def membership(self) -> FakeNode:
        return self

    async def add(
        self, peer_address: str, client_address: str, as_learner: bool, timeout_s: float = 10.0
    ) -> Member:
        self._check_serving()
        member = Member(
            max(m.member_id for m in self.members) + 1, peer_address, client_address, as_learner
        )
        self.members.append(member)
        return member

    async def remove(self, member_id: int, timeout_s: float = 10.0) -> None:
        self._check_serving()
        self.members.remove(self._member(member_id))

    async def promote(self, member_id: int, timeout_s: float = 10.0) -> Member:
        self._check_serving()
        member = self._member(member_id)
        promoted = Member(member_id, member.peer_address, member.client_address, False)
        self.members[self.members.index(member)] = promoted
        return promoted

    async def transfer_leader(self, target_id: int, timeout_s: float = 10.0) -> int:
        self._check_serving()
        self._member(target_id or MEMBER_ID)
        self.transfers.append(target_id)
        return target_id or MEMBER_ID

    async def snapshot_now(self) -> int:
        self.snapshot_index = self.index
        return self.index


@contextlib.asynccontextmanager
async def served_at(
    node: FakeNode, auth_token: str | None = None, tokens: ClientTokens | None = None
) -> AsyncIterator[str]:
    """A real grpc.aio server on 127.0.0.1 (a free port) with the public API over ``node``;
    its address. Stopped on exit."""
    server = grpc.aio.server()
    add_services(server, node, auth_token=auth_token, tokens=tokens)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


@contextlib.asynccontextmanager
async def serving(
    node: FakeNode, auth_token: str | None = None, tokens: ClientTokens | None = None
) -> AsyncIterator[grpc.aio.Channel]:
    """:func:`served_at`, and a channel to it; both closed on exit."""
    async with served_at(node, auth_token, tokens) as address:
        channel = grpc.aio.insecure_channel(address)
        try:
            yield channel
        finally:
            await channel.close(None)


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``predicate`` holds, polling the event loop; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)


@dataclass(frozen=True, slots=True)
class RpcFailure:
    code: grpc.StatusCode
    details: str
    reason: str | None
    leader: str | None


def rpc_failure(error: grpc.aio.AioRpcError) -> RpcFailure:
    # grpc-stubs types metadata entries loosely; on the wire both are strings here.
    metadata = dict(cast(Iterable[tuple[str, str]], error.trailing_metadata() or ()))
    return RpcFailure(
        error.code(),
        error.details() or "",
        metadata.get("rallypoint-error-reason"),
        metadata.get("rallypoint-leader"),
    )


async def fails(call: Awaitable[object]) -> RpcFailure:
    """Await a unary call that must fail; its status, message and reason metadata."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return rpc_failure(error)
    raise AssertionError("the call succeeded")


# ---------------------------------------------------------------------- rendezvous helpers


class Headers:
    """The request headers of one session: each call is the next sequence."""

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.sequence = 0

    def __call__(self) -> common_pb2.RequestHeader:
        self.sequence += 1
        return common_pb2.RequestHeader(session_id=self.session_id, sequence=self.sequence)


async def open_session(node: FakeNode) -> Headers:
    """A session opened straight in the fake member's state machine."""
    await node.apply(encode_envelope(Envelope(0, 0, 0, node.clock_ms, SessionOpen(600_000))))
    return Headers(node.index)


def job_config(min_nodes: int, max_nodes: int, **fields: Any) -> rendezvous_pb2.JobConfig:
    """A valid JobConfig on the wire: the state machine's defaults, then ``fields``."""
    defaults = JobConfig(min_nodes, max_nodes)
    values: dict[str, Any] = {
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "last_call_ms": defaults.last_call_ms,
        "join_timeout_ms": defaults.join_timeout_ms,
        "heartbeat_interval_ms": defaults.heartbeat_interval_ms,
        "phi_threshold": defaults.phi_threshold_milli / 1000,
        "phi_window": defaults.phi_window,
        "min_std_ms": defaults.min_std_ms,
        "acceptable_pause_ms": defaults.acceptable_pause_ms,
        "scale_up": defaults.scale_up,
        "keep_checkpoints": defaults.keep_checkpoints,
        "hang_factor": defaults.hang_factor_milli / 1000,
        "hang_floor_ms": defaults.hang_floor_ms,
        "startup_timeout_ms": defaults.startup_timeout_ms,
        "straggler_factor": defaults.straggler_factor_milli / 1000,
        "straggler_windows": defaults.straggler_windows,
        "straggler_window_ms": defaults.straggler_window_ms,
        "unit_size": defaults.unit_size,
        "domain_size": defaults.domain_size,
        "units_within_domains": defaults.units_within_domains,
        "straggler_hold_windows": defaults.straggler_hold_windows,
    }
    values.update(fields)
    return rendezvous_pb2.JobConfig(**values)


async def join_round(
    channel: grpc.aio.Channel, headers: Headers, job: str, size: int, **config: Any
) -> list[rendezvous_pb2.JoinResponse]:
    """``size`` participants ("w0", "w1", ...) of one session join ``job`` with min = max =
    ``size``: the last join closes the round, ranks in join order."""
    stub = rendezvous_pb2_grpc.RendezvousStub(channel)
    return [
        await stub.Join(
            rendezvous_pb2.JoinRequest(
                header=headers(), job=job, name=f"w{i}", config=job_config(size, size, **config)
            )
        )
        for i in range(size)
    ]
