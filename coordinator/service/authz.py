"""Client roles and what each may call: the one table from method to permission.

Theory of operation. A credential (a bearer token, see :mod:`.tokens`) stands for a
:class:`Role`: ``admin`` (everything), ``read`` (read-only) or ``job:<id>`` (the workers of
one job). Every method of the public API has exactly one :class:`Rule` in :data:`RULES`:
the :class:`Permission` it needs and, for a job's methods, where its request names the job
(``job``, ``scope.job`` or ``fence.job``), and, for a request made under a client session,
where it names the session. The guard in ``server.py`` looks the rule up for every call
before the servicer sees the request: a method without a rule cannot be registered, so
nothing escapes the table. A request-streaming call (a heartbeat stream) is checked message
by message, since each message names its own job.

Sessions are shared state: a session's cached answers and its participants belong to whoever
opened it, so closing someone else's session would remove their workers, and writing under
it would poison their at-most-once answers. A session therefore records the role that opened
it (``OwnedSessionOpen``), and a caller other than admin may name only sessions its own role
opened. The guard checks that against the applied state (see ``server.py``).

Role  | may
----- | ---
admin | every method
read  | cluster status and members; sessions of its own; reads of keys, leases, watches, jobs,
      | round stores and checkpoints; no write of any kind
job:J | cluster status and members; sessions of its own; join, heartbeat, leave, watch, get
      | and close job J; J's round store and checkpoint registry; drain a failure domain
      | one of its own session's participants of J is in (``domains.py``). Nothing of
      | another job, no key-value or lease call, no configure or evict, no undrain, no
      | membership change

A batch stream carries operations of several methods: opening it needs only READ
(``KV/Batch``) or STATUS (``RoundStore/Batch``, whose operations name their jobs), and
each operation is checked like the unary call it stands for (``OPERATION_GUARD``), so a
refused operation fails alone.

Roles attach to tokens, not to connections: a tokens file reloaded on SIGHUP takes effect at
the next call.
"""

from __future__ import annotations

import contextvars
import enum
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .errors import PermissionDenied

_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


class Permission(enum.Enum):
    """What a method needs; the value says it in the words of a refusal ("may not ...")."""

    STATUS = "read the cluster's status"
    SESSION = "use a client session"
    READ = "read keys, leases or the list of jobs"
    WRITE = "write keys or leases"
    ADMIN = "change the cluster's membership, leadership or snapshots, or prune jobs"
    JOB_READ = "read job {job!r}"
    JOB_WORK = "take part in job {job!r}"
    JOB_ADMIN = "configure job {job!r} or evict its workers"
    # A job's worker role drains only a domain its own session has a participant in; the
    # servicer checks that part (``domains.check_may_drain``): a DrainRequest names no job.
    DRAIN = "drain failure domains"
    UNDRAIN = "undrain failure domains"

    def describe(self, job: str | None) -> str:
        return self.value.format(job=job)


class RoleKind(enum.Enum):
    ADMIN = "admin"
    READ = "read"
    JOB = "job"


_GRANTS: dict[RoleKind, frozenset[Permission]] = {
    RoleKind.ADMIN: frozenset(Permission),
    RoleKind.READ: frozenset(
        {Permission.STATUS, Permission.SESSION, Permission.READ, Permission.JOB_READ}
    ),
    # For its own job only (Role.allows).
    RoleKind.JOB: frozenset(
        {
            Permission.STATUS,
            Permission.SESSION,
            Permission.JOB_READ,
            Permission.JOB_WORK,
            Permission.DRAIN,
        }
    ),
}


@dataclass(frozen=True, slots=True)
class Role:
    """Invariant: ``job`` is a valid job id when kind is JOB, else "" ."""

    kind: RoleKind
    job: str = ""

    @staticmethod
    def parse(text: str) -> Role:
        """``"admin"``, ``"read"`` or ``"job:<id>"``; ValueError naming what is wrong."""
        if text in ("admin", "read"):
            return Role(RoleKind(text))
        prefix, colon, job = text.partition(":")
        if prefix == "job" and colon:
            if not _JOB_ID.fullmatch(job):
                raise ValueError(
                    f"role {text!r}: {job!r} is not a job id (1..128 of A-Z a-z 0-9 . _ -)"
                )
            return Role(RoleKind.JOB, job)
        raise ValueError(f"role {text!r} is not one of admin, read, job:<job id>")

    @property
    def name(self) -> str:
        return f"job:{self.job}" if self.kind is RoleKind.JOB else self.kind.value

    def allows(self, permission: Permission, job: str | None) -> bool:
        """Whether the role holds ``permission`` (for ``job``, for a job's permission)."""
        if permission not in _GRANTS[self.kind]:
            return False
        if self.kind is RoleKind.JOB and permission in (Permission.JOB_READ, Permission.JOB_WORK):
            return job == self.job
        return True

    def check(self, rule: Rule, method: str, request: Any) -> None:
        """Raise PermissionDenied unless the role may make ``request`` under ``rule``."""
        job = rule.job(request) if rule.job is not None else None
        if not self.allows(rule.permission, job):
            raise PermissionDenied(
                f"permission denied: role {self.name!r} may not "
                f"{rule.permission.describe(job)} ({method.lstrip('/')})"
            )


# The role of the call being served, for the servicers that record it (Session.Open). Set by
# the guard around each unary call; None when the cluster requires no credentials.
CALLER: contextvars.ContextVar[Role | None] = contextvars.ContextVar("caller", default=None)

# Checks one operation a batch stream carries under the rule of the unary method it stands
# for (method, request: "/rallypoint.v1.KV/Put", a PutRequest), session owner included; raises
# PermissionDenied. Set by the guard around a stream's handler when the member requires
# credentials; None when it requires none (every operation is let through).
OperationGuard = Callable[[str, Any], Awaitable[None]]
OPERATION_GUARD: contextvars.ContextVar[OperationGuard | None] = contextvars.ContextVar(
    "operation_guard", default=None
)

# Counts one operation of a batch stream as a call of the unary method it stands for (method,
# None for success or the exception it ended with), in the member's per-method counters
# (``rallypoint_store_operations``). Set by the guard around a stream's handler when the
# member keeps metrics.
OperationCounter = Callable[[str, Exception | None], None]
OPERATION_COUNTER: contextvars.ContextVar[OperationCounter | None] = contextvars.ContextVar(
    "operation_counter", default=None
)


@dataclass(frozen=True, slots=True)
class Rule:
    """What one method needs. ``job``: where its request names the job (None for a method
    of no job); ``session``: where it names the client session it is made under."""

    permission: Permission
    job: Callable[[Any], str] | None = None
    session: Callable[[Any], int] | None = None


def _job(request: Any) -> str:
    return str(request.job)


def _scope_job(request: Any) -> str:
    return str(request.scope.job)


def _fence_job(request: Any) -> str:
    return str(request.fence.job)


def _header_session(request: Any) -> int:
    return int(request.header.session_id)


def _session_id(request: Any) -> int:
    return int(request.session_id)


P = Permission
_KV = "/rallypoint.v1.KV/"
_LEASE = "/rallypoint.v1.Lease/"
_SESSION = "/rallypoint.v1.Session/"
_CLUSTER = "/rallypoint.v1.Cluster/"
_RDZV = "/rallypoint.v1.Rendezvous/"
_STORE = "/rallypoint.v1.RoundStore/"
_CKPT = "/rallypoint.v1.CheckpointRegistry/"

# Every method of every public service, by its full gRPC name. The role table of
# docs/security.md is this table (docs/security.md, "Client tokens and roles"); a test checks
# that they agree and that every method has an entry.
RULES: dict[str, Rule] = {
    _KV + "Put": Rule(P.WRITE, session=_header_session),
    _KV + "Get": Rule(P.READ),
    _KV + "Range": Rule(P.READ),
    _KV + "Delete": Rule(P.WRITE, session=_header_session),
    _KV + "CompareAndSet": Rule(P.WRITE, session=_header_session),
    _KV + "Add": Rule(P.WRITE, session=_header_session),
    # Opening a batch stream needs READ; each of its operations is then checked under the
    # rule of the unary method it stands for (OPERATION_GUARD), writes' sessions included.
    _KV + "Batch": Rule(P.READ),
    "/rallypoint.v1.Watch/Watch": Rule(P.READ),
    _LEASE + "Grant": Rule(P.WRITE, session=_header_session),
    _LEASE + "KeepAlive": Rule(P.WRITE),
    _LEASE + "Revoke": Rule(P.WRITE, session=_header_session),
    _LEASE + "List": Rule(P.READ),
    _LEASE + "TimeToLive": Rule(P.READ),
    _SESSION + "Open": Rule(P.SESSION),
    _SESSION + "KeepAlive": Rule(P.SESSION, session=_session_id),
    _SESSION + "Close": Rule(P.SESSION, session=_session_id),
    _CLUSTER + "MemberList": Rule(P.STATUS),
    _CLUSTER + "MemberAdd": Rule(P.ADMIN),
    _CLUSTER + "MemberRemove": Rule(P.ADMIN),
    _CLUSTER + "MemberPromote": Rule(P.ADMIN),
    _CLUSTER + "TransferLeader": Rule(P.ADMIN),
    _CLUSTER + "Snapshot": Rule(P.ADMIN),
    _CLUSTER + "Status": Rule(P.STATUS),
    _RDZV + "Configure": Rule(P.JOB_ADMIN, _job, _header_session),
    _RDZV + "Join": Rule(P.JOB_WORK, _job, _header_session),
    _RDZV + "Leave": Rule(P.JOB_WORK, _job, _header_session),
    _RDZV + "Heartbeat": Rule(P.JOB_WORK, _job),
    _RDZV + "HeartbeatBatch": Rule(P.JOB_WORK, _job),
    _RDZV + "ReportCollectiveFailure": Rule(P.JOB_WORK, _job),
    _RDZV + "JoinBatch": Rule(P.JOB_WORK, _job, _header_session),
    _RDZV + "ListMembers": Rule(P.JOB_READ, _job),
    _RDZV + "WatchJob": Rule(P.JOB_READ, _job),
    _RDZV + "GetJob": Rule(P.JOB_READ, _job),
    _RDZV + "ListJobs": Rule(P.READ),
    _RDZV + "Evict": Rule(P.JOB_ADMIN, _job, _header_session),
    # torchrun's RendezvousHandler.set_closed closes its own job.
    _RDZV + "CloseJob": Rule(P.JOB_WORK, _job, _header_session),
    _RDZV + "PruneJobs": Rule(P.ADMIN, session=_header_session),
    # A job's worker: only a domain its own session has a participant in (domains.py).
    _RDZV + "Drain": Rule(P.DRAIN, session=_header_session),
    _RDZV + "Undrain": Rule(P.UNDRAIN, session=_header_session),
    _RDZV + "ListDrained": Rule(P.STATUS),
    _STORE + "Set": Rule(P.JOB_WORK, _scope_job, _header_session),
    _STORE + "Get": Rule(P.JOB_READ, _scope_job),
    _STORE + "Add": Rule(P.JOB_WORK, _scope_job, _header_session),
    _STORE + "CompareSet": Rule(P.JOB_WORK, _scope_job, _header_session),
    _STORE + "Wait": Rule(P.JOB_READ, _scope_job),
    _STORE + "Delete": Rule(P.JOB_WORK, _scope_job, _header_session),
    _STORE + "NumKeys": Rule(P.JOB_READ, _scope_job),
    _STORE + "Check": Rule(P.JOB_READ, _scope_job),
    _STORE + "MultiGet": Rule(P.JOB_READ, _scope_job),
    # Its operations name their jobs: opening it needs STATUS (every role has it), and each
    # operation is checked under its unary method's rule (OPERATION_GUARD).
    _STORE + "Batch": Rule(P.STATUS),
    _CKPT + "Begin": Rule(P.JOB_WORK, _fence_job, _header_session),
    _CKPT + "ShardDone": Rule(P.JOB_WORK, _fence_job, _header_session),
    _CKPT + "Commit": Rule(P.JOB_WORK, _fence_job, _header_session),
    _CKPT + "Abort": Rule(P.JOB_WORK, _fence_job, _header_session),
    _CKPT + "Latest": Rule(P.JOB_READ, _job),
    _CKPT + "CommitMemorySnapshot": Rule(P.JOB_WORK, _fence_job, _header_session),
    _CKPT + "LatestMemorySnapshot": Rule(P.JOB_READ, _job),
    # The whole state (every job's keys and records): admin only.
    "/rallypoint.v1.Maintenance/SnapshotSave": Rule(P.ADMIN),
}


def rule_for(method: str) -> Rule:
    """The rule of a method ("/rallypoint.v1.KV/Put"); a method without one is a bug."""
    rule = RULES.get(method)
    if rule is None:
        raise AssertionError(f"no authorization rule for {method}: add it to authz.RULES")
    return rule
