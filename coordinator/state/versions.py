"""Which record version a command needs: the gate that keeps proposals at or below the cluster
version (coordinator/version.py).

A record's encoding already says its format version (codec.py, "Format versions": a field of
``since(n)`` is written only when it holds something other than its default), so what a
command needs is a function of its bytes, not of the request that made it: a ``Put`` that
does not keep its lease is written in format 1, which every member reads, and needs nothing.
``INTRODUCED`` maps each (record, format version) that came after the baseline to the record
version that introduced it; every other pair is part of the baseline.
``tests/coordinator/test_cluster_version.py`` checks that every registered pair is either in
the baseline's ``records.json`` (pinned beside it) or here, so a new one cannot be forgotten.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from ..version import BASELINE_RECORD_VERSION
from . import codec

# (record name, its format version) -> the record version that introduced it.
INTRODUCED: Final[dict[tuple[str, int], int]] = {
    ("ClusterVersion", 1): 2,
    ("Put", 2): 2,
    ("MemorySnapshotCommit", 2): 2,
    ("Round", 4): 3,
    ("CloseRound", 2): 4,
    ("JobConfig", 3): 5,
    ("HeldOut", 1): 5,
}

# The record version from which a held round records the domains holding it (``Round``
# format 4) and ends its hold once none of their participants remains (rounds.py, ``_hold``).
# Below it every member applies the older rule (the hold runs its time), so that members of
# both releases apply the same log to the same state.
HOLD_DOMAINS_VERSION: Final = INTRODUCED[("Round", 4)]


def _written_format(value: Any) -> int:
    """The format version ``value`` (a registered record) is written in."""
    fmt = codec.record_format(type(value))
    if fmt.version == 1:
        return 1
    return fmt.version_of(len(codec.to_obj(value)) - 1)


def required_version(value: Any) -> tuple[int, str]:
    """The record version needed to encode ``value`` (a record, with the records inside it),
    and what needs it (``Put`` format 2, say): the highest over every record in it."""
    needed, feature = BASELINE_RECORD_VERSION, ""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(item)
            continue
        if not dataclasses.is_dataclass(item):
            continue
        name = type(item).__name__
        written = _written_format(item)
        version = INTRODUCED.get((name, written), BASELINE_RECORD_VERSION)
        if version > needed:
            fmt = codec.record_format(type(item))
            newest = [
                field
                for field, added in zip(fmt.field_names, fmt.field_versions, strict=True)
                if added == written > 1
            ]
            feature = f"{name}.{'/'.join(newest)}" if newest else f"the {name} record"
            needed = version
        stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
    return needed, feature


# The record version from which the leader may end a held round's hold early
# (``CloseRound.hold_over``, format 2): every remaining participant of the domains holding it
# was heard from since the failure (rendezvous.py, ``close_round``). Below it the hold runs
# its time (or ends at its domains' last removal, from HOLD_DOMAINS_VERSION).
HOLD_OVER_VERSION: Final = INTRODUCED[("CloseRound", 2)]

# The record version from which a participant the straggler policy evicted is held out of
# its job (joins.py, ``_held_out``; JobConfig.straggler_hold_windows). Below it every member
# admits its join at once, as before, so members of both releases apply the same log alike.
STRAGGLER_HOLD_VERSION: Final = INTRODUCED[("JobConfig", 3)]
