"""Pre-admission health checks: a rank that should not train drains its own failure domain
before the round trains.

``elastic_training(health_check=...)`` takes a callable ``check(round) -> str | None``. Every
rank of a forming round that has one calls it at the same point, once the round's process
group is up and before the formation's gate and the restore (formation.py), so a check may run
collectives on the round's group (through ``round.all_reduce`` and ``round.wait``, which are
given up when the round ends); such a check must then be set on every rank of the job, or its
collectives meet the gate of the ranks without it. It returns why this rank's domain should
be drained, or None. Every rank votes, a rank with no check "healthy", in the gate's
all-reduce (no collective of its own). When any rank says so, every rank gives the round up
before restoring anything, that rank drains its own domain (``client.drain(host, reason)``: a
worker's token may drain the domain its own participant is in), and the coordinator's drain
ends the round: the next one forms without the drained domain, whose workers wait until an
operator runs ``rallypoint undrain`` (docs/operations.md, "Draining a host").

The built-in :class:`CollectiveProbe` times a ring exchange among the round's ranks and names
a rank whose links are far slower than its peers': each rank sends a buffer to the next rank
and receives one from the previous, ``exchanges`` times, each exchange started together (an
all-reduce before it), and records how long the receive from its left neighbour took (the
link from rank r-1 to r). A slow rank slows both links it is on, its left one and its right
one; a healthy rank next to it slows only one. So a rank is blamed when both of its links
are over ``factor`` times the median of the other links and over it by at least ``floor_s``
(timer noise on a quiet machine). With fewer than three ranks every link has both ranks on
it and nobody can be blamed: the probe then says nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import WorkerError
from .round import ElasticRound

# What elastic_training(health_check=...) takes: why this rank's domain should be drained,
# or None.
HealthCheck = Callable[[ElasticRound], "str | None"]


class ProbeAbandoned(WorkerError):
    """The round ended during the probe (raised inside the probe, never out of formation)."""


def slow_ranks(link_s: Sequence[float], factor: float, floor_s: float) -> list[int]:
    """The ranks to blame, given ``link_s[r]``: the time of the link from rank r-1 to rank r
    (ring order). A rank is blamed when both its links, ``link_s[r]`` and ``link_s[r+1]``,
    are over ``factor`` x the median of the other links and over it by at least
    ``floor_s``."""
    world_size = len(link_s)
    if world_size < 3:
        return []
    blamed = []
    for rank in range(world_size):
        mine = (rank, (rank + 1) % world_size)
        baseline = _baseline(link_s, mine)
        if all(link_s[i] > factor * baseline and link_s[i] - baseline >= floor_s for i in mine):
            blamed.append(rank)
    return blamed


def _baseline(link_s: Sequence[float], mine: tuple[int, int]) -> float:
    """The median of the links a rank is not on: its own two would pull the median of a
    small ring towards them (with 4 ranks, two slow links of 4 are half of them)."""
    return statistics.median(t for i, t in enumerate(link_s) if i not in mine)


@dataclass(frozen=True, slots=True)
class CollectiveProbe:
    """A ring exchange among the round's ranks (module docstring): a rank whose two links
    are over ``factor`` x the median of the others (and by ``floor_s`` at least) drains its
    domain.

    Arguments:
        exchanges: how many ring exchanges are timed (their times are summed).
        size_bytes: the buffer each rank sends per exchange.
        factor: how many times the median of the other links a rank's two links must both
            exceed.
        floor_s: the least excess over the median that counts (summed over the exchanges).
    """

    exchanges: int = 3
    size_bytes: int = 1 << 20
    factor: float = 4.0
    floor_s: float = 0.05

    def __post_init__(self) -> None:
        if self.exchanges < 1 or self.size_bytes < 1:
            raise ValueError("CollectiveProbe: exchanges and size_bytes must be >= 1")
        if not self.factor > 1:
            raise ValueError(f"CollectiveProbe: factor must be > 1, not {self.factor!r}")
        if self.floor_s < 0:
            raise ValueError(f"CollectiveProbe: floor_s must be >= 0, not {self.floor_s!r}")

    def __call__(self, round_: ElasticRound) -> str | None:
        if round_.world_size < 3:
            return None
        try:
            link_s = self.measure(round_)
        except ProbeAbandoned:
            return None
        blamed = slow_ranks(link_s, self.factor, self.floor_s)
        if round_.rank not in blamed:
            return None
        rank, world_size = round_.rank, round_.world_size
        links = (rank, (rank + 1) % world_size)
        baseline = _baseline(link_s, links)
        return (
            f"collective probe: rank {rank}'s links took {link_s[links[0]] * 1000:.1f} and "
            f"{link_s[links[1]] * 1000:.1f} ms, over {self.factor:g}x the median of the "
            f"others ({baseline * 1000:.1f} ms)"
        )

    def measure(self, round_: ElasticRound) -> list[float]:
        """Every link's time, the same list on every rank: ``[r]`` is the link from rank r-1
        to rank r, summed over the exchanges."""
        rank, world_size = round_.rank, round_.world_size
        send = torch.ones(max(1, self.size_bytes // 4), dtype=torch.float32)
        receive = torch.empty_like(send)
        elapsed = 0.0
        for _ in range(self.exchanges):
            # Start together, so the receive's time is the link's, not a peer's lateness.
            if not round_.all_reduce(torch.zeros(1)):
                raise ProbeAbandoned(round_.end_reason)
            started = time.monotonic()
            self._before_exchange(rank)
            received = dist.irecv(receive, src=(rank - 1) % world_size)
            sent = dist.isend(send, dst=(rank + 1) % world_size)
            if received is None or sent is None:
                raise AssertionError("gloo's isend and irecv return their work")
            if not round_.wait(received, "the health probe's receive"):
                raise ProbeAbandoned(round_.end_reason)
            elapsed += time.monotonic() - started
            if not round_.wait(sent, "the health probe's send"):
                raise ProbeAbandoned(round_.end_reason)
        links = torch.zeros(world_size, dtype=torch.float64)
        links[rank] = elapsed
        if not round_.all_reduce(links):
            raise ProbeAbandoned(round_.end_reason)
        return [float(t) for t in links]

    def _before_exchange(self, rank: int) -> None:
        """Called on every rank just before each exchange (a test slows one rank here)."""
