"""A warm restart for a crashed rank: a per-host launcher that keeps the imports.

    python -m rallypoint.worker.warm [--preload torch,torch._dynamo,...] [--restarts N]
        [--restart-delay S] -- SCRIPT [ARGS...]

Theory of operation. A replacement started cold pays the interpreter's start, ``import
torch`` and torch's optimizer machinery (``torch._dynamo``, which AdamW imports) before it can
even connect: about 2 s on a CPU, the floor of a cold rejoin (bench/README.md, the peers
benchmark). This launcher pays them once. It imports the preload modules, then forks a
child that runs SCRIPT as ``__main__`` (``runpy.run_path``, ``sys.argv = [SCRIPT, *ARGS]``,
``sys.path[0]`` the script's folder, as ``python SCRIPT`` would). When the child dies
abnormally (a signal, or a non-zero exit), the launcher forks a new one after
``--restart-delay`` seconds, at most ``--restarts`` times: the new child starts with every
preloaded module already imported and runs the script from its first line. To rallypoint it
is a new process like any other: it opens its own client and session and joins under the
name its arguments give it, the elastic loop's ordinary replacement.

Exit status: a child's clean exit (0) ends the launcher with 0; after the last allowed
restart, or once a signal stopped restarts, the launcher exits with the child's status
(128 + the signal's number for a child killed by one, as shells report it).

Fork safety. A fork copies one thread; locks held by any other thread stay locked in the
child forever, and thread pools (torch's intra-op pool, gloo's, gRPC's) are not there.
So before every fork the launcher checks that it runs one Python thread and one OS thread,
that torch has not initialised CUDA and that no default process group exists, and refuses
with one line otherwise (exit 2): a preload module that starts a thread at import cannot be
preloaded. numpy's OpenBLAS (torch imports numpy) starts a thread pool at import unless
``OPENBLAS_NUM_THREADS=1`` or ``OMP_NUM_THREADS=1``; data-parallel ranks run with
``OMP_NUM_THREADS=1`` anyway (torchrun sets it for several processes a host), and the
launcher is started so. The launcher itself does nothing but import, fork and wait: it
never creates a tensor, a process group, a gRPC channel, or touches CUDA. The NCCL/CUDA
path is untested (this repository's machines have no GPU); CUDA must only be initialised in
the child.

The collector. The preloads are imported with the cyclic garbage collector off: imports make
long-lived objects, and the full collections that otherwise fire while torch and
torch._dynamo import scan every object made so far (the default preloads import in 1.6 s
with it off, 2.0 s with it on, on this repository's 2-core machine). Then the launcher
collects once and freezes every object it holds (``gc.freeze``): each child inherits them in
the collector's permanent generation, so its full collections scan only the objects it made
itself (with the default preloads about 290,000 objects are frozen, and a full collection
over them takes about 0.1 s here, a pause every other rank of a synchronous step would wait
out), and collections no longer write to the pages that hold them, which keeps more of those
shared with the launcher instead of copied. Frozen objects are never collected: they are the
preloaded modules' own, which live as long as the process.

Signals and process lifetime. SIGTERM, SIGINT and SIGHUP to the launcher are sent on to the
running child and stop restarts. Each child runs in a session of its own (a terminal's
Ctrl-C reaches it once, through the launcher) and with ``PR_SET_PDEATHSIG`` = SIGKILL, so a
launcher killed with SIGKILL takes its child with it. The launcher is a child subreaper
(worker/process_tree.py): processes the child started and left behind are re-parented to it,
and after each child ends, and when the launcher leaves, every descendant still alive is
killed.

Each child's environment says where it stands: ``RALLYPOINT_WARM_RESTART`` (0 for the first
child, 1 for the first restart, ...) and ``RALLYPOINT_WARM_FORKED_AT`` (the fork's wall
clock, ``time.time()``), so a script can report how long its restart took.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from .errors import WorkerError
from .process_tree import kill_descendants, set_child_subreaper

DEFAULT_PRELOAD = ("torch", "torch._dynamo", "rallypoint.worker.elastic")
DEFAULT_RESTARTS = 3
DEFAULT_RESTART_DELAY_S = 0.0
RESTART_ENV = "RALLYPOINT_WARM_RESTART"
FORKED_AT_ENV = "RALLYPOINT_WARM_FORKED_AT"
# Exit status for bad input and for a refused fork, as argparse uses for bad arguments.
USAGE_EXIT = 2
# A child killed by a signal: 128 + its number, as shells report it.
_SIGNAL_EXIT_BASE = 128
# prctl(2): the calling process gets this signal when its parent (the forking thread) dies.
_PR_SET_PDEATHSIG = 1
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PROG = "python -m rallypoint.worker.warm"
_VALUED_OPTIONS = ("--preload", "--restarts", "--restart-delay")


class UsageError(WorkerError):
    """Bad input or an unsafe state: the launcher prints the message as one line, exits 2."""


@dataclass(frozen=True, slots=True)
class WarmOptions:
    """What the launcher was asked to do. Invariant: ``restarts >= 0``,
    ``restart_delay_s >= 0``, ``script`` is an existing file."""

    preload: tuple[str, ...]
    restarts: int
    restart_delay_s: float
    script: Path
    script_args: tuple[str, ...]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _split_script(argv: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's own options, and SCRIPT with its arguments: SCRIPT is the first word
    that is neither an option nor an option's value, or the word after the first ``--``
    (every later word is the script's, ``--`` included)."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return argv[:index], argv[index + 1 :]
        if word in _VALUED_OPTIONS:
            index += 2
        elif word.startswith("-"):
            index += 1
        else:
            return argv[:index], argv[index:]
    return argv, []


def parse_options(argv: Sequence[str]) -> WarmOptions:
    """The options in ``argv`` (without the program name); UsageError on bad input."""
    parser = _Parser(
        prog=_PROG,
        usage=f"{_PROG} [--preload M,...] [--restarts N] [--restart-delay S] [--] SCRIPT [ARGS...]",
        description=__doc__.splitlines()[0],
        epilog="Start it with OMP_NUM_THREADS=1 (or OPENBLAS_NUM_THREADS=1) when torch is "
        "preloaded: numpy's OpenBLAS otherwise starts a thread pool, and the launcher refuses "
        "to fork over it. docs/elastic.md, 'A crashed rank restarted warm'.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--preload",
        default=",".join(DEFAULT_PRELOAD),
        help="comma-separated modules the launcher imports once, before the first fork "
        f"(default: {','.join(DEFAULT_PRELOAD)}; empty: none)",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=DEFAULT_RESTARTS,
        help="how many times a child that died abnormally is replaced "
        f"(default {DEFAULT_RESTARTS})",
    )
    parser.add_argument(
        "--restart-delay",
        type=float,
        default=DEFAULT_RESTART_DELAY_S,
        metavar="S",
        help="seconds between a child's death and its replacement's fork (default 0)",
    )
    own, rest = _split_script(list(argv))
    args = parser.parse_args(own)
    if not rest:
        raise UsageError("no SCRIPT given (usage: ... [--] SCRIPT [ARGS...])")
    script_name, script_args = rest[0], rest[1:]
    if args.restarts < 0:
        raise UsageError(f"--restarts {args.restarts}: must be 0 or more")
    if not args.restart_delay >= 0:  # also refuses nan
        raise UsageError(f"--restart-delay {args.restart_delay:g}: must be 0 or more seconds")
    script = Path(script_name)
    if not script.is_file():
        raise UsageError(f"SCRIPT {script_name}: no such file")
    modules = tuple(name.strip() for name in args.preload.split(",") if name.strip())
    return WarmOptions(modules, args.restarts, args.restart_delay, script, tuple(script_args))


def preload(modules: Sequence[str]) -> None:
    """Import each module with the collector off, then collect once and freeze every object
    this process holds (the module docstring says why); UsageError naming the first module
    that cannot be imported."""
    gc.disable()
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as error:
                raise UsageError(f"--preload {name}: cannot import it ({error})") from None
    finally:
        gc.enable()
    gc.collect()
    gc.freeze()


def fork_hazards() -> list[str]:
    """What makes a fork of this process unsafe now (nothing: an empty list). Cheap checks
    only: Python threads, OS threads (native libraries' pools), CUDA, a process group."""
    hazards = []
    if threading.active_count() != 1:
        names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        hazards.append(f"{threading.active_count()} Python threads run ({', '.join(names)})")
    with contextlib.suppress(OSError):
        native = len(os.listdir(f"/proc/{os.getpid()}/task"))
        if native != 1 and threading.active_count() == 1:
            hazards.append(
                f"{native} OS threads run (a native library's thread pool: numpy's OpenBLAS "
                "starts one when imported, unless OPENBLAS_NUM_THREADS=1 or OMP_NUM_THREADS=1)"
            )
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            hazards.append("torch has initialised CUDA")
        distributed = sys.modules.get("torch.distributed")
        if distributed is not None and distributed.is_available() and distributed.is_initialized():
            hazards.append("a torch.distributed process group exists")
    return hazards


def exit_status(wait_status: int) -> int:
    """A waited child's status as a process exit status (signal N: 128 + N)."""
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else _SIGNAL_EXIT_BASE - code


class Launcher:
    """Forks children that run the script, replaces the ones that die abnormally."""

    def __init__(self, options: WarmOptions) -> None:
        self.options = options
        self.child: int | None = None
        self.stop_signal: int | None = None  # set once a signal stopped restarts
        self.restarts_done = 0
        # The dispositions the launcher started with, which each child starts with again.
        self.inherited: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = signum
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signum)

    def install_handlers(self) -> None:
        """Forward each of FORWARDED_SIGNALS, but one the launcher was started ignoring (a
        ``nohup``, a background job's SIGINT): that one stays ignored, as the child's."""
        for signum in FORWARDED_SIGNALS:
            self.inherited[signum] = signal.getsignal(signum)
            if self.inherited[signum] != signal.SIG_IGN:
                signal.signal(signum, self._on_signal)

    def fork(self) -> bool:
        """Fork the next child: True in the child, False in the launcher."""
        hazards = fork_hazards()
        if hazards:
            raise UsageError(f"refusing to fork: {'; '.join(hazards)}")
        launcher = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_child(launcher)
            return True
        self.child = pid
        if self.stop_signal is not None:  # it arrived between the check and the fork
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, self.stop_signal)
        return False

    def _become_child(self, launcher: int) -> None:
        forked_at = time.time()
        os.setsid()
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != launcher:  # the launcher died before prctl took effect
                os._exit(_SIGNAL_EXIT_BASE + signal.SIGKILL)
        for signum, handler in self.inherited.items():
            # None: a handler set outside Python, which the launcher replaced.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        os.environ[RESTART_ENV] = str(self.restarts_done)
        os.environ[FORKED_AT_ENV] = repr(forked_at)

    def wait(self) -> int:
        """The running child's exit status once it ended (its leftovers killed)."""
        assert self.child is not None
        _, status = os.waitpid(self.child, 0)  # retried after a signal handler (PEP 475)
        self.child = None
        kill_descendants()
        return exit_status(status)

    def pause(self) -> None:
        """Wait out the restart delay, or until a signal stops restarts."""
        deadline = time.monotonic() + self.options.restart_delay_s
        while self.stop_signal is None and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))

    def supervise(self) -> int | None:
        """Fork and wait until done: the launcher's exit status, or None in a child."""
        while True:
            if self.fork():
                return None
            try:
                status = self.wait()
            except BaseException:
                if self.child is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.child, signal.SIGKILL)
                kill_descendants()
                raise
            if status == 0 or self.stop_signal is not None:
                return status
            if self.restarts_done >= self.options.restarts:
                return status
            self.restarts_done += 1
            print(
                f"warm: child exited with status {status}; restart "
                f"{self.restarts_done} of {self.options.restarts}",
                file=sys.stderr,
                flush=True,
            )
            self.pause()
            if self.stop_signal is not None:
                return _SIGNAL_EXIT_BASE + self.stop_signal


def run_script(options: WarmOptions) -> int:
    """In a child: run the script as ``__main__``, as ``python SCRIPT ARGS`` would. Its
    exceptions and SystemExit go up to the interpreter, which reports them and exits as it
    would for the script."""
    script = str(options.script)
    sys.argv = [script, *options.script_args]
    sys.path[0] = str(options.script.resolve().parent)
    runpy.run_path(script, run_name="__main__")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_options(sys.argv[1:] if argv is None else argv)
        preload(options.preload)
        launcher = Launcher(options)
        set_child_subreaper(True)
        launcher.install_handlers()
        status = launcher.supervise()
    except UsageError as error:
        print(f"{_PROG}: {error}", file=sys.stderr)
        return USAGE_EXIT
    if status is None:
        # Outside the try: nothing of the launcher's may catch what the script raises.
        return run_script(options)
    return status


if __name__ == "__main__":
    sys.exit(main())
