"""One rank of the health probe's test (test_health.py), run as a script:

    python probe_ranks.py RANK WORLD_SIZE WORKDIR SLOW_RANK DELAY_S

The ranks meet through a FileStore in WORKDIR (no coordinator, no port) and run the built-in
``CollectiveProbe`` over real gloo twice in one process group (starting processes is the
slow part): first with every rank alike, then with SLOW_RANK sleeping DELAY_S before each of
its exchanges, as a rank behind a slow link would deliver late. Each rank writes what each
probe said of it and the link times it measured to WORKDIR/rank<r>.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from rallypoint.worker.elastic import CollectiveProbe


class Round:
    """The part of an ElasticRound the probe uses, over the default group."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size, self.end_reason = rank, world_size, ""

    def all_reduce(self, tensor: torch.Tensor) -> bool:
        dist.all_reduce(tensor)
        return True

    def wait(self, work: dist.Work, what: str) -> bool:
        work.wait()
        return True


class SlowProbe(CollectiveProbe):
    slow_rank = -1
    delay_s = 0.0

    def _before_exchange(self, rank: int) -> None:
        if rank == self.slow_rank:
            time.sleep(self.delay_s)


def main() -> None:
    rank, world_size = int(sys.argv[1]), int(sys.argv[2])
    workdir = Path(sys.argv[3])
    store = dist.FileStore(str(workdir / "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    probe = SlowProbe()
    round_ = Round(rank, world_size)
    said = {}
    for case, slow_rank in (("alike", -1), ("slow", int(sys.argv[4]))):
        SlowProbe.slow_rank, SlowProbe.delay_s = slow_rank, float(sys.argv[5])
        verdict = probe(round_)  # type: ignore[arg-type]
        links = probe.measure(round_)  # type: ignore[arg-type]
        said[case] = {"verdict": verdict, "links": links}
    (workdir / f"rank{rank}.json").write_text(json.dumps(said))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
