"""The simulated network: per-message delay, drop, duplication, reordering, and partitions.

Theory of operation. Every message is planned at send time: dropped (at random, or because
its link is cut), or delivered after a random delay, sometimes twice. Delays are drawn per
message, so two messages on one link arrive out of order whenever the second draws the
shorter delay; a small share draws a long delay (several ticks) to reorder across heartbeat
rounds. A link cut when a message arrives also loses it. Partitions are sets of cut
*directed* links, one set per active fault, so one-way faults are expressible and
overlapping faults compose by union; healing a fault removes its set.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rallypoint.raft import NodeId

Link = tuple[NodeId, NodeId]


@dataclass(frozen=True, slots=True)
class NetworkParams:
    """Per-seed network behaviour; delays in simulation time units (1000 per tick)."""

    drop_prob: float
    dup_prob: float
    delay_min: int
    delay_max: int
    long_delay_prob: float
    long_delay_max: int


class Network:
    """Message fates and the current partition (see the module docstring)."""

    def __init__(self, rng: random.Random, params: NetworkParams) -> None:
        self._rng = rng
        self.params = params
        # Invariant: `blocked` is the union of `_cuts.values()`.
        self._cuts: dict[int, frozenset[Link]] = {}
        self.blocked: frozenset[Link] = frozenset()
        self.healthy = False  # no random loss or duplication (the quiet period before liveness)
        self.sent = 0
        self.dropped = 0

    def cut(self, fault_number: int, links: Iterable[Link]) -> None:
        self._cuts[fault_number] = frozenset(links)
        self._recompute()

    def heal(self, fault_number: int) -> None:
        if self._cuts.pop(fault_number, None) is not None:
            self._recompute()

    def heal_all(self) -> None:
        self._cuts.clear()
        self._recompute()
        self.healthy = True

    def _recompute(self) -> None:
        self.blocked = frozenset().union(*self._cuts.values())

    def plan(self, sender: NodeId, receiver: NodeId) -> tuple[int, ...]:
        """Delivery delays for one message: empty if it is lost, two entries if duplicated."""
        self.sent += 1
        p = self.params
        if (sender, receiver) in self.blocked or (
            not self.healthy and self._rng.random() < p.drop_prob
        ):
            self.dropped += 1
            return ()
        copies = 2 if not self.healthy and self._rng.random() < p.dup_prob else 1
        return tuple(self._delay() for _ in range(copies))

    def _delay(self) -> int:
        p = self.params
        if not self.healthy and self._rng.random() < p.long_delay_prob:
            return self._rng.randint(p.delay_max, p.long_delay_max)
        return self._rng.randint(p.delay_min, p.delay_max)


# -- partition shapes -------------------------------------------------------------------


def isolate(node: NodeId, nodes: Sequence[NodeId]) -> set[Link]:
    """``node`` can neither send to nor hear from anyone."""
    links: set[Link] = set()
    for other in nodes:
        if other != node:
            links.add((node, other))
            links.add((other, node))
    return links


def split(groups: Sequence[Sequence[NodeId]]) -> set[Link]:
    """Nodes talk only within their own group."""
    links: set[Link] = set()
    for i, group in enumerate(groups):
        for j, other_group in enumerate(groups):
            if i != j:
                links.update((a, b) for a in group for b in other_group)
    return links


def chain(order: Sequence[NodeId], ring: bool) -> set[Link]:
    """Each node talks only to its neighbours in ``order`` (closing the ring if asked)."""
    n = len(order)
    allowed: set[Link] = set()
    for i in range(n - 1):
        allowed.add((order[i], order[i + 1]))
        allowed.add((order[i + 1], order[i]))
    if ring and n > 2:
        allowed.add((order[0], order[-1]))
        allowed.add((order[-1], order[0]))
    return {(a, b) for a in order for b in order if a != b and (a, b) not in allowed}


def one_way(sources: Sequence[NodeId], targets: Sequence[NodeId]) -> set[Link]:
    """Messages from ``sources`` to ``targets`` are lost; the reverse direction works."""
    return {(a, b) for a in sources for b in targets if a != b}
