"""The load processes of the scale benchmark (bench/scale_bench.py drives them).

Theory of operation. One process plays tens of thousands of participants on one event loop,
speaking the public protocol as a client would, batched: it stands for many simulated hosts,
each with its own session (opened, then kept alive by the client's session keeper), its
participants joined with ``JoinBatch`` (at most ``JOIN_BATCH_LIMIT`` names a call) and carried
by one :class:`HeartbeatBatcher` (one ``HeartbeatBatch`` stream; the hosts' streams start on
the members in rotation, so they spread over the three). Per participant the process keeps
only a few dictionary entries: the batcher builds one request per interval per stream from
its packed lists, and the pushed assignments update the views.

The process speaks JSON lines like bench/rendezvous_load.py (whose ``emit``, ``LoopLag`` and
``command_lines`` it reuses): commands on stdin, events on stdout with the wall-clock time
``t``. Roles:

``hosts``
    ``join JOB COUNT CONFIG_JSON``: COUNT more participants of JOB in new simulated hosts of
    ``--per-host`` participants; emits ``joined`` with each JoinBatch's acknowledgement time.
    ``await JOB ROUND TIMEOUT_S``: waits until every participant of JOB has seen an ACTIVE
    round >= ROUND (pushed to it) or is gone; emits ``settled`` with when they saw it, their
    ranks and the bytes pushed since the last ``mark``. ``mark``: zero the byte counters.
    ``report``: answer latency, send lag, the loop's lag, failovers, gone participants since
    the last report. ``ids JOB``: a few participant ids of JOB. ``close``.
``worker``
    One participant in its own process on its own stream, heartbeating every
    ``--interval-s`` (100 ms): the benchmark's SIGKILL and SIGSTOP target, and the survivor
    that notices. ``join`` joins; every assignment pushed to it is emitted as ``round``.

Bytes pushed to participants: for every answer that carries assignments, the sum of
``Assignment.ByteSize()`` and the answer's own ``ByteSize()`` (assignments plus the
response's framing), by the round the assignments name.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import latency_summary_ms
from bench.rendezvous_load import LoopLag, Role, command_lines, emit, run_load_process
from rallypoint.client import (
    Assignment,
    Backoff,
    HeartbeatBatcher,
    JobConfig,
    RallypointError,
    RoundState,
)
from rallypoint.client.caller import Caller
from rallypoint.client.jobs import join_batch
from rallypoint.client.transport import Transport
from rallypoint.proto.v1 import rendezvous_pb2

# rendezvous.proto: JoinBatch takes at most 10,000 entries.
JOIN_BATCH_LIMIT = 10_000
# Simulated hosts joining at once (each one session open and one JoinBatch).
JOIN_CONCURRENCY = 8
CLIENT_TIMEOUT_S = 120.0
# Sessions outlive a stall of the load process comfortably.
SESSION_TTL_S = 60.0
RECONNECT_BACKOFF = Backoff(base_s=0.05, cap_s=2.0)


@dataclass(slots=True)
class JobLoad:
    """What the process knows of the participants it plays in one job."""

    job: str
    participants: int = 0
    ids: list[int] = field(default_factory=list)
    # Participant -> the highest round it saw ACTIVE, when, and its rank there.
    seen_round: dict[int, int] = field(default_factory=dict)
    seen_at: dict[int, float] = field(default_factory=dict)
    rank: dict[int, int] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    # Round -> how many participants have it as their highest ACTIVE round (so waiting for
    # a round costs a few additions per poll, not a pass over every participant).
    reached: collections.Counter[int] = field(default_factory=collections.Counter)
    # Round -> [assignments, their bytes, bytes of the answers carrying them], since `mark`.
    pushed: dict[int, list[int]] = field(default_factory=dict)

    def on_assignment(self, assignment: Assignment) -> None:
        participant_id = assignment.participant_id
        if assignment.gone:
            self.gone.add(participant_id)
        elif (
            assignment.state is RoundState.ACTIVE
            and assignment.round > self.seen_round.get(participant_id, 0)
            and not assignment.waiting
        ):
            previous = self.seen_round.get(participant_id)
            if previous is not None:
                self.reached[previous] -= 1
            self.reached[assignment.round] += 1
            self.seen_round[participant_id] = assignment.round
            self.seen_at[participant_id] = time.time()
            self.rank[participant_id] = assignment.rank

    def on_response(self, response: rendezvous_pb2.HeartbeatBatchResponse, _: float) -> None:
        if not response.assignments:
            return
        assignment_bytes = 0
        round_number = 0
        for assignment in response.assignments:
            assignment_bytes += assignment.ByteSize()
            round_number = max(round_number, assignment.round)
        counts = self.pushed.setdefault(round_number, [0, 0, 0])
        counts[0] += len(response.assignments)
        counts[1] += assignment_bytes
        counts[2] += response.ByteSize()

    def settled(self, round_number: int) -> bool:
        reached = sum(count for r, count in self.reached.items() if r >= round_number)
        gone_elsewhere = sum(1 for p in self.gone if self.seen_round.get(p, 0) < round_number)
        return reached + gone_elsewhere >= self.participants

    def summary(self, round_number: int) -> dict[str, Any]:
        times = [self.seen_at[p] for p, r in self.seen_round.items() if r >= round_number]
        ranks = [self.rank[p] for p, r in self.seen_round.items() if r == round_number]
        return {
            "job": self.job,
            "round": round_number,
            # The highest round any of them saw ACTIVE.
            "max_round": max(self.reached, default=0),
            "participants": self.participants,
            "seen": len(times),
            "gone": len(self.gone),
            "first_seen": min(times) if times else None,
            "last_seen": max(times) if times else None,
            "median_seen": statistics.median(times) if times else None,
            "ranks": sorted(ranks),
            "pushed": {str(r): counts for r, counts in sorted(self.pushed.items())},
        }


class Hosts:
    """The simulated hosts of one process: one transport (one channel per member), and per
    host a Caller (its own session) and a HeartbeatBatcher (its own stream)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.transport = Transport(
            args.endpoints, backoff=RECONNECT_BACKOFF, attempt_timeout_s=10.0
        )
        self.callers: list[Caller] = []
        self.batchers: list[HeartbeatBatcher] = []
        self.jobs: dict[str, JobLoad] = {}
        # Hosts started so far; with --first-host, the rotation of first members.
        self.started = 0
        self.names_issued = 0

    def caller(self) -> Caller:
        caller = Caller(
            self.transport,
            timeout_s=CLIENT_TIMEOUT_S,
            session_ttl_s=SESSION_TTL_S,
            max_inflight_writes=4,
        )
        self.callers.append(caller)
        return caller

    async def join(self, job: str, count: int, config: JobConfig) -> dict[str, Any]:
        load = self.jobs.setdefault(job, JobLoad(job))
        per_host = min(self.args.per_host, JOIN_BATCH_LIMIT)
        sizes = [min(per_host, count - start) for start in range(0, count, per_host)]
        slots = asyncio.Semaphore(JOIN_CONCURRENCY)
        acks: list[float] = []
        failures: list[str] = []

        async def host(size: int) -> None:
            index = self.started
            self.started += 1
            first_name = self.names_issued
            self.names_issued += size
            names = [
                f"{self.args.name_prefix}{self.args.first + first_name + i}" for i in range(size)
            ]
            async with slots:
                caller = self.caller()
                try:
                    await caller.open_session()
                    joined = await join_batch(
                        caller, job, names, config=config, timeout_s=CLIENT_TIMEOUT_S
                    )
                except RallypointError as error:
                    failures.append(f"{type(error).__name__}: {error}"[:300])
                    return
                acks.append(time.time())
            ids = list(joined.participant_ids)
            batcher = HeartbeatBatcher(
                caller,
                job,
                heartbeat_interval_s=self.args.interval_s,
                first_endpoint=self.args.first_host + index,
                on_assignment=load.on_assignment,
                on_response=load.on_response,
            )
            batcher.add_many(ids, joined.round)
            batcher.start()
            self.batchers.append(batcher)
            load.ids.extend(ids)
            load.participants += len(ids)

        started = time.time()
        await asyncio.gather(*(host(size) for size in sizes))
        return {
            "job": job,
            "count": count,
            "joined": load.participants,
            "started": started,
            "acks": acks,
            "failed": len(failures),
            "first_failure": failures[0] if failures else None,
            "hosts": len(self.batchers),
        }

    def report(self, lag: LoopLag) -> dict[str, Any]:
        latencies: list[float] = []
        send_lags: list[float] = []
        requests = answers = pushes = failovers = 0
        for batcher in self.batchers:
            samples = batcher.take_samples()
            latencies.extend(samples.answer_latency_s)
            send_lags.extend(samples.send_lag_s)
            requests += samples.requests
            answers += samples.answers
            pushes += samples.pushes
            failovers += samples.failovers
        stopped = [b for b in self.batchers if b.stopped.is_set()]
        send_lag = latency_summary_ms(send_lags)
        return {
            "participants": sum(load.participants for load in self.jobs.values()),
            "streams": len(self.batchers),
            "requests": requests,
            "answers": answers,
            "pushes": pushes,
            "latency": latency_summary_ms(latencies),
            "send_lag": {key: send_lag[key] for key in ("p50_ms", "p99_ms", "max_ms")},
            "loop_lag": lag.take(),
            "failovers": failovers,
            "gone": {job: len(load.gone) for job, load in self.jobs.items()},
            "stopped_streams": len(stopped),
            "first_stop": next((str(b.failure) for b in stopped if b.failure), None),
        }

    async def close(self) -> None:
        for batcher in self.batchers:
            await batcher.close()
        # Each caller ends its session (best effort) and closes the shared transport.
        for caller in self.callers:
            await caller.close()
        await self.transport.close()


async def settle(load: JobLoad, round_number: int, timeout_s: float) -> bool:
    """Wait (polling the views the callbacks fill) until the job's participants settled."""
    deadline = time.monotonic() + timeout_s
    while not load.settled(round_number):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def run_hosts(args: argparse.Namespace, lag: LoopLag) -> None:
    hosts = Hosts(args)
    emit("ready")
    try:
        async for line in command_lines():
            words = line.split(maxsplit=3)
            if words[0] == "join":
                config = JobConfig(**json.loads(words[3]))
                emit("joined", **await hosts.join(words[1], int(words[2]), config))
            elif words[0] == "await":
                load = hosts.jobs[words[1]]
                complete = await settle(load, int(words[2]), float(words[3]))
                emit("settled", complete=complete, **load.summary(int(words[2])))
            elif words[0] == "mark":
                for load in hosts.jobs.values():
                    load.pushed.clear()
                emit("marked")
            elif words[0] == "ids":
                emit("ids", job=words[1], ids=hosts.jobs[words[1]].ids[:16])
            elif words[0] == "report":
                emit("report", **hosts.report(lag))
            elif words[0] == "close":
                break
    finally:
        await hosts.close()
    emit("closed")


# --- worker: one real process on its own stream, the target of SIGKILL and SIGSTOP --------------


async def run_worker(args: argparse.Namespace, lag: LoopLag) -> None:
    config = JobConfig(**json.loads(args.config))
    commands = command_lines()
    transport = Transport(args.endpoints, backoff=RECONNECT_BACKOFF)
    caller = Caller(
        transport, timeout_s=CLIENT_TIMEOUT_S, session_ttl_s=SESSION_TTL_S, max_inflight_writes=4
    )
    batcher: HeartbeatBatcher | None = None
    try:
        await caller.open_session()
        # Join only when told: the driver starts every worker first.
        emit("ready")
        if await anext(commands, "close") != "join":
            return
        joined = await join_batch(
            caller, args.job, [args.name_prefix], config=config, timeout_s=CLIENT_TIMEOUT_S
        )
        participant_id = joined.participant_ids[0]

        def on_assignment(assignment: Assignment) -> None:
            emit(
                "round",
                round=assignment.round,
                state=assignment.state.value if assignment.state else None,
                rank=assignment.rank,
                world_size=assignment.world_size,
                gone=assignment.gone,
            )

        batcher = HeartbeatBatcher(
            caller,
            args.job,
            heartbeat_interval_s=args.interval_s,
            first_endpoint=args.first_host,
            on_assignment=on_assignment,
        )
        batcher.add(participant_id, joined.round)
        batcher.start()
        emit("joined", participant_id=participant_id, round=joined.round)
        async for line in commands:
            if line == "report":
                samples = batcher.take_samples()
                emit(
                    "report",
                    gone=int(batcher.is_gone(participant_id)),
                    latency=latency_summary_ms(samples.answer_latency_s),
                    loop_lag=lag.take(),
                )
            elif line == "close":
                break
    finally:
        if batcher is not None:
            await batcher.close()
        await caller.close()
    emit("closed")


ROLES: dict[str, Role] = {"hosts": run_hosts, "worker": run_worker}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--endpoints", required=True, help="comma-separated client addresses")
    parser.add_argument("--job", default="", help="worker: the job")
    parser.add_argument("--config", default="{}", help="worker: JobConfig fields as JSON")
    parser.add_argument("--name-prefix", default="p", help="participant names: PREFIX<index>")
    parser.add_argument("--first", type=int, default=0, help="index of the first name")
    parser.add_argument(
        "--first-host", type=int, default=0, help="rotation offset of the streams' members"
    )
    parser.add_argument("--per-host", type=int, default=1000, help="participants per stream")
    parser.add_argument("--interval-s", type=float, default=1.0, help="heartbeat interval")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_load_process(build_parser(), ROLES, argv)


if __name__ == "__main__":
    sys.exit(main())
