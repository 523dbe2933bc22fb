"""The bootstrap store of one ACTIVE round: the c10d Store semantics torch needs.

Theory of operation. Process groups bootstrap from the replicated cluster, never from rank
0's host: each (job, round) has its own store, namespaced "<job>/<round>", created empty
when the round closes and dropped when it ends, so memory stays bounded by one store per
job and no key of an old world leaks into a new one.

Only members of the round may use it, and only while it is ACTIVE (the rendezvous checks
this before calling in here: see ``Rendezvous.member_store``). Not while JOINING: the
bootstrap needs the rank and world size, which exist only once the round closes, and a
JOINING round's membership may still change. Not written after it ends: a straggler or a
zombie (paused past its failure detection, then resumed) gets ``StaleRound`` for every write,
and for every read of a key the store lacks (a blocked wait included, the moment the round
ends), instead of writing into, or waiting on, a world that no longer exists.

Ended, read-only. The store of the round that ended last stays readable, frozen, by that
round's members that are still participants of the job, until the next round ends (or the
job does): a read of a key it holds is answered, a read of a key it lacks is refused at once
(nothing can be written to it any more), every write is refused (``EndedRoundStore``). Why:
a round can end while its ranks are inside ``init_process_group`` (a scale-up the instant a
worker joins after the round closed). gloo's full mesh has each rank write its address and
then read every rank's before it connects, so a store that refused every read from the
moment the round ended split the ranks: one whose read was refused gave up, and a peer that
had read its address already sat in gloo's connect for five times its timeout (25 s) while
the next round waited for it. Frozen, the store gives every rank the same answer: either
every rank wrote its address before the end, and every rank reads them all and connects in
milliseconds (then sees the round ended and moves on), or one did not, and every rank's read
of that key is refused before anyone connects. The previous round's store is of no use to a
new round (it is never the new round's: stores are per round) and is never written again.

Not state: the ended store is kept beside the replicated state as a cache of the log (like
the rendezvous' rank index), not in snapshots and not compared between replicas. Reads do
not change the state, so replaying a log still gives the same bytes, old logs included, and
no format or command version is involved. A member restored from a snapshot taken after the
round ended (or restarted since) does not have it and refuses those reads as before the
rule existed: slower in that rare case, never wrong.

Writes are commands (applied in log order on every replica); reads (get, wait, num_keys,
check) are answered from the applied state by the servicer, which also implements waiting
(re-checking after each applied entry until its deadline). Values are bytes; ``add`` keeps
a decimal integer like the KV store's Add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rallypoint.proto.v1.counters import fits_int64, parse_counter

from . import codec
from .commands import StoreAdd, StoreCommand, StoreCompareSet, StoreDelete, StoreSet
from .errors import (
    AddOverflow,
    InvalidCommand,
    KeyTooLarge,
    LimitExceeded,
    NotAnInteger,
    StaleRound,
    ValueTooLarge,
)
from .jobs import RendezvousLimits
from .results import (
    Result,
    StoreAddResult,
    StoreCompareSetResult,
    StoreDeleteResult,
    StoreSetResult,
)


class RoundStore:
    # A live store: a read of a missing key may wait for a write (EndedRoundStore's is set).
    ended: StaleRound | None = None

    def __init__(self) -> None:
        # Iterated only through sorted() (bytes hash with the process's seed).
        self.values: dict[bytes, bytes] = {}
        # Invariant: the sum of len(key) + len(value) over `values`.
        self.size_bytes = 0

    # ----------------------------------------------------------------- reads

    def get(self, key: bytes) -> bytes | None:
        return self.values.get(key)

    def num_keys(self) -> int:
        return len(self.values)

    def check(self, keys: list[bytes]) -> bool:
        return all(key in self.values for key in keys)

    # ----------------------------------------------------------------- writes

    def execute(self, command: StoreCommand, limits: RendezvousLimits) -> Result:
        key = command.key
        if not key:
            return InvalidCommand("the store key must not be empty")
        if len(key) > limits.max_store_key_bytes:
            return KeyTooLarge(len(key), limits.max_store_key_bytes)
        if isinstance(command, StoreSet):
            return self._write(key, command.value, limits) or StoreSetResult()
        if isinstance(command, StoreAdd):
            return self._add(key, command.delta, limits)
        if isinstance(command, StoreCompareSet):
            return self._compare_set(key, command.expected, command.desired, limits)
        if isinstance(command, StoreDelete):
            return StoreDeleteResult(self._delete(key))
        raise AssertionError(f"no rule to execute {command!r}")

    def _write(self, key: bytes, value: bytes, limits: RendezvousLimits) -> Result | None:
        """Store ``value`` at ``key``; a failure if a limit forbids it (nothing changed)."""
        if len(value) > limits.max_store_value_bytes:
            return ValueTooLarge(len(value), limits.max_store_value_bytes)
        previous = self.values.get(key)
        if previous is None and len(self.values) >= limits.max_store_keys:
            return LimitExceeded("keys in one round's store", limits.max_store_keys)
        growth = len(value) - (len(previous) if previous is not None else -len(key))
        if self.size_bytes + growth > limits.max_store_bytes:
            return LimitExceeded("bytes in one round's store", limits.max_store_bytes)
        self.values[key] = value
        self.size_bytes += growth
        return None

    def _add(self, key: bytes, delta: int, limits: RendezvousLimits) -> Result:
        current = self.values.get(key)
        base = 0 if current is None else parse_counter(current)
        if base is None:
            return NotAnInteger(key)
        total = base + delta
        if not fits_int64(total):
            return AddOverflow(key)
        return self._write(key, str(total).encode("ascii"), limits) or StoreAddResult(total)

    def _compare_set(
        self, key: bytes, expected: bytes, desired: bytes, limits: RendezvousLimits
    ) -> Result:
        current = self.values.get(key)
        if (current is None and expected == b"") or current == expected:
            failure = self._write(key, desired, limits)
            return failure or StoreCompareSetResult(True, desired)
        return StoreCompareSetResult(False, current)

    def _delete(self, key: bytes) -> bool:
        previous = self.values.pop(key, None)
        if previous is None:
            return False
        self.size_bytes -= len(key) + len(previous)
        return True

    # ----------------------------------------------------------------- snapshots

    def to_obj(self) -> list[Any]:
        return [[key, self.values[key]] for key in sorted(self.values)]

    @classmethod
    def from_obj(cls, obj: Any) -> RoundStore:
        store = cls()
        if not isinstance(obj, list):
            raise codec.StateCodecError(f"malformed round store: {obj!r}"[:200])
        for item in obj:
            if not (isinstance(item, list) and len(item) == 2):
                raise codec.StateCodecError(f"malformed store entry: {item!r}"[:200])
            key, value = (codec.from_obj(part, bytes) for part in item)
            store.values[key] = value
            store.size_bytes += len(key) + len(value)
        return store


@dataclass(frozen=True, slots=True)
class EndedRoundStore:
    """The store of a round that ended, read-only (see "Ended, read-only" above): ``ended``
    is the refusal of a read of a key it lacks, which no write will ever add."""

    store: RoundStore
    ended: StaleRound

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def num_keys(self) -> int:
        return self.store.num_keys()

    def check(self, keys: list[bytes]) -> bool:
        return self.store.check(keys)
