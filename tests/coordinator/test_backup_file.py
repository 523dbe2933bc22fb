"""Backup files, restore and a forced new cluster, offline: every damaged file is refused in
one line, every bad input of ``snapshot status``/``snapshot restore`` is one line with exit
code 1 and changes nothing, and the data dirs they build hold what they say."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from rallypoint.coordinator import backup_file
from rallypoint.coordinator import identity as identity_file
from rallypoint.coordinator.backup_file import BackupError, BackupHeader, file_chunks, parse
from rallypoint.coordinator.cli.main import main
from rallypoint.coordinator.member_table import (
    MemberAddress,
    MemberTable,
    decode_app_snapshot,
    encode_app_snapshot,
)
from rallypoint.coordinator.node.recovery import RecoveryError, force_new_cluster, restore
from rallypoint.coordinator.peer_auth import cluster_id_for
from rallypoint.coordinator.state.kv import KeyValueStore
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.coordinator.state.values import KeyValue
from rallypoint.raft.storage.disk_storage import DiskStorage

SECRET = b"s" * 32
OLD_TOKEN = "old-cluster"
INITIAL = "1=127.0.0.1:7001@127.0.0.1:7002,2=127.0.0.1:7003@127.0.0.1:7004"
SEGMENT = "1MiB"


def backup_bytes(index: int = 9, cluster_id: int | None = None) -> bytes:
    machine = StateMachine()
    store = KeyValueStore()
    store.restore([KeyValue(b"k", b"v", 3, 3, 1)], [])
    machine.kv = store
    machine.applied_index = machine.revision = index
    members = MemberTable({1: MemberAddress("10.0.0.1:2380", "10.0.0.1:2379")}, highest_id=3)
    payload = encode_app_snapshot(members, machine.snapshot())
    header = BackupHeader(
        index=index,
        term=2,
        cluster_id=cluster_id_for(SECRET, OLD_TOKEN) if cluster_id is None else cluster_id,
        member_id=1,
        voters=(1, 2, 3),
        learners=(),
        size_bytes=len(payload),
        sha256=hashlib.sha256(payload).digest(),
        created_ms=1_700_000_000_000,
    )
    return b"".join(file_chunks(header, payload, 64))


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    return path


def test_a_backup_reads_back_as_written() -> None:
    backup = parse(backup_bytes(), "b")
    summary = backup_file.summarize(backup)
    assert (summary.index, summary.keys, summary.voters) == (9, 1, (1, 2, 3))


def test_every_truncation_is_refused_as_truncated() -> None:
    data = backup_bytes()
    for cut in range(len(data)):
        with pytest.raises(BackupError, match="truncated"):
            parse(data[:cut], "b")


def test_every_flipped_bit_is_refused() -> None:
    data = backup_bytes()
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        with pytest.raises(BackupError):
            parse(bytes(damaged), "b")


def test_bytes_after_the_snapshot_are_refused() -> None:
    with pytest.raises(BackupError, match="corrupt: 1 bytes after"):
        parse(backup_bytes() + b"x", "b")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code: int, out: str, err: str) -> str:
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_status_prints_the_index_keys_and_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "b.rpsnap"
    path.write_bytes(backup_bytes())
    code, out, _ = run(capsys, "snapshot", "status", str(path), "--json")
    document = json.loads(out)
    assert code == 0
    assert (document["index"], document["keys"], document["jobs"]) == (9, 1, [])
    code, out, _ = run(capsys, "snapshot", "status", str(path))
    assert code == 0 and "index 9 (term 2)" in out and "1 keys" in out


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda data: data[:-5], "truncated: it holds"),
        (lambda data: data[:-5] + b"\0" * 5, "SHA-256 does not match"),
        (lambda data: b"hello", "not a rallypoint backup"),
        (lambda data: b"", "truncated"),
    ],
)
def test_status_refuses_a_damaged_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: object, words: str
) -> None:
    path = tmp_path / "b.rpsnap"
    path.write_bytes(damage(backup_bytes()))  # type: ignore[operator]
    line = one_line_error(*run(capsys, "snapshot", "status", str(path)))
    assert words in line and str(path) in line


def test_status_of_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(*run(capsys, "snapshot", "status", str(tmp_path / "nope")))
    assert "No such file" in line


def restore_args(path: Path, data_dir: Path, secret: Path, *extra: str) -> list[str]:
    return [
        "snapshot",
        "restore",
        str(path),
        "--data-dir",
        str(data_dir),
        "--initial-cluster",
        INITIAL,
        "--peer-secret-file",
        str(secret),
        "--wal-segment-size",
        SEGMENT,
        *extra,
    ]


def test_restore_builds_a_member_of_a_new_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secret_file: Path
) -> None:
    path = tmp_path / "b.rpsnap"
    path.write_bytes(backup_bytes())
    for member_id in (1, 2):
        data_dir = tmp_path / f"m{member_id}"
        args = restore_args(path, data_dir, secret_file, "--member-id", str(member_id))
        code, out, err = run(capsys, *args, "--cluster-token", "new", "--json")
        assert code == 0, err
        assert json.loads(out)["cluster_id"] == f"{cluster_id_for(SECRET, 'new'):016x}"
        found = identity_file.load(str(data_dir))
        assert found is not None and found.member_id == member_id and not found.abstaining
        storage = DiskStorage.open(str(data_dir / "raft"))
        try:
            snapshot = storage.snapshot()
            assert snapshot.metadata.index == 9 and snapshot.metadata.conf_state.voters == (1, 2)
            assert storage.hard_state.commit == 9
            members, _ = decode_app_snapshot(snapshot.data)
            # Ids are never given again, not even after a restore.
            assert members.ids() == [1, 2] and members.next_id() == 4
        finally:
            storage.close()
    # Both members hold the same snapshot bytes: one log from the start.
    first, second = (sorted((tmp_path / f"m{i}" / "raft" / "snap").iterdir()) for i in (1, 2))
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_restore_refuses_bad_input_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secret_file: Path
) -> None:
    path = tmp_path / "b.rpsnap"
    path.write_bytes(backup_bytes())
    truncated = tmp_path / "truncated.rpsnap"
    truncated.write_bytes(backup_bytes()[:-1])
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("mine")
    fresh = tmp_path / "fresh"
    cases = [
        (
            restore_args(path, busy, secret_file, "--member-id", "1", "--cluster-token", "n"),
            "not empty",
        ),
        (
            restore_args(path, fresh, secret_file, "--member-id", "7", "--cluster-token", "n"),
            "member 7 is not in --initial-cluster",
        ),
        (
            restore_args(truncated, fresh, secret_file, "--member-id", "1", "--cluster-token", "n"),
            "truncated",
        ),
        (
            restore_args(
                path, fresh, secret_file, "--member-id", "1", "--cluster-token", OLD_TOKEN
            ),
            "give the restored cluster a new --cluster-token",
        ),
    ]
    for args, words in cases:
        line = one_line_error(*run(capsys, *args))
        assert words in line, line
    assert sorted(os.listdir(busy)) == ["keep"] and (busy / "keep").read_text() == "mine"
    assert not fresh.exists()


def test_save_refuses_to_overwrite_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "b.rpsnap"
    path.write_bytes(b"precious")
    args = ["snapshot", "save", str(path), "--endpoints", "127.0.0.1:1", "--timeout", "1"]
    line = one_line_error(*run(capsys, *args))
    assert "exists" in line
    assert path.read_bytes() == b"precious"


def test_force_new_cluster_makes_a_one_member_cluster_and_keeps_the_old_storage(
    tmp_path: Path,
) -> None:
    backup = parse(backup_bytes(), "b")
    data_dir = str(tmp_path / "m2")
    members = {1: MemberAddress("a:1", "a:2"), 2: MemberAddress("b:1", "b:2")}
    restore(backup, data_dir, 2, members, cluster_id=11, segment_size_bytes=1 << 20)
    forced = force_new_cluster(
        data_dir, 2, MemberAddress("b:1", "b:2"), 12, Limits(), segment_size_bytes=1 << 20
    )
    assert (forced.index, forced.previous_cluster_id, forced.previous_members) == (9, 11, (1,))
    assert forced.kept_uncommitted is None
    assert os.path.isdir(forced.kept_old_storage)
    found = identity_file.load(data_dir)
    assert found is not None and found.cluster_id == 12
    storage = DiskStorage.open(os.path.join(data_dir, "raft"))
    try:
        assert storage.snapshot().metadata.conf_state.voters == (2,)
        table, _ = decode_app_snapshot(storage.snapshot().data)
        assert table.ids() == [2] and table.next_id() == 4
    finally:
        storage.close()
    # Forced twice into the same cluster: refused (start it without the flag).
    with pytest.raises(RecoveryError, match="needs a new cluster id"):
        force_new_cluster(data_dir, 2, MemberAddress("b:1", "b:2"), 12, Limits())
    with pytest.raises(RecoveryError, match="belongs to member 2"):
        force_new_cluster(data_dir, 3, MemberAddress("b:1", "b:2"), 13, Limits())
    with pytest.raises(RecoveryError, match="holds no Raft storage"):
        force_new_cluster(str(tmp_path / "empty"), 1, MemberAddress("c:1", "c:2"), 1, Limits())
