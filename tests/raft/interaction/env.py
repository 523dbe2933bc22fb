"""The interaction environment: a cluster of RawNodes driven one step at a time by a script.

Modelled on etcd-io/raft's ``rafttest.InteractionEnv``. Each node is a ``RawNode`` over its
own ``MemoryStorage``, with a ``random.Random`` seeded by its id, so a script replays
identically. Nothing happens unless a directive says so: ``process-ready`` persists a node's
Ready, queues its messages and applies its committed entries; ``deliver-msgs`` steps queued
messages into their recipients; ``stabilize`` repeats both until nothing is left to do.

The network is a single FIFO list of messages in flight. A partition (``isolate``,
``partition``) does not touch the queue: a message crossing the partition is dropped when it
would be delivered (printed as ``dropped:``), so messages sent before a partition and
delivered after it are lost too, as on a real cut link. ``heal`` removes the partition.

The application state machine is an appender (as etcd's): its state is the concatenation of
the data of every applied normal entry. Each node keeps the history of its states, one per
applied entry, so ``snapshot`` and ``compact`` can capture the state at any applied index,
and ``restart`` can rebuild the node from what its storage persisted.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rallypoint.raft import (
    Config,
    Progress,
    RaftError,
    RawNode,
    ReadOnlyOption,
    SnapshotStatus,
)
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.describe import (
    describe_conf_state,
    describe_entries,
    describe_hard_state,
    describe_message,
    describe_ready,
    describe_snapshot,
    state_name,
)
from rallypoint.raft.log_storage import MemoryStorage, StorageError
from rallypoint.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfState,
    EntryType,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from ..internals import raft_core_for_tests
from .datadriven import CmdArg, DataDrivenSyntaxError, Directive, parse_line

#: A bound on stabilize's rounds; a cluster that has not settled by then is livelocked.
MAX_STABILIZE_ROUNDS = 10_000

_LOG_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    # Silences handler output too (errors still print): for chatty setup steps.
    "NONE": logging.CRITICAL + 10,
}

_TRANSITIONS = {
    "auto": ConfChangeTransition.AUTO,
    "implicit": ConfChangeTransition.JOINT_IMPLICIT,
    "explicit": ConfChangeTransition.JOINT_EXPLICIT,
}

_CHANGE_TYPES = {
    "v": ConfChangeType.ADD_NODE,
    "l": ConfChangeType.ADD_LEARNER_NODE,
    "r": ConfChangeType.REMOVE_NODE,
}


@dataclass(frozen=True, slots=True)
class AppState:
    """The appender state machine after applying the entry at ``index``."""

    index: Index
    term: Term
    conf_state: ConfState
    data: bytes


class ScenarioStorage(MemoryStorage):
    """A MemoryStorage whose ``snapshot()`` is the application's state at its applied index.

    As etcd's interaction tests do: an application can always produce a snapshot of what it
    has applied, so a leader sending a snapshot sends its current state (and configuration),
    not whatever snapshot was last persisted. ``initial_state`` still reads the persisted
    snapshot, which is what a restarted node recovers from.
    """

    def __init__(self) -> None:
        super().__init__()
        self.latest: Callable[[], Snapshot] | None = None

    def snapshot(self) -> Snapshot:
        if self.latest is None:
            return super().snapshot()
        return self.latest()


@dataclass(slots=True)
class Node:
    """One cluster member. Invariant: ``history`` is non-empty and its indexes increase;
    ``history[-1]`` is the state after the last applied entry (or installed snapshot)."""

    id: NodeId
    raw_node: RawNode
    storage: ScenarioStorage
    options: dict[str, Any]
    """The Config fields other than id, storage, rng, applied and logger (kept for restart)."""
    history: list[AppState] = field(default_factory=list)

    @property
    def applied(self) -> AppState:
        return self.history[-1]

    def applied_snapshot(self) -> Snapshot:
        state = self.history[-1]
        return Snapshot(state.data, SnapshotMetadata(state.conf_state, state.index, state.term))


class _OutputHandler(logging.Handler):
    """Routes the core's log records into the environment's output, tagged with the level."""

    def __init__(self, write: Callable[[str], None]) -> None:
        super().__init__()
        self._write = write

    def emit(self, record: logging.LogRecord) -> None:
        level = "WARN" if record.levelname == "WARNING" else record.levelname
        self._write(f"{level} {record.getMessage()}")


class InteractionEnv:
    """The cluster, the network and the output buffer of the block being run."""

    def __init__(self) -> None:
        # nodes[i] has id i + 1: ids are assigned consecutively by add-nodes.
        self.nodes: list[Node] = []
        # Messages sent and not yet delivered or dropped, in send order.
        self.messages: list[Message] = []
        # Partition group per node id; None means a fully connected network.
        self.partition: dict[NodeId, int] | None = None
        self._output: list[str] = []
        self._indent = 0
        self._level = logging.INFO
        # One per RawNode ever started (restarts add one); log-level applies to all.
        self._loggers: list[logging.Logger] = []
        self._handlers: dict[str, Callable[[Directive], None]] = {
            "add-nodes": self._add_nodes,
            "campaign": self._campaign,
            "compact": self._compact,
            "deliver-msgs": self._deliver_msgs,
            "forget-leader": self._forget_leader,
            "heal": self._heal,
            "isolate": self._isolate,
            "log-level": self._log_level,
            "partition": self._partition,
            "process-append-thread": self._process_append_thread,
            "process-ready": self._process_ready,
            "propose": self._propose,
            "propose-conf-change": self._propose_conf_change,
            "raft-log": self._raft_log,
            "raft-state": self._raft_state,
            "read-index": self._read_index,
            "report-snapshot": self._report_snapshot,
            "report-unreachable": self._report_unreachable,
            "restart": self._restart,
            "set-randomized-election-timeout": self._set_randomized_election_timeout,
            "snapshot": self._snapshot,
            "stabilize": self._stabilize,
            "status": self._status,
            "tick-election": self._tick_election,
            "tick-heartbeat": self._tick_heartbeat,
            "transfer-leadership": self._transfer_leadership,
        }

    # -- running directives ----------------------------------------------------------------

    def handle(self, d: Directive) -> str:
        """Run one block: the directive, then each input line as a further directive."""
        self._output = []
        self._indent = 0
        self._run(d)
        if d.cmd != "propose-conf-change":  # its input lines are the changes
            for n, line in enumerate(d.input_lines, start=1):
                cmd, args = parse_line(line)
                self._run(Directive(cmd, args, (), d.line_number + n))
        return "\n".join(self._output) if self._output else "ok"

    def _run(self, d: Directive) -> None:
        handler = self._handlers.get(d.cmd)
        if handler is None:
            raise DataDrivenSyntaxError(f"line {d.line_number}: unknown directive {d.cmd!r}")
        try:
            handler(d)
        except (RaftError, StorageError) as exc:
            # Expected outcomes (a dropped proposal, a compacted index) are part of the
            # scenario's output. Anything else (a broken invariant) propagates and fails it.
            self._error(f"{type(exc).__name__}: {exc}")

    def _write(self, text: str, *, error: bool = False) -> None:
        if self._level > logging.CRITICAL and not error:
            return
        for line in text.rstrip("\n").split("\n"):
            self._output.append(" " * self._indent + line)

    def _error(self, text: str) -> None:
        self._write(text, error=True)

    @contextmanager
    def _indented(self) -> Iterator[None]:
        self._indent += 2
        try:
            yield
        finally:
            self._indent -= 2

    # -- argument helpers ------------------------------------------------------------------

    def _node(self, token: str) -> Node:
        try:
            node_id = int(token)
        except ValueError:
            raise DataDrivenSyntaxError(f"expected a node id, got {token!r}") from None
        if not 1 <= node_id <= len(self.nodes):
            raise DataDrivenSyntaxError(f"no node {node_id} (have {len(self.nodes)})")
        return self.nodes[node_id - 1]

    def _nodes(self, d: Directive) -> list[Node]:
        """The nodes named by the positional arguments; all nodes if none are named."""
        ids = d.positional()
        return [self._node(t) for t in ids] if ids else list(self.nodes)

    def _first_node(self, d: Directive) -> Node:
        ids = d.positional()
        if not ids:
            raise DataDrivenSyntaxError(f"{d.cmd} needs a node id")
        return self._node(ids[0])

    @staticmethod
    def _int(arg: CmdArg, i: int = 0) -> int:
        try:
            return int(arg.vals[i])
        except ValueError:
            raise DataDrivenSyntaxError(f"{arg.key} needs integers, got {arg.vals}") from None

    @staticmethod
    def _bool(arg: CmdArg) -> bool:
        value = arg.single()
        if value not in ("true", "false"):
            raise DataDrivenSyntaxError(f"{arg.key} needs true or false, got {value!r}")
        return value == "true"

    # -- cluster membership ----------------------------------------------------------------

    def _add_nodes(self, d: Directive) -> None:
        """``add-nodes N [voters=(..)] [learners=(..)] [index=I] [content=S] [options]``.

        With voters or learners, each new node starts from a snapshot at ``index`` (term 1)
        holding that configuration, as a bootstrapped cluster; without, it starts empty and
        waits to be added by a conf change and caught up by a snapshot.
        """
        count = int(d.positional()[0])
        voters: list[NodeId] = []
        learners: list[NodeId] = []
        index = 0
        content = b""
        # The scenario defaults are etcd's test defaults: a short election timeout, and
        # pre-vote and check-quorum off unless a scenario turns them on.
        options: dict[str, Any] = {
            "election_tick": 3,
            "heartbeat_tick": 1,
            "pre_vote": False,
            "check_quorum": False,
        }
        setters: dict[str, Callable[[CmdArg], None]] = {
            "voters": lambda a: voters.extend(NodeId(self._int(a, i)) for i in range(len(a.vals))),
            "learners": lambda a: learners.extend(
                NodeId(self._int(a, i)) for i in range(len(a.vals))
            ),
            "prevote": lambda a: options.__setitem__("pre_vote", self._bool(a)),
            "checkquorum": lambda a: options.__setitem__("check_quorum", self._bool(a)),
            "read-only": lambda a: options.__setitem__(
                "read_only_option",
                {"safe": ReadOnlyOption.SAFE, "lease-based": ReadOnlyOption.LEASE_BASED}[
                    a.single()
                ],
            ),
            "inflight": lambda a: options.__setitem__("max_inflight_msgs", self._int(a)),
            "max-size-per-msg": lambda a: options.__setitem__("max_size_per_msg", self._int(a)),
            "max-committed-size-per-ready": lambda a: options.__setitem__(
                "max_committed_size_per_ready", self._int(a)
            ),
            "max-uncommitted-size": lambda a: options.__setitem__(
                "max_uncommitted_entries_size", self._int(a)
            ),
            "step-down-on-removal": lambda a: options.__setitem__(
                "step_down_on_removal", self._bool(a)
            ),
            "disable-proposal-forwarding": lambda a: options.__setitem__(
                "disable_proposal_forwarding", self._bool(a)
            ),
            "election-tick": lambda a: options.__setitem__("election_tick", self._int(a)),
            "heartbeat-tick": lambda a: options.__setitem__("heartbeat_tick", self._int(a)),
        }
        for arg in d.args[1:]:
            if arg.key == "index":
                index = self._int(arg)
            elif arg.key == "content":
                content = arg.single().encode()
            elif arg.key in setters and arg.vals:
                setters[arg.key](arg)
            else:
                raise DataDrivenSyntaxError(f"add-nodes: unknown argument {arg.key!r}")
        bootstrap = bool(voters or learners or index)
        if bootstrap and index <= 1:
            raise DataDrivenSyntaxError("add-nodes: a bootstrapped node needs index > 1")
        for _ in range(count):
            node_id = NodeId(len(self.nodes) + 1)
            storage = ScenarioStorage()
            if bootstrap:
                meta = SnapshotMetadata(
                    ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners))),
                    Index(index),
                    Term(1),
                )
                storage.apply_snapshot(Snapshot(content, meta))
            node = Node(node_id, self._start(node_id, storage, options), storage, options)
            self.nodes.append(node)
            self._reset_app_state(node)
            storage.latest = node.applied_snapshot

    def _start(self, node_id: NodeId, storage: ScenarioStorage, options: dict[str, Any]) -> RawNode:
        logger = logging.Logger(f"raft.{node_id}")  # not registered: no global state
        logger.setLevel(self._level)
        logger.propagate = False
        logger.addHandler(_OutputHandler(self._write))
        self._loggers.append(logger)
        applied = MemoryStorage.snapshot(storage).metadata.index
        config = Config(
            id=node_id,
            storage=storage,
            rng=random.Random(node_id),
            applied=applied,
            logger=logger,
            **options,
        )
        return RawNode(config)

    @staticmethod
    def _reset_app_state(node: Node) -> None:
        """The application restarts from the snapshot its storage holds."""
        persisted = MemoryStorage.snapshot(node.storage)
        meta = persisted.metadata
        node.history = [AppState(meta.index, meta.term, meta.conf_state, persisted.data)]

    def _restart(self, d: Directive) -> None:
        """``restart ID``: crash and recover: only what reached storage survives.

        Unpersisted Ready contents and the application's in-memory state are lost; the new
        RawNode replays committed entries after the storage's snapshot.
        """
        for node in self._nodes(d):
            node.raw_node = self._start(node.id, node.storage, node.options)
            self._reset_app_state(node)
            first, last = node.storage.first_index(), node.storage.last_index()
            log = f"{first}..{last}" if first <= last else "empty"
            self._write(
                f"{node.id} restarted: HardState {describe_hard_state(node.storage.hard_state)} "
                f"Log:{log} Applied:{node.applied.index}"
            )

    # -- Ready handling --------------------------------------------------------------------

    def _process_ready(self, d: Directive) -> None:
        nodes = self._nodes(d)
        for node in nodes:
            if len(nodes) > 1:
                self._write(f"> {node.id} handling Ready")
                with self._indented():
                    self.process_ready(node)
            else:
                self.process_ready(node)

    def process_ready(self, node: Node) -> None:
        """Persist, send, apply, advance: the contract of ``RawNode.ready``."""
        rn = node.raw_node
        rd = rn.ready()
        self._write(describe_ready(rd))
        if not rd.snapshot.is_empty():
            node.storage.apply_snapshot(rd.snapshot)
            meta = rd.snapshot.metadata
            node.history.append(AppState(meta.index, meta.term, meta.conf_state, rd.snapshot.data))
        node.storage.append(rd.entries)
        if not rd.hard_state.is_empty():
            node.storage.set_hard_state(rd.hard_state)
        self.messages.extend((*rd.messages, *rd.messages_after_persist))
        for entry in rd.committed_entries:
            last = node.applied
            if entry.index != last.index + 1:
                raise AssertionError(
                    f"node {node.id} asked to apply {entry.index} after {last.index}"
                )
            conf_state = last.conf_state
            update = entry.data
            if entry.type is EntryType.CONF_CHANGE:
                cc = decode_conf_change(entry.data)
                conf_state = rn.apply_conf_change(cc)
                update = cc.context
            node.history.append(AppState(entry.index, entry.term, conf_state, last.data + update))
        rn.advance(rd)

    def _process_append_thread(self, d: Directive) -> None:
        # Storage writes are synchronous here (process-ready persists): nothing to do.
        self._write("no append work: storage writes are synchronous")

    # -- the network -----------------------------------------------------------------------

    def _deliver_msgs(self, d: Directive) -> None:
        """``deliver-msgs [type=MsgX] [drop=(ids)] ID...``: deliver (or drop) queued messages."""
        msg_type: MessageType | None = None
        recipients: list[tuple[NodeId, bool]] = []
        for arg in d.args:
            if not arg.vals:
                recipients.append((self._node(arg.key).id, False))
            elif arg.key == "drop":
                recipients.extend((NodeId(self._int(arg, i)), True) for i in range(len(arg.vals)))
            elif arg.key == "type":
                try:
                    msg_type = MessageType[arg.single()]
                except KeyError:
                    raise DataDrivenSyntaxError(f"unknown message type {arg.single()}") from None
            else:
                raise DataDrivenSyntaxError(f"deliver-msgs: unknown argument {arg.key!r}")
        if sum(self.deliver(node_id, msg_type, drop) for node_id, drop in recipients) == 0:
            self._write("no messages")

    def _take(self, to: NodeId, msg_type: MessageType | None) -> list[Message]:
        """Remove and return the queued messages to ``to`` (of ``msg_type``), in order."""
        taken: list[Message] = []
        rest: list[Message] = []
        for m in self.messages:
            if m.to == to and (msg_type is None or m.type is msg_type):
                taken.append(m)
            else:
                rest.append(m)
        self.messages = rest
        return taken

    def _crosses_partition(self, m: Message) -> bool:
        if self.partition is None:
            return False
        return self.partition.get(m.from_, -1) != self.partition.get(m.to, -1)

    def deliver(self, to: NodeId, msg_type: MessageType | None, drop: bool) -> int:
        msgs = self._take(to, msg_type)
        for m in msgs:
            if drop or self._crosses_partition(m) or m.to > len(self.nodes):
                self._write("dropped: " + describe_message(m))
                continue
            self._write(describe_message(m))
            try:
                self.nodes[m.to - 1].raw_node.step(m)
            except RaftError as exc:
                self._error(f"{type(exc).__name__}: {exc}")
        return len(msgs)

    def _isolate(self, d: Directive) -> None:
        """``isolate ID``: cut ID off from every other node (until ``heal``)."""
        isolated = self._first_node(d).id
        self.partition = {n.id: int(n.id == isolated) for n in self.nodes}

    def _partition(self, d: Directive) -> None:
        """``partition (1,2) (3)``: each group only hears itself; unnamed nodes form a group."""
        groups: dict[NodeId, int] = {}
        for group, token in enumerate(d.positional(), start=1):
            if not (token.startswith("(") and token.endswith(")")):
                raise DataDrivenSyntaxError(f"partition groups look like (1,2), got {token!r}")
            for member in token[1:-1].split(","):
                node_id = self._node(member.strip()).id
                if node_id in groups:
                    raise DataDrivenSyntaxError(f"node {node_id} is in two partition groups")
                groups[node_id] = group
        self.partition = {n.id: groups.get(n.id, 0) for n in self.nodes}

    def _heal(self, d: Directive) -> None:
        self.partition = None

    def _stabilize(self, d: Directive) -> None:
        """Process Readies and deliver messages among the named nodes until neither has work."""
        nodes = self._nodes(d)
        for _ in range(MAX_STABILIZE_ROUNDS):
            done = True
            for node in nodes:
                if node.raw_node.has_ready():
                    done = False
                    self._write(f"> {node.id} handling Ready")
                    with self._indented():
                        self.process_ready(node)
            for node in nodes:
                if any(m.to == node.id for m in self.messages):
                    done = False
                    self._write(f"> {node.id} receiving messages")
                    with self._indented():
                        self.deliver(node.id, None, drop=False)
            if done:
                return
        raise AssertionError(f"stabilize did not settle in {MAX_STABILIZE_ROUNDS} rounds")

    # -- inputs to one node ----------------------------------------------------------------

    def _tick_election(self, d: Directive) -> None:
        """``tick-election ID``: ``election_tick`` ticks (beware the randomized timeout)."""
        for node in self._nodes(d):
            for _ in range(node.options["election_tick"]):
                node.raw_node.tick()

    def _tick_heartbeat(self, d: Directive) -> None:
        for node in self._nodes(d):
            for _ in range(node.options["heartbeat_tick"]):
                node.raw_node.tick()

    def _set_randomized_election_timeout(self, d: Directive) -> None:
        """``set-randomized-election-timeout ID timeout=T``: until the node's next role change.

        Pins the timeout a follower's ``tick-election`` is measured against, so a scenario
        can let leases expire without the node campaigning on its own.
        """
        arg = d.keyed("timeout")
        if arg is None:
            raise DataDrivenSyntaxError("set-randomized-election-timeout needs timeout=")
        timeout = self._int(arg)
        raft = raft_core_for_tests(self._first_node(d).raw_node)
        if not raft.election_timeout <= timeout < 2 * raft.election_timeout:
            raise DataDrivenSyntaxError(
                f"timeout {timeout} is outside [{raft.election_timeout}, "
                f"{2 * raft.election_timeout})"
            )
        raft.randomized_election_timeout = timeout

    def _campaign(self, d: Directive) -> None:
        self._first_node(d).raw_node.campaign()

    def _propose(self, d: Directive) -> None:
        """``propose ID DATA``."""
        node_id, data = d.positional()
        self._node(node_id).raw_node.propose(data.encode())

    def _propose_conf_change(self, d: Directive) -> None:
        """``propose-conf-change ID [transition=auto|implicit|explicit] v2 l3 r4``.

        The changes may also be given on input lines; none at all asks to leave a joint
        configuration. ``v`` adds (or promotes) a voter, ``l`` adds (or demotes to) a
        learner, ``r`` removes.
        """
        node_id, *tokens = d.positional()
        for line in d.input_lines:
            tokens.extend(line.split())
        changes = []
        for token in tokens:
            kind, number = token[:1], token[1:]
            if kind not in _CHANGE_TYPES or not number.isdigit():
                raise DataDrivenSyntaxError(f"a change looks like v2, l3 or r4; got {token!r}")
            changes.append(ConfChangeSingle(_CHANGE_TYPES[kind], NodeId(int(number))))
        transition = ConfChangeTransition.AUTO
        arg = d.keyed("transition")
        if arg is not None:
            transition = _TRANSITIONS[arg.single()]
        cc = ConfChange(tuple(changes), transition)
        self._node(node_id).raw_node.propose_conf_change(cc)

    def _read_index(self, d: Directive) -> None:
        """``read-index ID CTX``."""
        node_id, ctx = d.positional()
        self._node(node_id).raw_node.read_index(ctx.encode())

    def _transfer_leadership(self, d: Directive) -> None:
        """``transfer-leadership from=ID to=ID``."""
        frm, to = d.keyed("from"), d.keyed("to")
        if frm is None or to is None:
            raise DataDrivenSyntaxError("transfer-leadership needs from= and to=")
        self._node(frm.single()).raw_node.transfer_leader(NodeId(self._int(to)))

    def _forget_leader(self, d: Directive) -> None:
        for node in self._nodes(d):
            node.raw_node.forget_leader()

    def _report_unreachable(self, d: Directive) -> None:
        """``report-unreachable ID PEER``: ID's transport failed to reach PEER."""
        node_id, peer = d.positional()
        self._node(node_id).raw_node.report_unreachable(NodeId(int(peer)))

    def _report_snapshot(self, d: Directive) -> None:
        """``report-snapshot ID PEER [status=finish|failure]``."""
        node_id, peer = d.positional()
        arg = d.keyed("status")
        status = SnapshotStatus.FAILURE
        if arg is None or arg.single() == "finish":
            status = SnapshotStatus.FINISH
        self._node(node_id).raw_node.report_snapshot(NodeId(int(peer)), status)

    # -- storage ---------------------------------------------------------------------------

    def _state_at(self, node: Node, index: int) -> AppState:
        for state in reversed(node.history):
            if state.index == index:
                return state
        raise DataDrivenSyntaxError(
            f"node {node.id} has no applied state at {index} "
            f"(applied {node.history[0].index}..{node.applied.index})"
        )

    def _snapshot(self, d: Directive) -> None:
        """``snapshot ID``: the application snapshots its state at the applied index."""
        node = self._first_node(d)
        state = node.applied
        snap = node.storage.create_snapshot(state.index, state.conf_state, state.data)
        self._write(describe_snapshot(snap))

    def _compact(self, d: Directive) -> None:
        """``compact ID INDEX``: snapshot at INDEX (if not already) and drop entries <= INDEX."""
        node_id, index_token = d.positional()
        node = self._node(node_id)
        index = Index(int(index_token))
        if MemoryStorage.snapshot(node.storage).metadata.index < index:
            state = self._state_at(node, index)
            node.storage.create_snapshot(index, state.conf_state, state.data)
        node.storage.compact(index)
        self._print_log(node)

    # -- inspection ------------------------------------------------------------------------

    def _print_log(self, node: Node) -> None:
        first, last = node.storage.first_index(), node.storage.last_index()
        if last < first:
            self._write(f"log is empty: first index={first}, last index={last}")
            return
        self._write(describe_entries(node.storage.entries(first, Index(last + 1))))

    def _raft_log(self, d: Directive) -> None:
        """``raft-log ID``: the entries in ID's storage (the persisted log)."""
        self._print_log(self._first_node(d))

    def _raft_state(self, d: Directive) -> None:
        """Each node's view: role, voter or not, term, leader, commit and applied."""
        for node in self.nodes:
            st = node.raw_node.status()
            cs = st.conf_state
            voter = "Voter" if node.id in cs.voters or node.id in cs.voters_outgoing else ""
            self._write(
                f"{node.id}: {state_name(st.soft_state.raft_state)} ({voter or 'Non-Voter'}) "
                f"Term:{st.hard_state.term} Lead:{st.soft_state.lead} "
                f"Commit:{st.hard_state.commit} Applied:{st.applied}"
            )

    def _status(self, d: Directive) -> None:
        """``status ID``: the configuration and, on a leader, each peer's progress."""
        st = self._first_node(d).raw_node.status()
        self._write(describe_conf_state(st.conf_state))
        if st.lead_transferee:
            self._write(f"LeadTransferee:{st.lead_transferee}")
        for peer_id in sorted(st.progress):
            self._write(f"{peer_id}: {describe_progress(st.progress[peer_id])}")

    def _log_level(self, d: Directive) -> None:
        """``log-level DEBUG|INFO|WARN|ERROR|NONE`` (NONE silences all but errors)."""
        name = d.positional()[0].upper()
        if name not in _LOG_LEVELS:
            raise DataDrivenSyntaxError(f"unknown log level {name}")
        self._level = _LOG_LEVELS[name]
        for logger in self._loggers:
            logger.setLevel(self._level)


def describe_progress(pr: Progress) -> str:
    """etcd's ``Progress.String``: state, match, next and the flags that are set."""
    parts = [f"{state_name(pr.state)} match={pr.match} next={pr.next}"]
    if pr.is_learner:
        parts.append("learner")
    if pr.is_paused():
        parts.append("paused")
    if pr.pending_snapshot > 0:
        parts.append(f"pendingSnap={pr.pending_snapshot}")
    if not pr.recent_active:
        parts.append("inactive")
    count = pr.inflights.count()
    if count > 0:
        parts.append(f"inflight={count}" + ("[full]" if pr.inflights.full() else ""))
    return " ".join(parts)
