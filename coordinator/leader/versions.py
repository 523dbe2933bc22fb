"""The leader's part of the cluster version (``coordinator/version.py``): ask every member its
record version, and propose the cluster version when it can rise.

Theory of operation. While this member leads, every ``PROBE_INTERVAL_S`` (and as soon as the
configuration changes) it asks each other voter and learner ``Hello`` (``peer_hello.ask``),
whose answer carries the member's record version under its own MAC; it knows its own. When
every member of the configuration has answered since the last change, the cluster version
to propose is their minimum (``version.cluster_version_to_propose``: never while one is
unheard, and never below 2, since a member of the baseline cannot decode the command). It is
proposed only when above the applied cluster version, which the state machine never lowers.

What a member advertised is soft state of this leadership: a member that restarts with
another build answers the next probe with its new version; a member that does not answer
keeps the cluster version where it is (it is not raised past a member nobody heard). Once
the cluster version is this build's own record version nothing can rise further, and the
leader stops asking. Probes say they are probes (``HelloRequest.version_probe``), so a member
of this release does not log the asker as one that lost its data; a member of the baseline
does (one warning per probe, until it is upgraded).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..version import RECORD_VERSION, cluster_version_to_propose

log = logging.getLogger("rallypoint.node")

PROBE_INTERVAL_S = 1.0

# (member id, peer address) -> the version that member advertises, or None without an answer.
AskVersion = Callable[[int, str], Awaitable[int | None]]


class VersionProbe:
    """Leader-only: what each member advertised, and the cluster version proposals.

    Invariant: ``advertised`` holds only answers given during this leadership."""

    def __init__(
        self,
        member_id: int,
        ask: AskVersion,
        members: Callable[[], dict[int, str]],
        cluster_version: Callable[[], int],
        propose: Callable[[int], Awaitable[None]],
        interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self.member_id = member_id
        self._ask = ask
        self._members = members
        self._cluster_version = cluster_version
        self._propose = propose
        self.interval_s = interval_s
        self.is_leader = False
        self.advertised: dict[int, int] = {}
        self._changed = asyncio.Event()

    def promote(self) -> None:
        self.is_leader = True
        self.advertised.clear()
        self._changed.set()

    def demote(self) -> None:
        self.is_leader = False
        self.advertised.clear()

    def membership_changed(self) -> None:
        """Probe now: a new member's version is unknown until it answers."""
        self._changed.set()

    async def probe_once(self) -> int | None:
        """Ask every member once; propose the cluster version if it can rise. The version
        proposed, or None."""
        members = self._members()
        answers = await asyncio.gather(
            *(self._ask(m, address) for m, address in members.items() if m != self.member_id)
        )
        if not self.is_leader:
            return None
        asked = [m for m in members if m != self.member_id]
        for member_id, version in zip(asked, answers, strict=True):
            if version is None:
                self.advertised.pop(member_id, None)
            else:
                self.advertised[member_id] = version
        self.advertised[self.member_id] = RECORD_VERSION
        for gone in set(self.advertised) - set(members) - {self.member_id}:
            del self.advertised[gone]
        target = cluster_version_to_propose(self.advertised, frozenset(members))
        current = self._cluster_version()
        if target is None or target <= current:
            return None
        log.warning(
            "member %d: every member runs record version %d or later (%s): proposing "
            "cluster version %d (was %d)",
            self.member_id,
            target,
            ", ".join(f"{m}: {v}" for m, v in sorted(self.advertised.items())),
            target,
            current,
        )
        await self._propose(target)
        return target

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            # At this build's own version nothing can rise further (a leader never proposes
            # above its own): no probes, so a settled cluster asks nobody anything.
            if self.is_leader and self._cluster_version() < RECORD_VERSION:
                await self.probe_once()
