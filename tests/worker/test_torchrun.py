"""``torchrun --rdzv-backend=rallypoint`` against a real 3-member cluster on loopback.

Two torchrun agents on this host, two workers each, run ``torchrun_script.py`` (gloo
all-reduces, checked). Claims: the job completes with 4 ranks, each agent's workers reading
their store from their own agent; a SIGKILLed worker restarts both groups in a new round
(new store address) and the job completes at 4; a SIGKILLed agent leaves the other one
finishing at 2 ranks (``--nnodes=1:2``); the coordinator leader killed with -9 mid-job
changes nothing (one round, no restart); against members that require tokens, an agent
with its job's token (``--rdzv-conf token=...``, which wins over ``RALLYPOINT_TOKEN``)
completes, and one with another job's token is refused. The handler's settings and the
TCPStore bridge are also checked against torch's own TCPStore client.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch.distributed as dist
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from rallypoint.client import JobConfig, SyncClient
from rallypoint.worker.tcpstore import NoFreePortError, PortRange, TCPStoreBridge
from rallypoint.worker.torchrun import (
    RallypointRendezvousHandler,
    RendezvousSettings,
    RendezvousSettingsError,
    create_handler,
)
from tests.integration.harness import (
    ProcessCluster,
    free_port_block,
    kill_processes_mentioning,
    logged_coordinator_wait_s,
    running_cluster,
    running_cluster_with_tokens,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SCRIPT = Path(__file__).with_name("torchrun_script.py")
Event = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("torchrun-cluster")) as cluster:
        yield cluster


class TorchrunJob:
    """Two torchrun agents of one job, and the events their workers write."""

    def __init__(
        self,
        endpoints: list[str],
        job: str,
        out: Path,
        *,
        nnodes: str = "2",
        steps: int = 30,
        agents: int = 2,
        max_restarts: int = 3,
        rdzv_conf: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            "--nproc-per-node=2",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.1",
            "--rdzv-backend=rallypoint",
            f"--rdzv-endpoint={','.join(endpoints)}",
            f"--rdzv-id={job}",
            f"--rdzv-conf=last_call_timeout=0.5,read_timeout=60{rdzv_conf}",
            str(SCRIPT),
            f"--out={out}",
            f"--steps={steps}",
        ]
        self.logs = [out / f"agent-{i}.log" for i in range(agents)]
        self.agents = []
        for log_path in self.logs:
            with open(log_path, "w") as log:
                self.agents.append(
                    subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env={**os.environ, **(env or {})},
                    )
                )

    def events(self, event: str | None = None) -> list[Event]:
        found: list[Event] = []
        for path in self.out.glob("events-*.jsonl"):
            found += [json.loads(line) for line in path.read_text().splitlines() if line]
        return sorted(
            (e for e in found if event in (None, e["event"])), key=lambda e: float(e["t"])
        )

    def check_agents_running(self) -> None:
        for agent, log in zip(self.agents, self.logs, strict=True):
            if agent.poll() is not None:
                raise AssertionError(f"agent exited early:\n{log.read_text()[-3000:]}")

    def wait_for_step(self, step: int, timeout_s: float = 60) -> list[Event]:
        def reached() -> list[Event]:
            self.check_agents_running()
            return [e for e in self.events("step") if e["step"] >= step]

        return wait_until(reached, timeout_s, f"a worker at step {step}")

    def wait_for_new_workers(
        self, old: set[int], count: int, step: int, timeout_s: float = 60
    ) -> list[Event]:
        """The ``started`` events of ``count`` workers not in ``old``, once each is past
        ``step``; every agent must stay up meanwhile."""

        def running() -> list[Event] | None:
            self.check_agents_running()
            started = [e for e in self.events("started") if e["pid"] not in old]
            stepped = {e["pid"] for e in self.events("step") if e["step"] >= step}
            if len(started) >= count and {e["pid"] for e in started} <= stepped:
                return started
            return None

        return wait_until(running, timeout_s, f"{count} new workers past step {step}")

    def finish(self, agents: list[int] | None = None, timeout_s: float = 90) -> None:
        for index in agents if agents is not None else range(len(self.agents)):
            code = self.agents[index].wait(timeout=timeout_s)
            assert code == 0, (
                f"agent {index} exited {code}:\n{self.logs[index].read_text()[-4000:]}"
            )

    def kill_all(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        kill_processes_mentioning(f"--out={self.out}")  # workers live in sessions of their own


@pytest.fixture
def jobs() -> Iterator[list[TorchrunJob]]:
    started: list[TorchrunJob] = []
    yield started
    for job in started:
        job.kill_all()


def done_by_pid(job: TorchrunJob) -> dict[int, Event]:
    return {e["pid"]: e for e in job.events("done")}


def test_two_agents_complete_with_per_agent_stores(
    cluster: ProcessCluster, jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    job = TorchrunJob(cluster.endpoints, "plain", tmp_path)
    jobs.append(job)
    job.finish()
    started = job.events("started")
    assert sorted(e["rank"] for e in started) == [0, 1, 2, 3]
    assert {e["world_size"] for e in started} == {4}
    # Each agent gives its own two workers its own bridge: two addresses, two workers each.
    masters = [e["master"] for e in started]
    assert sorted(masters.count(m) for m in set(masters)) == [2, 2]
    assert len(done_by_pid(job)) == 4


def test_killed_worker_restarts_both_groups_in_a_new_round(
    cluster: ProcessCluster, jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    job = TorchrunJob(cluster.endpoints, "worker-kill", tmp_path, steps=40)
    jobs.append(job)
    job.wait_for_step(3)
    first = job.events("started")
    victim = next(e for e in first if e["rank"] == 1)
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    job.finish()
    later = [e for e in job.events("started") if e["t"] > killed_at]
    assert sorted(e["rank"] for e in later) == [0, 1, 2, 3], later
    # The new round's store is served on new ports: no worker reads the old addresses.
    assert not {e["master"] for e in later} & {e["master"] for e in first}
    done = done_by_pid(job)
    assert sorted(done) == sorted(e["pid"] for e in later)
    first_steps = [min(e["t"] for e in job.events("step") if e["pid"] == s["pid"]) for s in later]
    print(
        f"\nSIGKILL of a worker -> every new worker's first all_reduce: "
        f"{max(first_steps) - killed_at:.2f} s"
    )


def test_each_killed_worker_is_one_round_change_and_every_agent_stays_up(
    cluster: ProcessCluster, jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    """``--nnodes=1:3`` (the job scales up, so a waiter ends a round below max): a SIGKILLed
    worker of agent B, again and again. Each kill must cost one round change and bring all
    four ranks back, B included. B used to join under its new name (a scale-up: one round
    change), return that round, then leave under its old name (a second round change), and
    fail with StaleStoreRoundError in its rank assignment (2 of 3 kills in the report)."""
    kills = 4
    job_id = "worker-kill-elastic"
    job = TorchrunJob(
        cluster.endpoints, job_id, tmp_path, nnodes="1:3", steps=100_000, max_restarts=kills + 1
    )
    jobs.append(job)
    agent_b = job.agents[1].pid
    workers = job.wait_for_new_workers(set(), 4, step=3)
    with SyncClient(cluster.endpoints) as client:
        for kill in range(kills):
            assert sorted(e["rank"] for e in workers) == [0, 1, 2, 3], workers
            assert {e["world_size"] for e in workers} == {4}, workers
            before = client.get_job(job_id).round.round
            victim = next(e for e in workers if e["agent"] == agent_b)
            old = {e["pid"] for e in job.events("started")}
            os.kill(victim["pid"], signal.SIGKILL)
            workers = job.wait_for_new_workers(old, 4, step=3)
            after = client.get_job(job_id).round
            assert (after.round, after.world_size) == (before + 1, 2), (
                f"kill {kill}: rounds {before} -> {after.round}, world {after.world_size}"
            )
        assert sorted(e["rank"] for e in workers) == [0, 1, 2, 3], workers
        assert {e["world_size"] for e in workers} == {4}, workers
        assert {e["agent"] for e in workers} == {p.pid for p in job.agents}


def test_a_round_ending_during_the_rank_assignment_sends_the_agents_back_to_rendezvous(
    cluster: ProcessCluster,
) -> None:
    """Two handlers (two agents) return round R; a third node joins before torch's agents
    assign their workers' ranks in R's store, so R ends (a scale-up) under their feet. torch's
    own ``_assign_worker_ranks`` must not raise (it used to: StaleStoreRoundError, the agent
    out with a traceback); each handler then reports nodes waiting, so the agent restarts
    its workers, and ``next_rendezvous`` returns the round with all three nodes."""
    job_id = "assign-ranks-round-ends"

    def handler(node: str) -> RallypointRendezvousHandler:
        params = RendezvousParameters(
            "rallypoint",
            ",".join(cluster.endpoints),
            job_id,
            2,
            3,
            local_addr=node,
            last_call_timeout=0,
        )
        made = get_rendezvous_handler(params)
        assert isinstance(made, RallypointRendezvousHandler)
        return made

    def both(call: Any) -> list[Any]:
        results: list[Any] = [None, None]
        errors: list[BaseException] = []

        def run(index: int) -> None:
            try:
                results[index] = call(agents[index])
            except BaseException as error:  # handed to the test's thread
                errors.append(error)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        return results

    agents = [handler("node-a"), handler("node-b")]
    spec = SimpleNamespace(role="trainer", local_world_size=2)
    try:
        first = both(lambda h: h.next_rendezvous())
        assert sorted(info.rank for info in first) == [0, 1]
        with SyncClient(cluster.endpoints) as client:
            round_before = client.get_job(job_id).round.round
            third = client.join(job_id, "node-c")
            try:
                assert client.get_job(job_id).round.round == round_before + 1  # R ended
                for info in first:
                    workers = SimpleElasticAgent._assign_worker_ranks(
                        cast(Any, None), info.store, info.rank, info.world_size, spec
                    )
                    base = info.rank * 2
                    assert [w.global_rank for w in workers] == [base, base + 1]
                assert [h.num_nodes_waiting() for h in agents] == [1, 1]
                second = both(lambda h: h.next_rendezvous())
                assert {info.world_size for info in second} == {3}
                assert sorted(info.rank for info in second) == [0, 1]
                for info in second:  # the new round's store serves the agents
                    info.store.set(f"k{info.rank}", b"v")
                    assert info.store.get(f"k{info.rank}") == b"v"
                assert [h.num_nodes_waiting() for h in agents] == [0, 0]
            finally:
                third.leave()
    finally:
        for agent in agents:
            agent.shutdown()


def test_killed_agent_leaves_the_other_running_at_half_size(
    cluster: ProcessCluster, jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    job = TorchrunJob(cluster.endpoints, "agent-kill", tmp_path, nnodes="1:2", steps=40)
    jobs.append(job)
    job.wait_for_step(3)
    assert {e["world_size"] for e in job.events("started")} == {4}
    killed_at = time.time()
    os.killpg(job.agents[1].pid, signal.SIGKILL)  # the agent and its workers: a node lost
    job.agents[1].wait()
    job.finish([0])
    later = [e for e in job.events("started") if e["t"] > killed_at]
    assert sorted(e["rank"] for e in later) == [0, 1], later
    assert {e["world_size"] for e in later} == {2}
    assert sorted(done_by_pid(job)) == sorted(e["pid"] for e in later)


def exited(pid: int) -> bool:
    """The process is gone or a zombie (its parent, stopped, has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.parametrize(("nnodes", "worker_sets"), [("2", 2), ("1:2", 3)])
def test_paused_agent_rejoins_and_the_job_completes_at_full_size(
    cluster: ProcessCluster,
    jobs: list[TorchrunJob],
    tmp_path: Path,
    nnodes: str,
    worker_sets: int,
) -> None:
    """An agent SIGSTOPped past its failure detection and resumed rejoins as a newcomer: the
    job finishes at 4 ranks. The healthy agent restarts its workers once when the paused
    one is lost and, with ``--nnodes=1:2`` (it trains alone meanwhile), once more to admit
    it back."""
    job_id = f"agent-pause-{nnodes.replace(':', '-')}"
    job = TorchrunJob(cluster.endpoints, job_id, tmp_path, nnodes=nnodes, steps=80)
    jobs.append(job)
    job.wait_for_step(3)
    healthy, paused = job.agents
    first_workers = [e["pid"] for e in job.events("started")]
    with SyncClient(cluster.endpoints) as client:
        first_round = client.get_job(job_id).round.round
        # Only the agent stops: its workers run on (torchrun starts them in sessions of
        # their own) until the healthy agent's restart breaks their collectives.
        paused.send_signal(signal.SIGSTOP)
        try:
            # Past its detection: the coordinator ended the round the agent was in, the
            # healthy agent stopped its workers, and the paused agent's workers failed.
            wait_until(
                lambda: client.get_job(job_id).round.round > first_round,
                30,
                "the paused agent declared failed",
            )
            wait_until(lambda: all(map(exited, first_workers)), 30, "the first workers' end")
            if worker_sets == 3:
                wait_until(
                    lambda: [e for e in job.events("step") if e["world_size"] == 2],
                    30,
                    "the healthy agent's workers training alone",
                )
        finally:
            paused.send_signal(signal.SIGCONT)
    job.finish()
    done = job.events("done")
    assert sorted(e["rank"] for e in done) == [0, 1, 2, 3], done
    finishers = {e["pid"] for e in done}
    assert {e["world_size"] for e in job.events("started") if e["pid"] in finishers} == {4}
    # Each set of the healthy node's workers reads its own round's store address.
    sets = {e["master"] for e in job.events("started") if e["agent"] == healthy.pid}
    assert len(sets) == worker_sets, job.events("started")


def test_coordinator_leader_killed_mid_job_changes_nothing(
    cluster: ProcessCluster, jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    job = TorchrunJob(cluster.endpoints, "leader-kill", tmp_path, steps=60)
    jobs.append(job)
    job.wait_for_step(3)
    leader = cluster.leader()
    cluster.kill(leader)
    try:
        job.finish()
    finally:
        cluster.start(leader)
    started = job.events("started")
    assert len(started) == 4, started  # one set of workers: no restart, no new round
    assert {e["restart"] for e in started} == {0}
    assert len(done_by_pid(job)) == 4


def test_master_port_range_holds_the_workers_store_ports(
    cluster: ProcessCluster, jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    low = free_port_block(4)
    job = TorchrunJob(
        cluster.endpoints,
        "port-range",
        tmp_path,
        steps=5,
        rdzv_conf=f",master_port_range={low}-{low + 3}",
    )
    jobs.append(job)
    job.finish()
    masters = [e["master"] for e in job.events("started")]
    assert len(masters) == 4
    assert {int(m.rsplit(":", 1)[1]) for m in masters} <= set(range(low, low + 4)), masters


def test_a_job_token_in_rdzv_conf_is_all_an_agent_needs(
    jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    tokens = {"admin-secret": "admin", "tr-secret": "job:tr", "other-secret": "job:other"}
    with running_cluster_with_tokens(tmp_path / "cluster", tokens, size=1) as cluster:
        # The explicit token wins over the environment's (another job's, here).
        wrong_env = {"RALLYPOINT_TOKEN": "other-secret"}
        job = TorchrunJob(
            cluster.endpoints,
            "tr",
            tmp_path / "tr",
            nnodes="1",
            steps=5,
            agents=1,
            rdzv_conf=",token=tr-secret",
            env=wrong_env,
        )
        intruder = TorchrunJob(
            cluster.endpoints, "tr", tmp_path / "intruder", nnodes="1", agents=1, env=wrong_env
        )
        jobs.extend([job, intruder])
        job.finish()
        assert len(done_by_pid(job)) == 2
        assert intruder.agents[0].wait(timeout=90) != 0
        log = intruder.logs[0].read_text()
        assert "permission denied: role 'job:other' may not take part in job 'tr'" in log, log[
            -3000:
        ]
        # A wrong token, or none: one line naming the member and the agent's ways to pass
        # one (it was 96 lines: two tracebacks and torch's error summary).
        refused = {
            "wrong": (
                "wrong",
                "refused the token: the cluster does not know it (check the token given with",
            ),
            "none": ("", "requires a token and none was sent: pass one with"),
        }
        agents = {
            case: TorchrunJob(
                cluster.endpoints,
                "tr",
                tmp_path / f"token-{case}",
                nnodes="1",
                agents=1,
                rdzv_conf=f",token={token}" if token else "",
                env={"RALLYPOINT_TOKEN": ""},
            )
            for case, (token, _) in refused.items()
        }
        jobs.extend(agents.values())
        for case, (_, words) in refused.items():
            agent = agents[case]
            assert agent.agents[0].wait(timeout=90) == 1
            log = agent.logs[0].read_text()
            assert "Traceback" not in log, log[-3000:]
            assert log.strip().splitlines()[-1] == (
                f"rallypoint: {cluster.endpoints[0]} {words} --rdzv-conf token=... or "
                "$RALLYPOINT_TOKEN" + (")" if case == "wrong" else "")
            ), log[-3000:]


def test_agents_started_before_the_coordinator_wait_for_it(
    jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    """The coordinator down for 10 s at launch, over three times a client's deadline (3 s
    here, ``client_timeout``; joining used to give up after one): the agents wait (saying so
    in their logs, every 10 s) and the job runs once the members are up."""
    cluster = ProcessCluster(tmp_path / "cluster")
    try:
        job = TorchrunJob(
            cluster.endpoints, "late", tmp_path / "job", steps=10, rdzv_conf=",client_timeout=3"
        )
        jobs.append(job)
        for agent, log in zip(job.agents, job.logs, strict=True):
            wait_until(
                lambda a=agent, p=log: (
                    a.poll() is None and logged_coordinator_wait_s(p.read_text()) >= 10
                ),
                90,
                "an agent waiting 10 s for the coordinator",
            )
        cluster.start_all()
        started_at = time.time()
        cluster.leader()
        leader_at = time.time()
        job.finish()
    finally:
        cluster.shutdown()
    assert sorted(e["rank"] for e in job.events("done")) == [0, 1, 2, 3]
    for log in job.logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    first_step = min(e["t"] for e in job.events("step"))
    print(
        f"\ncoordinator started -> leader {leader_at - started_at:.2f} s -> first all_reduce "
        f"{first_step - leader_at:.2f} s later"
    )


def test_an_agent_that_never_reaches_the_coordinator_ends_with_one_line(
    jobs: list[TorchrunJob], tmp_path: Path
) -> None:
    nobody = ProcessCluster(tmp_path / "never-started", size=1)
    job = TorchrunJob(
        nobody.endpoints, "alone", tmp_path, nnodes="1", agents=1, rdzv_conf=",connect_timeout=3"
    )
    jobs.append(job)
    assert job.agents[0].wait(timeout=60) == 1
    log = job.logs[0].read_text()
    assert "Traceback" not in log, log
    last = log.strip().splitlines()[-1]
    assert last.startswith("rallypoint: job 'alone': gave up joining after 3 s: "), log
    assert f"no member answered at {nobody.endpoints[0]}; check that the members" in last


# ------------------------------------------------------------------ the pieces


def test_torchrun_finds_the_backend_and_reads_its_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RALLYPOINT_TOKEN", raising=False)
    params = RendezvousParameters(
        backend="rallypoint",
        endpoint="a:1, b:2,c:3",
        run_id="job-1",
        min_nodes=1,
        max_nodes=4,
        local_addr="node-7",
        timeout=120,
        last_call_timeout="2.5",
        heartbeat_interval="0.2",
        keep_alive_interval=5,
    )
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, RallypointRendezvousHandler)
    assert handler.use_agent_store is True
    settings = handler.settings
    assert settings.endpoints == ("a:1", "b:2", "c:3")
    assert (settings.join_timeout_s, settings.last_call_s) == (120.0, 2.5)
    config = settings.job_config()
    assert (config.min_nodes, config.max_nodes, config.heartbeat_interval_ms) == (1, 4, 200)
    assert config.scale_up is True
    assert settings.token is None
    # The node's failure domain: its --local-addr (or host name) unless --rdzv-conf says.
    assert settings.failure_domain == "node-7"
    racked = RendezvousParameters("rallypoint", "a:1", "j", 1, 1, domain="rack-3/host-9")
    assert RendezvousSettings.from_parameters(racked).failure_domain == "rack-3/host-9"
    none = RendezvousParameters("rallypoint", "a:1", "j", 1, 1, local_addr="n", domain="")
    assert RendezvousSettings.from_parameters(none).failure_domain == ""
    with pytest.raises(ValueError, match="at most 256 characters"):
        RendezvousSettings.from_parameters(
            RendezvousParameters("rallypoint", "a:1", "j", 1, 1, domain="h" * 257)
        )
    with_token = RendezvousParameters("rallypoint", "a:1", "j", 1, 1, token="job-secret")
    assert RendezvousSettings.from_parameters(with_token).token == "job-secret"
    with pytest.raises(ValueError, match="job id"):
        RendezvousSettings.from_parameters(
            RendezvousParameters("rallypoint", "a:1", "bad id!", 1, 1)
        )
    with pytest.raises(ValueError, match="seconds"):
        RendezvousSettings.from_parameters(
            RendezvousParameters("rallypoint", "a:1", "j", 1, 1, timeout="soon")
        )
    # An endpoint without a port is refused with the settings, in one line, before any call
    # (it was a traceback from the agent's first call, then another from torch's launcher).
    for endpoint in ("localhost", "a:1,localhost", "a:99999"):
        with pytest.raises(ValueError, match=f"^--rdzv-endpoint={endpoint}: ") as refused:
            RendezvousSettings.from_parameters(
                RendezvousParameters("rallypoint", endpoint, "j", 1, 1)
            )
        assert "\n" not in str(refused.value)
    with pytest.raises(RendezvousSettingsError, match="'localhost' has no port"):
        create_handler(RendezvousParameters("rallypoint", "localhost", "j", 1, 1))
    # connect_timeout follows the rendezvous timeout unless set.
    assert settings.connect_timeout_s == 120.0
    assert settings.master_port_range is None
    tuned = RendezvousParameters(
        "rallypoint",
        "a:1",
        "j",
        1,
        1,
        connect_timeout="30",
        master_port_range="29500-29599",
    )
    tuned_settings = RendezvousSettings.from_parameters(tuned)
    assert tuned_settings.connect_timeout_s == 30.0
    assert tuned_settings.master_port_range == PortRange(29500, 29599)
    for bad in ("29599-29500", "0-10", "29500-70000", "29500:29599", "many"):
        with pytest.raises(ValueError, match=r"master_port_range=.*expected LOW-HIGH") as raised:
            RendezvousSettings.from_parameters(
                RendezvousParameters("rallypoint", "a:1", "j", 1, 1, master_port_range=bad)
            )
        assert "\n" not in str(raised.value)
    for key, bad in (("connect_timeout", "0"), ("connect_timeout", "nan"), ("timeout", "-1")):
        with pytest.raises(ValueError, match=f"--rdzv-conf {key}="):
            RendezvousSettings.from_parameters(
                RendezvousParameters("rallypoint", "a:1", "j", 1, 1, **{key: bad})
            )
    # Without token= in --rdzv-conf, the environment's.
    monkeypatch.setenv("RALLYPOINT_TOKEN", "from-environment")
    plain = RendezvousParameters("rallypoint", "a:1", "j", 1, 1)
    assert RendezvousSettings.from_parameters(plain).token == "from-environment"
    assert RendezvousSettings.from_parameters(with_token).token == "job-secret"


def test_bridge_serves_torch_tcpstore_clients_for_one_round_at_a_time(
    cluster: ProcessCluster,
) -> None:
    with SyncClient(cluster.endpoints) as client:
        participant = client.join("bridge", "solo", config=JobConfig(min_nodes=1, max_nodes=1))
        info = participant.wait_for_round(timeout_s=30)
        bridge = TCPStoreBridge(cluster.endpoints)
        try:
            port = bridge.serve_round("bridge", info.round, participant.participant_id)
            timeout = timedelta(seconds=20)
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
            other = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
            store.set("key", b"value")
            assert other.get("key") == b"value"
            assert (store.add("n", 3), other.add("n", 2)) == (3, 5)
            assert store.check(["key"]) and not store.check(["absent"])
            assert store.compare_set("cas", b"", b"1") == b"1"
            assert store.compare_set("cas", b"x", b"2") == b"1"
            assert store.compare_set("absent", b"x", b"2") == b"x"
            store.multi_set(["a", "b"], [b"1", b"2"])
            assert other.multi_get(["a", "b"]) == [b"1", b"2"]
            # An append has no answer: two clients' appends sent back to back have no order,
            # not even through torch's own server (measured: "yx" 15 times in 300), so the
            # second client appends once the first's append is seen.
            store.append("log", b"x")
            assert other.get("log") == b"x"
            other.append("log", b"y")
            assert store.get("log") == b"xy"
            assert store.delete_key("a") and not store.delete_key("a")
            # A get blocks until another client sets the key.
            setter = threading.Timer(0.5, lambda: other.set("late", b"L"))
            setter.start()
            assert store.get("late") == b"L"
            # A wait that times out is cancelled, and the connection goes on.
            with pytest.raises(dist.DistStoreError):
                store.wait(["never"], timedelta(seconds=0.5))
            store.set("after", b"ok")
            assert store.get("after") == b"ok"
            assert store.num_keys() == other.num_keys() > 0
            # The round's store is the coordinator's: visible through the client library
            # (torch's TCPStore client puts "/" before every key).
            assert participant.store().get("/key", wait=False) == b"value"
            # Once the round ends, the workers' store calls fail at once.
            participant.leave()
            with pytest.raises(dist.DistError):
                store.add("zombie", 1)
        finally:
            bridge.close()


def test_bridge_takes_its_ports_from_the_range_and_says_when_none_is_free() -> None:
    low = free_port_block(2)
    # Nothing here reaches the coordinator: a bridge opens its session with the first call.
    bridge = TCPStoreBridge(["127.0.0.1:1"], port_range=PortRange(low, low + 1))
    try:
        ports = [bridge.serve_round("j", round_number, 1) for round_number in range(1, 5)]
        # Both ports of the range, a round never on the port of the one before.
        assert set(ports) == {low, low + 1}
        assert all(a != b for a, b in itertools.pairwise(ports)), ports
    finally:
        bridge.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", low))
        taken.listen()
        crowded = TCPStoreBridge(["127.0.0.1:1"], port_range=PortRange(low, low))
        try:
            with pytest.raises(NoFreePortError, match=f"in {low}-{low}: all 1 are in use"):
                crowded.serve_round("j", 1, 1)
        finally:
            crowded.close()
