"""DCP checkpoints: save at 4 ranks, restore resharded at 2 and 3 bit for bit, heal a new member
by broadcast; the restore-source choice; retention.

The multi-process tests run real gloo process groups on CPU, one process per rank
(tests/worker/dist_ranks.py), meeting through a FileStore: no coordinator involved.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rallypoint.worker import (
    CheckpointLayout,
    ParamLayout,
    PeerState,
    Placement,
    RestorePolicy,
    RestoreSource,
    checkpoint_path,
    choose_restore_source,
    delete_checkpoints,
    read_metadata,
    retired_beyond,
)

RANKS_SCRIPT = Path(__file__).with_name("dist_ranks.py")
# Generous for a loaded 2-core machine; a healthy run of each world takes seconds.
WORLD_TIMEOUT_S = 120


def run_world(scenario: str, world_size: int, workdir: Path) -> list[dict[str, Any]]:
    """Run every rank of ``scenario`` (names joined by commas) as its own process; their
    figures by rank, then by scenario."""
    # Rank 0 hosts a TCPStore on a free port (a file:// store's file, removed by whichever
    # rank finishes last, made ranks abort on exit now and then).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    command = [sys.executable, str(RANKS_SCRIPT), scenario]
    ranks = [
        subprocess.Popen(
            [*command, str(rank), str(world_size), str(workdir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    wait_ranks(ranks, [0] * world_size, WORLD_TIMEOUT_S)
    return [
        json.loads((workdir / f"{scenario}-{world_size}-rank{rank}.json").read_text())
        for rank in range(world_size)
    ]


def wait_ranks(ranks: list[subprocess.Popen[str]], expected: list[int], timeout_s: float) -> None:
    """Wait for every rank's process; fail with the stderr of each that did not exit with
    its expected code. A rank still running after ``timeout_s`` is sent SIGABRT (started
    with PYTHONFAULTHANDLER=1, it prints every thread's stack: where it hung), then killed;
    every rank's pipes are read to the end either way."""
    deadline = time.monotonic() + timeout_s
    stderrs: dict[int, str] = {}
    hung = []
    for rank, process in enumerate(ranks):
        try:
            remaining_s = max(0.1, deadline - time.monotonic())
            stderrs[rank] = process.communicate(timeout=remaining_s)[1]
        except subprocess.TimeoutExpired:
            hung.append(rank)
    for rank in hung:
        ranks[rank].send_signal(signal.SIGABRT)
    for rank in hung:
        try:
            stderrs[rank] = ranks[rank].communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            ranks[rank].kill()
            stderrs[rank] = ranks[rank].communicate()[1]
    failures = []
    for rank, process in enumerate(ranks):
        if rank in hung:
            failures.append(f"rank {rank} still running after {timeout_s:g} s:")
        elif process.returncode != expected[rank]:
            failures.append(f"rank {rank} exited {process.returncode}:")
        else:
            continue
        stderr = stderrs[rank] or ""
        # Torch's warnings can fill the tail: keep the first lines too.
        failures.append(
            stderr if len(stderr) <= 6000 else f"{stderr[:3000]}\n...\n{stderr[-3000:]}"
        )
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def saved_at_4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    workdir = tmp_path_factory.mktemp("checkpoints")
    return workdir, [rank["save"] for rank in run_world("save", 4, workdir)]


@pytest.fixture(scope="module")
def restored_at_3(saved_at_4: tuple[Path, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Restore from disk, then heal a new member by broadcast, in one world of 3 ranks."""
    workdir, _ = saved_at_4
    return run_world("restore,heal", 3, workdir)


def test_save_at_4_writes_dcp_files_and_metadata(
    saved_at_4: tuple[Path, list[dict[str, Any]]],
) -> None:
    workdir, figures = saved_at_4
    for name, sharded in (("fsdp", True), ("replicated", False)):
        path = workdir / name / "step-000003"
        assert [Path(f[name]["path"]) for f in figures] == [path] * 4
        metadata = read_metadata(path)
        assert (metadata.step, metadata.world_size) == (3, 4)
        assert {p.placement for p in metadata.layout.params} == {
            Placement.SHARDED if sharded else Placement.REPLICATED
        }
        assert metadata.layout.params[0].name == "0.weight"
        assert metadata.layout.params[0].shape == (10, 6)
        assert (path / ".metadata").exists()
        assert metadata.bytes_total == figures[0][name]["bytes_total"] > 0
    # FSDP: every rank wrote its own shards.
    assert len(list((workdir / "fsdp" / "step-000003").glob("*.distcp"))) == 4


def test_fsdp_and_replicated_restore_into_2_ranks(
    saved_at_4: tuple[Path, list[dict[str, Any]]],
) -> None:
    workdir, _ = saved_at_4
    figures = run_world("restore", 2, workdir)
    assert all(rank["restore"]["fsdp"]["bytes_read"] > 0 for rank in figures)


def test_fsdp_and_replicated_restore_into_3_ranks(restored_at_3: list[dict[str, Any]]) -> None:
    # Resharded reads: each rank reads about a third of the sharded checkpoint, not all of it.
    fsdp_read = [rank["restore"]["fsdp"]["bytes_read"] for rank in restored_at_3]
    assert 0 < max(fsdp_read) < sum(fsdp_read)


def test_new_member_receives_the_replicated_state_by_broadcast(
    restored_at_3: list[dict[str, Any]],
) -> None:
    # Ranks 0 and 1 survived at the same step, rank 2 is new: rank 0 sends the state to rank
    # 2 alone; rank 1 holds it already and receives nothing.
    moved = [rank["heal"]["bytes"] for rank in restored_at_3]
    assert moved[0] == moved[2] > 0 and moved[1] == 0, moved


# -- the restore-source choice ----------------------------------------------------------------


def peer(rank: int, step: int | None, replicated: bool = True, **kw: Any) -> PeerState:
    return PeerState(rank, step is not None, replicated, step, state_bytes=1000, **kw)


POLICY = RestorePolicy(broadcast_max_bytes=4000)


def test_choice_keep_when_every_rank_survived_with_the_same_state() -> None:
    decision = choose_restore_source([peer(0, 7), peer(1, 7)], 5, POLICY)
    assert decision.source is RestoreSource.KEEP


def test_choice_broadcast_from_the_lowest_survivor_when_small() -> None:
    decision = choose_restore_source([peer(0, None), peer(1, 7), peer(2, 7)], 5, POLICY)
    assert (decision.source, decision.src_rank) == (RestoreSource.BROADCAST, 1)
    # Sent only to the ranks that do not hold step 7 already: the newcomer and any survivor
    # a step behind.
    assert decision.receivers == (0,)
    behind = choose_restore_source([peer(0, 7), peer(1, 6), peer(2, None), peer(3, 7)], 5, POLICY)
    assert (behind.src_rank, behind.receivers) == (0, (1, 2))
    tight = RestorePolicy(broadcast_max_bytes=999)
    large = choose_restore_source([peer(0, None), peer(1, 7)], 5, tight)
    assert large.source is RestoreSource.DISK and "over the broadcast limit" in large.reason


def test_choice_follows_measured_throughput_over_the_size_limit() -> None:
    rates = {"disk_bytes_per_s": 2e9, "broadcast_bytes_per_s": 1e9}
    slower = choose_restore_source([peer(0, 7, **rates), peer(1, None)], 5, POLICY)
    assert slower.source is RestoreSource.DISK
    rates = {"disk_bytes_per_s": 1e8, "broadcast_bytes_per_s": 1e9}
    faster = choose_restore_source(
        [peer(0, 7, **rates), peer(1, None)], 5, RestorePolicy(broadcast_max_bytes=0)
    )
    assert faster.source is RestoreSource.BROADCAST


@pytest.mark.parametrize(
    ("peers", "reason"),
    [
        ([peer(0, 7, replicated=False), peer(1, None, replicated=False)], "sharded"),
        # Survivors a step apart heal from the most advanced (test_restore_survivors.py),
        # unless even that one is older than the checkpoint.
        ([peer(0, 4), peer(1, 3), peer(2, None)], "survivors are at step 4, older"),
        ([peer(0, 4), peer(1, None)], "older than the checkpoint"),
        ([peer(0, None), peer(1, None)], "no survivor"),
    ],
)
def test_choice_reads_the_disk_when_memory_cannot_serve(
    peers: list[PeerState], reason: str
) -> None:
    decision = choose_restore_source(peers, 5, POLICY)
    assert decision.source is RestoreSource.DISK and reason in decision.reason


def test_choice_without_a_checkpoint() -> None:
    fresh = choose_restore_source([peer(0, None), peer(1, None)], None, POLICY)
    assert fresh.source is RestoreSource.FRESH
    huge = RestorePolicy(broadcast_max_bytes=0)
    only_memory = choose_restore_source([peer(0, 3), peer(1, None)], None, huge)
    assert only_memory.source is RestoreSource.BROADCAST


# -- layout, naming and retention -------------------------------------------------------------


def test_layout_round_trips_through_json() -> None:
    layout = CheckpointLayout(
        world_size=4,
        params=(
            ParamLayout("0.weight", Placement.SHARDED, (10, 6), "float32", "Shard(dim=0)"),
            ParamLayout("0.bias", Placement.REPLICATED, (10,), "float32", ""),
        ),
    )
    assert CheckpointLayout.from_json(json.loads(layout.to_bytes())) == layout
    assert not layout.fully_replicated


def test_checkpoint_names_carry_step_and_round(tmp_path: Path) -> None:
    assert checkpoint_path(tmp_path, 123) == tmp_path / "step-000123"
    assert checkpoint_path(tmp_path, 123, round_number=7) == tmp_path / "step-000123-round-7"


def test_retention_keeps_the_last_k_and_deletes_only_checkpoints(tmp_path: Path) -> None:
    committed = [str(checkpoint_path(tmp_path, step)) for step in (10, 20, 30, 40)]
    for path in committed:
        Path(path).mkdir()
        (Path(path) / ".metadata").write_bytes(b"x")
    retired = retired_beyond(committed, keep=2)
    assert retired == committed[:2]
    uris = [retired[0], f"file://{retired[1]}"]
    assert delete_checkpoints(tmp_path, uris) == [Path(p).resolve() for p in retired]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000030", "step-000040"]
    # A second pass over the same list is harmless.
    assert delete_checkpoints(tmp_path, uris) == []
    with pytest.raises(ValueError, match="refusing"):
        delete_checkpoints(tmp_path, [str(tmp_path.parent)])
    with pytest.raises(ValueError, match="refusing"):
        delete_checkpoints(tmp_path / "step-000030", [str(tmp_path / "step-000040")])


def test_a_hung_rank_is_reported_with_where_it_waits() -> None:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code in ("pass", "import time\ndef waits_here():\n    time.sleep(60)\nwaits_here()")
    ]
    with pytest.raises(AssertionError) as failed:
        wait_ranks(ranks, [0, 0], timeout_s=2.0)
    report = str(failed.value)
    assert "rank 1 still running after 2 s" in report and "rank 0" not in report
    assert "waits_here" in report  # faulthandler's dump of the hung rank's stack
    assert all(process.stdout is not None and process.stdout.closed for process in ranks)
