"""One rank of the recovery benchmark's memory figures (bench/recovery_bench.py runs them).

    python -m bench.memory_ranks RANK WORKDIR SIZE_MB REPEATS

Three ranks (MEMORY_WORLD) on as many simulated hosts (one each) hold an FSDP2-sharded
model of about SIZE_MB MB of parameters (AdamW state doubles it twice over), train SNAPSHOTS
steps and take a memory snapshot after each with two copies: each rank's blob on its own host
and on the next rank's (or erasure-coded: MEMORY_ERASURE=K+M). The blocked time reported is
the median of the snapshots after the first (which copies into fresh buffers:
first_snapshot_blocked_s); it counts the copy made before take() returns and the next step's
wait for the rest. The same state is saved to disk with the Checkpointer (DCP files). Then
the ranks re-form with their ranks rotated (new rank i is old rank i-1), so that no rank
holds the shards it now needs: each restores from the other ranks' memory over their snapshot
servers. Alternately, REPEATS times: ``restore_from_memory`` and a raw ``dcp.load`` of the
disk checkpoint into the same (rotated) state dicts. Rank 0 writes
WORKDIR/memory-figures.json: medians, bytes, the time the training thread was held by the
snapshot, and the memory held for redundancy (all held / the state as stored).

With MEMORY_HOST_DIR=DIR the snapshots are kept in host memory (DIR/host-<rank>, files:
worker/snapshots/hostfiles.py) and the processes exit without leaving (as a crash would);
run again with MEMORY_PHASE=restart, new processes (ranks rotated as above) take the files
up and restore from them, as workers started again after a job-wide crash do: rank 0 writes
WORKDIR/host-memory-figures.json (host_memory_restore_s: from the new world's first
collective to every rank restored, taking the files up included).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from rallypoint.worker import Checkpointer, MemorySnapshots, SnapshotId
from rallypoint.worker.snapshots import RegisteredSnapshot, holding, restore_from_memory
from rallypoint.worker.torch_compat import forget_previous_world

# How many ranks (one per simulated host) and how their snapshots are protected: copies=2 by
# default, or erasure-coded (MEMORY_ERASURE=K+M, e.g. 4+2 with MEMORY_WORLD=4).
WORLD = int(os.environ.get("MEMORY_WORLD", "3"))
ERASURE = os.environ.get("MEMORY_ERASURE", "")
HOST_DIR = os.environ.get("MEMORY_HOST_DIR", "")
SNAPSHOTS = 8
WIDTH = 1024


def sharded_model(layers: int) -> torch.nn.Module:
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    for layer in model.children():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def init(rank: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=120)
    )


def main() -> None:
    old_rank, workdir = int(sys.argv[1]), Path(sys.argv[2])
    size_mb, repeats = float(sys.argv[3]), int(sys.argv[4])
    layers = max(1, int(size_mb * 1024 * 1024 / 4 / (WIDTH * WIDTH)))
    torch.set_num_threads(1)
    if os.environ.get("MEMORY_PHASE") == "restart":
        restart(old_rank, workdir, layers, repeats)
        return
    directory = Path(HOST_DIR) / f"host-{old_rank}" if HOST_DIR else None
    if ERASURE:
        k, m = ERASURE.split("+")
        memory = MemorySnapshots(f"host-{old_rank}", erasure=(int(k), int(m)), directory=directory)
    else:
        memory = MemorySnapshots(f"host-{old_rank}", copies=2, directory=directory)
    init(old_rank, int(os.environ["FIRST_PORT"]))
    memory.attach(1)
    model = sharded_model(layers)
    optimizer = torch.optim.AdamW(model.parameters())
    # Snapshots at the steps of a short run: the first copies into fresh buffers, the
    # others into the buffers kept (what every step after the first costs). A snapshot's
    # blocked time is the copy made in take() and the next optimizer.step()'s wait for the
    # copy left to the background (made while that step's forward and backward ran).
    blocked_each = []
    pending = None
    for step in range(1, SNAPSHOTS + 2):
        model(torch.randn(2, WIDTH)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if pending is not None:
            taken = pending.wait()
            blocked_each.append(taken.blocked_s)
        if step <= SNAPSHOTS:
            pending = memory.take(step, model, optimizer)
            assert pending is not None
    Checkpointer(workdir / "disk").save_async(1, model, optimizer).wait()
    held_bytes = [0] * WORLD
    dist.all_gather_object(held_bytes, memory.server.held_bytes())
    state_bytes = [0] * WORLD
    dist.all_gather_object(state_bytes, taken.state_bytes)
    # The state as stored: this rank's blob (its tensors, and the step, sampler position and
    # optimizer settings that one rank stores for all).
    own_blob = memory.server.blob(taken.snapshot, old_rank)
    stored_bytes = [0] * WORLD
    dist.all_gather_object(stored_bytes, len(own_blob) if own_blob is not None else 0)
    blocked = [0.0] * WORLD
    dist.all_gather_object(blocked, statistics.median(blocked_each[1:]))
    first_blocked = [0.0] * WORLD
    dist.all_gather_object(first_blocked, blocked_each[0])
    dist.barrier()
    dist.destroy_process_group()
    del model, optimizer

    # The same processes, ranks rotated: nobody holds what it now needs.
    rank = (old_rank + 1) % WORLD
    init(rank, int(os.environ["SECOND_PORT"]))
    forget_previous_world()
    memory.attach(2)
    snapshot = SnapshotId(1, SNAPSHOTS)
    holdings: list[Any] = [None] * WORLD
    dist.all_gather_object(holdings, holding(memory, snapshot))
    (checkpoint,) = (workdir / "disk").iterdir()
    ours, raw, fetched = [], [], 0
    for _ in range(repeats):
        model = sharded_model(layers)
        optimizer = torch.optim.AdamW(model.parameters())
        dist.barrier()
        started = time.perf_counter()
        _, _, fetched = restore_from_memory(memory, snapshot, holdings, model, optimizer)
        dist.barrier()
        ours.append(time.perf_counter() - started)

        model = sharded_model(layers)
        optimizer = torch.optim.AdamW(model.parameters())
        dist.barrier()
        started = time.perf_counter()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "progress": b""}
        dcp_load(state, checkpoint_id=str(checkpoint))
        dist.barrier()
        raw.append(time.perf_counter() - started)
    fetched_all = [0] * WORLD
    dist.all_gather_object(fetched_all, fetched)
    if rank == 0:
        total_state = sum(state_bytes)
        ours_s, raw_s = statistics.median(ours), statistics.median(raw)
        figures = {
            "world": WORLD,
            "state_bytes": total_state,
            "fetched_from_peers_bytes": sum(fetched_all),
            "memory_restore_median_s": ours_s,
            "raw_dcp_median_s": raw_s,
            "memory_restore_bytes_per_s": total_state / ours_s,
            "raw_dcp_bytes_per_s": total_state / raw_s,
            "memory_restore_vs_dcp": raw_s / ours_s,
            "snapshot_blocked_s": max(blocked),
            "snapshot_blocked_s_by_rank": blocked,
            "first_snapshot_blocked_s": max(first_blocked),
            "snapshot_blocked_s_per_gb": max(
                b / (s / 1e9) for b, s in zip(blocked, state_bytes, strict=True)
            ),
            "protect_s": taken.protect_s,
            "held_bytes": sum(held_bytes),
            "stored_state_bytes": sum(stored_bytes),
            # Everything held (own blobs, replicas or parity) / the state as stored.
            "memory_overhead": sum(held_bytes) / sum(stored_bytes),
            "memory_overhead_of_tensor_bytes": sum(held_bytes) / total_state,
            "redundancy": f"erasure {ERASURE}" if ERASURE else "copies 2",
            "repeats": repeats,
            "host_memory": bool(HOST_DIR),
            "world_name": taken.placement.world,
        }
        (workdir / "memory-figures.json").write_text(json.dumps(figures, indent=1))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def restart(old_rank: int, workdir: Path, layers: int, repeats: int) -> None:
    """New processes after a crash of every rank: take up the files of the snapshot the
    first processes took, and restore from them (module docstring)."""
    taken = json.loads((workdir / "memory-figures.json").read_text())
    directory = Path(HOST_DIR) / f"host-{old_rank}"
    memory = MemorySnapshots(f"host-{old_rank}", copies=2, directory=directory)
    rank = (old_rank + 1) % WORLD
    init(rank, int(os.environ["THIRD_PORT"]))
    memory.attach(3)
    registered = RegisteredSnapshot(1, SNAPSHOTS, WORLD, taken["world_name"])
    times, held = [], 0
    for repeat in range(max(1, repeats)):
        model = sharded_model(layers)
        optimizer = torch.optim.AdamW(model.parameters())
        dist.barrier()
        started = time.perf_counter()
        # The first takes the files up (holding: MemorySnapshots.recover).
        mine = holding(memory, registered if repeat == 0 else registered.snapshot)
        holdings: list[Any] = [None] * WORLD
        dist.all_gather_object(holdings, mine)
        step, _, _ = restore_from_memory(memory, registered.snapshot, holdings, model, optimizer)
        dist.barrier()
        times.append(time.perf_counter() - started)
        assert step == SNAPSHOTS
        held = sum(len(h.held) for h in holdings if h is not None)
    if rank == 0:
        figures = {
            "world": WORLD,
            "state_bytes": taken["state_bytes"],
            "blobs_taken_up": held,
            "host_memory_restore_s": times[0],
            "host_memory_restore_repeat_median_s": statistics.median(times[1:] or times),
            "host_memory_restore_bytes_per_s": taken["state_bytes"] / times[0],
            "memory_restore_median_s": taken["memory_restore_median_s"],
            "host_vs_process_memory": taken["memory_restore_median_s"] / times[0],
        }
        (workdir / "host-memory-figures.json").write_text(json.dumps(figures, indent=1))
    dist.barrier()
    memory.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
