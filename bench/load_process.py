"""Load processes and the context that drives them.

A load process (bench/rendezvous_load.py, bench/scale_load.py, bench/store_load.py) plays
many simulated workers: it takes commands, one a line, on stdin and reports JSON-line events,
which carry wall-clock times (one machine, so times from different processes compare), on
stdout. ``LoadProcess`` starts one and waits for its events; ``Bench`` is the rendezvous
benchmark's context (cluster, admin client, log folder) that spreads simulated workers over
several of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.cluster import RallypointCluster
from rallypoint.client import Client, EndReason, JobConfig, RallypointError

T = TypeVar("T")
B = TypeVar("B")

REPOSITORY = Path(__file__).resolve().parents[1]
# Events carry lists of one number per simulated worker.
EVENT_LINE_LIMIT_BYTES = 64 * 1024 * 1024


class LoadProcessError(RuntimeError):
    pass


@dataclass
class LoadProcess:
    """A bench/rendezvous_load.py process: commands on stdin, events from stdout."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    # Set, and replaced, whenever an event arrives or the process exits.
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    @staticmethod
    async def start(
        name: str,
        role: str,
        arguments: list[str],
        log_dir: Path,
        module: str = "bench.rendezvous_load",
    ) -> LoadProcess:
        """``module`` (bench/rendezvous_load.py unless given) run as ``role``."""
        log_path = log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                role,
                *arguments,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                cwd=REPOSITORY,
                limit=EVENT_LINE_LIMIT_BYTES,
            )
        process = LoadProcess(name, proc, log_path)
        process.reader = asyncio.create_task(process._read())
        return process

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.events.append(json.loads(line))
            self._wake()
        await self.proc.wait()
        self._wake()

    def _wake(self) -> None:
        self.arrived.set()
        self.arrived = asyncio.Event()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        if self.proc.stdin is not None and self.proc.returncode is None:
            self.proc.stdin.write(line.encode() + b"\n")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-1500:]
        return ""

    async def expect(self, event: str, timeout_s: float, since: int = 0) -> dict[str, Any]:
        """The first ``event`` at or after index ``since`` of the events, waiting for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for item in self.events[since:]:
                if item["event"] == event:
                    return item
                if item["event"] == "failed":
                    raise LoadProcessError(f"{self.name} failed: {item['error']}")
            if self.proc.returncode is not None:
                raise LoadProcessError(
                    f"{self.name} exited ({self.proc.returncode}) before {event!r}; "
                    f"log tail:\n{self.log_tail()}"
                )
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise TimeoutError(f"{self.name}: no {event!r} within {timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining_s)

    async def request(self, command: str, event: str, timeout_s: float) -> dict[str, Any]:
        since = len(self.events)
        self.send(command)
        return await self.expect(event, timeout_s, since)

    async def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.returncode is None:
            self.send("close")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout_s)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        if self.reader is not None:
            await self.reader


async def stop_all(processes: Sequence[LoadProcess], timeout_s: float = 60.0) -> None:
    await asyncio.gather(*(p.stop(timeout_s) for p in processes))


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal counts, none empty."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def config_json(config: JobConfig) -> str:
    return json.dumps(
        {name: getattr(config, name) for name in JobConfig.__dataclass_fields__},
    )


async def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll a condition of the events already read; the times compared are the events'."""
    deadline = time.monotonic() + timeout_s
    while (value := condition()) is None or value is False:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


async def start_workers(
    size: int,
    job: str,
    endpoints: str,
    config: JobConfig,
    log_dir: Path,
    module: str = "bench.rendezvous_load",
    extra: Callable[[int], list[str]] = lambda index: [],
) -> list[LoadProcess]:
    """``size`` real worker processes (the "worker" role of ``module``: one participant
    each) named worker0, worker1, ..., for ``job`` with ``config``; ``extra(i)`` are more
    arguments of worker i."""
    return [
        await LoadProcess.start(
            f"worker{i}",
            "worker",
            [
                f"--endpoints={endpoints}",
                f"--job={job}",
                f"--name-prefix=worker{i}",
                f"--config={config_json(config)}",
                *extra(i),
            ],
            log_dir,
            module=module,
        )
        for i in range(size)
    ]


async def join_workers(workers: Sequence[LoadProcess], timeout_s: float) -> dict[str, int]:
    """Once every worker process is ready, join them all: their participant ids by name."""
    await asyncio.gather(*(w.expect("ready", timeout_s) for w in workers))
    for worker in workers:
        worker.send("join")
    joined = await asyncio.gather(*(w.expect("joined", timeout_s) for w in workers))
    return {w.name: e["participant_id"] for w, e in zip(workers, joined, strict=True)}


@dataclass(frozen=True)
class Fault:
    victim: LoadProcess
    round_number: int  # the ACTIVE round the victim was a member of when signalled
    signalled_at: float  # wall-clock time of the signal (events carry wall-clock times)


async def inject_fault(
    alive: list[LoadProcess],
    kind: signal.Signals,
    active_round: Callable[[], int | None],
    what: str,
    settle_s: float,
    timeout_s: float,
) -> Fault:
    """Once ``active_round()`` names a round (``what`` it waits for, up to ``timeout_s``), and
    ``settle_s`` later, send ``kind`` to the last of ``alive``, which leaves the list."""
    round_number = await wait_until(active_round, timeout_s, what)
    # Let the detectors learn the heartbeats' rhythm before the fault.
    await asyncio.sleep(settle_s)
    victim = alive.pop()
    signalled_at = time.time()
    os.kill(victim.pid, kind)
    return Fault(victim, round_number, signalled_at)


def by_signal(trials: Sequence[dict[str, Any]], figure: str) -> dict[str, list[float]]:
    """``figure`` of each fault trial, grouped by the signal it sent (SIGKILL, SIGSTOP)."""
    return {
        name: [t[figure] for t in trials if t["signal"] == name] for name in ("SIGKILL", "SIGSTOP")
    }


async def reform_without(
    admin: Client, job: str, fault: Fault, kind: signal.Signals, config: JobConfig
) -> None:
    """After a fault: a stopped victim is killed (a stopped process dies of SIGKILL too), and
    ``job`` takes ``config`` (its min lowered to the survivors: their round closes at once)."""
    if kind is signal.SIGSTOP:
        fault.victim.proc.kill()
    await admin.configure(job, config)


@dataclass
class Bench:
    args: argparse.Namespace
    cluster: RallypointCluster
    admin: Client
    log_dir: Path
    # Participants declared failed that were alive, per phase.
    unexpected_failures: dict[str, int] = field(default_factory=dict)

    @property
    def endpoints(self) -> str:
        return ",".join(self.cluster.addresses.values())

    async def leader_pid(self) -> int | None:
        """The process id of the member that leads now (for its CPU)."""
        return await self.cluster.leader_pid()

    async def spread(
        self,
        role: str,
        job: str,
        total: int,
        arguments: list[str],
        active_timeout_s: float,
        processes_wanted: int | None = None,
    ) -> list[LoadProcess]:
        """``total`` simulated workers of ``role`` spread over ``processes_wanted`` load
        processes (default: ``--load-processes``), each of which has reported ready."""
        processes = []
        first = 0
        wanted = self.args.load_processes if processes_wanted is None else processes_wanted
        try:
            for index, count in enumerate(split(total, wanted)):
                own = [f"--first={first}", f"--count={count}"]
                processes.append(
                    await LoadProcess.start(
                        f"{job}-load{index}",
                        role,
                        [
                            f"--job={job}",
                            *own,
                            f"--active-timeout-s={active_timeout_s}",
                            *arguments,
                        ],
                        self.log_dir,
                    )
                )
                first += count
            await asyncio.gather(*(p.expect("ready", self.args.phase_timeout_s) for p in processes))
        except BaseException:
            await stop_all(processes)
            raise
        return processes

    async def participants(
        self, job: str, total: int, config: JobConfig, label: str
    ) -> list[LoadProcess]:
        """``total`` participants, one load process per simulated host of
        ``--participants-per-process`` participants (one client each, as shipped)."""
        arguments = [
            f"--endpoints={self.endpoints}",
            f"--name-prefix={label}-",
            f"--config={config_json(config)}",
        ]
        hosts = -(-total // self.args.participants_per_process)
        # Half the phase's timeout: the process reports what it saw before the driver gives up.
        return await self.spread(
            "participants", job, total, arguments, self.args.phase_timeout_s / 2, hosts
        )

    async def failed_in_history(self, job: str, expected: frozenset[int] = frozenset()) -> int:
        """Rounds of ``job`` that ended because a participant not in ``expected`` failed."""
        status = await self.admin.get_job(job)
        return sum(
            1
            for record in status.history
            if record.end_reason is EndReason.MEMBER_FAILED and record.ended_by not in expected
        )


async def run_phases(
    bench: B,
    names: str,
    phases: dict[str, Callable[[B], Any]],
    empty: dict[str, Any],
    results: dict[str, Any],
) -> None:
    """Run the comma-separated phases ``names`` in order, each one's figures into
    ``results[name]`` and its wall time into ``results["phase_wall_s"]``. A phase that fails
    (a timeout, a load process's or the cluster's error) gets its ``empty`` figures and the
    error instead; the other phases still run."""
    for phase in names.split(","):
        started = time.perf_counter()
        try:
            results[phase] = await phases[phase](bench)
        except (TimeoutError, LoadProcessError, RallypointError) as error:
            print(f"{phase}: failed: {error}", flush=True)
            results[phase] = {**empty[phase], "error": str(error)[:2000]}
        results["phase_wall_s"][phase] = time.perf_counter() - started
