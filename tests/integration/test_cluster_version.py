"""`rallypoint status` shows each member's record version and the cluster version, with real
processes of two record versions: a member of record version 1 holds the cluster at the
baseline and a newer feature is refused in one line; once it runs this build, the cluster
version rises by itself and the feature works.

No release of record version 1 speaks the stream peer protocol (they speak gRPC on the peer
port: docs/operations.md, "Upgrading"), so the older member is this build with its record
version set to 1 before anything imports it (``OLDER``): what it advertises in the hello
and in Status, what it proposes and what it refuses to open are all its record version's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rallypoint.coordinator.cli.main import main as rallypoint_main
from rallypoint.coordinator.version import RECORD_VERSION
from tests.upgrade.previous import Build

from .harness import MemberProcess, ProcessCluster, wait_until

pytestmark = pytest.mark.integration

# This build, of record version 1.
OLDER = Build(
    name="record version 1",
    interpreter=(
        sys.executable,
        "-c",
        "import runpy, rallypoint.coordinator.version as v; v.RECORD_VERSION = 1; "
        "runpy.run_module('rallypoint.coordinator', run_name='__main__')",
    ),
    env=(),
)


class MixedCluster(ProcessCluster):
    """A ProcessCluster whose members in ``builds`` start with another build."""

    builds: dict[int, Build]

    def _command(self, member: MemberProcess, initial: str, join: bool) -> list[str]:
        command = super()._command(member, initial, join)
        build = self.builds.get(member.member_id)
        if build is None:
            return command
        return ["env", *(f"{k}={v}" for k, v in build.env), *build.interpreter, *command[3:]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixedCluster]:
    root = tmp_path_factory.mktemp("versions")
    mixed = MixedCluster(root / "data", 3, tick_ms=50)
    mixed.builds = {3: OLDER}
    mixed.start_all()
    try:
        mixed.leader(timeout_s=60.0)
        wait_until(
            lambda: all(mixed.status(m) is not None for m in mixed.members), 60.0, "every member"
        )
        yield mixed
    finally:
        mixed.shutdown()


def cli(
    capsys: pytest.CaptureFixture[str], cluster: ProcessCluster, *argv: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = rallypoint_main([*argv, "--endpoints", ",".join(cluster.endpoints)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status_json(capsys: pytest.CaptureFixture[str], cluster: ProcessCluster) -> Any:
    code, out, err = cli(capsys, cluster, "status", "--json")
    assert code == 0, err
    return json.loads(out)


def test_status_shows_each_members_version_and_the_cluster_version_through_an_upgrade(
    capsys: pytest.CaptureFixture[str], cluster: MixedCluster
) -> None:
    document = status_json(capsys, cluster)
    versions = {row["id"]: row["record_version"] for row in document["members"]}
    # Member 3 runs record version 1, the baseline.
    assert versions == {1: RECORD_VERSION, 2: RECORD_VERSION, 3: 1}
    assert document["cluster_version"] == 1
    code, table, _ = cli(capsys, cluster, "status")
    assert code == 0 and "cluster version 1" in table and "version" in table

    # A feature of record version 2, refused in one line naming the version it needs (when
    # a member of this build leads; one of an older release ignores the field it does not
    # know, which is why the leader's build decides).
    if cluster.leader() != 1:
        code, _, err = cli(capsys, cluster, "transfer-leader", "1")
        assert code == 0, err
        wait_until(lambda: cluster.leader() == 1, 20.0, "member 1 to lead")
    leader_endpoint = cluster.members[1].client_address
    capsys.readouterr()
    code = rallypoint_main(["kv", "put", "k", "v", "--keep-lease", "--endpoints", leader_endpoint])
    err = capsys.readouterr().err
    assert code != 0
    assert "Put.keep_lease needs cluster version 2; the cluster is at version 1" in err
    assert len(err.strip().splitlines()) == 1, err

    # Member 3 upgraded: the same data directory, this build.
    cluster.stop(3)
    del cluster.builds[3]
    cluster.start(3)

    def raised() -> bool:
        code, out, _ = cli(capsys, cluster, "status", "--json")
        if code != 0:
            return False  # member 3 is starting
        document = json.loads(out)
        rows = document["members"]
        return document["cluster_version"] == RECORD_VERSION and all(
            row["record_version"] == RECORD_VERSION for row in rows
        )

    wait_until(raised, 60.0, "the cluster version to rise to this build's")
    code, table, _ = cli(capsys, cluster, "status")
    assert code == 0 and f"cluster version {RECORD_VERSION}" in table
    code, _, err = cli(capsys, cluster, "kv", "put", "k", "v2", "--keep-lease")
    assert code == 0, err


def test_an_older_build_refuses_a_data_directory_of_a_higher_cluster_version(
    cluster: MixedCluster,
) -> None:
    def raised() -> bool:
        statuses = [cluster.status(m) for m in (1, 2, 3)]
        return all(s is not None and s.cluster_version == RECORD_VERSION for s in statuses)

    wait_until(raised, 60.0, "cluster version raised")
    cluster.stop(2)
    cluster.builds[2] = OLDER
    cluster.start(2)
    member = cluster.members[2]
    wait_until(lambda: not member.running, 60.0, "the older build to exit")
    member.stopped = True
    assert (
        f"the cluster version is {RECORD_VERSION}, but this build of rallypoint reads and "
        "writes record versions up to 1"
    ) in cluster.log_text(2)
    del cluster.builds[2]
    cluster.start(2)
    wait_until(lambda: cluster.status(2) is not None, 60.0, "member 2 back with this build")
