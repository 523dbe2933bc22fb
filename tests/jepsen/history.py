"""Histories: every invocation and completion a client made, in a JSON-lines file.

A client (a "process", one operation in flight at a time) records ``invoke`` before it calls
the cluster and one of ``ok`` (the operation took effect, with its result), ``fail`` (it
certainly did not take effect) or ``info`` (unknown: a timeout or an unavailable cluster; it may
have taken effect, or may yet) when the call returns. Times are ``time.monotonic()`` seconds of
the one process that runs every client, so they are comparable across clients. Nemesis events
are recorded with process ``-1`` (``type`` ``start``/``stop``), so reports can shade them, and
so is the cluster's health after each change (``health``), for the availability checker.
"""

from __future__ import annotations

import enum
import json
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

NEMESIS_PROCESS = -1


class EventType(enum.Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"
    # Nemesis windows.
    START = "start"
    STOP = "stop"
    # The cluster's health after a nemesis change (see availability.py).
    HEALTH = "health"


@dataclass(frozen=True, slots=True)
class Event:
    process: int
    type: EventType
    # The operation's function: "read", "write", "cas", "add", "grant", "watch", ...
    f: str
    # Workload-specific, JSON-serialisable.
    key: str
    value: Any
    time_s: float

    def to_json(self) -> str:
        return json.dumps(
            {
                "process": self.process,
                "type": self.type.value,
                "f": self.f,
                "key": self.key,
                "value": self.value,
                "time": self.time_s,
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(line: str) -> Event:
        raw = json.loads(line)
        return Event(
            raw["process"], EventType(raw["type"]), raw["f"], raw["key"], raw["value"], raw["time"]
        )


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion. ``return_s`` is infinite for an operation
    whose outcome is unknown (it may take effect at any time after its call, or never)."""

    op_id: int
    process: int
    f: str
    key: str
    # The invocation's arguments.
    input: Any
    # The completion's value; None when unknown.
    output: Any
    call_s: float
    return_s: float
    # "ok" or "info" ("fail" operations are dropped: they did not take effect).
    status: str

    @property
    def unknown(self) -> bool:
        return self.status == "info"


class HistoryWriter:
    """Appends events to a JSON-lines file (flushed per event: a crash keeps what was seen)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(path, "w")  # noqa: SIM115 (closed in close())
        self.events: list[Event] = []
        # The lease workload's late writers wait for a newer holder's accepted write.
        self.highest_fenced_token = 0

    def record(
        self,
        process: int,
        type_: EventType,
        f: str,
        key: str,
        value: Any,
        time_s: float | None = None,
    ) -> Event:
        """Append an event, stamped now unless ``time_s`` says when it happened."""
        event = Event(process, type_, f, key, value, time.monotonic() if time_s is None else time_s)
        self.events.append(event)
        self._file.write(event.to_json() + "\n")
        self._file.flush()
        return event

    def close(self) -> None:
        self._file.close()


def read_history(path: Path) -> list[Event]:
    with open(path) as f:
        return [Event.from_json(line) for line in f if line.strip()]


def pair(events: Iterable[Event]) -> Iterator[Operation]:
    """Operations from events, in invocation order. An invocation with no completion (the run
    ended first) is unknown. Failed operations are left out."""
    pending: dict[int, tuple[int, Event]] = {}
    done: list[Operation] = []
    next_id = 0
    for event in events:
        if event.process == NEMESIS_PROCESS:
            continue
        if event.type is EventType.INVOKE:
            if event.process in pending:
                raise ValueError(f"process {event.process} invoked twice without a completion")
            pending[event.process] = (next_id, event)
            next_id += 1
            continue
        if event.process not in pending:
            raise ValueError(f"process {event.process} completed an operation it never invoked")
        op_id, call = pending.pop(event.process)
        if event.type is EventType.FAIL:
            continue
        unknown = event.type is EventType.INFO
        done.append(
            Operation(
                op_id,
                call.process,
                call.f,
                call.key,
                call.value,
                None if unknown else event.value,
                call.time_s,
                math.inf if unknown else event.time_s,
                event.type.value,
            )
        )
    for op_id, call in pending.values():
        done.append(
            Operation(
                op_id,
                call.process,
                call.f,
                call.key,
                call.value,
                None,
                call.time_s,
                math.inf,
                "info",
            )
        )
    done.sort(key=lambda op: op.op_id)
    return iter(done)


def nemesis_windows(events: Iterable[Event]) -> list[tuple[str, float, float]]:
    """(name, start, stop) of each nemesis fault; a fault still active at the end stops at the
    last event's time."""
    windows: list[tuple[str, float, float]] = []
    open_faults: dict[str, float] = {}
    last_s = 0.0
    for event in events:
        last_s = max(last_s, event.time_s)
        if event.process != NEMESIS_PROCESS:
            continue
        if event.type is EventType.START:
            open_faults[event.f] = event.time_s
        elif event.type is EventType.STOP and event.f in open_faults:
            windows.append((event.f, open_faults.pop(event.f), event.time_s))
    windows.extend((name, start, last_s) for name, start in open_faults.items())
    windows.sort(key=lambda w: w[1])
    return windows
