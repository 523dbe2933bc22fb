"""One process of an in-memory snapshot scenario, run as a script by test_memory.py.

    python memory_ranks.py SCENARIO RANK WORKDIR

Four processes on two simulated hosts (ranks 0, 1 on "host-a"; 2, 3 on "host-b") train an
FSDP2 model at world 4 through a TCPStore on MASTER_PORT, taking a memory snapshot after each
of steps 1-3 and training step 4 without one. Then the scenario's ranks die by SIGKILL and
the survivors form a new world (renumbered in rank order) through a TCPStore on
SECOND_PORT, rebuild a fresh model for it and call ``restore_state`` with the snapshot the
"registry" recorded (the on_complete callback writes it to WORKDIR), then train a step and
snapshot again in the new world. Every check is an assert; the survivors write their figures
to WORKDIR/<scenario>-rank<r>.json.

Scenarios:
  rank-lost  2 copies; rank 3 dies: the survivors rebuild its shards from host-a's replica.
  host-lost  2 copies; ranks 2 and 3 (all of host-b) die: rebuilt from host-a's replicas.
  fallback   1 copy (no replicas) and a disk checkpoint of step 2; rank 3 dies: its shards
             are nowhere in memory, so the restore reads the disk checkpoint (step 2).
  rank-moved 2 copies; rank 1 dies: the survivors of ranks 2 and 3 take ranks 1 and 2.
  rank-stopped 2 copies; rank 3 is SIGSTOPped while the others wait for it in a collective
             of the snapshots' own group (pending until its timeout); they re-form without
             it at once and restore its shards from memory (the test SIGKILLs it at the end).
  read-fails 2 copies; rank 3 dies, and in the new world rank 1's reads from memory fail
             (injected): every survivor's restore raises, none hangs; each writes what it
             raised (``outcome``) and stops there.
  read-fails-disk  the same with a disk checkpoint of step 2: every survivor falls back to
             it together.

Erasure-coded, 4+2 (on this world one group, ranks 0-3, and no rank off the group's hosts:
both parity shares go to host-a, ranks 0 and 1, so that host-b's loss is survived):
  ec-rank-lost    rank 3 dies: its blob is decoded from 4 of the 5 shares left.
  ec-host-b-lost  ranks 2, 3 die: their blobs are decoded from host-a's 2 blobs and 2 parity
                  shares.
  ec-host-a-lost  ranks 0, 1 die, and with them both parity shares: 2 of the 4 shares
                  needed are left, so the restore reads the disk checkpoint (step 2), saying
                  which group lost what.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from dist_ranks import (
    BATCH_SIZE,
    EXTRA,
    NUM_SAMPLES,
    adam,
    assert_bit_equal,
    full_state,
    sharded_mlp,
    train_step,
)

from rallypoint.worker import (
    Checkpointer,
    ElasticSampler,
    MemorySnapshots,
    RegisteredSnapshot,
    RestoreResult,
    RestoreSource,
    SnapshotId,
    SnapshotPlacement,
    restore_state,
)
from rallypoint.worker.snapshots import storage as snapshot_storage
from rallypoint.worker.torch_compat import forget_previous_world

HOSTS = ("host-a", "host-a", "host-b", "host-b")
SCENARIOS: dict[str, tuple[int | None, tuple[int, ...], tuple[int, int] | None]] = {
    # copies, the ranks that die, erasure (k, m)
    "rank-lost": (2, (3,), None),
    "host-lost": (2, (2, 3), None),
    "fallback": (1, (3,), None),
    # Ranks 2 and 3 become 1 and 2: torch's cached DTensor shardings must not follow them.
    "rank-moved": (2, (1,), None),
    # Rank 3 is stopped, not killed, with the others in a collective of the snapshots' group.
    "rank-stopped": (2, (3,), None),
    "read-fails": (2, (3,), None),
    "read-fails-disk": (2, (3,), None),
    "ec-rank-lost": (None, (3,), (4, 2)),
    "ec-host-b-lost": (None, (2, 3), (4, 2)),
    "ec-host-a-lost": (None, (0, 1), (4, 2)),
}
# The scenarios that restore from a disk checkpoint of step 2, and what their reason says.
FALLS_BACK = {
    "fallback": "no process holds rank(s) 3 of the memory snapshot",
    "read-fails-disk": "loading it failed (round 1 step 3: ",
    "ec-host-a-lost": (
        "group 0 (ranks 0, 1, 2, 3) of the memory snapshot (round 1 step 3) keeps 2 of the 4 "
        "shares it needs: lost the blobs of rank(s) 0, 1 and parity share(s) 0, 1"
    ),
}
SNAPSHOT_STEPS, TRAINED_STEPS = 3, 4
# The first world's snapshot groups' timeout (long enough to tell a wait for it apart).
GROUP_TIMEOUT_S = 40.0


def init_world(rank: int, world_size: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)


def dead(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def main() -> None:
    scenario, rank, workdir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    copies, dying, erasure = SCENARIOS[scenario]
    memory = MemorySnapshots(HOSTS[rank], copies=copies, erasure=erasure)
    registered: list[tuple[SnapshotId, int, SnapshotPlacement]] = []

    def register(snapshot: SnapshotId, world_size: int, placement: SnapshotPlacement) -> bool:
        registered.append((snapshot, world_size, placement))
        (workdir / f"{scenario}-registered.json").write_text(
            json.dumps([snapshot.round, snapshot.step, world_size])
        )
        return True

    # -- the first world: 4 ranks, round 1
    init_world(rank, 4, int(os.environ["MASTER_PORT"]))
    placement = memory.attach(1, on_complete=register, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    if erasure is None:
        assert placement.cross_host == ((copies or 1) > 1), placement
    else:
        assert placement.groups == ((0, 1, 2, 3),), placement
        assert placement.parity_holders == ((0, 1),), placement
        assert not placement.cross_host, placement  # host-a's loss is not survived
    model = sharded_mlp(0, 4)
    optimizer = adam(model)
    sampler = ElasticSampler(NUM_SAMPLES, batch_size=BATCH_SIZE, rank=rank, world_size=4)
    batches = iter(sampler)
    taken = []
    for step in range(1, TRAINED_STEPS + 1):
        train_step(model, optimizer, next(batches))
        sampler.advance()
        if scenario in FALLS_BACK and step == 2:
            Checkpointer(workdir / "disk").save_async(
                step, model, optimizer, sampler=sampler, extra=EXTRA
            ).wait()
        if step <= SNAPSHOT_STEPS:
            pending = memory.take(step, model, optimizer, sampler=sampler, extra=EXTRA)
            assert pending is not None
            taken.append(pending.wait())
            if step == SNAPSHOT_STEPS:
                reference = full_state(model, optimizer)
                reference_sampler = sampler.state_dict()
    assert [t.snapshot.step for t in taken] == [1, 2, 3]
    assert all(t.committed for t in taken)
    # Only the newest snapshot is kept: this rank's blob and the replicas it protects.
    expected = sorted(r for r, holders in enumerate(placement.holders) if rank in holders)
    assert memory.server.held(SnapshotId(1, 3)) == tuple(expected), memory.server.held
    assert memory.server.snapshots() == [SnapshotId(1, 3)]
    parity = placement.parity_held_by(rank)
    assert memory.server.held_parity(SnapshotId(1, 3)) == tuple(
        (group, j) for group in sorted(parity) for j in parity[group]
    )
    # At rest, written by every rank before any dies: this rank's blob and what it keeps for
    # others (replicas or parity shares).
    own_blob = memory.server.blob(SnapshotId(1, 3), rank)
    assert own_blob is not None
    at_rest = {
        "held_bytes": memory.server.held_bytes(),
        "blob_bytes": len(own_blob),
        "state_bytes": taken[-1].state_bytes,
        "blocked_s": [t.blocked_s for t in taken],
        "protect_s": [t.protect_s for t in taken],
    }
    if erasure is not None:
        assert taken[-1].placement.lengths[rank] == len(own_blob)
    (workdir / f"{scenario}-rank{rank}-at-rest.json").write_text(json.dumps(at_rest))
    addresses: list[Any] = [None] * 4
    dist.all_gather_object(addresses, memory.server.address)
    dist.barrier()
    pending = None
    if scenario == "rank-stopped":
        # Rank 3 stops (its process and sockets stay) while the others are in a collective
        # of the snapshot's own group with it: that work can only end by its timeout.
        if rank in dying:
            os.kill(os.getpid(), signal.SIGSTOP)
        world = memory._world
        assert world is not None
        pending = dist.all_reduce(torch.ones(1), group=world.control, async_op=True)
        time.sleep(0.5)
        assert pending is not None and not pending.is_completed()
    else:
        if rank in dying:
            os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not all(dead(addresses[r]) for r in dying):
            assert time.monotonic() < deadline, "the dying ranks did not die"
            time.sleep(0.05)
    dist.destroy_process_group()

    # -- the second world: the survivors, renumbered, round 2
    survivors = [r for r in range(4) if r not in dying]
    new_rank, world_size = survivors.index(rank), len(survivors)
    init_world(new_rank, world_size, int(os.environ["SECOND_PORT"]))
    forget_previous_world()
    attach_started = time.monotonic()
    memory.attach(2)
    # The previous world's groups are kept while their work may be pending: dropping them
    # here would wait in gloo's destructor for that work's timeout.
    attach_s = time.monotonic() - attach_started
    assert attach_s < GROUP_TIMEOUT_S / 2, f"attach took {attach_s:.1f} s"
    model = sharded_mlp(7, world_size)  # fresh weights: everything must come from the restore
    optimizer = adam(model)
    sampler = ElasticSampler(NUM_SAMPLES, batch_size=3, rank=new_rank, world_size=world_size)
    round_number, step, snapshot_world = json.loads(
        (workdir / f"{scenario}-registered.json").read_text()
    )
    disk = workdir / "disk"
    checkpoint = next(disk.iterdir()) if disk.exists() else None

    def restore() -> RestoreResult:
        return restore_state(
            model,
            optimizer,
            checkpoint=checkpoint,
            survivor_step=TRAINED_STEPS,
            extra=EXTRA,
            sampler=sampler,
            memory=memory,
            memory_snapshot=RegisteredSnapshot(round_number, step, snapshot_world),
        )

    if scenario.startswith("read-fails") and new_rank == 1:

        def failing(self: Any, plan: Any, planner: Any) -> Any:
            raise OSError("injected: this rank's reads from memory fail")

        snapshot_storage.PeerReader.read_data = failing  # type: ignore[method-assign]
    if scenario == "read-fails":
        try:
            restore()
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}"
        else:
            outcome = "restored"
        (workdir / f"{scenario}-rank{rank}.json").write_text(json.dumps({"outcome": outcome}))
        dist.barrier()
        return
    result = restore()
    restored = full_state(model, optimizer)
    if scenario in FALLS_BACK:
        assert result.source is RestoreSource.DISK, result
        assert result.step == 2, result
        assert FALLS_BACK[scenario] in result.reason, result
    else:
        assert result.source is RestoreSource.MEMORY, result
        assert (result.step, result.extra) == (SNAPSHOT_STEPS, EXTRA), result
        assert sampler.state_dict() == reference_sampler
        assert_bit_equal(restored, reference, "restored from memory")
    # Training goes on in the new world, and its snapshots are protected there.
    train_step(model, optimizer, next(iter(sampler)))
    sampler.advance()
    pending = memory.take(result.step + 1, model, optimizer, sampler=sampler, extra=EXTRA)
    assert pending is not None
    after = pending.wait()
    assert after.snapshot == SnapshotId(2, result.step + 1) and after.committed
    assert memory.server.snapshots() == [SnapshotId(2, result.step + 1)]
    figures = {
        "source": result.source.value,
        "reason": result.reason,
        "step": result.step,
        "bytes_from_peers": result.bytes_moved,
        "restore_s": result.duration_s,
        "blocked_s": [t.blocked_s for t in taken],
        "protect_s": [t.protect_s for t in taken],
        "state_bytes": taken[-1].state_bytes,
        "held_bytes": memory.server.held_bytes(),
        "blob_lengths": list(taken[-1].placement.lengths),
    }
    (workdir / f"{scenario}-rank{rank}.json").write_text(json.dumps(figures))
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
