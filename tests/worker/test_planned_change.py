"""A planned round change costs no step: real coordinator members, real worker processes.

Claims:
- two workers train; a third joins and scales the job up: the two survivors finish the step
  in flight, stop after the same step (``round_ending``, then ``round_ended`` with a planned
  reason), abandon no step, and the three go on at world 3. The set-up makes a survivor wait
  inside the gradient all-reduce almost all the time (its peer sleeps after each step), so
  ending the round at once, as a loss does, would abandon that step and leave the two
  survivors a step apart;
- an operator drains a host (2 of 4 workers) while the job trains: every worker finishes the
  step in flight and stops after the same one (none abandons a step), the other host's two
  go on at world 2 restored by KEEP from that very step, the drained host's workers wait and
  train in no round until it is undrained, when the four train again;
- the same drain of a sharded job (dp=2 x tp=2 mesh, FSDP2 and tensor parallel): its model
  is rebuilt for the new mesh and restored from memory, from a final snapshot of the agreed
  step that the drained round registers before its ranks leave it: no step lost;
- ``joining.is_planned`` tells a planned change from a loss: a member missing from the next
  round (failed, left, evicted) is a loss; a member moved to the wait list, or newcomers, are
  not.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rallypoint.client import JobState, RoundInfo, RoundMember, RoundState, SyncClient
from rallypoint.worker.joining import is_planned
from tests.integration.harness import ProcessCluster
from tests.worker.test_elastic import CHANGE_S, START_S, Job, cluster
from tests.worker.test_mesh_elastic import HOSTS, start_mesh_job

__all__ = ["cluster"]


def _member(pid: int) -> RoundMember:
    return RoundMember(participant_id=pid, name=f"w{pid}", rank=-1, metadata=b"", phi=0.0)


def _info(
    number: int,
    members: list[int],
    waiting: tuple[int, ...] = (),
    job_closed: bool = False,
    job_state: JobState = JobState.OPEN,
) -> RoundInfo:
    return RoundInfo(
        job="j",
        round=number,
        state=RoundState.JOINING,
        members=tuple(_member(pid) for pid in members),
        world_size=0,
        fencing_token=0,
        store_namespace=f"j/{number}",
        reason="",
        waiting=tuple(_member(pid) for pid in waiting),
        opened_ms=0,
        closed_ms=0,
        job_closed=job_closed,
        job_revision=number,
        job_state=job_state,
    )


def test_is_planned_tells_a_planned_change_from_a_loss() -> None:
    current = _info(3, [10, 11, 12])
    assert is_planned(_info(4, [10, 11, 12, 13]), current)  # a scale-up
    assert is_planned(_info(4, [10, 12], waiting=(11,)), current)  # 11 drained: waits
    assert not is_planned(_info(4, [10, 12]), current)  # 11 failed, left or was evicted
    assert not is_planned(_info(3, [10, 11, 12]), current)  # not a later round
    assert not is_planned(_info(4, [10, 11, 12], job_closed=True), current)
    assert not is_planned(_info(4, [10, 11, 12], job_state=JobState.FINISHED), current)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_scale_up_loses_no_step(cluster: ProcessCluster, tmp_path: Path) -> None:
    job = Job(
        cluster,
        tmp_path,
        "planned",
        "--min-nodes=2",
        "--max-nodes=3",
        "--checkpoint-every=0",
        "--max-steps=400",
    )
    try:
        fast = job.spawn("fast", "--step-sleep-s=0")
        slow = job.spawn("slow", "--step-sleep-s=0.15")
        pair = ["fast", "slow"]
        two_t = job.wait(lambda: job.training_at(pair, 2, 0.0), START_S, "2 workers training")
        job.wait(lambda: len(fast.select("step", two_t)) >= 5, CHANGE_S, "5 steps at world 2")
        job.spawn("late", "--step-sleep-s=0")
        names = ["fast", "slow", "late"]
        job.wait(lambda: job.training_at(names, 3, two_t), START_S, "3 workers training")
        done_t = time.time()  # stopping the workers below abandons their last steps
    finally:
        job.stop_all()
    last_at_two = {}
    for worker in (fast, slow):
        ended = [e for e in worker.select("round_ended") if e["reason"] != "finished"]
        assert ended, worker.events[-20:]
        assert ended[0]["reason"].startswith("planned change"), ended[0]
        abandoned = [e for e in worker.select("step_abandoned") if e["t"] < done_t]
        assert not abandoned, abandoned
        assert worker.select("round_ending"), "the planned change was not seen"
        steps = [e["step"] for e in worker.select("step") if e["world_size"] == 2]
        last_at_two[worker.name] = steps[-1]
    # Both stopped after the same step: the one in flight completed on both.
    assert last_at_two["fast"] == last_at_two["slow"], last_at_two


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_drained_host_leaves_at_a_step_boundary(cluster: ProcessCluster, tmp_path: Path) -> None:
    job = Job(
        cluster,
        tmp_path,
        "drained",
        "--min-nodes=2",
        "--max-nodes=4",
        "--checkpoint-every=0",
        "--max-steps=2000",
    )
    hosts = {"a1": "host-a", "a2": "host-a", "b1": "host-b", "b2": "host-b"}
    client = SyncClient(cluster.endpoints)
    try:
        for name, host in hosts.items():
            # a2 sleeps after each step: the others wait for it inside the all-reduce, where
            # a change taken at once would abandon their step.
            job.spawn(name, f"--host={host}", f"--step-sleep-s={0.15 if name == 'a2' else 0}")
        names = list(hosts)
        four_t = job.wait(lambda: job.training_at(names, 4, 0.0), START_S, "4 workers training")
        job.wait(lambda: len(job.workers["a1"].select("step", four_t)) >= 5, CHANGE_S, "steps at 4")
        drained_t = time.time()
        client.drain("host-b", reason="suspected NIC")
        stay = ["a1", "a2"]
        job.wait(lambda: job.training_at(stay, 2, drained_t), CHANGE_S, "host-a alone at world 2")
        # host-b's workers wait, drained: they train in no round of world 2.
        for name in ("b1", "b2"):
            assert not [
                e for e in job.workers[name].select("step", drained_t) if e["world_size"] == 2
            ]
        undrained_t = time.time()
        assert client.undrain("host-b")
        job.wait(lambda: job.training_at(names, 4, undrained_t), CHANGE_S, "world 4 again")
        done_t = time.time()  # stopping the workers below abandons their last steps
    finally:
        client.close()
        job.stop_all()
    last_at_four = {}
    for name, worker in job.workers.items():
        abandoned = [e for e in worker.select("step_abandoned") if e["t"] < done_t]
        assert not abandoned, (name, abandoned)
        ended = [e for e in worker.select("round_ended", drained_t) if e["reason"] != "finished"]
        assert ended and ended[0]["reason"].startswith("planned change"), (name, ended[:1])
        steps = [
            e["step"]
            for e in worker.select("step", four_t)
            if e["world_size"] == 4 and e["t"] < undrained_t
        ]
        last_at_four[name] = max(steps)
    # Every worker, drained or not, completed the same last step before the change.
    assert len(set(last_at_four.values())) == 1, last_at_four
    # The survivors went on from that step: nothing trained twice, nothing lost.
    (formed,) = [
        e for e in job.workers["a1"].select("round_formed", drained_t) if e["world_size"] == 2
    ][:1]
    assert formed["source"] == "keep" and formed["step"] == last_at_four["a1"], formed


def test_a_drained_host_of_a_sharded_job_loses_no_step(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    # dp=2 x tp=2 (FSDP2 over dp, tensor parallel over tp), a unit per host, a memory
    # snapshot every step. A drain of host-b: the job re-forms at dp=1 on host-a, and a
    # sharded model is rebuilt for the new mesh and restored from the newest registered
    # snapshot (it cannot keep what it held). Registration runs a step or two behind
    # training, so the drained round registers a final snapshot of the step every rank
    # agreed to stop after before anyone leaves it: host-a goes on from that very step.
    job = start_mesh_job(cluster, tmp_path, "mesh-drain")
    client = SyncClient(cluster.endpoints)
    try:
        names = list(HOSTS)
        job.wait(
            lambda: len(job.workers["a0"].select("step")) >= 10, CHANGE_S, "10 steps at world 4"
        )
        drained_t = time.time()
        client.drain("host-b", reason="suspected NIC")
        stay = ["a0", "a1"]
        job.wait(lambda: job.training_at(stay, 2, drained_t), CHANGE_S, "dp=1 x tp=2 training")
    finally:
        client.close()
        # The workers are killed one by one: a step the last one is in when its peer is
        # killed is abandoned, by the test, not by the drain.
        killed_t = time.time()
        job.stop_all()
    last_at_four = {
        name: max(e["step"] for e in job.workers[name].select("step") if e["world_size"] == 4)
        for name in names
    }
    for name in names:
        abandoned = [e for e in job.workers[name].select("step_abandoned") if e["t"] < killed_t]
        assert not abandoned, (name, abandoned)
    # Every rank stopped after the same step, and the new mesh went on from it.
    assert len(set(last_at_four.values())) == 1, last_at_four
    states = [job.workers[n].select("formed_state", drained_t)[0] for n in stay]
    assert {s["source"] for s in states} == {"memory"}, states
    assert {s["step"] for s in states} == set(last_at_four.values()), (states, last_at_four)
