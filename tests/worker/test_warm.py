"""The warm launcher (worker/warm.py): a crashed rank restarted from a process that kept its
imports.

Claims:
- a child killed with SIGKILL is replaced by a new process (a new pid, in a session of its
  own) that finds the preloaded modules (the defaults: torch, torch._dynamo,
  rallypoint.worker.elastic) already imported before the script imports anything, their
  objects frozen out of its full collections, forked from the launcher (its command line is
  the launcher's: no new interpreter started);
- a clean exit ends the launcher with 0 and no restart; a child that keeps failing is run
  1 + --restarts times and the launcher exits with its status (128 + N for signal N);
- SIGTERM, SIGINT and SIGHUP to the launcher reach the child, stop restarts, and no process
  is left behind (the child's own children included); a launcher killed with SIGKILL takes
  its child with it;
- the preloads import with the collector off, then one full collection and a freeze;
- the launcher refuses to fork (one line, exit 2) while a thread runs in it;
- bad input (an unknown preload module, a missing script, negative restarts, no script) is
  one line and exit 2;
- end to end: in a 3-worker gloo job one worker runs under the launcher and is SIGKILLed;
  its warm replacement joins under the same name and the job trains at world 3 again.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.worker.process_tree import descendants
from tests.integration.harness import (
    ProcessCluster,
    command_line,
    no_process_outlives,
    refused_to_start,
    running_cluster,
    wait_until,
)
from tests.worker.test_elastic import CHANGE_S, START_S, Job, Worker

LAUNCHER = [sys.executable, "-m", "rallypoint.worker.warm"]
PRELOADED = ("torch", "torch._dynamo", "rallypoint.worker.elastic")
# Torch's import alone takes seconds on a loaded 2-core machine.
LINE_S = 120

# Prints what it found at its start, before importing anything but the standard library,
# then does what its first argument says for this restart (RALLYPOINT_WARM_RESTART).
REPORTING_SCRIPT = """
import json, os, subprocess, sys, time
found = {name: name in sys.modules for name in PRELOADED}
restart = int(os.environ["RALLYPOINT_WARM_RESTART"])
import gc
report = {"pid": os.getpid(), "session": os.getsid(0), "found": found, "restart": restart,
          "argv": sys.argv, "forked_at": float(os.environ["RALLYPOINT_WARM_FORKED_AT"]),
          "frozen": gc.get_freeze_count()}
action = sys.argv[1].split(",")[min(restart, len(sys.argv[1].split(",")) - 1)]
if action == "grandchild":
    report["grandchild"] = subprocess.Popen(["sleep", "600"]).pid
print(json.dumps(report), flush=True)
if action in ("sleep", "grandchild"):
    time.sleep(600)
sys.exit(int(action) if action.isdigit() else 0)
""".replace("PRELOADED", repr(PRELOADED))


def write_script(tmp_path: Path) -> Path:
    script = tmp_path / "report.py"
    script.write_text(REPORTING_SCRIPT)
    return script


# Starts the launcher with SIGTERM, SIGINT and SIGHUP at their default dispositions, as one
# started at a terminal does: runs under ``nohup`` (SIGHUP ignored) or as a background job
# (SIGINT ignored) pass the ignored ones on, and the launcher leaves a signal it was started
# ignoring ignored (its docstring), so a test of forwarding must not inherit them. A small
# interpreter resets them and becomes the launcher (exec: the same process), rather than a
# ``preexec_fn`` in the test process: that made the child by fork() with Python running in it,
# and gRPC's fork handlers, with this process's channels alive, could abort it before the
# launcher started ("the launcher exited (-6): ... epoll_wait error: Bad file descriptor").
DEFAULT_SIGNALS_THEN_EXEC = (
    "import os, signal, sys\n"
    "for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(signum, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGNALS_THEN_EXEC, *LAUNCHER[1:], *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The launcher run to its end."""
    return subprocess.run(
        [*LAUNCHER, *args], capture_output=True, text=True, env=env, timeout=LINE_S
    )


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a launcher that refused to fork printed (it exits 2, runs nothing)."""
    assert result.returncode == 2 and result.stdout == "", result
    (line,) = result.stderr.strip().splitlines()
    assert "refusing to fork" in line, line
    return line


def read_report(proc: subprocess.Popen[str], timeout_s: float = LINE_S) -> dict[str, Any]:
    """The next JSON line the launcher's child printed (fails on the launcher's exit)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no line within {timeout_s:g} s"
    line = proc.stdout.readline()
    assert line, f"the launcher exited ({proc.wait()}): {proc.stderr.read() if proc.stderr else ''}"
    report: dict[str, Any] = json.loads(line)
    return report


def alive(pid: int) -> bool:
    """Running (not a zombie, not gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_killed_child_is_restarted_with_the_preloads_imported(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    with (
        no_process_outlives("the warm launcher"),
        start("--restarts=1", "--", str(script), "sleep,0", "--flag") as proc,
    ):
        try:
            first = read_report(proc)
            os.kill(first["pid"], signal.SIGKILL)
            second = read_report(proc)
            assert proc.wait(timeout=LINE_S) == 0
            assert proc.stderr is not None
            said = proc.stderr.read()
        finally:
            proc.kill()
    assert first["restart"] == 0 and second["restart"] == 1
    assert second["pid"] not in (first["pid"], proc.pid)
    # Every preloaded module was there before the script imported anything: a cold
    # `python report.py` finds none of them.
    assert second["found"] == dict.fromkeys(PRELOADED, True), second
    # And their objects are in the collector's permanent generation, which the child's full
    # collections skip (torch and torch._dynamo alone leave about 280,000; a cold process
    # has none frozen).
    assert second["frozen"] > 100_000, second
    # Its own session, the script's argv, and forked (not started) after the kill.
    assert second["session"] == second["pid"]
    assert second["argv"] == [str(script), "sleep,0", "--flag"]
    assert second["forked_at"] > first["forked_at"]
    assert "restart 1 of 1" in said


def test_the_restarted_child_is_a_fork_of_the_launcher(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    with (
        no_process_outlives("the warm launcher"),
        start("--preload=json", "--restarts=1", str(script), "sleep") as proc,
    ):
        try:
            os.kill(read_report(proc)["pid"], signal.SIGKILL)
            second = read_report(proc)
            # No new interpreter: the child's command line is the launcher's.
            assert command_line(second["pid"]) == command_line(proc.pid)
            assert "rallypoint.worker.warm" in command_line(second["pid"])
            assert second["found"] == dict.fromkeys(PRELOADED, False)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=LINE_S)


@pytest.mark.parametrize(
    ("action", "restarts", "runs", "status"),
    [("0", 3, 1, 0), ("3", 2, 3, 3), ("0,0", 0, 1, 0), ("5,0", 2, 2, 0), ("5,6,7", 1, 2, 6)],
)
def test_exit_status_and_restarts(
    tmp_path: Path, action: str, restarts: int, runs: int, status: int
) -> None:
    script = write_script(tmp_path)
    done = run("--preload=", f"--restarts={restarts}", "--", str(script), action)
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["restart"] for r in reports] == list(range(runs)), done.stderr
    assert done.returncode == status, done.stderr
    assert len({r["pid"] for r in reports}) == runs


def test_a_child_killed_by_a_signal_gives_128_plus_it(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    with start("--preload=", "--restarts=0", str(script), "sleep") as proc:
        os.kill(read_report(proc)["pid"], signal.SIGKILL)
        assert proc.wait(timeout=LINE_S) == 128 + signal.SIGKILL


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_reaches_the_child_stops_restarts_and_leaves_nothing(
    tmp_path: Path, signum: signal.Signals
) -> None:
    script = write_script(tmp_path)
    with (
        no_process_outlives("the warm launcher"),
        start("--preload=", "--restarts=3", str(script), "grandchild") as proc,
    ):
        try:
            report = read_report(proc)
            assert alive(report["grandchild"])
            proc.send_signal(signum)
            status = proc.wait(timeout=LINE_S)
            assert proc.stdout is not None and proc.stdout.read() == ""  # no restart
        finally:
            proc.kill()
    assert status == 128 + signum
    assert not alive(report["pid"]) and not alive(report["grandchild"])


def test_a_launcher_killed_with_sigkill_takes_its_child(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    with (
        no_process_outlives("the warm launcher"),
        start("--preload=", str(script), "sleep") as proc,
    ):
        report = read_report(proc)
        proc.kill()
        proc.wait()
        wait_until(lambda: not alive(report["pid"]), 10, "the child to die with its launcher")


def test_it_refuses_to_fork_while_a_thread_runs(tmp_path: Path) -> None:
    (tmp_path / "threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True, name='ticker').start()\n"
    )
    script = write_script(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with no_process_outlives("the refused launcher"):
        line = refused(run("--preload=threaded", str(script), "0", env=env))
    assert "2 Python threads run (ticker)" in line, line


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="OpenBLAS starts no pool on 1 CPU")
def test_it_refuses_to_fork_over_a_native_thread_pool(tmp_path: Path) -> None:
    """numpy's OpenBLAS starts its pool when imported unless told one thread: OS threads
    that Python does not see."""
    pytest.importorskip("numpy")
    pools = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in pools}
    script = str(write_script(tmp_path))
    assert "OS threads run" in refused(run("--preload=numpy", script, "0", env=env))
    # Told one thread, the same preload forks.
    done = run("--preload=numpy", script, "0", env={**env, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0 and json.loads(done.stdout)["restart"] == 0, done


def test_preloads_import_with_the_collector_off_and_are_frozen_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No collection runs while the preloads import (a module making 200,000 lists would
    set off hundreds), then one full collection, and what they made is frozen; the
    collector is on again afterwards, and a preload that fails to import leaves it on."""
    import gc

    from rallypoint.worker.warm import UsageError, preload

    (tmp_path / "many_objects_here.py").write_text("KEEP = [[i] for i in range(200_000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(note)
    try:
        preload(["many_objects_here"])
        frozen = gc.get_freeze_count()
        with pytest.raises(UsageError, match="--preload no_such_module_here"):
            preload(["no_such_module_here"])
    finally:
        gc.callbacks.remove(note)
        gc.unfreeze()  # this test's process is pytest's: give the collector everything back
        sys.modules.pop("many_objects_here", None)
    assert seen == [2], seen  # the one full collection after the imports, nothing during
    assert frozen >= 200_000
    assert gc.isenabled()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--preload=no_such_module_here", "{script}"], "--preload no_such_module_here"),
        (["--", "{missing}"], "no such file"),
        (["--restarts=-1", "{script}"], "--restarts -1: must be 0 or more"),
        (["--restart-delay=-0.5", "{script}"], "--restart-delay -0.5"),
        (["--restarts=1"], "no SCRIPT"),
        (["--restarts=two", "{script}"], "invalid int value: 'two'"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    script = write_script(tmp_path)
    filled = [a.format(script=script, missing=tmp_path / "missing.py") for a in args]
    line = refused_to_start([*LAUNCHER, *filled])
    assert line.startswith("python -m rallypoint.worker.warm: ") and said in line, line


# ------------------------------------------------------------------ end to end


class WarmJob(Job):
    """A job whose workers named in ``warm`` run under the warm launcher."""

    def __init__(self, *args: Any, warm: tuple[str, ...], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.warm = warm

    def command(self, name: str, *extra: str) -> list[str]:
        python, *script = super().command(name, *extra)
        return (
            [*LAUNCHER, "--restarts=1", "--", *script] if name in self.warm else [python, *script]
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("warm-cluster")) as running:
        yield running


def the_child(launcher: Worker) -> int:
    children = [pid for pid in descendants(launcher.proc.pid) if alive(pid)]
    assert children, "the launcher has no child"
    return children[0]


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_warm_replacement_rejoins_a_gloo_job(cluster: ProcessCluster, tmp_path: Path) -> None:
    job = WarmJob(
        cluster,
        tmp_path,
        "warm",
        "--min-nodes=2",
        "--max-nodes=3",
        "--step-sleep-s=0.01",
        warm=("w2",),
    )
    names = ["w0", "w1", "w2"]
    with no_process_outlives("the warm job"):
        try:
            for name in names:
                job.spawn(name)
            job.wait(lambda: job.training_at(names, 3, 0.0), START_S, "3 workers training")
            launcher = job.workers["w2"]
            crashed = the_child(launcher)
            round_at_kill = max(e["round"] for w in job.workers.values() for e in w.select("step"))
            killed_t = time.time()
            os.kill(crashed, signal.SIGKILL)
            # The survivors may re-form at world 2 first or wait for the replacement (it is
            # forked at once): either way the three train together again, in a later round.
            back_t = job.wait(
                lambda: job.training_at(names, 3, killed_t, round_at_kill),
                START_S + CHANGE_S,
                "world 3 training again",
            )
            print(f"SIGKILL -> the warm replacement training at world 3: {back_t - killed_t:.3f} s")
            replacement = the_child(launcher)
            assert replacement != crashed and launcher.proc.poll() is None
            # Forked from the launcher, not a new interpreter.
            assert command_line(replacement) == command_line(launcher.proc.pid)
            assert launcher.select("joined", killed_t), launcher.stderr_tail()
            assert "restart 1 of 1" in launcher.stderr_tail()
        finally:
            job.stop_all()
