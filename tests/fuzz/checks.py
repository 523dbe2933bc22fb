"""After the fuzzing: is the cluster still whole?

- Every member process still runs.
- A leader exists and a write succeeds (and reads back, linearizably).
- The members agree: each reports the same applied index before and after its state is read
  (so the read saw exactly that index), and at equal applied indexes every member's
  serializable answers are equal: every key (its value, revisions, version and lease), every
  lease, every job's round (less the reason text, which reads the member's clock), the
  member list. The state machine is deterministic, so equal indexes must mean equal state.
- Every member is stopped and started again from its own disk, and starts (nothing garbage
  was persisted), a leader is elected, a write succeeds, the key written before the restart
  is still there, and the members agree again.
- No member logged a traceback or a fatal error.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import grpc

from rallypoint.proto.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    rendezvous_pb2,
    rendezvous_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from tests.integration.harness import ProcessCluster, wait_until

# Keys per page when reading every key (values included: a value may be 1 MiB).
PAGE_KEYS = 32


class CheckFailed(Exception):
    """A check after the fuzzing failed; the message says which and how."""


def _retrying(call: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``call()`` retried on UNAVAILABLE (an election) until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            code = error.code()
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise CheckFailed(f"{what}: {code.name} {error.details()}") from None
            if time.monotonic() > deadline:
                raise CheckFailed(f"{what}: still {code.name} after {timeout_s:.0f} s") from None
            time.sleep(0.2)


def alive(cluster: ProcessCluster) -> list[str]:
    problems = []
    for member_id, member in cluster.members.items():
        if not member.running:
            code = member.proc.returncode if member.proc is not None else None
            tail = cluster.log_text(member_id)[-1500:]
            problems.append(f"member {member_id} is not running (exit {code}); log tail:\n{tail}")
    return problems


def write_and_read(cluster: ProcessCluster, key: bytes, value: bytes) -> None:
    """A write through any member, read back linearizably."""
    metadata = cluster.metadata
    leader = cluster.leader(timeout_s=30)
    with grpc.insecure_channel(cluster.members[leader].client_address) as channel:
        sessions = session_pb2_grpc.SessionStub(channel)
        kv = kv_pb2_grpc.KVStub(channel)
        opened = _retrying(
            lambda: sessions.Open(
                session_pb2.SessionOpenRequest(ttl_ms=60_000), timeout=5, metadata=metadata
            ),
            30,
            "opening a session",
        )
        header = common_pb2.RequestHeader(session_id=opened.session_id, sequence=1)
        _retrying(
            lambda: kv.Put(
                kv_pb2.PutRequest(header=header, key=key, value=value), timeout=5, metadata=metadata
            ),
            30,
            f"writing {key!r}",
        )
        got = _retrying(
            lambda: kv.Get(kv_pb2.GetRequest(key=key), timeout=5, metadata=metadata),
            30,
            f"reading {key!r}",
        )
        if got.kv.value != value:
            raise CheckFailed(f"{key!r} reads back {got.kv.value!r}, not {value!r}")


def _state(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> tuple[Any, ...]:
    """Everything this member's applied state answers to serializable reads, comparable."""
    kv = kv_pb2_grpc.KVStub(channel)
    keys: list[tuple[bytes, bytes, int, int, int, int]] = []
    start_after = b""
    while True:
        page = kv.Range(
            kv_pb2.RangeRequest(limit=PAGE_KEYS, start_after=start_after, serializable=True),
            timeout=10,
            metadata=metadata,
        )
        keys += [
            (
                x.key,
                hashlib.sha256(x.value).digest(),
                x.create_revision,
                x.mod_revision,
                x.version,
                x.lease_id,
            )
            for x in page.kvs
        ]
        if not page.more:
            break
        start_after = page.kvs[-1].key
    leases = lease_pb2_grpc.LeaseStub(channel).List(
        lease_pb2.LeaseListRequest(serializable=True), timeout=10, metadata=metadata
    )
    jobs = rendezvous_pb2_grpc.RendezvousStub(channel).ListJobs(
        rendezvous_pb2.ListJobsRequest(serializable=True), timeout=10, metadata=metadata
    )
    for job in jobs.jobs:
        job.reason = ""  # computed from the member's clock: a description, not state
    members = cluster_pb2_grpc.ClusterStub(channel).MemberList(
        cluster_pb2.MemberListRequest(serializable=True), timeout=10, metadata=metadata
    )
    return (
        tuple(keys),
        tuple(x.SerializeToString(deterministic=True) for x in leases.leases),
        tuple(x.SerializeToString(deterministic=True) for x in jobs.jobs),
        tuple(x.SerializeToString(deterministic=True) for x in members.members),
    )


def _applied(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> int:
    status = cluster_pb2_grpc.ClusterStub(channel).Status(
        cluster_pb2.StatusRequest(), timeout=5, metadata=metadata
    )
    return int(status.applied_index)


def agreement(cluster: ProcessCluster, timeout_s: float = 30.0) -> tuple[int, int]:
    """Wait until every member's state can be read at one applied index, and compare.
    Returns (that index, the number of keys)."""
    metadata = cluster.metadata
    deadline = time.monotonic() + timeout_s
    last = "no read yet"
    while time.monotonic() < deadline:
        readings: dict[int, tuple[int, tuple[Any, ...]]] = {}
        try:
            for member_id, member in sorted(cluster.members.items()):
                with grpc.insecure_channel(member.client_address) as channel:
                    before = _applied(channel, metadata)
                    state = _state(channel, metadata)
                    after = _applied(channel, metadata)
                if before != after:
                    break
                readings[member_id] = (before, state)
        except grpc.RpcError as error:
            last = f"a read failed: {error.code().name}"
            time.sleep(0.2)
            continue
        indexes = {index for index, _ in readings.values()}
        if len(readings) == len(cluster.members) and len(indexes) == 1:
            (index,) = indexes
            states = {member_id: state for member_id, (_, state) in readings.items()}
            first_id, first = next(iter(states.items()))
            for member_id, state in states.items():
                if state != first:
                    raise CheckFailed(
                        f"members {first_id} and {member_id} differ at applied index {index}: "
                        + _difference(first, state)
                    )
            return index, len(first[0])
        last = f"applied indexes {sorted(indexes)}"
        time.sleep(0.2)
    raise CheckFailed(f"the members never reached one applied index ({last})")


def _difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    names = ("keys", "leases", "jobs", "members")
    for name, left, right in zip(names, a, b, strict=True):
        if left != right:
            only_left = [x for x in left if x not in right][:3]
            only_right = [x for x in right if x not in left][:3]
            return (
                f"{name}: {len(left)} vs {len(right)}; only in the first {only_left!r}"[:400]
                + f"; only in the second {only_right!r}"[:400]
            )
    return "?"


def restart_all(cluster: ProcessCluster) -> list[str]:
    """Stop every member (SIGTERM), start each again on its own data directory."""
    problems = []
    for member_id in cluster.members:
        code = cluster.stop(member_id)
        if code != 0:
            problems.append(f"member {member_id} exited {code} on SIGTERM")
    for member_id in cluster.members:
        cluster.start(member_id)
    for member_id in cluster.members:

        def started(m: int = member_id) -> object:
            return cluster.status(m)

        try:
            wait_until(started, 60, f"member {member_id} to start")
        except TimeoutError:
            running = cluster.members[member_id].running
            tail = cluster.log_text(member_id)[-1500:]
            problems.append(
                f"member {member_id} did not start from its own disk "
                f"({'running' if running else 'exited'}); log tail:\n{tail}"
            )
    return problems


def logged_errors(cluster: ProcessCluster) -> list[str]:
    """Each distinct traceback's last line, and every fatal line, in the members' logs."""
    found: dict[str, None] = {}
    for member_id in cluster.members:
        lines = cluster.log_text(member_id).splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Traceback (most recent call last)"):
                end = next(
                    (lines[j] for j in range(i + 1, len(lines)) if not lines[j].startswith(" ")),
                    "(end of log)",
                )
                found[f"member {member_id} logged a traceback: {end[:300]}"] = None
            elif " CRITICAL " in line or "fatal error" in line:
                found[f"member {member_id} logged: {line[:300]}"] = None
    return list(found)
