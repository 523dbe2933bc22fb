"""The member table: addresses, ids never reused, and the snapshot format around it."""

from __future__ import annotations

import msgpack
import pytest

from rallypoint.coordinator.member_table import (
    APP_SNAPSHOT_FORMAT,
    ConfChangeContext,
    MemberAddress,
    MemberTable,
    MemberTableError,
    decode_app_snapshot,
    encode_app_snapshot,
)


def table() -> MemberTable:
    return MemberTable(
        {1: MemberAddress("h:1", "h:2"), 2: MemberAddress("h:3", "h:4")},
    )


def test_removed_ids_are_not_reused() -> None:
    members = table()
    members.set(3, MemberAddress("h:5", "h:6"))
    members.remove(3)
    assert members.ids() == [1, 2]
    assert members.next_id() == 4


def test_snapshot_keeps_the_highest_id_given() -> None:
    members = table()
    members.note_id(7)  # member 7 was added and removed
    decoded, state = decode_app_snapshot(encode_app_snapshot(members, b"state"))
    assert state == b"state"
    assert decoded.items() == members.items()
    assert decoded.next_id() == 8


def test_format_1_snapshots_still_load() -> None:
    old = msgpack.packb([1, table().to_obj(), b"state"], use_bin_type=True)
    decoded, state = decode_app_snapshot(old)
    assert (decoded.ids(), decoded.next_id(), state) == ([1, 2], 3, b"state")


@pytest.mark.parametrize(
    "obj",
    [[2, [], -1, b"s"], [2, [], "7", b"s"], [2, [], 3, "s"], [9, [], 3, b"s"], [2, [], 3]],
)
def test_malformed_snapshot_data_is_refused(obj: list[object]) -> None:
    with pytest.raises(MemberTableError, match="malformed snapshot data"):
        decode_app_snapshot(msgpack.packb(obj, use_bin_type=True))


@pytest.mark.parametrize(
    "obj",
    [
        ["a:1", "b:2", [1], 2],  # a proposer that is not a number (was a TypeError)
        ["a:1", "b:2", 1, {"x": 1}],
        ["a:1", "b:2", 1.5, 2],
        ["a:1", 7, 1, 2],
        ["a:1", "b:2", 1],
        "text",
    ],
)
def test_a_malformed_configuration_change_context_is_refused(obj: object) -> None:
    """A peer's entry is checked with this before it is persisted: anything but the
    refusal would end the peer's request with UNKNOWN (or stop a member applying it)."""
    with pytest.raises(MemberTableError, match="malformed configuration change context"):
        ConfChangeContext.decode(msgpack.packb(obj, use_bin_type=True))


def test_a_configuration_change_context_round_trips() -> None:
    context = ConfChangeContext("a:1", "b:2", 3, 2**63)
    assert ConfChangeContext.decode(context.encode()) == context


@pytest.mark.parametrize("size", [0, 255, 256, 65_535, 65_536, 300_000])
def test_the_app_snapshot_is_msgpack_of_its_four_parts(size: int) -> None:
    """Assembled around the state's bytes, the snapshot is still exactly msgpack's packing of
    [format, table, highest id, state] (what every member and older versions decode)."""
    members = MemberTable({1: MemberAddress("127.0.0.1:1", "127.0.0.1:2")}, 3)
    state = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    expected = msgpack.packb(
        [APP_SNAPSHOT_FORMAT, members.to_obj(), members.highest_id, state], use_bin_type=True
    )
    assert encode_app_snapshot(members, state) == expected
    assert decode_app_snapshot(expected)[1] == state
