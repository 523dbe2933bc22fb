"""``make demo``: a local coordinator cluster, four elastic workers, and the faults they survive.

    python -m rallypoint.worker.demo [--workers 4] [--keep-logs]

It starts a 3-member coordinator cluster on free loopback ports with temporary data
directories, the dashboard (``rallypoint dashboard``, on a free port: its address is printed;
open it to watch the same run in a browser), then four CPU workers
(``rallypoint.worker.demo_train``: a small MLP on synthetic regression data, gloo process
groups bootstrapped from the coordinator). While they train it shows a live view (round,
world size, step, loss, each worker with its phi) and then, one after the other:

1. SIGKILLs a worker: the coordinator notices, the survivors leave their collective,
   re-form at world 3 in the same processes and go on with their state;
2. kill -9s the coordinator's leader: a new leader is elected and training never stops;
3. starts a new worker: the world grows back to 4, the newcomer receiving the state from a
   survivor (or the latest checkpoint, resharded);
4. replaces them with four workers of a sharded model (FSDP2) on two simulated hosts, each
   taking an in-memory snapshot every step protected on the other host, and SIGKILLs one:
   its shards come back from the replica in its peer's memory (restore source ``memory``),
   resharded to world 3, losing at most a step and reading no disk.

It ends with a table of each recovery's time, exits 0 (1 if a phase did not happen in
time), and kills every process it started, whatever happens. Without a terminal (CI logs)
the live view is replaced by one line per event and a status line every few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rallypoint.client import RallypointError, SyncClient

from .process_tree import run_reaped

JOB = "demo"
# Each phase's deadline; a healthy run needs a fraction of it.
START_TIMEOUT_S = 60.0
PHASE_TIMEOUT_S = 30.0
# How long the world trains between two faults, so the loss visibly moves.
SETTLE_S = 5.0
# Time each worker spends per step beyond the math (keeps 2 cores from saturating).
STEP_SLEEP_S = 0.02


def free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@dataclass
class WorkerView:
    name: str
    proc: subprocess.Popen[str]
    round: int = 0
    rank: int | None = None
    world_size: int = 0
    step: int = 0
    loss: float | None = None
    phi: float | None = None
    source: str = ""
    state: str = "starting"


@dataclass
class Recovery:
    what: str
    started_t: float
    # Wall-clock times of the milestones, filled in as the events arrive.
    detected_t: float | None = None
    formed_t: float | None = None
    training_t: float | None = None
    restore: str = ""
    detail: str = ""


@dataclass
class Demo:
    root: Path
    console: Console
    workers: dict[str, WorkerView] = field(default_factory=dict)
    members: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    dashboard: subprocess.Popen[str] | None = None
    endpoints: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    leader_id: int = 0
    first_loss: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    # ----------------------------------------------------------- processes

    def start_members(self, count: int) -> None:
        addresses = {i: free_ports(2) for i in range(1, count + 1)}
        # The members' shared peer secret, readable by this user only.
        secret = self.root / "peer-secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        initial = ",".join(
            f"{i}=127.0.0.1:{peer}@127.0.0.1:{client}" for i, (peer, client) in addresses.items()
        )
        for member_id, (peer, client) in addresses.items():
            log = open(self.root / f"member-{member_id}.log", "ab")  # noqa: SIM115 (the child keeps it)
            self.members[member_id] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rallypoint.coordinator",
                    "serve",
                    f"--member-id={member_id}",
                    f"--data-dir={self.root / f'member-{member_id}'}",
                    f"--peer-address=127.0.0.1:{peer}",
                    f"--client-address=127.0.0.1:{client}",
                    f"--initial-cluster={initial}",
                    f"--peer-secret-file={secret}",
                    "--tick-ms=50",
                    "--election-ticks=10",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            self.endpoints.append(f"127.0.0.1:{client}")

    def start_dashboard(self) -> None:
        """``rallypoint dashboard`` on a free port, a client process like the workers; the
        address it prints is shown (the run goes on without it if it does not start)."""
        log = open(self.root / "dashboard.log", "w")  # noqa: SIM115 (the child keeps it)
        self.dashboard = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rallypoint.coordinator",
                "dashboard",
                f"--endpoints={','.join(self.endpoints)}",
                "--listen=127.0.0.1:0",
                "--poll=0.5",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        log.close()

        def show_address(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("rallypoint dashboard: "):
                    address = line.split(": ", 1)[1].strip()
                    self.console.print(f"dashboard: {address} (open it in a browser)")

        threading.Thread(target=show_address, args=(self.dashboard,), daemon=True).start()

    def start_worker(self, name: str, *extra: str, job: str = JOB) -> WorkerView:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        stderr = open(self.root / f"{name}.err", "w")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rallypoint.worker.demo_train",
                f"--endpoints={','.join(self.endpoints)}",
                f"--job={job}",
                f"--name={name}",
                f"--checkpoint-dir={self.root / 'checkpoints' / job}",
                "--checkpoint-every=20",
                f"--step-sleep-s={STEP_SLEEP_S}",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            start_new_session=True,
        )
        stderr.close()
        view = WorkerView(name, proc)
        with self.lock:
            self.workers[name] = view
        threading.Thread(target=self._read_worker, args=(view,), daemon=True).start()
        return view

    def kill_everything(self) -> None:
        """SIGKILL every process this demo started (each leads its own process group)."""
        procs: list[subprocess.Popen[Any]] = [w.proc for w in self.workers.values()]
        procs += list(self.members.values())
        if self.dashboard is not None:
            procs.append(self.dashboard)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    # ----------------------------------------------------------- events

    def _read_worker(self, view: WorkerView) -> None:
        assert view.proc.stdout is not None
        for line in view.proc.stdout:
            try:
                event: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append(event)
                self._apply(view, event)
        with self.lock:
            view.state = "exited" if view.state != "killed" else view.state

    def _apply(self, view: WorkerView, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "step":
            view.step, view.loss = event["step"], event["loss"]
            view.round, view.world_size, view.rank = (
                event["round"],
                event["world_size"],
                event["rank"],
            )
            view.state = "training"
            if self.first_loss is None:
                self.first_loss = event["loss"]
            return
        if kind == "joined":
            view.state = "joined, waiting for a round"
        elif kind == "round_formed":
            view.source = event["source"]
            view.state = "formed"
            self.note(
                f"{view.name}: round {event['round']} formed: rank {event['rank']} of "
                f"{event['world_size']}, restore {event['source']} ({event['reason']}) in "
                f"{event['restore_s'] * 1000:.0f} ms, group ready in "
                f"{event['formed_s'] * 1000:.0f} ms"
            )
        elif kind == "round_ended":
            view.state = "re-forming"
            self.note(f"{view.name}: left round {event['round']}: {event['reason']}")
        elif kind == "checkpoint_committed" and event.get("deleted") is not None:
            self.note(
                f"{view.name}: checkpoint of step {event['step']} committed (round "
                f"{event['round']}); {len(event['deleted'])} old one(s) deleted"
            )
        elif kind in ("checkpoint_refused", "rejoined"):
            self.note(f"{view.name}: {kind}: {event.get('error') or event.get('reason')}")

    def note(self, text: str) -> None:
        if self.stop.is_set():
            return  # the run is over: what workers say while being stopped is noise
        self.console.print(Text(f"{time.strftime('%H:%M:%S')} {text}", style="dim"))

    def select(self, kind: str, after_t: float) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["event"] == kind and e["t"] > after_t]

    def training_again(self, names: list[str], world_size: int, after_t: float) -> float | None:
        """The time every named worker had counted a step at ``world_size`` after ``after_t``."""
        firsts = []
        for name in names:
            steps = [
                e
                for e in self.select("step", after_t)
                if e["name"] == name and e["world_size"] == world_size
            ]
            if not steps:
                return None
            firsts.append(float(steps[0]["t"]))
        return max(firsts)

    # ----------------------------------------------------------- the coordinator's view

    def poll_coordinator(self) -> None:
        """Phi of every worker and the leader's id, twice a second (a thread)."""
        while True:  # the members may still be starting
            try:
                client = SyncClient(self.endpoints, timeout_s=2.0)
                break
            except RallypointError:
                if self.stop.wait(0.5):
                    return
        with client:
            while not self.stop.wait(0.5):
                with contextlib.suppress(RallypointError):
                    status = client.get_job(JOB, timeout_s=1.0)
                    with self.lock:
                        for member in status.round.members:
                            view = self.workers.get(member.name)
                            if view is not None:
                                view.phi = member.phi
                with contextlib.suppress(RallypointError):
                    leaders = {
                        s.status.leader_id
                        for s in client.status(timeout_s=0.5)
                        if s.status is not None and s.status.leader_id
                    }
                    if len(leaders) == 1:
                        self.leader_id = leaders.pop()

    # ----------------------------------------------------------- view

    def table(self) -> Table:
        with self.lock:
            training = [w for w in self.workers.values() if w.state == "training"]
            round_number = max((w.round for w in training), default=0)
            world = max((w.world_size for w in training if w.round == round_number), default=0)
            step = max((w.step for w in training), default=0)
            losses = [w.loss for w in training if w.loss is not None]
            loss = sum(losses) / len(losses) if losses else None
            title = (
                f"rallypoint demo: round {round_number}, world size {world}, step {step}, "
                f"loss {loss:.4f}" + (f" (from {self.first_loss:.4f})" if self.first_loss else "")
                if loss is not None
                else "rallypoint demo: starting"
            )
            table = Table(title=title, caption=f"coordinator leader: member {self.leader_id}")
            for column in ("worker", "state", "round", "rank", "step", "loss", "phi", "restore"):
                table.add_column(column)
            for view in self.workers.values():
                table.add_row(
                    view.name,
                    view.state,
                    str(view.round or "-"),
                    "-" if view.rank is None else str(view.rank),
                    str(view.step),
                    "-" if view.loss is None else f"{view.loss:.4f}",
                    "-" if view.phi is None else f"{view.phi:.2f}",
                    view.source or "-",
                )
            return table

    # ----------------------------------------------------------- the script

    def wait(self, condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(0.05)

    def run(self, worker_count: int) -> list[Recovery]:
        names = [f"worker-{i}" for i in range(1, worker_count + 1)]
        recoveries: list[Recovery] = []
        self.note("starting a 3-member coordinator cluster")
        self.start_members(3)
        self.start_dashboard()
        threading.Thread(target=self.poll_coordinator, daemon=True).start()
        self.note(f"starting {worker_count} workers (each imports torch: this takes a moment)")
        for name in names:
            self.start_worker(name)
        self.wait(
            lambda: self.training_again(names, worker_count, 0.0),
            START_TIMEOUT_S,
            f"{worker_count} workers training",
        )
        self.note(f"all {worker_count} workers are training together")
        time.sleep(SETTLE_S)

        # 1. A worker dies.
        survivors = names[:-1]
        victim = self.workers[names[-1]]
        killed = self.kill_worker(
            victim.name, survivors, f"SIGKILL {victim.name} (pid {victim.proc.pid})"
        )
        recoveries.append(killed)
        self.note(f"survivors training at world {worker_count - 1} again")
        time.sleep(SETTLE_S)

        # 2. The coordinator's leader dies.
        leader_id = self.wait(lambda: self.leader_id, PHASE_TIMEOUT_S, "a coordinator leader")
        leader = Recovery(f"kill -9 coordinator leader (member {leader_id})", time.time())
        os.killpg(self.members[leader_id].pid, signal.SIGKILL)
        self.note(f"kill -9 coordinator member {leader_id}, the leader")
        leader.training_t = self.wait(
            lambda: self.training_again(survivors, worker_count - 1, leader.started_t),
            PHASE_TIMEOUT_S,
            "training to go on",
        )
        leader.formed_t = self.wait(
            lambda: self.leader_id != leader_id and self.leader_id and time.time(),
            PHASE_TIMEOUT_S,
            "a new leader",
        )
        leader.detail = f"new leader: member {self.leader_id}; training never stopped"
        recoveries.append(leader)
        self.note(f"member {self.leader_id} leads now; training never stopped")
        time.sleep(SETTLE_S)

        # 3. A worker arrives.
        newcomer = f"worker-{worker_count + 1}"
        joined = Recovery(f"start {newcomer}", time.time())
        self.start_worker(newcomer)
        members = [*survivors, newcomer]
        joined.training_t = self.wait(
            lambda: self.training_again(members, worker_count, joined.started_t),
            START_TIMEOUT_S,
            f"the world back at {worker_count}",
        )
        self._milestones(joined, members)
        joined.detail += " (times include the new process's start)"
        recoveries.append(joined)
        self.note(f"world size {worker_count} again")
        time.sleep(SETTLE_S / 2)
        recoveries.append(self.sharded_phase([*survivors, newcomer]))
        return recoveries

    def sharded_phase(self, previous: list[str]) -> Recovery:
        """4. A sharded model (FSDP2) with in-memory snapshots on two simulated hosts: a
        killed worker's shards come back from its peer's memory."""
        for name in previous:  # make room on the machine: the replicated job is done
            view = self.workers[name]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(view.proc.pid, signal.SIGKILL)
            view.state = "stopped"
        self.note(
            "stopped the replicated job; starting 4 FSDP2 workers on 2 hosts, snapshots "
            "in memory every step"
        )
        hosts = {"fsdp-a1": "host-a", "fsdp-a2": "host-a", "fsdp-b1": "host-b", "fsdp-b2": "host-b"}
        for name, host in hosts.items():
            self.start_worker(
                name, "--fsdp", "--snapshot-every=1", f"--host={host}", job=f"{JOB}-fsdp"
            )
        names = list(hosts)
        self.wait(
            lambda: self.training_again(names, 4, 0.0), START_TIMEOUT_S, "4 FSDP2 workers training"
        )
        self.note("4 FSDP2 workers training; each step's state is in memory on both hosts")
        time.sleep(SETTLE_S)
        killed = self.kill_worker(
            "fsdp-b2",
            names[:-1],
            "SIGKILL fsdp-b2: its shards live only in host-a's memory now",
            what="SIGKILL fsdp-b2 (FSDP2)",
        )
        self.note(f"FSDP2 survivors training at world 3, restored from: {killed.restore}")
        time.sleep(SETTLE_S / 2)
        return killed

    def kill_worker(
        self, name: str, survivors: list[str], note: str, what: str | None = None
    ) -> Recovery:
        """SIGKILL worker ``name`` and wait for ``survivors`` to train again without it: the
        recovery, with its milestones."""
        victim = self.workers[name]
        killed = Recovery(what or f"SIGKILL {name}", time.time())
        victim.proc.kill()
        victim.state = "killed"
        self.note(note)
        killed.training_t = self.wait(
            lambda: self.training_again(survivors, len(survivors), killed.started_t),
            PHASE_TIMEOUT_S,
            f"the survivors training at world {len(survivors)}",
        )
        self._milestones(killed, survivors)
        return killed

    def _milestones(self, recovery: Recovery, names: list[str]) -> None:
        """Detection (the first worker to leave its round, or to join) and re-formation (the
        last worker's group ready), from the workers' events."""
        ended = [e for e in self.select("round_ended", recovery.started_t) if e["name"] in names]
        joined = self.select("joined", recovery.started_t)
        firsts = [e["t"] for e in ended[:1] + joined[:1]]
        recovery.detected_t = min(firsts) if firsts else None
        formed = [e for e in self.select("round_formed", recovery.started_t) if e["name"] in names]
        if formed:
            recovery.formed_t = max(e["t"] for e in formed)
            sources = sorted({e["source"] for e in formed})
            recovery.restore = ", ".join(sources)
            recovery.detail = formed[-1]["reason"]


def summary(recoveries: list[Recovery], demo: Demo) -> Table:
    table = Table(title="recoveries (seconds from the fault)")
    for column in ("fault", "detected", "re-formed", "training", "restore", "detail"):
        table.add_column(column)

    def since(recovery: Recovery, t: float | None) -> str:
        return "-" if t is None else f"{t - recovery.started_t:.2f}"

    for recovery in recoveries:
        table.add_row(
            recovery.what,
            since(recovery, recovery.detected_t),
            since(recovery, recovery.formed_t),
            since(recovery, recovery.training_t),
            recovery.restore or "-",
            recovery.detail,
        )
    losses = [w.loss for w in demo.workers.values() if w.loss is not None and w.state == "training"]
    if demo.first_loss is not None and losses:
        table.caption = f"loss {demo.first_loss:.4f} -> {sum(losses) / len(losses):.4f}"
    return table


@contextlib.contextmanager
def live_view(demo: Demo) -> Iterator[None]:
    """The rich live table on a terminal; elsewhere a status line every few seconds."""
    if demo.console.is_terminal:
        with Live(demo.table(), console=demo.console, refresh_per_second=4) as live:

            def refresh() -> None:
                while not demo.stop.wait(0.25):
                    live.update(demo.table())

            threading.Thread(target=refresh, daemon=True).start()
            yield
        return

    def status_lines() -> None:
        while not demo.stop.wait(3.0):
            demo.console.print(demo.table().title)

    threading.Thread(target=status_lines, daemon=True).start()
    yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--keep-logs", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        # CI logs: wide enough that the tables do not wrap.
        console = Console(width=140)
    root = Path(tempfile.mkdtemp(prefix="rallypoint-demo-"))
    demo = Demo(root, console)
    status = 1
    started = time.monotonic()
    try:
        with live_view(demo):
            recoveries = demo.run(args.workers)
            demo.stop.set()
        console.print(demo.table())
        console.print(summary(recoveries, demo))
        console.print(f"demo finished in {time.monotonic() - started:.0f} s")
        status = 0
    except TimeoutError as error:
        demo.stop.set()
        console.print(demo.table())
        console.print(f"[bold red]demo failed:[/] {error}; logs in {root}")
        args.keep_logs = True
    except KeyboardInterrupt:
        console.print("interrupted")
    finally:
        demo.stop.set()
        demo.kill_everything()
        if not args.keep_logs:
            shutil.rmtree(root, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(run_reaped(main))
