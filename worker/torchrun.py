"""torchrun's rendezvous over the coordinator: ``torchrun --rdzv-backend=rallypoint``.

    torchrun --nnodes=1:4 --nproc-per-node=8 --max-restarts=3 \\
        --rdzv-backend=rallypoint --rdzv-id=my-job \\
        --rdzv-endpoint=coord1:2379,coord2:2379,coord3:2379 train.py

Theory of operation. Each torchrun agent is one participant of the coordinator job named by
``--rdzv-id``; the agent's rendezvous rounds are the job's rounds (rendezvous.proto). The
handler implements torch's ``RendezvousHandler`` on them directly, rather than plugging a
key-value backend under torch's own dynamic rendezvous, so torchrun gets the coordinator's
failure detection (phi-accrual heartbeats: a dead or paused node is noticed in about a
second, not at a keep-alive timeout), stable ranks (a surviving node keeps its group rank),
round changes pushed by a watch, and round-fenced stores.

- ``next_rendezvous`` waits for the next ACTIVE round with this agent's participant. If the
  agent's current round is still ACTIVE (its own workers failed, so the other agents' groups
  must restart too), one agent (the first to claim the round's restart key) joins again
  under a new name in its old participant's place (``Join.replaces``, one replicated
  command): that ends the round once, and the next one opens at once with the survivors and
  the new participant in the old one's seat. Joining and then leaving cost two round changes
  when the job scales up (``--nnodes=1:3``): the new name ended the round as a waiter, the
  old name's leave then ended the round that held both, which the agent had just returned.
  An agent whose participant was lost (it was paused past its failure detection) joins
  again too.
- ``num_nodes_waiting`` is what makes the other agents restart their workers: it is positive
  once the round their workers run in is over (a member failed or left, or a waiting node
  scaled the job up: jobs are created with ``scale_up``, torchrun's admit-by-restart).
- The store in ``RendezvousInfo`` (the agents' rank assignment and exit barrier) is the
  round's store (:class:`AgentRoundStore`). A round that ends while the agent assigns its
  workers' ranks sends the agent back to ``next_rendezvous`` at its next monitor tick
  instead of out with a traceback (``torchrun_store.py``). The workers' store is the same
  round store, served to them by a :class:`TCPStoreBridge` in their own agent: the handler sets
  ``use_agent_store`` so that torch's ``env://`` makes every worker a TCPStore client of
  ``MASTER_ADDR:MASTER_PORT``, which each agent points at its own bridge. No process
  connects to another node's store, nothing depends on node 0 staying up, and each round
  starts from an empty store, so restarted workers never read an earlier attempt's
  addresses. The training script needs no change.
- A coordinator that cannot be reached (not started yet, every member restarting) is waited
  for, with a line in the log after each attempt, for ``connect_timeout`` (the rendezvous
  timeout unless set) within the rendezvous timeout; then the agent ends with one line
  saying what to check (``patience.py``), as it does when no round forms in time.

Settings come from ``--rdzv-conf`` (seconds unless named otherwise): ``timeout`` (torch's
rendezvous timeout, also ``join_timeout``), ``connect_timeout``, ``last_call_timeout``,
``heartbeat_interval``, ``phi_threshold``, ``acceptable_pause``, ``client_timeout``,
``store_timeout``, ``token`` (else ``$RALLYPOINT_TOKEN``; a ``job:<id>`` token of this job is
enough), ``tls_ca``, ``tls_cert``, ``tls_key``, ``bridge_host``, ``master_port_range``
(``LOW-HIGH``: the ports the workers' store, their ``MASTER_PORT``, may listen on), ``domain``
(the node's failure domain, its host: ``--local-addr`` or the host name unless set; "" for
none). Keys of
torch's own backends (such as ``read_timeout``) are accepted and ignored with a warning, so a
command line written for ``c10d`` runs unchanged. A setting that cannot be used ends the
agent with one line naming it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from rallypoint.client import (
    InvalidValueError,
    JobClosedError,
    JobConfig,
    JobNotFoundError,
    LeaveOutcome,
    RallypointError,
    RoundInfo,
    SyncClient,
    SyncParticipant,
    TlsConfig,
    UnauthenticatedError,
    parse_endpoints,
    token_or_environment,
)
from rallypoint.proto.v1.defaults import TORCHRUN_AGENT, TORCHRUN_JOB

from . import joining
from .errors import WorkerError
from .patience import CoordinatorUnreachableError, Patience, one_line_at_exit
from .store import CoordinatorStoreError
from .tcpstore import NoFreePortError, PortRange, TCPStoreBridge
from .torchrun_store import AgentRoundStore

log = logging.getLogger("rallypoint.worker.torchrun")

BACKEND = "rallypoint"
_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# Keys of a round's store under which the agents count themselves done (see _settle).
_DONE_COUNT_KEY = "rallypoint/torchrun/done"
_ALL_DONE_KEY = "rallypoint/torchrun/all-done"
# The key of a round's store whose first writer ends the round for a restart (_claim_restart).
_RESTART_KEY = "rallypoint/torchrun/restart"
SETTLE_TIMEOUT_S = 30.0
# The longest failure domain the coordinator takes (RendezvousLimits.max_domain_chars).
_MAX_DOMAIN_CHARS = 256
# How an agent's user passes a token, as a refused one's message says.
TOKEN_HINT = "--rdzv-conf token=... or $RALLYPOINT_TOKEN"
_OUR_KEYS = frozenset(
    {
        "timeout",
        "join_timeout",
        "connect_timeout",
        "last_call_timeout",
        "heartbeat_interval",
        "phi_threshold",
        "acceptable_pause",
        "client_timeout",
        "store_timeout",
        "token",
        "tls_ca",
        "tls_cert",
        "tls_key",
        "bridge_host",
        "master_port_range",
        "domain",
    }
)


class RendezvousSettingsError(RendezvousError, ValueError, WorkerError):
    """A ``--rdzv-endpoint``, ``--rdzv-id`` or ``--rdzv-conf`` value the backend cannot use."""


class CoordinatorUnreachableRendezvousError(RendezvousConnectionError, WorkerError):
    """No coordinator member could serve the agent for its connect timeout (one line: what
    was tried and what to check)."""


class TokenRefusedRendezvousError(RendezvousConnectionError, WorkerError):
    """The coordinator requires a token and the agent sent none, or one it does not know
    (one line: which member, and ``--rdzv-conf token=`` or ``$RALLYPOINT_TOKEN``)."""


class RoundTimeoutError(RendezvousTimeoutError, WorkerError):
    """No round formed with this agent within the rendezvous timeout."""


class WorkersStorePortError(RendezvousError, WorkerError):
    """No port of ``master_port_range`` was free for the workers' store."""


E = TypeVar("E", bound=BaseException)


def _one_line(error: E) -> E:
    """``error``, which ends the agent, if uncaught, with its message on one line: these are
    expected conditions with a message that says what to check, not bugs to trace."""
    one_line_at_exit(type(error))
    return error


def _positive_seconds(config: Mapping[str, Any], key: str, default: float) -> float:
    seconds = _seconds(config, key, default)
    if seconds == 0:
        raise ValueError(f"--rdzv-conf {key}={config.get(key)!r}: must be more than 0 seconds")
    return seconds


def _seconds(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--rdzv-conf {key}={value!r}: expected a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"--rdzv-conf {key}={value!r}: must be a finite, non-negative number")
    return seconds


@dataclass(frozen=True, slots=True)
class RendezvousSettings:
    """The handler's settings, from torchrun's rendezvous parameters. Every default comes
    from ``rallypoint.proto.v1.defaults``: ``TORCHRUN_JOB`` (the job's, in seconds here) and
    ``TORCHRUN_AGENT``."""

    endpoints: tuple[str, ...]
    job: str
    min_nodes: int
    max_nodes: int
    # How this node names itself to the coordinator (``--local-addr`` or the host name).
    node_name: str
    # The node's failure domain (its host): ``--rdzv-conf domain=...``; None: node_name. A
    # domain's participants are removed and readmitted together (docs/elastic.md, "Mesh
    # jobs"); "" declares none.
    domain: str | None = None
    join_timeout_s: float = TORCHRUN_JOB.join_timeout_ms / 1000
    # How long the agent keeps trying while no coordinator member can serve it (the
    # rendezvous timeout unless set): see patience.py.
    connect_timeout_s: float = TORCHRUN_JOB.join_timeout_ms / 1000
    last_call_s: float = TORCHRUN_JOB.last_call_ms / 1000
    heartbeat_interval_s: float = TORCHRUN_JOB.heartbeat_interval_ms / 1000
    phi_threshold: float = TORCHRUN_JOB.phi_threshold
    acceptable_pause_s: float = TORCHRUN_JOB.acceptable_pause_ms / 1000
    client_timeout_s: float = TORCHRUN_AGENT.client_timeout_s
    store_timeout_s: float = TORCHRUN_AGENT.store_timeout_s
    token: str | None = None
    tls: TlsConfig | None = None
    bridge_host: str = TORCHRUN_AGENT.bridge_host
    # The ports the workers' store (MASTER_PORT) may listen on, inclusive; None: any free one.
    master_port_range: PortRange | None = None

    @staticmethod
    def from_parameters(params: RendezvousParameters) -> RendezvousSettings:
        endpoints = tuple(e.strip() for e in params.endpoint.split(",") if e.strip())
        if not endpoints:
            raise ValueError(
                "--rdzv-endpoint must list the coordinator members, comma-separated "
                "(host:port,host:port,...)"
            )
        try:
            # Checked here, so a bad one ends the agent with this line, not a traceback
            # from its first call.
            endpoints = tuple(parse_endpoints(list(endpoints)))
        except InvalidValueError as error:
            raise ValueError(f"--rdzv-endpoint={params.endpoint}: {error}") from None
        if not _JOB_ID.fullmatch(params.run_id):
            raise ValueError(
                f"--rdzv-id {params.run_id!r} is not a coordinator job id: 1..128 characters "
                "of A-Z a-z 0-9 . _ -"
            )
        config: dict[str, Any] = dict(params.config)
        ignored = sorted(set(config) - _OUR_KEYS)
        if ignored:
            log.warning("--rdzv-conf keys not used by the rallypoint backend: %s", ignored)
        tls_files = [config.get(key) for key in ("tls_ca", "tls_cert", "tls_key")]
        tls = TlsConfig.from_files(*tls_files) if any(tls_files) else None
        timeout_key = "join_timeout" if "join_timeout" in config else "timeout"
        join_timeout_s = _positive_seconds(config, timeout_key, TORCHRUN_JOB.join_timeout_ms / 1000)
        port_range = config.get("master_port_range")
        node_name = params.local_addr or socket.getfqdn()
        domain = None if "domain" not in config else str(config["domain"])
        if domain is not None and len(domain) > _MAX_DOMAIN_CHARS:
            raise ValueError(
                f"--rdzv-conf domain={domain[:40]}...: a failure domain is at most "
                f"{_MAX_DOMAIN_CHARS} characters"
            )
        return RendezvousSettings(
            endpoints=endpoints,
            job=params.run_id,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            node_name=node_name,
            domain=domain,
            join_timeout_s=join_timeout_s,
            connect_timeout_s=_positive_seconds(config, "connect_timeout", join_timeout_s),
            last_call_s=_seconds(config, "last_call_timeout", TORCHRUN_JOB.last_call_ms / 1000),
            heartbeat_interval_s=_seconds(
                config, "heartbeat_interval", TORCHRUN_JOB.heartbeat_interval_ms / 1000
            ),
            phi_threshold=_seconds(config, "phi_threshold", TORCHRUN_JOB.phi_threshold),
            acceptable_pause_s=_seconds(
                config, "acceptable_pause", TORCHRUN_JOB.acceptable_pause_ms / 1000
            ),
            client_timeout_s=_seconds(config, "client_timeout", TORCHRUN_AGENT.client_timeout_s),
            store_timeout_s=_seconds(config, "store_timeout", TORCHRUN_AGENT.store_timeout_s),
            token=token_or_environment(config.get("token")),
            tls=tls,
            bridge_host=str(config.get("bridge_host", TORCHRUN_AGENT.bridge_host)),
            master_port_range=(
                None
                if port_range is None
                else PortRange.parse(str(port_range), "--rdzv-conf master_port_range")
            ),
        )

    @property
    def failure_domain(self) -> str:
        """The domain the agent joins with: ``domain``, else the node's name."""
        return self.node_name if self.domain is None else self.domain

    def job_config(self) -> JobConfig:
        return JobConfig(
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            last_call_ms=round(self.last_call_s * 1000),
            join_timeout_ms=max(1, round(self.join_timeout_s * 1000)),
            heartbeat_interval_ms=max(1, round(self.heartbeat_interval_s * 1000)),
            phi_threshold=self.phi_threshold,
            acceptable_pause_ms=round(self.acceptable_pause_s * 1000),
            # torchrun admits a late node by restarting every group: a waiting participant
            # ends a round smaller than max_nodes.
            scale_up=True,
        )


class RallypointRendezvousHandler(RendezvousHandler):
    """torch's ``RendezvousHandler`` over coordinator rounds; see the module docstring. Used
    from the agent's thread only (torch's agent is single-threaded)."""

    def __init__(self, settings: RendezvousSettings) -> None:
        self.settings = settings
        self._client: SyncClient | None = None
        self._bridge: TCPStoreBridge | None = None
        # The agent's participant; replaced when the agent joins again.
        self._participant: SyncParticipant | None = None
        # Participants this agent has joined as: names the next one.
        self._joins = 0
        # The round the last next_rendezvous returned (its workers run in it); None before.
        self._round: RoundInfo | None = None
        self._closed_locally = False
        # The store of that round, as handed to the agent.
        self._store: AgentRoundStore | None = None

    # -------------------------------------------------------------- RendezvousHandler

    def get_backend(self) -> str:
        return BACKEND

    def get_run_id(self) -> str:
        return self.settings.job

    @property
    def use_agent_store(self) -> bool:
        # Workers become TCPStore clients of MASTER_ADDR:MASTER_PORT, our bridge.
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        settings = self.settings
        # torch's timeout bounds the whole rendezvous, waiting for the coordinator included.
        deadline = time.monotonic() + settings.join_timeout_s
        try:
            client = self._connect()
            participant = self._participant
            # Joins again first (ending a live round whose workers failed), then waits: the
            # opposite order of the elastic loop's; worker/joining.py says why.
            if (
                participant is None
                or participant.lost.is_set()
                or (self._runs_in_live_round() and self._claim_restart())
            ):
                participant = self._join_again(client, participant, deadline)
            # The participant the round was found for: a new one if the old was lost while
            # waiting (a paused agent learns it was declared failed only as it runs again).
            participant, info = self._wait_for_round(client, participant, deadline)
        except CoordinatorUnreachableError as error:
            raise _one_line(CoordinatorUnreachableRendezvousError(str(error))) from error
        except JobClosedError as error:
            raise RendezvousClosedError(f"job {settings.job!r} is closed: {error}") from error
        except UnauthenticatedError as error:
            raise _one_line(TokenRefusedRendezvousError(str(error))) from None
        except RallypointError as error:
            raise RendezvousConnectionError(
                f"rendezvous of job {settings.job!r} failed: {error}"
            ) from error
        rank = info.rank_of(participant.participant_id)
        assert rank is not None, "wait_for_round returned a round without this participant"
        store = AgentRoundStore.for_agent(
            client,
            info,
            participant.participant_id,
            timeout=timedelta(seconds=settings.store_timeout_s),
        )
        self._store = store
        bridge = self._serve_workers()
        try:
            port = bridge.serve_round(settings.job, info.round, participant.participant_id)
        except NoFreePortError as error:
            raise _one_line(
                WorkersStorePortError(f"job {settings.job!r}: {error} (master_port_range)")
            ) from None
        self._round = info
        log.info(
            "job %s round %d: group rank %d of %d (participant %d); workers' store at %s:%d",
            settings.job,
            info.round,
            rank,
            info.world_size,
            participant.participant_id,
            bridge.host,
            port,
        )
        return RendezvousInfo(store, rank, info.world_size, RendezvousStoreInfo(bridge.host, port))

    def num_nodes_waiting(self) -> int:
        """Positive once the round this agent's workers run in is over: the agent must then
        restart them and rendezvous again."""
        participant, current = self._participant, self._round
        if participant is None or current is None:
            return 0
        if participant.lost.is_set():
            return 1
        store = self._store
        if store is not None and store.round_over is not None:
            # The round ended during the rank assignment: the watch may not have said so yet.
            return 1
        view = participant.round
        if joining.is_live(view, current.round):
            return 0
        ours = {m.participant_id for m in current.members}
        newcomers = [m for m in (*view.members, *view.waiting) if m.participant_id not in ours]
        return max(1, len(newcomers))

    def is_closed(self) -> bool:
        if self._closed_locally:
            return True
        participant = self._participant
        if participant is not None:
            return participant.round.job_closed
        try:
            return self._connect().get_job(self.settings.job).round.job_closed
        except JobNotFoundError:
            return False
        except RallypointError as error:
            raise RendezvousConnectionError(str(error)) from error

    def set_closed(self) -> None:
        self._closed_locally = True
        try:
            self._connect().close_job(self.settings.job)
        except JobNotFoundError:
            pass
        except RallypointError as error:
            raise RendezvousConnectionError(
                f"closing job {self.settings.job!r}: {error}"
            ) from error

    def shutdown(self) -> bool:
        """Leave the job (once every member of the round is done, see :meth:`_settle`) and
        close the bridge and the client."""
        self._settle()
        participant, self._participant = self._participant, None
        if participant is not None and not participant.lost.is_set():
            outcome, detail = _agent_outcome(self.settings.node_name, sys.exc_info()[1])
            with contextlib.suppress(RallypointError):
                participant.leave(outcome=outcome, detail=detail)
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()
        client, self._client = self._client, None
        if client is not None:
            client.close()
        return True

    # -------------------------------------------------------------- plumbing

    def _settle(self) -> None:
        """Leaving ends the round, and with it the round's store: an agent still inside
        torch's exit barrier (a store wait) would have it refused. So each agent counts
        itself done in the store after its barrier, and leaves once all members have (the
        last one to count says so), the round ended anyway, or SETTLE_TIMEOUT_S passed."""
        store, current = self._store, self._round
        if store is None or current is None or not self._runs_in_live_round():
            return
        try:
            if store.add(_DONE_COUNT_KEY, 1) >= current.world_size:
                store.set(_ALL_DONE_KEY, b"1")
            else:
                store.wait([_ALL_DONE_KEY], timedelta(seconds=SETTLE_TIMEOUT_S))
        except CoordinatorStoreError as error:
            log.info("leaving job %s without every member done: %s", self.settings.job, error)

    def _connect(self) -> SyncClient:
        """The agent's client. It opens its session with its first call, which goes through
        the patience (``_join_again``): making it never waits for the coordinator."""
        settings = self.settings
        if self._client is None:
            self._client = SyncClient(
                list(settings.endpoints),
                token=settings.token,
                tls=settings.tls,
                timeout_s=settings.client_timeout_s,
                open_session_on_connect=False,
                token_hint=TOKEN_HINT,
            )
        return self._client

    def _serve_workers(self) -> TCPStoreBridge:
        """The bridge that serves this agent's workers their store, made on first use."""
        settings = self.settings
        if self._bridge is None:
            self._bridge = TCPStoreBridge(
                settings.endpoints,
                host=settings.bridge_host,
                token=settings.token,
                tls=settings.tls,
                timeout_s=settings.client_timeout_s,
                port_range=settings.master_port_range,
            )
        return self._bridge

    def _patience(self, deadline: float) -> Patience:
        """How long to keep trying while no coordinator member can serve the agent: the
        connect timeout, within what is left of the rendezvous timeout."""
        settings = self.settings
        return Patience(
            settings.endpoints,
            timeout_s=max(0.001, min(settings.connect_timeout_s, deadline - time.monotonic())),
            attempt_s=settings.client_timeout_s,
            who=f"job {settings.job!r}",
            log=log,
        )

    def _runs_in_live_round(self) -> bool:
        """This agent's workers ran in a round that is still ACTIVE with it."""
        participant, current, store = self._participant, self._round, self._store
        if participant is None or current is None:
            return False
        if store is not None and store.round_over is not None:
            return False
        view = participant.round
        return joining.is_live(view, current.round)

    def _claim_restart(self) -> bool:
        """Whether this agent is the one to end its live round. When a worker dies, every
        agent's group fails at about the same time; if each joined again and left, each
        departure would end one more round. The first to set the round's restart key does
        it; the others keep their participants, carried into the next round."""
        store, participant = self._store, self._participant
        assert store is not None and participant is not None
        claim = str(participant.participant_id).encode()
        try:
            return store.compare_set(_RESTART_KEY, b"", claim) == claim
        except CoordinatorStoreError as error:
            log.info(
                "job %s: not ending round %d: %s", self.settings.job, store.round_number, error
            )
            return False

    def _join_again(
        self, client: SyncClient, old: SyncParticipant | None, deadline: float
    ) -> SyncParticipant:
        """Join as a new participant in the old one's place, in one command (the old one, if
        still in the job, leaves in the same round change; see the module docstring). Waits
        for an unreachable coordinator as the patience allows. How this differs from the
        elastic loop's join, and why: worker/joining.py."""
        settings = self.settings
        # Ids are never reused, so naming a participant already gone (lost, evicted, or
        # replaced by an attempt whose answer was lost) makes a plain join.
        replaces = 0 if old is None else old.participant_id

        def name() -> str:
            # A new name for each attempt: one whose answer was lost may have joined.
            self._joins += 1
            return f"{settings.node_name}/{os.getpid()}/{self._joins}"

        if old is not None:
            # Its view will soon lack it: that is this join taking its place, not a failure.
            old.expect_replacement()
        try:
            new = joining.join(
                client,
                settings.job,
                name,
                config=settings.job_config(),
                metadata=settings.node_name.encode(),
                patience=self._patience(deadline),
                replaces=replaces,
                domain=settings.failure_domain,
            )
        except BaseException:
            if old is not None:
                old.expect_replacement(False)
            raise
        self._participant = new
        if old is not None:
            # Already out of the job: stop its heartbeats, no Leave (it would only be refused).
            old.close()
        return new

    def _wait_for_round(
        self, client: SyncClient, participant: SyncParticipant, deadline: float
    ) -> tuple[SyncParticipant, RoundInfo]:
        """The next ACTIVE round with this agent, and the participant it includes: ``participant``
        or, if that was lost while waiting, the one this agent joined again as."""
        settings = self.settings

        def remaining_s() -> float:
            return max(0.0, deadline - time.monotonic())

        def timed_out(_: SyncParticipant, error: Exception) -> SyncParticipant:
            raise _one_line(
                RoundTimeoutError(
                    f"job {settings.job!r}: no round within the rendezvous timeout "
                    f"({settings.join_timeout_s:g} s): {error}"
                )
            ) from error

        def lost(participant: SyncParticipant, _: Exception) -> SyncParticipant:
            if participant.round.job_closed:
                raise RendezvousClosedError(f"job {settings.job!r} was closed") from None
            log.warning(
                "participant %d of job %s was lost while waiting; joining again",
                participant.participant_id,
                settings.job,
            )
            return self._join_again(client, participant, deadline)

        return joining.next_round(
            participant, timeout_s=remaining_s, on_lost=lost, on_timeout=timed_out
        )


def _agent_outcome(node: str, error: BaseException | None) -> tuple[LeaveOutcome, str]:
    """The agent's exit status, said to the job as it leaves. torch's launcher calls
    ``shutdown`` from a ``finally`` block after the agent's run: an exception on its way out
    is a failure (ChildFailedError: the workers failed past --max-restarts; a rendezvous
    error), none means the workers succeeded."""
    if error is None:
        return LeaveOutcome.FINISHED, f"torchrun agent {node}: the workers succeeded"
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        codes = sorted({getattr(f, "exitcode", "?") for f in failures.values()}, key=str)
        what = f"{len(failures)} worker(s) failed (exit code {', '.join(map(str, codes))})"
    else:
        what = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
    return LeaveOutcome.FAILED, f"torchrun agent {node}: {what}"[:1024]


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's handler creator for the ``rallypoint`` backend."""
    try:
        settings = RendezvousSettings.from_parameters(params)
    except (ValueError, OSError) as error:  # OSError: a TLS file that cannot be read
        raise _one_line(RendezvousSettingsError(str(error))) from None
    return RallypointRendezvousHandler(settings)
