"""Operator mistakes that must not lose data, with real ``rallypoint serve`` processes: a
second copy on the same data dir or ports, a read-only data dir, a disk too small for the
write-ahead log. Each is refused in seconds with one line on stderr and exit code 2; the
member already running is unaffected.

The disk cases run the member in a mount namespace of its own (``unshare --mount``) with a
small or read-only tmpfs over its data dir, so nothing is mounted on the test machine; they
are skipped where mount namespaces are not allowed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.client import Client
from tests.integration.harness import (
    SERVE_COMMAND,
    ProcessCluster,
    free_ports,
    refused_to_start,
    running_cluster,
)

pytestmark = pytest.mark.integration


def single_member(data_dir: Path, *extra: str) -> tuple[list[str], str]:
    """The command of a one-member cluster on fresh ports (it elects itself), and its client
    address."""
    peer, client = (f"127.0.0.1:{port}" for port in free_ports(2))
    command = [
        *SERVE_COMMAND,
        "--member-id=1",
        f"--data-dir={data_dir}",
        f"--peer-address={peer}",
        f"--client-address={client}",
        f"--initial-cluster=1={peer}@{client}",
        f"--peer-secret={os.urandom(16).hex()}",
        "--tick-ms=20",
        *extra,
    ]
    return command, client


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path, 1) as c:
        yield c


def test_a_second_serve_on_the_same_data_dir_is_refused_naming_the_lock_and_holder(
    cluster: ProcessCluster,
) -> None:
    member = cluster.members[1]
    assert member.proc is not None
    lock_file = member.data_dir / "rallypoint.lock"
    # Other ports, same data dir: two processes would append to one write-ahead log.
    line = refused_to_start(single_member(member.data_dir)[0])
    assert str(lock_file) in line and f"process {member.proc.pid}" in line
    assert lock_file.read_text().strip() == str(member.proc.pid)
    # The member that holds it still serves.
    assert cluster.status(1) is not None
    assert member.running


def test_a_second_member_on_the_same_ports_is_refused_naming_the_address(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    member = cluster.members[1]
    # The same flags as the running member, but its own data dir: before, both served and
    # clients were spread between them (SO_REUSEPORT).
    line = refused_to_start(
        [
            *SERVE_COMMAND,
            "--member-id=1",
            f"--data-dir={tmp_path / 'copy'}",
            f"--peer-address={member.peer_address}",
            f"--client-address={member.client_address}",
            f"--initial-cluster={cluster.initial_cluster()}",
            f"--peer-secret-file={cluster.secret_path}",
        ]
    )
    assert f"peer_address {member.peer_address}: cannot listen" in line
    assert "already in use" in line
    peer, _ = free_ports(2)
    line = refused_to_start(
        [
            *SERVE_COMMAND,
            "--member-id=1",
            f"--data-dir={tmp_path / 'copy'}",
            f"--peer-address=127.0.0.1:{peer}",
            f"--client-address={member.client_address}",
            f"--peer-secret-file={cluster.secret_path}",
        ]
    )
    assert f"client_address {member.client_address}: cannot listen" in line
    # Its own two listeners on one port, named differently.
    line = refused_to_start(
        [
            *SERVE_COMMAND,
            f"--data-dir={tmp_path / 'copy'}",
            f"--peer-address=localhost:{peer}",
            f"--client-address=127.0.0.1:{peer}",
            f"--peer-secret-file={cluster.secret_path}",
        ]
    )
    assert f"client_address 127.0.0.1:{peer} and peer_address localhost:{peer} are the same" in line
    assert cluster.status(1) is not None


# ------------------------------------------------------------------ disks (mount namespaces)


def _namespaced(mount_options: str, mount_point: Path, command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own, with a tmpfs over ``mount_point``."""
    script = f'mount -t tmpfs -o {mount_options} tmpfs "$1" && shift && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", script, "sh", str(mount_point), *command]


@pytest.fixture(scope="module")
def mount_namespaces() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not allowed here: {probe.stderr.strip()}")


def test_a_read_only_data_dir_is_refused_naming_the_path(
    mount_namespaces: None, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    # Cannot be created (its parent is read-only) ...
    line = refused_to_start(_namespaced("ro,size=1m", disk, single_member(disk / "member-1")[0]))
    assert f"data_dir {disk / 'member-1'} cannot be created: Read-only file system" in line
    # ... or exists and cannot be written.
    line = refused_to_start(_namespaced("ro,size=1m", disk, single_member(disk)[0]))
    assert f"data_dir {disk} is not writable" in line and "Read-only file system" in line


async def test_a_small_disk_needs_a_smaller_wal_segment_and_then_serves(
    mount_namespaces: None, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    data_dir = disk / "member-1"
    # 8 MiB cannot hold the default 64 MiB segment: said in one line, with the way out.
    line = refused_to_start(_namespaced("size=8m", disk, single_member(data_dir)[0]))
    assert "needs 65 MiB" in line and "--wal-segment-size" in line

    command, client_address = single_member(data_dir, "--wal-segment-size=4MiB")
    log_path = tmp_path / "member.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _namespaced("size=8m", disk, command), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        async with Client([client_address], timeout_s=30.0) as client:
            await client.put("small-disk", "fits")
            kv = await client.get("small-disk")
            assert kv is not None and kv.value == b"fits"
        assert proc.poll() is None
    finally:
        proc.terminate()
        try:
            assert proc.wait(timeout=15) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
