"""A process that carries several participants of one job through one client, as a host's
training process (or a torchrun agent) does, and prints one JSON line per thing it sees.

    python -m tests.integration.host_proc --endpoints A,B,C --job J --names a,b,c [--config JSON]
        [--domain HOST]

Events: ``joined`` (the participant ids, in name order), ``round`` (a participant's new
(round, state), with its rank), ``lost`` (a participant and why), ``left``. Commands, one per
stdin line: ``leave`` (every participant leaves), ``progress STEP`` (every participant
reports training progress at STEP), ``collective ROUND`` (the first participant reports
that a collective of ROUND failed; ``reported`` with the ids it confirmed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from rallypoint.client import Client, JobConfig, Participant, RoundInfo, TrainingProgress


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def watch(participant: Participant) -> None:
    def on_round(info: RoundInfo) -> None:
        emit(
            "round",
            participant_id=participant.participant_id,
            round=info.round,
            state=info.state.value,
            rank=info.rank_of(participant.participant_id),
            members=len(info.members),
        )

    participant.on_round_change(on_round)
    on_round(participant.round)


async def report_lost(participant: Participant) -> None:
    await participant.lost.wait()
    emit("lost", participant_id=participant.participant_id, reason=participant.lost_reason)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--names", required=True, help="comma-separated participant names")
    parser.add_argument("--config", help="JobConfig fields as JSON")
    parser.add_argument("--domain", default="", help="every participant's failure domain")
    args = parser.parse_args()
    config = JobConfig(**json.loads(args.config)) if args.config else None
    async with Client(args.endpoints, timeout_s=30) as client:
        participants = [
            await client.join(args.job, name, config=config, domain=args.domain)
            for name in args.names.split(",")
        ]
        emit("joined", participant_ids=[p.participant_id for p in participants])
        for participant in participants:
            watch(participant)
        lost = [asyncio.create_task(report_lost(p)) for p in participants]
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := (await reader.readline()).decode().strip():
            words = line.split()
            if words[0] == "leave":
                for participant in participants:
                    await participant.leave()
                emit("left")
            elif words[0] == "progress":
                now = time.monotonic()
                for participant in participants:
                    participant.report_progress(
                        TrainingProgress(
                            round=participant.round.round,
                            step=int(words[1]),
                            step_done_s=now,
                            step_ms=10.0,
                        )
                    )
                emit("reported", step=int(words[1]))
            elif words[0] == "collective":
                confirmed = await participants[0].report_collective_failure(
                    int(words[1]), "all_reduce failed: a peer vanished"
                )
                emit("collective", confirmed=confirmed)
        for task in lost:
            task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
