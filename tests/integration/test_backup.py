"""Backups and a lost majority, over real member processes, by the procedures of
docs/operations.md ("Backups", "Losing a majority"): their shell blocks are run as written,
with the variables they name set to this test's paths and ports.

- A backup saved from a cluster under write load holds, at its index, exactly the state the
  cluster's log gives at that index (every key, lease, session, job and checkpoint record:
  the state machines' bytes are equal), and a new three-member cluster restored from it
  answers every key, lease, job and checkpoint record as the original did.
- A survivor of a cluster that lost two of its three members for good, forced into a new
  cluster, keeps every write it had applied (its whole log), serves, and two new members
  added as the procedure says hold all of it: they serve it alone once the survivor is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rallypoint.client import JobConfig, LeaveOutcome, RallypointError, SyncClient
from rallypoint.coordinator import backup_file
from rallypoint.coordinator.cli.main import main as rallypoint_main
from rallypoint.coordinator.member_table import MemberAddress, MemberTable, encode_app_snapshot
from rallypoint.coordinator.node.recovery import replay, restore
from rallypoint.coordinator.peer_auth import cluster_id_for
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.raft.storage.disk_storage import DiskStorage
from rallypoint.raft.types import Index

from .harness import (
    SERVE_COMMAND,
    MemberProcess,
    ProcessCluster,
    refused_to_start,
    running_cluster,
    wait_until,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)


def section_blocks(title: str) -> list[str]:
    """The ```sh blocks of docs/operations.md's section ``### title``, in order."""
    text = OPERATIONS.read_text()
    start = text.index(f"\n### {title}\n")
    end = min(
        (i for i in (text.find("\n### ", start + 1), text.find("\n## ", start + 1)) if i > 0),
        default=len(text),
    )
    return SH_BLOCK.findall(text[start:end])


def commands(block: str) -> list[str]:
    """A block's commands: continuation lines joined, comment-only lines dropped."""
    joined = block.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def shell_env(**values: str) -> dict[str, str]:
    """The environment a block runs in: ``rallypoint`` on PATH, and the block's variables."""
    bin_dir = os.path.dirname(sys.executable)
    # The members the blocks start tick as the harness's do (RALLYPOINT_<SETTING>).
    path = f"{bin_dir}:{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "RALLYPOINT_TICK_MS": "50", **values}


def run_command(command: str, env: dict[str, str]) -> tuple[int, str, str]:
    """One ``rallypoint ...`` command of a block, as the shell would run it (its variables
    from ``env``), in this process (a command line's start costs seconds on a loaded
    machine): exit code, standard output, standard error."""
    expanded = re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], command)
    argv = shlex.split(expanded, comments=True)
    assert argv[0] == "rallypoint", command
    out, err = io.StringIO(), io.StringIO()
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the defaults the command reads ($RALLYPOINT_ENDPOINTS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = rallypoint_main(argv[1:])
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return code, out.getvalue(), err.getvalue()


def run_block(block: str, env: dict[str, str], member: MemberProcess | None = None) -> list[str]:
    """Run a block's commands in order: ``rallypoint serve`` in the background as
    ``member``'s process (its log to the member's log), every other one to completion (it
    must exit 0). Their standard outputs."""
    outputs = []
    for command in commands(block):
        if command.startswith("rallypoint serve"):
            assert member is not None, command
            log = open(member.log_path, "ab")  # noqa: SIM115 (the child keeps it open)
            member.proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"], env=env, stdout=log, stderr=subprocess.STDOUT
            )
            log.close()
            member.stopped = False
            continue
        code, out, err = run_command(command, env)
        assert code == 0, (command, out[-2000:], err[-2000:])
        outputs.append(out)
    return outputs


class Load:
    """Puts of distinct keys from a thread until stopped; the revision of each acknowledged
    one."""

    def __init__(self, endpoints: list[str], prefix: str) -> None:
        self.acked: dict[bytes, int] = {}
        self._stop = threading.Event()
        self._endpoints = endpoints
        self._prefix = prefix
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with SyncClient(self._endpoints, timeout_s=2) as writer:
            number = 0
            while not self._stop.is_set():
                key = f"{self._prefix}/{number:06d}".encode()
                # One not acknowledged is not counted.
                with contextlib.suppress(RallypointError):
                    self.acked[key] = writer.put(key, str(number)).kv.mod_revision
                number += 1

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.acked) >= count, 60, f"{count} acknowledged writes")

    def stop(self) -> dict[bytes, int]:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()
        return dict(self.acked)


def stored_keys(machine: StateMachine) -> dict[bytes, tuple[object, ...]]:
    return {
        kv.key: (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease_id)
        for kv in machine.kv.in_order()
    }


def served_keys(client: SyncClient) -> dict[bytes, tuple[object, ...]]:
    return {
        kv.key: (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease_id)
        for kv in client.range_pages(b"")
    }


def state_at(data_dir: Path, index: int) -> StateMachine | None:
    """The state machine a stopped member's log gives at ``index`` (None: its log stops
    short of it)."""
    storage = DiskStorage.open(str(data_dir / "raft"))
    try:
        if storage.last_index() < index:
            return None
        _, machine = replay(storage, Limits(), up_to=Index(index))
    finally:
        storage.close()
    return machine


def run_job(client: SyncClient, job: str) -> None:
    """Two rounds of a one-worker job, a checkpoint committed in the second, then the worker
    leaves: the job's records stay as they are from then on."""
    config = JobConfig(min_nodes=1, max_nodes=1)
    first = client.join(job, "w0", config=config)
    first.wait_for_round(timeout_s=20)
    first.leave()
    second = client.join(job, "w1", config=config)
    second.wait_for_round(timeout_s=20)
    second.store().set("ready", b"1")
    registry = second.checkpoints()
    checkpoint_id = registry.begin(7, uri="file:///checkpoints/7")
    registry.shard_done(checkpoint_id, 0)
    registry.commit(checkpoint_id)
    second.leave(outcome=LeaveOutcome.FINISHED, detail="done")


def test_a_backup_under_load_restores_into_a_new_cluster_every_record_at_its_index(
    tmp_path: Path,
) -> None:
    save_block, restore_block = section_blocks("Backups")
    backup = tmp_path / "backup.rpsnap"
    job = "backed-up"
    with (
        running_cluster(tmp_path / "original", 3, tick_ms=50) as original,
        SyncClient(original.endpoints, timeout_s=20) as client,
    ):
        lease = client.grant_lease(600)
        client.put("leased/a", "with a lease", lease=lease.lease_id)
        run_job(client, job)
        load = Load(original.endpoints, "load")
        load.wait_for(60)
        acked_before = dict(load.acked)
        saved_outputs = run_block(
            save_block,
            shell_env(RALLYPOINT_ENDPOINTS=",".join(original.endpoints), BACKUP=str(backup)),
        )
        load.wait_for(len(acked_before) + 40)
        acked = load.stop()
        job_before = client.get_job(job)
        leases_before = {(i.lease_id, i.granted_ttl_s) for i in client.lease_list()}
    # The cluster is stopped: its members' logs are read offline below.
    status_output = saved_outputs[-1]
    checked = backup_file.read(str(backup))
    index = checked.header.index
    assert f"index {index}" in status_output, status_output
    _, saved = backup_file.decode(checked)
    # Consistent: every write acknowledged before the save began is in it; one at one index.
    assert all(revision <= index for revision in acked_before.values())
    keys = stored_keys(saved)
    for key, revision in acked.items():
        assert (key in keys) == (revision <= index), (key, revision, index)
    # Exactly the state the cluster's log gives at that index: every key, lease, session,
    # job and checkpoint record (a member whose log reaches it; all did, given the load).
    replayed = next(
        machine
        for member in original.members.values()
        if (machine := state_at(member.data_dir, index)) is not None
    )
    assert replayed.snapshot() == saved.snapshot()

    restored = ProcessCluster(tmp_path / "restored", 3, tick_ms=50)
    try:
        new_cluster = restored.initial_cluster()
        for member in restored.members.values():
            env = shell_env(
                BACKUP=str(backup),
                MEMBER_ID=str(member.member_id),
                DATA_DIR=str(member.data_dir),
                PEER=member.peer_address,
                CLIENT=member.client_address,
                NEW_CLUSTER=new_cluster,
                PEER_SECRET_FILE=str(restored.secret_path),
            )
            run_block(restore_block, env, member)
        restored.leader()
        with SyncClient(restored.endpoints, timeout_s=20) as client:
            assert served_keys(client) == keys
            assert {(i.lease_id, i.granted_ttl_s) for i in client.lease_list()} == leases_before
            job_after = client.get_job(job)
            assert job_after.latest_checkpoint == job_before.latest_checkpoint
            assert job_after.latest_checkpoint is not None
            assert job_after.latest_checkpoint.step == 7
            assert job_after.history == job_before.history
            assert job_after.round.round == job_before.round.round
            assert job_after.config == job_before.config
            # The new cluster goes on from the backup's index.
            assert client.put("after/restore", "1").kv.mod_revision > index
        statuses = [restored.status(i) for i in restored.members]
        assert all(s is not None for s in statuses)
    finally:
        restored.shutdown()


def test_a_survivor_forced_into_a_new_cluster_keeps_every_write_it_had_applied(
    tmp_path: Path,
) -> None:
    force_block, add_block, promote_block = section_blocks("Losing a majority")
    cluster = ProcessCluster(tmp_path, 3, tick_ms=50)
    cluster.start_all()
    try:
        leader = cluster.leader()
        survivor = next(i for i in cluster.members if i != leader)
        load = Load(cluster.endpoints, "load")
        load.wait_for(80)
        # Two members lost for good, under load (the leader among them), then the survivor
        # crashes too.
        for lost in (i for i in cluster.members if i != survivor):
            cluster.kill(lost)
        acked = load.stop()
        cluster.kill(survivor)
        member = cluster.members[survivor]
        # What it had applied is in its log (a member applies only entries it holds).
        storage = DiskStorage.open(str(member.data_dir / "raft"))
        try:
            commit = storage.hard_state.commit
            _, held = replay(storage, Limits())
        finally:
            storage.close()
        expected = stored_keys(held)
        assert all(key in expected for key, revision in acked.items() if revision <= commit)

        env = shell_env(
            MEMBER_ID=str(survivor),
            DATA_DIR=str(member.data_dir),
            PEER=member.peer_address,
            CLIENT=member.client_address,
            PEER_SECRET_FILE=str(cluster.secret_path),
            RALLYPOINT_ENDPOINTS=member.client_address,
        )
        run_block(force_block, env, member)
        assert cluster.leader(among=[survivor]) == survivor
        log = cluster.log_text(survivor)
        assert "FORCING A NEW CLUSTER" in log
        assert (member.data_dir / "raft.before-force-new-cluster-1").is_dir()
        with SyncClient([member.client_address], timeout_s=20) as client:
            assert served_keys(client) == expected

        added = []
        for _ in range(2):
            new = cluster.add_member_process()
            added.append(new.member_id)
            new_env = {
                **env,
                "NEW_ID": str(new.member_id),
                "NEW_PEER": new.peer_address,
                "NEW_CLIENT": new.client_address,
                "NEW_DATA_DIR": str(new.data_dir),
            }
            (printed,) = run_block(add_block, new_env, new)
            assert f"added member {new.member_id} as a learner" in printed, printed

            # Caught up (as `rallypoint status` would show): it applied the survivor's
            # commit index as of now; then the documented promote (retried should the
            # leader still find it short).
            target = wait_until(lambda: cluster.status(survivor), 10, "the survivor's status")
            wait_until(
                lambda new_id=new.member_id, commit=target.commit_index: (
                    (status := cluster.status(new_id)) is not None
                    and status.applied_index >= commit
                ),
                60,
                f"member {new.member_id} to catch up",
            )

            def promoted(new_env: dict[str, str] = new_env) -> bool:
                code, _, _ = run_command(commands(promote_block)[0], new_env)
                return code == 0

            wait_until(promoted, 60, f"member {new.member_id} promoted", interval_s=0.5)
        # Both added members applied the last promotion before the survivor goes: one that
        # has not yet learned it was committed still counts the old voters (the survivor
        # among them) and could never elect without it.
        promoted_at = wait_until(lambda: cluster.status(survivor), 10, "the survivor's status")
        for new_id in added:
            wait_until(
                lambda new_id=new_id, commit=promoted_at.commit_index: (
                    (status := cluster.status(new_id)) is not None
                    and status.applied_index >= commit
                ),
                60,
                f"member {new_id} to apply its promotion",
            )
        # The survivor goes too: the two added members are a majority of the three voters,
        # and serve every write the survivor had applied.
        cluster.kill(survivor)
        cluster.leader(among=added)
        with SyncClient([cluster.members[i].client_address for i in added], timeout_s=20) as client:
            assert served_keys(client) == expected
    finally:
        cluster.shutdown()


def test_force_new_cluster_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (A data dir with no cluster state, or another member's: tests/coordinator/
    # test_backup_file.py, on recovery.force_new_cluster itself.)
    secret = tmp_path / "secret"
    secret.write_text(os.urandom(32).hex())
    data_dir = tmp_path / "member-1"

    def serve(*flags: str, data_dir: Path = tmp_path / "empty") -> list[str]:
        return [
            *SERVE_COMMAND,
            "--member-id=1",
            f"--data-dir={data_dir}",
            f"--peer-secret-file={secret}",
            "--wal-segment-size=1MiB",
            "--peer-address=127.0.0.1:1",
            "--client-address=127.0.0.1:2",
            "--force-new-cluster",
            *flags,
        ]

    # Refused with the settings, before anything is opened.
    assert rallypoint_main(serve("--join")[len(SERVE_COMMAND) - 1 :]) == 2
    refusal = capsys.readouterr().err.strip().splitlines()
    assert len(refusal) == 1 and "cannot --join another" in refusal[0], refusal
    # A data dir of the cluster these flags name already: forcing it again is refused.
    members = {1: MemberAddress("127.0.0.1:1", "127.0.0.1:2")}
    checked = backup_file.parse(
        b"".join(backup_file.file_chunks(*backup_of_empty_state(), 1 << 20)), "b"
    )
    cluster_id = cluster_id_for(secret.read_text().strip().encode(), "same")
    restore(checked, str(data_dir), 1, members, cluster_id, segment_size_bytes=1 << 20)
    identity_before = (data_dir / "identity.json").read_bytes()
    line = refused_to_start(serve("--cluster-token=same", data_dir=data_dir))
    assert "--force-new-cluster needs a new cluster id" in line
    # Nothing changed but the lock the member took.
    assert sorted(os.listdir(data_dir)) == ["identity.json", "raft", "rallypoint.lock"]
    assert (data_dir / "identity.json").read_bytes() == identity_before


def backup_of_empty_state() -> tuple[backup_file.BackupHeader, bytes]:
    machine = StateMachine()
    machine.applied_index = 5
    payload = encode_app_snapshot(MemberTable({1: MemberAddress("h:1", "h:2")}), machine.snapshot())
    header = backup_file.BackupHeader(
        index=5,
        term=1,
        cluster_id=1,
        member_id=1,
        voters=(1,),
        learners=(),
        size_bytes=len(payload),
        sha256=hashlib.sha256(payload).digest(),
        created_ms=0,
    )
    return header, payload
