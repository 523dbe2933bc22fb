"""Roles and the one authorization table: every method has a rule that finds its job and
session; tokens files; and the guard over a real gRPC server and the fake member (per-job
refusals, read-only, sessions that belong to their role, heartbeat streams per message)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from rallypoint.coordinator.service import add_services, authz
from rallypoint.coordinator.service.authz import RULES, Permission, Role, RoleKind
from rallypoint.coordinator.service.tokens import ClientTokens, TokensFileError, digest
from rallypoint.proto.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    maintenance_pb2,
    rendezvous_pb2,
    rendezvous_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)
from tests.integration.harness import write_tokens_file

from .fake_node import FakeNode, Headers, fails, job_config, rpc_failure, serving, until

Code = grpc.StatusCode
MODULES: tuple[ModuleType, ...] = (
    kv_pb2,
    watch_pb2,
    lease_pb2,
    session_pb2,
    cluster_pb2,
    rendezvous_pb2,
    maintenance_pb2,
)
SECURITY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "security.md"
# token -> role
TOKENS = {"adm1n-token": "admin", "r3ad-token": "read", "job-a-token": "job:A", "job-b": "job:B"}


def public_methods() -> Iterator[tuple[str, Any]]:
    """(full method name, request class) of every method of every public service."""
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                yield f"/{service.full_name}/{method.name}", getattr(module, method.input_type.name)


def job_fields(request: Any) -> list[str]:
    """The fields through which a request names a job: its own ``job``, or a message field
    (``scope``, ``fence``) that has one."""
    named = []
    for name, field in request.DESCRIPTOR.fields_by_name.items():
        inner = field.message_type
        if name == "job" or (inner is not None and "job" in inner.fields_by_name):
            named.append(name)
    return named


# ------------------------------------------------------------------------ the table


def test_every_method_of_every_public_service_has_exactly_one_rule() -> None:
    methods = [name for name, _ in public_methods()]
    assert len(methods) == len(set(methods)) == 58
    assert sorted(RULES) == sorted(methods)


async def test_a_method_without_a_rule_cannot_be_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(RULES, "/rallypoint.v1.RoundStore/Set")
    missing = re.escape("no authorization rule for /rallypoint.v1.RoundStore/Set")
    with pytest.raises(AssertionError, match=missing):
        add_services(grpc.aio.server(), FakeNode())


@pytest.mark.parametrize(("method", "request_class"), list(public_methods()))
def test_each_rule_finds_the_job_and_the_session_where_its_request_names_them(
    method: str, request_class: Any
) -> None:
    rule = RULES[method]
    request = request_class()
    named = job_fields(request)
    for name in named:
        target = request if name == "job" else getattr(request, name)
        target.job = "the-job"
    # A job's method is checked against the job its request names, and only those.
    assert (rule.job is not None) == bool(named) == rule.permission.name.startswith("JOB_")
    if rule.job is not None:
        assert rule.job(request) == "the-job"
    fields = request.DESCRIPTOR.fields_by_name
    if "header" in fields:
        request.header.session_id = 41
    elif method in ("/rallypoint.v1.Session/KeepAlive", "/rallypoint.v1.Session/Close"):
        request.session_id = 41
    else:
        assert rule.session is None
        return
    # Everything made under a session is checked against the session's owner.
    assert rule.session is not None and rule.session(request) == 41


def test_roles_parse_and_refuse_what_is_not_a_role() -> None:
    assert Role.parse("admin") == Role(RoleKind.ADMIN)
    assert Role.parse("job:resnet-50.v2") == Role(RoleKind.JOB, "resnet-50.v2")
    assert Role.parse("job:x").name == "job:x"
    for bad, complaint in [
        ("root", "not one of admin, read, job:<job id>"),
        ("job:", "is not a job id"),
        ("job:a b", "is not a job id"),
        ("Admin", "not one of"),
    ]:
        with pytest.raises(ValueError, match=re.escape(complaint)):
            Role.parse(bad)


def test_what_each_role_may_do() -> None:
    admin, read, job = Role.parse("admin"), Role.parse("read"), Role.parse("job:A")
    assert all(admin.allows(p, "any") for p in Permission)
    assert {p for p in Permission if read.allows(p, "A")} == {
        Permission.STATUS,
        Permission.SESSION,
        Permission.READ,
        Permission.JOB_READ,
    }
    # DRAIN: only a domain of its own session's participants (the servicer checks that).
    assert {p for p in Permission if job.allows(p, "A")} == {
        Permission.STATUS,
        Permission.SESSION,
        Permission.JOB_READ,
        Permission.JOB_WORK,
        Permission.DRAIN,
    }
    # DRAIN names no job: a domain of its own participants, whatever the job (servicer).
    assert {p for p in Permission if job.allows(p, "B")} == {
        Permission.STATUS,
        Permission.SESSION,
        Permission.DRAIN,
    }


def documented_role_table() -> dict[str, tuple[str, str, str]]:
    """method -> (admin, read, job) cells of docs/security.md's table, e.g. "KV/Put"."""
    text = SECURITY_PAGE.read_text()
    start = text.index("| method | admin | read | job:ID |")
    rows: dict[str, tuple[str, str, str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        for method in cells[0].split(", "):
            rows[method] = (cells[1], cells[2], cells[3])
    return rows


def test_the_documented_role_table_is_the_rule_table() -> None:
    def cell(role: Role, rule: authz.Rule) -> str:
        if rule.permission is authz.Permission.DRAIN and role.kind is RoleKind.JOB:
            # The servicer narrows it to the domains of the caller's own participants.
            return "own domain"
        if rule.job is None:
            return "yes" if role.allows(rule.permission, None) else "no"
        if role.kind is RoleKind.JOB:
            return "own job" if role.allows(rule.permission, role.job) else "no"
        return "yes" if role.allows(rule.permission, "any") else "no"

    expected = {
        method.removeprefix("/rallypoint.v1."): tuple(
            cell(Role.parse(role), rule) for role in ("admin", "read", "job:x")
        )
        for method, rule in RULES.items()
    }
    assert documented_role_table() == expected


# ------------------------------------------------------------------------ tokens files


def test_a_tokens_file_maps_digests_to_roles(tmp_path: Path) -> None:
    tokens = ClientTokens(
        path=str(write_tokens_file(tmp_path / "t.toml", TOKENS)), admin_token="op"
    )
    grant = tokens.lookup(b"job-a-token")
    assert grant is not None and (grant.name, grant.role.name) == ("job:A", "job:A")
    operator = tokens.lookup(b"op")
    assert operator is not None and (operator.name, operator.role.name) == ("--auth-token", "admin")
    assert tokens.lookup(b"nope") is None
    assert tokens.table.summary() == "5 tokens (admin 2, job 2, read 1)"
    assert ClientTokens(admin_token="x").table.summary() == "1 token (admin 1)"
    (tmp_path / "empty.toml").write_text("")
    assert (
        "every call will be refused"
        in ClientTokens(path=str(tmp_path / "empty.toml")).table.summary()
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[[token]]\nrole = "admin"\nsha256 = "abc"\n', "token 1 (token 1): sha256 must be 64 hex"),
        ('[[token]]\nrole = "boss"\nsha256 = "' + "0" * 64 + '"\n', "role 'boss' is not one of"),
        ('[[token]]\nsha256 = "' + "0" * 64 + '"\n', "role is missing"),
        ('[[token]]\nrole = "read"\nsecret = "x"\n', "unknown key 'secret'"),
        ("tokens = []\n", "unknown key 'tokens'"),
        ("[[token]\n", "not valid TOML"),
        (
            '[[token]]\nname = "a"\nrole = "read"\nsha256 = "' + "0" * 64 + '"\n'
            '[[token]]\nname = "b"\nrole = "admin"\nsha256 = "' + "0" * 64 + '"\n',
            "token 2 (b): same sha256 as token 1 (a)",
        ),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_the_entry(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(TokensFileError, match=re.escape(complaint)) as refused:
        ClientTokens(path=str(path))
    assert str(path) in str(refused.value)
    with pytest.raises(TokensFileError, match="No such file"):
        ClientTokens(path=str(tmp_path / "missing.toml"))


def test_a_reload_replaces_the_table_whole_or_keeps_it(tmp_path: Path) -> None:
    path = write_tokens_file(tmp_path / "t.toml", {"first": "job:A"})
    tokens = ClientTokens(path=str(path))
    write_tokens_file(path, {"second": "job:A", "reader": "read"})
    assert tokens.reload() == "2 tokens (job 1, read 1)"
    assert tokens.lookup(b"first") is None and tokens.lookup(b"second") is not None
    path.write_text("[[token]]\nrole = 3\n")
    with pytest.raises(TokensFileError, match="role is missing or not a string"):
        tokens.reload()
    assert tokens.lookup(b"second") is not None
    assert digest("second") in tokens.table.grants


# ------------------------------------------------------------------------ the guard


class Caller:
    """One role's view of the fake member: stubs and the metadata of its token."""

    def __init__(self, channel: grpc.aio.Channel, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.kv = kv_pb2_grpc.KVStub(channel)
        self.watch = watch_pb2_grpc.WatchStub(channel)
        self.sessions = session_pb2_grpc.SessionStub(channel)
        self.cluster = cluster_pb2_grpc.ClusterStub(channel)
        self.rendezvous = rendezvous_pb2_grpc.RendezvousStub(channel)
        self.store = rendezvous_pb2_grpc.RoundStoreStub(channel)
        self.checkpoints = rendezvous_pb2_grpc.CheckpointRegistryStub(channel)

    async def open_session(self) -> Headers:
        opened = await self.sessions.Open(
            session_pb2.SessionOpenRequest(ttl_ms=600_000), metadata=self.metadata
        )
        return Headers(opened.session_id)

    async def join(self, headers: Headers, job: str, name: str = "w0") -> Any:
        request = rendezvous_pb2.JoinRequest(
            header=headers(), job=job, name=name, config=job_config(1, 1)
        )
        return await self.rendezvous.Join(request, metadata=self.metadata)


class Cluster:
    def __init__(self, node: FakeNode, channel: grpc.aio.Channel) -> None:
        self.node = node
        self.callers = {role: Caller(channel, token) for token, role in TOKENS.items()}

    def __getitem__(self, role: str) -> Caller:
        return self.callers[role]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    node = FakeNode()
    tokens = ClientTokens(path=str(write_tokens_file(tmp_path / "tokens.toml", TOKENS)))
    async with serving(node, tokens=tokens) as channel:
        yield Cluster(node, channel)


def denied(failure: Any, role: str, lacked: str, method: str) -> bool:
    return bool(
        failure.code == Code.PERMISSION_DENIED
        and failure.details
        == f"permission denied: role {role!r} may not {lacked} (rallypoint.v1.{method})"
    )


async def test_a_job_token_works_in_its_job_and_nowhere_else(cluster: Cluster) -> None:
    admin, job_a, job_b = cluster["admin"], cluster["job:A"], cluster["job:B"]
    a_headers, b_headers = await job_a.open_session(), await job_b.open_session()
    joined = await job_a.join(a_headers, "A")
    other = await job_b.join(b_headers, "B")
    scope = rendezvous_pb2.StoreScope(job="A", round=1, participant_id=joined.participant_id)
    await job_a.store.Set(
        rendezvous_pb2.StoreSetRequest(header=a_headers(), scope=scope, key=b"k", value=b"v"),
        metadata=job_a.metadata,
    )
    got = await job_a.store.Get(
        rendezvous_pb2.StoreGetRequest(scope=scope, key=b"k"), metadata=job_a.metadata
    )
    assert got.value == b"v"
    many = await job_a.store.MultiGet(
        rendezvous_pb2.StoreMultiGetRequest(
            scope=scope, groups=[rendezvous_pb2.StoreKeyGroup(keys=[b"k"])]
        ),
        metadata=job_a.metadata,
    )
    assert list(many.groups[0].values) == [b"v"]
    await job_a.rendezvous.GetJob(rendezvous_pb2.GetJobRequest(job="A"), metadata=job_a.metadata)
    b_scope = rendezvous_pb2.StoreScope(job="B", round=1, participant_id=other.participant_id)
    m = job_a.metadata
    refusals = [
        (
            job_a.store.Set(
                rendezvous_pb2.StoreSetRequest(header=a_headers(), scope=b_scope, key=b"k"),
                metadata=m,
            ),
            "take part in job 'B'",
            "RoundStore/Set",
        ),
        (
            job_a.store.Get(rendezvous_pb2.StoreGetRequest(scope=b_scope, key=b"k"), metadata=m),
            "read job 'B'",
            "RoundStore/Get",
        ),
        (
            job_a.store.MultiGet(
                rendezvous_pb2.StoreMultiGetRequest(
                    scope=b_scope, groups=[rendezvous_pb2.StoreKeyGroup(keys=[b"k"])]
                ),
                metadata=m,
            ),
            "read job 'B'",
            "RoundStore/MultiGet",
        ),
        (
            job_a.rendezvous.Evict(
                rendezvous_pb2.EvictRequest(
                    header=a_headers(), job="B", participant_id=other.participant_id
                ),
                metadata=m,
            ),
            "configure job 'B' or evict its workers",
            "Rendezvous/Evict",
        ),
        (
            job_a.rendezvous.Evict(
                rendezvous_pb2.EvictRequest(
                    header=a_headers(), job="A", participant_id=joined.participant_id
                ),
                metadata=m,
            ),
            "configure job 'A' or evict its workers",
            "Rendezvous/Evict",
        ),
        (
            job_a.kv.Put(kv_pb2.PutRequest(header=a_headers(), key=b"k", value=b"v"), metadata=m),
            "write keys or leases",
            "KV/Put",
        ),
        (
            job_a.kv.Get(kv_pb2.GetRequest(key=b"k"), metadata=m),
            "read keys, leases or the list of jobs",
            "KV/Get",
        ),
        (
            job_a.rendezvous.ListJobs(rendezvous_pb2.ListJobsRequest(), metadata=m),
            "read keys, leases or the list of jobs",
            "Rendezvous/ListJobs",
        ),
        (
            job_a.cluster.MemberAdd(
                cluster_pb2.MemberAddRequest(peer_address="h:1", client_address="h:2"), metadata=m
            ),
            "change the cluster's membership, leadership or snapshots, or prune jobs",
            "Cluster/MemberAdd",
        ),
        (
            job_a.checkpoints.Latest(rendezvous_pb2.CheckpointLatestRequest(job="B"), metadata=m),
            "read job 'B'",
            "CheckpointRegistry/Latest",
        ),
    ]
    proposals = len(cluster.node.proposals)
    for call, lacked, method in refusals:
        assert denied(await fails(call), "job:A", lacked, method), method
    assert len(cluster.node.proposals) == proposals  # nothing refused reached the log
    # The cluster's status and members are open to every role; admin may do what A may not.
    await job_a.cluster.Status(cluster_pb2.StatusRequest(), metadata=m)
    await job_a.cluster.MemberList(cluster_pb2.MemberListRequest(), metadata=m)
    admin_headers = await admin.open_session()
    await admin.rendezvous.Evict(
        rendezvous_pb2.EvictRequest(
            header=admin_headers(), job="B", participant_id=other.participant_id
        ),
        metadata=admin.metadata,
    )
    await admin.kv.Put(
        kv_pb2.PutRequest(header=admin_headers(), key=b"k", value=b"v"), metadata=admin.metadata
    )


async def test_a_read_token_reads_everything_and_writes_nothing(cluster: Cluster) -> None:
    read = cluster["read"]
    m = read.metadata
    headers = await read.open_session()  # a client opens a session on connect, even to read
    await read.kv.Get(kv_pb2.GetRequest(key=b"k"), metadata=m)
    await read.kv.Range(kv_pb2.RangeRequest(prefix=b""), metadata=m)
    await read.rendezvous.ListJobs(rendezvous_pb2.ListJobsRequest(), metadata=m)
    await read.cluster.Status(cluster_pb2.StatusRequest(), metadata=m)
    watch = read.watch.Watch(watch_pb2.WatchRequest(key=b"k", progress_interval_ms=10), metadata=m)
    assert isinstance(await watch.read(), watch_pb2.WatchResponse)
    watch.cancel()
    put = await fails(read.kv.Put(kv_pb2.PutRequest(header=headers(), key=b"k"), metadata=m))
    assert denied(put, "read", "write keys or leases", "KV/Put")
    join = await fails(read.join(headers, "A"))
    assert denied(join, "read", "take part in job 'A'", "Rendezvous/Join")


async def test_memory_snapshots_are_a_jobs_own_to_record_and_read(cluster: Cluster) -> None:
    job_a, job_b, read = cluster["job:A"], cluster["job:B"], cluster["read"]
    a_headers, b_headers = await job_a.open_session(), await job_b.open_session()
    joined = await job_a.join(a_headers, "A")
    await job_b.join(b_headers, "B")
    fence = rendezvous_pb2.CheckpointFence(
        job="A", round=joined.round.round, fencing_token=joined.round.fencing_token
    )

    def commit(caller: Caller, headers: Headers, job: str) -> Any:
        request = rendezvous_pb2.MemorySnapshotCommitRequest(
            header=headers(),
            fence=rendezvous_pb2.CheckpointFence(
                job=job, round=fence.round, fencing_token=fence.fencing_token
            ),
            step=4,
            world_size=1,
        )
        return caller.checkpoints.CommitMemorySnapshot(request, metadata=caller.metadata)

    def latest(caller: Caller, job: str) -> Any:
        request = rendezvous_pb2.MemorySnapshotLatestRequest(job=job)
        return caller.checkpoints.LatestMemorySnapshot(request, metadata=caller.metadata)

    committed = await commit(job_a, a_headers, "A")
    assert (await latest(job_a, "A")).snapshot == committed.snapshot
    assert (await latest(read, "A")).snapshot == committed.snapshot
    refusals = [
        (commit(job_a, a_headers, "B"), "job:A", "take part in job 'B'", "CommitMemorySnapshot"),
        (latest(job_a, "B"), "job:A", "read job 'B'", "LatestMemorySnapshot"),
        (commit(read, await read.open_session(), "A"), "read", "take part in job 'A'",
         "CommitMemorySnapshot"),
    ]  # fmt: skip
    proposals = len(cluster.node.proposals)
    for call, role, lacked, method in refusals:
        failure = await fails(call)
        assert denied(failure, role, lacked, f"CheckpointRegistry/{method}"), failure.details
    assert len(cluster.node.proposals) == proposals  # nothing refused reached the log


async def test_no_or_an_unknown_token_is_unauthenticated(cluster: Cluster) -> None:
    kv = cluster["read"].kv
    for metadata in ((), (("authorization", "Bearer nope"),), (("authorization", "r3ad-token"),)):
        refused = await fails(kv.Get(kv_pb2.GetRequest(key=b"k"), metadata=metadata))
        assert refused.code == Code.UNAUTHENTICATED


async def test_a_session_belongs_to_the_role_that_opened_it(cluster: Cluster) -> None:
    admin, job_a, job_b = cluster["admin"], cluster["job:A"], cluster["job:B"]
    a_headers = await job_a.open_session()
    owner = cluster.node.state.session_info(a_headers.session_id)
    assert owner is not None and owner.owner == "job:A"
    session_of_a = session_pb2.SessionCloseRequest(session_id=a_headers.session_id)
    stolen = [
        job_b.sessions.Close(session_of_a, metadata=job_b.metadata),
        job_b.sessions.KeepAlive(
            session_pb2.SessionKeepAliveRequest(session_id=a_headers.session_id),
            metadata=job_b.metadata,
        ),
        job_b.join(a_headers, "B"),  # B's own job, under A's session
    ]
    for call in stolen:
        failure = await fails(call)
        assert failure.code == Code.PERMISSION_DENIED
        assert f"session {a_headers.session_id} was opened by another role" in failure.details
        assert "role 'job:B' may use only its own sessions" in failure.details
    assert cluster.node.state.session_info(a_headers.session_id) is not None
    # A session that no longer exists is the state machine's to refuse, as without tokens.
    ended = (await admin.open_session()).session_id
    await admin.sessions.Close(
        session_pb2.SessionCloseRequest(session_id=ended), metadata=admin.metadata
    )
    gone = await fails(
        job_b.sessions.Close(
            session_pb2.SessionCloseRequest(session_id=ended), metadata=job_b.metadata
        )
    )
    assert (gone.code, gone.reason) == (Code.NOT_FOUND, "SESSION_EXPIRED")
    # Admin may end anyone's session.
    await admin.sessions.Close(session_of_a, metadata=admin.metadata)
    assert cluster.node.state.session_info(a_headers.session_id) is None


async def test_a_session_this_member_has_not_applied_yet_is_waited_for(cluster: Cluster) -> None:
    job_a, job_b = cluster["job:A"], cluster["job:B"]
    next_session = cluster.node.index + 1
    keep_alive = asyncio.ensure_future(
        job_b.sessions.KeepAlive(
            session_pb2.SessionKeepAliveRequest(session_id=next_session),
            metadata=job_b.metadata,
            timeout=5,
        )
    )
    await until(lambda: cluster.node.apply_waits > 0)
    assert (await job_a.open_session()).session_id == next_session
    failure = await fails(keep_alive)
    assert failure.code == Code.PERMISSION_DENIED
    # Never applied within the call's deadline: unavailable here, for now.
    late = await fails(
        job_b.sessions.KeepAlive(
            session_pb2.SessionKeepAliveRequest(session_id=next_session + 5),
            metadata=job_b.metadata,
            timeout=0.3,
        )
    )
    assert late.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)


async def test_a_heartbeat_stream_is_checked_message_by_message(cluster: Cluster) -> None:
    job_a, job_b, read = cluster["job:A"], cluster["job:B"], cluster["read"]
    joined = await job_a.join(await job_a.open_session(), "A")
    other = await job_b.join(await job_b.open_session(), "B")
    call = job_a.rendezvous.Heartbeat(metadata=job_a.metadata)
    await call.write(rendezvous_pb2.HeartbeatRequest(job="A", participant_id=joined.participant_id))
    assert isinstance(await call.read(), rendezvous_pb2.HeartbeatResponse)
    await call.write(rendezvous_pb2.HeartbeatRequest(job="B", participant_id=other.participant_id))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert denied(
        rpc_failure(refused.value), "job:A", "take part in job 'B'", "Rendezvous/Heartbeat"
    )
    assert ("B", other.participant_id) not in cluster.node.heartbeats
    reader = read.rendezvous.Heartbeat(metadata=read.metadata)
    await reader.write(
        rendezvous_pb2.HeartbeatRequest(job="A", participant_id=joined.participant_id)
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await reader.read()
    assert rpc_failure(refused.value).code == Code.PERMISSION_DENIED


async def test_without_tokens_sessions_have_no_owner_and_everything_is_allowed() -> None:
    node = FakeNode()
    async with serving(node) as channel:
        opened = await session_pb2_grpc.SessionStub(channel).Open(
            session_pb2.SessionOpenRequest(ttl_ms=1000)
        )
        info = node.state.session_info(opened.session_id)
        assert info is not None and info.owner == ""
        await cluster_pb2_grpc.ClusterStub(channel).MemberAdd(
            cluster_pb2.MemberAddRequest(peer_address="h:1", client_address="h:2")
        )
