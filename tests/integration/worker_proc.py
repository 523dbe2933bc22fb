"""A training process as the integration tests see it: joins a job through the client library
and prints one JSON line per thing it observes, with the wall-clock time (``t``) so a test can
measure from a fault it injected to the moment a worker learnt of it.

    python -m tests.integration.worker_proc --endpoints A,B,C --job J --name N [--config JSON]

Events: ``joined``, ``round`` (every new (round, state): members as [id, name, rank], this
worker's rank, the fencing token), ``store_agreed`` (in each ACTIVE round with it, every
rank's ``hello/<rank>`` key read back from the round store), ``lost`` and ``left``. Commands,
one per stdin line, act on the latest ACTIVE round that included this worker unless a round
number is given, and answer ``{"event": "reply", "command": ..., "ok": ..., "error": ...}``:

    store_set KEY VALUE [ROUND] | ckpt_begin STEP [ROUND] | ckpt_shard ID [ROUND]
    ckpt_commit ID [ROUND] | leave
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from rallypoint.client import (
    Client,
    JobConfig,
    Participant,
    ParticipantLostError,
    RallypointError,
    RoundInfo,
    RoundState,
)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def round_fields(info: RoundInfo, participant_id: int) -> dict[str, Any]:
    return {
        "round": info.round,
        "state": info.state.value,
        "members": [[m.participant_id, m.name, m.rank] for m in info.members],
        "waiting": [m.participant_id for m in info.waiting],
        "rank": info.rank_of(participant_id),
        "world_size": info.world_size,
        "token": info.fencing_token,
    }


class Worker:
    def __init__(self, client: Client, participant: Participant) -> None:
        self.client = client
        self.participant = participant
        # Every ACTIVE round that included this worker, by number.
        self.mine: dict[int, RoundInfo] = {}
        # Greetings in flight (referenced so they are not collected before they finish).
        self.greetings: set[asyncio.Task[None]] = set()

    async def follow_rounds(self) -> None:
        participant = self.participant
        async for info in participant.rounds():
            emit("round", **round_fields(info, participant.participant_id))
            rank = info.rank_of(participant.participant_id)
            if info.state is RoundState.ACTIVE and rank is not None:
                self.mine[info.round] = info
                task = asyncio.create_task(self.greet(info, rank))
                self.greetings.add(task)
                task.add_done_callback(self.greetings.discard)

    async def greet(self, info: RoundInfo, rank: int) -> None:
        """Every rank writes its name and reads everybody's: the round store works."""
        store = self.client.round_store(info.job, info.round, self.participant.participant_id)
        try:
            await store.set(f"hello/{rank}", self.participant.name)
            keys = [f"hello/{r}" for r in range(info.world_size)]
            await store.wait(keys, timeout_s=30)
            names = [(await store.get(key)).decode() for key in keys]
        except RallypointError as error:
            emit("store_failed", round=info.round, error=type(error).__name__)
            return
        emit("store_agreed", round=info.round, names=names)

    def fence(self, words: list[str], position: int) -> RoundInfo:
        if len(words) > position:
            return self.mine[int(words[position])]
        return self.mine[max(self.mine)]

    async def command(self, line: str) -> dict[str, Any]:
        words = line.split()
        client = self.client
        pid = self.participant.participant_id
        match words:
            case ["store_set", key, value, *_]:
                info = self.fence(words, 3)
                await client.round_store(info.job, info.round, pid).set(key, value)
                return {"round": info.round}
            case ["ckpt_begin", step, *_]:
                info = self.fence(words, 2)
                checkpoint_id = await client.checkpoint_registry(info).begin(int(step))
                return {"round": info.round, "checkpoint_id": checkpoint_id}
            case ["ckpt_shard", checkpoint_id, *_]:
                info = self.fence(words, 2)
                rank = info.rank_of(pid)
                assert rank is not None
                progress = await client.checkpoint_registry(info).shard_done(
                    int(checkpoint_id), rank
                )
                return {"round": info.round, "reported": progress.reported}
            case ["ckpt_commit", checkpoint_id, *_]:
                info = self.fence(words, 2)
                result = await client.checkpoint_registry(info).commit(int(checkpoint_id))
                return {"round": info.round, "step": result.checkpoint.step}
            case ["leave"]:
                await self.participant.leave()
                return {}
        raise ValueError(f"unknown command {line!r}")


async def read_commands(worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        try:
            fields = await worker.command(line)
        except (RallypointError, KeyError, ValueError, AssertionError) as error:
            emit("reply", command=line, ok=False, error=type(error).__name__, detail=str(error))
        else:
            emit("reply", command=line, ok=True, **fields)
        if line == "leave":
            emit("left")
            return


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--config", help="JobConfig fields as JSON; omit to join an existing job")
    args = parser.parse_args()
    config = JobConfig(**json.loads(args.config)) if args.config else None
    async with Client(args.endpoints, timeout_s=30) as client:
        participant = await client.join(args.job, args.name, config=config)
        emit(
            "joined",
            participant_id=participant.participant_id,
            is_waiting=participant.joined.waiting,
            **round_fields(participant.round, participant.participant_id),
        )
        worker = Worker(client, participant)
        follower = asyncio.create_task(worker.follow_rounds())
        commands = asyncio.create_task(read_commands(worker))
        lost = asyncio.create_task(participant.lost.wait())
        await asyncio.wait([commands, lost], return_when=asyncio.FIRST_COMPLETED)
        if lost.done():
            emit("lost", reason=participant.lost_reason)
            try:
                await participant.wait_for_round(timeout_s=1)
            except ParticipantLostError:
                emit("wait_refused")
            # A zombie still takes commands: the test checks its writes are refused.
            await commands
        follower.cancel()


if __name__ == "__main__":
    asyncio.run(main())
