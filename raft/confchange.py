"""Configuration changes: simple (one voter at a time) and joint consensus (thesis 4.3).

Theory of operation (etcd-io/raft ``confchange/``): a ``Changer`` takes the tracker's current
configuration and progress map and computes the next ones, without touching the tracker;
the caller swaps them in. Three transitions exist:

- ``simple``: changes that alter the voter set by at most one node are applied directly
  (any two majorities of configurations differing by one voter overlap).
- ``enter_joint``: the outgoing voters are frozen as they are and the changes apply to the
  incoming voters; decisions then need majorities of both (``quorum.JointConfig``).
  Voters being demoted to learners wait in ``learners_next`` meanwhile, since a node cannot
  be a voter and a learner at once.
- ``leave_joint``: drops the outgoing half, turns ``learners_next`` into learners and forgets
  nodes that are in neither half.

Every result is checked against the tracker invariants before it is returned; an invalid
change raises ``ConfChangeError`` and leaves the tracker as it was. ``restore`` rebuilds a
tracker from a ``ConfState`` (a snapshot's or storage's) by replaying equivalent changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import ConfChangeError
from .quorum import JointConfig, MajorityConfig
from .tracker import Progress, ProgressMap, ProgressTracker, TrackerConfig
from .types import ConfChangeSingle, ConfChangeType, ConfState, Index, NodeId


@dataclass(slots=True)
class _WorkingConfig:
    """A mutable draft of a ``TrackerConfig`` while changes are applied."""

    incoming: set[NodeId]
    outgoing: set[NodeId]
    learners: set[NodeId]
    learners_next: set[NodeId]
    auto_leave: bool

    @classmethod
    def of(cls, cfg: TrackerConfig) -> _WorkingConfig:
        return cls(
            incoming=set(cfg.voters.incoming.ids),
            outgoing=set(cfg.voters.outgoing.ids),
            learners=set(cfg.learners),
            learners_next=set(cfg.learners_next),
            auto_leave=cfg.auto_leave,
        )

    def freeze(self) -> TrackerConfig:
        return TrackerConfig(
            voters=JointConfig(
                MajorityConfig(frozenset(self.incoming)), MajorityConfig(frozenset(self.outgoing))
            ),
            auto_leave=self.auto_leave,
            learners=frozenset(self.learners),
            learners_next=frozenset(self.learners_next),
        )


class Changer:
    """Computes configuration transitions from ``tracker``'s current configuration.

    ``last_index`` is the leader's last log index, used to initialise new peers' progress.
    """

    def __init__(self, tracker: ProgressTracker, last_index: Index) -> None:
        self.tracker = tracker
        self.last_index = last_index

    def enter_joint(
        self, auto_leave: bool, changes: Iterable[ConfChangeSingle]
    ) -> tuple[TrackerConfig, ProgressMap]:
        """Enter a joint configuration: outgoing = current voters, incoming = changed."""
        cfg, prs = self._check_and_copy()
        if cfg.outgoing:
            raise ConfChangeError("config is already joint")
        if not cfg.incoming:
            # Joint consensus with an empty outgoing half would be a simple change with
            # none of its safety; etcd refuses it too.
            raise ConfChangeError("can't make a zero-voter config joint")
        cfg.outgoing = set(cfg.incoming)
        self._apply(cfg, prs, changes)
        cfg.auto_leave = auto_leave
        return self._check_and_return(cfg, prs)

    def leave_joint(self) -> tuple[TrackerConfig, ProgressMap]:
        """Leave the joint configuration for its incoming half."""
        cfg, prs = self._check_and_copy()
        if not cfg.outgoing:
            raise ConfChangeError("can't leave a non-joint config")
        for node_id in cfg.learners_next:
            cfg.learners.add(node_id)
            prs[node_id].is_learner = True
        cfg.learners_next = set()
        for node_id in cfg.outgoing:
            if node_id not in cfg.incoming and node_id not in cfg.learners:
                del prs[node_id]
        cfg.outgoing = set()
        cfg.auto_leave = False
        return self._check_and_return(cfg, prs)

    def simple(self, changes: Iterable[ConfChangeSingle]) -> tuple[TrackerConfig, ProgressMap]:
        """Apply changes that alter the voter set by at most one node, without joint state."""
        cfg, prs = self._check_and_copy()
        if cfg.outgoing:
            raise ConfChangeError("can't apply simple config change in joint config")
        before = set(cfg.incoming)
        self._apply(cfg, prs, changes)
        if len(before ^ cfg.incoming) > 1:
            raise ConfChangeError("more than one voter changed without entering joint config")
        return self._check_and_return(cfg, prs)

    # -- internals ------------------------------------------------------------------------

    def _apply(
        self, cfg: _WorkingConfig, prs: ProgressMap, changes: Iterable[ConfChangeSingle]
    ) -> None:
        for cc in changes:
            if cc.node_id == 0:
                # The application may blank out a change it decided not to apply.
                continue
            if cc.type is ConfChangeType.ADD_NODE:
                self._make_voter(cfg, prs, cc.node_id)
            elif cc.type is ConfChangeType.ADD_LEARNER_NODE:
                self._make_learner(cfg, prs, cc.node_id)
            elif cc.type is ConfChangeType.REMOVE_NODE:
                self._remove(cfg, prs, cc.node_id)
            else:
                raise ConfChangeError(f"unexpected conf change type {cc.type!r}")
        if not cfg.incoming:
            raise ConfChangeError("removed all voters")

    def _make_voter(self, cfg: _WorkingConfig, prs: ProgressMap, node_id: NodeId) -> None:
        pr = prs.get(node_id)
        if pr is None:
            self._init_progress(cfg, prs, node_id, is_learner=False)
            return
        pr.is_learner = False
        cfg.learners.discard(node_id)
        cfg.learners_next.discard(node_id)
        cfg.incoming.add(node_id)

    def _make_learner(self, cfg: _WorkingConfig, prs: ProgressMap, node_id: NodeId) -> None:
        pr = prs.get(node_id)
        if pr is None:
            self._init_progress(cfg, prs, node_id, is_learner=True)
            return
        if pr.is_learner:
            return
        # Remove any existing voter role in the incoming config, keeping the progress.
        self._remove(cfg, prs, node_id)
        prs[node_id] = pr
        if node_id in cfg.outgoing:
            # Still a voter of the outgoing half: becomes a learner when the joint
            # configuration is left.
            cfg.learners_next.add(node_id)
        else:
            pr.is_learner = True
            cfg.learners.add(node_id)

    def _remove(self, cfg: _WorkingConfig, prs: ProgressMap, node_id: NodeId) -> None:
        if node_id not in prs:
            return
        cfg.incoming.discard(node_id)
        cfg.learners.discard(node_id)
        cfg.learners_next.discard(node_id)
        # An outgoing voter keeps its progress until the joint configuration is left.
        if node_id not in cfg.outgoing:
            del prs[node_id]

    def _init_progress(
        self, cfg: _WorkingConfig, prs: ProgressMap, node_id: NodeId, *, is_learner: bool
    ) -> None:
        if is_learner:
            cfg.learners.add(node_id)
        else:
            cfg.incoming.add(node_id)
        prs[node_id] = Progress(
            # next = last index (not +1) so that the first probe is at an index the new
            # peer surely lacks, which it rejects with a hint pointing at its real end.
            match=Index(0),
            next=Index(max(self.last_index, 1)),
            inflights=self.tracker.new_inflights(),
            is_learner=is_learner,
            # A new peer counts as active, or check-quorum could depose the leader right
            # after adding it, before it had a chance to answer.
            recent_active=True,
        )

    def _check_and_copy(self) -> tuple[_WorkingConfig, ProgressMap]:
        cfg = _WorkingConfig.of(self.tracker.config)
        # Copies: the tracker's own objects must not change if validation then fails.
        prs = {node_id: pr.copy() for node_id, pr in self.tracker.progress.items()}
        _check_invariants(cfg, prs)
        return cfg, prs

    def _check_and_return(
        self, cfg: _WorkingConfig, prs: ProgressMap
    ) -> tuple[TrackerConfig, ProgressMap]:
        _check_invariants(cfg, prs)
        return cfg.freeze(), prs


def _check_invariants(cfg: _WorkingConfig, prs: ProgressMap) -> None:
    for ids in (cfg.incoming, cfg.outgoing, cfg.learners, cfg.learners_next):
        for node_id in ids:
            if node_id not in prs:
                raise ConfChangeError(f"no progress for {node_id}")
    for node_id in cfg.learners_next:
        if node_id not in cfg.outgoing:
            raise ConfChangeError(f"{node_id} is in learners_next, but not outgoing")
        if prs[node_id].is_learner:
            raise ConfChangeError(f"{node_id} is in learners_next, but is already marked learner")
    for node_id in cfg.learners:
        if node_id in cfg.outgoing:
            raise ConfChangeError(f"{node_id} is in learners and outgoing voters")
        if node_id in cfg.incoming:
            raise ConfChangeError(f"{node_id} is in learners and incoming voters")
        if not prs[node_id].is_learner:
            raise ConfChangeError(f"{node_id} is in learners, but is not marked as learner")
    if not cfg.outgoing:
        if cfg.learners_next:
            raise ConfChangeError("learners_next must be empty when not joint")
        if cfg.auto_leave:
            raise ConfChangeError("auto_leave must be false when not joint")
    known = cfg.incoming | cfg.outgoing | cfg.learners
    for node_id in prs:
        if node_id not in known:
            raise ConfChangeError(f"progress for {node_id} outside the configuration")


def _to_conf_change_singles(
    cs: ConfState,
) -> tuple[list[ConfChangeSingle], list[ConfChangeSingle]]:
    """(outgoing, incoming) changes that rebuild ``cs`` from an empty configuration.

    The outgoing changes build the outgoing voters as a plain configuration; the incoming
    changes, applied with ``enter_joint``, then produce the incoming half, learners and
    learners_next (a node in learners_next must be an outgoing voter first).
    """
    outgoing = [ConfChangeSingle(ConfChangeType.ADD_NODE, i) for i in cs.voters_outgoing]
    incoming = [ConfChangeSingle(ConfChangeType.REMOVE_NODE, i) for i in cs.voters_outgoing]
    incoming += [ConfChangeSingle(ConfChangeType.ADD_NODE, i) for i in cs.voters]
    incoming += [ConfChangeSingle(ConfChangeType.ADD_LEARNER_NODE, i) for i in cs.learners]
    incoming += [ConfChangeSingle(ConfChangeType.ADD_LEARNER_NODE, i) for i in cs.learners_next]
    return outgoing, incoming


def restore(changer: Changer, cs: ConfState) -> tuple[TrackerConfig, ProgressMap]:
    """The configuration and progress map described by ``cs``, built on ``changer.tracker``.

    The tracker is expected to be empty; it is updated step by step while replaying.
    """
    outgoing, incoming = _to_conf_change_singles(cs)
    steps: list[Callable[[], tuple[TrackerConfig, ProgressMap]]] = []
    if not outgoing:
        # Not joint: add the nodes one at a time, each a valid simple change.
        steps = [functools.partial(changer.simple, [cc]) for cc in incoming]
    else:
        # Build the outgoing config one node at a time, then enter joint in one step.
        steps = [functools.partial(changer.simple, [cc]) for cc in outgoing]
        steps.append(functools.partial(changer.enter_joint, cs.auto_leave, incoming))
    tracker = changer.tracker
    for step in steps:
        cfg, prs = step()
        tracker.config = cfg
        tracker.progress = prs
    return tracker.config, tracker.progress
