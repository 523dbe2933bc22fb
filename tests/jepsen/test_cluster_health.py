"""The health the fault-injection cluster reports: a member counts as up only once it
answers after a start, not from the moment its process is launched. (A member restarted on
a loaded machine took 6 s to import and serve; counted up meanwhile, it made corrupt-3n's
availability check judge 7.9 s "with a connected majority" of which the majority existed
for 2.)"""

from __future__ import annotations

import random
import re
import subprocess
import threading
from pathlib import Path

import pytest

from tests.integration.harness import ProcessCluster, wait_until
from tests.jepsen.availability import Health
from tests.jepsen.cluster import NamespaceCluster


class FakeNetwork:
    """What NamespaceCluster needs of netns.Network, without namespaces."""

    def __init__(self) -> None:
        self.blocked: set[tuple[int, int]] = set()
        self.degraded: set[int] = set()
        self.on_change: object = None

    def add_member(self, member_id: int) -> None:
        pass


def test_a_started_member_is_up_only_once_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answering: set[int] = set()
    processes: list[subprocess.Popen[bytes]] = []

    def launch(self: ProcessCluster, member_id: int, **_: object) -> None:
        process = subprocess.Popen(["sleep", "60"])
        processes.append(process)
        self.members[member_id].proc = process

    monkeypatch.setattr(ProcessCluster, "start", launch)
    monkeypatch.setattr(
        NamespaceCluster,
        "status",
        lambda self, member_id, timeout_s=1.0: object() if member_id in answering else None,
    )
    cluster = NamespaceCluster(tmp_path, FakeNetwork(), 3)  # type: ignore[arg-type]
    try:
        for member_id in (1, 2):
            launch(cluster, member_id)
            answering.add(member_id)
        reported: list[Health] = []
        cluster.on_change = reported.append
        starting = threading.Thread(target=cluster.start, args=(3,))
        starting.start()
        wait_until(lambda: cluster.members[3].running, 10, "member 3's process")
        # Launched, not answering yet (importing, opening its log): not up, whoever asks
        # (the run's health poller asks every half second).
        assert cluster.health().up == (1, 2)
        answering.add(3)
        starting.join(timeout=30)
        assert not starting.is_alive()
        assert cluster.health().up == (1, 2, 3)
        assert reported[-1].up == (1, 2, 3)
        assert all(3 not in health.up for health in reported[:-1])
    finally:
        for process in processes:
            process.kill()
            process.wait()


@pytest.mark.parametrize("seed", range(8))
def test_damaging_a_wal_changes_only_what_it_says_without_reading_the_segment_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # Reading a preallocated segment whole held the interpreter lock for seconds and
    # stopped the run's clients, which share the nemesis's process.
    cluster = NamespaceCluster(tmp_path, FakeNetwork(), 1)  # type: ignore[arg-type]
    wal = cluster.members[1].data_dir / "raft" / "wal"
    wal.mkdir(parents=True)
    segment = wal / "0000000000000000-0000000000000001.wal"
    written = bytes(random.Random(seed).randrange(1, 256) for _ in range(50_000))
    before = written + bytes(3 << 20)  # the rest of the preallocated segment
    segment.write_bytes(before)

    def whole(self: Path) -> bytes:
        raise AssertionError(f"{self} read whole")

    monkeypatch.setattr(Path, "read_bytes", whole)
    what = cluster.damage_wal(1, random.Random(seed))
    monkeypatch.undo()
    after = segment.read_bytes()
    assert len(after) == len(before)
    assert after[: 50_000 - 4096] == before[: 50_000 - 4096] and after[50_000:] == before[50_000:]
    changed = [i for i in range(50_000 - 4096, 50_000) if after[i] != before[i]]
    torn = re.fullmatch(r".*: zeroed bytes (\d+)\.\.50000 \(a torn final record\)", what)
    flipped = re.fullmatch(r".*: flipped bit (\d) of byte (\d+) \(of 50000 written\)", what)
    if torn:
        cut = int(torn.group(1))
        assert after[cut:50_000] == bytes(50_000 - cut) and changed == list(range(cut, 50_000))
    else:
        assert flipped, what
        offset = int(flipped.group(2))
        assert changed == [offset]
        assert after[offset] == before[offset] ^ (1 << int(flipped.group(1)))
