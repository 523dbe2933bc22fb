"""A c10d store backed by the coordinator: ``init_process_group(store=CoordinatorStore(...))``.

Theory of operation. torch's process groups bootstrap through a ``torch.distributed.Store``
(rank 0 publishes an address, the others read it; barriers count with ``add``). The usual
one, ``TCPStore``, lives in rank 0's process: it is a single point of failure, and one that a
restarted group may read stale addresses from. :class:`CoordinatorStore` is the round store
of one (job, round, participant) instead (rendezvous.proto, service RoundStore): replicated
by the coordinator cluster, created empty when the round closes, and closed to writes when
it ends. So every round starts from a clean namespace, nothing depends on one host staying
up, and a worker of a round that ended is refused: every write, and every read of a key the
store lacks, raises :class:`StaleStoreRoundError` naming the round, so its
``init_process_group`` fails at once instead of waiting for peers that will never come. Reads
of keys it holds are answered to the round's members until the next round ends, so ranks
inside ``init_process_group`` when their round ended all see the same store and all connect
(or all fail) at once (coordinator/state/roundstore.py, "Ended, read-only"); a zombie (a
member declared failed) is no longer a participant and is refused every call.

Threads. torch calls a store from several threads (the caller, gloo's and the watchdog's).
The calls go through one :class:`SyncClient`, which is thread-safe: each call is a coroutine
submitted to the client's private event loop, and blocking reads (get, wait) are held by the
server, not by the loop, so one thread's long ``get`` does not delay another thread's
``set`` (the gRPC channel multiplexes them). The one thread that must not call the store is
the client's own loop thread (round-change callbacks run there).

Errors. A key still missing at the timeout is :class:`StoreTimeoutError`; any other failure
of the coordinator (no quorum within the client's timeout, a limit) is
:class:`CoordinatorStoreError`. All are ``torch.distributed.DistStoreError``, hence
``RuntimeError``, which is what torch's callers expect of a store.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from rallypoint.client import (
    DeadlineExceededError,
    RallypointError,
    RoundInfo,
    RoundState,
    StaleRoundError,
    SyncClient,
    SyncParticipant,
    SyncRoundStore,
    TlsConfig,
)

from .errors import WorkerError
from .torch_compat import Store

T = TypeVar("T")

DEFAULT_TIMEOUT = timedelta(seconds=300)


class CoordinatorStoreError(dist.DistStoreError, WorkerError):
    """The coordinator could not serve a store call (see the message and the cause)."""


class StoreTimeoutError(CoordinatorStoreError):
    """A key was still missing when the timeout passed."""


class StaleStoreRoundError(CoordinatorStoreError):
    """The store's round is over (or the participant is no longer one of its members): the
    world it was made for is gone."""

    def __init__(self, message: str, *, job: str, round_number: int) -> None:
        super().__init__(message)
        self.job = job
        self.round_number = round_number


def _text(key: str | bytes) -> str:
    return key.decode() if isinstance(key, bytes) else key


# How soon after a wait its value may answer a get of the same key (see ``wait``).
_WAITED_VALUE_S = 0.01

# A key one rank of a group publishes its address under: the group's prefix, "/", the rank
# (gloo's full mesh: ``<prefix>/<rank>``; see "Exchanges" in ``CoordinatorStore``).
_RANK_KEY = re.compile(r"(.*)/(0|[1-9][0-9]{0,8})")
# How many keys one read ahead covers, times the world size: a gloo address value grows by
# about 8 bytes per rank of its group (measured with torch 2.13: 162 bytes at 2 ranks, 186
# at 4), so an answer stays near half a MiB at any world size.
_READ_AHEAD_KEYS_X_RANKS = 65_536


class CoordinatorStore(Store):
    """The round store of ``round_number`` of ``job``, used as ``participant_id``, as a c10d
    store. ``client`` is a :class:`SyncClient` (borrowed: closing the store leaves it open)
    or the coordinator's endpoints (a list, or one comma-separated string), for which the
    store opens a client of its own, with ``token`` and ``tls``, and closes it in
    :meth:`close`. ``world_size``: the round's (``for_round`` and ``for_participant`` fill it
    in); without it the store reads no address exchange ahead (below).

    Exchanges. gloo connects a group of n ranks through the store: rank r sets
    ``<prefix>/<r>`` to its addresses, then for every rank i of the group, in order, waits
    for ``<prefix>/<i>`` and gets it. One call each made about 20 of a formation's calls to
    the coordinator (the world's group, the snapshots' group, the mesh's), each a read
    barrier. So when a thread that set ``<prefix>/<r>`` waits for ``<prefix>/<i>``, the
    store reads, in one call and without waiting, every ``<prefix>/<j>`` for j below the
    round's world size (no group is larger), asking the leader for cache leases on them, and
    answers the thread's later waits and gets of those keys from what it read while their
    leases last: a key that exists is answered at once, one still missing is waited for as
    before. A lease is the coordinator's promise that no write changes the key before it
    ends (coordinator/service/store_cache.py; a write of it is held until then), and the
    store lets a value go a drift allowance before that, so every answer from it is what a
    read at that moment would answer. A value read without a lease (another member than the
    leader answered) answers only the wait that read it (``wait``).
    """

    def __init__(
        self,
        client: SyncClient | str | Sequence[str],
        job: str,
        round_number: int,
        participant_id: int,
        *,
        timeout: timedelta = DEFAULT_TIMEOUT,
        token: str | None = None,
        tls: TlsConfig | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(client, SyncClient):
            self._client: SyncClient | None = None
            round_store = client.round_store(job, round_number, participant_id)
        else:
            endpoints = client.split(",") if isinstance(client, str) else list(client)
            self._client = SyncClient(endpoints, token=token, tls=tls)
            round_store = self._client.round_store(job, round_number, participant_id)
        self._init(round_store, participant_id, timeout, world_size)

    def _init(
        self,
        round_store: SyncRoundStore,
        participant_id: int,
        timeout: timedelta,
        world_size: int | None,
    ) -> None:
        self._store = round_store
        self.job = round_store.store.job
        self.round_number = round_store.round
        self.participant_id = participant_id
        self._close_lock = threading.Lock()
        # Per thread: the key the thread's last call waited for alone, and its value then
        # (``wait``, ``get``); any other call of the thread drops it.
        self._waited = threading.local()
        # The largest group an exchange can have (None: no exchange is read ahead).
        self._world_size = world_size
        # Values read with a cache lease, and when (monotonic) the store stops trusting
        # each: until then no write changes the key ("Exchanges").
        self._leased: dict[str, tuple[bytes, float]] = {}
        self._leased_lock = threading.Lock()
        self.set_timeout(timeout)

    @classmethod
    def for_participant(
        cls, participant: SyncParticipant, *, timeout: timedelta = DEFAULT_TIMEOUT
    ) -> CoordinatorStore:
        """The store of the participant's current round, which must be ACTIVE with it."""
        info = participant.round
        if info.rank_of(participant.participant_id) is None:
            raise StaleStoreRoundError(
                f"job {info.job!r} round {info.round} is {info.state.value} without participant "
                f"{participant.participant_id}: it has no store for it",
                job=info.job,
                round_number=info.round,
            )
        store: CoordinatorStore = cls.__new__(cls)
        Store.__init__(store)
        store._client = None
        store._init(participant.store(), participant.participant_id, timeout, info.world_size)
        return store

    @classmethod
    def for_round(
        cls,
        client: SyncClient,
        info: RoundInfo,
        participant_id: int,
        *,
        timeout: timedelta = DEFAULT_TIMEOUT,
    ) -> CoordinatorStore:
        """The store of the ACTIVE round ``info``, for its member ``participant_id``."""
        if info.state is not RoundState.ACTIVE:
            raise StaleStoreRoundError(
                f"job {info.job!r} round {info.round} is {info.state.value}: only an ACTIVE "
                "round has a store",
                job=info.job,
                round_number=info.round,
            )
        return cls(
            client,
            info.job,
            info.round,
            participant_id,
            timeout=timeout,
            world_size=info.world_size,
        )

    def __repr__(self) -> str:
        return (
            f"CoordinatorStore({self.job}/{self.round_number}, participant={self.participant_id})"
        )

    def close(self) -> None:
        """Close the client the store opened (a borrowed one stays open)."""
        with self._close_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> CoordinatorStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -------------------------------------------------------------- the c10d API

    def set(self, key: str, value: bytes | str) -> None:
        self._forget([key])
        self._call("set", lambda: self._store.set(key, value))
        # A rank's address in an exchange: this thread reads the others' next ("Exchanges").
        rank_key = _RANK_KEY.fullmatch(_text(key))
        self._waited.exchange = rank_key.group(1) if rank_key is not None else None

    def get(self, key: str) -> bytes:
        """The value at ``key``, waiting up to the store's timeout for it to be set. Right
        after this thread waited for ``key`` alone (and made no other call since), the value
        that wait read: no call to the coordinator (``wait`` says why)."""
        waited: tuple[str, bytes, float] | None = getattr(self._waited, "value", None)
        self._waited.value = None
        leased = self._leased_value(_text(key))
        if leased is not None:
            return leased
        if (
            waited is not None
            and waited[0] == _text(key)
            and time.monotonic() - waited[2] <= _WAITED_VALUE_S
        ):
            return waited[1]
        timeout_s = self._timeout_s(None)
        return self._call(
            "get", lambda: self._store.get(key, timeout_s=timeout_s), key=key, wait_s=timeout_s
        )

    def add(self, key: str, value: int) -> int:
        self._forget([key])
        return self._call("add", lambda: self._store.add(key, value))

    def compare_set(
        self, key: str, expected_value: bytes | str, desired_value: bytes | str
    ) -> bytes:
        """torch's semantics (HashStore, TCPStore): set ``key`` to ``desired_value`` if it
        holds ``expected_value``, or is absent and ``expected_value`` is empty; answer what
        the key holds now, or ``expected_value`` when the key is absent."""
        self._forget([key])
        result = self._call(
            "compare_set", lambda: self._store.compare_set(key, expected_value, desired_value)
        )
        if result.value is None:
            return expected_value.encode() if isinstance(expected_value, str) else expected_value
        return result.value

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        """Wait for every key to exist, up to ``timeout`` (default: the store's).

        A wait for one key reads its value too, and the thread's next call, if it is a
        ``get`` of that key, answers it without a call to the coordinator: gloo connects a
        group by waiting for each peer's address key and then reading it, so a formation made
        two calls (and two read barriers) per peer of each group it connects, about 40% of
        its store calls. The ``get`` answers the value the ``wait`` read, as if it had run
        at that moment: between the two, only a write of this very key by another rank
        could tell, and the keys waited for this way (gloo's addresses) are written once.
        The value answers only a get that follows within ``_WAITED_VALUE_S`` (gloo's comes
        back to back), so no slower exchange between ranks can fit between the two."""
        timeout_s = self._timeout_s(timeout)
        if len(keys) == 1:
            key = _text(keys[0])
            if self._leased_value(key) is not None:
                self._waited.value = None  # a call like any other (``get`` reads the lease)
                return
            if self._read_exchange(key):
                return
            (value,) = self._call(
                "wait",
                lambda: self._store.multi_get([key], timeout_s=timeout_s),
                key=key,
                wait_s=timeout_s,
            )
            self._waited.value = (key, value, time.monotonic())
            return
        self._call(
            "wait",
            lambda: self._store.wait(list(keys), timeout_s=timeout_s),
            key=", ".join(_text(k) for k in keys),
            wait_s=timeout_s,
        )

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """Every key's value, waiting up to the store's timeout for all of them to be set:
        one call to the coordinator (one read barrier), not one per key."""
        timeout_s = self._timeout_s(None)
        return self._call(
            "multi_get",
            lambda: self._store.multi_get(list(keys), timeout_s=timeout_s),
            key=", ".join(_text(k) for k in keys),
            wait_s=timeout_s,
        )

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        """Set every key; distinct keys are written concurrently."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        items = list(zip(keys, values, strict=True))
        self._forget(keys)
        self._call("multi_set", lambda: self._store.multi_set(items))

    def append(self, key: str, value: bytes | str) -> None:
        """Append to the value at ``key`` (a missing key counts as empty), by compare-and-set
        retried until no other writer came in between."""
        self._forget([key])
        self._call("append", lambda: self._store.append(key, value))

    def check(self, keys: Sequence[str]) -> bool:
        return self._call("check", lambda: self._store.check(list(keys)))

    def delete_key(self, key: str) -> bool:
        self._forget([key])
        return self._call("delete_key", lambda: self._store.delete(key))

    def num_keys(self) -> int:
        return self._call("num_keys", self._store.num_keys)

    # -------------------------------------------------------------- exchanges

    def _leased_value(self, key: str) -> bytes | None:
        """``key``'s value read under a lease that still lasts, else None."""
        with self._leased_lock:
            held = self._leased.get(key)
            if held is None:
                return None
            if time.monotonic() < held[1]:
                return held[0]
            del self._leased[key]
            return None

    def _forget(self, keys: Sequence[str | bytes]) -> None:
        """Drop what was read of ``keys`` before this store writes them. (Not needed for
        the answers to stay right: the write is held until the leases ended, and the store
        lets a value go before that.)"""
        with self._leased_lock:
            for key in keys:
                self._leased.pop(_text(key), None)

    def _read_exchange(self, key: str) -> bool:
        """When ``key`` belongs to the exchange this thread published its address in: read
        every key of the exchange that exists, with leases, in one call that does not wait
        ("Exchanges"); whether ``key`` was among them (its value then answers this thread's
        next get of it, as ``wait`` says)."""
        rank_key = _RANK_KEY.fullmatch(key)
        prefix = getattr(self._waited, "exchange", None)
        world_size = self._world_size
        if rank_key is None or world_size is None or rank_key.group(1) != prefix:
            return False
        first = int(rank_key.group(2))
        if first >= world_size:
            return False
        # gloo reads the ranks in order: from this one on.
        last = min(world_size, first + max(1, _READ_AHEAD_KEYS_X_RANKS // world_size))
        wanted = [
            exchange_key
            for exchange_key in (f"{prefix}/{rank}" for rank in range(first, last))
            if exchange_key == key or self._leased_value(exchange_key) is None
        ]
        sent = time.monotonic()
        answer = self._call("wait", lambda: self._store.read_leased([[k] for k in wanted]), key=key)
        found: bytes | None = None
        with self._leased_lock:
            for exchange_key, (values, lease_s) in zip(wanted, answer, strict=True):
                if values is None:
                    continue
                if exchange_key == key:
                    found = values[0]
                if lease_s > 0:
                    self._leased[exchange_key] = (values[0], sent + lease_s)
        if found is None:
            return False
        self._waited.value = (key, found, time.monotonic())
        return True

    # -------------------------------------------------------------- plumbing

    def _timeout_s(self, timeout: timedelta | None) -> float:
        if timeout is not None:
            return max(0.0, timeout.total_seconds())
        # The C++ base holds the timeout (set_timeout, and torch's own calls from C++, set it
        # there); torch's type stubs omit the property.
        default: timedelta = self.timeout  # type: ignore[attr-defined]
        return max(0.0, default.total_seconds())

    def _call(
        self, operation: str, call: Callable[[], T], *, key: str = "", wait_s: float = 0.0
    ) -> T:
        """Run ``call``, raising its failure as one of this module's errors."""
        self._waited.value = None  # a value read by a wait answers only the next call
        where = f"{self.job}/{self.round_number}"
        try:
            return call()
        except StaleRoundError as error:
            raise StaleStoreRoundError(
                f"{operation} refused: round {self.round_number} of job {self.job!r} is over "
                f"or participant {self.participant_id} is not one of its members ({error})",
                job=self.job,
                round_number=self.round_number,
            ) from error
        except DeadlineExceededError as error:
            if wait_s > 0 or key:
                raise StoreTimeoutError(
                    f"{operation} timed out after {wait_s:g} s in store {where}: "
                    f"{key or 'a key'} still missing ({error})"
                ) from error
            raise CoordinatorStoreError(f"{operation} in store {where}: {error}") from error
        except RallypointError as error:
            raise CoordinatorStoreError(f"{operation} in store {where}: {error}") from error
