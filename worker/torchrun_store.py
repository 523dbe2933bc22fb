"""The round store torch's agent gets from ``next_rendezvous``, and what it does when the
round ends under the agent's feet.

Theory of operation. Right after ``next_rendezvous`` returns, torch's agent assigns its
workers' ranks through the round's store (``SimpleElasticAgent._assign_worker_ranks``: each
agent sets ``torchelastic/role_info/<group rank>``; group rank 0 reads them all and sets
``torchelastic/assigned_ranks/<group rank>`` for each; each reads its own), with no handling
of a store error: one raised there ends the agent with a traceback. A round can end in that
window (a member fails, a node joins), and every call to its store is then refused
(:class:`StaleStoreRoundError`). So this store, once its round is over, answers the rest of
the assignment itself: a key this agent wrote reads back, another agent's role info reads as
this agent's, and a missing assignment is torch's own fast path (``TORCH_ELASTIC_WORKER_
IDENTICAL``: node ``g``'s workers start at ``g * local_world_size``; the same answer as the
slow path when every node runs ``--nproc-per-node`` workers). The agent then starts workers
that never train: ``round_over`` is set, so the handler's ``num_nodes_waiting`` is positive
at the agent's next monitor tick and the agent restarts them through ``next_rendezvous``
(a membership change: no restart is counted). A call these answers cannot serve (any other
key) raises the round's error, as before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import timedelta

from rallypoint.client import RoundInfo, SyncClient

from .store import CoordinatorStore, StaleStoreRoundError
from .torch_compat import role_local_world_size

log = logging.getLogger("rallypoint.worker.torchrun")

# torch's keys for the agents' rank assignment (SimpleElasticAgent._assign_worker_ranks).
ROLE_INFO_PREFIX = "torchelastic/role_info/"
ASSIGNED_RANKS_PREFIX = "torchelastic/assigned_ranks/"


class AgentRoundStore(CoordinatorStore):
    """The store of an ACTIVE round as torch's agent uses it (see the module docstring)."""

    group_rank: int
    group_world_size: int
    # The error that said the round is over, once a call met it; None while it runs.
    round_over: StaleStoreRoundError | None
    # What this agent set in the round, in order to answer for it once the round is over.
    _written: dict[str, bytes]

    @classmethod
    def for_agent(
        cls, client: SyncClient, info: RoundInfo, participant_id: int, *, timeout: timedelta
    ) -> AgentRoundStore:
        rank = info.rank_of(participant_id)
        if rank is None:
            raise ValueError(f"participant {participant_id} is not a member of round {info.round}")
        store = cls.for_round(client, info, participant_id, timeout=timeout)
        assert isinstance(store, AgentRoundStore)
        store.group_rank, store.group_world_size = rank, info.world_size
        store.round_over = None
        store._written = {}
        return store

    def set(self, key: str, value: bytes | str) -> None:
        self._written[key] = value.encode() if isinstance(value, str) else value
        if self.round_over is None:
            try:
                super().set(key, value)
            except StaleStoreRoundError as error:
                self._ended(error)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        if self.round_over is None:
            try:
                super().multi_set(keys, values)
            except StaleStoreRoundError as error:
                self._ended(error)
        for key, value in zip(keys, values, strict=True):
            self._written[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        if self.round_over is None:
            try:
                return super().get(key)
            except StaleStoreRoundError as error:
                self._ended(error)
        return self._answer(key)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        if self.round_over is None:
            try:
                return super().multi_get(keys)
            except StaleStoreRoundError as error:
                self._ended(error)
        return [self._answer(key) for key in keys]

    def _ended(self, error: StaleStoreRoundError) -> None:
        self.round_over = error
        log.warning(
            "job %s round %d ended during the agent's rank assignment; its workers will be "
            "restarted in the next round (%s)",
            self.job,
            self.round_number,
            error,
        )

    def _answer(self, key: str) -> bytes:
        """``key``'s value in a round that is over (see the module docstring)."""
        assert self.round_over is not None
        if key in self._written:
            return self._written[key]
        own = self._written.get(f"{ROLE_INFO_PREFIX}{self.group_rank}")
        if own is not None and key.startswith(ROLE_INFO_PREFIX):
            return own
        if own is not None and key == f"{ASSIGNED_RANKS_PREFIX}{self.group_rank}":
            local = role_local_world_size(own)
            base, world = self.group_rank * local, self.group_world_size * local
            return json.dumps([base, world, base, world]).encode()
        raise self.round_over
