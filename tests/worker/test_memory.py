"""In-memory snapshots: placement across hosts, the restore choice, the snapshot server's
refusals, and real worlds of 4 processes on 2 simulated hosts that lose a rank or a whole host
and restore bit for bit from the survivors' memory (tests/worker/memory_ranks.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rallypoint.worker import (
    PeerState,
    RegisteredSnapshot,
    RestorePolicy,
    RestoreSource,
    SnapshotError,
    SnapshotId,
    SnapshotServer,
    choose_restore_source,
    protectors,
)
from rallypoint.worker.memory import MemoryHolding, _request
from tests.worker.test_checkpoint import wait_ranks

RANKS_SCRIPT = Path(__file__).with_name("memory_ranks.py")
WORLD_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_scenario(scenario: str, dying: tuple[int, ...], workdir: Path) -> list[dict[str, Any]]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "MASTER_PORT": str(free_port()),
        "SECOND_PORT": str(free_port()),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANKS_SCRIPT), scenario, str(rank), str(workdir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(4)
    ]
    wait_ranks(ranks, [-signal.SIGKILL if r in dying else 0 for r in range(4)], WORLD_TIMEOUT_S)
    return [
        json.loads((workdir / f"{scenario}-rank{rank}.json").read_text())
        for rank in range(4)
        if rank not in dying
    ]


def test_a_lost_rank_is_rebuilt_from_its_replica_on_the_other_host(tmp_path: Path) -> None:
    survivors = run_scenario("rank-lost", (3,), tmp_path)
    assert {s["source"] for s in survivors} == {"memory"}
    assert {s["step"] for s in survivors} == {3}
    # Something came over the wire: rank 3's shards lived only in host-a's replica (rank 1).
    assert sum(s["bytes_from_peers"] for s in survivors) > 0


def test_a_lost_host_is_rebuilt_from_the_other_hosts_replicas(tmp_path: Path) -> None:
    survivors = run_scenario("host-lost", (2, 3), tmp_path)
    assert [s["source"] for s in survivors] == ["memory", "memory"]
    assert {s["step"] for s in survivors} == {3}


def test_survivors_whose_ranks_moved_restore_their_new_shards(tmp_path: Path) -> None:
    survivors = run_scenario("rank-moved", (1,), tmp_path)
    assert [s["source"] for s in survivors] == ["memory"] * 3


def test_without_replicas_a_lost_rank_falls_back_to_the_disk(tmp_path: Path) -> None:
    survivors = run_scenario("fallback", (3,), tmp_path)
    assert {s["source"] for s in survivors} == {"disk"}
    assert all("no process holds rank(s) 3" in s["reason"] for s in survivors)


def test_replicas_go_to_other_hosts_and_are_spread() -> None:
    placement = protectors(["a", "a", "b", "b"], copies=2)
    assert placement.holders == ((0, 2), (1, 3), (2, 0), (3, 1))
    assert placement.cross_host
    three = protectors(["a", "a", "b", "b", "c", "c"], copies=3)
    for rank, holders in enumerate(three.holders):
        assert len({three.hosts[h] for h in holders}) == 3, (rank, holders)
    # Every rank holds as many replicas as it ships.
    load = [sum(rank in holders[1:] for holders in three.holders) for rank in range(6)]
    assert load == [2] * 6
    # Uneven hosts: still on another host.
    uneven = protectors(["a", "a", "a", "b"], copies=2)
    assert all(uneven.hosts[h[1]] != uneven.hosts[r] for r, h in enumerate(uneven.holders))
    # One host: the next rank holds the replica; a lost host is not survived.
    single = protectors(["a", "a", "a"], copies=2)
    assert single.holders == ((0, 1), (1, 2), (2, 0)) and not single.cross_host
    assert protectors(["a", "b"], copies=1).holders == ((0,), (1,))
    with pytest.raises(ValueError, match="copies must be >= 1"):
        protectors(["a"], copies=0)


def peer(rank: int, held: tuple[int, ...], *, survivor: bool = True) -> PeerState:
    return PeerState(
        rank=rank,
        survivor=survivor,
        replicated=False,
        step=5 if survivor else None,
        state_bytes=1000,
        memory=MemoryHolding(f"127.0.0.1:{1000 + rank}", held, True),
    )


def test_choice_memory_for_a_sharded_model_when_every_shard_is_held() -> None:
    snapshot = RegisteredSnapshot(round=4, step=5, world_size=4)
    peers = [peer(0, (0, 2)), peer(1, (1, 3)), peer(2, (2, 0))]
    decision = choose_restore_source(peers, 3, RestorePolicy(), snapshot)
    assert decision.source is RestoreSource.MEMORY, decision
    assert "round 4 step 5" in decision.reason


def test_choice_disk_when_a_shard_is_lost_with_the_lost_ranks_named() -> None:
    snapshot = RegisteredSnapshot(round=4, step=5, world_size=4)
    peers = [peer(0, (0,)), peer(1, (1,))]
    decision = choose_restore_source(peers, 3, RestorePolicy(), snapshot)
    assert decision.source is RestoreSource.DISK
    assert "no process holds rank(s) 2, 3 of the memory snapshot (round 4 step 5)" in (
        decision.reason
    )


def test_choice_the_newer_disk_checkpoint_wins_over_an_older_snapshot() -> None:
    snapshot = RegisteredSnapshot(round=4, step=5, world_size=2)
    peers = [peer(0, (0, 1)), peer(1, (1, 0))]
    decision = choose_restore_source(peers, 8, RestorePolicy(), snapshot)
    assert decision.source is RestoreSource.DISK
    assert "older than the checkpoint" in decision.reason


def test_choice_a_replicated_world_keeps_its_own_newer_state() -> None:
    snapshot = RegisteredSnapshot(round=4, step=5, world_size=2)
    peers = [
        PeerState(rank, True, True, 6, 1000, memory=MemoryHolding("x:1", (rank,), True))
        for rank in range(2)
    ]
    assert choose_restore_source(peers, 3, RestorePolicy(), snapshot).source is RestoreSource.KEEP
    # Survivors behind the snapshot: the snapshot is newer.
    behind = [
        PeerState(rank, True, True, 4, 1000, memory=MemoryHolding("x:1", (0, 1), True))
        for rank in range(2)
    ]
    decision = choose_restore_source(behind, 3, RestorePolicy(), snapshot)
    assert decision.source is RestoreSource.MEMORY


def test_the_server_refuses_a_stale_or_missing_token_and_bad_ranges() -> None:
    server = SnapshotServer()
    try:
        server.set_token(b"current-world")
        server.put(SnapshotId(2, 9), 0, b"0123456789")
        header = {"op": "read", "round": 2, "step": 9, "rank": 0, "ranges": [(2, 3)]}
        got = _request(server.address, {**header, "token": b"current-world"}, answer_bytes=3)
        assert bytes(got) == b"234"
        for token in (b"old-world", b"", None):
            with pytest.raises(SnapshotError, match="not a member of the current world"):
                _request(server.address, {**header, "token": token}, answer_bytes=3)
        with pytest.raises(SnapshotError, match="outside the blob"):
            _request(
                server.address,
                {**header, "token": b"current-world", "ranges": [(8, 5)]},
                answer_bytes=5,
            )
        with pytest.raises(SnapshotError, match="holds no blob of rank 1"):
            _request(
                server.address, {**header, "token": b"current-world", "rank": 1}, answer_bytes=3
            )
        # A new world's token replaces the old one: the old world's members are refused.
        server.set_token(b"next-world")
        with pytest.raises(SnapshotError, match="not a member"):
            _request(server.address, {**header, "token": b"current-world"}, answer_bytes=3)
        # Garbage on the port is logged and dropped; the server keeps serving.
        host, _, port = server.address.rpartition(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"\xff\xff\xff\xff" + msgpack.packb([1, 2]))
        got = _request(server.address, {**header, "token": b"next-world"}, answer_bytes=3)
        assert bytes(got) == b"234"
    finally:
        server.close()
