"""CoordinatorStore against a real 3-member cluster on loopback.

Claims: gloo process groups of 2 and 4 worker processes bootstrap through the store (each
worker joins the job, builds the store of its round and all-reduces); the store keeps c10d's
semantics (blocking get, add, append, torch's compare_set, wait with a timeout, check, delete,
num_keys) from several threads at once over one client; a worker whose round ended (a
zombie) has its ``init_process_group`` refused at once with an error naming the round.

This file is also the worker process: ``python test_store.py worker|zombie ...``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from rallypoint.client import JobConfig, SyncClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HERE = Path(__file__)


def job_config(nodes: int) -> JobConfig:
    return JobConfig(
        min_nodes=nodes,
        max_nodes=nodes,
        heartbeat_interval_ms=100,
        acceptable_pause_ms=2000,
        join_timeout_ms=60_000,
    )


# ------------------------------------------------------------------ worker process


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from rallypoint.worker import CoordinatorStore, StaleStoreRoundError

    with SyncClient(args.endpoints.split(",")) as client:
        participant = client.join(args.job, args.name, config=job_config(args.nodes))
        info = participant.wait_for_round(timeout_s=60)
        rank = info.rank_of(participant.participant_id)
        assert rank is not None
        store = CoordinatorStore.for_participant(participant, timeout=timedelta(seconds=60))
        report = {"name": args.name, "round": info.round, "rank": rank, "world": info.world_size}
        if args.role == "zombie":
            print(json.dumps({"ready": True, **report}), flush=True)
            sys.stdin.readline()  # the test ends the round, then says go
            started = time.monotonic()
            try:
                dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
            except StaleStoreRoundError as error:
                report.update(
                    refused=type(error).__name__,
                    message=str(error),
                    error_round=error.round_number,
                    elapsed_s=time.monotonic() - started,
                )
            print(json.dumps(report), flush=True)
            return
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=60),
        )
        tensor = torch.tensor([float(rank + 1)])
        dist.all_reduce(tensor)
        dist.barrier()
        dist.destroy_process_group()
        report["sum"] = tensor.item()
        print(json.dumps(report), flush=True)
        participant.leave()


def spawn(
    role: str, endpoints: list[str], job: str, name: str, nodes: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE),
            role,
            f"--endpoints={','.join(endpoints)}",
            f"--job={job}",
            f"--name={name}",
            f"--nodes={nodes}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 90) -> dict[str, object]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{err[-3000:]}"
    report: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return report


# ------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    from tests.integration.harness import running_cluster

    with running_cluster(tmp_path_factory.mktemp("store-cluster")) as cluster:
        yield cluster.endpoints


@pytest.mark.parametrize("world_size", [2, 4])
def test_gloo_group_bootstraps_through_the_coordinator(
    endpoints: list[str], world_size: int
) -> None:
    job = f"gloo-{world_size}"
    procs = [spawn("worker", endpoints, job, f"w{i}", world_size) for i in range(world_size)]
    reports = [finish(proc) for proc in procs]
    expected_sum = world_size * (world_size + 1) / 2
    assert sorted(r["rank"] for r in reports) == list(range(world_size))  # type: ignore[type-var]
    assert {r["round"] for r in reports} == {1}
    assert all(r["sum"] == expected_sum for r in reports), reports


def test_c10d_semantics_from_many_threads(endpoints: list[str]) -> None:
    from rallypoint.worker import CoordinatorStore, StoreTimeoutError

    with SyncClient(endpoints) as client:
        participant = client.join("semantics", "solo", config=job_config(1))
        participant.wait_for_round(timeout_s=30)
        store = CoordinatorStore.for_participant(participant, timeout=timedelta(seconds=20))

        # A get blocks until another thread sets the key.
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(store.get("late")))
        reader.start()
        assert store.check(["late"]) is False
        store.set("late", b"value")
        reader.join(timeout=30)
        assert got == [b"value"]

        # Adds from 8 threads at once: none is lost.
        def add_five() -> None:
            for _ in range(5):
                store.add("counter", 1)

        adders = [threading.Thread(target=add_five) for _ in range(8)]
        for thread in adders:
            thread.start()
        for thread in adders:
            thread.join(timeout=60)
        assert store.get("counter") == b"40"
        assert store.add("counter", 2) == 42

        # Appends from 4 threads at once (compare-and-set retried on a race): none is lost,
        # and each thread's own appends stay in its order.
        def append_five(letter: str) -> None:
            for index in range(5):
                store.append("log", f"{letter}{index},")

        appenders = [threading.Thread(target=append_five, args=(c,)) for c in "abcd"]
        for thread in appenders:
            thread.start()
        for thread in appenders:
            thread.join(timeout=60)
        entries = store.get("log").decode().rstrip(",").split(",")
        assert sorted(entries) == sorted(f"{c}{i}" for c in "abcd" for i in range(5))
        for letter in "abcd":
            assert [e for e in entries if e[0] == letter] == [f"{letter}{i}" for i in range(5)]

        # torch's compare_set: absent + empty expected sets; absent + other expected answers
        # the expected value; a mismatch answers the current value.
        assert store.compare_set("cas", b"", b"one") == b"one"
        assert store.compare_set("missing", b"x", b"y") == b"x"
        assert store.check(["missing"]) is False
        assert store.compare_set("cas", b"nope", b"two") == b"one"
        assert store.compare_set("cas", b"one", b"two") == b"two"

        store.wait(["late", "cas"])
        with pytest.raises(StoreTimeoutError, match="never"):
            store.wait(["never"], timedelta(seconds=0.5))
        store.set_timeout(timedelta(seconds=0.3))
        assert store.timeout == timedelta(seconds=0.3)
        with pytest.raises(StoreTimeoutError):
            store.get("never")

        keys_before = store.num_keys()
        assert store.delete_key("late") is True
        assert store.delete_key("late") is False
        assert store.num_keys() == keys_before - 1
        participant.leave()


def test_zombie_is_refused_with_the_round_named(endpoints: list[str]) -> None:
    from rallypoint.worker import CoordinatorStore, StaleStoreRoundError

    job = "zombie"
    zombie = spawn("zombie", endpoints, job, "zombie", 2)
    try:
        with SyncClient(endpoints) as client:
            participant = client.join(job, "survivor", config=job_config(2))
            info = participant.wait_for_round(timeout_s=60)
            assert zombie.stdout is not None and zombie.stdin is not None
            ready = json.loads(zombie.stdout.readline())
            assert ready["round"] == info.round
            store = CoordinatorStore.for_participant(participant)
            store.set("before", b"ok")
            # The survivor leaves: the round ends, and its store with it.
            participant.leave()
            with pytest.raises(StaleStoreRoundError, match=f"round {info.round}"):
                store.set("after", b"no")
            zombie.stdin.write("go\n")
            zombie.stdin.flush()
            report = finish(zombie)
    finally:
        if zombie.poll() is None:
            zombie.kill()
    assert report["refused"] == "StaleStoreRoundError", report
    assert report["error_round"] == info.round
    assert f"round {info.round}" in str(report["message"])
    # Fails fast: nowhere near the 60 s store timeout.
    assert float(report["elapsed_s"]) < 20  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["worker", "zombie"])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    run_worker(parser.parse_args())


if __name__ == "__main__":
    main()
