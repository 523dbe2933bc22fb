"""Memory snapshots kept in host memory (worker/snapshots/hostfiles.py): the blobs live in files
of the directory (written in place, served from their mapping), a process started after one
that died takes up exactly the registered snapshot of its world and removes every other file,
dropped snapshots' files go with them, and leaving removes the directory.

The scenarios with a process group run in a process of their own (a one-rank gloo world)."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import pytest

from rallypoint.worker.snapshots.hostfiles import HostFiles, job_directory, world_of
from rallypoint.worker.snapshots.placement import SnapshotId
from rallypoint.worker.snapshots.server import SnapshotServer
from tests.worker.own_process import run_scenario


def _trained() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def _state(model: Any, optimizer: Any) -> list[Any]:
    import torch

    tensors = [*model.state_dict().values()]
    for state in optimizer.state_dict()["state"].values():
        tensors.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    return [tensor.clone() for tensor in tensors]


def scenario_taken_up_after_a_crash(tmp: Path) -> None:
    import shutil

    import torch
    import torch.distributed as dist

    from rallypoint.worker import MemorySnapshots
    from rallypoint.worker.snapshots import RegisteredSnapshot, holding, restore_from_memory

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    directory = job_directory(tmp / "shm", "job", "w/0")

    def register(snapshot: SnapshotId, world_size: int, placement: Any) -> bool:
        if snapshot.step == 8:
            raise RuntimeError("the process dies before registering step 8")
        return True

    memory = MemorySnapshots("host-a", copies=1, directory=directory)
    memory.attach(1, on_complete=register)
    model, optimizer = _trained()
    outcome = memory.take(7, model, optimizer, overlap=False).wait()  # type: ignore[union-attr]
    expected = _state(model, optimizer)
    world = outcome.placement.world
    assert world == memory.server.world(1) != ""
    # The blob is the file's mapping: held once, in host memory.
    blob = memory.server.blob(outcome.snapshot, 0)
    assert isinstance(blob, mmap.mmap)
    names = sorted(p.name for p in directory.iterdir() if p.name != ".lock")
    assert names == [f"r1-s7-w{world}-rank0.blob", f"r1-s7-w{world}.metadata",
                     f"r1-s7-w{world}.placement"]  # fmt: skip
    assert (directory / names[0]).read_bytes() == bytes(blob)
    # A later snapshot protected but never registered; then the process dies, its files stay.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    failed = memory.take(8, model, optimizer, overlap=False)
    assert failed is not None
    try:
        failed.wait()
        raise AssertionError("step 8 was registered")
    except RuntimeError:
        pass
    assert any("-s8-" in p.name for p in directory.iterdir())
    memory.close(keep_files=True)

    # Another run's (or another cluster's) snapshot of the same round and step, or one whose
    # registration names no world: nothing taken up, every file left removed.
    for index, stranger_world in enumerate([world_of(b"another world's token"), ""]):
        copied = tmp / f"copy-{index}"
        shutil.copytree(directory, copied)
        stranger = MemorySnapshots("host-a", copies=1, directory=copied)
        stranger.attach(2)
        theirs = holding(stranger, RegisteredSnapshot(1, 7, 1, stranger_world))
        assert theirs is not None and theirs.held == () and not theirs.has_metadata
        assert [p.name for p in copied.iterdir()] == [".lock"]
        stranger.close()
        assert not copied.exists()

    # The next process of the same worker: the registered snapshot of its world is taken
    # up (the unregistered step 8 removed) and restored bit for bit.
    memory = MemorySnapshots("host-a", copies=1, directory=directory)
    memory.attach(2)
    registered = RegisteredSnapshot(1, 7, 1, world)
    mine = holding(memory, registered)
    assert mine is not None and mine.held == (0,) and mine.has_metadata
    assert not any("-s8-" in p.name for p in directory.iterdir())
    fresh, fresh_optimizer = _trained()
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.zero_()
    step, _, _ = restore_from_memory(memory, registered.snapshot, [mine], fresh, fresh_optimizer)
    assert step == 7
    got = _state(fresh, fresh_optimizer)
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    # Its next snapshot, registered, drops the one taken up, files and all.
    memory.attach(3)
    memory.take(9, fresh, fresh_optimizer, overlap=False).wait()  # type: ignore[union-attr]
    assert not any(p.name.startswith("r1-") for p in directory.iterdir())
    # Leaving the job removes the files and the directories.
    memory.close()
    assert not directory.exists() and not directory.parent.exists()
    print("ok")


def test_a_crashed_process_s_snapshot_is_taken_up(tmp_path: Path) -> None:
    run_scenario(
        "tests.worker.test_snapshot_hostfiles", "scenario_taken_up_after_a_crash", tmp_path
    )


def test_a_directory_in_use_is_not_shared(tmp_path: Path) -> None:
    first = HostFiles(tmp_path / "d")
    try:
        assert HostFiles.open(tmp_path / "d") is None
    finally:
        first.close(keep=False)
    assert not (tmp_path / "d").exists()


def test_a_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o755)
    (tmp_path / "d").chmod(0o755)
    with pytest.raises(ValueError, match="closed to others"):
        HostFiles(tmp_path / "d")


def test_dropped_snapshots_take_their_files_with_them(tmp_path: Path) -> None:
    server = SnapshotServer(files=HostFiles(tmp_path / "d"))
    try:
        server.set_token(b"token", 4)
        world = world_of(b"token")
        for step in (1, 2):
            buffer = server.allocate(SnapshotId(4, step), 0, 5)
            memoryview(buffer)[:] = b"%05d" % step
            server.put(SnapshotId(4, step), 0, buffer)
            server.put(SnapshotId(4, step), 1, b"replica")
        names = {p.name for p in (tmp_path / "d").iterdir()}
        assert f"r4-s1-w{world}-rank0.blob" in names and f"r4-s2-w{world}-rank1.blob" in names
        server.drop_older(SnapshotId(4, 2))
        names = {p.name for p in (tmp_path / "d").iterdir()} - {".lock"}
        assert names == {f"r4-s2-w{world}-rank0.blob", f"r4-s2-w{world}-rank1.blob"}
        assert bytes(server.blob(SnapshotId(4, 2), 0) or b"") == b"00002"
    finally:
        server.close()
    assert not (tmp_path / "d").exists()
