"""worker/process_tree.py: a program run through ``run_reaped`` leaves no process behind,
whether its main function returns, raises, or the program gets SIGTERM, SIGHUP or Ctrl-C,
even when the processes it started were orphaned (their parent died) or run in sessions of
their own (as torchrun's workers do)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.worker.process_tree import descendants
from tests.integration.harness import no_process_outlives, sigint_at_its_default, wait_until

# A program that starts, in a session of its own, a child that starts a grandchild and
# dies: the grandchild is an orphan. Then it ends as told by its argument.
PROGRAM = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from rallypoint.worker.process_tree import run_reaped

    def main():
        orphaner = (
            "import subprocess, sys; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True)"
        )
        subprocess.run([sys.executable, "-c", orphaner], check=True)
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        print("ready", flush=True)
        if sys.argv[1] == "return":
            return 3
        if sys.argv[1] == "raise":
            raise RuntimeError("the program failed")
        sleeper.wait()  # until a signal

    sys.exit(run_reaped(main))
    """
)


@contextlib.contextmanager
def started(tmp_path: Path, how: str) -> Iterator[subprocess.Popen[str]]:
    """The program, running and ready; killed on the way out if it still runs."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    with subprocess.Popen(
        [sys.executable, str(script), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_at_its_default,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize(("how", "status"), [("return", 3), ("raise", 1)])
def test_a_program_that_ends_leaves_nothing(tmp_path: Path, how: str, status: int) -> None:
    with no_process_outlives(f"a program that ends by {how}"), started(tmp_path, how) as proc:
        assert proc.wait(timeout=30) == status


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signalled_program_leaves_nothing(tmp_path: Path, signum: signal.Signals) -> None:
    with no_process_outlives(f"a program sent {signum.name}"), started(tmp_path, "wait") as proc:
        # Its two sleepers (one orphaned, adopted) are its descendants.
        wait_until(lambda: len(descendants(proc.pid)) == 2, 10, "the program's two sleepers")
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=30) == 128 + signum
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()


# A program busy in an event loop (asyncio.run, as the benchmarks run theirs), mostly in
# plain code between awaits, as a program setting up grpc channels is.
LOOP_PROGRAM = textwrap.dedent(
    """
    import asyncio, sys
    from rallypoint.worker.process_tree import run_reaped

    async def busy():
        print("ready", flush=True)
        try:
            while True:
                sum(range(20_000))  # where a signal most likely arrives
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            print("cancelled at an await", flush=True)
            raise
        except KeyboardInterrupt:
            print("interrupted mid-code", flush=True)
            raise

    def main():
        asyncio.run(busy())
        return 0

    sys.exit(run_reaped(main))
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_reaches_an_event_loop_at_an_await(tmp_path: Path, signum: signal.Signals) -> None:
    """SIGTERM inside a running loop cancels the main task as Ctrl-C does, instead of raising
    KeyboardInterrupt in the middle of whatever code runs (inside grpc.aio's channel setup
    that crashed the interpreter, leaving every member the program started running)."""
    script = tmp_path / "loop_program.py"
    script.write_text(LOOP_PROGRAM)
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, err
    assert out.strip() == "cancelled at an await", out + err
