"""Joining a job, and waiting for a round while joining again when the participant is lost:
the one routine the elastic loop (worker/elastic/run.py) and the torchrun backend
(worker/torchrun.py) share.

Theory of operation. A worker (an elastic training process, or a torchrun agent for its
node) is one participant of its job. :func:`join` makes one: a ``Join``, tried again while no
coordinator member can serve it, for as long as the caller's :class:`Patience` allows.
:func:`next_round` waits for the next ACTIVE round that includes the participant; when the
participant is lost (declared failed: it was paused past its detection) or the wait runs
out, the caller's policy either raises or joins again, and the wait goes on with the new
participant. Both callers use both; what differs is their policy, and why:

- Order. The torchrun agent comes to ``next_rendezvous`` after its workers stopped; if they
  failed while the round is still ACTIVE, the other nodes' workers must restart too, so one
  agent ends that round itself by joining again in its participant's place, *before* it
  waits. The elastic loop's processes re-form in place, and it leaves ending rounds to the
  coordinator (its failure detection and push), so it waits first. It joins again only
  when its participant was lost, or when a collective broke and the coordinator ended
  nothing within ``reform_timeout_s`` (it then leaves, which ends that round, and joins).
- Names. An agent names every join attempt anew (``node/pid/count``): an attempt whose
  answer was lost may have joined, and the next must not take its name. An elastic worker
  joins as the name its user gave (unique in the job; its events and ``rallypoint rounds``
  show it).
- Replacing. An agent joins in its old participant's place (``Join.replaces``: one round
  change, where joining and then leaving made two). An elastic worker whose participant was
  lost joins plainly: the old one is already out of the job. After a broken collective it
  leaves, then joins.
- Held out. A worker the straggler policy evicted is refused (HeldOutError) while the
  job's straggler hold lasts (JobConfig.straggler_hold_windows): :func:`join` logs one line
  saying how long, sleeps out the hold, and joins again (as a newcomer: a scale-up, if
  the job scales up). The rule is the coordinator's, by the worker's name, so a restarted
  process under the same name waits just the same.
- Giving up. An elastic worker with ``rejoin=False`` raises ParticipantLostError; its wait
  for a round is bounded by ``join_timeout_s`` (JoinTimeoutError). An agent joins again
  unless the job was closed (RendezvousClosedError), within torch's rendezvous timeout
  (RoundTimeoutError).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rallypoint.client import (
    DeadlineExceededError,
    HeldOutError,
    JobConfig,
    JobState,
    ParticipantLostError,
    RoundInfo,
    RoundState,
    SyncClient,
    SyncParticipant,
)

from .patience import Patience

log = logging.getLogger("rallypoint.worker.joining")

# Past the hold the server named, so the join after it is not refused again for the clock
# steps between the refusal and the sleep.
_HOLD_MARGIN_S = 0.2

# What the caller does when its participant was lost or its wait ran out: raise, or return
# the participant to wait with from now on (one joined again).
Rejoin = Callable[[SyncParticipant, Exception], SyncParticipant]


def is_live(view: RoundInfo, round_number: int) -> bool:
    """Whether ``view`` (a participant's latest view of its job) shows round ``round_number``
    still ACTIVE: the round this worker formed, or runs in, goes on."""
    return view.round == round_number and view.state is RoundState.ACTIVE


def is_planned(view: RoundInfo, current: RoundInfo) -> bool:
    """Whether ``view``, a round after ``current`` (the round this worker trains in), came
    from a planned change: every member of ``current`` is still in the job (a member or a
    waiter of ``view``), so nobody the step in flight waits for is gone (a drain moved some
    to the wait list, a scale-up added newcomers). A member missing from ``view`` failed,
    left or was evicted: not planned. A view past several changes is planned only if no
    member went missing across them all, which errs towards ending at once."""
    if view.round <= current.round or view.job_closed or view.job_state is not JobState.OPEN:
        return False
    present = {m.participant_id for m in view.members}
    present.update(m.participant_id for m in view.waiting)
    return all(m.participant_id in present for m in current.members)


def join(
    client: SyncClient,
    job: str,
    name: Callable[[], str],
    *,
    config: JobConfig,
    metadata: bytes,
    patience: Patience,
    resume: bool = False,
    replaces: int = 0,
    domain: str = "",
) -> SyncParticipant:
    """Join ``job`` as a participant named ``name()`` (called for each attempt), creating
    the job with ``config`` if absent; tried again while no member can serve it, as the
    ``patience`` allows (then CoordinatorUnreachableError). ``replaces``: a participant
    the new one takes the place of, in one round change (0: none). ``domain``: its failure
    domain (its host; "": none). A worker held out as an evicted straggler waits out the
    hold, saying so once per refusal, and joins then ("Held out" above)."""
    return _waiting_out_holds(
        patience,
        config,
        lambda timeout_s: client.join(
            job,
            name(),
            config=config,
            metadata=metadata,
            resume=resume,
            replaces=replaces,
            domain=domain,
            timeout_s=timeout_s,
        ),
    )


def _waiting_out_holds(
    patience: Patience, config: JobConfig, attempt: Callable[[float], SyncParticipant]
) -> SyncParticipant:
    """``patience.call`` of ``attempt``, sleeping out each straggler hold it is refused for
    (one log line per refusal) and trying again then."""
    while True:
        try:
            return patience.call("joining", attempt)
        except HeldOutError as error:
            # A server that does not say how long: one straggler window, then ask again.
            wait_s = error.retry_after_s
            if wait_s is None:
                wait_s = config.straggler_window_ms / 1000
            log.warning(
                "%s: evicted as a straggler and held out of the job; joining again in %.1f s",
                patience.who,
                wait_s,
            )
            time.sleep(wait_s + _HOLD_MARGIN_S)


def next_round(
    participant: SyncParticipant,
    *,
    timeout_s: Callable[[], float],
    on_lost: Rejoin,
    on_timeout: Rejoin,
) -> tuple[SyncParticipant, RoundInfo]:
    """The next ACTIVE round with this worker, and the participant it includes:
    ``participant``, or the one ``on_lost`` or ``on_timeout`` joined again as. Each wait is
    bounded by ``timeout_s()``, asked anew before it."""
    while True:
        try:
            return participant, participant.wait_for_round(timeout_s=timeout_s())
        except ParticipantLostError as error:
            participant = on_lost(participant, error)
        except DeadlineExceededError as error:
            participant = on_timeout(participant, error)
