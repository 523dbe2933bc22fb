"""Helpers shared by the benchmarks: machine and version facts for the JSON, latency
percentiles, CPU accounting of processes from /proc, free loopback ports, and a run's frame
(its data folder, its targets judged and printed, its JSON and plot written).

Every benchmark writes the machine it ran on and the versions it measured beside its numbers,
because a figure without them cannot be compared with another run.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from tests.integration.harness import kill_processes_mentioning

T = TypeVar("T")

# Linux reports process times in clock ticks of this many per second.
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@contextmanager
def scratch_root(prefix: str, keep: str | None = None) -> Iterator[Path]:
    """The folder a benchmark keeps its cluster, trials and logs in, removed when the run
    ends, interrupted or not, unless ``keep`` names one (then it is created and left). Every
    process the benchmark starts while it is open gets ``TMPDIR`` inside it, so what they
    leave in the temp folder (torchrun's ``torchelastic_*`` folders, checkpoints) goes with
    it: a benchmark run on a shared machine leaves no disk behind."""
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix=prefix))
    scratch = root / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # gettempdir() caches: read TMPDIR again
    try:
        yield root
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo (platform.processor() is often empty)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_total_bytes": memory_total_bytes(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed versions of Python distributions, with the interpreter's as "python"."""
    versions = {"python": sys.version.split()[0]}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def command_version(command: Sequence[str]) -> str:
    """The first line a program prints for its version flag, or why there is none."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    output = (done.stdout or done.stderr).strip()
    return output.splitlines()[0] if output else f"unavailable (exit {done.returncode})"


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile of already sorted values (fraction in [0, 1])."""
    if not sorted_values:
        return math.nan
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    position = fraction * (len(sorted_values) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] * (1.0 - weight) + sorted_values[upper] * weight


def latency_summary_ms(latencies_s: Iterable[float]) -> dict[str, float]:
    """p50, p90, p99, max and mean in milliseconds of latencies given in seconds."""
    ordered = sorted(latencies_s)
    if not ordered:
        return {"p50_ms": math.nan, "p90_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan}
    return {
        "p50_ms": percentile(ordered, 0.50) * 1e3,
        "p90_ms": percentile(ordered, 0.90) * 1e3,
        "p99_ms": percentile(ordered, 0.99) * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
    }


def median_of(trials: Sequence[dict[str, Any]], field: str) -> float:
    """The median of one numeric field over trials, ignoring trials that lack it."""
    values = [float(t[field]) for t in trials if t.get(field) is not None]
    return statistics.median(values) if values else math.nan


def median(values: Sequence[float]) -> float:
    """The median of ``values``; NaN when there are none (nothing was measured)."""
    return statistics.median(values) if values else math.nan


def fmt_s(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f} s"


def sizes_arg(text: str) -> list[int]:
    """A comma-separated list of sizes, as ``--sizes`` takes it."""
    return [int(part) for part in text.split(",") if part.strip()]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used; 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis
    # start at field 3, so utime (14) and stime (15) are at offsets 11 and 12.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S


def child_pids(pid: int) -> list[int]:
    """Direct children of a process, from /proc/PID/task/*/children or by scanning /proc."""
    children: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        for task in task_dir.iterdir():
            text = (task / "children").read_text()
            children.extend(int(part) for part in text.split())
        return sorted(set(children))
    except OSError:
        pass
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            children.append(int(entry.name))
    return sorted(children)


@dataclass(frozen=True, slots=True)
class CpuSample:
    """CPU seconds used so far by each watched process, at one wall-clock instant."""

    wall_s: float
    cpu_s_by_pid: dict[int, float]

    @staticmethod
    def take(pids: Iterable[int], wall_s: float) -> CpuSample:
        return CpuSample(wall_s, {pid: process_cpu_s(pid) for pid in pids})


def cpu_share(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """CPU used between two samples: seconds and cores busy (1.0 = one core all the time)."""
    elapsed_s = after.wall_s - before.wall_s
    used_s = sum(
        after.cpu_s_by_pid[pid] - before.cpu_s_by_pid.get(pid, 0.0) for pid in after.cpu_s_by_pid
    )
    return {"cpu_s": used_s, "cores": used_s / elapsed_s if elapsed_s > 0 else math.nan}


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None, so the JSON is standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def write_results(out: Path, document: dict[str, Any], plot: Callable[[Path], None] | None) -> None:
    """Write ``document`` as standard JSON to ``out`` and, unless ``plot`` is None, draw the
    plot beside it (same name, .png); say what was written."""
    out.write_text(json.dumps(json_safe(document), indent=2, allow_nan=False) + "\n")
    if plot is None:
        print(f"wrote {out}")
        return
    plot(out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


class TorchrunAgents:
    """The agents of one torchrun job, each started from ``command`` in a session of its own
    with its log in ``out/agent-<i>.log``, and the JSON-lines events their workers append to
    ``out/events-*.jsonl``."""

    def __init__(
        self, command: Sequence[str], out: Path, count: int = 2, env: dict[str, str] | None = None
    ) -> None:
        self.out = out
        out.mkdir(parents=True)
        self.logs = [out / f"agent-{i}.log" for i in range(count)]
        self.agents: list[subprocess.Popen[bytes]] = []
        for log_path in self.logs:
            with open(log_path, "wb") as log:
                self.agents.append(
                    subprocess.Popen(
                        list(command),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=env,
                    )
                )

    def events(self, kind: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for path in self.out.glob("events-*.jsonl"):
            for line in path.read_text().splitlines():
                # A line being written may be cut short: it is complete on the next read.
                if line.endswith("}"):
                    found.append(json.loads(line))
        return [e for e in found if e["event"] == kind]

    def exited(self) -> tuple[subprocess.Popen[bytes], Path] | None:
        """The first agent that has exited, with its log; None while all run."""
        for agent, log in zip(self.agents, self.logs, strict=True):
            if agent.poll() is not None:
                return agent, log
        return None

    def kill_agents(self) -> None:
        """Kill the agents and every worker they started. torchrun starts workers in
        sessions of their own, so an agent's process group does not hold them; a worker
        that has not reported yet (still in gloo's connect, say) is found by the output
        directory on its command line. Left running, such workers once took the CPU from
        the next trial's cluster and workers."""
        for agent in self.agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        kill_processes_mentioning(f"--out={self.out}")


# --- a run's frame: its data folder, its targets -------------------------------------------------


def run_in_data_dir(
    data_dir: str | None, prefix: str, run: Callable[[Path], Coroutine[Any, Any, T]]
) -> T:
    """``run(folder)`` on uvloop, in ``data_dir`` (kept) or, when it is None, in a temporary
    folder named ``prefix...`` that is removed afterwards, whatever happened."""
    import uvloop

    temporary = data_dir is None
    folder = Path(tempfile.mkdtemp(prefix=prefix) if data_dir is None else data_dir)
    try:
        return uvloop.run(run(folder))
    finally:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)


def target_value(top: dict[str, Any], name: str) -> Any:
    """The figure a target names: ``top[name]``, or ``top[base][size]`` for ``base[size]``;
    None when it was not measured (absent or NaN)."""
    if name.endswith("]"):
        base, size = name[:-1].split("[")
        value = top[base].get(size)
    else:
        value = top[name]
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def verdicts(
    top: dict[str, Any], targets: dict[str, tuple[str, float]]
) -> dict[str, dict[str, Any]]:
    """Each target (name -> (direction, target)) judged on its figure in ``top``: PASS, MISS,
    or "not measured"."""
    out = {}
    for name, (direction, target) in targets.items():
        value = target_value(top, name)
        if value is None:
            verdict = "not measured"
        else:
            met = value >= target if direction == ">=" else value <= target
            verdict = "PASS" if met else "MISS"
        out[name] = {"value": value, "direction": direction, "target": target, "verdict": verdict}
    return out


def print_targets(checked: dict[str, dict[str, Any]], name_width: int, value_width: int) -> None:
    """The judged targets, one line each: name, value, target, verdict."""
    print("\ntargets:")
    for name, check in checked.items():
        value = check["value"]
        shown = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        print(
            f"  {name:<{name_width}}{shown:>{value_width}}  target {check['direction']} "
            f"{check['target']:<8g}{check['verdict']}"
        )


def follow_events(
    proc: subprocess.Popen[str], events: list[dict[str, Any]], lock: threading.Lock
) -> None:
    """Append each JSON line the worker ``proc`` prints to ``events`` (under ``lock``), from a
    daemon thread, until its stdout closes; other lines are skipped."""

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with lock:
                events.append(event)

    threading.Thread(target=read, daemon=True).start()
