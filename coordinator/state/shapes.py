"""Shaped jobs: who a closing round seats, in which units, at which ranks; and whether the
waiters of an ACTIVE round make a whole unit to scale up by. Pure functions of the state;
part of the deterministic state machine (no clock, no hash order: every container is walked
in id, rank, unit or domain-name order).

Theory of operation. A job is *shaped* when its ``unit_size`` u is above 1 or one of its
participants declared a failure domain (``Participant.domain``, e.g. its host; "" is none).
A flat job (u = 1, no domain) keeps the rules of :mod:`.rendezvous` as they were, byte for
byte; a shaped job's rounds follow these:

- Units. A closed round's world size is K * u; unit k is ranks [k*u, (k+1)*u). u divides
  min_nodes and max_nodes, and with ``units_within_domains`` a declared ``domain_size``
  (configure refuses anything else, ``JobConfig.problem``).
- Who may be seated (*eligible*): every participant whose domain is not drained. A shaped
  job's JOINING round holds every participant of the job (drained ones too, and more than
  max_nodes); its close seats K units and puts everyone else, in id order, on the wait list
  (the spares). So the wait list is still empty exactly while the round is JOINING.
- Placement (``place``). An *intact* unit is a unit of the previous round (``Round.previous``,
  the seats its surviving members had) whose u members are all eligible now: it keeps its
  unit index and every rank if the index is below K, else it takes the lowest free index
  (its ranks keep their offsets in the unit). The other eligible participants make *new*
  units: per domain (in name order), in id order, whole units inside the domain; then,
  unless ``units_within_domains``, the leftovers of all domains (domain order, then id
  order) make units that straddle domains; what is left waits. New units take the free
  indices in this order: those from spare hosts first (every member's domain declared and
  without a member in the previous round), then, of those alike, units inside one domain
  before straddling ones, then those holding the longest waiter (a participant that was not
  in the previous round before one that was, then the lower id: ids are join order).
  K = min(max_nodes // u, intact + new units). Intact units are seated first (lowest index
  first, should there be more than K of them).
- Closing. "Full" is K * u == max_nodes; "at least min" is K * u >= min_nodes (after the
  last call, which runs from when min_nodes participants are present). A round with a
  hold (``Round.hold_until_ms``) closes not before it.
- A rank dies. Its round ends; the next JOINING round holds everyone, so the dead rank's
  unit is no longer intact: its survivors are placed again with the spares (a spare unit
  takes the free index, so the world keeps its size), or wait.
- Scale-up (``admits_waiters``): an ACTIVE round with ``scale_up`` and room for one more
  unit ends for the waiters only when the eligible ones make a whole unit, and a domain's
  waiters count only once the domain is complete (``domain_size`` of its participants in
  the job, when declared): a returning host comes back in one round change.

Cost: ``place`` is O(N log N) in the round's participants; ``admits_waiters`` O(waiters).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from .jobs import JobConfig, Participant, Seat

__all__ = ["Placement", "admits_waiters", "place"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a closing round seats its members. Invariants: ``seats`` in participant-id
    order, their ranks a permutation of range(units * unit_size), each unit's ranks
    contiguous; ``waiting`` every other member of the JOINING round, in id order."""

    units: int
    seats: tuple[Seat, ...]
    waiting: tuple[int, ...]


def place(
    config: JobConfig,
    participants: Mapping[int, Participant],
    member_ids: Sequence[int],
    previous: Sequence[Seat],
    drained: Collection[str],
) -> Placement:
    """The placement of a JOINING round of ``member_ids`` (id order) whose previous round
    seated ``previous``; ``drained``: the drained domains (see the module's docstring)."""
    unit_size = config.unit_size
    eligible = [pid for pid in member_ids if participants[pid].domain not in drained]
    eligible_ids = set(eligible)
    # The previous round's units, from the seats of its members that are still eligible.
    old_units: dict[int, list[tuple[int, int]]] = {}
    for seat in previous:
        if seat.participant_id in eligible_ids and seat.rank >= 0:
            members = old_units.setdefault(seat.rank // unit_size, [])
            members.append((seat.rank % unit_size, seat.participant_id))
    intact = sorted(
        (index, tuple(sorted(unit))) for index, unit in old_units.items() if len(unit) == unit_size
    )
    in_intact = {pid for _, unit in intact for _, pid in unit}
    before = {seat.participant_id for seat in previous}
    # Hosts of the previous round (a domain of a member that is still a participant).
    busy = {
        participants[pid].domain for pid in before if pid in participants
    }  # membership tests only: never iterated
    by_domain: dict[str, list[int]] = {}
    for pid in eligible:
        if pid not in in_intact:
            by_domain.setdefault(participants[pid].domain, []).append(pid)
    formed: list[tuple[int, ...]] = []
    leftovers: list[int] = []
    for domain in sorted(by_domain):
        pids = by_domain[domain]
        whole = len(pids) - len(pids) % unit_size
        formed.extend(tuple(pids[i : i + unit_size]) for i in range(0, whole, unit_size))
        leftovers.extend(pids[whole:])
    if not config.units_within_domains:
        whole = len(leftovers) - len(leftovers) % unit_size
        formed.extend(tuple(leftovers[i : i + unit_size]) for i in range(0, whole, unit_size))

    def order(unit: tuple[int, ...]) -> tuple[bool, bool, tuple[bool, int]]:
        domains = [participants[pid].domain for pid in unit]
        spare_host = all(domain and domain not in busy for domain in domains)
        straddles = any(domain != domains[0] for domain in domains)
        return (not spare_host, straddles, min((pid in before, pid) for pid in unit))

    formed.sort(key=order)
    units = min(config.max_nodes // unit_size, len(intact) + len(formed))
    seated_intact = intact[:units]
    kept = {index for index, _ in seated_intact if index < units}
    free = iter(index for index in range(units) if index not in kept)
    ranks: dict[int, int] = {}
    for index, old in seated_intact:
        base = (index if index in kept else next(free)) * unit_size
        for offset, pid in old:
            ranks[pid] = base + offset
    for new in formed[: units - len(seated_intact)]:
        base = next(free) * unit_size
        for offset, pid in enumerate(new):
            ranks[pid] = base + offset
    seats = tuple(Seat(pid, ranks[pid]) for pid in member_ids if pid in ranks)
    waiting = tuple(pid for pid in member_ids if pid not in ranks)
    return Placement(units, seats, waiting)


def admits_waiters(
    config: JobConfig,
    participants: Mapping[int, Participant],
    waiting: Sequence[int],
    drained: Collection[str],
    domain_counts: Mapping[str, int],
) -> bool:
    """Whether the eligible waiters make a whole unit a scale-up may seat: waiters of a
    domain count once the domain holds ``domain_size`` participants (when declared)."""
    counts: dict[str, int] = {}
    for pid in waiting:
        domain = participants[pid].domain
        if domain in drained:
            continue
        if domain and config.domain_size and domain_counts.get(domain, 0) < config.domain_size:
            continue
        counts[domain] = counts.get(domain, 0) + 1
    if config.units_within_domains:
        return any(count >= config.unit_size for count in counts.values())
    return sum(counts.values()) >= config.unit_size
