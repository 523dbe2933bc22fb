"""Per-job authorization with real members: three daemons started with ``--tokens-file``
(tick 50 ms), and the client library with tokens of each role.

Claims: a ``job:A`` token joins job A and uses its round store and checkpoint registry, and
is refused (PermissionDeniedError, naming its role) job B's round store, evicting in job B,
adding a member and a plain key-value write; a ``read`` token gets, ranges, watches and
asks for status but cannot put; the admin token can do all of it; no token or an unknown one
is UnauthenticatedError; SIGHUP reloads the tokens file on every member (a new token works
afterwards, a removed one is refused, a file that does not parse leaves the tokens as they
were); the example of docs/security.md runs as written.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rallypoint.client import (
    Client,
    JobConfig,
    Participant,
    PermissionDeniedError,
    RoundState,
    UnauthenticatedError,
)

from .harness import (
    ProcessCluster,
    free_ports,
    kill_processes_mentioning,
    running_cluster_with_tokens,
    wait_until,
    write_tokens_file,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
ADMIN, READ, JOB_A, JOB_B = "admin-secret", "read-secret", "job-a-secret", "job-b-secret"
SOLO = JobConfig(min_nodes=1, max_nodes=1, heartbeat_interval_ms=100, acceptable_pause_ms=500)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    roles = {ADMIN: "admin", READ: "read", JOB_A: "job:A", JOB_B: "job:B"}
    with running_cluster_with_tokens(tmp_path_factory.mktemp("authz-cluster"), roles) as running:
        yield running


@pytest.fixture
async def connect(cluster: ProcessCluster) -> AsyncIterator[object]:
    clients: list[Client] = []

    async def make(token: str | None) -> Client:
        client = Client(cluster.endpoints, token=token, timeout_s=10)
        clients.append(client)
        return await client.connect()

    yield make
    for client in clients:
        await client.close()


async def active(participant: Participant) -> int:
    """The round number once the participant's round is ACTIVE (min = max = 1)."""
    info = await participant.wait_for_round(timeout_s=20)
    assert info.state is RoundState.ACTIVE
    return info.round


async def test_a_job_token_works_in_its_job_and_is_refused_everything_else(
    connect: object,
) -> None:
    make = connect
    assert callable(make)
    admin, job_a, job_b = await make(ADMIN), await make(JOB_A), await make(JOB_B)
    worker_a = await job_a.join("A", "a0", config=SOLO)
    worker_b = await job_b.join("B", "b0", config=SOLO)
    round_a, round_b = await active(worker_a), await active(worker_b)
    store = worker_a.store()
    await store.set("addr", "10.0.0.7:29500")
    assert await store.get("addr") == b"10.0.0.7:29500"
    assert await store.add("count", 2) == 2
    begun = await worker_a.checkpoints().begin(step=10, world_size=1, uri="file:///ckpt/10")
    assert begun > 0
    assert (await job_a.get_job("A")).round.round == round_a

    other_store = job_a.round_store("B", round_b, worker_b.participant_id)
    refusals = {
        "take part in job 'B'": other_store.set("addr", "evil"),
        "read job 'B'": other_store.get("addr", wait=False),
        "configure job 'B' or evict its workers": job_a.evict("B", worker_b.participant_id),
        "change the cluster's membership": job_a.member_add(
            *[f"127.0.0.1:{port}" for port in free_ports(2)]
        ),
        "write keys or leases": job_a.put("config/lr", "1.0"),
    }
    for lacked, call in refusals.items():
        with pytest.raises(PermissionDeniedError) as refused:
            await call
        assert str(refused.value).startswith(f"permission denied: role 'job:A' may not {lacked}")
    # B's worker never noticed: its round is still the one it formed.
    assert (await job_b.get_job("B")).round.round == round_b
    assert not worker_b.lost.is_set()
    assert await admin.get("config/lr") is None

    # Admin may do everything the job's token may not.
    await admin.put("config/lr", "0.1")
    peer, client_address = (f"127.0.0.1:{port}" for port in free_ports(2))
    added, _ = await admin.member_add(peer, client_address, as_learner=True)
    await admin.member_remove(added.member_id)
    await admin.evict("B", worker_b.participant_id)
    await asyncio.wait_for(worker_b.lost.wait(), 10)
    await worker_a.leave()


async def test_a_read_token_reads_and_cannot_write(connect: object) -> None:
    make = connect
    assert callable(make)
    admin, read = await make(ADMIN), await make(READ)
    written = await admin.put("jobs/A/owner", "alice")
    assert (await read.get("jobs/A/owner")).value == b"alice"  # type: ignore[union-attr]
    assert [kv.key for kv in (await read.range("jobs/")).kvs] == [b"jobs/A/owner"]
    assert all(status.error is None for status in await read.status())
    await read.list_jobs()
    watcher = read.watch("jobs/", prefix=True, start_revision=written.kv.mod_revision)
    event = await asyncio.wait_for(anext(aiter(watcher)), 10)
    assert event.kv.key == b"jobs/A/owner"
    await watcher.aclose()
    with pytest.raises(PermissionDeniedError, match="role 'read' may not write keys or leases"):
        await read.put("jobs/A/owner", "mallory")
    assert (await admin.get("jobs/A/owner")).value == b"alice"  # type: ignore[union-attr]


async def test_no_token_or_an_unknown_one_is_unauthenticated(cluster: ProcessCluster) -> None:
    # The message names the member, which of the two it was, and how to pass a token.
    words = {
        None: "requires a token and none was sent: pass one with Client(..., token=...) or "
        "$RALLYPOINT_TOKEN",
        "guess": "refused the token: the cluster does not know it (check the token given "
        "with Client(..., token=...) or $RALLYPOINT_TOKEN)",
    }
    for token, said in words.items():
        client = Client(cluster.endpoints, token=token, timeout_s=5, open_session_on_connect=False)
        try:
            with pytest.raises(UnauthenticatedError) as refused:
                await client.get("config/lr")
            assert str(refused.value) == f"{refused.value.endpoint} {said}"
            assert refused.value.endpoint in cluster.endpoints
        finally:
            await client.close()


ELASTIC = """
import torch
from rallypoint.worker import TrainState, elastic_training

model = torch.nn.Linear(2, 1)
state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
with elastic_training({endpoints!r}, job="A", name="w", min_nodes=1, max_nodes=1,
                      max_steps=1, checkpoint_dir="ck", state=state, {token}) as run:
    pass
"""


@pytest.mark.parametrize("token", ["wrong", None])
def test_a_refused_token_is_one_line_in_each_interface(
    cluster: ProcessCluster, tmp_path: Path, token: str | None
) -> None:
    """The CLI, ``rallypoint status`` and ``elastic_training`` each say it in one line with
    their own ways to pass a token (elastic_training's was a 55-line traceback)."""
    env = {k: v for k, v in os.environ.items() if k != "RALLYPOINT_TOKEN"}
    endpoint = cluster.endpoints[0]
    if token is None:
        said = "requires a token and none was sent: pass one with {how}"
    else:
        said = "refused the token: the cluster does not know it (check the token given with {how})"
    token_args = ["--token", token] if token else []
    for command, how in (
        (["kv", "get", "x"], "--token or $RALLYPOINT_TOKEN"),
        (["status"], "--token or $RALLYPOINT_TOKEN"),
    ):
        done = subprocess.run(
            [str(ROOT / ".venv/bin/rallypoint"), *command, "--endpoints", endpoint, *token_args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 1, done
        kind = "UnauthenticatedError: " if command[0] == "kv" else ""
        assert done.stderr == f"error: {kind}{endpoint} {said.format(how=how)}\n", done.stderr
    script = tmp_path / "train.py"
    script.write_text(ELASTIC.format(endpoints=endpoint, token=f"token={token!r}" if token else ""))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1, done
    how = "elastic_training(token=...) or $RALLYPOINT_TOKEN"
    assert done.stderr == f"rallypoint: {endpoint} {said.format(how=how)}\n", done.stderr


def _reloads(cluster: ProcessCluster, member_id: int, word: str) -> int:
    return len(re.findall(rf"SIGHUP: tokens file \S+ {word}", cluster.log_text(member_id)))


def sighup_all(cluster: ProcessCluster, word: str) -> None:
    """SIGHUP every member, and wait until each logged its reload ("reloaded" or "not")."""
    before = {i: _reloads(cluster, i, word) for i in cluster.members}
    for member in cluster.members.values():
        assert member.proc is not None
        member.proc.send_signal(signal.SIGHUP)
    for member_id, seen in before.items():
        wait_until(
            lambda i=member_id, n=seen: _reloads(cluster, i, word) > n,
            10,
            f"member {member_id} to log a tokens reload",
        )


async def test_sighup_reloads_the_tokens_file_on_every_member(
    cluster: ProcessCluster, connect: object
) -> None:
    make = connect
    assert callable(make)
    path = cluster.root / "tokens.toml"
    original = path.read_text()
    try:
        # A file that does not parse: every member logs it and keeps its tokens.
        path.write_text("[[token]\n")
        sighup_all(cluster, "not reloaded")
        assert await (await make(JOB_A)).get_job("A") is not None
        # JOB_A is removed, a new job:A token and a read token added.
        write_tokens_file(path, {ADMIN: "admin", READ: "read", "job-a-rotated": "job:A"})
        sighup_all(cluster, "reloaded")
        with pytest.raises(UnauthenticatedError):
            await (await make(None)).get_job("A")
        old = Client(cluster.endpoints, token=JOB_A, timeout_s=5)
        try:
            with pytest.raises(UnauthenticatedError):
                await old.connect()
        finally:
            await old.close()
        rotated = await make("job-a-rotated")
        worker = await rotated.join("A", "a-rotated", config=SOLO)
        await active(worker)
        await worker.store().set("k", "v")
        await worker.leave()
        assert all(m.running for m in cluster.members.values())
    finally:
        path.write_text(original)
        sighup_all(cluster, "reloaded")


def test_the_security_page_example_runs_as_written(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "security.md").read_text()
    section = page[page.index("## Client tokens and roles") :]
    start = section.index("```sh\n") + len("```sh\n")
    script = section[start : section.index("```\n", start)]
    client_port, peer_port = free_ports(2)
    script = script.replace("2379", str(client_port)).replace("2380", str(peer_port))
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=90,
            env=dict(os.environ, TMPDIR=str(tmp_path)),
        )
    finally:
        kill_processes_mentioning(f"127.0.0.1:{client_port}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert done.stdout.count("refused, as it should be") == 2, output
    assert "hello" in done.stdout, output
    assert "role 'read' may not write keys or leases" in done.stderr, output
    assert "SIGHUP: tokens file tokens.toml reloaded: 3 tokens (admin 1, job 1, read 1)" in output
