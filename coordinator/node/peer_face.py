"""This member as its peers see it: what the peer transport and the peer service call.

``PeerFace`` implements ``transport.PeerHost`` (the sending side: addresses, unreachable
peers, snapshot outcomes) and ``peer_gate.PeerReceiver`` (the receiving side: stepping
authenticated messages into Raft, Hello answers, and the checks a peer's entries and
snapshots pass before anything of them is persisted). It keeps what only the peer path
needs (the incarnations peers sent, refusal logs, entries and a snapshot already decoded
for their apply) and reads the running member (``RunningMember``: the driver's ``Node``)
for the rest.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from rallypoint.raft import ProposalDroppedError as RaftProposalDroppedError
from rallypoint.raft import SnapshotStatus
from rallypoint.raft.errors import (
    StepLocalMsgError,
    StepPeerNotFoundError,
    TermOutOfRangeError,
)
from rallypoint.raft.types import Entry, Message, MessageType, NodeId, Snapshot

from ..member_table import MemberTable, decode_app_snapshot
from ..metrics import NodeMetrics
from ..peer_auth import PeerKey
from ..peerwire.server import PeerListener
from ..peerwire.transport import StreamTransport
from ..state.machine import StateMachine
from ..transport import PeerServer, PeerTransport
from .bootstrap import is_fresh
from .config import NodeConfig, PeerTls
from .proposals import DecodedEntries, validate_entries

if TYPE_CHECKING:
    from rallypoint.raft import RawNode
    from rallypoint.raft.storage.disk_storage import DiskStorage

    from ..identity import Identity
    from ..state.view import StateView
    from .membership import Membership


class ReportSink(Protocol):
    """Where a peer's liveness report goes (the leader's supervisor)."""

    def take_report(self, member: int, payload: bytes) -> bool: ...


class RunningMember(Protocol):
    """What the peer face reads of the running member (the driver's ``Node``): declared here
    so this module does not import the driver that builds it."""

    identity: Identity | None
    storage: DiskStorage | None
    membership: Membership

    @property
    def supervisor(self) -> ReportSink: ...

    @property
    def core(self) -> RawNode | None: ...

    @property
    def raw(self) -> RawNode: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def state(self) -> StateView: ...

    def wake(self) -> None: ...


__all__ = ["PeerFace"]

log = logging.getLogger("rallypoint.node")

# Vote requests and answers: what a peer that abstains must not have counted.
_VOTE_TRAFFIC = frozenset(
    {
        MessageType.MsgVote,
        MessageType.MsgVoteResp,
        MessageType.MsgPreVote,
        MessageType.MsgPreVoteResp,
    }
)


class PeerFace:
    def __init__(
        self,
        node: RunningMember,
        config: NodeConfig,
        peer_tls: PeerTls | None,
        metrics: NodeMetrics,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._node = node
        self.config = config
        self._peer_tls = peer_tls
        # Fixed for the member's life (``transport.PeerEnd``).
        self.member_id = config.member_id
        self.cluster_id = config.cluster_id
        self.peer_key = PeerKey(config.peer_secret)
        self._metrics = metrics
        self._on_fatal = on_fatal
        # The incarnation each peer last sent with (in memory: for the log line when a peer
        # comes back with a new data directory).
        self._peer_incarnations: dict[int, int] = {}
        # Per peer, the last term refused as out of range that was logged at error level (a
        # peer stuck at such a term repeats it at heartbeat rate: one line per new term).
        self._refused_terms: dict[int, int] = {}
        # Per reason of a refused peer message: when it was last logged, and how many were
        # refused since without a line (note_peer_refusal).
        self._refusals_logged: dict[str, tuple[float, int]] = {}
        # Envelopes decoded when a leader's entries were validated, for their apply.
        self.decoded = DecodedEntries()
        # The last snapshot a peer sent, decoded off the loop by verify_snapshot: its bytes
        # and the state they restore, for the driver's install to swap in.
        self._verified_snapshot: tuple[bytes, StateMachine | None] = (b"", None)
        # Bound once: every append a follower receives counts here (validate_entries).
        received = metrics.peer_entries_received
        self._entries_held = received.labels(held="true")
        self._entries_new = received.labels(held="false")
        # The transport this member sends with, once made (``transport``): told of the
        # proposals peers forward, so that it holds back no commit notice they wait for.
        self._stream: StreamTransport | None = None

    @property
    def incarnation(self) -> int:
        identity = self._node.identity
        return 0 if identity is None else identity.incarnation

    @property
    def abstaining(self) -> bool:
        core = self._node.core
        return core is None or core.abstaining

    @property
    def accepts_traffic(self) -> bool:
        """False until the Raft node runs (while this member asks Hello, say), and once it
        stops."""
        return self._node.core is not None and not self._node.stopping

    @property
    def stopping(self) -> bool:
        return self._node.stopping

    @property
    def peer_names_required(self) -> bool:
        """With TLS on the peer port, a peer's certificate must name it (peer_auth.py)."""
        return self._peer_tls is not None

    def hello_answer(self, from_id: int, probe: bool = False) -> tuple[bool, bool, int, int]:
        """(established, knows the asker, term, last index) for peer_hello.py. Besides the
        leader's version probes (``probe``), only a member with empty storage asks, so an
        established member says so in its own log: the asker lost its data (or never ran
        since the cluster was created)."""
        storage = self._node.storage
        if storage is None:
            return False, False, 0, 0
        established = not is_fresh(storage)
        knows = self._node.membership.knows(from_id)
        if established and not probe:
            log.warning(
                "member %d: member %d started with empty storage and asked whether the "
                "cluster exists: it lost its data (or never ran since the cluster was "
                "created); told it exists, so %s",
                self.member_id,
                from_id,
                "it rejoins without voting until it has caught up"
                if knows
                else "it refuses to start (it is not in the configuration)",
            )
        return established, knows, int(storage.hard_state.term), int(storage.last_index())

    def deliver(
        self, messages: list[Message], incarnation: int = 0, abstaining: bool = False
    ) -> None:
        """Step authenticated messages from one peer into Raft. The votes of a peer that
        says it abstains (it lost its data and has not caught up) are dropped here too, in
        case its Raft node sent them anyway. A message the core refuses as expected (from a
        peer it does not know, a local type, or a proposal forwarded to this member after it
        stopped leading, which the proposer's timeout covers) is dropped; anything else it
        raises is a broken invariant and stops the member."""
        raw = self._node.raw
        if messages:
            # Before its messages are stepped: the acknowledgements of a peer that abstains
            # count toward no quorum (raft: abstaining_peers).
            raw.report_abstaining(messages[0].from_, abstaining)
        if messages and incarnation:
            peer_id = int(messages[0].from_)
            if self._note_incarnation(peer_id, incarnation, abstaining) and abstaining:
                # What a leader recorded this peer holds is void (raft: peer_lost_data).
                raw.report_lost_data(NodeId(peer_id))
        for message in messages:
            if abstaining and message.type in _VOTE_TRAFFIC:
                log.debug(
                    "member %d: dropped %s from abstaining member %d",
                    self.member_id,
                    message.type.name,
                    message.from_,
                )
                continue
            try:
                raw.step(message)
                if message.type is MessageType.MsgProp and self._stream is not None:
                    self._forwarded(self._stream, raw, message.from_)
            except (StepPeerNotFoundError, StepLocalMsgError, RaftProposalDroppedError) as exc:
                log.debug("member %d dropped %s: %s", self.member_id, message.type.name, exc)
            except TermOutOfRangeError as exc:
                self._note_refused_term(message, exc)
            except BaseException as exc:
                log.critical(
                    "member %d: fatal error stepping %s from member %d: %r",
                    self.member_id,
                    message.type.name,
                    message.from_,
                    exc,
                    exc_info=exc,
                )
                self._on_fatal(exc)
                raise
        self._node.wake()

    def _forwarded(self, stream: StreamTransport, raw: RawNode, from_id: int) -> None:
        """A peer's proposal was stepped: if this member leads (and appended it), the peer
        answers its caller only once it applies up to the log's last entry, so the peer
        transport sends it that commit index without delay (peerwire/notice_hold.py)."""
        if raw.leader_term() is not None and from_id != self.member_id:
            stream.await_commit(from_id, raw.last_index())

    def _note_refused_term(self, message: Message, exc: TermOutOfRangeError) -> None:
        """A message Raft refused for its term (raft/types.py MAX_TERM): a bug or corrupted
        state at the sender. Counted, and logged as an error once per peer and term."""
        self._metrics.peer_refusals.labels("term_out_of_range").inc()
        peer = int(message.from_)
        if self._refused_terms.get(peer) == message.term:
            log.debug("member %d: %s", self.member_id, exc)
            return
        self._refused_terms[peer] = int(message.term)
        log.error(
            "member %d refused a message from member %d: %s; that member's state is "
            "corrupt or it has a bug (its messages at this term are dropped)",
            self.member_id,
            peer,
            exc,
        )

    def _note_incarnation(self, peer_id: int, incarnation: int, abstaining: bool) -> bool:
        """Whether ``incarnation`` is new to this run. Warns once per new incarnation of a
        peer: one this member saw change, or (this member restarted since) one that says it
        abstains, which only a member that started from empty storage into an existing
        cluster does."""
        previous = self._peer_incarnations.get(peer_id)
        self._peer_incarnations[peer_id] = incarnation
        if previous == incarnation:
            return False
        if previous is None and not abstaining:
            return True
        log.warning(
            "member %d: member %d came back with a new data directory (incarnation %016x, "
            "was %s)%s",
            self.member_id,
            peer_id,
            incarnation,
            "not seen by this run" if previous is None else f"{previous:016x}",
            ": it lost its data and does not vote until it has caught up" if abstaining else "",
        )
        return True

    def peer_address(self, member_id: int) -> str | None:
        return self._node.membership.peer_address(member_id)

    def peer_addresses(self) -> dict[int, str]:
        return self._node.membership.peer_addresses()

    def learn_peer_address(self, member_id: int, address: str) -> None:
        self._node.membership.learn(member_id, address)

    def members_answer(self) -> tuple[int, MemberTable]:
        """(applied index, member table) for a member that asks (peer_lookup.py)."""
        return int(self._node.state.applied_index), self._node.membership.table

    def report_unreachable(self, member_id: int) -> None:
        self._node.raw.report_unreachable(NodeId(member_id))
        self._node.membership.target_unreachable(member_id)
        self._node.wake()

    def report_snapshot(self, member_id: int, ok: bool) -> None:
        status = SnapshotStatus.FINISH if ok else SnapshotStatus.FAILURE
        self._node.raw.report_snapshot(NodeId(member_id), status)
        self._node.wake()

    def note_peer_refusal(self, reason: str, from_id: int, detail: str) -> None:
        """Count refused traffic of a member and log it: a warning per reason at most once a
        second (a replaying proxy can open streams as fast as it likes), saying how many
        more were refused meanwhile."""
        self._metrics.peer_refusals.labels(reason).inc()
        now = time.monotonic()
        logged_at, suppressed = self._refusals_logged.get(reason, (-1.0, 0))
        if now - logged_at < 1.0 and logged_at >= 0:
            self._refusals_logged[reason] = (logged_at, suppressed + 1)
            log.debug("member %d: %s", self.member_id, detail)
            return
        self._refusals_logged[reason] = (now, 0)
        log.warning(
            "member %d: %s%s",
            self.member_id,
            detail,
            f" ({suppressed} more refused for this reason since the last line)"
            if suppressed
            else "",
        )

    def incoming_snapshot_dir(self) -> str:
        return os.path.join(self.config.data_dir, "incoming")

    def validate_entries(self, entries: tuple[Entry, ...]) -> None:
        """Raise ValueError unless every entry a peer sent would apply (see
        ``proposals.validate_entries``); keep what was decoded for their apply. The
        leading entries this member's log already holds exactly (index, term, type and data)
        were checked when they first came (or were proposed here) and are not decoded again
        (a leader resends entries when messages may have been lost); both kinds are counted
        in ``rallypoint_peer_entries_received``."""
        core = self._node.core
        if core is not None:
            held = core.held_prefix(entries)
            if held:
                self._entries_held.inc(held)
                entries = entries[held:]
            if not entries:
                return
        self._entries_new.inc(len(entries))
        envelopes = validate_entries(entries)
        self.decoded.keep(entries, envelopes, self._node.state.applied_index)

    @property
    def max_snapshot_bytes(self) -> int:
        return self.config.max_snapshot_bytes

    def verify_snapshot(self, snapshot: Snapshot) -> None:
        """Raise ValueError unless a received snapshot decodes and names a sane
        configuration (run off the event loop: decoding a large state takes a while)."""
        conf = snapshot.metadata.conf_state
        if snapshot.metadata.index < 1 or snapshot.metadata.term < 1:
            raise ValueError("a snapshot's index and term start at 1")
        if not conf.voters:
            raise ValueError("its configuration has no voter")
        members, state = decode_app_snapshot(snapshot.data)
        decoded = StateMachine(self.config.limits)
        decoded.restore(state)  # raises StateCodecError if malformed
        missing = [v for v in conf.voters if members.get(v) is None]
        if missing:
            raise ValueError(f"its member table lacks the addresses of voters {missing}")
        # Kept for the install, which then swaps it in instead of decoding again on the event
        # loop (a state of 1,000,000 keys takes seconds to decode). One reference assignment,
        # so the loop sees the old or the new pair, never half of one.
        self._verified_snapshot = (snapshot.data, decoded)

    async def serve(self) -> PeerServer:
        """Start serving the peer port (``peerwire``'s listener), with TLS if configured."""
        tls = self._peer_tls
        listener = PeerListener(self, None if tls is None else tls.server_ssl_context())
        await listener.start(self.config.peer_address)
        return listener

    def transport(self, rng: random.Random) -> PeerTransport:
        """This member's peer transport, over TLS if configured."""
        tls = self._peer_tls
        self._stream = StreamTransport(self, rng, None if tls is None else tls.client_ssl_context())
        return self._stream

    def take_verified(self, data: bytes) -> StateMachine | None:
        """The state ``verify_snapshot`` decoded from exactly ``data`` (None if it decoded
        another, or none): the install swaps it in instead of decoding on the loop."""
        verified_data, decoded = self._verified_snapshot
        self._verified_snapshot = (b"", None)
        return decoded if decoded is not None and verified_data is data else None

    def liveness_report(self, from_id: int, payload: bytes) -> bool:
        """A member's liveness report, for this member's supervisor (False: not leader)."""
        return self._node.supervisor.take_report(from_id, payload)
