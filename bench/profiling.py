"""py-spy profiles of running processes, for a benchmark's JSON: record while a trial runs,
then the functions that took the most samples.

py-spy samples only the thread holding the GIL (``--gil``), so a profile shows Python's busy
time, not its waits, and the share of samples taken with the GIL held is how busy Python was.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

PY_SPY_CANDIDATES = ("py-spy", "/tmp/pyspy/bin/py-spy")
PROFILE_RATE = 100


def find_py_spy() -> str | None:
    """The py-spy to run (on the PATH, or where the bench's setup installs it); None if none."""
    return next((p for p in PY_SPY_CANDIDATES if shutil.which(p)), None)


@contextlib.asynccontextmanager
async def record(
    py_spy: str, targets: dict[str, int], out_dir: Path, seconds: int
) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """Record each of ``targets`` (name -> pid) for ``seconds`` from now, raw profiles into
    ``out_dir/<name>.txt``; once the body is done, the yielded dict holds each target's
    ``top_functions`` and ``gil_busy``. If the body raises, nothing is read."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recorders = {}
    for name, pid in targets.items():
        recorders[name] = await asyncio.create_subprocess_exec(
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(seconds),
            "--rate",
            str(PROFILE_RATE),
            "--format",
            "raw",
            "--gil",
            "--nonblocking",
            "-o",
            str(out_dir / f"{name}.txt"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    profiles: dict[str, dict[str, Any]] = {}
    yield profiles
    for name, recorder in recorders.items():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(recorder.wait(), seconds + 30)
        functions = top_functions(out_dir / f"{name}.txt")
        # Samples with the GIL held over samples taken: the share of time Python ran.
        functions["gil_busy"] = functions["samples"] / (PROFILE_RATE * seconds)
        profiles[name] = functions


def top_functions(path: Path, count: int = 25) -> dict[str, Any]:
    """The functions with the most samples (self and inclusive) in a py-spy raw profile."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            if not samples.isdigit():
                continue
            weight = int(samples)
            frames = [frame for frame in stack.split(";") if frame and "thread" not in frame[:12]]
            total += weight
            if frames:
                own[frames[-1]] += weight
            for frame in set(frames):
                inclusive[frame] += weight
    return {
        "samples": total,
        "self": [[frame, n / total] for frame, n in own.most_common(count)] if total else [],
        "inclusive": [[f, n / total] for f, n in inclusive.most_common(count)] if total else [],
    }
