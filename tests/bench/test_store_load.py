"""The store benchmark's simulated ranks speak torch's TCPStore protocol as torch's own client
does: replayed against torch's C++ TCPStore server (libuv), what they write is what torch's
client reads back under the same keys, and they make the wire requests torch makes (gloo:
a SET, then WAIT, WAIT, GET for every rank's key)."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

REPOSITORY = Path(__file__).resolve().parents[2]
# bench/ is a folder of scripts run from the repository (python -m bench.store_load), not an
# installed package: the test imports it the same way.
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from bench.store_load import TCPStoreClient, gloo, gloo_value_bytes, nccl  # noqa: E402

WORLD = 4


def test_replayed_patterns_are_read_back_by_torchs_client() -> None:
    server = TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        use_libuv=True,
        timeout=timedelta(seconds=10),
    )

    async def replay() -> tuple[list[int], list[int]]:
        ranks = [await TCPStoreClient.connect("127.0.0.1", server.port) for _ in range(WORLD)]
        await asyncio.gather(*(gloo(c, r, WORLD, "g/") for r, c in enumerate(ranks)))
        after_gloo = [c.ops for c in ranks]
        await asyncio.gather(*(nccl(c, r, WORLD, "n/") for r, c in enumerate(ranks)))
        nccl_ops = [c.ops - before for c, before in zip(ranks, after_gloo, strict=True)]
        for client in ranks:
            await client.close()
        return after_gloo, nccl_ops

    gloo_ops, nccl_ops = asyncio.run(asyncio.wait_for(replay(), 30))
    assert gloo_ops == [3 * WORLD + 1] * WORLD
    # Rank 0 sets the id; the others WAIT + GET it; all ADD twice and WAIT; some set last_worker.
    assert nccl_ops[0] in (4, 5) and all(ops in (5, 6) for ops in nccl_ops[1:])
    assert sum(nccl_ops) >= 1 + 2 * (WORLD - 1) + 3 * WORLD + 1

    reader = TCPStore(
        "127.0.0.1",
        server.port,
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=10),
    )
    for rank in range(WORLD):
        assert reader.get(f"g/0//cpu//0/{rank}") == bytes(gloo_value_bytes(WORLD))
    assert reader.get("n/0") == bytes(128)
    assert reader.get("n/store_based_barrier_key:1") == str(WORLD).encode()
    assert reader.get("n/store_based_barrier_key:1:last_worker") == b"1"
