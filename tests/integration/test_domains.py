"""Failure domains and drains over real member processes: three daemons with a tokens file
and /metrics, the client library with tokens of each role, and the ``rallypoint`` CLI.

Claims: a participant's domain (``join(..., domain=)``, ``join_batch(..., domains=)``) shows
in ListMembers and in ``rallypoint rounds`` with the job's unit size and spares; ``rallypoint
drain`` as admin ends the ACTIVE round with a member in the domain (end reason ``drained``,
the detail naming the domain and the reason), the next round forms without the domain's
participant, which waits and is no spare, ``rallypoint drained`` lists the domain, and the
members export the drained count and the job's spares; ``rallypoint undrain`` admits it
again (scale-up); a job's token may drain only a domain one of its own session's
participants is in and may not undrain, a read-only token may only list; and every bad input
(an empty or oversized domain, a domains list of the wrong length, a unit that does not
divide min or max) is refused with one line naming what to fix, by the client before
sending and by a member when sent anyway.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rallypoint.client import (
    EndReason,
    InvalidArgumentError,
    InvalidValueError,
    JobConfig,
    PermissionDeniedError,
    RoundState,
    SyncClient,
    SyncParticipant,
)
from rallypoint.coordinator.cli.main import main as rallypoint_main
from rallypoint.proto.v1 import common_pb2, rendezvous_pb2, rendezvous_pb2_grpc

from .harness import ProcessCluster, running_cluster_with_tokens, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ADMIN, READ, JOB_A = "admin-secret", "read-secret", "job-a-secret"
# Two workers fill a round at once; scale_up admits an undrained waiter without a failure.
PAIR = JobConfig(
    min_nodes=1, max_nodes=2, heartbeat_interval_ms=100, acceptable_pause_ms=500, scale_up=True
)
SOLO = JobConfig(min_nodes=1, max_nodes=1, heartbeat_interval_ms=100, acceptable_pause_ms=500)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    roles = {ADMIN: "admin", READ: "read", JOB_A: "job:A"}
    with running_cluster_with_tokens(
        tmp_path_factory.mktemp("domains"), roles, metrics=True
    ) as running:
        yield running


@pytest.fixture
def connect(cluster: ProcessCluster) -> Iterator[Any]:
    clients: list[SyncClient] = []

    def make(token: str) -> SyncClient:
        client = SyncClient(cluster.endpoints, token=token, timeout_s=20)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def cli(
    capsys: pytest.CaptureFixture[str], cluster: ProcessCluster, *argv: str, token: str = ADMIN
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = rallypoint_main([*argv, "--endpoints", ",".join(cluster.endpoints), "--token", token])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], cluster: ProcessCluster, *argv: str) -> Any:
    code, out, err = cli(capsys, cluster, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line(error: BaseException) -> str:
    text = str(error)
    assert text and "\n" not in text, text
    return text


def active_round(client: SyncClient, job: str, names: set[str], what: str) -> int:
    """Wait until the job's round is ACTIVE with exactly ``names``; its number."""

    def formed() -> int | None:
        info = client.get_job(job).round
        done = info.state is RoundState.ACTIVE and {m.name for m in info.members} == names
        return info.round if done else None

    return wait_until(formed, 30, what)


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def on_every_member(cluster: ProcessCluster, expected: dict[tuple[str, str], float]) -> None:
    """Wait until every member exports ``expected``: (series, job label or "") -> value."""

    def matches() -> bool:
        for member in cluster.members.values():
            samples = scrape(member.metrics_address)
            for (name, job), wanted in expected.items():
                labels = (("job", job),) if job else ()
                if samples.get((name, labels)) != wanted:
                    return False
        return True

    wait_until(matches, 30, f"every member to export {expected}", interval_s=0.2)


def test_a_domain_shows_in_list_members_and_in_rallypoint_rounds(
    connect: Any, cluster: ProcessCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = connect(ADMIN)
    first = admin.join("shown", "a0", config=PAIR, domain="rack1-host-a")
    second = admin.join("shown", "b0", config=PAIR, domain="rack1-host-b")
    # a0 alone may form a round first (min 1); b0 then joins it by scale-up.
    active_round(admin, "shown", {"a0", "b0"}, "both workers in a round")
    # A batch join's domains, read back at once (nothing heartbeats these: a round of five
    # never forms, and they are removed as failed a few seconds later).
    five = JobConfig(min_nodes=5, max_nodes=5)
    batch = admin.join_batch("batched", ["x0", "x1"], domains=["rack2-h1", "rack2-h2"], config=five)
    assert len(batch.participant_ids) == 2
    assert {m.name: m.domain for m in admin.list_members("batched").members} == {
        "x0": "rack2-h1",
        "x1": "rack2-h2",
    }
    page = admin.list_members("shown")
    assert {m.name: m.domain for m in page.members} == {
        "a0": "rack1-host-a",
        "b0": "rack1-host-b",
    }
    document = cli_json(capsys, cluster, "rounds", "shown")
    assert {m["name"]: m["domain"] for m in document["round"]["members"]} == {
        "a0": "rack1-host-a",
        "b0": "rack1-host-b",
    }
    assert document["shape"] == {
        "unit_size": 1,
        "domain_size": 0,
        "units_within_domains": False,
    }
    assert document["round"]["spares"] == 0
    code, out, err = cli(capsys, cluster, "rounds", "shown")
    assert code == 0, err
    assert "domain" in out and "rack1-host-a" in out and "rack1-host-b" in out
    assert "unit size 1; 0 spares waiting" in out
    first.close()
    second.close()


def test_an_admin_drain_ends_the_round_and_the_domains_participant_waits_until_undrained(
    connect: Any, cluster: ProcessCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = connect(ADMIN)
    stays: SyncParticipant = admin.join("drainable", "c0", config=PAIR, domain="host-c")
    goes: SyncParticipant = admin.join("drainable", "d0", config=PAIR, domain="host-d")
    before = active_round(admin, "drainable", {"c0", "d0"}, "both workers in a round")

    code, out, err = cli(capsys, cluster, "drain", "host-d", "--reason", "ECC errors on GPU 3")
    assert code == 0, err
    assert out == f"drained domain host-d; ended drainable round {before}\n"
    after = active_round(admin, "drainable", {"c0"}, "the round re-formed without host-d")
    status = admin.get_job("drainable")
    assert [m.name for m in status.round.waiting] == ["d0"]
    assert status.round.spares == 0  # d0 waits, but in a drained domain
    ended = next(r for r in status.history if r.round == before)
    assert ended.end_reason is EndReason.DRAINED
    assert "host-d" in ended.detail and "ECC errors on GPU 3" in ended.detail
    # Nobody died: both workers are still in the job.
    assert goes.lost_reason is None and stays.lost_reason is None
    listed = cli_json(capsys, cluster, "drained")["drained"]
    assert [(d["domain"], d["reason"]) for d in listed] == [("host-d", "ECC errors on GPU 3")]
    assert cli_json(capsys, cluster, "rounds", "drainable")["history"][-1]["end_reason"] == (
        "drained"
    )
    on_every_member(
        cluster,
        {
            ("rallypoint_drained_domains", ""): 1.0,
            ("rallypoint_spares", "drainable"): 0.0,
        },
    )
    code, out, err = cli(capsys, cluster, "drain", "host-d")
    assert (code, out) == (0, "domain host-d was already drained\n"), err

    code, out, err = cli(capsys, cluster, "undrain", "host-d")
    assert code == 0, err
    assert out.startswith("undrained domain host-d")
    back = active_round(admin, "drainable", {"c0", "d0"}, "d0 admitted again after undrain")
    assert back > after
    assert admin.drained() == []
    on_every_member(cluster, {("rallypoint_drained_domains", ""): 0.0})
    stays.close()
    goes.close()


def test_a_job_token_drains_only_its_own_sessions_domain_and_read_only_is_refused(
    connect: Any,
) -> None:
    admin, worker, other_session, read = (
        connect(ADMIN),
        connect(JOB_A),
        connect(JOB_A),
        connect(READ),
    )
    participant = worker.join("A", "w0", config=SOLO, domain="host-w")
    active_round(admin, "A", {"w0"}, "A's worker in a round")
    with pytest.raises(PermissionDeniedError) as refused:
        worker.drain("host-x")
    assert one_line(refused.value).startswith(
        "permission denied: role 'job:A' may drain only a domain in which a participant of "
        "its own session is"
    )
    # The same role but another session, without a participant in host-w.
    with pytest.raises(PermissionDeniedError):
        other_session.drain("host-w")
    with pytest.raises(PermissionDeniedError) as refused:
        read.drain("host-w")
    assert "role 'read' may not drain failure domains" in one_line(refused.value)
    assert admin.drained() == []

    result = worker.drain("host-w", reason="health check: slow all-reduce")
    assert result.changed and [job for job, _ in result.ended] == ["A"]
    with pytest.raises(PermissionDeniedError) as refused:
        worker.undrain("host-w")
    assert "role 'job:A' may not undrain failure domains" in one_line(refused.value)
    assert [d.domain for d in read.drained()] == ["host-w"]
    assert admin.undrain("host-w") is True
    assert admin.undrain("host-w") is False
    participant.close()


def raw_call(cluster: ProcessCluster, method: str, request: Any) -> grpc.RpcError:
    """Send ``request`` as it is (no client-side checks) as admin; the error it ends with."""
    header = common_pb2.RequestHeader(session_id=1, sequence=1)
    if hasattr(request, "header"):
        request.header.CopyFrom(header)
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = rendezvous_pb2_grpc.RendezvousStub(channel)  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as failed:
            getattr(stub, method)(
                request, metadata=(("authorization", f"Bearer {ADMIN}"),), timeout=10
            )
    error: grpc.RpcError = failed.value
    return error


def test_bad_domains_and_shapes_are_refused_with_one_line(
    connect: Any, cluster: ProcessCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = connect(ADMIN)
    # The member refuses what the client does not check.
    with pytest.raises(InvalidArgumentError) as refused:
        admin.join("bad", "n0", config=SOLO, domain="h" * 257)
    assert "domain: must be at most 256 characters, got 257" in one_line(refused.value)
    code, out, err = cli(capsys, cluster, "drain", "h" * 300)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "must be at most 256 characters, got 300" in err

    # The client refuses before sending...
    with pytest.raises(InvalidValueError) as refused:
        JobConfig(min_nodes=6, max_nodes=8, unit_size=4)
    assert one_line(refused.value).startswith("unit_size 4 does not divide min_nodes 6")
    with pytest.raises(InvalidValueError) as refused:
        JobConfig(min_nodes=4, max_nodes=8, unit_size=4, domain_size=6, units_within_domains=True)
    assert one_line(refused.value).startswith("a domain of 6 holds 1 unit of 4 and strands 2 ranks")
    with pytest.raises(InvalidValueError) as refused:
        admin.join_batch("bad", ["n1", "n2"], domains=["h1"], config=SOLO)
    assert one_line(refused.value) == "domains must hold one entry per name: 1 for 2 names"
    code, out, err = cli(capsys, cluster, "drain", "")
    assert code == 1 and err.count("\n") == 1 and "domain must be a non-empty string" in err

    # ... and a member refuses the same when it is sent anyway.
    cases = {
        "Drain": (
            rendezvous_pb2.DrainRequest(domain=""),
            "domain: must name a failure domain",
        ),
        "JoinBatch": (
            rendezvous_pb2.JoinBatchRequest(job="bad", names=["n1", "n2"], domains=["h1"]),
            "domains: must be empty or one per name: 1 for 2 names",
        ),
        "Configure": (
            rendezvous_pb2.ConfigureRequest(
                job="bad",
                config=_with(
                    JobConfig(min_nodes=8, max_nodes=8, unit_size=4).to_proto(), min_nodes=6
                ),
            ),
            "config.unit_size: unit_size 4 does not divide min_nodes 6",
        ),
        "Join": (
            rendezvous_pb2.JoinRequest(
                job="bad",
                name="n3",
                config=_with(
                    JobConfig(min_nodes=4, max_nodes=8, unit_size=4, domain_size=8).to_proto(),
                    domain_size=6,
                    units_within_domains=True,
                ),
            ),
            "config.domain_size: a domain of 6 holds 1 unit of 4 and strands 2 ranks",
        ),
    }
    for method, (request, said) in cases.items():
        error = raw_call(cluster, method, request)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, error)
        details = error.details() or ""
        assert said in details and "\n" not in details, (method, details)


def _with(config: rendezvous_pb2.JobConfig, **changes: Any) -> rendezvous_pb2.JobConfig:
    for name, value in changes.items():
        setattr(config, name, value)
    return config
