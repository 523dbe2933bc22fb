"""The scale load generator's bookkeeping (bench/scale_load.py, ``JobLoad``): what the
benchmark's round-close, round-change-bytes and false-positive figures are computed from."""

from __future__ import annotations

from bench.scale_load import JobLoad
from rallypoint.client import Assignment, RoundState
from rallypoint.proto.v1 import rendezvous_pb2


def active(participant_id: int, round_number: int, rank: int) -> Assignment:
    return Assignment(
        participant_id, round_number, RoundState.ACTIVE, rank, 3, 9, "j/1", False, False
    )


def test_a_participant_counts_once_it_is_pushed_an_active_round() -> None:
    load = JobLoad("j", participants=3)
    load.on_assignment(Assignment(1, 1, RoundState.JOINING, -1, 0, 0, "", False, False))
    assert not load.settled(1)
    for participant_id, rank in ((1, 2), (2, 0)):
        load.on_assignment(active(participant_id, 1, rank))
    assert not load.settled(1)
    load.on_assignment(Assignment(3, 0, None, -1, 0, 0, "", False, gone=True))
    assert load.settled(1)
    summary = load.summary(1)
    assert summary["seen"] == 2 and summary["gone"] == 1 and summary["ranks"] == [0, 2]
    assert summary["first_seen"] <= summary["last_seen"]
    # A later round is waited for anew; a repeat of an old one changes nothing.
    assert not load.settled(2)
    seen_at = load.seen_at[1]
    load.on_assignment(active(1, 1, 2))
    assert load.seen_at[1] == seen_at


def test_bytes_are_counted_per_answer_that_carries_assignments() -> None:
    load = JobLoad("j", participants=2)
    load.on_response(rendezvous_pb2.HeartbeatBatchResponse(seq=1), 0.01)
    assert load.pushed == {}
    carried = [
        rendezvous_pb2.Assignment(participant_id=p, round=4, state=2, rank=p, world_size=2)
        for p in (1, 2)
    ]
    response = rendezvous_pb2.HeartbeatBatchResponse(seq=2, assignments=carried)
    load.on_response(response, 0.01)
    count, assignment_bytes, response_bytes = load.pushed[4]
    assert count == 2
    assert assignment_bytes == sum(a.ByteSize() for a in carried)
    assert response_bytes == response.ByteSize() > assignment_bytes
