"""Cache leases on round-store values, end to end on a real 3-member cluster: reads through
the TCPStore bridge's coalescer (``worker/tcpstore/coalescing.Reads``) are answered from leases
without a call, and never return a value older than a write that completed before the read
began, while another client keeps overwriting the keys; and a bridge's set, leased the value
it wrote (``coalescing.Sets``), never answers a read with it once another client's write of
the key completed. The negative control starts the members with the lease wait of writes
switched off (RALLYPOINT_UNSAFE_STORE_CACHE=1) and checks that the same checks then find
stale reads, so the checks can fail."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path

from rallypoint.client import Client, JobConfig
from rallypoint.worker.tcpstore.coalescing import Reads, Sets

from .harness import running_cluster

KEYS = [f"k{i}".encode() for i in range(4)]
WORKLOAD_S = 4.0
READERS = 3
# Keys a bridge sets (leased) and another client then overwrites.
SET_KEYS = [f"s{i}".encode() for i in range(2)]


@dataclass(frozen=True)
class Op:
    invoked: float
    completed: float
    key: bytes
    value: int


@dataclass
class Outcome:
    writes: list[Op]
    reads: list[Op]
    # Reads answered from a lease at once.
    hits: int
    # What a bridge read of each of SET_KEYS after it set the key (leased) and another
    # client's overwrite of it completed.
    after_overwrite: list[bytes | None]


async def workload(endpoints: list[str]) -> Outcome:
    """Writes (one writer task per key, increasing values) and reads through bridges'
    coalescers (a client each); then, per key of SET_KEYS, a bridge's leased set, another
    client's overwrite and the bridge's read."""
    config = JobConfig(min_nodes=1, max_nodes=1)
    async with Client(endpoints) as owner:
        participant = await owner.join("cache", "solo", config=config)
        info = await participant.wait_for_round(timeout_s=20)
        job, round_number, pid = "cache", info.round, participant.participant_id
        writer_store = owner.round_store(job, round_number, pid)
        for key in KEYS:
            await writer_store.set(key, b"0")
        readers = [Client(endpoints) for _ in range(READERS)]
        writes: list[Op] = []
        reads: list[Op] = []
        hits = 0
        stop = time.monotonic() + WORKLOAD_S

        async def write(key: bytes) -> None:
            value = 0
            while time.monotonic() < stop:
                value += 1
                invoked = time.monotonic()
                await writer_store.set(key, str(value).encode())
                writes.append(Op(invoked, time.monotonic(), key, value))
                # Gaps between writes, for reads to be leased in (no lease is granted on a
                # key while a write of it waits).
                await asyncio.sleep(0.3)

        async def read(client: Client) -> None:
            nonlocal hits
            store = client.round_store(job, round_number, pid)
            # As every c10d bootstrap begins: a write, which finds the leader (only the
            # leader grants leases; a write elsewhere is redirected to it).
            await store.set(f"reader-{id(client)}", b"here")
            coalescer = Reads(store, lambda: 1)
            rng = random.Random(id(client))
            try:
                while time.monotonic() < stop:
                    key = rng.choice(KEYS)
                    invoked = time.monotonic()
                    future = coalescer.read([key])
                    hits += future.done()
                    values = await future
                    assert values is not None, key
                    reads.append(Op(invoked, time.monotonic(), key, int(values[0])))
                    await asyncio.sleep(0.002)
            finally:
                coalescer.close()

        try:
            for client in readers:
                await client.__aenter__()
            await asyncio.gather(*(write(key) for key in KEYS), *(read(c) for c in readers))
        finally:
            for client in readers:
                await client.__aexit__(None, None, None)
        after_overwrite: list[bytes | None] = []
        async with Client(endpoints) as bridge_client:
            bridge_store = bridge_client.round_store(job, round_number, pid)
            bridge_reads = Reads(bridge_store, lambda: 1)
            sets = Sets(bridge_store, bridge_reads.cache)
            try:
                for key in SET_KEYS:
                    await sets.set(key, b"bridge")
                    assert bridge_reads.cache.leased([key]) == [b"bridge"], "no lease given"
                    # Held by the leader until the bridge's lease ended (unless unsafe).
                    await writer_store.set(key, b"writer")
                    values = await bridge_reads.read([key])
                    after_overwrite.append(None if values is None else values[0])
            finally:
                bridge_reads.close()
        await participant.leave()
        return Outcome(writes, reads, hits, after_overwrite)


def stale_reads(writes: list[Op], reads: list[Op]) -> list[tuple[Op, int]]:
    """Reads older than a write of their key that completed before they were invoked (the
    writer's values only grow), each with the newest such value."""
    stale = []
    for read in reads:
        newest = max(
            (w.value for w in writes if w.key == read.key and w.completed < read.invoked),
            default=0,
        )
        if read.value < newest:
            stale.append((read, newest))
    return stale


def run(tmp_path: Path, env: dict[str, str] | None) -> Outcome:
    with running_cluster(tmp_path / "cluster", 3, env=env) as cluster:
        return asyncio.run(workload(cluster.endpoints))


def test_leased_reads_skip_calls_and_never_return_an_overwritten_value(tmp_path: Path) -> None:
    outcome = run(tmp_path, None)
    writes, reads, hits = outcome.writes, outcome.reads, outcome.hits
    assert len(writes) >= 2 * len(KEYS) and len(reads) >= 200
    # Most reads were answered from a lease, without a call.
    assert hits >= len(reads) // 2, (hits, len(reads))
    assert not stale_reads(writes, reads), stale_reads(writes, reads)[:5]
    assert outcome.after_overwrite == [b"writer"] * len(SET_KEYS)


def test_control_without_the_write_wait_the_check_finds_stale_reads(tmp_path: Path) -> None:
    outcome = run(tmp_path, {"RALLYPOINT_UNSAFE_STORE_CACHE": "1"})
    assert stale_reads(outcome.writes, outcome.reads), "no stale read: the check is blind"
    assert b"bridge" in outcome.after_overwrite, "the set's lease outlived no overwrite"
