"""Abandonable collectives: waiting for gloo work that the round's end must be able to cut
short, the formation's gate, and FSDP2's collectives waited for the same way (fsdp_comm.py,
imported only for a model FSDP2 sharded).

Theory of operation (the package docstring has the whole loop). Collectives the loop issues
run with ``async_op=True``; the training thread waits on the work's future in slices of
``WAIT_SLICE_S`` and gives up as soon as the round ended (the round's end also wakes the
waiter at once) or the collective deadline passed. An abandoned work is not destroyed: it
stays in ``in_flight``, and the run keeps it (teardown.py) until gloo is surely done with it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import WorkerError

# How long the training thread sleeps at most between two looks at "has the round ended?".
WAIT_SLICE_S = 0.05
# gloo's timeout while a group connects (at most collective_timeout_s); see "Formation".
FORMATION_CONNECT_S = 5.0

# wait(work, what) -> False if the round ended (or the deadline passed) first.
Waiter = Callable[[dist.Work, str], bool]


def connect_timeout(collective_timeout_s: float) -> timedelta:
    """How long a gloo group's connect may take (every group connects through the round's
    store, which stops answering once the round ended)."""
    return timedelta(seconds=min(FORMATION_CONNECT_S, collective_timeout_s))


class RoundEnd:
    """Why a round ended; set once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        # A collective failed while the coordinator still had the round ACTIVE.
        self.broken = False
        self._lock = threading.Lock()

    def set(self, reason: str, *, broken: bool = False) -> bool:
        """End it, if not yet ended; whether this call did."""
        with self._lock:
            if self.event.is_set():
                return False
            self.reason, self.broken = reason, broken
            self.event.set()
            return True

    def is_set(self) -> bool:
        return self.event.is_set()


class Collectives:
    """One round's waits on gloo work. ``end(reason, broken=True)`` ends the round (a
    collective failed or passed its deadline); ``ended`` is the round's end."""

    def __init__(
        self,
        ended: RoundEnd,
        end: Callable[..., None],
        collective_timeout_s: float,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self._ended = ended
        self._end = end
        # Tells the coordinator a collective failed while the round went on (round.py).
        self._report = report
        self._timeout_s = collective_timeout_s
        # The waiter to wake when the round ends (the training thread's current collective).
        self._waiter: threading.Event | None = None
        # Work handed to gloo and not known complete (and the groups and stores it runs
        # in): kept alive past an abandon, until the run lets go of it (teardown.py).
        self.in_flight: list[object] = []

    def hold(self, item: object) -> None:
        """Keep ``item`` (a group, a store, a work) alive with the round's other gloo work."""
        self.in_flight.append(item)

    def release(self) -> list[object]:
        """Everything held, handed to the caller (the run's teardown), and forgotten here."""
        held, self.in_flight = self.in_flight, []
        return held

    def wake(self) -> None:
        """The round ended: wake the training thread's current wait, if any."""
        waiter = self._waiter
        if waiter is not None:
            waiter.set()

    def gate(self, what: str = "the formation's gate", votes: torch.Tensor | None = None) -> bool:
        """The formation's gate (package docstring, "Formation"): an all-reduce every rank
        must reach before the restore's synchronous collectives; False if the round ended
        (or the deadline passed) first. Not reported as progress: the round is not formed.
        (The first checkpoint of a round passes one too, after making its group.)
        ``votes``: a one-element CPU tensor that the gate sums over the ranks in place (the
        formation's health vote rides on it, formation.py), unspecified when False."""
        if self._ended.is_set():
            return False
        # nccl reduces CUDA tensors only.
        cuda = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        tensor = torch.ones(1, device=device) if votes is None else votes.to(device)
        try:
            work = dist.all_reduce(tensor, async_op=True)
        except (RuntimeError, ValueError) as error:
            self._end(f"{what} failed to start: {error}", broken=True)
            return False
        assert work is not None
        if not self.wait(work, what, time.monotonic()):
            return False
        if votes is not None and tensor is not votes:
            votes.copy_(tensor.cpu())
        return True

    def wait(self, work: dist.Work, what: str, started: float) -> bool:
        """The wait itself: in slices, abandoned when the round ends or at the deadline."""
        self.in_flight.append(work)
        done = threading.Event()
        self._waiter = done
        wait_slice: Callable[[float], bool] = done.wait
        try:
            work.get_future().add_done_callback(lambda _: done.set())
        except RuntimeError:
            # gloo's all_gather_into_tensor (FSDP2's) has no future: look at the work
            # itself, often at first (it takes milliseconds).
            wait_slice = functools.partial(_poll, work, done)
        deadline = started + self._timeout_s
        try:
            while not wait_slice(WAIT_SLICE_S):
                if self._ended.is_set():
                    return False
                if time.monotonic() >= deadline:
                    self._end(f"{what} passed its {self._timeout_s:g} s deadline", broken=True)
                    return False
            if self._ended.is_set() and not work.is_completed():
                return False
            try:
                work.wait()
            except RuntimeError as error:  # gloo's failures (DistBackendError among them)
                detail = f"{what} failed: {str(error).splitlines()[0][:200]}"
                # The round still goes on here, so the coordinator has not seen the loss
                # yet: tell it at once (a peer whose stream closed is then confirmed failed
                # without waiting out its window), and leave the collective.
                if not self._ended.is_set() and self._report is not None:
                    self._report(detail)
                self._end(detail, broken=True)
                return False
        finally:
            self._waiter = None
        self.in_flight.remove(work)
        return True


def _poll(work: dist.Work, woken: threading.Event, slice_s: float) -> bool:
    """Up to ``slice_s``: True once ``work`` completed or ``woken`` is set (the round
    ended), looking after 0.1 ms, then twice as long each time, at most every 2 ms."""
    end = time.monotonic() + slice_s
    pause = 0.0001
    while not (work.is_completed() or woken.is_set()):
        remaining = end - time.monotonic()
        if remaining <= 0:
            return False
        woken.wait(min(pause, remaining))
        pause = min(pause * 2, 0.002)
    return True


class CollectiveAbandoned(RuntimeError, WorkerError):
    """A collective inside a step (FSDP2's) was given up: the round ended under it."""


def collective_failure(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective's failure (torch's distributed errors, gloo's and
    NCCL's transport errors, one given up), not the training code's."""
    if isinstance(error, dist.DistError | CollectiveAbandoned):
        return True
    text = str(error)
    return any(mark in text for mark in ("gloo", "NCCL", "ProcessGroup", "c10d"))
