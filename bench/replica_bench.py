"""A sharded model restored from the survivors' replicas (source ``replicas``): how fast a
newcomer receives its shards, and that nothing is rolled back.

    .venv/bin/python -m bench.replica_bench [--out bench/results/replicas.json] [--repeats 3]

Four gloo processes (one thread each) form a dp=2 x tp=2 world: an MLP split tensor-parallel
inside each unit of two ranks (column-wise, then row-wise) and replicated over dp
(``replicate``), AdamW (fused), ~200 MB of model and optimizer state in all, ~100 MB per rank.
After a training step, each repeat makes one unit newcomers (a model and optimizer built
afresh, nothing held) and restores the world with ``restore_state`` as a formation does:
the survivors keep their shards and send the newcomers theirs, point to point. The units
take the newcomers' part in turn. Figures: each newcomer's bytes received over its restore's
duration (``replica_restore_bytes_per_s``, the median), the restore's duration on the
slowest rank, the steps rolled back (the survivors' step against the restored one), and
whether every rank then holds the same bits as its counterpart in the other unit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import machine_info, package_versions, write_results

HIDDEN, WIDE = 2048, 4096
WORLD = 4


def _digest(pieces: dict[Any, Any]) -> str:
    digest = hashlib.sha256()
    for key in sorted(pieces):
        digest.update(repr(key).encode())
        digest.update(pieces[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def rank_main(rank: int, port: int, repeats: int, out: Path) -> None:
    """One rank of the bench (see the module docstring)."""
    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from rallypoint.worker.checkpoint import restore_state
    from rallypoint.worker.replica_restore import held_state
    from rallypoint.worker.torch_compat import replicate_over

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=120)
    )

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        mesh = init_device_mesh("cpu", (WORLD // 2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(3)
        model = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, WIDE), torch.nn.ReLU(), torch.nn.Linear(WIDE, HIDDEN)
        )
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        replicate_over(model, mesh["dp"])
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        generator = torch.Generator().manual_seed(rank // 2)
        inputs = torch.randn(4, HIDDEN, generator=generator)
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    model, optimizer = build()
    train(model, optimizer)
    step = 1
    records = []
    for repeat in range(repeats):
        newcomer = rank // 2 == repeat % 2
        held = None if newcomer else held_state(model, optimizer)
        new_model, new_optimizer = build()
        dist.barrier()
        started = time.perf_counter()
        result = restore_state(
            new_model,
            new_optimizer,
            checkpoint=None,
            survivor_step=None if newcomer else step,
            previous=held,
        )
        duration_s = time.perf_counter() - started
        del held
        model, optimizer = new_model, new_optimizer
        pieces = held_state(model, optimizer)
        assert pieces is not None
        digests: list[Any] = [None] * WORLD
        dist.all_gather_object(digests, _digest(dict(pieces.pieces)))
        state_bytes = sum(t.numel() * t.element_size() for t in pieces.pieces.values())
        records.append(
            {
                "repeat": repeat,
                "newcomer": newcomer,
                "source": result.source.value,
                "step": result.step,
                "steps_rolled_back": step - result.step,
                "bytes_received": result.bytes_moved,
                "duration_s": duration_s,
                "state_bytes": state_bytes,
                "replicas_identical": digests[rank % 2] == digests[rank % 2 + 2],
            }
        )
        train(model, optimizer)
        step += 1
    out.write_text(json.dumps(records))
    dist.destroy_process_group()


def run(repeats: int, workdir: Path) -> list[list[dict[str, Any]]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.replica_bench",
                "--rank",
                str(rank),
                "--port",
                str(port),
                "--repeats",
                str(repeats),
                "--out",
                str(workdir / f"rank{rank}.json"),
            ],
            env=env,
        )
        for rank in range(WORLD)
    ]
    codes = [rank.wait(timeout=600) for rank in ranks]
    if any(codes):
        raise SystemExit(f"replica_bench: ranks exited with {codes}")
    return [json.loads((workdir / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="bench/results/replicas.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.rank is not None:
        rank_main(args.rank, args.port, args.repeats, Path(args.out))
        return 0
    out = Path(args.out)
    workdir = out.parent / f".{out.stem}-ranks"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    by_rank = run(args.repeats, workdir)
    for path in workdir.iterdir():
        path.unlink()
    workdir.rmdir()
    records = [record for ranks in by_rank for record in ranks]
    received = [r for r in records if r["newcomer"]]
    rates = [r["bytes_received"] / r["duration_s"] for r in received]
    slowest = [
        max(r["duration_s"] for r in records if r["repeat"] == repeat)
        for repeat in range(args.repeats)
    ]
    document = {
        "benchmark": "restore from the survivors' replicas (dp=2 x tp=2, gloo)",
        "replica_restore_bytes_per_s": statistics.median(rates),
        "replica_restore_s": statistics.median(slowest),
        "steps_rolled_back": max(r["steps_rolled_back"] for r in records),
        "sources": sorted({r["source"] for r in records}),
        "replicas_identical": all(r["replicas_identical"] for r in records),
        "state_bytes_per_rank": statistics.median(r["state_bytes"] for r in records),
        "bytes_received_per_newcomer": statistics.median(r["bytes_received"] for r in received),
        "parameters": {"world": WORLD, "tp": 2, "hidden": HIDDEN, "wide": WIDE},
        "repeats": args.repeats,
        "details": by_rank,
        "wall_time_s": time.perf_counter() - started,
        "machine": machine_info(),
        "versions": package_versions(["rallypoint", "torch"]),
    }
    write_results(out, document, None)
    print(
        f"replica restore: {document['replica_restore_bytes_per_s'] / 1e9:.2f} GB/s per "
        f"newcomer, {document['replica_restore_s']:.3f} s (slowest rank), "
        f"steps rolled back {document['steps_rolled_back']}, sources {document['sources']}, "
        f"replicas identical {document['replicas_identical']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
