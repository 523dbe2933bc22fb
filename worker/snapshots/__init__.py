"""In-memory snapshots of the training state, protected in peers' memory across hosts.

Theory of operation. A disk checkpoint costs a storage write, so jobs take one every tens of
minutes and a failure loses everything since. A memory snapshot costs a copy: every rank
keeps its part of the state (its shards, for a sharded model) in host memory, and ships a
replica to ranks on other hosts, so a lost rank's part (or a whole lost host's) comes back
from its peers' memory and the world resumes at most one snapshot behind.

Taking one (:meth:`MemorySnapshots.take`). The state (``get_state_dict`` of model and
optimizer, sharded, plus the step, sampler position and extra state; found again from a plan
while the state keeps its layout) is copied into staging buffers kept from one snapshot to the
next; training is held only for the copy of the model's buffers, the parameters and optimizer
state being copied in the background while the next forward and backward run
(``optimizer.step()`` waits for that copy: staging.py). A background thread
then:

1. lays the copy out as torch.distributed.checkpoint (DCP) would store it, through DCP's own
   save planner (so replicated tensors are stored once, by one rank) with a storage writer
   that packs each rank's items into one bytes object (a *blob*, tensors as their raw bytes)
   and records where each item lives (rank, offset, length) in DCP's metadata; every rank
   gets the global metadata back from the save;
2. pushes its blob to the ranks that protect it (:func:`protectors`: ``copies - 1`` ranks on
   other hosts, spread so that every rank holds about as many replicas as it ships) over a
   small TCP server every process runs (:class:`SnapshotServer`), and waits for their acks
   (erasure-coded: see below);
3. agrees with every rank that every blob is protected (an all-reduce over the snapshot's own
   process group), and only then calls ``on_complete`` on rank 0 (the elastic loop registers
   the snapshot with the coordinator, fenced by the round; a zombie's registration is
   refused) and drops the older snapshots everywhere.

A snapshot still in flight when the next is asked for makes the next one skipped, never
waited for: training is never held by the protection of an earlier step.

Restoring (:func:`restore_from_memory`, chosen by ``checkpoint.restore_state``). After a
failure the world re-forms with its survivors (and perhaps newcomers); each process still
holds what its server held: its own blobs and the replicas it protects, named by the old
world's round, step and rank. If the registered snapshot's every old rank is held by some
process of the new world, the state is loaded by DCP's load planner for the *new* world's
layout (resharding 4 -> 3 ranks is DCP's work) through a storage reader that fetches each
stored item from the process holding it (its own memory when it holds it; only the rows the
item needs, received straight into the target tensor): bit for bit what was snapshotted.
Otherwise the restore falls back to the disk checkpoint, saying which ranks were lost.

Outliving the processes (``MemorySnapshots(directory=...)``, hostfiles.py). A fault that
kills every process at once loses what their servers held. With a directory in host memory (a
tmpfs) every server keeps its blobs, parity shares, metadata and placement in files there
(written in place: held once, in the page cache instead of the heap), named by round, step and
the world that took them (a digest of its token, which the registered placement carries). A
process started after one that died (the same job and worker name: the same directory) takes
up, at its first restore, the files of the snapshot the coordinator registered, and only
those; every other file is removed. The restore then finds every old rank held, as above.

Between worlds. torch caches DTensor shardings by specs whose meshes compare equal across
worlds, so a process whose rank moved would get the previous world's coordinate:
``forget_previous_world`` (worker/torch_compat.py) clears those caches before the new
world's model is made. The previous world's snapshot groups are kept until their timeout
passed (``attach``): dropping them would run gloo's destructor, which waits for any
collective still pending on them.

Erasure coding (``MemorySnapshots(host, erasure=(k, m))``), for (k+m)/k of the state at rest
instead of ``copies`` times. The ranks form groups of k (:func:`erasure_protectors`; the rule
and the code are in erasure.py), each with m parity shares kept by m ranks chosen for
host diversity and balance. In step 2 each rank ships its blob to its group's parity holders
instead (``stage``: kept aside, never counted as held); a parity holder waits for all of its
group's blobs, computes only its own parity share(s) (zfec, over the blobs zero-padded to the
longest), keeps them and drops the blobs it received; the agreement of step 3 then means every
parity share is kept. The placement registered carries every blob's length (from the save's
metadata), which a rebuilt blob is trimmed to. At rest a process holds its own blob and its
parity shares. To restore, every group must keep k of its k+m shares (blobs or parity shares
held by the new world's processes; else the restore falls back to disk naming the group and
what it lost); a rebuild step first has one process per damaged group (the one holding most
of its shares) fetch k shares (``read`` and ``read-parity``), decode the lost blobs and keep
them in its server, agreed by every rank before any reads: then the load above finds every old
rank's blob held, and what it reads is bit for bit what was snapshotted.

Trust. The servers listen on the address the ranks advertise; every request carries the
current world's token (random, chosen by rank 0 of each world and sent over the process
group), so only members of the current world can read or place snapshots, and a process of
an ended world (its token is replaced) is refused. The token is not encryption: run it on
the training network only, as gloo's own traffic is.

The modules, one job each: placement.py (names, placement rules, the registry's encoding),
erasure.py (the coding and where parity goes), protocol.py (the wire), server.py
(:class:`SnapshotServer`), hostfiles.py (its files in host memory), storage.py (DCP's
storage in memory), staging.py (the copy),
lifecycle.py (:class:`MemorySnapshots`: attach, take, protect), restore.py (holdings,
rebuild, :func:`restore_from_memory`). They import worker/state_io.py for the state's layout,
never worker/checkpoint.py, which imports this package.

The names below load their module on first use: a job without memory snapshots needs only
the light ones (``SnapshotError``, ``RegisteredSnapshot``: placement.py), and a replacement
must not pay for the rest (and torch.distributed.checkpoint under it) before it has joined
(worker/elastic/, "Imports").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import module_getattr

if TYPE_CHECKING:
    from .hostfiles import (
        job_directory,
    )
    from .lifecycle import (
        DEFAULT_GROUP_TIMEOUT_S,
        MemorySnapshots,
        OnComplete,
        PendingSnapshot,
        SnapshotTaken,
    )
    from .placement import (
        PLACEMENT_VERSION,
        RegisteredSnapshot,
        SnapshotError,
        SnapshotId,
        SnapshotPlacement,
        erasure_protectors,
        protectors,
        validate_erasure,
    )
    from .protocol import (
        REQUEST_TIMEOUT_S,
    )
    from .restore import (
        MemoryHolding,
        holding,
        memory_blocker,
        metadata_ranks,
        rebuild_plan,
        restore_from_memory,
    )
    from .server import (
        SnapshotServer,
    )

# Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "DEFAULT_GROUP_TIMEOUT_S": "lifecycle",
    "MemoryHolding": "restore",
    "MemorySnapshots": "lifecycle",
    "OnComplete": "lifecycle",
    "PLACEMENT_VERSION": "placement",
    "PendingSnapshot": "lifecycle",
    "REQUEST_TIMEOUT_S": "protocol",
    "RegisteredSnapshot": "placement",
    "SnapshotError": "placement",
    "SnapshotId": "placement",
    "SnapshotPlacement": "placement",
    "SnapshotServer": "server",
    "SnapshotTaken": "lifecycle",
    "erasure_protectors": "placement",
    "holding": "restore",
    "job_directory": "hostfiles",
    "memory_blocker": "restore",
    "metadata_ranks": "restore",
    "protectors": "placement",
    "rebuild_plan": "restore",
    "restore_from_memory": "restore",
    "validate_erasure": "placement",
}


__getattr__ = module_getattr(__name__, _EXPORTS, globals())


__all__ = [
    "DEFAULT_GROUP_TIMEOUT_S",
    "PLACEMENT_VERSION",
    "REQUEST_TIMEOUT_S",
    "MemoryHolding",
    "MemorySnapshots",
    "OnComplete",
    "PendingSnapshot",
    "RegisteredSnapshot",
    "SnapshotError",
    "SnapshotId",
    "SnapshotPlacement",
    "SnapshotServer",
    "SnapshotTaken",
    "erasure_protectors",
    "holding",
    "job_directory",
    "memory_blocker",
    "metadata_ranks",
    "protectors",
    "rebuild_plan",
    "restore_from_memory",
    "validate_erasure",
]
