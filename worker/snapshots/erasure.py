"""Reed-Solomon erasure coding of in-memory snapshot blobs: where a group's parity shares go,
and the coding itself (zfec). Pure: no IO, no clock, no process group; the rest of
worker/snapshots/ moves the bytes.

Theory of operation. The world's ranks are split into *groups* of k data ranks (the last group
may be smaller; it then codes with its own size as k). A group's k blobs, zero-padded to the
longest, are its k data shares (share numbers 0..k-1, in the group's rank order); zfec, a
systematic Reed-Solomon code, derives m parity shares (share numbers k..k+m-1, parity index
0..m-1) of the padded length, and any k of the k+m shares give back all k blobs. Every rank
keeps its own blob (a data share); m ranks of the world keep one parity share each. A group
survives any loss that leaves it k shares, so a blob costs (k+m)/k of its bytes at rest, against
``copies`` times under replication.

Groups (:func:`erasure_groups`) take the ranks host by host in turn (the first rank of every
host, then the second, ...), so a group's data ranks sit on as many hosts as the world has:
the loss of a host then costs each group as few shares as it can.

Parity holders (:func:`parity_holders`), chosen share by share, group by group. A group
survives the loss of a host if the host keeps at most m of its shares (data and parity). So
a share goes, in this order of preference:

1. to a host that would still keep at most m of the group's shares, the fewest first (a host
   with none of the group's data ranks, then distinct hosts);
2. when no host can take it without keeping more than m (a small world: 4 ranks on 2 hosts
   with 4+2), to the host that already keeps the most, past saving anyway, so that the other
   hosts stay survivable;

and within that, to a rank holding fewest shares of the group (a lost process then costs the
group one share where the world allows), then to the rank with the fewest parity shares so
far (each rank ends with about m/k of them), then to the host with the fewest, then in rank
order starting at the group's first rank.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Mapping, Sequence
from types import ModuleType

# zfec codes at most 256 shares per group (GF(2^8)).
MAX_SHARES = 256


def _zfec() -> ModuleType:
    """zfec, imported when a share is first coded: the elastic loop imports this package
    whether or not the job erasure-codes its snapshots, and a replacement worker's every
    import before its join is on its way into training (bench/rejoin_phases.py)."""
    return importlib.import_module("zfec")


def erasure_groups(hosts: Sequence[str], data_shares: int) -> tuple[tuple[int, ...], ...]:
    """The groups of at most ``data_shares`` ranks of a world whose rank r runs on
    ``hosts[r]``: the ranks taken host by host in turn (hosts in order of their lowest rank),
    cut into runs of ``data_shares``; each group's ranks in rank order."""
    if data_shares < 1:
        raise ValueError(f"an erasure group needs at least 1 data share, got {data_shares}")
    members: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        members.setdefault(host, []).append(rank)
    # dicts keep insertion order: hosts in order of their lowest rank.
    columns = list(members.values())
    interleaved = [
        column[i]
        for i in range(max(map(len, columns), default=0))
        for column in columns
        if i < len(column)
    ]
    return tuple(
        tuple(sorted(interleaved[start : start + data_shares]))
        for start in range(0, len(interleaved), data_shares)
    )


def parity_holders(
    hosts: Sequence[str], groups: Sequence[Sequence[int]], parity_shares: int
) -> tuple[tuple[int, ...], ...]:
    """For each group, the ranks holding its parity shares 0..``parity_shares``-1 (the rule
    is in the module docstring). Deterministic: a function of its arguments only."""
    world = len(hosts)
    if parity_shares < 1:
        raise ValueError(f"an erasure group needs at least 1 parity share, got {parity_shares}")
    load = [0] * world  # parity shares held by each rank so far
    host_load: Counter[str] = Counter()
    chosen_all: list[tuple[int, ...]] = []
    for group in groups:
        on_host = Counter(hosts[rank] for rank in group)
        on_rank = Counter(group)
        chosen: list[int] = []
        for _ in range(parity_shares):
            ranked = []
            for rank in range(world):
                kept = on_host[hosts[rank]]
                survivable = kept + 1 <= parity_shares
                preference = (
                    0 if survivable else 1,
                    kept if survivable else -kept,
                    on_rank[rank],
                    load[rank],
                    host_load[hosts[rank]],
                    (rank - group[0]) % world,
                )
                ranked.append((preference, rank))
            best = min(ranked)[1]
            chosen.append(best)
            on_host[hosts[best]] += 1
            on_rank[best] += 1
            load[best] += 1
            host_load[hosts[best]] += 1
        chosen_all.append(tuple(chosen))
    return tuple(chosen_all)


def _padded(block: bytes | bytearray | memoryview, length: int) -> bytes:
    raw = bytes(block)
    if len(raw) > length:
        raise ValueError(f"a block of {len(raw)} bytes is longer than the padded {length}")
    return raw + bytes(length - len(raw))


def encode_parity(
    blobs: Sequence[bytes | bytearray | memoryview], parity_shares: int, wanted: Sequence[int]
) -> list[bytes]:
    """The parity shares ``wanted`` (parity indices, 0..``parity_shares``-1) of a group whose
    data shares are ``blobs`` (in the group's order; zero-padded here to the longest)."""
    k = len(blobs)
    if not 1 <= k <= MAX_SHARES - parity_shares or parity_shares < 1:
        raise ValueError(f"zfec cannot code {k} data and {parity_shares} parity shares")
    if any(not 0 <= j < parity_shares for j in wanted):
        raise ValueError(f"parity indices {list(wanted)} outside 0..{parity_shares - 1}")
    length = max(len(blob) for blob in blobs)
    if length == 0:
        return [b"" for _ in wanted]
    encoder = _zfec().Encoder(k, k + parity_shares)
    shares = encoder.encode([_padded(blob, length) for blob in blobs], [k + j for j in wanted])
    return [bytes(share) for share in shares]


def decode_blobs(
    shares: Mapping[int, bytes | bytearray | memoryview],
    lengths: Sequence[int],
    parity_shares: int,
) -> list[bytes]:
    """A group's data blobs, each trimmed to its length in ``lengths`` (the group's order),
    from any k of its shares: ``shares`` maps share numbers (data 0..k-1, parity k..k+m-1) to
    their bytes (data shares unpadded or padded, parity shares as encoded)."""
    k = len(lengths)
    if len(shares) < k:
        raise ValueError(f"{len(shares)} shares cannot give back {k} blobs")
    if any(not 0 <= number < k + parity_shares for number in shares):
        raise ValueError(f"share numbers {sorted(shares)} outside 0..{k + parity_shares - 1}")
    length = max(lengths)
    if length == 0:
        return [b"" for _ in lengths]
    numbers = sorted(shares)[:k]
    decoder = _zfec().Decoder(k, k + parity_shares)
    blocks = decoder.decode([_padded(shares[n], length) for n in numbers], numbers)
    return [bytes(block)[:size] for block, size in zip(blocks, lengths, strict=True)]
