"""A world's in-memory snapshots attach (``MemorySnapshots.attach``, at every formation): one
exchange of two collectives (every rank's host and server, and rank 0's token), where a
broadcast of the token and then that exchange were four; every rank ends with the same token
and placement. Three ranks on gloo, each on a host of its own, meeting through a FileStore
(no coordinator, no port)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RANK = """
import sys
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from rallypoint.worker import MemorySnapshots

rank, world, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world)
memory = MemorySnapshots(f"host-{rank}", copies=2)
memory.make_groups()
with CommDebugMode() as comms:
    placement = memory.attach(1)
assert comms.get_total_counts() == 2, dict(comms.get_comm_counts())
assert len(memory.token) == 16
seen = [None] * world
dist.all_gather_object(seen, (memory.token, placement))
assert all(other == seen[0] for other in seen), seen
assert placement.hosts == tuple(f"host-{r}" for r in range(world)), placement
print("ok", rank, flush=True)
import os
os._exit(0)
"""


def test_attach_exchanges_hosts_servers_and_the_token_in_two_collectives(tmp_path: Path) -> None:
    world = 3
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), str(world), str(store)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outcomes = [rank.communicate(timeout=180) for rank in ranks]
    for rank, (process, (out, err)) in enumerate(zip(ranks, outcomes, strict=True)):
        assert process.returncode == 0, f"rank {rank}:\n{err[-3000:]}"
        assert out.split() == ["ok", str(rank)], out
