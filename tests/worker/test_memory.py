"""In-memory snapshots: placement across hosts, the restore choice, the snapshot server's
refusals, and real worlds of 4 processes on 2 simulated hosts that lose a rank or a whole host
and restore bit for bit from the survivors' memory (tests/worker/memory_ranks.py)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest

from rallypoint.worker import (
    MemorySnapshots,
    PeerState,
    RegisteredSnapshot,
    RestorePolicy,
    RestoreSource,
    SnapshotError,
    SnapshotId,
    SnapshotPlacement,
    SnapshotServer,
    choose_restore_source,
    erasure_protectors,
    protectors,
)
from rallypoint.worker.snapshots import MemoryHolding, memory_blocker, rebuild_plan
from rallypoint.worker.snapshots.erasure import decode_blobs, encode_parity
from rallypoint.worker.snapshots.protocol import request
from tests.integration.harness import listen_ports
from tests.worker.test_checkpoint import wait_ranks

RANKS_SCRIPT = Path(__file__).with_name("memory_ranks.py")
WORLD_TIMEOUT_S = 180


def run_scenario(
    scenario: str, dying: tuple[int, ...], workdir: Path, *, stopped: bool = False
) -> list[dict[str, Any]]:
    """Run the scenario's 4 ranks; the survivors' figures. ``stopped``: the ``dying`` ranks
    stop themselves instead of dying, and are SIGKILLed once the survivors are done."""
    # Below the ephemeral range: the second world's store starts after the first world's
    # gloo connections took ephemeral ports (one took the port: EADDRINUSE, a 180 s hang).
    master_port, second_port = listen_ports(2)  # distinct
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "MASTER_PORT": str(master_port),
        "SECOND_PORT": str(second_port),
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
    if stopped:
        survivors = [r for r in range(4) if r not in dying]
        try:
            wait_ranks([ranks[r] for r in survivors], [0] * len(survivors), WORLD_TIMEOUT_S)
        finally:
            for r in dying:
                ranks[r].kill()
                ranks[r].communicate()
    else:
        expected = [-signal.SIGKILL if r in dying else 0 for r in range(4)]
        wait_ranks(ranks, expected, WORLD_TIMEOUT_S)
    return [
        json.loads((workdir / f"{scenario}-rank{rank}.json").read_text())
        for rank in range(4)
        if rank not in dying
    ]


def at_rest(scenario: str, workdir: Path) -> list[dict[str, Any]]:
    """Every rank's figures of the first world's last snapshot, written before any died."""
    return [
        json.loads((workdir / f"{scenario}-rank{rank}-at-rest.json").read_text())
        for rank in range(4)
    ]


def test_a_lost_rank_is_rebuilt_from_its_replica_on_the_other_host(tmp_path: Path) -> None:
    survivors = run_scenario("rank-lost", (3,), tmp_path)
    assert {s["source"] for s in survivors} == {"memory"}
    assert {s["step"] for s in survivors} == {3}
    # Something came over the wire: rank 3's shards lived only in host-a's replica (rank 1).
    assert sum(s["bytes_from_peers"] for s in survivors) > 0
    # At rest every blob is held twice.
    figures = at_rest("rank-lost", tmp_path)
    assert sum(f["held_bytes"] for f in figures) == 2 * sum(f["blob_bytes"] for f in figures)


def test_a_lost_host_is_rebuilt_from_the_other_hosts_replicas(tmp_path: Path) -> None:
    survivors = run_scenario("host-lost", (2, 3), tmp_path)
    assert [s["source"] for s in survivors] == ["memory", "memory"]
    assert {s["step"] for s in survivors} == {3}


def test_survivors_whose_ranks_moved_restore_their_new_shards(tmp_path: Path) -> None:
    survivors = run_scenario("rank-moved", (1,), tmp_path)
    assert [s["source"] for s in survivors] == ["memory"] * 3


def test_a_stopped_rank_holding_a_snapshot_collective_does_not_hold_the_next_world(
    tmp_path: Path,
) -> None:
    survivors = run_scenario("rank-stopped", (3,), tmp_path, stopped=True)
    assert [s["source"] for s in survivors] == ["memory"] * 3


def test_one_ranks_failed_load_fails_every_ranks_restore_without_a_hang(
    tmp_path: Path,
) -> None:
    # Each rank loads its part on its own; one all-reduce then tells all whether all did.
    outcomes = [s["outcome"] for s in run_scenario("read-fails", (3,), tmp_path)]
    assert outcomes[1] == (
        "SnapshotError: round 1 step 3: this rank could not load its part from memory: "
        "injected: this rank's reads from memory fail"
    )
    for outcome in (outcomes[0], outcomes[2]):
        assert outcome == (
            "SnapshotError: round 1 step 3: another rank failed to load its part from memory"
        )


def test_a_failed_load_from_memory_falls_back_to_the_disk_on_every_rank(tmp_path: Path) -> None:
    survivors = run_scenario("read-fails-disk", (3,), tmp_path)
    assert {s["source"] for s in survivors} == {"disk"}
    assert {s["step"] for s in survivors} == {2}
    assert "this rank could not load its part from memory" in survivors[1]["reason"]
    assert "another rank failed to load its part" in survivors[0]["reason"]


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
        got = request(server.address, {**header, "token": b"current-world"}, answer_bytes=3)
        assert bytes(got) == b"234"
        for token in (b"old-world", b"", None):
            with pytest.raises(SnapshotError, match="not a member of the current world"):
                request(server.address, {**header, "token": token}, answer_bytes=3)
        with pytest.raises(SnapshotError, match="outside the blob"):
            request(
                server.address,
                {**header, "token": b"current-world", "ranges": [(8, 5)]},
                answer_bytes=5,
            )
        with pytest.raises(SnapshotError, match="holds no blob of rank 1"):
            request(
                server.address, {**header, "token": b"current-world", "rank": 1}, answer_bytes=3
            )
        # A new world's token replaces the old one: the old world's members are refused.
        server.set_token(b"next-world")
        with pytest.raises(SnapshotError, match="not a member"):
            request(server.address, {**header, "token": b"current-world"}, answer_bytes=3)
        # Garbage on the port is logged and dropped; the server keeps serving.
        host, _, port = server.address.rpartition(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"\xff\xff\xff\xff" + msgpack.packb([1, 2]))
        got = request(server.address, {**header, "token": b"next-world"}, answer_bytes=3)
        assert bytes(got) == b"234"
    finally:
        server.close()


# -- erasure coding ---------------------------------------------------------------------------


def test_erasure_a_lost_rank_is_decoded_from_its_group(tmp_path: Path) -> None:
    # 4+2 on 2 hosts of 2: one group (ranks 0-3), parity on ranks 0 and 1 (memory_ranks.py).
    survivors = run_scenario("ec-rank-lost", (3,), tmp_path)
    assert {s["source"] for s in survivors} == {"memory"}
    assert {s["step"] for s in survivors} == {3}
    # Rank 3's blob came back decoded; the rebuilder fetched shares, the readers its blob.
    assert sum(s["bytes_from_peers"] for s in survivors) > 0
    # At rest every rank holds its own blob, ranks 0 and 1 a parity share each, of the
    # longest blob's length: nothing else.
    figures = at_rest("ec-rank-lost", tmp_path)
    blobs = [f["blob_bytes"] for f in figures]
    held = [f["held_bytes"] for f in figures]
    assert held == [blobs[0] + max(blobs), blobs[1] + max(blobs), blobs[2], blobs[3]]
    overhead = sum(held) / sum(blobs)
    # (k+m)/k = 1.5 for blobs of one length; padding to the longest adds (m/k)(max/mean - 1).
    mean = sum(blobs) / len(blobs)
    assert overhead == pytest.approx(1 + 2 / 4 * max(blobs) / mean)
    assert overhead < 2  # two copies' (the test above)
    print(f"erasure 4+2: blobs {blobs}, held {held}, overhead {overhead:.3f}")
    print(f"blocked_s {[f['blocked_s'] for f in figures]}")
    print(f"protect_s {[f['protect_s'] for f in figures]}")


def test_erasure_a_lost_host_is_decoded_from_the_other_hosts_blobs_and_parity(
    tmp_path: Path,
) -> None:
    survivors = run_scenario("ec-host-b-lost", (2, 3), tmp_path)
    assert [s["source"] for s in survivors] == ["memory", "memory"]
    assert {s["step"] for s in survivors} == {3}


def test_erasure_a_group_short_of_k_shares_falls_back_to_the_disk(tmp_path: Path) -> None:
    survivors = run_scenario("ec-host-a-lost", (0, 1), tmp_path)
    assert [s["source"] for s in survivors] == ["disk", "disk"]
    assert all("group 0 (ranks 0, 1, 2, 3)" in s["reason"] for s in survivors)


def test_erasure_groups_span_hosts_and_parity_goes_off_the_groups_hosts() -> None:
    # 4 hosts of 2, 2+1: each group on 2 hosts, its parity on a third; one share per rank.
    eight = erasure_protectors(["a", "a", "b", "b", "c", "c", "d", "d"], 2, 1)
    assert eight.groups == ((0, 2), (4, 6), (1, 3), (5, 7))
    for group, parity in zip(eight.groups, eight.parity_holders, strict=True):
        assert eight.hosts[parity[0]] not in {eight.hosts[r] for r in group}, (group, parity)
    assert sorted(p for parity in eight.parity_holders for p in parity) == [0, 2, 4, 6]
    assert eight.cross_host
    # 4 hosts of 3, 4+2: every group spans the 4 hosts; its 2 parity shares on 2 distinct
    # hosts and ranks other than its own; at most 2 shares of a group per host; 6 parity
    # shares over 12 ranks, at most 1 each (m/k = 0.5).
    hosts = [h for h in "abcd" for _ in range(3)]
    twelve = erasure_protectors(hosts, 4, 2)
    assert len(twelve.groups) == 3
    for group, parity in zip(twelve.groups, twelve.parity_holders, strict=True):
        assert len({hosts[r] for r in group}) == 4
        assert len({hosts[p] for p in parity}) == 2 and not set(parity) & set(group)
    load = [sum(r in p for p in twelve.parity_holders) for r in range(12)]
    assert max(load) == 1 and sum(load) == 6
    assert twelve.cross_host
    # 6 hosts of 1, 4+2: groups (0-3) and (4, 5) coded with k=2; parity off the group's hosts.
    six = erasure_protectors(list("abcdef"), 4, 2)
    assert six.groups == ((0, 1, 2, 3), (4, 5))
    assert set(six.parity_holders[0]) == {4, 5} and not set(six.parity_holders[1]) & {4, 5}
    assert six.cross_host


def test_erasure_in_a_small_world_parity_sits_in_the_group() -> None:
    # 4 ranks on 2 hosts, 4+2: no rank off the group. No host can keep at most 2 of the 6
    # shares with the other keeping 4, so both parity shares go to host-a (on two ranks):
    # host-b's loss is survived, host-a's is not (cross_host says the world is not covered).
    small = erasure_protectors(["a", "a", "b", "b"], 4, 2)
    assert small.groups == ((0, 1, 2, 3),)
    assert small.parity_holders == ((0, 1),)
    assert small.holders == ((0,), (1,), (2,), (3,))
    assert not small.cross_host
    assert small.parity_held_by(0) == {0: [0]} and small.parity_held_by(2) == {}
    # One host: everything on it.
    single = erasure_protectors(["a", "a", "a"], 2, 1)
    assert single.groups == ((0, 1), (2,)) and not single.cross_host
    with pytest.raises(ValueError, match="k >= 1 data and m >= 1 parity"):
        erasure_protectors(["a"], 4, 0)
    with pytest.raises(ValueError, match="at most 256 shares"):
        erasure_protectors(["a"], 250, 7)


def test_memory_snapshots_take_copies_or_erasure_not_both() -> None:
    with pytest.raises(ValueError, match="give copies or erasure, not both"):
        MemorySnapshots("a", copies=2, erasure=(4, 2))
    with pytest.raises(ValueError, match="k >= 1 data and m >= 1 parity shares, got 0\\+2"):
        MemorySnapshots("a", erasure=(0, 2))
    with pytest.raises(ValueError, match="copies must be >= 1"):
        MemorySnapshots("a", copies=0)


def test_erasure_round_trip_with_uneven_blob_lengths() -> None:
    rng = random.Random(5)
    blobs = [rng.randbytes(n) for n in (1000, 3, 0, 777)]
    parity = encode_parity(blobs, 2, [0, 1])
    assert [len(p) for p in parity] == [1000, 1000]
    # One parity holder codes only its own share: the same bytes.
    assert encode_parity(blobs, 2, [1]) == parity[1:]
    shares: dict[int, bytes] = {**dict(enumerate(blobs)), 4: parity[0], 5: parity[1]}
    lengths = [len(b) for b in blobs]
    for kept in itertools.combinations(range(6), 4):
        assert decode_blobs({n: shares[n] for n in kept}, lengths, 2) == blobs, kept
    with pytest.raises(ValueError, match="3 shares cannot give back 4 blobs"):
        decode_blobs({n: shares[n] for n in (0, 1, 4)}, lengths, 2)
    # Blobs of one length: parity costs m/k of them, (k+m)/k at rest.
    even = [rng.randbytes(600) for _ in range(4)]
    coded = sum(map(len, even)) + sum(map(len, encode_parity(even, 2, [0, 1])))
    assert coded / sum(map(len, even)) == 1.5
    assert decode_blobs({0: b"", 1: b""}, [0, 0], 1) == [b"", b""]


def coded_holding(
    rank: int, held: tuple[int, ...], parity: tuple[tuple[int, int], ...]
) -> MemoryHolding:
    placement = replace(erasure_protectors(["a", "a", "b", "b"], 4, 2), lengths=(10, 20, 30, 40))
    return MemoryHolding(f"127.0.0.1:{1000 + rank}", held, True, parity, placement)


def test_erasure_blocker_counts_each_groups_shares() -> None:
    snapshot = SnapshotId(1, 3)
    # Rank 3 lost: 5 shares left, 4 needed.
    one_lost = [coded_holding(0, (0,), ((0, 0),)), coded_holding(1, (1,), ((0, 1),))]
    one_lost.append(coded_holding(2, (2,), ()))
    assert memory_blocker(snapshot, 4, one_lost) is None
    # Host-a lost: 2 blobs left, no parity.
    host_a_lost = [coded_holding(2, (2,), ()), coded_holding(3, (3,), ())]
    assert memory_blocker(snapshot, 4, host_a_lost) == (
        "group 0 (ranks 0, 1, 2, 3) of the memory snapshot (round 1 step 3) keeps 2 of the "
        "4 shares it needs: lost the blobs of rank(s) 0, 1 and parity share(s) 0, 1"
    )
    # The restore choice says it too.
    peers = [PeerState(r, True, False, 4, 1000, memory=h) for r, h in enumerate(host_a_lost)]
    decision = choose_restore_source(peers, 2, RestorePolicy(), RegisteredSnapshot(1, 3, 4))
    assert decision.source is RestoreSource.DISK and "group 0 (ranks 0, 1, 2, 3)" in (
        decision.reason
    )


def test_erasure_rebuild_plan_is_deterministic_and_fetches_least() -> None:
    # New world: old ranks 0, 1, 2 (rank 3 lost). Ranks 0 and 1 hold 2 shares each: the
    # lowest of them rebuilds, from its own 2 shares, then data shares 1 and 2.
    holdings: list[MemoryHolding | None] = [
        coded_holding(0, (0,), ((0, 0),)),
        coded_holding(1, (1,), ((0, 1),)),
        coded_holding(2, (2,), ()),
    ]
    plan = rebuild_plan(holdings[0].placement, holdings)  # type: ignore[union-attr, arg-type]
    assert len(plan) == 1
    (rebuild,) = plan
    assert (rebuild.group, rebuild.rebuilder, rebuild.lost) == (0, 0, (3,))
    assert rebuild.shares == ((0, 0), (4, 0), (1, 1), (2, 2))
    # Nothing lost: nothing to rebuild.
    whole = [*holdings, coded_holding(3, (3,), ())]
    assert rebuild_plan(whole[0].placement, whole) == []  # type: ignore[union-attr, arg-type]


def test_placements_read_back_and_old_replication_bytes_still_read() -> None:
    coded = replace(erasure_protectors(["a", "a", "b", "b"], 4, 2), lengths=(1, 2, 3, 4))
    assert SnapshotPlacement.from_bytes(coded.to_bytes()) == coded
    copied = protectors(["a", "a", "b", "b"], copies=2)
    assert SnapshotPlacement.from_bytes(copied.to_bytes()) == copied
    # Version 1 (replication only, no version key), as registries hold it.
    old = b'{"hosts":["a","a","b","b"],"holders":[[0,2],[1,3],[2,0],[3,1]]}'
    assert SnapshotPlacement.from_bytes(old) == copied
    with pytest.raises(ValueError, match="version 9: this rallypoint reads versions 1 to 2"):
        SnapshotPlacement.from_bytes(b'{"version":9,"hosts":[],"holders":[]}')
