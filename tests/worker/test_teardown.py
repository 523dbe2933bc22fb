"""Leaving a round's group (worker/elastic/teardown.py): what the run let go of is destroyed
off the training thread, which goes on to the next round meanwhile; leaving the run waits
for it. No process group is needed: the round's held items are stand-ins whose destructors
say on which thread they ran."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from rallypoint.worker.elastic.teardown import Abandoned, leave_round


class Held:
    """Stands for a round's group or store: records the thread its destructor ran on."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __del__(self) -> None:
        self.seen.append(threading.current_thread().name)


def ended_round(seen: list[str]) -> Any:
    """What leave_round uses of an ended round whose group torch no longer has."""
    return SimpleNamespace(
        ended=True,
        commits=SimpleNamespace(shutdown=lambda: None, release_checkpointer=lambda: None),
        collectives=SimpleNamespace(release=lambda: [Held(seen)]),
    )


def test_a_left_rounds_quiet_items_are_destroyed_off_the_training_thread() -> None:
    seen: list[str] = []
    abandoned = Abandoned()
    leave_round(ended_round(seen), abandoned, finished=False, collective_timeout_s=30.0)
    abandoned.wait_dropped()
    assert seen == ["rallypoint-drop"]
    assert abandoned.groups() == 0


def test_a_synchronous_drop_destroys_on_the_callers_thread() -> None:
    seen: list[str] = []
    abandoned = Abandoned()
    abandoned.add(0.0, [Held(seen)])
    abandoned.drop(expired_after_s=0.0)
    assert seen == [threading.current_thread().name]
