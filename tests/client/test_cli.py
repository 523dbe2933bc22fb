"""The operator commands, run through their main function against the fake cluster."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from rallypoint.coordinator.cli.main import main

from .fake_server import FakeCluster


async def run(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster, *argv: str
) -> tuple[int, str, str]:
    endpoints = ",".join(cluster.addresses)
    code = await asyncio.to_thread(main, [*argv, "--endpoints", endpoints, "--timeout", "3"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def run_json(capsys: pytest.CaptureFixture[str], cluster: FakeCluster, *argv: str) -> Any:
    code, out, err = await run(capsys, cluster, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_kv_put_get_del(capsys: pytest.CaptureFixture[str], cluster: FakeCluster) -> None:
    put = await run_json(capsys, cluster, "kv", "put", "job/a", "1")
    assert put["kv"]["value"] == "1"
    await run_json(capsys, cluster, "kv", "put", "job/b", "2")
    got = await run_json(capsys, cluster, "kv", "get", "job/a")
    assert [kv["key"] for kv in got["kvs"]] == ["job/a"]
    assert got["kvs"][0]["mod_revision"] == put["revision"]
    listed = await run_json(capsys, cluster, "kv", "get", "job/", "--prefix")
    assert [kv["value"] for kv in listed["kvs"]] == ["1", "2"]
    deleted = await run_json(capsys, cluster, "kv", "del", "job/", "--prefix")
    assert deleted["deleted"] == 2
    code, out, err = await run(capsys, cluster, "kv", "get", "job/a")
    assert code == 1
    assert out == ""
    assert err.strip() == "error: key 'job/a' not found"


async def test_human_output_is_a_table(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    await run(capsys, cluster, "kv", "put", "k", "hello")
    code, out, _ = await run(capsys, cluster, "kv", "get", "k")
    assert code == 0
    assert "hello" in out and "mod rev" in out


async def test_kv_watch_prints_events(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    first = await run_json(capsys, cluster, "kv", "put", "w", "1")
    await run_json(capsys, cluster, "kv", "put", "w", "2")
    code, out, err = await run(
        capsys,
        cluster,
        "kv",
        "watch",
        "w",
        "--rev",
        str(first["revision"]),
        "--count",
        "2",
        "--json",
    )
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e["kv"]["value"]) for e in events] == [("put", "1"), ("put", "2")]


async def test_lease_commands(capsys: pytest.CaptureFixture[str], cluster: FakeCluster) -> None:
    granted = await run_json(capsys, cluster, "lease", "grant", "30")
    lease_id = granted["lease_id"]
    assert granted["fencing_token"] == lease_id
    await run_json(capsys, cluster, "kv", "put", "held", "x", "--lease", str(lease_id))
    listed = await run_json(capsys, cluster, "lease", "list")
    assert [x["lease_id"] for x in listed["leases"]] == [lease_id]
    kept = await run_json(capsys, cluster, "lease", "keep-alive", str(lease_id), "--once")
    assert kept == {"lease_id": lease_id, "ttl_s": 30.0}
    revoked = await run_json(capsys, cluster, "lease", "revoke", str(lease_id))
    assert revoked["deleted_keys"] == ["held"]
    code, _, err = await run(capsys, cluster, "lease", "keep-alive", str(lease_id), "--once")
    assert code == 1
    assert "does not exist" in err
    assert "Traceback" not in err


async def test_member_commands(capsys: pytest.CaptureFixture[str], cluster: FakeCluster) -> None:
    listed = await run_json(capsys, cluster, "member", "list")
    assert [m["id"] for m in listed["members"]] == [1, 2, 3]
    added = await run_json(
        capsys, cluster, "member", "add", "127.0.0.1:7004", "127.0.0.1:2385", "--learner"
    )
    assert added["added"]["is_learner"] is True
    new_id = added["added"]["id"]
    promoted = await run_json(capsys, cluster, "member", "promote", str(new_id))
    assert not next(m for m in promoted["members"] if m["id"] == new_id)["is_learner"]
    removed = await run_json(capsys, cluster, "member", "remove", str(new_id))
    assert new_id not in [m["id"] for m in removed["members"]]
    code, _, err = await run(capsys, cluster, "member", "remove", "99")
    assert code == 1
    assert err.startswith("error: MemberNotFoundError: no member 99 [MEMBER_NOT_FOUND]")


async def test_status_and_transfer_leader(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    status = await run_json(capsys, cluster, "status")
    rows = status["members"]
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert [r["is_leader"] for r in rows] == [True, False, False]
    assert {r["health"] for r in rows} == {"ok"}
    moved = await run_json(capsys, cluster, "transfer-leader")
    assert moved["previous_leader_id"] == 1
    assert moved["leader_id"] in (2, 3)
    assert cluster.store.leader_id == moved["leader_id"]
    explicit = await run_json(capsys, cluster, "transfer-leader", "1")
    assert explicit["leader_id"] == 1
    # Without a member id the leader chooses (target_id 0), knowing every log's progress.
    assert cluster.store.transfer_targets == [0, 1]


async def test_status_reports_an_unreachable_endpoint(
    capsys: pytest.CaptureFixture[str], cluster: FakeCluster
) -> None:
    endpoints = ",".join([*cluster.addresses, "127.0.0.1:1"])
    code = await asyncio.to_thread(main, ["status", "--json", "--endpoints", endpoints])
    captured = capsys.readouterr()
    assert code == 1
    rows = json.loads(captured.out)["members"]
    assert rows[-1]["client_address"] == "127.0.0.1:1"
    assert rows[-1]["health"] == "unreachable"
    assert captured.err.startswith("error: 1 of 4 endpoints unhealthy: 127.0.0.1:1")


async def test_snapshot_compact(capsys: pytest.CaptureFixture[str], cluster: FakeCluster) -> None:
    one = await run_json(capsys, cluster, "snapshot", "compact")
    assert len(one["snapshots"]) == 1
    every = await run_json(capsys, cluster, "snapshot", "compact", "--all")
    assert [s["member_id"] for s in every["snapshots"]] == [1, 2, 3]


async def test_nothing_reachable_is_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = await asyncio.to_thread(
        main, ["kv", "get", "k", "--endpoints", "127.0.0.1:1", "--timeout", "0.3"]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0] == (
        "error: UnavailableError: no member answered at 127.0.0.1:1 (connection refused): is a "
        "member running there, and is that its client port? (retried for 0.3 s)"
    )


def test_endpoints_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from rallypoint.coordinator.cli.client import build_parser

    monkeypatch.setenv("RALLYPOINT_ENDPOINTS", "10.0.0.1:2379")
    assert build_parser().parse_args(["status"]).endpoints == "10.0.0.1:2379"
    monkeypatch.delenv("RALLYPOINT_ENDPOINTS")
    default = build_parser().parse_args(["status"]).endpoints
    assert default == "127.0.0.1:2379,127.0.0.1:2381,127.0.0.1:2383"
