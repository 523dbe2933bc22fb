"""The client's side of shaped jobs, without a cluster: a JobConfig whose units cannot tile
its world is refused at once in one line; the shape travels both ways on the wire (a member
that predates it sends unit_size 0, read as 1); domains and drains come back as values."""

from __future__ import annotations

import pytest

from rallypoint.client import (
    DrainedDomain,
    DrainResult,
    EndReason,
    InvalidValueError,
    JobConfig,
    RoundInfo,
)
from rallypoint.client.rendezvous_values import RoundRecord
from rallypoint.proto.v1 import rendezvous_pb2


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        (
            {"min_nodes": 6, "max_nodes": 8, "unit_size": 4},
            "unit_size 4 does not divide min_nodes 6",
        ),
        (
            {"min_nodes": 4, "max_nodes": 10, "unit_size": 4},
            "unit_size 4 does not divide max_nodes 10",
        ),
        (
            {"min_nodes": 4, "max_nodes": 8, "unit_size": 0},
            "unit_size must be an integer of at least 1, got 0",
        ),
        (
            {"min_nodes": 4, "max_nodes": 8, "domain_size": -1},
            "domain_size must be an integer of at least 0",
        ),
        (
            {
                "min_nodes": 4,
                "max_nodes": 8,
                "unit_size": 4,
                "domain_size": 6,
                "units_within_domains": True,
            },
            "a domain of 6 holds 1 unit of 4 and strands 2 ranks",
        ),
    ],
)
def test_a_shape_that_cannot_tile_the_world_is_refused_in_one_line(
    shape: dict[str, int | bool], said: str
) -> None:
    with pytest.raises(InvalidValueError) as refused:
        JobConfig(**shape)  # type: ignore[arg-type]
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_the_shape_goes_both_ways_and_an_older_members_zero_reads_as_one() -> None:
    config = JobConfig(8, 16, unit_size=4, domain_size=8, units_within_domains=True)
    wire = config.to_proto()
    assert (wire.unit_size, wire.domain_size, wire.units_within_domains) == (4, 8, True)
    assert JobConfig.from_proto(wire) == config
    older = rendezvous_pb2.JobConfig(min_nodes=2, max_nodes=3)
    assert JobConfig.from_proto(older).unit_size == 1
    # A straddling domain is fine while units may straddle.
    assert JobConfig(4, 8, unit_size=4, domain_size=6).domain_size == 6


def test_domains_spares_and_drains_come_back_as_values() -> None:
    info = rendezvous_pb2.RoundInfo(
        job="j",
        round=3,
        state=rendezvous_pb2.ROUND_STATE_ACTIVE,
        members=[rendezvous_pb2.RoundMember(participant_id=7, name="a0", rank=0, domain="h1")],
        waiting=[rendezvous_pb2.RoundMember(participant_id=9, name="b0", rank=-1, domain="h2")],
        spares=1,
    )
    round_info = RoundInfo.from_proto(info)
    assert [m.domain for m in round_info.members + round_info.waiting] == ["h1", "h2"]
    assert round_info.spares == 1
    record = rendezvous_pb2.RoundRecord(round=2, end_reason=rendezvous_pb2.ROUND_END_REASON_DRAINED)
    assert RoundRecord.from_proto(record).end_reason is EndReason.DRAINED
    response = rendezvous_pb2.DrainResponse(
        changed=True, ended=[rendezvous_pb2.DrainedRound(job="j", round=3)]
    )
    assert DrainResult.from_proto("h1", response) == DrainResult("h1", True, (("j", 3),))
    listed = rendezvous_pb2.DrainedDomain(domain="h1", reason="ECC", since_ms=5)
    assert DrainedDomain.from_proto(listed) == DrainedDomain("h1", "ECC", 5)
